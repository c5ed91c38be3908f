//! Open calls per caller: the multi-round calls a caller holds pinned at once, so that the pin
//! table's capacity is shared. A slot is reserved when a request that may start a call is
//! admitted (before it reaches a backend, so a caller at its share is refused there); the
//! request path drops the [`OpenCall`] if the answer pins nothing, or stores it with the call's
//! pins, and the slot comes back when the last clone is dropped (the call's last pin ends).

use std::sync::Arc;

use super::caller::CallerKey;
use super::inflight::{PerCaller, Permit, Refused};

/// The open-calls quota.
pub struct OpenCalls {
    counts: Arc<PerCaller>,
}

/// One open call, counted until its last clone is dropped. One pointer: cheap to keep with
/// every pin of the call.
#[derive(Clone)]
pub struct OpenCall(#[allow(dead_code)] Arc<Permit>);

impl std::fmt::Debug for OpenCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenCall")
    }
}

impl OpenCalls {
    pub fn new(max: u32, max_tracked: usize) -> OpenCalls {
        OpenCalls {
            counts: PerCaller::new(max, max_tracked),
        }
    }

    /// Reserves one open call for `key`, or refuses when it holds its share.
    pub fn try_open(&self, key: CallerKey) -> Result<OpenCall, Refused> {
        self.counts.try_acquire(key).map(|p| OpenCall(Arc::new(p)))
    }

    /// The calls `key` holds open (unit tests read it).
    #[cfg(test)]
    pub fn count(&self, key: &CallerKey) -> u32 {
        self.counts.count(key)
    }

    /// Callers with an open call.
    pub fn tracked(&self) -> usize {
        self.counts.tracked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_released_when_its_last_pin_lets_go() {
        let calls = OpenCalls::new(1, 10);
        let a = CallerKey([1; 16]);
        let call = calls.try_open(a).unwrap();
        assert!(calls.try_open(a).is_err(), "at its share");
        assert!(
            calls.try_open(CallerKey([2; 16])).is_ok(),
            "another caller is not affected"
        );
        // The call re-pinned under a new handle: two pins share the one slot.
        let other_pin = call.clone();
        drop(call);
        assert_eq!(calls.count(&a), 1);
        drop(other_pin);
        assert_eq!((calls.count(&a), calls.tracked()), (0, 0));
        assert!(calls.try_open(a).is_ok());
        assert_eq!(std::mem::size_of::<OpenCall>(), std::mem::size_of::<usize>());
    }
}
