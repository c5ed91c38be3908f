//! A pin's life after its call (docs/src/pins.md): the replay window of a finished call, expiry counted
//! once however the pin is found gone, and a follow-up that carries only its routing header.

use std::time::Duration;

use crate::support::*;
use mrtr_router::control::PinKind;
use serde_json::json;

/// The fleet's backends with the first one weighted up: a ring that places many keys elsewhere.
fn reweighted(fleet: &Fleet) -> Vec<BackendSpec> {
    let mut specs = fleet.specs();
    specs[0].weight = 8;
    specs
}

/// A key that the fleet's ring and the [`reweighted`] one give to different workers, so only a
/// pin can keep it on its first worker across the change. Leaves the fleet on its own ring.
fn key_moved_by_reweighting(fleet: &Fleet, prefix: &str) -> String {
    let before = fleet.control.view();
    fleet.reconfigure(&reweighted(fleet));
    let after = fleet.control.view();
    fleet.reconfigure(&fleet.specs());
    (0..1000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| before.ring_owner(k).unwrap() != after.ring_owner(k).unwrap())
        .expect("a re-weighting moves some keys")
}

fn owner(fleet: &Fleet, key: &str) -> String {
    fleet.control.view().ring_owner(key).unwrap()
}

#[tokio::test]
async fn a_follow_up_carrying_only_the_routing_header_finds_its_call() {
    let fleet = Fleet::start(3, "").await;
    let rid = key_moved_by_reweighting(&fleet, "rid");
    let start = fleet
        .post(&[("mcp-routing-id", &rid)], &start_call("body-key", 2))
        .await;
    assert_eq!(start.json()["result"]["pending"], true);
    fleet.reconfigure(&reweighted(&fleet));
    assert_ne!(
        owner(&fleet, &rid),
        start.worker(),
        "the ring alone would send it elsewhere"
    );
    // No messageId in the body: only the pin recorded under the routing id leads it back. The
    // worker answers any method; where it lands is what counts.
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let follow = fleet.post(&[("mcp-routing-id", &rid)], &ping).await;
    assert_eq!(follow.worker(), start.worker());
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_route_decisions_total{source=\"pin\"}"), Some(1.0));
}

#[tokio::test]
async fn a_finished_call_stays_pinned_for_the_replay_window_then_goes() {
    // Long enough that the duplicate right after the final answer falls inside it on a busy machine.
    let fleet = Fleet::start(3, "[routing]\nreplay_window = \"2s\"").await;
    let mid = key_moved_by_reweighting(&fleet, "replay");
    let start = fleet.post(&[], &start_call(&mid, 2)).await;
    assert_eq!(start.json()["result"]["pending"], true);
    fleet.reconfigure(&reweighted(&fleet));
    let done = fleet.post(&[], &confirm(&mid, 2)).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done");
    assert_eq!(done.worker(), start.worker());
    // A duplicate of the last follow-up reaches the call's worker, not the ring's choice.
    let dup = fleet.post(&[], &confirm(&mid, 2)).await;
    assert_eq!(dup.worker(), start.worker());
    assert_eq!(dup.json()["result"], done.json()["result"], "answered idempotently");
    // Once the window ends the key is no longer pinned: a late duplicate goes by the ring.
    eventually(Duration::from_secs(10), "the replay window ends", || {
        fleet.control.pin(PinKind::Client, &mid).is_none()
    })
    .await;
    let late = fleet.post(&[], &confirm(&mid, 2)).await;
    assert_eq!(late.worker(), owner(&fleet, &mid));
    assert_eq!(late.json()["error"]["message"], "unknown messageId");
    assert_eq!(fleet.total_executions(), 1);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_route_decisions_total{source=\"pin\"}"), Some(2.0));
    assert_eq!(metric(&m, "mrtr_route_decisions_total{source=\"ring\"}"), Some(2.0));
    assert_eq!(fleet.control.pin_count(), 0);
}

#[tokio::test]
async fn a_pin_that_idles_out_before_its_follow_up_counts_as_expired_once() {
    let fleet = Fleet::start(1, "[routing]\npin_idle_ttl = \"100ms\"").await;
    let start = fleet.post(&[], &start_call("late", 2)).await;
    assert_eq!(start.json()["result"]["pending"], true);
    eventually(Duration::from_secs(10), "the pin idles out", || {
        fleet.control.pin(PinKind::Client, "late").is_none()
    })
    .await;
    // The late follow-up's lookup finds the entry past its deadline and drops it (the background
    // sweep, once a second, is very unlikely to get there first in the few ms between).
    let late = fleet.post(&[], &confirm("late", 2)).await;
    assert_eq!(late.json()["result"]["content"][0]["text"], "done");
    assert_eq!(fleet.control.pin_count(), 0);
    // Sweeps report it, whichever removed it, and only once.
    fleet.control.sweep();
    fleet.control.sweep();
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_expired_total{kind=\"client\"}"), Some(1.0));
}
