//! Each quota's share on its own (docs/src/quotas.md): the pin table's (`max_open_calls`), a
//! call's rounds past its caller's rate (MRTR-aware admission), requests in flight with SSE
//! answers held (`max_in_flight`), a tool's own rate and calls in flight, the body budget's
//! shares (one HTTP/2 connection's, `max_body_bytes_per_connection`; one caller's on many
//! connections, `max_body_bytes_per_caller`), the caller a PROXY protocol header names, and
//! the configs `check` refuses.

use std::path::Path;
use std::process::Command;

use crate::support::quotas::{assert_quota_refusal, held_sse, UnfinishedBodies};
use crate::support::*;
use mrtr_router::config::Config;
use serde_json::json;
use tokio::net::TcpStream;

/// Callers told apart by the `X-Forwarded-For` that 127.0.0.1, a trusted proxy, adds.
const BY_FORWARDED_IP: &str = "[quotas]\ncaller = \"ip\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n";

fn from(ip: &str) -> [(&'static str, &str); 1] {
    [("x-forwarded-for", ip)]
}

fn refusals(metrics: &str, quota: &str, scope: &str) -> f64 {
    let (q, s) = (format!("quota=\"{quota}\""), format!("scope=\"{scope}\""));
    metric_sum(metrics, "mrtr_quota_refusals_total", &[&q, &s])
}

#[tokio::test]
async fn a_caller_at_its_open_calls_share_leaves_the_pin_table_to_others() {
    const N: u32 = 3;
    let fleet = Fleet::start(2, &format!("{BY_FORWARDED_IP}max_open_calls = {N}\n")).await;
    let (a, b) = (from("203.0.113.7"), from("198.51.100.9"));
    for i in 0..N {
        let started = fleet.post(&a, &start_call(&format!("a-{i}"), 2)).await;
        assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
    }
    let reached = fleet.total_requests();
    let mut refused = start_call("a-over", 2);
    refused["id"] = json!("a-over-id");
    let over = fleet.post(&a, &refused).await;
    assert_eq!(assert_quota_refusal(&over, &json!("a-over-id")), "too_many_open_calls");
    assert_eq!(over.json()["error"]["data"]["scope"], "caller");
    assert_eq!(fleet.total_requests(), reached, "the refused call reached no worker");
    assert!(!fleet.workers.iter().any(|w| w.state.knows("a-over")));
    // Only a request that may start a call needs a slot.
    let ping = fleet
        .post(&a, &json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}))
        .await;
    assert_eq!(ping.status, 200, "{ping:?}");

    // B's calls pin and complete meanwhile, more of them than A's share.
    for i in 0..2 * N {
        let mid = format!("b-{i}");
        let started = fleet.post(&b, &start_call(&mid, 2)).await;
        assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
        assert!(
            fleet.control.pin(mrtr_router::control::PinKind::Client, &mid).is_some(),
            "B's call is pinned"
        );
        let done = fleet.post(&b, &confirm(&mid, 2)).await;
        assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
        assert_eq!(done.worker(), started.worker());
    }
    // A's admitted calls go on while A is at its share; each one finished gives a slot back.
    let done = fleet.post(&a, &confirm("a-0", 2)).await;
    assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
    let again = fleet.post(&a, &start_call("a-next", 2)).await;
    assert_eq!(again.json()["result"]["pending"], true, "{again:?}");
    let over = fleet.post(&a, &start_call("a-over-2", 2)).await;
    assert_eq!(assert_quota_refusal(&over, &json!(1)), "too_many_open_calls");
    for mid in ["a-1", "a-2", "a-next"] {
        let done = fleet.post(&a, &confirm(mid, 2)).await;
        assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{mid}: {done:?}");
    }
    assert_eq!(fleet.total_executions(), u64::from(2 * N + N + 1));
    assert_eq!(fleet.total_unknown_followups(), 0);
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "open_calls", "caller"), 2.0);
    assert_eq!(metric_sum(&m, "mrtr_quota_refusals_total", &[]), 2.0);
    fleet.shutdown().await;
}

#[tokio::test]
async fn callers_past_max_tracked_callers_share_one_overflow_entry_and_the_metrics_say_so() {
    // Two callers tracked at most, one call a minute each: a third and a fourth caller share
    // one entry, so one call between them (fail closed).
    let fleet = Fleet::start(
        1,
        &format!("{BY_FORWARDED_IP}rate = \"1/m\"\nburst = 1\nmax_tracked_callers = 2\n"),
    )
    .await;
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_quota_tables_full"), Some(0.0));
    for ip in ["192.0.2.1", "192.0.2.2"] {
        assert_eq!(fleet.post(&from(ip), &ping).await.status, 200, "{ip}");
    }
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_quota_tables_full"),
        Some(1.0),
        "the rate's table is full"
    );
    assert_eq!(metric(&m, "mrtr_quota_callers"), Some(2.0));
    assert_eq!(
        fleet.post(&from("192.0.2.3"), &ping).await.status,
        200,
        "the overflow entry's one call"
    );
    let shared = fleet.post(&from("192.0.2.4"), &ping).await;
    assert_eq!(assert_quota_refusal(&shared, &json!(1)), "rate_limited");
    assert_eq!(shared.json()["error"]["data"]["scope"], "overflow");
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "rate", "overflow"), 1.0);
    assert_eq!(
        metric(&m, "mrtr_quota_callers"),
        Some(2.0),
        "no caller past the cap is added"
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_past_max_tracked_callers_share_one_body_share() {
    // One caller tracked: A takes the table's one entry with one unfinished body; B and C are
    // past the cap and share one overflow share of 1 MiB, which B fills.
    const PART: usize = 256 << 10;
    let fleet = Fleet::start(
        1,
        &format!(
            "{BY_FORWARDED_IP}max_body_bytes_per_caller = {}\nmax_tracked_callers = 1\n",
            1 << 20
        ),
    )
    .await;
    let a = UnfinishedBodies::open(&fleet, &from("192.0.2.1"), 1, 1, PART).await;
    let (held, _) = a.settle(&fleet, 0).await;
    assert_eq!(held, PART);
    let mut b = UnfinishedBodies::open(&fleet, &from("192.0.2.2"), 1, 4, PART).await;
    let (held, _) = b.settle(&fleet, PART).await;
    assert_eq!(held, 1 << 20, "B holds the whole overflow share");
    assert_eq!(b.refused().await, 0);
    let whoami = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "whoami"}});
    let c = fleet.post(&from("192.0.2.3"), &whoami).await;
    assert_eq!(
        (c.status.as_u16(), c.router_error()),
        (503, Some("router_overloaded")),
        "{c:?}"
    );
    let m = fleet.metrics().await;
    assert_eq!(
        refusals(&m, "body_bytes", "overflow"),
        1.0,
        "C was refused by the overflow share"
    );
    assert_eq!(refusals(&m, "body_bytes", "caller"), 0.0);
    assert_eq!(metric(&m, "mrtr_quota_tables_full"), Some(1.0));
    // A tracked caller is not held back by the overflow.
    b.close(&fleet, PART).await;
    a.close(&fleet, 0).await;
    assert_eq!(fleet.post(&from("192.0.2.1"), &whoami).await.status, 200);
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_call_admitted_at_round_one_finishes_while_its_caller_is_over_its_rate() {
    // One new call a minute: the first round takes the whole burst, for the whole test.
    let fleet = Fleet::start(2, &format!("{BY_FORWARDED_IP}rate = \"1/m\"\nburst = 1\n")).await;
    let a = from("203.0.113.7");
    const ROUNDS: u32 = 5;
    let first = fleet.post(&a, &start_call("long", ROUNDS)).await;
    assert_eq!(first.json()["result"]["pending"], true, "{first:?}");
    for round in 2..=ROUNDS {
        // Over its rate: a new call is refused...
        let mut other = start_call(&format!("other-{round}"), 2);
        other["id"] = json!(100 + round);
        let refused = fleet.post(&a, &other).await;
        assert_eq!(assert_quota_refusal(&refused, &json!(100 + round)), "rate_limited");
        let policy = refused.headers["ratelimit-policy"].to_str().unwrap();
        assert_eq!(policy, "\"caller\";q=1;w=60", "one call per 60 s");
        // ...and the admitted call's next round is not.
        let next = fleet.post(&a, &confirm("long", round)).await;
        assert_eq!(next.status, 200, "round {round}: {next:?}");
        let result = &next.json()["result"];
        match round {
            ROUNDS => assert_eq!(result["content"][0]["text"], "done", "{result}"),
            _ => assert_eq!((&result["pending"], &result["round"]), (&json!(true), &json!(round))),
        }
    }
    assert_eq!(fleet.total_executions(), 1);
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "rate", "caller"), f64::from(ROUNDS - 1));
    // Another caller has its own burst.
    let b = fleet.post(&from("198.51.100.9"), &start_call("b", 2)).await;
    assert_eq!(b.json()["result"]["pending"], true, "{b:?}");
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_tool_has_its_own_rate_per_caller_and_its_own_calls_in_flight_across_callers() {
    let fleet = Fleet::start(
        1,
        &format!(
            "{BY_FORWARDED_IP}[[quotas.tool]]\nname = \"whoami\"\nrate = \"1/m\"\nburst = 1\n\
             [[quotas.tool]]\nname = \"stream\"\nmax_in_flight = 1\n"
        ),
    )
    .await;
    let (a, b) = (from("203.0.113.7"), from("198.51.100.9"));
    let whoami = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "whoami"}});
    assert_eq!(fleet.post(&a, &whoami).await.status, 200);
    let again = fleet.post(&a, &whoami).await;
    assert_eq!(assert_quota_refusal(&again, &json!(3)), "rate_limited");
    assert_eq!(again.json()["error"]["data"]["scope"], "tool");
    assert_eq!(again.headers["ratelimit-policy"], "\"tool\";q=1;w=60");
    // Per caller: B has its own; and A's calls of other tools are not this one's.
    assert_eq!(fleet.post(&b, &whoami).await.status, 200);
    assert_eq!(fleet.post(&a, &start_call("a-1", 1)).await.status, 200);

    // One `stream` in flight, whoever's: A holds it, B's is refused, B's other calls are not.
    let a_owned: Vec<(String, String)> = a.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let (mut held, worker) = held_sse(&fleet.client, &fleet.url(), &a_owned, 4).await;
    let mut stream = stream_call(None, json!({"events": 1}));
    stream["id"] = json!(5);
    let refused = fleet.post(&b, &stream).await;
    assert_eq!(assert_quota_refusal(&refused, &json!(5)), "too_many_in_flight");
    assert_eq!(refused.json()["error"]["data"]["scope"], "tool");
    assert_eq!(fleet.post(&b, &start_call("b-1", 1)).await.status, 200);
    fleet.worker(&worker).state.release();
    read_until(&mut held, "\"result\"").await;
    let end = tokio::time::timeout(REQUEST_DEADLINE, http_body_util::BodyExt::frame(&mut held)).await;
    assert!(end.expect("the stream ends").is_none());
    let served = fleet.post(&b, &stream).await;
    assert_eq!(served.status, 200, "{served:?}");
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "rate", "tool"), 1.0);
    assert_eq!(refusals(&m, "in_flight", "tool"), 1.0);
    fleet.shutdown().await;
}

/// The status line and body of a ping sent over a new connection that opens with a PROXY
/// protocol v1 header naming `source` as the client.
async fn ping_by_proxy_protocol(router: std::net::SocketAddr, source: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut tcp = TcpStream::connect(router).await.unwrap();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let request = format!(
        "PROXY TCP4 {source} 127.0.0.1 40000 80\r\n{}",
        raw_mcp_post(router, "Connection: close\r\n", ping)
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let got = read_to_close(&mut tcp, REQUEST_DEADLINE)
        .await
        .expect("an answer, then close");
    String::from_utf8(got).unwrap()
}

#[tokio::test]
async fn behind_an_l4_balancer_the_proxy_protocol_source_is_the_caller() {
    let fleet = Fleet::start(
        1,
        "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\"]\n\
         [quotas]\nrate = \"1/m\"\nburst = 1\n",
    )
    .await;
    let first = ping_by_proxy_protocol(fleet.router, "203.0.113.7").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let again = ping_by_proxy_protocol(fleet.router, "203.0.113.7").await;
    assert!(again.starts_with("HTTP/1.1 429"), "{again}");
    assert!(
        again.to_ascii_lowercase().contains("mcp-router-error: rate_limited"),
        "{again}"
    );
    // The balancer's connections all come from 127.0.0.1; the header tells the callers apart.
    let other = ping_by_proxy_protocol(fleet.router, "198.51.100.9").await;
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    assert_eq!(fleet.total_requests(), 2);
    fleet.shutdown().await;
}

#[tokio::test]
async fn held_sse_answers_count_in_flight_until_they_end() {
    let fleet = Fleet::start(1, "[quotas]\nmax_in_flight = 2\n").await;
    let (url, none) = (fleet.url(), Vec::new());
    let (mut first, worker) = held_sse(&fleet.client, &url, &none, 1).await;
    let (_second, _) = held_sse(&fleet.client, &url, &none, 2).await;
    let reached = fleet.total_requests();
    let ping = json!({"jsonrpc": "2.0", "id": "third", "method": "ping"});
    let third = fleet.post(&[], &ping).await;
    assert_eq!(assert_quota_refusal(&third, &json!("third")), "too_many_in_flight");
    assert_eq!(third.headers["retry-after"], "1");
    assert_eq!(fleet.total_requests(), reached, "the refused request reached no worker");

    // One stream ends (its answer's last byte read): its count comes back.
    fleet.worker(&worker).state.release();
    let rest = read_until(&mut first, "\"result\"").await;
    assert!(rest.contains("\"progress\":2"), "{rest}");
    let end = tokio::time::timeout(REQUEST_DEADLINE, http_body_util::BodyExt::frame(&mut first)).await;
    assert!(end.expect("the stream ends").is_none(), "nothing after the result");
    let fourth = fleet.post(&[], &ping).await;
    assert_eq!(fourth.status, 200, "{fourth:?}");
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "in_flight", "caller"), 1.0);
    fleet.worker(&worker).state.release();
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_h2_connection_holds_at_most_its_share_of_the_body_budget() {
    const KIB: usize = 1 << 10;
    const SHARE: usize = 2 << 20;
    // Each stream sends its whole window (hyper's stream window under a share: 256 KiB) of a
    // body it declares larger, and never finishes it.
    const PART: usize = 256 * KIB;
    const STREAMS: usize = 180;
    let fleet = Fleet::start(
        1,
        &format!(
            "[server]\nmax_body_bytes = {}\nh2_max_concurrent_streams = 200\n\
             [quotas]\nmax_body_bytes_per_connection = {SHARE}\n",
            1 << 20
        ),
    )
    .await;
    let mut bodies = UnfinishedBodies::open(&fleet, &[], 1, STREAMS, PART).await;
    // Settled: each stream is held whole (its part read) or refused.
    let (held, peak) = bodies.settle(&fleet, 0).await;
    println!(
        "one h2 connection, {STREAMS} unfinished {PART}-byte parts: {held} bytes held (peak {peak}), share {SHARE}"
    );
    assert!(peak <= SHARE, "held {peak} bytes, over the share {SHARE}");
    assert_eq!(held, SHARE, "the share is used whole");
    assert_another_client_is_served(&fleet).await;
    let refused = bodies.refused().await;
    assert_eq!(refused, STREAMS - SHARE / PART);
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "body_bytes", "connection"), refused as f64);
    bodies.close(&fleet, 0).await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_on_many_connections_holds_at_most_its_share_of_the_body_budget() {
    // Parts of one HTTP/2 DATA frame (16 KiB, the default largest): each is taken from the
    // shares whole or refused whole, so the share fills exactly however the frames interleave.
    const PART: usize = 16 << 10;
    const STREAMS: usize = 64;
    const PER_CONNECTION: usize = 1 << 20;
    const PER_CALLER: usize = 3 << 20;
    let fleet = Fleet::start(
        1,
        &format!(
            "[server]\nmax_body_bytes = {}\n{}max_body_bytes_per_connection = {PER_CONNECTION}\n\
             max_body_bytes_per_caller = {PER_CALLER}\n",
            1 << 20,
            BY_FORWARDED_IP,
        ),
    )
    .await;
    // Four connections of 64 streams: each connection offers exactly its share (1 MiB), the
    // caller 4 MiB in all, past its 3 MiB.
    let a = from("203.0.113.7");
    let mut bodies = UnfinishedBodies::open(&fleet, &a, 4, STREAMS, PART).await;
    let (held, peak) = bodies.settle(&fleet, 0).await;
    println!("one caller, 4 h2 connections x {STREAMS} unfinished {PART}-byte parts: {held} bytes held (peak {peak}), share {PER_CALLER}");
    assert!(
        peak <= PER_CALLER,
        "held {peak} bytes, over the caller's share {PER_CALLER}"
    );
    assert_eq!(held, PER_CALLER, "the caller's share is used whole");
    // Another caller, and a body of this caller's that fits nowhere now, meanwhile.
    assert_another_client_is_served(&fleet).await;
    let whoami = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "whoami"}});
    let over = fleet.post(&a, &whoami).await;
    assert_eq!(
        (over.status, over.router_error()),
        (http::StatusCode::SERVICE_UNAVAILABLE, Some("router_overloaded"))
    );
    // Refused before its body was whole: its id is not known.
    assert_eq!(
        (over.json()["id"].clone(), over.json()["error"]["code"].clone()),
        (json!(null), json!(-32005))
    );
    let refused = bodies.refused().await;
    assert_eq!(refused, 4 * STREAMS - PER_CALLER / PART);
    let m = fleet.metrics().await;
    assert_eq!(refusals(&m, "body_bytes", "caller"), (refused + 1) as f64);
    assert_eq!(refusals(&m, "body_bytes", "connection"), 0.0);
    bodies.close(&fleet, 0).await;
    // Given back: the caller's next body is read and served.
    assert_eq!(fleet.post(&a, &whoami).await.status, 200);
    fleet.shutdown().await;
}

/// A client that holds no body is served, body and all, while another holds its share; it is
/// the only one whose request reached a worker.
async fn assert_another_client_is_served(fleet: &Fleet) {
    let whoami = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami"}});
    let other = fleet.post(&from("198.51.100.9"), &whoami).await;
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(
        fleet.total_requests(),
        1,
        "only the other client's request reached the worker"
    );
}

const BACKEND: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";

#[test]
fn configs_that_would_not_do_what_they_say_are_refused() {
    let parse = |text: &str| Config::parse(Path::new("q.toml"), &format!("{BACKEND}{text}")).map(|_| ());
    // A shared store holds only the rates: one with no rate to share is refused.
    let no_rate = "[quotas]\nmax_in_flight = 8\nstore = \"redis://127.0.0.1:6379/0\"\n";
    let e = parse(no_rate).unwrap_err().to_string();
    assert!(e.contains("a shared store holds only the rates"), "{e}");
    parse("[quotas]\nstore = \"redis://r:6379\"\n[[quotas.tool]]\nname = \"t\"\nrate = \"1/s\"\n")
        .expect("a tool's rate is one to share");
    let e = parse("[quotas]\ncaller = \"principal\"\n").unwrap_err().to_string();
    assert!(e.contains("\"principal\" needs [auth]"), "{e}");
    parse("[quotas]\nrate = \"10/s\"\nstore = \"local\"\n").expect("the local store");

    // `check` says the same and fails.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.toml");
    let check = |quotas: &str| {
        std::fs::write(&path, format!("{BACKEND}{quotas}")).unwrap();
        Command::new(bin())
            .args(["check", "--config"])
            .arg(&path)
            .env("MRTR_TEST_REDIS_PASSWORD", "fr0m-env")
            .output()
            .unwrap()
    };
    let out = check(no_rate);
    assert!(!out.status.success(), "check accepted a store with no rate");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("q.toml") && err.contains("holds only the rates"), "{err}");

    // A store with a rate is accepted without a connection (Redis may come up after the
    // router), and `check` never prints its password.
    let out = check("[quotas]\nrate = \"10/s\"\nstore = \"redis://mrtr:s3cret@127.0.0.1:1/2\"\n");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("store = \"redis://mrtr:***@127.0.0.1:1/2\""),
        "{stdout}"
    );
    assert!(
        !stdout.contains("s3cret") && !stderr.contains("s3cret"),
        "{stdout}{stderr}"
    );
    // Nor one read from the environment.
    let out = check("[quotas]\nrate = \"10/s\"\nstore = \"redis://:${MRTR_TEST_REDIS_PASSWORD}@127.0.0.1:1/2\"\n");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("store = \"redis://:***@127.0.0.1:1/2\""), "{stdout}");
    assert!(!stdout.contains("fr0m-env"), "{stdout}");
}
