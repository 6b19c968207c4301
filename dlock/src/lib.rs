#![doc = include_str!("../README.md")]

pub mod bench;
#[cfg(feature = "check")]
pub mod check;
#[cfg(feature = "check")]
pub mod compare;
mod config;
pub mod migrate;
mod redact;
mod registry;
#[cfg(feature = "check")]
pub mod soak;

pub use config::LockConfig;
pub use redact::redact;
pub use registry::{
    Backend, backends, connect, connect_config, native_primitives, scheme_of, schemes,
};

/// The whole lockcore API, so applications depend on `dlock` only.
pub use lockcore::*;
