//! All-or-nothing acquisition of several locks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use crate::{
    AcquireOptions, DistributedLock, FencingToken, LockGuard, LockName, LostReason, Released,
    Result, Wait,
};

type LostFuture<'a> = Pin<Box<dyn Future<Output = (LockName, LostReason)> + Send + 'a>>;

/// Guards for a set of locks taken together by [`LockExt::lock_many`](crate::LockExt::lock_many).
/// Dropping it releases every lock in the background.
#[must_use = "dropping a MultiGuard releases every lock at once"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The names and fencing tokens, in acquisition (canonical) order.
    pub fn tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// The individual guards, in acquisition order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every lock is still held (local check, no I/O).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any of the locks is lost, with that lock's name and reason.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> (LockName, LostReason) {
        let mut futures: Vec<LostFuture<'_>> = self
            .guards
            .iter()
            .map(|g| {
                let name = g.name();
                Box::pin(async move { (name, g.lost().await) }) as LostFuture<'_>
            })
            .collect();
        if futures.is_empty() {
            return std::future::pending().await;
        }
        std::future::poll_fn(|cx| {
            for f in futures.iter_mut() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    return Poll::Ready(v);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Releases every lock, in reverse order; reports the first error after trying them all.
    ///
    /// # Cancel safety
    /// Locks not yet released when the future is dropped are released in the background.
    ///
    /// # Errors
    /// The first store failure.
    pub async fn release(mut self) -> Result<Vec<Released>> {
        let mut first_err = None;
        let mut out = Vec::with_capacity(self.guards.len());
        while let Some(g) = self.guards.pop() {
            match g.release().await {
                Ok(r) => out.push(r),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        out.reverse();
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

pub(crate) async fn lock_many(
    backend: &Arc<dyn DistributedLock>,
    names: &[&str],
    opts: &AcquireOptions,
) -> Result<MultiGuard> {
    let mut names = names
        .iter()
        .map(LockName::new)
        .collect::<Result<Vec<_>>>()?;
    names.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    names.dedup();
    let resolved = crate::acquire::resolve(backend, opts)?;
    let deadline = match opts.wait_value() {
        Wait::For(d) => Some(Instant::now() + d),
        _ => None,
    };
    let mut taken: Vec<LockGuard> = Vec::with_capacity(names.len());
    for name in &names {
        let wait = match (opts.wait_value(), deadline) {
            (Wait::For(_), Some(d)) => Wait::For(d.saturating_duration_since(Instant::now())),
            (w, _) => w,
        };
        match crate::acquire::lock_resolved(backend, name, &resolved.with_wait(wait)).await {
            Ok(g) => taken.push(g),
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, held = taken.len(), "lock_many: giving back what was taken");
                while let Some(g) = taken.pop() {
                    if let Err(re) = g.release().await {
                        tracing::warn!(error = %re, "lock_many: release after failure failed; the lease will end at its ttl");
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(MultiGuard { guards: taken })
}
