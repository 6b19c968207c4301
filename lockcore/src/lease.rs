//! Leases, owner ids and fencing tokens.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::LockName;

/// A fencing token: for a backend with strict fencing, every acquisition of a name gets a token
/// greater than every token handed out before for that name. A protected resource rejects any
/// write carrying a token lower than the highest it has seen.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// 128 random bits naming one acquisition (not a process or a thread).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u128);

impl OwnerId {
    /// A fresh random id.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    /// Parses the 32-hex-digit form written by `Display`.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == 32)
            .then(|| u128::from_str_radix(text, 16).ok().map(OwnerId))
            .flatten()
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

/// One successful acquisition.
///
/// `valid_until` is a monotonic instant computed as *start of the request* + ttl − drift; nothing
/// here reads the wall clock. A lease is plain data: holding one does not keep the lock (see
/// [`LockGuard`](crate::LockGuard) for that).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    name: LockName,
    owner: OwnerId,
    token: FencingToken,
    acquired_at: Instant,
    valid_until: Instant,
    ttl: Duration,
    drift: Duration,
    handle: Option<Arc<str>>,
}

impl Lease {
    /// Builds a lease for a request that started at `started` (backends call this).
    pub fn new(
        name: LockName,
        owner: OwnerId,
        token: FencingToken,
        started: Instant,
        ttl: Duration,
        drift: Duration,
    ) -> Self {
        Lease {
            name,
            owner,
            token,
            acquired_at: started,
            valid_until: started + ttl.saturating_sub(drift),
            ttl,
            drift,
            handle: None,
        }
    }

    /// Attaches backend-private data (for example a ZooKeeper node path).
    pub fn with_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// The same lease renewed by an extend request that started at `started`.
    pub fn renewed(&self, started: Instant, ttl: Duration) -> Self {
        let drift = if ttl == self.ttl {
            self.drift
        } else {
            crate::options::default_drift(ttl)
        };
        Lease {
            valid_until: started + ttl.saturating_sub(drift),
            ttl,
            drift,
            ..self.clone()
        }
    }

    /// The same lease, trusted no later than `until` (a keep-alive cap, for example).
    pub fn valid_no_later_than(mut self, until: Instant) -> Self {
        self.valid_until = self.valid_until.min(until);
        self
    }

    /// Lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }
    /// Owner id of this acquisition.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }
    /// Fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }
    /// When the acquire request started.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
    /// Until when the lease is certainly valid (monotonic clock).
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// The ttl asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// The drift allowance.
    pub fn drift(&self) -> Duration {
        self.drift
    }
    /// Backend-private data, if any.
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }
    /// Time left before `valid_until` (zero once past).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// Whether `valid_until` is still ahead.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
}

/// Outcome of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lease was current and the lock is now free.
    Released,
    /// The lease had already expired, been released, or been taken over; nothing was changed.
    NotHeld,
}

/// What `inspect` reports about a lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LockInfo {
    /// Lock name.
    pub name: String,
    /// Current holder's owner id, if the lock is held.
    pub holder: Option<String>,
    /// Token of the current (or, if free, the last) acquisition, if known.
    pub token: Option<FencingToken>,
    /// Time left on the holder's lease as the store sees it.
    pub remaining: Option<Duration>,
    /// Clients queued for the lock, where the backend queues.
    pub waiters: Option<usize>,
    /// What each part of the store sees, where a lock spans several (Redlock: one line per
    /// node); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

impl LockInfo {
    /// Builds a report (backends call this).
    pub fn new(
        name: &LockName,
        holder: Option<String>,
        token: Option<FencingToken>,
        remaining: Option<Duration>,
        waiters: Option<usize>,
    ) -> Self {
        LockInfo {
            name: name.as_str().to_owned(),
            holder,
            token,
            remaining,
            waiters,
            details: Vec::new(),
        }
    }

    /// The same report with per-part views (see [`LockInfo::details`]).
    pub fn with_details(mut self, details: Vec<String>) -> Self {
        self.details = details;
        self
    }

    /// Whether someone holds the lock.
    pub fn is_held(&self) -> bool {
        self.holder.is_some()
    }

    /// The same report with the read side of a read-write lock counted, in the words every
    /// backend uses (and `dlock status` prints): `"N reader(s) holding"` when `readers_holding`
    /// is above 0, and `"K of the W waiting are readers"` when `readers_waiting` (K) is,
    /// W being [`waiters`](Self::waiters). Other details are kept.
    pub fn with_readers(mut self, readers_holding: usize, readers_waiting: usize) -> Self {
        if readers_holding > 0 {
            self.details
                .push(format!("{readers_holding} reader(s) holding"));
        }
        if readers_waiting > 0 {
            let waiting = self.waiters.unwrap_or(readers_waiting);
            self.details.push(format!(
                "{readers_waiting} of the {waiting} waiting are readers"
            ));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_readers_counts_holders_and_queued_readers_in_one_wording() {
        let name = LockName::new("n").unwrap();
        let info = LockInfo::new(&name, Some("r".into()), None, None, Some(3));
        let counted = info.clone().with_readers(2, 1);
        assert_eq!(
            counted.details,
            ["2 reader(s) holding", "1 of the 3 waiting are readers"]
        );
        assert!(info.clone().with_readers(0, 0).details.is_empty());
        let kept = info.with_details(vec!["x".into()]).with_readers(0, 2);
        assert_eq!(kept.details, ["x", "2 of the 3 waiting are readers"]);
    }
}
