//! PostgreSQL: lease rows, `INSERT .. ON CONFLICT DO UPDATE .. WHERE expired RETURNING fence`,
//! a FIFO queue of waiter rows (see [`crate::queue`]) whose head is granted and dequeued in one
//! statement, and waiters woken by LISTEN/NOTIFY over one listener connection per client
//! ([`listen`]).

mod listen;
mod routines;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{Error, Lease, LockName, OwnerId, Result, WaitMechanism};
use sqlx::error::DatabaseError;
use sqlx::{SqlSafeStr, SqlStr};

use super::{PermitRoutines, SqlDialect, Statements, connect_server, fence_of};
use crate::common::{Class, StatementRunner, from_micros, whole};
use crate::config::{SqlConfig, Target};
use crate::statement::{Sql, Stmt, Style};
use crate::wake::{Join, Wake};
use listen::Listener;

const BACKEND: &str = "postgres";

/// The database's clock.
const NOW: &str = "clock_timestamp()";

/// A CTE that turns off `synchronous_commit` for the current transaction (one statement); the
/// statement must select `FROM async_commit` so it is evaluated.
const ASYNC: &str = "async_commit AS (SELECT set_config('synchronous_commit', 'off', true))";

/// PostgreSQL's state besides the pool: the listener, and keep-alive's batch statement.
pub struct Postgres {
    listener: Listener,
    /// $1 names, $2 owners, $3 fences, $4 ttls in µs (arrays): keep-alive's batch in one
    /// statement; returns the owners whose rows were extended.
    extend_many: SqlStr,
}

/// The take-over of an existing row (free, expired, or already ours where `ours` holds) with
/// the new fence `fence`, returning the fence.
fn upsert(fence: &str, ours: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE \
         SET owner = EXCLUDED.owner, fence = {fence}, expires_at = EXCLUDED.expires_at \
         WHERE l.owner IS NULL OR l.expires_at <= {NOW} OR (l.owner = EXCLUDED.owner AND {ours}) \
         RETURNING fence"
    )
}

/// [`upsert`]'s `ours` for a row already ours that is taken again: always (a retry of the same
/// statement after a lost reply succeeds with a newer fence).
const AGAIN: &str = "true";

/// Frees the row where `condition` holds and notifies the name's waiters (see `Payload`): with
/// `head`, only the queue's live head when there is one. Counts the notifications sent.
///
/// With `head`, a release that finds a waiter queued commits without waiting for the WAL
/// flush: the head's grant, whose commit does wait, follows at once and flushes the release's
/// record with its own, so the hand-over waits for one flush instead of two. A release that a
/// crash loses in between leaves the lock held until its ttl, as a crashed holder's would:
/// liveness, never exclusion (the fence is the grant's, which is flushed). With nobody queued
/// the release waits for its flush as before.
fn free_and_notify(s: &Sql, condition: &str, head: bool) -> Stmt {
    let (t, w, table) = (&s.leases, &s.waiters, &s.table);
    let released =
        format!("WITH released AS (UPDATE {t} SET owner = NULL WHERE {condition} RETURNING name)");
    s.row(&if head {
        format!(
            "{released}, head AS (SELECT waiter FROM {w} \
             WHERE name = $name AND expires_at > {NOW} ORDER BY ticket LIMIT 1), \
             quick AS (SELECT set_config('synchronous_commit', 'off', true) FROM head) \
             SELECT count(pg_notify('{table}', \
             CASE WHEN h.waiter IS NULL THEN 'N' || r.name ELSE 'W' || h.waiter || r.name END)) \
             FROM released AS r LEFT JOIN head AS h ON true LEFT JOIN quick ON true"
        )
    } else {
        format!("{released} SELECT count(pg_notify('{table}', 'N' || r.name)) FROM released AS r")
    })
}

/// The template of [`SqlDialect::semaphore_lock`] on the semaphores table `sem` (quoted).
fn semaphore_lock(sem: &str, bump: bool) -> String {
    if bump {
        format!(
            "INSERT INTO {sem} AS s (name, fence) VALUES ($name, GREATEST(1, $min_token::bigint)) \
             ON CONFLICT (name) DO UPDATE SET fence = GREATEST(s.fence + 1, $min_token::bigint) \
             RETURNING fence"
        )
    } else {
        format!(
            "INSERT INTO {sem} AS s (name, fence) VALUES ($name, 0) \
             ON CONFLICT (name) DO UPDATE SET fence = s.fence"
        )
    }
}

/// The notification payload that wakes the live head of `$name`'s permit queue but `$owner`:
/// the only waiter that a freed permit can go to (FIFO), so only it is woken (`Q`); with nobody
/// queued, `P` wakes the rest.
fn permit_wake(s: &Sql) -> String {
    let v = &s.permit_waiters;
    format!(
        "COALESCE('Q' || (SELECT waiter FROM {v} WHERE name = $name AND expires_at > {NOW} \
         AND waiter <> $owner ORDER BY ticket LIMIT 1) || $name, 'P' || $name)"
    )
}

/// The owner- and fence-checked release's condition.
const HELD: &str =
    "name = $name AND owner = $owner AND fence = $fence AND expires_at > clock_timestamp()";

impl SqlDialect for Postgres {
    type Db = sqlx::Postgres;
    const BACKEND: &'static str = BACKEND;
    const CLIENT: &'static str = "PostgresLock";
    const WAIT: WaitMechanism = WaitMechanism::ListenNotify;
    const STYLE: Style = Style {
        numbered: Some('$'),
        quote: '"',
        binary_names: false,
        returning: true,
        ttl_unit: Duration::from_micros(1),
    };
    /// `CREATE TABLE IF NOT EXISTS` is not safe against itself in PostgreSQL: two sessions may
    /// both pass the existence check and one fails on the `pg_type` unique index (23505), with
    /// "type already exists" (42710) or with 42P07.
    const CREATE_RACES: &'static [&'static str] = &["23505", "42P07", "42710"];

    const NOW: &'static str = NOW;
    /// The hand-over's statement deletes the new owner's waiter row (see `hand`).
    const HAND_DEQUEUES: bool = true;
    /// The waiter's grant deletes its waiter row in the same statement (see `wait_acquire`).
    const GRANT_DEQUEUES: bool = true;
    /// `wait_acquire` looks for itself.
    const ATTEMPT_LOOKS: bool = true;

    const RELAXED_COMMIT: Option<&'static str> = Some("SET LOCAL synchronous_commit = off");

    fn expiry() -> String {
        format!("{NOW} + $ttl::bigint * interval '1 microsecond'")
    }

    fn micros_between(now: &str, at: &str) -> String {
        format!("(extract(epoch FROM {at} - {now}) * 1000000)::bigint")
    }

    fn classify(db: &dyn DatabaseError) -> Class {
        match db.code().as_deref().unwrap_or_default() {
            // admin_shutdown (pg_terminate_backend, fast shutdown), crash_shutdown, connection
            // exceptions: the session is gone, another connection may work.
            "57P01" | "57P02" => Class::Stale,
            c if c.starts_with("08") => Class::Stale,
            // serialization failure, deadlock, lock not available.
            "40001" | "40P01" | "55P03" => Class::Busy,
            // starting up, too many connections, out of memory/disk.
            "57P03" | "53300" | "53200" | "53100" => Class::Fail { retryable: true },
            // invalid_password, invalid_authorization_specification (no such role, pg_hba
            // refusal), insufficient_privilege.
            "28P01" | "28000" | "42501" => Class::Denied,
            _ => Class::Fail { retryable: false },
        }
    }

    async fn connect(
        config: &SqlConfig,
        sql: &mut Statements,
    ) -> Result<(StatementRunner<Self::Db>, Self)> {
        let Target::Postgres(opts) = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a postgres:// URL"));
        };
        let (mut runner, opts) = connect_server::<Self>(config, opts, sql).await?;
        let shared = Arc::new(listen::Shared::default());
        runner.lender = Some(shared.clone());
        let extend_many = format!(
            "UPDATE \"{}\" AS l \
             SET expires_at = {NOW} + v.ttl_us * interval '1 microsecond' \
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
             AS v(name, owner, fence, ttl_us) \
             WHERE l.name = v.name COLLATE \"C\" AND l.owner = v.owner AND l.fence = v.fence \
             AND l.expires_at > {NOW} \
             RETURNING l.owner",
            config.table
        );
        let listener = Listener::new(opts, runner.clone(), &config.table, shared);
        let extend_many = sqlx::AssertSqlSafe(extend_many).into_sql_str();
        Ok((
            runner,
            Postgres {
                listener,
                extend_many,
            },
        ))
    }

    const CREATE: &[&str] = &[
        "CREATE TABLE IF NOT EXISTS {t} (name text COLLATE \"C\" NOT NULL PRIMARY KEY, \
         owner text NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL)",
        // Waiters: one row per queued acquire; `ticket` orders them, `expires_at` is the
        // waiter's liveness (refreshed while it waits). UNLOGGED, as the permit waiters below:
        // queue bookkeeping writes no WAL, and a crash (or a failover) that empties the table
        // only sends each waiter back to the tail at its next refresh (see `crate::queue`); no
        // holder, fence or expiry is kept there.
        // `secret`: what the waiter's hand-over notification is tagged with (see `hand`).
        "CREATE UNLOGGED TABLE IF NOT EXISTS {w} (ticket bigint GENERATED ALWAYS AS IDENTITY, \
         name text COLLATE \"C\" NOT NULL, waiter text NOT NULL, \
         expires_at timestamptz NOT NULL, secret text NULL, PRIMARY KEY (name, ticket))",
        // A waiters table made before the secret was: the column is added once (by a role that
        // may alter the table), and left alone when it is there.
        "DO $D$ BEGIN IF to_regclass('{w}') IS NOT NULL AND NOT EXISTS (SELECT 1 \
         FROM pg_attribute WHERE attrelid = to_regclass('{w}') AND attname = 'secret' \
         AND NOT attisdropped) THEN ALTER TABLE {w} ADD COLUMN secret text NULL; END IF; END $D$",
        // Semaphores: the fence of each (never reset by release or expiry), and the row whose
        // lock serialises the semaphore's grants and joins.
        "CREATE TABLE IF NOT EXISTS {s} (name text COLLATE \"C\" NOT NULL PRIMARY KEY, \
         fence bigint NOT NULL)",
        // Permit holders: one row per permit held, with the count it was granted under.
        "CREATE TABLE IF NOT EXISTS {p} (name text COLLATE \"C\" NOT NULL, owner text NOT NULL, \
         fence bigint NOT NULL, permits bigint NOT NULL, expires_at timestamptz NOT NULL, \
         PRIMARY KEY (name, owner))",
        // Permit waiters: as the lock's waiters, apart from them, with the count.
        "CREATE UNLOGGED TABLE IF NOT EXISTS {v} (ticket bigint GENERATED ALWAYS AS IDENTITY, \
         name text COLLATE \"C\" NOT NULL, waiter text NOT NULL, permits bigint NOT NULL, \
         expires_at timestamptz NOT NULL, PRIMARY KEY (name, ticket))",
        // Readers: one row per read hold (fence set) or per queued reader's mark (fence NULL).
        "CREATE TABLE IF NOT EXISTS {r} (name text COLLATE \"C\" NOT NULL, owner text NOT NULL, \
         fence bigint NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (name, owner))",
    ];

    fn semaphore_lock(s: &Sql, bump: bool) -> Stmt {
        let text = semaphore_lock(&s.semaphores, bump);
        if bump { s.row(&text) } else { s.done(&text) }
    }

    fn lease_bump(s: &Sql) -> Stmt {
        s.row(&format!(
            "INSERT INTO {} AS l (name, owner, fence, expires_at) \
             VALUES ($name, NULL, GREATEST(1, $min_token::bigint), {NOW}) \
             ON CONFLICT (name) DO UPDATE SET fence = GREATEST(l.fence + 1, $min_token::bigint) \
             RETURNING fence",
            s.leases
        ))
    }

    fn acquire(s: &Sql) -> Stmt {
        // The row is inserted, or taken over when free or expired (or already ours: a retry of
        // this same statement), setting the fence to GREATEST(fence + 1, min_token); never while a
        // live waiter is queued for the name (no jumping the queue).
        s.row(&format!(
            "INSERT INTO {} AS l (name, owner, fence, expires_at) \
             SELECT $name, $owner, GREATEST(1, $min_token::bigint), {} \
             WHERE NOT EXISTS (SELECT 1 FROM {} AS w \
             WHERE w.name = $name AND w.expires_at > {NOW}) {}",
            s.leases,
            Self::expiry(),
            s.waiters,
            upsert("GREATEST(l.fence + 1, $min_token::bigint)", AGAIN)
        ))
    }

    /// The hand-over (see [`Statements::hand`]), which also deletes the new owner's waiter
    /// rows and tells it by a notification that carries the grant (`H`, see `wake::Payload`):
    /// the server delivers it only once the statement has committed, and this one waits for
    /// the WAL flush (it writes the new fence), so the new owner may hold on the notification
    /// alone, without a statement of its own. Anyone who can connect may send a notification,
    /// so the grant carries a tag made with the secret the new owner stored in its waiter row
    /// (see `wake::Secret`), which only a reader of that table can make; a row without one (an
    /// older client's) gets a plain wake-up (`W`), and its owner's next attempt finds the row
    /// its own. Where the row is freed instead (the head is a reader, or has not refreshed its
    /// liveness lately), it wakes the head as [`free_and_notify`] does, and then commits
    /// without waiting for the flush.
    fn hand(s: &Sql, next: &str, held: &str) -> Stmt {
        let (t, w, table) = (&s.leases, &s.waiters, &s.table);
        // What the notification grants, then its tag (`wake::Grant::fields` and `Secret::tag`).
        let grant = "m.fence || ',' || $ttl::bigint || ',' || k.ticket";
        let tag = format!(
            "encode(sha256(convert_to(k.secret || ',' || {grant} || ',' || m.owner || ',' \
             || k.secret, 'UTF8')), 'hex')"
        );
        s.row(&format!(
            "WITH n AS (SELECT ({next}) AS next), \
             moved AS (UPDATE {t} AS l SET owner = n.next, \
             fence = CASE WHEN n.next IS NULL THEN l.fence ELSE l.fence + 1 END, \
             expires_at = CASE WHEN n.next IS NULL THEN l.expires_at ELSE {expiry} END \
             FROM n WHERE {held} RETURNING l.name, l.owner, l.fence), \
             handed AS (SELECT w.ticket, w.secret FROM {w} AS w, moved AS m \
             WHERE w.name = m.name AND w.waiter = m.owner AND w.expires_at > {NOW} \
             ORDER BY w.ticket LIMIT 1), \
             dequeued AS (DELETE FROM {w} AS w USING moved AS m WHERE w.name = m.name \
             AND (w.waiter = m.owner OR w.expires_at <= {NOW})), \
             head AS (SELECT waiter FROM {w} WHERE name = $name AND waiter <> $owner \
             AND expires_at > {NOW} ORDER BY ticket LIMIT 1), \
             quick AS (SELECT set_config('synchronous_commit', 'off', true) \
             FROM moved, head WHERE moved.owner IS NULL) \
             SELECT count(pg_notify('{table}', CASE \
             WHEN m.owner IS NOT NULL AND k.secret IS NOT NULL \
             THEN 'H' || m.owner || {grant} || ',' || {tag} || ',' || m.name \
             WHEN m.owner IS NOT NULL THEN 'W' || m.owner || m.name \
             WHEN h.waiter IS NOT NULL THEN 'W' || h.waiter || m.name ELSE 'N' || m.name END)) \
             FROM moved AS m LEFT JOIN handed AS k ON true LEFT JOIN head AS h ON true \
             LEFT JOIN quick ON true",
            expiry = Self::expiry(),
        ))
    }

    fn wait_acquire(s: &Sql) -> Stmt {
        // Only when no live waiter with a smaller ticket is queued and the row is not held by
        // another (checked first, so waiters that are not next write nothing); the grant sets
        // the fence to GREATEST(fence + 1, min_token) and deletes the waiter's row (and expired
        // ones) in the same statement. A row already ours (a release handed it over, see
        // `hand`, or a lost reply's try granted it) is not taken again but reported, unless
        // its fence is below the minimum. Returns the fence if granted, the holder's time left
        // in µs, no head, and the fence and time left in µs of a live row already ours.
        let (t, w) = (&s.leases, &s.waiters);
        let left = Self::micros_between(NOW, "h.expires_at");
        s.row(&format!(
            "WITH acq AS (\
             INSERT INTO {t} AS l (name, owner, fence, expires_at) \
             SELECT $name, $owner, GREATEST(1, $min_token::bigint), {} \
             WHERE NOT EXISTS (SELECT 1 FROM {w} AS w \
             WHERE w.name = $name AND w.ticket < $ticket AND w.waiter <> $owner \
             AND w.expires_at > {NOW}) \
             AND NOT EXISTS (SELECT 1 FROM {t} AS h \
             WHERE h.name = $name AND h.owner <> $owner AND h.expires_at > {NOW}) {}), \
             dequeued AS (DELETE FROM {w} AS w WHERE w.name = $name \
             AND (w.waiter = $owner OR w.expires_at <= {NOW}) \
             AND EXISTS (SELECT 1 FROM acq)), \
             mine AS (SELECT h.fence, {left} AS left_us FROM {t} AS h \
             WHERE h.name = $name AND h.owner = $owner AND h.expires_at > {NOW}) \
             SELECT (SELECT fence FROM acq), \
             (SELECT {left} FROM {t} AS h WHERE h.name = $name AND h.owner IS NOT NULL \
             AND h.expires_at > {NOW}), NULL::bigint, \
             (SELECT fence FROM mine), (SELECT left_us FROM mine)",
            Self::expiry(),
            upsert(
                "GREATEST(l.fence + 1, $min_token::bigint)",
                "l.fence < $min_token::bigint"
            ),
        ))
    }

    // Queue bookkeeping below commits without waiting for the WAL flush (`synchronous_commit`
    // off for that one transaction): a waiter row lost in a crash is re-created by its waiter's
    // next refresh, and one that comes back expires at its liveness. This keeps the joining
    // waiter's commit from queueing behind (or ahead of) the head's grant on the WAL flush.
    // (The queue tables this crate creates are UNLOGGED, whose writes need no flush anyway;
    // tables made by an older version may be logged.)

    /// Joins the tail; drops expired waiters of the name on the way.
    fn enqueue(s: &Sql) -> Stmt {
        s.row(&format!(
            "WITH gc AS (DELETE FROM {w} WHERE name = $name AND expires_at <= {NOW}), {ASYNC} \
             INSERT INTO {w} (name, waiter, expires_at, secret) \
             SELECT $name, $owner, {expiry}, $secret FROM async_commit RETURNING ticket",
            w = s.waiters,
            expiry = Self::expiry(),
        ))
    }

    fn refresh(s: &Sql) -> Stmt {
        s.done(&format!(
            "WITH {ASYNC} UPDATE {w} SET expires_at = {expiry} FROM async_commit \
             WHERE ticket = $ticket AND name = $name AND waiter = $owner \
             AND expires_at > {NOW}",
            w = s.waiters,
            expiry = Self::expiry(),
        ))
        .keeping()
    }

    /// Wakes only the head of the queue when there is one (see `Payload`): waking every waiter
    /// made each release start as many attempts as there were waiters, and the head's attempt
    /// queued behind them.
    fn release(s: &Sql) -> Stmt {
        free_and_notify(s, HELD, true)
    }

    /// The plain compare-and-free with a notification, without looking up the queue's head.
    fn release_owner(s: &Sql) -> Stmt {
        free_and_notify(s, "name = $name AND owner = $owner", false)
    }

    /// Returns whether a lease was freed. (A free that a crash loses ends at the lease's ttl.)
    /// The grant and the hand-over delete the waiter's row themselves, so this is the only
    /// way out of the queue.
    fn leave(s: &Sql) -> Option<Stmt> {
        let (t, w, table) = (&s.leases, &s.waiters, &s.table);
        Some(s.row(&format!(
            "WITH gone AS (DELETE FROM {w} \
             WHERE name = $name AND (waiter = $owner OR expires_at <= {NOW}) RETURNING 1), \
             freed AS (UPDATE {t} SET owner = NULL WHERE name = $name AND owner = $owner \
             RETURNING 1), {ASYNC} \
             SELECT (SELECT count(*) FROM freed), \
             (SELECT count(pg_notify('{table}', 'N' || $name)) FROM \
             (SELECT 1 FROM gone UNION ALL SELECT 1 FROM freed LIMIT 1) AS x) \
             FROM async_commit"
        )))
    }

    /// The row freed by the last reader, or a reader granted at the head, wakes the name's
    /// waiters.
    fn reader_notify(s: &Sql) -> Option<Stmt> {
        let table = &s.table;
        Some(s.done(&format!("SELECT pg_notify('{table}', 'N' || $name)")))
    }

    /// Whatever frees a permit or leaves the permit queue wakes the name's permit waiters
    /// (`P<name>`, see `Payload`).
    fn permit_leave(s: &Sql) -> Option<Stmt> {
        let (p, v, table) = (&s.permits, &s.permit_waiters, &s.table);
        Some(s.row(&format!(
            "WITH gone AS (DELETE FROM {v} \
             WHERE name = $name AND (waiter = $owner OR expires_at <= {NOW}) RETURNING 1), \
             freed AS (DELETE FROM {p} WHERE name = $name AND owner = $owner RETURNING 1) \
             SELECT (SELECT count(*) FROM freed), \
             (SELECT count(pg_notify('{table}', 'P' || $name)) FROM \
             (SELECT 1 FROM gone UNION ALL SELECT 1 FROM freed LIMIT 1) AS x)"
        )))
    }

    fn permit_routines(s: &Sql) -> Option<PermitRoutines> {
        Some(routines::permit_routines(s, &permit_wake(s)))
    }

    fn wake(&self, name: &LockName, waiter: OwnerId, permits: bool) -> Wake {
        self.listener.ensure();
        let waiters = &self.listener.waiters;
        let registration =
            waiters.register(&crate::wake::key(name.as_str(), permits), Some(waiter));
        registration.into_wake(Some(waiters.ready.subscribe()))
    }

    fn joined(&self, name: &LockName, waiter: OwnerId, join: Join) {
        let waiters = &self.listener.waiters;
        waiters.joined(name.as_str(), waiter, join, None);
    }

    async fn wait_for_release(
        &self,
        runner: &StatementRunner<Self::Db>,
        sql: &Statements,
        name: &LockName,
        until: Instant,
    ) -> Result<()> {
        self.listener.ensure();
        // Subscribe first, then look: a release between the two still wakes us.
        let registration = self.listener.waiters.register(name.as_str(), None);
        let notified = registration.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut ready = self.listener.waiters.ready.subscribe();
        if !*ready.borrow_and_update() {
            // Not listening yet (first wait, or the server is away): poll at the helper's pace.
            let _ = tokio::time::timeout_at(until.into(), ready.wait_for(|r| *r)).await;
            return Ok(());
        }
        let row = tokio::time::timeout_at(until.into(), runner.lock_row(&sql.inspect, name)).await;
        let wake_at = match row {
            // Free, expired or never used: try again now.
            Ok(Ok(None)) | Ok(Ok(Some((_, _, None, _)))) => return Ok(()),
            // Held: wake on NOTIFY, or when the lease runs out by the database's clock.
            Ok(Ok(Some((_, _, Some(us), _)))) => {
                let left = from_micros(Some(us)).unwrap_or_default();
                (Instant::now() + left + Duration::from_millis(1)).min(until)
            }
            Ok(Err(_)) | Err(_) => until,
        };
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(wake_at.into()) => {}
        }
        Ok(())
    }

    async fn extend_batch(
        &self,
        runner: &StatementRunner<Self::Db>,
        _sql: &Statements,
        batch: &[(&Lease, Duration)],
    ) -> Result<Vec<bool>> {
        let names: Vec<&str> = batch.iter().map(|(l, _)| l.name().as_str()).collect();
        let owners: Vec<String> = batch.iter().map(|(l, _)| l.owner().to_string()).collect();
        let fences: Vec<i64> = batch.iter().map(|(l, _)| fence_of(l)).collect();
        let ttls: Vec<i64> = batch
            .iter()
            .map(|(_, ttl)| whole(*ttl, Self::STYLE.ttl_unit))
            .collect();
        let done: Vec<String> = runner
            .run("extend", None, |mut c| {
                let q = sqlx::query_scalar(self.extend_many.clone())
                    .bind(names.as_slice())
                    .bind(owners.as_slice())
                    .bind(fences.as_slice())
                    .bind(ttls.as_slice());
                async move {
                    let r = q.fetch_all(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        let done: HashSet<String> = done.into_iter().collect();
        Ok(owners.iter().map(|o| done.contains(o)).collect())
    }

    async fn close(&self) {
        self.listener.close().await;
    }
}
