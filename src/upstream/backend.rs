//! One backend: its identity, address, health state, in-flight accounting, how it is reached
//! (plain or TLS, HTTP/1.1 or HTTP/2: swapped in place on reload) and its connection pools.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use std::hash::Hasher;

use arc_swap::ArcSwapOption;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::HeaderValue;
use rustls::pki_types::ServerName;
use siphasher::sip::SipHasher13;

use super::h2::H2Pool;
use super::pool::{ConnPool, Endpoint, PooledConn, Room};
use super::slots::SlotGauges;
use super::tls::{BackendTls, ConnectError, Stream};
use crate::config::{defaults, BackendConfig, UpstreamConfig};
use crate::metrics::Metrics;

/// Stable identity of a backend: a digest of its name. Pins store this (8 bytes) rather than
/// the name, and it survives reloads as long as the name does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKey(pub u64);

impl BackendKey {
    pub fn of(name: &str) -> BackendKey {
        let mut h = SipHasher13::new_with_keys(0x6d72_7472, 0x6261_636b);
        h.write(name.as_bytes());
        BackendKey(h.finish())
    }
}

/// One backend instance. Shared by every snapshot that lists it, so its in-flight count
/// carries across reloads.
pub struct Backend {
    pub(crate) key: BackendKey,
    pub(crate) name: Arc<str>,
    /// Ring share; updated in place on reload.
    weight: AtomicU32,
    /// What the config says of it (name, URL, weight at creation).
    config: BackendConfig,
    /// Where its connections go: the URL's host (IPv6 without brackets) and port.
    endpoint: Endpoint,
    /// The URL's authority as the `Host` header of upstream requests.
    host: HeaderValue,
    /// Idle keep-alive HTTP/1.1 connections to this backend.
    pub(crate) pool: Arc<ConnPool>,
    /// Its HTTP/2 connections, when `http2` is on.
    pub(crate) h2: Arc<H2Pool>,
    /// HTTP/2 to it (`[[backend]] http2`, else `[upstream] http2`); changed in place on reload.
    http2: AtomicBool,
    /// TLS to it, for an `https://` backend: `[upstream]`'s client configs with a resumption
    /// cache of its own; swapped in place on reload (renewed files), for new connections.
    tls: ArcSwapOption<BackendTls>,
    /// Requests sent and not yet finished (response body done or dropped).
    inflight: AtomicI64,
    /// This backend's metric children, resolved once (label lookups are not free).
    metrics: Option<BackendMetrics>,
    /// False while ejected by health checks.
    healthy: AtomicBool,
    /// Consecutive failed checks or requests (reset by any success).
    failures: AtomicU32,
    /// Consecutive successful active checks while ejected.
    successes: AtomicU32,
    /// Incarnation: changes whenever the backend is ejected, so pins made before an ejection
    /// never follow it into a restarted instance that lost their state.
    epoch: AtomicU32,
    /// When it was last ejected (milliseconds since the UNIX epoch; 0: never, as this router
    /// saw it): a sealed token issued before then names an instance that is gone.
    ejected_ms: AtomicU64,
    /// When its health last changed (milliseconds since the UNIX epoch; its creation at first),
    /// what ejected it last ([`Ejector`] as `u8`, 0: never ejected), and how often it was
    /// ejected: for the status page, written only when health changes.
    health_since_ms: AtomicU64,
    ejected_by: AtomicU8,
    ejections: AtomicU32,
    /// Drained on request through the admin listener (a deploy): no new keys.
    pub(crate) admin_drained: AtomicBool,
    /// Pins naming this backend at the last sweep.
    pub(crate) pins: AtomicUsize,
}

struct BackendMetrics {
    inflight: prometheus::IntGauge,
    duration: prometheus::Histogram,
    requests_vec: prometheus::IntCounterVec,
    /// `mrtr_requests_total` children by (method label, status): a few dozen pairs at most
    /// (labels are a fixed set), so a scan beats hashing.
    requests: parking_lot::RwLock<Vec<(&'static str, u16, prometheus::IntCounter)>>,
}

/// Source of backend epochs: unique in the process, so a backend removed and added again
/// under the same name never matches pins of its earlier life.
static NEXT_EPOCH: AtomicU32 = AtomicU32::new(1);

fn next_epoch() -> u32 {
    NEXT_EPOCH.fetch_add(1, Ordering::Relaxed)
}

/// What ejected a backend: failed active health checks, or failed requests (passive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ejector {
    Checks = 1,
    Requests = 2,
}

impl Ejector {
    pub fn label(self) -> &'static str {
        match self {
            Ejector::Checks => "active",
            Ejector::Requests => "passive",
        }
    }
}

/// A backend's health history as the status page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthNote {
    /// When health last changed (its creation at first), milliseconds since the UNIX epoch.
    pub since_ms: u64,
    /// What ejected it last, if it ever was.
    pub ejected_by: Option<Ejector>,
    /// Ejections since the router learned of it (each one a new incarnation).
    pub ejections: u32,
}

/// A change of a backend's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    Ejected,
    Readmitted,
}

impl Backend {
    pub fn new(cfg: &BackendConfig, upstream: &UpstreamConfig, metrics: Option<&Metrics>) -> Backend {
        let opened = metrics.map(|m| m.upstream_connections.with_label_values(&[&cfg.name]));
        let h2 = H2Pool::new(cfg.scheme.clone(), cfg.authority.clone(), opened.clone());
        let slot_gauges = metrics.map(|m| SlotGauges {
            open: m.upstream_open.with_label_values(&[&cfg.name]),
            queued: m.upstream_queued.with_label_values(&[&cfg.name]),
        });
        let metrics = metrics.map(|m| BackendMetrics {
            inflight: m.backend_inflight.with_label_values(&[&cfg.name]),
            duration: m.request_duration.with_label_values(&[&cfg.name]),
            requests_vec: m.requests_total.clone(),
            requests: Default::default(),
        });
        Backend {
            key: BackendKey::of(&cfg.name),
            name: cfg.name.as_str().into(),
            weight: AtomicU32::new(cfg.weight),
            config: cfg.clone(),
            endpoint: Endpoint::of(&cfg.authority),
            host: HeaderValue::from_str(cfg.authority.as_str()).expect("an authority is a valid header value"),
            pool: ConnPool::new(opened, slot_gauges),
            h2,
            http2: AtomicBool::new(false),
            tls: ArcSwapOption::empty(),
            inflight: AtomicI64::new(0),
            metrics,
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            epoch: AtomicU32::new(next_epoch()),
            ejected_ms: AtomicU64::new(0),
            health_since_ms: AtomicU64::new(unix_ms(SystemTime::now())),
            ejected_by: AtomicU8::new(0),
            ejections: AtomicU32::new(0),
            admin_drained: AtomicBool::new(false),
            pins: AtomicUsize::new(0),
        }
        .refreshed(cfg, upstream)
    }

    fn refreshed(self, cfg: &BackendConfig, upstream: &UpstreamConfig) -> Backend {
        self.refresh(cfg, upstream);
        self
    }

    /// Takes what a reload may change in place: weight, HTTP/2, the TLS client configs (renewed
    /// files reach new connections; those open stay), the idle timeout.
    pub fn refresh(&self, cfg: &BackendConfig, upstream: &UpstreamConfig) {
        self.set_weight(cfg.weight);
        self.http2.store(cfg.http2.unwrap_or(upstream.http2), Ordering::Relaxed);
        self.pool.set_max_idle(upstream.idle_timeout);
        self.pool
            .set_limits(upstream.max_connections_per_backend, upstream.queue_timeout);
        if cfg.scheme != Scheme::HTTPS {
            return;
        }
        let Some(base) = &upstream.tls.clients else {
            // The config builds them whenever a backend is https.
            self.tls.store(None);
            return;
        };
        let name = cfg.tls_server_name.as_deref().unwrap_or(&self.endpoint.host);
        let Ok(name) = ServerName::try_from(name.to_string()) else {
            // Checked when the config was read; a URL's host is a valid name.
            self.tls.store(None);
            return;
        };
        let current = self.tls.load();
        let same = current
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(&t.base, base) && t.server_name == name);
        if !same {
            self.tls.store(Some(Arc::new(BackendTls::new(base, name))));
        }
    }

    /// Whether requests to it go over HTTP/2.
    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight, Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// This backend as it is now (its epoch), for a request about to be sent.
    pub fn incarnation(self: &Arc<Self>) -> Incarnation {
        Incarnation {
            backend: self.clone(),
            epoch: self.epoch(),
        }
    }

    /// Whether a sealed token issued at `issued_ms` (milliseconds since the UNIX epoch) may still
    /// name this instance: it was issued after the backend's last ejection, as this router saw it.
    pub fn issued_since_ejection(&self, issued_ms: u64) -> bool {
        issued_ms > self.ejected_ms.load(Ordering::Acquire)
    }

    /// Counts a failed request (passive health); ejects after `unhealthy_after` in a row.
    pub fn record_failure(&self, unhealthy_after: u32) -> Option<HealthChange> {
        self.fail(unhealthy_after, Ejector::Requests)
    }

    /// Counts a failed active check; ejects after `unhealthy_after` failures in a row.
    pub fn record_check_failure(&self, unhealthy_after: u32) -> Option<HealthChange> {
        self.fail(unhealthy_after, Ejector::Checks)
    }

    fn fail(&self, unhealthy_after: u32, by: Ejector) -> Option<HealthChange> {
        self.successes.store(0, Ordering::Relaxed);
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= unhealthy_after && self.healthy.swap(false, Ordering::AcqRel) {
            let now = unix_ms(SystemTime::now());
            self.ejected_ms.store(now, Ordering::Release);
            self.epoch.store(next_epoch(), Ordering::Release);
            self.health_since_ms.store(now, Ordering::Relaxed);
            self.ejected_by.store(by as u8, Ordering::Relaxed);
            self.ejections.fetch_add(1, Ordering::Relaxed);
            return Some(HealthChange::Ejected);
        }
        None
    }

    /// When its health last changed, and what ejected it last.
    pub fn health_note(&self) -> HealthNote {
        HealthNote {
            since_ms: self.health_since_ms.load(Ordering::Relaxed),
            ejected_by: match self.ejected_by.load(Ordering::Relaxed) {
                1 => Some(Ejector::Checks),
                2 => Some(Ejector::Requests),
                _ => None,
            },
            ejections: self.ejections.load(Ordering::Relaxed),
        }
    }

    /// Counts a successful active check; re-admits after `healthy_after` in a row.
    pub fn record_check_success(&self, healthy_after: u32) -> Option<HealthChange> {
        self.failures.store(0, Ordering::Relaxed);
        if self.is_healthy() {
            return None;
        }
        let n = self.successes.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= healthy_after && !self.healthy.swap(true, Ordering::AcqRel) {
            self.successes.store(0, Ordering::Relaxed);
            self.health_since_ms
                .store(unix_ms(SystemTime::now()), Ordering::Relaxed);
            return Some(HealthChange::Readmitted);
        }
        None
    }

    /// A request answered: the failure streak ends (re-admission needs active checks).
    pub fn record_request_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    pub fn authority(&self) -> &Authority {
        &self.config.authority
    }

    /// Where connections to this backend go.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A kept-alive connection from the pool (a stream on an HTTP/2 connection with room),
    /// else one being opened: the only place that chooses between the two (the request path and
    /// the health checks both come here).
    #[inline]
    pub fn connection(&self) -> Connection<'_> {
        if self.is_http2() {
            return self.http2_connection();
        }
        match self.pool.checkout() {
            Some(conn) => Connection::Ready(conn),
            // Boxed: a cold path, kept out of every request's future.
            None => Connection::Opening(Box::pin(self.open_http1(true))),
        }
    }

    /// A connection for an active health check: as [`Backend::connection`], but one beyond
    /// `max_connections_per_backend` when the backend is at it (a backend busy with long calls
    /// is up, and its check must not wait behind them).
    pub fn check_connection(&self) -> Connection<'_> {
        match (self.is_http2(), self.pool.checkout()) {
            (true, _) => self.http2_connection(),
            (false, Some(conn)) => Connection::Ready(conn),
            (false, None) => Connection::Opening(Box::pin(self.open_http1(false))),
        }
    }

    /// A connection for a request sent again (its first one was closed, or the backend refused
    /// the HTTP/2 stream): a new HTTP/1.1 connection; an HTTP/2 stream as for any request.
    pub fn reconnect(&self) -> Connection<'_> {
        match self.is_http2() {
            true => self.http2_connection(),
            false => Connection::Opening(Box::pin(self.open_http1(true))),
        }
    }

    fn http2_connection(&self) -> Connection<'_> {
        let max_idle = self.pool.max_idle();
        match self.h2.checkout(max_idle) {
            Some(lease) => Connection::Ready(PooledConn::http2(lease, &self.h2, true)),
            None => Connection::Opening(Box::pin(async move {
                let lease = self.h2.connect(self.open(true), max_idle).await?;
                Ok(PooledConn::http2(lease, &self.h2, false))
            })),
        }
    }

    /// A new HTTP/1.1 connection, under the backend's cap when `bounded`: past it, the request
    /// waits for a slot or for a connection put back (`queue_timeout`), then is refused as busy.
    async fn open_http1(&self, bounded: bool) -> Result<PooledConn, ConnectError> {
        let slot = match bounded {
            true => match self.pool.room().await {
                Room::Slot(slot) => slot,
                Room::Idle(conn) => return Ok(conn),
                Room::Busy => return Err(ConnectError::busy()),
            },
            false => self.pool.slots.take_beyond_limit(),
        };
        let stream = self.open(false).await?;
        self.pool.connect(stream, slot).await
    }

    /// A new connection's byte stream: TCP, under TLS for an `https://` backend (ALPN `h2` or
    /// `http/1.1`), within [`defaults::CONNECT_TIMEOUT`] for the two. A health check with no
    /// path is this.
    pub async fn open(&self, http2: bool) -> Result<Stream, ConnectError> {
        let tls = match self.config.scheme == Scheme::HTTPS {
            true => match self.tls.load_full() {
                Some(tls) => Some(tls),
                None => {
                    let e = std::io::Error::other("no TLS client config for this backend");
                    return Err(ConnectError::tls(e));
                }
            },
            false => None,
        };
        let opening = async {
            let tcp = self.endpoint.connect().await.map_err(ConnectError::connect)?;
            tcp.set_nodelay(true).map_err(ConnectError::connect)?;
            match &tls {
                Some(tls) => tls.handshake(tcp, http2).await,
                None => Ok(Stream::Plain(tcp)),
            }
        };
        match tokio::time::timeout(defaults::CONNECT_TIMEOUT, opening).await {
            Ok(result) => result,
            Err(_) => {
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
                Err(match tls {
                    Some(_) => ConnectError::tls(e),
                    None => ConnectError::connect(e),
                })
            }
        }
    }

    /// The `Host` header for requests to this backend.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// Whether this backend object still matches `cfg` (else a reload replaces it): the same
    /// name and URL. Weight, HTTP/2 and the TLS name are not identity: a backend that changes
    /// them keeps its object, counts and pins ([`Backend::refresh`] takes them).
    pub fn matches(&self, cfg: &BackendConfig) -> bool {
        let c = &self.config;
        (&c.name, &c.scheme, &c.authority, &c.base_path) == (&cfg.name, &cfg.scheme, &cfg.authority, &cfg.base_path)
    }

    #[cfg(test)]
    pub fn for_test(name: &str, weight: u32) -> Arc<Backend> {
        let cfg = BackendConfig {
            name: name.into(),
            scheme: http::uri::Scheme::HTTP,
            authority: Authority::from_static("127.0.0.1:1"),
            base_path: String::new(),
            weight,
            http2: None,
            tls_server_name: None,
        };
        let upstream = crate::config::Config::parse(std::path::Path::new("t.toml"), "[discovery]\ndns = \"x:1\"\n")
            .expect("a valid config")
            .upstream;
        Arc::new(Backend::new(&cfg, &upstream, None))
    }

    /// Counts an answered request in `mrtr_requests_total` and `mrtr_request_duration_seconds`.
    pub fn observe_request(&self, method: &'static str, status: http::StatusCode, seconds: f64) {
        let Some(m) = &self.metrics else { return };
        m.duration.observe(seconds);
        let status_code = status.as_u16();
        let is_key = |&&(m, s, _): &&(&str, u16, prometheus::IntCounter)| s == status_code && m == method;
        if let Some((_, _, c)) = m.requests.read().iter().find(is_key) {
            c.inc();
            return;
        }
        let mut seen = m.requests.write();
        if !seen.iter().any(|e| is_key(&e)) {
            let c = m.requests_vec.with_label_values(&[&self.name, method, status.as_str()]);
            seen.push((method, status_code, c));
        }
        let (_, _, c) = seen.iter().find(is_key).expect("just added");
        c.inc();
    }

    pub fn url(&self) -> String {
        self.config.url()
    }

    pub fn inflight(&self) -> i64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Counts a request in flight until the returned guard drops.
    pub fn start_request(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.inflight.inc();
        }
        InflightGuard(self.clone())
    }

    /// The request target (origin form) for a request's path and query, under the backend's
    /// base path.
    pub fn target_for(&self, path_and_query: Option<&PathAndQuery>) -> Result<PathAndQuery, http::Error> {
        let pq = path_and_query.map_or("/", |p| p.as_str());
        let base_path = &self.config.base_path;
        if base_path.is_empty() {
            return Ok(path_and_query
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")));
        }
        Ok(format!("{base_path}{pq}").parse()?)
    }
}

/// A backend as it was when a request was sent to it. An ejection while the request is in
/// flight changes the backend's epoch, and then no pin its answer makes may follow the backend
/// into the instance that comes back.
#[derive(Clone)]
pub struct Incarnation {
    pub backend: Arc<Backend>,
    pub epoch: u32,
}

/// A connection to a backend: taken from the pool at once, or still being opened.
pub enum Connection<'a> {
    Ready(PooledConn),
    Opening(std::pin::Pin<Box<dyn std::future::Future<Output = Result<PooledConn, ConnectError>> + Send + 'a>>),
}

/// Milliseconds since the UNIX epoch.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Decrements the backend's in-flight count when the request is over.
pub struct InflightGuard(Arc<Backend>);

impl InflightGuard {
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
        if let Some(m) = &self.0.metrics {
            m.inflight.dec();
        }
    }
}
