//! The servers the external tests start beside the router: the test authorization server
//! (`oidc-provider` under node) and Redis; and the browser that looks at the status page.

pub mod browser;
pub mod idp;
pub mod redis_server;
