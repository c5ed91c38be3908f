//! The patched h2's check of connection-specific fields (vendor/patches/h2/0001): it
//! looks for them in one pass before its lookups, and must still refuse to send any message
//! that carries one (RFC 9113 §8.2.2), a request or an answer, whichever field it is, while
//! sending every other message as it is. Driven with h2 itself on a real connection, under
//! hyper, which takes those fields out before h2 sees them.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(20);

/// The ways a message can carry connection-specific fields: each alone, all of them, and the
/// one `TE` a request may carry (`trailers`, allowed).
fn cases() -> Vec<(Vec<(&'static str, &'static str)>, bool)> {
    let fields = [
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("te", "gzip"),
    ];
    let mut cases: Vec<_> = fields.iter().map(|f| (vec![*f, ("x-kept", "yes")], false)).collect();
    cases.push((fields.to_vec(), false));
    cases.push((vec![("x-kept", "yes"), ("content-type", "text/plain")], true));
    cases.push((vec![], true));
    cases
}

/// An h2 client and server on one TCP connection: the client's handle, and the server's
/// connection (accepting streams) for the test to drive.
async fn pair() -> (h2::client::SendRequest<Bytes>, h2::server::Connection<TcpStream, Bytes>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        client
    };
    let server = async {
        let (tcp, _) = listener.accept().await.unwrap();
        h2::server::handshake(tcp).await.unwrap()
    };
    tokio::join!(client, server)
}

#[tokio::test]
async fn a_request_with_a_connection_specific_field_is_refused_and_any_other_is_sent() {
    let (client, mut server) = pair().await;
    // The server answers every request it gets with 200 and passes its fields on.
    let (got_tx, mut got) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok((request, mut respond))) = server.accept().await {
            let names: Vec<String> = request.headers().keys().map(|n| n.to_string()).collect();
            got_tx.send(names).unwrap();
            respond.send_response(Response::new(()), true).unwrap();
        }
    });
    let run = async {
        let mut client = client.ready().await.unwrap();
        for (fields, allowed) in cases() {
            let mut request = Request::get("http://x/");
            for (name, value) in &fields {
                request = request.header(*name, *value);
            }
            let sent = client.send_request(request.body(()).unwrap(), true);
            match sent {
                Err(e) => {
                    assert!(!allowed, "{fields:?} refused: {e}");
                    assert!(e.to_string().contains("malformed headers"), "{fields:?}: {e}");
                }
                Ok((answer, _)) => {
                    assert!(allowed, "{fields:?} sent");
                    assert_eq!(answer.await.unwrap().status(), 200);
                    let mut names = got.recv().await.unwrap();
                    names.sort();
                    let mut want: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
                    want.sort();
                    assert_eq!(names, want);
                }
            }
            client = client.ready().await.unwrap();
        }
        // `TE: trailers` is the one TE an HTTP/2 request may carry.
        let request = Request::get("http://x/").header("te", "trailers").body(()).unwrap();
        let (answer, _) = client.send_request(request, true).expect("TE: trailers is sent");
        assert_eq!(answer.await.unwrap().status(), 200);
    };
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("done within the deadline");
}

#[tokio::test]
async fn an_answer_with_a_connection_specific_field_is_refused_and_any_other_is_sent() {
    let (mut client, mut server) = pair().await;
    // The answer to `/N` tries the fields of `cases()[N]` first; a refused one is followed by a
    // plain 204, so that the client's wait ends either way. What the server's sends returned
    // comes back on the channel.
    let (sent_tx, mut sent) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok((request, mut respond))) = server.accept().await {
            let case: usize = request.uri().path()[1..].parse().unwrap();
            let mut answer = Response::builder();
            for (name, value) in &cases()[case].0 {
                answer = answer.header(*name, *value);
            }
            let tried = respond.send_response(answer.body(()).unwrap(), true);
            if tried.is_err() {
                respond
                    .send_response(Response::builder().status(204).body(()).unwrap(), true)
                    .unwrap();
            }
            sent_tx.send(tried.map(|_| ()).map_err(|e| e.to_string())).unwrap();
        }
    });
    let run = async {
        for (case, (fields, allowed)) in cases().into_iter().enumerate() {
            client = client.ready().await.unwrap();
            let request = Request::get(format!("http://x/{case}")).body(()).unwrap();
            let (answer, _) = client.send_request(request, true).unwrap();
            let answer = answer.await.unwrap();
            match sent.recv().await.unwrap() {
                Ok(()) => {
                    assert!(allowed, "{fields:?} sent");
                    assert_eq!(answer.status(), 200);
                    for (name, value) in &fields {
                        assert_eq!(answer.headers()[*name], *value, "{fields:?}");
                    }
                }
                Err(e) => {
                    assert!(!allowed, "{fields:?} refused: {e}");
                    assert!(e.contains("malformed headers"), "{fields:?}: {e}");
                    assert_eq!(answer.status(), 204);
                }
            }
        }
    };
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("done within the deadline");
}
