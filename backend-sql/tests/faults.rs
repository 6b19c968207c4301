//! Fault tests on real servers: the database killed -9 and restarted, the holder's link
//! blackholed through the kit's proxy, the holder's sessions killed by the server, and a holder
//! process killed -9. Safety is checked on recorded histories (no two holders' windows overlap,
//! tokens grow) and with a fenced resource (stale writes are rejected).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::kit::{self, Fault, Proxy};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{
    AcquireOptions, DistributedLock, Error, FencingToken, KeepAlive, LockExt, LockGuard, LockName,
    LostReason, Released, Wait,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Postgres,
    MariaDb,
}

/// A kit server of either kind, private or shared.
enum Server {
    Pg(kit::Postgres),
    My(kit::MariaDb),
    SharedPg(&'static kit::Postgres),
    SharedMy(&'static kit::MariaDb),
}

impl Server {
    async fn private(kind: Kind) -> Server {
        match kind {
            Kind::Postgres => Server::Pg(kit::Postgres::start().await.expect("kit PostgreSQL")),
            Kind::MariaDb => Server::My(kit::MariaDb::start().await.expect("kit MariaDB")),
        }
    }

    async fn shared(kind: Kind) -> Server {
        match kind {
            Kind::Postgres => {
                Server::SharedPg(kit::Postgres::shared().await.expect("kit PostgreSQL"))
            }
            Kind::MariaDb => Server::SharedMy(kit::MariaDb::shared().await.expect("kit MariaDB")),
        }
    }

    fn pg(&self) -> Option<&kit::Postgres> {
        match self {
            Server::Pg(p) => Some(p),
            Server::SharedPg(p) => Some(p),
            _ => None,
        }
    }

    fn my(&self) -> Option<&kit::MariaDb> {
        match self {
            Server::My(m) => Some(m),
            Server::SharedMy(m) => Some(m),
            _ => None,
        }
    }

    /// A fresh database's URL and name.
    async fn fresh_database(&self) -> (String, String) {
        let url = match (self.pg(), self.my()) {
            (Some(p), _) => p.fresh_database("faults").await,
            (_, Some(m)) => m.fresh_database("faults").await,
            _ => unreachable!(),
        }
        .expect("create database");
        let db = url.rsplit('/').next().expect("database").to_owned();
        (url, db)
    }

    fn addr(&self) -> std::net::SocketAddr {
        match (self.pg(), self.my()) {
            (Some(p), _) => p.addr(),
            (_, Some(m)) => m.addr(),
            _ => unreachable!(),
        }
    }

    fn kill9(&self) {
        match (self.pg(), self.my()) {
            (Some(p), _) => p.kill9(),
            (_, Some(m)) => m.kill9(),
            _ => unreachable!(),
        }
    }

    async fn restart(&self) {
        match (self.pg(), self.my()) {
            (Some(p), _) => p.restart().await,
            (_, Some(m)) => m.restart().await,
            _ => unreachable!(),
        }
        .expect("restart");
    }

    /// Ends every server session connected to `db` (the server side of the connection dies:
    /// `pg_terminate_backend` / `KILL`). Returns how many it ended.
    async fn kill_sessions(&self, db: &str) -> usize {
        if let Some(p) = self.pg() {
            let out = p
                .query(
                    "postgres",
                    &format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = '{db}' AND pid <> pg_backend_pid()"
                    ),
                )
                .await
                .expect("psql");
            return out.trim().parse().expect("count");
        }
        let m = self.my().expect("server");
        let ids = m
            .query(
                "mysql",
                &format!("SELECT id FROM information_schema.PROCESSLIST WHERE db = '{db}'"),
            )
            .await
            .expect("processlist");
        let ids: Vec<&str> = ids.split_whitespace().collect();
        for id in &ids {
            // A session may end by itself meanwhile ("Unknown thread id").
            let _ = m.query("mysql", &format!("KILL CONNECTION {id}")).await;
        }
        ids.len()
    }
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("name")
}

fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

async fn client(url: &str) -> Arc<dyn DistributedLock> {
    backend_sql::connect(url).await.expect("connect")
}

/// Fails instead of hanging.
async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}

/// A guarded holder's tenure, recorded when it ends: from when `lock` returned to the last
/// `valid_until` the guard knew of, or to `ended` if it stopped relying on it earlier.
fn hold_of(client: usize, guard: &LockGuard, acquired: Instant, ended: Option<Instant>) -> Hold {
    let lease = guard.lease();
    Hold {
        client,
        name: lease.name().as_str().to_owned(),
        token: lease.token().0,
        acquired,
        valid_until: lease.valid_until(),
        ended,
    }
}

/// Acquires `n`, riding out store errors (the database may be down), until `deadline`.
/// Records the tenure, writes to the fenced resource, holds briefly, releases.
async fn waiter(
    id: usize,
    c: Arc<dyn DistributedLock>,
    n: String,
    history: Arc<History>,
    fenced: Arc<FencedResource>,
    deadline: Instant,
) -> u64 {
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Wait::For(Duration::from_secs(3)));
    loop {
        assert!(
            Instant::now() < deadline,
            "waiter {id} never got the lock back"
        );
        match c.lock(&n, &opts).await {
            Ok(guard) => {
                let acquired = Instant::now();
                let token = guard.fencing_token();
                fenced
                    .write(token, id as u64)
                    .unwrap_or_else(|e| panic!("waiter {id}: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                let ended = Instant::now();
                history.push(hold_of(id, &guard, acquired, Some(ended)));
                let _ = guard.release().await;
                return token.0;
            }
            Err(Error::Timeout { .. }) => {}
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("waiter {id}: unexpected error {e}"),
        }
    }
}

// ---- the database killed -9 and restarted ----

async fn kill9_and_restart(kind: Kind) {
    let server = Server::private(kind).await;
    let (url, _) = server.fresh_database().await;
    let url = with_query(&url, "ttl=2s&timeout=1s");
    let n = "crashed";
    let history = Arc::new(History::new());
    let fenced = Arc::new(FencedResource::new());

    let holder = client(&url).await;
    let guard = holder
        .lock(n, &AcquireOptions::new().keep_alive(KeepAlive::renew()))
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    let holder_token = guard.fencing_token();
    fenced.write(holder_token, 0).expect("first write");

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut waiters = tokio::task::JoinSet::new();
    for id in 1..=2 {
        let c = client(&url).await;
        waiters.spawn(waiter(
            id,
            c,
            n.to_owned(),
            history.clone(),
            fenced.clone(),
            deadline,
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        guard.is_held(),
        "the holder kept the lock while the database was up"
    );
    assert!(
        waiters.try_join_next().is_none(),
        "a waiter got a held lock"
    );

    server.kill9();
    // Renewals fail: the holder must be told, no later than its lease's end.
    let reason = within(
        Duration::from_secs(30),
        "lost() after kill -9",
        guard.lost(),
    )
    .await;
    assert!(
        matches!(reason, LostReason::ConnectionLost | LostReason::Expired),
        "lost because {reason:?}"
    );
    assert!(!guard.is_held());
    history.push(hold_of(0, &guard, held_at, None));
    // Nobody got it while the database was down.
    assert_eq!(
        fenced.accepted().len(),
        1,
        "a write happened while the database was down"
    );

    server.restart().await;
    let mut tokens = Vec::new();
    while let Some(r) = within(
        Duration::from_secs(150),
        "waiters after restart",
        waiters.join_next(),
    )
    .await
    {
        tokens.push(r.expect("waiter task"));
    }
    assert_eq!(tokens.len(), 2, "both waiters recovered after the restart");
    for t in &tokens {
        assert!(
            *t > holder_token.0,
            "token {t} after the restart is not above the holder's {}",
            holder_token.0
        );
    }
    // The old holder's late write is refused by the fenced resource.
    assert!(
        fenced.write(holder_token, 99).is_err(),
        "stale write accepted"
    );
    assert_eq!(fenced.rejected(), 1);
    history.assert_safe();
    fenced.assert_never_accepted_stale();

    // The old holder's client works again and cannot free anything with its stale lease.
    let released = within(Duration::from_secs(30), "stale release", async {
        loop {
            match holder.release(&guard.lease()).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert_eq!(released, Released::NotHeld);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill9_restart_while_held_and_waited_for() {
    kill9_and_restart(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill9_restart_while_held_and_waited_for() {
    kill9_and_restart(Kind::MariaDb).await;
}

// ---- the holder's link blackholed past the ttl ----

async fn blackholed_holder(kind: Kind, fault: Fault) {
    let server = Server::shared(kind).await;
    let (url, _) = server.fresh_database().await;
    let proxy = Proxy::start(server.addr()).await.expect("proxy");
    let proxied = url.replace(&server.addr().to_string(), &proxy.addr().to_string());
    assert_ne!(proxied, url);
    let holder = client(&with_query(&proxied, "ttl=1500ms&timeout=500ms")).await;
    let other = client(&with_query(&url, "ttl=5s")).await;
    let n = "blackholed";
    let history = History::new();
    let fenced = FencedResource::new();

    let guard = holder
        .lock(n, &AcquireOptions::new())
        .await
        .expect("holder acquires");
    let held_at = Instant::now();
    let stale = guard.fencing_token();
    fenced.write(stale, 1).expect("holder writes");

    let taker = {
        let other = other.clone();
        tokio::spawn(async move {
            let g = other
                .lock(
                    n,
                    &AcquireOptions::new()
                        .keep_alive(KeepAlive::Off)
                        .wait(Wait::For(Duration::from_secs(60))),
                )
                .await
                .expect("the other client takes over");
            (g, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!taker.is_finished(), "taken while the holder renews");

    tokio::task::block_in_place(|| proxy.set(fault));
    let reason = within(Duration::from_secs(30), "holder's lost()", guard.lost()).await;
    assert!(
        matches!(reason, LostReason::ConnectionLost | LostReason::Expired),
        "lost because {reason:?}"
    );
    history.push(hold_of(1, &guard, held_at, None));

    let (taken, taken_at) = within(Duration::from_secs(60), "takeover", taker)
        .await
        .expect("taker task");
    assert!(taken.fencing_token() > stale);
    fenced
        .write(taken.fencing_token(), 2)
        .expect("new holder writes");
    // The partitioned holder's write arrives late: refused.
    assert!(fenced.write(stale, 3).is_err(), "stale write accepted");
    assert_eq!(fenced.rejected(), 1);

    // The link heals: the old holder's client recovers, and its stale lease frees nothing.
    tokio::task::block_in_place(|| proxy.set(Fault::PassThrough));
    let released = within(Duration::from_secs(30), "stale release", async {
        loop {
            match holder.release(&guard.lease()).await {
                Ok(r) => break r,
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert_eq!(released, Released::NotHeld);
    let info = other.inspect(&name(n)).await.unwrap().expect("row");
    assert_eq!(info.holder, Some(taken.lease().owner().to_string()));
    history.push(hold_of(2, &taken, taken_at, Some(Instant::now())));
    taken.release().await.expect("release");
    history.assert_safe();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holder_replies_blackholed_past_ttl() {
    blackholed_holder(Kind::Postgres, Fault::BlackholeReplies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holder_requests_blackholed_past_ttl() {
    blackholed_holder(Kind::Postgres, Fault::BlackholeRequests).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_holder_replies_blackholed_past_ttl() {
    blackholed_holder(Kind::MariaDb, Fault::BlackholeReplies).await;
}

// ---- the server ends the clients' sessions ----

/// One client holds `n` (keep-alive on); a second client waits for it, for up to `wait_secs`,
/// in a task that releases at once and returns its token. Returns the holder's guard, its
/// token and the waiting task.
async fn held_and_waited_for(
    url: &str,
    n: &'static str,
    wait_secs: u64,
) -> (
    LockGuard,
    FencingToken,
    tokio::task::JoinHandle<FencingToken>,
) {
    let holder = client(url).await;
    let waiter_client = client(url).await;
    let guard = holder
        .lock(n, &AcquireOptions::new())
        .await
        .expect("holder acquires");
    let token = guard.fencing_token();
    let waiting = tokio::spawn(async move {
        let g = waiter_client
            .lock(
                n,
                &AcquireOptions::new()
                    .keep_alive(KeepAlive::Off)
                    .wait(Wait::For(Duration::from_secs(wait_secs))),
            )
            .await
            .expect("waiter acquires after the release");
        let token = g.fencing_token();
        g.release().await.expect("release");
        token
    });
    (guard, token, waiting)
}

/// A lease is not a session: `pg_terminate_backend` / `KILL CONNECTION` of every session of the
/// holder and the waiter (pooled connections and the PostgreSQL listener) neither frees the lock
/// nor stops the holder from renewing; the waiter still gets it when it is released.
async fn sessions_killed(kind: Kind) {
    let server = Server::shared(kind).await;
    let (url, db) = server.fresh_database().await;
    let url = with_query(&url, "ttl=1s");
    let (guard, token, waiting) = held_and_waited_for(&url, "killed-sessions", 60).await;
    let mut killed = 0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        killed += server.kill_sessions(&db).await;
    }
    assert!(killed >= 2, "only {killed} sessions were killed");
    assert!(
        guard.watch().lost_reason().is_none() && guard.is_held(),
        "the holder lost its lease because its sessions were killed"
    );
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    guard.extend(Duration::from_secs(1)).await.expect("extend");
    guard.release().await.expect("release");
    let next = within(Duration::from_secs(60), "waiter", waiting)
        .await
        .expect("waiter task");
    assert!(next > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_terminate_backend_neither_frees_nor_breaks() {
    sessions_killed(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill_connection_neither_frees_nor_breaks() {
    sessions_killed(Kind::MariaDb).await;
}

// ---- a PostgreSQL listener that goes silent ----

/// Sends `signal` to a server process when dropped (to continue a stopped backend whatever
/// happens to the test).
struct Signal {
    pid: String,
    signal: &'static str,
}

impl Drop for Signal {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args([self.signal, &self.pid])
            .status();
    }
}

/// The server process ids of the sessions of `db` that LISTEN (the waiter's listener).
async fn listener_pids(pg: &kit::Postgres, db: &str) -> Vec<String> {
    let out = pg
        .query(
            "postgres",
            &format!(
                "SELECT pid FROM pg_stat_activity \
                 WHERE datname = '{db}' AND query LIKE 'LISTEN %' ORDER BY pid"
            ),
        )
        .await
        .expect("psql");
    out.split_whitespace().map(str::to_owned).collect()
}

/// The waiter's LISTEN connection stops answering without any error (its server process is
/// stopped, as a dropped idle connection or a hung backend would look): the client notices that
/// its ping through the pool does not come back, listens on a new connection, and the wait
/// ends with the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_silent_listener_is_replaced() {
    let server = Server::shared(Kind::Postgres).await;
    let pg = server.pg().expect("postgres");
    let (url, db) = server.fresh_database().await;
    let url = with_query(&url, "timeout=2s");
    let (guard, token, waiting) = held_and_waited_for(&url, "silent-listener", 120).await;
    let first = within(Duration::from_secs(30), "the waiter's listener", async {
        loop {
            if let [pid] = listener_pids(pg, &db).await.as_slice() {
                return pid.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // A healthy listener answers its pings and stays: two rounds of them (one every 5 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        listener_pids(pg, &db).await,
        std::slice::from_ref(&first),
        "a listener that answered its pings was replaced"
    );
    let stopped = Signal {
        pid: first.clone(),
        signal: "-CONT",
    };
    let status = std::process::Command::new("kill")
        .args(["-STOP", &first])
        .status()
        .expect("kill");
    assert!(status.success(), "cannot stop backend {first}");
    // Nothing fails on the waiter's side; only its pings can tell.
    let replacement = within(Duration::from_secs(60), "a new listener", async {
        loop {
            let pids = listener_pids(pg, &db).await;
            if let Some(pid) = pids.into_iter().find(|p| *p != first) {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_ne!(replacement, first);
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    guard.release().await.expect("release");
    let next = within(Duration::from_secs(60), "waiter", waiting)
        .await
        .expect("waiter task");
    assert!(next > token);
    drop(stopped);
}

// ---- a holder process killed -9 ----

const CHILD_ENV: &str = "DLOCK_SQL_FAULT_HOLDER_URL";
const CHILD_NAME: &str = "held-by-another-process";
const CHILD_TTL: Duration = Duration::from_secs(3);

/// Acts as the holder process when re-executed: acquires, prints the token, waits to be killed.
async fn child_holder(url: &str) {
    let c = client(url).await;
    let guard = c
        .lock(CHILD_NAME, &AcquireOptions::new().ttl(CHILD_TTL))
        .await
        .expect("child acquires");
    println!("DLOCK_HELD {}", guard.fencing_token().0);
    use std::io::Write;
    std::io::stdout().flush().expect("flush");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    drop(guard);
}

/// Another OS process holds the lock (renewing it) and is killed -9: the lock frees, but not
/// before ttl − drift has passed since the process was started, and the next token is higher.
async fn holder_process_killed(test: &str, url: String) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let spawned = Instant::now();
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the holder process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let child_token: u64 = within(Duration::from_secs(60), "holder process", async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("read")
                .expect("the holder process ended before holding the lock");
            // libtest may print "test <name> ... " on the same line first.
            if let Some((_, t)) = line.split_once("DLOCK_HELD ") {
                break t.trim().parse().expect("token");
            }
        }
    })
    .await;
    let c = client(&url).await;
    let n = name(CHILD_NAME);
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(5))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
        .with_defaults(&c.defaults());
    assert!(
        c.try_acquire(&n, &opts).await.unwrap().is_none(),
        "held by the other process"
    );
    child.kill().await.expect("kill -9 the holder process");
    let (lease, freed_at) = within(
        Duration::from_secs(60),
        "lock freed after the kill",
        async {
            loop {
                if let Some(l) = c.try_acquire(&n, &opts).await.expect("try_acquire") {
                    break (l, Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    let floor = CHILD_TTL - lockcore::default_drift(CHILD_TTL);
    assert!(
        freed_at.duration_since(spawned) >= floor,
        "freed {:?} after the holder process started, before its ttl − drift ({floor:?})",
        freed_at.duration_since(spawned)
    );
    assert!(lease.token().0 > child_token);
    c.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_holder_process_killed() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        return child_holder(&url).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    holder_process_killed("sqlite_holder_process_killed", url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holder_process_killed() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        return child_holder(&url).await;
    }
    let url = Server::shared(Kind::Postgres)
        .await
        .fresh_database()
        .await
        .0;
    holder_process_killed("postgres_holder_process_killed", url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_holder_process_killed() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        return child_holder(&url).await;
    }
    let url = Server::shared(Kind::MariaDb).await.fresh_database().await.0;
    holder_process_killed("mariadb_holder_process_killed", url).await;
}

// ---- a waiting process killed -9 ----

const WAITER_ENV: &str = "DLOCK_SQL_FAULT_WAITER_URL";
const WAITER_NAME: &str = "waited-for-by-a-killed-process";

/// Acts as the waiting process when re-executed: queues for the (held) lock and waits to be
/// killed.
async fn child_waiter(url: &str) {
    let c = client(url).await;
    let r = c
        .lock(
            WAITER_NAME,
            &AcquireOptions::new()
                .ttl(Duration::from_secs(10))
                .wait(Wait::Forever),
        )
        .await;
    // Only reached if the parent released before killing us.
    println!("DLOCK_WAITER_DONE {}", r.is_ok());
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// A process queued for the lock is killed -9, leaving its waiter row behind with no cleanup:
/// once the holder releases, the next waiter still gets the lock (the dead row stops counting
/// when its liveness runs out), with a higher token, and the queue ends empty.
async fn waiter_process_killed(test: &str, url: String) {
    let (holder, next) = (client(&url).await, client(&url).await);
    let n = name(WAITER_NAME);
    let held = holder
        .lock(
            WAITER_NAME,
            &AcquireOptions::new()
                .ttl(Duration::from_secs(60))
                .keep_alive(KeepAlive::Off)
                .wait(Wait::No),
        )
        .await
        .expect("holder acquires");
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(WAITER_ENV, &url)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the waiting process");
    within(Duration::from_secs(60), "the other process queues", async {
        loop {
            let waiters = holder
                .inspect(&n)
                .await
                .expect("inspect")
                .and_then(|i| i.waiters);
            if waiters == Some(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    child.kill().await.expect("kill -9 the waiting process");
    let waiting = {
        let next = next.clone();
        tokio::spawn(async move {
            next.lock(
                WAITER_NAME,
                &AcquireOptions::new()
                    .ttl(Duration::from_secs(10))
                    .keep_alive(KeepAlive::Off)
                    .wait(Wait::For(Duration::from_secs(60))),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held_token = held.fencing_token();
    held.release().await.expect("release");
    let got = within(Duration::from_secs(90), "the next waiter", waiting)
        .await
        .expect("task")
        .expect("the next waiter gets the lock past the dead one");
    assert!(got.fencing_token() > held_token);
    let info = next.inspect(&n).await.expect("inspect").expect("row");
    assert_eq!(info.waiters, Some(0), "the queue is empty: {info:?}");
    got.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_waiter_process_killed() {
    if let Ok(url) = std::env::var(WAITER_ENV) {
        return child_waiter(&url).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    waiter_process_killed("sqlite_waiter_process_killed", url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiter_process_killed() {
    if let Ok(url) = std::env::var(WAITER_ENV) {
        return child_waiter(&url).await;
    }
    let url = Server::shared(Kind::Postgres)
        .await
        .fresh_database()
        .await
        .0;
    waiter_process_killed("postgres_waiter_process_killed", url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_waiter_process_killed() {
    if let Ok(url) = std::env::var(WAITER_ENV) {
        return child_waiter(&url).await;
    }
    let url = Server::shared(Kind::MariaDb).await.fresh_database().await.0;
    waiter_process_killed("mariadb_waiter_process_killed", url).await;
}
