//! A pin's life after its call (DESIGN §4): expiry counted once however the pin is found gone.

mod support;

use std::time::Duration;

use mrtr_router::pins::{PinKey, PinKind};
use support::*;

#[tokio::test]
async fn a_pin_that_idles_out_before_its_follow_up_counts_as_expired_once() {
    let fleet = Fleet::start(1, "[routing]\npin_idle_ttl = \"100ms\"").await;
    let start = fleet.post(&[], &start_call("late", 2)).await;
    assert_eq!(start.json()["result"]["pending"], true);
    let key = PinKey::new(PinKind::Client, b"late");
    eventually(Duration::from_secs(10), "the pin idles out", || {
        fleet.shared.pins.peek(key).is_none()
    })
    .await;
    // The late follow-up's lookup finds the entry past its deadline and drops it (the background
    // sweep, once a second, is very unlikely to get there first in the few ms between).
    let late = fleet.post(&[], &confirm("late", 2)).await;
    assert_eq!(late.json()["result"]["content"][0]["text"], "done");
    assert!(fleet.shared.pins.is_empty());
    // Sweeps report it, whichever removed it, and only once.
    mrtr_router::fleet::sweep_once(&fleet.shared);
    mrtr_router::fleet::sweep_once(&fleet.shared);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_expired_total{kind=\"client\"}"), Some(1.0));
}
