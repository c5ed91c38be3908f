//! The fleet: `[[backend]]`, `[discovery]` and `[health]`.

use std::time::Duration;

use http::uri::{Authority, Scheme};

use super::reader::{quoted, Section};
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
    let Some(name) = s.text("name")? else {
        return s.err(s.span(), "backend: needs a name");
    };
    let name_span = name.span.clone();
    let name = name.value.trim().to_string();
    if name.is_empty() || name.len() > 128 || name.chars().any(|ch| ch.is_control() || ch == ',') {
        return s.err(
            name_span,
            "backend.name: must be 1-128 printable characters without commas",
        );
    }
    if others.iter().any(|o| o.name == name) {
        return s.err(name_span, format!("backend.name: {name:?} is defined twice"));
    }
    s.print("name", quoted(&name));
    let Some(url) = s.text("url")? else {
        return s.err(s.span(), "backend.url: every backend needs a url");
    };
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
    let weight = s.int("weight", defaults::WEIGHT as i64, 0..=1000)? as u32;
    let http2 = s.maybe_flag("http2")?;
    match http2 {
        Some(on) => s.print("http2", on),
        None => s.print_comment(&format!("http2 = {upstream_http2} (from [upstream])")),
    }
    let tls_server_name = tls_server_name(&mut s, "backend", &backend.scheme)?;
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
fn tls_server_name(s: &mut Section, section: &str, scheme: &Scheme) -> Result<Option<String>, ConfigError> {
    let Some(name) = s.text("tls_server_name")? else {
        return Ok(None);
    };
    let value = name.value.trim();
    if *scheme != Scheme::HTTPS {
        return s.err(
            name.span,
            format!("{section}.tls_server_name: only for https:// (TLS) backends"),
        );
    }
    if rustls::pki_types::ServerName::try_from(value).is_err() {
        return s.err(
            name.span,
            format!("{section}.tls_server_name: {value:?} is not a DNS name or an IP address"),
        );
    }
    s.print("tls_server_name", quoted(value));
    Ok(Some(value.to_string()))
}

pub(super) fn discovery(mut s: Section) -> Result<Option<DiscoveryConfig>, ConfigError> {
    if !s.present() {
        return s.finish(false).map(|()| None);
    }
    let Some(dns) = s.text("dns")? else {
        return s.err(s.span(), "discovery.dns: required, as \"name:port\"");
    };
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
    let interval = s.duration("interval", defaults::DISCOVERY_INTERVAL)?;
    let scheme = match s.choice("scheme", "http", &[("http", false), ("https", true)])? {
        true => Scheme::HTTPS,
        false => Scheme::HTTP,
    };
    let tls_server_name = tls_server_name(&mut s, "discovery", &scheme)?;
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
    let interval = s.duration("interval", defaults::HEALTH_INTERVAL)?;
    let timeout = s.duration("timeout", defaults::HEALTH_TIMEOUT)?;
    let (path, span) = s.string("path", defaults::HEALTH_PATH)?;
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
        unhealthy_after: s.int("unhealthy_after", defaults::UNHEALTHY_AFTER as i64, 1..=1000)? as u32,
        healthy_after: s.int("healthy_after", defaults::HEALTHY_AFTER as i64, 1..=1000)? as u32,
    };
    s.finish(true)?;
    Ok(health)
}
