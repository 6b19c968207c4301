#![doc = include_str!("../README.md")]
//!
//! The modules are what the command runs beside the library: the shared conformance suite
//! against a user's store ([`check`]), backends side by side ([`compare`]), random faults
//! against a store ([`soak`]) and the benchmark ([`bench`](mod@bench)). Applications depend on the
//! `fencedlock` package instead.

pub mod bench;
pub mod check;
pub mod compare;
pub mod soak;
