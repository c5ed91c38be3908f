//! `[upstream]`: how the router reaches its backends, every backend unless `[[backend]]`
//! overrides it: the roots that verify `https://` backends (`tls_ca`, else the system trust
//! store), the client certificate for mTLS, HTTP/2, and how long a pooled connection may idle.
//!
//! The files are read, parsed and checked here, so `check` and a reload see a bad one; the
//! rustls client configs are built once every backend is read, and only when a backend (or
//! `[discovery]`) is `https`: a plain-HTTP fleet never reads the system trust store.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::reader::{key, quoted, Doc, Section};
use super::reference::Kind;
use super::server::{digest, read_file};
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// HTTP/2 to backends (ALPN `h2` on `https://`, prior knowledge on `http://`), unless a
    /// `[[backend]]` says otherwise.
    pub http2: bool,
    /// A pooled connection idle this long is closed, never used again.
    pub idle_timeout: Duration,
    /// HTTP/1.1 connections open to one backend at most.
    pub max_connections_per_backend: usize,
    /// How long a request waits for a connection of a backend at that cap.
    pub queue_timeout: Duration,
    /// Whether a request that cannot have changed state is tried once more on the next backend.
    pub retry: Retry,
    /// Retries at most this share of requests over the last 10 s (with a floor).
    pub retry_budget: f64,
    pub tls: UpstreamTls,
}

/// `upstream.retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// What cannot have changed state (a connect that never completed), and what may run twice.
    Idempotent,
    Off,
}

/// What verifies `https://` backends and what the router presents to them.
#[derive(Clone)]
pub struct UpstreamTls {
    /// `tls_ca`, resolved against the config file's directory; `None`: the system trust store.
    pub ca_path: Option<PathBuf>,
    /// `tls_client_cert` and `tls_client_key`, resolved.
    pub client_cert_path: Option<PathBuf>,
    pub client_key_path: Option<PathBuf>,
    /// The CA file's certificates (empty without `tls_ca`).
    ca: Vec<CertificateDer<'static>>,
    client_auth: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    /// The client configs, built when some backend needs TLS.
    pub clients: Option<Arc<TlsClients>>,
    /// SHA-256 over the files' contents and the roots in use: configs compare equal when those do.
    digest: [u8; 32],
}

/// The rustls client configs for backends: one per ALPN offer. Each backend clones the one it
/// needs with a session-resumption cache of its own.
#[derive(Debug)]
pub struct TlsClients {
    /// ALPN `http/1.1`.
    pub http1: Arc<rustls::ClientConfig>,
    /// ALPN `h2`.
    pub http2: Arc<rustls::ClientConfig>,
    /// Roots it trusts, and where they came from (for `check` and logs).
    pub roots: usize,
    pub from_system: bool,
}

impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.ca_path,
            &self.client_cert_path,
            &self.client_key_path,
            self.digest,
        ) == (
            &other.ca_path,
            &other.client_cert_path,
            &other.client_key_path,
            other.digest,
        )
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("ca_path", &self.ca_path)
            .field("client_cert_path", &self.client_cert_path)
            .field("client_key_path", &self.client_key_path)
            .field("clients", &self.clients.as_ref().map(|c| c.roots))
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// Whether the config names files (or uses the system store) whose content a reload must
    /// read again even when the config text is unchanged.
    pub fn reads_files(&self) -> bool {
        self.ca_path.is_some() || self.client_cert_path.is_some() || self.clients.is_some()
    }
}

pub(super) fn upstream(mut s: Section) -> Result<UpstreamConfig, ConfigError> {
    let http2 = key(
        "http2",
        "`true`: HTTP/2 to every backend (ALPN `h2` on `https://`, prior knowledge on `http://`) unless \
         its `[[backend]]` says otherwise.",
    );
    let idle_timeout = key(
        "idle_timeout",
        "A pooled connection idle this long is closed, never used again (below the 5 s keep-alive of \
         uvicorn and Node).",
    );
    let max_connections_per_backend = key(
        "max_connections_per_backend",
        "HTTP/1.1 connections open to one backend at most, idle or busy (each open SSE stream holds \
         one); past it, a request waits for one.",
    );
    let queue_timeout = key(
        "queue_timeout",
        "How long a request waits for a connection of a backend at that cap before it is answered 503 \
         `upstream_busy` (`server.upstream_timeout` bounds the wait too).",
    );
    let retry = key(
        "retry",
        "`idempotent`: a request whose backend refused the connection (or failed its TLS handshake), \
         which it cannot have seen, is tried once on the next backend of the ring, unless pinned; so is a \
         first round that may run twice (a `ping`, a list, a `tools/call` of a tool the catalog knows as \
         `readOnlyHint` or `idempotentHint`) whose backend failed after it was sent, unless pinned, in a \
         session or a batch; `off`: never.",
    );
    let retry_budget = key(
        "retry_budget",
        "Retries at most this share of the requests forwarded over the last 10 s (at least 10 in that \
         window); past it a request gets its first backend's 502.",
    );
    let tls = tls_files(&mut s)?;
    let http2 = s.bool(http2, defaults::UPSTREAM_HTTP2)?;
    let retry = s.choice(
        retry,
        defaults::UPSTREAM_RETRY,
        &[("idempotent", Retry::Idempotent), ("off", Retry::Off)],
    )?;
    let retry_budget = s.float(
        retry_budget,
        defaults::RETRY_BUDGET,
        |f| (0.0..=1.0).contains(&f),
        "from 0 to 1",
    )?;
    let idle_timeout = s.duration(idle_timeout, defaults::UPSTREAM_IDLE_TIMEOUT)?;
    let max_connections_per_backend = s.int(
        max_connections_per_backend,
        defaults::MAX_CONNECTIONS_PER_BACKEND as i64,
        1..=1_000_000,
    )? as usize;
    let queue_timeout = s.duration(queue_timeout, defaults::UPSTREAM_QUEUE_TIMEOUT)?;
    s.finish(true)?;
    Ok(UpstreamConfig {
        http2,
        idle_timeout,
        max_connections_per_backend,
        queue_timeout,
        retry,
        retry_budget,
        tls,
    })
}

/// `tls_ca`, `tls_client_cert` and `tls_client_key`: read, parsed and checked (the client
/// certificate and key both or neither, and belonging together).
fn tls_files(s: &mut Section) -> Result<UpstreamTls, ConfigError> {
    let tls_ca = key("tls_ca", "PEM bundle of the roots that verify `https://` backends.")
        .unset("the system trust store")
        .example("backends-ca.pem");
    let tls_client_cert = key(
        "tls_client_cert",
        "PEM certificate chain the router presents to backends that ask for one (mTLS); set with \
         `tls_client_key`.",
    )
    .unset("no client certificate")
    .example("router.pem");
    let tls_client_key = key(
        "tls_client_key",
        "The private key of `tls_client_cert` (PEM: PKCS#8, PKCS#1 or SEC1).",
    )
    .unset("no client certificate")
    .example("router.key");
    let mut contents: Vec<Vec<u8>> = Vec::new();
    let (mut ca_path, mut ca) = (None, Vec::new());
    if let Some(text) = s.text(tls_ca, Kind::Path)? {
        let (path, pem) = read_file(s, "upstream.tls_ca", &text)?;
        ca = crate::tls::certs(&pem)
            .or_else(|e| s.err(text.span.clone(), format!("upstream.tls_ca: {}: {e}", path.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &ca {
            if let Err(e) = roots.add(cert.clone()) {
                return s.err(
                    text.span.clone(),
                    format!(
                        "upstream.tls_ca: {}: a certificate in it is no CA root: {e}",
                        path.display()
                    ),
                );
            }
        }
        s.print("tls_ca", quoted(&path.to_string_lossy()));
        contents.push(pem);
        ca_path = Some(path);
    } else {
        s.print_comment("tls_ca unset: https:// backends are verified against the system trust store");
    }
    let (cert, key) = match (
        s.text(tls_client_cert, Kind::Path)?,
        s.text(tls_client_key, Kind::Path)?,
    ) {
        (None, None) => (None, None),
        (Some(cert), Some(key)) => (Some(cert), Some(key)),
        (Some(one), None) | (None, Some(one)) => {
            return s.err(
                one.span,
                "upstream.tls_client_cert and upstream.tls_client_key: set both (mTLS) or neither",
            )
        }
    };
    let (mut client_cert_path, mut client_key_path, mut client_auth) = (None, None, None);
    if let (Some(cert), Some(key)) = (cert, key) {
        let (cert_path, cert_pem) = read_file(s, "upstream.tls_client_cert", &cert)?;
        let (key_path, key_pem) = read_file(s, "upstream.tls_client_key", &key)?;
        let chain = crate::tls::certs(&cert_pem).or_else(|e| {
            s.err(
                cert.span.clone(),
                format!("upstream.tls_client_cert: {}: {e}", cert_path.display()),
            )
        })?;
        let private_key = crate::tls::private_key(&key_pem).or_else(|e| {
            s.err(
                key.span.clone(),
                format!("upstream.tls_client_key: {}: {e}", key_path.display()),
            )
        })?;
        // Built once with no roots, only to check that the key fits the certificate.
        if let Err(e) = crate::tls::client_config(
            rustls::RootCertStore::empty(),
            Some((chain.clone(), private_key.clone_key())),
        ) {
            let (key_file, cert_file) = (key_path.display(), cert_path.display());
            return s.err(
                key.span.clone(),
                format!("upstream.tls_client_key: {key_file} does not fit the certificate in {cert_file}: {e}"),
            );
        }
        s.print("tls_client_cert", quoted(&cert_path.to_string_lossy()));
        s.print("tls_client_key", quoted(&key_path.to_string_lossy()));
        contents.push(cert_pem);
        contents.push(key_pem);
        (client_cert_path, client_key_path, client_auth) =
            (Some(cert_path), Some(key_path), Some(Arc::new((chain, private_key))));
    }
    let contents: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
    Ok(UpstreamTls {
        ca_path,
        client_cert_path,
        client_key_path,
        ca,
        client_auth,
        clients: None,
        digest: digest(&contents),
    })
}

/// Builds the client configs when `needed` (some backend, or discovery, is `https`): roots from
/// `tls_ca`, else from the system trust store (read here, so `check` and reloads see it).
pub(super) fn build_clients(doc: &Doc, tls: &mut UpstreamTls, needed: bool) -> Result<(), ConfigError> {
    if !needed {
        return Ok(());
    }
    let mut roots = rustls::RootCertStore::empty();
    let from_system = tls.ca_path.is_none();
    if from_system {
        let found = rustls_native_certs::load_native_certs();
        let (added, _ignored) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = match found.errors.first() {
                Some(e) => format!(" ({e})"),
                None => String::new(),
            };
            return doc.err(
                None,
                format!(
                    "upstream.tls_ca: unset, and the system trust store has no certificate{why}: \
                     set upstream.tls_ca to a PEM bundle, or SSL_CERT_FILE / SSL_CERT_DIR"
                ),
            );
        }
        // A renewed system store is a changed config, as a renewed CA file is.
        let mut parts: Vec<&[u8]> = vec![&tls.digest];
        parts.extend(roots.roots.iter().map(|r| r.subject.as_ref()));
        parts.extend(roots.roots.iter().map(|r| r.subject_public_key_info.as_ref()));
        tls.digest = digest(&parts);
    } else {
        for cert in &tls.ca {
            // Checked when the file was read.
            let _ = roots.add(cert.clone());
        }
    }
    let n = roots.len();
    let build = |http2: bool| -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        let auth = tls.client_auth.as_ref().map(|a| (a.0.clone(), a.1.clone_key()));
        let mut config = crate::tls::client_config(roots.clone(), auth)
            .or_else(|e| doc.err(None, format!("upstream: cannot build the TLS client: {e}")))?;
        config.alpn_protocols = crate::tls::client_alpn(http2);
        Ok(Arc::new(config))
    };
    tls.clients = Some(Arc::new(TlsClients {
        http1: build(false)?,
        http2: build(true)?,
        roots: n,
        from_system,
    }));
    Ok(())
}
