//! `[routing]`: where keys come from, the ring, and the pins' lifetimes and bounds.

use std::time::Duration;

use super::reader::{quoted, Section};
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
    let routing = RoutingConfig {
        header: header(&mut s)?,
        body_field: body_field(&mut s)?,
        virtual_nodes: s.int("virtual_nodes", defaults::VIRTUAL_NODES as i64, 160..=10_000)? as usize,
        load_factor: s.float(
            "load_factor",
            defaults::LOAD_FACTOR,
            |f| f == 0.0 || (f > 1.0 && f.is_finite()),
            "must be 0 (off) or greater than 1.0, e.g. 1.25",
        )?,
        pin_idle_ttl: s.duration("pin_idle_ttl", defaults::PIN_IDLE_TTL)?,
        session_idle_ttl: s.duration("session_idle_ttl", defaults::SESSION_IDLE_TTL)?,
        task_idle_ttl: s.duration("task_idle_ttl", defaults::TASK_IDLE_TTL)?,
        replay_window: s.duration("replay_window", defaults::REPLAY_WINDOW)?,
        max_rounds: s.int("max_rounds", defaults::MAX_ROUNDS as i64, 1..=1_000_000)? as u32,
        max_pins: s.int("max_pins", defaults::MAX_PINS as i64, 1..=1 << 32)? as usize,
        on_pin_lost: s.choice(
            "on_pin_lost",
            defaults::ON_PIN_LOST,
            &[("strict", OnPinLost::Strict), ("rehash", OnPinLost::Rehash)],
        )?,
        drain_timeout: s.duration("drain_timeout", defaults::DRAIN_TIMEOUT)?,
    };
    s.finish(true)?;
    Ok(routing)
}

fn header(s: &mut Section) -> Result<http::HeaderName, ConfigError> {
    let (text, span) = match s.text("header")? {
        Some(t) => (t.value, t.span),
        None => (defaults::ROUTING_HEADER, None),
    };
    let Ok(name) = http::HeaderName::from_bytes(text.as_bytes()) else {
        return s.err(span, format!("routing.header: {text:?} is not a valid header name"));
    };
    s.print("header", quoted(name.as_str()));
    Ok(name)
}

fn body_field(s: &mut Section) -> Result<String, ConfigError> {
    let (field, span) = s.string("body_field", defaults::BODY_FIELD)?;
    if field.is_empty() {
        return s.err(span, "routing.body_field: must not be empty");
    }
    Ok(field)
}
