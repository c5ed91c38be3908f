//! The integration tests that need tools beyond Rust (docs/src/design/testing.md): the official
//! MCP Python SDK (`interop`, `rolling_deploy`), node with the test authorization server
//! (`idp`, `auth_stepup`, `list_filter_idp`), promtool, kubectl and a Python venv for the
//! deploy/ checks (`deploy`), redis-server (`quotas_redis`), and headless Chromium driven by
//! node's playwright-core (`status_page`); and how the SDK's scripts are run (`warm`). Built only with the `external-tests` feature, which
//! the README's test command turns on after it installs the tools: a plain `cargo test` never
//! needs them.

// The harness of tests/it/, whose helpers these tests use only a few of.
#[allow(dead_code)]
#[path = "../it/support/mod.rs"]
mod support;
mod tools;

mod auth_stepup;
mod deploy;
mod idp;
mod interop;
mod list_filter_idp;
mod quotas_redis;
mod rolling_deploy;
mod status_page;
mod warm;
