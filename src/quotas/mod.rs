//! Fair shares between callers (`[quotas]`, docs/src/configuration.md): who a caller is
//! (`caller`), the rate of new calls (`rate`, GCRA), requests in flight (`inflight`) and calls
//! held open (`open_calls`) per caller, and per tool; each table bounded, with one overflow
//! entry past the cap. [`Quotas`] bundles them behind one [`Quotas::admit`].
//!
//! **Admission respects calls.** A call is admitted by the rate quotas once, at its first
//! request: a follow-up (`Request::new_call` false) is never refused by a rate, since refusing
//! round 3 of a call whose rounds 1-2 ran would strand its state on a worker; follow-ups are
//! bounded by `routing.max_rounds` and the pin's ttl instead. They do count toward in-flight
//! quotas, which hold nothing of a call's state.
//!
//! Depends on `config` only; never on the request path's types: the request path passes in
//! what it read (principal tag, headers, peer, tool, whether the request continues a call).

mod body;
mod caller;
mod inflight;
mod open_calls;
mod rate;
mod refused;
mod store;
mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

pub use body::{BodyShare, BodyShares};
pub use caller::{CallerKey, CallerRule};
pub use inflight::{PerCaller, Permit, Refused, Shared, SharedPermit};
pub use open_calls::{OpenCall, OpenCalls};
pub use rate::{RateLimiter, RetryAfter};
pub use refused::{RefusedCallers, MINUTES as REFUSED_MINUTES};
pub use store::StoreMetrics;

use crate::config::{QuotaStore, QuotasConfig, Rate};
use store::{RedisStore, SharedRate, Verdict};

/// The `Retry-After` of a refusal that no clock decides (in flight, open calls): a request or
/// call of the same caller may end any moment.
const RETRY_AFTER_BUSY: Duration = Duration::from_secs(1);

/// Which quota refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    Rate,
    InFlight,
    OpenCalls,
}

impl Quota {
    /// The `Mcp-Router-Error` reason.
    pub fn reason(self) -> &'static str {
        match self {
            Quota::Rate => "rate_limited",
            Quota::InFlight => "too_many_in_flight",
            Quota::OpenCalls => "too_many_open_calls",
        }
    }

    /// The `quota` label of `mrtr_quota_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Quota::Rate => "rate",
            Quota::InFlight => "in_flight",
            Quota::OpenCalls => "open_calls",
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAdmitted {
    /// A quota of the caller's (or its tool's) refused it: 429.
    Refused(Refusal),
    /// The shared store could not check its rate, and `store_failure = "closed"`: 503, no
    /// refusal of the caller's.
    StoreUnavailable,
}

impl From<Refusal> for NotAdmitted {
    fn from(refusal: Refusal) -> NotAdmitted {
        NotAdmitted::Refused(refusal)
    }
}

/// Whose limit it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The caller's own.
    Caller,
    /// A `[[quotas.tool]]`'s (per caller for its rate, all callers for its in-flight count).
    Tool,
    /// The overflow entry callers past `max_tracked_callers` share.
    Overflow,
}

impl Scope {
    /// The `scope` label of `mrtr_quota_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Scope::Caller => "caller",
            Scope::Tool => "tool",
            Scope::Overflow => "overflow",
        }
    }
}

/// A refused request: the answer is 429 with `Retry-After` (and, for a rate, the
/// `RateLimit-Policy` and `RateLimit` headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub quota: Quota,
    pub scope: Scope,
    pub retry_after: Duration,
    /// The rate that refused, and its state, for the headers.
    rate: Option<(Rate, RetryAfter)>,
}

impl Refusal {
    fn busy(quota: Quota, scope: Scope, refused: Refused) -> Refusal {
        Refusal {
            quota,
            scope: if refused.overflow { Scope::Overflow } else { scope },
            retry_after: RETRY_AFTER_BUSY,
            rate: None,
        }
    }

    fn rate(scope: Scope, rate: Rate, retry: RetryAfter) -> Refusal {
        Refusal {
            quota: Quota::Rate,
            scope: if retry.overflow { Scope::Overflow } else { scope },
            retry_after: retry.after,
            rate: Some((rate, retry)),
        }
    }

    /// `Retry-After` in whole seconds: rounded up, at least 1 (a client told 0 retries at once).
    pub fn retry_after_secs(&self) -> u64 {
        whole_seconds(self.retry_after)
    }

    /// `RateLimit-Policy` and `RateLimit`, for a rate refusal.
    pub fn rate_limit_headers(&self) -> Option<(String, String)> {
        let name = match self.scope {
            Scope::Tool => "tool",
            Scope::Caller | Scope::Overflow => "caller",
        };
        self.rate.map(|(rate, retry)| rate_limit_headers(name, rate, &retry))
    }
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000).max(1) as u64
}

/// The `RateLimit-Policy` and `RateLimit` values (IETF httpapi-ratelimit-headers, draft 10)
/// for a refusal by `rate`: the policy says `q` calls per `w` seconds, `q` the burst and `w`
/// the time the burst takes to come back (`burst × T`, so `q / w` is the rate); the state says
/// none remain (`r=0`) and when the whole burst is back (`t`).
///
/// `RateLimit-Policy: "caller";q=40;w=2` and `RateLimit: "caller";r=0;t=2`.
pub fn rate_limit_headers(policy: &str, rate: Rate, retry: &RetryAfter) -> (String, String) {
    let emission = rate.period.as_nanos() as u64 / u64::from(rate.count.max(1));
    let window = whole_seconds(Duration::from_nanos(emission.saturating_mul(rate.burst.into())));
    let reset = whole_seconds(retry.reset);
    (
        format!("\"{policy}\";q={};w={window}", rate.burst),
        format!("\"{policy}\";r=0;t={reset}"),
    )
}

/// What the request path knows of a request when it asks for admission.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The tool of each `tools/call` in the request (a batch may call several), read from the
    /// verified body.
    pub tools: &'a [&'a str],
    /// The new calls the request starts: none for a follow-up of a call already admitted
    /// (`route::is_follow_up`), else one for each of its messages (a batch's elements each).
    /// The rate quotas count them.
    pub new_calls: u32,
    /// The request may start a multi-round call (its answer may pin): an open-call slot is
    /// reserved for it. Only for new calls: a follow-up's call holds its slot already.
    pub may_open_call: bool,
}

/// An admitted request: its in-flight counts, held until dropped (when the answer's body
/// ends), and its open-call slot, if it reserved one.
#[must_use = "the request is counted only while its admission is held"]
pub struct Admission {
    _in_flight: Option<Permit>,
    _tool_in_flight: Vec<SharedPermit>,
    open_call: Option<OpenCall>,
}

impl Admission {
    /// The reserved open-call slot, for the request path to keep with the call's pins (when
    /// the answer pins) or to drop (when it does not).
    pub fn take_open_call(&mut self) -> Option<OpenCall> {
        self.open_call.take()
    }
}

/// The quotas of one tool.
struct ToolQuotas {
    /// The tool's name in the shared store's keys.
    name: String,
    rate: Option<RateLimiter>,
    in_flight: Option<Arc<Shared>>,
}

/// What the quotas hold, for the metrics (`mrtr_quota_callers`) and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Callers tracked, all tables together (the caller rate, each tool's rate, in flight,
    /// open calls, body bytes).
    pub tracked: usize,
    /// Tables at `max_tracked_callers` now: a new caller of one shares its overflow entry.
    pub full_tables: usize,
    /// Rate checks of callers past the cap, served by the overflow buckets, since the start.
    pub overflowed: u64,
}

/// Every quota of one `[quotas]`, built once per config.
pub struct Quotas {
    caller: CallerRule,
    rate: Option<RateLimiter>,
    in_flight: Option<Arc<PerCaller>>,
    open_calls: Option<OpenCalls>,
    tools: HashMap<String, ToolQuotas>,
    bodies: Option<Arc<BodyShares>>,
    max_tracked_callers: usize,
    /// The shared store, when `store` names one: the rates above are then counted there (the
    /// local tables stay empty).
    shared: Option<RedisStore>,
    /// Who was refused lately, for the status page (written only by refusals).
    pub refused: RefusedCallers,
}

impl Quotas {
    /// The quotas of `config`, their clocks starting at `epoch`; a shared store reports to
    /// `store_metrics`.
    pub fn new(config: &QuotasConfig, epoch: Instant, store_metrics: StoreMetrics) -> Quotas {
        let cap = config.max_tracked_callers;
        let tools = config.tools.iter().map(|t| {
            let quotas = ToolQuotas {
                name: t.name.clone(),
                rate: t.rate.map(|r| RateLimiter::new(r, cap, epoch)),
                in_flight: t.max_in_flight.map(Shared::new),
            };
            (t.name.clone(), quotas)
        });
        Quotas {
            caller: CallerRule::new(config.caller.clone(), config.trusted_proxies.clone()),
            rate: config.rate.map(|r| RateLimiter::new(r, cap, epoch)),
            in_flight: config.max_in_flight.map(|n| PerCaller::new(n, cap)),
            open_calls: config.max_open_calls.map(|n| OpenCalls::new(n, cap)),
            tools: tools.collect(),
            bodies: config.max_body_bytes_per_caller.map(|n| BodyShares::new(n as u64, cap)),
            max_tracked_callers: cap,
            refused: RefusedCallers::new(epoch),
            shared: match &config.store {
                QuotaStore::Local => None,
                QuotaStore::Redis(url) => Some(RedisStore::new(
                    url,
                    config.store_timeout,
                    config.store_failure,
                    store_metrics,
                )),
            },
        }
    }

    /// The caller of a request (`caller::CallerRule::key`).
    pub fn caller(&self, principal: Option<&[u8; 16]>, headers: &HeaderMap, peer: IpAddr) -> CallerKey {
        self.caller.key(principal, headers, peer)
    }

    /// The client IP of a request, as the quotas see it (for the access log).
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        self.caller.client_ip(headers, peer)
    }

    /// Admits a request of `caller` at `now`, or says which quota refuses it. The counts that
    /// can be given back are taken first (in flight, then the open-call slot), the rates last
    /// (the tool's before the caller's), so a refused request spends at most one rate unit.
    /// Async for the shared store, whose rate check is a round trip; the local store never
    /// waits.
    pub async fn admit(
        &self,
        caller: CallerKey,
        request: &Request<'_>,
        now: Instant,
    ) -> Result<Admission, NotAdmitted> {
        let in_flight = match &self.in_flight {
            Some(q) => Some(
                q.try_acquire(caller)
                    .map_err(|r| Refusal::busy(Quota::InFlight, Scope::Caller, r))?,
            ),
            None => None,
        };
        let tools: Vec<&ToolQuotas> = request.tools.iter().filter_map(|name| self.tools.get(*name)).collect();
        let mut tool_in_flight = Vec::new();
        for shared in tools.iter().filter_map(|t| t.in_flight.as_ref()) {
            let refused = Refusal::busy(Quota::InFlight, Scope::Tool, Refused { overflow: false });
            tool_in_flight.push(shared.try_acquire().ok_or(refused)?);
        }
        let new_call = request.new_calls > 0;
        let open_call = match &self.open_calls {
            Some(q) if new_call && request.may_open_call => Some(
                q.try_open(caller)
                    .map_err(|r| Refusal::busy(Quota::OpenCalls, Scope::Caller, r))?,
            ),
            _ => None,
        };
        if new_call {
            // One unit of each tool's rate per call of it, then one of the caller's per new call.
            let mut rates: Vec<(Scope, &str, &RateLimiter)> = tools
                .iter()
                .filter_map(|t| Some((Scope::Tool, t.name.as_str(), t.rate.as_ref()?)))
                .collect();
            if let Some(limiter) = &self.rate {
                rates.extend((0..request.new_calls).map(|_| (Scope::Caller, "", limiter)));
            }
            match &self.shared {
                None => Self::check_rates(&rates, caller, now)?,
                Some(store) => Self::check_shared(store, &rates, caller, now).await?,
            }
        }
        Ok(Admission {
            _in_flight: in_flight,
            _tool_in_flight: tool_in_flight,
            open_call,
        })
    }

    /// A request's units of rates, the tools' first, in this replica's tables: refused at the
    /// first that has none left (the units before it stay spent).
    fn check_rates(rates: &[(Scope, &str, &RateLimiter)], caller: CallerKey, now: Instant) -> Result<(), Refusal> {
        for (scope, _, limiter) in rates {
            limiter
                .check(&caller, now)
                .map_err(|r| Refusal::rate(*scope, limiter.rate(), r))?;
        }
        Ok(())
    }

    /// A request's units of rates, the tools' first, in the shared store: one round trip.
    async fn check_shared(
        store: &RedisStore,
        rates: &[(Scope, &str, &RateLimiter)],
        caller: CallerKey,
        now: Instant,
    ) -> Result<(), NotAdmitted> {
        if rates.is_empty() {
            return Ok(());
        }
        let caller = caller.store_digest();
        let keys: Vec<SharedRate> = rates
            .iter()
            .map(|(scope, name, limiter)| {
                let key = match scope {
                    Scope::Tool => format!("mrtr:rate:tool:{name}:{caller}"),
                    _ => format!("mrtr:rate:caller:{caller}"),
                };
                SharedRate::of(limiter, key)
            })
            .collect();
        match store.check(&keys, now).await {
            Verdict::Admitted => Ok(()),
            Verdict::Refused(i, retry) => {
                let (scope, _, limiter) = rates[i];
                Err(Refusal::rate(scope, limiter.rate(), retry).into())
            }
            Verdict::Unavailable => Err(NotAdmitted::StoreUnavailable),
        }
    }

    /// Whether a tool has quotas of its own: only then is a `tools/call`'s tool name read.
    pub fn names_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Forgets the callers whose rate state is back to a full burst by `now` (the in-flight
    /// and open-call tables forget theirs as counts reach 0). The request path's owner calls it
    /// on a timer; returns how many were forgotten.
    pub fn prune(&self, now: Instant) -> usize {
        let tools = self.tools.values().filter_map(|t| t.rate.as_ref());
        self.rate.iter().chain(tools).map(|r| r.prune(now)).sum()
    }

    pub fn stats(&self) -> Stats {
        let rates = || {
            self.rate
                .iter()
                .chain(self.tools.values().filter_map(|t| t.rate.as_ref()))
        };
        let tables = rates()
            .map(RateLimiter::tracked)
            .chain(self.in_flight.as_ref().map(|q| q.tracked()))
            .chain(self.open_calls.as_ref().map(OpenCalls::tracked))
            .chain(self.bodies.as_ref().map(|b| b.tracked()));
        let (tracked, full_tables) = tables.fold((0, 0), |(sum, full), n| {
            (sum + n, full + usize::from(n >= self.max_tracked_callers))
        });
        Stats {
            tracked,
            full_tables,
            overflowed: rates().map(RateLimiter::overflowed).sum(),
        }
    }

    /// The share of `caller`'s bodies one body takes from (`max_body_bytes_per_caller`).
    pub fn body_share(&self, caller: CallerKey) -> Option<BodyShare> {
        self.bodies.as_ref().map(|b| b.share(caller))
    }
}
