//! The issuer's keys as the request path reads them: one swappable [`KeySet`], loaded from
//! `jwks_file` or fetched (docs/src/authorization.md, "The issuer's keys").
//!
//! Interface first, fetching to follow: `current` is one atomic load per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use super::jwks::{JwksError, KeySet};
use crate::config::{AuthConfig, JwksSource};

/// The key set in use, and when it was loaded.
pub struct KeyStore {
    set: ArcSwapOption<KeySet>,
    loaded_at: Mutex<Option<Instant>>,
}

/// How a refresh ended: the `result` label of `mrtr_jwks_refreshes_total`.
pub const REFRESH_RESULTS: [&str; 2] = ["ok", "error"];

impl KeyStore {
    /// A store for `cfg`: a `jwks_file`'s keys loaded now, fetched ones empty until the first fetch.
    pub fn new(cfg: Option<&AuthConfig>) -> KeyStore {
        let store = KeyStore {
            set: ArcSwapOption::empty(),
            loaded_at: Mutex::new(None),
        };
        if let Some(cfg) = cfg {
            let _ = store.apply(cfg);
        }
        store
    }

    /// Loads what `cfg` holds itself (a `jwks_file`'s contents, read when the config was): at
    /// start and at each reload. A fetched set is kept until the next fetch.
    pub fn apply(&self, cfg: &AuthConfig) -> Result<(), JwksError> {
        if let JwksSource::File { contents, .. } = &cfg.jwks {
            let parsed = KeySet::parse(contents)?;
            self.install(parsed.keys);
        }
        Ok(())
    }

    fn install(&self, keys: KeySet) {
        self.set.store(Some(Arc::new(keys)));
        *self.loaded_at.lock() = Some(Instant::now());
    }

    /// The keys in use; `None` while none could be loaded.
    pub fn current(&self) -> Option<Arc<KeySet>> {
        self.set.load_full()
    }

    /// How long ago the set in use was loaded.
    pub fn age(&self) -> Option<Duration> {
        self.loaded_at.lock().map(|t| t.elapsed())
    }

    /// A token named a key `seen` lacks: the keys are fetched again (at most once per
    /// `jwks_kid_refetch`, one fetch shared by every request that waits for it), and the set
    /// to try again with is returned if it changed.
    pub async fn refetch(&self, _cfg: &AuthConfig, _seen: &Arc<KeySet>) -> Option<Arc<KeySet>> {
        None
    }
}
