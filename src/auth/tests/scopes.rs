//! What a token grants (scopes and their hierarchies) and whom it names (the principal's
//! digest).

use super::*;

#[test]
fn scope_hierarchies() {
    let granted = Scopes::parse("files mcp:tools read:a:b").unwrap();
    for (required, ok) in [
        ("files", true),
        ("files:write", true),
        ("files:write:all", true),
        ("filesystem", false),
        ("file", false),
        ("mcp:tools", true),
        ("mcp:tools:call", true),
        ("mcp", false),
        ("mcp:toolsx", false),
        ("mcp:prompts", false),
        ("read:a:b:c", true),
        ("read:a", false),
        ("Files", false),
    ] {
        assert_eq!(granted.satisfies(required), ok, "{required}");
    }
    let required: Vec<String> = ["files:read", "mcp", "mcp:prompts", "mcp", "read:a:b"]
        .map(str::to_owned)
        .to_vec();
    assert_eq!(granted.missing(&required), ["mcp", "mcp:prompts"]);
    assert!(Scopes::default().missing(&[]).is_empty());
}

#[test]
fn scope_tokens() {
    for ok in ["a", "files:read", "!#[]~", "https://x.example/scope"] {
        assert!(is_valid_scope(ok), "{ok}");
    }
    for bad in ["", "a b", "a\"b", "a\\b", "é", "a\tb", "\x7f"] {
        assert!(!is_valid_scope(bad), "{bad:?}");
    }
    assert_eq!(Scopes::parse("ok bad\\"), Err(InvalidScope("bad\\".into())));
    let s = Scopes::from_values(["b", "a", "b"]).unwrap();
    assert_eq!((s.len(), s.to_string()), (2, "a b".to_owned()));
    assert!(Scopes::parse("   ").unwrap().is_empty());
}

#[test]
fn the_principal_digest_is_stable_and_unambiguous() {
    let p = Principal::new("https://issuer.example", "user-42");
    // Pinned: sealed handles in flight carry this value; a change breaks them.
    assert_eq!(
        hex(&p.digest()),
        "b79084290f221f0fcb388745f46bdfeeaf7aa2449d26aaf2671078afac0b89bf"
    );
    assert_ne!(Principal::new("ab", "c").digest(), Principal::new("a", "bc").digest());
    assert_ne!(Principal::new("", "x").digest(), Principal::new("x", "").digest());
    assert_ne!(
        Principal::new("i", "svc").digest(),
        Principal::client("i", "svc").digest(),
        "a client is no user"
    );
    assert_eq!(p.digest(), p.clone().digest());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
