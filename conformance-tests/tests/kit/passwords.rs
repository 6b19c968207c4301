//! Who can connect: only the holder of the run's password.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{
    MariaDb, Postgres, Proxy, Redis, RedisReply, password, redis_command,
};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::support::{authenticated_with, exchange};

/// `scheme://user:password@host:port/database` split into its parts (the kit's URLs, which
/// need no percent-decoding: the password is hex).
struct UrlParts {
    user: String,
    password: String,
    host: String,
    port: String,
    database: String,
}

fn parts_of(url: &str) -> UrlParts {
    let rest = url.split_once("://").expect("a scheme").1;
    let (userinfo, rest) = rest.split_once('@').expect("credentials in the URL");
    let (user, password) = userinfo.split_once(':').expect("a password in the URL");
    let (hostport, database) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').expect("a port");
    UrlParts {
        user: user.to_owned(),
        password: password.to_owned(),
        host: host.to_owned(),
        port: port.to_owned(),
        database: database.to_owned(),
    }
}

/// Runs a command line client and returns its stdout, or its stderr when it fails.
async fn client_output(mut cmd: tokio::process::Command) -> Result<String, String> {
    let out = timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the client finishes")
        .expect("the client runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `psql` with the parts of `url` but the password, which is `password` (none: no password at
/// all), in its environment as the kit itself passes it.
async fn psql(url: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/psql"))
        .filter(|p| p.exists())
        .max()
        .unwrap_or_else(|| "psql".into());
    let p = parts_of(url);
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-X", "-w", "-A", "-t", "-h", &p.host, "-p", &p.port])
        .args(["-U", &p.user, "-d", &p.database, "-c", sql])
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent")
        .env("PGCONNECT_TIMEOUT", "10");
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    client_output(cmd).await
}

/// The `mariadb` client over TCP with the parts of `url` but the password, which is `password`
/// (none: no password at all), in its environment as the kit itself passes it.
async fn mariadb(url: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let p = parts_of(url);
    let bin = ["/usr/bin/mariadb", "/usr/bin/mysql"]
        .into_iter()
        .find(|b| std::path::Path::new(b).exists())
        .unwrap_or("mariadb");
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--no-defaults",
        "--protocol=tcp",
        "-h",
        &p.host,
        "-P",
        &p.port,
    ])
    .args(["-u", &p.user, "-D", &p.database, "-N", "-B", "-e", sql])
    .args(["--connect-timeout=10"])
    .env_remove("MYSQL_PWD");
    if let Some(password) = password {
        cmd.env("MYSQL_PWD", password);
    }
    client_output(cmd).await
}

/// Mode bits of a server's temp dir: nobody but its owner may enter.
fn assert_private(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
}

/// `select_1` (a client running `SELECT 1` with the password it is given) is refused without a
/// password and with a wrong one, with errors that hold every text of `refusals[0]` and
/// `refusals[1]`; with the password of `url`, the kit's, it gets `1`.
async fn only_the_urls_password_gets_in<F, Fut>(url: &str, select_1: F, refusals: [&[&str]; 2])
where
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let right = parts_of(url).password;
    assert_eq!(right, password());
    for (password, says) in [None, Some("wrong")].into_iter().zip(refusals) {
        let Err(err) = select_1(password.map(str::to_owned)).await else {
            panic!("let in with the password {password:?}");
        };
        assert!(says.iter().all(|s| err.contains(s)), "{err}");
    }
    assert_eq!(select_1(Some(right)).await.as_deref(), Ok("1"));
}

/// Another local user reaches the server's port but not its socket dir: without the run's
/// password (none, or a wrong one) PostgreSQL refuses them; the kit's URL gets in.
#[tokio::test]
async fn postgres_refuses_connections_without_the_runs_password() {
    let pg = Postgres::shared().await.expect("shared postgres");
    let url = &pg.url();
    only_the_urls_password_gets_in(
        url,
        |password| async move { psql(url, password.as_deref(), "SELECT 1").await },
        [
            &["no password supplied"],
            &["password authentication failed for user \"postgres\""],
        ],
    )
    .await;
    // Stored as a SCRAM secret of one iteration: logins stay cheap.
    let stored = pg
        .query(
            "postgres",
            "SELECT split_part(rolpassword, ':', 1) FROM pg_authid WHERE rolname = 'postgres'",
        )
        .await
        .unwrap();
    assert_eq!(stored.trim(), "SCRAM-SHA-256$1");
    assert_private(pg.dir());
}

/// Without the run's password MariaDB refuses root; no account logs in without a password;
/// `INTO OUTFILE` writes only into the server's own dir, never as root.
#[tokio::test]
async fn mariadb_refuses_connections_without_the_runs_password() {
    use std::os::unix::fs::MetadataExt as _;
    let db = MariaDb::shared().await.expect("shared mariadb");
    let url = &db.url();
    only_the_urls_password_gets_in(
        url,
        |password| async move { mariadb(url, password.as_deref(), "SELECT 1").await },
        [
            &["Access denied for user 'root'", "using password: NO"],
            &["Access denied for user 'root'", "using password: YES"],
        ],
    )
    .await;
    let open = db
        .query(
            "mysql",
            "SELECT CONCAT(User, '@', Host) FROM mysql.global_priv \
             WHERE IFNULL(JSON_EXTRACT(Priv, '$.account_locked'), 'false') <> 'true' \
             AND IFNULL(JSON_EXTRACT(Priv, '$.is_role'), 'false') <> 'true' \
             AND (IFNULL(JSON_VALUE(Priv, '$.authentication_string'), '') = '' \
             OR User = '' OR Priv LIKE '%unix_socket%')",
        )
        .await
        .unwrap();
    assert_eq!(open.trim(), "", "accounts without a password");

    let err = db
        .query(
            "test",
            "SELECT 1 INTO OUTFILE '/tmp/dlock-kit-outfile-test'",
        )
        .await
        .expect_err("a file outside the server's dir");
    assert!(err.to_string().contains("secure-file-priv"), "{err}");
    // The shared server is this process's own, and only this test writes there.
    let out = db.dir().join("files/out.txt");
    db.query(
        "test",
        &format!("SELECT 1 INTO OUTFILE '{}'", out.display()),
    )
    .await
    .expect("a file in the server's own dir");
    let mine = tempfile::tempfile().unwrap().metadata().unwrap().uid();
    let owner = std::fs::metadata(&out).unwrap().uid();
    assert!(
        mine != 0 || owner != 0,
        "a server started by root wrote a root-owned file"
    );
    assert_private(db.dir());
}

/// Without the run's password Redis answers only NOAUTH or WRONGPASS; the password in the
/// kit's URL works, also through a proxy; no command line shows it.
#[tokio::test]
async fn redis_refuses_connections_without_the_runs_password() {
    let redis = Redis::start().await.expect("redis starts");
    assert_eq!(
        redis_command(redis.addr(), &["PING"]).await.unwrap(),
        RedisReply::Error("NOAUTH Authentication required.".into())
    );
    let mut conn = BufReader::new(TcpStream::connect(redis.addr()).await.unwrap());
    match exchange(&mut conn, &["AUTH", "wrong"]).await.unwrap() {
        RedisReply::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("a wrong password is refused: {other:?}"),
    }
    match exchange(&mut conn, &["GET", "k"]).await.unwrap() {
        RedisReply::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("still not authenticated: {other:?}"),
    }

    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let via = redis.url_via(proxy.addr());
    assert_eq!(via, format!("redis://:{}@{}", password(), proxy.addr()));
    for url in [redis.url(), via] {
        let rest = url.strip_prefix("redis://:").unwrap();
        let (pw, addr) = rest.split_once('@').unwrap();
        let addr: SocketAddr = addr.parse().unwrap();
        let mut conn = authenticated_with(addr, pw)
            .await
            .expect("the URL's password");
        assert_eq!(
            exchange(&mut conn, &["PING"]).await.unwrap(),
            RedisReply::Status("PONG".into()),
            "{addr}"
        );
    }
    assert_eq!(
        redis.command(&["PING"]).await.unwrap(),
        RedisReply::Status("PONG".into())
    );
    assert!(!format!("{redis:?}").contains(password()), "{redis:?}");

    // Any local user can read every process's command line.
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(password()),
                "{} shows the password on its command line",
                entry.path().display()
            );
        }
    }
    assert_private(redis.dir());
}
