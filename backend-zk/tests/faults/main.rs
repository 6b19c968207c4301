//! Scenarios only ZooKeeper has: sessions that expire behind a silent link, a lost reply to
//! `create`, a leader killed in an ensemble, queue nodes deleted or abandoned, the czxid fencing
//! token, and a silent semaphore holder whose permit comes back with its
//! session. Each uses a kit server of its own (or its own chroot on the shared
//! one), and checks safety on recorded histories and a fenced resource.
//!
//! One test binary; the files are areas.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod fencing;
mod queue;
mod semaphores;
mod sessions;
