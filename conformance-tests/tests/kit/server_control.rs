//! `ServerControl`: one handle over every kind, ending client sessions and restarting.

use std::time::Duration;

use conformance_tests::kit::{
    KitError, KitErrorKind, MariaDb, Postgres, Redis, ServerControl, ZooKeeper, redis_encode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use crate::support::{authenticated, bulk, mariadb_answers, pg_answers, redis_pongs, refuses};

/// A session that sleeps on the server is ended by `kill_client_connections` (through the
/// trait object), and the server still answers afterwards.
async fn sleeping_session_is_ended(
    server: &dyn ServerControl,
    sleeper: impl std::future::Future<Output = conformance_tests::kit::KitResult<String>>
    + Send
    + 'static,
    answers: impl std::future::Future<Output = bool>,
) {
    let sleeper = tokio::spawn(async move { sleeper.await.map(|_| ()) });
    let mut killed = 0;
    // The session may not have connected yet: kill until it is ended (a hang guard bounds it).
    let ended = timeout(Duration::from_secs(30), async {
        loop {
            killed += server
                .kill_client_connections()
                .await
                .expect("kill_client_connections");
            if sleeper.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "{}: the sleeping session was never ended",
        server.label()
    );
    assert!(killed >= 1, "{}: no connection counted", server.label());
    assert!(answers.await, "{} stopped answering", server.label());
}

#[tokio::test]
async fn postgres_kill_client_connections_ends_sessions_not_the_server() {
    // A private server: killing the shared one's connections would end other tests' sessions.
    let pg = std::sync::Arc::new(Postgres::start().await.expect("postgres"));
    let sleeper = {
        let pg = pg.clone();
        async move { pg.query("postgres", "SELECT pg_sleep(600)").await }
    };
    sleeping_session_is_ended(
        &*pg,
        sleeper,
        pg_answers(pg.addr(), Duration::from_secs(10)),
    )
    .await;
    assert_eq!(
        pg.query("postgres", "SELECT 1")
            .await
            .expect("query")
            .trim(),
        "1"
    );
}

#[tokio::test]
async fn mariadb_kill_client_connections_ends_sessions_not_the_server() {
    // A private server: killing the shared one's connections would end other tests' sessions.
    let db = std::sync::Arc::new(MariaDb::start().await.expect("mariadb"));
    let sleeper = {
        let db = db.clone();
        async move { db.query("mysql", "SELECT SLEEP(600)").await }
    };
    sleeping_session_is_ended(
        &*db,
        sleeper,
        mariadb_answers(db.addr(), Duration::from_secs(10)),
    )
    .await;
    assert_eq!(
        db.query("mysql", "SELECT 1").await.expect("query").trim(),
        "1"
    );
}

#[tokio::test]
async fn redis_kill_client_connections_ends_sessions_not_the_server() {
    let redis = Redis::start().await.expect("redis");
    let addr = redis.addr();
    let sleeper = async move {
        let io = |e: std::io::Error| KitError::new(KitErrorKind::Io, e.to_string());
        let mut s = authenticated(addr).await.map_err(io)?;
        // BLPOP on a key nobody pushes: the connection waits until it is killed.
        s.get_mut()
            .write_all(&redis_encode(&["BLPOP", "never", "0"]))
            .await
            .map_err(io)?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap_or(0);
        Ok(format!("read {n} bytes"))
    };
    sleeping_session_is_ended(&redis, sleeper, redis_pongs(addr, Duration::from_secs(10))).await;
}

#[tokio::test]
async fn server_control_restarts_through_the_trait_object() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("redis with AOF");
    let server: &dyn ServerControl = &redis;
    assert_eq!(server.label(), "redis-server");
    assert_eq!(server.addr(), redis.addr());
    redis.command(&["SET", "k", "v"]).await.expect("SET");
    server.kill9();
    assert!(
        refuses(server.addr()).await,
        "still answering after kill -9"
    );
    server.restart().await.expect("restart");
    assert_eq!(
        redis.command(&["GET", "k"]).await.expect("GET"),
        bulk("v"),
        "the AOF did not bring the key back"
    );
    let zk = ZooKeeper::shared().await.expect("zookeeper");
    let zk: &dyn ServerControl = zk;
    assert!(
        zk.kill_client_connections().await.is_err(),
        "ZooKeeper has no server-side connection kill; it must say so"
    );
}
