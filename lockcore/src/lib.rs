#![doc = include_str!("../README.md")]

mod backend;
mod capabilities;
mod cleanup;
mod error;
mod ext;
mod guard;
mod lease;
pub mod memory;
mod multi;
mod name;
mod options;
mod percent;
mod redact;
mod reentrant;
mod renewer;
mod rw;
pub mod wait;

pub use backend::{DistributedLock, RawFloor};
pub use capabilities::{Capabilities, Expiry, Fairness, Fencing, NativePrimitives, WaitMechanism};
pub use cleanup::spawn_cleanup;
pub use error::{BoxError, Error, Result};
pub use ext::{LockExt, acquire, lock_name};
pub use guard::{LeaseWatch, LockGuard, LostReason};
pub use lease::{FencingToken, Lease, LockInfo, OwnerId, Released};
pub use memory::MemoryLock;
pub use multi::MultiGuard;
pub use name::{LockName, MAX_NAME_BYTES};
pub use options::{
    AcquireOptions, ClientDefaults, DEFAULT_TTL, KeepAlive, MAX_TTL, MIN_TTL, Wait, check_ttl,
    default_drift, parse_duration,
};
pub use percent::{PercentError, percent_decode};
pub use redact::{redact_url, scrub, secrets_of};
pub use reentrant::{Owner, ReentrantGuard};
pub use rw::{Access, ReadGuard, ReadWriteExt, WriteGuard};

/// Re-exported so backends implement the trait with the same macro version.
pub use async_trait::async_trait;
