//! An ordered toy: the memory store holds the locks and permits, and a queue of its own orders
//! the waiters, so that a defect can break the order without touching anything else.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Lease, LockInfo,
    LockName, LostReason, MemoryLock, NativePrimitives, Released, Result, SemaphoreInfo,
    async_trait,
};

use crate::Target;

/// What an ordered toy gets wrong about its queue of waiters (`None`: nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FifoDefect {
    /// A single attempt succeeds over queued waiters whenever the lock (or a permit) is free.
    TryJumpsQueue,
    /// The newest waiter is served first.
    Lifo,
}

impl FifoDefect {
    /// Every FIFO defect.
    pub const ALL: [FifoDefect; 2] = [FifoDefect::TryJumpsQueue, FifoDefect::Lifo];
}

/// Who queues for what: the lock of a name, or a permit of the semaphore of that name.
type Key = (bool, LockName);

#[derive(Debug, Default)]
struct Queues {
    waiting: Mutex<HashMap<Key, VecDeque<u64>>>,
    next: AtomicU64,
}

/// A FIFO backend (it says [`lockcore::Fairness::Fifo`]) of locks and semaphores: waiters
/// queue in arrival order and are served from the head; a single attempt is refused while
/// anyone waits. With a [`FifoDefect`], the order is broken in that one way. Clients of the
/// same defect share one store.
#[derive(Debug)]
pub struct Queued {
    inner: MemoryLock,
    queues: &'static Queues,
    defect: Option<FifoDefect>,
}

impl Queued {
    /// A client of the shared store of ordered toys with `defect` (`None`: a correct one).
    pub fn new(defect: Option<FifoDefect>) -> Self {
        static STORES: OnceLock<Mutex<HashMap<String, &'static Queues>>> = OnceLock::new();
        let store = format!("ordered-toy-{defect:?}");
        let queues = *STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap()
            .entry(store.clone())
            .or_insert_with(|| Box::leak(Box::default()));
        Queued {
            inner: MemoryLock::new(&store),
            queues,
            defect,
        }
    }

    fn queued(&self, key: &Key) -> usize {
        let q = self.queues.waiting.lock().unwrap();
        q.get(key).map_or(0, VecDeque::len)
    }

    /// Whether waiter `id` is the one to serve next.
    fn turn(&self, key: &Key, id: u64) -> bool {
        let q = self.queues.waiting.lock().unwrap();
        let next = match self.defect {
            Some(FifoDefect::Lifo) => q.get(key).and_then(|q| q.back()),
            _ => q.get(key).and_then(|q| q.front()),
        };
        next == Some(&id)
    }

    async fn attempt(
        &self,
        key: &Key,
        opts: &AcquireOptions,
        permits: u32,
    ) -> Result<Option<Lease>> {
        if key.0 {
            self.inner.try_acquire_permit(&key.1, permits, opts).await
        } else {
            self.inner.try_acquire(&key.1, opts).await
        }
    }

    /// A single attempt: refused while anyone queues (unless the defect lets it jump).
    async fn try_in_order(
        &self,
        key: Key,
        opts: &AcquireOptions,
        permits: u32,
    ) -> Result<Option<Lease>> {
        if self.defect != Some(FifoDefect::TryJumpsQueue) && self.queued(&key) > 0 {
            return Ok(None);
        }
        self.attempt(&key, opts, permits).await
    }

    /// Queues, then attempts whenever it is this waiter's turn, until granted or `deadline`.
    async fn wait_in_order(
        &self,
        key: Key,
        opts: &AcquireOptions,
        permits: u32,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        if self.queued(&key) == 0
            && let Some(lease) = self.attempt(&key, opts, permits).await?
        {
            return Ok(Some(lease));
        }
        let id = self.queues.next.fetch_add(1, Ordering::Relaxed);
        self.queues
            .waiting
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .push_back(id);
        // Leaves the queue however the wait ends: granted, timed out, failed or dropped.
        let _place = Place {
            queues: self.queues,
            key: key.clone(),
            id,
        };
        loop {
            if self.turn(&key, id)
                && let Some(lease) = self.attempt(&key, opts, permits).await?
            {
                return Ok(Some(lease));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let nap = Duration::from_millis(2);
            let until = deadline.map_or(now + nap, |d| d.min(now + nap));
            tokio::time::sleep_until(until.into()).await;
        }
    }
}

/// A waiter's place in its queue, given up on drop.
struct Place {
    queues: &'static Queues,
    key: Key,
    id: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut q = self
            .queues
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(waiting) = q.get_mut(&self.key) {
            waiting.retain(|w| *w != self.id);
            if waiting.is_empty() {
                q.remove(&self.key);
            }
        }
    }
}

#[async_trait]
impl DistributedLock for Queued {
    fn capabilities(&self) -> Capabilities {
        // The memory store's, less read-write locks: readers would bypass this queue.
        let mut caps = self.inner.capabilities();
        caps.backend = "ordered-toy";
        caps.native = NativePrimitives::new(false, false, true);
        caps
    }

    fn defaults(&self) -> ClientDefaults {
        self.inner.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.try_in_order((false, name.clone()), opts, 1).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_in_order((false, name.clone()), opts, 1, deadline)
            .await
    }

    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.try_in_order((true, name.clone()), opts, permits).await
    }

    async fn acquire_permit_wait(
        &self,
        name: &LockName,
        permits: u32,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_in_order((true, name.clone()), opts, permits, deadline)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }

    fn lost_reason(&self, lease: &Lease, error: &Error) -> LostReason {
        self.inner.lost_reason(lease, error)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let waiting = self.queued(&(false, name.clone()));
        Ok(self.inner.inspect(name).await?.map(|mut info| {
            info.waiters = Some(waiting);
            info
        }))
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        let waiting = self.queued(&(true, name.clone()));
        Ok(self.inner.inspect_semaphore(name).await?.map(|mut info| {
            info.waiters = Some(waiting);
            info
        }))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        if self.queued(&(false, name.clone())) + self.queued(&(true, name.clone())) > 0 {
            return Ok(false);
        }
        self.inner.forget(name).await
    }

    async fn names(&self) -> Result<Vec<LockName>> {
        self.inner.names().await
    }
}

/// A target whose clients share the ordered toy store of `defect` (`None`: a correct one).
pub fn ordered_target(defect: Option<FifoDefect>) -> Target {
    let label = match defect {
        Some(d) => format!("mutant-ordered-{d:?}"),
        None => "ordered-toy".to_owned(),
    };
    Target::new(&label, "", move |_| async move {
        Ok(Arc::new(Queued::new(defect)) as Arc<dyn DistributedLock>)
    })
}
