#![doc = include_str!("../README.md")]

pub mod config;
mod lock;

use std::future::Future;
use std::sync::Arc;

use lockcore::{DistributedLock, Result};

pub use config::DualConfig;
pub use lock::{DualLock, FENCING_ASSUMPTION, Side, UNCARRIED_ASSUMPTION};

/// The backend name in capabilities and error messages.
pub const BACKEND: &str = "dual";

/// URL schemes this crate serves.
pub const SCHEMES: &[&str] = &["dual"];

/// What a dual store offers natively, given its two stores' primitives: what both offer, but
/// reentrancy (dual keeps none of its own).
pub const fn native_of(
    first: lockcore::NativePrimitives,
    second: lockcore::NativePrimitives,
) -> lockcore::NativePrimitives {
    let both = first.and(second);
    lockcore::NativePrimitives::new(false, both.read_write, both.semaphore)
}

/// Connects a `dual://` URL: parses it (before any I/O), connects the first store, then the
/// second, with `connect_store` (the facade passes `dlock::connect`), and composes them.
///
/// # Cancel safety
/// Dropping the future drops whatever store was connected so far; nothing is held yet.
///
/// # Errors
/// [`lockcore::Error::InvalidConfig`] for a malformed URL or a store without fencing tokens;
/// whatever `connect_store` returns for either store.
pub async fn connect<F, Fut>(url: &str, connect_store: F) -> Result<Arc<dyn DistributedLock>>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Arc<dyn DistributedLock>>>,
{
    let config = DualConfig::parse(url)?;
    let (first, second) = config.store_urls();
    let first = connect_store(first).await?;
    let second = connect_store(second).await?;
    Ok(Arc::new(DualLock::new(first, second, config)?))
}
