//! The speed-ups: parts that make waits and statements cheaper but are not needed for a correct
//! lock. Each can be switched off with the `speedups` option ([`crate::Speedup`]); without any
//! of them every operation keeps the same guarantees, only slower.
//!
//! * [`doorbell`]: a release wakes the head of the queue in another process on the same host
//!   at once (MySQL, SQLite), instead of leaving it to its next poll.
//! * [`sqlite_write_queue`]: SQLite's writers queue in arrival order, keep-alive writes first,
//!   instead of meeting in SQLite's busy handler, which sleeps between tries.
//! * [`connection_cache`]: a connection whose statement completed is kept for the next
//!   statement, sparing the pool's ping on every checkout.
//! * [`background_dequeue`]: after a hand-over on MySQL, the new holder deletes its waiter row
//!   off its path, in the background.
//! * [`mysql_procedures`]: MySQL's semaphore grant, join and hand-over as stored procedures,
//!   one round trip each, where the account may create them.
//!
//! One more lives with what it speeds up, since it is the release statement itself: the
//! hand-over of a released lock or permit to the next waiter (`Statements::hand`,
//! `Client::lock_release`, `Client::release_permit`, see `crate::queue`).

pub(crate) mod background_dequeue;
pub(crate) mod connection_cache;
pub(crate) mod doorbell;
pub(crate) mod mysql_procedures;
pub(crate) mod sqlite_write_queue;
