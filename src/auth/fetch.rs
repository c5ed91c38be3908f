//! Fetching the issuer's key set, and the metadata that names it (RFC 8414, then OpenID
//! Connect discovery), over the router's own HTTPS client: rustls with the roots of
//! `[upstream]` (docs/src/authorization.md, "The issuer's keys").
//!
//! Bounded in every way whoever answers could stretch it: the whole fetch within a timeout,
//! the body within a size, and only a `200` taken. A redirect is not followed: the URL
//! configured, or named by metadata whose `issuer` was checked, is the only one trusted.
//! One connection per fetch, HTTP/1.1: fetches are minutes apart.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::Scheme;
use http::{header, HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::fetch_url;

/// The largest metadata document read: such documents are a few KiB.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// A document fetched.
#[derive(Debug)]
pub struct Fetched {
    pub body: Bytes,
    /// How long its server says it stays fresh ([`max_age`]).
    pub max_age: Option<Duration>,
}

/// Why a fetch brought nothing.
#[derive(Debug)]
pub enum FetchError {
    /// Not `https://`, nor `http://` to a loopback address.
    Url(String),
    /// An `https://` URL, and no TLS client: `[upstream]` built none.
    NoTls,
    Connect(std::io::Error),
    Tls(std::io::Error),
    Http(hyper::Error),
    /// Anything but `200`; `location` when it was a redirect (not followed).
    Status {
        status: StatusCode,
        location: Option<String>,
    },
    TooLarge {
        limit: usize,
    },
    Timeout(Duration),
    /// Discovery: a metadata document that is not one, or names another issuer, or no fit
    /// `jwks_uri`.
    Metadata {
        url: String,
        why: String,
    },
    /// Discovery: neither metadata URL answered a document (what each said).
    NotFound(Vec<(String, FetchError)>),
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Url(why) => f.write_str(why),
            FetchError::NoTls => f.write_str(
                "an https:// URL, and no TLS roots: [upstream] builds them only when auth.jwks_uri or the issuer is https",
            ),
            FetchError::Connect(e) => write!(f, "cannot connect: {e}"),
            FetchError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            FetchError::Http(e) => {
                write!(f, "HTTP: {e}")?;
                match std::error::Error::source(e) {
                    Some(cause) => write!(f, ": {cause}"),
                    None => Ok(()),
                }
            }
            FetchError::Status { status, location: None } => write!(f, "answered {status}, not 200"),
            FetchError::Status {
                status,
                location: Some(to),
            } => write!(f, "answered {status} to {to:?}, not 200 (redirects are not followed)"),
            FetchError::TooLarge { limit } => write!(f, "the document is over the limit of {limit} bytes"),
            FetchError::Timeout(t) => write!(f, "no whole answer within {}", humantime::format_duration(*t)),
            FetchError::Metadata { url, why } => write!(f, "{url}: {why}"),
            FetchError::NotFound(tries) => {
                f.write_str("no metadata found")?;
                for (url, why) in tries {
                    write!(f, "; {url}: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for FetchError {}

/// GETs `url` (`https://` verified by `tls`, or `http://` to a loopback address), all within
/// `timeout`; the body is at most `limit` bytes.
pub async fn get(
    url: &Uri,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: usize,
    timeout: Duration,
) -> Result<Fetched, FetchError> {
    match tokio::time::timeout(timeout, connect_and_get(url, tls, limit)).await {
        Ok(fetched) => fetched,
        Err(_) => Err(FetchError::Timeout(timeout)),
    }
}

async fn connect_and_get(
    url: &Uri,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: usize,
) -> Result<Fetched, FetchError> {
    // Checked again here: a discovered URL reaches this point too.
    let url = fetch_url(&url.to_string()).map_err(FetchError::Url)?;
    let (Some(host), Some(authority)) = (url.host(), url.authority()) else {
        return Err(FetchError::Url(format!("{url}: no host")));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let https = url.scheme() == Some(&Scheme::HTTPS);
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let request = Request::get(url.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, authority.as_str())
        .header(header::ACCEPT, "application/json")
        .header(header::USER_AGENT, concat!("mrtr-router/", env!("CARGO_PKG_VERSION")))
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Url(format!("{url}: {e}")))?;
    let tcp = TcpStream::connect((host, port)).await.map_err(FetchError::Connect)?;
    let _ = tcp.set_nodelay(true);
    if !https {
        return exchange(tcp, request, limit).await;
    }
    let config = tls.ok_or(FetchError::NoTls)?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| FetchError::Url(format!("{url}: {e}")))?;
    let stream = TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(FetchError::Tls)?;
    exchange(stream, request, limit).await
}

/// One request over `io`, its answer read whole.
async fn exchange<S>(io: S, request: Request<Empty<Bytes>>, limit: usize) -> Result<Fetched, FetchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(FetchError::Http)?;
    let answer = async move {
        let response = sender.send_request(request).await.map_err(FetchError::Http)?;
        if response.status() != StatusCode::OK {
            let location = response.headers().get(header::LOCATION);
            return Err(FetchError::Status {
                status: response.status(),
                location: location.map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned()),
            });
        }
        let declared = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(FetchError::TooLarge { limit });
        }
        let max_age = max_age(response.headers());
        let mut body = response.into_body();
        let mut read = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.map_err(FetchError::Http)?.data_ref() {
                if read.len() + data.len() > limit {
                    return Err(FetchError::TooLarge { limit });
                }
                read.extend_from_slice(data);
            }
        }
        Ok(Fetched {
            body: read.freeze(),
            max_age,
        })
    };
    // The connection is driven here, not by a task of its own: a fetch given up (its timeout)
    // leaves nothing running.
    tokio::pin!(answer);
    tokio::pin!(connection);
    tokio::select! {
        fetched = &mut answer => fetched,
        // Ended (the server closed after its answer, or failed): what was read, or the error,
        // is the answer's to say.
        _ = &mut connection => answer.await,
    }
}

/// How long an answer stays fresh by its `Cache-Control`: `max-age=N` (the least, if it says
/// several); zero when it says `no-cache` or `no-store`, whatever else; `None` when it says
/// none of these. A number too large to hold is taken as the largest.
pub fn max_age(headers: &HeaderMap) -> Option<Duration> {
    let mut age: Option<Duration> = None;
    for value in headers.get_all(header::CACHE_CONTROL) {
        let Ok(text) = value.to_str() else { continue };
        for directive in text.split(',') {
            let (name, argument) = match directive.split_once('=') {
                Some((name, argument)) => (name.trim(), Some(argument.trim())),
                None => (directive.trim(), None),
            };
            if name.eq_ignore_ascii_case("no-cache") || name.eq_ignore_ascii_case("no-store") {
                return Some(Duration::ZERO);
            }
            if name.eq_ignore_ascii_case("max-age") {
                if let Some(seconds) = argument.and_then(delta_seconds) {
                    age = Some(age.map_or(seconds, |a| a.min(seconds)));
                }
            }
        }
    }
    age
}

/// RFC 9111 `delta-seconds` (quoted too, which recipients may accept).
fn delta_seconds(argument: &str) -> Option<Duration> {
    let digits = argument
        .strip_prefix('"')
        .and_then(|a| a.strip_suffix('"'))
        .unwrap_or(argument);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_secs(digits.parse().unwrap_or(u64::MAX)))
}

/// Where an issuer's metadata is looked for, in order: RFC 8414's well-known URL (the suffix
/// between host and path), then OpenID Connect's (the suffix after the path).
pub fn metadata_urls(issuer: &str) -> Result<[Uri; 2], FetchError> {
    let uri = fetch_url(issuer).map_err(FetchError::Url)?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(FetchError::Url(format!("{issuer:?}: needs a scheme and a host")));
    };
    // RFC 8414 §3.1: a terminating `/` is removed first (OIDC Discovery §4 says the same).
    let path = uri.path().trim_end_matches('/');
    let url = |text: String| {
        text.parse::<Uri>()
            .map_err(|e| FetchError::Url(format!("{text:?}: {e}")))
    };
    Ok([
        url(format!(
            "{scheme}://{authority}/.well-known/oauth-authorization-server{path}"
        ))?,
        url(format!("{scheme}://{authority}{path}/.well-known/openid-configuration"))?,
    ])
}

/// The `jwks_uri` of `issuer`'s metadata, within `timeout`. The first URL of
/// [`metadata_urls`] that answers a document decides: its `issuer` must be `issuer` exactly,
/// and its `jwks_uri` https (or http to a loopback address); else the discovery fails.
pub async fn discover(
    issuer: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> Result<Uri, FetchError> {
    let urls = metadata_urls(issuer)?;
    let search = async {
        let mut tries = Vec::new();
        for url in urls {
            match get(&url, tls, MAX_METADATA_BYTES, timeout).await {
                Ok(fetched) => return jwks_uri_of(issuer, &url, &fetched.body),
                Err(e) => tries.push((url.to_string(), e)),
            }
        }
        Err(FetchError::NotFound(tries))
    };
    match tokio::time::timeout(timeout, search).await {
        Ok(found) => found,
        Err(_) => Err(FetchError::Timeout(timeout)),
    }
}

/// What a metadata document from `url` says the key set's URL is.
fn jwks_uri_of(issuer: &str, url: &Uri, document: &[u8]) -> Result<Uri, FetchError> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        issuer: String,
        jwks_uri: Option<String>,
    }
    let refused = |why: String| FetchError::Metadata {
        url: url.to_string(),
        why,
    };
    let metadata: Metadata = serde_json::from_slice(document)
        .map_err(|e| refused(format!("not an authorization server's metadata ({e})")))?;
    if metadata.issuer != issuer {
        return Err(refused(format!(
            "names the issuer {:?}, not {issuer:?}",
            metadata.issuer
        )));
    }
    let jwks_uri = metadata.jwks_uri.ok_or_else(|| refused("no jwks_uri".into()))?;
    fetch_url(&jwks_uri).map_err(|e| refused(format!("jwks_uri {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_control(values: &[&str]) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::CACHE_CONTROL, v.parse().unwrap());
        }
        max_age(&headers)
    }

    #[test]
    fn max_age_is_read_from_cache_control() {
        let secs = |n| Some(Duration::from_secs(n));
        assert_eq!(cache_control(&[]), None);
        assert_eq!(cache_control(&["max-age=300"]), secs(300));
        assert_eq!(cache_control(&["public, MAX-AGE = 60 , must-revalidate"]), secs(60));
        assert_eq!(cache_control(&["max-age=\"90\""]), secs(90));
        // Several: the least.
        assert_eq!(cache_control(&["max-age=600", "max-age=120"]), secs(120));
        // Not a number, negative, empty: not read.
        for bad in [
            "max-age=abc",
            "max-age=-5",
            "max-age=",
            "max-age",
            "max-age=1.5",
            "public",
        ] {
            assert_eq!(cache_control(&[bad]), None, "{bad}");
        }
        assert_eq!(cache_control(&["max-age=99999999999999999999999"]), secs(u64::MAX));
        // s-maxage is for shared caches; the router is not one.
        assert_eq!(cache_control(&["s-maxage=10"]), None);
    }

    #[test]
    fn no_cache_and_no_store_say_zero_whatever_else() {
        for value in [
            "no-cache",
            "no-store",
            "max-age=3600, no-store",
            "No-Cache=\"set-cookie\", max-age=5",
        ] {
            assert_eq!(cache_control(&[value]), Some(Duration::ZERO), "{value}");
        }
        assert_eq!(cache_control(&["max-age=3600", "no-cache"]), Some(Duration::ZERO));
    }

    #[test]
    fn metadata_urls_of_an_issuer_with_and_without_a_path() {
        let urls = |issuer| metadata_urls(issuer).unwrap().map(|u| u.to_string());
        assert_eq!(
            urls("https://idp.example.com"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server",
                "https://idp.example.com/.well-known/openid-configuration",
            ]
        );
        assert_eq!(urls("https://idp.example.com/"), urls("https://idp.example.com"));
        assert_eq!(
            urls("https://idp.example.com/tenant/a/"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server/tenant/a",
                "https://idp.example.com/tenant/a/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            urls("http://127.0.0.1:8080/realms/x")[1],
            "http://127.0.0.1:8080/realms/x/.well-known/openid-configuration"
        );
        assert!(matches!(
            metadata_urls("http://idp.example.com"),
            Err(FetchError::Url(_))
        ));
    }

    #[test]
    fn metadata_must_name_the_issuer_and_a_fetchable_jwks_uri() {
        let url: Uri = "https://idp.example.com/.well-known/openid-configuration"
            .parse()
            .unwrap();
        let issuer = "https://idp.example.com";
        let doc = |iss: &str, jwks: &str| format!(r#"{{"issuer":"{iss}","jwks_uri":"{jwks}","x":[1]}}"#);
        let ok = jwks_uri_of(issuer, &url, doc(issuer, "https://keys.example.com/jwks").as_bytes()).unwrap();
        assert_eq!(ok, "https://keys.example.com/jwks");
        let refused = |document: &str| match jwks_uri_of(issuer, &url, document.as_bytes()) {
            Err(FetchError::Metadata { why, .. }) => why,
            other => panic!("{document}: {other:?}"),
        };
        assert!(refused(&doc("https://idp.example.com/", "https://k/j")).contains("names the issuer"));
        assert!(refused(&doc("https://evil.example.com", "https://k/j")).contains("names the issuer"));
        assert!(refused(&doc(issuer, "http://keys.example.com/jwks")).contains("loopback"));
        assert!(refused(&format!(r#"{{"issuer":"{issuer}"}}"#)).contains("no jwks_uri"));
        assert!(refused("<html>").contains("not an authorization server's metadata"));
    }
}
