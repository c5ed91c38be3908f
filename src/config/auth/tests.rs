//! `[auth]` and its tables as configs write them: off unless strict, tools, methods and scopes,
//! every mistake refused with its key named.

use std::path::Path;

use super::*;
use crate::config::Config;

const BACKEND: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";

fn parse(auth: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("test.toml"), &format!("{BACKEND}{auth}"))
}

fn error(auth: &str) -> String {
    parse(auth).unwrap_err().message
}

const STRICT: &str = "[auth]\nissuer = \"https://idp.example.com\"\n\
    [auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n";

#[test]
fn off_unless_the_section_is_there_and_strict() {
    assert_eq!(parse("").unwrap().auth, None);
    assert_eq!(parse("[auth]\nmode = \"off\"\n").unwrap().auth, None);
    let c = parse(STRICT).unwrap();
    let a = c.auth.as_ref().unwrap();
    assert_eq!(a.audiences, ["https://mcp.example.com/mcp"]);
    assert_eq!(a.allowed_origins, ["https://mcp.example.com"]);
    assert_eq!(a.resource.authorization_servers, ["https://idp.example.com"]);
    assert_eq!(
        a.resource.url(),
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    );
    assert_eq!(a.jwks, JwksSource::Discovered);
    assert_eq!(a.forward, Forward::Strip);
    assert!(a.identity_headers);
    assert_eq!(a.algorithms, AlgorithmSet::ALL);
    // The printout reads back as the same config.
    assert_eq!(Config::parse(Path::new("t.toml"), &c.to_toml()).unwrap(), c);
}

#[test]
fn tools_methods_and_scopes() {
    let text = "[auth]\nissuer = \"https://idp.example.com\"\nrequired_scopes = [\"mcp\"]\n\
        jwks_uri = \"http://127.0.0.1:9999/jwks\"\n\
        [auth.resource_metadata]\nresource = \"https://mcp.example.com\"\n\
        [[auth.tool]]\nname = \"transfer\"\nscopes = [\"pay:write\", \"pay:write\"]\n\
        [[auth.method]]\nname = \"tasks/get\"\nscopes = [\"tasks\"]\n";
    let a = parse(text).unwrap().auth.unwrap();
    assert_eq!(
        a.tools,
        [Scoped {
            name: "transfer".into(),
            scopes: vec!["pay:write".into()]
        }]
    );
    assert_eq!(a.methods[0].scopes, ["tasks"]);
    assert_eq!(a.resource.scopes_supported, ["mcp", "pay:write", "tasks"]);
    assert_eq!(
        a.resource.url(),
        "https://mcp.example.com/.well-known/oauth-protected-resource"
    );
    assert!(matches!(a.jwks, JwksSource::Uri(_)));
}

#[test]
fn mistakes_are_refused_with_the_key_named() {
    let cases = [
        ("[auth]\n", "auth.issuer: required"),
        (
            "[auth]\nissuer = \"https://i\"\n",
            "auth.resource_metadata.resource: required",
        ),
        (&format!("{STRICT}[auth.x]\n"), "unknown key `x`"),
        (
            "[auth]\nissuer = \"https://i\"\njwks_uri = \"http://idp.example.com/jwks\"\n",
            "http:// only to a loopback",
        ),
        (
            "[auth]\nissuer = \"https://i\"\njwks_uri = \"https://i/j\"\njwks_file = \"j.json\"\n",
            "set one, not both",
        ),
        (
            "[auth]\nissuer = \"https://i\"\nalgorithms = [\"HS256\"]\n",
            "is an HMAC algorithm",
        ),
        ("[auth]\nissuer = \"https://i\"\nalgorithms = []\n", "at least one"),
        (
            "[auth]\nissuer = \"https://i\"\nrequired_scopes = [\"a b\"]\n",
            "auth.required_scopes: \"a b\" is not a scope",
        ),
        (
            "[auth]\nissuer = \"https://i\"\npublic_paths = [\"health\"]\n",
            "must start with `/`",
        ),
        (
            "[auth]\nissuer = \"https://i\"\njwks_refresh_min = \"2h\"\n",
            "jwks_refresh_max: must be at least",
        ),
        (
            "[auth]\nissuer = \"https://i\"\njwks_file = \"/nonexistent/jwks.json\"\n",
            "auth.jwks_file: cannot read",
        ),
    ];
    for (text, want) in cases {
        let got = error(text);
        assert!(got.contains(want), "{text:?}: {got}");
    }
    let tools = format!("{STRICT}[[auth.tool]]\nname = \"t\"\n[[auth.tool]]\nname = \"t\"\n");
    assert!(
        error(&tools).contains("auth.tool: \"t\" is listed twice"),
        "{}",
        error(&tools)
    );
    let query = "[auth]\nissuer = \"https://i\"\n[auth.resource_metadata]\nresource = \"https://m/mcp?x=1\"\n";
    assert!(error(query).contains("no query or fragment"), "{}", error(query));
}
