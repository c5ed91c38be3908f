//! The floor under any reverse proxy built on hyper and tokio: the least such a proxy can do and
//! still be one. `bench/run.py` runs it as the `hyper-floor` row, next to mrtr-router, HAProxy
//! and nginx, so every run shows what hyper's two HTTP/1 codecs and tokio's event loop cost on
//! their own (docs/src/benchmarks.md, "The floors").
//!
//! It takes each request's backend from a hash of `Mcp-Routing-Id` (keyless requests go to the
//! first), forwards the request as it came (body streamed, no header touched), reads the whole
//! answer and sends it back. Upstream connections are kept alive in a per-thread free list. It
//! has no config, no body scan, no pins, no metrics, no timeouts and no limits: it is a
//! measuring stick, not a proxy to deploy. The knobs the router uses that make hyper cheaper
//! (flattened writes, `TCP_NODELAY`, mimalloc, one worker thread) are set here too.
//!
//! Two more floors stand under two more of the router's rows: `hyper_floor_h2c` (HTTP/2
//! clients) and `hyper_floor_scan` (every body read whole and scanned, as the router checks
//! every proxied POST).
//!
//! ```sh
//! cargo run --release --example hyper_floor -- 127.0.0.1:18083 127.0.0.1:19001,127.0.0.1:19002
//! ```

#[path = "floor/mod.rs"]
mod floor;

use hyper::service::service_fn;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    floor::run("hyper_floor", |io, backends| async move {
        let service = service_fn(move |req| floor::relay(req, backends));
        let _ = hyper::server::conn::http1::Builder::new()
            .writev(false)
            .serve_connection(io, service)
            .await;
    })
}
