//! Races behind fleet changes, made deterministic: an answer from an instance ejected while the
//! request was in flight, and a backend removed while a call on it is still answering.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use mrtr_router::control::PinKind;
use mrtr_router::example::Worker;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const FAST_HEALTH: &str =
    "[health]\ninterval = \"50ms\"\ntimeout = \"200ms\"\nunhealthy_after = 2\nhealthy_after = 2\n";

/// A backend instance shutting down gracefully (it stops accepting, then finishes what it had
/// in hand: what uvicorn, hyper or any SDK server does on SIGTERM) answers `pending` after the
/// router ejected it; its successor then starts at the same address. The call lives in the old
/// instance, so its follow-up must end with `pinned_backend_unavailable` and never reach the
/// successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answered_by_an_instance_already_ejected_never_follows_into_its_successor() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spec = BackendSpec {
        name: "b".into(),
        url: format!("http://{addr}"),
        weight: 1,
    };
    let fleet = Arc::new(Fleet::start_backends(Vec::new(), &[spec], FAST_HEALTH).await);
    let start = {
        let fleet = fleet.clone();
        tokio::spawn(async move { fleet.post(&[], &start_call("late-1", 2)).await })
    };
    // The old instance takes the request in hand (health checks connect and close at once; the
    // router's connection is the one carrying a POST).
    let mut conn = loop {
        let (c, _) = tokio::time::timeout(REQUEST_DEADLINE, listener.accept())
            .await
            .expect("the router connects")
            .unwrap();
        let mut first = [0u8; 4];
        if let Ok(Ok(4)) = tokio::time::timeout(Duration::from_millis(500), c.peek(&mut first)).await {
            if &first == b"POST" {
                break c;
            }
        }
    };
    let request = read_http_request(&mut conn).await.expect("a whole request in time");
    assert!(request.contains("\"late-1\""), "{request}");
    let epoch_at_send = fleet.control.backend("b").unwrap().epoch;
    // It stops accepting: the router ejects it.
    drop(listener);
    let shared = fleet.control.clone();
    eventually(Duration::from_secs(5), "ejection", || {
        !shared.backend("b").unwrap().healthy
    })
    .await;
    // Then it finishes the request it had: the call waits for a confirmation, in this instance.
    let body = json!({"jsonrpc": "2.0", "id": 1, "messageId": "late-1",
                      "result": {"pending": true, "round": 1, "worker": "b"}})
    .to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-worker: b\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    // ... and exits.
    conn.shutdown().await.unwrap();
    drop(conn);
    let a = start.await.unwrap();
    assert_eq!(a.json()["result"]["pending"], true, "{a:?}");
    let pin = fleet
        .control
        .pin(PinKind::Client, "late-1")
        .expect("the call is pinned");
    // The successor comes up at the same address and is re-admitted.
    let successor = Worker::start("b", TcpListener::bind(addr).await.unwrap());
    eventually(Duration::from_secs(5), "re-admission", || {
        shared.backend("b").unwrap().healthy
    })
    .await;
    let epoch_now = fleet.control.backend("b").unwrap().epoch;
    let b = fleet.post(&[], &confirm("late-1", 2)).await;
    assert_eq!(
        successor.state.unknown_followups.load(SeqCst),
        0,
        "misroute: the follow-up of a call held by the old instance reached its successor \
         (request sent under epoch {epoch_at_send}, pin recorded with epoch {}, backend epoch now {epoch_now}; \
         answer {} {:?}: {})",
        pin.epoch,
        b.status,
        b.router_error(),
        String::from_utf8_lossy(&b.body)
    );
    assert_eq!(b.status, 503, "{b:?}");
    assert_eq!(b.router_error(), Some("pinned_backend_unavailable"));
}

/// A backend removed from the config while a long tool call runs on it (an SSE answer still
/// streaming) drains: the call's `pending` answer arrives after the removal, and its follow-up
/// must still reach that backend, which is running and within `drain_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_backend_is_not_forgotten_while_a_call_on_it_is_still_answering() {
    let fleet = Fleet::start(2, "").await;
    let holder = fleet.workers[0].state.name.clone();
    let mid = (0..)
        .map(|i| format!("slow-{i}"))
        .find(|k| *fleet.control.view().ring_owner(k).unwrap() == *holder)
        .unwrap();
    let req = http::Request::post(fleet.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            stream_call(Some(&mid), json!({"events": 2, "gated": true, "pending": true})).to_string(),
        )))
        .unwrap();
    let resp = tokio::time::timeout(REQUEST_DEADLINE, fleet.client.request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.headers()["x-worker"], holder.as_str());
    let mut body = resp.into_body();
    read_until(&mut body, "notifications/progress").await;
    // The holder is removed while its answer is still on the way.
    fleet.reconfigure(&fleet.specs()[1..]);
    fleet.control.sweep();
    let still_known = fleet.control.backends().iter().any(|b| *b.name == *holder && b.removed);
    fleet.workers[0].state.release();
    let text = read_until(&mut body, "\"pending\":true").await;
    assert!(text.contains(&holder), "{text}");
    let b = fleet
        .post(
            &[],
            &json!({"jsonrpc": "2.0", "id": 2, "messageId": mid, "method": "tools/call", "params": {"name": "whoami"}}),
        )
        .await;
    assert_eq!(
        (b.status.as_u16(), b.router_error(), b.worker()),
        (200, None, holder.clone()),
        "the follow-up of a call started before the drain must reach its backend; the draining backend \
         was {} by the sweep that ran while the call's answer was in flight: {}",
        if still_known { "kept" } else { "forgotten" },
        String::from_utf8_lossy(&b.body)
    );
}

// ---- bounded load ---------------------------------------------------------------------------
