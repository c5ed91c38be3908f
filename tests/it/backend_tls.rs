//! TLS to backends (`https://` URLs, `[upstream] tls_ca`, `tls_client_cert`/`tls_client_key`,
//! `tls_server_name`, `[discovery] scheme = "https"`): example workers behind a TLS front whose
//! certificates the test makes (rcgen). Served when the certificate verifies; 502
//! `upstream_tls`, counted as `kind="tls"` and toward ejection, when it does not; mTLS; kept-alive
//! and resumed TLS connections; a renewed CA file picked up by a reload; health checks over TLS;
//! the config's checks.

use crate::support::tls_backend;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use mrtr_router::Config;
use serde_json::json;
use tls_backend::*;

/// Health checks out of the way: one at the start (a TLS handshake on a connection of its own,
/// never pooled), then none.
const QUIET_HEALTH: &str = "[health]\ninterval = \"1h\"\n";

fn ping(id: u64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}})
}

/// `[upstream]` trusting the CA file at `ca`, plus `more` keys.
fn upstream(ca: &Path, more: &str) -> String {
    format!("[upstream]\ntls_ca = \"{}\"\n{more}\n", ca.display())
}

fn https(name: &str, host: &str, front: &TlsFront) -> BackendSpec {
    BackendSpec {
        name: name.into(),
        url: format!("https://{host}:{}", front.addr.port()),
        weight: 1,
    }
}

fn tls_errors(m: &str, backend: &str) -> f64 {
    metric(
        m,
        &format!("mrtr_upstream_errors_total{{backend=\"{backend}\",kind=\"tls\"}}"),
    )
    .unwrap_or(0.0)
}

fn opened(m: &str, backend: &str) -> f64 {
    metric(
        m,
        &format!("mrtr_upstream_connections_opened_total{{backend=\"{backend}\"}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn an_https_backend_is_served_over_one_kept_alive_verified_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let worker = start_worker("worker-0").await;
    let front = tls_front(worker.addr, &ca.server(&["localhost"]), None).await;
    let spec = https("worker-0", "localhost", &front);
    let fleet = Fleet::start_backends(
        vec![worker],
        &[spec],
        &format!("{QUIET_HEALTH}{}", upstream(&ca_file, "")),
    )
    .await;
    for i in 0..20 {
        let a = fleet.post(&[], &ping(i)).await;
        assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "worker-0"), "{a:?}");
    }
    // A multi-round call is pinned and followed up over TLS as over plain HTTP.
    let a = fleet.post(&[], &start_call("tls-call", 2)).await;
    assert_eq!(a.json()["result"]["pending"], true, "{a:?}");
    let a = fleet.post(&[], &confirm("tls-call", 2)).await;
    assert_eq!(a.json()["result"]["content"][0]["text"], "done", "{a:?}");
    assert_eq!(fleet.total_executions(), 1);
    // The backend sees its own host in `Host`, and the request arrived over TLS.
    let a = send(
        &fleet.client,
        http::Method::POST,
        &format!("http://{}/echo", fleet.router),
        &[],
        "{}".into(),
    )
    .await;
    let host = format!("localhost:{}", front.addr.port());
    assert_eq!(echoed(&a.json(), "host"), [host.as_str()]);
    let m = fleet.metrics().await;
    assert_eq!(opened(&m, "worker-0"), 1.0, "one TLS connection, kept alive:\n{m}");
    eventually(
        Duration::from_secs(10),
        "the health check's handshake and the pooled one",
        || front.handshakes() == 2,
    )
    .await;
    assert_eq!(tls_errors(&m, "worker-0"), 0.0);
    fleet.shutdown().await;
}

#[tokio::test]
async fn certificates_that_do_not_verify_answer_upstream_tls_and_eject_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let stranger = Ca::new("someone else's CA");
    for (what, leaf) in [
        ("unknown issuer", stranger.server(&["localhost"])),
        ("expired", ca.expired_server(&["localhost"])),
        ("another name", ca.server(&["other.example"])),
    ] {
        let worker = start_worker("bad").await;
        let front = tls_front(worker.addr, &leaf, None).await;
        let spec = https("bad", "localhost", &front);
        let extra = format!(
            "[health]\ninterval = \"1h\"\nunhealthy_after = 3\n{}",
            upstream(&ca_file, "")
        );
        let fleet = Fleet::start_backends(vec![worker], &[spec], &extra).await;
        // The health check at the start is the first failure; two requests make three.
        for i in 0..2 {
            let a = fleet.post(&[], &ping(i)).await;
            assert_eq!(
                (a.status.as_u16(), a.router_error()),
                (502, Some("upstream_tls")),
                "{what}: {a:?}"
            );
            assert_eq!(a.json()["error"]["code"], -32003, "{what}");
            assert_eq!(a.json()["id"], i, "{what}");
        }
        assert_eq!(fleet.total_requests(), 0, "{what}: nothing reached the worker");
        let m = fleet.metrics().await;
        assert_eq!(tls_errors(&m, "bad"), 2.0, "{what}:\n{m}");
        assert_eq!(
            metric(&m, "mrtr_router_errors_total{reason=\"upstream_tls\"}"),
            Some(2.0),
            "{what}"
        );
        // Three failures in a row: ejected, as after connect errors.
        eventually(Duration::from_secs(10), "ejected", || {
            !fleet.control.backends()[0].healthy
        })
        .await;
        let a = fleet.post(&[], &ping(9)).await;
        assert_eq!(a.router_error(), Some("no_backend"), "{what}: {a:?}");
        fleet.shutdown().await;
    }
}

#[tokio::test]
async fn tls_server_name_checks_a_backend_reached_by_ip_against_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let worker = start_worker("by-ip").await;
    let front = tls_front(worker.addr, &ca.server(&["mcp.internal"]), None).await;
    let url = format!("https://127.0.0.1:{}", front.addr.port());
    let extra = format!("{QUIET_HEALTH}{}", upstream(&ca_file, ""));
    // Without the override the certificate's name does not match the IP: refused.
    let fleet = Fleet::start_backends(
        Vec::new(),
        &[BackendSpec {
            name: "by-ip".into(),
            url: url.clone(),
            weight: 1,
        }],
        &extra,
    )
    .await;
    assert_eq!(fleet.post(&[], &ping(1)).await.router_error(), Some("upstream_tls"));
    // With it, served; the change is taken in place by a reload.
    let text = std::fs::read_to_string(&fleet.config_path).unwrap();
    std::fs::write(
        &fleet.config_path,
        format!("{text}tls_server_name = \"mcp.internal\"\n"),
    )
    .unwrap();
    fleet.control.reload().expect("reload accepted");
    let a = fleet.post(&[], &ping(2)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.worker(), "by-ip");
    drop(worker);
    fleet.shutdown().await;
}

#[tokio::test]
async fn an_mtls_backend_refuses_the_router_without_a_client_certificate_and_serves_it_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let clients = Ca::new("client CA");
    let (cert, key) = clients.client("mrtr-router").write(dir.path(), "client");
    let worker = start_worker("mtls").await;
    let front = tls_front(worker.addr, &ca.server(&["localhost"]), Some(&clients)).await;
    let spec = https("mtls", "localhost", &front);

    // Over HTTP/1.1 and over HTTP/2 (where the refusal comes while waiting for SETTINGS).
    for http2 in ["http2 = false", "http2 = true"] {
        let extra = format!("{QUIET_HEALTH}{}", upstream(&ca_file, http2));
        let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&spec), &extra).await;
        let refused_before = front.failed();
        let a = fleet.post(&[], &ping(1)).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (502, Some("upstream_tls")),
            "{http2}: {a:?}"
        );
        eventually(Duration::from_secs(10), "the backend refused the handshake", || {
            front.failed() > refused_before
        })
        .await;
        assert_eq!(tls_errors(&fleet.metrics().await, "mtls"), 1.0, "{http2}");
        fleet.shutdown().await;
    }

    // A certificate another CA signed is refused the same way.
    let (other_cert, other_key) = Ca::new("unknown client CA")
        .client("mrtr-router")
        .write(dir.path(), "other");
    let keys = |c: &Path, k: &Path| {
        format!(
            "tls_client_cert = \"{}\"\ntls_client_key = \"{}\"",
            c.display(),
            k.display()
        )
    };
    let extra = format!("{QUIET_HEALTH}{}", upstream(&ca_file, &keys(&other_cert, &other_key)));
    let fleet = Fleet::start_backends(Vec::new(), std::slice::from_ref(&spec), &extra).await;
    assert_eq!(fleet.post(&[], &ping(2)).await.router_error(), Some("upstream_tls"));
    fleet.shutdown().await;

    let extra = format!("{QUIET_HEALTH}{}", upstream(&ca_file, &keys(&cert, &key)));
    let fleet = Fleet::start_backends(vec![worker], &[spec], &extra).await;
    for i in 0..5 {
        let a = fleet.post(&[], &ping(i)).await;
        assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "mtls"), "{a:?}");
    }
    assert_eq!(tls_errors(&fleet.metrics().await, "mtls"), 0.0);
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_renewed_ca_file_and_a_reload_verify_new_connections_against_the_new_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (Ca::new("old CA"), Ca::new("new CA"));
    let ca_file = write(dir.path(), "ca.pem", &old.pem());
    let worker = start_worker("renewed").await;
    // The backend already has its certificate from the new CA.
    let front = tls_front(worker.addr, &new.server(&["localhost"]), None).await;
    let spec = https("renewed", "localhost", &front);
    let extra = format!(
        "[health]\ninterval = \"1h\"\nunhealthy_after = 100\n{}",
        upstream(&ca_file, "")
    );
    let fleet = Fleet::start_backends(vec![worker], &[spec], &extra).await;
    assert_eq!(fleet.post(&[], &ping(1)).await.router_error(), Some("upstream_tls"));

    // The same config text; the file now holds the new CA.
    write(dir.path(), "ca.pem", &new.pem());
    fleet.control.reload().expect("reload accepted");
    let a = fleet.post(&[], &ping(2)).await;
    assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "renewed"), "{a:?}");

    // A broken CA file is rejected, naming the key and the file; the new CA stays in use.
    write(dir.path(), "ca.pem", "not a certificate");
    let e = fleet
        .control
        .reload()
        .expect_err("a bad CA file is rejected")
        .to_string();
    assert!(
        e.contains("upstream.tls_ca") && e.contains(&ca_file.display().to_string()),
        "{e}"
    );
    assert_eq!(fleet.post(&[], &ping(3)).await.status, 200);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"ok\"}"), Some(1.0));
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"error\"}"), Some(1.0));
    fleet.shutdown().await;
}

#[tokio::test]
async fn idle_tls_connections_close_after_idle_timeout_and_the_next_one_resumes_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let worker = start_worker("resume").await;
    let front = tls_front(worker.addr, &ca.server(&["localhost"]), None).await;
    let spec = https("resume", "localhost", &front);
    let extra = format!("{QUIET_HEALTH}{}", upstream(&ca_file, "idle_timeout = \"200ms\""));
    let fleet = Fleet::start_backends(vec![worker], &[spec], &extra).await;
    // The health check's handshake, on a connection closed at once (it reads nothing, so it
    // keeps no session ticket).
    eventually(Duration::from_secs(10), "the health check's connection closed", || {
        front.closed() == 1
    })
    .await;
    assert_eq!(fleet.post(&[], &ping(1)).await.status, 200);
    // The pooled connection idles past 200 ms: the once-a-second sweep closes it.
    eventually(Duration::from_secs(10), "the idle TLS connection is closed", || {
        front.closed() == 2
    })
    .await;
    assert_eq!(fleet.control.backends()[0].idle_connections, 0);
    assert_eq!(fleet.post(&[], &ping(2)).await.status, 200);
    assert_eq!(front.handshakes(), 3);
    assert_eq!(
        front.resumed(),
        1,
        "the last handshake resumed the pooled one's session"
    );
    assert_eq!(opened(&fleet.metrics().await, "resume"), 2.0);
    fleet.shutdown().await;
}

#[tokio::test]
async fn health_checks_go_over_tls_a_handshake_or_a_get() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (good, bad) = (start_worker("good").await, start_worker("bad").await);
    let good_front = tls_front(good.addr, &ca.server(&["localhost"]), None).await;
    let bad_front = tls_front(bad.addr, &Ca::new("stranger").server(&["localhost"]), None).await;
    let specs = [
        https("good", "localhost", &good_front),
        https("bad", "localhost", &bad_front),
    ];
    // `path = ""`: a completed handshake is the check.
    let extra = format!(
        "[health]\ninterval = \"20ms\"\nunhealthy_after = 2\n{}",
        upstream(&ca_file, "")
    );
    let fleet = Fleet::start_backends(Vec::new(), &specs, &extra).await;
    eventually(
        Duration::from_secs(10),
        "the backend whose certificate fails is ejected",
        || fleet.control.backend("bad").is_some_and(|b| !b.healthy),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "several handshakes checked the good one",
        || good_front.handshakes() >= 3,
    )
    .await;
    assert!(fleet.control.backend("good").unwrap().healthy);
    assert_eq!(
        good.state.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a handshake, no request"
    );
    fleet.shutdown().await;

    // With a path, the GET goes over the pooled TLS connection.
    let extra = format!(
        "[health]\ninterval = \"20ms\"\npath = \"/status/200\"\n{}",
        upstream(&ca_file, "")
    );
    let fleet = Fleet::start_backends(vec![good], &specs[..1], &extra).await;
    // Checks run on a fixed cadence, so the first ones overlap while a debug build's handshake
    // takes longer than the interval, each on a connection of its own; once those are open,
    // every check goes over one of them.
    eventually(Duration::from_secs(10), "checks reach the worker", || {
        fleet.total_requests() >= 5
    })
    .await;
    let (before, checks) = (good_front.handshakes(), fleet.total_requests());
    eventually(Duration::from_secs(10), "ten more checks", || {
        fleet.total_requests() >= checks + 10
    })
    .await;
    assert!(fleet.control.backend("good").unwrap().healthy);
    assert_eq!(
        good_front.handshakes(),
        before,
        "every later check on a kept-alive connection"
    );
    drop(bad);
    fleet.shutdown().await;
}

#[tokio::test]
async fn discovered_backends_over_https_are_checked_against_the_dns_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let worker = start_worker("discovered").await;
    let front = tls_front(worker.addr, &ca.server(&["mcp-workers.test"]), None).await;
    let port = front.addr.port();
    let extra = format!(
        "[discovery]\ndns = \"mcp-workers.test:{port}\"\ninterval = \"50ms\"\nscheme = \"https\"\n{QUIET_HEALTH}{}",
        upstream(&ca_file, "")
    );
    let fleet = Fleet::start_backends(vec![worker], &[], &extra).await;
    fleet.control.set_resolver(Arc::new(|_host, _port| {
        Box::pin(async { Ok(vec!["127.0.0.1:0".parse().unwrap()]) })
    }));
    let name = format!("dns:127.0.0.1:{port}");
    eventually(Duration::from_secs(10), "the discovered backend is in the ring", || {
        fleet.control.view().ring().iter().any(|b| b.name == name)
    })
    .await;
    let a = fleet.post(&[], &ping(1)).await;
    assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "discovered"), "{a:?}");
    assert_eq!(
        fleet.control.backend(&name).unwrap().url,
        format!("https://127.0.0.1:{port}")
    );
    fleet.shutdown().await;
}

#[test]
fn upstream_config_is_read_checked_and_printed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key) = ca.client("router").write(dir.path(), "client");
    let (_, other_key) = ca.client("other").write(dir.path(), "other");
    let file = dir.path().join("c.toml");
    let parse = |text: &str| Config::parse(&file, text);
    let backend = "[[backend]]\nname = \"a\"\nurl = \"https://mcp-7.internal:8443\"\nhttp2 = true\ntls_server_name = \"mcp.internal\"\n";

    let c = parse(&format!(
        "[upstream]\ntls_ca = \"ca.pem\"\ntls_client_cert = \"client.pem\"\ntls_client_key = \"client.key\"\nhttp2 = false\nidle_timeout = \"3s\"\n{backend}"
    ))
    .unwrap();
    let u = &c.upstream;
    assert_eq!((u.http2, u.idle_timeout), (false, Duration::from_secs(3)));
    assert_eq!(
        u.tls.ca_path.as_deref(),
        Some(ca_file.as_path()),
        "relative to the config's directory"
    );
    let clients = u.tls.clients.as_ref().expect("built: a backend is https");
    assert_eq!((clients.roots, clients.from_system), (1, false));
    assert_eq!(clients.http1.alpn_protocols, [b"http/1.1".to_vec()]);
    assert_eq!(clients.http2.alpn_protocols, [b"h2".to_vec()]);
    let b = &c.backends[0];
    assert_eq!(
        (b.http2, b.tls_server_name.as_deref()),
        (Some(true), Some("mcp.internal"))
    );
    // `check` prints every key; what it prints loads back the same config.
    let printed = c.to_toml();
    for line in [
        format!("tls_ca = \"{}\"", ca_file.display()),
        format!("tls_client_cert = \"{}\"", cert.display()),
        format!("tls_client_key = \"{}\"", key.display()),
        "http2 = false".into(),
        "idle_timeout = \"3s\"".into(),
        "http2 = true".into(),
        "tls_server_name = \"mcp.internal\"".into(),
    ] {
        assert!(printed.contains(&line), "{line} in:\n{printed}");
    }
    assert_eq!(parse(&printed).unwrap(), c, "{printed}");

    // Defaults: no TLS configured, 4 s idle timeout, HTTP/1.1; a plain fleet builds no TLS client.
    let c = parse("[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n").unwrap();
    assert_eq!(
        (c.upstream.http2, c.upstream.idle_timeout),
        (false, Duration::from_secs(4))
    );
    assert!(c.upstream.tls.clients.is_none());
    let printed = c.to_toml();
    assert!(
        printed.contains("[upstream]\n") && printed.contains("idle_timeout = \"4s\""),
        "{printed}"
    );
    assert!(printed.contains("# http2 = false (from [upstream])"), "{printed}");
    // Discovery's scheme and name.
    let c = parse("[discovery]\ndns = \"w.svc:8443\"\nscheme = \"https\"\n[upstream]\ntls_ca = \"ca.pem\"\n").unwrap();
    let d = c.discovery.as_ref().unwrap();
    assert_eq!((d.scheme.as_str(), d.tls_server_name.as_deref()), ("https", None));
    assert!(c.upstream.tls.clients.is_some());
    assert_eq!(parse(&c.to_toml()).unwrap(), c);

    let key_err = |text: String, needle: &str| {
        let e = parse(&text).expect_err(&text).to_string();
        assert!(e.contains(needle), "{text}\n→ {e}");
        assert!(e.contains("c.toml:"), "the file (and line) named: {e}");
    };
    let missing = dir.path().join("missing.pem");
    key_err(
        format!("[upstream]\ntls_ca = \"{}\"\n{backend}", missing.display()),
        &format!("upstream.tls_ca: cannot read {}", missing.display()),
    );
    key_err(
        format!("[upstream]\ntls_ca = \"client.key\"\n{backend}"),
        "upstream.tls_ca",
    );
    key_err(
        format!("[upstream]\ntls_client_cert = \"client.pem\"\n{backend}"),
        "set both (mTLS) or neither",
    );
    key_err(
        format!(
            "[upstream]\ntls_client_cert = \"client.pem\"\ntls_client_key = \"{}\"\n{backend}",
            other_key.display()
        ),
        "does not fit the certificate",
    );
    key_err(
        "[upstream]\nhttp2 = \"yes\"\n[[backend]]\nname = \"a\"\nurl = \"http://x:1\"\n".into(),
        "upstream.http2: expected true or false",
    );
    key_err(
        "[[backend]]\nname = \"a\"\nurl = \"http://x:1\"\ntls_server_name = \"n\"\n".into(),
        "backend.tls_server_name: only for https://",
    );
    key_err(
        "[[backend]]\nname = \"a\"\nurl = \"https://x:1\"\ntls_server_name = \"not a name!\"\n".into(),
        "is not a DNS name",
    );
    key_err(
        "[discovery]\ndns = \"w:1\"\nscheme = \"tls\"\n".into(),
        "discovery.scheme",
    );
    key_err(
        "[discovery]\ndns = \"w:1\"\ntls_server_name = \"w\"\n".into(),
        "discovery.tls_server_name: only for https://",
    );
    key_err(
        "[[backend]]\nname = \"a\"\nurl = \"ftp://x:1\"\n".into(),
        "http:// or https://",
    );
}

/// Without `tls_ca`, the system trust store verifies backends (read with rustls-native-certs,
/// which takes `SSL_CERT_FILE` and `SSL_CERT_DIR` when set: here, the test's CA and an empty
/// directory; no other test of this file reads the system store). An empty store is a config
/// error, not a fleet that trusts nothing.
#[tokio::test]
async fn without_tls_ca_the_system_trust_store_verifies_backends() {
    if crate::support::ran_alone() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("system CA");
    let ca_file = write(dir.path(), "system-ca.pem", &ca.pem());
    let saved = ["SSL_CERT_FILE", "SSL_CERT_DIR"].map(|v| (v, std::env::var_os(v)));
    let empty_dir = tempfile::tempdir().unwrap();
    std::env::set_var("SSL_CERT_FILE", &ca_file);
    std::env::set_var("SSL_CERT_DIR", empty_dir.path());
    let worker = start_worker("system").await;
    let front = tls_front(worker.addr, &ca.server(&["localhost"]), None).await;
    let fleet = Fleet::start_backends(vec![worker], &[https("system", "localhost", &front)], QUIET_HEALTH).await;
    let clients = fleet.control.config().upstream.tls.clients.clone().expect("built");
    assert_eq!((clients.from_system, clients.roots), (true, 1));
    assert!(fleet.control.config().to_toml().contains("# tls_ca unset"));
    let a = fleet.post(&[], &ping(1)).await;
    assert_eq!((a.status.as_u16(), a.worker().as_str()), (200, "system"), "{a:?}");
    fleet.shutdown().await;

    write(dir.path(), "system-ca.pem", "");
    let text = "[[backend]]\nname = \"a\"\nurl = \"https://localhost:1\"\n";
    let e = Config::parse(&dir.path().join("c.toml"), text)
        .expect_err("no roots")
        .to_string();
    assert!(e.contains("system trust store has no certificate"), "{e}");
    for (var, value) in saved {
        match value {
            Some(value) => std::env::set_var(var, value),
            None => std::env::remove_var(var),
        }
    }
}
