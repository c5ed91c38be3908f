//! The servers the external tests start beside the router: the test authorization server
//! (`oidc-provider` under node) and Redis.

pub mod idp;
pub mod redis_server;
