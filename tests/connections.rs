//! New proxy connections: the protocol is told from the first bytes (HTTP/1 or h2c, with a
//! fallback when a first segment is too short to tell), and a connection that sends nothing,
//! or only part of a head, is closed after `header_read_timeout`.

mod support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

fn raw_post(fleet: &Fleet) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{PING}",
        fleet.router,
        PING.len()
    )
}

/// Reads until the peer closes (or `limit` passes) and returns what came.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn requests_are_served_whatever_their_first_segment_holds() {
    let fleet = Fleet::start(1, "").await;
    // Whole, then split after "P" (which also begins the HTTP/2 preface, so the router cannot
    // tell from the first segment alone), then after "PO".
    for split in [None, Some(1), Some(2)] {
        let request = raw_post(&fleet);
        let mut s = TcpStream::connect(fleet.router).await.unwrap();
        s.set_nodelay(true).unwrap();
        match split {
            None => s.write_all(request.as_bytes()).await.unwrap(),
            Some(at) => {
                s.write_all(&request.as_bytes()[..at]).await.unwrap();
                // Not a synchronisation: the answer is checked either way; the pause only makes
                // it likely that the router sees the short segment on its own.
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.write_all(&request.as_bytes()[at..]).await.unwrap();
            }
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("\"result\"") {
            let n = tokio::time::timeout(REQUEST_DEADLINE, s.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "split {split:?}: {text}");
    }
}

#[tokio::test]
async fn silent_and_stalled_connections_are_closed_after_the_header_read_timeout() {
    let fleet = Fleet::start(1, "[server]\nheader_read_timeout = \"400ms\"").await;

    let started = Instant::now();
    let mut silent = TcpStream::connect(fleet.router).await.unwrap();
    let got = read_to_close(&mut silent, Duration::from_secs(10))
        .await
        .expect("a silent connection is closed");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "closed too early: {:?}",
        started.elapsed()
    );

    // Part of a head, then nothing.
    let mut stalled = TcpStream::connect(fleet.router).await.unwrap();
    stalled.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    read_to_close(&mut stalled, Duration::from_secs(10))
        .await
        .expect("a stalled head is closed");
    let reached = fleet.total_requests();
    assert_eq!(reached, 0, "neither reached a backend");
}
