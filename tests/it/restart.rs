//! Restarts refuse no connection: with its listening sockets passed by socket activation
//! (`LISTEN_FDS`, as systemd passes them), a router restarted under load leaves new
//! connections queued in the kernel until the next process takes them; with `[tokens]`, a
//! call in flight across the restart continues on the new process.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "restart-key-0123456789abcdef0123456789";

/// The router binary with `proxy` and `admin` passed as fds 3 and 4, as systemd passes them
/// (`LISTEN_PID` set by a shell to its own pid, which `exec` keeps).
fn spawn_activated(config: &std::path::Path, proxy: RawFd, admin: RawFd) -> Child {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ exec \"$0\" --config \"$1\"")
        .arg(bin())
        .arg(config)
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", "proxy:admin")
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Out of the way first, so that neither dup2 overwrites the other's source.
            let p = libc::fcntl(proxy, libc::F_DUPFD, 100);
            let a = libc::fcntl(admin, libc::F_DUPFD, 100);
            if p < 0 || a < 0 || libc::dup2(p, 3) < 0 || libc::dup2(a, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// One request on a new connection (what a restart could refuse); true when it got a 200.
async fn ping_on_new_connection(addr: SocketAddr) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    matches!(
        tokio::time::timeout(REQUEST_DEADLINE, s.read_to_end(&mut answer)).await,
        Ok(Ok(_))
    ) && answer.starts_with(b"HTTP/1.1 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_passed_sockets_refuses_no_connection_and_loses_no_call() {
    let workers = vec![start_worker("w1").await, start_worker("w2").await];
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (proxy_addr, admin_addr) = (proxy.local_addr().unwrap(), admin.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    // The config's own addresses are never bound: the passed sockets are used instead.
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:1\"\nshutdown_grace = \"5s\"\n[admin]\nlisten = \"127.0.0.1:2\"\n\
         [tokens]\nkeys = [\"{KEY}\"]\n"
    );
    for w in &workers {
        text.push_str(&format!(
            "[[backend]]\nname = \"{}\"\nurl = \"{}\"\n",
            w.state.name,
            w.url()
        ));
    }
    std::fs::write(&config, text).unwrap();
    let client = client();
    let mut first = KillOnDrop(spawn_activated(&config, proxy.as_raw_fd(), admin.as_raw_fd()));
    let first = &mut first.0;
    wait_readyz(first, &client, admin_addr, 200, "the first router starts").await;

    // A call starts on the first process.
    let url = format!("http://{proxy_addr}/mcp");
    let start = send(
        &client,
        http::Method::POST,
        &url,
        &[],
        start_call("across-1", 2).to_string().into(),
    )
    .await;
    assert_eq!(start.json()["result"]["pending"], true, "{start:?}");
    let token = start.headers["mcp-routing-id"].to_str().unwrap().to_string();

    // Load on new connections throughout the restart.
    let (served, failed, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let load = {
        let (served, failed, stop) = (served.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let counter = if ping_on_new_connection(proxy_addr).await {
                    &served
                } else {
                    &failed
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let wait_served = |n: u64, what: &'static str| {
        let served = served.clone();
        async move {
            eventually(Duration::from_secs(20), what, || served.load(Ordering::Relaxed) >= n).await;
        }
    };
    wait_served(50, "load through the first router").await;
    signal(first, "TERM");
    wait_for_exit(first, "the first router to stop").await;
    let during = served.load(Ordering::Relaxed);
    let mut second = KillOnDrop(spawn_activated(&config, proxy.as_raw_fd(), admin.as_raw_fd()));
    let second = &mut second.0;
    wait_served(during + 50, "load through the second router").await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "a request failed across the restart");

    // The call goes on in the second process, by its token.
    let follow_up = send(
        &client,
        http::Method::POST,
        &url,
        &[("mcp-routing-id", &token)],
        confirm("across-1", 2).to_string().into(),
    )
    .await;
    assert_eq!(
        follow_up.json()["result"]["content"][0]["text"],
        "done",
        "{follow_up:?}"
    );
    assert_eq!(follow_up.worker(), start.worker());
    signal(second, "TERM");
    wait_for_exit(second, "the second router to stop").await;
}
