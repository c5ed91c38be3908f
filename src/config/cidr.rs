//! IP networks as configs write them (`10.0.0.0/8`, `2001:db8::/32`, or one address), for the
//! peers the router trusts: proxies that add `X-Forwarded-For` (`[quotas] trusted_proxies`) and
//! load balancers that send a PROXY protocol header (`server.proxy_protocol_from`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A network: an address whose bits past `prefix` are zero, and the prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the network. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, what a
    /// dual-stack socket reports for an IPv4 peer) is the IPv4 address it maps.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask(u32::from(ip).into(), 32, self.prefix) == u32::from(net).into(),
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask(u128::from(ip), 128, self.prefix) == u128::from(net),
            _ => false,
        }
    }

    /// Whether any of `networks` contains `ip`.
    pub fn any_contains(networks: &[Cidr], ip: IpAddr) -> bool {
        networks.iter().any(|n| n.contains(ip))
    }
}

/// `bits` with all but its first `prefix` of `width` bits cleared.
fn mask(bits: u128, width: u32, prefix: u8) -> u128 {
    match u32::from(prefix) {
        0 => 0,
        p => bits & (u128::MAX << (width - p)) & (u128::MAX >> (128 - width)),
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `address/prefix`, or an address alone (the one host). Host bits set (`10.0.0.1/8`) are an
    /// error: such a value is usually a typo for a narrower network, and widening it silently
    /// would trust more peers than meant.
    fn from_str(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IP network (e.g. \"10.0.0.0/8\", \"2001:db8::/32\")"))?;
        let width: u8 = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            // Digits only: `u8::from_str` would take `+8` too.
            Some(p) => match p.bytes().all(|b| b.is_ascii_digit()).then(|| p.parse::<u8>()) {
                Some(Ok(p)) if p <= width => p,
                _ => return Err(format!("{text:?}: the prefix length must be 0 to {width}")),
            },
        };
        let bits = match network {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        };
        let masked = mask(bits, width.into(), prefix);
        if masked != bits {
            let net = match network {
                IpAddr::V4(_) => IpAddr::from(std::net::Ipv4Addr::from(masked as u32)),
                IpAddr::V6(_) => IpAddr::from(std::net::Ipv6Addr::from(masked)),
            };
            return Err(format!("{text:?} has host bits set: the network is {net}/{prefix}"));
        }
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let cases = [
            ("10.0.0.0/8", "10.255.1.2", true),
            ("10.0.0.0/8", "11.0.0.0", false),
            ("10.0.0.0/8", "::ffff:10.1.2.3", true),
            ("10.0.0.0/8", "::1", false),
            ("192.168.1.7", "192.168.1.7", true),
            ("192.168.1.7", "192.168.1.8", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("0.0.0.0/0", "2001:db8::1", false),
            ("2001:db8::/32", "2001:db8:ffff::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
            ("::/0", "fe80::1", true),
            ("::1", "::1", true),
            ("fd00::/8", "10.0.0.1", false),
        ];
        for (net, addr, inside) in cases {
            let cidr: Cidr = net.parse().unwrap();
            assert_eq!(cidr.contains(ip(addr)), inside, "{net} ∋ {addr}");
        }
        assert_eq!("10.0.0.0/8".parse::<Cidr>().unwrap().to_string(), "10.0.0.0/8");
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
    }

    #[test]
    fn mistakes_are_refused() {
        for (bad, why) in [
            ("10.0.0.1/8", "host bits set: the network is 10.0.0.0/8"),
            ("10.0.0.0/33", "0 to 32"),
            ("::/129", "0 to 128"),
            ("10.0.0.0/", "prefix length"),
            ("10.0.0.0/+8", "prefix length"),
            ("10.0.0.0/08x", "prefix length"),
            ("10.0.0/8", "not an IP network"),
            ("example.com", "not an IP network"),
            ("", "not an IP network"),
            ("2001:db8::1/32", "the network is 2001:db8::/32"),
        ] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
