//! The state of a held lease that a guard and the keep-alive renewer share: the lease as last
//! renewed, whether the guard is finished, and the lost signal with its reason. Both
//! [`guard`](crate::LockGuard) and the renewer import this module; it imports neither.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

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
    pub(crate) lost: watch::Sender<Option<LostReason>>,
}

impl Shared {
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
        let changed = self.lost.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        });
        if changed {
            let lease = self.lease();
            tracing::warn!(backend = self.backend, lock = %lease.name(), token = lease.token().0, %reason, "lock lost");
        }
    }

    pub(crate) fn set_fallback(&self, reason: LostReason) {
        *lock(&self.fallback) = reason;
    }
}
