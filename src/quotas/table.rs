//! The bounded map every quota keeps its per-caller state in: 16 shards, each a mutex over a
//! `HashMap` (std's randomly keyed SipHash: the keys come from clients), and one count of the
//! entries of all shards, reserved before an insert so the cap is never passed. A key that
//! finds the table full is not inserted: its quota sends it to the overflow entry instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::caller::CallerKey;

const SHARDS: usize = 16;

pub(super) struct Table<V> {
    shards: [Mutex<HashMap<CallerKey, V>>; SHARDS],
    /// Entries in all shards together; at most `cap`.
    len: AtomicUsize,
    cap: usize,
}

impl<V> Table<V> {
    pub fn new(cap: usize) -> Table<V> {
        Table {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            len: AtomicUsize::new(0),
            cap,
        }
    }

    /// A shard by the key's bytes: keys are digests or addresses, so mixing the two halves
    /// spreads them; a skew would only cost contention, never correctness.
    fn shard(&self, key: &CallerKey) -> &Mutex<HashMap<CallerKey, V>> {
        let (a, b) = key.0.split_at(8);
        let mixed =
            u64::from_le_bytes(a.try_into().expect("8 bytes")) ^ u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let index = (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize;
        &self.shards[index % SHARDS]
    }

    /// `f` on the key's value, inserted as `new()` first when absent and the table has room.
    /// `None`: the key is absent and the table is full (nothing was inserted, `f` not run).
    pub fn update<R>(&self, key: &CallerKey, new: impl FnOnce() -> V, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut shard = self.shard(key).lock();
        if let Some(v) = shard.get_mut(key) {
            return Some(f(v));
        }
        let reserved = self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.cap).then_some(n + 1));
        reserved.ok()?;
        let v = shard.entry(*key).or_insert_with(new);
        Some(f(v))
    }

    /// `f` on the key's value when present; the entry is removed when `f` says so.
    pub fn update_existing(&self, key: &CallerKey, f: impl FnOnce(&mut V) -> bool) {
        let mut shard = self.shard(key).lock();
        let Some(v) = shard.get_mut(key) else { return };
        if f(v) {
            shard.remove(key);
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Keeps the entries `keep` says to, and gives back the memory of a table that shrank to a
    /// quarter of what it holds room for (after a burst of callers has gone). Returns how many
    /// entries were removed.
    pub fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|_, v| keep(v));
            let gone = before - shard.len();
            if shard.capacity() > 64 && shard.capacity() / 4 > shard.len() {
                shard.shrink_to_fit();
            }
            removed += gone;
        }
        self.len.fetch_sub(removed, Ordering::AcqRel);
        removed
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// The value of `key`, copied, when present (for tests and explanations).
    #[cfg(test)]
    pub fn get(&self, key: &CallerKey) -> Option<V>
    where
        V: Copy,
    {
        self.shard(key).lock().get(key).copied()
    }
}
