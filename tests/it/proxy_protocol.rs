//! `server.proxy_protocol`: real PROXY protocol v1 and v2 headers sent over TCP before HTTP/1.1
//! and h2c; the client address the backend is told (`X-Forwarded-For`, from the `/echo`
//! worker) is the header's source from a trusted balancer, and a header from anyone else, or a
//! trusted balancer's connection without one, is closed without an answer and never reaches a
//! backend.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{echoed, read_to_close, Fleet, REQUEST_DEADLINE};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// 127.0.0.1 is the balancer; 127.0.0.2 is a client that reaches the router directly.
const CONFIG: &str = "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\"]\n";

const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

async fn connect_from(source: &str, router: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(router).await.unwrap()
}

fn v2(command: u8, family: u8, block: &[u8]) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.extend_from_slice(&[0x20 | command, family]);
    out.extend_from_slice(&(block.len() as u16).to_be_bytes());
    out.extend_from_slice(block);
    out
}

fn echo_request(router: SocketAddr) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{router}/echo"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}",
        )))
        .unwrap()
}

/// Sends `header`, then a POST to `/echo` over HTTP/1.1 (or h2c), and returns the
/// `X-Forwarded-For` the backend received.
async fn forwarded_for(mut tcp: TcpStream, header: &[u8], router: SocketAddr, h2: bool) -> Vec<String> {
    tcp.write_all(header).await.unwrap();
    let io = TokioIo::new(tcp);
    let answer = tokio::time::timeout(REQUEST_DEADLINE, async {
        if h2 {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            send.send_request(echo_request(router)).await.unwrap()
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            send.send_request(echo_request(router)).await.unwrap()
        }
    })
    .await
    .expect("an answer in time");
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&body).unwrap();
    echoed(&json, "x-forwarded-for")
}

/// Sends `bytes` and expects the router to close the connection without writing a byte.
async fn closed_without_answer(mut tcp: TcpStream, bytes: &[u8], what: &str) {
    tcp.write_all(bytes).await.unwrap();
    let got = read_to_close(&mut tcp, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("{what}: still open"));
    assert!(got.is_empty(), "{what}: answered {:?}", String::from_utf8_lossy(&got));
}

#[tokio::test]
async fn a_trusted_balancers_header_names_the_client() {
    let fleet = Fleet::start(1, CONFIG).await;
    let router = fleet.router;
    let v1 = b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\n";
    let got = forwarded_for(connect_from("127.0.0.1", router).await, v1, router, false).await;
    assert_eq!(got, ["198.51.100.7"]);

    let mut block = Vec::new();
    block.extend_from_slice(&"2001:db8::7".parse::<std::net::Ipv6Addr>().unwrap().octets());
    block.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    block.extend_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
    // A TLV after the addresses (AWS's VPC endpoint id), skipped.
    block.extend_from_slice(&[0xea, 0x00, 0x04, b'v', b'p', b'c', b'e']);
    let header = v2(1, 0x21, &block);
    for h2 in [false, true] {
        let got = forwarded_for(connect_from("127.0.0.1", router).await, &header, router, h2).await;
        assert_eq!(got, ["2001:db8::7"], "h2: {h2}");
    }
    let ipv4 = v2(1, 0x11, &[203, 0, 113, 9, 127, 0, 0, 1, 0x9c, 0x40, 0, 80]);
    let got = forwarded_for(connect_from("127.0.0.1", router).await, &ipv4, router, true).await;
    assert_eq!(got, ["203.0.113.9"]);
    // LOCAL (the balancer's own health check): the balancer is the client.
    let local = v2(0, 0x00, &[]);
    let got = forwarded_for(connect_from("127.0.0.1", router).await, &local, router, false).await;
    assert_eq!(got, ["127.0.0.1"]);
    // A header split across segments is read whole.
    let mut tcp = connect_from("127.0.0.1", router).await;
    tcp.write_all(&v1[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let got = forwarded_for(tcp, &v1[10..], router, false).await;
    assert_eq!(got, ["198.51.100.7"]);
    fleet.shutdown().await;
}

#[tokio::test]
async fn anyone_else_and_anything_broken_is_closed_unanswered() {
    let fleet = Fleet::start(1, CONFIG).await;
    let router = fleet.router;
    let post = b"POST /echo HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    let spoofed = [&b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\n"[..], post].concat();
    closed_without_answer(
        connect_from("127.0.0.2", router).await,
        &spoofed,
        "a header from 127.0.0.2",
    )
    .await;
    let spoofed_v2 = [
        v2(1, 0x11, &[198, 51, 100, 7, 127, 0, 0, 1, 0, 1, 0, 80]),
        post.to_vec(),
    ]
    .concat();
    closed_without_answer(
        connect_from("127.0.0.2", router).await,
        &spoofed_v2,
        "a v2 header from 127.0.0.2",
    )
    .await;
    closed_without_answer(
        connect_from("127.0.0.1", router).await,
        post,
        "the balancer without a header",
    )
    .await;
    for broken in [
        &b"PROXY TCP4 198.51.100.7 127.0.0.1 40000\r\n"[..],
        b"PROXY TCP9 1.2.3.4 5.6.7.8 1 2\r\n",
        &[b"PROXY UNKNOWN ".as_slice(), &[b'x'; 120]].concat(),
        &v2(1, 0x51, &[0; 12]),
        &v2(1, 0x11, &[0; 4]),
    ] {
        let what = format!("broken {:?}", String::from_utf8_lossy(broken));
        closed_without_answer(connect_from("127.0.0.1", router).await, &[broken, post].concat(), &what).await;
    }
    assert_eq!(fleet.total_requests(), 0, "nothing closed reached a backend");
    // A direct client without a header is served, as itself.
    let got = forwarded_for(connect_from("127.0.0.2", router).await, b"", router, false).await;
    assert_eq!(got, ["127.0.0.2"]);
    fleet.shutdown().await;
}

/// Off (the default), a PROXY header is no HTTP: the router answers 400 and never reads a client
/// address from it.
#[tokio::test]
async fn off_a_header_is_just_a_bad_request() {
    let fleet = Fleet::start(1, "").await;
    let mut tcp = connect_from("127.0.0.1", fleet.router).await;
    tcp.write_all(b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\nGET / HTTP/1.1\r\nHost: r\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut tcp, Duration::from_secs(5)).await.expect("closed");
    assert!(got.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&got));
    assert_eq!(fleet.total_requests(), 0);
    fleet.shutdown().await;
}
