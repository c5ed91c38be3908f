//! The binary: `check`, `route`, `demo`, `--version`, and a served router reloaded by SIGHUP and
//! stopped by SIGTERM.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Method;

#[test]
fn check_prints_the_effective_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n").unwrap();
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("virtual_nodes = 160") && text.contains("on_pin_lost = \"strict\""),
        "{text}"
    );

    std::fs::write(
        &path,
        "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\nweight = -1\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("c.toml:4") && err.contains("backend.weight"), "{err}");
}

#[test]
fn check_reads_the_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), signing_key.serialize_pem()).unwrap();
    let backend = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
    let check = |server: &str| {
        std::fs::write(&path, format!("[server]\n{server}{backend}")).unwrap();
        Command::new(bin())
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };
    // Relative to the config file's directory, whatever the working directory.
    let out = check("tls_cert = \"server.pem\"\ntls_key = \"server.key\"\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let printed = toml::Value::String(dir.path().join("server.pem").to_string_lossy().into()).to_string();
    assert!(text.contains(&format!("tls_cert = {printed}")), "{text}");
    // `demo` drives its calls over plain HTTP: with TLS configured it says so and stops.
    let demo = Command::new(bin())
        .args(["demo", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(demo.status.code(), Some(1));
    let err = String::from_utf8_lossy(&demo.stderr);
    assert!(err.contains("demo drives its calls over plain HTTP"), "{err}");

    let out = check("tls_cert = \"gone.pem\"\ntls_key = \"server.key\"\n");
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    let gone = dir.path().join("gone.pem");
    assert!(
        err.contains("c.toml:2") && err.contains(&format!("server.tls_cert: cannot read {}", gone.display())),
        "{err}"
    );
}

#[test]
fn route_explains_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n[[backend]]\nname = \"b\"\nurl = \"http://127.0.0.1:9002\"\n").unwrap();
    let out = Command::new(bin())
        .args(["route", "--config"])
        .arg(&path)
        .arg("transfer-1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "ring");
    assert!(v["backend"] == "a" || v["backend"] == "b");
    // The same key always maps the same way, in every process.
    let again = Command::new(bin())
        .args(["route", "--config"])
        .arg(&path)
        .arg("transfer-1")
        .output()
        .unwrap();
    assert_eq!(out.stdout, again.stdout);
    let body = Command::new(bin())
        .args(["route", "--config"])
        .arg(&path)
        .args([
            "--body",
            r#"{"jsonrpc":"2.0","id":1,"messageId":"transfer-1","method":"tools/call"}"#,
        ])
        .output()
        .unwrap();
    let vb: serde_json::Value = serde_json::from_slice(&body.stdout).unwrap();
    assert_eq!(vb["backend"], v["backend"], "header key and body key hash alike");
    assert_eq!(vb["keys"]["method"], "tools/call");
}

/// The router turns transparent huge pages off for itself (see `main.rs`): with them, memory
/// freed by connections that wait stays resident inside huge pages.
#[tokio::test]
async fn the_router_runs_without_transparent_huge_pages() {
    let w = start_worker("w").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let (port, admin) = (free_port(), free_port());
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n[[backend]]\nname = \"w\"\nurl = \"{}\"\n",
        w.url()
    );
    std::fs::write(&path, text).unwrap();
    let mut child = KillOnDrop(spawn_router(&path));
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
    wait_readyz(&mut child.0, &client(), admin_addr, 200, "the router to become ready").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("the kernel reports THP_enabled (Linux 5.0 and later)");
    assert_eq!(thp.trim(), "0", "transparent huge pages are on for the router");
}

#[tokio::test]
async fn sighup_reloads_and_sigterm_stops() {
    let w1 = start_worker("w1").await;
    let w2 = start_worker("w2").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let (port, admin) = (free_port(), free_port());
    let head = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n");
    std::fs::write(
        &path,
        format!("{head}[[backend]]\nname = \"w1\"\nurl = \"{}\"\n", w1.url()),
    )
    .unwrap();
    let mut child = spawn_router(&path);
    let c = client();
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
    wait_readyz(&mut child, &c, admin_addr, 200, "the router to become ready").await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let a = send(
        &c,
        Method::POST,
        &url,
        &[],
        Bytes::from(start_call("hup-1", 2).to_string()),
    )
    .await;
    assert_eq!(a.worker(), "w1");

    std::fs::write(
        &path,
        format!(
            "{head}[[backend]]\nname = \"w1\"\nurl = \"{}\"\n[[backend]]\nname = \"w2\"\nurl = \"{}\"\n",
            w1.url(),
            w2.url()
        ),
    )
    .unwrap();
    signal(&child, "HUP");
    let metrics_url = format!("http://127.0.0.1:{admin}/metrics");
    let mut reloaded = false;
    for _ in 0..200 {
        let m = send(&c, Method::GET, &metrics_url, &[], Bytes::new()).await;
        if metric(&String::from_utf8_lossy(&m.body), "mrtr_ring_members") == Some(2.0) {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(reloaded, "SIGHUP did not reload the config");
    let b = send(
        &c,
        Method::POST,
        &url,
        &[],
        Bytes::from(confirm("hup-1", 2).to_string()),
    )
    .await;
    assert_eq!(b.worker(), "w1", "the pin survived the reload");
    assert_eq!(b.json()["result"]["content"][0]["text"], "done");

    signal(&child, "TERM");
    let status = wait_for_exit(&mut child, "the router to stop on SIGTERM").await;
    assert!(status.success(), "{status:?}");
}

/// `mrtr-router demo` (the README's first command): example workers behind the router, four
/// two-round calls whose rounds each reach one worker, then it serves until Ctrl-C.
#[tokio::test]
async fn demo_drives_calls_through_the_router_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.toml");
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:{}\"\n[admin]\nlisten = \"127.0.0.1:{}\"\n",
        free_port(),
        free_port()
    );
    for i in 0..3 {
        text.push_str(&format!(
            "[[backend]]\nname = \"w{i}\"\nurl = \"http://127.0.0.1:{}\"\n",
            free_port()
        ));
    }
    std::fs::write(&path, text).unwrap();
    let mut child = Command::new(bin())
        .arg("demo")
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let mut calls = Vec::new();
    loop {
        let Ok(line) = lines.recv_timeout(CHILD_DEADLINE) else {
            let _ = child.kill();
            panic!("the demo stopped printing before it served: {calls:?}");
        };
        if line.starts_with("serving until Ctrl-C") {
            break;
        }
        if let Some(rounds) = line.strip_prefix("call ") {
            calls.push(rounds.to_string());
        }
    }
    assert_eq!(calls.len(), 4, "{calls:?}");
    for call in &calls {
        let (_, rounds) = call.split_once("round 1 → ").unwrap();
        let (first, second) = rounds.split_once(", round 2 → ").unwrap();
        let worker = |r: &str| r.split(' ').next().unwrap().to_string();
        assert_eq!(worker(first), worker(second), "{call}");
        assert!(first.ends_with("(pending)") && second.ends_with("(done)"), "{call}");
    }
    signal(&child, "INT");
    let status = wait_for_exit(&mut child, "the demo to stop on Ctrl-C").await;
    assert!(status.success(), "{status}");
}

/// `demo` fits its config to the machine: under an open-file limit that caps the router below
/// `server.max_connections`, the demo lowers it and warns of nothing, while the router served
/// from the same file still warns.
#[test]
fn the_demo_fits_max_connections_to_the_open_file_limit_and_serving_still_warns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.toml");
    let (port, admin) = (free_port(), free_port());
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = 10000\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n"
    );
    for i in 0..2 {
        text.push_str(&format!(
            "[[backend]]\nname = \"w{i}\"\nurl = \"http://127.0.0.1:{}\"\n",
            free_port()
        ));
    }
    std::fs::write(&path, text).unwrap();
    // 512 descriptors (soft and hard): the router affords (512 - 128) / 2 = 192 connections.
    let run = |verb: &str| {
        let script = format!("ulimit -n 512 && exec \"$0\" {verb} --config \"$1\"");
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(bin())
            .arg(&path)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let lines = stderr_until(&mut child.0, "accepting client connections");
        (child, lines)
    };
    let (demo, lines) = run("demo");
    let warned = |lines: &[String]| lines.iter().any(|l| l.contains("open-file limit allows fewer"));
    assert!(!warned(&lines), "{lines:#?}");
    assert!(
        lines.last().unwrap().contains("cap=128"),
        "a quarter of the limit: {lines:#?}"
    );
    drop(demo);
    let (_served, lines) = run("");
    assert!(warned(&lines), "{lines:#?}");
    assert!(lines.last().unwrap().contains("cap=192"), "{lines:#?}");
}

/// The lines `child` writes to stderr up to the first that contains `marker` (included); panics
/// after [`CHILD_DEADLINE`].
fn stderr_until(child: &mut std::process::Child, marker: &str) -> Vec<String> {
    let rx = lines_of(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + CHILD_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(marker);
                lines.push(line);
                if done {
                    return lines;
                }
            }
            Err(_) => panic!("no line with {marker:?} on stderr: {lines:#?}"),
        }
    }
}

/// The lines of `pipe` as they come, read by a thread of their own.
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `--version` names the commit the binary was built from (`build.rs`): the checkout's `HEAD`,
/// or `unknown` outside a git checkout.
#[test]
fn version_names_the_commit() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let commit = text
        .trim_end()
        .strip_prefix(&format!("mrtr-router {version} ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text:?}"));
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string());
    match head {
        Some(head) => assert_eq!(commit, head, "{text:?}"),
        None => assert_eq!(commit, "unknown", "{text:?}"),
    }
}

/// Each verb fails with a message naming the problem, and a non-zero status, never a panic.
#[test]
fn bad_inputs_fail_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n").unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[routing\nheader = 1\n").unwrap();
    let missing = dir.path().join("missing.toml");
    let cases: [(Vec<&std::ffi::OsStr>, &str); 5] = [
        (
            vec!["check".as_ref(), "--config".as_ref(), missing.as_os_str()],
            "missing.toml",
        ),
        (vec!["check".as_ref(), "--config".as_ref(), bad.as_os_str()], "bad.toml"),
        (
            vec!["route".as_ref(), "--config".as_ref(), missing.as_os_str(), "k".as_ref()],
            "missing.toml",
        ),
        (
            vec![
                "route".as_ref(),
                "--config".as_ref(),
                good.as_os_str(),
                "--body".as_ref(),
                "{not json".as_ref(),
            ],
            "--body is not JSON",
        ),
        (vec!["--config".as_ref(), bad.as_os_str()], "bad.toml"),
    ];
    for (args, expected) in cases {
        let out = Command::new(bin()).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
