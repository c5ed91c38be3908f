//! Where sealed tokens travel (DESIGN §5): unsealing what a client echoes before the request
//! is routed and forwarded (the backend always sees its own bytes), and sealing the backend
//! into what an answer hands out (`Mcp-Routing-Id`, `requestState`, `Mcp-Session-Id`).

use std::time::SystemTime;

use bytes::{Bytes, BytesMut};

use crate::config::TokensConfig;
use crate::route::RequestKeys;
use crate::token::{self, Rejected, TokenKeys};

/// The keys for each kind of sealed value.
pub struct Sealing {
    /// Routing tokens and wrapped `requestState`s (`tokens.token_ttl`).
    calls: TokenKeys,
    /// Wrapped session ids (`tokens.session_ttl`): they live as long as the session.
    sessions: TokenKeys,
}

/// What the tokens of one request say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsealed {
    /// The backend the (first) token names.
    pub backend: String,
    /// The backend's own session id, when the request's `Mcp-Session-Id` was wrapped.
    pub session_id: Option<String>,
    /// `(wrapped, original)` when the request's `params.requestState` was wrapped.
    pub request_state: Option<(String, String)>,
}

/// A JSON string in an answer to replace by its wrapped form (both quoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pub from: String,
    pub to: String,
}

impl Sealing {
    pub fn new(cfg: &TokensConfig) -> Result<Sealing, String> {
        Ok(Sealing {
            calls: TokenKeys::new(cfg.keys.clone(), cfg.token_ttl)?,
            sessions: TokenKeys::new(cfg.keys.clone(), cfg.session_ttl)
                .map_err(|e| e.replace("token_ttl", "session_ttl"))?,
        })
    }

    /// Verifies every sealed value the request carries. `Ok(None)`: nothing of ours in it.
    /// Any value of ours that fails verification rejects the request.
    pub fn unseal(&self, keys: &RequestKeys, now: SystemTime) -> Result<Option<Unsealed>, Rejected> {
        let mut backend = None;
        if let Some(h) = keys.header_key.filter(|h| token::is_token(h)) {
            backend = Some(self.calls.verify(h, now)?.backend);
        }
        let mut request_state = None;
        if let Some(s) = keys.request_state.as_deref().filter(|s| token::is_token(s)) {
            let (original, claims) = self.calls.unwrap(s, now)?;
            backend.get_or_insert(claims.backend);
            request_state = Some((s.to_string(), original.into_owned()));
        }
        let mut session_id = None;
        if let Some(s) = keys.session_id.filter(|s| token::is_token(s)) {
            let (original, claims) = self.sessions.unwrap(s, now)?;
            backend.get_or_insert(claims.backend);
            session_id = Some(original.into_owned());
        }
        Ok(backend.map(|backend| Unsealed {
            backend,
            session_id,
            request_state,
        }))
    }

    /// A routing token naming `backend`, for the `Mcp-Routing-Id` answer header.
    pub fn routing_token(&self, backend: &str) -> String {
        self.calls.seal(backend, SystemTime::now())
    }

    /// The session id a client should echo for the backend's `session_id`.
    pub fn wrap_session(&self, session_id: &str, backend: &str) -> String {
        self.sessions.wrap(session_id, backend, SystemTime::now())
    }

    /// The wrapped form of a `requestState` and where it goes in the answer, or `None` when
    /// the state is not written as a plain JSON string (then only the local pin table knows it).
    pub fn wrap_request_state(&self, state: &str, backend: &str) -> Option<Replacement> {
        if state.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return None;
        }
        let wrapped = self.calls.wrap(state, backend, SystemTime::now());
        Some(Replacement {
            from: format!("\"{state}\""),
            to: format!("\"{wrapped}\""),
        })
    }
}

/// `body` with the first occurrence of `from` replaced by `to`, if there is one.
pub fn replace_once(body: &[u8], from: &[u8], to: &[u8]) -> Option<Bytes> {
    let at = memchr::memmem::find(body, from)?;
    let mut out = BytesMut::with_capacity(body.len() - from.len() + to.len());
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(to);
    out.extend_from_slice(&body[at + from.len()..]);
    Some(out.freeze())
}

/// The request body with the client's wrapped `requestState` back to the backend's own bytes.
pub fn restore_request_state(body: &[u8], wrapped: &str, original: &str) -> Option<Bytes> {
    let from = format!("\"{wrapped}\"");
    let to = serde_json::to_string(original).ok()?;
    replace_once(body, from.as_bytes(), to.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sealing() -> Sealing {
        let cfg = TokensConfig {
            keys: vec![vec![7u8; 32]],
            token_ttl: Duration::from_secs(60),
            session_ttl: Duration::from_secs(600),
        };
        Sealing::new(&cfg).unwrap()
    }

    #[test]
    fn request_state_round_trip_in_a_body() {
        let s = sealing();
        let answer =
            br#"{"id":1,"result":{"resultType":"input_required","requestState":"v1.abc-_=","inputRequests":{}}}"#;
        let r = s.wrap_request_state("v1.abc-_=", "w1").unwrap();
        let rewritten = replace_once(answer, r.from.as_bytes(), r.to.as_bytes()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&rewritten).unwrap();
        let wrapped = v["result"]["requestState"].as_str().unwrap().to_string();
        assert!(token::is_token(&wrapped));
        // The client echoes it; the router restores the backend's bytes.
        let retry = format!(r#"{{"id":2,"method":"tools/call","params":{{"requestState":"{wrapped}","name":"x"}}}}"#);
        let env = crate::dialect::parse_request(retry.as_bytes(), "messageId").unwrap();
        let headers = http::HeaderMap::new();
        let keys = RequestKeys::new(&headers, &http::HeaderName::from_static("mcp-routing-id"), env);
        let u = s.unseal(&keys, SystemTime::now()).unwrap().unwrap();
        assert_eq!(u.backend, "w1");
        let (w, orig) = u.request_state.unwrap();
        let restored = restore_request_state(retry.as_bytes(), &w, &orig).unwrap();
        assert_eq!(
            &restored[..],
            br#"{"id":2,"method":"tools/call","params":{"requestState":"v1.abc-_=","name":"x"}}"#
        );
        // States that need JSON escaping are not wrapped (the local pin table still routes them).
        assert!(s.wrap_request_state("a\"b", "w1").is_none());
    }

    #[test]
    fn tampered_values_reject_the_request() {
        let s = sealing();
        let good = s.wrap_session("0123abcd", "w2");
        let bad = good.replace("0123abcd", "0123abce");
        let mut headers = http::HeaderMap::new();
        headers.insert("mcp-session-id", bad.parse().unwrap());
        let keys = RequestKeys::new(
            &headers,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        assert_eq!(s.unseal(&keys, SystemTime::now()), Err(Rejected::BadSignature));
        headers.insert("mcp-session-id", good.parse().unwrap());
        let keys = RequestKeys::new(
            &headers,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        let u = s.unseal(&keys, SystemTime::now()).unwrap().unwrap();
        assert_eq!((u.backend.as_str(), u.session_id.as_deref()), ("w2", Some("0123abcd")));
        // Values that are not ours pass untouched.
        let mut plain = http::HeaderMap::new();
        plain.insert("mcp-routing-id", "r-77".parse().unwrap());
        let keys = RequestKeys::new(
            &plain,
            &http::HeaderName::from_static("mcp-routing-id"),
            Default::default(),
        );
        assert_eq!(s.unseal(&keys, SystemTime::now()), Ok(None));
    }
}
