//! Tests of the test kit itself: every server starts, answers, dies on kill -9, comes back on the
//! same port, freezes on pause and thaws on resume; the proxy injects each fault.
//!
//! Timeouts here only turn a hang into a failure; nothing asserts an upper bound on time.

use std::net::SocketAddr;
use std::time::Duration;

use conformance_tests::kit::{MariaDb, Postgres};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long a paused server gets to (not) answer.
const PAUSED_PROBE: Duration = Duration::from_millis(1500);

/// Whether a TCP connection to `addr` is refused.
async fn refuses(addr: SocketAddr) -> bool {
    matches!(
        timeout(Duration::from_secs(5), TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Sends PostgreSQL's SSLRequest and reads the one-byte answer ('N' or 'S').
async fn pg_answers(addr: SocketAddr, within: Duration) -> bool {
    let probe = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        std::io::Result::Ok(b[0] == b'N' || b[0] == b'S')
    };
    matches!(timeout(within, probe).await, Ok(Ok(true)))
}

/// Reads MariaDB's handshake greeting (protocol version 10), which it sends on connect.
async fn mariadb_answers(addr: SocketAddr, within: Duration) -> bool {
    let probe = async {
        let mut s = TcpStream::connect(addr).await?;
        let mut header = [0u8; 5];
        s.read_exact(&mut header).await?;
        std::io::Result::Ok(header[4] == 10)
    };
    matches!(timeout(within, probe).await, Ok(Ok(true)))
}

#[tokio::test]
async fn postgres_starts_answers_and_survives_kill9_restart_with_its_data() {
    let pg = Postgres::start().await.expect("postgres starts");
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert_eq!(pg.addr().port(), pg.port());
    assert_ne!(pg.port(), 5432, "never the system server's port");
    assert_eq!(
        pg.query("postgres", "SELECT 40 + 2").await.unwrap().trim(),
        "42"
    );
    pg.query(
        "postgres",
        "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)",
    )
    .await
    .unwrap();

    pg.kill9();
    assert!(
        refuses(pg.addr()).await,
        "a killed postgres refuses connections"
    );

    let port = pg.port();
    pg.restart().await.expect("postgres restarts after kill -9");
    assert_eq!(pg.port(), port, "restart keeps the port");
    assert_eq!(
        pg.query("postgres", "SELECT v FROM kept")
            .await
            .unwrap()
            .trim(),
        "7",
        "committed rows survive kill -9 and restart"
    );

    // restart() of a running server kills it first.
    pg.restart().await.expect("postgres restarts while running");
    assert!(pg_answers(pg.addr(), Duration::from_secs(10)).await);
}

#[tokio::test]
async fn postgres_pause_freezes_and_resume_thaws() {
    let pg = Postgres::start().await.expect("postgres starts");
    assert!(pg_answers(pg.addr(), Duration::from_secs(10)).await);
    pg.pause();
    assert!(
        !pg_answers(pg.addr(), PAUSED_PROBE).await,
        "a paused postgres does not answer"
    );
    pg.resume();
    assert!(
        pg_answers(pg.addr(), Duration::from_secs(10)).await,
        "a resumed postgres answers"
    );
    assert_eq!(pg.query("postgres", "SELECT 1").await.unwrap().trim(), "1");
}

#[tokio::test]
async fn postgres_shared_is_one_server_and_databases_isolate_tests() {
    let a = Postgres::shared().await.expect("shared postgres");
    let b = Postgres::shared().await.expect("shared postgres");
    assert!(std::ptr::eq(a, b), "shared() returns one instance");
    let url = a.create_database("kit_iso").await.unwrap();
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/kit_iso", a.port())
    );
    assert_eq!(
        a.create_database("kit_iso").await.unwrap(),
        url,
        "idempotent"
    );
    a.query("kit_iso", "CREATE TABLE only_here (v int)")
        .await
        .unwrap();
    assert!(
        a.query("postgres", "SELECT * FROM only_here")
            .await
            .is_err()
    );
    let fresh = a.fresh_database("kit").await.unwrap();
    assert!(fresh.starts_with(&format!("postgres://postgres@127.0.0.1:{}/kit_", a.port())));
    assert!(a.create_database("bad name; drop").await.is_err());
}

#[tokio::test]
async fn mariadb_starts_answers_and_survives_kill9_restart_with_its_data() {
    let db = MariaDb::start().await.expect("mariadb starts");
    assert_eq!(
        db.url(),
        format!("mysql://root@127.0.0.1:{}/test", db.port())
    );
    assert_ne!(db.port(), 3306, "never the system server's port");
    assert_eq!(
        db.query("test", "SELECT 40 + 2").await.unwrap().trim(),
        "42"
    );
    db.query(
        "test",
        "CREATE TABLE kept (v int) ENGINE=InnoDB; INSERT INTO kept VALUES (7)",
    )
    .await
    .unwrap();
    // Real grant tables: tests can create users.
    db.query(
        "test",
        "CREATE USER 'kit'@'127.0.0.1' IDENTIFIED BY 'pw'; GRANT ALL ON test.* TO 'kit'@'127.0.0.1'",
    )
    .await
    .unwrap();

    db.kill9();
    assert!(
        refuses(db.addr()).await,
        "a killed mariadb refuses connections"
    );

    let port = db.port();
    db.restart().await.expect("mariadb restarts after kill -9");
    assert_eq!(db.port(), port, "restart keeps the port");
    assert_eq!(
        db.query("test", "SELECT v FROM kept").await.unwrap().trim(),
        "7",
        "committed rows survive kill -9 and restart"
    );
}

#[tokio::test]
async fn mariadb_pause_freezes_and_resume_thaws() {
    let db = MariaDb::start().await.expect("mariadb starts");
    assert!(mariadb_answers(db.addr(), Duration::from_secs(10)).await);
    db.pause();
    assert!(
        !mariadb_answers(db.addr(), PAUSED_PROBE).await,
        "a paused mariadb does not answer"
    );
    db.resume();
    assert!(
        mariadb_answers(db.addr(), Duration::from_secs(10)).await,
        "a resumed mariadb answers"
    );
}

#[tokio::test]
async fn mariadb_shared_is_one_server_and_databases_isolate_tests() {
    let a = MariaDb::shared().await.expect("shared mariadb");
    let b = MariaDb::shared().await.expect("shared mariadb");
    assert!(std::ptr::eq(a, b), "shared() returns one instance");
    let url = a.create_database("kit_iso").await.unwrap();
    assert_eq!(url, format!("mysql://root@127.0.0.1:{}/kit_iso", a.port()));
    assert_eq!(
        a.create_database("kit_iso").await.unwrap(),
        url,
        "idempotent"
    );
    a.query("kit_iso", "CREATE TABLE only_here (v int)")
        .await
        .unwrap();
    assert!(a.query("test", "SELECT * FROM only_here").await.is_err());
    assert!(a.create_database("bad`name").await.is_err());
}
