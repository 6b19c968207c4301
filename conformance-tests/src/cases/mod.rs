//! One `pub async fn` per conformance case, in one file per area. Each takes a [`Ctx`](crate::Ctx)
//! (independent clients, unique names) and panics with a message naming what went wrong. The
//! helpers here are the ones cases of several areas share.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, LockGuard, Wait};

pub(crate) const SEC: Duration = Duration::from_secs(1);

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Options for a plain ttl lease: no keep-alive, one attempt.
pub(crate) fn lease_opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

/// Panics with "`what`: did not finish within `limit`" if `fut` does not finish in time: a
/// hang guard for tests, not a timing goal.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// One `try_lock` that the store answered: a retryable error (a Redlock vote whose nodes all
/// missed their timeout on a loaded machine, a broken connection) is no answer, so it asks
/// again, for up to a minute; any other error fails the case.
pub(crate) async fn try_answered(
    c: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
) -> Option<LockGuard> {
    within(60 * SEC, "an answer to try_lock", async {
        loop {
            match c.try_lock(name, opts).await {
                Ok(answer) => break answer,
                Err(e) if e.is_retryable() => tokio::time::sleep(ms(50)).await,
                Err(e) => panic!("try_lock: {e}"),
            }
        }
    })
    .await
}

/// Fails the case when `lease` is valid past the store's own expiry of it, by the store's word
/// ([`crate::history::overpromised`]); a store that does not report the time left passes.
pub(crate) async fn promise_kept(c: &Arc<dyn DistributedLock>, lease: &lockcore::Lease) {
    if let Some(v) = crate::history::overpromised(c.as_ref(), lease).await {
        panic!("{v}");
    }
}

pub(crate) async fn is_free(c: &Arc<dyn DistributedLock>, name: &str) -> bool {
    match try_answered(c, name, &lease_opts(10 * SEC)).await {
        Some(g) => {
            g.release().await.expect("release");
            true
        }
        None => false,
    }
}

mod exclusion;
mod expiry;
mod fencing;
mod input;
mod multi_lock;
mod read_write;
mod semaphore;
mod waiting;

pub use exclusion::*;
pub use expiry::*;
pub use fencing::*;
pub use input::*;
pub use multi_lock::*;
pub use read_write::*;
pub use semaphore::*;
pub use waiting::*;
