//! MariaDB: start, kill -9 and restart with its data, pause and resume, the shared server.

use std::time::Duration;

use conformance_tests::kit::{MariaDb, password};

use crate::support::{kill9_and_restart, mariadb_answers, pause_then_resume};

#[tokio::test]
async fn mariadb_starts_answers_and_survives_kill9_restart_with_its_data() {
    let db = MariaDb::start().await.expect("mariadb starts");
    assert_eq!(
        db.url(),
        format!("mysql://root:{}@127.0.0.1:{}/test", password(), db.port())
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
        &format!(
            "CREATE USER 'kit'@'127.0.0.1' IDENTIFIED BY '{}'; \
             GRANT ALL ON test.* TO 'kit'@'127.0.0.1'",
            password()
        ),
    )
    .await
    .unwrap();

    kill9_and_restart(&db).await;
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
    pause_then_resume(&db, mariadb_answers).await;
}

#[tokio::test]
async fn mariadb_shared_is_one_server_and_databases_isolate_tests() {
    let a = MariaDb::shared().await.expect("shared mariadb");
    let b = MariaDb::shared().await.expect("shared mariadb");
    assert!(std::ptr::eq(a, b), "shared() returns one instance");
    let url = a.create_database("kit_iso").await.unwrap();
    assert_eq!(
        url,
        format!("mysql://root:{}@127.0.0.1:{}/kit_iso", password(), a.port())
    );
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
