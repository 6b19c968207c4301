//! [`TairLock`] as a [`DistributedLock`]: the lease's token is the version and its handle the
//! proof. Waiting acquires, writers and readers, queue in dlock's FIFO queue beside the
//! emulation's hash and are woken by this client's wake-up hub (the loop of `crate::queue`,
//! the same as a `redis://` lock's); every attempt arms a [`CleanupGuard`].

use std::time::{Duration, Instant};

use lockcore::cleanup::{CleanupGuard, Undo};
use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    FencingToken, Lease, LockInfo, LockName, OwnerId, Released, Result, SemaphoreInfo,
    WaitMechanism, async_trait,
};

use super::BACKEND;
use super::primitives::{
    self, Answer, ExpireLock, ExpireUnlock, Queue, ReadEnter, TairLock, u64_at,
};
use crate::node::replies;
use crate::node::{Mode, Node, is_permit, min_token_arg, protocol_error};
use crate::queue::{self, Queued, Step};

/// How long a waiting writer's mark keeps Tair's own readers (which bypass the queue) out
/// without being refreshed: a writer that crashed while waiting holds them up for at most this.
const WRITER_WAITING: Duration = Duration::from_secs(2);

/// The lease handle of a reader (a writer's handle is its proof, a number).
const READER: &str = "reader";

fn lease_for(
    name: &LockName,
    owner: OwnerId,
    version: u64,
    started: Instant,
    opts: &AcquireOptions,
    handle: String,
) -> Lease {
    Lease::new(
        name.clone(),
        owner,
        FencingToken(version),
        started,
        opts.ttl_value(),
        opts.drift_value(),
    )
    .with_handle(handle)
}

impl TairLock {
    /// One attempt at the write lock that never jumps dlock's queue.
    async fn try_write(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let min_token = min_token_arg(BACKEND, opts)?;
        let guard = self.arm(name, owner, false);
        let answer = self
            .try_lock(name, owner, opts.ttl_value(), min_token)
            .await;
        let _ = guard.disarm();
        Ok(match answer? {
            ExpireLock::Locked {
                expiry, version, ..
            } => Some(lease_for(
                name,
                owner,
                version,
                started,
                opts,
                expiry.to_string(),
            )),
            ExpireLock::Held { .. } | ExpireLock::Readers => None,
        })
    }

    /// One attempt at a read hold that never jumps a writer queued in dlock's queue.
    async fn try_read(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let min_token = min_token_arg(BACKEND, opts)?;
        let guard = self.arm(name, owner, false);
        let answer = self
            .read_enter_as(name, owner, opts.ttl_value(), min_token, Queue::Try)
            .await;
        let _ = guard.disarm();
        Ok(match answer? {
            ReadEnter::Entered { version, .. } => Some(lease_for(
                name,
                owner,
                version,
                started,
                opts,
                READER.to_owned(),
            )),
            ReadEnter::Writer { .. } => None,
        })
    }

    /// Waits in dlock's queue for the write lock (`writer`) or a read hold, until `deadline`.
    async fn wait_for(
        &self,
        name: &LockName,
        deadline: Option<Instant>,
        writer: bool,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let hold = TairHold {
            lock: self.clone(),
            writer,
        };
        queue::wait(&hold, name, opts, deadline).await
    }
}

/// A hold of the emulation's lock as dlock's queue waits for it: the write lock, or a read hold.
#[derive(Clone)]
struct TairHold {
    lock: TairLock,
    writer: bool,
}

impl Queued for TairHold {
    const BACKEND: &'static str = BACKEND;

    fn node(&self) -> &Node {
        &self.lock.client.inner.node
    }

    async fn attempt(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        started: Instant,
        _queued: Option<Instant>,
    ) -> Result<Step> {
        debug_assert_eq!(mode, Mode::Wait, "the queue's loop waits");
        let waiting = self.writer.then_some(WRITER_WAITING);
        let answer = self
            .lock
            .queued_attempt(name, owner, opts.ttl_value(), min_token, waiting)
            .await?;
        Ok(match answer {
            Answer::Granted { proof, version } => {
                let handle = match self.writer {
                    true => proof.to_string(),
                    false => READER.to_owned(),
                };
                Step::Granted(lease_for(name, owner, version, started, opts, handle))
            }
            Answer::Refused { blocked, rank } => Step::Waiting {
                pttl: blocked,
                rank,
            },
        })
    }

    fn undo(self, name: LockName, owner: OwnerId) -> Undo {
        leave((self.lock, name, owner, self.writer))
    }
}

/// What an attempt of `owner` on a name may have left: a place in dlock's queue, a reader
/// entry, a lock (its proof lost with the reply), and, for a waiting writer (`true`), its
/// `writer waiting` mark (the state of its clean-up guard).
type Attempt = (TairLock, LockName, OwnerId, bool);

/// Frees whatever the attempt got, by owner: first its place in the queue (so no grant comes
/// after), then the reader of this owner, its lock, and its waiting mark.
fn leave((lock, name, owner, writer_waits): Attempt) -> Undo {
    Undo::Spawn(Box::pin(async move {
        let queued = lock.leave_queue(&name, owner).await?;
        let read = lock.read_exit(&name, owner).await?;
        let locked = lock.expire_unlock_owner(&name, owner).await? != ExpireUnlock::NotCurrent;
        if writer_waits {
            lock.read(&name, owner, Duration::ZERO, "unwait", 0, Queue::Bypass)
                .await?;
        }
        Ok(queued || read || locked)
    }))
}

impl TairLock {
    /// The clean-up guard of `owner`'s attempt on `name` (`writer_waits`: it may leave a
    /// `writer waiting` mark), disarmed when the acquire returns.
    fn arm(&self, name: &LockName, owner: OwnerId, writer_waits: bool) -> CleanupGuard<Attempt> {
        CleanupGuard::arm(
            BACKEND,
            name,
            (self.clone(), name.clone(), owner, writer_waits),
            leave,
        )
    }
}

fn proof_of(lease: &Lease) -> Option<u64> {
    lease.handle().and_then(|h| h.parse().ok())
}

#[async_trait]
impl DistributedLock for TairLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            BACKEND,
            self.client.capabilities().fencing,
            Expiry::Ttl,
            Fairness::Fifo,
            WaitMechanism::PubSub,
        )
        .bounded_requests(true)
        .native(super::NATIVE)
        // expireLock and a reader's entry raise the version to the minimum in the same step.
        .min_token(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.client.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.try_write(name, opts.owner_or_random(), opts).await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_for(name, deadline, true, opts).await
    }

    async fn try_acquire_shared(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        self.try_read(name, opts.owner_or_random(), opts).await
    }

    async fn acquire_shared_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_for(name, deadline, false, opts).await
    }

    // Semaphores: Tair has no semaphore command to emulate, so a permit is the single-server
    // semaphore of this crate (`src/node/lua/sem_*.lua`) on the same server, through the
    // client this emulation already holds. Its keys are apart from the emulation's hashes.

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
        let wait = self
            .client
            .acquire_permit_wait(name, permits, opts, deadline);
        wait.await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>> {
        self.client.inspect_semaphore(name).await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        if is_permit(lease) {
            return self.client.release(lease).await;
        }
        if lease.handle() == Some(READER) {
            return Ok(match self.read_exit(lease.name(), lease.owner()).await? {
                true => Released::Released,
                false => Released::NotHeld,
            });
        }
        // The proof as the handle holds it (the text `expireLock` returned), once it reads as
        // one.
        let Some(proof) = lease.handle().filter(|h| h.parse::<u64>().is_ok()) else {
            return Ok(Released::NotHeld);
        };
        // The proof and the owner both: a lease of this client names its own acquisition.
        let answer = self
            .unlock(lease.name(), proof, Some(lease.owner()), true)
            .await?;
        Ok(match answer {
            ExpireUnlock::Unlocked | ExpireUnlock::CountedDown => Released::Released,
            ExpireUnlock::NotCurrent => Released::NotHeld,
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::backend_support::check_ttl(ttl)?;
        let started = Instant::now();
        let lost = || Error::lock_lost(BACKEND, lease.name(), "extend");
        if is_permit(lease) {
            return self.client.extend(lease, ttl).await;
        }
        if lease.handle() == Some(READER) {
            let renewed = self.read_renew(lease.name(), lease.owner(), ttl).await?;
            return match renewed && lease.is_valid() {
                true => Ok(lease.renewed(started, ttl)),
                false => Err(lost()),
            };
        }
        let expiry = proof_of(lease).ok_or_else(lost)?;
        match self
            .extend_lock(lease.name(), lease.owner(), expiry, ttl)
            .await?
        {
            Some(_) if lease.is_valid() => Ok(lease.renewed(started, ttl)),
            _ => Err(lost()),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let value = self
            .eval("inspect", name, &self.call(&primitives::INSPECT, name))
            .await?;
        let items = replies::array(&value).map_err(|e| protocol_error("inspect", Some(name), e))?;
        let holder = items
            .first()
            .and_then(replies::text)
            .filter(|h| !h.is_empty());
        let left = items.get(1).and_then(replies::int).unwrap_or(-1);
        let version = u64_at(items, 2).unwrap_or(0);
        let readers = u64_at(items, 3).unwrap_or(0);
        let waiters = u64_at(items, 4).and_then(|w| usize::try_from(w).ok());
        if holder.is_none() && version == 0 && readers == 0 && waiters.unwrap_or(0) == 0 {
            return Ok(None);
        }
        let mut info = LockInfo::new(
            name,
            holder,
            (version > 0).then_some(FencingToken(version)),
            u64::try_from(left).ok().map(Duration::from_millis),
            waiters,
        );
        info = info.with_readers(usize::try_from(readers).unwrap_or(0), 0);
        Ok(Some(info))
    }

    /// Forgets the emulation's lock `name` and the semaphore `name`, each unless it is in use.
    async fn forget(&self, name: &LockName) -> Result<bool> {
        let value = self
            .eval("forget", name, &self.call(&primitives::FORGET, name))
            .await?;
        let lock =
            replies::parse_flag(&value).map_err(|e| protocol_error("forget", Some(name), e))?;
        let semaphore = self.client.forget(name).await?;
        Ok(lock && semaphore)
    }
}
