//! `[quotas]` and `[[quotas.tool]]` as configs write them: defaults, every key, every refusal.

use std::path::Path;

use super::*;
use crate::config::Config;

const BACKEND: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";
const AUTH: &str = "[auth]\nissuer = \"https://idp.example.com\"\n\
    [auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("test.toml"), &format!("{BACKEND}{text}"))
}

fn quotas(text: &str) -> QuotasConfig {
    let c = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    // The printout reads back as the same config.
    assert_eq!(
        Config::parse(Path::new("t.toml"), &c.to_toml()).unwrap(),
        c,
        "{}",
        c.to_toml()
    );
    c.quotas.unwrap()
}

#[test]
fn off_unless_the_section_is_there() {
    assert_eq!(parse("").unwrap().quotas, None);
    let q = quotas("[quotas]\n");
    assert_eq!(q.caller, CallerSource::Ip);
    assert_eq!((q.rate, q.max_in_flight, q.max_open_calls), (None, None, None));
    assert_eq!(q.max_tracked_callers, 100_000);
    assert_eq!(q.store, QuotaStore::Local);
    assert_eq!(
        (q.store_timeout, q.store_failure),
        (Duration::from_millis(50), StoreFailure::Open)
    );
    let notes = parse("[quotas]\n").unwrap().notes();
    assert!(notes.iter().any(|n| n.contains("sets no quota")), "{notes:?}");
    // With [auth], the caller is the principal unless said otherwise.
    assert_eq!(
        quotas(&format!("{AUTH}[quotas]\nrate = \"1/s\"\n")).caller,
        CallerSource::Principal
    );
    let q = quotas(&format!("{AUTH}[quotas]\ncaller = \"ip\"\n"));
    assert_eq!(q.caller, CallerSource::Ip);
}

#[test]
fn every_quota_and_tool() {
    let q = quotas(
        "[quotas]\ncaller = \"header:X-Api-Key\"\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n\
         rate = \"20/s\"\nmax_in_flight = 8\nmax_open_calls = 50\n\
         max_body_bytes_per_connection = 4194304\nmax_body_bytes_per_caller = 8388608\n\
         max_tracked_callers = 1000\nstore_timeout = \"20ms\"\nstore_failure = \"closed\"\n\
         [[quotas.tool]]\nname = \"search\"\nrate = \"30/m\"\nburst = 5\n\
         [[quotas.tool]]\nname = \"slow\"\nmax_in_flight = 4\n",
    );
    assert_eq!(
        q.caller,
        CallerSource::Header(http::HeaderName::from_static("x-api-key"))
    );
    assert_eq!(q.trusted_proxies.len(), 2);
    let second = Duration::from_secs(1);
    assert_eq!(
        q.rate,
        Some(Rate {
            count: 20,
            period: second,
            burst: 20
        })
    );
    assert_eq!((q.max_in_flight, q.max_open_calls), (Some(8), Some(50)));
    assert_eq!(q.max_body_bytes_per_connection, Some(4 << 20));
    assert_eq!(q.max_body_bytes_per_caller, Some(8 << 20));
    assert_eq!(q.store, QuotaStore::Local);
    assert_eq!(q.store_failure, StoreFailure::Closed);
    let minute = Duration::from_secs(60);
    assert_eq!(
        q.tools,
        [
            ToolQuota {
                name: "search".into(),
                rate: Some(Rate {
                    count: 30,
                    period: minute,
                    burst: 5
                }),
                max_in_flight: None
            },
            ToolQuota {
                name: "slow".into(),
                rate: None,
                max_in_flight: Some(4)
            },
        ]
    );
}

#[test]
fn nonsense_is_refused_with_the_key_named() {
    let cases = [
        ("[quotas]\nrate = \"0/s\"\n", "quotas.rate: \"0/s\" is not a rate"),
        ("[quotas]\nrate = \"10/h\"\n", "is not a rate"),
        ("[quotas]\nrate = \"ten/s\"\n", "is not a rate"),
        ("[quotas]\nrate = \"-1/s\"\n", "is not a rate"),
        ("[quotas]\nrate = \"10\"\n", "is not a rate"),
        (
            "[quotas]\nrate = \"1/s\"\nburst = 0\n",
            "quotas.burst: 0 is out of range",
        ),
        ("[quotas]\nburst = 5\n", "quotas.burst: needs quotas.rate"),
        (
            "[quotas]\ntrusted_proxies = [\"10.0.0.1/8\"]\n",
            "quotas.trusted_proxies: \"10.0.0.1/8\" has host bits",
        ),
        (
            "[quotas]\ntrusted_proxies = [\"proxy.internal\"]\n",
            "not an IP network",
        ),
        ("[quotas]\ncaller = \"principal\"\n", "\"principal\" needs [auth]"),
        (
            "[quotas]\ncaller = \"subject\"\n",
            "is not one of \"principal\", \"header:NAME\", \"ip\"",
        ),
        ("[quotas]\ncaller = \"header:\"\n", "is not a valid header name"),
        ("[quotas]\ncaller = \"header:a b\"\n", "is not a valid header name"),
        (
            "[quotas]\nstore = \"memcached://x\"\n",
            "quotas.store: \"memcached://x\" is neither",
        ),
        ("[quotas]\nstore = \"redis://\"\n", "has no host"),
        (
            "[quotas]\nstore = \"redis://127.0.0.1:6379/0\"\n",
            "a shared store holds only the rates",
        ),
        (
            "[quotas]\nrate = \"1/s\"\nstore = \"redis://u:secret@127.0.0.1:6379/x\"\n",
            "\"redis://u:***@127.0.0.1:6379/x\": ",
        ),
        (
            "[quotas]\nrate = \"1/s\"\nstore = \"redis://:${MRTR_TEST_NEVER_SET}@127.0.0.1/0\"\n",
            "quotas.store: environment variable MRTR_TEST_NEVER_SET is not set",
        ),
        (
            "[quotas]\nrate = \"1/s\"\nstore = \"rediss://127.0.0.1\"\n",
            "is neither \"local\" nor a redis:// URL",
        ),
        ("[quotas]\nstore = \"redis://:6379\"\n", "has no host"),
        ("[quotas]\nstore_failure = \"maybe\"\n", "quotas.store_failure"),
        ("[quotas]\nstore_timeout = \"0s\"\n", "greater than zero"),
        (
            "[quotas]\nmax_in_flight = 0\n",
            "quotas.max_in_flight: 0 is out of range",
        ),
        (
            "[quotas]\nmax_open_calls = 0\n",
            "quotas.max_open_calls: 0 is out of range",
        ),
        ("[quotas]\nmax_tracked_callers = 0\n", "out of range"),
        (
            "[quotas]\nmax_body_bytes_per_connection = 1024\n",
            "must be between server.max_body_bytes",
        ),
        (
            "[quotas]\nmax_body_bytes_per_connection = 1099511627776\n",
            "must be between server.max_body_bytes",
        ),
        (
            "[quotas]\nmax_body_bytes_per_caller = 1024\n",
            "quotas.max_body_bytes_per_caller (1024): must be between server.max_body_bytes",
        ),
        ("[quotas]\nbogus = 1\n", "quotas: unknown key `bogus`"),
        (
            "[[quotas.tool]]\nname = \"t\"\n",
            "quotas.tool \"t\": sets neither rate nor max_in_flight",
        ),
        ("[[quotas.tool]]\nrate = \"1/s\"\n", "quotas.tool.name: required"),
        (
            "[[quotas.tool]]\nname = \"t\"\nburst = 3\n",
            "quotas.tool.burst: needs quotas.tool.rate",
        ),
        (
            "[[quotas.tool]]\nname = \"t\"\nmax_in_flight = 1\n[[quotas.tool]]\nname = \"t\"\nmax_in_flight = 2\n",
            "quotas.tool: \"t\" is listed twice",
        ),
        (
            "[[quotas.tool]]\nname = \"t\"\nmax_inflight = 1\n",
            "unknown key `max_inflight`",
        ),
    ];
    for (text, want) in cases {
        let got = parse(text).map(|_| ()).unwrap_err().to_string();
        assert!(got.contains(want), "{text:?}: {got}");
    }
}
