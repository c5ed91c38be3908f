//! Reading bodies within their limits: a client's POST body whole (`max_body_bytes`,
//! `body_read_timeout`, and the budget all bodies being read share, `max_body_buffer_bytes`;
//! the rest of a refused one drained so the client reads the 413 or 503), and a backend's JSON
//! answer whole (within the upstream deadline) so its outcome can be observed.

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::deadline::{within, Deadline};
use crate::body::MAX_OBSERVED_EVENT;
use crate::error::RouterError;
use crate::metrics::BodyBuffer;
use crate::quotas::BodyShare;
use crate::state::Snapshot;
use crate::upstream::DrivenBody;

/// Collects body frames; the common case, one frame, is kept without a copy.
#[derive(Default)]
struct BodyBuf {
    single: Option<Bytes>,
    buf: BytesMut,
}

impl BodyBuf {
    fn len(&self) -> usize {
        self.buf.len() + self.single.as_ref().map_or(0, |s| s.len())
    }

    fn push(&mut self, data: Bytes) {
        match self.single.take() {
            None if self.buf.is_empty() => self.single = Some(data),
            prev => {
                if let Some(p) = prev {
                    self.buf.extend_from_slice(&p);
                }
                self.buf.extend_from_slice(&data);
            }
        }
    }

    fn finish(self) -> Bytes {
        self.single.unwrap_or_else(|| self.buf.freeze())
    }
}

/// One client connection's share of `max_body_buffer_bytes`
/// (`[quotas] max_body_bytes_per_connection`): what its bodies hold now, and at most.
pub struct ConnectionShare {
    held: BodyBuffer,
    limit: usize,
}

impl ConnectionShare {
    pub fn new(limit: usize) -> ConnectionShare {
        ConnectionShare {
            held: BodyBuffer::default(),
            limit,
        }
    }
}

/// A body's share of `max_body_buffer_bytes` (and of its connection's and its caller's
/// shares), given back when dropped (once the answer is observed).
pub(super) struct Held<'a> {
    budget: Option<&'a BodyBuffer>,
    share: Option<&'a ConnectionShare>,
    /// The caller's share (`max_body_bytes_per_caller`): gives back all it took when dropped.
    caller: Option<BodyShare>,
    bytes: usize,
}

impl<'a> Held<'a> {
    pub(super) fn nothing() -> Held<'a> {
        Held {
            budget: None,
            share: None,
            caller: None,
            bytes: 0,
        }
    }

    /// Takes `n` more bytes of the connection's `share`, of the caller's, then of `budget` (of
    /// `limit` in all), or answers `router_overloaded`.
    fn take(
        &mut self,
        budget: &'a BodyBuffer,
        share: Option<&'a ConnectionShare>,
        n: usize,
        limit: usize,
    ) -> Result<(), RouterError> {
        if let Some(s) = share {
            if !s.held.try_reserve(n, s.limit) {
                return Err(RouterError::BodyShareFull {
                    scope: "connection",
                    limit: s.limit,
                });
            }
        }
        if let Some(caller) = &mut self.caller {
            // What the caller's share took is given back whole when `self` drops.
            if let Err(refused) = caller.try_take(n as u64) {
                if let Some(s) = share {
                    s.held.release(n);
                }
                return Err(RouterError::BodyShareFull {
                    scope: if refused.overflow { "overflow" } else { "caller" },
                    limit: caller.limit() as usize,
                });
            }
        }
        if !budget.try_reserve(n, limit) {
            if let Some(s) = share {
                s.held.release(n);
            }
            return Err(RouterError::Overloaded);
        }
        self.budget = Some(budget);
        self.share = share;
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(budget) = self.budget {
            budget.release(self.bytes);
        }
        if let Some(share) = self.share {
            share.held.release(self.bytes);
        }
    }
}

/// Reads a POST body whole: at most `max_body_bytes`, within `body_read_timeout`, each frame
/// taken from the budget all bodies share (`max_body_buffer_bytes`) as it is read, and from
/// the connection's and the caller's shares of it when `[quotas]` sets them.
pub(super) async fn read_body<'a>(
    mut body: Incoming,
    snap: &Snapshot,
    budget: &'a BodyBuffer,
    share: Option<&'a ConnectionShare>,
    caller: Option<BodyShare>,
) -> Result<(Bytes, Held<'a>), RouterError> {
    let mut held = Held {
        caller,
        ..Held::nothing()
    };
    let result = read_limited(&mut body, snap, budget, share, &mut held).await;
    if let Err(RouterError::BodyTooLarge { .. } | RouterError::Overloaded | RouterError::BodyShareFull { .. }) = result
    {
        drop(held);
        // A lingering close: read and drop what the client is still sending (bounded), so
        // that it reads the 413 instead of a connection reset.
        let drain = async {
            let mut seen = 0;
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, |d| d.len());
                if seen > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
        return result.map(|b| (b, Held::nothing()));
    }
    result.map(|b| (b, held))
}

/// How much of a refused body is read and dropped (not kept) before the 413 or 503 goes out,
/// and for how long.
const LINGER_BYTES: usize = 16 * 1024 * 1024;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);

async fn read_limited<'a>(
    body: &mut Incoming,
    snap: &Snapshot,
    budget: &'a BodyBuffer,
    share: Option<&'a ConnectionShare>,
    held: &mut Held<'a>,
) -> Result<Bytes, RouterError> {
    let limit = snap.config.server.max_body_bytes;
    let budget_limit = snap.config.server.max_body_buffer_bytes;
    // hyper has parsed `Content-Length` already: a declared length is the body's exact size.
    if body.size_hint().exact().is_some_and(|n| n > limit as u64) {
        return Err(RouterError::BodyTooLarge { limit });
    }
    let mut acc = BodyBuf::default();
    let mut push = |acc: &mut BodyBuf, frame: Result<http_body::Frame<Bytes>, hyper::Error>| {
        let Ok(data) = frame.map_err(|_| RouterError::BodyBroken)?.into_data() else {
            return Ok(());
        };
        if acc.len() + data.len() > limit {
            return Err(RouterError::BodyTooLarge { limit });
        }
        held.take(budget, share, data.len(), budget_limit)?;
        acc.push(data);
        Ok(())
    };
    // Usually the whole body came with the headers: take what is there without arming a timer.
    loop {
        match body.frame().now_or_never() {
            Some(Some(frame)) => push(&mut acc, frame)?,
            Some(None) => return Ok(acc.finish()),
            None => break,
        }
    }
    let rest = async {
        while let Some(frame) = body.frame().await {
            push(&mut acc, frame)?;
        }
        Ok(())
    };
    match tokio::time::timeout(snap.config.server.body_read_timeout, rest).await {
        Ok(r) => r.map(|()| acc.finish()),
        Err(_) => Err(RouterError::BodyTimeout),
    }
}

pub(super) enum Collected {
    Whole(Bytes),
    /// Too large to observe: what was read, and the rest still to stream.
    Prefix(Bytes, DrivenBody),
}

pub(super) enum CollectError {
    Timeout,
    Upstream,
}

/// Reads a JSON answer whole (up to [`MAX_OBSERVED_EVENT`]) before the upstream deadline.
pub(super) async fn collect_json(mut body: DrivenBody, deadline: Deadline<'_>) -> Result<Collected, CollectError> {
    let read = async move {
        let mut acc = BodyBuf::default();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| CollectError::Upstream)?.into_data() else {
                continue;
            };
            acc.push(data);
            if acc.len() > MAX_OBSERVED_EVENT {
                return Ok(Collected::Prefix(acc.finish(), body));
            }
        }
        Ok(Collected::Whole(acc.finish()))
    };
    within(deadline, std::pin::pin!(read))
        .await
        .ok_or(CollectError::Timeout)?
}
