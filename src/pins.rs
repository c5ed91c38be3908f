//! The pin table: which backend holds each in-flight multi-round call (docs/src/pins.md).
//!
//! Keys are 128-bit digests of what the client echoes (a routing id, a `requestState`, a task
//! id, a session id), so the table never stores client-sized strings. Entries are 40 bytes
//! in a sharded map; expiry is a deadline per entry, enforced on lookup and by [`PinTable::sweep`].
//! Time comes from the table's [`Clock`], which tests drive by hand.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::metrics::PIN_KINDS;
use crate::quotas::OpenCall;
use crate::upstream::BackendKey;

const SHARDS: usize = 64;

/// What kind of handle a pin was learned from; each has its own TTL and metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PinKind {
    /// `Mcp-Routing-Id` / `messageId` of a pending call (docs/src/dialects.md).
    Client = 0,
    /// Digest of a `requestState` from an `input_required` result (§2b).
    RequestState = 1,
    /// A task id from a `resultType: "task"` result (§2b).
    Task = 2,
    /// An `Mcp-Session-Id` issued by a backend (§2c).
    Session = 3,
}

impl PinKind {
    pub const ALL: [PinKind; 4] = [PinKind::Client, PinKind::RequestState, PinKind::Task, PinKind::Session];

    /// Its `kind` label in the pin metrics.
    pub fn label(self) -> &'static str {
        PIN_KINDS[self as usize]
    }

    /// Counts a pin of this kind made, in `mrtr_pins_created_total`.
    pub fn count_created(self, metrics: &crate::metrics::Metrics) {
        metrics.pins_created_by_kind[self as usize].inc();
    }

    /// Counts a pin of this kind finished, in `mrtr_pins_finished_total`.
    pub fn count_finished(self, metrics: &crate::metrics::Metrics) {
        metrics.pins_finished_by_kind[self as usize].inc();
    }
}

/// A pin's key: a keyed 128-bit digest of the kind and the client-visible handle, and the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinKey {
    digest: u128,
    kind: PinKind,
}

impl PinKey {
    pub fn new(kind: PinKind, handle: &[u8]) -> PinKey {
        let mut h = SipHasher13::new_with_keys(0x7069_6e73_2d76_3100, 0x6d72_7472_2d70_696e);
        h.write_u8(kind as u8);
        h.write(handle);
        PinKey {
            digest: h.finish128().as_u128(),
            kind,
        }
    }

    /// The kind of handle it was made from.
    pub fn kind(&self) -> PinKind {
        self.kind
    }

    /// Its digest: the same on every replica, so a sealed handle can carry it.
    pub fn digest(&self) -> u128 {
        self.digest
    }

    /// The key of `kind` whose digest is `digest` (one a sealed handle carried).
    pub fn from_digest(kind: PinKind, digest: u128) -> PinKey {
        PinKey { digest, kind }
    }
}

/// Where the pin table reads the time: milliseconds since the table was made.
#[derive(Clone)]
pub enum Clock {
    /// The monotonic clock.
    Monotonic(Instant),
    /// A clock that moves only when told (tests of expiry, with no sleeping).
    Manual(Arc<AtomicU64>),
}

impl Clock {
    fn now_ms(&self) -> u64 {
        match self {
            Clock::Monotonic(epoch) => epoch.elapsed().as_millis() as u64,
            Clock::Manual(ms) => ms.load(Ordering::Relaxed),
        }
    }
}

/// Per-kind TTLs, taken from the routing config at each call (so reloads apply at once).
#[derive(Debug, Clone, Copy)]
pub struct PinTtls {
    pub client: Duration,
    pub request_state: Duration,
    pub task: Duration,
    pub session: Duration,
    pub replay_window: Duration,
}

impl PinTtls {
    fn idle(&self, kind: PinKind) -> Duration {
        match kind {
            PinKind::Client => self.client,
            PinKind::RequestState => self.request_state,
            PinKind::Task => self.task,
            PinKind::Session => self.session,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    backend: BackendKey,
    /// The backend's epoch when pinned: a pin never follows a backend through an ejection.
    epoch: u32,
    /// Milliseconds since the table's epoch after which the entry is gone.
    deadline_ms: u64,
    /// Rounds the call has had so far (answers that continued it).
    rounds: u32,
    kind: PinKind,
    /// Finished calls linger for the replay window so duplicate follow-ups still land.
    finished: bool,
    /// The caller's open-call slot (`[quotas] max_open_calls`), held while the call is open:
    /// freed when it finishes, expires or is removed.
    hold: Option<OpenCall>,
}

impl Entry {
    fn view(&self) -> Pin {
        Pin {
            backend: self.backend,
            epoch: self.epoch,
            kind: self.kind,
            rounds: self.rounds,
            finished: self.finished,
        }
    }
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub backend: BackendKey,
    pub epoch: u32,
    pub kind: PinKind,
    pub rounds: u32,
    pub finished: bool,
}

/// Counts of what a sweep removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Active pins that idled out, per kind (indexed by `PinKind as usize`).
    pub expired: [u64; 4],
    /// Finished pins whose replay window ended.
    pub retired: u64,
    /// Pins left per backend, by kind (indexed by `PinKind as usize`).
    pub per_backend: HashMap<BackendKey, [usize; 4]>,
}

#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u128(&mut self, n: u128) {
        // Keys are already uniform digests: their low bits are a fine hash.
        self.0 = n as u64;
    }
}

type Shard = HashMap<u128, Entry, BuildHasherDefault<KeyHasher>>;

/// The table of live pins.
pub struct PinTable {
    shards: Box<[Mutex<Shard>]>,
    clock: Clock,
    len: AtomicUsize,
    per_kind: [AtomicI64; 4],
    /// Active pins found expired and removed outside a sweep (by a lookup, or replaced by a new
    /// pin), per kind, until the next sweep reports them with its own: each expiry is counted
    /// by whichever removes the entry, so once, and the metric keeps one writer.
    expired_unswept: [AtomicU64; 4],
}

impl Default for PinTable {
    fn default() -> Self {
        PinTable::new()
    }
}

impl PinTable {
    pub fn new() -> PinTable {
        PinTable::with_clock(Clock::Monotonic(Instant::now()))
    }

    /// A table reading the time from `clock`.
    pub fn with_clock(clock: Clock) -> PinTable {
        PinTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            clock,
            len: AtomicUsize::new(0),
            per_kind: Default::default(),
            expired_unswept: Default::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn shard(&self, key: PinKey) -> &Mutex<Shard> {
        &self.shards[(key.digest >> 64) as usize % SHARDS]
    }

    /// Pins in the table (active and finished-in-replay-window).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the table holds no pin at all: then a request has nothing to look up, and
    /// skips hashing its keys. Acquire pairs with the Release count in [`PinTable::pin`], which
    /// comes before the answer that makes the client send a follow-up.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Pins of one kind in the table.
    pub fn count(&self, kind: PinKind) -> i64 {
        self.per_kind[kind as usize].load(Ordering::Relaxed)
    }

    /// Finds a live pin; an active one has its idle deadline pushed out (a follow-up refreshes it).
    pub fn lookup(&self, key: PinKey, ttls: &PinTtls) -> Option<Pin> {
        let now = self.now_ms();
        let mut shard = self.shard(key).lock();
        let e = shard.get_mut(&key.digest)?;
        if e.deadline_ms <= now {
            let (kind, finished) = (e.kind, e.finished);
            shard.remove(&key.digest);
            drop(shard);
            self.removed(kind);
            self.expired_outside_sweep(kind, finished);
            return None;
        }
        if !e.finished {
            e.deadline_ms = now + ttls.idle(e.kind).as_millis() as u64;
        }
        Some(e.view())
    }

    /// Reads a pin without refreshing it (for `route` and debug output).
    pub fn peek(&self, key: PinKey) -> Option<Pin> {
        let now = self.now_ms();
        let shard = self.shard(key).lock();
        let e = shard.get(&key.digest).filter(|e| e.deadline_ms > now)?;
        Some(e.view())
    }

    /// Pins `key` to `backend` (as it was at `epoch`) as an active call that has had `rounds`
    /// rounds. Returns true when the key was not pinned before (a new pin); an entry past its
    /// deadline counts as gone.
    pub fn pin(&self, key: PinKey, backend: BackendKey, epoch: u32, rounds: u32, ttls: &PinTtls) -> bool {
        self.pin_holding(key, backend, epoch, rounds, ttls, None)
    }

    /// [`PinTable::pin`], the pin holding the call's open-call slot `hold` (an active pin
    /// pinned again keeps the slot it held).
    pub fn pin_holding(
        &self,
        key: PinKey,
        backend: BackendKey,
        epoch: u32,
        rounds: u32,
        ttls: &PinTtls,
        hold: Option<OpenCall>,
    ) -> bool {
        let kind = key.kind;
        let now = self.now_ms();
        let deadline_ms = now + ttls.idle(kind).as_millis() as u64;
        let mut shard = self.shard(key).lock();
        let kept = match shard.get_mut(&key.digest) {
            Some(e) if !e.finished && e.deadline_ms > now => e.hold.take(),
            _ => None,
        };
        let entry = Entry {
            backend,
            epoch,
            deadline_ms,
            rounds,
            kind,
            finished: false,
            hold: hold.or(kept),
        };
        let old = shard.insert(key.digest, entry);
        drop(shard);
        match old {
            None => {
                self.len.fetch_add(1, Ordering::Release);
                self.per_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(old) => {
                let expired = old.deadline_ms <= now;
                if expired {
                    self.expired_outside_sweep(old.kind, old.finished);
                }
                if old.kind != kind {
                    self.per_kind[old.kind as usize].fetch_sub(1, Ordering::Relaxed);
                    self.per_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
                }
                old.kind != kind || old.finished || expired
            }
        }
    }

    /// Marks a call finished: it stays for the replay window, then goes. Returns the pin as
    /// it was if it was active (so the caller counts the finish once).
    pub fn finish(&self, key: PinKey, ttls: &PinTtls) -> Option<Pin> {
        let now = self.now_ms();
        let mut shard = self.shard(key).lock();
        let e = shard.get_mut(&key.digest)?;
        if e.finished || e.deadline_ms <= now {
            return None;
        }
        e.finished = true;
        e.hold = None;
        e.deadline_ms = now + ttls.replay_window.as_millis() as u64;
        Some(Pin {
            finished: false,
            ..e.view()
        })
    }

    fn removed(&self, kind: PinKind) {
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.per_kind[kind as usize].fetch_sub(1, Ordering::Relaxed);
    }

    /// Notes a pin found past its deadline and removed outside a sweep, for the next sweep to
    /// report; a finished pin's deadline ends its replay window, which is no expiry.
    fn expired_outside_sweep(&self, kind: PinKind, finished: bool) {
        if !finished {
            self.expired_unswept[kind as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops every pin whose deadline passed; reports those too that expired since the last
    /// sweep and were removed by other means.
    pub fn sweep(&self) -> Swept {
        let now = self.now_ms();
        let mut swept = Swept::default();
        for (n, unswept) in swept.expired.iter_mut().zip(&self.expired_unswept) {
            *n = unswept.swap(0, Ordering::Relaxed);
        }
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|_, e| {
                if e.deadline_ms > now {
                    swept.per_backend.entry(e.backend).or_default()[e.kind as usize] += 1;
                    return true;
                }
                if e.finished {
                    swept.retired += 1;
                } else {
                    swept.expired[e.kind as usize] += 1;
                }
                self.removed(e.kind);
                false
            });
            if shard.capacity() > 64 && shard.len() * 4 < shard.capacity() {
                shard.shrink_to_fit();
            }
        }
        swept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttls(idle_ms: u64, replay_ms: u64) -> PinTtls {
        let d = Duration::from_millis(idle_ms);
        PinTtls {
            client: d,
            request_state: d,
            task: d,
            session: d,
            replay_window: Duration::from_millis(replay_ms),
        }
    }

    const B1: BackendKey = BackendKey(1);
    const B2: BackendKey = BackendKey(2);

    /// A table on a clock that moves only by [`advance`].
    fn manual() -> (PinTable, Arc<AtomicU64>) {
        let ms = Arc::new(AtomicU64::new(0));
        (PinTable::with_clock(Clock::Manual(ms.clone())), ms)
    }

    fn advance(clock: &AtomicU64, ms: u64) {
        clock.fetch_add(ms, Ordering::Relaxed);
    }

    #[test]
    fn pin_lookup_finish_replay() {
        let t = PinTable::new();
        let long = ttls(60_000, 60_000);
        let k = PinKey::new(PinKind::Client, b"transfer-1");
        assert_ne!(k, PinKey::new(PinKind::Session, b"transfer-1"), "kinds never collide");
        assert!(t.lookup(k, &long).is_none());
        assert!(t.pin(k, B1, 7, 1, &long));
        assert!(!t.pin(k, B1, 7, 2, &long), "re-pin of an active call is not new");
        let p = t.lookup(k, &long).unwrap();
        assert_eq!((p.backend, p.rounds, p.finished), (B1, 2, false));
        assert_eq!(t.finish(k, &long).unwrap().rounds, 2);
        assert!(t.finish(k, &long).is_none(), "finishing twice counts once");
        let p = t.lookup(k, &long).unwrap();
        assert!(p.finished, "a finished call is still found during the replay window");
        assert_eq!((t.len(), t.count(PinKind::Client)), (1, 1));
    }

    #[test]
    fn idle_ttl_expires_and_follow_up_refreshes() {
        let (t, clock) = manual();
        let short = ttls(80, 10);
        let a = PinKey::new(PinKind::Client, b"a");
        let b = PinKey::new(PinKind::Client, b"b");
        t.pin(a, B1, 7, 1, &short);
        t.pin(b, B2, 7, 1, &short);
        // Keep `a` alive with follow-ups for longer than its TTL; `b` gets none.
        for _ in 0..20 {
            assert!(t.lookup(a, &short).is_some());
            advance(&clock, 10);
        }
        let swept = t.sweep();
        assert_eq!(swept.expired[PinKind::Client as usize], 1);
        assert!(t.peek(b).is_none());
        assert_eq!(t.lookup(a, &short).unwrap().backend, B1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn replay_window_ends() {
        let (t, clock) = manual();
        let k = PinKey::new(PinKind::Task, b"t");
        t.pin(k, B1, 7, 1, &ttls(60_000, 30));
        t.finish(k, &ttls(60_000, 30));
        advance(&clock, 29);
        assert!(t.peek(k).is_some(), "still in its replay window");
        advance(&clock, 1);
        assert!(t.peek(k).is_none(), "finished pin outlived its replay window");
        let swept = t.sweep();
        assert_eq!((swept.expired, swept.retired, swept.per_backend.len()), ([0; 4], 1, 0));
        assert!(t.is_empty());
    }

    #[test]
    fn a_pin_a_lookup_finds_expired_is_reported_by_the_next_sweep_once() {
        let (t, clock) = manual();
        let short = ttls(20, 20);
        let idle = PinKey::new(PinKind::Client, b"idle");
        let done = PinKey::new(PinKind::Task, b"done");
        t.pin(idle, B1, 7, 1, &short);
        t.pin(done, B1, 7, 1, &short);
        t.finish(done, &short);
        advance(&clock, 20);
        assert!(
            t.peek(idle).is_none() && t.peek(done).is_none(),
            "both past their deadlines"
        );
        assert!(t.lookup(idle, &short).is_none());
        assert!(t.lookup(done, &short).is_none());
        assert!(t.is_empty(), "the lookups removed both");
        // The finished one ended its replay window: that is no expiry.
        assert_eq!(t.sweep().expired, [1, 0, 0, 0]);
        assert_eq!(t.sweep().expired, [0; 4], "reported once");
    }

    #[test]
    fn re_pinning_an_expired_key_is_a_new_pin_and_reports_the_expiry() {
        let (t, clock) = manual();
        let k = PinKey::new(PinKind::RequestState, b"state");
        t.pin(k, B1, 7, 1, &ttls(20, 20));
        advance(&clock, 20);
        assert!(t.peek(k).is_none(), "past its deadline");
        assert!(t.pin(k, B2, 7, 1, &ttls(60_000, 60_000)));
        assert_eq!((t.len(), t.count(PinKind::RequestState)), (1, 1));
        assert_eq!(t.sweep().expired, [0, 1, 0, 0]);
        assert_eq!(t.lookup(k, &ttls(60_000, 60_000)).unwrap().backend, B2);
    }

    #[test]
    fn counts_per_kind() {
        let t = PinTable::new();
        let l = ttls(60_000, 60_000);
        for i in 0..100u32 {
            t.pin(PinKey::new(PinKind::Session, &i.to_le_bytes()), B1, 7, 1, &l);
        }
        t.pin(PinKey::new(PinKind::Task, b"x"), B1, 7, 1, &l);
        assert_eq!(
            (t.count(PinKind::Session), t.count(PinKind::Task), t.len()),
            (100, 1, 101)
        );
    }
}
