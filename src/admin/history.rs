//! The status page's history: a bounded ring of one-second samples of the metrics (requests and
//! errors per second, the router's and each backend's), and the last outcome of the config
//! reloads and of the issuer's key refreshes, all read off the Prometheus collectors by
//! `status::sample`, a task on a one-second timer. The request path never writes here: it counts in
//! the metrics as it always does, and this reads them.
//!
//! Memory: [`SAMPLES`] one-second samples of two `u32` per series, 2,400 bytes per backend and
//! 2,400 for the router (a backend's series is dropped with the backend), plus the map's entry
//! and name per backend (`history_memory_is_bounded` checks the figure the book states).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::core::Collector;

use crate::metrics::Metrics;

/// One-second samples kept: five minutes.
pub const SAMPLES: usize = 300;
/// How often [`sample`] reads the metrics.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Requests and errors in each second of the window, oldest first from the ring's head.
struct Series {
    requests: [u32; SAMPLES],
    errors: [u32; SAMPLES],
}

impl Series {
    fn new() -> Box<Series> {
        Box::new(Series {
            requests: [0; SAMPLES],
            errors: [0; SAMPLES],
        })
    }
}

/// A series with the counters it was last computed from.
struct Tracked {
    series: Box<Series>,
    last: (u64, u64),
}

impl Tracked {
    fn new(now: (u64, u64)) -> Tracked {
        Tracked {
            series: Series::new(),
            last: now,
        }
    }

    /// Writes the change since the last sample at `slot`.
    fn record(&mut self, slot: usize, now: (u64, u64)) {
        let delta = |now: u64, last: u64| u32::try_from(now.saturating_sub(last)).unwrap_or(u32::MAX);
        self.series.requests[slot] = delta(now.0, self.last.0);
        self.series.errors[slot] = delta(now.1, self.last.1);
        self.last = now;
    }
}

/// The last change of an `ok`/`error` counter pair: which moved, and when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastOutcome {
    counts: (u64, u64),
    /// `Some((ok, at_ms))`: the last sample that saw either counter move; `ok` false when the
    /// error counter moved (in a second where both moved, the error is the one shown).
    pub last: Option<(bool, u64)>,
}

impl LastOutcome {
    fn record(&mut self, now: (u64, u64), at_ms: u64) {
        if now.1 > self.counts.1 {
            self.last = Some((false, at_ms));
        } else if now.0 > self.counts.0 {
            self.last = Some((true, at_ms));
        }
        self.counts = now;
    }
}

/// What one sample reads of the metrics: every counter is a total since the start.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Totals {
    /// Requests the router answered (proxied, and its own error answers), and its own errors.
    pub router: (u64, u64),
    /// Per backend: requests (answered, and failed talking to it), errors (5xx answers and
    /// failures talking to it).
    pub backends: Vec<(Arc<str>, (u64, u64))>,
    /// `mrtr_config_reloads_total` and `mrtr_jwks_refreshes_total`, `ok` and `error`.
    pub reloads: (u64, u64),
    pub refreshes: (u64, u64),
}

struct Ring {
    /// Samples taken so far; the newest is `taken - 1`, in slot `(taken - 1) % SAMPLES`.
    taken: u64,
    router: Tracked,
    backends: HashMap<Arc<str>, Tracked>,
    reloads: LastOutcome,
    refreshes: LastOutcome,
}

/// The ring, behind a lock the sampler takes once a second and each status build once.
pub struct History {
    ring: Mutex<Ring>,
}

/// A window of the history: samples `from..to` (sample numbers), each series as long.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub from: u64,
    pub to: u64,
    pub router: (Vec<u32>, Vec<u32>),
    /// By backend name; a backend newer than `from` has zeros before it appeared.
    pub backends: HashMap<Arc<str>, (Vec<u32>, Vec<u32>)>,
    pub reloads: LastOutcome,
    pub refreshes: LastOutcome,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            ring: Mutex::new(Ring {
                taken: 0,
                router: Tracked::new((0, 0)),
                backends: HashMap::new(),
                reloads: LastOutcome::default(),
                refreshes: LastOutcome::default(),
            }),
        }
    }

    /// Adds one sample: the change of each counter since the last one. A backend seen for the
    /// first time starts at its counts now (its first second reads 0); one no longer listed is
    /// dropped with its series.
    pub fn record(&self, totals: &Totals, at_ms: u64) -> u64 {
        let mut ring = self.ring.lock();
        let slot = (ring.taken % SAMPLES as u64) as usize;
        let first = ring.taken == 0;
        if first {
            ring.router.last = totals.router;
            ring.reloads.counts = totals.reloads;
            ring.refreshes.counts = totals.refreshes;
        }
        ring.router.record(slot, totals.router);
        ring.backends
            .retain(|name, _| totals.backends.iter().any(|(n, _)| n == name));
        for (name, counts) in &totals.backends {
            let tracked = ring
                .backends
                .entry(name.clone())
                .or_insert_with(|| Tracked::new(*counts));
            tracked.record(slot, *counts);
        }
        ring.reloads.record(totals.reloads, at_ms);
        ring.refreshes.record(totals.refreshes, at_ms);
        ring.taken += 1;
        ring.taken
    }

    /// Samples taken so far (the next sample's number).
    #[cfg(test)]
    pub fn taken(&self) -> u64 {
        self.ring.lock().taken
    }

    /// The samples after `since` (all those kept when `None`, or when `since` is older than
    /// the ring).
    pub fn window(&self, since: Option<u64>) -> Window {
        let ring = self.ring.lock();
        let to = ring.taken;
        let oldest = to.saturating_sub(SAMPLES as u64);
        let from = since.map_or(oldest, |s| s.clamp(oldest, to));
        let take = |s: &Series| {
            let slots = (from..to).map(|n| (n % SAMPLES as u64) as usize);
            (
                slots.clone().map(|i| s.requests[i]).collect(),
                slots.map(|i| s.errors[i]).collect(),
            )
        };
        Window {
            from,
            to,
            router: take(&ring.router.series),
            backends: ring
                .backends
                .iter()
                .map(|(name, t)| (name.clone(), take(&t.series)))
                .collect(),
            reloads: ring.reloads,
            refreshes: ring.refreshes,
        }
    }
}

/// The bytes the ring holds for `backends` backends, their names aside.
#[cfg(test)]
pub fn memory(backends: usize) -> usize {
    let series = std::mem::size_of::<Series>();
    let entry = std::mem::size_of::<(Arc<str>, Tracked)>() + std::mem::size_of::<u64>();
    std::mem::size_of::<Ring>() + series + backends * (series + entry)
}

/// Sums the `f64` values of a collector's series whose labels pass `keep`, grouped by the
/// value of the label `by` (or all in one when `by` is empty).
pub(super) fn sum_by(
    collector: &dyn Collector,
    by: &str,
    keep: impl Fn(&[prometheus::proto::LabelPair]) -> bool,
) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for family in collector.collect() {
        for m in family.get_metric() {
            let labels = m.get_label();
            if !keep(labels) {
                continue;
            }
            let key = labels
                .iter()
                .find(|l| l.name() == by)
                .map_or_else(String::new, |l| l.value().to_string());
            let value = match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                prometheus::proto::MetricType::GAUGE => m.get_gauge().get_value(),
                _ => continue,
            };
            *out.entry(key).or_default() += value;
        }
    }
    out
}

/// The value of `name` among `labels`.
pub(super) fn label<'a>(labels: &'a [prometheus::proto::LabelPair], name: &str) -> &'a str {
    labels.iter().find(|l| l.name() == name).map_or("", |l| l.value())
}

/// What the metrics say now, for one sample.
pub fn totals(metrics: &Metrics, backends: &[Arc<str>]) -> Totals {
    let all = |_: &[prometheus::proto::LabelPair]| true;
    // One pass over `mrtr_requests_total`: all answers, and the 5xx ones, per backend.
    let (mut answered, mut failed) = (HashMap::<String, f64>::new(), HashMap::<String, f64>::new());
    for family in metrics.requests_total.collect() {
        for m in family.get_metric() {
            let (labels, n) = (m.get_label(), m.get_counter().get_value());
            *answered.entry(label(labels, "backend").to_string()).or_default() += n;
            if label(labels, "status").starts_with('5') {
                *failed.entry(label(labels, "backend").to_string()).or_default() += n;
            }
        }
    }
    let upstream = sum_by(&metrics.upstream_errors, "backend", all);
    let router_errors: f64 = sum_by(&metrics.router_errors, "", all).values().sum();
    let proxied: f64 = answered.values().sum();
    let n = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0) as u64;
    let reloads = sum_by(&metrics.config_reloads, "result", all);
    let refreshes = sum_by(&metrics.jwks_refreshes, "result", all);
    Totals {
        router: ((proxied + router_errors) as u64, router_errors as u64),
        backends: backends
            .iter()
            .map(|b| {
                let attempts = n(&answered, b) + n(&upstream, b);
                (b.clone(), (attempts, n(&failed, b) + n(&upstream, b)))
            })
            .collect(),
        reloads: (n(&reloads, "ok"), n(&reloads, "error")),
        refreshes: (n(&refreshes, "ok"), n(&refreshes, "error")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(router: (u64, u64), backends: &[(&str, (u64, u64))]) -> Totals {
        Totals {
            router,
            backends: backends.iter().map(|(n, c)| (Arc::from(*n), *c)).collect(),
            ..Totals::default()
        }
    }

    #[test]
    fn a_sample_is_the_change_since_the_last_one() {
        let h = History::new();
        h.record(&totals((100, 5), &[("a", (10, 1))]), 0);
        h.record(&totals((130, 6), &[("a", (25, 1))]), 1000);
        h.record(&totals((131, 6), &[("a", (25, 3)), ("b", (7, 7))]), 2000);
        let w = h.window(None);
        assert_eq!((w.from, w.to), (0, 3));
        assert_eq!(w.router, (vec![0, 30, 1], vec![0, 1, 0]));
        assert_eq!(w.backends[&Arc::from("a")], (vec![0, 15, 0], vec![0, 0, 2]));
        // b appeared at the third sample: it starts at its counts then.
        assert_eq!(w.backends[&Arc::from("b")], (vec![0, 0, 0], vec![0, 0, 0]));
        let since = h.window(Some(2));
        assert_eq!((since.from, since.to, since.router.0), (2, 3, vec![1]));
        assert_eq!(h.window(Some(3)).router.0, Vec::<u32>::new());
        // A backend gone is dropped with its series.
        h.record(&totals((131, 6), &[("b", (7, 7))]), 3000);
        assert!(!h.window(None).backends.contains_key("a"));
    }

    #[test]
    fn the_ring_keeps_the_last_samples_only() {
        let h = History::new();
        for i in 0..(SAMPLES as u64 + 50) {
            h.record(&totals((i * 2, 0), &[]), i * 1000);
        }
        let w = h.window(None);
        assert_eq!((w.from, w.to), (50, SAMPLES as u64 + 50));
        assert_eq!(w.router.0.len(), SAMPLES);
        assert!(w.router.0.iter().all(|&n| n == 2));
        // A client that fell behind the ring gets what is kept.
        assert_eq!(h.window(Some(3)).from, 50);
        // One from the future gets nothing.
        assert_eq!(h.window(Some(10_000)).router.0.len(), 0);
    }

    #[test]
    fn the_last_outcome_is_the_counter_that_moved_last() {
        let h = History::new();
        let with = |reloads, refreshes| Totals {
            reloads,
            refreshes,
            ..Totals::default()
        };
        h.record(&with((1, 0), (0, 0)), 1000);
        assert_eq!(
            h.window(None).reloads.last,
            None,
            "counts before the first sample are no news"
        );
        h.record(&with((2, 0), (0, 1)), 2000);
        let w = h.window(None);
        assert_eq!(
            (w.reloads.last, w.refreshes.last),
            (Some((true, 2000)), Some((false, 2000)))
        );
        h.record(&with((2, 1), (1, 1)), 3000);
        let w = h.window(None);
        assert_eq!(
            (w.reloads.last, w.refreshes.last),
            (Some((false, 3000)), Some((true, 3000)))
        );
    }

    #[test]
    fn history_memory_is_bounded() {
        // What docs/src/observability.md states: 2,400 bytes per series, a few more per backend.
        assert_eq!(std::mem::size_of::<Series>(), 2 * 4 * SAMPLES);
        let per_backend = memory(101) - memory(100);
        assert!((2400..2500).contains(&per_backend), "{per_backend}");
        assert!(memory(100) < 250 * 1024, "{}", memory(100));
    }
}
