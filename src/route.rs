//! The routing decision (DESIGN §3): the keys a request carries, and which backend they choose.
//! Shared by the proxy, `mrtr-router route` and `/debug/route`, so all three explain the same logic.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::HeaderMap;

use crate::config::OnPinLost;
use crate::dialect::{RequestEnvelope, NAME_HEADER, SESSION_HEADER};
use crate::error::RouterError;
use crate::pins::{Pin, PinKey, PinKind, PinTable};
use crate::sealing::Unsealed;
use crate::state::Snapshot;
use crate::upstream::{Backend, BackendKey};

/// Every handle in a request that can choose a backend.
#[derive(Debug, Default, Clone)]
pub struct RequestKeys<'a> {
    /// JSON-RPC method (absent for GET/DELETE).
    pub method: Option<Cow<'a, str>>,
    /// The request's raw JSON-RPC id, for error answers.
    pub id: Option<&'a str>,
    /// The routing header value (2a).
    pub header_key: Option<&'a str>,
    /// The body key field value (2a).
    pub message_id: Option<Cow<'a, str>>,
    /// `params.requestState` (2b).
    pub request_state: Option<Cow<'a, str>>,
    /// Task id: `Mcp-Name` on `tasks/*`, else `params.taskId` (2b).
    pub task_id: Option<Cow<'a, str>>,
    /// `Mcp-Session-Id` (2c).
    pub session_id: Option<&'a str>,
}

/// A header's first value as text, if it has one.
fn header_text(v: &http::HeaderValue) -> Option<&str> {
    std::str::from_utf8(v.as_bytes()).ok().filter(|s| !s.is_empty())
}

impl<'a> RequestKeys<'a> {
    pub fn new(headers: &'a HeaderMap, routing_header: &http::HeaderName, envelope: RequestEnvelope<'a>) -> Self {
        let is_task_method = envelope.method.as_deref().is_some_and(|m| m.starts_with("tasks/"));
        // One pass over the headers (a handful) instead of a hashed lookup per name; the first
        // value of each counts, as with `HeaderMap::get`.
        let (mut header_key, mut session_id, mut name) = (None, None, None);
        for (n, v) in headers {
            if n == routing_header {
                header_key.get_or_insert(v);
            }
            if n == SESSION_HEADER {
                session_id.get_or_insert(v);
            }
            if is_task_method && n == NAME_HEADER {
                name.get_or_insert(v);
            }
        }
        RequestKeys {
            method: envelope.method,
            id: envelope.id,
            header_key: header_key.and_then(header_text),
            message_id: envelope.message_id,
            request_state: envelope.request_state,
            task_id: name.and_then(header_text).map(Cow::Borrowed).or(envelope.task_id),
            session_id: session_id.and_then(header_text),
        }
    }

    /// Takes `key` as if it came in the routing header (for explanations): an empty value is
    /// no key, as an empty header is.
    pub fn set_header_key(&mut self, key: &'a str) {
        self.header_key = Some(key).filter(|k| !k.is_empty());
    }

    /// The routing header when it names a call, not when it is one of the router's sealed
    /// tokens (those name a backend, and are alike for every call sealed in the same second).
    fn call_header(&self) -> Option<&str> {
        self.header_key.filter(|h| !crate::token::is_token(h))
    }

    /// The key hashed on the ring: the routing header, else the body key (DESIGN §2a).
    pub fn client_key(&self) -> Option<&str> {
        self.call_header().or(self.message_id.as_deref())
    }

    /// Pin keys to look up, in DESIGN §3 order: learned handles first, then client keys.
    pub fn pin_candidates(&self) -> impl Iterator<Item = (PinKey, &str)> + '_ {
        let learned = [
            self.request_state.as_deref().map(|s| (PinKind::RequestState, s)),
            self.task_id.as_deref().map(|s| (PinKind::Task, s)),
            self.session_id.map(|s| (PinKind::Session, s)),
        ];
        let client = self.client_handles().map(|h| h.map(|s| (PinKind::Client, s)));
        learned
            .into_iter()
            .chain(client)
            .flatten()
            .map(|(kind, s)| (PinKey::new(kind, s.as_bytes()), s))
    }

    /// Client pin keys a `pending` answer is recorded under (routing id and messageId).
    pub fn client_pin_keys(&self) -> impl Iterator<Item = PinKey> + '_ {
        self.client_handles()
            .into_iter()
            .flatten()
            .map(|s| PinKey::new(PinKind::Client, s.as_bytes()))
    }

    /// The call's routing header and its body key; the same string in both is one handle.
    fn client_handles(&self) -> [Option<&str>; 2] {
        let header = self.call_header();
        [header, self.message_id.as_deref().filter(|m| Some(*m) != header)]
    }

    /// Whether this request may start a call that needs a pin (refused when the table is full).
    pub fn may_create_pin(&self) -> bool {
        self.client_key().is_some()
            || matches!(
                self.method.as_deref(),
                Some("tools/call" | "prompts/get" | "resources/read" | "initialize")
            )
    }
}

/// Where a decision came from (the `source` label of `mrtr_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Token,
    Pin,
    Ring,
    Keyless,
}

impl Source {
    /// Every source, in discriminant order (metric children are indexed by `source as usize`).
    pub const ALL: [Source; 4] = [Source::Token, Source::Pin, Source::Ring, Source::Keyless];

    pub fn label(self) -> &'static str {
        match self {
            Source::Token => "token",
            Source::Pin => "pin",
            Source::Ring => "ring",
            Source::Keyless => "keyless",
        }
    }
}

/// A pin the request matched.
#[derive(Debug, Clone, Copy)]
pub struct Matched {
    pub key: PinKey,
    pub pin: Pin,
}

/// The chosen backend and why.
pub struct Decision {
    pub backend: Arc<Backend>,
    pub source: Source,
    /// The pin that chose the backend (or that was lost, with `rehash`).
    pub matched: Option<Matched>,
    /// Set when a pin's backend was gone and `rehash` routed by the ring instead.
    pub pin_lost: bool,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.backend.name, self.source.label())?;
        if let Some(m) = &self.matched {
            write!(
                f,
                " ({} pin, {} rounds{})",
                m.pin.kind.label(),
                m.pin.rounds,
                if m.pin.finished { ", finished" } else { "" }
            )?;
        }
        if self.pin_lost {
            write!(f, " (pinned backend lost; rehashed)")?;
        }
        Ok(())
    }
}

/// Chooses the backend for a request (DESIGN §3). `unsealed` is what the request's tokens
/// say (step 1); `refresh` is false for read-only explanations (`route`, `/debug/route`),
/// which must not extend pins.
pub fn decide(
    snap: &Snapshot,
    pins: &PinTable,
    keys: &RequestKeys,
    unsealed: Option<&Unsealed>,
    refresh: bool,
) -> Result<Decision, RouterError> {
    let routing = &snap.config.routing;
    // With `rehash`, a lost call goes on to the ring; `lost` remembers its pin, if any.
    let mut pin_lost = false;
    let mut lost = None;
    // A pin holds while its backend is known, healthy, and the same incarnation.
    let usable = |key: BackendKey, epoch: Option<u32>| {
        snap.backend(key)
            .filter(|b| b.is_healthy() && epoch.is_none_or(|e| b.epoch() == e))
    };
    // Explanations (`refresh` false) read pins without extending them.
    let find = |key: PinKey| {
        if refresh {
            pins.lookup(key, &snap.ttls)
        } else {
            pins.peek(key)
        }
    };
    // A full table refuses every request that may start a call (DESIGN §4), on every path, a
    // sealed token's included: that request's answer would add pins. Only a follow-up of a call
    // pinned here passes: its pins are already counted, and refusing it would break the call. A
    // session pin alone does not make a follow-up: a new call or task inside the session adds
    // pins of its own.
    let full = |call: Option<Matched>| {
        refresh
            && call.is_none_or(|m| m.pin.kind == PinKind::Session)
            && keys.may_create_pin()
            && pins.len() >= routing.max_pins
    };
    // What a request routed by a pin or a token must pass: its call's rounds, and the table's room.
    let admit = |call: Option<Matched>| {
        check_rounds(call, keys, routing.max_rounds)?;
        match full(call) {
            true => Err(RouterError::PinCapacity { max: routing.max_pins }),
            false => Ok(()),
        }
    };
    if let Some(u) = unsealed {
        let key = BackendKey::of(&u.backend);
        if snap.backend(key).is_none() {
            // Authentic, but naming a backend this router does not have: never guess.
            return Err(RouterError::InvalidToken {
                reason: "unknown_backend",
            });
        }
        // The local pin, if this replica has one, still counts rounds and finishes the call.
        let mut candidates = keys.pin_candidates();
        let matched = candidates.find_map(|(k, _)| {
            let pin = find(k)?;
            (pin.backend == key).then_some(Matched { key: k, pin })
        });
        let matched = matched.map(|m| call_in_session(m, &mut candidates, find));
        match usable(key, None) {
            Some(backend) => {
                admit(matched)?;
                return Ok(Decision {
                    backend: backend.clone(),
                    source: Source::Token,
                    matched,
                    pin_lost: false,
                });
            }
            None if routing.on_pin_lost == OnPinLost::Strict => {
                let handle = keys.client_key().or(keys.session_id).unwrap_or("<sealed>").to_string();
                return Err(RouterError::PinnedBackendUnavailable {
                    key: handle,
                    backend: u.backend.clone(),
                });
            }
            None => {
                pin_lost = true;
                lost = matched;
            }
        }
    }
    if !pin_lost && !pins.is_empty() {
        let mut candidates = keys.pin_candidates();
        while let Some((key, handle)) = candidates.next() {
            let Some(pin) = find(key) else { continue };
            let matched = Matched { key, pin };
            match usable(pin.backend, Some(pin.epoch)) {
                Some(backend) => {
                    let matched = call_in_session(matched, &mut candidates, find);
                    admit(Some(matched))?;
                    return Ok(Decision {
                        backend: backend.clone(),
                        source: Source::Pin,
                        matched: Some(matched),
                        pin_lost: false,
                    });
                }
                None if routing.on_pin_lost == OnPinLost::Strict => {
                    return Err(RouterError::PinnedBackendUnavailable {
                        key: handle.to_string(),
                        backend: snap.backend_name(pin.backend),
                    });
                }
                None => {
                    pin_lost = true;
                    // A lost call pin outranks a lost session: rehashed, the call re-pins
                    // its own keys.
                    if lost.is_none_or(|l: Matched| l.pin.kind == PinKind::Session) {
                        lost = Some(matched);
                    }
                }
            }
        }
    }
    if full(lost) {
        return Err(RouterError::PinCapacity { max: routing.max_pins });
    }
    let (backend, source) = match keys.client_key() {
        Some(k) => (snap.ring.pick(k), Source::Ring),
        None => (snap.ring.pick_keyless(), Source::Keyless),
    };
    let backend = backend.ok_or(RouterError::NoBackend)?.clone();
    Ok(Decision {
        backend,
        source,
        matched: lost,
        pin_lost,
    })
}

/// A session pin gives way to the pin of a 2a call made inside that session, found among the
/// candidates after it (client keys come last): that pin is what counts the call's rounds and
/// marks the request as a follow-up rather than a new call. The call's pin must name the same
/// backend incarnation; the session decides the backend either way (DESIGN §3 order).
fn call_in_session<'k>(
    matched: Matched,
    rest: &mut impl Iterator<Item = (PinKey, &'k str)>,
    find: impl Fn(PinKey) -> Option<Pin>,
) -> Matched {
    if matched.pin.kind != PinKind::Session {
        return matched;
    }
    let session = matched.pin;
    rest.find_map(|(key, _)| {
        let pin = find(key)?;
        let same = pin.kind != PinKind::Session && pin.backend == session.backend && pin.epoch == session.epoch;
        same.then_some(Matched { key, pin })
    })
    .unwrap_or(matched)
}

/// Refuses a follow-up past `max_rounds` (rounds count for calls, not sessions or tasks).
fn check_rounds(matched: Option<Matched>, keys: &RequestKeys, max_rounds: u32) -> Result<(), RouterError> {
    let Some(m) = matched else { return Ok(()) };
    let counts = matches!(m.pin.kind, PinKind::Client | PinKind::RequestState);
    if counts && !m.pin.finished && m.pin.rounds >= max_rounds {
        let key = keys
            .client_key()
            .or(keys.request_state.as_deref())
            .unwrap_or("<call>")
            .to_string();
        return Err(RouterError::TooManyRounds { key, max: max_rounds });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_both_header_and_body_is_one_candidate() {
        let mut headers = HeaderMap::new();
        let routing = http::HeaderName::from_static("mcp-routing-id");
        headers.insert(routing.clone(), http::HeaderValue::from_static("k-1"));
        let body = br#"{"id":1,"method":"tools/call","messageId":"k-1"}"#;
        let env = crate::dialect::parse_request(body, "messageId").unwrap();
        let keys = RequestKeys::new(&headers, &routing, env);
        assert_eq!(keys.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(), ["k-1"]);
        let other = br#"{"id":1,"method":"tools/call","messageId":"k-2"}"#;
        let env = crate::dialect::parse_request(other, "messageId").unwrap();
        let keys = RequestKeys::new(&headers, &routing, env);
        assert_eq!(
            keys.pin_candidates().map(|(_, s)| s).collect::<Vec<_>>(),
            ["k-1", "k-2"]
        );
    }

    #[test]
    fn headers_are_read_by_their_first_value_and_mcp_name_only_on_tasks() {
        let routing = http::HeaderName::from_static("mcp-routing-id");
        let mut headers = HeaderMap::new();
        headers.append(SESSION_HEADER, http::HeaderValue::from_static("s-1"));
        headers.append(SESSION_HEADER, http::HeaderValue::from_static("s-2"));
        headers.append(NAME_HEADER, http::HeaderValue::from_static("t-header"));
        headers.append(routing.clone(), http::HeaderValue::from_static(""));
        let keys_of = |body: &'static [u8]| {
            let env = crate::dialect::parse_request(body, "messageId").unwrap();
            let k = RequestKeys::new(&headers, &routing, env);
            (k.session_id, k.header_key, k.task_id.map(|t| t.into_owned()))
        };
        let call = keys_of(br#"{"id":1,"method":"tools/call","params":{"taskId":"t-body"}}"#);
        assert_eq!(call, (Some("s-1"), None, Some("t-body".to_string())));
        let task = keys_of(br#"{"id":1,"method":"tasks/get","params":{"taskId":"t-body"}}"#);
        assert_eq!(task, (Some("s-1"), None, Some("t-header".to_string())));
    }
}
