//! `[routing]`: where keys come from, the ring, and the pins' lifetimes and bounds.

use std::time::Duration;

use super::reader::{key, quoted, Section};
use super::reference::Kind;
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// Request header that carries the client key (lower-cased for lookup).
    pub header: http::HeaderName,
    /// Top-level JSON field that carries the client key when the header is absent.
    pub body_field: String,
    pub virtual_nodes: usize,
    pub load_factor: f64,
    pub pin_idle_ttl: Duration,
    pub session_idle_ttl: Duration,
    pub task_idle_ttl: Duration,
    pub replay_window: Duration,
    pub max_rounds: u32,
    pub max_pins: usize,
    pub on_pin_lost: OnPinLost,
    pub drain_timeout: Duration,
}

/// What to do with a follow-up whose pinned backend is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPinLost {
    Strict,
    Rehash,
}

pub(super) fn routing(mut s: Section) -> Result<RoutingConfig, ConfigError> {
    let virtual_nodes = key(
        "virtual_nodes",
        "Ring points per unit of weight; 640 spreads keys more evenly over fleets of 8 or more.",
    );
    let load_factor = key(
        "load_factor",
        "Bounded load: a backend with more than `load_factor` times the mean of requests in flight \
         takes no new keys, e.g. 1.25; 0 is off.",
    );
    let pin_idle_ttl = key(
        "pin_idle_ttl",
        "A pinned call without a follow-up for this long is forgotten.",
    );
    let session_idle_ttl = key(
        "session_idle_ttl",
        "A legacy session (`Mcp-Session-Id`) without a request for this long is forgotten.",
    );
    let task_idle_ttl = key("task_idle_ttl", "A task without a request for this long is forgotten.");
    let replay_window = key(
        "replay_window",
        "A finished call's pin stays this long, so that duplicate follow-ups reach the same backend.",
    );
    let max_rounds = key(
        "max_rounds",
        "Rounds one call may take; the follow-up past it is answered 429 `too_many_rounds`.",
    );
    let max_pins = key(
        "max_pins",
        "Pins held in all; a request that would start a new call past it is answered 429 `pin_capacity`.",
    );
    let on_pin_lost = key(
        "on_pin_lost",
        "A follow-up whose pinned backend is gone: `strict` answers 503 `pinned_backend_unavailable`, \
         `rehash` routes it by the ring.",
    );
    let drain_timeout = key(
        "drain_timeout",
        "How long a removed or drained backend keeps serving the calls pinned to it.",
    );
    let routing = RoutingConfig {
        header: header(&mut s)?,
        body_field: body_field(&mut s)?,
        virtual_nodes: s.int(virtual_nodes, defaults::VIRTUAL_NODES as i64, 160..=10_000)? as usize,
        load_factor: s.float(
            load_factor,
            defaults::LOAD_FACTOR,
            |f| f == 0.0 || (f > 1.0 && f.is_finite()),
            "0 (off) or greater than 1.0",
        )?,
        pin_idle_ttl: s.duration(pin_idle_ttl, defaults::PIN_IDLE_TTL)?,
        session_idle_ttl: s.duration(session_idle_ttl, defaults::SESSION_IDLE_TTL)?,
        task_idle_ttl: s.duration(task_idle_ttl, defaults::TASK_IDLE_TTL)?,
        replay_window: s.duration(replay_window, defaults::REPLAY_WINDOW)?,
        max_rounds: s.int(max_rounds, defaults::MAX_ROUNDS as i64, 1..=1_000_000)? as u32,
        max_pins: s.int(max_pins, defaults::MAX_PINS as i64, 1..=1 << 32)? as usize,
        on_pin_lost: s.choice(
            on_pin_lost,
            defaults::ON_PIN_LOST,
            &[("strict", OnPinLost::Strict), ("rehash", OnPinLost::Rehash)],
        )?,
        drain_timeout: s.duration(drain_timeout, defaults::DRAIN_TIMEOUT)?,
    };
    s.finish(true)?;
    Ok(routing)
}

fn header(s: &mut Section) -> Result<http::HeaderName, ConfigError> {
    let header = key("header", "Request header that carries the client key.");
    let text = s.text_or(header, Kind::HeaderName, defaults::ROUTING_HEADER)?;
    let Ok(name) = http::HeaderName::from_bytes(text.value.as_bytes()) else {
        return s.err(
            text.span,
            format!("routing.header: {:?} is not a valid header name", text.value),
        );
    };
    s.print("header", quoted(name.as_str()));
    Ok(name)
}

fn body_field(s: &mut Section) -> Result<String, ConfigError> {
    let body_field = key(
        "body_field",
        "Top-level JSON-RPC field that carries the client key when the header is absent.",
    );
    let (field, span) = s.string(body_field, defaults::BODY_FIELD)?;
    if field.is_empty() {
        return s.err(span, "routing.body_field: must not be empty");
    }
    Ok(field)
}
