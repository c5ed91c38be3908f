//! TLS on the proxy listener (`server.tls_cert`, `server.tls_key`): reading the PEM files and
//! building the rustls server config (the `ring` provider, ALPN `h2` then `http/1.1`).
//!
//! The provider is passed to the builder explicitly, so no process-wide default provider is
//! needed (or installed): rustls panics at `ServerConfig::builder()` when it finds two providers
//! in the build and none installed, which a dependency could bring about.

use std::sync::Arc;

use rustls::crypto::ring;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The ALPN protocols offered, in the server's order of preference. A client without ALPN gets
/// HTTP/1.1; one that offers ALPN but neither of these fails the handshake (rustls answers
/// `no_application_protocol`).
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The certificates of a PEM file (the chain, leaf first).
pub fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM file ({e})"))?;
    if certs.is_empty() {
        return Err("no certificate in it (expected PEM \"BEGIN CERTIFICATE\")".into());
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => "no private key in it (expected PEM \"BEGIN PRIVATE KEY\", PKCS#1 or SEC1)".into(),
        e => format!("not a PEM file ({e})"),
    })
}

/// The server config for a certificate chain and its key: TLS 1.2 and 1.3, no client
/// certificates, ALPN [`ALPN`]. Fails when the key does not match the certificate or is of a
/// kind the provider cannot sign with.
pub fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Whether a finished handshake chose HTTP/2.
pub fn is_h2(conn: &rustls::ServerConnection) -> bool {
    conn.alpn_protocol() == Some(ALPN[0])
}
