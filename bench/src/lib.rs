#![doc = include_str!("../README.md")]

pub mod floor;
pub mod ladder;

pub use floor::{Floor, Floors};
