#![doc = include_str!("../README.md")]

mod cluster;
pub mod config;
mod lock;
mod queue;
pub mod redlock;
mod scripts;
mod single;
mod store;
pub mod tair;
mod waiters;

use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use config::{DEFAULT_PREFIX, Deployment, RedisConfig, Secret, redact_url};
pub use lock::{
    ASSUMPTION_CLUSTER, ASSUMPTION_NO_PERSISTENCE, ASSUMPTION_UNKNOWN, RedisLock, RedisStats,
};
pub use redlock::RedlockLock;
pub use tair::TairLock;

/// The backend name in capabilities and error messages.
pub const BACKEND: &str = "redis";

/// URL schemes this crate serves.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+cluster",
    "redlock",
    "redlocks",
    "tair",
];

/// Connects to the Redis server, Redis Cluster or Redlock masters named by `url` (see
/// [`RedisConfig`] for the forms and options).
///
/// # Cancel safety
/// Dropping the future closes what was opened; nothing is held yet.
///
/// # Errors
/// [`lockcore::Error::UnsupportedScheme`] for a scheme not in [`SCHEMES`];
/// [`lockcore::Error::InvalidConfig`] for a malformed URL or option (before any I/O);
/// [`lockcore::Error::Backend`] when the server cannot be reached or refuses the credentials.
/// No message contains the password.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let config = RedisConfig::parse(url)?;
    if matches!(config.deployment, Deployment::Redlock { .. }) {
        return Ok(Arc::new(RedlockLock::connect(&config).await?));
    }
    if config.tair {
        return Ok(Arc::new(TairLock::connect(&config).await?));
    }
    Ok(Arc::new(RedisLock::connect(&config).await?))
}
