//! One client of a dialect: its pool and rules, its statements, its configuration and the
//! dialect's own state; and the statements that both a single attempt and the queue run.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{
    AcquireOptions, ClientDefaults, Lease, LockName, OwnerId, Released, Result, WaitMechanism,
};

use crate::common::{Pending, StatementRunner, detached, min_token_of, token};
use crate::config::{Speedup, Speedups, SqlConfig};
use crate::dialect::{SqlDialect, Statements, lease_row_args};
use crate::statement::{Args, Reply, Stmt};
use crate::wake::{Join, Terms, Waiters, Wake, key, local};

/// The lease of a grant to `owner` with fence `fence`, valid from `started` for the ttl of `opts`.
pub(crate) fn granted(
    name: &LockName,
    owner: OwnerId,
    fence: i64,
    started: Instant,
    opts: &AcquireOptions,
) -> Lease {
    let (ttl, drift) = (opts.ttl_value(), opts.drift_value());
    Lease::new(name.clone(), owner, token(fence), started, ttl, drift)
}

/// The handle that marks a permit's lease, so that release and extend find its row.
pub(crate) const PERMIT: &str = "permit";

/// The handle of a permit's lease granted from the queue (others were queued then): its
/// release rings the doorbell of the permit queue's head (see `crate::speedup::doorbell`).
pub(crate) const PERMIT_QUEUED: &str = "permit queued";

/// Whether `lease` is a permit's.
pub(crate) fn is_permit(lease: &Lease) -> bool {
    matches!(lease.handle(), Some(PERMIT | PERMIT_QUEUED))
}

/// The doorbell keys of a store (see `Client::doorbells`).
struct Doorbells {
    lock: Arc<str>,
    permits: Arc<str>,
}

impl Doorbells {
    /// The lock queue's key, or with `permits` the permit queue's.
    fn of(&self, permits: bool) -> &Arc<str> {
        match permits {
            true => &self.permits,
            false => &self.lock,
        }
    }
}

/// The lease of a permit granted to `owner` with fence `fence`, marked as a permit's.
pub(crate) fn permit(
    name: &LockName,
    owner: OwnerId,
    fence: i64,
    started: Instant,
    opts: &AcquireOptions,
) -> Lease {
    granted(name, owner, fence, started, opts).with_handle(PERMIT)
}

/// The handle that marks a reader's lease (a read-write lock's shared side), so that release
/// and extend find its row.
pub(crate) const READ: &str = "read";

/// The handle of a read hold granted from the queue (a writer held or was queued then): its
/// release rings the doorbell of the lock queue's head, a writer waiting for the readers to
/// leave (see `crate::speedup::doorbell`).
pub(crate) const READ_QUEUED: &str = "read queued";

/// Whether `lease` is a reader's.
pub(crate) fn is_read(lease: &Lease) -> bool {
    matches!(lease.handle(), Some(READ | READ_QUEUED))
}

/// The lease of a read hold granted to `owner` with fence `fence`, marked as a reader's.
pub(crate) fn reader(
    name: &LockName,
    owner: OwnerId,
    fence: i64,
    started: Instant,
    opts: &AcquireOptions,
) -> Lease {
    granted(name, owner, fence, started, opts).with_handle(READ)
}

/// The handle that marks a lock's lease granted from the queue (`granted(..).with_handle`):
/// others were queued when it was granted, so its release rings the doorbell of the queue's
/// head (see `crate::speedup::doorbell`). See [`queued`] for the handle that also names that head.
pub(crate) const QUEUED: &str = "queued";

/// The handle of a lock's lease granted from the queue: [`QUEUED`], followed by the ticket of
/// the waiter left at the head when the grant's statement says (`queued 42`), which its
/// release rings without looking the head up.
pub(crate) fn queued(next: Option<i64>) -> std::sync::Arc<str> {
    match next {
        Some(ticket) => format!("{QUEUED} {ticket}").into(),
        None => QUEUED.into(),
    }
}

/// What a lease's handle says of the queue (see [`queued`]): `None` if the lease was not
/// granted from it, else the head's ticket where the grant named one.
fn queued_head(handle: Option<&str>) -> Option<Option<i64>> {
    let rest = handle?.strip_prefix(QUEUED)?;
    match rest.strip_prefix(' ') {
        Some(ticket) => Some(ticket.parse().ok()),
        None => rest.is_empty().then_some(None),
    }
}

/// How long after releasing a lock granted from the queue a waiting acquire of the same name
/// joins the queue at once (see `Client::joins_first`).
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// How many names `Client::joins_first` remembers before it drops the old ones.
const CONTENDED_NAMES: usize = 1024;

/// What one attempt's statement hands back: whether it granted, and how many tries it took (a
/// retry may have followed a lost reply to a grant).
pub(crate) trait Outcome: Send + 'static {
    /// Whether the attempt was granted.
    fn granted(&self) -> bool;
    /// How many tries the statement took.
    fn tries(&self) -> u32;
}

impl Outcome for Reply {
    fn granted(&self) -> bool {
        self.value().is_some()
    }
    fn tries(&self) -> u32 {
        self.tries
    }
}

/// Whether a finished attempt whose caller is gone leaves something to give back: a grant, or a
/// retry whose lost first try may have been granted.
fn undo_needed<T: Outcome>(outcome: &T) -> bool {
    outcome.granted() || outcome.tries() > 1
}

/// What a [`SqlLock`](crate::SqlLock) holds, shared by its clones.
pub(crate) struct Client<D: SqlDialect> {
    pub(crate) runner: StatementRunner<D::Db>,
    pub(crate) sql: Statements,
    pub(crate) table: String,
    pub(crate) redacted: String,
    pub(crate) defaults: ClientDefaults,
    pub(crate) dialect: D,
    /// This process's registry for the store and table (see `crate::wake`): where the
    /// dialect polls, a release made here wakes the waiters here at once; on every dialect, a
    /// permit's release can hand the freed permit to the waiter here nearest the head.
    pub(crate) local: Arc<Waiters>,
    /// Whether waiters poll (no notifications: MySQL, SQLite).
    polls: bool,
    /// Where waiters poll and other processes may share the store: the keys of the store's
    /// doorbells (see `crate::speedup::doorbell`), the lock queue's ([`local`]'s key) and the
    /// permit queue's (its tickets are another table's, so its addresses must differ).
    doorbells: Option<Doorbells>,
    /// The names whose lock this client last released from a grant out of the queue, and when
    /// (see [`joins_first`](Self::joins_first)).
    contended: std::sync::Mutex<std::collections::HashMap<LockName, Instant>>,
    /// The speed-ups in use (see `crate::speedup`; the doorbells are [`doorbells`]).
    ///
    /// [`doorbells`]: Self::doorbells
    pub(crate) speedups: Speedups,
    /// The background deletes of the waiter rows of holders that a release handed the lock
    /// to, by owner id, while they run (see `Client::dequeue_later`).
    pub(crate) leaving: std::sync::Mutex<std::collections::HashMap<OwnerId, Leaving>>,
}

/// A background delete of a new holder's waiter rows after a hand-over (see
/// `Client::dequeue_later` in `crate::queue`).
pub(crate) struct Leaving {
    pub(crate) task: tokio::task::JoinHandle<()>,
    /// Set once the rows are deleted.
    pub(crate) deleted: Arc<std::sync::atomic::AtomicBool>,
}

impl<D: SqlDialect> Client<D> {
    /// Connects (see [`SqlLock::connect`](crate::SqlLock::connect)).
    pub(crate) async fn connect(config: &SqlConfig) -> Result<Self> {
        let mut sql = Statements::new::<D>(&config.table);
        let (runner, dialect) = D::connect(config, &mut sql).await?;
        // The URL without its options (credentials are redacted already) and the table.
        let store = config.redacted.split('?').next().unwrap_or_default();
        let polls = D::WAIT == WaitMechanism::Poll;
        let store = format!("{store}#{}", config.table);
        let local = local(&store);
        let ring = config.speedups.contains(Speedup::Doorbell);
        let doorbells = (ring && polls && dialect.shared_across_processes()).then(|| Doorbells {
            permits: format!("{store}#permits").into(),
            lock: store.into(),
        });
        Ok(Client {
            runner,
            sql,
            table: config.table.clone(),
            redacted: config.redacted.clone(),
            defaults: config.defaults.clone(),
            dialect,
            local,
            polls,
            doorbells,
            contended: Default::default(),
            speedups: config.speedups,
            leaving: Default::default(),
        })
    }

    /// Subscribes `waiter` to the wake-ups of `name` (the lock, or with `permits` the
    /// semaphore), before its first look at the rows: the dialect's notifications, or where it
    /// polls, the releases made in this process. A permit waiter is also registered here for a
    /// release of this process to hand it a permit.
    pub(crate) fn wake(&self, name: &LockName, waiter: OwnerId, permits: bool) -> Wake {
        let key = key(name.as_str(), permits);
        if self.polls {
            return self.local.register(&key, Some(waiter)).into_wake(None);
        }
        let wake = self.dialect.wake(name, waiter, permits);
        match permits {
            true => wake.with_hand_over(&self.local, &key, waiter),
            false => wake,
        }
    }

    /// Records where `waiter` (registered with [`wake`](Self::wake)) joined the queue, when
    /// that join was sent and the secret it stored, and a permit waiter's `terms`, so that this
    /// process's releases wake (where the dialect polls) or hand a permit to the nearest to the
    /// head, and the dialect can tell a hand-over's notification for this join (see
    /// [`SqlDialect::joined`]).
    pub(crate) fn joined(
        &self,
        name: &LockName,
        waiter: OwnerId,
        permits: bool,
        join: Join,
        terms: Option<Terms>,
    ) {
        let key = key(name.as_str(), permits);
        self.local.joined(&key, waiter, join, terms);
        if !permits {
            self.dialect.joined(name, waiter, join);
        }
    }

    /// Whether, where the dialect polls, a waiter of this process queued for `name` is nearer
    /// the head than `waiter`: that one's grant or leaving wakes `waiter` (see
    /// [`freed`](Self::freed)), so `waiter` need not poll until then.
    pub(crate) fn behind_another_here(
        &self,
        name: &LockName,
        waiter: OwnerId,
        permits: bool,
    ) -> bool {
        self.polls
            && self
                .local
                .behind_another(&key(name.as_str(), permits), waiter)
    }

    /// Tells this process's waiters on `name` (the lock's and readers', or with `permits` the
    /// semaphore's) that a hold of it ended here or the queue moved, where the dialect polls:
    /// wakes the one queued here nearest to the head (the rest are behind it, and each grant
    /// wakes the next). PostgreSQL's statements notify every process themselves.
    pub(crate) fn freed(&self, name: &LockName, permits: bool) {
        if self.polls {
            self.local.wake_first(&key(name.as_str(), permits));
        }
    }

    /// Releases `lease` with `stmt` (the owner- and fence-checked delete or update of its row)
    /// and, when that freed it, tells this process's waiters of the lock (or with `permits`
    /// the semaphore); see [`freed`](Self::freed).
    pub(crate) async fn release_row(
        &self,
        stmt: &Stmt,
        lease: &Lease,
        permits: bool,
    ) -> Result<Released> {
        let args = lease_row_args(lease).ttl(lease.ttl());
        let freed = self.runner.reply("release", stmt, args).await?;
        // `StatementRunner::run` sends the statement again when the session died before the reply
        // came; if the lost try freed the row, the retry finds nothing, and the lock's row says
        // whether that was this release. (A permit's row goes with its release and with its
        // expiry alike, so a retried permit release that finds nothing stays NotHeld.)
        let freed = freed.count() > 0
            || (freed.tries > 1 && !permits && self.freed_at_fence(lease).await?);
        if !freed {
            return Ok(Released::NotHeld);
        }
        self.released(lease, permits);
        Ok(Released::Released)
    }

    /// The statement that releases the lock's `lease`: for a lease granted from the queue,
    /// the release that hands the row to the queue's head (`Statements::hand`), since others
    /// were likely queued behind it; without the hand-over speed-up, the plain release.
    pub(crate) fn lock_release(&self, lease: &Lease) -> &Stmt {
        match queued_head(lease.handle()) {
            Some(_) if self.speedups.contains(Speedup::HandOver) => &self.sql.hand,
            _ => &self.sql.release,
        }
    }

    /// Whether the lock's row is free at `lease`'s fence: after a release of `lease` that was
    /// sent again and freed nothing, whether its lost first try freed it (see
    /// `Statements::freed_at_fence`). A `forget` of the free row, or a takeover and its
    /// release, in between make it `false`, and the release reports NotHeld as before; so does
    /// a lost try that handed the row over (`Statements::hand`), which leaves it as a
    /// takeover would.
    pub(crate) async fn freed_at_fence(&self, lease: &Lease) -> Result<bool> {
        let reply = self
            .runner
            .reply("release", &self.sql.freed_at_fence, lease_row_args(lease));
        Ok(reply.await?.count() > 0)
    }

    /// After `lease` was freed: tells this process's waiters (see [`freed`](Self::freed))
    /// and, for a lease granted from the queue, rings the doorbell of the queue's head (see
    /// [`ring_head`](Self::ring_head)).
    pub(crate) fn released(&self, lease: &Lease, permits: bool) {
        let (name, owner) = (lease.name(), lease.owner());
        self.freed(name, permits);
        match lease.handle() {
            Some(PERMIT_QUEUED) => self.ring_head(name, owner, None, true),
            Some(READ_QUEUED) => self.ring_head(name, owner, None, false),
            handle => {
                if let Some(head) = queued_head(handle) {
                    self.ring_head(name, owner, head, false);
                    self.note_contended(lease);
                }
            }
        }
    }

    /// Where the dialect has doorbells (see `crate::speedup::doorbell`): rings the doorbell of
    /// `head` (the waiter the grant left at the head of `name`'s queue, or with `permits` of its
    /// permit queue) or, when there is none or nobody is bound there any more, looks up the live
    /// head in the background and rings that. Best effort: an error only leaves the head to its
    /// polling.
    pub(crate) fn ring_head(
        &self,
        name: &LockName,
        owner: OwnerId,
        head: Option<i64>,
        permits: bool,
    ) {
        let Some(key) = self.doorbells.as_ref().map(|b| b.of(permits)) else {
            return;
        };
        if head.is_some_and(|ticket| crate::speedup::doorbell::ring(key, ticket)) {
            return;
        }
        let key = key.clone();
        let head = match permits {
            true => self.sql.permits.head.clone(),
            false => self.sql.head.clone(),
        };
        let (runner, name) = (self.runner.clone(), name.clone());
        tokio::spawn(async move {
            let args = Args::of(&name).owner(owner);
            match runner.reply("look up the head", &head, args).await {
                Ok(reply) => {
                    if let Some(ticket) = reply.value() {
                        crate::speedup::doorbell::ring(&key, ticket);
                    }
                }
                Err(e) => tracing::debug!(lock = %name, error = %e, "no doorbell rung"),
            }
        });
    }

    /// Remembers that `lease`, granted from the queue, was just released (see
    /// [`joins_first`](Self::joins_first)).
    pub(crate) fn note_contended(&self, lease: &Lease) {
        let mut contended = self
            .contended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if contended.len() >= CONTENDED_NAMES {
            contended.retain(|_, at| at.elapsed() < CONTENDED_FOR);
        }
        contended.insert(lease.name().clone(), Instant::now());
    }

    /// Whether a waiting acquire of `name`'s lock should join the queue without its plain
    /// attempt first: this client released a lock of the name granted from the queue within
    /// [`CONTENDED_FOR`], so others are most likely still queued and the attempt, refused while
    /// they are, would only be one more write (on SQLite one more turn of the file's one
    /// writer, taken when the head's grant needs it). Joining first costs an uncontended
    /// acquire two more statements, once.
    pub(crate) fn joins_first(&self, name: &LockName) -> bool {
        let mut contended = self
            .contended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        contended
            .remove(name)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// How this client's waiters learn of a release, as its capabilities say: the dialect's
    /// notifications; where the dialect polls and other processes share the store, doorbells
    /// between the processes of a Linux host (`crate::speedup::doorbell`), polling for waiters
    /// elsewhere; or polling alone.
    pub(crate) fn waiting(&self) -> WaitMechanism {
        if self.doorbells.is_some() && cfg!(target_os = "linux") {
            WaitMechanism::Doorbell
        } else {
            D::WAIT
        }
    }

    /// Binds the doorbell of the waiter with `ticket` in the lock's queue (with `permits`, the
    /// permit queue) where the dialect has doorbells (see `crate::speedup::doorbell`).
    pub(crate) fn doorbell(
        &self,
        ticket: i64,
        permits: bool,
    ) -> Option<crate::speedup::doorbell::Doorbell> {
        crate::speedup::doorbell::Doorbell::bind(self.doorbells.as_ref()?.of(permits), ticket)
    }

    /// One attempt (`DistributedLock::try_acquire`), also a waiting acquire's first.
    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let min_token = min_token_of(D::BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let ttl = opts.ttl_value();
        // The acquire statement; its reply counts the tries.
        let statement = {
            let (client, name) = (self.clone(), name.clone());
            async move {
                let args = Args::of(&name).owner(owner).ttl(ttl).min_token(min_token);
                client
                    .runner
                    .reply("acquire", &client.sql.acquire, args)
                    .await
            }
        };
        let give_back = || self.release_later(name, owner);
        let reply = self.attempt_once(name, statement, give_back).await?;
        let fence = reply.value();
        Ok(fence.map(|fence| granted(name, owner, fence, started, opts)))
    }

    /// One attempt as every `try` runs it (the lock's, a permit's, a read hold's): `statement`
    /// runs detached (`common::detached`) with `give_back` armed, so a caller that goes away
    /// leaves nothing granted behind. A retry that was not granted gives back what its first try,
    /// whose reply was lost, may have been granted: a waiting acquire goes on with the same owner
    /// id when the caller chose it. (A retry after SQLite's "database is locked" cannot have run
    /// the first try; giving back then finds nothing.)
    pub(crate) async fn attempt_once<T: Outcome>(
        &self,
        name: &LockName,
        statement: impl Future<Output = Result<T>> + Send + 'static,
        give_back: impl Fn() -> Pending<bool>,
    ) -> Result<T> {
        let cleanup = CleanupGuard::arm(D::BACKEND, name, give_back(), Undo::Spawn);
        let undo = give_back();
        let outcome = detached(D::BACKEND, name, statement, undo_needed::<T>, undo).await?;
        if outcome.tries() > 1 && !outcome.granted() {
            give_back().await?;
        }
        let _done = cleanup.disarm();
        Ok(outcome)
    }

    /// Frees `name`'s row if `owner` holds it, whatever the fence (the clean-up after an
    /// interrupted acquire: the fence is unknown). Whether a lease was freed.
    pub(crate) async fn release_owner(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let args = Args::of(name).owner(owner);
        let reply = self.runner.reply("release", &self.sql.release_owner, args);
        let freed = reply.await?.count() > 0;
        if freed {
            self.freed(name, false);
        }
        Ok(freed)
    }

    /// [`release_owner`](Self::release_owner) as an undo: a future that owns what it needs and
    /// does nothing until it is polled.
    fn release_later(self: &Arc<Self>, name: &LockName, owner: OwnerId) -> Pending<bool> {
        let (client, name) = (self.clone(), name.clone());
        Box::pin(async move { client.release_owner(&name, owner).await })
    }
}
