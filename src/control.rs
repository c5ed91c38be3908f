//! [`RouterControl`]: what a running router lets its owner do and see from outside the request
//! path: reload, run a round of upkeep now, and look at its backends, ring and pins. The tests
//! use it to observe the router; none of it changes routing except `reload` and `sweep`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::{Config, ConfigError};
use crate::pins::PinKey;
use crate::state::{Shared, Snapshot};
use crate::upstream::Backend;

pub use crate::pins::PinKind;
pub use crate::upstream::Resolver;

/// The controls of a running router (cheap to clone).
#[derive(Clone)]
pub struct RouterControl {
    shared: Arc<Shared>,
}

/// One backend as the router sees it at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendState {
    pub name: String,
    pub url: String,
    pub healthy: bool,
    /// Changes at every ejection: pins made before it never follow the backend.
    pub epoch: u32,
    pub inflight: i64,
    /// Pins naming it at the last sweep.
    pub pins: usize,
    /// Removed from the config or discovery, or drained by an operator.
    pub draining: bool,
    /// Removed (it serves only its pins until they end or `drain_timeout` passes).
    pub removed: bool,
    /// Idle keep-alive connections in its pool.
    pub idle_connections: usize,
    /// HTTP/1.1 connections open to it, idle or busy (at most `max_connections_per_backend`,
    /// plus one per health check under way).
    pub open_connections: usize,
}

/// A pin as the table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinState {
    /// The backend it names, or `<removed backend …>` when the router no longer knows it.
    pub backend: String,
    /// The backend's epoch when the pin was made.
    pub epoch: u32,
    pub rounds: u32,
    /// Finished, lingering for the replay window.
    pub finished: bool,
}

/// The routing state at one moment: one snapshot's config, backends and ring.
pub struct View {
    snap: Arc<Snapshot>,
}

fn state_of(b: &Backend, removed: bool) -> BackendState {
    BackendState {
        name: b.name.to_string(),
        url: b.url(),
        healthy: b.is_healthy(),
        epoch: b.epoch(),
        inflight: b.inflight(),
        pins: b.pins.load(Ordering::Relaxed),
        draining: removed || b.admin_drained.load(Ordering::Relaxed),
        removed,
        idle_connections: b.pool.idle_len(),
        open_connections: b.pool.slots.open(),
    }
}

impl RouterControl {
    pub(crate) fn new(shared: Arc<Shared>) -> RouterControl {
        RouterControl { shared }
    }

    /// Re-reads the config file (as SIGHUP does); an invalid file leaves the running config.
    pub fn reload(&self) -> Result<(), ConfigError> {
        self.shared.reload()
    }

    /// The routing state now.
    pub fn view(&self) -> View {
        View {
            snap: self.shared.snapshot(),
        }
    }

    /// The running config.
    pub fn config(&self) -> Config {
        self.shared.snapshot().config.clone()
    }

    /// Every backend the router knows: serving ones by name, then draining ones.
    pub fn backends(&self) -> Vec<BackendState> {
        let states = self.shared.backend_states();
        states.iter().map(|(b, removed)| state_of(b, *removed)).collect()
    }

    /// The backend named `name`, serving or draining.
    pub fn backend(&self, name: &str) -> Option<BackendState> {
        self.backends().into_iter().find(|b| b.name == name)
    }

    /// The pin of `kind` for the handle a client echoes (a routing id, a `requestState`, a task
    /// or session id), without refreshing it.
    pub fn pin(&self, kind: PinKind, handle: &str) -> Option<PinState> {
        let pin = self.shared.pins.peek(PinKey::new(kind, handle.as_bytes()))?;
        Some(PinState {
            backend: self.shared.snapshot().backend_name(pin.backend),
            epoch: pin.epoch,
            rounds: pin.rounds,
            finished: pin.finished,
        })
    }

    /// Pins in the table (active and finished-in-replay-window).
    pub fn pin_count(&self) -> usize {
        self.shared.pins.len()
    }

    /// One round of the background upkeep now: expire pins, count them per backend, forget
    /// drained backends, close idle connections.
    pub fn sweep(&self) {
        crate::fleet::sweep_once(&self.shared);
    }

    /// Replaces the resolver `[discovery]` uses (tests point it at addresses of their own).
    pub fn set_resolver(&self, resolver: Resolver) {
        self.shared.lookup.replace(resolver);
    }

    /// Whether shutdown has begun (`/readyz` answers 503 from then on).
    pub fn shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::SeqCst)
    }
}

impl View {
    pub fn config(&self) -> &Config {
        &self.snap.config
    }

    /// The ring's owner of `key`, ignoring load.
    pub fn ring_owner(&self, key: &str) -> Option<String> {
        self.snap.ring.owner(key).map(|b| b.name.to_string())
    }

    /// Where a new `key` would go now: its owner, or with bounded load the first backend in
    /// ring order within the load bound.
    pub fn ring_pick(&self, key: &str) -> Option<String> {
        self.snap.ring.pick(key).map(|b| b.name.to_string())
    }

    /// The backends on the ring (healthy, not draining), by name.
    pub fn ring(&self) -> Vec<BackendState> {
        self.snap.ring.members().iter().map(|b| state_of(b, false)).collect()
    }
}
