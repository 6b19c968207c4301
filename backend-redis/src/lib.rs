#![doc = include_str!("../README.md")]

pub mod config;
mod lock;
pub mod node;
mod queue;
pub mod tair;

use std::sync::Arc;

use lockcore::{DistributedLock, Error, Result};

pub use config::{DEFAULT_PREFIX, Deployment, RedisConfig, Secret, redact_url};
pub use lock::{ASSUMPTION_CLUSTER, RedisLock, RedisStats};
pub use node::{ASSUMPTION_NO_PERSISTENCE, ASSUMPTION_UNKNOWN};
pub use tair::TairLock;

/// The backend name in capabilities and error messages (the Tair emulation's is
/// [`tair::BACKEND`]).
pub const BACKEND: &str = "redis";

/// URL schemes of single Redis and Redis Cluster (the Tair emulation's are [`tair::SCHEMES`];
/// [`connect`] serves both).
pub const SCHEMES: &[&str] = &["redis", "rediss", "redis+cluster"];

/// What this backend offers natively besides the mutex (see its capabilities): read-write locks
/// (the lock of a name is its write lock; readers are kept beside it, see the README's
/// "Read-write locks") and counting semaphores (`src/node/lua/sem_*.lua`, each semaphore an
/// object apart from the lock of its name), on a single server and in a Cluster.
pub const NATIVE: lockcore::NativePrimitives = lockcore::NativePrimitives::new(false, true, true);

/// Connects to the Redis server or Redis Cluster named by `url`, or to the Tair emulation on a
/// server for `tair://` (see [`RedisConfig`] for the forms and options). Redlock URLs are
/// `backend-redlock`'s.
///
/// # Cancel safety
/// Dropping the future closes what was opened; nothing is held yet.
///
/// # Errors
/// [`lockcore::Error::UnsupportedScheme`] for a scheme in neither [`SCHEMES`] nor
/// [`tair::SCHEMES`] (`redlock://` included);
/// [`lockcore::Error::InvalidConfig`] for a malformed URL or option (before any I/O);
/// [`lockcore::Error::Backend`] when the server cannot be reached or refuses the credentials.
/// No message contains the password.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let config = RedisConfig::parse(url)?;
    if let Deployment::Redlock { tls, .. } = config.deployment {
        return Err(Error::UnsupportedScheme {
            scheme: if tls { "redlocks" } else { "redlock" }.to_owned(),
            available: SCHEMES.iter().chain(tair::SCHEMES).copied().collect(),
        });
    }
    if config.tair {
        return Ok(Arc::new(TairLock::connect(&config).await?));
    }
    Ok(Arc::new(RedisLock::connect(&config).await?))
}
