//! Unit tests of `keeper`: what a list a client got costs, and labels.

use super::{labelable, Catalog, CatalogMetrics, ClientList, SMALL_LIST};
use crate::catalog::definition::{MAX_CONTAINERS, MAX_VALUES};

/// A `tools/list` answer listing `n` tools named `t0`, `t1`, ...
fn list(n: usize) -> Vec<u8> {
    let tools: Vec<_> = (0..n)
        .map(|i| serde_json::json!({"name": format!("t{i}"), "inputSchema": {"type": "object"}}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}})).unwrap()
}

/// A list a client got is read when small, or when large and nothing else large is being
/// read; larger than `max_bytes`, never.
#[test]
fn a_list_a_client_got_is_read_within_its_bounds() {
    let catalog = Catalog::new(CatalogMetrics::register(&prometheus::Registry::new()));
    catalog.know(["b"]);
    let (small, large) = (list(3), list(5000));
    assert!(small.len() <= SMALL_LIST && large.len() > SMALL_LIST);
    let told = |c: &Catalog| c.fleet.lock().backend("b").map_or(0, |t| t.seen_otherwise.len());
    let declined = |c: &Catalog, msg: &[u8], max_bytes| c.client_saw("b", msg, max_bytes) == ClientList::Declined;
    assert!(declined(&catalog, &large, large.len() - 1), "over max_bytes");
    assert_eq!(told(&catalog), 0);
    let empties = vec![serde_json::json!([]); MAX_CONTAINERS];
    let tool = serde_json::json!({"name": "t", "inputSchema": {"type": "object", "x": empties}});
    let dense = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [tool]}}));
    assert!(
        declined(&catalog, &dense.unwrap(), usize::MAX),
        "too many objects and arrays"
    );
    let zeros = vec![0; MAX_VALUES];
    let tool = serde_json::json!({"name": "t", "inputSchema": {"type": "object", "x": zeros}});
    let numbers = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [tool]}}));
    assert!(declined(&catalog, &numbers.unwrap(), usize::MAX), "too many values");
    assert_eq!(told(&catalog), 0);
    // One claim at a time, taken before any thread is: a second is refused until the
    // first is given back by its read.
    assert_eq!(catalog.client_saw("b", &large, large.len()), ClientList::Claimed);
    assert!(!catalog.claim_large_read("b", &large, large.len()));
    assert!(
        declined(&catalog, &large, large.len()),
        "another large one is being read"
    );
    assert_eq!(told(&catalog), 0);
    assert_eq!(
        catalog.client_saw("b", &small, large.len()),
        ClientList::Read { changed: true },
        "a small one is read all the same"
    );
    assert_eq!(told(&catalog), 3);
    assert!(catalog.read_claimed("b", &large), "the claimed read");
    assert_eq!(told(&catalog), crate::catalog::fleet::TOLD_MAX);
    assert_eq!(
        catalog.client_saw("b", &large, large.len()),
        ClientList::Claimed,
        "given back"
    );
}

#[test]
fn a_label_is_a_short_printable_name() {
    assert!(labelable("search_v2.docs-x"));
    assert!(labelable(&"a".repeat(128)));
    for refused in [
        String::new(),
        "a".repeat(129),
        "a\u{2028}b".into(),
        "a\u{202E}b".into(),
        "a\rb".into(),
    ] {
        assert!(!labelable(&refused), "{refused:?}");
    }
}
