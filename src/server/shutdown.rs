//! Graceful shutdown, the one mechanism for every listener: once it starts, each connection
//! finishes the requests it has in flight and closes (idle keep-alive connections close at
//! once, unless their client's next request is already in the socket: `server::serve`), and
//! accept loops stop.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

/// Graceful shutdown of the proxy's connections: once it starts, each connection finishes the
/// requests it has in flight and closes (idle keep-alive connections close at once). Cheap on
/// the hot path: a poll reads one flag, and registers its task's waker only when the waker
/// changes, which in practice is once per connection. (hyper-util's `GracefulShutdown` polls a
/// `watch` channel on every poll of every connection, ~700 instructions per request.)
#[derive(Default)]
pub struct Shutdown {
    started: AtomicBool,
    /// The task of each live connection, woken when the drain starts.
    tasks: parking_lot::Mutex<HashMap<u64, Waker>>,
    next_id: AtomicU64,
}

impl Shutdown {
    /// Starts the shutdown: every watch is woken and sees it.
    pub fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
        for (_, task) in self.tasks.lock().drain() {
            task.wake();
        }
    }

    /// Whether the shutdown has started.
    pub fn is_started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Resolves once the shutdown has started.
    pub async fn started(&self) {
        let mut watch = self.register();
        poll_fn(|cx| watch.poll_started(cx)).await
    }

    /// A watch on the shutdown, to be polled ([`Watch::poll_started`]) before each poll of a
    /// connection.
    pub fn register(&self) -> Watch<'_> {
        Watch {
            shutdown: self,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            waker: None,
        }
    }
}

/// A connection's place in [`Shutdown::tasks`], given up when the connection ends or is dropped.
pub struct Watch<'a> {
    shutdown: &'a Shutdown,
    id: u64,
    /// The waker registered in `shutdown.tasks`, if any.
    waker: Option<Waker>,
}

impl Watch<'_> {
    /// Ready once the drain has started: a connection served by hyper is then shut down
    /// gracefully (see `server::serve`), one not yet handed to hyper (its protocol not known,
    /// its TLS handshake not done) simply closes.
    pub fn poll_started(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // Registered before the flag is read: a drain that starts in between still finds this
        // task (it sets the flag before it wakes the tasks).
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.shutdown.tasks.lock().insert(self.id, cx.waker().clone());
            self.waker = Some(cx.waker().clone());
        }
        match self.shutdown.started.load(Ordering::SeqCst) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.waker.is_some() {
            self.shutdown.tasks.lock().remove(&self.id);
        }
    }
}
