#![doc = include_str!("../README.md")]

mod client;
mod common;
pub mod config;
mod connection;
mod dialect;
mod lock;
mod queue;
mod read;
mod semaphore;
mod speedup;
mod statement;
mod wake;

use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use config::{DEFAULT_TABLE, Dialect, Speedup, Speedups, SqlConfig, SqlitePath, redact_url};
pub use connection::SqlConnection;
pub use lock::SqlLock;

/// A PostgreSQL lock client: a pool of up to 8 connections for statements, and a listener
/// connection, started on the first wait and shared by every name this client waits on, that
/// also runs the statements between notifications.
///
/// `Debug` shows the URL without its password.
pub type PostgresLock = SqlLock<dialect::postgres::Postgres>;

/// A MySQL/MariaDB lock client over a pool of up to 8 connections. Sessions run in UTC
/// (`time_zone = '+00:00'`) so every client compares `DATETIME` expiries alike.
///
/// `Debug` shows the URL without its password.
pub type MySqlLock = SqlLock<dialect::mysql::MySql>;

/// A SQLite lock client. Several clients and processes may share one database file; writers are
/// serialised by SQLite and "database is locked" is retried within the `timeout` option.
///
/// `Debug` shows the URL.
pub type SqliteLock = SqlLock<dialect::sqlite::Sqlite>;

/// URL schemes this crate serves (`mariadb` uses the MySQL driver).
pub const SCHEMES: &[&str] = &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

/// What this backend offers natively besides the mutex (see its capabilities): read-write locks
/// and counting semaphores (see the crate docs' sections on each).
pub const NATIVE: lockcore::NativePrimitives = lockcore::NativePrimitives::new(false, true, true);

/// Connects to the database named by `url` and creates the lease table if needed.
///
/// # Errors
/// [`lockcore::Error::UnsupportedScheme`] for a scheme not in [`SCHEMES`];
/// [`lockcore::Error::InvalidConfig`] for a malformed URL, table name or option (before any
/// I/O); [`lockcore::Error::Backend`] when the database cannot be reached or the table cannot be
/// created. No message contains the password.
///
/// # Cancel safety
/// Dropping the future closes what was opened; nothing else is left behind.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let config = SqlConfig::parse(url)?;
    connect_config(&config).await
}

/// [`connect`] with an already parsed configuration.
///
/// # Errors
/// As [`connect`], without the parsing errors.
///
/// # Cancel safety
/// As [`connect`].
pub async fn connect_config(config: &SqlConfig) -> Result<Arc<dyn DistributedLock>> {
    Ok(match config.dialect() {
        Dialect::Postgres => Arc::new(PostgresLock::connect(config).await?),
        Dialect::MySql => Arc::new(MySqlLock::connect(config).await?),
        Dialect::Sqlite => Arc::new(SqliteLock::connect(config).await?),
    })
}
