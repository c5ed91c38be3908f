//! Reaching a backend's socket: a TCP connection, under TLS for `https://` backends (rustls,
//! the roots and client certificate of `[upstream]`, a session-resumption cache per backend),
//! and telling a TLS failure from other failures wherever it surfaces (the handshake, or the
//! first read: under TLS 1.3 a server rejects a client certificate after the client's side of
//! the handshake is done).

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::{ClientSessionMemoryCache, Resumption};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::config::{defaults, TlsClients};

/// A connection's byte stream: plain TCP, or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS to one backend: the client configs of `[upstream]` cloned with a resumption cache of the
/// backend's own (shared by its HTTP/1.1 and HTTP/2 configs), and the name it is checked against.
pub struct BackendTls {
    /// What these were cloned from: a reload that builds new ones (renewed files) is noticed by
    /// pointer.
    pub(super) base: Arc<TlsClients>,
    http1: Arc<TlsConnector>,
    http2: Arc<TlsConnector>,
    pub(super) server_name: ServerName<'static>,
}

impl BackendTls {
    pub fn new(base: &Arc<TlsClients>, server_name: ServerName<'static>) -> BackendTls {
        let sessions = Arc::new(ClientSessionMemoryCache::new(defaults::TLS_SESSIONS_PER_BACKEND));
        let own = |config: &Arc<rustls::ClientConfig>| {
            let mut config = rustls::ClientConfig::clone(config);
            config.resumption = Resumption::store(sessions.clone());
            Arc::new(TlsConnector::from(Arc::new(config)))
        };
        BackendTls {
            base: base.clone(),
            http1: own(&base.http1),
            http2: own(&base.http2),
            server_name,
        }
    }

    /// The TLS handshake over `tcp`, offering ALPN `h2` or `http/1.1`.
    pub async fn handshake(&self, tcp: TcpStream, http2: bool) -> Result<Stream, ConnectError> {
        let connector = if http2 { &self.http2 } else { &self.http1 };
        match connector.connect(self.server_name.clone(), tcp).await {
            Ok(tls) => Ok(Stream::Tls(Box::new(tls))),
            Err(e) => Err(ConnectError::tls(e)),
        }
    }
}

/// Why no connection to a backend could be opened.
#[derive(Debug)]
pub struct ConnectError {
    /// `"connect"` (TCP, or HTTP/2's preface) or `"tls"` (the handshake or the certificates):
    /// the `kind` of `mrtr_upstream_errors_total`.
    pub kind: &'static str,
    error: io::Error,
}

impl ConnectError {
    pub fn connect(error: io::Error) -> ConnectError {
        ConnectError { kind: "connect", error }
    }

    pub fn tls(error: io::Error) -> ConnectError {
        ConnectError { kind: "tls", error }
    }

    /// An error of an established connection (an HTTP/2 connection that ended before its
    /// SETTINGS): TLS when rustls is behind it.
    pub fn of(error: &(dyn StdError + 'static)) -> ConnectError {
        let kind = if tls_error(error).is_some() { "tls" } else { "connect" };
        ConnectError {
            kind,
            error: io::Error::other(Chain(error).to_string()),
        }
    }

    /// The backend has `max_connections_per_backend` connections open, all busy, and none
    /// came free within `queue_timeout`: the router's own limit, nothing against the backend.
    pub fn busy() -> ConnectError {
        ConnectError {
            kind: "busy",
            error: io::Error::other("every connection allowed to the backend is busy"),
        }
    }

    pub fn is_busy(&self) -> bool {
        self.kind == "busy"
    }

    pub fn is_tls(&self) -> bool {
        self.kind == "tls"
    }

    /// A connect that failed for want of this machine's resources ([`is_local_error`]): it
    /// says nothing of the backend.
    pub fn is_local(&self) -> bool {
        self.kind == "connect" && is_local_error(&self.error)
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_tls() {
            true => write!(f, "TLS handshake failed: {}", Chain(&self.error)),
            false => write!(f, "{}", Chain(&self.error)),
        }
    }
}

impl StdError for ConnectError {}

/// Whether a failed connect attempt says something about the backend, or only about this
/// machine: out of file descriptors, memory, buffers or local ports. Only the backend's own
/// faults may count toward ejecting it.
pub fn is_local_error(e: &io::Error) -> bool {
    // EMFILE, ENFILE, ENOMEM, ENOBUFS, EADDRNOTAVAIL (Linux numbers).
    matches!(e.raw_os_error(), Some(24 | 23 | 12 | 105 | 99))
}

/// The rustls error behind `e`, if any: an error's sources are searched, and the error inside
/// each `io::Error`, where tokio-rustls puts it. (Not behind an `h2::Error`, which keeps only an
/// I/O error's text: the HTTP/2 connections note a TLS failure as it passes.)
pub fn tls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let io = e
            .downcast_ref::<io::Error>()
            .or_else(|| e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io));
        if let Some(tls) = io
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        next = e.source();
    }
    None
}

/// An error and its sources, `: `-separated (hyper's errors say little without their source).
pub struct Chain<'a>(pub &'a (dyn StdError + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut last = self.0.to_string();
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            // io::Error shows its inner error's text as its own: say it once.
            if !last.contains(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{AlertDescription, CertificateError};

    #[test]
    fn a_tls_failure_is_found_wherever_it_is_wrapped_and_its_log_says_what_rustls_said() {
        let unknown = || rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        // tokio-rustls's handshake error; the same under an error with it as its source.
        let io = io::Error::new(io::ErrorKind::InvalidData, unknown());
        assert_eq!(tls_error(&io), Some(&unknown()));
        #[derive(Debug)]
        struct Outer(io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("connection error")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let refused = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        let outer = Outer(io::Error::new(io::ErrorKind::InvalidData, refused.clone()));
        assert_eq!(tls_error(&outer), Some(&refused));
        assert_eq!(ConnectError::of(&outer).kind, "tls");
        // Not TLS: a reset.
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(tls_error(&reset), None);
        assert_eq!(ConnectError::of(&reset).kind, "connect");
        // The log line names what rustls said.
        let shown = ConnectError::tls(io::Error::new(io::ErrorKind::InvalidData, unknown())).to_string();
        assert!(
            shown.starts_with("TLS handshake failed: ") && shown.contains("UnknownIssuer"),
            "{shown}"
        );
        // A connect refused for want of local descriptors says nothing of the backend.
        assert!(ConnectError::connect(io::Error::from_raw_os_error(24)).is_local());
        assert!(!ConnectError::tls(io::Error::from_raw_os_error(24)).is_local());
    }
}
