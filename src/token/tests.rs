//! The format's unit tests: round trips, every kind against every other, tampering, expiry,
//! the previous format's tokens.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

const TTL: Duration = Duration::from_secs(3600);
const NOW: u64 = 1_750_000_000;
const KINDS: [Kind; 4] = [Kind::RoutingId, Kind::RequestState, Kind::Session, Kind::Task];

fn key(b: u8) -> Vec<u8> {
    vec![b; 32]
}

fn keys(list: &[u8]) -> SealingKeys {
    SealingKeys::new(list.iter().map(|&b| key(b)).collect(), TTL).unwrap()
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn seal_verify_round_trip() {
    let k = keys(&[1]);
    let now = at(NOW) + Duration::from_millis(250);
    let t = k.seal(Kind::RoutingId, "worker-1", 3, now);
    assert!(is_token(&t) && t.starts_with("mrt2."), "{t}");
    assert!(
        t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
        "{t}"
    );
    let c = k.verify(Kind::RoutingId, &t, at(NOW + 10)).unwrap();
    assert_eq!(
        c,
        Claims {
            backend: "worker-1".into(),
            key_id: key_id(&key(1)),
            issued_ms: NOW * 1000 + 250,
            expires: NOW + 3600,
            rounds: Some(3),
            principal: None,
            call: None,
        }
    );
    // Any backend name, including non-ASCII and the empty one, and a long one (on the heap).
    for b in ["", "10.0.0.7:8000", "wörker \"x\"", &"b".repeat(300)] {
        assert_eq!(
            k.verify(Kind::Task, &k.seal(Kind::Task, b, 0, now), now)
                .unwrap()
                .backend,
            b
        );
    }
}

#[test]
fn wrapped_values_round_trip_byte_for_byte() {
    let k = keys(&[1]);
    let long_state = "eyJhbGciOi.JIUzI1NiJ9/+=".repeat(40);
    for v in [
        "",
        "0123456789abcdef",
        &long_state,
        "a.b.c",
        "st\"ate\\/+=é",
        "line\nbreak",
    ] {
        let w = k.seal_value(Kind::RequestState, v, "w2", 7, at(NOW));
        assert!(w.is_ascii() && !w.contains('"') && !w.contains('\\'), "{w}");
        let (back, claims) = k.open_value(Kind::RequestState, &w, at(NOW)).unwrap();
        assert_eq!(
            (back.as_ref(), claims.backend.as_str(), claims.rounds),
            (v, "w2", Some(7))
        );
    }
    // A plain visible-ASCII value travels as is, and comes back borrowed.
    let w = k.seal_value(Kind::Session, "0123abcd", "w2", 0, at(NOW));
    assert!(w.ends_with(".0123abcd"), "{w}");
    assert!(matches!(
        k.open_value(Kind::Session, &w, at(NOW)).unwrap().0,
        Cow::Borrowed(_)
    ));
}

#[test]
fn a_token_is_bound_to_its_kind_and_form() {
    let k = keys(&[1]);
    for made in KINDS {
        let plain = k.seal(made, "w", 1, at(NOW));
        let wrapped = k.seal_value(made, "v", "w", 1, at(NOW));
        for asked in KINDS {
            assert_eq!(
                k.verify(asked, &plain, at(NOW)).is_ok(),
                made == asked,
                "{made:?} as {asked:?}"
            );
            let opened = k.open_value(asked, &wrapped, at(NOW));
            assert_eq!(opened.is_ok(), made == asked, "{made:?} as {asked:?}");
            if made != asked {
                assert_eq!(opened.unwrap_err(), Rejected::BadSignature);
            }
        }
        assert_eq!(k.verify(made, &wrapped, at(NOW)), Err(Rejected::Malformed));
        assert_eq!(k.open_value(made, &plain, at(NOW)).unwrap_err(), Rejected::Malformed);
    }
}

#[test]
fn the_backend_name_cannot_be_read_from_a_token() {
    let k = keys(&[1]);
    for name in ["worker-1", "mcp-7.internal:8443", "dns:10.1.2.3:8000"] {
        let t = k.seal(Kind::RoutingId, name, 0, at(NOW));
        let body = URL_SAFE_NO_PAD.decode(t.strip_prefix(PREFIX).unwrap()).unwrap();
        let visible = |hay: &[u8]| hay.windows(name.len()).any(|w| w == name.as_bytes());
        assert!(!visible(t.as_bytes()) && !visible(&body), "{name} visible in {t}");
        // Two tokens for the same backend at the same moment share no ciphertext (fresh nonces).
        let again = k.seal(Kind::RoutingId, name, 0, at(NOW));
        assert_ne!(t, again);
    }
}

#[test]
fn rotation_the_first_key_seals_and_every_key_opens() {
    let old = keys(&[1]);
    let both = keys(&[2, 1]);
    let t = old.seal(Kind::RoutingId, "w", 0, at(NOW));
    assert_eq!(
        both.verify(Kind::RoutingId, &t, at(NOW)).unwrap().key_id,
        key_id(&key(1))
    );
    let t = both.seal(Kind::RoutingId, "w", 0, at(NOW));
    assert_eq!(
        both.verify(Kind::RoutingId, &t, at(NOW)).unwrap().key_id,
        key_id(&key(2))
    );
    assert_eq!(old.verify(Kind::RoutingId, &t, at(NOW)), Err(Rejected::UnknownKey));
}

#[test]
fn expiry() {
    let k = keys(&[1]);
    let t = k.seal(Kind::RoutingId, "w", 0, at(NOW));
    assert!(
        k.verify(Kind::RoutingId, &t, at(NOW + 3600)).is_ok(),
        "valid through its last second"
    );
    assert_eq!(k.verify(Kind::RoutingId, &t, at(NOW + 3601)), Err(Rejected::Expired));
    let short = k.with_ttl(Duration::from_secs(5)).unwrap();
    let w = short.seal_value(Kind::Session, "s", "w", 0, at(NOW));
    assert_eq!(
        k.open_value(Kind::Session, &w, at(NOW + 6)).unwrap_err(),
        Rejected::Expired
    );
}

#[test]
fn every_changed_bit_is_rejected() {
    let k = keys(&[1]);
    let tokens = [
        (k.seal(Kind::RoutingId, "worker-1", 2, at(NOW)), false),
        (
            k.seal_value(Kind::RoutingId, "0123456789abcdef", "worker-1", 2, at(NOW)),
            true,
        ),
        (k.seal_value(Kind::RoutingId, "st\"ate", "worker-1", 2, at(NOW)), true),
    ];
    for (token, wrapped) in tokens {
        for i in 0..token.len() {
            for bit in 0..8 {
                let mut bytes = token.clone().into_bytes();
                bytes[i] ^= 1 << bit;
                let Ok(changed) = String::from_utf8(bytes) else {
                    continue;
                };
                let accepted = match wrapped {
                    true => k.open_value(Kind::RoutingId, &changed, at(NOW)).is_ok(),
                    false => k.verify(Kind::RoutingId, &changed, at(NOW)).is_ok(),
                };
                assert!(!accepted, "byte {i} bit {bit} changed and accepted: {changed}");
            }
        }
    }
}

#[test]
fn a_wrapped_token_cannot_move_to_another_value() {
    let k = keys(&[1]);
    let a = k.seal_value(Kind::Session, "session-a", "w1", 0, at(NOW));
    let moved = a.replace("session-a", "session-b");
    assert_eq!(
        k.open_value(Kind::Session, &moved, at(NOW)).unwrap_err(),
        Rejected::BadSignature
    );
}

#[test]
fn arbitrary_input_never_panics() {
    let k = keys(&[1]);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for len in 0..400 {
        let mut s = String::from(if len % 2 == 0 { PREFIX } else { "mrt1." });
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            s.push(b"AZaz09-_.~\"\\"[(seed % 12) as usize] as char);
        }
        for kind in KINDS {
            let _ = k.verify(kind, &s, at(NOW));
            let _ = k.open_value(kind, &s, at(NOW));
        }
    }
}

#[test]
fn keys_are_checked_in_one_place() {
    let e = SealingKeys::new(vec![key(1), vec![7; 31]], TTL).unwrap_err();
    assert_eq!(e, "tokens.keys[1]: must be at least 32 bytes (got 31)");
    assert!(SealingKeys::new(vec![], TTL).unwrap_err().starts_with("tokens.keys:"));
    assert!(SealingKeys::new(vec![key(1)], Duration::from_millis(500)).is_err());
    assert!(SealingKeys::new(vec![key(1)], Duration::from_secs(1 << 33)).is_err());
    let p = SealingKeys::build(&[key(1), key(2), key(1)], TTL).unwrap_err();
    assert_eq!(
        (p.index, p.message.as_str()),
        (Some(2), "tokens.keys[2]: same key as tokens.keys[0]")
    );
    // Long keys are fine; Debug never shows key material.
    let k = SealingKeys::new(vec![vec![0xab; 200]], TTL).unwrap();
    assert!(!format!("{k:?}").contains("171"), "{k:?}");
    assert_eq!(k.ttl(), TTL);
}

#[test]
fn tokens_of_the_previous_format_are_accepted_for_their_lifetime() {
    let legacy = LegacySealingKeys::new(vec![key(1)], TTL).unwrap();
    let k = keys(&[1]);
    let t = legacy.seal("worker-1", at(NOW));
    let c = k.verify(Kind::RoutingId, &t, at(NOW + 5)).unwrap();
    assert_eq!(
        (c.backend.as_str(), c.issued_ms, c.rounds),
        ("worker-1", NOW * 1000, None)
    );
    assert_eq!(k.verify(Kind::RoutingId, &t, at(NOW + 3601)), Err(Rejected::Expired));
    let w = legacy.seal_value("state-1", "worker-2", at(NOW));
    let (v, c) = k.open_value(Kind::RequestState, &w, at(NOW)).unwrap();
    assert_eq!((v.as_ref(), c.backend.as_str()), ("state-1", "worker-2"));
    // A changed byte is still detected.
    let bad = w.replace("state-1", "state-2");
    assert_eq!(
        k.open_value(Kind::RequestState, &bad, at(NOW)).unwrap_err(),
        Rejected::BadSignature
    );
    // Keys the router does not have are unknown in either format.
    assert_eq!(
        keys(&[9]).verify(Kind::RoutingId, &t, at(NOW)),
        Err(Rejected::UnknownKey)
    );
}

#[test]
fn reasons() {
    let labels: Vec<_> = Rejected::ALL.iter().map(|r| r.reason()).collect();
    assert_eq!(labels, ["malformed", "unknown_key", "bad_signature", "expired"]);
}

#[test]
fn stable_tokens_are_the_same_for_the_same_handle_and_open_as_its_kind() {
    let k = keys(&[1]);
    let a = k.seal_stable(Kind::Task, "task-7", "worker-1");
    assert_eq!(a, k.seal_stable(Kind::Task, "task-7", "worker-1"), "one id, one token");
    assert_eq!(
        a,
        keys(&[1]).seal_stable(Kind::Task, "task-7", "worker-1"),
        "on every replica"
    );
    assert_ne!(a, k.seal_stable(Kind::Task, "task-8", "worker-1"));
    assert_ne!(a, k.seal_stable(Kind::Task, "task-7", "worker-2"));
    let (v, c) = k.open_value(Kind::Task, &a, at(NOW)).unwrap();
    assert_eq!((v.as_ref(), c.backend.as_str(), c.issued_ms), ("task-7", "worker-1", 0));
    assert_eq!(
        k.open_value(Kind::Session, &a, at(NOW)).unwrap_err(),
        Rejected::BadSignature
    );
    assert!(
        k.open_value(Kind::Task, &a, at(NOW + 50 * 365 * 24 * 3600)).is_ok(),
        "no expiry (until 2106)"
    );
    // The name is not readable in it either.
    assert!(!a.contains("worker-1"));
}

#[test]
fn bound_tokens_carry_their_principal_and_it_cannot_be_changed_or_removed() {
    let k = keys(&[1]);
    let (alice, bob) = ([0xa1; 16], [0xb0; 16]);
    let t = k.seal_for(Some(&alice), None, Kind::RoutingId, "worker-1", 2, at(NOW));
    let c = k.verify(Kind::RoutingId, &t, at(NOW)).unwrap();
    assert_eq!(
        (c.principal, c.backend.as_str(), c.rounds),
        (Some(alice), "worker-1", Some(2))
    );
    assert_eq!(
        k.verify(Kind::RoutingId, &k.seal(Kind::RoutingId, "w", 0, at(NOW)), at(NOW))
            .unwrap()
            .principal,
        None
    );
    for value in ["state-1", "needs \"escaping\" é", ""] {
        let w = k.seal_value_for(Some(&bob), None, Kind::RequestState, value, "worker-2", 1, at(NOW));
        let (v, c) = k.open_value(Kind::RequestState, &w, at(NOW)).unwrap();
        assert_eq!((v.as_ref(), c.principal), (value, Some(bob)));
    }
    // The flag is authenticated: clearing or setting it (or changing a principal byte) fails.
    let body_of = |t: &str| {
        URL_SAFE_NO_PAD
            .decode(t.strip_prefix(PREFIX).unwrap().split('.').next().unwrap())
            .unwrap()
    };
    let text_of = |b: &[u8]| format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(b));
    let mut body = body_of(&t);
    body[4] &= !FLAG_PRINCIPAL;
    assert!(k.verify(Kind::RoutingId, &text_of(&body), at(NOW)).is_err());
    let mut body = body_of(&t);
    body[HEAD + 3] ^= 1;
    assert_eq!(
        k.verify(Kind::RoutingId, &text_of(&body), at(NOW)).unwrap_err(),
        Rejected::BadSignature
    );
    // Stable tokens: one per (principal, value), different across principals.
    let a = k.seal_stable_for(Some(&alice), Kind::Task, "task-7", "worker-1");
    assert_eq!(a, k.seal_stable_for(Some(&alice), Kind::Task, "task-7", "worker-1"));
    assert_ne!(a, k.seal_stable_for(Some(&bob), Kind::Task, "task-7", "worker-1"));
    assert_ne!(a, k.seal_stable(Kind::Task, "task-7", "worker-1"));
    assert_eq!(k.open_value(Kind::Task, &a, at(NOW)).unwrap().1.principal, Some(alice));
}

#[test]
fn tokens_name_their_call_and_it_cannot_be_changed_or_removed() {
    let k = keys(&[1]);
    let alice = [0xa1; 16];
    for (principal, call) in [
        (
            None,
            CallTag {
                digest: 7,
                by_routing_id: false,
            },
        ),
        (
            Some(&alice),
            CallTag {
                digest: u128::MAX - 3,
                by_routing_id: true,
            },
        ),
    ] {
        let t = k.seal_for(principal, Some(call), Kind::RoutingId, "worker-1", 2, at(NOW));
        let c = k.verify(Kind::RoutingId, &t, at(NOW)).unwrap();
        assert_eq!(
            (c.call, c.principal.as_ref(), c.backend.as_str()),
            (Some(call), principal, "worker-1")
        );
        let w = k.seal_value_for(principal, Some(call), Kind::RequestState, "s-1", "worker-2", 1, at(NOW));
        let (v, c) = k.open_value(Kind::RequestState, &w, at(NOW)).unwrap();
        assert_eq!((v.as_ref(), c.call), ("s-1", Some(call)));
        // The flags are authenticated: clearing or setting a call flag is refused.
        let mut raw = URL_SAFE_NO_PAD.decode(t.strip_prefix("mrt2.").unwrap()).unwrap();
        for flip in [8u8, 16] {
            raw[4] ^= flip;
            let forged = format!("mrt2.{}", URL_SAFE_NO_PAD.encode(&raw));
            assert!(k.verify(Kind::RoutingId, &forged, at(NOW)).is_err(), "flag {flip}");
            raw[4] ^= flip;
        }
    }
}
