//! Acquiring: single attempts and the fair (FIFO) waiting acquire, with the armed cleanup that
//! undoes an acquire whose caller went away.
//!
//! A waiting acquire joins a queue kept in Redis (a ZSET ordered by an arrival ticket) and
//! refreshes a liveness deadline on every re-check; the acquire script drops waiters whose
//! liveness ran out, so a crashed waiter holds up the queue for at most [`ALIVE`]. The lock is
//! granted only to the live head of the queue, and a `try` attempt never jumps a non-empty
//! queue. Waiters sleep until their release notification (see [`crate::waiters`]) or a bounded
//! fallback re-check ([`RECHECK`]), never by polling in a tight loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{AcquireOptions, FencingToken, Lease, LockName, OwnerId, Result};

use crate::lock::Inner;
use crate::scripts::{self, AcquireReply, Call, Key, Keys};
use crate::store::{backend_error, protocol_error};

/// Longest a waiter sleeps between re-checks when no notification comes (also the interval at
/// which it refreshes its liveness).
pub(crate) const RECHECK: Duration = Duration::from_millis(500);

/// How long a waiter stays in the queue after its last re-check: a waiter that crashed (or
/// stalled longer than this) is dropped from the queue, and rejoins at the tail if it comes back.
pub(crate) const ALIVE: Duration = Duration::from_millis(2000);

/// Undoes an acquire whose future was dropped (or failed) before it could return the lease:
/// leaves the queue and deletes the lock if it was granted to this owner. Armed on creation,
/// disarmed on success; when dropped armed it spawns the cleanup on the current runtime at once.
struct Abandon<'a> {
    inner: &'a Arc<Inner>,
    name: &'a LockName,
    owner: OwnerId,
    armed: bool,
}

impl Abandon<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Runs the cleanup now (the normal end of a wait that timed out).
    async fn cancel_now(mut self) {
        self.armed = false;
        if let Err(e) = self.inner.cancel(self.name, self.owner).await {
            tracing::warn!(lock = %self.name, error = %e, "redis: leaving the wait queue failed; the entry expires on its own");
        }
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (inner, name, owner) = (self.inner.clone(), self.name.clone(), self.owner);
        lockcore::spawn_cleanup(crate::BACKEND, self.name, async move {
            inner.cancel(&name, owner).await
        });
    }
}

impl Inner {
    /// The acquire script's call; `floor` is the token floor (0 = none, see
    /// [`scripts::floor_arg`]).
    fn acquire_call(
        &self,
        keys: &Keys,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: &str,
        floor: u64,
    ) -> Call {
        keys.call(
            &scripts::ACQUIRE,
            &[Key::Lock, Key::Fence, Key::Queue, Key::Alive, Key::Seq],
        )
        .owner_arg(owner)
        .arg(millis(opts.ttl_value()))
        .arg(mode)
        .arg(millis(ALIVE))
        .arg(self.client.as_str())
        .arg(self.wakes.as_str())
        .arg(floor)
    }

    /// One run of the acquire script in `mode` for `owner`, with token floor `floor` (0 = none).
    pub(crate) async fn attempt(
        &self,
        name: &LockName,
        keys: &Keys,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: &str,
        floor: u64,
    ) -> Result<AcquireReply> {
        let value = self
            .store
            .eval(&self.acquire_call(keys, owner, opts, mode, floor))
            .await
            .map_err(|e| backend_error("acquire", Some(name), e))?;
        scripts::parse_acquire(&value, owner).map_err(|e| protocol_error("acquire", Some(name), e))
    }

    /// One `try` for `owner` that never jumps the queue: the short fast script (free and
    /// nobody queued: three commands, three keys), and the full acquire script in `try` mode
    /// only when someone is queued (it prunes dead waiters and never jumps live ones). A
    /// refusal carries the holder's fence, as the full script's does.
    pub(crate) async fn try_once(
        &self,
        name: &LockName,
        keys: &Keys,
        owner: OwnerId,
        opts: &AcquireOptions,
        floor: u64,
    ) -> Result<AcquireReply> {
        let fast = keys
            .call(&scripts::TRY_FAST, &[Key::Lock, Key::Fence, Key::Queue])
            .owner_arg(owner)
            .arg(millis(opts.ttl_value()))
            .arg(floor);
        let value = self
            .store
            .eval(&fast)
            .await
            .map_err(|e| backend_error("acquire", Some(name), e))?;
        match scripts::parse_try_fast(&value, owner)
            .map_err(|e| protocol_error("acquire", Some(name), e))?
        {
            Some(reply) => Ok(reply),
            None => self.attempt(name, keys, owner, opts, "try", floor).await,
        }
    }

    pub(crate) fn lease(
        name: &LockName,
        owner: OwnerId,
        token: u64,
        started: Instant,
        opts: &AcquireOptions,
    ) -> Lease {
        Lease::new(
            name.clone(),
            owner,
            FencingToken(token),
            started,
            opts.ttl_value(),
            opts.drift_value(),
        )
    }

    /// One attempt that never jumps the queue.
    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let floor = scripts::floor_arg(crate::BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let keys = Keys::new(&self.prefix, name);
        let mut guard = Abandon {
            inner: self,
            name,
            owner,
            armed: true,
        };
        let reply = self.try_once(name, &keys, owner, opts, floor).await?;
        guard.disarm();
        Ok(match reply {
            AcquireReply::Granted(token) => Some(Self::lease(name, owner, token, started, opts)),
            AcquireReply::Waiting { .. } => None,
        })
    }

    /// Queues for the lock and waits for its turn, until `deadline`.
    pub(crate) async fn acquire_wait(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let floor = scripts::floor_arg(crate::BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let waiter = owner.to_string();
        let keys = Keys::new(&self.prefix, name);
        // Registered before the first request, so a wake-up that names us is never dropped.
        let (registration, mut subscribed) = self.hub.register(&waiter);
        let mut guard = Abandon {
            inner: self,
            name,
            owner,
            armed: true,
        };
        loop {
            let started = Instant::now();
            let (pttl, rank) = match self
                .attempt(name, &keys, owner, opts, "wait", floor)
                .await?
            {
                AcquireReply::Granted(token) => {
                    guard.disarm();
                    return Ok(Some(Self::lease(name, owner, token, started, opts)));
                }
                AcquireReply::Waiting { pttl, rank, .. } => (pttl, rank),
            };
            if !subscribed {
                // Subscribe, then check again at once: a release between the attempt above and
                // the subscription is caught by that second attempt.
                match self.hub.ensure_subscribed(&self.store).await {
                    Ok(()) => {
                        subscribed = true;
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(lock = %name, error = %e, "redis: cannot subscribe; re-checking on the fallback timer")
                    }
                }
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                guard.cancel_now().await;
                return Ok(None);
            }
            let mut wake = now + RECHECK;
            if rank == 0 {
                // Head of the queue behind a holder: its lease may simply run out (expiry
                // publishes nothing), so look again right after it would.
                let left = u64::try_from(pttl).unwrap_or(0);
                wake = wake.min(now + Duration::from_millis(left + 1));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                _ = registration.notified() => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            subscribed = self.hub.is_subscribed();
        }
    }

    /// Leaves the queue and deletes the lock if it was granted to `owner`.
    pub(crate) async fn cancel(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        self.give_back(name, owner, false).await
    }

    /// Deletes the lock if it was granted to `owner`, and leaves the queue unless `keep_place`
    /// (a Redlock waiter that lost a split vote keeps its place for its next attempt).
    pub(crate) async fn give_back(
        &self,
        name: &LockName,
        owner: OwnerId,
        keep_place: bool,
    ) -> Result<bool> {
        let keys = Keys::new(&self.prefix, name);
        let call = keys
            .call(&scripts::CANCEL, &[Key::Lock, Key::Queue, Key::Alive])
            .owner_arg(owner)
            .arg(self.client.as_str())
            .arg(self.wakes.as_str())
            .arg(u8::from(keep_place));
        let value = self
            .store
            .eval(&call)
            .await
            .map_err(|e| backend_error("cancel acquire", Some(name), e))?;
        scripts::parse_flag(&value).map_err(|e| protocol_error("cancel acquire", Some(name), e))
    }
}

/// The start of an `extend_many`: a slot per lease, filled now with the error of a lease whose
/// ttl is out of bounds (no I/O for it), and the indices of the leases to send.
pub(crate) fn checked_batch(
    leases: &[(Lease, Duration)],
) -> (Vec<Option<Result<Lease>>>, Vec<usize>) {
    let mut out = Vec::with_capacity(leases.len());
    let mut sent = Vec::with_capacity(leases.len());
    for (i, (_, ttl)) in leases.iter().enumerate() {
        match lockcore::check_ttl(*ttl) {
            Ok(()) => {
                sent.push(i);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    (out, sent)
}

/// Whole milliseconds, at least 1 (ttls are ≥ 10 ms by contract).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
