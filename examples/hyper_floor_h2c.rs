//! hyper-floor for HTTP/2 clients: `examples/hyper_floor.rs` with hyper's HTTP/2 server at the
//! listener (prior knowledge, as h2load's h2c; a task per stream, as hyper runs them), the
//! backends still spoken to in HTTP/1.1. It adds only what every HTTP/2-to-HTTP/1 proxy must:
//! the request target in origin form and `Host` from `:authority` (an HTTP/1.1 backend refuses a
//! request without it). `bench/run.py` runs it as the `hyper-floor-h2c` row, beside `mrtr-h2c`,
//! `haproxy-h2c` and `nginx-h2c`: what hyper and h2 cost on their own under that load.
//!
//! ```sh
//! cargo run --release --example hyper_floor_h2c -- 127.0.0.1:18083 127.0.0.1:19001,127.0.0.1:19002
//! ```

#[path = "floor/mod.rs"]
mod floor;

use http::{header, HeaderValue, Request, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioExecutor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    floor::run("hyper_floor_h2c", |io, backends| async move {
        let service = service_fn(move |mut req| {
            to_http1(&mut req);
            floor::relay(req, backends)
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await;
    })
}

/// An HTTP/2 request made one an HTTP/1.1 backend takes: origin-form target, `Host` set.
fn to_http1(req: &mut Request<Incoming>) {
    if let Some(host) = req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        req.headers_mut().insert(header::HOST, host);
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = path.parse().expect("a path from a parsed URI parses");
    *req.version_mut() = Version::HTTP_11;
}
