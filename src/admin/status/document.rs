//! The status document's members (docs/src/observability.md, "The status document"): the
//! router, the backends, quotas, auth and the catalog, each read from the metrics' collectors
//! or the state `/backends` shows, and what this reader may see of them.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::{json, Map, Value};

use super::super::history::{self, label, sum_by, LastOutcome, Window};
use super::{Status, View, SENSITIVE, TOP_REFUSED};
use crate::pins::PinKind;
use crate::state::{Shared, Snapshot};
use crate::upstream::unix_ms;

fn outcome(o: &LastOutcome) -> Value {
    match o.last {
        Some((ok, at_ms)) => json!({"result": if ok { "ok" } else { "error" }, "at_ms": at_ms}),
        None => Value::Null,
    }
}

fn counts(map: &std::collections::HashMap<String, f64>, keys: &[&str]) -> Value {
    let mut out = Map::new();
    for k in keys {
        out.insert(k.to_string(), json!(map.get(*k).copied().unwrap_or(0.0) as u64));
    }
    Value::Object(out)
}

/// The status document (docs/src/observability.md, "The status document").
pub fn build(shared: &Shared, status: &Status, view: View) -> Value {
    super::super::refresh_gauges(shared);
    let snap = shared.snapshot();
    let metrics = &shared.metrics;
    let window = status.history.window(view.since);
    let all = |_: &[prometheus::proto::LabelPair]| true;

    // The backends, each from the same collectors /metrics renders.
    let up = sum_by(&metrics.backend_up, "backend", all);
    let inflight = sum_by(&metrics.backend_inflight, "backend", all);
    let draining = sum_by(&metrics.backend_draining, "backend", all);
    let open = sum_by(&metrics.upstream_open, "backend", all);
    let queued = sum_by(&metrics.upstream_queued, "backend", all);
    let mut pins: std::collections::HashMap<String, [u64; 4]> = std::collections::HashMap::new();
    for family in prometheus::core::Collector::collect(&metrics.backend_pins) {
        for m in family.get_metric() {
            let kind = label(m.get_label(), "kind");
            if let Some(k) = PinKind::ALL.iter().position(|p| p.label() == kind) {
                let backend = label(m.get_label(), "backend").to_string();
                pins.entry(backend).or_default()[k] = m.get_gauge().get_value() as u64;
            }
        }
    }
    let states = shared.backend_states();
    let names: Vec<Arc<str>> = states.iter().map(|(b, _)| b.name.clone()).collect();
    let totals = history::totals(metrics, &names);
    let shares = status.shares(&snap);
    let get = |m: &std::collections::HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
    let empty = (Vec::new(), Vec::new());
    let backends: Vec<Value> = states
        .iter()
        .zip(&totals.backends)
        .map(|((b, removed), (_, (requests, errors)))| {
            let name: &str = &b.name;
            let note = b.health_note();
            let by_kind = pins.get(name).copied().unwrap_or_default();
            let open = get(&open, name) as u64;
            let idle = b.pool.idle_len() as u64;
            let series = window.backends.get(name).unwrap_or(&empty);
            let share = shares.iter().find(|(k, _)| *k == b.key).map_or(0.0, |(_, s)| *s);
            json!({
                "name": name,
                "url": b.url(),
                "weight": b.weight(),
                "up": get(&up, name) == 1.0,
                "health": {
                    "since_ms": note.since_ms,
                    "ejected_by": note.ejected_by.map(|e| e.label()),
                    "ejections": note.ejections,
                },
                "incarnation": b.epoch(),
                "draining": get(&draining, name) == 1.0,
                "removed": removed,
                "on_ring": snap.ring.members().iter().any(|m| m.key == b.key),
                "ring_share": share,
                "inflight": get(&inflight, name) as i64,
                "connections": {
                    "protocol": if b.is_http2() { "http2" } else { "http1" },
                    "open": open,
                    "idle": idle.min(open),
                    "busy": open.saturating_sub(idle),
                    "queued": get(&queued, name) as u64,
                },
                "pins": pin_counts(by_kind),
                "requests_total": requests,
                "errors_total": errors,
                "history": {"requests": series.0, "errors": series.1},
            })
        })
        .collect();

    let router = router(shared, &snap, &window);
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": env!("MRTR_COMMIT"),
        "generated_at_ms": unix_ms(SystemTime::now()),
        "started_at_ms": status.started_ms,
        "uptime_seconds": status.started.elapsed().as_secs(),
        "access": access(shared, view),
        "history": {
            "interval_ms": history::INTERVAL.as_millis() as u64,
            "samples": history::SAMPLES,
            "from": window.from,
            "to": window.to,
        },
        "router": router,
        "backends": backends,
        "quotas": quotas(shared, &snap, view),
        "auth": auth(shared, &snap, &window),
        "config": view.sensitive.then(|| snap.config.to_toml()),
        // Tool names and descriptions come from backends: sensitive, as the config is.
        "catalog": snap.config.catalog.as_ref().filter(|_| view.sensitive).map(|_| shared.catalog.summary()),
    })
}

fn pin_counts(by_kind: [u64; 4]) -> Value {
    let mut out = Map::new();
    for kind in PinKind::ALL {
        out.insert(kind.label().to_string(), json!(by_kind[kind as usize]));
    }
    out.insert("total".to_string(), json!(by_kind.iter().sum::<u64>()));
    Value::Object(out)
}

fn access(shared: &Shared, view: View) -> Value {
    let token = shared.snapshot().config.admin.token.is_some();
    let why = match (view.sensitive, token) {
        (true, _) => None,
        (false, true) => Some("the admin token is needed for the config, the refused callers and the drain controls"),
        (false, false) => Some(
            "admin.token is not set and the admin listener is not on loopback: the config, the refused callers \
             and the drain controls are not served",
        ),
    };
    json!({
        "sensitive": view.sensitive,
        "change": view.sensitive,
        "token_configured": token,
        "redacted": if view.sensitive { Vec::new() } else { SENSITIVE.to_vec() },
        "why": why,
    })
}

fn router(shared: &Shared, snap: &Snapshot, window: &Window) -> Value {
    let metrics = &shared.metrics;
    let all = |_: &[prometheus::proto::LabelPair]| true;
    let connections = sum_by(&metrics.connections, "protocol", all);
    let pins = sum_by(&metrics.pins, "kind", all);
    let errors = sum_by(&metrics.router_errors, "reason", all);
    let reloads = sum_by(&metrics.config_reloads, "result", all);
    let decisions: Map<String, Value> = crate::metrics::ROUTE_SOURCES
        .iter()
        .zip(&metrics.decisions_by_source)
        .map(|(s, c)| (s.to_string(), json!(c.get())))
        .collect();
    let mut pin_kinds = [0u64; 4];
    for kind in PinKind::ALL {
        pin_kinds[kind as usize] = pins.get(kind.label()).copied().unwrap_or(0.0) as u64;
    }
    let rounds = prometheus::core::Collector::collect(&metrics.rounds_per_call);
    let rounds = rounds.first().and_then(|f| f.get_metric().first()).map(|m| {
        let h = m.get_histogram();
        let buckets: Vec<Value> = h
            .get_bucket()
            .iter()
            .map(|b| json!({"le": b.upper_bound(), "count": b.cumulative_count()}))
            .collect();
        json!({"buckets": buckets, "count": h.get_sample_count(), "sum": h.get_sample_sum()})
    });
    json!({
        "connections": counts(&connections, &crate::metrics::PROTOCOLS),
        "connections_parked": metrics.connections_parked.get(),
        "requests_per_second": window.router.0.last().copied().unwrap_or(0),
        "errors_per_second": window.router.1.last().copied().unwrap_or(0),
        "errors": counts(&errors, &crate::error::RouterError::REASONS),
        "route_decisions": decisions,
        "ring_members": metrics.ring_members.get(),
        "pins": pin_counts(pin_kinds),
        "pins_lost": metrics.pins_lost.get(),
        "rounds_per_call": rounds,
        "body_buffer": {
            "bytes": metrics.body_buffer.held(),
            "limit": snap.config.server.max_body_buffer_bytes,
        },
        "config_reloads": {
            "ok": reloads.get("ok").copied().unwrap_or(0.0) as u64,
            "error": reloads.get("error").copied().unwrap_or(0.0) as u64,
            "last": outcome(&window.reloads),
        },
        "history": {"requests": window.router.0, "errors": window.router.1},
    })
}

fn quotas(shared: &Shared, snap: &Snapshot, view: View) -> Value {
    let Some(q) = &snap.quotas else {
        return Value::Null;
    };
    let metrics = &shared.metrics;
    let mut refusals = Map::new();
    for family in prometheus::core::Collector::collect(&metrics.quota_refusals) {
        for m in family.get_metric() {
            let (quota, scope) = (label(m.get_label(), "quota"), label(m.get_label(), "scope"));
            refusals.insert(format!("{quota}/{scope}"), json!(m.get_counter().get_value() as u64));
        }
    }
    let (top, others) = match view.sensitive {
        true => {
            let (top, others) = q.refused.top(TOP_REFUSED, Instant::now());
            let top: Vec<Value> = top
                .into_iter()
                .map(|c| json!({"caller": c.caller, "quota": c.quota, "count": c.count}))
                .collect();
            (Value::Array(top), json!(others))
        }
        false => (Value::Null, Value::Null),
    };
    json!({
        "callers_tracked": metrics.quota_callers.get(),
        "tables_full": metrics.quota_tables_full.get(),
        "refusals": refusals,
        "window_minutes": crate::quotas::REFUSED_MINUTES,
        "top_refused": top,
        "top_refused_others": others,
    })
}

fn auth(shared: &Shared, snap: &Snapshot, window: &Window) -> Value {
    if snap.auth.is_none() {
        return Value::Null;
    }
    let metrics = &shared.metrics;
    let outcomes: Map<String, Value> = crate::auth::AUTH_RESULTS
        .iter()
        .zip(&metrics.auth_by_result)
        .map(|(r, c)| (r.to_string(), json!(c.get())))
        .collect();
    let all = |_: &[prometheus::proto::LabelPair]| true;
    let refreshes = sum_by(&metrics.jwks_refreshes, "result", all);
    let loaded = shared.issuer_keys.current().is_some();
    json!({
        "outcomes": outcomes,
        "keys_loaded": loaded,
        "keys_age_seconds": loaded.then(|| metrics.jwks_age.get()),
        "refreshes": counts(&refreshes, &crate::auth::REFRESH_RESULTS),
        "last_refresh": outcome(&window.refreshes),
        "last_refresh_failed": window.refreshes.last.is_some_and(|(ok, _)| !ok),
    })
}
