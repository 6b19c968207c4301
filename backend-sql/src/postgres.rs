//! PostgreSQL: lease rows, `INSERT .. ON CONFLICT DO UPDATE .. WHERE expired RETURNING fence`,
//! a FIFO queue of waiter rows (see [`crate::queue`]) whose head is granted and dequeued in one
//! statement, and waiters woken by LISTEN/NOTIFY over one listener connection per client.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, Lease, LockInfo, LockName, OwnerId, RawFloor, Released, Result, WaitMechanism,
    async_trait,
};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, SqlStr};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::common::{
    CancelCleanup, Class, Core, batch_error, checked_batch, classify_transport, detached, floor_of,
    from_micros, micros, spawn_cleanup, sql, token,
};
use crate::config::{SqlConfig, Target};
use crate::queue::{Attempt, LIVENESS, Queue, Wake};

const BACKEND: &str = "postgres";

/// A CTE that turns off `synchronous_commit` for the current transaction (one statement); the
/// statement must select `FROM async_commit` so it is evaluated.
const ASYNC: &str = "async_commit AS (SELECT set_config('synchronous_commit', 'off', true))";

/// Pooled connections for statements (the listener has its own).
const POOL_SIZE: u32 = 8;

/// The statements of one client, built once with the validated table name.
struct Statements {
    create: SqlStr,
    create_queue: SqlStr,
    gc_queue: SqlStr,
    acquire: SqlStr,
    floor_acquire: SqlStr,
    wait_acquire: SqlStr,
    enqueue: SqlStr,
    refresh: SqlStr,
    cancel: SqlStr,
    release: SqlStr,
    floor_release: SqlStr,
    release_owner: SqlStr,
    extend: SqlStr,
    extend_many: SqlStr,
    inspect: SqlStr,
    forget: SqlStr,
    forget_queue: SqlStr,
}

impl Statements {
    fn new(table: &str) -> Self {
        // The table name is a validated identifier ([A-Za-z_][A-Za-z0-9_]{0,62}); it doubles as
        // the NOTIFY channel.
        let t = format!("\"{table}\"");
        let w = format!("\"{}\"", crate::common::queue_table(table));
        Statements {
            create: sql(format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name text COLLATE \"C\" NOT NULL PRIMARY KEY, \
                 owner text NULL, \
                 fence bigint NOT NULL, \
                 expires_at timestamptz NOT NULL)"
            )),
            // Waiters: one row per queued acquire; `ticket` orders them, `expires_at` is the
            // waiter's liveness (refreshed while it waits).
            create_queue: sql(format!(
                "CREATE TABLE IF NOT EXISTS {w} (\
                 ticket bigint GENERATED ALWAYS AS IDENTITY, \
                 name text COLLATE \"C\" NOT NULL, \
                 waiter text NOT NULL, \
                 expires_at timestamptz NOT NULL, \
                 PRIMARY KEY (name, ticket))"
            )),
            gc_queue: sql(format!(
                "DELETE FROM {w} WHERE expires_at <= clock_timestamp()"
            )),
            // $1 name, $2 owner, $3 ttl in µs, $4 token floor (0 = none). The row is inserted,
            // or taken over when free or expired (or already ours: a retry of this same
            // statement), setting the fence to GREATEST(fence + 1, floor); never while a live
            // waiter is queued for the name (no jumping the queue).
            acquire: sql(format!(
                "INSERT INTO {t} AS l (name, owner, fence, expires_at) \
                 SELECT $1, $2, GREATEST(1, $4::bigint), \
                 clock_timestamp() + $3::bigint * interval '1 microsecond' \
                 WHERE NOT EXISTS (SELECT 1 FROM {w} AS w \
                 WHERE w.name = $1 AND w.expires_at > clock_timestamp()) \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = EXCLUDED.owner, fence = GREATEST(l.fence + 1, $4::bigint), \
                 expires_at = EXCLUDED.expires_at \
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner \
                 RETURNING fence"
            )),
            // The raw floor: the plain acquire, without the queue check.
            floor_acquire: sql(format!(
                "INSERT INTO {t} AS l (name, owner, fence, expires_at) \
                 VALUES ($1, $2, 1, clock_timestamp() + $3::bigint * interval '1 microsecond') \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = EXCLUDED.owner, fence = l.fence + 1, expires_at = EXCLUDED.expires_at \
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner \
                 RETURNING fence"
            )),
            // $1 name, $2 waiter (= owner), $3 ttl in µs, $4 ticket, $5 token floor (0 = none).
            // A queued waiter's attempt: only when no live waiter with a smaller ticket is
            // queued and the row is not held by another (checked first, so waiters that are not
            // next write nothing); the grant sets the fence to GREATEST(fence + 1, floor) and
            // deletes the waiter's row (and expired ones) in the same statement. Returns the
            // fence if granted, and the holder's time left in µs.
            wait_acquire: sql(format!(
                "WITH acq AS (\
                 INSERT INTO {t} AS l (name, owner, fence, expires_at) \
                 SELECT $1, $2, GREATEST(1, $5::bigint), \
                 clock_timestamp() + $3::bigint * interval '1 microsecond' \
                 WHERE NOT EXISTS (SELECT 1 FROM {w} AS w \
                 WHERE w.name = $1 AND w.ticket < $4 AND w.waiter <> $2 \
                 AND w.expires_at > clock_timestamp()) \
                 AND NOT EXISTS (SELECT 1 FROM {t} AS h \
                 WHERE h.name = $1 AND h.owner <> $2 AND h.expires_at > clock_timestamp()) \
                 ON CONFLICT (name) DO UPDATE \
                 SET owner = EXCLUDED.owner, fence = GREATEST(l.fence + 1, $5::bigint), \
                 expires_at = EXCLUDED.expires_at \
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner \
                 RETURNING fence), \
                 dequeued AS (DELETE FROM {w} AS w WHERE w.name = $1 \
                 AND (w.waiter = $2 OR w.expires_at <= clock_timestamp()) \
                 AND EXISTS (SELECT 1 FROM acq)) \
                 SELECT (SELECT fence FROM acq), \
                 (SELECT (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000000)::bigint \
                 FROM {t} AS h WHERE h.name = $1 AND h.owner IS NOT NULL \
                 AND h.expires_at > clock_timestamp())"
            )),
            // Queue bookkeeping below commits without waiting for the WAL flush
            // (`synchronous_commit` off for that one transaction): a waiter row lost in a crash
            // is re-created by its waiter's next refresh, and one that comes back expires at its
            // liveness. This keeps the joining waiter's commit from queueing behind (or ahead
            // of) the head's grant on the WAL flush.
            //
            // $1 name, $2 waiter, $3 liveness in µs. Joins the tail; drops expired waiters of
            // the name on the way.
            enqueue: sql(format!(
                "WITH gc AS (DELETE FROM {w} WHERE name = $1 AND expires_at <= clock_timestamp()), \
                 {ASYNC} \
                 INSERT INTO {w} (name, waiter, expires_at) \
                 SELECT $1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond' \
                 FROM async_commit RETURNING ticket"
            )),
            // $1 name, $2 waiter, $3 liveness in µs. Never revives an expired waiter (it rejoins
            // at the tail instead).
            refresh: sql(format!(
                "WITH {ASYNC} \
                 UPDATE {w} SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond' \
                 FROM async_commit \
                 WHERE name = $1 AND waiter = $2 AND expires_at > clock_timestamp()"
            )),
            // $1 name, $2 waiter. Leaves the queue (and drops expired waiters), frees a lease
            // granted to this waiter, and wakes the others if anything changed. Returns whether
            // a lease was freed. (A free that a crash loses ends at the lease's ttl.)
            cancel: sql(format!(
                "WITH gone AS (DELETE FROM {w} \
                 WHERE name = $1 AND (waiter = $2 OR expires_at <= clock_timestamp()) RETURNING 1), \
                 freed AS (UPDATE {t} SET owner = NULL WHERE name = $1 AND owner = $2 RETURNING 1), \
                 {ASYNC} \
                 SELECT (SELECT count(*) FROM freed), \
                 (SELECT count(pg_notify('{table}', 'N' || $1)) FROM \
                 (SELECT 1 FROM gone UNION ALL SELECT 1 FROM freed LIMIT 1) AS x) \
                 FROM async_commit"
            )),
            // $1 name, $2 owner, $3 fence. The row stays (the fence must never reset). Wakes
            // only the head of the queue when there is one (see `Payload`): waking every waiter
            // made each release start as many attempts as there were waiters, and the head's
            // attempt queued behind them.
            release: sql(format!(
                "WITH released AS (\
                 UPDATE {t} SET owner = NULL \
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp() \
                 RETURNING name), \
                 head AS (SELECT waiter FROM {w} \
                 WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY ticket LIMIT 1) \
                 SELECT count(pg_notify('{table}', \
                 CASE WHEN h.waiter IS NULL THEN 'N' || r.name ELSE 'W' || h.waiter || r.name END)) \
                 FROM released AS r LEFT JOIN head AS h ON true"
            )),
            // The raw floor's release: the plain compare-and-free with a notification, without
            // looking up the queue's head.
            floor_release: sql(format!(
                "WITH released AS (\
                 UPDATE {t} SET owner = NULL \
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp() \
                 RETURNING name) \
                 SELECT count(pg_notify('{table}', 'N' || name)) FROM released"
            )),
            // $1 name, $2 owner: cleanup after an interrupted acquire (the fence is unknown).
            release_owner: sql(format!(
                "WITH released AS (\
                 UPDATE {t} SET owner = NULL WHERE name = $1 AND owner = $2 RETURNING name) \
                 SELECT count(pg_notify('{table}', 'N' || name)) FROM released"
            )),
            // $1 name, $2 owner, $3 fence, $4 ttl in µs. Never resurrects an expired row.
            extend: sql(format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()"
            )),
            // $1 names, $2 owners, $3 fences, $4 ttls in µs (arrays): keep-alive's batch in one
            // statement; returns the owners whose rows were extended.
            extend_many: sql(format!(
                "UPDATE {t} AS l \
                 SET expires_at = clock_timestamp() + v.ttl_us * interval '1 microsecond' \
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
                 AS v(name, owner, fence, ttl_us) \
                 WHERE l.name = v.name COLLATE \"C\" AND l.owner = v.owner AND l.fence = v.fence \
                 AND l.expires_at > clock_timestamp() \
                 RETURNING l.owner"
            )),
            // $1 name. Remaining time as the database's clock sees it; live waiters.
            // Binds: name. Deletes the row of a name nobody holds or waits for (its fence too:
            // `forget` is only for names that are never used again).
            forget: sql(format!(
                "DELETE FROM {t} WHERE name = $1 AND (owner IS NULL OR expires_at <= clock_timestamp()) \
                 AND NOT EXISTS (SELECT 1 FROM {w} AS w WHERE w.name = {t}.name \
                 AND w.expires_at > clock_timestamp())"
            )),
            // Binds: name. The name's waiter rows whose liveness ran out.
            forget_queue: sql(format!(
                "DELETE FROM {w} WHERE name = $1 AND expires_at <= clock_timestamp()"
            )),
            inspect: sql(format!(
                "SELECT l.owner, l.fence, \
                 CASE WHEN l.owner IS NOT NULL AND l.expires_at > c.now \
                 THEN (extract(epoch FROM l.expires_at - c.now) * 1000000)::bigint END, \
                 (SELECT count(*) FROM {w} AS w WHERE w.name = l.name AND w.expires_at > c.now) \
                 FROM {t} AS l, LATERAL (SELECT clock_timestamp() AS now) AS c \
                 WHERE l.name = $1"
            )),
        }
    }
}

fn classify(e: &sqlx::Error) -> Class {
    if let Some(class) = classify_transport(e) {
        return class;
    }
    let code = match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()).unwrap_or_default(),
        _ => String::new(),
    };
    match code.as_str() {
        // admin_shutdown (pg_terminate_backend, fast shutdown), crash_shutdown, connection
        // exceptions: the session is gone, another connection may work.
        "57P01" | "57P02" => Class::Stale,
        c if c.starts_with("08") => Class::Stale,
        // serialization failure, deadlock, lock not available.
        "40001" | "40P01" | "55P03" => Class::Busy,
        // starting up, too many connections, out of memory/disk.
        "57P03" | "53300" | "53200" | "53100" => Class::Fail { retryable: true },
        _ => Class::Fail { retryable: false },
    }
}

/// What a release notification says (the NOTIFY payload). The channel is the table name; the
/// payload's first byte tells the form:
/// - `W<waiter><name>`: wake only `waiter` (32 hex digits), the live head of `name`'s queue when
///   the lock was freed; it is the only waiter whose attempt can be granted. Listeners of the
///   name that are not queued (`wait_for_release`) wake too.
/// - `N<name>`: wake everyone interested in `name` (nobody was queued, or a waiter left).
///
/// Anything else (a client of an older version sends the bare name) wakes nobody; waiters then
/// find the release on their next re-check ([`RECHECK`](crate::queue::RECHECK)), so a mix of
/// versions is slower but never stuck.
#[derive(Debug, PartialEq, Eq)]
enum Payload<'a> {
    Head { waiter: &'a str, name: &'a str },
    Name(&'a str),
    Unknown,
}

impl<'a> Payload<'a> {
    fn parse(payload: &'a str) -> Self {
        if let Some(name) = payload.strip_prefix('N') {
            return Payload::Name(name);
        }
        match payload.strip_prefix('W') {
            Some(rest) if rest.len() > 32 && rest.is_char_boundary(32) => {
                let (waiter, name) = rest.split_at(32);
                Payload::Head { waiter, name }
            }
            _ => Payload::Unknown,
        }
    }
}

/// The wakeups of one name in this client.
#[derive(Default)]
struct Interest {
    /// Listeners that are not queued (`wait_for_release`): woken by every release of the name.
    any: Arc<Notify>,
    /// Queued waiters by id: woken when named as the head, or by an `N` payload.
    queued: HashMap<String, Arc<Notify>>,
}

/// Per-name wakeups fed by the listener task.
struct Waiters {
    by_name: Mutex<HashMap<String, Interest>>,
    /// Whether the listener connection is up and LISTENing.
    ready: watch::Sender<bool>,
}

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Interest>> {
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Interest in every release of `name`.
    fn register(self: &Arc<Self>, name: &str) -> Registration {
        let notify = self.map().entry(name.to_owned()).or_default().any.clone();
        Registration {
            waiters: self.clone(),
            name: name.to_owned(),
            waiter: None,
            notify,
        }
    }

    /// A queued waiter's interest: woken when it is the head a release names.
    fn register_waiter(self: &Arc<Self>, name: &str, waiter: OwnerId) -> Registration {
        let waiter = waiter.to_string();
        let notify = Arc::new(Notify::new());
        self.map()
            .entry(name.to_owned())
            .or_default()
            .queued
            .insert(waiter.clone(), notify.clone());
        Registration {
            waiters: self.clone(),
            name: name.to_owned(),
            waiter: Some(waiter),
            notify,
        }
    }

    fn wake(&self, payload: &str) {
        let map = self.map();
        match Payload::parse(payload) {
            Payload::Head { waiter, name } => {
                if let Some(i) = map.get(name) {
                    i.any.notify_waiters();
                    if let Some(n) = i.queued.get(waiter) {
                        n.notify_waiters();
                    }
                }
            }
            Payload::Name(name) => {
                if let Some(i) = map.get(name) {
                    i.any.notify_waiters();
                    i.queued.values().for_each(|n| n.notify_waiters());
                }
            }
            Payload::Unknown => {}
        }
    }

    /// After a reconnect notifications may have been missed: everyone re-checks.
    fn wake_all(&self) {
        for i in self.map().values() {
            i.any.notify_waiters();
            i.queued.values().for_each(|n| n.notify_waiters());
        }
    }
}

/// One interest in a name; removes the map entry when the last one goes.
pub(crate) struct Registration {
    waiters: Arc<Waiters>,
    name: String,
    /// The queued waiter's id, for [`Waiters::register_waiter`].
    waiter: Option<String>,
    notify: Arc<Notify>,
}

impl Registration {
    /// The wakeup the listener task fires.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.waiters.map();
        let Some(interest) = map.get_mut(&self.name) else {
            return;
        };
        if let Some(waiter) = &self.waiter {
            interest.queued.remove(waiter);
        }
        // The map holds one reference to `any`, and a name-wide registration being dropped
        // holds another.
        let others = Arc::strong_count(&interest.any) - 1 - usize::from(self.waiter.is_none());
        if others == 0 && interest.queued.is_empty() {
            map.remove(&self.name);
        }
    }
}

/// How often, while anyone in this client waits, the listener is checked: a notification sent
/// through the pool to the client's own ping channel must come back through the listener within
/// the client's `timeout`. A LISTEN connection that died silently (a middlebox dropped it while
/// idle, its server process hangs) never reports an error; without this, waits would fall back
/// to the 0.5 s re-check for the rest of the client's life.
pub(crate) const LISTENER_CHECK: Duration = Duration::from_secs(5);

/// Where the listener task gets its connections and what it listens to.
struct Listen {
    /// How to open a LISTEN connection.
    opts: PgConnectOptions,
    /// The one-connection pool of the LISTEN connection in use, for `close()`.
    current: Arc<Mutex<Option<PgPool>>>,
    /// The client's pool and statement rules, which send the pings.
    core: Core<Postgres>,
    /// The release channel (the table name).
    channel: String,
    /// This client's own ping channel.
    ping: String,
}

/// Keeps one LISTEN connection up and dispatches notifications by payload (see [`Payload`]),
/// replacing it when it fails or stops answering pings.
async fn listen_loop(listen: Listen, waiters: Arc<Waiters>) {
    let mut delay = Duration::from_millis(50);
    loop {
        // A new one-connection pool each time: dropping a listener returns its connection to
        // its pool only after an `UNLISTEN *`, which a silent connection never answers, so a
        // shared pool would stay exhausted until TCP gave up on that connection.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(listen.core.timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_lazy_with(listen.opts.clone());
        *listen
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(listen_pool.clone());
        let connected = async {
            let mut l = PgListener::connect_with(&listen_pool).await?;
            l.listen_all([listen.channel.as_str(), listen.ping.as_str()])
                .await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let listener = match connected {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(backend = BACKEND, error = %e, "listener connection failed; waiters poll until it is back");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        delay = Duration::from_millis(50);
        let (pongs, seen) = watch::channel(0u64);
        let receiving = Receiving(tokio::spawn(receive(
            listener,
            listen.ping.clone(),
            waiters.clone(),
            pongs,
        )));
        // Waiters that arrived while we were not listening wait for this flag (they have not
        // re-checked the row yet), so they need no extra wakeup.
        waiters.ready.send_replace(true);
        let why = supervise(&listen, &waiters, receiving, seen).await;
        tracing::debug!(backend = BACKEND, "{why}; listening on a new connection");
        waiters.ready.send_replace(false);
        waiters.wake_all();
    }
}

/// The task reading the LISTEN connection, aborted (with its connection) when dropped.
struct Receiving(JoinHandle<sqlx::Error>);

impl Drop for Receiving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads notifications until the connection fails: releases wake waiters, pings count.
async fn receive(
    mut listener: PgListener,
    ping: String,
    waiters: Arc<Waiters>,
    pongs: watch::Sender<u64>,
) -> sqlx::Error {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) if n.channel() == ping => pongs.send_modify(|c| *c += 1),
            Ok(Some(n)) => waiters.wake(n.payload()),
            // The connection dropped and was re-established (LISTEN included); anything sent
            // in between is lost, so everyone re-checks.
            Ok(None) => waiters.wake_all(),
            Err(e) => return e,
        }
    }
}

/// Watches the receiving task and, while anyone waits, pings through the pool every
/// [`LISTENER_CHECK`]. Returns why the connection must be replaced.
async fn supervise(
    listen: &Listen,
    waiters: &Waiters,
    mut receiving: Receiving,
    mut pongs: watch::Receiver<u64>,
) -> String {
    loop {
        tokio::select! {
            ended = &mut receiving.0 => {
                return match ended {
                    Ok(e) => format!("listener connection lost: {e}"),
                    Err(e) => format!("listener task ended: {e}"),
                };
            }
            _ = tokio::time::sleep(LISTENER_CHECK) => {}
        }
        if waiters.map().is_empty() {
            continue;
        }
        let before = *pongs.borrow_and_update();
        let sent = listen
            .core
            .run("ping the listener", None, |mut c| {
                let q = sqlx::query("SELECT pg_notify($1, '')").bind(listen.ping.as_str());
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await;
        if sent.is_err() {
            // The server is out of reach for the pool too; the waiters' own statements see
            // that, and the listener's errors end `receiving`.
            continue;
        }
        let answered =
            tokio::time::timeout(listen.core.timeout, pongs.wait_for(|n| *n > before)).await;
        if !matches!(answered, Ok(Ok(_))) {
            return format!(
                "listener silent: a ping sent through the pool did not come back within {:?}",
                listen.core.timeout
            );
        }
    }
}

struct Inner {
    core: Core<Postgres>,
    sql: Statements,
    table: String,
    redacted: String,
    defaults: ClientDefaults,
    /// How the listener connects, and its current pool (see [`Listen`]).
    listen_opts: PgConnectOptions,
    listen_pool: Arc<Mutex<Option<PgPool>>>,
    /// This client's ping channel (see [`LISTENER_CHECK`]).
    ping: String,
    listener: Mutex<Option<JoinHandle<()>>>,
    waiters: Arc<Waiters>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// The undo for a detached acquire statement: release by owner.
fn release_later(
    inner: &Arc<Inner>,
    name: &LockName,
    owner: OwnerId,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool>> + Send>>
+ Send
+ 'static {
    let (inner, name) = (inner.clone(), name.clone());
    move || Box::pin(async move { inner.release_owner(&name, owner).await })
}

impl Inner {
    fn ensure_listener(&self) {
        let mut slot = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(tokio::spawn(listen_loop(
                Listen {
                    opts: self.listen_opts.clone(),
                    current: self.listen_pool.clone(),
                    core: self.core.clone(),
                    channel: self.table.clone(),
                    ping: self.ping.clone(),
                },
                self.waiters.clone(),
            )));
        }
    }

    async fn release_owner(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let owner = owner.to_string();
        let n: i64 = self
            .core
            .run("release", Some(name), |mut c| {
                let q = sqlx::query_scalar(self.sql.release_owner.clone())
                    .bind(name.as_str())
                    .bind(owner.as_str());
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(n > 0)
    }

    /// The acquire statement (see [`detached`]): the fence if granted, and how many tries it
    /// took (a retry may have followed a lost reply to a grant).
    async fn acquire_statement(
        self: Arc<Self>,
        name: LockName,
        owner: String,
        ttl_us: i64,
        floor: i64,
    ) -> Result<(Option<i64>, u32)> {
        let mut tries = 0;
        let fence = self
            .core
            .run("acquire", Some(&name), |mut c| {
                tries += 1;
                let q = sqlx::query_scalar(self.sql.acquire.clone())
                    .bind(name.as_str())
                    .bind(owner.as_str())
                    .bind(ttl_us)
                    .bind(floor);
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok((fence, tries))
    }

    /// A waiter's attempt (see [`detached`]): the fence if granted, the holder's µs left.
    async fn wait_statement(
        self: Arc<Self>,
        name: LockName,
        waiter: String,
        ttl_us: i64,
        ticket: i64,
        floor: i64,
    ) -> Result<(Option<i64>, Option<i64>)> {
        self.core
            .run("acquire", Some(&name), |mut c| {
                let q = sqlx::query_as(self.sql.wait_acquire.clone())
                    .bind(name.as_str())
                    .bind(waiter.as_str())
                    .bind(ttl_us)
                    .bind(ticket)
                    .bind(floor);
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }

    /// (owner, fence, µs left if held, live waiters) of `name`'s row.
    async fn inspect_row(
        &self,
        name: &LockName,
    ) -> Result<Option<(Option<String>, i64, Option<i64>, i64)>> {
        self.core
            .run("inspect", Some(name), |mut c| {
                let q = sqlx::query_as(self.sql.inspect.clone()).bind(name.as_str());
                async move {
                    let r = q.fetch_optional(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }
}

/// A PostgreSQL lock client: a pool of up to 8 connections for statements plus one listener
/// connection, started on the first wait, shared by every name this client waits on.
///
/// `Debug` shows the URL without its password.
#[derive(Clone)]
pub struct PostgresLock {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLock")
            .field("url", &self.inner.redacted)
            .field("table", &self.inner.table)
            .finish()
    }
}

impl PostgresLock {
    /// Connects and creates the lease table if it does not exist.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is not a PostgreSQL URL; [`Error::Backend`] if the
    /// server cannot be reached or the table cannot be created.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; a table being created is either created or
    /// not.
    pub async fn connect(config: &SqlConfig) -> Result<Self> {
        let Target::Postgres(opts) = &config.target else {
            return Err(Error::invalid_config(BACKEND, "not a postgres:// URL"));
        };
        let timeout = crate::config::timeout_of(config);
        let mut opts: PgConnectOptions = opts.clone();
        let tls = crate::config::read_tls(config)?;
        if let Some(pem) = tls.ca {
            opts = opts.ssl_root_cert_from_pem(pem);
        }
        if let Some((cert, key)) = tls.client {
            opts = opts
                .ssl_client_cert_from_pem(cert)
                .ssl_client_key_from_pem(key);
        }
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_lazy_with(opts.clone());
        let waiters = Arc::new(Waiters {
            by_name: Mutex::default(),
            ready: watch::Sender::new(false),
        });
        let lock = PostgresLock {
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
                listen_opts: opts,
                listen_pool: Arc::default(),
                ping: format!("dlock_ping_{}", OwnerId::random()),
                listener: Mutex::new(None),
                waiters,
            }),
        };
        lock.inner.core.probe(&lock.inner.listen_opts).await?;
        lock.create_table().await?;
        Ok(lock)
    }

    /// `CREATE TABLE IF NOT EXISTS` is not safe against itself in PostgreSQL: two sessions may
    /// both pass the existence check and one fails on the `pg_type` unique index (23505), with
    /// "type already exists" (42710) or with 42P07. Running it again then finds the table.
    /// The lease table first, then the waiters table; then expired waiter rows left by crashed
    /// processes are dropped (best effort).
    async fn create_table(&self) -> Result<()> {
        let inner = &self.inner;
        for statement in [&inner.sql.create, &inner.sql.create_queue] {
            let mut tries = 0;
            loop {
                tries += 1;
                let r = inner
                    .core
                    .run("create table", None, |mut c| {
                        let q = sqlx::query(statement.clone());
                        async move {
                            let r = q.execute(c.conn()).await;
                            (c, r)
                        }
                    })
                    .await;
                match r {
                    Ok(_) => break,
                    Err(Error::Backend { source, .. })
                        if tries < 10
                            && source
                                .downcast_ref::<sqlx::Error>()
                                .and_then(|e| e.as_database_error())
                                .and_then(|d| d.code())
                                .is_some_and(|c| matches!(&*c, "23505" | "42P07" | "42710")) =>
                    {
                        tokio::time::sleep(Duration::from_millis(5 * tries)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
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
        Ok(())
    }

    /// Closes the pools (and the listener) gracefully. Dropping every clone does the same without
    /// waiting.
    ///
    /// # Errors
    /// None: closing is best-effort and cannot fail.
    ///
    /// # Cancel safety
    /// Safe to drop; connections then close in the background.
    pub async fn close(&self) {
        let task = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        let listen_pool = self
            .inner
            .listen_pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(pool) = listen_pool {
            pool.close().await;
        }
        self.inner.core.pool.close().await;
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }
}

#[async_trait]
impl DistributedLock for PostgresLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::ListenNotify,
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
        let ttl = opts.ttl_value();
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
        let (fence, tries) = detached(
            BACKEND,
            name,
            inner
                .clone()
                .acquire_statement(name.clone(), owner_text, micros(ttl), floor),
            |(fence, tries)| fence.is_some() || *tries > 1,
            release_later(inner, name, owner),
        )
        .await?;
        // A retry after a broken connection may find the queue non-empty although the first
        // try (whose reply was lost) got the lock: then it is given back, here and now, since a
        // waiting acquire goes on with the same owner id when the caller chose it.
        if fence.is_none() && tries > 1 {
            inner.release_owner(name, owner).await?;
        }
        cleanup.disarm();
        Ok(fence.map(|f| {
            Lease::new(
                name.clone(),
                owner,
                token(f),
                started,
                ttl,
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

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        let inner = &self.inner;
        inner.ensure_listener();
        // Subscribe first, then look: a release between the two still wakes us.
        let registration = inner.waiters.register(name.as_str());
        let notified = registration.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let mut ready = inner.waiters.ready.subscribe();
        if !*ready.borrow_and_update() {
            // Not listening yet (first wait, or the server is away): poll at the helper's pace.
            let _ = tokio::time::timeout_at(until.into(), ready.wait_for(|r| *r)).await;
            return Ok(());
        }
        let wake_at = match tokio::time::timeout_at(until.into(), inner.inspect_row(name)).await {
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

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let inner = &self.inner;
        let owner = lease.owner().to_string();
        let fence = i64::try_from(lease.token().0).unwrap_or(i64::MAX);
        let n: i64 = inner
            .core
            .run("release", Some(lease.name()), |mut c| {
                let q = sqlx::query_scalar(inner.sql.release.clone())
                    .bind(lease.name().as_str())
                    .bind(owner.as_str())
                    .bind(fence);
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(if n > 0 {
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
                    .bind(lease.name().as_str())
                    .bind(owner.as_str())
                    .bind(fence)
                    .bind(micros(ttl));
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(lease.renewed(started, ttl))
        } else {
            Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
        }
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let (mut results, todo) = checked_batch(leases);
        if !todo.is_empty() {
            let inner = &self.inner;
            let started = Instant::now();
            let names: Vec<&str> = todo.iter().map(|&i| leases[i].0.name().as_str()).collect();
            let owners: Vec<String> = todo
                .iter()
                .map(|&i| leases[i].0.owner().to_string())
                .collect();
            let fences: Vec<i64> = todo
                .iter()
                .map(|&i| i64::try_from(leases[i].0.token().0).unwrap_or(i64::MAX))
                .collect();
            let ttls: Vec<i64> = todo.iter().map(|&i| micros(leases[i].1)).collect();
            let done: Result<Vec<String>> = inner
                .core
                .run("extend", None, |mut c| {
                    let q = sqlx::query_scalar(inner.sql.extend_many.clone())
                        .bind(names.as_slice())
                        .bind(owners.as_slice())
                        .bind(fences.as_slice())
                        .bind(ttls.as_slice());
                    async move {
                        let r = q.fetch_all(c.conn()).await;
                        (c, r)
                    }
                })
                .await;
            match done {
                Ok(done) => {
                    let done: std::collections::HashSet<String> = done.into_iter().collect();
                    for (&i, owner) in todo.iter().zip(&owners) {
                        let (lease, ttl) = &leases[i];
                        results[i] = Some(if done.contains(owner) {
                            Ok(lease.renewed(started, *ttl))
                        } else {
                            Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
                        });
                    }
                }
                Err(e) => {
                    for &i in &todo {
                        results[i] = Some(Err(batch_error(&e, leases[i].0.name())));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every lease has a result"))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        Ok(self
            .inner
            .inspect_row(name)
            .await?
            .map(|(owner, fence, remaining, waiters)| {
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
                name.as_str().to_owned(),
            )
            .await?;
        Ok(self.inspect(name).await?.is_none())
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        Some(Arc::new(PgFloor {
            inner: self.inner.clone(),
        }))
    }
}

impl Queue for PostgresLock {
    const BACKEND: &'static str = BACKEND;

    fn wake(&self, name: &LockName, waiter: OwnerId) -> Wake {
        let inner = &self.inner;
        inner.ensure_listener();
        Wake::notify(
            inner.waiters.register_waiter(name.as_str(), waiter),
            inner.waiters.ready.subscribe(),
        )
    }

    async fn enqueue(&self, name: &LockName, waiter: &str) -> Result<i64> {
        let inner = &self.inner;
        inner
            .core
            .run("enqueue", Some(name), |mut c| {
                let q = sqlx::query_scalar(inner.sql.enqueue.clone())
                    .bind(name.as_str())
                    .bind(waiter)
                    .bind(micros(LIVENESS));
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await
    }

    async fn refresh(&self, name: &LockName, waiter: &str) -> Result<bool> {
        let inner = &self.inner;
        let done = inner
            .core
            .run("refresh waiter", Some(name), |mut c| {
                let q = sqlx::query(inner.sql.refresh.clone())
                    .bind(name.as_str())
                    .bind(waiter)
                    .bind(micros(LIVENESS));
                async move {
                    let r = q.execute(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
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
        let undo = {
            let (lock, name) = (self.clone(), name.clone());
            move || async move { lock.cancel(&name, waiter).await }
        };
        let (fence, left) = detached(
            BACKEND,
            name,
            inner.clone().wait_statement(
                name.clone(),
                waiter.to_string(),
                micros(ttl),
                ticket,
                floor,
            ),
            |(fence, _)| fence.is_some(),
            undo,
        )
        .await?;
        Ok(match fence {
            Some(f) => Attempt::Granted(f),
            None => Attempt::Blocked {
                ahead: None,
                holder_left: from_micros(left),
            },
        })
    }

    async fn dequeue(&self, _name: &LockName, _waiter: &str) -> Result<()> {
        // The grant deleted the waiter's row in the same statement.
        Ok(())
    }

    async fn cancel(&self, name: &LockName, waiter: OwnerId) -> Result<bool> {
        let inner = &self.inner;
        let waiter = waiter.to_string();
        let (freed, _notified): (i64, i64) = inner
            .core
            .run("leave queue", Some(name), |mut c| {
                let q = sqlx::query_as(inner.sql.cancel.clone())
                    .bind(name.as_str())
                    .bind(waiter.as_str());
                async move {
                    let r = q.fetch_one(c.conn()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(freed > 0)
    }
}

/// The plain acquire (no waiter-queue check) and the release statement straight on the pool: no
/// retries, time limits, guards or lockcore layer.
struct PgFloor {
    inner: Arc<Inner>,
}

#[async_trait]
impl RawFloor for PgFloor {
    fn description(&self) -> String {
        "INSERT .. ON CONFLICT DO UPDATE .. RETURNING fence (without the queue check), then \
         UPDATE .. SET owner = NULL with pg_notify, on the same sqlx pool"
            .into()
    }

    async fn pair(&self, name: &LockName) -> Result<()> {
        let pool = &self.inner.core.pool;
        let owner = OwnerId::random().to_string();
        let err = |e| Error::backend(BACKEND, "raw floor", Some(name), true, e);
        let fence: Option<i64> = sqlx::query_scalar(self.inner.sql.floor_acquire.clone())
            .bind(name.as_str())
            .bind(owner.as_str())
            .bind(micros(Duration::from_secs(10)))
            .fetch_optional(pool)
            .await
            .map_err(err)?;
        if let Some(fence) = fence {
            let _: i64 = sqlx::query_scalar(self.inner.sql.floor_release.clone())
                .bind(name.as_str())
                .bind(owner.as_str())
                .bind(fence)
                .fetch_one(pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "000000000000000000000000000000aa";

    /// A wakeup of `r`, enabled so that a notification from now on fires it.
    fn arm(r: &Registration) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut f = Box::pin(r.notify().notified());
        f.as_mut().enable();
        f
    }

    fn waiters() -> Arc<Waiters> {
        Arc::new(Waiters {
            by_name: Mutex::default(),
            ready: watch::channel(false).0,
        })
    }

    /// Whether the wakeup `f` fired since it was enabled.
    fn woken(f: &mut std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>) -> bool {
        use std::future::Future;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn payloads_parse_by_their_first_byte() {
        assert_eq!(Payload::parse("Njobs/1"), Payload::Name("jobs/1"));
        assert_eq!(
            Payload::parse(&format!("W{A}jobs/1")),
            Payload::Head {
                waiter: A,
                name: "jobs/1"
            }
        );
        // A name may itself start with N or W, or be anything but NUL.
        assert_eq!(Payload::parse("NW"), Payload::Name("W"));
        assert_eq!(
            Payload::parse(&format!("W{A}N")),
            Payload::Head {
                waiter: A,
                name: "N"
            }
        );
        // Too short for a waiter id and a name, or an older client's bare name.
        assert_eq!(Payload::parse(&format!("W{A}")), Payload::Unknown);
        assert_eq!(Payload::parse("jobs/1"), Payload::Unknown);
        assert_eq!(Payload::parse("Wé"), Payload::Unknown);
    }

    #[test]
    fn a_head_payload_wakes_only_that_waiter_and_name_wide_listeners() {
        let w = waiters();
        let a = OwnerId(0xaa);
        let b = OwnerId(0xbb);
        assert_eq!(a.to_string(), A);
        let ra = w.register_waiter("n", a);
        let rb = w.register_waiter("n", b);
        let any = w.register("n");
        let other = w.register_waiter("m", a);
        let (mut fa, mut fb, mut fany, mut fother) = (arm(&ra), arm(&rb), arm(&any), arm(&other));
        w.wake(&format!("W{A}n"));
        assert!(woken(&mut fa), "the head was not woken");
        assert!(!woken(&mut fb), "a waiter behind the head was woken");
        assert!(woken(&mut fany), "a name-wide listener was not woken");
        assert!(!woken(&mut fother), "a waiter of another name was woken");

        let (mut fa, mut fb) = (arm(&ra), arm(&rb));
        w.wake("Nn");
        assert!(
            woken(&mut fa) && woken(&mut fb),
            "N did not wake every waiter"
        );
        assert!(!woken(&mut fother), "N woke another name");

        let mut fb = arm(&rb);
        w.wake("n");
        assert!(!woken(&mut fb), "an unknown payload woke someone");
        w.wake_all();
        assert!(
            woken(&mut fb) && woken(&mut fother),
            "wake_all missed a waiter"
        );
    }

    #[test]
    fn registrations_remove_their_entries_when_dropped() {
        let w = waiters();
        let ra = w.register_waiter("n", OwnerId(1));
        let any1 = w.register("n");
        let any2 = w.register("n");
        drop(ra);
        assert!(
            w.map().contains_key("n"),
            "removed while name-wide listeners remain"
        );
        drop(any1);
        assert!(
            w.map().contains_key("n"),
            "removed while one listener remains"
        );
        let rb = w.register_waiter("n", OwnerId(2));
        drop(any2);
        assert!(w.map().contains_key("n"), "removed while a waiter remains");
        assert_eq!(w.map()["n"].queued.len(), 1);
        drop(rb);
        assert!(
            w.map().is_empty(),
            "the entry outlived its last registration"
        );
    }
}
