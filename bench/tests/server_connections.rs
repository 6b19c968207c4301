//! The connection sampler against servers started by the test kit: it sees connections that
//! others open, the server's limit, and (on MariaDB) the connections refused for lack of room.

use std::time::Duration;

use conformance_tests::kit;
use dlock_bench::server_connections::{ConnectionSampler, ServerConnections};
use sqlx::Connection;

/// Samples while `open` more connections to `url` are held for a few samples.
async fn sample_while_open<C: Connection>(url: &str, open: usize) -> ServerConnections {
    let sampler = ConnectionSampler::start(url)
        .await
        .expect("sampler starts")
        .expect("a server URL is sampled");
    let mut held = Vec::new();
    for _ in 0..open {
        held.push(C::connect(url).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    let seen = sampler.finish().await.expect("sampler finishes");
    for c in held {
        c.close().await.expect("close");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_opened_by_others_are_counted_up_to_the_limit() {
    let pg = kit::Postgres::shared().await.expect("kit PostgreSQL");
    let seen = sample_while_open::<sqlx::PgConnection>(&pg.url(), 3).await;
    assert!(
        seen.added() >= 3,
        "three connections were open at every sample, the sampler saw {seen:?}"
    );
    assert_eq!(
        seen.limit, 300,
        "the kit's PostgreSQL runs with max_connections=300"
    );
    assert_eq!(seen.refused, None, "PostgreSQL does not count refusals");
    assert!(!seen.reached_limit(), "{seen:?} is far from the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refusals_are_counted_and_the_full_server_is_seen() {
    // A server of its own: the test lowers its limit.
    let db = kit::MariaDb::start().await.expect("kit MariaDB");
    let url = db.url();
    let mut admin = sqlx::MySqlConnection::connect(&url).await.expect("connect");
    let open_now: i64 = sqlx::query_scalar(
        "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'THREADS_CONNECTED'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("threads connected");
    // Room for the sampler and two more. The connections that fill it are a plain account's:
    // MariaDB lets an administrator connect beyond the limit.
    let wanted = open_now + 2;
    for statement in [
        "CREATE USER IF NOT EXISTS plain IDENTIFIED BY 'plain'".to_owned(),
        format!("SET GLOBAL max_connections = {wanted}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .expect("a plain account and a lower limit");
    }
    // (The server raises a limit below its minimum, 10, to that.)
    let limit: i64 = sqlx::query_scalar("SELECT CAST(@@max_connections AS SIGNED)")
        .fetch_one(&mut admin)
        .await
        .expect("the limit in force");
    let plain = url.replacen(&format!("root:{}", db.password()), "plain:plain", 1);
    let plain = plain
        .rsplit_once('/')
        .map(|(server, _)| server)
        .unwrap_or(&plain);

    let sampler = ConnectionSampler::start(&url)
        .await
        .expect("sampler starts")
        .expect("a server URL is sampled");
    let mut held = Vec::new();
    let mut refusal = None;
    for _ in 0..=limit {
        match sqlx::MySqlConnection::connect(plain).await {
            Ok(c) => held.push(c),
            Err(e) => {
                refusal = Some(e);
                break;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    let seen = sampler.finish().await.expect("sampler finishes");
    drop(held);

    let refusal = refusal.expect("the server refused a connection beyond its limit");
    assert_eq!(
        refusal
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("08004"),
        "refused as too many connections: {refusal}"
    );
    assert_eq!(seen.limit, u64::try_from(limit).unwrap(), "{seen:?}");
    assert_eq!(
        seen.refused,
        Some(1),
        "one refusal while sampling: {seen:?}"
    );
    assert!(seen.reached_limit(), "the server was full: {seen:?}");
}

#[tokio::test]
async fn other_stores_are_not_sampled() {
    for url in [
        "redis://127.0.0.1:1/",
        "memory://",
        "sqlite:///tmp/never-opened.db",
    ] {
        let sampler = ConnectionSampler::start(url).await.expect("no I/O");
        assert!(
            sampler.is_none(),
            "{url} has no server connections to count"
        );
    }
}
