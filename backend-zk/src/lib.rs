#![doc = include_str!("../README.md")]

mod acl;
mod cleanup;
pub mod config;
mod lock;
mod names;
mod nodelay;
mod recipe;
mod renew;
mod semaphore;
mod session;

use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use config::{Credentials, DEFAULT_PORT, DEFAULT_PREFIX, ZkConfig};
pub use lock::ZkLock;
pub use names::Layout;
/// The ZooKeeper client this crate uses (see [`ZkLock::zk_client`]).
pub use zookeeper_client;

/// The backend name in capabilities and error messages.
pub const BACKEND: &str = "zookeeper";

/// URL schemes this crate serves.
pub const SCHEMES: &[&str] = &["zk"];

/// What the ZooKeeper backend offers besides the mutex, in every layout: read-write locks and
/// counting semaphores (see the README, "Semaphores").
pub const NATIVE: lockcore::NativePrimitives = lockcore::NativePrimitives::new(false, true, true);

/// Connects to the ZooKeeper ensemble named by `url` (see [`ZkConfig`] for the form and
/// options).
///
/// # Cancel safety
/// Dropping the future closes the session it opened; nothing is held yet.
///
/// # Errors
/// [`lockcore::Error::UnsupportedScheme`] for a scheme other than `zk`;
/// [`lockcore::Error::InvalidConfig`] for a malformed URL or option (before any I/O);
/// [`lockcore::Error::Backend`] when no server answers;
/// [`lockcore::Error::AccessDenied`] when the credentials are refused, or (with credentials)
/// the base node lets another identity do more than read it (see the README, "Access
/// control"). No message contains the password.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let config = ZkConfig::parse(url)?;
    Ok(Arc::new(ZkLock::connect(&config).await?))
}
