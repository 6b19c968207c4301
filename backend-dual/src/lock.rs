//! [`DualLock`]: one lock held on two stores, first then second.
//!
//! The acquisition itself (first store, then second, and the give-back when it does not
//! complete) is in `acquire`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fencing, Lease,
    LockInfo, LockName, LostReason, OwnerId, Released, Result, SemaphoreInfo, async_trait,
    backend_support::Access,
};

use crate::{BACKEND, DualConfig};

mod acquire;

/// What a dual fencing guarantee assumes, in words (see the migration guide in the README).
pub const FENCING_ASSUMPTION: &str = "tokens of dual clients come from the second store's \
     counter, carried up to the first store's token; tokens of single-store clients join that \
     one increasing sequence only while the migration phases are followed (no first-only and \
     second-only clients at the same time)";

/// What a dual fencing guarantee assumes when the second store cannot carry a token minimum
/// (ZooKeeper second).
pub const UNCARRIED_ASSUMPTION: &str = "tokens are the second store's own (it cannot raise them \
     to the first store's): strict among dual clients, but not ordered with the tokens of \
     first-only clients, so this pair cannot carry a migration's fencing";

/// Which of the two stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The store taken first (ZooKeeper, in a ZooKeeper → Redis move).
    First,
    /// The store taken second (Redis).
    Second,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::First => "first",
            Side::Second => "second",
        })
    }
}

/// The two stores' leases of one dual acquisition.
#[derive(Clone, Debug)]
struct Pair {
    first: Lease,
    second: Lease,
    /// Why a side was found lost by `extend`, for `lost_reason`.
    lost: Option<(Side, LostReason)>,
}

impl Pair {
    /// Long past any use: both leases ran out more than a ttl ago.
    fn stale(&self, now: Instant) -> bool {
        let end = self.first.valid_until().max(self.second.valid_until());
        now > end + self.first.ttl().max(self.second.ttl())
    }
}

/// One attempt, or a wait until a deadline (`None`: no deadline).
#[derive(Clone, Copy, Debug)]
enum Attempt {
    Once,
    Until(Option<Instant>),
}

/// Every lock held on two stores: acquired on the first, then on the second (a fixed order, so
/// two dual clients never deadlock), released and extended on both, lost when either side is
/// lost. Waiting happens in the first store's queue. The token is the second store's, whose
/// counter is carried to at least the first store's token in the granting step
/// ([`AcquireOptions::min_token`]), so one fenced resource sees one increasing sequence from
/// first-only, dual and second-only clients while the migration phases are followed.
///
/// Any two stores compose; the token order across a migration needs a second store that can
/// carry a token minimum (every backend but ZooKeeper). Read-write locks when both have them.
pub struct DualLock {
    first: Arc<dyn DistributedLock>,
    second: Arc<dyn DistributedLock>,
    config: DualConfig,
    capabilities: Capabilities,
    pairs: Mutex<HashMap<OwnerId, Pair>>,
}

impl fmt::Debug for DualLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DualLock")
            .field("first", &self.first)
            .field("second", &self.second)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DualLock {
    /// Composes two connected stores. A second store that cannot carry a token minimum
    /// (ZooKeeper, which assigns its tokens itself) is accepted with a weaker fencing claim
    /// ([`UNCARRIED_ASSUMPTION`]) and a warning: such a pair keeps mutual exclusion through a
    /// migration, but not one token order.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when either store hands out no fencing tokens at all.
    pub fn new(
        first: Arc<dyn DistributedLock>,
        second: Arc<dyn DistributedLock>,
        config: DualConfig,
    ) -> Result<Self> {
        let (c1, c2) = (first.capabilities(), second.capabilities());
        for (side, c) in [(Side::First, &c1), (Side::Second, &c2)] {
            if c.fencing == Fencing::None {
                return Err(Error::invalid_config(
                    BACKEND,
                    format!(
                        "the {side} store ({}) hands out no fencing tokens",
                        c.backend
                    ),
                ));
            }
        }
        let expiry = if c1.expiry == Expiry::Session || c2.expiry == Expiry::Session {
            Expiry::Session
        } else {
            Expiry::Ttl
        };
        let assumption = if c2.min_token {
            FENCING_ASSUMPTION
        } else {
            UNCARRIED_ASSUMPTION
        };
        let capabilities = Capabilities::new(
            BACKEND,
            Fencing::Conditional { assumption },
            expiry,
            c1.fairness,
            c1.waiting,
        )
        .native(crate::native_of(c1.native, c2.native))
        .shared_across_processes(c1.shared_across_processes && c2.shared_across_processes)
        .bounded_requests(c1.bounded_requests && c2.bounded_requests)
        .min_token(c2.min_token)
        // A name must be usable on both stores (ZooKeeper in Curator's or kazoo's layout takes
        // only znode paths).
        .path_names(c1.path_names || c2.path_names);
        if !c2.min_token {
            tracing::warn!(
                second = c2.backend,
                "the second store cannot raise its tokens to the first store's: dual tokens are \
                 the second store's own and are not ordered with first-only clients' tokens"
            );
        }
        Ok(DualLock {
            first,
            second,
            config,
            capabilities,
            pairs: Mutex::new(HashMap::new()),
        })
    }

    /// The store taken first.
    pub fn first(&self) -> &Arc<dyn DistributedLock> {
        &self.first
    }

    /// The store taken second.
    pub fn second(&self) -> &Arc<dyn DistributedLock> {
        &self.second
    }

    /// The parsed URL.
    pub fn config(&self) -> &DualConfig {
        &self.config
    }

    /// The two leases behind a dual `lease` while it is held, first store's first.
    pub fn leases(&self, lease: &Lease) -> Option<(Lease, Lease)> {
        self.pairs()
            .get(&lease.owner())
            .filter(|p| p.first.name() == lease.name())
            .map(|p| (p.first.clone(), p.second.clone()))
    }

    /// `Unsupported` unless both stores have semaphores.
    fn check_semaphore(&self) -> Result<()> {
        let caps = &self.capabilities;
        caps.require(caps.native.semaphore, "semaphore")
    }

    fn pairs(&self) -> MutexGuard<'_, HashMap<OwnerId, Pair>> {
        self.pairs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pair_of(&self, lease: &Lease) -> Option<Pair> {
        self.pairs()
            .get(&lease.owner())
            .filter(|p| p.first.name() == lease.name())
            .cloned()
    }

    fn side(&self, side: Side) -> &Arc<dyn DistributedLock> {
        match side {
            Side::First => &self.first,
            Side::Second => &self.second,
        }
    }

    /// What one renewal of a dual lease comes to, from each store's answer: a lease valid no
    /// longer than both sides, or `LockLost` when either side lost its hold (recorded on the
    /// pair for `lost_reason`), or the first other failure.
    fn renewed(
        &self,
        lease: &Lease,
        pair: Pair,
        ttl: Duration,
        started: Instant,
        first: Result<Lease>,
        second: Result<Lease>,
    ) -> Result<Lease> {
        let mut lost = None;
        let mut failure = None;
        let mut updated = pair.clone();
        for (side, result) in [(Side::First, first), (Side::Second, second)] {
            match result {
                Ok(renewed) => match side {
                    Side::First => updated.first = renewed,
                    Side::Second => updated.second = renewed,
                },
                Err(e) => {
                    let inner = match side {
                        Side::First => &pair.first,
                        Side::Second => &pair.second,
                    };
                    if matches!(e, Error::LockLost { .. }) && lost.is_none() {
                        lost = Some((side, self.side(side).lost_reason(inner, &e)));
                    } else if failure.is_none() {
                        failure = Some(e);
                    }
                }
            }
        }
        if let Some((side, reason)) = lost {
            updated.lost = Some((side, reason));
            if let Some(p) = self.pairs().get_mut(&lease.owner()) {
                *p = updated;
            }
            tracing::debug!(lock = %lease.name(), %side, ?reason, "a side of a dual lock was lost");
            return Err(Error::lock_lost(BACKEND, lease.name(), "extend"));
        }
        if let Some(p) = self.pairs().get_mut(&lease.owner()) {
            *p = updated.clone();
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(lease.renewed(started, ttl).valid_no_later_than(
            updated
                .first
                .valid_until()
                .min(updated.second.valid_until()),
        ))
    }
}

fn describe(side: Side, backend: &str, info: &Option<LockInfo>) -> String {
    let state = match info {
        None => "never used".to_owned(),
        Some(i) => {
            let mut s = match &i.holder {
                Some(h) => format!("held by {h}"),
                None => "free".to_owned(),
            };
            if let Some(t) = i.token {
                s.push_str(&format!(", token {t}"));
            }
            if let Some(r) = i.remaining {
                s.push_str(&format!(", {} left", humanize(r)));
            }
            if let Some(w) = i.waiters {
                s.push_str(&format!(", {w} waiting"));
            }
            s
        }
    };
    format!("{side} ({backend}): {state}")
}

fn humanize(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

// Every method written out: a default left in place would answer for dual what neither store
// said.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl DistributedLock for DualLock {
    fn capabilities(&self) -> Capabilities {
        // A session store's granted timeout can change with a new session: asked each time.
        let session = [&self.first, &self.second]
            .iter()
            .filter_map(|s| s.capabilities().session_timeout)
            .max();
        self.capabilities.clone().session_timeout(session)
    }

    fn defaults(&self) -> ClientDefaults {
        let (d1, d2) = (self.first.defaults(), self.second.defaults());
        let mut d = ClientDefaults::default();
        d.ttl = self.config.ttl.unwrap_or(d1.ttl);
        d.drift = self.config.drift.or(d1.drift);
        d.timeout = self.config.timeout.unwrap_or(d1.timeout + d2.timeout);
        d
    }

    /// One attempt on each store: `Ok(None)` when either is held by someone else (the first
    /// store's hold is then given back).
    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.acquire(Access::Exclusive, name, opts, Attempt::Once)
            .await
    }

    /// Waits in the first store's queue, then for the second store (renewing the first hold
    /// meanwhile); both until `deadline`.
    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.acquire(Access::Exclusive, name, opts, Attempt::Until(deadline))
            .await
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        self.first.wait_for_release(name, until).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let caps = &self.capabilities;
        caps.require(caps.native.read_write, "read lock")?;
        self.acquire(Access::Shared, name, opts, Attempt::Once)
            .await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let caps = &self.capabilities;
        caps.require(caps.native.read_write, "read lock")?;
        self.acquire(Access::Shared, name, opts, Attempt::Until(deadline))
            .await
    }

    /// A permit on each store (see the crate docs for why that keeps the count through the
    /// migration's phases).
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.check_semaphore()?;
        self.acquire(Access::Permit(permits), name, opts, Attempt::Once)
            .await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.check_semaphore()?;
        let access = Access::Permit(permits);
        self.acquire(access, name, opts, Attempt::Until(deadline))
            .await
    }

    /// Releases both holds at once. `Released` only when both were still held.
    ///
    /// The order does not matter for exclusion: each store keeps its own holders apart, and
    /// any two clients share a store (first-only and dual clients the first, second-only and
    /// dual clients the second). A dual waiter that gets the first store's hold before the
    /// second store's release has run waits there as any waiter does. Sending both at once
    /// takes one of the two store round trips off every handoff.
    async fn release(&self, lease: &Lease) -> Result<Released> {
        let Some(pair) = self.pair_of(lease) else {
            return Ok(Released::NotHeld);
        };
        let (second, first) = tokio::join!(
            self.second.release(&pair.second),
            self.first.release(&pair.first)
        );
        // Forgotten only once both calls answered, so a dropped release can be repeated.
        self.pairs().remove(&lease.owner());
        match (first?, second?) {
            (Released::Released, Released::Released) => Ok(Released::Released),
            _ => Ok(Released::NotHeld),
        }
    }

    /// Extends both holds at once. A side found lost makes the whole lease lost
    /// ([`Error::LockLost`]); `lost_reason` then says which side and why.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let Some(pair) = self.pair_of(lease) else {
            return Err(Error::lock_lost(BACKEND, lease.name(), "extend"));
        };
        let started = Instant::now();
        let (first, second) = tokio::join!(
            self.first.extend(&pair.first, ttl),
            self.second.extend(&pair.second, ttl)
        );
        self.renewed(lease, pair, ttl, started, first, second)
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        let _ = error;
        match self.pair_of(lease).and_then(|p| p.lost) {
            Some((_, reason)) => reason,
            None if lease.is_valid() => LostReason::Taken,
            None => LostReason::Expired,
        }
    }

    /// Both stores' views: `holder` is the owner when both sides agree (a dual client), else
    /// whichever side is held; `token` is the second store's; `details` has one line per side.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (first, second) = tokio::join!(self.first.inspect(name), self.second.inspect(name));
        let (first, second) = (first?, second?);
        if first.is_none() && second.is_none() {
            return Ok(None);
        }
        let holder_of = |i: &Option<LockInfo>| i.as_ref().and_then(|i| i.holder.clone());
        let (h1, h2) = (holder_of(&first), holder_of(&second));
        let holder = h1.clone().or(h2.clone());
        let token = second
            .as_ref()
            .and_then(|i| i.token)
            .or(first.as_ref().and_then(|i| i.token));
        let remaining = match (
            first.as_ref().and_then(|i| i.remaining),
            second.as_ref().and_then(|i| i.remaining),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let waiters = first.as_ref().and_then(|i| i.waiters);
        let mut details = Vec::new();
        for (side, info) in [(Side::First, &first), (Side::Second, &second)] {
            details.push(describe(side, self.side(side).capabilities().backend, info));
            if let Some(i) = info {
                details.extend(i.details.iter().map(|d| format!("  {d}")));
            }
        }
        if h1.is_some() && h2.is_some() && h1 != h2 {
            details.push(
                "warning: the two sides are held by different owners: a first-only and a \
                 second-only client hold this lock at once (a migration phase was skipped)"
                    .to_owned(),
            );
        }
        Ok(Some(
            LockInfo::new(name, holder, token, remaining, waiters).with_details(details),
        ))
    }

    /// The first store's view, where dual clients queue (a dual holder holds a permit on each
    /// store; first-only clients show only here).
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        self.check_semaphore()?;
        self.first.inspect_semaphore(name).await
    }

    /// The names either store knows (a store that cannot list is skipped if the other can).
    async fn names(&self) -> Result<Vec<LockName>> {
        let (first, second) = tokio::join!(self.first.names(), self.second.names());
        let mut names = match (first, second) {
            (Ok(mut a), Ok(b)) => {
                a.extend(b);
                a
            }
            (Ok(a), Err(Error::Unsupported { .. })) | (Err(Error::Unsupported { .. }), Ok(a)) => a,
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }

    /// Extends every lease's two sides, one lease after another (each [`extend`](Self::extend)
    /// already sends its two sides at once).
    /// One batch per store, both at once: each store renews its side of every lease the way it
    /// renews many (a pipeline, a multi-read), so the last lease of a long list is not renewed
    /// a round trip per earlier lease late.
    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let mut out: Vec<Option<Result<Lease>>> = Vec::with_capacity(leases.len());
        let (mut pairs, mut firsts, mut seconds) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (lease, ttl)) in leases.iter().enumerate() {
            match self.pair_of(lease) {
                Some(pair) => {
                    firsts.push((pair.first.clone(), *ttl));
                    seconds.push((pair.second.clone(), *ttl));
                    pairs.push((i, pair));
                    out.push(None);
                }
                None => out.push(Some(Err(Error::lock_lost(BACKEND, lease.name(), "extend")))),
            }
        }
        let started = Instant::now();
        let (firsts, seconds) = tokio::join!(
            self.first.extend_many(&firsts),
            self.second.extend_many(&seconds)
        );
        for (((i, pair), first), second) in pairs.into_iter().zip(firsts).zip(seconds) {
            let (lease, ttl) = &leases[i];
            out[i] = Some(self.renewed(lease, pair, *ttl, started, first, second));
        }
        out.into_iter()
            .map(|r| r.expect("every lease answered"))
            .collect()
    }

    /// Forgets `name` on the second store, then on the first.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        let second = self.second.forget(name).await?;
        let first = self.first.forget(name).await?;
        Ok(first && second)
    }
}
