//! What a backend guarantees, so callers and the conformance suite can tell backends apart.

use std::fmt;

/// How far fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Tokens strictly increase per name across expiry, release, restarts and helper-key loss.
    Strict,
    /// Tokens increase as long as the stated assumption holds.
    Conditional {
        /// The assumption, in words.
        assumption: &'static str,
    },
    /// Tokens carry no ordering guarantee.
    None,
}

/// How a lock ends when its holder disappears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The lease ends at its ttl unless renewed.
    Ttl,
    /// The lock lives as long as the client's session (ZooKeeper): the store ends it when the
    /// session expires, not at a ttl of its own. The ttl paces renewals, and a backend may also
    /// end an unrenewed lease at its ttl from the client side (the ZooKeeper backend deletes
    /// its node then); leases are never trusted longer than the session timeout.
    Session,
}

/// In which order blocked acquirers get the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fairness {
    /// First come, first served; `try_acquire` does not jump the queue.
    Fifo,
    /// No order is promised.
    Unordered,
}

/// How waiters learn that a lock was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMechanism {
    /// In-process notification.
    Notify,
    /// Redis pub/sub.
    PubSub,
    /// ZooKeeper watches.
    Watch,
    /// PostgreSQL LISTEN/NOTIFY.
    ListenNotify,
    /// Polling with capped exponential backoff and jitter (the store has no notification).
    Poll,
    /// Polling, cut short where the client can: a release wakes the waiters of its own process
    /// at once and rings the head waiter's doorbell (a datagram) in another process on the same
    /// host; waiters on other hosts find a release by polling (the SQL dialects without
    /// notifications, on Linux).
    Doorbell,
}

impl WaitMechanism {
    /// Whether waiters are woken by the store rather than by polling (a doorbell reaches only
    /// the waiters on the releasing client's host, so the others poll).
    pub fn is_native(self) -> bool {
        !matches!(self, WaitMechanism::Poll | WaitMechanism::Doorbell)
    }
}

/// Primitives the store provides natively (dlock builds the rest in lockcore).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NativePrimitives {
    /// Reentrancy kept in the store.
    pub reentrant: bool,
    /// Shared/exclusive locks.
    pub read_write: bool,
    /// Counting semaphores.
    pub semaphore: bool,
}

impl NativePrimitives {
    /// The primitives with these flags (a backend's `NATIVE` constant).
    pub const fn new(reentrant: bool, read_write: bool, semaphore: bool) -> Self {
        NativePrimitives {
            reentrant,
            read_write,
            semaphore,
        }
    }

    /// What both `self` and `other` offer (a store made of two).
    pub const fn and(self, other: NativePrimitives) -> Self {
        NativePrimitives::new(
            self.reentrant && other.reentrant,
            self.read_write && other.read_write,
            self.semaphore && other.semaphore,
        )
    }
}

/// A backend's guarantees.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Backend name (`memory`, `redis`, `sqlite`, ...).
    pub backend: &'static str,
    /// Fencing guarantee.
    pub fencing: Fencing,
    /// Expiry model.
    pub expiry: Expiry,
    /// Waiter ordering.
    pub fairness: Fairness,
    /// How waiters are woken.
    pub waiting: WaitMechanism,
    /// Native primitives.
    pub native: NativePrimitives,
    /// Whether two OS processes using the same URL see the same locks.
    pub shared_across_processes: bool,
    /// Whether every request the backend sends is already bounded by its `timeout` option (for
    /// example a client library's per-reply timeout). Then lockcore puts no timer of its own
    /// around a non-waiting acquire; otherwise it bounds the call by `timeout` itself.
    pub bounded_requests: bool,
    /// Whether acquisitions honour [`AcquireOptions::min_token`](crate::AcquireOptions::min_token)
    /// (the name's counter moves to `max(counter + 1, min_token)` in the granting step). Backends
    /// whose tokens the store assigns by itself (ZooKeeper's `czxid`) cannot.
    pub min_token: bool,
    /// For [`Expiry::Session`] stores: the session timeout the server granted this client's
    /// current session, which is how long a lock outlives a holder that died without releasing
    /// it (the server may have clamped the timeout asked for to its own bounds). `None` for ttl
    /// stores, whose leases end at their ttl.
    pub session_timeout: Option<std::time::Duration>,
    /// Whether lock names are paths in the store's own tree (ZooKeeper in Curator's or kazoo's
    /// layout, where `a/b` is the znode `{chroot}/a/b` those libraries lock too). Such a store
    /// refuses names that are no path there (`.`, `..`, an empty segment) with
    /// [`Error::InvalidName`](crate::Error::InvalidName) before any I/O, instead of keeping
    /// every [`LockName`](crate::LockName) distinct by escaping it.
    pub path_names: bool,
}

impl Capabilities {
    /// A description with no native extras; set the rest with the builder methods.
    pub fn new(
        backend: &'static str,
        fencing: Fencing,
        expiry: Expiry,
        fairness: Fairness,
        waiting: WaitMechanism,
    ) -> Self {
        Capabilities {
            backend,
            fencing,
            expiry,
            fairness,
            waiting,
            native: NativePrimitives::default(),
            shared_across_processes: true,
            bounded_requests: false,
            min_token: false,
            session_timeout: None,
            path_names: false,
        }
    }

    /// Declares that each store request is bounded by the backend's `timeout` option, so
    /// lockcore need not add its own timer around `try_acquire` (see
    /// [`Capabilities::bounded_requests`]).
    pub fn bounded_requests(mut self, bounded: bool) -> Self {
        self.bounded_requests = bounded;
        self
    }

    /// Records the session timeout granted to a session store's client (see
    /// [`Capabilities::session_timeout`]).
    pub fn session_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Declares that acquisitions honour a token minimum (see [`Capabilities::min_token`]).
    pub fn min_token(mut self, carries: bool) -> Self {
        self.min_token = carries;
        self
    }

    /// Declares that lock names are paths in the store's tree (see
    /// [`Capabilities::path_names`]).
    pub fn path_names(mut self, paths: bool) -> Self {
        self.path_names = paths;
        self
    }

    /// Sets whether other processes see the same locks.
    pub fn shared_across_processes(mut self, shared: bool) -> Self {
        self.shared_across_processes = shared;
        self
    }

    /// Sets the native primitives.
    pub fn native(mut self, native: NativePrimitives) -> Self {
        self.native = native;
        self
    }

    /// `Ok` when `has` (one of [`Capabilities::native`]'s flags) is set, else
    /// [`Error::Unsupported`](crate::Error::Unsupported) for `operation` on this backend. No I/O.
    ///
    /// # Errors
    /// As said.
    pub fn require(&self, has: bool, operation: &'static str) -> crate::Result<()> {
        if has {
            Ok(())
        } else {
            Err(crate::Error::Unsupported {
                operation,
                backend: self.backend,
            })
        }
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fencing = match self.fencing {
            Fencing::Strict => "strict".to_owned(),
            Fencing::Conditional { assumption } => format!("conditional ({assumption})"),
            Fencing::None => "none".to_owned(),
        };
        let expiry = match (self.expiry, self.session_timeout) {
            (Expiry::Session, Some(t)) => format!("Session (timeout {t:?})"),
            (e, _) => format!("{e:?}"),
        };
        write!(
            f,
            "{}: fencing {fencing}; expiry {expiry}; fairness {:?}; waiting {:?}",
            self.backend, self.fairness, self.waiting
        )
    }
}
