//! [`SqlLock`]: the `DistributedLock` contract over lease rows, written once for every dialect.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, Lease, LockInfo, LockName, Released, Result, SemaphoreInfo, async_trait,
};

use crate::client::{Client, is_permit, is_read};
use crate::common::{from_micros, token};
use crate::config::SqlConfig;
use crate::dialect::{READERS_OWNER, SqlDialect, lease_row_args};
use crate::queue::Kind;
use crate::statement::Args;

/// A lock client over lease rows in the database of dialect `D`; see [`PostgresLock`],
/// [`MySqlLock`] and [`SqliteLock`]. Clones share one pool.
///
/// [`PostgresLock`]: crate::PostgresLock
/// [`MySqlLock`]: crate::MySqlLock
/// [`SqliteLock`]: crate::SqliteLock
pub struct SqlLock<D: SqlDialect> {
    client: Arc<Client<D>>,
}

// By hand: a derive would require `D: Clone`.
impl<D: SqlDialect> Clone for SqlLock<D> {
    fn clone(&self) -> Self {
        SqlLock {
            client: self.client.clone(),
        }
    }
}

impl<D: SqlDialect> fmt::Debug for SqlLock<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(D::CLIENT)
            .field("url", &self.client.redacted)
            .field("table", &self.client.table)
            .finish()
    }
}

impl<D: SqlDialect> SqlLock<D> {
    /// Connects and creates the lease table if it does not exist. SQLite opens the database
    /// (creating it and its parent directory if needed) and switches a file database to WAL.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is not a URL of this dialect; [`Error::Backend`] if
    /// the server cannot be reached, the file cannot be created or opened, the database stays
    /// locked for the whole `timeout`, or the table cannot be created.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; a table being created is either created or
    /// not.
    pub async fn connect(config: &SqlConfig) -> Result<Self> {
        Ok(SqlLock {
            client: Arc::new(Client::connect(config).await?),
        })
    }

    /// Closes the pool (and PostgreSQL's listener) gracefully. Dropping every clone does the
    /// same without waiting.
    ///
    /// # Errors
    /// None: closing is best-effort and cannot fail.
    ///
    /// # Cancel safety
    /// Safe to drop; connections then close in the background.
    pub async fn close(&self) {
        self.client.dialect.close().await;
        self.client.runner.cache.clear();
        self.client.runner.pool.close().await;
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.client.table
    }
}

#[async_trait]
impl<D: SqlDialect> DistributedLock for SqlLock<D> {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            D::BACKEND,
            Fencing::Strict,
            Expiry::Ttl,
            Fairness::Fifo,
            self.client.waiting(),
        )
        // Read-write locks (`crate::read`) and counting semaphores (`crate::semaphore`).
        .native(crate::NATIVE)
        .shared_across_processes(self.client.dialect.shared_across_processes())
        // The acquiring statement sets the fence to GREATEST(fence + 1, min_token) (SQLite:
        // MAX(fence + 1, min_token)).
        .min_token(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.client.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.client.try_acquire(name, opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        crate::queue::acquire(&self.client, name, Kind::Lock, opts, deadline).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.client.try_acquire_read(name, opts).await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        crate::queue::acquire(&self.client, name, Kind::Read, opts, deadline).await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.client.try_acquire_permit(name, permits, opts).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let kind = Kind::Permits(permits);
        crate::queue::acquire(&self.client, name, kind, opts, deadline).await
    }

    async fn wait_for_release(&self, name: &LockName, until: Instant) -> Result<()> {
        let c = &self.client;
        let wait = c.dialect.wait_for_release(&c.runner, &c.sql, name, until);
        wait.await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        let c = &self.client;
        if is_read(lease) {
            return c.release_read(lease).await;
        }
        if is_permit(lease) {
            return c.release_permit(lease).await;
        }
        // A holder that a release handed the lock to: its waiter row must be gone first.
        c.settle_leaving(lease.name(), lease.owner()).await;
        c.release_row(c.lock_release(lease), lease, false).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::backend_support::check_ttl(ttl)?;
        let started = Instant::now();
        let c = &self.client;
        if is_read(lease) {
            return match c.extend_read(lease, ttl).await? {
                true => Ok(lease.renewed(started, ttl)),
                false => Err(Error::lock_lost(D::BACKEND, lease.name(), "extend")),
            };
        }
        let stmt = if is_permit(lease) {
            &c.sql.permits.extend
        } else {
            &c.sql.extend
        };
        let extend = c
            .runner
            .reply("extend", stmt, lease_row_args(lease).ttl(ttl));
        // MySQL sets CLIENT_FOUND_ROWS, so a matched row counts even if unchanged.
        if extend.await?.count() == 1 {
            Ok(lease.renewed(started, ttl))
        } else {
            Err(Error::lock_lost(D::BACKEND, lease.name(), "extend"))
        }
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let started = Instant::now();
        // Leases whose ttl is out of range get their error now; the rest go in one batch.
        let checked: Vec<_> = leases
            .iter()
            .map(|(_, t)| lockcore::backend_support::check_ttl(*t))
            .collect();
        // Locks' leases and permits' go in a batch each (their rows are in other tables); a
        // reader's extension is a transaction of its own (see `crate::read`).
        let batch = |permits: bool| -> Vec<(&Lease, Duration)> {
            leases
                .iter()
                .zip(&checked)
                .filter(|((lease, _), ok)| {
                    ok.is_ok() && !is_read(lease) && is_permit(lease) == permits
                })
                .map(|((lease, ttl), _)| (lease, *ttl))
                .collect()
        };
        let (locks, permits) = (batch(false), batch(true));
        let c = &self.client;
        let mut locks_done = if locks.is_empty() {
            Ok(Vec::new())
        } else {
            c.dialect.extend_batch(&c.runner, &c.sql, &locks).await
        }
        .map(Vec::into_iter);
        let mut permits_done = if permits.is_empty() {
            Ok(Vec::new())
        } else {
            let args: Vec<_> = permits
                .iter()
                .map(|(l, t)| lease_row_args(l).ttl(*t))
                .collect();
            let extend = &c.sql.permits.extend;
            let done = c.runner.each_in_transaction("extend", extend, &args).await;
            done.map(|d| d.into_iter().map(|n| n == 1).collect())
        }
        .map(Vec::into_iter);
        let mut out = Vec::with_capacity(leases.len());
        for ((lease, ttl), checked) in leases.iter().zip(checked) {
            if let Err(e) = checked {
                out.push(Err(e));
                continue;
            }
            if is_read(lease) {
                out.push(self.extend(lease, *ttl).await);
                continue;
            }
            let done = if is_permit(lease) {
                &mut permits_done
            } else {
                &mut locks_done
            };
            out.push(match done.as_mut().map(Iterator::next) {
                Ok(Some(true)) => Ok(lease.renewed(started, *ttl)),
                Ok(_) => Err(Error::lock_lost(D::BACKEND, lease.name(), "extend")),
                Err(e) => Err(batch_error(e, lease.name())),
            });
        }
        out
    }

    /// The lease row as it stands; while readers hold the name, its holder is the owner value
    /// `readers` (`dialect::READERS_OWNER`) and the details count the readers, and the details
    /// say how many of the waiters are readers.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let c = &self.client;
        let Some((owner, fence, remaining, waiters)) =
            c.runner.lock_row(&c.sql.inspect, name).await?
        else {
            return Ok(None);
        };
        let remaining = from_micros(remaining);
        let holder = owner.filter(|_| remaining.is_some());
        let readers_hold = holder.as_deref() == Some(READERS_OWNER);
        let (mut holding, mut queued) = (0, 0);
        if readers_hold || waiters > 0 {
            let reads = &c.sql.reads.summary;
            let counts = c.runner.reply("inspect", reads, Args::of(name)).await?;
            let count = |i| usize::try_from(counts.col(i).unwrap_or(0)).unwrap_or(0);
            (holding, queued) = (if readers_hold { count(0) } else { 0 }, count(1));
        }
        let waiters = Some(usize::try_from(waiters).unwrap_or(0));
        let info = LockInfo::new(name, holder, Some(token(fence)), remaining, waiters);
        Ok(Some(info.with_readers(holding, queued)))
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        self.client.inspect_semaphore(name).await
    }

    /// Forgets the lock `name` and the semaphore `name`, each unless it is in use.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        // The name's expired waiter rows first, then its row.
        let c = &self.client;
        for stmt in [&c.sql.forget_queue, &c.sql.reads.gc, &c.sql.forget] {
            c.runner.reply("forget", stmt, Args::of(name)).await?;
        }
        let semaphore = c.forget_semaphore(name).await?;
        Ok(self.inspect(name).await?.is_none() && semaphore)
    }
}

/// Copies a batch-wide failure to every lease it concerned.
fn batch_error(e: &Error, name: &LockName) -> Error {
    let (backend, operation, retryable, text) = match e {
        Error::Backend {
            backend,
            operation,
            retryable,
            source,
            ..
        } => (*backend, *operation, *retryable, source.to_string()),
        other => ("sql", "extend", other.is_retryable(), other.to_string()),
    };
    Error::backend(backend, operation, Some(name), retryable, text)
}
