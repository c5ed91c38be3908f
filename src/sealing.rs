//! Where sealed tokens travel (docs/src/tokens.md): unsealing what a client echoes before the request
//! is routed and forwarded (the backend always sees its own bytes), and sealing the backend
//! into what an answer hands out (`Mcp-Routing-Id`, `requestState`, `Mcp-Session-Id`).

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};

use crate::config::TokensConfig;
use crate::dialect::{self, RequestHandles};
use crate::token::{self, CallTag, Claims, Kind, PrincipalTag, Rejected, SealingKeys};

/// The keys for each kind of sealed value.
pub struct Sealing {
    /// Routing tokens and wrapped `requestState`s (`tokens.token_ttl`).
    calls: Arc<SealingKeys>,
    /// Wrapped session ids (`tokens.session_ttl`): they live as long as the session.
    sessions: Arc<SealingKeys>,
    /// `tokens.accept_clear_handles`: a verified caller's clear handles are taken too.
    accept_clear: bool,
}

/// What the tokens of one request say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsealed {
    /// The backend the (first) token names.
    pub backend: String,
    /// When the request's (first) timed token was issued (milliseconds since the UNIX epoch):
    /// one issued before the backend's last ejection belongs to an instance that is gone. A
    /// stable task id alone has no issue time.
    pub issued_ms: Option<u64>,
    /// The call's rounds as its tokens count them (the routing token, a wrapped
    /// `requestState`); `None` without such a token, or in one of the previous format.
    pub rounds: Option<u32>,
    /// The backend's own session id, when the request's `Mcp-Session-Id` was wrapped.
    pub session_id: Option<String>,
    /// The backend's own `params.requestState`, when the request's was wrapped.
    pub request_state: Option<String>,
    /// The backend's own task id, when the request's (`Mcp-Name` and `params.taskId`) was wrapped.
    pub task_id: Option<String>,
    /// The backend's own ids of `params.notifications.taskIds`, each where it was wrapped.
    pub task_ids: Vec<Option<String>>,
    /// The request carried a routing token (the `Mcp-Routing-Id` of a pinned call).
    pub routing_token: bool,
    /// The call its routing token was issued for, when the token names one.
    pub routing_call: Option<CallTag>,
    /// The method and tool its wrapped `requestState` was issued for, when it names them.
    pub state_call: Option<CallTag>,
}

impl Unsealed {
    /// The pin key of the call the request's routing token stands for: a call known by its
    /// routing id, whose follow-ups carry the token in its place (and no `messageId`).
    pub fn token_call_key(&self, handles: &RequestHandles) -> Option<crate::pins::PinKey> {
        let call = self
            .routing_call
            .filter(|c| c.by_routing_id && handles.message_id.is_none())?;
        Some(crate::pins::PinKey::from_digest(
            crate::pins::PinKind::Client,
            call.digest,
        ))
    }
}

/// Why the sealed values of a request are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A value of ours that does not verify.
    Token(Rejected),
    /// Values that verify but name different backends.
    Conflict,
    /// A value issued to another caller than the one presenting it.
    Principal,
    /// A handle of a kind the router seals, in the clear, from a verified caller (`[auth]` on).
    Clear(&'static str),
}

impl From<Rejected> for Refused {
    fn from(r: Rejected) -> Refused {
        Refused::Token(r)
    }
}

impl Refused {
    /// The `reason` label of `mrtr_tokens_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Token(r) => r.reason(),
            Refused::Conflict => "conflict",
            Refused::Principal => "principal",
            Refused::Clear(_) => "clear",
        }
    }
}

/// JSON string literals in an answer to replace by wrapped values. Each literal is found by
/// its bytes as the backend wrote them (escapes and all) and by which occurrence of those bytes
/// it is, so that the same literal earlier in the message (a tool echoing the state in its
/// text) stays, and so that it is found again in an SSE event, whose bytes frame the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// By the literal's place in the message, last first: replacing a later literal leaves the
    /// count of occurrences before an earlier one as it was.
    edits: Vec<Edit>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Edit {
    from: Box<[u8]>,
    nth: usize,
    to: String,
    place: usize,
}

impl Replacement {
    /// Replaces the literal at `at` in `message` by `wrapped` (a token: nothing in it needs
    /// escaping).
    pub fn new(message: &[u8], at: Range<usize>, wrapped: &str) -> Replacement {
        Replacement { edits: Vec::new() }.and(message, at, wrapped)
    }

    /// Replaces the JSON value at `at` in `message` by `json` as it is (a whole value).
    pub fn json(message: &[u8], at: Range<usize>, json: String) -> Replacement {
        let mut r = Replacement { edits: Vec::new() };
        r.insert(message, at, json);
        r
    }

    /// This replacement and `other` (of the same message) both.
    pub fn merged(mut self, other: Replacement) -> Replacement {
        for edit in other.edits {
            let before = self.edits.partition_point(|e| e.place > edit.place);
            self.edits.insert(before, edit);
        }
        self
    }

    /// This replacement, and the literal at `at` in `message` by `wrapped` too.
    pub fn and(mut self, message: &[u8], at: Range<usize>, wrapped: &str) -> Replacement {
        self.insert(message, at, format!("\"{wrapped}\""));
        self
    }

    fn insert(&mut self, message: &[u8], at: Range<usize>, to: String) {
        // In valid JSON no occurrence can straddle the literal's opening quote (what precedes
        // a string is structure, never a backslash), so counting whole ones before it is exact.
        let nth = memchr::memmem::find_iter(&message[..at.start], &message[at.clone()]).count();
        let edit = Edit {
            place: at.start,
            from: message[at].into(),
            nth,
            to,
        };
        let before = self.edits.partition_point(|e| e.place > edit.place);
        self.edits.insert(before, edit);
    }

    /// `body` with the literals replaced, if `body` holds them all.
    pub fn apply(&self, body: &[u8]) -> Option<Bytes> {
        let mut out: Option<Bytes> = None;
        for e in &self.edits {
            let current = out.as_deref().unwrap_or(body);
            let at = memchr::memmem::find_iter(current, &e.from).nth(e.nth)?;
            out = Some(splice(current, at..at + e.from.len(), e.to.as_bytes()));
        }
        out
    }
}

impl Sealing {
    /// The keys `[tokens]` configured (checked and built when the config was read).
    pub fn new(cfg: &TokensConfig) -> Sealing {
        Sealing {
            calls: cfg.calls.clone(),
            sessions: cfg.sessions.clone(),
            accept_clear: cfg.accept_clear_handles,
        }
    }

    /// Verifies every sealed value the request carries, each as the kind of handle it stands
    /// for. `Ok(None)`: nothing of ours in it. Any value of ours that fails verification
    /// rejects the request, and so do two that name different backends (docs/src/routing.md:
    /// each handle's state lives on its own instance, so no choice could serve both). A value
    /// bound to a principal is refused unless `caller` is that principal (a value issued while
    /// `[auth]` was off is bound to no one). From a verified `caller`, a handle of a kind the
    /// router seals must be sealed (unless `tokens.accept_clear_handles`): its clear value is
    /// the backend's own, which would reach the backend bound to no one.
    pub fn unseal(
        &self,
        handles: &RequestHandles,
        now: SystemTime,
        caller: Option<&PrincipalTag>,
    ) -> Result<Option<Unsealed>, Refused> {
        let mut first: Option<Claims> = None;
        let mut rounds: Option<u32> = None;
        let mut issued_ms: Option<u64> = None;
        // `timed`: the token has an issue time (a stable task token has none).
        let mut note = |claims: Claims, counts_rounds: bool, timed: bool| {
            if claims.principal.is_some() && claims.principal.as_ref() != caller {
                return Err(Refused::Principal);
            }
            if first.as_ref().is_some_and(|f| f.backend != claims.backend) {
                return Err(Refused::Conflict);
            }
            if counts_rounds {
                rounds = rounds.max(claims.rounds);
            }
            if timed {
                issued_ms.get_or_insert(claims.issued_ms);
            }
            first.get_or_insert(claims);
            Ok(())
        };
        let must_be_sealed = caller.is_some() && !self.accept_clear;
        let sealed = |value: &str, kind: &'static str| match token::is_token(value) {
            true => Ok(true),
            false if must_be_sealed => Err(Refused::Clear(kind)),
            false => Ok(false),
        };
        let routing_token = handles.header_key.is_some_and(token::is_token);
        let mut routing_call = None;
        if let Some(h) = handles.header_key.filter(|_| routing_token) {
            let claims = self.calls.verify(Kind::RoutingId, h, now)?;
            routing_call = claims.call;
            note(claims, true, true)?;
        }
        let (mut request_state, mut state_call) = (None, None);
        if let Some(s) = handles.request_state.as_deref() {
            if sealed(s, "requestState")? {
                let (original, claims) = self.calls.open_value(Kind::RequestState, s, now)?;
                state_call = claims.call;
                note(claims, true, true)?;
                request_state = Some(original.into_owned());
            }
        }
        let mut session_id = None;
        if let Some(s) = handles.session_id {
            if sealed(s, "session id")? {
                let (original, claims) = self.sessions.open_value(Kind::Session, s, now)?;
                note(claims, false, true)?;
                session_id = Some(original.into_owned());
            }
        }
        let mut open_task = |t: &str| -> Result<Option<String>, Refused> {
            if !sealed(t, "task id")? {
                return Ok(None);
            }
            let (original, claims) = self.calls.open_value(Kind::Task, t, now)?;
            note(claims, false, false)?;
            Ok(Some(original.into_owned()))
        };
        let task_id = handles.task_id.as_deref().map(&mut open_task).transpose()?.flatten();
        let task_ids = handles
            .task_ids()
            .iter()
            .map(|t| open_task(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(first.map(|claims| Unsealed {
            backend: claims.backend,
            issued_ms,
            rounds,
            session_id,
            request_state,
            task_id,
            task_ids,
            routing_token,
            routing_call,
            state_call,
        }))
    }

    /// A routing token naming `backend`, the `call` it continues and the call's `rounds`, for
    /// the `Mcp-Routing-Id` answer header. Every value sealed here is bound `to` the caller when
    /// `[auth]` named one.
    pub fn routing_token(
        &self,
        to: Option<&PrincipalTag>,
        call: Option<CallTag>,
        backend: &str,
        rounds: u32,
        issued: SystemTime,
    ) -> String {
        self.calls.seal_for(to, call, Kind::RoutingId, backend, rounds, issued)
    }

    /// The session id a client should echo for the backend's `session_id`.
    pub fn wrap_session(
        &self,
        to: Option<&PrincipalTag>,
        session_id: &str,
        backend: &str,
        issued: SystemTime,
    ) -> String {
        self.sessions
            .seal_value_for(to, None, Kind::Session, session_id, backend, 0, issued)
    }

    /// A task id wrapped so that it also names `backend`: the same id always gives the same
    /// wrapped id (on every replica with the same first key), as a task id must stay one string
    /// for the task's whole life.
    pub fn wrap_task(&self, to: Option<&PrincipalTag>, task_id: &str, backend: &str) -> String {
        self.calls.seal_stable_for(to, Kind::Task, task_id, backend)
    }

    /// A `requestState` wrapped so that it also names `backend`, the method and tool it was
    /// issued for (`call`) and the call's `rounds`; any string can be wrapped, and the wrapped
    /// form is plain ASCII that no JSON encoder escapes.
    pub fn wrap_request_state(
        &self,
        to: Option<&PrincipalTag>,
        call: Option<CallTag>,
        state: &str,
        backend: &str,
        rounds: u32,
        issued: SystemTime,
    ) -> String {
        self.calls
            .seal_value_for(to, call, Kind::RequestState, state, backend, rounds, issued)
    }
}

/// `body` with the bytes at `at` replaced by `with`.
fn splice(body: &[u8], at: Range<usize>, with: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() - at.len() + with.len());
    out.extend_from_slice(&body[..at.start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&body[at.end..]);
    out.freeze()
}

/// The request body with the client's wrapped `requestState` and task ids back to the
/// backend's own values, where the client's echoes stand (found by the same scan that read the
/// wrapped values, so they are there); the JSON escapes of what is put back are serde_json's.
pub fn restore_originals(body: &Bytes, body_field: &str, unsealed: &Unsealed) -> Bytes {
    let at = dialect::handles_at(body, body_field);
    let state = at.request_state.zip(unsealed.request_state.as_deref());
    let task = at.task_id.zip(unsealed.task_id.as_deref());
    let listed = at
        .task_ids
        .into_iter()
        .zip(&unsealed.task_ids)
        .filter_map(|(at, original)| Some((at, original.as_deref()?)));
    let mut edits: Vec<(Range<usize>, &str)> = state.into_iter().chain(task).chain(listed).collect();
    // Last first: an edit leaves the places before it as they were.
    edits.sort_by_key(|e| std::cmp::Reverse(e.0.start));
    let mut out = body.clone();
    for (at, original) in edits {
        let literal = serde_json::to_vec(original).expect("a string always serializes");
        out = splice(&out, at, &literal);
    }
    out
}

/// Whether the body holds a wrapped handle to put back ([`restore_originals`]).
pub fn restores_body(unsealed: &Unsealed) -> bool {
    unsealed.request_state.is_some() || unsealed.task_id.is_some() || unsealed.task_ids.iter().any(Option::is_some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sealing() -> Sealing {
        let keys = |ttl| Arc::new(SealingKeys::new(vec![vec![7u8; 32]], Duration::from_secs(ttl)).unwrap());
        Sealing {
            calls: keys(60),
            sessions: keys(600),
            accept_clear: false,
        }
    }

    /// An answer's state is wrapped where it stands, the client echoes the token, and the
    /// backend gets its state back.
    fn round_trip(answer: &[u8], echo: impl Fn(&str) -> String) -> (String, Bytes, String) {
        let s = sealing();
        let crate::dialect::Outcome::InputRequired { request_state, at } = crate::dialect::parse_outcome(answer) else {
            panic!("not input_required: {}", String::from_utf8_lossy(answer))
        };
        let wrapped = s.wrap_request_state(None, None, &request_state, "w1", 1, SystemTime::now());
        let rewritten = Replacement::new(answer, at, &wrapped).apply(answer).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(v["result"]["requestState"], wrapped.as_str());
        assert!(token::is_token(&wrapped));
        let retry = format!(
            r#"{{"id":2,"method":"tools/call","params":{{"requestState":{},"name":"x"}}}}"#,
            echo(&wrapped)
        );
        let env = crate::dialect::parse_request(retry.as_bytes(), "messageId").unwrap();
        let headers = http::HeaderMap::new();
        let handles = RequestHandles::new(&headers, &http::HeaderName::from_static("mcp-routing-id"), env);
        let u = s.unseal(&handles, SystemTime::now(), None).unwrap().unwrap();
        assert_eq!(u.backend, "w1");
        assert_eq!(u.request_state.as_deref(), Some(request_state.as_str()));
        let restored = restore_originals(&Bytes::from(retry.clone()), "messageId", &u);
        (String::from_utf8(rewritten.to_vec()).unwrap(), restored, wrapped)
    }

    #[test]
    fn request_state_round_trip_in_a_body() {
        let quoted = |w: &str| format!("\"{w}\"");
        let (_, restored, _) = round_trip(
            br#"{"id":1,"result":{"resultType":"input_required","requestState":"v1.abc-_=","inputRequests":{}}}"#,
            quoted,
        );
        assert_eq!(
            &restored[..],
            br#"{"id":2,"method":"tools/call","params":{"requestState":"v1.abc-_=","name":"x"}}"#
        );
        // Escapes the backend chose (`\/`, `\u00e9`, a quote): wrapped all the same, and the
        // backend gets the same string back.
        let (_, restored, _) = round_trip(
            br#"{"id":1,"result":{"resultType":"input_required","requestState":"a\/b\u00e9\"c"}}"#,
            quoted,
        );
        let v: serde_json::Value = serde_json::from_slice(&restored).unwrap();
        assert_eq!(v["params"]["requestState"], "a/b\u{e9}\"c");
        // A client whose encoder escapes `/` in the token it echoes.
        let (_, restored, wrapped) = round_trip(
            br#"{"id":1,"result":{"resultType":"input_required","requestState":"a/b"}}"#,
            |w| format!("\"{}\"", w.replace('/', "\\/")),
        );
        assert!(wrapped.contains('/'), "the state rides in the token as is: {wrapped}");
        assert_eq!(
            &restored[..],
            br#"{"id":2,"method":"tools/call","params":{"requestState":"a/b","name":"x"}}"#
        );
        // The same literal earlier in the answer (a tool echoing the state) stays as it was.
        let (rewritten, _, wrapped) = round_trip(
            br#"{"id":1,"result":{"content":[{"type":"text","text":"s1"}],"resultType":"input_required","requestState":"s1"}}"#,
            quoted,
        );
        assert_eq!(
            rewritten,
            format!(
                r#"{{"id":1,"result":{{"content":[{{"type":"text","text":"s1"}}],"resultType":"input_required","requestState":"{wrapped}"}}}}"#
            )
        );
    }

    #[test]
    fn every_refusal_has_its_label_value() {
        let all = Rejected::ALL.map(Refused::Token).into_iter().chain([Refused::Conflict]);
        for refused in all {
            assert!(
                crate::metrics::TOKEN_REJECTIONS.contains(&refused.reason()),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_bound_handle_opens_only_for_its_principal() {
        let s = sealing();
        let (alice, bob) = ([1u8; 16], [2u8; 16]);
        let mut headers = http::HeaderMap::new();
        let session = s.wrap_session(Some(&alice), "0123abcd", "w2", SystemTime::now());
        headers.insert("mcp-session-id", session.parse().unwrap());
        headers.insert(
            "mcp-routing-id",
            s.routing_token(Some(&alice), None, "w2", 1, SystemTime::now())
                .parse()
                .unwrap(),
        );
        let name = http::HeaderName::from_static("mcp-routing-id");
        let handles = RequestHandles::new(&headers, &name, Default::default());
        let u = s.unseal(&handles, SystemTime::now(), Some(&alice)).unwrap().unwrap();
        assert_eq!((u.backend.as_str(), u.session_id.as_deref()), ("w2", Some("0123abcd")));
        for caller in [Some(&bob), None] {
            assert_eq!(
                s.unseal(&handles, SystemTime::now(), caller),
                Err(Refused::Principal),
                "{caller:?}"
            );
        }
        // Issued with [auth] off: bound to no one, opens for anyone.
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "mcp-session-id",
            s.wrap_session(None, "0123abcd", "w2", SystemTime::now())
                .parse()
                .unwrap(),
        );
        let handles = RequestHandles::new(&headers, &name, Default::default());
        assert!(s.unseal(&handles, SystemTime::now(), Some(&bob)).unwrap().is_some());
    }

    #[test]
    fn tampered_values_reject_the_request() {
        let s = sealing();
        let good = s.wrap_session(None, "0123abcd", "w2", SystemTime::now());
        let bad = good.replace("0123abcd", "0123abce");
        let mut headers = http::HeaderMap::new();
        headers.insert("mcp-session-id", bad.parse().unwrap());
        let handles = RequestHandles::new(
            &headers,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        assert_eq!(
            s.unseal(&handles, SystemTime::now(), None),
            Err(Refused::Token(Rejected::BadSignature))
        );
        headers.insert("mcp-session-id", good.parse().unwrap());
        let handles = RequestHandles::new(
            &headers,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        let u = s.unseal(&handles, SystemTime::now(), None).unwrap().unwrap();
        assert_eq!((u.backend.as_str(), u.session_id.as_deref()), ("w2", Some("0123abcd")));
        // Values that are not ours pass untouched.
        let mut plain = http::HeaderMap::new();
        plain.insert("mcp-routing-id", "r-77".parse().unwrap());
        let handles = RequestHandles::new(
            &plain,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        assert_eq!(s.unseal(&handles, SystemTime::now(), None), Ok(None));
    }
}
