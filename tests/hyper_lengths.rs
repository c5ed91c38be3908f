//! The patched hyper's reading of `Content-Length` (`vendor/README.md`, change 9): a value that
//! is one number is read without the split, and every other form is read as stock hyper reads
//! it. An answer's length decides where the next answer on the connection starts, so each form
//! is checked on a real connection, by what the client gets.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(10);

/// What a hyper client makes of an answer whose head carries `lengths` (one header line each)
/// and whose body is `0123456789`: the body it read, or none if it refused the answer.
async fn answer_read_with(lengths: &[&str]) -> Option<Bytes> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let head: String = lengths.iter().map(|l| format!("content-length: {l}\r\n")).collect();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        // The request's head, then the answer.
        let mut buf = [0u8; 1024];
        let mut read = Vec::new();
        while !read.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before its request was whole");
            read.extend_from_slice(&buf[..n]);
        }
        s.write_all(format!("HTTP/1.1 200 OK\r\n{head}\r\n0123456789").as_bytes())
            .await
            .unwrap();
        // Held open until the client is done, so a length cut short cannot end at the close.
        let _ = s.read(&mut buf).await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    let driver = tokio::spawn(conn);
    let request = Request::get("/")
        .header("host", "x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let read = async {
        let answer = send.send_request(request).await.ok()?;
        answer.into_body().collect().await.ok().map(|b| b.to_bytes())
    };
    let body = tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the answer within the deadline");
    drop(send);
    driver.abort();
    server.abort();
    body
}

#[tokio::test]
async fn one_number_is_the_length() {
    assert_eq!(answer_read_with(&["4"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["10"]).await.as_deref(), Some(&b"0123456789"[..]));
    // Leading zeros are digits too (stock hyper reads them so).
    assert_eq!(answer_read_with(&["0004"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["0"]).await.as_deref(), Some(&b""[..]));
}

#[tokio::test]
async fn the_same_number_repeated_is_the_length() {
    // In one line (a list, as RFC 9110 allows), in two lines, and both at once.
    assert_eq!(answer_read_with(&["4, 4"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["4,4"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["4", "4"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["4", "4, 4"]).await.as_deref(), Some(&b"0123"[..]));
    assert_eq!(answer_read_with(&["4, 4", "4"]).await.as_deref(), Some(&b"0123"[..]));
}

#[tokio::test]
async fn lengths_that_disagree_or_are_not_numbers_are_refused() {
    for lengths in [
        &["4", "5"][..],
        &["4, 5"],
        &["4", "4, 5"],
        &["5, 4", "4"],
        &["+4"],
        &["-4"],
        &["4x"],
        &["x"],
        &["4,"],
        &[","],
        // Past u64: refused, never wrapped.
        &["18446744073709551616"],
        &["4", "18446744073709551620"],
    ] {
        assert_eq!(answer_read_with(lengths).await, None, "content-length {lengths:?}");
    }
}
