//! A network partition, on real separate hosts: a backend in its own network namespace (a veth
//! pair away) whose packets are black-holed mid-load. Its in-flight requests get 504 at the
//! deadline, it is ejected within `interval × unhealthy_after + timeout`, its pinned calls get
//! 503, the other backend is never affected, and once the partition heals it is re-admitted;
//! no request is ever misrouted. Needs root (as CI and these machines give) and iproute2.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use mrtr_router::example::Worker;
use serde_json::json;

/// Runs a command of iproute2, failing the test loudly when it fails.
fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to this host by a veth pair (`10.213.N.1` here, `.2` there);
/// removed when dropped.
struct Host {
    ns: String,
    veth: String,
    there: String,
}

impl Host {
    fn create() -> Host {
        let n = std::process::id() % 250 + 1;
        let (ns, veth, peer) = (format!("mrtr-part-{n}"), format!("mrtrh{n}"), format!("mrtrn{n}"));
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        let (here, there) = (format!("10.213.{n}.1"), format!("10.213.{n}.2"));
        run(&["ip", "netns", "add", &ns]);
        let host = Host {
            ns: ns.clone(),
            veth: veth.clone(),
            there: there.clone(),
        };
        run(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer]);
        run(&["ip", "link", "set", &peer, "netns", &ns]);
        run(&["ip", "addr", "add", &format!("{here}/30"), "dev", &veth]);
        run(&["ip", "link", "set", &veth, "up"]);
        run(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "ip",
            "addr",
            "add",
            &format!("{there}/30"),
            "dev",
            &peer,
        ]);
        run(&["ip", "netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        run(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        host
    }

    /// Drops every packet between the two hosts, both ways: `tc netem loss 100%` where the
    /// kernel has netem, else a FIFO of length zero (which drops whatever is queued to it).
    fn black_hole(&self) {
        for (ns, dev) in [(None, self.veth.clone()), (Some(&self.ns), self.peer())] {
            let mut args: Vec<String> = Vec::new();
            if let Some(ns) = ns {
                args.extend(["ip", "netns", "exec", ns].map(String::from));
            }
            let base = ["tc", "qdisc", "add", "dev", &dev, "root"].map(String::from);
            let netem: Vec<String> = args
                .iter()
                .cloned()
                .chain(base.clone())
                .chain(["netem", "loss", "100%"].map(String::from))
                .collect();
            let fifo: Vec<String> = args
                .iter()
                .cloned()
                .chain(base)
                .chain(["pfifo", "limit", "0"].map(String::from))
                .collect();
            let netem: Vec<&str> = netem.iter().map(String::as_str).collect();
            let ok = Command::new(netem[0])
                .args(&netem[1..])
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                run(&fifo.iter().map(String::as_str).collect::<Vec<_>>());
            }
        }
    }

    fn heal(&self) {
        run(&["tc", "qdisc", "del", "dev", &self.veth, "root"]);
        run(&[
            "ip",
            "netns",
            "exec",
            &self.ns,
            "tc",
            "qdisc",
            "del",
            "dev",
            &self.peer(),
            "root",
        ]);
    }

    fn peer(&self) -> String {
        self.veth.replacen("mrtrh", "mrtrn", 1)
    }

    /// Starts an example worker inside the namespace, on a thread of its own (a thread's
    /// sockets belong to the namespace it joined).
    fn start_worker(
        &self,
        name: &str,
    ) -> (
        std::net::SocketAddr,
        Arc<mrtr_router::example::WorkerState>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (ns, there, name) = (self.ns.clone(), self.there.clone(), name.to_string());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
            // SAFETY: setns on this thread only, with a valid namespace descriptor.
            let joined = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            assert_eq!(joined, 0, "setns: {}", std::io::Error::last_os_error());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind((there.as_str(), 0)).await.unwrap();
                let w = Worker::start(&name, listener);
                ready_tx.send((w.addr, w.state.clone())).unwrap();
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                w.stop().await;
            });
        });
        let (addr, state) = ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        (addr, state, stop_tx)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.veth]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

fn whoami(mid: &str) -> serde_json::Value {
    json!({"jsonrpc":"2.0","id":1,"messageId":mid,"method":"tools/call","params":{"name":"whoami"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_backend_times_out_is_ejected_loses_its_pins_only_and_comes_back() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the partition test needs root (network namespaces and tc); run the test command as root"
    );
    let host = Host::create();
    let (far_addr, far, stop_far) = host.start_worker("far");
    let near = start_worker("near").await;
    let specs = vec![
        BackendSpec {
            name: "far".into(),
            url: format!("http://{far_addr}"),
            weight: 1,
        },
        BackendSpec {
            name: "near".into(),
            url: near.url(),
            weight: 1,
        },
    ];
    let (interval, unhealthy_after, timeout) = (Duration::from_millis(100), 2u32, Duration::from_millis(300));
    let extra = format!(
        "[server]\nupstream_timeout = \"1s\"\n[health]\ninterval = \"100ms\"\ntimeout = \"300ms\"\nunhealthy_after = {unhealthy_after}\nhealthy_after = 2\n"
    );
    let fleet = Arc::new(Fleet::start_backends(vec![near], &specs, &extra).await);
    let view = fleet.control.view();
    let key_on = |worker: &str, prefix: &str| {
        (0..2000)
            .map(|i| format!("{prefix}-{i}"))
            .find(|k| view.ring_owner(k).as_deref() == Some(worker))
            .unwrap()
    };
    // A call pinned on the far backend, one on the near one.
    let (pinned_far, pinned_near) = (key_on("far", "call-far"), key_on("near", "call-near"));
    assert_eq!(fleet.post(&[], &start_call(&pinned_far, 2)).await.worker(), "far");
    assert_eq!(fleet.post(&[], &start_call(&pinned_near, 2)).await.worker(), "near");

    // Load on keys of the near backend throughout: never affected.
    let (served, failed, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let near_keys: Vec<String> = (0..50).map(|i| key_on("near", &format!("near-load-{i}"))).collect();
    let load = {
        let (fleet, served, failed, stop) = (fleet.clone(), served.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let a = fleet.post(&[], &whoami(&near_keys[i % near_keys.len()])).await;
                let counter = if a.status == 200 && a.worker() == "near" {
                    &served
                } else {
                    &failed
                };
                counter.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };
    // A slow call in flight on the far backend when the partition begins.
    let slow_key = key_on("far", "slow");
    let in_flight = {
        let fleet = fleet.clone();
        let body = json!({"jsonrpc":"2.0","id":9,"messageId": slow_key,"method":"tools/call","params":{"name":"sleep","arguments":{"ms": 3000}}});
        tokio::spawn(async move {
            let sent = Instant::now();
            (fleet.post(&[], &body).await, sent.elapsed())
        })
    };
    let control = fleet.control.clone();
    eventually(Duration::from_secs(10), "the slow call reaches the far backend", || {
        control.backend("far").unwrap().inflight > 0
    })
    .await;

    host.black_hole();
    let cut = Instant::now();
    let ejected = {
        let control = control.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while control.backend("far").unwrap().healthy {
                assert!(Instant::now() < deadline, "the far backend is never ejected");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            cut.elapsed()
        })
    };
    let (answer, took) = in_flight.await.unwrap();
    assert_eq!(
        (answer.status.as_u16(), answer.router_error()),
        (504, Some("upstream_timeout")),
        "{answer:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "at the deadline: {took:?}"
    );
    let after = ejected.await.unwrap();
    let bound = interval * unhealthy_after + timeout;
    // Polled every 5 ms, on a loaded 2-core machine: a little slack past the bound.
    assert!(
        after <= bound + Duration::from_millis(150),
        "ejected after {after:?}, bound {bound:?}"
    );
    let lost = fleet.post(&[], &confirm(&pinned_far, 2)).await;
    assert_eq!(
        (lost.status.as_u16(), lost.router_error()),
        (503, Some("pinned_backend_unavailable")),
        "{lost:?}"
    );
    let kept = fleet.post(&[], &confirm(&pinned_near, 2)).await;
    assert_eq!(kept.json()["result"]["content"][0]["text"], "done", "{kept:?}");
    // New keys of the far backend go elsewhere meanwhile.
    let moved = fleet.post(&[], &whoami(&key_on("far", "new-far"))).await;
    assert_eq!((moved.status.as_u16(), moved.worker().as_str()), (200, "near"));

    host.heal();
    eventually(Duration::from_secs(10), "the far backend is re-admitted", || {
        control.backend("far").unwrap().healthy
    })
    .await;
    println!(
        "partition: in-flight call answered 504 after {took:?}, far ejected {after:?} after the cut (bound {bound:?})"
    );
    let back = fleet.post(&[], &whoami(&key_on("far", "after"))).await;
    assert_eq!(back.worker(), "far", "{back:?}");
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(served.load(Ordering::Relaxed) > 0);
    println!(
        "partition: {} requests to the near backend meanwhile, none failed",
        served.load(Ordering::Relaxed)
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "the near backend's traffic was affected"
    );
    assert_eq!(
        fleet.total_unknown_followups() + far.unknown_followups.load(Ordering::Relaxed),
        0,
        "a misroute"
    );
    let _ = stop_far.send(());
}
