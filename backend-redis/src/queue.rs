//! Acquiring on one server: single attempts and the fair (FIFO) waiting acquire, each with an
//! armed [`CleanupGuard`] that undoes an acquire whose caller went away. The same two functions
//! take a lock, a read hold of the lock (its read-write form: readers queue in the lock's own
//! queue, marked as readers), or a permit of the semaphore of the same name ([`Hold`]): the
//! semaphore has a queue of its own with the same layout, its own scripts, and the same wake-up
//! hub. The waiting loop ([`wait`]) serves any layout that queues this way ([`Queued`]): the
//! Tair emulation's hash queues its waiters in the same kind of queue.
//!
//! A waiting acquire joins a queue kept in Redis (a ZSET ordered by an arrival ticket) and
//! refreshes a liveness deadline on every re-check; the acquire script drops waiters whose
//! liveness ran out, so a crashed waiter holds up the queue for at most [`ALIVE`]. The lock is
//! granted only to the live head of the queue, and a `try` attempt never jumps a non-empty
//! queue. Waiters sleep until their release notification (the node's wake-up hub) or a bounded
//! fallback re-check ([`RECHECK`]), never by polling in a tight loop.
//!
//! [`ALIVE`]: crate::node::ALIVE

use std::future::Future;
use std::time::{Duration, Instant};

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{AcquireOptions, Lease, LockName, OwnerId, Result};

use crate::BACKEND;
use crate::node::{self, AcquireReply, AttemptReply, Mode, Node, RECHECK};

/// What an acquire takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The lock of the name (the write lock of its read-write form).
    Lock,
    /// A shared (read) hold of the lock of the name.
    Read,
    /// A permit of the semaphore of the name, which has this many.
    Permit(u32),
}

impl Hold {
    /// One run of this hold's acquire script for `owner` in `mode` (a lock's `try` takes the
    /// short fast script first); `queued`: an earlier attempt was answered with a place in the
    /// queue (only a permit can have been handed over since).
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        self,
        node: &Node,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        queued: bool,
    ) -> Result<AttemptReply> {
        let now = match (self, mode) {
            (Hold::Lock, Mode::Try) => return node.try_attempt(name, owner, opts, min_token).await,
            (Hold::Lock, _) => node.acquire(name, owner, opts, mode, min_token).await?,
            (Hold::Read, _) => {
                node.acquire_shared(name, owner, opts, mode, min_token)
                    .await?
            }
            (Hold::Permit(n), _) => {
                return node
                    .acquire_permit(name, owner, opts, mode, min_token, n, queued)
                    .await;
            }
        };
        Ok(AttemptReply::Now(now))
    }

    /// The lease of a grant with `token`, valid from `started`; a permit's carries
    /// [`node::PERMIT`], which routes its release and extend to the semaphore's scripts, and a
    /// reader's [`node::READER`], which routes them to the lock's read holds.
    fn lease(
        self,
        name: &LockName,
        owner: OwnerId,
        token: u64,
        started: Instant,
        opts: &AcquireOptions,
    ) -> Lease {
        let lease = node::lease(name, owner, token, started, opts);
        match self {
            Hold::Lock => lease,
            Hold::Read => lease.with_handle(node::READER),
            Hold::Permit(_) => lease.with_handle(node::PERMIT),
        }
    }
}

/// One waiter-mode attempt's outcome, whatever the layout.
pub(crate) enum Step {
    /// Granted: the lease.
    Granted(Lease),
    /// Not granted.
    Waiting {
        /// How long the hold in the way lasts unless released, ms (negative: none).
        pttl: i64,
        /// The waiter's place in the queue (0: the head).
        rank: i64,
    },
}

/// A lock layout whose waiters queue in a node's FIFO queue (see `node/lua/common.lua`) and are
/// woken through the node's hub: this crate's own holds ([`OnNode`]) and the Tair emulation.
pub(crate) trait Queued: Clone + Send + Sync + 'static {
    /// The backend name in errors.
    const BACKEND: &'static str;

    /// The node whose hub wakes the waiters.
    fn node(&self) -> &Node;

    /// One attempt for `owner` in `mode` (a grant's lease is valid from `started`). `queued`:
    /// when the owner's last attempt that was answered with a place in the queue started, if
    /// one was; a grant a release handed over meanwhile is valid from then.
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        started: Instant,
        queued: Option<Instant>,
    ) -> impl Future<Output = Result<Step>> + Send;

    /// The lease of a grant a release handed to `owner` with `token` and told it of through
    /// the hub ([`Registration::handed`](node::Registration::handed)), valid from `since` (the
    /// owner's last attempt answered with a place in the queue); `None` for a layout whose
    /// releases never hand over (the waiter then re-checks as for any wake-up).
    fn handed(
        &self,
        name: &LockName,
        owner: OwnerId,
        token: u64,
        since: Instant,
        opts: &AcquireOptions,
    ) -> Option<Lease> {
        let _ = (name, owner, token, since, opts);
        None
    }

    /// Undoes what an attempt of `owner` may have left: its queue entry, a grant it never
    /// returned. Builds the requests now and sends them when polled.
    fn undo(self, name: LockName, owner: OwnerId) -> Undo;
}

/// A hold of this crate's layout on one node.
#[derive(Clone)]
pub(crate) struct OnNode {
    node: Node,
    hold: Hold,
}

impl Queued for OnNode {
    const BACKEND: &'static str = BACKEND;

    fn node(&self) -> &Node {
        &self.node
    }

    async fn attempt(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        started: Instant,
        queued: Option<Instant>,
    ) -> Result<Step> {
        let reply = self
            .hold
            .attempt(
                &self.node,
                name,
                owner,
                opts,
                mode,
                min_token,
                queued.is_some(),
            )
            .await?;
        Ok(match reply {
            AttemptReply::Now(AcquireReply::Granted(token)) => {
                Step::Granted(self.hold.lease(name, owner, token, started, opts))
            }
            AttemptReply::Plain(token) => Step::Granted(node::plain(
                self.hold.lease(name, owner, token, started, opts),
            )),
            AttemptReply::Now(AcquireReply::Waiting { pttl, rank, .. }) => {
                Step::Waiting { pttl, rank }
            }
            // The script hands over only to an owner that says it was queued.
            AttemptReply::Handed(token) => {
                Step::Granted(
                    self.hold
                        .lease(name, owner, token, queued.unwrap_or(started), opts),
                )
            }
        })
    }

    fn handed(
        &self,
        name: &LockName,
        owner: OwnerId,
        token: u64,
        since: Instant,
        opts: &AcquireOptions,
    ) -> Option<Lease> {
        matches!(self.hold, Hold::Permit(_))
            .then(|| self.hold.lease(name, owner, token, since, opts))
    }

    fn undo(self, name: LockName, owner: OwnerId) -> Undo {
        leave((self.node, name, owner, self.hold))
    }
}

/// What an acquire of `owner` on a node may have left there (the state of its clean-up guard).
type Attempt = (Node, LockName, OwnerId, Hold);

/// Leaves the queue and deletes the lock (or frees the read hold or the permit) if it was
/// granted to the owner
/// (the undo of an acquire that did not return its lease).
fn leave((node, name, owner, hold): Attempt) -> Undo {
    Undo::Spawn(Box::pin(async move {
        match hold {
            Hold::Lock => node.cancel(&name, owner).await,
            Hold::Read => node.cancel_shared(&name, owner).await,
            Hold::Permit(_) => node.cancel_permit(&name, owner).await,
        }
    }))
}

/// One attempt at `hold` that never jumps the queue.
pub(crate) async fn try_acquire(
    node: &Node,
    name: &LockName,
    opts: &AcquireOptions,
    hold: Hold,
) -> Result<Option<Lease>> {
    let started = Instant::now();
    let min_token = node::min_token_arg(BACKEND, opts)?;
    let owner = opts.owner_or_random();
    // Until the reply is in: a dropped or failed request may still have granted the lock.
    let attempt = (node.clone(), name.clone(), owner, hold);
    let guard = CleanupGuard::arm(BACKEND, name, attempt, leave);
    let reply = hold
        .attempt(node, name, owner, opts, Mode::Try, min_token, false)
        .await?;
    let _ = guard.disarm();
    Ok(match reply {
        AttemptReply::Now(AcquireReply::Granted(token)) => {
            Some(hold.lease(name, owner, token, started, opts))
        }
        AttemptReply::Plain(token) => {
            Some(node::plain(hold.lease(name, owner, token, started, opts)))
        }
        AttemptReply::Now(AcquireReply::Waiting { .. }) => None,
        AttemptReply::Handed(_) => return Err(node::handed_to_a_try(name)),
    })
}

/// Queues for `hold` and waits for its turn, until `deadline`.
pub(crate) async fn acquire_wait(
    node: &Node,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
    hold: Hold,
) -> Result<Option<Lease>> {
    let on = OnNode {
        node: node.clone(),
        hold,
    };
    wait(&on, name, opts, deadline).await
}

/// The clean-up of a waiting acquire on `Q`'s layout.
fn undo_of<Q: Queued>((q, name, owner): (Q, LockName, OwnerId)) -> Undo {
    q.undo(name, owner)
}

/// Queues on `q`'s layout and waits for the turn, until `deadline`.
pub(crate) async fn wait<Q: Queued>(
    q: &Q,
    name: &LockName,
    opts: &AcquireOptions,
    deadline: Option<Instant>,
) -> Result<Option<Lease>> {
    let min_token = node::min_token_arg(Q::BACKEND, opts)?;
    let owner = opts.owner_or_random();
    let waiter = owner.to_string();
    let node = q.node();
    // Registered before the first request, so a wake-up that names us is never dropped.
    let (registration, mut subscribed) = node.register(&waiter, name);
    let guard = CleanupGuard::arm(
        Q::BACKEND,
        name,
        (q.clone(), name.clone(), owner),
        undo_of::<Q>,
    );
    // When the last attempt answered with a place in the queue started: a permit a release
    // hands over meanwhile is valid from then (the release ran after that attempt).
    let mut queued: Option<Instant> = None;
    loop {
        let started = Instant::now();
        let step = q.attempt(name, owner, opts, Mode::Wait, min_token, started, queued);
        let (pttl, rank) = match step.await? {
            Step::Granted(lease) => {
                let _ = guard.disarm();
                return Ok(Some(lease));
            }
            Step::Waiting { pttl, rank } => (pttl, rank),
        };
        queued = Some(started);
        if !subscribed {
            // Subscribe, then check again at once: a release between the attempt above and
            // the subscription is caught by that second attempt.
            match node.ensure_subscribed(name).await {
                Ok(()) => {
                    subscribed = true;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(backend = Q::BACKEND, lock = %name, error = %e, "cannot subscribe; re-checking on the fallback timer")
                }
            }
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            if let Err(e) = guard.run_now().await {
                tracing::warn!(backend = Q::BACKEND, lock = %name, error = %e, "leaving the wait queue failed; the entry expires on its own");
            }
            return Ok(None);
        }
        let mut wake = now + RECHECK;
        if rank == 0 {
            // Head of the queue behind a holder (a writer behind readers: the last of them; for
            // a permit, behind full permits): its lease may simply run out (expiry publishes
            // nothing), so look again right after it would.
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
        if let Some(token) = registration.handed()
            && let Some(lease) = q.handed(name, owner, token, started, opts)
        {
            let _ = guard.disarm();
            return Ok(Some(lease));
        }
        subscribed = node.is_subscribed(name);
    }
}
