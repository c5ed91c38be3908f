//! The backends and how the router reaches them: the backend type ([`Backend`]), its
//! keep-alive connection pool (HTTP/1.1) and its HTTP/2 connections (`h2`), TLS to `https://`
//! backends (`tls`), which backends exist ([`Membership`]: configured, discovered, draining),
//! DNS discovery lookups, and active health checks.

mod backend;
mod discovery;
mod exchange;
mod h2;
pub mod health;
mod membership;
mod pool;
mod request_body;
mod retry_budget;
mod slots;
mod tls;

pub use backend::{unix_ms, Backend, BackendKey, Connection, HealthChange, Incarnation, InflightGuard};
pub use discovery::{Lookup, Resolver};
pub use exchange::{SendError, UpstreamBody};
pub use membership::Membership;
pub use pool::{DrivenBody, PooledConn};
pub use request_body::{BodyFault, ClientBody, FaultCell};
pub use retry_budget::RetryBudget;
pub use tls::{tls_error, Chain, ConnectError};
