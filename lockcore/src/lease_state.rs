//! The state of a held lease that a guard and the keep-alive renewer share: the lease as last
//! renewed, whether the guard is finished, and the lost signal with its reason. Both
//! [`guard`](crate::LockGuard) and the renewer import this module; it imports neither.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::{Error, Lease};

/// Why a lock is no longer held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out without being renewed.
    Expired,
    /// The store says another owner holds it (or nobody does) before our lease ran out.
    Taken,
    /// Renewals failed because the store could not be reached, until the lease ran out.
    ConnectionLost,
    /// The client session that held the lock ended (session-based backends).
    SessionExpired,
    /// A quorum backend lost its majority.
    QuorumLost,
    /// The keep-alive cap (renewals or hold time) was reached and the lease then ran out.
    RenewalLimit,
}

impl LostReason {
    /// The reason implied by a failed renewal.
    pub fn from_error(error: &Error) -> Self {
        match error {
            Error::LockLost { .. } => LostReason::Taken,
            Error::QuorumNotReached { .. } => LostReason::QuorumLost,
            _ => LostReason::ConnectionLost,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            LostReason::Expired => "the lease expired",
            LostReason::Taken => "the lock was taken by another owner",
            LostReason::ConnectionLost => "the store could not be reached to renew the lease",
            LostReason::SessionExpired => "the client session expired",
            LostReason::QuorumLost => "the quorum was lost",
            LostReason::RenewalLimit => "the keep-alive limit was reached",
        };
        f.write_str(s)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct Shared {
    pub(crate) backend: &'static str,
    /// Set when the guard is released or dropped: the renewer stops renewing it.
    pub(crate) finished: AtomicBool,
    pub(crate) lease: Mutex<Lease>,
    /// The reason to report when `valid_until` passes without a renewal.
    pub(crate) fallback: Mutex<LostReason>,
    /// Why the lock was lost, once known; set once.
    lost: Mutex<Option<LostReason>>,
    /// Wakes whoever waits in `LeaseWatch::lost` when `lost` is set. (A `watch` channel did
    /// both, but it costs every guard an allocation of eight `Notify`s, and dropping its sender
    /// locks each of them: a quarter of lockcore's own time per acquire and release.)
    lost_set: Notify,
}

impl Shared {
    /// A lease just granted: not finished, not lost, `Expired` when it runs out unrenewed.
    pub(crate) fn new(backend: &'static str, lease: Lease) -> Self {
        Shared {
            backend,
            finished: AtomicBool::new(false),
            lease: Mutex::new(lease),
            fallback: Mutex::new(LostReason::Expired),
            lost: Mutex::new(None),
            lost_set: Notify::new(),
        }
    }

    /// The reason, once the lock is known to be lost.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *lock(&self.lost)
    }

    /// Resolves once the lock is known to be lost, or once `valid_until` has passed (where it
    /// sets the fallback reason), with the reason.
    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            // Created before looking, so that a `set_lost` after the look still wakes it.
            let set = self.lost_set.notified();
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            let until = lock(&self.lease).valid_until();
            if Instant::now() >= until {
                self.set_lost(self.fallback());
                continue;
            }
            tokio::select! {
                _ = set => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    /// Resolves as [`lost`](Self::lost) does, or `margin` before `valid_until` when no renewal
    /// has moved it further by then, with the reason the lock is lost for, or would be if it
    /// is not renewed in time (the fallback).
    pub(crate) async fn expiring(&self, margin: Duration) -> LostReason {
        loop {
            let set = self.lost_set.notified();
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            let until = lock(&self.lease).valid_until();
            let warn_at = until.checked_sub(margin).unwrap_or(until);
            if Instant::now() >= warn_at {
                if Instant::now() >= until {
                    self.set_lost(self.fallback());
                    continue;
                }
                return self.fallback();
            }
            tokio::select! {
                _ = set => {}
                _ = tokio::time::sleep_until(warn_at.into()) => {}
            }
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    pub(crate) fn store_lease(&self, lease: Lease) {
        *lock(&self.lease) = lease;
    }

    pub(crate) fn fallback(&self) -> LostReason {
        *lock(&self.fallback)
    }

    pub(crate) fn lease(&self) -> Lease {
        lock(&self.lease).clone()
    }

    pub(crate) fn set_lost(&self, reason: LostReason) {
        let changed = {
            let mut lost = lock(&self.lost);
            let first = lost.is_none();
            if first {
                *lost = Some(reason);
            }
            first
        };
        if changed {
            self.lost_set.notify_waiters();
            let lease = self.lease();
            tracing::warn!(backend = self.backend, lock = %lease.name(), token = lease.token().0, %reason, "lock lost");
        }
    }

    pub(crate) fn set_fallback(&self, reason: LostReason) {
        *lock(&self.fallback) = reason;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::{FencingToken, LockName, OwnerId};

    fn hour_lease() -> Lease {
        let name = LockName::new("held").unwrap();
        let hour = Duration::from_secs(3600);
        Lease::new(
            name,
            OwnerId::random(),
            FencingToken(1),
            Instant::now(),
            hour,
            Duration::ZERO,
        )
    }

    /// `lost()` wakes on the reason, not on the lease's end an hour away, whether the reason
    /// is set while it waits or before it first looks; the first reason stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_wakes_on_the_reason_and_keeps_the_first() {
        let shared = Arc::new(Shared::new("test", hour_lease()));
        let waiting = tokio::spawn({
            let shared = shared.clone();
            async move { shared.lost().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        shared.set_lost(LostReason::Taken);
        let limit = Duration::from_secs(30);
        let reason = tokio::time::timeout(limit, waiting).await.expect("woken");
        assert_eq!(reason.unwrap(), LostReason::Taken);
        shared.set_lost(LostReason::Expired);
        assert_eq!(shared.lost_reason(), Some(LostReason::Taken));
        let again = tokio::time::timeout(limit, shared.lost()).await;
        assert_eq!(again.expect("already set"), LostReason::Taken);
    }
}
