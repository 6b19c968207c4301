//! MySQL and MariaDB: lease rows, `INSERT .. ON DUPLICATE KEY UPDATE` with `IF(..)` and
//! `LAST_INSERT_ID(expr)` to return the fence; a FIFO queue of waiter rows (see
//! [`crate::queue`]); waiters poll (the store has no notification).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, Lease, LockInfo, LockName, OwnerId, RawFloor, Released, Result, WaitMechanism,
    async_trait,
};
use sqlx::mysql::{MySqlDatabaseError, MySqlPoolOptions, MySqlQueryResult};
use sqlx::{MySql, SqlStr};

use crate::common::{
    CancelCleanup, Class, Core, checked_batch, classify_transport, detached, finish_batch,
    floor_of, from_micros, micros, spawn_cleanup, sql, token,
};
use crate::config::{SqlConfig, Target};
use crate::queue::{Attempt, LIVENESS, Queue, Wake};

const BACKEND: &str = "mysql";

/// Pooled connections.
const POOL_SIZE: u32 = 8;

/// The statements of one client, built once with the validated table name.
struct Statements {
    create: SqlStr,
    create_queue: SqlStr,
    gc_queue: SqlStr,
    acquire: SqlStr,
    floor_acquire: SqlStr,
    wait_acquire: SqlStr,
    probe: SqlStr,
    enqueue: SqlStr,
    refresh: SqlStr,
    dequeue: SqlStr,
    release: SqlStr,
    release_owner: SqlStr,
    extend: SqlStr,
    inspect: SqlStr,
    forget: SqlStr,
    forget_queue: SqlStr,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let w = format!("`{}`", crate::common::queue_table(table));
        // The raw floor's update, as it was before the queue. Binds: owner, owner, owner,
        // owner, ttl µs.
        let upsert = "ON DUPLICATE KEY UPDATE \
             fence = IF(owner IS NULL OR expires_at <= NOW(6) OR owner = ?, \
             LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0)), \
             owner = IF(owner IS NULL OR expires_at <= NOW(6) OR owner = ?, ?, owner), \
             expires_at = IF(owner <=> ?, NOW(6) + INTERVAL ? MICROSECOND, expires_at)";
        // The acquires' update. MySQL applies the SET list left to right, each assignment
        // seeing the columns already assigned. `fence` is decided first: bumped if the row is
        // free, expired or already ours AND the queue condition `gate` holds. `owner` then
        // follows that one decision: `LAST_INSERT_ID()` returns what the `fence` assignment
        // passed to `LAST_INSERT_ID(expr)`, the new fence if granted and 0 if not (fences start
        // at 1). `expires_at` last tests whether `owner` is now ours (owner ids are unique per
        // acquisition). The queue condition is a subquery in the update, not an
        // `INSERT .. SELECT .. WHERE NOT EXISTS`, which costs MariaDB twice as much per
        // statement. A grant's fence is GREATEST(fence + 1, token floor) (0 = no floor).
        // Binds: owner, the gate's, floor, owner, owner, ttl µs.
        let gated = |gate: &str| {
            format!(
                "ON DUPLICATE KEY UPDATE \
                 fence = IF((owner IS NULL OR expires_at <= NOW(6) OR owner = ?) AND {gate}, \
                 LAST_INSERT_ID(GREATEST(fence + 1, ?)), fence + LAST_INSERT_ID(0)), \
                 owner = IF(LAST_INSERT_ID() = fence, ?, owner), \
                 expires_at = IF(owner <=> ?, NOW(6) + INTERVAL ? MICROSECOND, expires_at)"
            )
        };
        // A new row, for the acquires: binds name, owner, floor, ttl µs.
        let insert = format!(
            "INSERT INTO {t} (name, owner, fence, expires_at) \
             VALUES (?, ?, LAST_INSERT_ID(GREATEST(1, ?)), NOW(6) + INTERVAL ? MICROSECOND)"
        );
        // A new row, for the raw floor (no token floor): binds name, owner, ttl µs.
        let floor_insert = format!(
            "INSERT INTO {t} (name, owner, fence, expires_at) \
             VALUES (?, ?, LAST_INSERT_ID(1), NOW(6) + INTERVAL ? MICROSECOND)"
        );
        Statements {
            // VARBINARY: names compare byte for byte (case-sensitive), and 1024 bytes fit
            // InnoDB's 3072-byte index limit whatever the character set.
            create: sql(format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name VARBINARY(1024) NOT NULL PRIMARY KEY, \
                 owner CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL, \
                 fence BIGINT NOT NULL, \
                 expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
            )),
            // Waiters: one row per queued acquire; `ticket` orders them, `expires_at` is the
            // waiter's liveness (refreshed while it waits).
            create_queue: sql(format!(
                "CREATE TABLE IF NOT EXISTS {w} (\
                 ticket BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 name VARBINARY(1024) NOT NULL, \
                 waiter CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
                 expires_at DATETIME(6) NOT NULL, \
                 KEY by_name (name, ticket)) ENGINE=InnoDB"
            )),
            gc_queue: sql(format!("DELETE FROM {w} WHERE expires_at <= NOW(6)")),
            // Binds: name, owner, floor, ttl µs, owner, name, floor, owner, owner, ttl µs.
            // LAST_INSERT_ID(expr) reports the outcome in the OK packet: the new fence for a
            // new row (1, or the floor) and for a take-over, 0 when the row is held by someone
            // else or a live waiter is queued for the name. A new row (a name never used) is
            // not gated: a waiter only queues after finding the row held, and rows are never
            // deleted.
            acquire: sql(format!(
                "{insert} {}",
                gated(&format!(
                    "NOT EXISTS (SELECT 1 FROM {w} AS w \
                     WHERE w.name = ? AND w.expires_at > NOW(6))"
                ))
            )),
            // The raw floor: the plain acquire, without the queue check. Binds: name, owner,
            // ttl µs, owner, owner, owner, owner, ttl µs.
            floor_acquire: sql(format!("{floor_insert} {upsert}")),
            // A queued waiter's attempt: only when no live waiter with a smaller ticket is
            // queued. Binds: name, owner, floor, ttl µs, owner, name, ticket, owner, floor,
            // owner, owner, ttl µs.
            wait_acquire: sql(format!(
                "{insert} {}",
                gated(&format!(
                    "NOT EXISTS (SELECT 1 FROM {w} AS w WHERE w.name = ? AND w.ticket < ? \
                     AND w.waiter <> ? AND w.expires_at > NOW(6))"
                ))
            )),
            // Read-only look before a waiter writes: live waiters ahead of it, and the holder's
            // time left in µs. Binds: name, ticket, waiter, name, waiter.
            probe: sql(format!(
                "SELECT (SELECT COUNT(*) FROM {w} AS w \
                 WHERE w.name = ? AND w.ticket < ? AND w.waiter <> ? AND w.expires_at > NOW(6)), \
                 (SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), l.expires_at) FROM {t} AS l \
                 WHERE l.name = ? AND l.owner IS NOT NULL AND l.owner <> ? \
                 AND l.expires_at > NOW(6))"
            )),
            // Binds: name, waiter, liveness µs. The insert id is the ticket.
            enqueue: sql(format!(
                "INSERT INTO {w} (name, waiter, expires_at) \
                 VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND)"
            )),
            // Binds: liveness µs, name, waiter. Never revives an expired waiter.
            refresh: sql(format!(
                "UPDATE {w} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND waiter = ? AND expires_at > NOW(6)"
            )),
            // Binds: name, waiter. Leaves the queue, dropping expired waiters of the name.
            dequeue: sql(format!(
                "DELETE FROM {w} WHERE name = ? AND (waiter = ? OR expires_at <= NOW(6))"
            )),
            // Binds: name, owner, fence. The row stays (the fence must never reset).
            release: sql(format!(
                "UPDATE {t} SET owner = NULL \
                 WHERE name = ? AND owner = ? AND fence = ? AND expires_at > NOW(6)"
            )),
            // Binds: name, owner.
            release_owner: sql(format!(
                "UPDATE {t} SET owner = NULL WHERE name = ? AND owner = ?"
            )),
            // Binds: ttl µs, name, owner, fence. Never resurrects an expired row.
            extend: sql(format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND fence = ? AND expires_at > NOW(6)"
            )),
            // Binds: name.
            // Binds: name. Deletes the row of a name nobody holds or waits for (its fence too:
            // `forget` is only for names that are never used again).
            forget: sql(format!(
                "DELETE FROM {t} WHERE name = ? AND (owner IS NULL OR expires_at <= NOW(6)) \
                 AND NOT EXISTS (SELECT 1 FROM {w} AS w WHERE w.name = {t}.name \
                 AND w.expires_at > NOW(6))"
            )),
            // Binds: name. The name's waiter rows whose liveness ran out.
            forget_queue: sql(format!(
                "DELETE FROM {w} WHERE name = ? AND expires_at <= NOW(6)"
            )),
            inspect: sql(format!(
                "SELECT l.owner, l.fence, \
                 IF(l.owner IS NOT NULL AND l.expires_at > NOW(6), \
                 TIMESTAMPDIFF(MICROSECOND, NOW(6), l.expires_at), NULL), \
                 (SELECT COUNT(*) FROM {w} AS w WHERE w.name = l.name AND w.expires_at > NOW(6)) \
                 FROM {t} AS l WHERE l.name = ?"
            )),
        }
    }
}

type MyQuery<'q> = sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>;

/// Binds the raw floor's `ON DUPLICATE KEY UPDATE` tail.
fn upsert_binds<'q>(q: MyQuery<'q>, owner: &str, ttl_us: i64) -> MyQuery<'q> {
    q.bind(owner)
        .bind(owner)
        .bind(owner)
        .bind(owner)
        .bind(ttl_us)
}

/// Binds the tail of the acquires' update after the gate's own binds.
fn gated_tail<'q>(q: MyQuery<'q>, owner: &str, floor: i64, ttl_us: i64) -> MyQuery<'q> {
    q.bind(floor).bind(owner).bind(owner).bind(ttl_us)
}

/// The fence an acquire statement reported: the OK packet's insert id, if a row was written.
fn granted(done: &sqlx::mysql::MySqlQueryResult) -> Option<u64> {
    (done.rows_affected() > 0 && done.last_insert_id() > 0).then(|| done.last_insert_id())
}

fn classify(e: &sqlx::Error) -> Class {
    if let Some(class) = classify_transport(e) {
        return class;
    }
    let number = match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|m| m.number())
            .unwrap_or(0),
        _ => 0,
    };
    match number {
        // deadlock, lock wait timeout: the statement was rolled back.
        1205 | 1213 => Class::Busy,
        // server shutdown, connection killed (MariaDB), gone away, lost, idle disconnect.
        1053 | 1927 | 2006 | 2013 | 4031 => Class::Stale,
        // too many connections, out of resources.
        1040 | 1041 | 1203 => Class::Fail { retryable: true },
        _ => Class::Fail { retryable: false },
    }
}

struct Inner {
    core: Core<MySql>,
    sql: Statements,
    table: String,
    redacted: String,
    defaults: ClientDefaults,
}

impl Inner {
    /// The acquire statement (see [`detached`]): its result, and how many tries it took (a
    /// retry may have followed a lost reply to a grant).
    async fn acquire_statement(
        self: Arc<Self>,
        name: LockName,
        owner: String,
        ttl_us: i64,
        floor: i64,
    ) -> Result<(MySqlQueryResult, u32)> {
        let mut tries = 0;
        let done = self
            .core
            .run("acquire", Some(&name), |mut c| {
                tries += 1;
                let (bytes, o) = (name.as_str().as_bytes(), owner.as_str());
                let q = sqlx::query(self.sql.acquire.clone())
                    .bind(bytes)
                    .bind(o)
                    .bind(floor)
                    .bind(ttl_us)
                    .bind(o)
                    .bind(bytes);
                let q = gated_tail(q, o, floor, ttl_us);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok((done, tries))
    }

    /// A waiter's acquire statement (see [`detached`]).
    async fn wait_statement(
        self: Arc<Self>,
        name: LockName,
        waiter: String,
        ttl_us: i64,
        ticket: i64,
        floor: i64,
    ) -> Result<MySqlQueryResult> {
        self.core
            .run("acquire", Some(&name), |mut c| {
                let (bytes, w) = (name.as_str().as_bytes(), waiter.as_str());
                let q = sqlx::query(self.sql.wait_acquire.clone())
                    .bind(bytes)
                    .bind(w)
                    .bind(floor)
                    .bind(ttl_us)
                    .bind(w)
                    .bind(bytes)
                    .bind(ticket)
                    .bind(w);
                let q = gated_tail(q, w, floor, ttl_us);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }

    async fn release_owner(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let owner = owner.to_string();
        let done = self
            .core
            .run("release", Some(name), |mut c| {
                let q = sqlx::query(self.sql.release_owner.clone())
                    .bind(name.as_str().as_bytes())
                    .bind(owner.as_str());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

/// A MySQL/MariaDB lock client over a pool of up to 8 connections. Sessions run in UTC
/// (`time_zone = '+00:00'`) so every client compares `DATETIME` expiries alike.
///
/// `Debug` shows the URL without its password.
#[derive(Clone)]
pub struct MySqlLock {
    inner: Arc<Inner>,
}

impl fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLock")
            .field("url", &self.inner.redacted)
            .field("table", &self.inner.table)
            .finish()
    }
}

impl MySqlLock {
    /// Connects and creates the lease table if it does not exist.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is not a MySQL/MariaDB URL; [`Error::Backend`] if the
    /// server cannot be reached or the table cannot be created.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; a table being created is either created or
    /// not.
    pub async fn connect(config: &SqlConfig) -> Result<Self> {
        let Target::MySql(opts) = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a mysql:// URL"));
        };
        let timeout = crate::config::timeout_of(config);
        let mut opts = opts.clone();
        let tls = crate::config::read_tls(config)?;
        if let Some(pem) = tls.ca {
            opts = opts.ssl_ca_from_pem(pem);
        }
        if let Some((cert, key)) = tls.client {
            opts = opts
                .ssl_client_cert_from_pem(cert)
                .ssl_client_key_from_pem(key);
        }
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL_SIZE)
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_lazy_with(opts.clone());
        let lock = MySqlLock {
            inner: Arc::new(Inner {
                core: Core {
                    backend: BACKEND,
                    pool,
                    timeout,
                    classify,
                },
                sql: Statements::new(&config.table),
                table: config.table.clone(),
                redacted: config.redacted.clone(),
                defaults: config.defaults.clone(),
            }),
        };
        let inner = &lock.inner;
        inner.core.probe(&opts).await?;
        for statement in [&inner.sql.create, &inner.sql.create_queue] {
            inner
                .core
                .run("create table", None, |mut c| {
                    let q = sqlx::query(statement.clone());
                    async move {
                        let r = q.execute(c.conn()).await;
                        (c, r)
                    }
                })
                .await?;
        }
        // Expired waiter rows left by crashed processes (best effort).
        let gc = inner
            .core
            .run("drop expired waiters", None, |mut c| {
                let q = sqlx::query(inner.sql.gc_queue.clone());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await;
        if let Err(e) = gc {
            tracing::debug!(backend = BACKEND, error = %e, "dropping expired waiter rows failed");
        }
        Ok(lock)
    }

    /// Closes the pool gracefully. Dropping every clone does the same without waiting.
    ///
    /// # Errors
    /// None: closing is best-effort and cannot fail.
    ///
    /// # Cancel safety
    /// Safe to drop; connections then close in the background.
    pub async fn close(&self) {
        self.inner.core.pool.close().await;
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }
}

#[async_trait]
impl DistributedLock for MySqlLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::Poll,
        )
        // The acquiring statement sets the fence to GREATEST(fence + 1, floor).
        .token_floor(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        let started = Instant::now();
        let floor = floor_of(BACKEND, opts)?;
        let owner = opts.owner_or_random();
        let owner_text = owner.to_string();
        let ttl = micros(opts.ttl_value());
        let inner = &self.inner;
        let mut cleanup = {
            let inner = inner.clone();
            let name = name.clone();
            CancelCleanup::arm(move || {
                let task_name = name.clone();
                spawn_cleanup(BACKEND, &name, async move {
                    inner.release_owner(&task_name, owner).await
                });
            })
        };
        let (done, tries) = detached(
            BACKEND,
            name,
            inner
                .clone()
                .acquire_statement(name.clone(), owner_text, ttl, floor),
            |(done, tries)| granted(done).is_some() || *tries > 1,
            {
                let (inner, name) = (inner.clone(), name.clone());
                move || async move { inner.release_owner(&name, owner).await }
            },
        )
        .await?;
        let fence = granted(&done);
        // A retry after a broken connection may find the queue non-empty although the first
        // try (whose reply was lost) got the lock: then it is given back, here and now, since a
        // waiting acquire goes on with the same owner id when the caller chose it.
        if fence.is_none() && tries > 1 {
            inner.release_owner(name, owner).await?;
        }
        cleanup.disarm();
        Ok(fence.map(|fence| {
            Lease::new(
                name.clone(),
                owner,
                lockcore::FencingToken(fence),
                started,
                opts.ttl_value(),
                opts.drift_value(),
            )
        }))
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        crate::queue::acquire(self, name, opts, deadline).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let inner = &self.inner;
        let owner = lease.owner().to_string();
        let fence = i64::try_from(lease.token().0).unwrap_or(i64::MAX);
        let done = inner
            .core
            .run("release", Some(lease.name()), |mut c| {
                let q = sqlx::query(inner.sql.release.clone())
                    .bind(lease.name().as_str().as_bytes())
                    .bind(owner.as_str())
                    .bind(fence);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(if done.rows_affected() > 0 {
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let started = Instant::now();
        let inner = &self.inner;
        let owner = lease.owner().to_string();
        let fence = i64::try_from(lease.token().0).unwrap_or(i64::MAX);
        let done = inner
            .core
            .run("extend", Some(lease.name()), |mut c| {
                let q = sqlx::query(inner.sql.extend.clone())
                    .bind(micros(ttl))
                    .bind(lease.name().as_str().as_bytes())
                    .bind(owner.as_str())
                    .bind(fence);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        // The connection sets CLIENT_FOUND_ROWS, so a matched row counts even if unchanged.
        if done.rows_affected() == 1 {
            Ok(lease.renewed(started, ttl))
        } else {
            Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
        }
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        // One transaction on one connection: one commit (one log flush) for the whole batch.
        let (results, todo) = checked_batch(leases);
        if !todo.is_empty() {
            let inner = &self.inner;
            let started = Instant::now();
            let owners: Vec<String> = todo
                .iter()
                .map(|&i| leases[i].0.owner().to_string())
                .collect();
            let done: Result<Vec<u64>> = inner
                .core
                .run("extend", None, |mut c| {
                    let queries: Vec<_> = todo
                        .iter()
                        .zip(&owners)
                        .map(|(&i, owner)| {
                            let (lease, ttl) = &leases[i];
                            sqlx::query(inner.sql.extend.clone())
                                .bind(micros(*ttl))
                                .bind(lease.name().as_str().as_bytes())
                                .bind(owner.as_str())
                                .bind(i64::try_from(lease.token().0).unwrap_or(i64::MAX))
                        })
                        .collect();
                    async move {
                        let r = async {
                            let mut tx = sqlx::Connection::begin(c.conn()).await?;
                            let mut out = Vec::with_capacity(queries.len());
                            for q in queries {
                                out.push(q.execute(&mut *tx).await?.rows_affected());
                            }
                            tx.commit().await?;
                            Ok(out)
                        }
                        .await;
                        (c, r)
                    }
                })
                .await;
            return finish_batch(BACKEND, leases, results, &todo, started, done);
        }
        finish_batch(
            BACKEND,
            leases,
            results,
            &todo,
            Instant::now(),
            Ok(Vec::new()),
        )
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let inner = &self.inner;
        let row: Option<(Option<String>, i64, Option<i64>, i64)> = inner
            .core
            .run("inspect", Some(name), |mut c| {
                let q = sqlx::query_as(inner.sql.inspect.clone()).bind(name.as_str().as_bytes());
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(row.map(|(owner, fence, remaining, waiters)| {
            let remaining = from_micros(remaining);
            LockInfo::new(
                name,
                owner.filter(|_| remaining.is_some()),
                Some(token(fence)),
                remaining,
                Some(usize::try_from(waiters).unwrap_or(0)),
            )
        }))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let sql = &self.inner.sql;
        self.inner
            .core
            .execute_each(
                "forget",
                name,
                &[&sql.forget_queue, &sql.forget],
                name.as_str().as_bytes().to_vec(),
            )
            .await?;
        Ok(self.inspect(name).await?.is_none())
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(MySqlFloor {
            inner: self.inner.clone(),
        }))
    }
}

impl Inner {
    async fn dequeue(&self, name: &LockName, waiter: &str) -> Result<()> {
        self.core
            .run("leave queue", Some(name), |mut c| {
                let q = sqlx::query(self.sql.dequeue.clone())
                    .bind(name.as_str().as_bytes())
                    .bind(waiter);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(())
    }
}

impl Queue for MySqlLock {
    const BACKEND: &'static str = BACKEND;

    fn wake(&self, _name: &LockName, _waiter: OwnerId) -> Wake {
        Wake::poll()
    }

    async fn enqueue(&self, name: &LockName, waiter: &str) -> Result<i64> {
        let inner = &self.inner;
        let done = inner
            .core
            .run("enqueue", Some(name), |mut c| {
                let q = sqlx::query(inner.sql.enqueue.clone())
                    .bind(name.as_str().as_bytes())
                    .bind(waiter)
                    .bind(micros(LIVENESS));
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX))
    }

    async fn refresh(&self, name: &LockName, waiter: &str) -> Result<bool> {
        let inner = &self.inner;
        let done = inner
            .core
            .run("refresh waiter", Some(name), |mut c| {
                let q = sqlx::query(inner.sql.refresh.clone())
                    .bind(micros(LIVENESS))
                    .bind(name.as_str().as_bytes())
                    .bind(waiter);
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        // CLIENT_FOUND_ROWS: a matched row counts even if unchanged.
        Ok(done.rows_affected() > 0)
    }

    async fn attempt(
        &self,
        name: &LockName,
        waiter: OwnerId,
        ticket: i64,
        ttl: Duration,
        floor: i64,
    ) -> Result<Attempt> {
        let inner = &self.inner;
        let waiter_text = waiter.to_string();
        let w = waiter_text.as_str();
        let bytes = name.as_str().as_bytes();
        // Look first (read-only): only the head of the queue, with the row free, writes.
        let (ahead, left): (i64, Option<i64>) = inner
            .core
            .run("acquire", Some(name), |mut c| {
                let q = sqlx::query_as(inner.sql.probe.clone())
                    .bind(bytes)
                    .bind(ticket)
                    .bind(w)
                    .bind(bytes)
                    .bind(w);
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        let ahead = u64::try_from(ahead).unwrap_or(0);
        let holder_left = from_micros(left);
        if ahead > 0 || holder_left.is_some() {
            return Ok(Attempt::Blocked {
                ahead: Some(ahead),
                holder_left,
            });
        }
        let done = detached(
            BACKEND,
            name,
            inner
                .clone()
                .wait_statement(name.clone(), waiter_text, micros(ttl), ticket, floor),
            |done| granted(done).is_some(),
            {
                let (lock, name) = (self.clone(), name.clone());
                move || async move { lock.cancel(&name, waiter).await }
            },
        )
        .await?;
        Ok(match granted(&done) {
            Some(fence) => Attempt::Granted(i64::try_from(fence).unwrap_or(i64::MAX)),
            None => Attempt::Blocked {
                ahead: Some(0),
                holder_left: None,
            },
        })
    }

    async fn dequeue(&self, name: &LockName, waiter: &str) -> Result<()> {
        self.inner.dequeue(name, waiter).await
    }

    async fn cancel(&self, name: &LockName, waiter: OwnerId) -> Result<bool> {
        self.inner.dequeue(name, &waiter.to_string()).await?;
        self.inner.release_owner(name, waiter).await
    }
}

/// The plain acquire (no waiter-queue check) and the release statement straight on the pool.
struct MySqlFloor {
    inner: Arc<Inner>,
}

#[async_trait]
impl RawFloor for MySqlFloor {
    fn description(&self) -> String {
        "INSERT .. ON DUPLICATE KEY UPDATE (fence via LAST_INSERT_ID; without the queue check), \
         then UPDATE .. SET owner = NULL, on the same sqlx pool"
            .into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let pool = &self.inner.core.pool;
        let owner = OwnerId::random().to_string();
        let o = owner.as_str();
        let ttl = micros(Duration::from_secs(10));
        let err = |e| Error::backend(BACKEND, "raw floor", Some(name), true, e);
        let q = sqlx::query(self.inner.sql.floor_acquire.clone())
            .bind(name.as_str().as_bytes())
            .bind(o)
            .bind(ttl);
        let done = upsert_binds(q, o, ttl).execute(pool).await.map_err(err)?;
        let fence = done.last_insert_id();
        if fence > 0 {
            sqlx::query(self.inner.sql.release.clone())
                .bind(name.as_str().as_bytes())
                .bind(o)
                .bind(i64::try_from(fence).unwrap_or(i64::MAX))
                .execute(pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}
