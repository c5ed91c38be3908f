//! `[server]` (the proxy listener, its limits and timeouts, TLS) and `[admin]`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::reader::{key, quoted, Section, Text};
use super::reference::Kind;
use super::{defaults, Cidr, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Largest request body the router reads to find a key; larger is 413.
    pub max_body_bytes: usize,
    /// Time a client has to send its request headers (HTTP/1): kept by the connection watchdog.
    pub header_read_timeout: Duration,
    /// Time a client has to send the whole request body once headers are in.
    pub body_read_timeout: Duration,
    /// Deadline for a non-streaming answer (head and whole JSON body).
    pub upstream_timeout: Duration,
    /// An SSE stream with no bytes for this long is closed (never below 60 s).
    pub stream_idle_timeout: Duration,
    /// How long SIGTERM waits for in-flight requests and streams.
    pub shutdown_grace: Duration,
    /// Most request headers accepted (HTTP/1); more is 431.
    pub max_headers: usize,
    /// Client connections open at once; past it the listener stops accepting (connections
    /// wait in the kernel's backlog) until one closes.
    pub max_connections: usize,
    /// Streams one HTTP/2 client connection may have open at once.
    pub h2_max_concurrent_streams: u32,
    /// Request-body bytes the router holds at once across all connections while it reads POST
    /// bodies; a body that would go past it is answered 503 `router_overloaded`.
    pub max_body_buffer_bytes: usize,
    /// Whether the router's own error answers (502, 503, 504) name the backend. Off: a client
    /// learns nothing about the fleet from them (what sealed tokens hide stays hidden); the
    /// log, the access log, traces and metrics name it either way.
    pub errors_name_backends: bool,
    /// `tls_cert` + `tls_key`: the proxy listener speaks TLS (HTTP/1.1 and HTTP/2 by ALPN).
    pub tls: Option<TlsConfig>,
    /// Connections from `proxy_protocol_from` start with a PROXY protocol header (v1 or v2),
    /// whose source address is the client's; such a header from any other peer, or a trusted
    /// peer's connection without one, is closed without an answer.
    pub proxy_protocol: bool,
    /// The load balancers trusted to send a PROXY protocol header.
    pub proxy_protocol_from: Vec<Cidr>,
}

/// TLS on the proxy listener: the two files, read and checked when the config is loaded, and
/// the rustls server config built from them (see `crate::tls`).
#[derive(Clone)]
pub struct TlsConfig {
    /// The certificate chain (PEM, leaf first), as resolved against the config file's directory.
    pub cert_path: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_path: PathBuf,
    /// Shared by every TLS connection accepted while this config runs.
    pub server: Arc<rustls::ServerConfig>,
    /// SHA-256 over both files' contents: two configs are equal when paths and contents are.
    digest: [u8; 32],
}

impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest && self.cert_path == other.cert_path && self.key_path == other.key_path
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// The bearer token `POST /backends/*` needs (and, with `protect_reads`, `/backends` and
    /// `/debug/route`). Unset: the mutating endpoints answer only on a loopback listener.
    pub token: Option<AdminSecret>,
    /// The token is required for `/backends` and `/debug/route` too.
    pub protect_reads: bool,
    /// Admin connections open at once; past it, the oldest is closed to make room.
    pub max_connections: usize,
    /// Time an admin client has to send a request head (also the limit on an idle keep-alive
    /// connection).
    pub header_read_timeout: Duration,
    /// Time an admin client has to send a request body (`POST /debug/route`).
    pub body_read_timeout: Duration,
}

/// `admin.token`: only its SHA-256 is kept, and a presented token is compared with it in
/// constant time; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminSecret {
    digest: [u8; 32],
}

impl AdminSecret {
    pub fn new(token: &[u8]) -> AdminSecret {
        AdminSecret {
            digest: digest(&[token]),
        }
    }

    /// Whether `presented` is the token. The time taken depends on neither value: both are
    /// hashed, and every byte of the digests is compared.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let other = digest(&[presented]);
        let diff = self
            .digest
            .iter()
            .zip(other.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for AdminSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminSecret(<redacted>)")
    }
}

pub(super) fn server(mut s: Section) -> Result<ServerConfig, ConfigError> {
    let listen = key(
        "listen",
        "Address of the proxy listener (HTTP/1.1 and HTTP/2; TLS with `tls_cert` and `tls_key`); read at start only.",
    );
    let max_body_bytes = key(
        "max_body_bytes",
        "Largest request body read to find a key; a larger one is answered 413 `body_too_large`.",
    );
    let header_read_timeout = key(
        "header_read_timeout",
        "Time a client has to send its request headers (HTTP/1), else 408 `header_timeout`; an idle \
         keep-alive connection, or an h2c one with no stream, is closed after as long.",
    );
    let body_read_timeout = key(
        "body_read_timeout",
        "Time a client has to send a request body once its headers are in, else 408 `body_timeout`.",
    );
    let upstream_timeout = key(
        "upstream_timeout",
        "Deadline for a non-streaming answer (its head and whole JSON body), else 504.",
    );
    let stream_idle_timeout = key(
        "stream_idle_timeout",
        "A streamed (SSE) answer with no bytes for this long is closed, and a client that takes nothing \
         of an answer for this long is dropped; at least 60s, as MCP streams idle between events.",
    );
    let shutdown_grace = key(
        "shutdown_grace",
        "How long SIGTERM waits for in-flight requests and streams before it closes them.",
    );
    let max_headers = key(
        "max_headers",
        "Most request headers accepted (HTTP/1); more is answered 431.",
    );
    let max_connections = key(
        "max_connections",
        "Client connections open at once, and never more than the open-file limit affords (half of \
         it after a reserve, logged at start); past it, new connections wait in the kernel's backlog.",
    );
    let h2_max_concurrent_streams = key(
        "h2_max_concurrent_streams",
        "Streams one HTTP/2 client connection may have open at once; more are refused (`REFUSED_STREAM`).",
    );
    let max_body_buffer_bytes = key(
        "max_body_buffer_bytes",
        "Request-body bytes held at once across all connections while bodies are read; a body that \
         would go past it is answered 503 `router_overloaded`; at least `max_body_bytes`.",
    );
    let errors_name_backends = key(
        "errors_name_backends",
        "Whether the router's own 502/503/504 answers name the backend; off, clients learn nothing of \
         the fleet from them; logs, access log, traces and metrics always name it.",
    );
    let mut server = ServerConfig {
        listen: s.addr(listen, defaults::LISTEN)?.0,
        max_body_bytes: s.int(max_body_bytes, defaults::MAX_BODY_BYTES as i64, 64..=1 << 30)? as usize,
        header_read_timeout: s.duration(header_read_timeout, defaults::HEADER_READ_TIMEOUT)?,
        body_read_timeout: s.duration(body_read_timeout, defaults::BODY_READ_TIMEOUT)?,
        upstream_timeout: s.duration(upstream_timeout, defaults::UPSTREAM_TIMEOUT)?,
        stream_idle_timeout: s.duration_at_least(
            stream_idle_timeout,
            defaults::STREAM_IDLE_TIMEOUT,
            defaults::MIN_STREAM_IDLE_TIMEOUT,
        )?,
        shutdown_grace: s.duration(shutdown_grace, defaults::SHUTDOWN_GRACE)?,
        max_headers: s.int(max_headers, defaults::MAX_HEADERS as i64, 16..=10_000)? as usize,
        max_connections: s.int(max_connections, defaults::MAX_CONNECTIONS as i64, 1..=1_000_000)? as usize,
        h2_max_concurrent_streams: s.int(
            h2_max_concurrent_streams,
            defaults::H2_MAX_CONCURRENT_STREAMS.into(),
            1..=10_000,
        )? as u32,
        max_body_buffer_bytes: s.int(
            max_body_buffer_bytes,
            defaults::MAX_BODY_BUFFER_BYTES as i64,
            64..=1 << 40,
        )? as usize,
        errors_name_backends: s.bool(errors_name_backends, defaults::ERRORS_NAME_BACKENDS)?,
        tls: tls(&mut s)?,
        proxy_protocol: false,
        proxy_protocol_from: Vec::new(),
    };
    (server.proxy_protocol, server.proxy_protocol_from) = proxy_protocol(&mut s)?;
    if server.max_body_buffer_bytes < server.max_body_bytes {
        let span = s.span();
        return s.err(
            span,
            format!(
                "server.max_body_buffer_bytes ({}) must be at least server.max_body_bytes ({})",
                server.max_body_buffer_bytes, server.max_body_bytes
            ),
        );
    }
    s.finish(true)?;
    Ok(server)
}

/// `proxy_protocol` and `proxy_protocol_from`: on needs at least one trusted source, or every
/// connection would be closed.
fn proxy_protocol(s: &mut Section) -> Result<(bool, Vec<Cidr>), ConfigError> {
    let on = key(
        "proxy_protocol",
        "Read a PROXY protocol header (v1 or v2, as HAProxy and cloud L4 load balancers send) before \
         TLS or HTTP on connections from `proxy_protocol_from`: its source address is the client's; \
         a trusted peer's connection without one, or one from any other peer with one, is closed \
         without an answer.",
    );
    let from = key(
        "proxy_protocol_from",
        "The load balancers allowed to send a PROXY protocol header; required when `proxy_protocol` is on.",
    );
    let on = s.bool(on, defaults::PROXY_PROTOCOL)?;
    let (from, span) = cidrs(s, from)?;
    if on && from.is_empty() {
        let span = span.or(s.span());
        return s.err(
            span,
            "server.proxy_protocol: needs server.proxy_protocol_from (the load balancers' addresses)",
        );
    }
    Ok((on, from))
}

/// An array of IP networks, default none, printed.
pub(super) fn cidrs(
    s: &mut Section,
    key: super::reader::Key,
) -> Result<(Vec<Cidr>, Option<std::ops::Range<usize>>), ConfigError> {
    let (texts, span) = s.strings_or(key, Kind::Cidr, &[])?;
    let mut out = Vec::with_capacity(texts.len());
    for t in texts {
        match t.value.parse::<Cidr>() {
            Ok(c) => out.push(c),
            Err(e) => return s.err(t.span, format!("{}: {e}", s.key_name(key.name()))),
        }
    }
    let printed: Vec<String> = out.iter().map(Cidr::to_string).collect();
    s.print_strings(key.name(), printed.iter().map(String::as_str));
    Ok((out, span))
}

/// `tls_cert` and `tls_key`: both or neither; the files are read, parsed and checked to belong
/// together here, so `check` and a reload see a bad file.
fn tls(s: &mut Section) -> Result<Option<TlsConfig>, ConfigError> {
    let cert = key(
        "tls_cert",
        "PEM certificate chain, leaf first: the proxy listener speaks TLS (ALPN `h2` and `http/1.1`); \
         set with `tls_key`; read again at each reload.",
    )
    .unset("plain HTTP")
    .example("server.pem");
    let key_file = key(
        "tls_key",
        "The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).",
    )
    .unset("plain HTTP")
    .example("server.key");
    let (cert, key) = match (s.text(cert, Kind::Path)?, s.text(key_file, Kind::Path)?) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(one), None) | (None, Some(one)) => {
            return s.err(
                one.span,
                "server.tls_cert and server.tls_key: set both (TLS) or neither (plain HTTP)",
            )
        }
    };
    let (cert_path, cert_pem) = read_file(s, "server.tls_cert", &cert)?;
    let (key_path, key_pem) = read_file(s, "server.tls_key", &key)?;
    let certs = crate::tls::certs(&cert_pem).or_else(|e| {
        s.err(
            cert.span.clone(),
            format!("server.tls_cert: {}: {e}", cert_path.display()),
        )
    })?;
    let private_key = crate::tls::private_key(&key_pem)
        .or_else(|e| s.err(key.span.clone(), format!("server.tls_key: {}: {e}", key_path.display())))?;
    let server = crate::tls::server_config(certs, private_key).or_else(|e| {
        let (key_file, cert_file) = (key_path.display(), cert_path.display());
        s.err(
            key.span.clone(),
            format!("server.tls_key: {key_file} does not fit the certificate in {cert_file}: {e}"),
        )
    })?;
    s.print("tls_cert", quoted(&cert_path.to_string_lossy()));
    s.print("tls_key", quoted(&key_path.to_string_lossy()));
    Ok(Some(TlsConfig {
        digest: digest(&[&cert_pem, &key_pem]),
        cert_path,
        key_path,
        server,
    }))
}

/// A file the config names, and its content; errors name the key and the resolved path.
pub(super) fn read_file(s: &Section, key: &str, path: &Text) -> Result<(PathBuf, Vec<u8>), ConfigError> {
    let path_buf = s.doc().resolve(path.value);
    match std::fs::read(&path_buf) {
        Ok(bytes) => Ok((path_buf, bytes)),
        Err(e) => s.err(
            path.span.clone(),
            format!("{key}: cannot read {}: {e}", path_buf.display()),
        ),
    }
}

/// SHA-256 over the files' contents (length-prefixed): configs compare equal when their files do.
pub(super) fn digest(contents: &[&[u8]]) -> [u8; 32] {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    for content in contents {
        digest.update(&(content.len() as u64).to_be_bytes());
        digest.update(content);
    }
    digest.finish().as_ref().try_into().expect("SHA-256 is 32 bytes")
}

pub(super) fn admin(mut s: Section, server: &ServerConfig) -> Result<AdminConfig, ConfigError> {
    let listen = key(
        "listen",
        "Address of the admin listener; read at start only; must differ from `server.listen`.",
    );
    let token = key(
        "token",
        "Bearer token `POST /backends/*` needs (and, with `protect_reads`, `/backends` and `/debug/route`); \
         never printed.",
    )
    .unset("`POST /backends/*` answers only on a loopback admin listener, 403 elsewhere")
    .example("${MRTR_ADMIN_TOKEN}");
    let protect_reads = key(
        "protect_reads",
        "`true`: `/backends` and `/debug/route` need the token too (needs `token`); `/metrics`, \
         `/healthz` and `/readyz` never do.",
    );
    let max_connections = key(
        "max_connections",
        "Admin connections open at once; one more closes the oldest, so idle clients cannot keep \
         probes and scrapes out.",
    );
    let header_read_timeout = key(
        "header_read_timeout",
        "Time an admin client has to send a request head; also how long an idle admin keep-alive \
         connection stays.",
    );
    let body_read_timeout = key(
        "body_read_timeout",
        "Time an admin client has to send a request body (`POST /debug/route`), else 408.",
    );
    let (listen, span) = s.addr(listen, defaults::ADMIN_LISTEN)?;
    if listen == server.listen {
        return s.err(span, "admin.listen: must differ from server.listen");
    }
    let token = match s.secret(token)? {
        None => None,
        Some(secret) => {
            if secret.value.is_empty() {
                return s.err(secret.span, "admin.token: empty (unset the key to have no token)");
            }
            s.print("token", format!("{}   # value hidden", quoted("<redacted>")));
            Some(AdminSecret::new(secret.value.as_bytes()))
        }
    };
    let protect_reads = s.bool(protect_reads, defaults::ADMIN_PROTECT_READS)?;
    if protect_reads && token.is_none() {
        let span = s.span();
        return s.err(span, "admin.protect_reads: needs admin.token");
    }
    let admin = AdminConfig {
        listen,
        token,
        protect_reads,
        max_connections: s.int(max_connections, defaults::ADMIN_MAX_CONNECTIONS as i64, 1..=100_000)? as usize,
        header_read_timeout: s.duration(header_read_timeout, defaults::ADMIN_HEADER_READ_TIMEOUT)?,
        body_read_timeout: s.duration(body_read_timeout, defaults::ADMIN_BODY_READ_TIMEOUT)?,
    };
    s.finish(true)?;
    Ok(admin)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, crate::config::ConfigError> {
        let backend = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
        Config::parse(Path::new("test.toml"), &format!("{backend}{text}"))
    }

    #[test]
    fn proxy_protocol_needs_its_sources() {
        let c = parse("[server]\nproxy_protocol = true\nproxy_protocol_from = [\"10.1.0.0/16\"]\n").unwrap();
        assert!(c.server.proxy_protocol);
        assert_eq!(c.server.proxy_protocol_from, ["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(Config::parse(Path::new("t.toml"), &c.to_toml()).unwrap(), c);
        let c = parse("").unwrap();
        assert!(!c.server.proxy_protocol && c.server.proxy_protocol_from.is_empty());
        let e = parse("[server]\nproxy_protocol = true\n").unwrap_err().to_string();
        assert!(
            e.contains("server.proxy_protocol: needs server.proxy_protocol_from"),
            "{e}"
        );
        let e = parse("[server]\nproxy_protocol_from = [\"10.0.0.0/33\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.proxy_protocol_from: \"10.0.0.0/33\""), "{e}");
    }
}
