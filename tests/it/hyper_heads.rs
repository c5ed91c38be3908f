//! The patched hyper's reading of heads (patches 0008 to 0012 in vendor/patches/hyper/), each
//! checked on real connections by what a server or a client reads; each passes on stock hyper
//! too (scripts/test-stock.sh), which is the point: the patches change nothing a peer sees.
//! - a `Content-Length` that is one number is read without the list split (0008), and every
//!   other form as stock hyper reads it (an answer's length decides where the next one starts);
//! - header names come from a per-thread cache keyed by their bytes (0009): whatever the cache
//!   holds, every name reads lowercased, with its own value;
//! - only a server looks for `TE: trailers` (0010): a server still sends trailers to a client
//!   that asked for them, and only to one, and a client still reads them;
//! - HTTP/2 looks for connection-specific fields in one pass before taking them out (0011): an
//!   answer or a request that has some still loses exactly those (h2 would refuse to send it
//!   otherwise), one that has none keeps every field;
//! - a `Connection` value of one token is compared as it is (0012): a client and a server still
//!   keep or close the connection as `close` and `keep-alive` say, in any case, alone or in a
//!   list, and a token that only starts like one says nothing;
//! - the server's `Date` is checked against the wall clock: it is the wall clock's second, and
//!   it turns with it (a patch that read the coarse clock for it was dropped: vendor/README.md).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Bounds every wait here, so a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(20);

/// A hyper HTTP/1 client connection, with the task that drives it (stopped when dropped).
struct Client {
    send: SendRequest<Empty<Bytes>>,
    driver: JoinHandle<hyper::Result<()>>,
}

impl Client {
    async fn to(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        Client {
            send,
            driver: tokio::spawn(conn),
        }
    }

    /// Sends `GET /`; the answer's head, or the error hyper refused it with.
    async fn get(&mut self) -> hyper::Result<Response<Incoming>> {
        let request = Request::get("/").header("host", "x").body(Empty::new()).unwrap();
        self.send.send_request(request).await
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Runs `run` to its end within [`DEADLINE`], then stops the `server` task beside it.
async fn within<T>(server: JoinHandle<()>, run: impl Future<Output = T>) -> T {
    let out = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("done within the deadline");
    server.abort();
    out
}

/// A hyper HTTP/1 server answering one connection with `answer`: its address, its task.
async fn hyper_server<F, B>(answer: fn(Request<Incoming>) -> F) -> (SocketAddr, JoinHandle<()>)
where
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: http_body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), service_fn(answer))
            .await
            .unwrap();
    });
    (addr, task)
}

/// A server that answers one connection's requests, in turn, with `answers` (raw HTTP/1.1),
/// then holds it open until the client is done (so an answer cut short cannot end at the
/// close): its address, its task.
async fn raw_server(answers: Vec<String>) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        for answer in answers {
            read_message(&mut s, &mut buf).await;
            s.write_all(answer.as_bytes()).await.unwrap();
        }
        let _ = s.read(&mut [0u8; 64]).await;
    });
    (addr, task)
}

/// Reads one HTTP/1.1 message with a `content-length` off `s` (into `buf`, which may hold the
/// next one's first bytes afterwards) and returns its body.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    next_message(s, buf).await.expect("the connection closed mid-message")
}

/// [`read_message`], or `None` if the peer closed the connection before a message began.
async fn next_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
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
                return Some(body);
            }
        }
        let n = s.read(&mut chunk).await.unwrap();
        if n == 0 {
            assert!(buf.is_empty(), "the connection closed mid-message");
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

// ---- Content-Length (patch 0009) ----------------------------------------------------------------

/// What a hyper client makes of an answer whose head carries `lengths` (one header line each)
/// and whose body is `0123456789`: the body it read, or none if it refused the answer.
async fn answer_read_with(lengths: &[&str]) -> Option<Bytes> {
    let head: String = lengths.iter().map(|l| format!("content-length: {l}\r\n")).collect();
    let (addr, server) = raw_server(vec![format!("HTTP/1.1 200 OK\r\n{head}\r\n0123456789")]).await;
    let mut client = Client::to(addr).await;
    let read = async {
        let answer = client.get().await.ok()?;
        answer.into_body().collect().await.ok().map(|b| b.to_bytes())
    };
    within(server, read).await
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

// ---- Header names (patch 0010) ------------------------------------------------------------------

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

#[tokio::test]
async fn a_server_reads_every_name_as_sent_whatever_it_read_before() {
    // The server answers with the names and values it read, one per line.
    let (addr, server) = hyper_server(|req| async move {
        let text: String = read(req.headers()).iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        Ok(Response::new(Full::new(Bytes::from(text))))
    })
    .await;
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
    within(server, run).await;
}

#[tokio::test]
async fn a_client_reads_every_name_as_sent_whatever_it_read_before() {
    // The server answers request `n` with head `n`'s lines.
    let answers = (0..HEADS).map(|n| format!("HTTP/1.1 200 OK\r\n{}Content-Length: 0\r\n\r\n", head_text(n)));
    let (addr, server) = raw_server(answers.collect()).await;
    let run = async {
        let mut client = Client::to(addr).await;
        for n in 0..HEADS {
            let answer = client.get().await.unwrap();
            assert_eq!(read(answer.headers()), expected(n), "answer {n}");
            answer.into_body().collect().await.unwrap();
        }
    };
    within(server, run).await;
}

// ---- TE: trailers (patch 0011) ------------------------------------------------------------------

/// What a hyper server writes for a chunked answer with a trailer field, to a request with
/// these extra header lines: the raw answer, up to the end of its last chunk's trailers.
async fn chunked_answer_to(extra: &str) -> String {
    let (addr, server) = hyper_server(|_req| async move {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-done", "yes".parse().unwrap());
        // A body of unknown length, so the answer is chunked and can carry trailers.
        let frames = [
            Ok(Frame::data(Bytes::from_static(b"part"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        // hyper sends only the trailer fields the head declares.
        Ok(Response::builder().header("trailer", "x-done").body(body).unwrap())
    })
    .await;
    let run = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n").as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        // The last chunk is `0`, then its trailer lines, then an empty line.
        while !got.windows(5).any(|w| w == b"\r\n0\r\n") || !got.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the server closed mid-answer: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8(got).unwrap()
    };
    within(server, run).await
}

#[tokio::test]
async fn a_server_sends_trailers_only_to_a_client_that_asked_for_them() {
    let asked = chunked_answer_to("TE: trailers\r\n").await;
    assert!(
        asked.to_ascii_lowercase().ends_with("\r\n0\r\nx-done: yes\r\n\r\n"),
        "{asked}"
    );
    let asked_in_a_list = chunked_answer_to("TE: gzip, Trailers\r\n").await;
    assert!(
        asked_in_a_list.to_ascii_lowercase().contains("\r\nx-done: yes\r\n"),
        "{asked_in_a_list}"
    );
    let not_asked = chunked_answer_to("").await;
    assert!(not_asked.ends_with("\r\n0\r\n\r\n"), "{not_asked}");
    assert!(!not_asked.to_ascii_lowercase().contains("x-done: yes"), "{not_asked}");
}

#[tokio::test]
async fn a_client_reads_an_answers_trailers() {
    let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\npart\r\n0\r\nX-Done: yes\r\n\r\n";
    let (addr, server) = raw_server(vec![chunked.to_owned()]).await;
    let run = async {
        let mut client = Client::to(addr).await;
        let answer = client.get().await.unwrap();
        let collected = answer.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("the answer's trailers");
        assert_eq!(collected.to_bytes(), "part");
        assert_eq!(trailers.get("x-done").map(|v| v.to_str().unwrap()), Some("yes"));
    };
    within(server, run).await;
}

/// Connection-specific fields, each of which hyper's HTTP/2 side takes out of a message (h2
/// refuses to send a message that still has one): `x-hop` because `Connection` names it.
const CONNECTION_SPECIFIC: [(&str, &str); 7] = [
    ("connection", "keep-alive, x-hop"),
    ("x-hop", "1"),
    ("keep-alive", "timeout=5"),
    ("proxy-connection", "keep-alive"),
    ("transfer-encoding", "chunked"),
    ("upgrade", "h2c"),
    ("te", "gzip"),
];

/// The names in `headers`, sorted, less the ones every answer gets (`date`, `content-length`).
fn names(headers: &HeaderMap) -> Vec<String> {
    let mut names: Vec<String> = headers
        .keys()
        .map(|n| n.as_str().to_owned())
        .filter(|n| n != "date" && n != "content-length")
        .collect();
    names.sort();
    names
}

/// An HTTP/2 server (prior knowledge) answering `answer`, and a client connected to it.
async fn h2_pair<F>(
    answer: fn(Request<Incoming>) -> F,
) -> (hyper::client::conn::http2::SendRequest<Empty<Bytes>>, JoinHandle<()>)
where
    F: Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(s), service_fn(answer))
            .await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    (send, server)
}

/// An HTTP/2 request for `path` carrying `headers`.
fn h2_request(path: &str, headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut request = Request::get(format!("http://x{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Empty::new()).unwrap()
}

/// The ways a message can carry connection-specific fields: each alone (`x-hop` with the
/// `Connection` that names it), all of them, and none.
fn hop_cases() -> Vec<Vec<(&'static str, &'static str)>> {
    let mut cases: Vec<Vec<_>> = CONNECTION_SPECIFIC
        .iter()
        .filter(|(name, _)| *name != "x-hop")
        .map(|field| vec![*field])
        .collect();
    cases.push(vec![("connection", "x-hop"), ("x-hop", "1")]);
    cases.push(CONNECTION_SPECIFIC.to_vec());
    cases.push(vec![]);
    cases
}

#[tokio::test]
async fn an_h2_server_takes_connection_specific_fields_out_of_an_answer_and_only_those() {
    // The answer to `/N` carries the fields of `hop_cases()[N]`.
    let (mut client, server) = h2_pair(|req| async move {
        let case: usize = req.uri().path()[1..].parse().unwrap();
        let mut answer = Response::builder()
            .header("x-kept", "yes")
            .header("content-type", "text/plain");
        for (name, value) in &hop_cases()[case] {
            answer = answer.header(*name, *value);
        }
        Ok(answer.body(Full::new(Bytes::from_static(b"ok"))).unwrap())
    })
    .await;
    let run = async {
        for case in 0..hop_cases().len() {
            let path = format!("/{case}");
            let answer = client.send_request(h2_request(&path, &[])).await.unwrap();
            assert_eq!(answer.status(), 200, "{:?}", hop_cases()[case]);
            assert_eq!(
                names(answer.headers()),
                ["content-type", "x-kept"],
                "{:?}",
                hop_cases()[case]
            );
            assert_eq!(answer.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
    };
    within(server, run).await;
}

#[tokio::test]
async fn an_h2_client_takes_connection_specific_fields_out_of_a_request_and_only_those() {
    // The server answers with the names of the fields it received.
    let (mut client, server) = h2_pair(|req| async move {
        let body = names(req.headers()).join(",");
        Ok(Response::new(Full::new(Bytes::from(body))))
    })
    .await;
    let run = async {
        for mut headers in hop_cases() {
            headers.push(("x-kept", "yes"));
            let answer = client.send_request(h2_request("/", &headers)).await.unwrap();
            let got = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got, "x-kept", "{headers:?}");
        }
        // `TE: trailers` is the one TE an HTTP/2 request may carry; nothing at all stays nothing.
        let cases: [(&[(&str, &str)], &str); 2] = [(&[("te", "trailers"), ("accept", "*/*")], "accept,te"), (&[], "")];
        for (headers, want) in cases {
            let answer = client.send_request(h2_request("/", headers)).await.unwrap();
            let got = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got, want, "{headers:?}");
        }
    };
    within(server, run).await;
}

// ---- Connection tokens (patch 0013) -------------------------------------------------------------

/// Whether a hyper client sends a second request on the connection after an answer that
/// starts with `status_line` and carries `connection` lines: the server answers whatever comes
/// on that connection, and the second request fails if hyper closed it after the first answer.
async fn client_reuses_after(status_line: &str, connection: &[&str]) -> bool {
    let lines: String = connection.iter().map(|v| format!("connection: {v}\r\n")).collect();
    let first = format!("{status_line}\r\n{lines}content-length: 2\r\n\r\nok");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut answer = first;
        while next_message(&mut s, &mut buf).await.is_some() {
            s.write_all(answer.as_bytes()).await.unwrap();
            answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_owned();
        }
    });
    let run = async {
        let mut client = Client::to(addr).await;
        let first = client.get().await.unwrap();
        assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "ok");
        match client.get().await {
            Ok(second) => second.into_body().collect().await.is_ok(),
            Err(_) => false,
        }
    };
    within(server, run).await
}

#[tokio::test]
async fn a_client_keeps_or_closes_its_connection_as_the_answers_connection_tokens_say() {
    let cases: [(&str, &[&str], bool); 11] = [
        ("HTTP/1.1 200 OK", &[], true),
        ("HTTP/1.1 200 OK", &["keep-alive"], true),
        ("HTTP/1.1 200 OK", &["close"], false),
        ("HTTP/1.1 200 OK", &["Close"], false),
        ("HTTP/1.1 200 OK", &["closed"], true),
        ("HTTP/1.1 200 OK", &["keep-alive, close"], false),
        ("HTTP/1.1 200 OK", &["keep-alive", "close"], false),
        ("HTTP/1.0 200 OK", &[], false),
        ("HTTP/1.0 200 OK", &["keep-alive"], true),
        ("HTTP/1.0 200 OK", &["Keep-Alive"], true),
        ("HTTP/1.0 200 OK", &["keep-alives"], false),
    ];
    for (status_line, connection, reused) in cases {
        assert_eq!(
            client_reuses_after(status_line, connection).await,
            reused,
            "{status_line} {connection:?}"
        );
    }
}

/// How many of two requests, sent at once with `request_line` and `connection` lines, a hyper
/// server answers before it closes the connection (it answers both when it keeps it open).
async fn server_answers_of_two(request_line: &str, connection: &[&str]) -> usize {
    let (addr, server) = hyper_server(|_req| async { Ok(Response::new(Full::new(Bytes::from_static(b"ok")))) }).await;
    let lines: String = connection.iter().map(|v| format!("connection: {v}\r\n")).collect();
    let request = format!("{request_line}\r\nhost: x\r\n{lines}\r\n");
    let run = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("{request}{request}").as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut answers = 0;
        while answers < 2 && next_message(&mut s, &mut buf).await.is_some() {
            answers += 1;
        }
        answers
    };
    within(server, run).await
}

#[tokio::test]
async fn a_server_keeps_or_closes_its_connection_as_the_requests_connection_tokens_say() {
    let cases: [(&str, &[&str], usize); 9] = [
        ("GET / HTTP/1.1", &[], 2),
        ("GET / HTTP/1.1", &["keep-alive"], 2),
        ("GET / HTTP/1.1", &["close"], 1),
        ("GET / HTTP/1.1", &["CLOSE"], 1),
        ("GET / HTTP/1.1", &["closed"], 2),
        ("GET / HTTP/1.1", &["te, close"], 1),
        ("GET / HTTP/1.0", &[], 1),
        ("GET / HTTP/1.0", &["keep-alive"], 2),
        ("GET / HTTP/1.0", &["Keep-Alive"], 2),
    ];
    for (request_line, connection, answers) in cases {
        assert_eq!(
            server_answers_of_two(request_line, connection).await,
            answers,
            "{request_line} {connection:?}"
        );
    }
}

/// The `Date` second of a server's answer on `client`'s connection, checked against the wall
/// clock read before asking and after the answer: not ahead of it, and behind it by less than
/// the second the date leaves out plus the coarse clock's few milliseconds.
async fn date_of(client: &mut Client) -> std::time::SystemTime {
    let before = std::time::SystemTime::now();
    let answer = client.get().await.expect("an answer");
    let after = std::time::SystemTime::now();
    let date = answer.headers().get(http::header::DATE).expect("a Date header");
    let date = httpdate::parse_http_date(date.to_str().unwrap()).expect("an HTTP date");
    assert!(date <= after, "Date {date:?} ahead of the clock ({after:?})");
    let behind = before.duration_since(date).unwrap_or_default();
    assert!(behind < Duration::from_millis(1100), "Date {behind:?} behind the clock");
    date
}

#[tokio::test]
async fn the_date_is_the_wall_clocks_second_and_turns_with_it() {
    let (addr, server) = hyper_server(|_| async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }).await;
    let mut client = Client::to(addr).await;
    let run = async {
        let started = std::time::Instant::now();
        let first = date_of(&mut client).await;
        // Within three seconds of asking again, the second has turned, to one that is again
        // the clock's.
        let turned = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let date = date_of(&mut client).await;
            if date != first {
                break date;
            }
            assert!(started.elapsed() < Duration::from_secs(3), "Date stuck at {first:?}");
        };
        assert!(turned > first);
    };
    within(server, run).await;
}
