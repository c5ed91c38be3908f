//! The backends and how the router reaches them: the backend type ([`Backend`]), its
//! keep-alive connection pool, which backends exist ([`Membership`]: configured, discovered,
//! draining), DNS discovery lookups, and active health checks.

mod backend;
mod discovery;
pub mod health;
mod membership;
mod pool;
mod request_body;

pub use backend::{Backend, BackendKey, Connection, HealthChange, Incarnation, InflightGuard};
pub use discovery::{Lookup, Resolver};
pub use membership::Membership;
pub use pool::{is_local_error, DrivenBody, PooledConn, SendError};
pub use request_body::{BodyFault, ClientBody, FaultCell, UpstreamBody};
