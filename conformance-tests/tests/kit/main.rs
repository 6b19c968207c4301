//! Tests of the test kit itself: every server starts, answers, dies on kill -9, comes back on the
//! same port, freezes on pause and thaws on resume; the proxy injects each fault.
//!
//! Timeouts here only turn a hang into a failure; nothing asserts an upper bound on time.
//!
//! One test binary, so that the kit starts each shared server once; the files are areas.

mod support;

mod mariadb;
mod passwords;
mod ports;
mod postgres;
mod proxy;
mod redis;
mod server_control;
mod zookeeper;
