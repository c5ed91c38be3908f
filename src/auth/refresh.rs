//! The loop that keeps the issuer's keys fresh (docs/src/authorization.md, "The issuer's
//! keys"): the first fetch at once, retried quickly while no set is loaded; then again after
//! the set's `Cache-Control: max-age`, within `jwks_refresh_min` and `jwks_refresh_max`; a
//! failed fetch keeps the set and is retried after `jwks_refresh_min`.
//!
//! It reads the running config every round (at least once a second), through a closure: a
//! reload that turns `[auth]` on, or names another issuer or source, is fetched for at once.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::time::Instant;

use super::issuer_keys::{FetchOutcome, IssuerKeys, Source};
use crate::config::{AuthConfig, JwksSource};

/// What the loop reads from the running config each round.
#[derive(Debug, Clone)]
pub struct JwksConfig {
    pub auth: AuthConfig,
    /// The client of `[upstream]` that verifies `https://` (its roots: `tls_ca`, else the
    /// system's); `None` when the config built none.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// How often the config is read again while nothing is due.
const RECHECK: Duration = Duration::from_secs(1);

/// The first retry while no set is loaded; doubled each time, up to `jwks_refresh_min`.
const FIRST_RETRY: Duration = Duration::from_millis(250);

/// Keeps `store` fresh until dropped (the router aborts it at shutdown). `config` gives the
/// running config, `None` while there is nothing to fetch (auth off, or its keys in a file);
/// each fetch counts into `refreshes` (labels `REFRESH_RESULTS`).
pub async fn keep_fresh(store: &IssuerKeys, config: impl Fn() -> Option<JwksConfig>, refreshes: IntCounterVec) {
    store.count_into(refreshes);
    // What the last fetch was for: another source, or the set dropped since, fetches at once.
    let mut fetched_for: Option<(Source, u64)> = None;
    let mut due = Instant::now();
    let mut retry = FIRST_RETRY;
    loop {
        // Read before the config: a reload drops the set before the config it applies is seen.
        let generation = store.generation();
        let Some(c) = config().filter(|c| !matches!(c.auth.jwks, JwksSource::File { .. })) else {
            fetched_for = None;
            tokio::time::sleep(RECHECK).await;
            continue;
        };
        store.verify_with(c.tls.clone());
        let now_for = (Source::of(&c.auth), generation);
        if fetched_for.as_ref() != Some(&now_for) {
            due = Instant::now();
            retry = FIRST_RETRY;
        }
        let now = Instant::now();
        if now < due {
            tokio::time::sleep((due - now).min(RECHECK)).await;
            continue;
        }
        let outcome = store.refresh(&c.auth).await;
        fetched_for = Some(now_for);
        due = Instant::now() + next_fetch(outcome, store.current().is_some(), &c.auth, &mut retry);
    }
}

/// How long after a fetch that ended with `outcome` the next one is made; `loaded`: a set is
/// in use. `retry` is the wait while none is, doubled at each failure.
fn next_fetch(outcome: FetchOutcome, loaded: bool, cfg: &AuthConfig, retry: &mut Duration) -> Duration {
    let (min, max) = (cfg.jwks_refresh_min, cfg.jwks_refresh_max);
    match outcome {
        FetchOutcome::Loaded { max_age } => {
            *retry = FIRST_RETRY;
            max_age.unwrap_or(max).max(min).min(max)
        }
        FetchOutcome::Failed if loaded => min,
        FetchOutcome::Failed => {
            let wait = (*retry).min(min);
            *retry = (*retry * 2).min(min);
            wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(min: u64, max: u64) -> AuthConfig {
        let text = format!(
            "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9\"\n[auth]\nissuer = \"http://127.0.0.1:1\"\n\
             jwks_uri = \"http://127.0.0.1:1/jwks\"\njwks_refresh_min = \"{min}s\"\njwks_refresh_max = \"{max}s\"\n\
             [auth.resource_metadata]\nresource = \"http://127.0.0.1:2/mcp\"\n"
        );
        let config = crate::config::Config::parse(std::path::Path::new("t.toml"), &text).unwrap();
        config.auth.unwrap()
    }

    #[test]
    fn max_age_is_clamped_to_the_bounds_and_missing_means_the_max() {
        let cfg = auth(60, 3600);
        let mut retry = FIRST_RETRY;
        let loaded = |max_age: Option<u64>| FetchOutcome::Loaded {
            max_age: max_age.map(Duration::from_secs),
        };
        let secs = Duration::from_secs;
        assert_eq!(next_fetch(loaded(Some(300)), true, &cfg, &mut retry), secs(300));
        assert_eq!(next_fetch(loaded(Some(0)), true, &cfg, &mut retry), secs(60));
        assert_eq!(next_fetch(loaded(Some(86_400)), true, &cfg, &mut retry), secs(3600));
        assert_eq!(next_fetch(loaded(Some(u64::MAX)), true, &cfg, &mut retry), secs(3600));
        assert_eq!(next_fetch(loaded(None), true, &cfg, &mut retry), secs(3600));
    }

    #[test]
    fn failures_retry_quickly_while_nothing_is_loaded_then_after_the_min() {
        let cfg = auth(2, 3600);
        let mut retry = FIRST_RETRY;
        let waits: Vec<u128> = (0..6)
            .map(|_| next_fetch(FetchOutcome::Failed, false, &cfg, &mut retry).as_millis())
            .collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 2000, 2000]);
        assert_eq!(
            next_fetch(FetchOutcome::Failed, true, &cfg, &mut retry),
            Duration::from_secs(2)
        );
        // A success starts the backoff over.
        next_fetch(FetchOutcome::Loaded { max_age: None }, true, &cfg, &mut retry);
        assert_eq!(retry, FIRST_RETRY);
    }
}
