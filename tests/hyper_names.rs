//! The patched hyper's header names (`vendor/README.md`, change 10): a name is made once per
//! thread from the bytes it came in and cloned when the same bytes come again. Whatever the
//! cache holds, every head must read as stock hyper reads it: each name lowercased, with its
//! own value. Checked on real connections, both ways (a server reading requests, a client
//! reading answers), with the cases the cache could get wrong: one name in several spellings,
//! names that share a slot (same length, first and last byte) taking turns, more names than
//! it has slots, names too long for it.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(20);

/// Heads sent on one connection, one after another.
const HEADS: usize = 300;

/// The header lines of head `n`, as sent (any case) and as they must read (lowercased).
fn lines(n: usize) -> Vec<(String, String)> {
    let spelled = |name: &str, n: usize| -> String {
        match n % 3 {
            0 => name.to_owned(),
            1 => name.to_ascii_lowercase(),
            _ => name.to_ascii_uppercase(),
        }
    };
    let letter = (b'a' + (n % 26) as u8) as char;
    let names = [
        // A standard name and an MCP one, spelled three ways.
        spelled("Accept", n),
        spelled("Mcp-Routing-Id", n + 1),
        // Same length, first and last byte: one slot, a different name each head.
        format!("x-{letter}{letter}-z"),
        format!("X-{letter}{letter}-Z"),
        // A new name each head: more than the cache's slots, many times over.
        format!("x-head-{n}"),
        // Longer than the cache keeps.
        format!("x-{}-{n}", "long".repeat(10)),
        spelled("Content-Type", n + 2),
    ];
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, format!("v{n}-{i}")))
        .collect()
}

/// Head `n`'s names and values as they must read, sorted.
fn expected(n: usize) -> Vec<(String, String)> {
    let mut want: Vec<_> = lines(n).into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    // `x-aa-z` and `X-AA-Z` are one name: it reads as one name with both values.
    want.sort();
    want
}

/// A head's names and values as read, sorted.
fn read(headers: &http::HeaderMap) -> Vec<(String, String)> {
    let mut got: Vec<_> = headers
        .iter()
        .filter(|(k, _)| *k != "host" && *k != "content-length")
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
        .collect();
    got.sort();
    got
}

fn head_text(n: usize) -> String {
    lines(n).iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect()
}

/// Reads one HTTP/1.1 message with a `content-length` off `s` (into `buf`, which may hold the
/// next one's first bytes afterwards) and returns its body.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |l| l.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                return body;
            }
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-message");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn a_server_reads_every_name_as_sent_whatever_it_read_before() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The server answers with the names and values it read, one per line.
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let service = service_fn(|req: Request<Incoming>| async move {
            let text: String = read(req.headers()).iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(text))))
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), service)
            .await
            .unwrap();
    });
    let run = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        for n in 0..HEADS {
            let request = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", head_text(n));
            s.write_all(request.as_bytes()).await.unwrap();
            let body = read_message(&mut s, &mut buf).await;
            let want: String = expected(n).iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            assert_eq!(String::from_utf8(body).unwrap(), want, "request {n}");
        }
    };
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("every answer within the deadline");
    server.abort();
}

#[tokio::test]
async fn a_client_reads_every_name_as_sent_whatever_it_read_before() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The server answers request `n` with head `n`'s lines.
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        for n in 0..HEADS {
            read_message(&mut s, &mut buf).await;
            let answer = format!("HTTP/1.1 200 OK\r\n{}Content-Length: 0\r\n\r\n", head_text(n));
            s.write_all(answer.as_bytes()).await.unwrap();
        }
    });
    let run = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        let driver = tokio::spawn(conn);
        for n in 0..HEADS {
            let request = Request::get("/")
                .header("host", "x")
                .body(Empty::<Bytes>::new())
                .unwrap();
            let answer = send.send_request(request).await.unwrap();
            assert_eq!(read(answer.headers()), expected(n), "answer {n}");
            answer.into_body().collect().await.unwrap();
        }
        driver.abort();
    };
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("every answer within the deadline");
    server.abort();
}
