//! The integration tests that need only Rust and loopback, in one binary (`cargo test --test it`;
//! one module's: `cargo test --test it <module>::`): the router started in-process, or as its
//! binary, on real sockets, in front of example workers and purpose-built backends
//! (docs/src/design/testing.md). The tests that need tools beyond Rust are in tests/external/.

mod support;

// Counts the bytes live in the process, for the memory tests (each runs in a process of its own).
#[global_allocator]
static ALLOCATOR: support::counting::Counting = support::counting::Counting;

mod access_log;
mod architecture;
mod auth;
mod auth_handles;
mod backend_tls;
mod bounded_load;
mod catalog;
mod catalog_prompts;
mod catalog_rollout;
mod chaos;
mod cli;
mod config_reference;
mod connections;
mod edge;
mod edge_batches;
mod envelope;
mod errors;
mod failures;
mod fleet;
mod h2_fields;
mod h2_requests;
mod held_memory;
mod hostile;
mod hyper_heads;
mod hyper_queue;
mod jwks;
mod list_filter;
mod metrics_docs;
mod opaque_errors;
mod partition;
mod pin_lifecycle;
mod pin_memory;
mod pool;
mod properties;
mod proxy_protocol;
mod quota_memory;
mod quotas;
mod quotas_shares;
mod races;
mod request_state;
mod restart;
mod routing;
mod sealed_messages;
mod server_config;
mod shutdown;
mod stalled_bytes;
mod status_api;
mod streaming;
mod task_notices;
mod tasks;
mod tls;
mod tokens;
mod tracing;
mod upstream_cap;
mod upstream_h2;
