//! The PROXY protocol header (HAProxy's spec, versions 1 and 2) an L4 load balancer puts before
//! a connection's first byte, saying whom it accepted the connection from
//! (`server.proxy_protocol`, docs/src/configuration.md). Parsed by hand: it is a few fixed
//! fields, not HTTP.
//!
//! - v1: `PROXY TCP4|TCP6 src dst sport dport\r\n` or `PROXY UNKNOWN …\r\n`, at most 107 bytes
//!   with the CRLF.
//! - v2: a 12-byte signature, version and command, family and protocol, a 16-bit length, the
//!   addresses, then TLVs (skipped). `LOCAL` (the balancer's own health check) and the
//!   `UNSPEC`/`UNIX` families carry no client address: the peer stays the client.
//!
//! [`parse`] tells three cases apart: a whole header (and its length), no header at all (the
//! first bytes cannot start one: plain HTTP or TLS), and not yet known (more bytes needed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A v1 header's longest form, CRLF included (`PROXY UNKNOWN` with two full IPv6 addresses).
pub const V1_MAX: usize = 107;
/// The v2 signature.
pub const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v2 header accepted, TLVs included. The addresses take at most 216 bytes (UNIX);
/// balancers add a few small TLVs (a VPC endpoint id, a link id). A longer one is refused rather
/// than buffered.
pub const V2_MAX: usize = 1024;
const V1_PREFIX: &[u8] = b"PROXY ";

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The client's address; `None` when the header carries none (v1 `UNKNOWN`, v2 `LOCAL`,
    /// `UNSPEC` or `UNIX`): the connection's peer is the client then.
    pub source: Option<SocketAddr>,
    /// The address the client connected to, when given.
    pub destination: Option<SocketAddr>,
}

/// Why the bytes are no header (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A header may follow: more bytes are needed to tell.
    Incomplete,
    /// A header starts, but is broken.
    Invalid(&'static str),
}

/// Parses the header at the start of `buf`: `Ok(Some((header, consumed)))`, `Ok(None)` when
/// `buf` does not start with one, or why not yet.
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    if starts(buf, V2_SIGNATURE) {
        return match buf.len() >= V2_SIGNATURE.len() {
            true => v2(buf).map(Some),
            false => Err(Error::Incomplete),
        };
    }
    if starts(buf, V1_PREFIX) {
        return match buf.len() >= V1_PREFIX.len() {
            true => v1(buf).map(Some),
            false => Err(Error::Incomplete),
        };
    }
    Ok(None)
}

/// Whether `buf` and `signature` agree on their common length (an empty `buf` agrees).
fn starts(buf: &[u8], signature: &[u8]) -> bool {
    let n = buf.len().min(signature.len());
    buf[..n] == signature[..n]
}

fn v1(buf: &[u8]) -> Result<(Header, usize), Error> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if window.contains(&b'\n') {
            return Err(Error::Invalid("v1: a line feed without a carriage return"));
        }
        return match buf.len() >= V1_MAX {
            true => Err(Error::Invalid("v1: no CRLF within 107 bytes")),
            false => Err(Error::Incomplete),
        };
    };
    let line = std::str::from_utf8(&buf[V1_PREFIX.len()..end]).map_err(|_| Error::Invalid("v1: not ASCII"))?;
    let consumed = end + 2;
    let mut fields = line.split(' ');
    let family = fields.next().unwrap_or_default();
    if family == "UNKNOWN" {
        let none = Header {
            source: None,
            destination: None,
        };
        return Ok((none, consumed));
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(Error::Invalid("v1: unknown family (TCP4, TCP6 or UNKNOWN)")),
    };
    let fields: Vec<&str> = fields.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(Error::Invalid("v1: not `PROXY family src dst sport dport`"));
    };
    let ip = |text: &str| -> Result<IpAddr, Error> {
        match v6 {
            false => text
                .parse::<Ipv4Addr>()
                .map(IpAddr::V4)
                .map_err(|_| Error::Invalid("v1: a bad IPv4 address")),
            true => text
                .parse::<Ipv6Addr>()
                .map(IpAddr::V6)
                .map_err(|_| Error::Invalid("v1: a bad IPv6 address")),
        }
    };
    let header = Header {
        source: Some(SocketAddr::new(ip(src)?, port(sport)?)),
        destination: Some(SocketAddr::new(ip(dst)?, port(dport)?)),
    };
    Ok((header, consumed))
}

/// A v1 port: 1 to 5 digits, at most 65535.
fn port(text: &str) -> Result<u16, Error> {
    let digits = !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
    match digits {
        true => text.parse().map_err(|_| Error::Invalid("v1: a port past 65535")),
        false => Err(Error::Invalid("v1: a bad port")),
    }
}

fn v2(buf: &[u8]) -> Result<(Header, usize), Error> {
    let Some(fixed) = buf.get(..16) else {
        return Err(Error::Incomplete);
    };
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    if version != 2 {
        return Err(Error::Invalid("v2: version is not 2"));
    }
    let (family, protocol) = (fixed[13] >> 4, fixed[13] & 0x0f);
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let consumed = 16 + len;
    if consumed > V2_MAX {
        return Err(Error::Invalid("v2: longer than 1024 bytes"));
    }
    let Some(block) = buf.get(16..consumed) else {
        return Err(Error::Incomplete);
    };
    let none = Header {
        source: None,
        destination: None,
    };
    match command {
        // LOCAL: the balancer speaking for itself; the block, family included, is ignored.
        0 => return Ok((none, consumed)),
        1 => {}
        _ => return Err(Error::Invalid("v2: command is neither LOCAL nor PROXY")),
    }
    match protocol {
        0 | 1 => {}
        2 => return Err(Error::Invalid("v2: a datagram connection")),
        _ => return Err(Error::Invalid("v2: unknown protocol")),
    }
    let addresses = |size: usize| match block.len() >= size {
        true => Ok(&block[..size]),
        false => Err(Error::Invalid("v2: the addresses do not fit the length")),
    };
    let header = match family {
        0 => none,
        1 => {
            let a = addresses(12)?;
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]));
            let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
            Header {
                source: Some(SocketAddr::new(ip(0), port(8))),
                destination: Some(SocketAddr::new(ip(4), port(10))),
            }
        }
        2 => {
            let a = addresses(36)?;
            let ip = |at: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&a[at..at + 16]).expect("16 bytes")));
            let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
            Header {
                source: Some(SocketAddr::new(ip(0), port(32))),
                destination: Some(SocketAddr::new(ip(16), port(34))),
            }
        }
        3 => {
            addresses(216)?;
            none
        }
        _ => return Err(Error::Invalid("v2: unknown address family")),
    };
    Ok((header, consumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Option<SocketAddr> {
        Some(text.parse().unwrap())
    }

    /// A v2 header: command, family/protocol byte, the block after the length.
    fn v2_header(command: u8, fam: u8, block: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.push(0x20 | command);
        out.push(fam);
        out.extend_from_slice(&(block.len() as u16).to_be_bytes());
        out.extend_from_slice(block);
        out
    }

    fn inet(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut b = src.to_vec();
        b.extend_from_slice(&dst);
        b.extend_from_slice(&sport.to_be_bytes());
        b.extend_from_slice(&dport.to_be_bytes());
        b
    }

    #[test]
    fn v1_headers() {
        let tcp4 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
        let (h, n) = parse(tcp4).unwrap().unwrap();
        assert_eq!(
            (h.source, h.destination),
            (addr("192.0.2.1:56324"), addr("198.51.100.2:443"))
        );
        assert_eq!(&tcp4[n..n + 3], b"GET");
        let tcp6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 65535 0\r\n";
        let (h, n) = parse(tcp6).unwrap().unwrap();
        assert_eq!((h.source, n), (addr("[2001:db8::1]:65535"), tcp6.len()));
        let unknown = b"PROXY UNKNOWN ffff:f...f:ffff 1.2.3.4 1 2\r\nx";
        let (h, n) = parse(unknown).unwrap().unwrap();
        assert_eq!((h.source, n), (None, unknown.len() - 1));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().1, 15);
        // The longest v1 header is 107 bytes, CRLF included (the spec's worst case: UNKNOWN
        // with two full IPv6 addresses); the longest TCP6 one parses too.
        let v6 = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        let longest = format!("PROXY UNKNOWN {v6} {v6} 65535 65535\r\n");
        assert_eq!(longest.len(), V1_MAX);
        assert_eq!(parse(longest.as_bytes()).unwrap().unwrap().1, V1_MAX);
        let tcp6 = format!("PROXY TCP6 {v6} {v6} 65535 65535\r\n");
        assert_eq!(
            parse(tcp6.as_bytes()).unwrap().unwrap().0.source,
            addr(&format!("[{v6}]:65535"))
        );
    }

    #[test]
    fn v2_headers() {
        let block = inet([192, 0, 2, 1], [198, 51, 100, 2], 56324, 443);
        let mut bytes = v2_header(1, 0x11, &block);
        bytes.extend_from_slice(b"\x16\x03\x01");
        let (h, n) = parse(&bytes).unwrap().unwrap();
        assert_eq!(
            (h.source, h.destination),
            (addr("192.0.2.1:56324"), addr("198.51.100.2:443"))
        );
        assert_eq!(&bytes[n..], b"\x16\x03\x01");
        // TCP6, with TLVs after the addresses (skipped).
        let mut block = Vec::new();
        block.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        block.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        block.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        block.extend_from_slice(&[0xea, 0x00, 0x05, b'v', b'p', b'c', b'-', b'1']);
        let bytes = v2_header(1, 0x21, &block);
        let (h, n) = parse(&bytes).unwrap().unwrap();
        assert_eq!((h.source, n), (addr("[2001:db8::1]:56324"), bytes.len()));
        // LOCAL: no address, whatever the family says; UNSPEC and UNIX: none either.
        for (command, fam, block) in [(0, 0x11, block.clone()), (0, 0xf0, Vec::new()), (1, 0x00, Vec::new())] {
            let bytes = v2_header(command, fam, &block);
            assert_eq!(
                parse(&bytes).unwrap().unwrap(),
                (
                    Header {
                        source: None,
                        destination: None
                    },
                    bytes.len()
                )
            );
        }
        let unix = v2_header(1, 0x31, &[0; 216]);
        assert_eq!(parse(&unix).unwrap().unwrap().0.source, None);
    }

    #[test]
    fn no_header_and_not_yet_known() {
        for plain in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PRI * HTTP/2.0\r\n",
            b"\x16\x03\x01\x02\x00",
            b"POST",
            b"\r\nGET",
            b"PROXZ",
        ] {
            assert_eq!(parse(plain), Ok(None), "{plain:?}");
        }
        // Every proper prefix of a header might still become one.
        let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
        let v2 = v2_header(1, 0x11, &inet([1, 2, 3, 4], [5, 6, 7, 8], 1, 2));
        for header in [&v1[..], &v2] {
            for n in 0..header.len() {
                assert_eq!(parse(&header[..n]), Err(Error::Incomplete), "{:?}", &header[..n]);
            }
            assert!(parse(header).unwrap().is_some());
        }
    }

    #[test]
    fn malformed_headers_are_invalid() {
        let invalid = |bytes: &[u8]| match parse(bytes) {
            Err(Error::Invalid(why)) => why,
            other => panic!("{bytes:?}: {other:?}"),
        };
        let v1_cases: &[(&[u8], &str)] = &[
            (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown family"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "not `PROXY family"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "not `PROXY family"),
            (b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", "not `PROXY family"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", "not `PROXY family"),
            (b"PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n", "bad IPv4"),
            (b"PROXY TCP6 1.2.3.4 2001:db8::1 1 2\r\n", "bad IPv6"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "past 65535"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", "bad port"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 123456 2\r\n", "bad port"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 -2\r\n", "bad port"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "line feed without"),
            (b"PROXY TCP4 1.2.3.4 5.6.\xff.8 1 2\r\n", "not ASCII"),
            (b"PROXY \r\n", "unknown family"),
        ];
        for (bytes, why) in v1_cases {
            assert!(invalid(bytes).contains(why), "{bytes:?}: {}", invalid(bytes));
        }
        // No CRLF within 107 bytes, even when one comes later.
        let mut long = b"PROXY UNKNOWN ".to_vec();
        long.resize(V1_MAX, b'x');
        assert!(invalid(&long).contains("no CRLF within 107 bytes"));
        long.extend_from_slice(b"\r\n");
        assert!(invalid(&long).contains("no CRLF within 107 bytes"));

        let inet4 = inet([1, 2, 3, 4], [5, 6, 7, 8], 1, 2);
        let mut bad_version = v2_header(1, 0x11, &inet4);
        bad_version[12] = 0x11;
        let v2_cases: Vec<(Vec<u8>, &str)> = vec![
            (bad_version, "version is not 2"),
            (v2_header(2, 0x11, &inet4), "neither LOCAL nor PROXY"),
            (v2_header(1, 0x41, &inet4), "unknown address family"),
            (v2_header(1, 0x12, &inet4), "datagram"),
            (v2_header(1, 0x13, &inet4), "unknown protocol"),
            (v2_header(1, 0x11, &inet4[..11]), "do not fit the length"),
            (v2_header(1, 0x21, &inet4), "do not fit the length"),
            (v2_header(1, 0x31, &[0; 100]), "do not fit the length"),
            (v2_header(1, 0x11, &vec![0; V2_MAX - 15]), "longer than 1024"),
        ];
        for (bytes, why) in &v2_cases {
            assert!(invalid(bytes).contains(why), "{why}: {}", invalid(bytes));
        }
        // Oversized is refused from the fixed part alone, before the block arrives.
        let mut head = v2_header(1, 0x11, &[]);
        head[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(invalid(&head).contains("longer than 1024"));
        // The longest accepted is exactly V2_MAX.
        let ok = v2_header(1, 0x11, &vec![0; V2_MAX - 16]);
        assert_eq!(parse(&ok).unwrap().unwrap().1, V2_MAX);
    }

    proptest::proptest! {
        /// Whatever follows a signature, the parser answers without panicking, never consumes
        /// more than it was given or than the bounds allow, and a prefix of bytes it accepted
        /// is never taken for something else.
        #[test]
        fn any_bytes_after_a_signature(v2 in proptest::bool::ANY, tail in proptest::collection::vec(proptest::num::u8::ANY, 0..1100)) {
            let mut bytes = if v2 { V2_SIGNATURE.to_vec() } else { V1_PREFIX.to_vec() };
            bytes.extend_from_slice(&tail);
            if let Ok(Some((_, consumed))) = parse(&bytes) {
                proptest::prop_assert!(consumed <= bytes.len() && consumed <= V2_MAX.max(V1_MAX));
                for n in 0..consumed {
                    proptest::prop_assert_eq!(parse(&bytes[..n]), Err(Error::Incomplete));
                }
            }
        }
    }
}
