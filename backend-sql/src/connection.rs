//! A plain connection with a URL's settings, outside the lock client.

use std::time::Duration;

use lockcore::{Error, Result};
use sqlx::Connection as _;
use sqlx::sqlite::SqliteConnectOptions;

use crate::config::{SqlConfig, SqlitePath, Target, WithTls};

/// One connection of the driver behind a URL, opened with its settings: host, credentials and
/// TLS files; MySQL sessions in UTC; SQLite's file, `synchronous` and busy timeout. It is not
/// a lock client: it sees the lease table as it is in the database, and what it writes there
/// bypasses every guarantee of this crate.
#[derive(Debug)]
pub enum SqlConnection {
    /// A PostgreSQL connection.
    Postgres(sqlx::PgConnection),
    /// A MySQL or MariaDB connection.
    MySql(sqlx::MySqlConnection),
    /// A SQLite connection.
    Sqlite(sqlx::SqliteConnection),
}

impl SqlConfig {
    /// Opens one [`SqlConnection`] with this URL's settings, for tools that read or measure
    /// the lease table ([`table`](Self::table)) directly. The table is there once a lock
    /// client has connected to the same URL.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an in-memory SQLite database (private to the client that
    /// opened it) or TLS files that cannot be used; [`Error::Backend`] when the database cannot
    /// be reached within the URL's `timeout`. No message contains the password.
    pub async fn open_connection(&self) -> Result<SqlConnection> {
        let backend = self.dialect.backend();
        let timeout = self.defaults.timeout;
        let failed = |e: sqlx::Error| Error::backend(backend, "connect", None, true, e);
        let opened = async {
            Ok(match &self.target {
                Target::Postgres(o) => {
                    let o = o.clone().with_tls(self)?;
                    SqlConnection::Postgres(
                        sqlx::PgConnection::connect_with(&o).await.map_err(failed)?,
                    )
                }
                Target::MySql(o) => {
                    let o = o.clone().with_tls(self)?;
                    SqlConnection::MySql(
                        sqlx::MySqlConnection::connect_with(&o)
                            .await
                            .map_err(failed)?,
                    )
                }
                Target::Sqlite { path, synchronous } => {
                    let SqlitePath::File(file) = path else {
                        let why = "an in-memory database is private to the client that opened it";
                        return Err(Error::invalid_config(backend, why));
                    };
                    let o = SqliteConnectOptions::new()
                        .filename(file)
                        .synchronous(*synchronous)
                        .busy_timeout(timeout.min(Duration::from_secs(1)));
                    SqlConnection::Sqlite(
                        sqlx::SqliteConnection::connect_with(&o)
                            .await
                            .map_err(failed)?,
                    )
                }
            })
        };
        tokio::time::timeout(timeout, opened)
            .await
            .unwrap_or_else(|_| {
                let why = format!("the database did not answer within {timeout:?}");
                Err(Error::backend(backend, "connect", None, true, why))
            })
    }
}
