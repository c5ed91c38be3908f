//! mrtr-router patch: header names read through a small cache, one per thread.
//!
//! Every head hyper parses turns each header's name into a `HeaderName`: the bytes lowercased
//! through a table, matched against the standard names, and a name that is not one of them
//! (every `Mcp-*` header, most `X-*`) copied into a new allocation. A proxy's heads carry the
//! same dozen names request after request, so the name made from a run of bytes is kept, per
//! thread, under exactly those bytes: the same bytes again give a clone of the same name (for
//! a standard one a copy of a tag, for another a reference count), which is what
//! `HeaderName::from_bytes` would have made of them.

use std::cell::RefCell;

use http::header::{HeaderName, InvalidHeaderName};

/// How many names the cache holds; a name's slot is a hash of its length and its first and
/// last bytes, and a name that hashes to a taken slot replaces the one there.
const SLOTS: usize = 64;
/// Longer names are made as hyper always made them (a slot holds its name's bytes inline).
const MAX_LEN: usize = 32;

struct Slot {
    len: u8,
    raw: [u8; MAX_LEN],
    name: Option<HeaderName>,
}

const EMPTY: Slot = Slot {
    len: 0,
    raw: [0; MAX_LEN],
    name: None,
};

thread_local! {
    static CACHE: RefCell<[Slot; SLOTS]> = const { RefCell::new([EMPTY; SLOTS]) };
}

/// `HeaderName::from_bytes(raw)`, from the cache when these bytes were seen before.
#[inline]
pub(super) fn from_bytes(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    let (Some(&first), Some(&last)) = (raw.first(), raw.last()) else {
        return HeaderName::from_bytes(raw);
    };
    if raw.len() > MAX_LEN {
        return HeaderName::from_bytes(raw);
    }
    let key = (raw.len() as u32) << 16 | (first as u32) << 8 | last as u32;
    let at = (key.wrapping_mul(0x9e37_79b1) >> (32 - SLOTS.trailing_zeros())) as usize;
    // Nothing here calls back into hyper, so the cache is never borrowed twice; should it be,
    // or the thread be ending (its cache gone), the name is made without it.
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let slot = &mut cache[at];
            Some(match &slot.name {
                Some(name) if slot.raw[..slot.len as usize] == *raw => Ok(name.clone()),
                _ => miss(raw, slot),
            })
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| HeaderName::from_bytes(raw))
}

/// Makes the name, and keeps it in `slot` in place of the one there.
#[cold]
#[inline(never)]
fn miss(raw: &[u8], slot: &mut Slot) -> Result<HeaderName, InvalidHeaderName> {
    let name = HeaderName::from_bytes(raw)?;
    slot.len = raw.len() as u8;
    slot.raw[..raw.len()].copy_from_slice(raw);
    slot.name = Some(name.clone());
    Ok(name)
}
