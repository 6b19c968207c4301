#![doc = include_str!("../README.md")]

mod common;
pub mod config;
mod mysql;
mod postgres;
mod queue;
mod sqlite;

use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use config::{DEFAULT_TABLE, Dialect, SqlConfig, SqlitePath, redact_url};
pub use mysql::MySqlLock;
pub use postgres::PostgresLock;
pub use sqlite::SqliteLock;

/// URL schemes this crate serves (`mariadb` uses the MySQL driver).
pub const SCHEMES: &[&str] = &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

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
