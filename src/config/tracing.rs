//! `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (docs/src/observability.md); off
//! unless `otlp_endpoint` is set.

use super::reader::{key, quoted, Section};
use super::reference::Kind;
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// Where spans are POSTed (OTLP/HTTP protobuf): the configured URL, with `/v1/traces`
    /// appended when it has no path of its own.
    pub traces_url: http::Uri,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The share of traces the router starts that are sampled (head sampling, by trace id). A
    /// client's `traceparent` decides for its own trace: sampled ones are always followed.
    pub sample_ratio: f64,
}

/// `None` when `otlp_endpoint` is unset (tracing off); the other keys are checked either way.
pub(super) fn tracing(mut s: Section) -> Result<Option<TracingConfig>, ConfigError> {
    let otlp_endpoint = key(
        "otlp_endpoint",
        "The `http://` OTLP/HTTP collector spans are sent to; `/v1/traces` is appended to a URL without a path.",
    )
    .unset("tracing off")
    .example("http://127.0.0.1:4318");
    let service_name = key(
        "service_name",
        "The `service.name` resource attribute of the router's spans.",
    );
    let sample_ratio = key(
        "sample_ratio",
        "Share of the traces the router starts that are sampled (by trace id); a client's \
         `traceparent` decides for its own trace.",
    );
    let endpoint = s.text(otlp_endpoint, Kind::Url)?;
    let traces_url = match &endpoint {
        None => None,
        Some(t) => {
            let url = traces_url(t.value).or_else(|e| s.err(t.span.clone(), format!("tracing.otlp_endpoint: {e}")))?;
            s.print("otlp_endpoint", quoted(t.value.trim()));
            Some(url)
        }
    };
    let (service_name, span) = s.string(service_name, defaults::SERVICE_NAME)?;
    if service_name.trim().is_empty() {
        return s.err(span, "tracing.service_name: must not be empty");
    }
    let sample_ratio = s.float(
        sample_ratio,
        defaults::SAMPLE_RATIO,
        |r| (0.0..=1.0).contains(&r),
        "between 0.0 and 1.0",
    )?;
    s.finish(false)?;
    Ok(traces_url.map(|traces_url| TracingConfig {
        traces_url,
        service_name,
        sample_ratio,
    }))
}

/// The OTLP/HTTP traces URL for an endpoint: `http://host:port` gets `/v1/traces`; a URL with
/// a path (`http://host:4318/v1/traces`, a gateway's prefix) is taken as it is.
fn traces_url(endpoint: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = endpoint
        .trim()
        .parse()
        .map_err(|e| format!("{endpoint:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "{endpoint:?}: only http:// is supported (scheme {other:?}); run a collector or agent beside the router"
            ))
        }
        None => {
            return Err(format!(
                "{endpoint:?}: needs http:// and a host, e.g. \"http://127.0.0.1:4318\""
            ))
        }
    }
    if uri.authority().is_none() {
        return Err(format!("{endpoint:?}: needs a host, e.g. \"http://127.0.0.1:4318\""));
    }
    let path = uri.path();
    if path.is_empty() || path == "/" {
        let base = endpoint.trim().trim_end_matches('/');
        return format!("{base}/v1/traces")
            .parse()
            .map_err(|e| format!("{endpoint:?}: {e}"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn endpoints_become_traces_urls() {
        let url = |e: &str| traces_url(e).map(|u| u.to_string());
        assert_eq!(url("http://127.0.0.1:4318").unwrap(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(
            url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            url("http://tempo:4318/v1/traces").unwrap(),
            "http://tempo:4318/v1/traces"
        );
        assert_eq!(url("http://gw/otlp/v1/traces").unwrap(), "http://gw/otlp/v1/traces");
        assert!(url("https://collector:4318").unwrap_err().contains("only http://"));
        assert!(url("collector:4318").is_err());
        assert!(url("not a url").is_err());
    }
}
