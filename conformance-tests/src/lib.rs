//! The shared conformance suite.
pub mod kit;
