//! `[quotas]` and `[[quotas.tool]]`: fair shares between callers (docs/src/configuration.md):
//! who a caller is, the rate of new calls each may start, the requests each may have in flight
//! and the calls each may hold open, the body bytes one connection may buffer, and the limits of
//! single tools. Absent: no quota at all. Each quota applies only when its key is set.

use std::time::Duration;

use super::reader::{key, quoted, Section};
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

/// `rate` and `burst` as one section reads them.
fn rate(s: &mut Section, rate: super::reader::Key, burst: super::reader::Key) -> Result<Option<Rate>, ConfigError> {
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

/// The keys of `[quotas]`; `[[quotas.tool]]` is read after, then [`combine`]d.
pub(super) struct QuotasKeys {
    present: bool,
    config: QuotasConfig,
    /// Where `store` is written, for [`combine`]'s check that a shared store has a rate to share.
    store_span: Option<std::ops::Range<usize>>,
}

pub(super) fn quotas(mut s: Section, auth_on: bool, server: &ServerConfig) -> Result<QuotasKeys, ConfigError> {
    let present = s.present();
    let caller = key(
        "caller",
        "Who a caller is: `principal` (the verified issuer and subject; needs `[auth]`), `header:NAME` \
         (that request header's value, as a trusted gateway sets it), or `ip` (the client IP: the peer, \
         or the `X-Forwarded-For` hop a `trusted_proxies` peer added; IPv6 by /64); a request without \
         a principal or the header is counted by IP.",
    )
    .unset("`principal` when `[auth]` is on, else `ip`")
    .example("header:X-Api-Key");
    let trusted_proxies = key(
        "trusted_proxies",
        "Peers whose `X-Forwarded-For` is believed: the client IP is the right-most hop that is not \
         one of them; from any other peer the header is ignored. They are also the only peers whose \
         `caller = \"header:NAME\"` header is believed, and that caller needs them (`[\"0.0.0.0/0\", \"::/0\"]` \
         believes every peer).",
    );
    let rate_key = key(
        "rate",
        "New calls a caller may start, `N/s` or `N/m` (GCRA); follow-ups of an admitted call are \
         never refused by it; past it, 429 `rate_limited`.",
    )
    .unset("no rate quota")
    .example("20/s");
    let burst = key(
        "burst",
        "New calls a caller may start at once, beside the steady `rate`.",
    )
    .unset("the rate's N")
    .example("40");
    let max_in_flight = key(
        "max_in_flight",
        "Requests a caller may have in flight at once, follow-ups and SSE streams included (until the \
         answer ends); past it, 429 `too_many_in_flight`.",
    )
    .unset("no in-flight quota")
    .example("32");
    let max_open_calls = key(
        "max_open_calls",
        "Multi-round calls a caller may hold open (pinned) at once, so that no caller takes the pin \
         table; a new call past it is refused 429 `too_many_open_calls` before it reaches a backend.",
    )
    .unset("no open-calls quota (only `routing.max_pins`)")
    .example("100");
    let max_body = key(
        "max_body_bytes_per_connection",
        "Request-body bytes one client connection may have buffered at once (HTTP/2 streams together), \
         between `server.max_body_bytes` and `server.max_body_buffer_bytes`.",
    )
    .unset("a connection may take all of `server.max_body_buffer_bytes`")
    .example("8388608");
    let max_body_caller = key(
        "max_body_bytes_per_caller",
        "Request-body bytes one caller may have buffered at once, all its connections together, \
         between `server.max_body_bytes` and `server.max_body_buffer_bytes`; past it, 503 \
         `router_overloaded`.",
    )
    .unset("a caller may take all of `server.max_body_buffer_bytes`")
    .example("33554432");
    let max_tracked = key(
        "max_tracked_callers",
        "Callers each quota keeps state for (idle ones are forgotten); past it, new callers share one \
         overflow entry with one caller's limits.",
    );
    let store = key(
        "store",
        "Where rate state lives: `local` (each replica counts alone), or \
         `redis://[user:password@]host[:port][/db]`, shared by every replica that names it (the rates \
         only; in-flight and open calls are always local).",
    );
    let store_timeout = key(
        "store_timeout",
        "A store round trip that takes longer fails, and `store_failure` decides.",
    );
    let store_failure = key(
        "store_failure",
        "When the store fails or is slow: `open` admits the request, `closed` answers 503 \
         `quota_store_unavailable`.",
    );

    let caller_text = s.text(caller, Kind::String)?;
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
    let (trusted_proxies, _) = cidrs(&mut s, trusted_proxies)?;
    if let (CallerSource::Header(h), true) = (&caller, trusted_proxies.is_empty()) {
        // Believed from anyone, a header is a name each request picks: fresh values would dodge
        // every per-caller quota and fill `max_tracked_callers`.
        let span = caller_span.clone();
        return s.err(
            span,
            format!(
                "quotas.caller = \"header:{h}\" needs trusted_proxies: the peers (gateways) whose {h} \
                 header is believed; from anyone else a request is counted by its IP. To believe every \
                 peer (only a gateway can reach the router), say so: trusted_proxies = [\"0.0.0.0/0\", \"::/0\"]"
            ),
        );
    }
    let rate = rate(&mut s, rate_key, burst)?;
    let max_in_flight = s.maybe_int(max_in_flight, 1..=1_000_000)?.map(|n| n as u32);
    let max_open_calls = s.maybe_int(max_open_calls, 1..=u32::MAX.into())?.map(|n| n as u32);
    let max_body_bytes_per_connection = body_share(&mut s, max_body, server)?;
    let max_body_bytes_per_caller = body_share(&mut s, max_body_caller, server)?;
    let max_tracked_callers = s.int(max_tracked, defaults::QUOTA_MAX_TRACKED_CALLERS as i64, 1..=100_000_000)? as usize;
    let store_text = s.secret_or(store, defaults::QUOTA_STORE)?;
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
    let store_timeout = s.duration(store_timeout, defaults::QUOTA_STORE_TIMEOUT)?;
    let store_failure = s.choice(
        store_failure,
        defaults::QUOTA_STORE_FAILURE,
        &[("open", StoreFailure::Open), ("closed", StoreFailure::Closed)],
    )?;
    s.nested(&["tool"]);
    s.finish(false)?;
    Ok(QuotasKeys {
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

/// A share of `server.max_body_buffer_bytes` (a connection's or a caller's): at least one whole
/// body, at most the whole budget.
fn body_share(s: &mut Section, key: super::reader::Key, server: &ServerConfig) -> Result<Option<usize>, ConfigError> {
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
    let name = key("name", "The tool's name, as a `tools/call` request's body gives it.").example("search");
    let rate_key = key(
        "rate",
        "New calls of this tool a caller may start, `N/s` or `N/m`; past it, 429 `rate_limited`.",
    )
    .unset("no rate quota for this tool")
    .example("2/s");
    let burst = key("burst", "Calls of this tool a caller may start at once.")
        .unset("the rate's N")
        .example("4");
    let max_in_flight = key(
        "max_in_flight",
        "Calls of this tool in flight at once, all callers together, so a slow tool cannot take every \
         connection of its backends; past it, 429 `too_many_in_flight`.",
    )
    .unset("no in-flight quota for this tool")
    .example("16");
    let name_text = s.required(name, Kind::String)?;
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
    let rate = rate(&mut s, rate_key, burst)?;
    let max_in_flight = s.maybe_int(max_in_flight, 1..=1_000_000)?.map(|n| n as u32);
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
    keys: QuotasKeys,
    tools: Vec<ToolQuota>,
    err: impl Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
) -> Result<Option<QuotasConfig>, ConfigError> {
    if !keys.present {
        return Ok(None);
    }
    let rated = keys.config.rate.is_some() || tools.iter().any(|t| t.rate.is_some());
    if matches!(keys.config.store, QuotaStore::Redis(_)) && !rated {
        return Err(err(
            keys.store_span,
            "quotas.store: a shared store holds only the rates, and neither quotas.rate nor a \
             [[quotas.tool]] rate is set"
                .to_string(),
        ));
    }
    Ok(Some(QuotasConfig { tools, ..keys.config }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const BACKEND: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
    const AUTH: &str = "[auth]\nissuer = \"https://idp.example.com\"\n\
        [auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), &format!("{BACKEND}{text}"))
    }

    fn quotas(text: &str) -> QuotasConfig {
        let c = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        // The printout reads back as the same config.
        assert_eq!(
            Config::parse(Path::new("t.toml"), &c.to_toml()).unwrap(),
            c,
            "{}",
            c.to_toml()
        );
        c.quotas.unwrap()
    }

    #[test]
    fn off_unless_the_section_is_there() {
        assert_eq!(parse("").unwrap().quotas, None);
        let q = quotas("[quotas]\n");
        assert_eq!(q.caller, CallerSource::Ip);
        assert_eq!((q.rate, q.max_in_flight, q.max_open_calls), (None, None, None));
        assert_eq!(q.max_tracked_callers, 100_000);
        assert_eq!(q.store, QuotaStore::Local);
        assert_eq!(
            (q.store_timeout, q.store_failure),
            (Duration::from_millis(50), StoreFailure::Open)
        );
        let notes = parse("[quotas]\n").unwrap().notes();
        assert!(notes.iter().any(|n| n.contains("sets no quota")), "{notes:?}");
        // With [auth], the caller is the principal unless said otherwise.
        assert_eq!(
            quotas(&format!("{AUTH}[quotas]\nrate = \"1/s\"\n")).caller,
            CallerSource::Principal
        );
        let q = quotas(&format!("{AUTH}[quotas]\ncaller = \"ip\"\n"));
        assert_eq!(q.caller, CallerSource::Ip);
    }

    #[test]
    fn every_quota_and_tool() {
        let q = quotas(
            "[quotas]\ncaller = \"header:X-Api-Key\"\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n\
             rate = \"20/s\"\nmax_in_flight = 8\nmax_open_calls = 50\n\
             max_body_bytes_per_connection = 4194304\nmax_body_bytes_per_caller = 8388608\n\
             max_tracked_callers = 1000\nstore_timeout = \"20ms\"\nstore_failure = \"closed\"\n\
             [[quotas.tool]]\nname = \"search\"\nrate = \"30/m\"\nburst = 5\n\
             [[quotas.tool]]\nname = \"slow\"\nmax_in_flight = 4\n",
        );
        assert_eq!(
            q.caller,
            CallerSource::Header(http::HeaderName::from_static("x-api-key"))
        );
        assert_eq!(q.trusted_proxies.len(), 2);
        let second = Duration::from_secs(1);
        assert_eq!(
            q.rate,
            Some(Rate {
                count: 20,
                period: second,
                burst: 20
            })
        );
        assert_eq!((q.max_in_flight, q.max_open_calls), (Some(8), Some(50)));
        assert_eq!(q.max_body_bytes_per_connection, Some(4 << 20));
        assert_eq!(q.max_body_bytes_per_caller, Some(8 << 20));
        assert_eq!(q.store, QuotaStore::Local);
        assert_eq!(q.store_failure, StoreFailure::Closed);
        let minute = Duration::from_secs(60);
        assert_eq!(
            q.tools,
            [
                ToolQuota {
                    name: "search".into(),
                    rate: Some(Rate {
                        count: 30,
                        period: minute,
                        burst: 5
                    }),
                    max_in_flight: None
                },
                ToolQuota {
                    name: "slow".into(),
                    rate: None,
                    max_in_flight: Some(4)
                },
            ]
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_key_named() {
        let cases = [
            ("[quotas]\nrate = \"0/s\"\n", "quotas.rate: \"0/s\" is not a rate"),
            ("[quotas]\nrate = \"10/h\"\n", "is not a rate"),
            ("[quotas]\nrate = \"ten/s\"\n", "is not a rate"),
            ("[quotas]\nrate = \"-1/s\"\n", "is not a rate"),
            ("[quotas]\nrate = \"10\"\n", "is not a rate"),
            (
                "[quotas]\nrate = \"1/s\"\nburst = 0\n",
                "quotas.burst: 0 is out of range",
            ),
            ("[quotas]\nburst = 5\n", "quotas.burst: needs quotas.rate"),
            (
                "[quotas]\ntrusted_proxies = [\"10.0.0.1/8\"]\n",
                "quotas.trusted_proxies: \"10.0.0.1/8\" has host bits",
            ),
            (
                "[quotas]\ntrusted_proxies = [\"proxy.internal\"]\n",
                "not an IP network",
            ),
            ("[quotas]\ncaller = \"principal\"\n", "\"principal\" needs [auth]"),
            (
                "[quotas]\ncaller = \"subject\"\n",
                "is not one of \"principal\", \"header:NAME\", \"ip\"",
            ),
            ("[quotas]\ncaller = \"header:\"\n", "is not a valid header name"),
            ("[quotas]\ncaller = \"header:a b\"\n", "is not a valid header name"),
            (
                "[quotas]\nstore = \"memcached://x\"\n",
                "quotas.store: \"memcached://x\" is neither",
            ),
            ("[quotas]\nstore = \"redis://\"\n", "has no host"),
            (
                "[quotas]\nstore = \"redis://127.0.0.1:6379/0\"\n",
                "a shared store holds only the rates",
            ),
            (
                "[quotas]\nrate = \"1/s\"\nstore = \"redis://u:secret@127.0.0.1:6379/x\"\n",
                "\"redis://u:***@127.0.0.1:6379/x\": ",
            ),
            (
                "[quotas]\nrate = \"1/s\"\nstore = \"redis://:${MRTR_TEST_NEVER_SET}@127.0.0.1/0\"\n",
                "quotas.store: environment variable MRTR_TEST_NEVER_SET is not set",
            ),
            (
                "[quotas]\nrate = \"1/s\"\nstore = \"rediss://127.0.0.1\"\n",
                "is neither \"local\" nor a redis:// URL",
            ),
            ("[quotas]\nstore = \"redis://:6379\"\n", "has no host"),
            ("[quotas]\nstore_failure = \"maybe\"\n", "quotas.store_failure"),
            ("[quotas]\nstore_timeout = \"0s\"\n", "greater than zero"),
            (
                "[quotas]\nmax_in_flight = 0\n",
                "quotas.max_in_flight: 0 is out of range",
            ),
            (
                "[quotas]\nmax_open_calls = 0\n",
                "quotas.max_open_calls: 0 is out of range",
            ),
            ("[quotas]\nmax_tracked_callers = 0\n", "out of range"),
            (
                "[quotas]\nmax_body_bytes_per_connection = 1024\n",
                "must be between server.max_body_bytes",
            ),
            (
                "[quotas]\nmax_body_bytes_per_connection = 1099511627776\n",
                "must be between server.max_body_bytes",
            ),
            (
                "[quotas]\nmax_body_bytes_per_caller = 1024\n",
                "quotas.max_body_bytes_per_caller (1024): must be between server.max_body_bytes",
            ),
            ("[quotas]\nbogus = 1\n", "quotas: unknown key `bogus`"),
            (
                "[[quotas.tool]]\nname = \"t\"\n",
                "quotas.tool \"t\": sets neither rate nor max_in_flight",
            ),
            ("[[quotas.tool]]\nrate = \"1/s\"\n", "quotas.tool.name: required"),
            (
                "[[quotas.tool]]\nname = \"t\"\nburst = 3\n",
                "quotas.tool.burst: needs quotas.tool.rate",
            ),
            (
                "[[quotas.tool]]\nname = \"t\"\nmax_in_flight = 1\n[[quotas.tool]]\nname = \"t\"\nmax_in_flight = 2\n",
                "quotas.tool: \"t\" is listed twice",
            ),
            (
                "[[quotas.tool]]\nname = \"t\"\nmax_inflight = 1\n",
                "unknown key `max_inflight`",
            ),
        ];
        for (text, want) in cases {
            let got = parse(text).map(|_| ()).unwrap_err().to_string();
            assert!(got.contains(want), "{text:?}: {got}");
        }
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
