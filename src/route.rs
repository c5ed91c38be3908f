//! The routing decision (docs/src/routing.md): which backend a request's handles choose, and why.
//! One [`resolve`] (unseal, then decide) serves the proxy, `mrtr-router route` and `/debug/route`,
//! so all three explain the same logic.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::catalog::WhenAllOut;
use crate::config::OnPinLost;
use crate::dialect::RequestHandles;
use crate::error::RouterError;
use crate::pins::{Pin, PinKey, PinKind, PinTable};
use crate::sealing::{Refused, Unsealed};
use crate::state::Snapshot;
use crate::token::{CallTag, PrincipalTag};
use crate::upstream::{Backend, BackendKey};

/// Where a decision came from (the `source` label of `mrtr_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Token,
    Pin,
    Ring,
    Keyless,
}

impl Source {
    /// Its `source` label in `mrtr_route_decisions_total`.
    pub fn label(self) -> &'static str {
        crate::metrics::ROUTE_SOURCES[self as usize]
    }

    /// Counts a decision of this source in `mrtr_route_decisions_total`.
    pub fn count(self, metrics: &crate::metrics::Metrics) {
        metrics.decisions_by_source[self as usize].inc();
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
    /// The rounds the call has had so far, as its local pin or its sealed tokens count them
    /// (whichever counts more: a call may have alternated between replicas).
    pub rounds: u32,
    /// The request continues a call under way ([`is_follow_up`]).
    pub follow_up: bool,
}

/// Whether a request continues a call already under way (docs/src/pins.md, "Follow-ups"), the
/// one definition routing, quotas and the retry to the next backend share. Each handle counts only for what it
/// continues:
/// - the pin of a call it matched (not a session's alone: a session holds many calls): a client
///   key's for a request that starts no call of its own (a `tools/call` that repeats a pending
///   call's key is a new call, routed to its backend as a duplicate); a `requestState`'s for a
///   retry of a method that takes one; a task's for the task methods;
/// - a sealed `requestState` issued for this method and tool; sealed task ids on the task
///   methods; a sealed routing token issued for this call (the same `messageId`, or none when
///   the call is known by its routing id), on a request that starts no call of its own;
/// - a JSON-RPC response posted in a session (the client's answer to an elicitation or sampling
///   request the server made during a call).
///
/// A request that only carries a session is a new call; so is a batch, one that carries another
/// call's handle, and one whose call has ended here (its pin finished: a repeat of its last round is
/// routed to the same backend, but it is no longer a call a limiter could strand).
pub fn is_follow_up(handles: &RequestHandles, matched: Option<Matched>, unsealed: Option<&Unsealed>) -> bool {
    // Most requests carry no handle at all.
    if matched.is_none() && unsealed.is_none() && handles.session_id.is_none() {
        return false;
    }
    // A batch is no round of a call: each element counts as a new call.
    if matched.is_some_and(|m| m.pin.finished) || handles.is_batch() {
        return false;
    }
    let starts = handles.starts_a_call();
    // A sealed `requestState` says which method and tool it was issued for; the pin it matched
    // continues only that.
    let state_for_this = unsealed
        .and_then(|u| u.state_call)
        .is_none_or(|c| c == handles.tool_tag());
    let pinned = matched.is_some_and(|m| match m.pin.kind {
        PinKind::Client => !starts,
        PinKind::RequestState => handles.takes_request_state() && state_for_this,
        PinKind::Task => handles.follows_tasks(),
        PinKind::Session => false,
    });
    let sealed = unsealed.is_some_and(|u| {
        let state = u.request_state.is_some()
            && handles.takes_request_state()
            && u.state_call.is_some_and(|c| c == handles.tool_tag());
        let tasks = (u.task_id.is_some() || u.task_ids.iter().any(Option::is_some)) && handles.follows_tasks();
        let routed = u.routing_token && !starts && u.routing_call.is_some_and(|c| names_this_call(c, handles));
        state || tasks || routed
    });
    pinned || sealed || (handles.session_id.is_some() && handles.is_response())
}

/// Whether a routing token issued for `call` is this request's call: the same `messageId`, or,
/// for a call known by its routing id, a request without one (the token stands for the id).
fn names_this_call(call: CallTag, handles: &RequestHandles) -> bool {
    match handles.message_id.as_deref() {
        Some(m) => !call.by_routing_id && PinKey::new(PinKind::Client, m.as_bytes()).digest() == call.digest,
        None => call.by_routing_id,
    }
}

/// Whether `resolve` extends the pins it reads (a request being served) or only looks (an
/// explanation: `mrtr-router route`, `/debug/route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Refresh,
    Peek,
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

/// Chooses the backend for a request: what its sealed tokens say first (verified here; a bad
/// token is refused and chooses nothing, and so is one bound to another principal than the
/// `caller`), then [`decide`]. Returns what the tokens unsealed too:
/// the proxy gives the backend back its own state and session id.
pub fn resolve(
    snap: &Snapshot,
    pins: &PinTable,
    handles: &RequestHandles,
    caller: Option<&PrincipalTag>,
    lookup: Lookup,
) -> Result<(Decision, Option<Box<Unsealed>>), RouterError> {
    let unsealed = match &snap.sealing {
        Some(s) => s
            .unseal(handles, SystemTime::now(), caller)
            .map_err(|refused| match refused {
                Refused::Principal => RouterError::HandlePrincipalMismatch,
                Refused::Clear(kind) => RouterError::HandleNotSealed { kind },
                _ => RouterError::InvalidToken {
                    reason: refused.reason(),
                },
            })?
            // Boxed: hundreds of bytes, carried through the request path only with `[tokens]`.
            .map(Box::new),
        None => None,
    };
    let mut decision = decide(snap, pins, handles, unsealed.as_deref(), lookup == Lookup::Refresh)?;
    decision.follow_up = is_follow_up(handles, decision.matched, unsealed.as_deref());
    // A new call goes only to a backend serving its tool as the lock approves (a pinned
    // session's backend included); a call under way goes on where it lives.
    if let (Some(tools), false) = (&snap.tools, decision.follow_up) {
        tools.approve(handles, decision.backend.key)?;
    }
    Ok((decision, unsealed))
}

/// Chooses the backend for a request (docs/src/routing.md). `unsealed` is what the request's tokens
/// say (step 1); `refresh` is false for read-only explanations (`route`, `/debug/route`),
/// which must not extend pins.
pub fn decide(
    snap: &Snapshot,
    pins: &PinTable,
    handles: &RequestHandles,
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
    // A full table refuses every request that may start a call (docs/src/pins.md), on every path, a
    // sealed token's included: that request's answer would add pins. Only a follow-up of a call
    // pinned here passes: its pins are already counted, and refusing it would break the call (a
    // sealed handle alone does not say its pins are here).
    let full = |call: Option<Matched>| {
        refresh && !is_follow_up(handles, call, None) && handles.may_create_pin() && pins.len() >= routing.max_pins
    };
    // What a request routed by a pin or a token must pass: its call's rounds, and the table's room.
    let admit = |call: Option<Matched>, token_rounds: Option<u32>| {
        let rounds = check_rounds(call, token_rounds, handles, routing.max_rounds)?;
        match full(call) {
            true => Err(RouterError::PinCapacity { max: routing.max_pins }),
            false => Ok(rounds),
        }
    };
    if let Some(u) = unsealed {
        let key = BackendKey::of(&u.backend);
        // The local pin, if this replica has one, still counts rounds and finishes the call.
        let mut candidates = handles.pin_candidates();
        let on_backend = |k: PinKey| {
            let pin = find(k)?;
            (pin.backend == key).then_some(Matched { key: k, pin })
        };
        // A call known by its routing id is pinned here under that id's key, which the token
        // stands for once the client echoes only the token.
        let token_call = u.token_call_key(handles);
        let matched = candidates
            .find_map(|(k, _)| on_backend(k))
            .or_else(|| token_call.and_then(on_backend));
        let matched = matched.map(|m| call_in_session(m, &mut candidates, find));
        // A backend this router does not know (a replica that never saw it), one ejected, or
        // one ejected since the token was issued (a restarted instance): the pin is lost.
        let current = usable(key, None).filter(|b| u.issued_ms.is_none_or(|t| b.issued_since_ejection(t)));
        match current {
            Some(backend) => {
                let rounds = admit(matched, u.rounds)?;
                return Ok(Decision {
                    backend: backend.clone(),
                    source: Source::Token,
                    matched,
                    pin_lost: false,
                    rounds,
                    follow_up: false,
                });
            }
            None if routing.on_pin_lost == OnPinLost::Strict => {
                let handle = handles
                    .client_key()
                    .or(handles.session_id)
                    .unwrap_or("<sealed>")
                    .to_string();
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
        let mut candidates = handles.pin_candidates();
        while let Some((key, handle)) = candidates.next() {
            let Some(pin) = find(key) else { continue };
            let matched = Matched { key, pin };
            match usable(pin.backend, Some(pin.epoch)) {
                Some(backend) => {
                    let matched = call_in_session(matched, &mut candidates, find);
                    let rounds = admit(Some(matched), None)?;
                    return Ok(Decision {
                        backend: backend.clone(),
                        source: Source::Pin,
                        matched: Some(matched),
                        pin_lost: false,
                        rounds,
                        follow_up: false,
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
                    // its own handles.
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
    let (backend, source) = pick_new(snap, handles, refresh)?;
    Ok(Decision {
        backend,
        source,
        matched: lost,
        pin_lost,
        rounds: 0,
        follow_up: false,
    })
}

/// The backend of a request no pin or token routes: by the ring (its key's, or the less loaded
/// of two at random without one). With the catalog on, a new call of a tool it knows goes
/// among the backends serving it (a new `prompts/get` or `resources/read`, among those listing
/// its prompt or resource). `refresh`: counted (false for read-only explanations).
fn pick_new(snap: &Snapshot, handles: &RequestHandles, refresh: bool) -> Result<(Arc<Backend>, Source), RouterError> {
    let candidates = match snap.tools.as_ref().and_then(|t| t.for_new_call(handles)) {
        Some(candidates) => Some(candidates?),
        None => None,
    };
    if let (Some(tools), Some(c), true) = (&snap.tools, &candidates, refresh) {
        tools.count(c.arguments);
    }
    let pick = |among: Option<&[BackendKey]>| match handles.client_key() {
        Some(k) => (snap.ring.pick_among(k, among), Source::Ring),
        None => (snap.ring.pick_keyless_among(among), Source::Keyless),
    };
    let (mut backend, mut source) = pick(candidates.as_ref().and_then(|c| c.backends.as_deref()));
    let mut when_all_out = candidates.as_ref().map(|c| c.when_all_out);
    if backend.is_none() {
        match when_all_out {
            // Every backend whose schema accepts the call's arguments is out: among all
            // serving its tool, as a call no schema accepts.
            Some(WhenAllOut::AmongServing(serving)) => {
                (backend, source) = pick(Some(serving));
                when_all_out = Some(WhenAllOut::Refuse);
            }
            // Every backend listing the prompt or resource is out: the ring decides, and the
            // backend's own error is the answer.
            Some(WhenAllOut::AnyBackend) => (backend, source) = pick(None),
            _ => {}
        }
    }
    match (backend, when_all_out) {
        (Some(b), _) => Ok((b.clone(), source)),
        (None, Some(WhenAllOut::Refuse)) => Err(tool_unavailable(handles)),
        (None, _) => Err(RouterError::NoBackend),
    }
}

/// Every backend serving the called tool is down, draining or loaded out of the ring.
fn tool_unavailable(handles: &RequestHandles) -> RouterError {
    let tool = handles.name.as_deref().unwrap_or_default();
    RouterError::ToolUnavailable {
        tool: crate::catalog::shown(tool),
    }
}

/// A session pin gives way to the pin of a 2a call made inside that session, found among the
/// candidates after it (client keys come last): that pin is what counts the call's rounds and
/// marks the request as a follow-up rather than a new call. The call's pin must name the same
/// backend incarnation; the session decides the backend either way (the order of docs/src/routing.md).
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

/// The rounds a follow-up's call has had, by its local pin and its sealed tokens
/// (`token_rounds`); past `max_rounds` the follow-up is refused. Rounds count for calls, not
/// sessions or tasks; a duplicate of a finished call's last follow-up passes.
fn check_rounds(
    matched: Option<Matched>,
    token_rounds: Option<u32>,
    handles: &RequestHandles,
    max_rounds: u32,
) -> Result<u32, RouterError> {
    let call = matched.filter(|m| matches!(m.pin.kind, PinKind::Client | PinKind::RequestState));
    if call.is_some_and(|m| m.pin.finished) {
        return Ok(call.map_or(0, |m| m.pin.rounds));
    }
    let rounds = call.map_or(0, |m| m.pin.rounds).max(token_rounds.unwrap_or(0));
    if rounds >= max_rounds {
        let key = handles
            .client_key()
            .or(handles.request_state.as_deref())
            .unwrap_or("<call>")
            .to_string();
        return Err(RouterError::TooManyRounds { key, max: max_rounds });
    }
    Ok(rounds)
}
