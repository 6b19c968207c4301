//! What sets the three databases apart, behind one trait: their SQL text and its parameters,
//! error classes, connecting, and how a waiter learns of a release. Each statement that differs
//! is a method of [`SqlDialect`]; those that read the same everywhere but for the clock and the
//! interval arithmetic are the methods' defaults, or are written once in [`Statements::new`].

use std::future::Future;
use std::time::{Duration, Instant};

use lockcore::{Error, Lease, LockName, OwnerId, Result, WaitMechanism};
use sqlx::error::DatabaseError;
use sqlx::{Connection, Database};

use crate::common::{Class, StatementRunner};
use crate::config::{SqlConfig, WithTls};
use crate::speedup::connection_cache::ConnectionCache;
use crate::statement::{Args, Sql, SqlDb, Stmt, Style};
use crate::wake::{Join, Wake};

pub mod mysql;
mod permits;
pub mod postgres;
mod reads;
pub mod sqlite;

pub use permits::{PermitRoutines, PermitStatements, PermitTemplates, recorded};
pub use reads::{READERS_OWNER, ReadStatements};

/// One database's side of [`SqlLock`](crate::SqlLock). (Not [`crate::Dialect`], the enum a
/// URL's scheme picks.)
pub trait SqlDialect: Send + Sync + Sized + 'static {
    /// The sqlx driver.
    type Db: SqlDb;
    /// The backend name in capabilities, errors and logs.
    const BACKEND: &'static str;
    /// The client type's name, for `Debug`.
    const CLIENT: &'static str;
    /// How waiters learn of a release.
    const WAIT: WaitMechanism = WaitMechanism::Poll;
    /// How statements write and bind their parameters.
    const STYLE: Style;
    /// The database's clock, as `expires_at` holds it.
    const NOW: &'static str;
    /// Creates the lease table `{t}`, the waiters table `{w}` (named `{q}` unquoted), the
    /// semaphores table `{s}`, the permit holders table `{p}` and the permit waiters table `{v}`
    /// (named `{vq}` unquoted), and any index, in this order.
    const CREATE: &[&str];
    /// The text, sent on the plain protocol in one round trip, that begins a semaphore or
    /// reader transaction where a plain `BEGIN` will not do (MySQL: `SET TRANSACTION ISOLATION
    /// LEVEL READ COMMITTED; START TRANSACTION`, so that each statement of it reads what
    /// committed before the statement, as on PostgreSQL).
    const TX_BEGIN: Option<&'static str> = None;
    /// Run first inside a transaction that a crash may lose without harm (joining a queue: a
    /// waiter whose row is gone joins again), so its commit does not wait for the disk
    /// (PostgreSQL: `SET LOCAL synchronous_commit = off`, as the lock's own enqueue does).
    const RELAXED_COMMIT: Option<&'static str> = None;
    /// SQLSTATEs with which `CREATE TABLE IF NOT EXISTS` fails when it raced another client's;
    /// running it again then finds the table.
    const CREATE_RACES: &[&str] = &[];
    /// Whether a read costs no round trip (SQLite: the database is in the process). A single
    /// attempt at a permit then looks at the semaphore first and is refused without taking the
    /// write turn when it is full or has waiters, so on a busy semaphore the woken head's grant
    /// does not queue behind the refused tries of clients that have just released.
    const LOCAL_READS: bool = false;
    /// Whether a hand-over (`Statements::hand`) also deletes the new owner's waiter row
    /// (SQLite's triggers, PostgreSQL's statement); otherwise the new owner deletes it once it
    /// has found the grant (MySQL, see `crate::speedup::background_dequeue`).
    const HAND_DEQUEUES: bool = false;
    /// Whether a waiter's grant (`Statements::wait_acquire`) also deletes its waiter row
    /// (SQLite's triggers, PostgreSQL's statement); otherwise the new owner deletes it
    /// (`Statements::dequeue`) before its acquire returns (MySQL).
    const GRANT_DEQUEUES: bool = false;
    /// Whether the waiter's attempt (`Statements::wait_acquire`) itself reports a live row
    /// already the waiter's (PostgreSQL), so that it needs no read-only look first
    /// (`Statements::waiter_look`, `Statements::own_row_look`).
    const ATTEMPT_LOOKS: bool = false;

    /// `$ttl` from now, as an `expires_at` value.
    fn expiry() -> String {
        format!("{} + $ttl", Self::NOW)
    }

    /// The microseconds from `now` until `at`.
    fn micros_between(now: &str, at: &str) -> String;

    /// How a statement that failed with the server's error `db` should be handled.
    fn classify(db: &dyn DatabaseError) -> Class;

    /// Opens the client's pool and creates the tables (`sql.create`), then drops expired waiter
    /// rows (best effort); returns the pool's rules and the dialect's own state. It may adapt
    /// `sql` to what the server and the account allow (MySQL's stored procedures).
    fn connect(
        config: &SqlConfig,
        sql: &mut Statements,
    ) -> impl Future<Output = Result<(StatementRunner<Self::Db>, Self)>> + Send;

    /// One attempt (`try_acquire`, a waiting acquire's first): takes the row if it is free,
    /// expired or already ours and no live waiter is queued, setting the fence to
    /// `GREATEST(fence + 1, $min_token)`; hands back the fence if granted.
    fn acquire(s: &Sql) -> Stmt;

    /// A queued waiter's attempt: as [`acquire`](Self::acquire), but only when no live waiter
    /// with a smaller ticket is queued.
    fn wait_acquire(s: &Sql) -> Stmt;

    /// Writes the semaphore row of `$name`, inserting it if new: the first statement of every
    /// semaphore transaction, which takes the row's lock (PostgreSQL, MySQL) or the database's
    /// write lock (SQLite) until the transaction ends. With `bump`, it sets the fence to
    /// `GREATEST(fence + 1, $min_token)` (a new row: `GREATEST(1, $min_token)`) and hands it back
    /// as its value; without, it leaves the fence as it is (a new row: 0).
    fn semaphore_lock(s: &Sql, bump: bool) -> Stmt;

    /// The first statement of a reader's grant transaction: inserts the lease row of `$name`
    /// if missing (free: owner NULL, fence `GREATEST(1, $min_token)`), else sets its fence to
    /// `GREATEST(fence + 1, $min_token)`, which takes the row's lock (PostgreSQL, MySQL) or the
    /// database's write lock (SQLite) until the transaction ends; hands the fence back as its
    /// value. Writers (the mutex's single-statement acquire) write the same row, so they and
    /// the reader's transaction take turns.
    fn lease_bump(s: &Sql) -> Stmt;

    /// The text of [`Statements::hand`], given the query `next` (one row, one column: the
    /// waiter to hand the row to, or NULL to free it), run once, and `held`, the release's
    /// condition on the row. By default `UPDATE .. FROM`, whose assignments all read the row
    /// as it was.
    fn hand(s: &Sql, next: &str, held: &str) -> Stmt {
        s.done(&format!(
            "UPDATE {t} SET owner = n.next, \
             fence = CASE WHEN n.next IS NULL THEN fence ELSE fence + 1 END, \
             expires_at = CASE WHEN n.next IS NULL THEN expires_at ELSE {expiry} END \
             FROM (SELECT ({next}) AS next) AS n WHERE {held}",
            t = s.leases,
            expiry = Self::expiry(),
        ))
    }

    /// [`Statements::enqueue`]: joins the lock queue's tail (liveness in `$ttl`); hands back
    /// the ticket.
    fn enqueue(s: &Sql) -> Stmt {
        s.insert_returning(
            &format!(
                "INSERT INTO {} (name, waiter, expires_at) VALUES ($name, $owner, {})",
                s.waiters,
                Self::expiry()
            ),
            "ticket",
        )
    }

    /// [`Statements::refresh`] of the lock queue.
    fn refresh(s: &Sql) -> Stmt {
        refresh::<Self>(s, &s.waiters)
    }

    /// [`Statements::release`]: frees a live row of `$owner` with `$fence`.
    fn release(s: &Sql) -> Stmt {
        s.done(&format!(
            "UPDATE {} SET owner = NULL WHERE {}",
            s.leases,
            live_hold::<Self>()
        ))
    }

    /// [`Statements::release_owner`]: frees `$owner`'s row whatever its fence.
    fn release_owner(s: &Sql) -> Stmt {
        s.done(&format!(
            "UPDATE {} SET owner = NULL WHERE name = $name AND owner = $owner",
            s.leases
        ))
    }

    /// [`Statements::leave`]: leaving the lock queue in one statement, where the dialect has
    /// one (none by default: a dequeue, then a release by owner).
    fn leave(_s: &Sql) -> Option<Stmt> {
        None
    }

    /// [`ReadStatements::notify`]: wakes `$name`'s waiters when a reader changes what they
    /// wait for (none by default: waiters poll).
    fn reader_notify(_s: &Sql) -> Option<Stmt> {
        None
    }

    /// [`PermitStatements::leave`]: leaving the permit queue in one statement, where the
    /// dialect has one.
    fn permit_leave(_s: &Sql) -> Option<Stmt> {
        None
    }

    /// The semaphore's transactions as server-side routines created with the tables, where the
    /// dialect always has them (PostgreSQL's functions; MySQL's procedures depend on the
    /// account and are installed when it connects).
    fn permit_routines(_s: &Sql) -> Option<PermitRoutines> {
        None
    }

    /// Whether other processes see the same locks.
    fn shared_across_processes(&self) -> bool {
        true
    }

    /// Subscribes `waiter` to release notifications for `name` (the lock, or with `permits` the
    /// semaphore), before its first look at the rows. Where the dialect can, a lock's release
    /// wakes only the queue's head.
    fn wake(&self, _name: &LockName, _waiter: OwnerId, _permits: bool) -> Wake {
        Wake::default()
    }

    /// Records that `waiter`, subscribed to `name`'s lock with [`wake`](Self::wake), joined the
    /// queue (PostgreSQL: so that a hand-over's notification naming that join's ticket, with the
    /// tag of its secret, can be taken as a grant made after the join was sent).
    fn joined(&self, _name: &LockName, _waiter: OwnerId, _join: Join) {}

    /// `DistributedLock::wait_for_release`: by default a sleep until `until` (polling).
    fn wait_for_release(
        &self,
        _core: &StatementRunner<Self::Db>,
        _sql: &Statements,
        _name: &LockName,
        until: Instant,
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            tokio::time::sleep_until(until.into()).await;
            Ok(())
        }
    }

    /// Keep-alive's batch of extends (each ttl already checked): whether each lease's row was
    /// extended. By default the extends in one transaction on one connection: one commit (one
    /// log flush) for the whole batch.
    fn extend_batch(
        &self,
        runner: &StatementRunner<Self::Db>,
        sql: &Statements,
        batch: &[(&Lease, Duration)],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send {
        let args: Vec<Args<'_>> = batch
            .iter()
            .map(|(l, ttl)| lease_row_args(l).ttl(*ttl))
            .collect();
        async move {
            let done = runner
                .each_in_transaction("extend", &sql.extend, &args)
                .await?;
            Ok(done.into_iter().map(|n| n == 1).collect())
        }
    }

    /// Stops what the dialect runs besides the pool (PostgreSQL's listener).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A lease's fence as the signed column holds it.
pub fn fence_of(lease: &Lease) -> i64 {
    i64::try_from(lease.token().0).unwrap_or(i64::MAX)
}

/// The values that name `lease`'s row: name, owner and fence.
pub fn lease_row_args(lease: &Lease) -> Args<'_> {
    Args::of(lease.name())
        .owner(lease.owner())
        .fence(fence_of(lease))
}

/// The ticket of the live waiter other than `$owner` at the head of `$name`'s queue in the
/// waiters table `queue` (the lock's or the semaphore's), a query that also serves as a
/// subquery: the doorbell a release rings (see `crate::speedup::doorbell`).
pub fn head_of<D: SqlDialect>(queue: &str) -> String {
    format!(
        "SELECT ticket FROM {queue} WHERE name = $name AND waiter <> $owner \
         AND expires_at > {} ORDER BY ticket LIMIT 1",
        D::NOW
    )
}

/// [`Statements::hand`] for dialect `D`: [`SqlDialect::hand`] with `next`, the queue's first live
/// waiter (but the releaser) when it is a writer (no reader's mark) refreshed within
/// [`HAND_FRESH`], else NULL; `held` is the release's condition on the row.
fn hand<D: SqlDialect>(s: &Sql, held: &str) -> Stmt {
    let (w, r, now) = (&s.waiters, &s.readers, D::NOW);
    let fresh = HAND_FRESH.as_micros();
    let next = format!(
        "SELECT CASE WHEN {} > {fresh} AND NOT EXISTS (SELECT 1 FROM {r} AS m \
         WHERE m.name = w.name AND m.owner = w.waiter) THEN w.waiter END \
         FROM {w} AS w WHERE w.name = $name AND w.waiter <> $owner AND w.expires_at > {now} \
         ORDER BY w.ticket LIMIT 1",
        D::micros_between(now, "w.expires_at")
    );
    D::hand(s, &next, held)
}

/// A live row of `$owner` with `$fence` for `$name`: the condition of every release and extend
/// of a lease (the lock's row, a permit's, a reader's) and of a hand-over.
pub fn live_hold<D: SqlDialect>() -> String {
    format!(
        "name = $name AND owner = $owner AND fence = $fence AND expires_at > {}",
        D::NOW
    )
}

/// Moves the liveness of waiter `$owner`'s row `$ticket` in the waiters table `queue` ahead,
/// if it is still live (a lapsed waiter joins again instead).
pub fn refresh<D: SqlDialect>(s: &Sql, queue: &str) -> Stmt {
    s.done(&format!(
        "UPDATE {queue} SET expires_at = {} \
         WHERE ticket = $ticket AND name = $name AND waiter = $owner AND expires_at > {}",
        D::expiry(),
        D::NOW
    ))
    .keeping()
}

/// `$owner`'s smallest live ticket in the waiters table `queue`, if any: what a retried join
/// hands back instead of joining again (see `statement::rejoin`).
pub fn own_ticket<D: SqlDialect>(queue: &str) -> String {
    format!(
        "SELECT MIN(ticket) FROM {queue} WHERE name = $name AND waiter = $owner \
         AND expires_at > {}",
        D::NOW
    )
}

/// How recently a waiter must have refreshed its liveness to be handed the lock by a release
/// (see [`Statements::hand`]): its row's liveness has more than this left. A live waiter
/// refreshes every second (`queue::REFRESH`) for three (`queue::LIVENESS`), so its row always
/// has more than two seconds left; a waiter that died is handed the lock only in the first
/// 1.5 s after its last refresh, and the lock then stays with it until that lease runs out, as
/// with a holder that dies.
pub const HAND_FRESH: Duration = Duration::from_millis(1500);

/// The statements of one client, built once with the validated table name.
pub struct Statements {
    pub create: Vec<Stmt>,
    /// One `SELECT` of no rows from each table: whether this account can use the tables that
    /// a `CREATE` it may not run would have made (see [`create_tables`]).
    pub probe_tables: Vec<Stmt>,
    /// Expired waiter rows of every name, dropped when a client connects.
    pub gc_queue: Stmt,
    pub acquire: Stmt,
    /// A queued waiter's attempt: the fence if granted, the holder's time left in µs where the
    /// dialect reports it, and, where it says, the ticket of the live waiter left at the head
    /// of the queue after this grant (the doorbell its release rings: see
    /// `crate::speedup::doorbell`); where it looks for itself (no
    /// [`waiter_look`](Self::waiter_look)), the fence and time left in µs of a live row already the
    /// waiter's, which it reports rather than takes again (a hand-over).
    pub wait_acquire: Stmt,
    /// Read-only look before a waiter writes (a reader never waits for SQLite's write lock):
    /// live waiters ahead of it; the holder's time left in µs; where the row is the waiter's
    /// (a release handed it over, see [`hand`](Self::hand)), its fence and its time left in
    /// µs; and the ticket of the live waiter first in line behind it. `None` where
    /// [`wait_acquire`](Self::wait_acquire) looks for itself.
    pub waiter_look: Option<Stmt>,
    /// The look of a waiter that was woken (most likely handed the row, see
    /// [`hand`](Self::hand)): the fence and time left in µs of a live row of `$owner`, and the
    /// ticket of the live waiter first in line behind it; no row if it is not the waiter's.
    /// Lighter than [`waiter_look`](Self::waiter_look), which follows it when it finds nothing.
    /// `None` where there is no `waiter_look`.
    pub own_row_look: Option<Stmt>,
    /// The release of a lease granted from the queue, which hands the row over in the same
    /// statement (see `crate::queue`, "Hand-over"): owner- and fence-checked as
    /// [`release`](Self::release); when the queue's first live waiter is a writer whose
    /// liveness was refreshed within [`HAND_FRESH`], the row becomes that waiter's with the
    /// fence bumped and an expiry `$ttl` (the releaser's ttl) from now, else it is freed.
    pub hand: Stmt,
    /// Joins the queue's tail (liveness in `$ttl`); hands back the ticket.
    pub enqueue: Stmt,
    /// Extends the liveness of the waiter's row with `$ticket`, and only that row: a join
    /// retried after a lost reply may have left another row of `$owner` ahead, which must run
    /// out rather than hold the queue (see `queue::acquire`). Never revives an expired waiter
    /// (it rejoins at the tail).
    pub refresh: Stmt,
    /// The ticket of the queue's live head (see `crate::speedup::doorbell`), if any.
    pub head: Stmt,
    /// `$owner`'s live ticket in the queue, if any (see [`own_ticket`]).
    pub own_ticket: Stmt,
    /// Leaves the queue, dropping expired waiters of the name: after a grant or a hand-over
    /// that did not (see [`SqlDialect::GRANT_DEQUEUES`], [`SqlDialect::HAND_DEQUEUES`]), and
    /// where there is no one-statement [`leave`](Self::leave).
    pub dequeue: Stmt,
    /// Leaves the queue, frees a lease granted to the waiter, and wakes the others, in one
    /// statement that counts the freed leases. `None`: [`dequeue`](Self::dequeue), then
    /// [`release_owner`](Self::release_owner).
    pub leave: Option<Stmt>,
    /// Owner- and fence-checked release. The row stays (the fence must never reset).
    pub release: Stmt,
    /// After a [`release`](Self::release) sent again (its first reply lost) that freed
    /// nothing: whether the row is free at the lease's fence, as only a release of that lease
    /// leaves it (a lease that ran out keeps its owner; a takeover raises the fence). One row:
    /// a count.
    pub freed_at_fence: Stmt,
    /// Release by owner alone: the clean-up after an interrupted acquire (the fence is unknown).
    pub release_owner: Stmt,
    /// Never resurrects an expired row.
    pub extend: Stmt,
    /// Owner, fence, remaining time in µs by the database's clock (read once), live waiters.
    pub inspect: Stmt,
    /// Deletes the row of a name nobody holds or waits for (its fence too: `forget` is only for
    /// names that are never used again).
    pub forget: Stmt,
    /// The name's waiter rows whose liveness ran out.
    pub forget_queue: Stmt,
    /// The statements of counting semaphores.
    pub permits: PermitStatements,
    /// The statements of read-write locks' readers.
    pub reads: ReadStatements,
}

impl Statements {
    /// `D`'s statements for lease table `table`.
    pub fn new<D: SqlDialect>(table: &str) -> Self {
        let s = Sql::new(D::STYLE, table);
        let (t, w, now, expiry) = (&s.leases, &s.waiters, D::NOW, D::expiry());
        let queue = crate::common::queue_table(table);
        let permit_queue = crate::common::aux_table(table, crate::statement::PERMIT_QUEUE);
        let held = live_hold::<D>();
        let routines = D::permit_routines(&s);
        let routine_creates = routines.iter().flat_map(|r| r.create.iter().cloned());
        Statements {
            create: D::CREATE
                .iter()
                .map(|c| {
                    let c = c.replace("{t}", t).replace("{w}", w).replace("{q}", &queue);
                    let c = c
                        .replace("{s}", &s.semaphores)
                        .replace("{p}", &s.permits)
                        .replace("{v}", &s.permit_waiters)
                        .replace("{r}", &s.readers);
                    s.done(&c.replace("{vq}", &permit_queue))
                })
                .chain(routine_creates)
                .collect(),
            probe_tables: [
                t,
                w,
                &s.semaphores,
                &s.permits,
                &s.permit_waiters,
                &s.readers,
            ]
            .iter()
            .map(|table| s.row(&format!("SELECT 1 FROM {table} WHERE 1 = 0")))
            .collect(),
            gc_queue: s.done(&format!("DELETE FROM {w} WHERE expires_at <= {now}")),
            acquire: D::acquire(&s),
            wait_acquire: D::wait_acquire(&s),
            waiter_look: (!D::ATTEMPT_LOOKS).then(|| {
                s.row(&format!(
                    "SELECT (SELECT count(*) FROM {w} AS w \
                 WHERE w.name = $name AND w.ticket < $ticket AND w.waiter <> $owner \
                 AND w.expires_at > {now}), \
                 (SELECT {left} FROM {t} AS l \
                 WHERE l.name = $name AND l.owner IS NOT NULL AND l.owner <> $owner \
                 AND l.expires_at > {now}), \
                 (SELECT l.fence FROM {t} AS l WHERE {mine} AND l.expires_at > {now}), \
                 (SELECT {left} FROM {t} AS l WHERE {mine} AND l.expires_at > {now}), ({})",
                    head_of::<D>(&s.waiters),
                    left = D::micros_between(now, "l.expires_at"),
                    mine = "l.name = $name AND l.owner = $owner",
                ))
            }),
            own_row_look: (!D::ATTEMPT_LOOKS).then(|| {
                s.row(&format!(
                    "SELECT l.fence, {}, ({}) FROM {t} AS l \
                 WHERE l.name = $name AND l.owner = $owner AND l.expires_at > {now}",
                    D::micros_between(now, "l.expires_at"),
                    head_of::<D>(&s.waiters),
                ))
            }),
            hand: hand::<D>(&s, &held),
            enqueue: D::enqueue(&s),
            refresh: D::refresh(&s),
            head: s.row(&head_of::<D>(&s.waiters)),
            own_ticket: s.row(&own_ticket::<D>(&s.waiters)),
            dequeue: s.done(&format!(
                "DELETE FROM {w} WHERE name = $name AND (waiter = $owner OR expires_at <= {now})"
            )),
            leave: D::leave(&s),
            freed_at_fence: s.row(&format!(
                "SELECT count(*) FROM {t} WHERE name = $name AND owner IS NULL AND fence = $fence"
            )),
            release: D::release(&s),
            release_owner: D::release_owner(&s),
            extend: s
                .done(&format!(
                    "UPDATE {t} SET expires_at = {expiry} WHERE {held}"
                ))
                .keeping(),
            inspect: s.row(&format!(
                "SELECT l.owner, l.fence, \
                 CASE WHEN l.owner IS NOT NULL AND l.expires_at > c.now THEN {} END, \
                 (SELECT count(*) FROM {w} AS w WHERE w.name = l.name AND w.expires_at > c.now) \
                 FROM {t} AS l, (SELECT {now} AS now) AS c WHERE l.name = $name",
                D::micros_between("c.now", "l.expires_at")
            )),
            forget: s.done(&format!(
                "DELETE FROM {t} WHERE name = $name AND (owner IS NULL OR expires_at <= {now}) \
                 AND NOT EXISTS (SELECT 1 FROM {w} AS w WHERE w.name = {t}.name \
                 AND w.expires_at > {now})"
            )),
            forget_queue: s.done(&format!(
                "DELETE FROM {w} WHERE name = $name AND expires_at <= {now}"
            )),
            permits: PermitStatements::new::<D>(&s, routines),
            reads: ReadStatements::new::<D>(&s),
        }
    }
}

/// Pooled connections to a server (the PostgreSQL listener has its own).
const POOL_SIZE: u32 = 8;

/// Connect options of dialect `D`.
type Options<D> = <<<D as SqlDialect>::Db as Database>::Connection as Connection>::Options;

/// The connect of a server dialect (PostgreSQL, MySQL) with `opts` from the URL: the TLS files
/// read, a pool of up to 8 connections (idle ones closed after 60 s; two kept out of it between
/// statements, see [`ConnectionCache`]), one connection opened
/// straight away to say at once why the server cannot be used (see
/// [`StatementRunner::connect_once`]), the tables created, and expired waiter rows left by crashed
/// processes dropped (best effort). Returns the options used, TLS files included.
pub async fn connect_server<D: SqlDialect>(
    config: &SqlConfig,
    opts: &Options<D>,
    sql: &Statements,
) -> Result<(StatementRunner<D::Db>, Options<D>)>
where
    Options<D>: WithTls,
{
    let opts = opts.clone().with_tls(config)?;
    let timeout = config.defaults.timeout;
    let pool = sqlx::pool::PoolOptions::<D::Db>::new()
        .max_connections(POOL_SIZE)
        .min_connections(0)
        .acquire_timeout(timeout)
        .idle_timeout(Duration::from_secs(60))
        .test_before_acquire(false)
        .connect_lazy_with(opts.clone());
    let runner = StatementRunner {
        backend: D::BACKEND,
        pool,
        timeout,
        classify: D::classify,
        write_queue: None,
        cache: ConnectionCache::for_speedups(POOL_SIZE, config.speedups),
        lender: None,
    };
    runner.connect_once(&opts).await?;
    create_tables::<D>(&runner, sql).await?;
    Ok((runner, opts))
}

/// Creates the tables through `runner`, running again a `CREATE` that raced another client's (see
/// [`SqlDialect::CREATE_RACES`]), then drops expired waiter rows left by crashed processes (best
/// effort).
///
/// An account that may not create tables (PostgreSQL and MySQL refuse `CREATE TABLE IF NOT
/// EXISTS` without the privilege even when the table is there) can still use tables that an
/// administrator, or a first run with more rights, made: a refused `CREATE TABLE` is passed
/// over when every table then answers a `SELECT`, and its refusal returned when one does not.
/// (PostgreSQL's functions are only created where the database lacks their text, so such an
/// account needs no right for them either, as long as its version's functions are there.)
pub async fn create_tables<D: SqlDialect>(
    runner: &StatementRunner<D::Db>,
    sql: &Statements,
) -> Result<()> {
    let mut refused = None;
    for statement in &sql.create {
        let mut tries = 0;
        while let Err(e) = runner
            .reply("create table", statement, Args::default())
            .await
        {
            let sql = statement.sql.as_str();
            let table = sql.starts_with("CREATE TABLE") || sql.starts_with("CREATE UNLOGGED TABLE");
            if table && matches!(e, Error::AccessDenied { .. }) {
                refused.get_or_insert(e);
                break;
            }
            let raced = matches!(&e, Error::Backend { source, .. } if source
                .downcast_ref::<sqlx::Error>()
                .and_then(|e| e.as_database_error()?.code())
                .is_some_and(|c| D::CREATE_RACES.iter().any(|r| *r == c)));
            tries += 1;
            if !raced || tries >= 10 {
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(5 * tries)).await;
        }
    }
    if let Some(refused) = refused {
        for select in &sql.probe_tables {
            if runner
                .reply("create table", select, Args::default())
                .await
                .is_err()
            {
                return Err(refused);
            }
        }
        tracing::debug!(
            backend = D::BACKEND,
            "may not create tables; using the existing ones"
        );
    }
    for gc in std::iter::once(&sql.gc_queue).chain(&sql.permits.gc_all) {
        let gc = runner.reply("drop expired waiters", gc, Args::default());
        if let Err(e) = gc.await {
            tracing::debug!(backend = D::BACKEND, error = %e, "dropping expired rows failed");
        }
    }
    Ok(())
}
