//! Clean-up after an interrupted acquire, for backends: spawned at once on the current tokio
//! runtime (never `block_on` in a `Drop`), or, outside any runtime, a warning that the lock's
//! own expiry will have to end it.

use std::future::Future;

use crate::{LockName, Result};

/// Spawns `undo` (the clean-up of an acquire whose caller went away) on the current tokio
/// runtime and logs how it ended; outside a runtime, logs that the lock ends at its ttl instead.
/// `undo` resolves to whether it found something to undo. Backends call this from the `Drop` of
/// their armed clean-up guards.
pub fn spawn_cleanup(
    backend: &'static str,
    name: &LockName,
    undo: impl Future<Output = Result<bool>> + Send + 'static,
) {
    let name = name.clone();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                match undo.await {
                    Ok(undone) => tracing::debug!(
                        backend,
                        lock = %name,
                        undone,
                        "clean-up after an interrupted acquire"
                    ),
                    Err(e) => tracing::warn!(
                        backend,
                        lock = %name,
                        error = %e,
                        "clean-up after an interrupted acquire failed; what it left ends at its ttl"
                    ),
                }
            });
        }
        Err(_) => tracing::warn!(
            backend,
            lock = %name,
            "acquire interrupted outside a tokio runtime; what it left ends at its ttl"
        ),
    }
}
