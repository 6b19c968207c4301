//! The Tair-style `expireLock` / `expireUnlock` emulation (`tair://host:port`), on one Redis
//! server, with its reentrant and read-write forms made atomic.
//!
//! Tair judges a lock by a flag and an expiry timestamp together: locked only while the flag is
//! set and the timestamp lies ahead. `expireLock` succeeds only in the unlocked state (an expired
//! lock is taken over in the same step) and returns the expiry timestamp, the caller's proof for
//! `expireUnlock`. Here each lock name is one hash (flag, expiry in the server's milliseconds,
//! owner, reentrant count, and the version, bumped by every successful `expireLock` and never
//! reset: the fencing token), and every call is one script, so:
//!
//! * a stale or wrong proof never unlocks a newer holder (a new expiry is always above the old
//!   one, even within one millisecond, so proofs of different holders never coincide); an
//!   extend moves the expiry but keeps the proof, so a renewal never invalidates it;
//! * the reentrant form counts per owner and balances in the same scripts;
//! * the read-write form's reader enter checks the writer and registers the reader in one step,
//!   and the writer's `expireLock` checks the readers in one step: the two-step race of the
//!   usual pattern (a reader checks the write lock, then counts itself in; a writer checks the
//!   count, then locks) cannot happen;
//! * no decision uses the client's clock: every script reads the server's `TIME`.
//!
//! [`TairLock`] exposes the primitives for teams who think in those terms
//! (`primitives.rs`) and implements [`DistributedLock`](lockcore::DistributedLock) on top of
//! them (`lock.rs`), so the shared suite runs on `tair://`. The connection is this crate's
//! single-server client (TLS, ACL, timeouts), reused as it is. The scripts are in
//! `src/tair/lua/`; they share the prelude `lua/common.lua`, pasted at each one's `--@tair`
//! line (`try_fast.lua`, the common case of dlock's single attempt, has none).

mod lock;
pub(crate) mod primitives;

pub use primitives::{ExpireLock, ExpireUnlock, ReadEnter, TairLock, script_source};

/// The backend name in capabilities and error messages.
pub const BACKEND: &str = "tair";

/// URL schemes of the Tair emulation.
pub const SCHEMES: &[&str] = &["tair"];

/// What the Tair emulation offers besides the mutex: reentrancy, read-write locks, and counting
/// semaphores (the single-server semaphore of this crate on the same server: Tair has no
/// semaphore command to emulate).
pub const NATIVE: lockcore::NativePrimitives = lockcore::NativePrimitives::new(true, true, true);

/// The former name of [`BACKEND`].
#[deprecated(note = "use backend_redis::tair::BACKEND")]
pub const TAIR: &str = BACKEND;
