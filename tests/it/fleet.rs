//! Fleet changes: draining, pin loss, health ejection and re-admission, admin drain, bounded
//! load, discovery, config file watching, graceful shutdown.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Method;
use serde_json::json;

fn whoami(mid: &str) -> serde_json::Value {
    json!({"jsonrpc":"2.0","id":1,"messageId":mid,"method":"tools/call","params":{"name":"whoami"}})
}

#[tokio::test]
async fn removed_backend_drains_its_pinned_calls_then_is_forgotten() {
    let fleet = Fleet::start(3, "[routing]\nreplay_window = \"10ms\"").await;
    let a = fleet.post(&[], &start_call("drain-1", 2)).await;
    let holder = a.worker();
    let rest: Vec<_> = fleet.specs().into_iter().filter(|s| s.name != holder).collect();
    fleet.reconfigure(&rest);
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, &format!("mrtr_backend_draining{{backend=\"{holder}\"}}")),
        Some(1.0)
    );
    assert_eq!(metric(&m, "mrtr_ring_members"), Some(2.0));
    // New keys never reach the draining backend.
    for i in 0..40 {
        assert_ne!(fleet.post(&[], &whoami(&format!("new-{i}"))).await.worker(), holder);
    }
    // Its pinned call still does, and finishes there.
    let b = fleet.post(&[], &confirm("drain-1", 2)).await;
    assert_eq!(b.worker(), holder);
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");
    // Once its last pin is gone it is forgotten.
    tokio::time::sleep(Duration::from_millis(20)).await; // let the 10 ms replay window pass
    fleet.control.sweep();
    assert!(fleet.control.backends().iter().all(|b| *b.name != *holder));
    assert_eq!(fleet.total_unknown_followups(), 0);
}

/// Starts call `mid`, removes the backend holding it from the config, lets the fleet's 1 ms
/// `drain_timeout` pass and sweeps, then sends the call's follow-up. Returns the former holder and
/// the follow-up's answer.
async fn follow_up_after_its_holder_drained_out(fleet: &Fleet, mid: &str) -> (String, Answer) {
    let holder = fleet.post(&[], &start_call(mid, 2)).await.worker();
    let rest: Vec<_> = fleet.specs().into_iter().filter(|s| s.name != holder).collect();
    fleet.reconfigure(&rest);
    tokio::time::sleep(Duration::from_millis(5)).await;
    fleet.control.sweep();
    let b = fleet.post(&[], &confirm(mid, 2)).await;
    (holder, b)
}

#[tokio::test]
async fn past_drain_timeout_a_pinned_call_is_lost_strictly() {
    let fleet = Fleet::start(3, "[routing]\ndrain_timeout = \"1ms\"").await;
    let (_, b) = follow_up_after_its_holder_drained_out(&fleet, "lost-1").await;
    assert_eq!(b.status, 503);
    assert_eq!(b.router_error(), Some("pinned_backend_unavailable"));
    assert_eq!(b.json()["error"]["code"], -32001);
    assert_eq!(b.json()["error"]["data"]["key"], "lost-1");
    assert!(b.headers.contains_key("retry-after"));
    assert_eq!(fleet.total_unknown_followups(), 0, "strict never forwards a lost call");
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, "mrtr_router_errors_total{reason=\"pinned_backend_unavailable\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn rehash_policy_routes_a_lost_call_by_the_ring() {
    let fleet = Fleet::start(3, "[routing]\non_pin_lost = \"rehash\"\ndrain_timeout = \"1ms\"").await;
    let (holder, b) = follow_up_after_its_holder_drained_out(&fleet, "lost-2").await;
    // The ring's choice answers; it does not hold the call, and says so itself.
    assert_eq!((b.status.as_u16(), b.router_error()), (200, None));
    assert_ne!(b.worker(), holder);
    assert_eq!(b.json()["error"]["message"], "unknown messageId");
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_pins_lost_total"), Some(1.0));
}

const FAST_HEALTH: &str = "[health]\ninterval = \"50ms\"\ntimeout = \"200ms\"\nunhealthy_after = 2\nhealthy_after = 2";

#[tokio::test]
async fn killed_backend_is_ejected_its_calls_lost_and_a_restart_never_inherits_them() {
    let mut fleet = Fleet::start(3, FAST_HEALTH).await;
    // Pending calls spread over all workers.
    let mut holders = std::collections::HashMap::new();
    for i in 0..30 {
        let mid = format!("k-{i}");
        holders.insert(mid.clone(), fleet.post(&[], &start_call(&mid, 2)).await.worker());
    }
    let victim_name = fleet.workers[0].state.name.clone();
    let addr = fleet.workers[0].addr;
    let victim = fleet.workers.remove(0);
    victim.stop().await;
    let shared = fleet.control.clone();
    let victim_key = victim_name.clone();
    eventually(Duration::from_secs(10), "ejection", || {
        !shared.backend(&victim_key).unwrap().healthy
    })
    .await;
    assert_eq!(fleet.control.view().ring().len(), 2);
    // Keyless and new-key traffic keeps flowing on the others.
    for i in 0..20 {
        let a = fleet.post(&[], &whoami(&format!("after-{i}"))).await;
        assert_eq!(a.status, 200);
        assert_ne!(a.worker(), victim_name);
    }
    // The same instance comes back (empty, as after a crash) and is re-admitted.
    fleet.workers.push(mrtr_router::example::Worker::start(
        &victim_name,
        tokio::net::TcpListener::bind(addr).await.unwrap(),
    ));
    eventually(Duration::from_secs(10), "re-admission", || {
        shared.backend(&victim_key).unwrap().healthy
    })
    .await;
    assert_eq!(fleet.control.view().ring().len(), 3);
    let mut refused = 0;
    for (mid, holder) in &holders {
        let b = fleet.post(&[], &confirm(mid, 2)).await;
        if *holder == victim_name {
            assert_eq!(b.router_error(), Some("pinned_backend_unavailable"), "{mid}: {b:?}");
            refused += 1;
        } else {
            assert_eq!(b.json()["result"]["content"][0]["text"], "done", "{mid}");
            assert_eq!(&b.worker(), holder);
        }
    }
    assert_eq!(
        fleet.total_unknown_followups(),
        0,
        "the restarted instance never saw a follow-up of a lost call"
    );
    let m = fleet.metrics().await;
    assert_eq!(
        metric(&m, &format!("mrtr_backend_up{{backend=\"{victim_name}\"}}")),
        Some(1.0)
    );
    assert!(refused > 0, "no call was pinned to the victim: {holders:?}");
    assert_eq!(
        metric(&m, "mrtr_pins_lost_total"),
        Some(refused as f64),
        "every refused follow-up lost its pin"
    );
}

#[tokio::test]
async fn connect_failures_of_unpinned_requests_move_to_another_backend() {
    // Health checks far apart: only the passive path acts in this test.
    let fleet = Fleet::start(2, "[health]\ninterval = \"1h\"\nunhealthy_after = 2").await;
    let port = free_port();
    let mut specs = fleet.specs();
    specs.push(BackendSpec {
        name: "dead".into(),
        url: format!("http://127.0.0.1:{port}"),
        weight: 1,
    });
    fleet.reconfigure(&specs);
    for i in 0..30 {
        let a = fleet.post(&[], &whoami(&format!("m-{i}"))).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    let m = fleet.metrics().await;
    assert!(metric(&m, "mrtr_upstream_errors_total{backend=\"dead\",kind=\"connect\"}").unwrap() >= 1.0);
    assert_eq!(
        metric(&m, "mrtr_backend_up{backend=\"dead\"}"),
        Some(0.0),
        "passively ejected"
    );
}

#[tokio::test]
async fn admin_drain_and_undrain() {
    let fleet = Fleet::start(2, "").await;
    let admin = format!("http://{}", fleet.admin);
    let held = fleet.post(&[], &start_call("deploy-1", 2)).await.worker();
    let r = send(
        &fleet.client,
        Method::POST,
        &format!("{admin}/backends/{held}/drain"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    let list = r.json();
    let entry = list["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == held.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (entry["draining"].as_bool(), entry["on_ring"].as_bool()),
        (Some(true), Some(false))
    );
    for i in 0..20 {
        assert_ne!(fleet.post(&[], &whoami(&format!("d-{i}"))).await.worker(), held);
        assert_ne!(
            fleet
                .post(&[], &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
                .await
                .worker(),
            held,
            "keyless too"
        );
    }
    assert_eq!(
        fleet.post(&[], &confirm("deploy-1", 2)).await.worker(),
        held,
        "pinned calls finish on a drained backend"
    );
    let r = send(
        &fleet.client,
        Method::POST,
        &format!("{admin}/backends/{held}/undrain"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(fleet.control.view().ring().len(), 2);
    let r = send(
        &fleet.client,
        Method::POST,
        &format!("{admin}/backends/nope/drain"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn config_file_change_is_reloaded_including_a_symlink_swap() {
    let fleet = Fleet::start(3, "").await;
    let specs = fleet.specs();
    // Kubernetes-style: config.toml -> ..data/config.toml, ..data -> ..v1
    let dir = fleet.dir.path();
    let v1 = dir.join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("config.toml"), render_config("", &specs[..2])).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::fs::remove_file(&fleet.config_path).unwrap();
    std::os::unix::fs::symlink("..data/config.toml", &fleet.config_path).unwrap();
    let shared = fleet.control.clone();
    eventually(Duration::from_secs(10), "reload after the file changed", || {
        shared.view().ring().len() == 2
    })
    .await;
    let v2 = dir.join("..v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("config.toml"), render_config("", &specs[..1])).unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    eventually(Duration::from_secs(10), "reload after the symlink swap", || {
        shared.view().ring().len() == 1
    })
    .await;
    // A broken file is rejected and the running config stays.
    std::fs::write(v2.join("config.toml"), "[server\n").unwrap();
    let m = || async { metric(&fleet.metrics().await, "mrtr_config_reloads_total{result=\"error\"}") };
    for _ in 0..500 {
        if m().await == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m().await, Some(1.0));
    assert_eq!(shared.view().ring().len(), 1);
}

#[tokio::test]
async fn discovery_adds_and_drains_backends() {
    // DNS answers carry addresses, not ports: discovered workers share one port on
    // different loopback addresses.
    let d1 = mrtr_router::example::Worker::start("d1", tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap());
    let port = d1.addr.port();
    let d2 =
        mrtr_router::example::Worker::start("d2", tokio::net::TcpListener::bind(("127.0.0.3", port)).await.unwrap());
    let fixed = start_worker("static").await;
    let static_spec = BackendSpec {
        name: "static".into(),
        url: fixed.url(),
        weight: 1,
    };
    let extra = format!("[discovery]\ndns = \"mcp-workers.test:{port}\"\ninterval = \"20ms\"");
    let fleet = Fleet::start_backends(vec![fixed, d1, d2], &[static_spec], &extra).await;
    type Answer = std::io::Result<Vec<std::net::SocketAddr>>;
    let ip = |s: &str| std::net::SocketAddr::new(s.parse().unwrap(), 0);
    let answer: std::sync::Arc<parking_lot::Mutex<Answer>> =
        std::sync::Arc::new(parking_lot::Mutex::new(Ok(vec![ip("127.0.0.2"), ip("127.0.0.3")])));
    let a2 = answer.clone();
    // Set before the router's tasks first run (no await since the router started).
    fleet.control.set_resolver(std::sync::Arc::new(move |host, _port| {
        let result = match &*a2.lock() {
            Ok(list) if host == "mcp-workers.test" => Ok(list.clone()),
            _ => Err(std::io::Error::other("no such host")),
        };
        Box::pin(async move { result })
    }));
    let shared = fleet.control.clone();
    eventually(Duration::from_secs(10), "discovered backends join", || {
        shared.view().ring().len() == 3
    })
    .await;
    let name2 = format!("dns:127.0.0.3:{port}");
    // Pin a call on the second discovered backend.
    let mid = (0..200)
        .map(|i| format!("disc-{i}"))
        .find(|m| *shared.view().ring_owner(m).unwrap() == *name2)
        .unwrap();
    assert_eq!(fleet.post(&[], &start_call(&mid, 2)).await.worker(), "d2");
    // A failed lookup keeps the set.
    *answer.lock() = Err(std::io::Error::other("SERVFAIL"));
    let m0 = metric(
        &fleet.metrics().await,
        "mrtr_discovery_resolutions_total{result=\"error\"}",
    )
    .unwrap_or(0.0);
    for _ in 0..500 {
        if metric(
            &fleet.metrics().await,
            "mrtr_discovery_resolutions_total{result=\"error\"}",
        )
        .unwrap_or(0.0)
            > m0 + 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(shared.view().ring().len(), 3);
    // The address disappears from DNS: that backend drains, its pinned call still finishes there.
    *answer.lock() = Ok(vec![ip("127.0.0.2")]);
    eventually(Duration::from_secs(10), "removed address leaves the ring", || {
        shared.view().ring().len() == 2
    })
    .await;
    assert!(shared.backends().iter().any(|b| *b.name == *name2 && b.removed));
    let done = fleet.post(&[], &confirm(&mid, 2)).await;
    assert_eq!(
        (
            done.worker().as_str(),
            done.json()["result"]["content"][0]["text"].as_str()
        ),
        ("d2", Some("done"))
    );
    assert_eq!(fleet.total_unknown_followups(), 0);
}

/// Health checks at IPv6 backends, configured (`http://[::1]:port`) or discovered (an AAAA
/// answer): the default check (a TCP connect) reaches them, so they stay on the ring and serve.
#[tokio::test]
async fn ipv6_backends_pass_their_health_checks_and_serve() {
    let health = "[health]\ninterval = \"20ms\"\ntimeout = \"500ms\"\nunhealthy_after = 1\n";
    let static_v6 = mrtr_router::example::Worker::start("v6", tokio::net::TcpListener::bind("[::1]:0").await.unwrap());
    let discovered_v6 =
        mrtr_router::example::Worker::start("d6", tokio::net::TcpListener::bind("[::1]:0").await.unwrap());
    let port = discovered_v6.addr.port();
    let spec = BackendSpec {
        name: "v6".into(),
        url: static_v6.url(),
        weight: 1,
    };
    assert!(spec.url.starts_with("http://[::1]:"), "{}", spec.url);
    let extra = format!("{health}[discovery]\ndns = \"v6.test:{port}\"\ninterval = \"20ms\"\n");
    let fleet = Fleet::start_backends(vec![static_v6, discovered_v6], &[spec], &extra).await;
    fleet.control.set_resolver(std::sync::Arc::new(|_host, port| {
        Box::pin(async move { Ok(vec![std::net::SocketAddr::new("::1".parse().unwrap(), port)]) })
    }));
    let discovered = format!("dns:[::1]:{port}");
    let control = fleet.control.clone();
    eventually(Duration::from_secs(10), "the IPv6 address is discovered", || {
        control.backend(&discovered).is_some()
    })
    .await;
    // Several checks reach each backend (every check is a connection); one failure would have
    // ejected it.
    for w in &fleet.workers {
        let state = w.state.clone();
        eventually(Duration::from_secs(10), "health checks reach the IPv6 backend", || {
            state.connections.load(std::sync::atomic::Ordering::Relaxed) >= 5
        })
        .await;
    }
    for name in ["v6", discovered.as_str()] {
        let b = fleet.control.backend(name).unwrap();
        assert!(b.healthy, "{b:?}");
    }
    assert_eq!(fleet.control.view().ring().len(), 2);
    let served: std::collections::BTreeSet<String> = workers_serving(&fleet).await;
    assert_eq!(served, ["d6".to_string(), "v6".to_string()].into(), "both serve");
    assert_eq!(
        metric(
            &fleet.metrics().await,
            "mrtr_upstream_errors_total{backend=\"v6\",kind=\"connect\"}"
        ),
        Some(0.0),
        "shown from the start, and never moved"
    );
}

/// The workers that answer 40 keyless requests.
async fn workers_serving(fleet: &Fleet) -> std::collections::BTreeSet<String> {
    let mut served = std::collections::BTreeSet::new();
    for i in 0..40 {
        let a = fleet.post(&[], &whoami(&format!("v6-{i}"))).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
        served.insert(a.worker());
    }
    served
}
