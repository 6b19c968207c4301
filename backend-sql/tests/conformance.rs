//! The shared conformance suite against SQLite (a temp file), PostgreSQL and MariaDB (the kit's
//! shared servers, one database per test binary). Every factory call makes a new client with its
//! own pool on the same store.

use std::sync::{Arc, OnceLock};

use lockcore::DistributedLock;
use tokio::sync::OnceCell;

fn sqlite_url() -> &'static str {
    static URL: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    &URL.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/locks.db", dir.path().display());
        (dir, url)
    })
    .1
}

async fn make_sqlite() -> Arc<dyn DistributedLock> {
    backend_sql::connect(sqlite_url())
        .await
        .expect("sqlite client")
}

async fn make_postgres() -> Arc<dyn DistributedLock> {
    static URL: OnceCell<String> = OnceCell::const_new();
    let url = URL
        .get_or_init(|| async {
            let pg = conformance_tests::kit::Postgres::shared()
                .await
                .expect("kit PostgreSQL");
            pg.create_database("backend_sql_conformance")
                .await
                .expect("create database")
        })
        .await;
    backend_sql::connect(url).await.expect("postgres client")
}

async fn make_mariadb() -> Arc<dyn DistributedLock> {
    static URL: OnceCell<String> = OnceCell::const_new();
    let url = URL
        .get_or_init(|| async {
            let db = conformance_tests::kit::MariaDb::shared()
                .await
                .expect("kit MariaDB");
            db.create_database("backend_sql_conformance")
                .await
                .expect("create database")
        })
        .await;
    backend_sql::connect(url).await.expect("mariadb client")
}

conformance_tests::suite!(sqlite, make_sqlite, [ttl, fifo]);
conformance_tests::suite!(postgres, make_postgres, [ttl, fifo]);
conformance_tests::suite!(mariadb, make_mariadb, [ttl, fifo]);
