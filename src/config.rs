//! Configuration: the TOML file (DESIGN §7) parsed into raw structs, then checked once and
//! turned into the validated [`Config`] the rest of the router uses.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use serde::Deserialize;
use toml::Spanned;

/// Every default in one place, so docs, `check` output and code agree.
pub mod defaults {
    use std::time::Duration;

    pub const LISTEN: &str = "127.0.0.1:8080";
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    pub const MAX_BODY_BYTES: usize = 1024 * 1024;
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(300);
    pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    pub const MAX_HEADERS: usize = 100;
    pub const ROUTING_HEADER: &str = "Mcp-Routing-Id";
    pub const BODY_FIELD: &str = "messageId";
    pub const VIRTUAL_NODES: usize = 160;
    pub const LOAD_FACTOR: f64 = 0.0;
    pub const PIN_IDLE_TTL: Duration = Duration::from_secs(600);
    pub const SESSION_IDLE_TTL: Duration = Duration::from_secs(3600);
    pub const TASK_IDLE_TTL: Duration = Duration::from_secs(3600);
    pub const REPLAY_WINDOW: Duration = Duration::from_secs(60);
    pub const MAX_ROUNDS: u32 = 32;
    pub const MAX_PINS: usize = 1_000_000;
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
    pub const RETRY_AFTER_SECS: u64 = 1;
    pub const WEIGHT: u32 = 1;
    pub const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
    pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
    pub const UNHEALTHY_AFTER: u32 = 3;
    pub const HEALTHY_AFTER: u32 = 2;
    pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(5);
    pub const TOKEN_TTL: Duration = Duration::from_secs(3600);
    /// Wrapped session ids live as long as a session may: clients keep them from `initialize` on.
    pub const SESSION_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
    /// Opening a TCP connection to a backend (also bounded by `upstream_timeout`).
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Idle keep-alive connections kept per backend, and for how long.
    pub const MAX_IDLE_PER_BACKEND: usize = 1024;
    pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
    /// The longest duration any key accepts: 3650 days (ten years). Deadlines are computed as
    /// `now + duration`, which a longer value (up to `u64::MAX` seconds) would overflow.
    pub const MAX_DURATION: Duration = Duration::from_secs(MAX_DURATION_DAYS * 24 * 3600);
    pub const MAX_DURATION_DAYS: u64 = 3650;
}

/// A configuration problem, with the file and line where it was found when known.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub routing: RoutingConfig,
    pub health: HealthConfig,
    /// `[tokens]`: present when sealed routing tokens are on (DESIGN §5).
    pub tokens: Option<TokensConfig>,
    /// `[discovery]`: backends from DNS, merged with the static ones.
    pub discovery: Option<DiscoveryConfig>,
    /// Static backends; may be empty when discovery is configured.
    pub backends: Vec<BackendConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// Time between active checks of each backend.
    pub interval: Duration,
    /// Deadline of one active check.
    pub timeout: Duration,
    /// `""`: a TCP connect is the check; else an HTTP GET of this path expecting 2xx.
    pub path: String,
    /// Consecutive failures (active or passive) that eject a backend.
    pub unhealthy_after: u32,
    /// Consecutive active successes that re-admit it.
    pub healthy_after: u32,
}

#[derive(Clone, PartialEq)]
pub struct TokensConfig {
    /// HMAC keys: the first signs, all verify.
    pub keys: Vec<Vec<u8>>,
    pub token_ttl: Duration,
    /// Lifetime of wrapped `Mcp-Session-Id` values.
    pub session_ttl: Duration,
}

impl fmt::Debug for TokensConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TokensConfig {{ keys: <{} redacted>, token_ttl: {:?} }}",
            self.keys.len(),
            self.token_ttl
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveryConfig {
    /// DNS name to resolve (A/AAAA records).
    pub host: String,
    pub port: u16,
    pub interval: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Largest request body the router reads to find a key; larger is 413.
    pub max_body_bytes: usize,
    /// Time a client has to send its request headers (HTTP/1): kept by `server::head_timeout`.
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
    /// `tls_cert` + `tls_key`: the proxy listener speaks TLS (HTTP/1.1 and HTTP/2 by ALPN).
    pub tls: Option<TlsConfig>,
}

/// TLS on the proxy listener: the two files, read and checked when the config is loaded, and
/// the rustls server config built from them (see [`crate::tls`]).
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// Request header that carries the client key (lower-cased for lookup).
    pub header: http::HeaderName,
    /// Top-level JSON field that carries the client key when the header is absent.
    pub body_field: String,
    pub virtual_nodes: usize,
    pub load_factor: f64,
    pub pin_idle_ttl: Duration,
    pub session_idle_ttl: Duration,
    pub task_idle_ttl: Duration,
    pub replay_window: Duration,
    pub max_rounds: u32,
    pub max_pins: usize,
    pub on_pin_lost: OnPinLost,
    pub drain_timeout: Duration,
}

/// What to do with a follow-up whose pinned backend is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnPinLost {
    Strict,
    Rehash,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub name: String,
    pub scheme: Scheme,
    pub authority: Authority,
    /// Path prefix of the backend URL without a trailing slash ("" for none).
    pub base_path: String,
    pub weight: u32,
}

impl BackendConfig {
    /// The backend URL as written in the config, normalised.
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

// ---- raw file format ----------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    routing: RawRouting,
    #[serde(default)]
    health: RawHealth,
    tokens: Option<Spanned<RawTokens>>,
    discovery: Option<Spanned<RawDiscovery>>,
    #[serde(default)]
    backend: Vec<Spanned<RawBackend>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    unhealthy_after: Option<Spanned<i64>>,
    healthy_after: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokens {
    keys: Spanned<Vec<Spanned<String>>>,
    token_ttl: Option<Spanned<String>>,
    session_ttl: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    dns: Spanned<String>,
    interval: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<Spanned<String>>,
    max_body_bytes: Option<Spanned<i64>>,
    header_read_timeout: Option<Spanned<String>>,
    body_read_timeout: Option<Spanned<String>>,
    upstream_timeout: Option<Spanned<String>>,
    stream_idle_timeout: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    max_headers: Option<Spanned<i64>>,
    tls_cert: Option<Spanned<String>>,
    tls_key: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    header: Option<Spanned<String>>,
    body_field: Option<Spanned<String>>,
    virtual_nodes: Option<Spanned<i64>>,
    load_factor: Option<Spanned<f64>>,
    pin_idle_ttl: Option<Spanned<String>>,
    session_idle_ttl: Option<Spanned<String>>,
    task_idle_ttl: Option<Spanned<String>>,
    replay_window: Option<Spanned<String>>,
    max_rounds: Option<Spanned<i64>>,
    max_pins: Option<Spanned<i64>>,
    on_pin_lost: Option<Spanned<OnPinLost>>,
    drain_timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: Spanned<String>,
    url: Spanned<String>,
    weight: Option<Spanned<i64>>,
}

// ---- validation ---------------------------------------------------------------------------

/// Turns byte offsets of the file into line numbers for error messages.
struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Checker<'_> {
    fn err<T>(&self, span: Option<std::ops::Range<usize>>, message: impl Into<String>) -> Result<T, ConfigError> {
        let line = span.map(|s| self.text[..s.start.min(self.text.len())].matches('\n').count() + 1);
        Err(ConfigError {
            file: self.file.to_path_buf(),
            line,
            message: message.into(),
        })
    }

    fn duration(&self, key: &str, v: &Option<Spanned<String>>, default: Duration) -> Result<Duration, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        match humantime::parse_duration(v.get_ref().trim()) {
            Ok(d) if d.is_zero() => self.err(Some(v.span()), format!("{key}: must be greater than zero")),
            Ok(d) if d > defaults::MAX_DURATION => self.err(
                Some(v.span()),
                format!("{key}: at most {} days", defaults::MAX_DURATION_DAYS),
            ),
            Ok(d) => Ok(d),
            Err(e) => self.err(
                Some(v.span()),
                format!(
                    "{key}: invalid duration {:?} ({e}); use e.g. \"10s\", \"5m\", \"1h\"",
                    v.get_ref()
                ),
            ),
        }
    }

    fn int(&self, key: &str, v: &Option<Spanned<i64>>, default: i64, min: i64, max: i64) -> Result<i64, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        let n = *v.get_ref();
        if n < min || n > max {
            return self.err(Some(v.span()), format!("{key}: {n} is out of range {min}..={max}"));
        }
        Ok(n)
    }

    fn addr(&self, key: &str, v: &Option<Spanned<String>>, default: &str) -> Result<SocketAddr, ConfigError> {
        let (text, span) = match v {
            Some(v) => (v.get_ref().as_str(), Some(v.span())),
            None => (default, None),
        };
        text.parse()
            .or_else(|_| self.err(span, format!("{key}: {text:?} is not an IP:port address")))
    }

    /// A file the config names: its path (a relative one is taken from the config file's
    /// directory) and its content.
    fn read_file(&self, key: &str, v: &Spanned<String>) -> Result<(PathBuf, Vec<u8>), ConfigError> {
        let path = self.file.parent().unwrap_or(Path::new("")).join(v.get_ref().trim());
        match std::fs::read(&path) {
            Ok(bytes) => Ok((path, bytes)),
            Err(e) => self.err(Some(v.span()), format!("{key}: cannot read {}: {e}", path.display())),
        }
    }

    /// `server.tls_cert` and `server.tls_key`: both or neither; the files are read, parsed and
    /// checked to belong together here, so `check` and a reload see a bad file.
    fn tls(&self, s: &RawServer) -> Result<Option<TlsConfig>, ConfigError> {
        let (cert, key) = match (&s.tls_cert, &s.tls_key) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            (Some(one), None) | (None, Some(one)) => {
                return self.err(
                    Some(one.span()),
                    "server.tls_cert and server.tls_key: set both (TLS) or neither (plain HTTP)",
                )
            }
        };
        let (cert_path, cert_pem) = self.read_file("server.tls_cert", cert)?;
        let (key_path, key_pem) = self.read_file("server.tls_key", key)?;
        let certs = crate::tls::certs(&cert_pem).or_else(|e| {
            self.err(
                Some(cert.span()),
                format!("server.tls_cert: {}: {e}", cert_path.display()),
            )
        })?;
        let private_key = crate::tls::private_key(&key_pem)
            .or_else(|e| self.err(Some(key.span()), format!("server.tls_key: {}: {e}", key_path.display())))?;
        let server = crate::tls::server_config(certs, private_key).or_else(|e| {
            self.err(
                Some(key.span()),
                format!(
                    "server.tls_key: {} does not fit the certificate in {}: {e}",
                    key_path.display(),
                    cert_path.display()
                ),
            )
        })?;
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        for content in [&cert_pem, &key_pem] {
            digest.update((content.len() as u64).to_be_bytes());
            digest.update(content);
        }
        Ok(Some(TlsConfig {
            cert_path,
            key_path,
            server,
            digest: digest.finalize().into(),
        }))
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(path, &Config::read_text(path)?)
    }

    /// Reads a config file's text, with an error naming the file.
    pub fn read_text(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read: {e}"),
        })
    }

    /// Validates config text; `path` is only used in error messages.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let c = Checker { file: path, text };
        let raw: RawFile = match toml::from_str(text) {
            Ok(raw) => raw,
            Err(e) => return c.err(e.span(), e.message().to_string()),
        };
        let s = &raw.server;
        let server = ServerConfig {
            listen: c.addr("server.listen", &s.listen, defaults::LISTEN)?,
            max_body_bytes: c.int(
                "server.max_body_bytes",
                &s.max_body_bytes,
                defaults::MAX_BODY_BYTES as i64,
                64,
                1 << 30,
            )? as usize,
            header_read_timeout: c.duration(
                "server.header_read_timeout",
                &s.header_read_timeout,
                defaults::HEADER_READ_TIMEOUT,
            )?,
            body_read_timeout: c.duration(
                "server.body_read_timeout",
                &s.body_read_timeout,
                defaults::BODY_READ_TIMEOUT,
            )?,
            upstream_timeout: c.duration(
                "server.upstream_timeout",
                &s.upstream_timeout,
                defaults::UPSTREAM_TIMEOUT,
            )?,
            stream_idle_timeout: c.duration(
                "server.stream_idle_timeout",
                &s.stream_idle_timeout,
                defaults::STREAM_IDLE_TIMEOUT,
            )?,
            shutdown_grace: c.duration("server.shutdown_grace", &s.shutdown_grace, defaults::SHUTDOWN_GRACE)?,
            max_headers: c.int(
                "server.max_headers",
                &s.max_headers,
                defaults::MAX_HEADERS as i64,
                16,
                10_000,
            )? as usize,
            tls: c.tls(s)?,
        };
        if server.stream_idle_timeout < Duration::from_secs(60) {
            let span = s.stream_idle_timeout.as_ref().map(|v| v.span());
            return c.err(
                span,
                "server.stream_idle_timeout: must be at least 60s (MCP streams idle between events)",
            );
        }
        let admin = AdminConfig {
            listen: c.addr("admin.listen", &raw.admin.listen, defaults::ADMIN_LISTEN)?,
        };
        if admin.listen == server.listen {
            return c.err(
                raw.admin.listen.as_ref().map(|v| v.span()),
                "admin.listen: must differ from server.listen",
            );
        }
        let r = &raw.routing;
        let header_text = r
            .header
            .as_ref()
            .map(|v| v.get_ref().as_str())
            .unwrap_or(defaults::ROUTING_HEADER);
        let header = http::HeaderName::from_bytes(header_text.as_bytes()).or_else(|_| {
            c.err(
                r.header.as_ref().map(|v| v.span()),
                format!("routing.header: {header_text:?} is not a valid header name"),
            )
        })?;
        let body_field = r
            .body_field
            .as_ref()
            .map(|v| v.get_ref().clone())
            .unwrap_or_else(|| defaults::BODY_FIELD.to_string());
        if body_field.is_empty() {
            return c.err(
                r.body_field.as_ref().map(|v| v.span()),
                "routing.body_field: must not be empty",
            );
        }
        let load_factor = r
            .load_factor
            .as_ref()
            .map(|v| *v.get_ref())
            .unwrap_or(defaults::LOAD_FACTOR);
        if !(load_factor == 0.0 || (load_factor > 1.0 && load_factor.is_finite())) {
            return c.err(
                r.load_factor.as_ref().map(|v| v.span()),
                "routing.load_factor: must be 0 (off) or greater than 1.0, e.g. 1.25",
            );
        }
        let routing = RoutingConfig {
            header,
            body_field,
            virtual_nodes: c.int(
                "routing.virtual_nodes",
                &r.virtual_nodes,
                defaults::VIRTUAL_NODES as i64,
                160,
                10_000,
            )? as usize,
            load_factor,
            pin_idle_ttl: c.duration("routing.pin_idle_ttl", &r.pin_idle_ttl, defaults::PIN_IDLE_TTL)?,
            session_idle_ttl: c.duration(
                "routing.session_idle_ttl",
                &r.session_idle_ttl,
                defaults::SESSION_IDLE_TTL,
            )?,
            task_idle_ttl: c.duration("routing.task_idle_ttl", &r.task_idle_ttl, defaults::TASK_IDLE_TTL)?,
            replay_window: c.duration("routing.replay_window", &r.replay_window, defaults::REPLAY_WINDOW)?,
            max_rounds: c.int(
                "routing.max_rounds",
                &r.max_rounds,
                defaults::MAX_ROUNDS as i64,
                1,
                1_000_000,
            )? as u32,
            max_pins: c.int("routing.max_pins", &r.max_pins, defaults::MAX_PINS as i64, 1, 1 << 32)? as usize,
            on_pin_lost: r
                .on_pin_lost
                .as_ref()
                .map(|v| *v.get_ref())
                .unwrap_or(OnPinLost::Strict),
            drain_timeout: c.duration("routing.drain_timeout", &r.drain_timeout, defaults::DRAIN_TIMEOUT)?,
        };
        let mut backends: Vec<BackendConfig> = Vec::with_capacity(raw.backend.len());
        for b in &raw.backend {
            let span = Some(b.span());
            let b = b.get_ref();
            let name = b.name.get_ref().trim().to_string();
            if name.is_empty() || name.len() > 128 || name.chars().any(|ch| ch.is_control() || ch == ',') {
                return c.err(
                    Some(b.name.span()),
                    "backend.name: must be 1-128 printable characters without commas",
                );
            }
            if backends.iter().any(|o| o.name == name) {
                return c.err(Some(b.name.span()), format!("backend.name: {name:?} is defined twice"));
            }
            let uri: http::Uri = b.url.get_ref().parse().or_else(|_| {
                c.err(
                    Some(b.url.span()),
                    format!("backend.url: {:?} is not a URL", b.url.get_ref()),
                )
            })?;
            let scheme = match uri.scheme() {
                Some(s) if *s == Scheme::HTTP => s.clone(),
                Some(s) if *s == Scheme::HTTPS => {
                    return c.err(
                        Some(b.url.span()),
                        format!("backend.url: scheme {s} is not supported yet; use http://"),
                    )
                }
                _ => return c.err(Some(b.url.span()), "backend.url: must start with http://"),
            };
            let Some(authority) = uri.authority().cloned() else {
                return c.err(Some(b.url.span()), "backend.url: needs a host and port");
            };
            if uri.query().is_some() {
                return c.err(Some(b.url.span()), "backend.url: must not carry a query");
            }
            let base_path = uri.path().trim_end_matches('/').to_string();
            let weight = c.int("backend.weight", &b.weight, defaults::WEIGHT as i64, 0, 1000)? as u32;
            let _ = span;
            backends.push(BackendConfig {
                name,
                scheme,
                authority,
                base_path,
                weight,
            });
        }
        let h = &raw.health;
        let health = HealthConfig {
            interval: c.duration("health.interval", &h.interval, defaults::HEALTH_INTERVAL)?,
            timeout: c.duration("health.timeout", &h.timeout, defaults::HEALTH_TIMEOUT)?,
            path: h.path.as_ref().map(|p| p.get_ref().clone()).unwrap_or_default(),
            unhealthy_after: c.int(
                "health.unhealthy_after",
                &h.unhealthy_after,
                defaults::UNHEALTHY_AFTER as i64,
                1,
                1000,
            )? as u32,
            healthy_after: c.int(
                "health.healthy_after",
                &h.healthy_after,
                defaults::HEALTHY_AFTER as i64,
                1,
                1000,
            )? as u32,
        };
        if let Some(p) = &h.path {
            if !(p.get_ref().is_empty()
                || p.get_ref().starts_with('/') && p.get_ref().parse::<http::uri::PathAndQuery>().is_ok())
            {
                return c.err(
                    Some(p.span()),
                    "health.path: must be \"\" (TCP connect) or an absolute path like \"/healthz\"",
                );
            }
        }
        let tokens = match &raw.tokens {
            None => None,
            Some(t) => {
                let t = t.get_ref();
                let mut keys = Vec::new();
                for (i, k) in t.keys.get_ref().iter().enumerate() {
                    let value =
                        expand_env(k.get_ref()).or_else(|e| c.err(Some(k.span()), format!("tokens.keys[{i}]: {e}")))?;
                    if value.len() < crate::token::MIN_KEY_LEN {
                        return c.err(
                            Some(k.span()),
                            format!(
                                "tokens.keys[{i}]: a key needs at least {} bytes (has {})",
                                crate::token::MIN_KEY_LEN,
                                value.len()
                            ),
                        );
                    }
                    keys.push(value.into_bytes());
                }
                if keys.is_empty() {
                    return c.err(Some(t.keys.span()), "tokens.keys: at least one key is required");
                }
                let tokens = TokensConfig {
                    keys,
                    token_ttl: c.duration("tokens.token_ttl", &t.token_ttl, defaults::TOKEN_TTL)?,
                    session_ttl: c.duration("tokens.session_ttl", &t.session_ttl, defaults::SESSION_TOKEN_TTL)?,
                };
                // The sealing keys are built here once to check everything they check.
                if let Err(e) = crate::sealing::Sealing::new(&tokens) {
                    return c.err(Some(t.keys.span()), e);
                }
                Some(tokens)
            }
        };
        let discovery = match &raw.discovery {
            None => None,
            Some(d) => {
                let d = d.get_ref();
                let text = d.dns.get_ref().trim();
                let Some((host, port)) = text
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                else {
                    return c.err(
                        Some(d.dns.span()),
                        format!("discovery.dns: {text:?} must be \"name:port\""),
                    );
                };
                if host.is_empty() || port == 0 {
                    return c.err(
                        Some(d.dns.span()),
                        format!("discovery.dns: {text:?} must be \"name:port\""),
                    );
                }
                Some(DiscoveryConfig {
                    host: host.trim_matches(['[', ']']).to_string(),
                    port,
                    interval: c.duration("discovery.interval", &d.interval, defaults::DISCOVERY_INTERVAL)?,
                })
            }
        };
        if backends.is_empty() && discovery.is_none() {
            return c.err(
                None,
                "no [[backend]] configured: at least one backend (or [discovery]) is required",
            );
        }
        Ok(Config {
            server,
            admin,
            routing,
            health,
            tokens,
            discovery,
            backends,
        })
    }

    /// The effective configuration as TOML, every default spelled out (for `check`). Strings
    /// are written as TOML strings (quotes, backslashes and control characters escaped), so
    /// the output loads back as the same config (but for token keys, which are never printed).
    pub fn to_toml(&self) -> String {
        use std::fmt::Write;
        let d = |d: Duration| quoted(&humantime::format_duration(d).to_string());
        let s = &self.server;
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "[server]");
        let _ = writeln!(out, "listen = {}", quoted(&s.listen.to_string()));
        let _ = writeln!(out, "max_body_bytes = {}", s.max_body_bytes);
        let _ = writeln!(out, "header_read_timeout = {}", d(s.header_read_timeout));
        let _ = writeln!(out, "body_read_timeout = {}", d(s.body_read_timeout));
        let _ = writeln!(out, "upstream_timeout = {}", d(s.upstream_timeout));
        let _ = writeln!(out, "stream_idle_timeout = {}", d(s.stream_idle_timeout));
        let _ = writeln!(out, "shutdown_grace = {}", d(s.shutdown_grace));
        let _ = writeln!(out, "max_headers = {}", s.max_headers);
        if let Some(tls) = &s.tls {
            let _ = writeln!(out, "tls_cert = {}", quoted(&tls.cert_path.to_string_lossy()));
            let _ = writeln!(out, "tls_key = {}", quoted(&tls.key_path.to_string_lossy()));
        }
        let _ = writeln!(out, "\n[admin]\nlisten = {}", quoted(&self.admin.listen.to_string()));
        let r = &self.routing;
        let _ = writeln!(out, "\n[routing]");
        let _ = writeln!(out, "header = {}", quoted(r.header.as_str()));
        let _ = writeln!(out, "body_field = {}", quoted(&r.body_field));
        let _ = writeln!(out, "virtual_nodes = {}", r.virtual_nodes);
        let _ = writeln!(out, "load_factor = {}", r.load_factor);
        let _ = writeln!(out, "pin_idle_ttl = {}", d(r.pin_idle_ttl));
        let _ = writeln!(out, "session_idle_ttl = {}", d(r.session_idle_ttl));
        let _ = writeln!(out, "task_idle_ttl = {}", d(r.task_idle_ttl));
        let _ = writeln!(out, "replay_window = {}", d(r.replay_window));
        let _ = writeln!(out, "max_rounds = {}", r.max_rounds);
        let _ = writeln!(out, "max_pins = {}", r.max_pins);
        let on_pin_lost = match r.on_pin_lost {
            OnPinLost::Strict => "strict",
            OnPinLost::Rehash => "rehash",
        };
        let _ = writeln!(out, "on_pin_lost = {}", quoted(on_pin_lost));
        let _ = writeln!(out, "drain_timeout = {}", d(r.drain_timeout));
        let h = &self.health;
        let _ = writeln!(out, "\n[health]");
        let _ = writeln!(out, "interval = {}", d(h.interval));
        let _ = writeln!(out, "timeout = {}", d(h.timeout));
        let _ = writeln!(out, "path = {}", quoted(&h.path));
        let _ = writeln!(out, "unhealthy_after = {}", h.unhealthy_after);
        let _ = writeln!(out, "healthy_after = {}", h.healthy_after);
        if let Some(t) = &self.tokens {
            let hidden = vec![quoted("<redacted>"); t.keys.len()].join(", ");
            let _ = writeln!(out, "\n[tokens]\nkeys = [{hidden}]   # values hidden");
            let _ = writeln!(out, "token_ttl = {}", d(t.token_ttl));
            let _ = writeln!(out, "session_ttl = {}", d(t.session_ttl));
        }
        if let Some(disc) = &self.discovery {
            let host = if disc.host.contains(':') {
                format!("[{}]", disc.host)
            } else {
                disc.host.clone()
            };
            let _ = writeln!(out, "\n[discovery]");
            let _ = writeln!(out, "dns = {}", quoted(&format!("{host}:{}", disc.port)));
            let _ = writeln!(out, "interval = {}", d(disc.interval));
        }
        for b in &self.backends {
            let _ = writeln!(out, "\n[[backend]]");
            let _ = writeln!(out, "name = {}", quoted(&b.name));
            let _ = writeln!(out, "url = {}", quoted(&b.url()));
            let _ = writeln!(out, "weight = {}", b.weight);
        }
        out
    }
}

/// `text` as a TOML string, escaped as TOML needs.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// Replaces `${NAME}` with the environment variable NAME (which must be set).
fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start + 2..].find('}') else {
            return Err("unterminated ${".into());
        };
        let name = &rest[start + 2..start + 2 + len];
        out.push_str(&std::env::var(name).map_err(|_| format!("environment variable {name} is not set"))?);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), text)
    }

    const ONE: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";

    #[test]
    fn defaults_apply() {
        let c = parse(ONE).unwrap();
        assert_eq!(c.routing.virtual_nodes, 160);
        assert_eq!(c.routing.header.as_str(), "mcp-routing-id");
        assert_eq!(c.backends[0].weight, 1);
        assert_eq!(c.server.max_body_bytes, 1 << 20);
        // The printed effective config parses back to the same config.
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn tokens_discovery_and_health_sections() {
        std::env::set_var("MRTR_TEST_TOKEN_KEY", "k".repeat(40));
        let c = parse(&format!(
            "{ONE}[tokens]\nkeys = [\"${{MRTR_TEST_TOKEN_KEY}}\", \"{}\"]\ntoken_ttl = \"5m\"\n[discovery]\ndns = \"mcp.svc:8000\"\n[health]\npath = \"/healthz\"\n",
            "o".repeat(32)
        ))
        .unwrap();
        let t = c.tokens.as_ref().unwrap();
        assert_eq!(
            (t.keys[0].len(), t.keys.len(), t.token_ttl),
            (40, 2, Duration::from_secs(300))
        );
        let d = c.discovery.as_ref().unwrap();
        assert_eq!((d.host.as_str(), d.port), ("mcp.svc", 8000));
        assert_eq!(c.health.path, "/healthz");
        assert!(!format!("{t:?}").contains("kkkk"), "keys never printed");
        // Discovery alone is enough; no static backend needed.
        assert!(parse("[discovery]\ndns = \"mcp.svc:8000\"\n")
            .unwrap()
            .backends
            .is_empty());
    }

    #[test]
    fn errors_name_key_and_line() {
        let e = parse(&format!("{ONE}[routing]\npin_idle_ttl = \"ten\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("routing.pin_idle_ttl"), "{e}");
        let e = parse(&format!("{ONE}[routing]\nbogus = 1\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = parse("[[backend]]\nname = \"a\"\nurl = \"ftp://x\"\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        let e = parse(&format!("{ONE}{ONE}")).unwrap_err();
        assert!(e.to_string().contains("defined twice"), "{e}");
        assert!(parse("").unwrap_err().to_string().contains("no [[backend]]"));
        let e = parse(&format!("{ONE}[routing]\nvirtual_nodes = 10\n")).unwrap_err();
        assert!(e.to_string().contains("virtual_nodes"), "{e}");
        let e = parse(&format!("{ONE}[tokens]\nkeys = [\"short\"]\n")).unwrap_err();
        assert!(e.to_string().contains("tokens.keys[0]") && e.line == Some(5), "{e}");
        let e = parse(&format!("{ONE}[tokens]\nkeys = [\"${{MRTR_SURELY_UNSET_VAR}}\"]\n")).unwrap_err();
        assert!(e.to_string().contains("MRTR_SURELY_UNSET_VAR"), "{e}");
        let e = parse(&format!("{ONE}[discovery]\ndns = \"workers\"\n")).unwrap_err();
        assert!(e.to_string().contains("name:port"), "{e}");
        let e = parse(&format!("{ONE}[health]\npath = \"healthz\"\n")).unwrap_err();
        assert!(e.to_string().contains("health.path"), "{e}");
    }

    #[test]
    fn the_printed_config_escapes_strings_and_loads_back_the_same() {
        let c = parse(
            "[routing]\nbody_field = 'say \"hi\" \\ bye'\nload_factor = 1.25\n[discovery]\ndns = \"[::1]:8000\"\n\
             [[backend]]\nname = 'a\"b\\c \\\" d'\nurl = \"http://127.0.0.1:9001/p\"\nweight = 3\n",
        )
        .unwrap();
        assert_eq!(c.backends[0].name, r#"a"b\c \" d"#);
        assert_eq!(c.routing.body_field, r#"say "hi" \ bye"#);
        let printed = c.to_toml();
        let again = parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again, c, "{printed}");
        // And what it printed is a TOML document on its own.
        let doc: toml::Table = printed.parse().unwrap();
        assert_eq!(doc["backend"][0]["name"].as_str(), Some(r#"a"b\c \" d"#));
    }

    #[test]
    fn durations_are_capped_at_ten_years() {
        let e = parse(&format!("{ONE}[routing]\ndrain_timeout = \"18446744073709551615s\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.to_string().contains("routing.drain_timeout: at most 3650 days"),
            "{e}"
        );
        let e = parse(&format!("{ONE}[server]\nupstream_timeout = \"3651days\"\n")).unwrap_err();
        assert!(
            e.to_string().contains("server.upstream_timeout: at most 3650 days"),
            "{e}"
        );
        // The maximum itself is accepted, and prints back to the same value.
        let c = parse(&format!("{ONE}[routing]\ndrain_timeout = \"3650days\"\n")).unwrap();
        assert_eq!(c.routing.drain_timeout, defaults::MAX_DURATION);
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        let c = parse(&format!(
            "{ONE}[routing]\ndrain_timeout = \"{}s\"\n",
            defaults::MAX_DURATION.as_secs()
        ))
        .unwrap();
        assert_eq!(c.routing.drain_timeout, defaults::MAX_DURATION);
    }
}
