//! PostgreSQL: start, kill -9 and restart with its data, pause and resume, the shared server.

use std::time::Duration;

use conformance_tests::kit::{Postgres, password};

use crate::support::{kill9_and_restart, pause_then_resume, pg_answers};

#[tokio::test]
async fn postgres_starts_answers_and_survives_kill9_restart_with_its_data() {
    let pg = Postgres::start().await.expect("postgres starts");
    assert_eq!(
        pg.url(),
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/postgres",
            password(),
            pg.port()
        )
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

    kill9_and_restart(&pg).await;
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
    pause_then_resume(&pg, pg_answers).await;
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
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/kit_iso",
            password(),
            a.port()
        )
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
    assert!(fresh.starts_with(&format!(
        "postgres://postgres:{}@127.0.0.1:{}/kit_",
        password(),
        a.port()
    )));
    assert!(a.create_database("bad name; drop").await.is_err());
}
