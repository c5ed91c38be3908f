//! The patched h2's request heads (vendor/patches/h2/0004): a request is filled in place from its
//! pseudo-header fields instead of through `Request::builder()`, and must come out as the
//! builder made it: the same method, URI, version, `:protocol` extension and fields for every
//! head h2 accepts, and `RST_STREAM PROTOCOL_ERROR` for every head it refuses (RFC 9113
//! §8.3), each on its own stream of one connection. Sent raw (h2's own client would refuse to
//! send most of them) to h2's server on a real socket. Passes on stock h2 too
//! (`scripts/test-stock.sh`), which is what says the patch changes nothing a client sees.
//! The server push test does the same for the other frame h2 change 3 boxes, PUSH_PROMISE.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::eventually;
use crate::support::h2_frames::*;
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(20);
const PROTOCOL_ERROR: u32 = 0x1;

/// What the server made of a request it accepted.
#[derive(Debug, PartialEq)]
struct Made {
    method: String,
    uri: String,
    version: http::Version,
    protocol: Option<String>,
    fields: Vec<(String, String)>,
}

/// A request head, and what h2 must make of it: `None` for a refusal.
type Case = (&'static [(&'static str, &'static str)], Option<Made>);

fn made(method: &str, uri: &str, protocol: Option<&str>, fields: &[(&str, &str)]) -> Option<Made> {
    Some(Made {
        method: method.into(),
        uri: uri.into(),
        version: http::Version::HTTP_2,
        protocol: protocol.map(Into::into),
        fields: fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
    })
}

fn cases() -> Vec<Case> {
    vec![
        (
            &[
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "a.test:8080"),
                (":path", "/mcp?x=1"),
                ("x-call", "7"),
            ],
            made("POST", "http://a.test:8080/mcp?x=1", None, &[("x-call", "7")]),
        ),
        // No :authority: the scheme is checked, then left out (a URI cannot hold it alone).
        (
            &[(":method", "GET"), (":scheme", "https"), (":path", "/p")],
            made("GET", "/p", None, &[]),
        ),
        (
            &[(":method", "PURGE"), (":scheme", "http"), (":path", "*")],
            made("PURGE", "*", None, &[]),
        ),
        (
            &[(":method", "CONNECT"), (":authority", "a.test:443")],
            made("CONNECT", "a.test:443", None, &[]),
        ),
        (
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":authority", "a.test"),
                (":path", "/chat"),
            ],
            made("CONNECT", "https://a.test/chat", Some("websocket"), &[]),
        ),
        // Refused.
        (&[(":scheme", "http"), (":path", "/")], None), // no :method
        (
            &[
                (":method", "GET"),
                (":protocol", "websocket"),
                (":scheme", "http"),
                (":path", "/"),
            ],
            None,
        ),
        (
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":status", "200"),
            ],
            None,
        ),
        (
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":authority", "a b"),
                (":path", "/"),
            ],
            None,
        ),
        (&[(":method", "GET"), (":authority", "a.test"), (":path", "/")], None), // no :scheme
        (&[(":method", "GET"), (":scheme", "http"), (":path", "")], None),
        (&[(":method", "GET"), (":scheme", "http"), (":path", "/a b")], None),
        (
            &[
                (":method", "CONNECT"),
                (":scheme", "https"),
                (":authority", "a.test:443"),
            ],
            None,
        ),
        (
            &[(":method", "CONNECT"), (":authority", "a.test:443"), (":path", "/")],
            None,
        ),
        (
            &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":authority", "a.test"),
            ],
            None,
        ),
        // Passes every check of the pseudo-fields, but makes no URI: a scheme and an authority
        // with no path.
        (
            &[(":method", "GET"), (":scheme", "http"), (":authority", "a.test")],
            None,
        ),
    ]
}

/// h2's server on `listener`'s first connection, extended CONNECT on: each request it accepts is
/// sent to `made` (by stream id) and answered 200.
async fn serve(listener: TcpListener, made: mpsc::UnboundedSender<(u32, Made)>) {
    let (socket, _) = listener.accept().await.unwrap();
    let mut conn = h2::server::Builder::new()
        .enable_connect_protocol()
        .handshake::<_, Bytes>(socket)
        .await
        .unwrap();
    while let Some(accepted) = conn.accept().await {
        let Ok((req, mut respond)) = accepted else { return };
        let id = u32::from(respond.stream_id());
        let _ = made.send((
            id,
            Made {
                method: req.method().to_string(),
                uri: req.uri().to_string(),
                version: req.version(),
                protocol: req
                    .extensions()
                    .get::<h2::ext::Protocol>()
                    .map(|p| p.as_str().to_string()),
                fields: req
                    .headers()
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                    .collect(),
            },
        ));
        respond.send_response(http::Response::new(()), true).unwrap();
    }
}

#[tokio::test]
async fn request_heads_come_out_as_the_builder_made_them_and_bad_ones_are_reset() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (made_tx, mut made_rx) = mpsc::unbounded_channel();
    let server = tokio::spawn(serve(listener, made_tx));

    let (read, mut write) = TcpStream::connect(addr).await.unwrap().into_split();
    let cases = cases();
    let mut burst = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    burst.extend(frame(SETTINGS, 0, 0, &[]));
    for (i, (head, _)) in cases.iter().enumerate() {
        burst.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream_of(i), &hpack(head)));
    }
    write.write_all(&burst).await.unwrap();
    let write = Arc::new(tokio::sync::Mutex::new(write));
    let seen = Arc::new(parking_lot::Mutex::new(Seen::default()));
    let reader = tokio::spawn(read_frames(read, write.clone(), seen.clone()));

    eventually(DEADLINE, "every stream answered or reset", || {
        let s = seen.lock();
        s.answered.len() + s.reset.len() >= cases.len()
    })
    .await;

    let mut accepted = BTreeMap::new();
    while let Ok((id, m)) = made_rx.try_recv() {
        accepted.insert(id, m);
    }
    let seen = seen.lock();
    assert_eq!(seen.goaway, None, "stream errors only: the connection stays open");
    for (i, (head, expected)) in cases.into_iter().enumerate() {
        let id = stream_of(i);
        match expected {
            Some(expected) => {
                assert_eq!(accepted.get(&id), Some(&expected), "{head:?}");
                assert!(seen.answered.contains(&id), "{head:?} answered");
            }
            None => {
                assert_eq!(accepted.get(&id), None, "{head:?} must be refused");
                assert_eq!(seen.reset.get(&id), Some(&PROTOCOL_ERROR), "{head:?}");
            }
        }
    }
    reader.abort();
    server.abort();
}

/// The client stream of the `i`th case: odd, in order.
fn stream_of(i: usize) -> u32 {
    1 + 2 * i as u32
}

/// A server push carries the other frame the patch boxes (h2 change 3): the PUSH_PROMISE goes
/// through the server's send queue and the client's receive path. The pushed request's head,
/// its answer and the answer to the request that drew it arrive as sent.
#[tokio::test]
async fn a_pushed_request_arrives_with_its_head_and_its_answer() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(socket).await.unwrap();
        let (_, mut respond) = conn.accept().await.unwrap().unwrap();
        let promised = http::Request::get("http://a.test/style.css")
            .header("x-pushed", "1")
            .body(())
            .unwrap();
        let mut pushed = respond.push_request(promised).unwrap();
        let answer = http::Response::builder().status(203).body(()).unwrap();
        pushed.send_response(answer, true).unwrap();
        respond.send_response(http::Response::new(()), true).unwrap();
        // Serves the connection until the client is done with it.
        while conn.accept().await.is_some() {}
    });

    let run = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::Builder::new()
            .enable_push(true)
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::get("http://a.test/").body(()).unwrap();
        let (mut answer, _) = client.send_request(request, true).unwrap();
        let mut pushes = answer.push_promises();
        assert_eq!(answer.await.unwrap().status(), 200);
        let push = pushes.push_promise().await.expect("one push").unwrap();
        let (head, pushed_answer) = push.into_parts();
        assert_eq!(
            (head.method(), head.uri().to_string()),
            (&http::Method::GET, "http://a.test/style.css".to_string())
        );
        assert_eq!(head.headers()["x-pushed"], "1");
        assert_eq!(pushed_answer.await.unwrap().status(), 203);
        assert!(pushes.push_promise().await.is_none(), "one push only");
    };
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("the push within the deadline");
    server.abort();
}
