#![doc = include_str!("../README.md")]

mod acquire;
mod backend;
pub mod backend_support;
mod capabilities;
pub mod cleanup;
mod error;
mod ext;
mod guard;
mod lease;
mod lease_state;
pub mod memory;
mod multi;
mod name;
mod options;
mod percent;
mod redact;
mod reentrant;
mod renewer;
mod rw;
mod semaphore;
mod url_parts;
pub mod wait;

pub use backend::DistributedLock;
pub use capabilities::{Capabilities, Expiry, Fairness, Fencing, NativePrimitives, WaitMechanism};
pub use error::{BoxError, Error, Result};
pub use ext::LockExt;
pub use guard::{LeaseWatch, LockGuard};
pub use lease::{FencingToken, Lease, LockInfo, OwnerId, Released};
pub use lease_state::LostReason;
pub use memory::MemoryLock;
pub use multi::MultiGuard;
pub use name::{LockName, MAX_NAME_BYTES};
pub use options::{
    AcquireOptions, ClientDefaults, DEFAULT_TTL, KeepAlive, MAX_TTL, MIN_TTL, Wait, parse_duration,
};
pub use percent::{PercentError, percent_decode, percent_encode};
pub use redact::redact_url;
pub use reentrant::{Owner, ReentrantGuard};
pub use rw::{ReadGuard, ReadWriteExt, WriteGuard};
pub use semaphore::{
    MAX_PERMITS, PermitGuard, PermitHolder, Semaphore, SemaphoreExt, SemaphoreInfo,
};

/// Re-exported so backends implement the trait with the same macro version.
pub use async_trait::async_trait;
