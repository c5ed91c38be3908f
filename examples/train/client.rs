//! Client connections of the training workload: HTTP/1.1 or HTTP/2, in clear text or over TLS
//! (ALPN), each a hyper client connection of its own, so the driver decides how many
//! connections the router sees and how many streams each carries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Any one request gives up after this long: a hang fails the training instead of stalling it.
const REQUEST_DEADLINE: Duration = Duration::from_secs(15);

/// Where and how to connect.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub http2: bool,
    /// Set: TLS, with this connector (its ALPN offers only the protocol of `http2`).
    pub tls: Option<TlsConnector>,
}

impl Target {
    pub fn new(addr: SocketAddr, http2: bool, root: Option<&CertificateDer<'static>>) -> Target {
        let tls = root.map(|root| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(root.clone()).expect("a valid certificate");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("default versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![if http2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
            TlsConnector::from(Arc::new(config))
        });
        Target { addr, http2, tls }
    }
}

pub enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// An answer read whole (a held stream is read by [`Conn::open`] instead).
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

pub async fn connect(t: &Target) -> Result<Conn, String> {
    let tcp = TcpStream::connect(t.addr).await.map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    match &t.tls {
        None => handshake(tcp, t.http2).await,
        Some(tls) => {
            let name = ServerName::try_from("localhost").expect("a DNS name");
            let stream = tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
            handshake(stream, t.http2).await
        }
    }
}

async fn handshake<IO>(io: IO, h2: bool) -> Result<Conn, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    if h2 {
        let (send, conn) = http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn::H2(send))
    } else {
        let (send, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn::H1(send))
    }
}

impl Conn {
    /// Another handle on the same connection: an HTTP/2 one carries streams side by side.
    pub fn share(&self) -> Option<Conn> {
        match self {
            Conn::H2(s) => Some(Conn::H2(s.clone())),
            Conn::H1(_) => None,
        }
    }

    fn request(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Bytes) -> Request<Full<Bytes>> {
        // HTTP/2 takes `:authority` from the target; HTTP/1.1 the origin form and `Host`.
        let mut req = match self {
            Conn::H2(_) => Request::builder().uri(format!("http://localhost{path}")),
            Conn::H1(_) => Request::builder().uri(path).header("host", "localhost"),
        }
        .method(method);
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        req = req.header("accept", "application/json, text/event-stream");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(Full::new(body)).expect("a valid request")
    }

    async fn send_request(&mut self, req: Request<Full<Bytes>>) -> Result<http::Response<Incoming>, String> {
        let sent = async {
            match self {
                Conn::H1(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(req).await.map_err(|e| e.to_string())
                }
                Conn::H2(s) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.send_request(req).await.map_err(|e| e.to_string())
                }
            }
        };
        tokio::time::timeout(REQUEST_DEADLINE, sent)
            .await
            .map_err(|_| "no answer in time".to_string())?
    }

    /// Sends a request to `/mcp`.
    pub async fn send(
        &mut self,
        method: Method,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, String> {
        self.send_to(method, "/mcp", headers, body).await
    }

    pub async fn send_to(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, String> {
        let req = self.request(method, path, headers, body.into());
        let resp = self.send_request(req).await?;
        let (head, body) = resp.into_parts();
        let body = tokio::time::timeout(REQUEST_DEADLINE, body.collect())
            .await
            .map_err(|_| "answer body not in time".to_string())?
            .map_err(|e| format!("answer body: {e}"))?
            .to_bytes();
        Ok(Answer {
            status: head.status,
            headers: head.headers,
            body,
        })
    }

    /// Sends a GET and reads the event stream it answers until `until`; the events read.
    pub async fn hold(&mut self, headers: &[(&str, &str)], until: tokio::time::Instant) -> Result<u64, String> {
        let req = self.request(Method::GET, "/mcp", headers, Bytes::new());
        let resp = self.send_request(req).await?;
        if resp.headers().get("content-type").map(|v| v.as_bytes()) != Some(b"text/event-stream") {
            return Err(format!(
                "held stream answered {} without an event stream",
                resp.status()
            ));
        }
        let mut body = resp.into_body();
        let mut events = 0;
        loop {
            match tokio::time::timeout_at(until, body.frame()).await {
                Err(_) => return Ok(events),
                Ok(Some(Ok(_))) => events += 1,
                Ok(Some(Err(e))) => return Err(format!("held stream: {e}")),
                Ok(None) => return Err("held stream ended early".into()),
            }
        }
    }
}
