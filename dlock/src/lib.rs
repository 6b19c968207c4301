#![doc = include_str!("../README.md")]

mod config;
pub mod migrate;
mod redact;
mod registry;

pub use config::LockConfig;
pub use redact::redact;
pub use registry::{
    Backend, backends, connect, connect_config, native_primitives, scheme_of, schemes,
};

/// The whole lockcore API, so applications depend on `dlock` only.
pub use lockcore::*;
