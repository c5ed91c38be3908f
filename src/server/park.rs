//! Parked connections: an HTTP/1 client connection that waits between requests, held as its
//! socket alone until its client sends again (see `Connection::serve_http1`).
//!
//! hyper keeps a connection's whole state for its life (~700 bytes in the connection's task,
//! its boxed slots for the request in flight and the body), waiting or not. Keep-alive clients
//! (an MCP client between tool calls, a pool's spare connections) leave most connections waiting
//! most of the time, so a parked connection holds what the kernel already does for it, its
//! socket, plus its task and timer: waiting for the socket's readiness costs no state at all.

use std::future::{poll_fn, Future};
use std::task::Poll;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::shutdown::Shutdown;
use super::watchdog::{peek, Activity, Expiry, Peeked, Watchdog};

/// A client connection's byte stream, and the TCP socket it runs on.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn tcp(&self) -> &TcpStream;
}

impl ClientIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// TLS: what rustls read off the socket and decrypted, hyper has read too (it parks only after
/// a read that found nothing), so the socket's readiness is the client's next bytes here too.
impl ClientIo for TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// A client connection [`super::serve`] serves, which it parks when this finds it waiting
/// between requests holding nothing.
pub trait Parkable {
    fn is_idle(&self) -> bool;
}

/// hyper says whether the connection holds nothing (the patched hyper's `is_idle`,
/// vendor/patches/hyper/0005).
#[cfg(feature = "patched-http")]
impl<I, S, B> Parkable for http1::Connection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn is_idle(&self) -> bool {
        http1::Connection::is_idle(self)
    }
}

/// Stock hyper cannot say whether a connection may be taken apart without losing a byte, so
/// none is parked, and at the shutdown an HTTP/1 connection is shut down as hyper does (one
/// between requests closes at once, even with its client's next request in its socket).
#[cfg(not(feature = "patched-http"))]
impl<I, S: HttpService<Incoming>> Parkable for http1::Connection<I, S> {
    fn is_idle(&self) -> bool {
        false
    }
}

/// Never: an HTTP/2 connection's state is shared by its streams, and hyper reads it all the
/// time (an idle one is closed after `header_read_timeout`, as it was).
impl<I, S: HttpService<Incoming>, E> Parkable for http2::Connection<I, S, E> {
    fn is_idle(&self) -> bool {
        false
    }
}

/// Why a parked connection stopped waiting.
#[derive(Debug, PartialEq, Eq)]
pub enum Unparked {
    /// Its client sent (or closed, or the socket failed): a new hyper connection reads it.
    Readable,
    /// It has waited `header_read_timeout` for a request: it is closed, as an unparked one is.
    TimedOut,
    /// The shutdown started and nothing waits to be read: it is closed, as an idle
    /// connection is at the shutdown.
    Shutdown,
}

/// A connection parked, counted in `mrtr_connections_parked` until dropped.
pub struct Parked<'a>(&'a prometheus::IntGauge);

impl<'a> Parked<'a> {
    pub fn new(gauge: &'a prometheus::IntGauge) -> Parked<'a> {
        gauge.inc();
        Parked(gauge)
    }

    /// Waits for the client's next bytes on `tcp` (or its end), the connection's
    /// `header_read_timeout` (`timer`, the same as while hyper served it), or the shutdown.
    /// Readiness is looked at first, and the socket itself before the shutdown or the timeout
    /// close it: a client that sent as either came is served.
    pub fn wait<'b>(
        self,
        tcp: &'b TcpStream,
        timer: &'b mut Watchdog,
        activity: &'b Activity,
        shutdown: &'b Shutdown,
    ) -> impl Future<Output = Unparked> + Send + 'b
    where
        'a: 'b,
    {
        let mut watch = shutdown.register();
        poll_fn(move |cx| {
            // Moves the guard into the future: counted as parked as long as it waits.
            let _parked = &self;
            if tcp.poll_read_ready(cx).is_ready() {
                return Poll::Ready(Unparked::Readable);
            }
            let why = if watch.poll_started(cx).is_ready() {
                Unparked::Shutdown
            } else {
                match timer.poll_expired(cx, activity) {
                    Poll::Ready(Expiry::HeadTimeout) => Unparked::TimedOut,
                    // Nothing is in flight: the other checks cannot fire, and `Waiting` it is.
                    _ => return Poll::Pending,
                }
            };
            // Either closes the connection, and may come before tokio's reactor has seen
            // bytes that came just before it (under load, often): the kernel's word is taken
            // instead of tokio's, and a client that has sent is served.
            Poll::Ready(match peek(tcp) {
                Peeked::Nothing => why,
                Peeked::Bytes | Peeked::End => Unparked::Readable,
            })
        })
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::pin::{pin, Pin};
    use std::task::Context;
    use std::time::Duration;

    use super::*;

    /// A client connection's two ends, the router's read until nothing was there, as hyper
    /// leaves a connection it parks (which also clears the readiness tokio gives a new socket).
    async fn pair(listener: &tokio::net::TcpListener) -> (std::net::TcpStream, TcpStream) {
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let read = server.try_read(&mut [0; 1]);
        assert!(
            matches!(read, Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "{read:?}"
        );
        (client, server)
    }

    /// Sends a request to `server`, in its socket but not seen by tokio's reactor.
    fn send_unseen(client: &mut std::net::TcpStream, server: &TcpStream) {
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        super::super::watchdog::spin_until_sent(server);
    }

    fn poll<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    /// A parked connection whose client sent as the shutdown began is served: here the bytes
    /// are in the socket but tokio's reactor has not seen them, as under load a shutdown often
    /// wakes a connection first. Only the socket says so; tokio's readiness would have it
    /// closed unread. One whose client sent nothing is closed; one whose client has just
    /// closed is read too (a new hyper connection finds the end and ends).
    #[tokio::test(flavor = "current_thread")]
    async fn at_the_shutdown_the_socket_is_asked_not_tokio() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gauge = prometheus::IntGauge::new("parked", "parked").unwrap();
        let activity = Activity::default();
        for client_does in ["nothing", "sends", "closes"] {
            let (mut client, server) = pair(&listener).await;
            let shutdown = Shutdown::default();
            let mut timer = Watchdog::new(Duration::from_secs(60), None, Duration::from_secs(60));
            let mut parked = pin!(Parked::new(&gauge).wait(&server, &mut timer, &activity, &shutdown));
            assert_eq!(poll(parked.as_mut()), Poll::Pending);
            assert_eq!(gauge.get(), 1);
            let want = match client_does {
                "sends" => {
                    send_unseen(&mut client, &server);
                    Unparked::Readable
                }
                "closes" => {
                    drop(client);
                    super::super::watchdog::spin_until_sent(&server);
                    Unparked::Readable
                }
                _ => Unparked::Shutdown,
            };
            shutdown.start();
            assert_eq!(poll(parked.as_mut()), Poll::Ready(want), "{client_does}");
        }
        assert_eq!(gauge.get(), 0);
    }

    /// The same at `header_read_timeout`: a client that sent as the timeout came is served, one
    /// that did not is closed at the fourth quiet check (see `watchdog`).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn at_the_timeout_the_socket_is_asked_not_tokio() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gauge = prometheus::IntGauge::new("parked", "parked").unwrap();
        let (shutdown, activity) = (Shutdown::default(), Activity::default());
        for sends in [false, true] {
            let (mut client, server) = pair(&listener).await;
            let mut timer = Watchdog::new(Duration::from_millis(400), None, Duration::from_secs(60));
            let mut parked = pin!(Parked::new(&gauge).wait(&server, &mut timer, &activity, &shutdown));
            assert_eq!(poll(parked.as_mut()), Poll::Pending);
            for _ in 0..3 {
                tokio::time::advance(Duration::from_millis(100)).await;
                assert_eq!(poll(parked.as_mut()), Poll::Pending);
            }
            tokio::time::advance(Duration::from_millis(100)).await;
            if sends {
                send_unseen(&mut client, &server);
            }
            let want = if sends { Unparked::Readable } else { Unparked::TimedOut };
            assert_eq!(poll(parked.as_mut()), Poll::Ready(want), "sends: {sends}");
        }
        assert_eq!(gauge.get(), 0);
    }
}
