//! Read-write locks: many readers or one writer per name, on backends whose capabilities say
//! [`NativePrimitives::read_write`](crate::NativePrimitives). On such a backend the exclusive
//! lock of a name *is* its write lock: [`LockExt::lock`](crate::LockExt::lock) and
//! [`ReadWriteExt::write_lock`] exclude each other and every reader. Readers and writers queue
//! together in arrival order, so a steady stream of readers cannot starve a writer. Elsewhere
//! every method here fails with [`Error::Unsupported`](crate::Error::Unsupported) before any I/O.

use std::sync::Arc;

use async_trait::async_trait;

use crate::acquire::{Access, acquire_resolved, resolve, timeout};
use crate::guard::guard_type;
use crate::{AcquireOptions, DistributedLock, LockGuard, LockName, Result, Wait};

guard_type!(ReadGuard, "read (shared) lock");
guard_type!(WriteGuard, "write (exclusive) lock");

/// Read-write locking on a connected backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
/// use std::sync::Arc;
/// use lockcore::{AcquireOptions, DistributedLock, MemoryLock, ReadWriteExt};
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new("rw-doc"));
/// let r1 = locks.read_lock("catalog", &AcquireOptions::new()).await?;
/// let r2 = locks.read_lock("catalog", &AcquireOptions::new()).await?;
/// assert!(locks.try_write_lock("catalog", &AcquireOptions::new()).await?.is_none());
/// r1.release().await?;
/// r2.release().await?;
/// let w = locks.write_lock("catalog", &AcquireOptions::new()).await?;
/// w.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait ReadWriteExt {
    /// Acquires a shared hold on `name`, waiting per `opts`.
    ///
    /// # Cancel safety
    /// As [`LockExt::lock`](crate::LockExt::lock).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) (before any I/O) on a backend without
    /// read-write locks; otherwise as [`LockExt::lock`](crate::LockExt::lock), `Timeout`
    /// included.
    async fn read_lock(&self, name: &str, opts: &AcquireOptions) -> Result<ReadGuard>;

    /// One attempt at a shared hold: `Ok(None)` while a writer holds or waits.
    ///
    /// # Cancel safety
    /// As [`LockExt::lock`](crate::LockExt::lock).
    ///
    /// # Errors
    /// As [`read_lock`](Self::read_lock), without `Timeout`.
    async fn try_read_lock(&self, name: &str, opts: &AcquireOptions) -> Result<Option<ReadGuard>>;

    /// Acquires the exclusive (write) hold on `name`, waiting per `opts`.
    ///
    /// # Cancel safety
    /// As [`LockExt::lock`](crate::LockExt::lock).
    ///
    /// # Errors
    /// As [`read_lock`](Self::read_lock).
    async fn write_lock(&self, name: &str, opts: &AcquireOptions) -> Result<WriteGuard>;

    /// One attempt at the write hold: `Ok(None)` while anyone holds or waits.
    ///
    /// # Cancel safety
    /// As [`LockExt::lock`](crate::LockExt::lock).
    ///
    /// # Errors
    /// As [`read_lock`](Self::read_lock), without `Timeout`.
    async fn try_write_lock(&self, name: &str, opts: &AcquireOptions)
    -> Result<Option<WriteGuard>>;
}

async fn acquire_rw(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
    access: Access,
    operation: &'static str,
) -> Result<Option<LockGuard>> {
    let name = LockName::new(name)?;
    let opts = resolve(backend, opts)?;
    let caps = backend.capabilities();
    caps.require(caps.native.read_write, operation)?;
    acquire_resolved(backend, &name, &opts, access).await
}

#[async_trait]
impl ReadWriteExt for Arc<dyn DistributedLock> {
    async fn read_lock(&self, name: &str, opts: &AcquireOptions) -> Result<ReadGuard> {
        acquire_rw(self, name, opts, Access::Shared, "read_lock")
            .await?
            .map(ReadGuard)
            .ok_or_else(|| timeout(self, name, opts))
    }

    async fn try_read_lock(&self, name: &str, opts: &AcquireOptions) -> Result<Option<ReadGuard>> {
        let opts = opts.clone().wait(Wait::No);
        Ok(acquire_rw(self, name, &opts, Access::Shared, "read_lock")
            .await?
            .map(ReadGuard))
    }

    async fn write_lock(&self, name: &str, opts: &AcquireOptions) -> Result<WriteGuard> {
        let opts = opts.clone().write_side();
        acquire_rw(self, name, &opts, Access::Exclusive, "write_lock")
            .await?
            .map(WriteGuard)
            .ok_or_else(|| timeout(self, name, &opts))
    }

    async fn try_write_lock(
        &self,
        name: &str,
        opts: &AcquireOptions,
    ) -> Result<Option<WriteGuard>> {
        let opts = opts.clone().wait(Wait::No).write_side();
        Ok(
            acquire_rw(self, name, &opts, Access::Exclusive, "write_lock")
                .await?
                .map(WriteGuard),
        )
    }
}
