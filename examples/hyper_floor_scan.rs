//! hyper-floor with the one piece of work the router does to every proxied POST: each body is
//! read whole and checked with the router's own envelope scan (`parse_request`, looking for
//! `messageId` as the router does by default); a body that is not JSON is answered 400, the
//! rest forwarded (the router's `parse_error`, docs/src/errors.md). Otherwise
//! `examples/hyper_floor.rs`. `bench/run.py` runs it as the `hyper-floor-scan` row: the floor
//! any router stands on that checks every body as mrtr-router does.
//!
//! ```sh
//! cargo run --release --example hyper_floor_scan -- 127.0.0.1:18083 127.0.0.1:19001,127.0.0.1:19002
//! ```

#[path = "floor/mod.rs"]
mod floor;

use std::net::SocketAddr;

use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    floor::run("hyper_floor_scan", |io, backends| async move {
        let service = service_fn(move |req| scanned(req, backends));
        let _ = hyper::server::conn::http1::Builder::new()
            .writev(false)
            .serve_connection(io, service)
            .await;
    })
}

/// The body read whole and scanned as the router scans it, then relayed.
async fn scanned(req: Request<Incoming>, backends: &'static [SocketAddr]) -> floor::Answer {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    if mrtr_router::internals::parse_request(&body, "messageId").is_err() {
        return Ok(floor::short_answer(StatusCode::BAD_REQUEST, "not JSON\n"));
    }
    floor::relay(Request::from_parts(parts, Full::new(body)), backends).await
}
