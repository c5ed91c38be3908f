//! The shared quota store (`[quotas] store = "redis://…"`, docs/src/quotas.md "Several
//! replicas") against a real Redis: two replicas count one rate per caller; Redis killed
//! mid-run (each `store_failure` honoured, the limit back after a restart); Redis frozen
//! (`store_timeout` honoured, never a hang).

use std::time::{Duration, Instant};

use crate::support::quotas::assert_quota_refusal;
use crate::support::*;
use crate::tools::redis_server::RedisServer;
use serde_json::{json, Value};

const BY_FORWARDED_IP: &str = "[quotas]\ncaller = \"ip\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n";

fn from(ip: &str) -> [(&'static str, &str); 1] {
    [("x-forwarded-for", ip)]
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

/// Two routers in front of the same two workers, each with `quotas` (a `[quotas]` body after
/// the caller lines) and the store at `redis`.
async fn replicas(redis: &RedisServer, quotas: [&str; 2]) -> (Fleet, Fleet) {
    let config = |q: &str| format!("{BY_FORWARDED_IP}{q}store = \"{}\"\n", redis.url());
    let first = Fleet::start(2, &config(quotas[0])).await;
    let specs = first.specs();
    let second = Fleet::start_backends(Vec::new(), &specs, &config(quotas[1])).await;
    (first, second)
}

/// `quotas` with `store_failure = "open"`, and with `"closed"`.
fn each_failure_mode(quotas: &str) -> [String; 2] {
    ["open", "closed"].map(|mode| format!("{quotas}store_failure = \"{mode}\"\n"))
}

fn store_errors(metrics: &str, kind: &str) -> f64 {
    metric_sum(metrics, "mrtr_quota_store_errors_total", &[&format!("kind=\"{kind}\"")])
}

/// Asserts `a` is the closed store's answer to the request `id`: 503, `Retry-After`, -32018.
fn assert_store_unavailable(a: &Answer, id: u64) {
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.router_error(), Some("quota_store_unavailable"), "{a:?}");
    assert!(a.headers.contains_key("retry-after"), "{a:?}");
    assert_eq!(a.headers["content-type"], "application/json");
    let body = a.json();
    assert_eq!(
        (&body["id"], &body["error"]["code"]),
        (&json!(id), &json!(-32018)),
        "{body}"
    );
}

#[tokio::test]
async fn two_replicas_count_one_rate_per_caller() {
    let redis = RedisServer::start().await;
    // One call a minute after a burst of 10: within the test only the burst is admitted.
    const BURST: u64 = 10;
    let q = format!("rate = \"1/m\"\nburst = {BURST}\n");
    let (one, two) = replicas(&redis, [&q, &q]).await;
    let a = from("203.0.113.7");
    let (mut admitted, mut refused) = ([0u64; 2], 0u64);
    for id in 0..3 * BURST {
        // The caller's requests alternate between the replicas, as a balancer spreads them.
        let (i, replica) = if id % 2 == 0 { (0, &one) } else { (1, &two) };
        let answer = replica.post(&a, &ping(id)).await;
        if answer.status == 200 {
            admitted[i] += 1;
        } else {
            assert_eq!(assert_quota_refusal(&answer, &json!(id)), "rate_limited");
            let policy = answer.headers["ratelimit-policy"].to_str().unwrap();
            assert_eq!(policy, format!("\"caller\";q={BURST};w={}", 60 * BURST));
            refused += 1;
        }
    }
    // Per replica, each would have admitted 10 and refused 5.
    assert_eq!(admitted, [BURST / 2, BURST / 2], "one burst shared by both replicas");
    assert_eq!(refused, 2 * BURST);
    assert_eq!(one.total_requests(), BURST, "only the admitted reached a worker");
    // Another caller has its own burst, on either replica.
    let b = from("198.51.100.9");
    assert_eq!(two.post(&b, &ping(100)).await.status, 200);
    assert_eq!(one.post(&b, &ping(101)).await.status, 200);
    // Redis holds a key per caller, named by its digest, never by its address: not as text,
    // and not as the caller's 16-byte key in hex (an IPv4 address's IPv6-mapped form).
    let keys = redis.keys().await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    for k in &keys {
        let digest = k.strip_prefix("mrtr:rate:caller:").expect("a caller's key");
        assert_eq!(digest.len(), 32, "{k}");
        for address in ["203.0", "198.51", "ffffcb007107", "ffffc6336409"] {
            assert!(!k.contains(address), "{k} shows {address}");
        }
    }
    for replica in [&one, &two] {
        let m = replica.metrics().await;
        assert!(metric_sum(&m, "mrtr_quota_store_seconds_count", &[]) >= (BURST + 1) as f64);
        assert_eq!(metric_sum(&m, "mrtr_quota_store_errors_total", &[]), 0.0);
    }
    two.shutdown().await;
    one.shutdown().await;
}

#[tokio::test]
async fn over_any_window_two_replicas_admit_one_rate() {
    let redis = RedisServer::start().await;
    // 20 calls a second after a burst of 5, for one caller spread over two replicas.
    let q = "rate = \"20/s\"\nburst = 5\n";
    let (one, two) = replicas(&redis, [q, q]).await;
    let started = Instant::now();
    let drive = |replica: &Fleet, lane: u64| {
        let (client, url) = (replica.client.clone(), replica.url());
        async move {
            let mut admitted = Vec::new();
            for n in 0..150u64 {
                let body = bytes::Bytes::from(ping(lane * 1000 + n).to_string());
                let a = send(&client, http::Method::POST, &url, &from("203.0.113.7"), body).await;
                match a.status.as_u16() {
                    200 => admitted.push(Instant::now()),
                    429 => assert_eq!(a.router_error(), Some("rate_limited"), "{a:?}"),
                    _ => panic!("{a:?}"),
                }
            }
            admitted
        }
    };
    let lanes = tokio::join!(drive(&one, 0), drive(&one, 1), drive(&two, 2), drive(&two, 3));
    let lanes = [lanes.0, lanes.1, lanes.2, lanes.3];
    let elapsed = started.elapsed();
    let admitted: usize = lanes.iter().map(Vec::len).sum();
    // GCRA admits at most burst + rate × elapsed (+ 1 for the call at the window's edge);
    // each replica counting alone would admit up to twice that.
    let limit = 5.0 + 20.0 * elapsed.as_secs_f64() + 1.0;
    assert!(
        (admitted as f64) <= limit,
        "{admitted} admitted in {elapsed:?}, limit {limit}"
    );
    assert!(admitted >= 5, "the burst is admitted: {admitted}");
    assert_eq!(one.total_requests(), admitted as u64);
    two.shutdown().await;
    one.shutdown().await;
}

/// What a replica answered, counted by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Tally {
    ok: u64,
    rate_limited: u64,
    unavailable: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.rate_limited += other.rate_limited;
        self.unavailable += other.unavailable;
    }
}

/// New calls of one caller sent to `replica` one after another until `stop`: every answer is
/// a 200, a rate's 429 or (`closed`) the store's 503, each complete, none late.
async fn steady(replica: &Fleet, closed: bool, stop: &std::sync::atomic::AtomicBool) -> Tally {
    let mut tally = Tally::default();
    let mut id = 10_000;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let answer = replica.post(&from("192.0.2.200"), &ping(id)).await;
        match answer.status.as_u16() {
            200 => tally.ok += 1,
            429 => {
                assert_eq!(assert_quota_refusal(&answer, &json!(id)), "rate_limited");
                tally.rate_limited += 1;
            }
            _ if closed => {
                assert_store_unavailable(&answer, id);
                tally.unavailable += 1;
            }
            _ => panic!("the open replica answered {answer:?}"),
        }
        id += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tally
}

#[tokio::test]
async fn redis_killed_mid_run_each_failure_mode_is_honoured_and_the_limit_comes_back() {
    let mut redis = RedisServer::start().await;
    let [open, closed] = each_failure_mode("rate = \"1/m\"\nburst = 3\nstore_timeout = \"200ms\"\n");
    let (o, c) = replicas(&redis, [&open, &closed]).await;
    let (mut on_o, mut on_c) = (Tally::default(), Tally::default());
    let a = from("203.0.113.7");
    for id in 0..3 {
        assert_eq!(o.post(&a, &ping(id)).await.status, 200);
        on_o.ok += 1;
    }
    assert_eq!(
        assert_quota_refusal(&o.post(&a, &ping(3)).await, &json!(3)),
        "rate_limited"
    );
    assert_eq!(
        assert_quota_refusal(&c.post(&a, &ping(4)).await, &json!(4)),
        "rate_limited"
    );
    (on_o.rate_limited, on_c.rate_limited) = (1, 1);
    // A two-round call admitted on the closed replica before the store goes.
    let y = from("198.51.100.9");
    let started = c.post(&y, &start_call("y-call", 2)).await;
    assert_eq!(started.json()["result"]["pending"], true, "{started:?}");
    on_c.ok += 1;

    // Another caller's steady traffic on both replicas throughout: the kill and the restart
    // happen while its requests are on their way.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let background = async { tokio::join!(steady(&o, false, &stop), steady(&c, true, &stop)) };
    let foreground = async {
        redis.kill();
        // Open: admitted, though the caller is over its rate; closed: 503.
        for id in 10..20 {
            let answer = o.post(&a, &ping(id)).await;
            assert_eq!(answer.status, 200, "fail open: {answer:?}");
            on_o.ok += 1;
            let answer = c.post(&a, &ping(id)).await;
            assert_store_unavailable(&answer, id);
            on_c.unavailable += 1;
        }
        // A follow-up is never checked against a rate, so the call admitted before goes on.
        let done = c.post(&y, &confirm("y-call", 2)).await;
        assert_eq!(done.json()["result"]["content"][0]["text"], "done", "{done:?}");
        on_c.ok += 1;
        let mc = c.metrics().await;
        assert!(metric_sum(&mc, "mrtr_quota_store_errors_total", &[]) >= 10.0, "{mc}");
        assert!(
            store_errors(&mc, "error") + store_errors(&mc, "timeout") >= 1.0,
            "a round trip failed before the store was left alone: {mc}"
        );

        // Back: an empty Redis, so a full burst again, then the limit.
        redis.restart().await;
        let z = from("192.0.2.44");
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut id = 100;
        loop {
            let answer = c.post(&z, &ping(id)).await;
            if answer.status == 200 {
                break;
            }
            assert_store_unavailable(&answer, id);
            on_c.unavailable += 1;
            assert!(Instant::now() < deadline, "the store never came back");
            id += 1;
            // The store is retried a second after a failure; no need to ask faster.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        on_c.ok += 1;
        let mut statuses = Vec::new();
        for n in 1..=3 {
            statuses.push(c.post(&z, &ping(id + n)).await.status.as_u16());
        }
        assert_eq!(statuses, [200, 200, 429], "the burst of 3, then the rate, shared again");
        (on_c.ok, on_c.rate_limited) = (on_c.ok + 2, on_c.rate_limited + 1);
        let answer = o.post(&z, &ping(id + 4)).await;
        assert_eq!(assert_quota_refusal(&answer, &json!(id + 4)), "rate_limited");
        on_o.rate_limited += 1;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let ((steady_o, steady_c), ()) = tokio::join!(background, foreground);
    assert_eq!(steady_o.unavailable, 0);
    assert!(steady_o.ok + steady_o.rate_limited > 0 && steady_c.ok + steady_c.rate_limited > 0);
    on_o.add(steady_o);
    on_c.add(steady_c);

    // Every answer is counted where the docs say, and only what was admitted reached a worker.
    let (mo, mc) = (o.metrics().await, c.metrics().await);
    let unavailable = "mrtr_router_errors_total{reason=\"quota_store_unavailable\"}";
    assert_eq!(metric(&mc, unavailable), Some(on_c.unavailable as f64), "{on_c:?}");
    assert_eq!(metric(&mo, unavailable), Some(0.0));
    assert_eq!(
        metric_sum(&mc, "mrtr_quota_refusals_total", &[]),
        on_c.rate_limited as f64
    );
    assert_eq!(
        metric_sum(&mo, "mrtr_quota_refusals_total", &[]),
        on_o.rate_limited as f64
    );
    assert_eq!(o.total_requests(), on_o.ok + on_c.ok, "{on_o:?} {on_c:?}");
    c.shutdown().await;
    o.shutdown().await;
}

#[tokio::test]
async fn a_frozen_redis_costs_a_request_at_most_store_timeout() {
    let redis = RedisServer::start().await;
    let [open, closed] = each_failure_mode("rate = \"100/s\"\nburst = 100\nstore_timeout = \"150ms\"\n");
    let (o, c) = replicas(&redis, [&open, &closed]).await;
    let a = from("203.0.113.7");
    // Connected and answering first, so that the freeze meets a live connection.
    assert_eq!(o.post(&a, &ping(1)).await.status, 200);
    assert_eq!(c.post(&a, &ping(2)).await.status, 200);

    redis.pause();
    let timed = |replica: &Fleet, id: u64| {
        let (client, url) = (replica.client.clone(), replica.url());
        async move {
            let t = Instant::now();
            let body = bytes::Bytes::from(ping(id).to_string());
            let answer = send(&client, http::Method::POST, &url, &from("203.0.113.7"), body).await;
            (answer, t.elapsed())
        }
    };
    let ((open_answer, open_took), (closed_answer, closed_took)) = tokio::join!(timed(&o, 3), timed(&c, 4));
    assert_eq!(open_answer.status, 200, "{open_answer:?}");
    assert_store_unavailable(&closed_answer, 4);
    for took in [open_took, closed_took] {
        // The store's timeout, not Redis's silence, decides: never sooner, and not much later.
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
    // Within a second of a failure the store is not asked: such a request waits for nothing.
    // (A request that comes later waits the timeout again and leaves the store alone anew.)
    let mut decided_at_once = 0;
    for id in 5..10 {
        let before = store_errors(&c.metrics().await, "down");
        let (answer, took) = timed(&c, id).await;
        assert_store_unavailable(&answer, id);
        if store_errors(&c.metrics().await, "down") > before {
            assert!(took < Duration::from_millis(150), "{took:?}");
            decided_at_once += 1;
            break;
        }
    }
    assert_eq!(decided_at_once, 1, "no request was decided without a round trip");
    let m = c.metrics().await;
    let timeouts = store_errors(&m, "timeout");
    assert!(timeouts >= 1.0, "{m}");
    let quick = metric(&m, "mrtr_quota_store_seconds_bucket{le=\"0.1\"}").unwrap();
    let total = metric_sum(&m, "mrtr_quota_store_seconds_count", &[]);
    assert!(
        total - quick >= timeouts,
        "each timed-out round trip is seen at its length: {m}"
    );

    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut id = 10;
    while c.post(&a, &ping(id)).await.status != 200 {
        assert!(Instant::now() < deadline, "the store never answered again");
        id += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.shutdown().await;
    o.shutdown().await;
}
