//! TLS for test backends: a certificate authority made in the test (rcgen) and the server and
//! client certificates it signs, and a TLS front (a rustls server offering ALPN `h2` and
//! `http/1.1`, optionally requiring a client certificate) that relays each connection to a
//! plain backend such as an example worker, so every behaviour of the worker (HTTP/1.1 or
//! HTTP/2, SSE, pins) is there over TLS. The front counts handshakes, resumed ones and failed
//! ones.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A CA of the test's own.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate (with its chain, leaf only) and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Leaf {
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![self.der.clone()]
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::try_from(self.key_der.clone()).unwrap()
    }

    /// Writes `<name>.pem` and `<name>.key` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        (
            write(dir, &format!("{name}.pem"), &self.cert_pem),
            write(dir, &format!("{name}.key"), &self.key_pem),
        )
    }
}

/// Writes `text` to `dir/file`; its path.
pub fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A server certificate for `names` (DNS names or IP addresses), valid now.
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    /// A server certificate for `names` that expired in 2021.
    pub fn expired_server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, true)
    }

    /// A client certificate (for mTLS) named `name`.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, false)
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose, expired: bool) -> Leaf {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![usage];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS front relaying to a plain backend.
pub struct TlsFront {
    pub addr: SocketAddr,
    /// Handshakes completed (each one a connection relayed to the backend).
    pub handshakes: Arc<AtomicU64>,
    /// Of those, the ones that resumed an earlier session.
    pub resumed: Arc<AtomicU64>,
    /// Handshakes that failed (a client without the certificate asked for, say).
    pub failed: Arc<AtomicU64>,
    /// Relayed connections that have ended.
    pub closed: Arc<AtomicU64>,
    /// Handshakes that chose HTTP/2 by ALPN.
    pub alpn_h2: Arc<AtomicU64>,
}

impl TlsFront {
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::SeqCst)
    }
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::SeqCst)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }
    pub fn alpn_h2(&self) -> u64 {
        self.alpn_h2.load(Ordering::SeqCst)
    }
}

/// Serves TLS with `leaf` on a port of its own and relays each connection to `target`; with
/// `client_ca`, a client must present a certificate that CA signed.
pub async fn tls_front(target: SocketAddr, leaf: &Leaf, client_ca: Option<&Ca>) -> TlsFront {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(leaf.chain(), leaf.key()).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = TlsFront {
        addr: listener.local_addr().unwrap(),
        handshakes: Default::default(),
        resumed: Default::default(),
        failed: Default::default(),
        closed: Default::default(),
        alpn_h2: Default::default(),
    };
    let (handshakes, resumed, failed, closed, alpn_h2) = (
        front.handshakes.clone(),
        front.resumed.clone(),
        front.failed.clone(),
        front.closed.clone(),
        front.alpn_h2.clone(),
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let (handshakes, resumed, failed, closed, alpn_h2) = (
                handshakes.clone(),
                resumed.clone(),
                failed.clone(),
                closed.clone(),
                alpn_h2.clone(),
            );
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                };
                if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                    resumed.fetch_add(1, Ordering::SeqCst);
                }
                if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                    alpn_h2.fetch_add(1, Ordering::SeqCst);
                }
                handshakes.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut plain) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    front
}
