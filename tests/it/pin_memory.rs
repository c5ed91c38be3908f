//! One million live pins stay within 200 MB of resident memory (issue: performance). Its own
//! test binary, so no other test's allocations share the process.

use std::time::Duration;

use mrtr_router::internals::{BackendKey, PinKey, PinKind, PinTable, PinTtls};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_million_pins_fit_in_200_mb() {
    if crate::support::ran_alone() {
        return;
    }
    let d = Duration::from_secs(600);
    let ttls = PinTtls {
        client: d,
        request_state: d,
        task: d,
        session: d,
        replay_window: d,
    };
    let table = PinTable::new();
    let before = rss_bytes();
    for i in 0..1_000_000u32 {
        let kind = PinKind::ALL[(i % 4) as usize];
        // Keys as long as real handles: the table keeps only their 16-byte digest.
        let handle = format!("v1.{i:08}-M0AF2PbQoc_6m1A-vIOZqJnl83iRyE6yJJWsqjhoia4C7CmXa_eC-3G_2UBSPOXiesKaEACpkvtt");
        table.pin(
            PinKey::new(kind, handle.as_bytes()),
            BackendKey(u64::from(i % 7)),
            1,
            1,
            &ttls,
        );
    }
    let grown = rss_bytes().saturating_sub(before);
    println!("1,000,000 pins: +{:.1} MiB resident", grown as f64 / (1 << 20) as f64);
    assert_eq!(table.len(), 1_000_000);
    assert!(grown < 200 * 1024 * 1024, "{grown} bytes");
}
