//! The config as a running router sees it: every duration at its documented maximum.

mod support;

use std::time::Duration;

use support::*;

/// The largest value every duration key accepts (`config::defaults::MAX_DURATION`).
const MAX: &str = "3650days";

#[tokio::test]
async fn a_router_with_every_duration_at_its_maximum_serves_reloads_and_stops() {
    let worker = start_worker("worker-0").await;
    let port = worker.addr.port();
    let extra = format!(
        "[server]\nheader_read_timeout = \"{MAX}\"\nbody_read_timeout = \"{MAX}\"\nupstream_timeout = \"{MAX}\"\n\
         stream_idle_timeout = \"{MAX}\"\nshutdown_grace = \"{MAX}\"\n\
         [routing]\npin_idle_ttl = \"{MAX}\"\nsession_idle_ttl = \"{MAX}\"\ntask_idle_ttl = \"{MAX}\"\n\
         replay_window = \"{MAX}\"\ndrain_timeout = \"{MAX}\"\n\
         [health]\ninterval = \"{MAX}\"\ntimeout = \"{MAX}\"\n\
         [tokens]\nkeys = [\"{}\"]\ntoken_ttl = \"{MAX}\"\nsession_ttl = \"{MAX}\"\n\
         [discovery]\ndns = \"127.0.0.1:{port}\"\ninterval = \"{MAX}\"\n",
        "k".repeat(32)
    );
    let fleet = Fleet::start_with(vec![worker], &extra).await;
    let snap = fleet.shared.snapshot();
    assert_eq!(
        snap.config.routing.drain_timeout,
        mrtr_router::config::defaults::MAX_DURATION
    );
    assert_eq!(
        snap.config.server.shutdown_grace,
        mrtr_router::config::defaults::MAX_DURATION
    );
    drop(snap);

    // A whole two-round call: pins and tokens with the longest lifetimes.
    let a = fleet.post(&[], &start_call("max-1", 2)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let b = fleet.post(&[], &confirm("max-1", 2)).await;
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");

    let discovered = || {
        fleet
            .shared
            .backend_states()
            .iter()
            .any(|(b, _)| b.name.starts_with("dns:"))
    };
    eventually(Duration::from_secs(10), "the discovered backend", discovered).await;
    // Removing the static backend drains it until now + drain_timeout; the discovered one
    // (the same worker) serves on.
    fleet.reconfigure(&[]);
    let c = fleet.post(&[], &start_call("max-2", 1)).await;
    assert_eq!(c.status, 200, "{:?}", c.body);

    // shutdown_grace at its maximum: idle connections still close at once.
    fleet.shutdown().await;
}
