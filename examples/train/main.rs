//! The training workload of the profile-guided build (`scripts/build-optimized.sh`,
//! docs/src/benchmarks.md, "Profile-guided and post-link optimised build"): it runs a router
//! binary as a child process in front of three training backends (`backend.rs`) and drives a
//! mix of MCP traffic through it for a bounded time, then stops it with SIGTERM so that an
//! instrumented binary writes its profile on the way out.
//!
//! Two phases, each a fresh router process:
//! - `plain`: clear-text listener, one worker thread, HTTP/1.1 upstreams; HTTP/1.1 clients and
//!   h2c clients (prior knowledge, 8 streams per connection);
//! - `secure`: TLS listener (ALPN h2 and http/1.1), sealed routing tokens (`[tokens]`), the
//!   access log on, the default worker threads, HTTP/2 (h2c) upstreams; HTTP/1.1 and HTTP/2
//!   clients over TLS 1.3, some reconnecting (full and resumed handshakes).
//!
//! In both, each request is one of: header-keyed and body-keyed `tools/call`s (a few with 16 KiB
//! bodies), keyless calls, two-round calls of the routing-id dialect (`pending`, `confirm`) and
//! of multi round-trip requests (`input_required`, `requestState` echoed), tasks
//! (`tasks/get` with `Mcp-Name`), legacy sessions (`initialize`, a call, `DELETE`), SSE answers,
//! and error answers (malformed JSON, a body past `max_body_bytes`, `TRACE`, a `requestState`
//! nobody issued, a mismatched `Mcp-Name`, a backend's 500); beside them, held SSE streams of
//! sessions and `/metrics` scrapes. Every answer is checked: a wrong status, a misrouted
//! follow-up or a router that does not exit cleanly fails the run (exit status 1).
//!
//! ```sh
//! cargo run --example train -- --router target/release/mrtr-router --seconds 20
//! cargo run --example train -- --router target/release/mrtr-router --seconds 3 --no-http2
//! ```

mod backend;
mod client;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

use backend::Backend;
use client::{connect, Conn, Target};

struct Args {
    router: PathBuf,
    seconds: u64,
    http2: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut router = None;
    let mut seconds = 20;
    let mut http2 = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--router" => router = args.next().map(PathBuf::from),
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s| (1..=3600).contains(s))
                    .ok_or("--seconds takes 1 to 3600")?
            }
            "--no-http2" => http2 = false,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let router = router.ok_or("usage: train --router BIN [--seconds N per phase] [--no-http2]")?;
    Ok(Args { router, seconds, http2 })
}

#[derive(Clone, Copy)]
struct Phase {
    name: &'static str,
    tls: bool,
    /// Worker threads of the router; `None`: its default (one per core).
    threads: Option<usize>,
}

const PHASES: [Phase; 2] = [
    Phase {
        name: "plain",
        tls: false,
        threads: Some(1),
    },
    Phase {
        name: "secure",
        tls: true,
        threads: None,
    },
];

/// What one phase did: requests per outcome, and the first few faults.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    faults: AtomicU64,
    held_events: AtomicU64,
    first_faults: parking_lot::Mutex<Vec<String>>,
}

impl Tally {
    fn fault(&self, what: String) {
        self.faults.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_faults.lock();
        if first.len() < 8 {
            first.push(what);
        }
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let ok = rt.block_on(async move {
        let mut backends = Vec::new();
        for i in 0..3 {
            backends.push(Backend::start(&format!("train-{i}")).await.expect("a backend listener"));
        }
        let mut ok = true;
        for phase in PHASES {
            match run_phase(phase, &args, &backends).await {
                Ok(()) => {}
                Err(e) => {
                    eprintln!("train: phase {}: {e}", phase.name);
                    ok = false;
                }
            }
        }
        for b in &backends {
            if b.misroutes() > 0 {
                eprintln!("train: backend {} saw {} misrouted follow-ups", b.name, b.misroutes());
                ok = false;
            }
        }
        backends.into_iter().for_each(Backend::stop);
        ok
    });
    std::process::exit(if ok { 0 } else { 1 });
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn write_config(dir: &Path, phase: Phase, http2: bool, backends: &[Backend]) -> (PathBuf, SocketAddr, SocketAddr) {
    let (proxy, admin): (SocketAddr, SocketAddr) = (
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    );
    let mut text = format!("[server]\nlisten = \"{proxy}\"\nmax_body_bytes = 65536\nshutdown_grace = \"2s\"\n");
    if phase.tls {
        text.push_str("tls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n");
    }
    text.push_str(&format!("[admin]\nlisten = \"{admin}\"\n"));
    if phase.tls {
        text.push_str("[tokens]\nkeys = [\"training-key-0123456789abcdef0123456789abcdef\"]\n");
        text.push_str("[log]\naccess = true\n");
        text.push_str(&format!("[upstream]\nhttp2 = {http2}\n"));
    }
    for b in backends {
        text.push_str(&format!(
            "[[backend]]\nname = \"{}\"\nurl = \"http://{}\"\n",
            b.name, b.addr
        ));
    }
    let path = dir.join("router.toml");
    std::fs::write(&path, text).expect("config written");
    (path, proxy, admin)
}

/// Polls `/readyz` on the admin listener: the router's own readiness signal.
async fn wait_ready(admin: SocketAddr, child: &mut std::process::Child) -> Result<(), String> {
    let target = Target::new(admin, false, None);
    for _ in 0..400 {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("the router exited at start: {status}"));
        }
        if let Ok(mut conn) = connect(&target).await {
            if let Ok(a) = conn.send_to(Method::GET, "/readyz", &[], "").await {
                if a.status == 200 {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err("the router was not ready within 10 s".into())
}

async fn run_phase(phase: Phase, args: &Args, backends: &[Backend]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = phase.tls.then(|| {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("a certificate");
        std::fs::write(dir.path().join("cert.pem"), cert.cert.pem()).expect("cert written");
        std::fs::write(dir.path().join("key.pem"), cert.signing_key.serialize_pem()).expect("key written");
        cert.cert.der().clone()
    });
    let (config, proxy, admin) = write_config(dir.path(), phase, args.http2, backends);
    let stderr = std::fs::File::create(dir.path().join("router.log")).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&args.router);
    cmd.arg("--config")
        .arg(&config)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(stderr);
    if let Some(n) = phase.threads {
        cmd.env("MRTR_WORKER_THREADS", n.to_string());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", args.router.display()))?;
    let driven = async {
        wait_ready(admin, &mut child).await?;
        drive(phase, args, proxy, admin, root).await
    }
    .await;
    // SIGTERM, the way an operator stops it: the router drains and returns from main, so an
    // instrumented binary writes its profile.
    // SAFETY: kill(2) with the pid of our own child and a valid signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child).await;
    let log = std::fs::read_to_string(dir.path().join("router.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(5).collect();
    let tally = driven.inspect_err(|_| eprintln!("router log (last lines): {tail:?}"))?;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("the router exited with {s}; log: {tail:?}")),
        Err(e) => return Err(e),
    }
    let (requests, faults) = (
        tally.requests.load(Ordering::Relaxed),
        tally.faults.load(Ordering::Relaxed),
    );
    println!(
        "train: phase {:<6} {} s: {requests} requests, {} held-stream events, {faults} faults",
        phase.name,
        args.seconds,
        tally.held_events.load(Ordering::Relaxed)
    );
    if faults > 0 {
        return Err(format!("{faults} faults, the first: {:?}", tally.first_faults.lock()));
    }
    Ok(())
}

async fn wait_exit(child: &mut std::process::Child) -> Result<std::process::ExitStatus, String> {
    for _ in 0..800 {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = child.kill();
    Err("the router did not exit within 20 s of SIGTERM".into())
}

async fn drive(
    phase: Phase,
    args: &Args,
    proxy: SocketAddr,
    admin: SocketAddr,
    root: Option<rustls::pki_types::CertificateDer<'static>>,
) -> Result<Arc<Tally>, String> {
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let tally = Arc::new(Tally::default());
    let h1 = Target::new(proxy, false, root.as_ref());
    let h2 = Target::new(proxy, true, root.as_ref());
    let mut tasks = tokio::task::JoinSet::new();
    // (target, connections, streams per connection)
    let mut shapes = vec![(h1.clone(), if phase.tls { 3 } else { 4 }, 1)];
    if args.http2 {
        shapes.push((h2, if phase.tls { 1 } else { 2 }, 8));
    }
    for (target, conns, streams) in shapes {
        for c in 0..conns {
            let (target, tally) = (target.clone(), tally.clone());
            tasks.spawn(async move { connection(target, streams, c, until, tally).await });
        }
    }
    for s in 0..16 {
        let (target, tally) = (h1.clone(), tally.clone());
        tasks.spawn(async move {
            if let Err(e) = held(&target, until, &tally).await {
                tally.fault(format!("held stream {s}: {e}"));
            }
        });
    }
    let scrape_tally = tally.clone();
    tasks.spawn(async move {
        let target = Target::new(admin, false, None);
        while Instant::now() < until {
            match connect(&target).await {
                Ok(mut c) => match c.send_to(Method::GET, "/metrics", &[], "").await {
                    Ok(_) => {}
                    Err(e) => scrape_tally.fault(format!("admin: {e}")),
                },
                Err(e) => scrape_tally.fault(format!("admin: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a client task failed: {e}"))?;
    }
    Ok(tally)
}

/// One client connection (reconnecting now and then, and after a refused large body), with
/// `streams` request loops on it.
async fn connection(target: Target, streams: usize, c: usize, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        let conn = match connect(&target).await {
            Ok(conn) => conn,
            Err(e) => {
                tally.fault(format!("connection {c}: {e}"));
                return;
            }
        };
        let mut handles: Vec<Conn> = (1..streams)
            .map(|_| conn.share().expect("HTTP/2 carries streams"))
            .collect();
        handles.push(conn);
        let mut loops = tokio::task::JoinSet::new();
        for mut conn in handles {
            let tally = tally.clone();
            // Unique per request loop: two loops with one seed would send the same keys.
            let seed = NEXT_SEED.fetch_add(1, Ordering::Relaxed);
            loops.spawn(async move { requests(&mut conn, seed, until, &tally).await });
        }
        while loops.join_next().await.is_some() {}
    }
}

static NEXT_SEED: AtomicU64 = AtomicU64::new(1);

/// Requests on one connection (or one HTTP/2 stream loop) until `until`, or until the
/// connection should be replaced (now and then, and after a body the router refused).
async fn requests(conn: &mut Conn, seed: u64, until: Instant, tally: &Tally) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut n = 0u64;
    while Instant::now() < until && n < 400 {
        n += 1;
        let pick = rng.random_range(0..100);
        let key = format!("k-{seed:x}-{n}-{}", rng.random::<u32>());
        let outcome = scenario(conn, pick, &key, &mut rng).await;
        tally.requests.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(Next::Continue) => {}
            Ok(Next::Reconnect) => return,
            Err(e) => {
                tally.fault(format!("{e} (scenario {pick})"));
                return;
            }
        }
    }
}

enum Next {
    Continue,
    /// The router closes a connection after refusing a body it did not read.
    Reconnect,
}

fn call(id: u64, key: Option<&str>, tool: &str, extra: serde_json::Value) -> String {
    let mut v = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {"query": "weather in Lisbon next week", "units": "metric", "limit": 5}}});
    if let Some(k) = key {
        v["messageId"] = json!(k);
    }
    if let serde_json::Value::Object(extra) = extra {
        for (k, x) in extra {
            v["params"][k] = x;
        }
    }
    v.to_string()
}

fn expect(a: &client::Answer, status: u16, what: &str) -> Result<(), String> {
    match a.status.as_u16() == status {
        true => Ok(()),
        false => Err(format!(
            "{what}: {} (expected {status}): {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )),
    }
}

async fn scenario(conn: &mut Conn, pick: u32, key: &str, rng: &mut impl Rng) -> Result<Next, String> {
    match pick {
        // Header-keyed calls: the key in `Mcp-Routing-Id` and in the body.
        0..=29 => {
            let a = conn
                .send(
                    Method::POST,
                    &[("mcp-routing-id", key)],
                    call(1, Some(key), "search", json!({})),
                )
                .await?;
            expect(&a, 200, "header-keyed call")?;
        }
        // Body-keyed calls.
        30..=49 => {
            let a = conn
                .send(Method::POST, &[], call(2, Some(key), "search", json!({})))
                .await?;
            expect(&a, 200, "body-keyed call")?;
        }
        // Keyless: least outstanding requests.
        50..=54 => {
            let a = conn
                .send(Method::POST, &[], r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#)
                .await?;
            expect(&a, 200, "keyless call")?;
        }
        // Two rounds, routing-id dialect: `pending`, then `confirm` with the same messageId.
        55..=64 => {
            let header = [("mcp-routing-id", key)];
            let headers: &[(&str, &str)] = if pick.is_multiple_of(2) { &header } else { &[] };
            let a = conn
                .send(Method::POST, headers, call(4, Some(key), "transfer", json!({})))
                .await?;
            expect(&a, 200, "pending call")?;
            let confirm =
                json!({"jsonrpc": "2.0", "id": 5, "messageId": key, "method": "confirm", "params": {"approved": true}});
            let a = conn.send(Method::POST, headers, confirm.to_string()).await?;
            expect(&a, 200, "confirm")?;
        }
        // Two rounds, multi round-trip requests: `input_required`, the state echoed.
        65..=74 => {
            let mrtr = [
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "ask"),
            ];
            let a = conn.send(Method::POST, &mrtr, call(6, None, "ask", json!({}))).await?;
            expect(&a, 200, "input_required call")?;
            let state = a.json()["result"]["requestState"].clone();
            if !state.is_string() {
                return Err(format!("no requestState in {}", String::from_utf8_lossy(&a.body)));
            }
            let retry = call(
                7,
                None,
                "ask",
                json!({"requestState": state, "inputResponses": {"confirm": {"action": "accept"}}}),
            );
            let a = conn.send(Method::POST, &mrtr, retry).await?;
            expect(&a, 200, "requestState retry")?;
        }
        // A task: created, then polled to completion with `Mcp-Name`.
        75..=79 => {
            let a = conn
                .send(Method::POST, &[], call(8, None, "longjob", json!({})))
                .await?;
            expect(&a, 200, "task call")?;
            let task = a.json()["result"]["taskId"].as_str().unwrap_or_default().to_string();
            let get = json!({"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": {"taskId": task}});
            let a = conn.send(Method::POST, &[("mcp-name", &task)], get.to_string()).await?;
            expect(&a, 200, "tasks/get")?;
        }
        // A legacy session: initialize, a call in it, its end.
        80..=84 => {
            let init = r#"{"jsonrpc":"2.0","id":10,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"train"}}}"#;
            let a = conn.send(Method::POST, &[], init).await?;
            expect(&a, 200, "initialize")?;
            let sid = a
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let session = [("mcp-session-id", sid.as_str())];
            let a = conn
                .send(Method::POST, &session, call(11, None, "search", json!({})))
                .await?;
            expect(&a, 200, "call in a session")?;
            let a = conn.send(Method::DELETE, &session, "").await?;
            expect(&a, 200, "session DELETE")?;
        }
        // An SSE answer.
        85..=89 => {
            let a = conn
                .send(
                    Method::POST,
                    &[("mcp-routing-id", key)],
                    call(12, Some(key), "progress", json!({})),
                )
                .await?;
            expect(&a, 200, "SSE answer")?;
            if a.headers.get("content-type").map(|v| v.as_bytes()) != Some(b"text/event-stream")
                || a.body
                    .split(|b| *b == b'\n')
                    .filter(|l| l.starts_with(b"data:"))
                    .count()
                    != 3
            {
                return Err("the SSE answer is not 3 events".into());
            }
        }
        // A 16 KiB body, the key last.
        90..=92 => {
            let filler = "x".repeat(16 * 1024);
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{{"name":"store","arguments":{{"content":"{filler}"}}}},"messageId":"{key}"}}"#
            );
            let a = conn.send(Method::POST, &[], body).await?;
            expect(&a, 200, "16 KiB call")?;
        }
        // Error answers.
        _ => match rng.random_range(0..6) {
            0 => expect(
                &conn
                    .send(Method::POST, &[], r#"{"jsonrpc":"2.0","id":14,"method":"#)
                    .await?,
                400,
                "malformed JSON",
            )?,
            1 => {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{{"x":"{}"}}}}"#,
                    "y".repeat(70_000)
                );
                expect(&conn.send(Method::POST, &[], body).await?, 413, "body too large")?;
                return Ok(Next::Reconnect);
            }
            2 => expect(&conn.send(Method::TRACE, &[], "").await?, 405, "TRACE")?,
            3 => {
                let forged = call(16, None, "ask", json!({"requestState": "forged-state"}));
                expect(
                    &conn.send(Method::POST, &[], forged).await?,
                    400,
                    "unknown requestState",
                )?;
            }
            4 => {
                let get = r#"{"jsonrpc":"2.0","id":17,"method":"tasks/get","params":{"taskId":"t-a"}}"#;
                expect(
                    &conn.send(Method::POST, &[("mcp-name", "t-b")], get).await?,
                    400,
                    "Mcp-Name mismatch",
                )?;
            }
            _ => expect(
                &conn
                    .send(
                        Method::POST,
                        &[("mcp-routing-id", key)],
                        call(18, Some(key), "fail", json!({})),
                    )
                    .await?,
                500,
                "backend 500",
            )?,
        },
    }
    Ok(match rng.random_range(0..200) {
        0 => Next::Reconnect,
        _ => Next::Continue,
    })
}

/// A held SSE stream of a session, on a connection of its own, until the phase ends.
async fn held(target: &Target, until: Instant, tally: &Tally) -> Result<(), String> {
    let mut conn = connect(target).await?;
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"train"}}}"#;
    let a = conn.send(Method::POST, &[], init).await?;
    expect(&a, 200, "initialize")?;
    let sid = a
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let events = conn.hold(&[("mcp-session-id", &sid)], until).await?;
    tally.held_events.fetch_add(events, Ordering::Relaxed);
    Ok(())
}
