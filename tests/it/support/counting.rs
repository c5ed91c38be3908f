//! The test binary's allocator: the system's, counting the bytes live in the process, for the
//! tests that measure memory. Those run each in a process of their own ([`super::ran_alone`]),
//! so that the count is theirs alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

/// The system allocator, counting the bytes live in the process.
pub struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

/// The bytes live in the process now.
pub fn live_bytes() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every call is the system allocator's, with the same arguments; the count is a
// relaxed atomic on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
