//! TLS on the proxy listener (`server.tls_cert`, `server.tls_key`): HTTP/1.1 and HTTP/2 by
//! ALPN, a client that does not speak TLS or never finishes its handshake, a client that leaves
//! mid-request, a kept-alive connection served again after a wait, certificates changed by a
//! reload, and the config errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use mrtr_router::Config;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// A self-signed certificate for `localhost`, written as PEM files into `dir`.
struct TestCert {
    cert: PathBuf,
    key: PathBuf,
    der: CertificateDer<'static>,
}

fn make_cert(dir: &Path, name: &str) -> TestCert {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, signing_key.serialize_pem()).unwrap();
    TestCert {
        cert: cert_path,
        key: key_path,
        der: cert.der().clone(),
    }
}

/// The `[server]` table naming `cert`'s files, plus `more` server keys.
fn tls_server(cert: &TestCert, more: &str) -> String {
    format!(
        "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{more}\n",
        cert.cert.display(),
        cert.key.display()
    )
}

/// A TLS connection to the router that trusts only `trusted`, offering `alpn`.
async fn connect(
    fleet: &Fleet,
    trusted: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(fleet.router).await?;
    let handshake = TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp);
    tokio::time::timeout(REQUEST_DEADLINE, handshake)
        .await
        .expect("the handshake ends within the test deadline")
}

/// The HTTP/1.1 request of [`echo`]: a ping POSTed to the example worker's `/echo`.
fn http1_ping() -> Request<Full<Bytes>> {
    Request::post("/echo")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(PING)))
        .unwrap()
}

/// POSTs a ping to the example worker's `/echo` over `stream` (HTTP/2 when ALPN chose `h2`):
/// the answer's HTTP version and the headers the worker saw.
async fn echo(stream: TlsStream<TcpStream>) -> (Version, Value) {
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(stream);
    let answer = async {
        let resp = if h2 {
            let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::post("https://localhost/echo")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(PING)))
                .unwrap();
            sender.send_request(req).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            sender.send_request(http1_ping()).await.unwrap()
        };
        assert_eq!(resp.status(), 200);
        let version = resp.version();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (version, serde_json::from_slice::<Value>(&body).unwrap())
    };
    tokio::time::timeout(REQUEST_DEADLINE, answer)
        .await
        .expect("an answer within the test deadline")
}

#[tokio::test]
async fn http1_over_tls_is_proxied_and_the_backend_sees_https() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&cert, "")).await;
    // ALPN http/1.1, and no ALPN at all: both HTTP/1.1.
    for alpn in [&[&b"http/1.1"[..]][..], &[]] {
        let stream = connect(&fleet, &cert.der, alpn).await.expect("handshake");
        let expected: Option<&[u8]> = alpn.first().copied();
        assert_eq!(stream.get_ref().1.alpn_protocol(), expected);
        let (version, v) = echo(stream).await;
        assert_eq!(version, Version::HTTP_11);
        assert_eq!(echoed(&v, "x-forwarded-proto"), ["https"], "{v}");
        assert_eq!(echoed(&v, "x-forwarded-for"), ["127.0.0.1"], "{v}");
    }
    assert_eq!(fleet.total_requests(), 2);
}

#[tokio::test]
async fn alpn_h2_is_served_as_http2() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&cert, "")).await;
    let stream = connect(&fleet, &cert.der, &[b"h2", b"http/1.1"])
        .await
        .expect("handshake");
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the server prefers h2"
    );
    let (version, v) = echo(stream).await;
    assert_eq!(version, Version::HTTP_2);
    assert_eq!(echoed(&v, "x-forwarded-proto"), ["https"], "{v}");
}

#[tokio::test]
async fn plain_http_to_the_tls_port_fails_and_the_router_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    // A long header read timeout: the plain request must fail the handshake, not time out.
    let fleet = Fleet::start(1, &tls_server(&cert, "header_read_timeout = \"30s\"")).await;
    for request in [
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{PING}",
            PING.len()
        ),
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(),
    ] {
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let got = read_to_close(&mut s, Duration::from_secs(5))
            .await
            .expect("the router closes a connection that does not speak TLS");
        assert!(!got.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&got));
    }
    assert_eq!(fleet.total_requests(), 0);
    let stream = connect(&fleet, &cert.der, &[]).await.expect("handshake");
    let (_, v) = echo(stream).await;
    assert_eq!(echoed(&v, "x-forwarded-proto"), ["https"]);
}

#[tokio::test]
async fn a_handshake_that_never_finishes_is_dropped_after_the_header_read_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&cert, "header_read_timeout = \"300ms\"")).await;
    // Nothing at all; then the header of a handshake record whose body never comes.
    for first in [&b""[..], &[0x16, 0x03, 0x01, 0x02, 0x00]] {
        let started = Instant::now();
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.write_all(first).await.unwrap();
        let got = read_to_close(&mut s, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("after {first:?}, the connection is still open"));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300),
            "closed after {waited:?}: not the timeout"
        );
        assert!(got.is_empty(), "{got:?}");
    }
    // The router serves on.
    let stream = connect(&fleet, &cert.der, &[]).await.expect("handshake");
    assert_eq!(echo(stream).await.0, Version::HTTP_11);
}

/// A client that chose `h2` and then never sends the HTTP/2 preface is dropped, not held by an
/// HTTP/2 handshake that waits forever.
#[tokio::test]
async fn an_h2_client_that_never_sends_its_preface_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&cert, "header_read_timeout = \"300ms\"")).await;
    let mut stream = connect(&fleet, &cert.der, &[b"h2"]).await.expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let started = Instant::now();
    read_to_close(&mut stream, Duration::from_secs(10))
        .await
        .expect("the router closes the connection");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_tls_client_that_leaves_mid_request_is_noticed() {
    // The connection's timer peeks at the TCP socket under TLS every 100 ms while the request
    // is in flight; the worker holds its answer for 20 s, far longer than the wait below.
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&cert, "header_read_timeout = \"400ms\"")).await;
    let mut stream = connect(&fleet, &cert.der, &[b"http/1.1"]).await.expect("handshake");
    let body = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":20000}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    eventually(REQUEST_DEADLINE, "the request reaches the worker", || {
        fleet.total_requests() == 1
    })
    .await;
    // Gone without a close_notify: the TCP connection closes under the TLS stream.
    drop(stream);
    let left_at = Instant::now();
    let mut aborts = None;
    while aborts != Some(1.0) {
        assert!(
            left_at.elapsed() < Duration::from_secs(10),
            "client abort not counted: {aborts:?}"
        );
        aborts = metric(&fleet.metrics().await, "mrtr_client_aborts_total");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_reload_serves_a_changed_certificate_to_new_connections_and_a_bad_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let first = make_cert(dir.path(), "server");
    let fleet = Fleet::start(1, &tls_server(&first, "")).await;
    connect(&fleet, &first.der, &[]).await.expect("the first certificate");

    // A renewed certificate in the same files: the config text is unchanged.
    let renewed = make_cert(dir.path(), "renewed");
    std::fs::copy(&renewed.cert, &first.cert).unwrap();
    std::fs::copy(&renewed.key, &first.key).unwrap();
    fleet.control.reload().expect("reload accepted");
    let stream = connect(&fleet, &renewed.der, &[b"h2"])
        .await
        .expect("the renewed certificate");
    assert_eq!(echo(stream).await.0, Version::HTTP_2);
    assert!(
        connect(&fleet, &first.der, &[]).await.is_err(),
        "the old certificate is no longer served"
    );

    // A broken certificate file: rejected, naming the key and the file; the renewed one stays.
    std::fs::write(&first.cert, "not a certificate").unwrap();
    let e = fleet
        .control
        .reload()
        .expect_err("a bad certificate is rejected")
        .to_string();
    assert!(
        e.contains("server.tls_cert") && e.contains(&first.cert.display().to_string()),
        "{e}"
    );
    let stream = connect(&fleet, &renewed.der, &[])
        .await
        .expect("the renewed certificate still");
    assert_eq!(echo(stream).await.0, Version::HTTP_11);
    let m = fleet.metrics().await;
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"ok\"}"), Some(1.0));
    assert_eq!(metric(&m, "mrtr_config_reloads_total{result=\"error\"}"), Some(1.0));
}

#[test]
fn tls_config_needs_both_files_readable_and_matching() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let other = make_cert(dir.path(), "other");
    let backend = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
    let parse = |server: String| Config::parse(&dir.path().join("c.toml"), &format!("{server}{backend}"));

    let c = parse(tls_server(&cert, "")).unwrap();
    let tls = c.server.tls.as_ref().unwrap();
    assert_eq!((&tls.cert_path, &tls.key_path), (&cert.cert, &cert.key));
    assert_eq!(tls.server.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    // `check` prints the files, and its output loads the same config.
    let printed = c.to_toml();
    assert!(
        printed.contains(&format!("tls_cert = \"{}\"", cert.cert.display())),
        "{printed}"
    );
    assert_eq!(Config::parse(&dir.path().join("c.toml"), &printed).unwrap(), c);
    // Relative paths are taken from the config file's directory.
    let c = parse("[server]\ntls_cert = \"server.pem\"\ntls_key = \"server.key\"\n".into()).unwrap();
    assert_eq!(c.server.tls.unwrap().cert_path, cert.cert);

    for (server, needle) in [
        (
            format!("[server]\ntls_cert = \"{}\"\n", cert.cert.display()),
            "set both (TLS) or neither".to_string(),
        ),
        (
            format!("[server]\ntls_key = \"{}\"\n", cert.key.display()),
            "set both (TLS) or neither".to_string(),
        ),
        (
            format!(
                "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                dir.path().join("missing.pem").display(),
                cert.key.display()
            ),
            format!(
                "server.tls_cert: cannot read {}",
                dir.path().join("missing.pem").display()
            ),
        ),
        (
            format!(
                "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                cert.cert.display(),
                dir.path().join("missing.key").display()
            ),
            format!(
                "server.tls_key: cannot read {}",
                dir.path().join("missing.key").display()
            ),
        ),
        // A key file holding a certificate, and a key that belongs to another certificate.
        (
            format!(
                "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                cert.cert.display(),
                cert.cert.display()
            ),
            "server.tls_key".to_string(),
        ),
        (
            format!(
                "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                cert.cert.display(),
                other.key.display()
            ),
            "does not fit the certificate".to_string(),
        ),
    ] {
        let e = parse(server.clone()).expect_err(&server).to_string();
        assert!(e.contains(&needle), "{server}: {e}");
        assert!(e.contains("c.toml:"), "the line is named: {e}");
    }
}

/// A connection still in its TLS handshake when shutdown begins is closed at once, not waited
/// on for `header_read_timeout`.
#[tokio::test]
async fn a_handshake_in_progress_does_not_hold_a_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let mut fleet = Fleet::start(
        1,
        &tls_server(&cert, "header_read_timeout = \"30s\"\nshutdown_grace = \"30s\""),
    )
    .await;
    let mut silent = TcpStream::connect(fleet.router).await.unwrap();
    // Served after the silent one was accepted.
    let stream = connect(&fleet, &cert.der, &[]).await.expect("handshake");
    assert_eq!(echo(stream).await.0, Version::HTTP_11);
    fleet.assert_stops_promptly("a connection in its handshake").await;
    assert!(read_to_close(&mut silent, Duration::from_secs(5)).await.is_some());
}

/// A kept-alive HTTP/1.1 connection over TLS that waits past the router's looks (which give its
/// hyper buffers back, `vendor/README.md`, and then park it: only the TLS stream is held) is
/// served again: a new hyper connection reads on from where rustls is.
#[tokio::test]
async fn a_tls_keep_alive_connection_that_waited_is_served_again() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    // A look at each connection every second (a quarter of the timeout).
    let fleet = Fleet::start(1, &tls_server(&cert, "header_read_timeout = \"4s\"")).await;
    let stream = connect(&fleet, &cert.der, &[b"http/1.1"]).await.expect("handshake");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    for round in 0..3 {
        if round > 0 {
            // Parked after two looks, a second apart (the first gave the buffers back).
            fleet
                .wait_metric("mrtr_connections_parked", 1.0, Duration::from_secs(10))
                .await;
        }
        sender.ready().await.expect("the connection is still open");
        let resp = tokio::time::timeout(REQUEST_DEADLINE, sender.send_request(http1_ping()))
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(resp.status(), 200, "round {round}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(echoed(&v, "x-forwarded-proto"), ["https"], "round {round}: {v}");
        let m = fleet.metrics().await;
        assert_eq!(metric(&m, "mrtr_connections_parked"), Some(0.0), "round {round}");
        assert_eq!(
            metric(&m, "mrtr_connections{protocol=\"http1\"}"),
            Some(1.0),
            "round {round}"
        );
    }
    assert_eq!(fleet.total_requests(), 3);
}
