//! `[quotas]` and `[[quotas.tool]]`: fair shares between callers (docs/src/configuration.md):
//! who a caller is, the rate of new calls each may start, the requests each may have in flight
//! and the calls each may hold open, the body bytes one connection may buffer, and the limits of
//! single tools. Absent: no quota at all. Each quota applies only when its key is set.

//!
//! The keys are declared in `keys` (name, meaning, what leaving one out means); this file reads
//! them in their order and checks each value, the section's own checks in named steps.

mod keys;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::time::Duration;

use super::reader::{quoted, Key, Section};
use super::reference::Kind;
use super::server::cidrs;
use super::{defaults, Cidr, ConfigError, ServerConfig};

/// `[quotas]`, present.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotasConfig {
    pub caller: CallerSource,
    /// Peers whose `X-Forwarded-For` hop is believed (`quotas::caller` has the rule).
    pub trusted_proxies: Vec<Cidr>,
    /// New calls per caller.
    pub rate: Option<Rate>,
    /// Requests per caller in flight at once (SSE streams until they end).
    pub max_in_flight: Option<u32>,
    /// Multi-round calls per caller held open (pinned) at once.
    pub max_open_calls: Option<u32>,
    /// Request-body bytes one client connection may have buffered at once.
    pub max_body_bytes_per_connection: Option<usize>,
    /// Request-body bytes one caller may have buffered at once, all its connections together.
    pub max_body_bytes_per_caller: Option<usize>,
    /// Callers tracked per quota table; past it, new callers share one overflow entry.
    pub max_tracked_callers: usize,
    /// `[[quotas.tool]]`.
    pub tools: Vec<ToolQuota>,
    pub store: QuotaStore,
    /// A store operation that takes longer fails (and `store_failure` says what then).
    pub store_timeout: Duration,
    pub store_failure: StoreFailure,
}

/// Who a caller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerSource {
    /// The verified principal (`[auth]`): issuer and subject.
    Principal,
    /// The value of this request header, set by a trusted front (an API gateway).
    Header(http::HeaderName),
    /// The client IP.
    Ip,
}

/// A GCRA rate: `count` per `period`, and up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
    pub burst: u32,
}

impl Rate {
    /// The rate as the config writes it (`"10/s"`).
    pub fn text(&self) -> String {
        let unit = if self.period == Duration::from_secs(60) {
            "m"
        } else {
            "s"
        };
        format!("{}/{unit}", self.count)
    }
}

/// One `[[quotas.tool]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolQuota {
    pub name: String,
    /// New calls of this tool per caller.
    pub rate: Option<Rate>,
    /// Calls of this tool in flight at once, all callers together.
    pub max_in_flight: Option<u32>,
}

/// Where rate-limit state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaStore {
    /// In this process: each replica counts on its own.
    Local,
    /// In Redis, shared by every replica (the rate quotas only).
    Redis(String),
}

/// What a rate check does when the store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// The request is admitted.
    Open,
    /// The request is answered 503 `quota_store_unavailable`.
    Closed,
}

/// What `[quotas]` says, read; `[[quotas.tool]]` is read after, then [`combine`]d.
pub(super) struct QuotasSection {
    present: bool,
    config: QuotasConfig,
    /// Where `store` is written, for [`combine`]'s check that a shared store has a rate to share.
    store_span: Option<Range<usize>>,
}

/// `[quotas]`: its keys in the order the reference lists them.
pub(super) fn quotas(mut s: Section, auth_on: bool, server: &ServerConfig) -> Result<QuotasSection, ConfigError> {
    let present = s.present();
    let (caller, trusted_proxies) = caller(&mut s, auth_on)?;
    let rate = rate(&mut s, keys::RATE, keys::BURST)?;
    let max_in_flight = s.maybe_int(keys::MAX_IN_FLIGHT, 1..=1_000_000)?.map(|n| n as u32);
    let max_open_calls = s
        .maybe_int(keys::MAX_OPEN_CALLS, 1..=u32::MAX.into())?
        .map(|n| n as u32);
    let max_body_bytes_per_connection = body_share(&mut s, keys::MAX_BODY_BYTES_PER_CONNECTION, server)?;
    let max_body_bytes_per_caller = body_share(&mut s, keys::MAX_BODY_BYTES_PER_CALLER, server)?;
    let max_tracked_callers = s.int(
        keys::MAX_TRACKED_CALLERS,
        defaults::QUOTA_MAX_TRACKED_CALLERS as i64,
        1..=100_000_000,
    )? as usize;
    let (store, store_span) = store(&mut s)?;
    let store_timeout = s.duration(keys::STORE_TIMEOUT, defaults::QUOTA_STORE_TIMEOUT)?;
    let store_failure = s.choice(
        keys::STORE_FAILURE,
        defaults::QUOTA_STORE_FAILURE,
        &[("open", StoreFailure::Open), ("closed", StoreFailure::Closed)],
    )?;
    s.nested(&["tool"]);
    s.finish(false)?;
    Ok(QuotasSection {
        present,
        store_span,
        config: QuotasConfig {
            caller,
            trusted_proxies,
            rate,
            max_in_flight,
            max_open_calls,
            max_body_bytes_per_connection,
            max_body_bytes_per_caller,
            max_tracked_callers,
            tools: Vec::new(),
            store,
            store_timeout,
            store_failure,
        },
    })
}

/// `caller` and `trusted_proxies`: who a caller is, and the peers believed about it. A caller
/// named by a header needs peers to believe it from.
fn caller(s: &mut Section, auth_on: bool) -> Result<(CallerSource, Vec<Cidr>), ConfigError> {
    let caller_text = s.text(keys::CALLER, Kind::String)?;
    let caller_span = caller_text.as_ref().and_then(|t| t.span.clone());
    let caller = match &caller_text {
        None if auth_on => CallerSource::Principal,
        None => CallerSource::Ip,
        Some(t) => match t.value.trim() {
            "principal" if !auth_on => {
                return s.err(
                    t.span.clone(),
                    "quotas.caller: \"principal\" needs [auth] (without it, no caller is verified)",
                )
            }
            "principal" => CallerSource::Principal,
            "ip" => CallerSource::Ip,
            other => match other.strip_prefix("header:").map(str::trim) {
                Some(name) => match http::HeaderName::from_bytes(name.as_bytes()) {
                    Ok(h) => CallerSource::Header(h),
                    Err(_) => {
                        return s.err(
                            t.span.clone(),
                            format!("quotas.caller: {name:?} is not a valid header name"),
                        )
                    }
                },
                None => {
                    return s.err(
                        t.span.clone(),
                        format!(
                            "quotas.caller: {:?} is not one of \"principal\", \"header:NAME\", \"ip\"",
                            t.value
                        ),
                    )
                }
            },
        },
    };
    let printed = match &caller {
        CallerSource::Principal => "principal".to_string(),
        CallerSource::Header(h) => format!("header:{h}"),
        CallerSource::Ip => "ip".to_string(),
    };
    s.print("caller", quoted(&printed));
    let (trusted_proxies, _) = cidrs(s, keys::TRUSTED_PROXIES)?;
    if let (CallerSource::Header(h), true) = (&caller, trusted_proxies.is_empty()) {
        // Believed from anyone, a header is a name each request picks: fresh values would dodge
        // every per-caller quota and fill `max_tracked_callers`.
        return s.err(
            caller_span,
            format!(
                "quotas.caller = \"header:{h}\" needs trusted_proxies: the peers (gateways) whose {h} \
                 header is believed; from anyone else a request is counted by its IP. To believe every \
                 peer (only a gateway can reach the router), say so: trusted_proxies = [\"0.0.0.0/0\", \"::/0\"]"
            ),
        );
    }
    Ok((caller, trusted_proxies))
}

/// `store`: `local`, or a Redis URL checked (no connection made), printed without its password;
/// and where it is written.
fn store(s: &mut Section) -> Result<(QuotaStore, Option<Range<usize>>), ConfigError> {
    let store_text = s.secret_or(keys::STORE, defaults::QUOTA_STORE)?;
    let store_span = store_text.span.clone();
    let store = match store_text.value.trim() {
        "local" => QuotaStore::Local,
        url => match redis_url(url) {
            Ok(()) => QuotaStore::Redis(url.to_string()),
            Err(why) => return s.err(store_text.span, format!("quotas.store: {why}")),
        },
    };
    let printed = match &store {
        QuotaStore::Local => "local".to_string(),
        QuotaStore::Redis(url) => without_password(url),
    };
    s.print("store", quoted(&printed));
    Ok((store, store_span))
}

/// `rate` and `burst` as one section reads them.
fn rate(s: &mut Section, rate: Key, burst: Key) -> Result<Option<Rate>, ConfigError> {
    let text = s.text(rate, Kind::String)?;
    let burst_value = s.maybe_int(burst, 1..=1_000_000)?;
    let Some(text) = text else {
        if burst_value.is_some() {
            let span = s.span();
            return s.err(span, format!("{}: needs {}", s.key_name("burst"), s.key_name("rate")));
        }
        return Ok(None);
    };
    let Some((count, period)) = parse_rate(text.value) else {
        return s.err(
            text.span,
            format!(
                "{}: {:?} is not a rate: N/s or N/m, N from 1 to 1000000 (e.g. \"10/s\")",
                s.key_name("rate"),
                text.value
            ),
        );
    };
    let burst = match burst_value {
        Some(b) => b as u32,
        None => {
            s.print("burst", count);
            count
        }
    };
    let rate = Rate { count, period, burst };
    s.print("rate", quoted(&rate.text()));
    Ok(Some(rate))
}

/// `N/s` or `N/m`, N in 1..=1,000,000.
fn parse_rate(text: &str) -> Option<(u32, Duration)> {
    let (n, unit) = text.trim().split_once('/')?;
    let period = match unit {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        _ => return None,
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = n.parse().ok()?;
    (1..=1_000_000).contains(&n).then_some((n, period))
}

/// A share of `server.max_body_buffer_bytes` (a connection's or a caller's): at least one whole
/// body, at most the whole budget.
fn body_share(s: &mut Section, key: Key, server: &ServerConfig) -> Result<Option<usize>, ConfigError> {
    let Some(n) = s.maybe_int(key, 64..=1 << 40)? else {
        return Ok(None);
    };
    let n = n as usize;
    if n < server.max_body_bytes || n > server.max_body_buffer_bytes {
        let span = s.span();
        return s.err(
            span,
            format!(
                "{} ({n}): must be between server.max_body_bytes ({}) and server.max_body_buffer_bytes ({})",
                s.key_name(key.name()),
                server.max_body_bytes,
                server.max_body_buffer_bytes
            ),
        );
    }
    Ok(Some(n))
}

/// `redis://[user:password@]host[:port][/db]`: the scheme and a host checked here, the rest
/// by the Redis client's own parser (no connection is made: Redis may come up after the
/// router).
fn redis_url(url: &str) -> Result<(), String> {
    let shown = without_password(url);
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err(format!("{shown:?} is neither \"local\" nor a redis:// URL"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("{shown:?} has no host"));
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("{shown:?}: {e}"))
}

/// The URL as the router shows it (`config show`, errors): a password replaced by `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{}", &rest[authority_end..])
        }
        _ => url.to_string(),
    }
}

/// One `[[quotas.tool]]`.
pub(super) fn tool(mut s: Section, seen: &[ToolQuota]) -> Result<ToolQuota, ConfigError> {
    let name_text = s.required(keys::TOOL_NAME, Kind::String)?;
    if seen.iter().any(|t| t.name == name_text.value) {
        return s.err(
            name_text.span,
            format!("quotas.tool: {:?} is listed twice", name_text.value),
        );
    }
    if name_text.value.is_empty() {
        return s.err(name_text.span, "quotas.tool.name: empty");
    }
    let name = name_text.value.to_string();
    s.print("name", quoted(&name));
    let rate = rate(&mut s, keys::TOOL_RATE, keys::TOOL_BURST)?;
    let max_in_flight = s.maybe_int(keys::TOOL_MAX_IN_FLIGHT, 1..=1_000_000)?.map(|n| n as u32);
    let (span, reference) = (s.span(), s.reference_mode());
    let doc_err = |s: &Section, span, message: String| s.err::<()>(span, message).unwrap_err();
    let empty = (rate.is_none() && max_in_flight.is_none() && !reference).then(|| {
        doc_err(
            &s,
            span,
            format!("quotas.tool {name:?}: sets neither rate nor max_in_flight"),
        )
    });
    // Unknown keys first: a misspelt `max_in_flight` is the likelier mistake.
    s.finish(false)?;
    if let Some(e) = empty {
        return Err(e);
    }
    Ok(ToolQuota {
        name,
        rate,
        max_in_flight,
    })
}

/// Puts the section and its tools together: `None` when `[quotas]` is absent (a
/// `[[quotas.tool]]` makes it present: TOML opens the parent table). A shared store holds only
/// rates, so one named where no rate is set would share nothing: refused.
pub(super) fn combine(
    section: QuotasSection,
    tools: Vec<ToolQuota>,
    err: impl Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
) -> Result<Option<QuotasConfig>, ConfigError> {
    if !section.present {
        return Ok(None);
    }
    let rated = section.config.rate.is_some() || tools.iter().any(|t| t.rate.is_some());
    if matches!(section.config.store, QuotaStore::Redis(_)) && !rated {
        return Err(err(
            section.store_span,
            "quotas.store: a shared store holds only the rates, and neither quotas.rate nor a \
             [[quotas.tool]] rate is set"
                .to_string(),
        ));
    }
    Ok(Some(QuotasConfig {
        tools,
        ..section.config
    }))
}
