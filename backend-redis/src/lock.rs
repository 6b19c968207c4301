//! [`RedisLock`]: the client of one server or a Cluster, connecting, capabilities, and the
//! [`DistributedLock`] impl over the [`Node`] primitives.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    Fencing, FencingToken, Lease, LockInfo, LockName, PermitHolder, Released, Result,
    SemaphoreInfo, WaitMechanism, async_trait,
};

use crate::BACKEND;
use crate::config::{Deployment, RedisConfig};
use crate::node::{self, Node};
use crate::queue::{self, Hold};

/// Fencing assumption of a Redis Cluster.
pub const ASSUMPTION_CLUSTER: &str = "no Cluster failover loses acknowledged writes (replication to replicas is asynchronous) and every master persists with appendonly yes + appendfsync always";

/// Counters of one client, for benchmarks and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Leases extended successfully (by `extend` or keep-alive).
    pub renewals: u64,
    /// Leases an extend found gone (`LockLost`).
    pub renewals_lost: u64,
    /// Extends that failed with a store error.
    pub renewal_errors: u64,
    /// `extend_many` calls (keep-alive batches).
    pub renewal_batches: u64,
    /// Pipelines sent for renewals (one per batch on a single server; one per hash slot in a
    /// Cluster, sent concurrently).
    pub renewal_pipelines: u64,
    /// Wake-up messages this client's subscriber received. A release wakes only the head
    /// waiter's client, so a client whose waiters are not at the head receives none.
    pub wakeups: u64,
}

#[derive(Default)]
struct Counters {
    renewals: AtomicU64,
    renewals_lost: AtomicU64,
    renewal_errors: AtomicU64,
    renewal_batches: AtomicU64,
    renewal_pipelines: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) node: Node,
    defaults: ClientDefaults,
    fencing: Fencing,
    counters: Counters,
}

/// A client of one Redis server or Redis Cluster. Cheap to clone (one shared connection, one
/// subscriber).
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("url", &self.inner.node.shown())
            .field("prefix", &self.inner.node.prefix())
            .field("fencing", &self.inner.fencing)
            .finish()
    }
}

impl RedisLock {
    /// Connects per `config`, checks that the server answers (and accepts the credentials), and
    /// reads its persistence settings to decide the fencing guarantee.
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; nothing is held yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unreadable or invalid CA file, or a Redlock URL (which
    /// `backend-redlock` connects); [`Error::Backend`] when the server cannot be reached within
    /// `timeout` (retryable) or refuses the credentials (not retryable). Messages name the URL
    /// with its password redacted.
    pub async fn connect(config: &RedisConfig) -> Result<RedisLock> {
        let redacted = config.redacted_url();
        let (node, fencing) = match &config.deployment {
            Deployment::Single { host, port, tls } => {
                let node = Node::open(config, host, *port, *tls, redacted)?;
                let fencing = node.probe().await?;
                (node, fencing)
            }
            Deployment::Cluster { nodes } => {
                let node = Node::cluster(config, nodes).await?;
                // A first round trip, so bad credentials or a cluster that is down fail here.
                node.ping().await?;
                (
                    node,
                    Fencing::Conditional {
                        assumption: ASSUMPTION_CLUSTER,
                    },
                )
            }
            Deployment::Redlock { .. } => {
                return Err(Error::invalid_config(
                    BACKEND,
                    format!(
                        "`{redacted}` is a Redlock URL: connect it with backend_redlock::connect or RedlockLock::connect"
                    ),
                ));
            }
        };
        Ok(RedisLock {
            inner: Arc::new(Inner {
                node,
                defaults: config.defaults.clone(),
                fencing,
                counters: Counters::default(),
            }),
        })
    }

    /// This client's counters.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        RedisStats {
            renewals: c.renewals.load(Ordering::Relaxed),
            renewals_lost: c.renewals_lost.load(Ordering::Relaxed),
            renewal_errors: c.renewal_errors.load(Ordering::Relaxed),
            renewal_batches: c.renewal_batches.load(Ordering::Relaxed),
            renewal_pipelines: c.renewal_pipelines.load(Ordering::Relaxed),
            wakeups: self.inner.node.wakeups(),
        }
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        self.inner.node.prefix()
    }
}

impl Inner {
    /// Counts one extend's answer and turns it into the renewed lease or the error.
    fn extend_outcome(
        &self,
        lease: &Lease,
        started: Instant,
        ttl: Duration,
        answer: Result<bool>,
    ) -> Result<Lease> {
        let c = &self.counters;
        match answer {
            Ok(true) => {
                c.renewals.fetch_add(1, Ordering::Relaxed);
                Ok(lease.renewed(started, ttl))
            }
            Ok(false) => {
                c.renewals_lost.fetch_add(1, Ordering::Relaxed);
                Err(Error::lock_lost(BACKEND, lease.name(), "extend"))
            }
            Err(e) => {
                c.renewal_errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            self.inner.fencing,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::PubSub,
        )
        .native(crate::NATIVE)
        // On a single server every request runs on a connection with a response timeout of
        // `timeout`, and connecting is bounded by it too. The Cluster client retries a request
        // after a timeout, so there lockcore keeps its own bound.
        .bounded_requests(!self.inner.node.is_cluster())
        // The acquire scripts raise the fence counter to the minimum in the granting step.
        .min_token(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults.clone()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        queue::try_acquire(&self.inner.node, name, opts, Hold::Lock).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        queue::acquire_wait(&self.inner.node, name, opts, deadline, Hold::Lock).await
    }

    /// A read hold: granted while no writer holds the lock and none is queued (readers queue
    /// with writers in the lock's own queue); the token comes from the lock's fence counter.
    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        queue::try_acquire(&self.inner.node, name, opts, Hold::Read).await
    }

    /// Queues for a read hold behind the writers ahead of it; a run of readers at the head of
    /// the queue gets in together.
    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        queue::acquire_wait(&self.inner.node, name, opts, deadline, Hold::Read).await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let hold = Hold::Permit(permits);
        queue::try_acquire(&self.inner.node, name, opts, hold).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        let hold = Hold::Permit(permits);
        queue::acquire_wait(&self.inner.node, name, opts, deadline, hold).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        Ok(match self.inner.node.release(lease).await? {
            true => Released::Released,
            false => Released::NotHeld,
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::backend_support::check_ttl(ttl)?;
        let started = Instant::now();
        let answer = self.inner.node.extend(lease, ttl).await;
        self.inner.extend_outcome(lease, started, ttl, answer)
    }

    async fn extend_many(&self, leases: &[(Lease, Duration)]) -> Vec<Result<Lease>> {
        let inner = &self.inner;
        let (mut out, sent) = node::checked_batch(leases);
        let batch: Vec<(&Lease, Duration)> =
            sent.iter().map(|&i| (&leases[i].0, leases[i].1)).collect();
        let c = &inner.counters;
        c.renewal_batches.fetch_add(1, Ordering::Relaxed);
        c.renewal_pipelines
            .fetch_add(inner.node.pipelines(&batch), Ordering::Relaxed);
        let started = Instant::now();
        let answers = inner.node.extend_many(&batch).await;
        for (i, answer) in sent.into_iter().zip(answers) {
            let (lease, ttl) = &leases[i];
            out[i] = Some(inner.extend_outcome(lease, started, *ttl, answer));
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(node::protocol_error("extend", None, "no reply".into())))
            })
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let r = self.inner.node.inspect(name).await?;
        if r.holder.is_none() && r.fence.is_none() && r.queued == 0 && r.readers == 0 {
            return Ok(None);
        }
        let waiters = Some(usize::try_from(r.live_waiters).unwrap_or(0));
        if let (None, Some(reader)) = (&r.holder, r.oldest_reader) {
            // Read holds (no writer holds while a reader does): the oldest reader stands for
            // them, with its own token, as lockcore's memory backend reports them.
            let info = LockInfo::new(
                name,
                Some(reader.owner),
                Some(FencingToken(reader.token)),
                Some(Duration::from_millis(reader.remaining_ms)),
                waiters,
            );
            let readers = usize::try_from(r.readers).unwrap_or(0);
            return Ok(Some(info.with_readers(readers, 0)));
        }
        // Tokens are drawn only by a grant, so while the lock is held the fence counter is
        // its holder's token; when free it is the last one handed out.
        Ok(Some(LockInfo::new(
            name,
            r.holder,
            r.fence.map(FencingToken),
            (r.pttl > 0).then(|| Duration::from_millis(r.pttl as u64)),
            waiters,
        )))
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        let r = self.inner.node.inspect_semaphore(name).await?;
        if r.fence.is_none() && r.holders.is_empty() && r.queued == 0 {
            return Ok(None);
        }
        // The recorded count binds only while the semaphore is in use.
        let in_use = !r.holders.is_empty() || r.live_waiters > 0;
        let permits = u32::try_from(r.permits).ok().filter(|_| in_use);
        let holders = r
            .holders
            .into_iter()
            .map(|h| PermitHolder {
                owner: h.owner,
                token: FencingToken(h.token),
                remaining: Some(Duration::from_millis(h.remaining_ms)),
            })
            .collect();
        let waiters = usize::try_from(r.live_waiters).unwrap_or(0);
        Ok(Some(SemaphoreInfo::new(
            name,
            permits,
            holders,
            Some(waiters),
        )))
    }

    /// Forgets the lock `name` and the semaphore `name`, each unless it is in use.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        self.inner.node.forget(name).await
    }

    /// Every name with a fence counter under this client's prefix (a name gets one with its
    /// first grant and keeps it until `forget`), found with `SCAN`, which does not block the
    /// server; in a Cluster, on every master of the slot map.
    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.node.names().await
    }
}
