//! Redis-specific tests against kit servers: TLS, ACL users, bad input, credentials never
//! printed, the key layout, queue liveness, script reloading, pipelined renewals, inspect.
//!
//! One test binary, so that the kit starts its shared server once; the files are areas.

mod support;

mod connections;
mod lock_key;
mod locks;
mod read_write;
mod semaphores;
