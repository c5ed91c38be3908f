//! The callers `[quotas]` refused lately, for the status page (docs/src/observability.md): counts
//! per caller and quota in one-minute windows, the last [`MINUTES`] of them, each window at most
//! [`MAX_ENTRIES`] entries (a refusal past them counts in `others`). Written only when a request
//! is refused; a caller is kept as its 16-byte key, shown as the access log's `caller` text.

use std::time::Instant;

use parking_lot::Mutex;

use super::CallerKey;

/// One-minute windows kept: "the last minutes" the status page shows.
pub const MINUTES: usize = 5;
/// Entries (caller and quota) per window: a flood of distinct callers fills it, and the rest
/// are counted together.
pub const MAX_ENTRIES: usize = 64;

/// One caller's refusals by one quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedCaller {
    /// The access log's `caller` text: an address (IPv6 as its /64) or a key's digest.
    pub caller: String,
    /// The access log's `quota` text: `rate/caller`, `in_flight/tool`, `body_bytes/caller`...
    pub quota: String,
    pub count: u64,
}

struct Entry {
    caller: CallerKey,
    quota: &'static str,
    scope: &'static str,
    count: u64,
}

#[derive(Default)]
struct Window {
    /// Minutes since the table's start that this window counts.
    minute: u64,
    entries: Vec<Entry>,
    others: u64,
}

/// The refusals of the last [`MINUTES`] minutes.
pub struct RefusedCallers {
    start: Instant,
    windows: Mutex<[Window; MINUTES]>,
}

impl RefusedCallers {
    pub fn new(start: Instant) -> RefusedCallers {
        RefusedCallers {
            start,
            windows: Mutex::new(Default::default()),
        }
    }

    fn minute(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_secs() / 60
    }

    /// Counts one refusal of `caller` by `quota`/`scope` (the labels of
    /// `mrtr_quota_refusals_total`).
    pub fn note(&self, caller: CallerKey, quota: &'static str, scope: &'static str, now: Instant) {
        let minute = self.minute(now);
        let mut windows = self.windows.lock();
        let w = &mut windows[(minute % MINUTES as u64) as usize];
        if w.minute != minute {
            *w = Window {
                minute,
                ..Window::default()
            };
        }
        let same = |e: &Entry| e.caller == caller && e.quota == quota && e.scope == scope;
        match w.entries.iter().position(same) {
            Some(i) => w.entries[i].count += 1,
            None if w.entries.len() < MAX_ENTRIES => w.entries.push(Entry {
                caller,
                quota,
                scope,
                count: 1,
            }),
            None => w.others += 1,
        }
    }

    /// The `n` callers refused most in the last [`MINUTES`] minutes (this one included), most
    /// first, and the refusals of callers past each window's entries.
    pub fn top(&self, n: usize, now: Instant) -> (Vec<RefusedCaller>, u64) {
        let minute = self.minute(now);
        let windows = self.windows.lock();
        let live = windows
            .iter()
            .filter(|w| w.minute + (MINUTES as u64) > minute && w.minute <= minute);
        let mut sums: Vec<(CallerKey, &'static str, &'static str, u64)> = Vec::new();
        let mut others = 0;
        for w in live {
            others += w.others;
            for e in &w.entries {
                match sums
                    .iter_mut()
                    .find(|s| s.0 == e.caller && s.1 == e.quota && s.2 == e.scope)
                {
                    Some(s) => s.3 += e.count,
                    None => sums.push((e.caller, e.quota, e.scope, e.count)),
                }
            }
        }
        drop(windows);
        sums.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.bytes().cmp(b.0.bytes())));
        let top = sums
            .into_iter()
            .take(n)
            .map(|(caller, quota, scope, count)| RefusedCaller {
                caller: caller.log_text(),
                quota: format!("{quota}/{scope}"),
                count,
            })
            .collect();
        (top, others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::time::Duration;

    fn ip(s: &str) -> CallerKey {
        CallerKey::from_ip(s.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn counts_by_caller_and_quota_most_first_as_the_access_log_names_them() {
        let t0 = Instant::now();
        let r = RefusedCallers::new(t0);
        for _ in 0..3 {
            r.note(ip("10.0.0.2"), "rate", "caller", t0);
        }
        r.note(ip("10.0.0.1"), "rate", "caller", t0);
        r.note(ip("2001:db8::1"), "in_flight", "tool", t0 + Duration::from_secs(61));
        let (top, others) = r.top(10, t0 + Duration::from_secs(61));
        let got: Vec<_> = top
            .iter()
            .map(|c| (c.caller.as_str(), c.quota.as_str(), c.count))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.2", "rate/caller", 3),
                ("10.0.0.1", "rate/caller", 1),
                ("2001:db8::/64", "in_flight/tool", 1)
            ]
        );
        assert_eq!(others, 0);
        assert_eq!(r.top(1, t0).0.len(), 1);
    }

    #[test]
    fn old_minutes_are_forgotten_and_each_window_is_bounded() {
        let t0 = Instant::now();
        let r = RefusedCallers::new(t0);
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            r.note(CallerKey::from_ip(IpAddr::from(i.to_be_bytes())), "rate", "caller", t0);
        }
        let (top, others) = r.top(usize::MAX, t0);
        assert_eq!((top.len(), others), (MAX_ENTRIES, 10));
        let later = t0 + Duration::from_secs(60 * MINUTES as u64);
        assert_eq!(r.top(usize::MAX, later), (Vec::new(), 0));
        // The window of that minute is reused, not added to.
        r.note(ip("10.0.0.9"), "rate", "caller", later);
        assert_eq!(r.top(usize::MAX, later).0.len(), 1);
    }
}
