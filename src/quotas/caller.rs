//! Who a request's caller is, as a fixed-size key: no string of a caller's is kept.
//!
//! - `principal`: the verified principal's tag (issuer and subject, from `auth`), as given.
//! - `header:NAME`: SHA-256 of the header's last value, cut to 16 bytes (the last: a gateway
//!   that appends rather than replaces puts its own value after the client's). When
//!   `trusted_proxies` is set, the header is believed only from those peers.
//! - `ip`: the client IP (below), an IPv4 address as its IPv4-mapped IPv6 form, an IPv6 one cut
//!   to its /64: one host or home network gets a /64 or more, so counting each address apart
//!   would give every attacker millions of buckets.
//!
//! A request without a principal (a public path) or without the header is counted by IP.
//!
//! **The client IP.** The TCP peer (or the source of its PROXY protocol header), unless that
//! peer is in `trusted_proxies`: then the `X-Forwarded-For` hops (every such header in order,
//! as one list) are walked from the right, skipping each hop that is itself trusted, and the
//! first hop that is not is the client. Every hop right of it was added by a trusted proxy, so
//! it is the address that proxy saw; anything left of it is the client's own claim, never read.
//! A hop that is not an address (`unknown`, garbage), hops that run out, or more than
//! [`MAX_HOPS`] of them stop the walk at the last trusted address reached: the request counts
//! against that proxy, never against an address nobody vouched for. From a peer that is not
//! trusted, `X-Forwarded-For` is ignored whatever it says.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderMap;

use crate::config::{CallerSource, Cidr};

/// Hops of `X-Forwarded-For` walked at most: a chain of trusted proxies is a few hops long.
pub const MAX_HOPS: usize = 16;

/// A caller, as a 16-byte key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerKey(pub(super) [u8; 16]);

impl CallerKey {
    /// The caller of a verified principal, from its tag.
    pub fn from_principal(tag: &[u8; 16]) -> CallerKey {
        CallerKey(*tag)
    }

    /// The caller a header value names.
    pub fn from_header_value(value: &[u8]) -> CallerKey {
        CallerKey::digest(b"mrtr-quota-header-v1\0", value)
    }

    /// SHA-256 of `domain` then `bytes`, cut to 16 bytes.
    fn digest(domain: &[u8], bytes: &[u8]) -> CallerKey {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(domain);
        ctx.update(bytes);
        let mut key = [0; 16];
        key.copy_from_slice(&ctx.finish().as_ref()[..16]);
        CallerKey(key)
    }

    /// The caller at a client IP (IPv6 by /64).
    pub fn from_ip(ip: IpAddr) -> CallerKey {
        CallerKey(match ip.to_canonical() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => (u128::from(v6) & !(u128::MAX >> 64)).to_be_bytes(),
        })
    }

    /// The key's bytes.
    pub fn bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The caller's name in the shared store (`mrtr:rate:caller:HEX`): SHA-256 of the key, cut
    /// to 16 bytes, in hex. Never the key itself, which for an `ip` caller is the address.
    pub fn store_digest(&self) -> String {
        CallerKey::digest(b"mrtr-quota-store-v1\0", &self.0).to_string()
    }
}

impl CallerKey {
    /// What the access log shows of the caller: an IP caller as its address (an IPv6 one as its
    /// /64), a principal or header caller as its key in hex, a digest that names no one (a
    /// header may carry a credential; the principal's subject has a field of its own).
    pub fn log_text(&self) -> String {
        let v6 = Ipv6Addr::from(self.0);
        if let Some(v4) = v6.to_ipv4_mapped() {
            return v4.to_string();
        }
        // A digest whose last 8 bytes are all zero: one in 2^64.
        if self.0[8..] == [0; 8] {
            return format!("{v6}/64");
        }
        self.to_string()
    }
}

/// Hex: what a log line may show of a principal or header caller.
impl fmt::Display for CallerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerKey({self})")
    }
}

/// `[quotas] caller` and `trusted_proxies`, ready to name callers.
#[derive(Debug, Clone)]
pub struct CallerRule {
    source: CallerSource,
    trusted: Vec<Cidr>,
}

impl CallerRule {
    pub fn new(source: CallerSource, trusted: Vec<Cidr>) -> CallerRule {
        CallerRule { source, trusted }
    }

    /// The caller of a request: `principal` is the verified principal's tag when `[auth]`
    /// verified one, `peer` the connection's client address (the PROXY header's source when
    /// there was one).
    pub fn key(&self, principal: Option<&[u8; 16]>, headers: &HeaderMap, peer: IpAddr) -> CallerKey {
        match (&self.source, principal) {
            (CallerSource::Principal, Some(tag)) => return CallerKey::from_principal(tag),
            (CallerSource::Header(name), _) if self.trusted.is_empty() || Cidr::any_contains(&self.trusted, peer) => {
                let last = headers.get_all(name).iter().next_back();
                if let Some(value) = last.filter(|v| !v.is_empty()) {
                    return CallerKey::from_header_value(value.as_bytes());
                }
            }
            _ => {}
        }
        CallerKey::from_ip(self.client_ip(headers, peer))
    }

    /// The client IP (the module's comment has the rule).
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let trusted = |ip: IpAddr| Cidr::any_contains(&self.trusted, ip);
        if !trusted(peer) {
            return peer;
        }
        let mut reached = peer;
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .rev()
            .flat_map(|value| value.as_bytes().rsplit(|&b| b == b','));
        for hop in hops.take(MAX_HOPS) {
            let Some(ip) = hop_address(hop) else {
                return reached;
            };
            if !trusted(ip) {
                return ip;
            }
            reached = ip;
        }
        reached
    }
}

/// One `X-Forwarded-For` hop: an address, with a port or in brackets as some proxies write it.
fn hop_address(hop: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(hop).ok()?.trim_matches([' ', '\t']);
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn rule(source: CallerSource, trusted: &[&str]) -> CallerRule {
        CallerRule::new(source, trusted.iter().map(|t| t.parse().unwrap()).collect())
    }

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", http::HeaderValue::from_bytes(v.as_bytes()).unwrap());
        }
        h
    }

    #[test]
    fn the_log_shows_an_address_for_an_ip_caller_and_a_digest_for_the_others() {
        assert_eq!(CallerKey::from_ip(ip("203.0.113.7")).log_text(), "203.0.113.7");
        assert_eq!(CallerKey::from_ip(ip("::ffff:203.0.113.7")).log_text(), "203.0.113.7");
        assert_eq!(
            CallerKey::from_ip(ip("2001:db8:1:2:3:4:5:6")).log_text(),
            "2001:db8:1:2::/64"
        );
        let header = CallerKey::from_header_value(b"api-key-of-tenant-7");
        assert_eq!(header.log_text(), header.to_string());
        assert_eq!(header.log_text().len(), 32);
        assert!(!header.log_text().contains("tenant"));
        let principal = CallerKey::from_principal(&[7; 16]);
        assert_eq!(principal.log_text(), "07".repeat(16));
    }

    #[test]
    fn the_client_ip_is_the_right_most_hop_no_trusted_proxy_vouches_for() {
        let r = rule(CallerSource::Ip, &["10.0.0.0/8", "2001:db8::/32"]);
        let cases: &[(&str, &[&str], &str)] = &[
            // An untrusted peer: its X-Forwarded-For, spoofed or not, is never read.
            ("203.0.113.7", &["198.51.100.1"], "203.0.113.7"),
            ("203.0.113.7", &["10.0.0.1"], "203.0.113.7"),
            ("203.0.113.7", &["garbage"], "203.0.113.7"),
            // A trusted peer: the hop it added.
            ("10.0.0.2", &["198.51.100.1"], "198.51.100.1"),
            // The client's own claim left of it is ignored.
            ("10.0.0.2", &["6.6.6.6, 198.51.100.1"], "198.51.100.1"),
            ("10.0.0.2", &["6.6.6.6", "198.51.100.1"], "198.51.100.1"),
            // A chain of trusted proxies is walked through.
            ("10.0.0.2", &["198.51.100.1, 10.9.9.9"], "198.51.100.1"),
            (
                "10.0.0.2",
                &["6.6.6.6, 198.51.100.1", "10.1.1.1,10.2.2.2"],
                "198.51.100.1",
            ),
            // Ports, brackets, spaces, IPv6, a mapped peer.
            ("10.0.0.2", &["198.51.100.1:4711"], "198.51.100.1"),
            ("10.0.0.2", &["[2001:db9::5]:443"], "2001:db9::5"),
            ("10.0.0.2", &[" \t2001:db9::5 "], "2001:db9::5"),
            ("10.0.0.2", &["[2001:db9::5]"], "2001:db9::5"),
            ("::ffff:10.0.0.2", &["198.51.100.1"], "198.51.100.1"),
            ("2001:db8::1", &["198.51.100.1"], "198.51.100.1"),
            // Nothing a trusted proxy vouched for: the last trusted address reached.
            ("10.0.0.2", &[], "10.0.0.2"),
            ("10.0.0.2", &["10.3.3.3"], "10.3.3.3"),
            ("10.0.0.2", &["unknown"], "10.0.0.2"),
            ("10.0.0.2", &["6.6.6.6, garbage, 10.3.3.3"], "10.3.3.3"),
            ("10.0.0.2", &[""], "10.0.0.2"),
            ("10.0.0.2", &["198.51.100.1,"], "10.0.0.2"),
            ("10.0.0.2", &["1.2.3.4.5"], "10.0.0.2"),
            ("10.0.0.2", &["[10.0.0.1]"], "10.0.0.2"),
        ];
        for (peer, xff, want) in cases {
            assert_eq!(r.client_ip(&headers(xff), ip(peer)), ip(want), "{peer} {xff:?}");
        }
        // Past MAX_HOPS trusted hops, the walk stops where it is.
        let long = vec!["10.0.0.9"; MAX_HOPS + 4].join(",");
        let spoof = format!("6.6.6.6,{long}");
        assert_eq!(r.client_ip(&headers(&[&spoof]), ip("10.0.0.2")), ip("10.0.0.9"));
        // Not UTF-8.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", http::HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(r.client_ip(&h, ip("10.0.0.2")), ip("10.0.0.2"));
        // No trusted proxy at all: the peer, always.
        let direct = rule(CallerSource::Ip, &[]);
        assert_eq!(
            direct.client_ip(&headers(&["198.51.100.1"]), ip("10.0.0.2")),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn keys_by_principal_header_or_address() {
        let tag = [7u8; 16];
        let peer = ip("203.0.113.7");
        let by_principal = rule(CallerSource::Principal, &[]);
        assert_eq!(by_principal.key(Some(&tag), &HeaderMap::new(), peer).bytes(), &tag);
        // No principal (a public path): by IP.
        assert_eq!(
            by_principal.key(None, &HeaderMap::new(), peer),
            CallerKey::from_ip(peer)
        );

        let name = http::HeaderName::from_static("x-api-key");
        let by_header = rule(CallerSource::Header(name.clone()), &[]);
        let mut h = HeaderMap::new();
        h.append(&name, "alice".parse().unwrap());
        let alice = by_header.key(None, &h, peer);
        assert_eq!(alice, CallerKey::from_header_value(b"alice"));
        assert_ne!(alice, CallerKey::from_header_value(b"bob"));
        assert_eq!(
            by_header.key(None, &h, ip("198.51.100.1")),
            alice,
            "the same caller from elsewhere"
        );
        // The last value counts; an empty or absent header falls back to the IP.
        h.append(&name, "bob".parse().unwrap());
        assert_eq!(by_header.key(None, &h, peer), CallerKey::from_header_value(b"bob"));
        let mut empty = HeaderMap::new();
        empty.append(&name, "".parse().unwrap());
        assert_eq!(by_header.key(None, &empty, peer), CallerKey::from_ip(peer));
        // With trusted proxies, the header only from them.
        let gated = rule(CallerSource::Header(name.clone()), &["10.0.0.0/8"]);
        assert_eq!(gated.key(None, &h, peer), CallerKey::from_ip(peer));
        assert_eq!(
            gated.key(None, &h, ip("10.1.1.1")),
            CallerKey::from_header_value(b"bob")
        );
    }

    #[test]
    fn addresses_key_ipv4_alone_and_ipv6_by_64() {
        let k = |t: &str| CallerKey::from_ip(ip(t));
        assert_ne!(k("192.0.2.1"), k("192.0.2.2"));
        assert_eq!(k("192.0.2.1"), k("::ffff:192.0.2.1"));
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_ne!(k("::1"), k("0.0.0.1"));
        assert_eq!(k("192.0.2.1").to_string(), "00000000000000000000ffffc0000201");
    }
}
