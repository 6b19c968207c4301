//! Doorbells: how a release wakes the head of the queue in *another process on the same host*
//! where the dialect has no notifications (MySQL, SQLite).
//!
//! Without them a waiter in another process finds a release only on its next look (see
//! `queue::PollInterval`), a step that is at best a millisecond and grows with the wait. With them:
//! * a queued waiter binds a datagram socket at an address made of the store (the client's
//!   registry key, [`crate::wake::local`]'s: the URL without options, and the table) and its
//!   ticket, and wakes when a datagram arrives there;
//! * the release of a lease that was granted from the queue (so that others were likely queued
//!   behind it, and which has handed that head the row: see "Hand-over" in `crate::queue`)
//!   sends an empty datagram to the address of the queue's live head. Where the
//!   grant's own statement named the waiter left at the head (SQLite's grant), the release
//!   rings that ticket at once; otherwise, or when nobody is
//!   bound there any more (that waiter left), it looks the head up in the background after the
//!   release returned; a read hold granted from the queue rings the same head (a writer waiting
//!   for the readers to leave) on its release, looked up the same way;
//! * a semaphore's permit waiter binds one the same way, at the permit queue's addresses (the
//!   store's key with `#permits`: its tickets are another table's); the release of a permit
//!   granted from the queue that does not hand the permit to a waiter of its own process
//!   looks up the permit queue's live head and rings it.
//!
//! A doorbell only hastens a look; nothing depends on it. A ring that reaches nobody (the
//! head is on another host, in another network namespace, or reached the store by another URL;
//! a client of an older version; an uncontended grant, which rings nobody), that comes late,
//! or that a stranger sends, costs a look or leaves the waiter to its polling, as before.
//!
//! The addresses are Linux's abstract socket names (no file, gone with the socket; scoped by
//! network namespace). Elsewhere there is no doorbell and waiters poll.

/// The address of the doorbell of the waiter with `ticket` in the queue of the store `key`:
/// `dlock-bell/<FNV-1a of key, 8 hex digits>/<ticket>` (the hash keeps the address within the
/// 107 bytes an abstract name may have, and is the same in every process and version; two
/// stores whose keys collide only cost each other a look).
fn address(key: &str, ticket: i64) -> String {
    format!("dlock-bell/{:08x}/{ticket}", crate::common::fnv1a(key))
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    use std::sync::LazyLock;

    /// A waiter's bound doorbell; unbound when dropped.
    pub struct Doorbell {
        socket: tokio::net::UnixDatagram,
    }

    impl Doorbell {
        /// Binds the doorbell of `ticket` in the queue of store `key`. `None` if the address
        /// is taken (a waiter of a ticket that was given out again, rarely) or sockets fail:
        /// the waiter then polls.
        pub fn bind(key: &str, ticket: i64) -> Option<Doorbell> {
            let bind = || -> io::Result<Doorbell> {
                let addr = SocketAddr::from_abstract_name(super::address(key, ticket))?;
                let socket = UnixDatagram::bind_addr(&addr)?;
                socket.set_nonblocking(true)?;
                let socket = tokio::net::UnixDatagram::from_std(socket)?;
                Ok(Doorbell { socket })
            };
            bind()
                .inspect_err(|e| tracing::debug!(error = %e, ticket, "no doorbell; polling"))
                .ok()
        }

        /// Waits for a ring, then takes every ring queued meanwhile (they all say the same).
        ///
        /// # Cancel safety
        /// Cancel safe: a ring not yet received stays queued for the next call.
        pub async fn rung(&self) {
            let mut buf = [0u8; 1];
            let _ = self.socket.recv(&mut buf).await;
            while self.socket.try_recv(&mut buf).is_ok() {}
        }

        /// Takes every ring queued now, without waiting; whether there was one. A ring is
        /// queued at the receiver before [`ring`] returns, so this tells at once whether one
        /// was sent.
        #[cfg(test)]
        pub fn try_rung(&self) -> bool {
            let mut buf = [0u8; 1];
            let mut rung = false;
            while self.socket.try_recv(&mut buf).is_ok() {
                rung = true;
            }
            rung
        }
    }

    /// The socket rings are sent from: one per process, never bound.
    static SENDER: LazyLock<Option<UnixDatagram>> = LazyLock::new(|| {
        let socket = UnixDatagram::unbound().ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(socket)
    });

    /// Rings the doorbell of `ticket` in the queue of store `key`, without waiting: best
    /// effort. Whether a bound doorbell took the ring (`false`: nobody there, or its queue is
    /// full; nothing to report, but the caller may look for whoever else should hear it).
    pub fn ring(key: &str, ticket: i64) -> bool {
        let Some(sender) = SENDER.as_ref() else {
            return false;
        };
        SocketAddr::from_abstract_name(super::address(key, ticket))
            .is_ok_and(|addr| sender.send_to_addr(&[], &addr).is_ok())
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    /// No doorbells here (see the module docs): never bound.
    pub struct Doorbell(std::convert::Infallible);

    impl Doorbell {
        /// Always `None`: waiters poll.
        pub fn bind(_key: &str, _ticket: i64) -> Option<Doorbell> {
            None
        }

        /// Never called: no `Doorbell` exists.
        pub async fn rung(&self) {
            match self.0 {}
        }
    }

    /// Nothing to ring.
    pub fn ring(_key: &str, _ticket: i64) -> bool {
        false
    }
}

pub(crate) use imp::{Doorbell, ring};

#[cfg(test)]
mod tests;
