//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against
//! SQLite (a temp file), PostgreSQL and MariaDB (the kit's shared servers, one database per
//! test binary; fault scenarios start private servers). Every client has its own pool on the
//! same store. This is where each dialect declares, once, how it fares in every fault scenario.

use std::process::ExitCode;
use std::sync::OnceLock;

use conformance_tests::kit::{KitError, KitErrorKind, MariaDb, Postgres};
use conformance_tests::{Expect, Persistence, Spawned, Target};

const ALWAYS_DURABLE: Expect = Expect::NotApplicable(
    "committed rows survive a crash on every SQL server (the kit's servers too: `fsync=off` \
     loses nothing a kill -9 can take); there is no setting without persistence to test",
);

fn sqlite_url() -> String {
    static URL: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/locks.db", dir.path().display());
        (dir, url)
    })
    .1
    .clone()
}

fn no_volatile_server() -> KitError {
    KitError::new(
        KitErrorKind::InvalidArgument,
        "SQL servers always persist committed rows",
    )
}

/// The declarations shared by PostgreSQL and MariaDB.
fn server_faults(target: Target) -> Target {
    target
        .fault("server_killed_and_restarted", Expect::Safe)
        .fault(
            "server_killed_and_restarted_without_persistence",
            ALWAYS_DURABLE,
        )
        .fault("server_paused_past_ttl", Expect::Safe)
        .fault("holder_replies_blackholed_past_ttl", Expect::Safe)
        .fault("holder_requests_blackholed_past_ttl", Expect::Safe)
        .fault("store_connections_killed", Expect::Safe)
        .fault("holder_process_killed", Expect::Safe)
        .fault("client_paused_past_ttl", Expect::Safe)
        .fault("sem_server_killed_and_restarted", Expect::Safe)
        .fault("sem_holder_blackholed_past_ttl", Expect::Safe)
        .fault("sem_client_paused_past_ttl", Expect::Safe)
        .fault("rw_reader_paused_past_ttl", Expect::Safe)
        .fault("rw_reader_server_killed_and_restarted", Expect::Safe)
        .fault("rw_reader_blackholed_past_ttl", Expect::Safe)
}

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_sql::connect(&url).await };
    let sqlite = Target::lazy("sqlite", || async { sqlite_url() }, connect)
        .fault("client_paused_past_ttl", Expect::Safe)
        .fault("sem_client_paused_past_ttl", Expect::Safe)
        .fault("rw_reader_paused_past_ttl", Expect::Safe)
        .fault("holder_process_killed", Expect::Safe)
        .without_server("embedded store: there is no server to kill, pause or cut off");
    let postgres = Target::lazy(
        "postgres",
        || async {
            let pg = Postgres::shared().await.expect("kit PostgreSQL");
            pg.create_database("backend_sql_conformance")
                .await
                .expect("create database")
        },
        connect,
    )
    .spawn_with(|persistence| async move {
        if persistence == Persistence::None {
            return Err(no_volatile_server());
        }
        let pg = Postgres::start().await?;
        let url = pg.fresh_database("faults").await?;
        Ok(Spawned {
            server: Box::new(pg),
            url,
            keep: None,
        })
    });
    let mariadb = Target::lazy(
        "mariadb",
        || async {
            let db = MariaDb::shared().await.expect("kit MariaDB");
            db.create_database("backend_sql_conformance")
                .await
                .expect("create database")
        },
        connect,
    )
    .spawn_with(|persistence| async move {
        if persistence == Persistence::None {
            return Err(no_volatile_server());
        }
        let db = MariaDb::start().await?;
        let url = db.fresh_database("faults").await?;
        Ok(Spawned {
            server: Box::new(db),
            url,
            keep: None,
        })
    });
    conformance_tests::harness::main(
        vec![sqlite, server_faults(postgres), server_faults(mariadb)],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
