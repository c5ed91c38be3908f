//! What the hyper-floor examples share (`hyper_floor`, `hyper_floor_h2c`, `hyper_floor_scan`):
//! the command line, the accept loop, the relay to the backends and their idle connections. Each
//! example is its own binary with one way of serving, so that no floor's code is compiled
//! beside another's (a second instance of hyper's server changes what the compiler inlines in
//! the first: ~600 instructions a request, measured).

use std::cell::RefCell;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;
use std::thread::LocalKey;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Idle upstream connections, one list per backend.
type Idle<B> = RefCell<Vec<Vec<SendRequest<B>>>>;

thread_local! {
    /// For bodies streamed as they came.
    static IDLE_STREAMED: Idle<Incoming> = const { RefCell::new(Vec::new()) };
    /// For bodies read whole.
    static IDLE_BUFFERED: Idle<Full<Bytes>> = const { RefCell::new(Vec::new()) };
}

/// A request body a floor forwards, and the free list of the connections that carry its kind.
pub trait Forwarded:
    hyper::body::Body<Data = Bytes, Error: std::error::Error + Send + Sync> + Send + Sized + 'static
{
    fn idle() -> &'static LocalKey<Idle<Self>>;
}

impl Forwarded for Incoming {
    fn idle() -> &'static LocalKey<Idle<Self>> {
        &IDLE_STREAMED
    }
}

impl Forwarded for Full<Bytes> {
    fn idle() -> &'static LocalKey<Idle<Self>> {
        &IDLE_BUFFERED
    }
}

/// What a floor answers with.
pub type Answer = Result<Response<Full<Bytes>>, hyper::Error>;

/// Reads `LISTEN BACKEND[,BACKEND...]` from the command line and serves every accepted
/// connection with `serve` on one thread.
pub fn run<S, F>(name: &str, serve: S) -> Result<(), Box<dyn std::error::Error>>
where
    S: Fn(TokioIo<TcpStream>, &'static [SocketAddr]) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut args = std::env::args().skip(1);
    let usage = format!("usage: {name} LISTEN BACKEND[,BACKEND...]");
    let listen: SocketAddr = args.next().ok_or(usage.clone())?.parse()?;
    let backends: Vec<SocketAddr> = args
        .next()
        .ok_or(usage)?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let backends: &'static [SocketAddr] = backends.leak();
    IDLE_STREAMED.with(|idle| idle.borrow_mut().resize_with(backends.len(), Vec::new));
    IDLE_BUFFERED.with(|idle| idle.borrow_mut().resize_with(backends.len(), Vec::new));

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        eprintln!("{name}: listening on {listen}");
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(TokioIo::new(stream), backends));
        }
    })
}

/// Sends `req` to its backend (by a hash of `Mcp-Routing-Id`; keyless requests to the first) on
/// an idle connection or a new one; the answer read whole.
pub async fn relay<B: Forwarded>(req: Request<B>, backends: &'static [SocketAddr]) -> Answer {
    let at = req.headers().get("mcp-routing-id").map_or(0, |key| {
        BuildHasherDefault::<DefaultHasher>::default().hash_one(key.as_bytes()) as usize % backends.len()
    });
    let idle = B::idle().with(|idle| idle.borrow_mut()[at].pop());
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
        B::idle().with(|idle| idle.borrow_mut()[at].push(sender));
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

async fn connect<B: Forwarded>(backend: SocketAddr) -> Result<SendRequest<B>, Box<dyn std::error::Error>> {
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
    short_answer(StatusCode::BAD_GATEWAY, "bad gateway\n")
}

/// A short answer of the floor's own.
pub fn short_answer(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *answer.status_mut() = status;
    answer
}
