//! The floor under any reverse proxy built on hyper and tokio: the least such a proxy can do and
//! still be one. `bench/run.sh` runs it as the `hyper-floor` row, next to mrtr-router, HAProxy and
//! nginx, so every run shows what hyper's two HTTP/1 codecs and tokio's event loop cost on their
//! own (BENCHMARKS.md).
//!
//! It takes each request's backend from a hash of `Mcp-Routing-Id` (keyless requests go to the
//! first), forwards the request as it came (body streamed, no header touched), reads the whole
//! answer and sends it back. Upstream connections are kept alive in a per-thread free list. It
//! has no config, no body scan, no pins, no metrics, no timeouts and no limits: it is a
//! measuring stick, not a proxy to deploy. The knobs the router uses that make hyper cheaper
//! (flattened writes, `TCP_NODELAY`, mimalloc, one worker thread) are set here too.
//!
//! ```sh
//! cargo run --release --example hyper_floor -- 127.0.0.1:18083 127.0.0.1:19001,127.0.0.1:19002
//! ```

use std::cell::RefCell;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

thread_local! {
    /// Idle upstream connections, one list per backend.
    static IDLE: RefCell<Vec<Vec<SendRequest<Incoming>>>> = const { RefCell::new(Vec::new()) };
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hyper_floor LISTEN BACKEND[,BACKEND...]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let backends: Vec<SocketAddr> = args
        .next()
        .ok_or(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let backends: &'static [SocketAddr] = backends.leak();
    IDLE.with(|idle| idle.borrow_mut().resize_with(backends.len(), Vec::new));

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        eprintln!("hyper_floor: listening on {listen}");
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(move |req| forward(req, backends));
                let _ = hyper::server::conn::http1::Builder::new()
                    .writev(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

async fn forward(
    req: Request<Incoming>,
    backends: &'static [SocketAddr],
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let at = req.headers().get("mcp-routing-id").map_or(0, |key| {
        BuildHasherDefault::<DefaultHasher>::default().hash_one(key.as_bytes()) as usize % backends.len()
    });
    let idle = IDLE.with(|idle| idle.borrow_mut()[at].pop());
    // A kept connection's task may not have finished the last exchange yet: wait for it.
    let mut sender = match idle {
        Some(mut sender) => match sender.ready().await {
            Ok(()) => Some(sender),
            Err(_) => None,
        },
        None => None,
    };
    if sender.is_none() {
        sender = connect(backends[at]).await.ok();
    }
    let Some(mut sender) = sender else {
        return Ok(bad_gateway());
    };
    let answer = match sender.send_request(req).await {
        Ok(answer) => answer,
        Err(_) => return Ok(bad_gateway()),
    };
    let (parts, body) = answer.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Ok(bad_gateway()),
    };
    if !sender.is_closed() {
        IDLE.with(|idle| idle.borrow_mut()[at].push(sender));
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

async fn connect(backend: SocketAddr) -> Result<SendRequest<Incoming>, Box<dyn std::error::Error>> {
    let stream = TcpStream::connect(backend).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .writev(false)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(conn);
    Ok(sender)
}

fn bad_gateway() -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(Bytes::from_static(b"bad gateway\n")));
    *answer.status_mut() = StatusCode::BAD_GATEWAY;
    answer
}
