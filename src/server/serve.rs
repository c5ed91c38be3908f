//! The loop that serves one hyper connection (HTTP/1 or HTTP/2) until it ends, waits too long
//! for a request, loses its client mid-request, or is found idle to be parked; and the
//! shutdown's part in it (a connection is shut down gracefully, after serving a request its
//! client had already sent).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{ready, Poll};

use hyper_util::server::graceful::GracefulConnection;

use super::shutdown::Shutdown;
use super::{park, watchdog};

/// What became of a connection served by [`serve`]; unpolled since, unless it ended.
pub(super) enum Served {
    /// The connection ended by itself.
    Ended(hyper::Result<()>),
    /// It waited `header_read_timeout` for a request.
    TimedOut,
    /// Its client left while a request was in flight: the connection is dropped, and the
    /// request with it (its upstream connection closes).
    ClientLeft,
    /// It waits between requests holding nothing (HTTP/1): see `Connection::serve_http1`.
    Idle,
}

/// Serves `conn` until it ends, has waited `header_read_timeout` for a request, its client has
/// left mid-request (HTTP/1: `timer` peeks at its socket, see `watchdog`), or is found idle
/// (see [`park::Parkable`]) at one of `timer`'s checks; shutting it down gracefully if the
/// shutdown starts meanwhile. `timer` is the connection's, kept across the hyper connections
/// that serve it in turn (see `Connection::serve_http1`). A bare `poll_fn`: an `async` block
/// around it would hold what it needs twice (in the block, and in the closure).
pub(super) fn serve<'a, C>(
    mut conn: Pin<&'a mut C>,
    shutdown: &'a Shutdown,
    activity: &'a watchdog::Activity,
    timer: &'a mut watchdog::Watchdog,
) -> impl Future<Output = Served> + Send + 'a
where
    C: GracefulConnection<Error = hyper::Error> + park::Parkable + Send + 'a,
{
    let mut watch = shutdown.register();
    // The count of requests begun that the shutdown waits to see grow before it shuts the
    // connection down: one served after the shutdown began (see `LAST_CALL`, and a parked one
    // whose client sent as it began), or found between requests with its client's next one
    // in its socket, first reads that request. Shut down before it has one, hyper would close
    // it unread.
    let mut wait_past = shutdown.is_started().then(|| activity.started());
    let mut closing = false;
    poll_fn(move |cx| {
        if !closing && watch.poll_started(cx).is_ready() {
            match wait_past {
                None if conn.is_idle() && timer.client_sent() => wait_past = Some(activity.started()),
                Some(begun) if activity.started() == begun => {}
                _ => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            return Poll::Ready(Served::Ended(r));
        }
        if !closing && wait_past.is_some_and(|begun| activity.started() != begun) {
            // The request waited for has just begun: shut down at the next poll, which an
            // answer made at once would not otherwise bring.
            cx.waker().wake_by_ref();
        }
        // After the connection: what it just did is in the counters the timer reads.
        match ready!(timer.poll_expired(cx, activity)) {
            watchdog::Expiry::Waiting if conn.is_idle() => Poll::Ready(Served::Idle),
            watchdog::Expiry::Waiting => Poll::Pending,
            watchdog::Expiry::HeadTimeout => Poll::Ready(Served::TimedOut),
            watchdog::Expiry::ClientLeft => {
                tracing::debug!("client left while its request was in flight");
                Poll::Ready(Served::ClientLeft)
            }
            watchdog::Expiry::Stalled => {
                tracing::debug!("client took nothing of its answer for stream_idle_timeout");
                Poll::Ready(Served::ClientLeft)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::os::fd::AsRawFd;
    use std::pin::pin;
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response};
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;

    use super::*;

    /// At the shutdown, a connection between requests whose client has just sent its next one
    /// reads and serves it before it closes; one whose client sent nothing closes at once.
    /// The request is in the socket but tokio's reactor (which turns only when this test
    /// awaits) has not seen it, as under load a shutdown often wakes a connection first: shut
    /// down then, hyper would close the connection with the request unread.
    #[tokio::test(flavor = "current_thread")]
    async fn at_the_shutdown_a_request_in_the_socket_is_served_first() {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for sends in [false, true] {
            let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let fd = server.as_raw_fd();
            let (shutdown, activity) = (Shutdown::default(), Arc::new(watchdog::Activity::default()));
            let mut timer = watchdog::Watchdog::new(Duration::from_secs(60), Some(fd), Duration::from_secs(60));
            let counts = activity.clone();
            let answer = service_fn(move |_: Request<Incoming>| {
                let done = counts.start();
                async move {
                    drop(done);
                    Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from_static(b"ok"))))
                }
            });
            let http1 = hyper::server::conn::http1::Builder::new();
            let mut conn = Box::pin(http1.serve_connection(TokioIo::new(server), answer));
            let ended = {
                let mut served = pin!(serve(conn.as_mut(), &shutdown, &activity, &mut timer));
                // hyper reads, finds nothing, and waits between requests.
                assert!(served.as_mut().poll(&mut cx).is_pending());
                if sends {
                    client
                        .write_all(b"POST /mcp HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
                        .unwrap();
                    // SAFETY: the socket is open: `conn` owns it.
                    watchdog::spin_until_sent(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
                }
                shutdown.start();
                let first = served.as_mut().poll(&mut cx);
                match sends {
                    false => first,
                    true => {
                        assert!(first.is_pending(), "held for the request in its socket");
                        // Bounded, and a timeout's firing would poll it once more: shut down
                        // only then, it took the whole 10 s.
                        let waiting = std::time::Instant::now();
                        let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
                        assert!(waiting.elapsed() < Duration::from_secs(5), "{:?}", waiting.elapsed());
                        ended.map(Poll::Ready).expect("served, then shut down")
                    }
                }
            };
            assert!(matches!(ended, Poll::Ready(Served::Ended(Ok(())))), "sends: {sends}");
            drop(conn);
            let mut answer = String::new();
            client.read_to_string(&mut answer).unwrap();
            match sends {
                false => assert_eq!(answer, "", "closed without a word"),
                true => {
                    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
                    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
                }
            }
            assert_eq!(activity.started(), u64::from(sends));
        }
    }
}
