//! The patched hyper's client request queue (`vendor/README.md`, change 4) keeps tokio's
//! contract where a connection fails: a request still queued when its connection ends comes
//! back to its sender unsent, and the connection's task ends then, not when the last
//! `SendRequest` is dropped.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(10);

/// A request queued on a connection that fails before writing it (its server sent bytes
/// nobody asked for, which hyper's client takes for a broken connection): the request is
/// handed back unsent (`TrySendError::take_message`), and the connection ends while its
/// `SendRequest` is still held.
#[tokio::test]
async fn a_request_queued_on_a_connection_that_fails_comes_back_and_the_connection_ends() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut server_side, _) = listener.accept().await.unwrap();
    server_side
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    // The unasked-for answer is there before the connection is first polled.
    tokio::time::timeout(DEADLINE, tcp.readable())
        .await
        .expect("readable")
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    let req = Request::post("/mcp")
        .header("host", addr.to_string())
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    // Queued before the connection is first polled.
    let answer = send.try_send_request(req);
    let conn = tokio::spawn(conn);
    let mut err = tokio::time::timeout(DEADLINE, answer)
        .await
        .expect("the queued request is answered")
        .expect_err("the connection failed");
    let back = err.take_message().expect("the request comes back unsent");
    assert_eq!(back.uri(), "/mcp");
    let ended = tokio::time::timeout(DEADLINE, conn)
        .await
        .expect("the connection ends while its SendRequest is held");
    assert!(ended.is_ok(), "the connection's task did not panic");
    assert!(send.is_closed(), "the sender sees the connection closed");
    drop(server_side);
}
