//! The issuer's keys as the request path reads them: one swappable [`KeySet`], loaded from
//! `jwks_file` or fetched (docs/src/authorization.md, "The issuer's keys").
//!
//! `current` is one atomic load per request. A fetch runs as a task of its own that everyone who
//! needs it awaits (the refresh loop, the requests whose access token names an unknown `kid`):
//! never two at once, and none cancelled because one waiter gave up or its client left.
//!
//! The last good set stays in use when a fetch fails or brings no usable key. It is dropped only
//! when a reload names another issuer or another source of keys: an access token must never verify
//! against the keys of an issuer the config no longer names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::Uri;
use parking_lot::Mutex;
use prometheus::IntCounterVec;

use super::fetch::{self, FetchError};
use super::jwks::{JwksError, KeySet, MAX_JWKS_BYTES};
use crate::config::{AuthConfig, JwksSource};

/// The key set in use, and how it is kept.
pub struct IssuerKeys {
    inner: Arc<Inner>,
}

/// How a refresh ended: the `result` label of `mrtr_jwks_refreshes_total`.
pub const REFRESH_RESULTS: [&str; 2] = ["ok", "error"];

/// How one fetch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOutcome {
    /// A set with usable keys is in use; `max_age` as its server said.
    Loaded { max_age: Option<Duration> },
    /// Nothing new is in use (the last good set, if any, stays).
    Failed,
}

/// Whose keys a set is: a reload that changes this drops the set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Source {
    issuer: String,
    from: From,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum From {
    Uri(Uri),
    Discovered,
    File(PathBuf),
}

impl Source {
    pub(super) fn of(cfg: &AuthConfig) -> Source {
        let from = match &cfg.jwks {
            JwksSource::Uri(uri) => From::Uri(uri.clone()),
            JwksSource::Discovered => From::Discovered,
            JwksSource::File { path, .. } => From::File(path.clone()),
        };
        Source {
            issuer: cfg.issuer.clone(),
            from,
        }
    }
}

type Flight = Shared<BoxFuture<'static, FetchOutcome>>;

struct Inner {
    set: ArcSwapOption<KeySet>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Whose keys `set` holds (`None` until a config with `[auth]` is applied).
    source: Option<Source>,
    /// Bumped each time `source` changes (and the set is dropped).
    generation: u64,
    loaded_at: Option<Instant>,
    /// SHA-256 of the document `set` was read from: the same document again keeps the same
    /// set, so that [`IssuerKeys::refetch`] can tell a changed set by pointer.
    document: Option<[u8; 32]>,
    /// The `jwks_uri` the issuer's metadata named (`JwksSource::Discovered`).
    discovered: Option<Uri>,
    /// The fetch under way, and its number.
    flight: Option<(u64, Flight)>,
    flights: u64,
    /// When the last fetch for an unknown `kid` began.
    kid_fetch_at: Option<Instant>,
    /// The last fetch failed, and said so in the log: the next failures of the streak do not.
    failing: bool,
    /// What verifies an `https://` issuer: the client of `[upstream]`, as the refresh loop
    /// last read it.
    tls: Option<Arc<rustls::ClientConfig>>,
    refreshes: Option<IntCounterVec>,
}

impl State {
    /// Whether keys fetched for `source` may go in (a store never configured takes any).
    fn serves(&self, source: &Source) -> bool {
        self.source.as_ref().is_none_or(|s| s == source)
    }
}

impl IssuerKeys {
    /// A store for `cfg`: a `jwks_file`'s keys loaded now, fetched ones empty until the first fetch.
    pub fn new(cfg: Option<&AuthConfig>) -> IssuerKeys {
        let store = IssuerKeys {
            inner: Arc::new(Inner {
                set: ArcSwapOption::empty(),
                state: Mutex::new(State::default()),
            }),
        };
        if let Some(cfg) = cfg {
            let _ = store.apply(cfg);
        }
        store
    }

    /// Takes `cfg` at start and at each reload: another issuer or source of keys drops the set
    /// in use; a `jwks_file`'s contents (read when the config was) replace it. A fetched set is
    /// kept until the next fetch.
    pub fn apply(&self, cfg: &AuthConfig) -> Result<(), JwksError> {
        let source = Source::of(cfg);
        let mut state = self.inner.state.lock();
        if state.source.as_ref() != Some(&source) {
            if state.source.is_some() {
                tracing::info!(issuer = %cfg.issuer, "auth: the issuer or its keys' source changed; the keys in use are dropped");
            }
            self.inner.set.store(None);
            // A fetch under way for the old source is let go: it can no longer install its
            // keys, and the new source's first fetch must not wait on it.
            *state = State {
                source: Some(source),
                generation: state.generation + 1,
                flights: state.flights,
                tls: state.tls.take(),
                refreshes: state.refreshes.take(),
                ..State::default()
            };
        }
        if let JwksSource::File { contents, .. } = &cfg.jwks {
            let parsed = KeySet::parse(contents)?;
            if parsed.keys.is_empty() {
                return Err(JwksError::NotJwks("no key in it can verify a token".into()));
            }
            self.inner.install(&mut state, parsed.keys, contents);
        }
        Ok(())
    }

    /// The keys in use; `None` while none could be loaded.
    pub fn current(&self) -> Option<Arc<KeySet>> {
        self.inner.set.load_full()
    }

    /// How long ago the set in use was loaded (fetched again unchanged counts as loaded).
    pub fn age(&self) -> Option<Duration> {
        self.inner.state.lock().loaded_at.map(|t| t.elapsed())
    }

    /// An access token named a key `seen` lacks: the keys are fetched again (at most once per
    /// `jwks_kid_refetch`, one fetch shared by every request that waits for it, each waiting
    /// at most `jwks_timeout`), and the set to try again with is returned if it changed.
    pub async fn refetch(&self, cfg: &AuthConfig, seen: &Arc<KeySet>) -> Option<Arc<KeySet>> {
        let changed = || self.current().filter(|now| !Arc::ptr_eq(now, seen));
        if let Some(now) = changed() {
            return Some(now);
        }
        if matches!(cfg.jwks, JwksSource::File { .. }) {
            return None;
        }
        let flight = {
            let mut state = self.inner.state.lock();
            match &state.flight {
                Some((_, flight)) => flight.clone(),
                None if state.kid_fetch_at.is_some_and(|at| at.elapsed() < cfg.jwks_kid_refetch) => return None,
                None => {
                    state.kid_fetch_at = Some(Instant::now());
                    self.inner.start(&mut state, cfg)
                }
            }
        };
        let _ = tokio::time::timeout(cfg.jwks_timeout, flight).await;
        changed()
    }

    /// Fetches the keys now, or joins the fetch under way.
    pub async fn refresh(&self, cfg: &AuthConfig) -> FetchOutcome {
        let flight = {
            let mut state = self.inner.state.lock();
            match &state.flight {
                Some((_, flight)) => flight.clone(),
                None => self.inner.start(&mut state, cfg),
            }
        };
        flight.await
    }

    /// The client that verifies an `https://` issuer from now on (`[upstream]`'s).
    pub fn verify_with(&self, tls: Option<Arc<rustls::ClientConfig>>) {
        self.inner.state.lock().tls = tls;
    }

    /// Each fetch from now on counts into `refreshes` (`mrtr_jwks_refreshes_total`, labels
    /// [`REFRESH_RESULTS`]).
    pub fn count_into(&self, refreshes: IntCounterVec) {
        self.inner.state.lock().refreshes = Some(refreshes);
    }

    /// Counts the changes of source: the refresh loop fetches at once after one.
    pub(super) fn generation(&self) -> u64 {
        self.inner.state.lock().generation
    }
}

impl Inner {
    /// A fetch as a task of its own (`state` is the store's, locked).
    fn start(self: &Arc<Self>, state: &mut State, cfg: &AuthConfig) -> Flight {
        state.flights += 1;
        let number = state.flights;
        let (inner, cfg) = (self.clone(), cfg.clone());
        let task = tokio::spawn(async move {
            // Ended, however it ends (a panic, the runtime going away): the next one may begin.
            let _landed = Landed(&inner, number);
            inner.fetch(&cfg).await
        });
        let flight = async move { task.await.unwrap_or(FetchOutcome::Failed) }
            .boxed()
            .shared();
        state.flight = Some((number, flight.clone()));
        flight
    }

    async fn fetch(&self, cfg: &AuthConfig) -> FetchOutcome {
        let source = Source::of(cfg);
        let (tls, refreshes, discovered) = {
            let state = self.state.lock();
            let discovered = state.discovered.clone().filter(|_| state.serves(&source));
            (state.tls.clone(), state.refreshes.clone(), discovered)
        };
        let loaded = match self.download(cfg, &source, tls.as_ref(), discovered).await {
            Ok((url, fetched)) => match KeySet::parse(&fetched.body) {
                Ok(parsed) if !parsed.keys.is_empty() => {
                    for skipped in &parsed.skipped {
                        tracing::debug!(url = %url, kid = ?skipped.kid, reason = skipped.reason, "auth: a key of the issuer's set is skipped");
                    }
                    let mut state = self.state.lock();
                    let installed = state.serves(&source);
                    if installed {
                        self.install(&mut state, parsed.keys, &fetched.body);
                    }
                    Ok((url, fetched.max_age, installed))
                }
                Ok(_) => Err((url, "no key in it can verify a token".to_string())),
                Err(e) => Err((url, e.to_string())),
            },
            Err((url, e)) => Err((url, e.to_string())),
        };
        let result = if loaded.is_ok() { "ok" } else { "error" };
        if let Some(counter) = &refreshes {
            counter.with_label_values(&[result]).inc();
        }
        let mut state = self.state.lock();
        let was_failing = std::mem::replace(&mut state.failing, loaded.is_err());
        match loaded {
            Ok((url, max_age, installed)) => {
                if was_failing {
                    tracing::info!(url = %url, "auth: the issuer's keys fetched again");
                }
                match installed {
                    true => FetchOutcome::Loaded { max_age },
                    // The config named another source meanwhile.
                    false => FetchOutcome::Failed,
                }
            }
            Err((url, why)) => {
                if state.serves(&source) {
                    // It may have moved: the metadata is read again next time.
                    state.discovered = None;
                }
                if !was_failing {
                    let kept = if self.set.load().is_some() {
                        "the last good set stays in use"
                    } else {
                        "no set to verify tokens with yet"
                    };
                    tracing::warn!(url = %url, error = %why, "auth: the issuer's keys could not be fetched; {kept}");
                }
                FetchOutcome::Failed
            }
        }
    }

    /// The key set's document, and the URL it came from (found in the metadata first, when
    /// discovered).
    async fn download(
        &self,
        cfg: &AuthConfig,
        source: &Source,
        tls: Option<&Arc<rustls::ClientConfig>>,
        discovered: Option<Uri>,
    ) -> Result<(String, fetch::Fetched), (String, FetchError)> {
        let url = match (&cfg.jwks, discovered) {
            (JwksSource::Uri(url), _) => url.clone(),
            (JwksSource::Discovered, Some(url)) => url,
            (JwksSource::Discovered, None) => {
                let found = fetch::discover(&cfg.issuer, tls, cfg.jwks_timeout)
                    .await
                    .map_err(|e| (format!("{} (discovery)", cfg.issuer), e))?;
                let mut state = self.state.lock();
                if state.serves(source) {
                    state.discovered = Some(found.clone());
                }
                found
            }
            (JwksSource::File { path, .. }, _) => {
                let shown = path.display().to_string();
                return Err((
                    shown.clone(),
                    FetchError::Url(format!("{shown}: a file is read, never fetched")),
                ));
            }
        };
        let text = url.to_string();
        match fetch::get(&url, tls, MAX_JWKS_BYTES, cfg.jwks_timeout).await {
            Ok(fetched) => Ok((text, fetched)),
            Err(e) => Err((text, e)),
        }
    }

    /// Puts `keys`, read from `document`, in use (`state` is the store's, locked).
    fn install(&self, state: &mut State, keys: KeySet, document: &[u8]) {
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, document)
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        if state.document != Some(digest) || self.set.load().is_none() {
            self.set.store(Some(Arc::new(keys)));
            state.document = Some(digest);
        }
        state.loaded_at = Some(Instant::now());
    }
}

/// Clears the store's flight `.1` when dropped.
struct Landed<'a>(&'a Inner, u64);

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        if state.flight.as_ref().is_some_and(|(n, _)| *n == self.1) {
            state.flight = None;
        }
    }
}
