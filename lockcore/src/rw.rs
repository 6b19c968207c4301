//! Read-write locks: many readers or one writer per name, on backends whose capabilities say
//! [`NativePrimitives::read_write`](crate::NativePrimitives). On such a backend the exclusive
//! lock of a name *is* its write lock: [`LockExt::lock`](crate::LockExt::lock) and
//! [`ReadWriteExt::write_lock`] exclude each other and every reader. Readers and writers queue
//! together in arrival order, so a steady stream of readers cannot starve a writer. Elsewhere
//! every method here fails with [`Error::Unsupported`] before any I/O.

use std::ops::Deref;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{AcquireOptions, DistributedLock, Error, LockGuard, LockName, Released, Result, Wait};

/// Exclusive (write) or shared (read) access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// One holder: a mutex, or the write side of a read-write lock.
    Exclusive,
    /// Many holders at once, none of them a writer.
    Shared,
}

macro_rules! guard_type {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A held ", $what, " lock: a [`LockGuard`] (keep-alive, `lost()`, `extend`, ")]
        #[doc = "release on drop) under a type that says which side it holds. Derefs to the guard."]
        #[must_use = "dropping the guard releases the lock at once; keep it alive while the work runs"]
        #[derive(Debug)]
        pub struct $name(LockGuard);

        impl $name {
            /// Releases the hold (owner-checked; `Released::NotHeld` if it was already lost).
            ///
            /// # Cancel safety
            /// As [`LockGuard::release`].
            ///
            /// # Errors
            /// Store failures (the hold then ends at its ttl).
            pub async fn release(self) -> Result<Released> {
                self.0.release().await
            }

            /// The plain guard.
            pub fn into_inner(self) -> LockGuard {
                self.0
            }
        }

        impl Deref for $name {
            type Target = LockGuard;
            fn deref(&self) -> &LockGuard {
                &self.0
            }
        }
    };
}

guard_type!(ReadGuard, "read (shared)");
guard_type!(WriteGuard, "write (exclusive)");

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
    /// [`Error::Unsupported`] (before any I/O) on a backend without read-write locks; otherwise
    /// as [`LockExt::lock`](crate::LockExt::lock), `Timeout` included.
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

fn check_supported(backend: &Arc<dyn DistributedLock>, operation: &'static str) -> Result<()> {
    let caps = backend.capabilities();
    if caps.native.read_write {
        Ok(())
    } else {
        Err(Error::Unsupported {
            operation,
            backend: caps.backend,
        })
    }
}

async fn acquire_rw(
    backend: &Arc<dyn DistributedLock>,
    name: &str,
    opts: &AcquireOptions,
    access: Access,
    operation: &'static str,
) -> Result<Option<LockGuard>> {
    let name = LockName::new(name)?;
    opts.clone().with_defaults(&backend.defaults()).validate()?;
    check_supported(backend, operation)?;
    crate::ext::acquire_as(backend, &name, opts, access).await
}

fn timeout(backend: &Arc<dyn DistributedLock>, name: &str, opts: &AcquireOptions) -> Error {
    Error::Timeout {
        backend: backend.capabilities().backend,
        name: name.to_owned(),
        waited: match opts.wait_value() {
            Wait::For(d) => d,
            _ => std::time::Duration::ZERO,
        },
    }
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
        acquire_rw(self, name, opts, Access::Exclusive, "write_lock")
            .await?
            .map(WriteGuard)
            .ok_or_else(|| timeout(self, name, opts))
    }

    async fn try_write_lock(
        &self,
        name: &str,
        opts: &AcquireOptions,
    ) -> Result<Option<WriteGuard>> {
        let opts = opts.clone().wait(Wait::No);
        Ok(
            acquire_rw(self, name, &opts, Access::Exclusive, "write_lock")
                .await?
                .map(WriteGuard),
        )
    }
}
