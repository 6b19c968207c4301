//! Accounts that may use the tables but not create them.

use std::time::Duration;

use conformance_tests::kit;
use conformance_tests::within;
use lockcore::{Error, LockExt, Released};

use crate::support::*;

/// An account allowed to read and write the tables but not to create any (PostgreSQL:
/// `CREATE TABLE IF NOT EXISTS` is refused without the schema's `CREATE`, even when the table
/// is there; MySQL likewise without the `CREATE` privilege) uses the tables a first run with
/// more rights made: locks and permits work. On a database without the tables it gets the
/// refusal, as access denied, at connect.
async fn a_dml_only_account_uses_existing_tables(kind: Kind) {
    let url = fresh_url(kind).await;
    drop(client(&url).await);
    let account = unique("dml");
    let (db, port) = {
        let rest = url.rsplit_once('@').expect("user@host").1;
        let (host, db) = rest.split_once('/').expect("host/db");
        (
            db.to_owned(),
            host.rsplit_once(':').expect("port").1.to_owned(),
        )
    };
    // A second database, where nobody made the tables.
    let bare = fresh_url(kind).await;
    let bare_db = bare.rsplit_once('/').expect("db").1.to_owned();
    let admin = Raw::connect(&url).await;
    let grants: Vec<String> = match kind {
        Kind::Postgres => vec![
            format!(
                "CREATE ROLE \"{account}\" LOGIN PASSWORD '{}'",
                kit::password()
            ),
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
            format!("GRANT USAGE ON SCHEMA public TO \"{account}\""),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public \
                 TO \"{account}\""
            ),
            format!("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO \"{account}\""),
        ],
        Kind::MariaDb => ["%", "localhost", "127.0.0.1"]
            .iter()
            .flat_map(|host| {
                [
                    format!(
                        "CREATE USER '{account}'@'{host}' IDENTIFIED BY '{}'",
                        kit::password()
                    ),
                    format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.* TO '{account}'@'{host}'"
                    ),
                    format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON `{bare_db}`.* \
                         TO '{account}'@'{host}'"
                    ),
                ]
            })
            .collect(),
        Kind::Sqlite => unreachable!("SQLite has no accounts"),
    };
    for grant in grants {
        admin.exec(&grant).await;
    }
    if kind == Kind::Postgres {
        // Schemas are per database: the bare one's too.
        let bare_admin = Raw::connect(&bare).await;
        bare_admin
            .exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            .await;
    }
    let scheme = if kind == Kind::Postgres {
        "postgres"
    } else {
        "mysql"
    };
    let as_account = |db: &str| {
        let password = kit::password();
        format!("{scheme}://{account}:{password}@127.0.0.1:{port}/{db}")
    };
    let c = client(&as_account(&db)).await;
    let n = name("least-privilege");
    let lock = take(&c, &n, Duration::from_secs(30))
        .await
        .expect("the lock");
    // A queued waiter's grant.
    let waiter = {
        let (c, n) = (client(&as_account(&db)).await, n.clone());
        tokio::spawn(async move { c.lock(n.as_str(), &waiting(Duration::from_secs(30))).await })
    };
    until_queued(&c, &n, 1).await;
    assert_eq!(c.release(&lock).await.unwrap(), Released::Released);
    let granted = within(Duration::from_secs(30), "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("the waiter's lock");
    granted.release().await.expect("release");
    let p = permit(&c, &n, 2, opts(Duration::from_secs(30)))
        .await
        .expect("try a permit")
        .expect("a permit");
    assert_eq!(c.release(&p).await.unwrap(), Released::Released);
    match backend_sql::connect(&as_account(&bare_db)).await {
        Err(Error::AccessDenied { .. }) => {}
        Err(other) => panic!("a database without the tables: {other}"),
        Ok(_) => panic!("connected to a database without the tables it may not create"),
    }
}

mod a_dml_only_account_uses_existing_tables {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_dml_only_account_uses_existing_tables(super::Kind::Postgres).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb() {
        super::a_dml_only_account_uses_existing_tables(super::Kind::MariaDb).await
    }
}
