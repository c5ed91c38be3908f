//! The fleet: `[[backend]]`, `[discovery]` and `[health]`.

use std::time::Duration;

use http::uri::{Authority, Scheme};

use super::reader::{key, quoted, Key, Section};
use super::reference::Kind;
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub name: String,
    pub scheme: Scheme,
    pub authority: Authority,
    /// Path prefix of the backend URL without a trailing slash ("" for none).
    pub base_path: String,
    pub weight: u32,
    /// `http2`: HTTP/2 to this backend; `None` follows `[upstream] http2`.
    pub http2: Option<bool>,
    /// `tls_server_name`: the name sent as SNI and checked in the certificate of an `https://`
    /// backend, when not the URL's host.
    pub tls_server_name: Option<String>,
}

impl BackendConfig {
    /// The backend URL as written in the config, normalised.
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveryConfig {
    /// DNS name to resolve (A/AAAA records).
    pub host: String,
    pub port: u16,
    pub interval: Duration,
    /// `scheme`: `http`, or `https` for TLS to the discovered backends.
    pub scheme: Scheme,
    /// `tls_server_name`: the name the discovered backends' certificates are checked against
    /// (they are reached by IP); default the `dns` name. Only with `https`.
    pub tls_server_name: Option<String>,
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

/// One `[[backend]]`; `others` are the ones read before it (names are unique); `upstream_http2`
/// is what `http2` means when unset.
pub(super) fn backend(
    mut s: Section,
    others: &[BackendConfig],
    upstream_http2: bool,
) -> Result<BackendConfig, ConfigError> {
    let name = key(
        "name",
        "Unique name, 1 to 128 bytes of printable characters without commas (no control, format or separator characters but the space); pins and tokens refer to backends by name.",
    )
    .example("worker-1");
    let url = key(
        "url",
        "`http://host:port[/prefix]` or `https://...`; the request's path and query are appended as received.",
    )
    .example("http://127.0.0.1:9001");
    let weight = key(
        "weight",
        "Share of the ring; 0 takes no new keys but keeps serving the calls pinned to it.",
    );
    let http2 = key("http2", "HTTP/2 to this backend, or not.")
        .unset("as `upstream.http2`")
        .example("true");
    let tls_server_name_key = key(
        "tls_server_name",
        "`https://` only: the name sent as SNI and checked in the backend's certificate (for a backend \
         reached by IP).",
    )
    .unset("the URL's host")
    .example("mcp.internal");
    let name = s.required(name, Kind::String)?;
    let name_span = name.span.clone();
    let name = name.value.trim().to_string();
    if name.is_empty() || name.len() > 128 || !super::printable(&name) || name.contains(',') {
        return s.err(
            name_span,
            "backend.name: must be 1 to 128 bytes of printable characters without commas",
        );
    }
    if others.iter().any(|o| o.name == name) {
        return s.err(name_span, format!("backend.name: {name:?} is defined twice"));
    }
    s.print("name", quoted(&name));
    let url = s.required(url, Kind::Url)?;
    let Ok(uri) = url.value.parse::<http::Uri>() else {
        return s.err(url.span, format!("backend.url: {:?} is not a URL", url.value));
    };
    let scheme = match uri.scheme() {
        Some(sc) if *sc == Scheme::HTTP || *sc == Scheme::HTTPS => sc.clone(),
        _ => return s.err(url.span, "backend.url: must start with http:// or https://"),
    };
    let Some(authority) = uri.authority().cloned() else {
        return s.err(url.span, "backend.url: needs a host and port");
    };
    if uri.query().is_some() {
        return s.err(url.span, "backend.url: must not carry a query");
    }
    let backend = BackendConfig {
        name,
        scheme,
        authority,
        base_path: uri.path().trim_end_matches('/').to_string(),
        weight: 0,
        http2: None,
        tls_server_name: None,
    };
    s.print("url", quoted(&backend.url()));
    let weight = s.int(weight, defaults::WEIGHT as i64, 0..=1000)? as u32;
    let http2 = s.maybe_bool(http2)?;
    match http2 {
        Some(on) => s.print("http2", on),
        None => s.print_comment(&format!("http2 = {upstream_http2} (from [upstream])")),
    }
    let tls_server_name = tls_server_name(&mut s, tls_server_name_key, &backend.scheme)?;
    s.finish(true)?;
    Ok(BackendConfig {
        weight,
        http2,
        tls_server_name,
        ..backend
    })
}

/// `tls_server_name` of `[[backend]]` or `[discovery]`: a DNS name or an IP address, and only
/// where the scheme is `https`; printed when set.
fn tls_server_name(s: &mut Section, key: Key, scheme: &Scheme) -> Result<Option<String>, ConfigError> {
    let Some(name) = s.text(key, Kind::ServerName)? else {
        return Ok(None);
    };
    let value = name.value.trim();
    let key_name = s.key_name("tls_server_name");
    if *scheme != Scheme::HTTPS {
        return s.err(name.span, format!("{key_name}: only for https:// (TLS) backends"));
    }
    if rustls::pki_types::ServerName::try_from(value).is_err() {
        return s.err(
            name.span,
            format!("{key_name}: {value:?} is not a DNS name or an IP address"),
        );
    }
    s.print("tls_server_name", quoted(value));
    Ok(Some(value.to_string()))
}

pub(super) fn discovery(mut s: Section) -> Result<Option<DiscoveryConfig>, ConfigError> {
    if !s.present() {
        return s.finish(false).map(|()| None);
    }
    let dns = key(
        "dns",
        "DNS name and port whose A/AAAA records are the backends, e.g. a Kubernetes headless Service.",
    )
    .example("mcp-workers.default.svc.cluster.local:8000");
    let interval = key("interval", "Time between lookups.");
    let scheme = key("scheme", "`https`: the discovered backends are reached over TLS.");
    let tls_server_name_key = key(
        "tls_server_name",
        "With `https`: the name the discovered backends' certificates are checked against (they are \
         reached by IP).",
    )
    .unset("the `dns` name")
    .example("mcp-workers.default.svc");
    let dns = s.required(dns, Kind::HostPort)?;
    let text = dns.value.trim();
    let parsed = text
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        .filter(|(h, p)| !h.is_empty() && *p != 0);
    let Some((host, port)) = parsed else {
        return s.err(dns.span, format!("discovery.dns: {text:?} must be \"name:port\""));
    };
    let host = host.to_string();
    let shown = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    s.print("dns", quoted(&shown));
    let interval = s.duration(interval, defaults::DISCOVERY_INTERVAL)?;
    let scheme = match s.choice(scheme, defaults::DISCOVERY_SCHEME, &[("http", false), ("https", true)])? {
        true => Scheme::HTTPS,
        false => Scheme::HTTP,
    };
    let tls_server_name = tls_server_name(&mut s, tls_server_name_key, &scheme)?;
    if scheme == Scheme::HTTPS && tls_server_name.is_none() {
        s.print_comment(&format!("tls_server_name = {} (the dns name)", quoted(&host)));
    }
    s.finish(false)?;
    Ok(Some(DiscoveryConfig {
        host,
        port,
        interval,
        scheme,
        tls_server_name,
    }))
}

pub(super) fn health(mut s: Section) -> Result<HealthConfig, ConfigError> {
    let interval = key(
        "interval",
        "Time between active checks of each backend (serving and draining).",
    );
    let timeout = key("timeout", "Deadline of one check.");
    let path = key(
        "path",
        "`\"\"`: a TCP connect (to an `https://` backend, a TLS handshake) is the check; else an HTTP GET \
         of this absolute path must answer 2xx.",
    );
    let unhealthy_after = key(
        "unhealthy_after",
        "Consecutive failures (checks, or connect errors, TLS failures and resets on real traffic; never \
         upstream timeouts or client faults) that eject a backend.",
    );
    let healthy_after = key(
        "healthy_after",
        "Consecutive successful checks that re-admit an ejected backend.",
    );
    let interval = s.duration(interval, defaults::HEALTH_INTERVAL)?;
    let timeout = s.duration(timeout, defaults::HEALTH_TIMEOUT)?;
    let (path, span) = s.string(path, defaults::HEALTH_PATH)?;
    if !(path.is_empty() || path.starts_with('/') && path.parse::<http::uri::PathAndQuery>().is_ok()) {
        return s.err(
            span,
            "health.path: must be \"\" (TCP connect) or an absolute path like \"/healthz\"",
        );
    }
    let health = HealthConfig {
        interval,
        timeout,
        path,
        unhealthy_after: s.int(unhealthy_after, defaults::UNHEALTHY_AFTER as i64, 1..=1000)? as u32,
        healthy_after: s.int(healthy_after, defaults::HEALTHY_AFTER as i64, 1..=1000)? as u32,
    };
    s.finish(true)?;
    Ok(health)
}
