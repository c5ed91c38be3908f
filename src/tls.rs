//! TLS with rustls: reading PEM files, the proxy listener's server config (`server.tls_cert`,
//! `server.tls_key`; ALPN `h2` then `http/1.1`), and the client configs that reach `https://`
//! backends (`[upstream] tls_ca` or the system trust store, `tls_client_cert`/`tls_client_key`).
//!
//! The `ring` provider is passed to every builder explicitly, so no process-wide default provider
//! is needed (or installed): rustls panics at `ServerConfig::builder()` when it finds two
//! providers in the build and none installed, which a dependency could bring about.

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

/// The ALPN protocol a client config offers a backend: `h2` only (HTTP/2 backends), or
/// `http/1.1` only.
pub fn client_alpn(http2: bool) -> Vec<Vec<u8>> {
    vec![if http2 { ALPN[0] } else { ALPN[1] }.to_vec()]
}

/// A client config that verifies servers against `roots` (webpki, the `ring` provider), TLS 1.2
/// and 1.3, presenting `client_auth` (chain, key) when a server asks for a certificate. Fails
/// when the key does not match the certificate or is of a kind the provider cannot sign with.
pub fn client_config(
    roots: rustls::RootCertStore,
    client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    match client_auth {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Whether a finished handshake chose HTTP/2.
pub fn is_h2(conn: &rustls::ServerConnection) -> bool {
    conn.alpn_protocol() == Some(ALPN[0])
}
