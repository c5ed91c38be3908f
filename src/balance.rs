//! Backend choice for unpinned requests: the consistent-hash ring (with optional bounded load)
//! for keyed requests, and power-of-two-choices least-outstanding for keyless ones.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use consistent_hash_ring::{Ring, RingBuilder};
use siphasher::sip::SipHasher13;

use crate::upstream::{Backend, BackendKey};

/// Fixed SipHash key: every router replica must place every key on the same backend.
const RING_KEY: (u64, u64) = (0x6d72_7472_2d72_696e, 0x672d_7631_2d6b_6579);

/// SipHash-1-3 with a fixed key: well mixing (sequential ids spread) and identical in
/// every process, unlike `RandomState`.
#[derive(Clone, Copy, Default)]
pub struct FixedSipHash;

impl BuildHasher for FixedSipHash {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(RING_KEY.0, RING_KEY.1)
    }
}

/// A ring member: hashed and compared by name only, so its ring positions depend on the name
/// alone and every replica with the same config builds the same ring.
#[derive(Clone)]
struct Member(Arc<Backend>);

impl Hash for Member {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state)
    }
}
impl PartialEq for Member {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}
impl Eq for Member {}

/// The consistent-hash ring over the backends that take new keys.
pub struct HashRing {
    ring: Ring<Member, FixedSipHash>,
    members: Vec<Arc<Backend>>,
    load_factor: f64,
}

impl HashRing {
    /// Builds the ring; each backend gets `virtual_nodes × weight` points.
    pub fn new(members: Vec<Arc<Backend>>, virtual_nodes: usize, load_factor: f64) -> HashRing {
        let weighted = members
            .iter()
            .filter(|b| b.weight() > 0)
            .map(|b| (Member(b.clone()), virtual_nodes * b.weight() as usize));
        let ring = RingBuilder::new(FixedSipHash).weighted_nodes_iter(weighted).build();
        let members = members.into_iter().filter(|b| b.weight() > 0).collect();
        HashRing {
            ring,
            members,
            load_factor,
        }
    }

    pub fn members(&self) -> &[Arc<Backend>] {
        &self.members
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Each member's share of the hash space (0 to 1, together 1): the part of new keys the
    /// ring gives it, ignoring load. Walks every virtual node: for the status page, not for
    /// requests.
    pub fn shares(&self) -> Vec<(BackendKey, f64)> {
        let mut shares: Vec<(BackendKey, u128)> = self.members.iter().map(|b| (b.key, 0)).collect();
        for range in self.ring.resident_ranges() {
            let width = u128::from(range.keys().end() - range.keys().start()) + 1;
            if let Some(s) = shares.iter_mut().find(|(k, _)| *k == range.node().0.key) {
                s.1 += width;
            }
        }
        let whole = (1u128 << 64) as f64;
        shares.into_iter().map(|(k, w)| (k, w as f64 / whole)).collect()
    }

    /// The backend that owns `key` on the ring, ignoring load.
    pub fn owner(&self, key: &str) -> Option<&Arc<Backend>> {
        self.ring.try_get(key).map(|m| &m.0)
    }

    /// The backend for `key`: its ring owner, or with bounded load on, the first backend in
    /// ring order whose in-flight count is within `load_factor × mean`.
    pub fn pick(&self, key: &str) -> Option<&Arc<Backend>> {
        if self.load_factor <= 0.0 || self.members.len() < 2 {
            return self.owner(key);
        }
        let total: i64 = self.members.iter().map(|b| b.inflight()).sum();
        // +1 counts the request being placed, so an idle fleet never skips anyone.
        let cap = ((total + 1) as f64 / self.members.len() as f64 * self.load_factor).ceil() as i64;
        let mut first = None;
        for m in self.ring.replicas(key) {
            first.get_or_insert(&m.0);
            if m.0.inflight() < cap {
                return Some(&m.0);
            }
        }
        first
    }

    /// [`HashRing::pick`] among the members `among` names (all of them: `None`): the first of
    /// them in ring order for `key`, within the load bound when it is on.
    pub fn pick_among(&self, key: &str, among: Option<&[BackendKey]>) -> Option<&Arc<Backend>> {
        let Some(among) = among else { return self.pick(key) };
        let mut candidates = self.ring.replicas(key).map(|m| &m.0).filter(|b| among.contains(&b.key));
        if self.load_factor <= 0.0 || self.members.len() < 2 {
            return candidates.next();
        }
        let chosen: Vec<&Arc<Backend>> = self.members.iter().filter(|b| among.contains(&b.key)).collect();
        let total: i64 = chosen.iter().map(|b| b.inflight()).sum();
        let cap = ((total + 1) as f64 / chosen.len().max(1) as f64 * self.load_factor).ceil() as i64;
        let mut first = None;
        for b in candidates {
            first.get_or_insert(b);
            if b.inflight() < cap {
                return Some(b);
            }
        }
        first
    }

    /// [`HashRing::pick_keyless`] among the members `among` names (all of them: `None`).
    pub fn pick_keyless_among(&self, among: Option<&[BackendKey]>) -> Option<&Arc<Backend>> {
        let Some(among) = among else { return self.pick_keyless() };
        let chosen: Vec<&Arc<Backend>> = self.members.iter().filter(|b| among.contains(&b.key)).collect();
        least_of_two(chosen.len(), |i| chosen[i])
    }

    /// Another backend for a request whose first choice could not be reached: the next one in
    /// ring order for `key`, or a keyless choice among the others.
    /// `among`: only those (the backends the catalog lets take the request), when it says.
    pub fn fallback(
        &self,
        key: Option<&str>,
        exclude: BackendKey,
        among: Option<&[BackendKey]>,
    ) -> Option<&Arc<Backend>> {
        let may = |b: &&Arc<Backend>| b.key != exclude && among.is_none_or(|a| a.contains(&b.key));
        match key {
            Some(k) => self.ring.replicas(k).map(|m| &m.0).find(may),
            None => self.members.iter().filter(may).min_by_key(|b| b.inflight()),
        }
    }

    /// Least outstanding requests between two random members (power of two choices).
    pub fn pick_keyless(&self) -> Option<&Arc<Backend>> {
        least_of_two(self.members.len(), |i| &self.members[i])
    }
}

/// Of `n` backends (`nth` gives each), the less loaded of two drawn at random (power of two
/// choices).
fn least_of_two<'a>(n: usize, nth: impl Fn(usize) -> &'a Arc<Backend>) -> Option<&'a Arc<Backend>> {
    match n {
        0 => None,
        1 => Some(nth(0)),
        _ => {
            let a = rand::random_range(0..n);
            let mut b = rand::random_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (nth(a), nth(b));
            Some(if b.inflight() < a.inflight() { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn backends(n: usize, weight: u32) -> Vec<Arc<Backend>> {
        (0..n)
            .map(|i| Backend::for_test(&format!("worker-{i}"), weight))
            .collect()
    }

    fn counts(ring: &HashRing, keys: impl Iterator<Item = String>) -> HashMap<String, usize> {
        let mut c = HashMap::new();
        for k in keys {
            *c.entry(ring.owner(&k).unwrap().name.to_string()).or_default() += 1;
        }
        c
    }

    #[test]
    fn sequential_ids_spread() {
        let ring = HashRing::new(backends(3, 1), 160, 0.0);
        let c = counts(&ring, (0..10).map(|i| format!("session-{i}")));
        assert_eq!(c.len(), 3, "session-0..9 must land on all three backends: {c:?}");
    }

    /// 100k pseudo-random keys, the same on every run.
    fn random_keys(n: u64) -> impl Iterator<Item = String> {
        (0..n).map(|i| {
            format!(
                "{:032x}",
                (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834)
            )
        })
    }

    fn peak_to_mean(n: usize, vnodes: usize) -> f64 {
        let ring = HashRing::new(backends(n, 1), vnodes, 0.0);
        let c = counts(&ring, random_keys(100_000));
        *c.values().max().unwrap() as f64 / (100_000.0 / n as f64)
    }

    fn moved_fraction(n: usize, vnodes: usize) -> f64 {
        let before = HashRing::new(backends(n, 1), vnodes, 0.0);
        let after = HashRing::new(backends(n + 1, 1), vnodes, 0.0);
        let keys: Vec<String> = (0..50_000).map(|i| format!("call-{i}")).collect();
        let new_name = format!("worker-{n}");
        let mut moved = 0;
        for k in &keys {
            let (a, b) = (&before.owner(k).unwrap().name, &after.owner(k).unwrap().name);
            if a != b {
                assert_eq!(**b, *new_name, "a key may only move to the added backend");
                moved += 1;
            }
        }
        moved as f64 / keys.len() as f64
    }

    #[test]
    fn peak_to_mean_load_is_bounded() {
        // 160 points per backend (the default) keeps peak/mean within 1.15 for fleets up to 7;
        // larger fleets want more points (`routing.virtual_nodes`, docs/src/configuration.md), checked here at 640.
        for n in 2..=7 {
            let r = peak_to_mean(n, 160);
            assert!(r <= 1.15, "n={n} at 160 vnodes: peak/mean = {r:.3}");
        }
        for n in 8..=12 {
            let r = peak_to_mean(n, 640);
            assert!(r <= 1.15, "n={n} at 640 vnodes: peak/mean = {r:.3}");
        }
    }

    #[test]
    fn adding_a_backend_moves_few_keys() {
        for (n, vnodes) in [
            (2, 160),
            (3, 160),
            (4, 160),
            (5, 160),
            (6, 160),
            (7, 160),
            (9, 640),
            (11, 640),
        ] {
            let frac = moved_fraction(n, vnodes);
            assert!(frac <= 1.2 / (n + 1) as f64, "n={n}: {frac:.3} of keys moved");
        }
    }

    #[test]
    fn shares_cover_the_ring_by_weight() {
        let mut members = backends(3, 1);
        members.push(Backend::for_test("heavy", 3));
        let ring = HashRing::new(members, 160, 0.0);
        let shares = ring.shares();
        let total: f64 = shares.iter().map(|(_, s)| s).sum();
        assert!((total - 1.0).abs() < 1e-9, "{shares:?}");
        let heavy = shares.iter().find(|(k, _)| *k == BackendKey::of("heavy")).unwrap().1;
        assert!((0.4..0.6).contains(&heavy), "weight 3 of 6: {heavy}");
        assert!(HashRing::new(Vec::new(), 160, 0.0).shares().is_empty());
    }

    #[test]
    fn weights_are_honoured() {
        let mut bs = backends(2, 1);
        bs.push(Backend::for_test("heavy", 2));
        let ring = HashRing::new(bs, 160, 0.0);
        let c = counts(&ring, (0..40_000).map(|i| format!("k{i}")));
        let heavy = c["heavy"] as f64 / 40_000.0;
        assert!((0.42..0.58).contains(&heavy), "weight-2 share {heavy:.3}");
    }

    #[test]
    fn same_config_same_mapping() {
        let a = HashRing::new(backends(4, 1), 160, 0.0);
        let mut reversed = backends(4, 1);
        reversed.reverse();
        let b = HashRing::new(reversed, 160, 0.0);
        for i in 0..1000 {
            let k = format!("x{i}");
            assert_eq!(a.owner(&k).unwrap().name, b.owner(&k).unwrap().name);
        }
    }

    #[test]
    fn bounded_load_skips_busy_owner() {
        let bs = backends(3, 1);
        let ring = HashRing::new(bs.clone(), 160, 1.25);
        let owner = ring.owner("hot").unwrap().clone();
        let _busy: Vec<_> = (0..10).map(|_| owner.start_request()).collect();
        let picked = ring.pick("hot").unwrap();
        assert_ne!(picked.name, owner.name);
        assert!(HashRing::new(vec![], 160, 0.0).pick("x").is_none());
    }

    #[test]
    fn keyless_prefers_less_loaded() {
        let bs = backends(2, 1);
        let ring = HashRing::new(bs.clone(), 160, 0.0);
        let _busy = bs[0].start_request();
        for _ in 0..50 {
            assert_eq!(ring.pick_keyless().unwrap().name, bs[1].name);
        }
    }
}
