#![doc = include_str!("../README.md")]

pub mod config;
mod inspect;
mod lock;
mod masters;
mod vote;
mod wait;

use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use backend_redis::RedisConfig;
pub use config::MIN_NODE_TIMEOUT;
pub use lock::RedlockLock;
pub use masters::{ASSUMPTION_REDLOCK, MIN_GRACE};

/// The backend name in capabilities and error messages.
pub const BACKEND: &str = "redlock";

/// URL schemes this crate serves (`redlocks://` speaks TLS to every node).
pub const SCHEMES: &[&str] = &["redlock", "redlocks"];

/// What this backend offers natively besides the mutex (see its capabilities): nothing. Neither
/// semaphores nor read-write locks: the README says why a majority vote keeps neither's
/// guarantees.
pub const NATIVE: lockcore::NativePrimitives = lockcore::NativePrimitives::new(false, false, false);

/// Connects to the Redlock masters named by `url` (`redlock://h1:p1,h2:p2,h3:p3`; see
/// [`RedisConfig`] for the forms and options, which are backend-redis's own).
///
/// # Cancel safety
/// Dropping the future closes what was opened; nothing is held yet.
///
/// # Errors
/// [`lockcore::Error::UnsupportedScheme`] for a scheme not in [`SCHEMES`];
/// [`lockcore::Error::InvalidConfig`] for a malformed URL or option (before any I/O);
/// [`lockcore::Error::Backend`] when fewer than a majority of the nodes answer;
/// [`lockcore::Error::AccessDenied`] when a majority refuses the credentials. No message
/// contains the password.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let config = config::parse(url)?;
    Ok(Arc::new(RedlockLock::connect(&config).await?))
}
