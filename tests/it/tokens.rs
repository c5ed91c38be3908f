//! Sealed routing tokens (docs/src/tokens.md): several replicas with the same keys route each other's
//! follow-ups with no shared store; bad tokens are refused; backends only see their own bytes.

use std::time::{Duration, SystemTime};

use crate::support::*;
use bytes::Bytes;
use http::Method;
use mrtr_router::internals::{LegacySealingKeys, SealingKeys, TokenKind};
use serde_json::json;

const KEY_A: &str = "key-a-0123456789abcdef0123456789abcdef";
const KEY_B: &str = "key-b-0123456789abcdef0123456789abcdef";

fn tokens(keys: &[&str]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    format!("[tokens]\nkeys = [{}]\n", list.join(", "))
}

fn routing_token(a: &Answer) -> String {
    a.headers
        .get("mcp-routing-id")
        .expect("an answer that pins carries a routing token")
        .to_str()
        .unwrap()
        .to_string()
}

/// Two routers in front of the same workers, with different weights so that their rings
/// disagree: only the token can route B's follow-ups of A's calls right.
async fn two_replicas(extra_a: &str, extra_b: &str) -> (Fleet, Fleet) {
    let a = Fleet::start(3, extra_a).await;
    let mut specs = a.specs();
    specs[0].weight = 6;
    let b = Fleet::start_backends(Vec::new(), &specs, extra_b).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_route_each_others_follow_ups() {
    let (a, b) = two_replicas(&tokens(&[KEY_A]), &tokens(&[KEY_A])).await;
    for i in 0..150 {
        let mid = format!("alt-{i}");
        // Round 1 on A, round 2 on B, round 3 on A: each echoes the token it was given.
        let r1 = a.post(&[], &start_call(&mid, 3)).await;
        let t1 = routing_token(&r1);
        let r2 = b.post(&[("mcp-routing-id", &t1)], &confirm(&mid, 2)).await;
        assert_eq!(r2.json()["result"]["pending"], true, "{mid}: {:?}", r2.json());
        let t2 = routing_token(&r2);
        let r3 = a.post(&[("mcp-routing-id", &t2)], &confirm(&mid, 3)).await;
        assert_eq!(r3.json()["result"]["content"][0]["text"], "done", "{mid}");
        assert_eq!((r1.worker(), r2.worker()), (r3.worker(), r3.worker()));
    }
    assert_eq!(a.total_unknown_followups(), 0);
    assert_eq!(a.total_executions(), 150);
    let mb = b.metrics().await;
    assert_eq!(metric(&mb, "mrtr_route_decisions_total{source=\"token\"}"), Some(150.0));
    // Without the token B's ring sends some follow-ups elsewhere: the setup can tell.
    for i in 0..60 {
        let mid = format!("no-token-{i}");
        a.post(&[], &start_call(&mid, 2)).await;
        b.post(&[], &confirm(&mid, 2)).await;
    }
    assert!(
        a.total_unknown_followups() > 0,
        "the two rings must disagree for this test to mean anything"
    );
}

#[tokio::test]
async fn a_restarted_replica_routes_by_token() {
    let a = Fleet::start(3, &tokens(&[KEY_A])).await;
    let specs = a.specs();
    let r1 = a.post(&[], &start_call("restart-1", 2)).await;
    let t = routing_token(&r1);
    // A fresh router process: no pins at all, same keys.
    let a2 = Fleet::start_backends(Vec::new(), &specs, &tokens(&[KEY_A])).await;
    assert_eq!(a2.control.pin_count(), 0);
    let r2 = a2.post(&[("mcp-routing-id", &t)], &confirm("restart-1", 2)).await;
    assert_eq!(r2.json()["result"]["content"][0]["text"], "done");
    assert_eq!(r2.worker(), r1.worker());
    a.shutdown().await;
}

/// A replica that holds no pin for a call still never moves a follow-up its token names: when
/// the named instance refuses the connection, the client gets 502 (and may retry), never
/// another instance that does not know the call.
#[tokio::test]
async fn a_token_routed_follow_up_is_not_moved_when_its_backend_refuses() {
    let slow_health = format!("{}[health]\ninterval = \"1h\"\nunhealthy_after = 3\n", tokens(&[KEY_A]));
    let (mut a, b) = two_replicas(&slow_health, &slow_health).await;
    let r1 = a.post(&[], &start_call("moved-1", 2)).await;
    let t = routing_token(&r1);
    let holder = r1.worker();
    let at = a.workers.iter().position(|w| w.state.name == holder).unwrap();
    a.workers.remove(at).stop().await;
    let r2 = b.post(&[("mcp-routing-id", &t)], &confirm("moved-1", 2)).await;
    assert_eq!(r2.status, 502, "{r2:?}");
    assert_eq!(r2.router_error(), Some("upstream_unavailable"));
    assert_eq!(a.total_requests(), 0, "no other instance saw the follow-up");
    assert_eq!(a.total_unknown_followups(), 0);
}

#[tokio::test]
async fn key_rotation_old_key_verifies_new_key_signs() {
    let (old, _) = two_replicas(&tokens(&[KEY_A]), &tokens(&[KEY_A])).await;
    let specs = old.specs();
    let rotated = Fleet::start_backends(Vec::new(), &specs, &tokens(&[KEY_B, KEY_A])).await;
    let r1 = old.post(&[], &start_call("rot-1", 3)).await;
    let t_old = routing_token(&r1);
    let r2 = rotated.post(&[("mcp-routing-id", &t_old)], &confirm("rot-1", 2)).await;
    assert_eq!(r2.worker(), r1.worker(), "a token signed with the old key still routes");
    let t_new = routing_token(&r2);
    let new_only = SealingKeys::new(vec![KEY_B.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    assert!(
        new_only.verify(TokenKind::RoutingId, &t_new, SystemTime::now()).is_ok(),
        "the first key signs"
    );
    // A router that only knows the old key refuses the new one.
    let r3 = old.post(&[("mcp-routing-id", &t_new)], &confirm("rot-1", 3)).await;
    assert_eq!(
        (r3.status.as_u16(), r3.router_error()),
        (400, Some("invalid_routing_token"))
    );
    let m = old.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_tokens_rejected_total{reason=\"unknown_key\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn bad_tokens_are_refused_and_never_choose_a_backend() {
    let fleet = Fleet::start(2, &tokens(&[KEY_A])).await;
    let good = routing_token(&fleet.post(&[], &start_call("bad-1", 2)).await);
    let keys = SealingKeys::new(vec![KEY_A.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    let foreign = SealingKeys::new(vec![KEY_B.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    let mut tampered = good.clone().into_bytes();
    let mid = tampered.len() / 2;
    tampered[mid] = if tampered[mid] == b'A' { b'B' } else { b'A' };
    let cases = [
        ("tampered", String::from_utf8(tampered).unwrap(), "bad_signature"),
        // 5 characters short: always an impossible base64 length, so structurally malformed
        // (a cut at a valid length may decode and fail the MAC instead).
        ("truncated", truncate_to_invalid_length(&good), "malformed"),
        (
            "expired",
            keys.seal(
                TokenKind::RoutingId,
                "worker-0",
                1,
                SystemTime::now() - Duration::from_secs(3600),
            ),
            "expired",
        ),
        (
            "foreign key",
            foreign.seal(TokenKind::RoutingId, "worker-0", 1, SystemTime::now()),
            "unknown_key",
        ),
        (
            "a wrapped requestState as the routing header",
            keys.seal_value(TokenKind::RequestState, "s", "worker-0", 1, SystemTime::now()),
            "malformed",
        ),
        (
            "a routing token minted for a task",
            keys.seal(TokenKind::Task, "worker-0", 1, SystemTime::now()),
            "bad_signature",
        ),
    ];
    let served_before = fleet.total_requests();
    for (what, token, reason) in &cases {
        let a = fleet.post(&[("mcp-routing-id", token)], &confirm("bad-1", 2)).await;
        assert_eq!(a.status, 400, "{what}");
        assert_eq!(a.router_error(), Some("invalid_routing_token"), "{what}");
        assert_eq!(a.json()["error"]["code"], -32600, "{what}");
        assert_eq!(a.json()["id"], 3, "{what}");
        let m = fleet.metrics().await;
        assert!(
            metric(&m, &format!("mrtr_tokens_rejected_total{{reason=\"{reason}\"}}")).unwrap_or(0.0) >= 1.0,
            "{what}: {reason}"
        );
    }
    // Sealed session ids and states are checked the same way.
    let bad_session = keys
        .seal_value(TokenKind::Session, "abc", "worker-0", 0, SystemTime::now())
        .replace("abc", "abd");
    let a = fleet
        .post(
            &[("mcp-session-id", &bad_session)],
            &json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
        )
        .await;
    assert_eq!(a.router_error(), Some("invalid_routing_token"));
    let bad_state = foreign.seal_value(TokenKind::RequestState, "s", "worker-0", 1, SystemTime::now());
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","requestState": bad_state}});
    assert_eq!(
        fleet.post(&[], &body).await.router_error(),
        Some("invalid_routing_token")
    );
    let served_after = fleet.total_requests();
    assert_eq!(served_before, served_after, "no refused request reached a backend");
    // The good token still works.
    let ok = fleet.post(&[("mcp-routing-id", &good)], &confirm("bad-1", 2)).await;
    assert_eq!(ok.json()["result"]["content"][0]["text"], "done");
}

/// Cuts a token so its base64 part has a length no base64 text can have (4n + 1).
fn truncate_to_invalid_length(token: &str) -> String {
    let b64_len = |t: &str| t.len() - "mrt2.".len();
    let mut cut = token.len() - 5;
    while b64_len(&token[..cut]) % 4 != 1 {
        cut -= 1;
    }
    token[..cut].to_string()
}

#[tokio::test]
async fn backends_see_their_own_bytes() {
    let fleet = Fleet::start(1, &tokens(&[KEY_A])).await;
    let keys = SealingKeys::new(vec![KEY_A.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    let session = keys.seal_value(TokenKind::Session, "0123456789abcdef", "worker-0", 0, SystemTime::now());
    let state = keys.seal_value(
        TokenKind::RequestState,
        "v1.state/with+odd=chars",
        "worker-0",
        1,
        SystemTime::now(),
    );
    let body =
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","requestState": state}}).to_string();
    let url = format!("http://{}/echo", fleet.router);
    let a = send(
        &fleet.client,
        Method::POST,
        &url,
        &[("mcp-session-id", &session)],
        Bytes::from(body),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let v = a.json();
    let headers = v["headers"].as_array().unwrap();
    let seen_session: Vec<_> = headers
        .iter()
        .filter(|h| h[0] == "mcp-session-id")
        .map(|h| h[1].as_str().unwrap())
        .collect();
    assert_eq!(seen_session, ["0123456789abcdef"]);
    let seen_body: serde_json::Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
    assert_eq!(seen_body["params"]["requestState"], "v1.state/with+odd=chars");
    assert!(
        !v["body"].as_str().unwrap().contains("mrt2."),
        "no wrapped value reaches the backend"
    );
}

/// A replica that never knew the backend a token names (another replica still drains it, or
/// a config in flux) treats the token as a lost pin: 503 with Retry-After, never a 400 (the
/// client did nothing wrong) and never another backend.
#[tokio::test]
async fn a_token_for_a_backend_this_replica_does_not_know_is_a_lost_pin() {
    let a = Fleet::start(2, &tokens(&[KEY_A])).await;
    let r1 = a.post(&[], &start_call("gone-1", 2)).await;
    let holder = r1.worker();
    let t = routing_token(&r1);
    // B was started after the holder left the config (A still drains it).
    let others: Vec<BackendSpec> = a.specs().into_iter().filter(|s| s.name != holder).collect();
    let b = Fleet::start_backends(Vec::new(), &others, &tokens(&[KEY_A])).await;
    let r2 = b.post(&[("mcp-routing-id", &t)], &confirm("gone-1", 2)).await;
    assert_eq!(
        (r2.status.as_u16(), r2.router_error()),
        (503, Some("pinned_backend_unavailable")),
        "{r2:?}"
    );
    assert!(r2.headers.contains_key("retry-after"));
    assert_eq!(a.total_unknown_followups(), 0, "no other backend saw the follow-up");
    let m = b.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_lost_total"), Some(1.0));
    assert_eq!(
        metric(&m, "mrtr_tokens_rejected_total{reason=\"unknown_backend\"}"),
        None
    );
    // With `rehash` the same follow-up goes by B's ring.
    let rehash = Fleet::start_backends(
        Vec::new(),
        &others,
        &format!("{}[routing]\non_pin_lost = \"rehash\"\n", tokens(&[KEY_A])),
    )
    .await;
    let r3 = rehash.post(&[("mcp-routing-id", &t)], &confirm("gone-1", 2)).await;
    assert_eq!(r3.status, 200, "{r3:?}");
    assert_ne!(r3.worker(), holder);
}

/// Each kind of handle has its own tokens: a wrapped `requestState` presented as a session id
/// (or a session as a state) is refused, and so never chooses a backend.
#[tokio::test]
async fn a_wrapped_handle_of_one_kind_is_refused_as_another() {
    let fleet = Fleet::start(2, &tokens(&[KEY_A])).await;
    let keys = SealingKeys::new(vec![KEY_A.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    let state = keys.seal_value(TokenKind::RequestState, "0123abcd", "worker-0", 1, SystemTime::now());
    let session = keys.seal_value(TokenKind::Session, "0123abcd", "worker-0", 0, SystemTime::now());
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let as_session = fleet.post(&[("mcp-session-id", &state)], &ping).await;
    assert_eq!(
        (as_session.status.as_u16(), as_session.router_error()),
        (400, Some("invalid_routing_token"))
    );
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","requestState": session}});
    let as_state = fleet.post(&[], &body).await;
    assert_eq!(
        (as_state.status.as_u16(), as_state.router_error()),
        (400, Some("invalid_routing_token"))
    );
    // Each in its own place is fine.
    assert_eq!(fleet.post(&[("mcp-session-id", &session)], &ping).await.status, 200);
    assert_eq!(fleet.total_requests(), 1, "the refused requests reached no backend");
}

/// A token says nothing about the fleet: the backend's name is in none of its bytes, nor in
/// their base64 decoding.
#[tokio::test]
async fn a_token_reveals_no_backend_name() {
    let fleet = Fleet::start(3, &tokens(&[KEY_A])).await;
    for i in 0..20 {
        let a = fleet.post(&[], &start_call(&format!("opaque-{i}"), 2)).await;
        let t = routing_token(&a);
        let name = a.worker();
        assert!(!t.contains(&name), "{name} in {t}");
        let body = t.strip_prefix("mrt2.").expect("the current format");
        let decoded = base64_decode(body);
        assert!(
            !decoded.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} in {t}"
        );
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        acc = (acc << 6) | value(c) as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Rolling upgrade of the routers: a token the previous release issued (`mrt1.`, HMAC, not
/// bound to a kind) still routes for its lifetime on a router of this release.
#[tokio::test]
async fn tokens_of_the_previous_release_route_for_their_lifetime() {
    let fleet = Fleet::start(3, &tokens(&[KEY_A])).await;
    let r1 = fleet.post(&[], &start_call("upgrade-1", 2)).await;
    let holder = r1.worker();
    let previous = LegacySealingKeys::new(vec![KEY_A.as_bytes().to_vec()], Duration::from_secs(3600)).unwrap();
    let t = previous.seal(&holder, SystemTime::now());
    assert!(t.starts_with("mrt1."));
    let r2 = fleet.post(&[("mcp-routing-id", &t)], &confirm("upgrade-1", 2)).await;
    assert_eq!(r2.json()["result"]["content"][0]["text"], "done", "{r2:?}");
    assert_eq!(r2.worker(), holder);
    let expired = previous.seal(&holder, SystemTime::now() - Duration::from_secs(3601));
    let r3 = fleet
        .post(&[("mcp-routing-id", &expired)], &confirm("upgrade-1", 2))
        .await;
    assert_eq!(r3.router_error(), Some("invalid_routing_token"));
}

/// A backend killed and restarted at the same address: every token issued before the
/// restart, on every replica (one with a local pin for the call, one without), is a lost pin,
/// so no old call ever reaches the new instance; new calls go there as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_before_a_backend_restart_are_lost_pins_on_every_replica() {
    let fast = format!(
        "{}[health]\ninterval = \"30ms\"\ntimeout = \"200ms\"\nunhealthy_after = 2\nhealthy_after = 2\n",
        tokens(&[KEY_A])
    );
    let (mut a, b) = two_replicas(&fast, &fast).await;
    let r1 = a.post(&[], &start_call("before-a", 2)).await;
    let holder = r1.worker();
    let via_a = routing_token(&r1);
    // A call on the same backend started through B: A holds no pin for it.
    let (mid_b, via_b) = (0..500)
        .map(|i| format!("before-b-{i}"))
        .find_map(|mid| {
            let r = futures_block_on(b.post(&[], &start_call(&mid, 2)));
            (r.worker() == holder).then(|| (mid, routing_token(&r)))
        })
        .expect("some key of B's lands on the holder");
    let at = a.workers.iter().position(|w| w.state.name == holder).unwrap();
    let addr = a.workers[at].addr;
    a.workers.remove(at).stop().await;
    let (ha, hb) = (a.control.clone(), b.control.clone());
    eventually(Duration::from_secs(10), "both replicas eject it", || {
        !ha.backend(&holder).unwrap().healthy && !hb.backend(&holder).unwrap().healthy
    })
    .await;
    let successor = mrtr_router::example::Worker::start(&holder, tokio::net::TcpListener::bind(addr).await.unwrap());
    eventually(Duration::from_secs(10), "both replicas re-admit it", || {
        ha.backend(&holder).unwrap().healthy && hb.backend(&holder).unwrap().healthy
    })
    .await;
    for (fleet, mid, token) in [
        (&a, "before-a", &via_a),
        (&b, "before-a", &via_a),
        (&a, mid_b.as_str(), &via_b),
        (&b, mid_b.as_str(), &via_b),
    ] {
        let r = fleet.post(&[("mcp-routing-id", token)], &confirm(mid, 2)).await;
        assert_eq!(
            (r.status.as_u16(), r.router_error()),
            (503, Some("pinned_backend_unavailable")),
            "{mid}: {r:?}"
        );
    }
    assert_eq!(
        successor.state.requests.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "no old call reached the new instance"
    );
    // The restarted instance takes new calls.
    let fresh = (0..500)
        .map(|i| format!("after-{i}"))
        .find(|mid| futures_block_on(a.post(&[], &start_call(mid, 1))).worker() == holder);
    assert!(fresh.is_some(), "new calls reach the restarted backend");
    assert_eq!(
        successor
            .state
            .unknown_followups
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// Runs a future to its end from inside the test's runtime (for `find_map` closures).
fn futures_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Sealed handles in one request that name different backends are refused, whichever the
/// kinds (docs/src/routing.md): each handle's state lives on its own instance, so routing by
/// any one of them would strand the other. Handles that agree route as one.
#[tokio::test]
async fn sealed_handles_that_name_different_backends_are_refused() {
    let fleet = Fleet::start(2, &tokens(&[KEY_A])).await;
    let keys = SealingKeys::new(vec![KEY_A.as_bytes().to_vec()], Duration::from_secs(60)).unwrap();
    let now = SystemTime::now();
    let to = |backend: &str| keys.seal(TokenKind::RoutingId, backend, 1, now);
    let session_on = |backend: &str| keys.seal_value(TokenKind::Session, "0123abcd", backend, 0, now);
    let task_on = |backend: &str| keys.seal_stable(TokenKind::Task, "task-1", backend);
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let served = fleet.total_requests();
    let a = fleet
        .post(
            &[
                ("mcp-routing-id", &to("worker-1")),
                ("mcp-session-id", &session_on("worker-0")),
            ],
            &ping,
        )
        .await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (400, Some("invalid_routing_token")),
        "{a:?}"
    );
    assert_eq!(a.json()["error"]["code"], -32600);
    let get = json!({"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId": task_on("worker-0")}});
    let a = fleet.post(&[("mcp-routing-id", &to("worker-1"))], &get).await;
    assert_eq!(
        (a.status.as_u16(), a.router_error()),
        (400, Some("invalid_routing_token")),
        "{a:?}"
    );
    assert_eq!(fleet.total_requests(), served, "no refused request reached a backend");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_tokens_rejected_total{reason=\"conflict\"}"),
        Some(2.0),
        "{m}"
    );
    // Agreeing, they route together.
    let a = fleet
        .post(
            &[
                ("mcp-routing-id", &to("worker-0")),
                ("mcp-session-id", &session_on("worker-0")),
            ],
            &ping,
        )
        .await;
    assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "worker-0"), "{a:?}");
}
