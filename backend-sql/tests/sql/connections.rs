//! Connecting: bad input refused before any I/O, passwords kept out of messages, one connection
//! per waiting client and none leaked, SQLite files shared by processes, TLS and client
//! certificates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_sql::SqlConfig;
use conformance_tests::kit;
use conformance_tests::within;
use lockcore::{
    AcquireOptions, DistributedLock, Error, KeepAlive, LockExt, Released, Wait, WaitMechanism,
};

use crate::support::*;

/// Bad URLs, options and table names fail as `InvalidConfig` (before any I/O: the hosts do not
/// exist) and never show the password.
#[tokio::test]
async fn bad_input_fails_before_io_without_the_password() {
    let secret = "Sup3rS3cret";
    let cases = [
        format!("postgres://u:{secret}@db.invalid:5432/x?colour=blue"),
        format!("postgres://u:{secret}@db.invalid:5432/x?table=1bad"),
        format!("postgres://u:{secret}@db.invalid:5432/x?table=a%22b"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ttl=forever"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ttl=1ms"),
        format!("postgres://u:{secret}@db.invalid:5432/x?timeout=0s"),
        format!("postgres://u:{secret}@db.invalid:5432/x?sslmode=verify-fully"),
        format!("postgres://u:{secret}@db.invalid:5432/x?sslmode=require&ca=/etc/ca.pem"),
        format!("postgres://u:{secret}@db.invalid:5432/x?ca=/nonexistent/ca.pem"),
        format!("mysql://u:{secret}@db.invalid:3306/x?ssl-mode=REQUIRED&ssl-ca=/etc/ca.pem"),
        format!("postgres://u:{secret}@db.invalid:notaport/x"),
        format!("postgresql://u:{secret}@/x"),
        format!("mysql://u:{secret}@db.invalid:3306"),
        format!("mariadb://u:{secret}@db.invalid:3306/x?table="),
        format!("mysql://u:{secret}@db.invalid:3306/x?prefix=a"),
        format!("mysql://u:{secret}@db.invalid/x/y"),
        "sqlite://".to_owned(),
        "sqlite:///tmp/?ttl=1s".to_owned(),
        "sqlite::memory:?table=drop%20table".to_owned(),
        "sqlite::memory:?ttl=10s&drift=20s".to_owned(),
    ];
    for url in &cases {
        // Bad input is rejected before any I/O; the timeout only turns a hang into a failure.
        let err = tokio::time::timeout(Duration::from_secs(30), backend_sql::connect(url))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} hung instead of being rejected",
                    backend_sql::redact_url(url)
                )
            })
            .expect_err(&format!(
                "{} should be rejected",
                backend_sql::redact_url(url)
            ));
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "{}: expected InvalidConfig, got {err:?}",
            backend_sql::redact_url(url)
        );
        let text = format!("{err} / {err:?}");
        assert!(!text.contains(secret), "password leaked: {text}");
    }
    let err = backend_sql::connect("oracle://u:pw@h/x").await.unwrap_err();
    match err {
        Error::UnsupportedScheme { available, .. } => {
            assert_eq!(available, backend_sql::SCHEMES)
        }
        other => panic!("{other:?}"),
    }
}

/// Debug of clients and errors from a real server never show the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_stay_out_of_debug_and_server_errors() {
    let secret = "Sup3rS3cret";
    // The kit's URL carries its password: a live client to Debug.
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let url = pg.url();
    let c = client(&url).await;
    let debug = format!("{c:?}");
    assert!(!debug.contains(pg.password()), "{debug}");
    assert!(debug.contains("***"), "{debug}");
    let config = SqlConfig::parse(&url).unwrap();
    assert!(!format!("{config:?}").contains(pg.password()));

    // MariaDB checks passwords: a wrong one fails, without echoing it.
    let db = kit::MariaDb::shared().await.expect("kit MariaDB");
    let url = format!(
        "mysql://root:{secret}@127.0.0.1:{}/test?timeout=5s",
        db.port()
    );
    let err = backend_sql::connect(&url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    assert!(matches!(err, Error::AccessDenied { .. }), "{text}");
    assert!(text.contains("mysql"), "names the backend: {text}");
    assert!(!text.contains(secret), "{text}");

    // Nothing listening: a connection error, no password.
    let port = kit::free_port();
    let url = format!("postgres://postgres:{secret}@127.0.0.1:{port}/postgres?timeout=1s");
    let err = backend_sql::connect(&url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    assert!(err.is_retryable(), "{text}");
    assert!(!text.contains(secret), "{text}");
}

/// A fresh kit PostgreSQL database for clients named `app`, and the count of their sessions,
/// the listeners (`<app> listener`) included.
async fn postgres_sessions(app: &str) -> (String, impl AsyncFn() -> u32) {
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let url = with_query(
        &pg.fresh_database(app).await.unwrap(),
        &format!("application_name={app}"),
    );
    let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '{app}%'");
    let count = async move || {
        let out = pg.query("postgres", &sql).await.expect("psql");
        out.trim().parse::<u32>().expect("count")
    };
    (url, count)
}

/// A fresh kit MariaDB database and the count of the sessions in it.
async fn mariadb_sessions(prefix: &str) -> (String, impl AsyncFn() -> u32) {
    let db = kit::MariaDb::shared().await.expect("kit MariaDB");
    let url = db.fresh_database(prefix).await.unwrap();
    let database = url.rsplit('/').next().unwrap().to_owned();
    let sql =
        format!("SELECT count(*) FROM information_schema.PROCESSLIST WHERE db = '{database}'");
    let count = async move || {
        let out = db.query("mysql", &sql).await.expect("mariadb client");
        out.trim().parse::<u32>().expect("count")
    };
    (url, count)
}

/// Count the server sessions of our clients before, during and after use: every connection,
/// the PostgreSQL listener included, is closed once the clients are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_leak_postgres() {
    let (url, count) = postgres_sessions("dlock_leak_test").await;
    leak_check(&url, count).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_leak_mariadb() {
    let (url, count) = mariadb_sessions("leak").await;
    leak_check(&url, count).await;
}

/// While three clients use a name (one holds it, two wait through more than one refresh of
/// their place in the queue), each has one connection open on the server: on PostgreSQL the
/// statements run on the connection that listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_waiting_client_postgres() {
    let (url, count) = postgres_sessions("dlock_one_test").await;
    let peak = peak_while_waiting(&url, count).await;
    assert_eq!(peak, 3, "sessions of three clients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_waiting_client_mariadb() {
    let (url, count) = mariadb_sessions("one").await;
    let peak = peak_while_waiting(&url, count).await;
    assert_eq!(peak, 3, "sessions of three clients");
}

/// Three clients on one name: the first holds it and the other two wait for it (on
/// PostgreSQL, with their listeners).
struct TwoWaiting {
    clients: [Arc<dyn DistributedLock>; 3],
    lease: lockcore::Lease,
    waiters: Vec<tokio::task::JoinHandle<()>>,
}

impl TwoWaiting {
    async fn start(url: &str) -> Self {
        let clients = [client(url).await, client(url).await, client(url).await];
        let n = name("two-waiting");
        let lease = take(&clients[0], &n, Duration::from_secs(30))
            .await
            .expect("acquire");
        let waiters = clients[1..]
            .iter()
            .map(|c| {
                let (c, n) = (c.clone(), n.clone());
                tokio::spawn(async move {
                    let opts = AcquireOptions::new()
                        .ttl(Duration::from_secs(30))
                        .keep_alive(KeepAlive::Off)
                        .wait(Wait::For(Duration::from_secs(30)));
                    let guard = c.lock(n.as_str(), &opts).await.expect("waiter acquires");
                    guard.release().await.expect("release");
                })
            })
            .collect();
        TwoWaiting {
            clients,
            lease,
            waiters,
        }
    }

    /// Releases the name and waits for both waiters to take and release it in turn.
    async fn finish(self) {
        self.clients[0].release(&self.lease).await.unwrap();
        for w in self.waiters {
            tokio::time::timeout(Duration::from_secs(60), w)
                .await
                .expect("waiter hangs")
                .expect("waiter task");
        }
    }
}

/// The most server sessions `count` saw at once while two clients waited for 2.5 s (more than
/// two refreshes of their places) behind a third that held the name, once the sessions had
/// settled at three.
async fn peak_while_waiting(url: &str, count: impl AsyncFn() -> u32) -> u32 {
    let contended = TwoWaiting::start(url).await;
    // A PostgreSQL waiter's first statements run before its listener has connected; once it
    // has, the connection they used is closed.
    let settle = Instant::now() + Duration::from_secs(20);
    while count().await != 3 {
        assert!(
            Instant::now() < settle,
            "sessions never settled at one per client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut peak = 0;
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        peak = peak.max(count().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    contended.finish().await;
    peak
}

async fn leak_check(url: &str, count: impl AsyncFn() -> u32) {
    assert_eq!(count().await, 0, "sessions before any client");
    for _round in 0..2 {
        let contended = TwoWaiting::start(url).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(count().await > 0, "the clients are connected");
        contended.finish().await;
    }
    // Connections close in the background once the pools are gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = count().await;
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} sessions still open 30 s after the clients were dropped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `sqlite::memory:` clients are independent stores; file URLs create missing parent dirs. A
/// file's waiters in other processes of a Linux host are rung by doorbells, which the
/// capabilities say; a private store has nobody to ring.
#[tokio::test]
async fn sqlite_memory_is_private_and_files_get_parent_dirs() {
    let (a, b) = (
        client("sqlite::memory:").await,
        client("sqlite::memory:").await,
    );
    assert!(!a.capabilities().shared_across_processes);
    assert_eq!(a.capabilities().waiting, WaitMechanism::Poll);
    let n = name("m");
    let la = take(&a, &n, Duration::from_secs(10)).await.expect("a");
    assert!(take(&b, &n, Duration::from_secs(10)).await.is_some());
    assert!(take(&a, &n, Duration::from_secs(10)).await.is_none());
    a.release(&la).await.unwrap();

    let path = sqlite_dir().path().join("deep/er/dir/locks.db");
    let c = client(&format!("sqlite://{}", path.display())).await;
    assert!(c.capabilities().shared_across_processes);
    let rung = match cfg!(target_os = "linux") {
        true => WaitMechanism::Doorbell,
        false => WaitMechanism::Poll,
    };
    assert_eq!(c.capabilities().waiting, rung);
    assert!(path.exists());
}

const HAMMER_URL: &str = "DLOCK_SQL_HAMMER_URL";

const HAMMER_OUT: &str = "DLOCK_SQL_HAMMER_OUT";

const HAMMER_NAME: &str = "hammered-by-four-processes";

const HAMMER_FOR: Duration = Duration::from_secs(3);

const HAMMER_PROCESSES: usize = 4;

/// CLOCK_MONOTONIC in nanoseconds: the clock `Instant` reads on Linux, shared by every process
/// on the host, so holds recorded by different processes can be compared.
#[allow(unsafe_code)]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusive pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u64::try_from(ts.tv_sec).expect("time") * 1_000_000_000
        + u64::try_from(ts.tv_nsec).expect("time")
}

/// One child process: hammers [`HAMMER_NAME`] with waiting and single-attempt acquires for
/// [`HAMMER_FOR`], writing one line per hold (`token acquired_ns valid_until_ns ended_ns`).
/// Any error panics, which fails the child and so the parent.
async fn hammer_child(url: &str, out: &str) {
    use std::io::Write;
    let c = client(url).await;
    let mut lines = String::new();
    let stop_at = Instant::now() + HAMMER_FOR;
    let mut round = 0u64;
    while Instant::now() < stop_at {
        round += 1;
        let opts = AcquireOptions::new()
            .ttl(Duration::from_secs(10))
            .keep_alive(KeepAlive::Off);
        let guard = if round.is_multiple_of(4) {
            c.try_lock(HAMMER_NAME, &opts)
                .await
                .unwrap_or_else(|e| panic!("try_lock, round {round}: {e}"))
        } else {
            Some(
                c.lock(HAMMER_NAME, &opts.wait(Wait::For(Duration::from_secs(60))))
                    .await
                    .unwrap_or_else(|e| panic!("lock, round {round}: {e}")),
            )
        };
        let Some(guard) = guard else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let (acquired_at, acquired_ns) = (Instant::now(), monotonic_ns());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let ended_ns = monotonic_ns();
        let lease = guard.lease();
        let valid_until_ns = acquired_ns
            + u64::try_from(
                lease
                    .valid_until()
                    .saturating_duration_since(acquired_at)
                    .as_nanos(),
            )
            .expect("ns");
        lines.push_str(&format!(
            "{} {acquired_ns} {valid_until_ns} {ended_ns}\n",
            lease.token().0
        ));
        match guard.release().await {
            Ok(Released::Released) => {}
            other => panic!("release, round {round}: {other:?}"),
        }
    }
    let mut f = std::fs::File::create(out).expect("output file");
    f.write_all(lines.as_bytes()).expect("write holds");
}

/// SQLite is the embedded default shared by every process on the host: four OS processes
/// hammer one name on one database file for a few seconds, with waiting and single-attempt
/// acquires. No error of any kind (in particular no "database is locked") reaches any of them,
/// every process gets the lock, and the merged history has no overlapping holds and tokens that
/// grow with acquisition order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_four_processes_hammer_one_name() {
    if let (Ok(url), Ok(out)) = (std::env::var(HAMMER_URL), std::env::var(HAMMER_OUT)) {
        return hammer_child(&url, &out).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    // The file and its tables exist before the children race to open it.
    drop(client(&url).await);
    let mut children = Vec::new();
    for i in 0..HAMMER_PROCESSES {
        let out = dir.path().join(format!("holds-{i}.txt"));
        let child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "connections::sqlite_four_processes_hammer_one_name",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HAMMER_URL, &url)
            .env(HAMMER_OUT, &out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a hammering process");
        children.push((out, child));
    }
    let (base_at, base_ns) = (Instant::now(), monotonic_ns());
    let at = |ns: u64| {
        if ns >= base_ns {
            base_at + Duration::from_nanos(ns - base_ns)
        } else {
            base_at - Duration::from_nanos(base_ns - ns)
        }
    };
    let mut holds = Vec::new();
    for (i, (out, child)) in children.into_iter().enumerate() {
        let output = within(
            Duration::from_secs(120),
            "hammering process",
            child.wait_with_output(),
        )
        .await
        .expect("wait for the child");
        assert!(
            output.status.success(),
            "process {i} failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let text = std::fs::read_to_string(&out).expect("holds file");
        let before = holds.len();
        for line in text.lines() {
            let v: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect();
            holds.push(conformance_tests::Hold {
                client: i,
                name: HAMMER_NAME.to_owned(),
                token: v[0],
                acquired: at(v[1]),
                valid_until: at(v[2]),
                ended: Some(at(v[3])),
            });
        }
        assert!(holds.len() > before, "process {i} never got the lock");
    }
    eprintln!("hammer: {} holds", holds.len());
    let violations = conformance_tests::check(&holds);
    assert!(
        violations.is_empty(),
        "{} violations in {} holds, first: {}",
        violations.len(),
        holds.len(),
        violations[0]
    );
}

/// `take` then `release` on a fresh name: the client works end to end.
async fn round_trip(c: &Arc<dyn DistributedLock>) {
    let n = name(&unique("tls"));
    let lease = take(c, &n, Duration::from_secs(30))
        .await
        .expect("a fresh name is free");
    assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
}

/// The text of a failed connect, checked to be a non-retryable backend error.
async fn refused(url: &str) -> String {
    let err = backend_sql::connect(url).await.unwrap_err();
    let text = format!("{err} / {err:?}");
    // A server that refuses the client (no client certificate, a user that must use TLS) says
    // so as access denied; a failed handshake is a store error.
    assert!(
        matches!(err, Error::Backend { .. } | Error::AccessDenied { .. }),
        "{text}"
    );
    assert!(
        !err.is_retryable(),
        "a TLS setting does not change on retry: {text}"
    );
    text
}

/// PostgreSQL over TLS against the kit's own CA: verified connections work and are encrypted
/// (every session of the client, the LISTEN connection included); without the CA, full
/// verification refuses the server; a CA file that is missing or not PEM is a config error
/// raised before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_is_verified_and_used() {
    let pg = kit::Postgres::start_tls()
        .await
        .expect("kit PostgreSQL with TLS");
    let ca = pg.ca_cert().expect("a TLS server has a CA");
    // One `ssl|listens` line per session of the client named `app`.
    let ssl_of = |app: &'static str| {
        let pg = &pg;
        async move {
            let sql = format!(
                "SELECT s.ssl, a.application_name = '{app} listener' FROM pg_stat_ssl s \
                 JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE '{app}%'"
            );
            let out = pg.query("postgres", &sql).await.expect("psql");
            out.lines().map(str::to_owned).collect::<Vec<_>>()
        }
    };

    let verified = format!(
        "{}?sslmode=verify-full&ca={}&application_name=dlock_tls",
        pg.url(),
        ca.display()
    );
    let c = client(&verified).await;
    round_trip(&c).await;
    // A waiter makes the client open its LISTEN connection too.
    let n = name(&unique("tls-wait"));
    let held = take(&c, &n, Duration::from_secs(30)).await.unwrap();
    let waiter = {
        let c = c.clone();
        let n = n.clone();
        tokio::spawn(async move {
            let guard = c
                .lock(n.as_str(), &waiting(Duration::from_secs(30)))
                .await?;
            let lease = guard.lease();
            guard.release().await?;
            Ok::<_, Error>(lease)
        })
    };
    until_queued(&c, &n, 1).await;
    let sessions = within(Duration::from_secs(30), "the LISTEN session", async {
        loop {
            let sessions = ssl_of("dlock_tls").await;
            if sessions.iter().any(|s| s.ends_with("|t")) {
                break sessions;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        sessions.iter().all(|s| s.starts_with("t|")),
        "all encrypted: {sessions:?}"
    );
    c.release(&held).await.unwrap();
    let next = within(Duration::from_secs(30), "the TLS waiter", waiter)
        .await
        .unwrap()
        .expect("granted after the release");
    assert!(next.token() > held.token());

    // The same query tells a plain session apart, so the check above can fail.
    let plain = client(&format!(
        "{}?sslmode=disable&application_name=dlock_plain",
        pg.url()
    ))
    .await;
    round_trip(&plain).await;
    let sessions = ssl_of("dlock_plain").await;
    assert!(
        !sessions.is_empty() && sessions.iter().all(|s| s.starts_with("f|")),
        "{sessions:?}"
    );

    // `require` encrypts without checking the certificate.
    round_trip(&client(&format!("{}?sslmode=require", pg.url())).await).await;
    // Full verification against the system's roots: the kit's CA is not among them.
    let text = refused(&format!("{}?sslmode=verify-full&timeout=5s", pg.url())).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");

    for (file, expected) in [
        (pg.dir().join("no-such-ca.pem"), "cannot be read"),
        (pg.dir().join("postgres.log"), "holds no PEM block"),
    ] {
        let err = backend_sql::connect(&format!("{}?ca={}", pg.url(), file.display()))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
}

/// MariaDB over TLS against the kit's own CA, with an account that the server admits only over
/// TLS (`REQUIRE SSL`): verified and `required` connections work, a plain one is refused by the
/// server (so the working ones really are encrypted), and an unknown CA is refused by us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_is_verified_and_used() {
    let secret = "Tl5-S3cret";
    let db = kit::MariaDb::start_tls()
        .await
        .expect("kit MariaDB with TLS");
    let ca = db.ca_cert().expect("a TLS server has a CA");
    db.query(
        "mysql",
        &format!(
            "CREATE USER 'tlsonly'@'127.0.0.1' IDENTIFIED BY '{secret}' REQUIRE SSL; \
             GRANT ALL ON test.* TO 'tlsonly'@'127.0.0.1'"
        ),
    )
    .await
    .expect("create the TLS-only account");
    let base = format!("mysql://tlsonly:{secret}@127.0.0.1:{}/test", db.port());

    round_trip(&client(&format!("{base}?ca={}", ca.display())).await).await;
    round_trip(
        &client(&format!(
            "{base}?ssl-mode=VERIFY_CA&ssl-ca={}",
            ca.display()
        ))
        .await,
    )
    .await;
    round_trip(&client(&format!("{base}?ssl-mode=REQUIRED")).await).await;

    let text = refused(&format!("{base}?ssl-mode=DISABLED&timeout=5s")).await;
    assert!(!text.contains(secret), "{text}");
    let text = refused(&format!("{base}?ssl-mode=VERIFY_IDENTITY&timeout=5s")).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert!(!text.contains(secret), "{text}");
}

/// Client certificates: a PostgreSQL account admitted only by `cert` authentication (the
/// certificate's CN names the account) and a MariaDB account created `REQUIRE X509` work with
/// `cert` + `key` and are refused without them, or with a certificate issued to someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate() {
    let pg = kit::Postgres::start_tls()
        .await
        .expect("kit PostgreSQL with TLS");
    let files = pg.tls().expect("a TLS server has its files");
    pg.query("postgres", "CREATE ROLE certonly LOGIN SUPERUSER")
        .await
        .expect("create the role");
    pg.prepend_hba("hostssl all certonly 127.0.0.1/32 cert\nhost all certonly 127.0.0.1/32 reject")
        .await
        .expect("cert-only rule");
    let mine = files.issue_client("certonly").await.expect("client cert");
    let theirs = files
        .issue_client("someone-else")
        .await
        .expect("client cert");
    let base = format!(
        "postgres://certonly@127.0.0.1:{}/postgres?ca={}&timeout=5s",
        pg.port(),
        files.ca_cert().display()
    );
    let with =
        |c: &kit::CertAndKey| format!("{base}&cert={}&key={}", c.cert.display(), c.key.display());
    round_trip(&client(&with(&mine)).await).await;
    let text = refused(&base).await;
    assert!(text.contains("valid client certificate"), "{text}");
    let text = refused(&with(&theirs)).await;
    assert!(text.contains("certonly"), "names the account: {text}");
    // A key file that holds no key is caught before connecting.
    let err = backend_sql::connect(&format!(
        "{base}&cert={}&key={}",
        mine.cert.display(),
        mine.cert.display()
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("client key"), "{err}");

    let db = kit::MariaDb::start_tls()
        .await
        .expect("kit MariaDB with TLS");
    let files = db.tls().expect("a TLS server has its files");
    db.query(
        "mysql",
        "CREATE USER 'x509only'@'127.0.0.1' REQUIRE X509; \
         GRANT ALL ON test.* TO 'x509only'@'127.0.0.1'",
    )
    .await
    .expect("create the X509 account");
    let mine = files.issue_client("x509only").await.expect("client cert");
    let base = format!(
        "mysql://x509only@127.0.0.1:{}/test?ssl-ca={}&timeout=5s",
        db.port(),
        files.ca_cert().display()
    );
    round_trip(
        &client(&format!(
            "{base}&ssl-cert={}&ssl-key={}",
            mine.cert.display(),
            mine.key.display()
        ))
        .await,
    )
    .await;
    refused(&base).await;
}
