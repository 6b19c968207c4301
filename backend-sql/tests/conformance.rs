//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against
//! SQLite (a temp file), PostgreSQL and MariaDB (the kit's shared servers, one database per
//! test binary; fault scenarios start private servers). Every client has its own pool on the
//! same store. How each dialect fares in every fault scenario is declared once, in
//! `conformance_tests::catalog`, which `dlock compare` reads too.
//!
//! `DLOCK_SQL_SPEEDUPS=<value>` adds `speedups=<value>` to every URL (`none`: the plain path,
//! which every speed-up must agree with); the reports then go to
//! `<target tmp>/sql-speedups-<value>/`, apart from the main table's.

use std::process::ExitCode;
use std::sync::OnceLock;

use conformance_tests::Target;
use conformance_tests::catalog::declare;
use conformance_tests::kit::{MariaDb, Postgres};
use conformance_tests::spawn::SpawnName;

/// The speed-ups to test with, from `DLOCK_SQL_SPEEDUPS` (unset: the URL's default, all).
fn speedups() -> Option<String> {
    std::env::var("DLOCK_SQL_SPEEDUPS")
        .ok()
        .filter(|v| !v.is_empty())
}

/// `url` with `speedups=<value>` added where `DLOCK_SQL_SPEEDUPS` asks for it.
fn with_speedups(url: String) -> String {
    match speedups() {
        Some(value) => {
            let join = if url.contains('?') { '&' } else { '?' };
            format!("{url}{join}speedups={value}")
        }
        None => url,
    }
}

fn sqlite_url() -> String {
    static URL: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    URL.get_or_init(|| {
        // Under cargo's folder for test files: a static is never dropped, so the folder
        // outlives the run.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
        let url = format!("sqlite://{}/locks.db", dir.path().display());
        (dir, with_speedups(url))
    })
    .1
    .clone()
}

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_sql::connect(&url).await };
    let sqlite = Target::lazy("sqlite", || async { sqlite_url() }, connect);
    let postgres = Target::lazy(
        "postgres",
        || async {
            let pg = Postgres::shared().await.expect("kit PostgreSQL");
            let url = pg.create_database("backend_sql_conformance").await;
            with_speedups(url.expect("create database"))
        },
        connect,
    );
    let mariadb = Target::lazy(
        "mariadb",
        || async {
            let db = MariaDb::shared().await.expect("kit MariaDB");
            let url = db.create_database("backend_sql_conformance").await;
            with_speedups(url.expect("create database"))
        },
        connect,
    );
    let reports = match speedups() {
        Some(value) => format!("{}/sql-speedups-{value}", env!("CARGO_TARGET_TMPDIR")),
        None => env!("CARGO_TARGET_TMPDIR").to_owned(),
    };
    conformance_tests::harness::main(
        vec![
            declare(SpawnName::Sqlite, sqlite),
            declare(SpawnName::Postgres, postgres),
            declare(SpawnName::Mariadb, mariadb),
        ],
        &reports,
    )
}
