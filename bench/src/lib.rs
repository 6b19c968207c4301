#![doc = include_str!("../README.md")]

pub mod floor;
pub mod ladder;
pub mod server_connections;

pub use floor::{Floor, Floors};
