//! The connection watchdog: the header read timeout (`server.header_read_timeout`), kept per
//! connection rather than per request (the 408 an HTTP/1 client gets when its request head is
//! too slow, and the close of a connection, HTTP/1 keep-alive or h2c with no stream, that waits
//! that long for a request), and the watch for an HTTP/1 client that leaves while its request
//! is in flight.
//!
//! hyper's own HTTP/1 `header_read_timeout` arms a fresh timer for every request head: a boxed
//! `Sleep`, a clock read, an insert into and removal from the timer wheel, and an extra read
//! poll after each answer. Replacing it took a proxied request from 48.4k to 46.2k
//! instructions (callgrind, bench/FINDINGS.md). It also closes a slow head without an answer, and
//! HTTP/2 has no such timeout at all. Here each connection has one timer that fires every
//! quarter of the timeout and looks at two counters the requests keep: a connection whose
//! requests neither started nor finished for four checks in a row, with none in flight, has
//! been waiting for a request for between 1 and 1.25 times the timeout. A request costs two
//! counter bumps and no timer. The checks before that one say the connection waits
//! ([`Expiry::Waiting`]): an HTTP/1 connection is then parked (`super::park`).
//!
//! hyper notices a client that leaves mid-request by trying a read on every poll of the
//! connection (four per proxied request, ~1.1k instructions). The router turns that off
//! (`half_close`) and looks at the socket on the timer's checks instead: a peek that finds the
//! client's end of stream, while a request is in flight, ends the connection and with it the
//! request upstream. A client that leaves is so noticed within a quarter of the timeout, or at
//! once if the answer is being written to it.
//!
//! The same checks watch for an HTTP/1 client that takes nothing of its answer: hyper asks an
//! answer's body for more only while it can write, so a body whose last poll handed hyper data,
//! and that no poll has followed for `stream_idle_timeout`, sits behind a client that reads
//! nothing. That ends the connection too (two relaxed atomic writes per body poll).
//!
//! HTTP/2 has the same watch per stream rather than per connection ([`StreamExecutor`]): each
//! stream's answer counts hyper's polls of it, and a stream whose answer has waited with its
//! data in hyper's hands for `stream_idle_timeout` is reset, its request upstream dropped. The
//! connection's other streams go on.
//!
//! Over TLS the peek is at the TCP socket under the TLS stream: it sees the client's FIN or
//! reset as it would in cleartext (TLS records are bytes like any others, and a peek takes
//! none of them). A client that sends a `close_notify` alert before its FIN leaves those bytes
//! unread in front of the FIN, so the peek finds bytes, not the end: such a client is taken as
//! gone only when writing its answer fails (as it is when it pipelines another request).
//!
//! This file is the timer and the peek at the client's socket; what the requests and their
//! answers' bodies report to it is `activity`, and the watch of each HTTP/2 stream `streams`.

mod activity;
mod streams;

use std::future::Future;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;

use crate::error::RouterError;
use crate::state::Shared;

pub use activity::{Activity, Tracked};
pub use streams::{stream_polls, StreamExecutor};

/// Checks per timeout: the timeout is kept to within a quarter of itself.
const CHECKS_PER_TIMEOUT: u32 = 4;

/// How long the 408 may take to write before the connection is closed without it.
const ANSWER_WRITE_TIME: Duration = Duration::from_secs(1);

/// Why a connection's timer ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// A check found it waiting for a request (none started, finished or in flight since the
    /// check before), not yet for `header_read_timeout`: it may be parked (HTTP/1). The timer
    /// goes on.
    Waiting,
    /// It waited `header_read_timeout` for a request head.
    HeadTimeout,
    /// Its client closed (or reset) the connection while a request was in flight.
    ClientLeft,
    /// Its client took nothing of an answer for the stall limit (`stream_idle_timeout`).
    Stalled,
}

/// One connection's timer: its header read timeout, and its watch for a client that leaves.
pub struct Watchdog {
    period: Duration,
    /// The HTTP/1 client's socket, peeked at on checks while a request is in flight; `None` for
    /// HTTP/2, where hyper reads all the time and notices a close itself.
    client: Option<RawFd>,
    tick: Pin<Box<Sleep>>,
    /// The counters at the last check.
    seen: (u64, u64),
    /// Checks in a row that found nothing in flight and nothing changed.
    quiet: u32,
    /// Checks in a row that found an answer's data with hyper and hyper not asking for more.
    stalled: u32,
    /// How many such checks end the connection (HTTP/1 only).
    stall_checks: u32,
    /// The body polls at the last check.
    seen_polls: u64,
    /// The task's waker is with the timer (it is from the first poll on).
    registered: bool,
}

impl Watchdog {
    /// A timer for a connection whose client socket is `client` (HTTP/1). The socket must stay
    /// open as long as the timer is polled: it is owned by the connection the timer belongs to.
    ///
    /// An HTTP/1 client that takes nothing of an answer for `stall_limit` ends the connection
    /// too: hyper stops asking the body for more when it cannot write, so neither the body's
    /// idle limit nor the upstream deadline would ever see it, and the request would hold its
    /// backend connection (and its place in the in-flight counts) for as long as the client
    /// liked.
    pub fn new(timeout: Duration, client: Option<RawFd>, stall_limit: Duration) -> Watchdog {
        let period = (timeout / CHECKS_PER_TIMEOUT).max(Duration::from_millis(1));
        let stall_checks = stall_limit
            .as_nanos()
            .div_ceil(period.as_nanos())
            .clamp(1, u32::MAX.into()) as u32;
        Watchdog {
            period,
            client,
            tick: Box::pin(tokio::time::sleep(period)),
            seen: (0, 0),
            quiet: 0,
            stalled: 0,
            stall_checks,
            seen_polls: 0,
            registered: false,
        }
    }

    /// Ready once the connection has waited `timeout` for a request head, or its client has
    /// left while a request is in flight; and [`Expiry::Waiting`] at each check before that
    /// that finds it waiting. Cheap when the timer has not fired: one flag read (the first call
    /// registers the task's waker).
    pub fn poll_expired(&mut self, cx: &mut Context<'_>, activity: &Activity) -> Poll<Expiry> {
        if !self.tick.is_elapsed() {
            if !self.registered {
                // Afterwards the timer's firing wakes the task; until then a flag read does.
                let _ = self.tick.as_mut().poll(cx);
                self.registered = true;
            }
            return Poll::Pending;
        }
        let now = activity.snapshot();
        let in_flight = now.0 != now.1;
        if !in_flight && now == self.seen {
            self.quiet += 1;
        } else {
            self.quiet = 0;
            self.seen = now;
        }
        if self.quiet >= CHECKS_PER_TIMEOUT {
            return Poll::Ready(Expiry::HeadTimeout);
        }
        // The client left: its socket holds its end of stream (or an error), not bytes.
        if in_flight && self.peek_client() == Some(Peeked::End) {
            return Poll::Ready(Expiry::ClientLeft);
        }
        let holding = activity.polls().holding();
        if in_flight && self.client.is_some() && holding.is_some_and(|polls| polls == self.seen_polls) {
            self.stalled += 1;
            if self.stalled >= self.stall_checks {
                return Poll::Ready(Expiry::Stalled);
            }
        } else {
            self.stalled = 0;
            self.seen_polls = activity.polls().count();
        }
        let next = self.tick.deadline() + self.period;
        self.tick.as_mut().reset(next);
        // Registers the waker for the new deadline (a fired timer forgets it).
        let _ = self.tick.as_mut().poll(cx);
        match self.quiet {
            0 => Poll::Pending,
            _ => Poll::Ready(Expiry::Waiting),
        }
    }

    /// Whether the HTTP/1 client has sent bytes not read yet (its next request, as a rule),
    /// whatever tokio's readiness says (see [`peek`]).
    pub fn client_sent(&self) -> bool {
        self.peek_client() == Some(Peeked::Bytes)
    }

    /// What the HTTP/1 client's socket holds now; `None` for HTTP/2 (no socket to peek at).
    fn peek_client(&self) -> Option<Peeked> {
        // SAFETY: `Watchdog::new`'s contract: the socket is open while its timer is used.
        self.client.map(|fd| peek(unsafe { BorrowedFd::borrow_raw(fd) }))
    }
}

/// What a client's socket holds, looked at now: tokio's readiness is what its reactor saw
/// when it last turned, a peek is what the kernel holds. A peek takes nothing from the
/// socket, and the socket is non-blocking (tokio's), so this never waits.
pub fn peek(fd: impl AsFd) -> Peeked {
    let mut byte = [MaybeUninit::uninit()];
    match socket2::SockRef::from(&fd).peek(&mut byte) {
        Ok(0) => Peeked::End,
        Ok(_) => Peeked::Bytes,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Peeked::Nothing
        }
        Err(_) => Peeked::End,
    }
}

/// Waits, without an await (so tokio's reactor does not turn and does not see them), until
/// bytes a test's client wrote (or its end) are in `socket`: loopback delivers within the
/// write as a rule; a bounded spin (not a sleep) covers a late softirq.
#[cfg(test)]
pub fn spin_until_sent(socket: impl AsFd) {
    let mut spins = 0;
    while peek(&socket) == Peeked::Nothing {
        spins += 1;
        assert!(spins < 1_000_000, "the bytes written never reached the socket");
        std::thread::yield_now();
    }
}

/// See [`peek`].
#[derive(Debug, PartialEq, Eq)]
pub enum Peeked {
    /// Nothing to read yet.
    Nothing,
    /// The client sent bytes not read yet.
    Bytes,
    /// The client closed or reset the connection (or the socket failed).
    End,
}

/// Ends a connection whose head timed out: a client that sent part of a head gets the 408
/// `header_timeout`; an idle keep-alive connection is closed without a word (a client may be
/// sending its next request on it at this moment, and would read a 408 as that one's answer).
pub async fn answer<S: AsyncWrite + Unpin>(shared: &Shared, io: TokioIo<S>, unread: Bytes) {
    let mut stream = io.into_inner();
    if !unread.is_empty() {
        let e = RouterError::HeaderTimeout;
        shared.metrics.router_errors.with_label_values(&[e.reason()]).inc();
        let bytes = wire_bytes(e.to_response(None, 0));
        let _ = tokio::time::timeout(ANSWER_WRITE_TIME, stream.write_all(&bytes)).await;
    }
    let _ = tokio::time::timeout(ANSWER_WRITE_TIME, stream.shutdown()).await;
}

/// A response the router made itself, as HTTP/1.1 bytes, closing the connection.
fn wire_bytes(resp: Response<Bytes>) -> Vec<u8> {
    let (head, body) = resp.into_parts();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        head.status.as_u16(),
        head.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_408_is_a_whole_http1_answer() {
        let bytes = wire_bytes(RouterError::HeaderTimeout.to_response(None, 0));
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{head}");
        assert!(head.contains("\r\nmcp-router-error: header_timeout"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], -32600);
        assert_eq!(v["id"], serde_json::Value::Null);
    }

    /// A timer checking every 100 ms, and its counters.
    fn timer() -> (Watchdog, Arc<Activity>) {
        let timer = Watchdog::new(Duration::from_millis(400), None, Duration::from_secs(60));
        (timer, Arc::new(Activity::default()))
    }

    fn poll(timer: &mut Watchdog, activity: &Activity) -> Poll<Expiry> {
        timer.poll_expired(&mut Context::from_waker(std::task::Waker::noop()), activity)
    }

    #[tokio::test(start_paused = true)]
    async fn says_waiting_at_each_quiet_check_before_the_timeout() {
        let (mut timer, activity) = timer();
        let check = |timer: &mut Watchdog| poll(timer, &activity);
        assert_eq!(check(&mut timer), Poll::Pending);
        drop(activity.start());
        // The check that sees the request's start and end: a change, not waiting.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(check(&mut timer), Poll::Pending);
        for i in 0..3 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert_eq!(check(&mut timer), Poll::Ready(Expiry::Waiting), "check {i}");
            // Between checks: nothing.
            assert_eq!(check(&mut timer), Poll::Pending, "check {i}");
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(check(&mut timer), Poll::Ready(Expiry::HeadTimeout));
    }

    #[tokio::test(start_paused = true)]
    async fn expires_after_four_quiet_checks_and_not_while_a_request_is_in_flight() {
        let (mut timer, activity) = timer();
        let expired = |timer: &mut Watchdog| match poll(timer, &activity) {
            Poll::Ready(Expiry::HeadTimeout) => true,
            Poll::Ready(Expiry::Waiting) | Poll::Pending => false,
            Poll::Ready(e) => panic!("{e:?}"),
        };
        assert!(!expired(&mut timer));
        // A request in flight for three timeouts keeps the connection.
        let done = activity.start();
        for _ in 0..12 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert!(!expired(&mut timer));
        }
        drop(done);
        // Its end is a change: four quiet checks after the one that sees it.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!expired(&mut timer));
        for i in 0..4 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert_eq!(expired(&mut timer), i == 3, "check {i}");
        }
    }
}
