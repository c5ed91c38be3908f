//! Looking up `[discovery].dns`: the system resolver, or one a test puts in its place.

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

/// Resolves a host and port to socket addresses.
pub type Resolver = Arc<dyn Fn(String, u16) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> + Send + Sync>;

/// The resolver discovery uses (default: the system's).
#[derive(Default)]
pub struct Lookup {
    replaced: Mutex<Option<Resolver>>,
}

impl Lookup {
    /// Replaces the system resolver (tests point discovery at addresses of their own).
    pub fn replace(&self, resolver: Resolver) {
        *self.replaced.lock() = Some(resolver);
    }

    pub async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        let replaced = self.replaced.lock().clone();
        match replaced {
            Some(resolver) => resolver(host.to_string(), port).await,
            None => Ok(tokio::net::lookup_host((host, port)).await?.collect()),
        }
    }
}
