//! Access tokens (bearers) already verified, with what the request path made of them
//! (docs/src/authorization.md, "Cost"). A client sends the same bearer on every request until
//! it expires, and checking its signature costs 20 times what
//! routing the request does (ES256: ~780k instructions): the router checks it once, and after
//! that compares the bearer's text.
//!
//! An entry holds while the bearer has not expired (`exp` plus the leeway, checked on every
//! hit) and while the key set it was verified with is the one in use: the entry keeps that set
//! alive and is honoured only for the very same set, so a key dropped from the issuer's set
//! stops verifying its bearers at the next fetch. A change of `[auth]` makes a new cache. Only
//! bearers that verified are kept: a refusal is never remembered. The text is compared whole,
//! so nothing but the same bearer can hit.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::jwks::KeySet;

/// Shards, so that requests on other cores rarely wait for one another.
const SHARDS: usize = 16;

/// Bearers by their text.
type Shard<T> = Mutex<HashMap<Box<str>, Entry<T>>>;

/// Verified bearers, each with a `T`: what the request path built from the verified claims once
/// (the caller, its principal's tag, the identity headers), so a hit rebuilds nothing.
pub struct VerifiedBearers<T> {
    shards: Box<[Shard<T>]>,
    per_shard: usize,
    hasher: RandomState,
    leeway: Duration,
}

struct Entry<T> {
    value: Arc<T>,
    /// The bearer's `exp`.
    expires_at: SystemTime,
    keys: Arc<KeySet>,
}

impl<T> VerifiedBearers<T> {
    /// Room for about `capacity` bearers (0: none kept).
    pub fn new(capacity: usize, leeway: Duration) -> VerifiedBearers<T> {
        let per_shard = capacity.div_ceil(SHARDS);
        VerifiedBearers {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard,
            hasher: RandomState::new(),
            leeway,
        }
    }

    /// `bearer` as verified with `keys`, if it was and still holds at `now`.
    pub fn get(&self, bearer: &str, keys: &Arc<KeySet>, now: SystemTime) -> Option<Arc<T>> {
        if self.per_shard == 0 {
            return None;
        }
        let mut shard = self.shard(bearer).lock();
        let entry = shard.get(bearer)?;
        if Arc::ptr_eq(&entry.keys, keys) && now < entry.expires_at + self.leeway {
            return Some(entry.value.clone());
        }
        shard.remove(bearer);
        None
    }

    /// Remembers that `bearer`, expiring at `expires_at`, verified with `keys`. A full shard
    /// first drops what has expired, and if that frees nothing, everything it holds: bounded,
    /// whatever bearers come.
    pub fn put(&self, bearer: &str, keys: &Arc<KeySet>, value: Arc<T>, expires_at: SystemTime, now: SystemTime) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(bearer).lock();
        if shard.len() >= self.per_shard {
            let leeway = self.leeway;
            shard.retain(|_, e| now < e.expires_at + leeway && Arc::ptr_eq(&e.keys, keys));
            if shard.len() >= self.per_shard {
                shard.clear();
            }
        }
        let keys = keys.clone();
        shard.insert(
            bearer.into(),
            Entry {
                value,
                expires_at,
                keys,
            },
        );
    }

    /// Bearers held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    fn shard(&self, bearer: &str) -> &Shard<T> {
        &self.shards[self.hasher.hash_one(bearer) as usize % SHARDS]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Arc<KeySet> {
        Arc::new(KeySet::parse(br#"{"keys":[]}"#).unwrap().keys)
    }

    #[test]
    fn a_bearer_holds_for_its_set_until_it_expires() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cache = VerifiedBearers::new(100, Duration::from_secs(30));
        let (set, other) = (keys(), keys());
        let exp = now + Duration::from_secs(60);
        cache.put("t1", &set, Arc::new("alice"), exp, now);
        assert!(cache.get("t1", &set, now).is_some());
        assert!(
            cache.get("t1", &set, now + Duration::from_secs(89)).is_some(),
            "within the leeway"
        );
        assert!(cache.get("t2", &set, now).is_none(), "only the same text");
        assert!(cache.get("t1", &other, now).is_none(), "another key set");
        assert!(cache.get("t1", &set, now).is_none(), "and it is gone for good");
        cache.put("t1", &set, Arc::new("alice"), exp, now);
        assert!(
            cache.get("t1", &set, now + Duration::from_secs(90)).is_none(),
            "expired"
        );
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_cache_stays_within_its_capacity_and_can_be_off() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cache = VerifiedBearers::new(64, Duration::ZERO);
        let set = keys();
        let exp = now + Duration::from_secs(60);
        for i in 0..10_000 {
            cache.put(&format!("bearer-{i}"), &set, Arc::new(i), exp, now);
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        let off = VerifiedBearers::new(0, Duration::ZERO);
        off.put("t", &set, Arc::new(0), exp, now);
        assert!(off.get("t", &set, now).is_none());
    }
}
