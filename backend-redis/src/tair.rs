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
//! [`TairLock`] exposes the primitives for teams who think in those terms and implements
//! [`DistributedLock`] on top of them, so the shared suite runs on `tair://`. The connection is
//! this crate's single-server client (TLS, ACL, timeouts), reused as it is.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOptions, Capabilities, ClientDefaults, DistributedLock, Error, Expiry, Fairness,
    FencingToken, Lease, LockInfo, LockName, OwnerId, RawFloor, Released, Result, WaitMechanism,
    async_trait,
};
use redis::Value;

use crate::config::RedisConfig;
use crate::lock::RedisLock;
use crate::queue::millis;
use crate::scripts::{self, Call, Key, Keys, Lua};
use crate::store::{backend_error, protocol_error};

/// The backend name in capabilities and error messages.
pub const TAIR: &str = "tair";

/// What `expireLock` answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpireLock {
    /// Locked (or, in the reentrant form, entered again by its holder).
    Locked {
        /// The expiry timestamp (server time, ms): the proof for `expireUnlock`.
        expiry: u64,
        /// The version after this lock: the fencing token.
        version: u64,
        /// The holder's reentrant count (1 for a fresh lock).
        count: u64,
    },
    /// Held by another owner until `expiry` (server time, ms).
    Held {
        /// The holder's expiry timestamp.
        expiry: u64,
        /// The holder's owner id.
        holder: String,
    },
    /// Readers hold the key (the read-write form).
    Readers,
}

/// What `expireUnlock` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireUnlock {
    /// The lock is free now.
    Unlocked,
    /// A reentrant holder counted down; the lock is still held.
    CountedDown,
    /// The proof was not current (wrong, stale, or the lock expired): nothing changed.
    NotCurrent,
}

/// A reader's entry (the read-write form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadEnter {
    /// Entered, until `expiry` (server ms) unless renewed; `version`, bumped by the entry, is
    /// the reader's fencing token.
    Entered {
        /// The reader's expiry timestamp.
        expiry: u64,
        /// The version after this entry.
        version: u64,
    },
    /// A writer holds the key until `expiry`.
    Writer {
        /// The writer's expiry timestamp.
        expiry: u64,
        /// The writer's owner id.
        holder: String,
    },
}

/// A client of the Tair emulation on one Redis server. Cheap to clone.
#[derive(Clone)]
pub struct TairLock {
    client: RedisLock,
}

impl fmt::Debug for TairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TairLock")
            .field("server", &self.client)
            .finish()
    }
}

fn reply_error(operation: &'static str, name: &LockName, value: &Value) -> Error {
    protocol_error(operation, Some(name), format!("unexpected reply {value:?}"))
}

fn u64_at(items: &[Value], i: usize) -> Option<u64> {
    items
        .get(i)
        .and_then(scripts::int)
        .and_then(|v| u64::try_from(v).ok())
}

impl TairLock {
    /// Connects to the server of a `tair://` URL (the same forms and options as `redis://`).
    ///
    /// # Cancel safety
    /// Dropping the future closes what was opened; nothing is held yet.
    ///
    /// # Errors
    /// As [`RedisLock::connect`].
    pub async fn connect(config: &RedisConfig) -> Result<TairLock> {
        Ok(TairLock {
            client: RedisLock::connect(config).await?,
        })
    }

    fn call(&self, lua: &'static Lua, name: &LockName) -> Call {
        Keys::new(&self.client.inner.prefix, name).call(lua, &[Key::Tair, Key::Readers])
    }

    async fn eval(&self, operation: &'static str, name: &LockName, call: &Call) -> Result<Value> {
        self.client
            .inner
            .store
            .eval(call)
            .await
            .map_err(|e| backend_error(operation, Some(name), e))
    }

    /// `expireLock(key, expireTime)`: locks `name` for `owner` for `ttl` if it is unlocked (or
    /// its expiry passed), and no reader holds it. With `reentrant`, the holder locking again
    /// counts up and keeps its proof.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lock taken until its expiry (the proof is then lost;
    /// [`TairLock::expire_unlock_owner`] frees it by owner).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ttl outside the contract's bounds (before any I/O);
    /// store failures.
    pub async fn expire_lock(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        reentrant: bool,
    ) -> Result<ExpireLock> {
        self.lock_as(name, owner, ttl, reentrant, None, 0).await
    }

    /// `expire_lock` by a writer that will wait (`waiting` = how long its mark lasts without
    /// being refreshed): refused, it marks the name so that new readers stay out. A fresh
    /// lock's version is at least `floor` (0 = none).
    async fn lock_as(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        reentrant: bool,
        waiting: Option<Duration>,
        floor: u64,
    ) -> Result<ExpireLock> {
        lockcore::check_ttl(ttl)?;
        let call = self
            .call(&scripts::TAIR_LOCK, name)
            .owner_arg(owner)
            .arg(millis(ttl))
            .arg(if reentrant { "1" } else { "0" })
            .arg(waiting.map_or(0, millis))
            .arg(floor);
        let value = self.eval("expireLock", name, &call).await?;
        let items =
            scripts::array(&value).map_err(|e| protocol_error("expireLock", Some(name), e))?;
        match items.first().and_then(scripts::int) {
            Some(1) => match (u64_at(items, 1), u64_at(items, 2), u64_at(items, 3)) {
                (Some(expiry), Some(version), Some(count)) => Ok(ExpireLock::Locked {
                    expiry,
                    version,
                    count,
                }),
                _ => Err(reply_error("expireLock", name, &value)),
            },
            Some(0) => match items.get(2).and_then(scripts::text) {
                Some(holder) if holder == "readers" => Ok(ExpireLock::Readers),
                Some(holder) => Ok(ExpireLock::Held {
                    expiry: u64_at(items, 1).unwrap_or(0),
                    holder,
                }),
                None => Err(reply_error("expireLock", name, &value)),
            },
            _ => Err(reply_error("expireLock", name, &value)),
        }
    }

    /// `expireUnlock(key, timestamp)`: unlocks `name` only if it is still locked with exactly
    /// the proof `expiry` that `expire_lock` returned. A reentrant holder counts down first
    /// unless `whole`.
    ///
    /// # Cancel safety
    /// The unlock either happened in the store or not.
    ///
    /// # Errors
    /// Store failures.
    pub async fn expire_unlock(
        &self,
        name: &LockName,
        expiry: u64,
        whole: bool,
    ) -> Result<ExpireUnlock> {
        self.unlock(name, &expiry.to_string(), "", whole).await
    }

    /// Unlocks `name` if `owner` holds it, whatever the proof: the clean-up for an acquire
    /// whose reply (and so its proof) was lost.
    ///
    /// # Cancel safety
    /// The unlock either happened in the store or not.
    ///
    /// # Errors
    /// Store failures.
    pub async fn expire_unlock_owner(
        &self,
        name: &LockName,
        owner: OwnerId,
    ) -> Result<ExpireUnlock> {
        self.unlock(name, "", &owner.to_string(), true).await
    }

    async fn unlock(
        &self,
        name: &LockName,
        expiry: &str,
        owner: &str,
        whole: bool,
    ) -> Result<ExpireUnlock> {
        let call = self
            .call(&scripts::TAIR_UNLOCK, name)
            .arg(expiry)
            .arg(owner)
            .arg(if whole { "1" } else { "0" });
        let value = self.eval("expireUnlock", name, &call).await?;
        match scripts::int(&value) {
            Some(1) => Ok(ExpireUnlock::Unlocked),
            Some(2) => Ok(ExpireUnlock::CountedDown),
            Some(0) => Ok(ExpireUnlock::NotCurrent),
            _ => Err(reply_error("expireUnlock", name, &value)),
        }
    }

    /// Moves the expiry of a lock still held by `owner` with proof `expiry` to now + `ttl` (the
    /// proof stays the same); returns the new expiry, or `None` when the lock is no longer this
    /// proof's.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have extended the lock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ttl out of bounds (before any I/O); store failures.
    pub async fn extend_lock(
        &self,
        name: &LockName,
        owner: OwnerId,
        expiry: u64,
        ttl: Duration,
    ) -> Result<Option<u64>> {
        lockcore::check_ttl(ttl)?;
        let call = self
            .call(&scripts::TAIR_EXTEND, name)
            .arg(expiry)
            .owner_arg(owner)
            .arg(millis(ttl));
        let value = self.eval("extend", name, &call).await?;
        match scripts::int(&value) {
            Some(0) => Ok(None),
            Some(v) if v > 0 => Ok(Some(v as u64)),
            _ => Err(reply_error("extend", name, &value)),
        }
    }

    /// A reader enters `name` for `ttl` (renew it with [`TairLock::read_renew`]), in one step
    /// with the check that no writer holds it.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the reader registered until its expiry.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ttl out of bounds (before any I/O); store failures.
    pub async fn read_enter(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
    ) -> Result<ReadEnter> {
        self.read_enter_as(name, reader, ttl, 0).await
    }

    /// [`read_enter`](Self::read_enter) with a token floor (0 = none): the version the entry
    /// bumps is at least `floor`.
    async fn read_enter_as(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
        floor: u64,
    ) -> Result<ReadEnter> {
        lockcore::check_ttl(ttl)?;
        let value = self.read(name, reader, ttl, "enter", floor).await?;
        let items =
            scripts::array(&value).map_err(|e| protocol_error("read enter", Some(name), e))?;
        match items.first().and_then(scripts::int) {
            Some(1) => Ok(ReadEnter::Entered {
                expiry: u64_at(items, 1).unwrap_or(0),
                version: u64_at(items, 2).unwrap_or(0),
            }),
            Some(0) => Ok(ReadEnter::Writer {
                expiry: u64_at(items, 1).unwrap_or(0),
                holder: items.get(2).and_then(scripts::text).unwrap_or_default(),
            }),
            _ => Err(reply_error("read enter", name, &value)),
        }
    }

    /// The reader leaves; `false` when it was no longer registered (its expiry passed).
    ///
    /// # Cancel safety
    /// The exit either happened in the store or not.
    ///
    /// # Errors
    /// Store failures.
    pub async fn read_exit(&self, name: &LockName, reader: OwnerId) -> Result<bool> {
        let value = self.read(name, reader, Duration::ZERO, "exit", 0).await?;
        scripts::parse_flag(&value).map_err(|e| protocol_error("read exit", Some(name), e))
    }

    /// Moves a registered reader's expiry to now + `ttl`; `false` when it was no longer there.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not have renewed the reader.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ttl out of bounds (before any I/O); store failures.
    pub async fn read_renew(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
    ) -> Result<bool> {
        lockcore::check_ttl(ttl)?;
        let value = self.read(name, reader, ttl, "renew", 0).await?;
        scripts::parse_flag(&value).map_err(|e| protocol_error("read renew", Some(name), e))
    }

    /// One run of the read script: `op` for `reader`; `floor` (0 = none) only counts for
    /// `enter`.
    async fn read(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
        op: &str,
        floor: u64,
    ) -> Result<Value> {
        let call = self
            .call(&scripts::TAIR_READ, name)
            .owner_arg(reader)
            .arg(millis(ttl).max(1))
            .arg(op)
            .arg(floor);
        self.eval("read", name, &call).await
    }
}

/// How long a waiting writer's mark keeps new readers out without being refreshed (a writer
/// that crashed while waiting holds readers up for at most this).
const WRITER_WAITING: Duration = Duration::from_secs(2);

/// The lease handle of a reader (a writer's handle is its proof, a number).
const READER: &str = "reader";

/// Sleeps between attempts of a waiting acquire: capped exponential backoff with jitter
/// (the emulation, like Tair, has no notification to wait for).
async fn backoff(attempt: u32, deadline: Option<Instant>) {
    let cap = Duration::from_millis(100);
    let base = Duration::from_millis(2)
        .saturating_mul(1 << attempt.min(6))
        .min(cap);
    let mut pause = base.mul_f64(0.5 + rand::random::<f64>() / 2.0);
    if let Some(d) = deadline {
        pause = pause.min(d.saturating_duration_since(Instant::now()));
    }
    tokio::time::sleep(pause).await;
}

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
    async fn try_write(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        waiting: Option<Duration>,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let floor = scripts::floor_arg(TAIR, opts)?;
        let mut guard = Abandon::arm(self, name, owner, waiting.is_some());
        let answer = self
            .lock_as(name, owner, opts.ttl_value(), false, waiting, floor)
            .await;
        guard.armed = false;
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

    async fn try_read(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let started = Instant::now();
        let floor = scripts::floor_arg(TAIR, opts)?;
        let mut guard = Abandon::arm(self, name, owner, false);
        let answer = self
            .read_enter_as(name, owner, opts.ttl_value(), floor)
            .await;
        guard.armed = false;
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

    /// Polls `attempt` with backoff until it grants or `deadline` passes. A writer's mark is
    /// cleared when it gives up.
    async fn wait_for(
        &self,
        name: &LockName,
        owner: OwnerId,
        deadline: Option<Instant>,
        writer: bool,
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let mut guard = Abandon::arm(self, name, owner, writer);
        let mut attempt = 0;
        loop {
            let got = if writer {
                self.try_write(name, owner, opts, Some(WRITER_WAITING))
                    .await?
            } else {
                self.try_read(name, owner, opts).await?
            };
            if got.is_some() {
                guard.armed = false;
                return Ok(got);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                guard.armed = false;
                if writer {
                    self.read(name, owner, Duration::ZERO, "unwait", 0).await?;
                }
                return Ok(None);
            }
            backoff(attempt, deadline).await;
            attempt += 1;
        }
    }
}

/// Frees a lock granted to a dropped `try_acquire` (its reply, and so its proof, was lost),
/// in a task spawned at once; disarmed when the acquire returns.
struct Abandon {
    lock: TairLock,
    name: LockName,
    owner: OwnerId,
    armed: bool,
    /// A waiting writer: its `writer waiting` mark goes too.
    writer_waits: bool,
}

impl Abandon {
    /// Armed for `owner`'s attempt on `name` (`writer_waits`: it may leave a `writer waiting`
    /// mark).
    fn arm(lock: &TairLock, name: &LockName, owner: OwnerId, writer_waits: bool) -> Self {
        Abandon {
            lock: lock.clone(),
            name: name.clone(),
            owner,
            armed: true,
            writer_waits,
        }
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (lock, name, owner) = (self.lock.clone(), self.name.clone(), self.owner);
        let writer_waits = self.writer_waits;
        // The reader of this owner, its lock, and its waiting mark, whichever it got.
        lockcore::spawn_cleanup(TAIR, &self.name, async move {
            let read = lock.read_exit(&name, owner).await?;
            let locked = lock.expire_unlock_owner(&name, owner).await? != ExpireUnlock::NotCurrent;
            if writer_waits {
                lock.read(&name, owner, Duration::ZERO, "unwait", 0).await?;
            }
            Ok(read || locked)
        });
    }
}

fn proof_of(lease: &Lease) -> Option<u64> {
    lease.handle().and_then(|h| h.parse().ok())
}

#[async_trait]
impl DistributedLock for TairLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            TAIR,
            self.client.capabilities().fencing,
            Expiry::Ttl,
            Fairness::Unordered,
            WaitMechanism::Poll,
        )
        .bounded_requests(true)
        .native(true, true, false)
        // expireLock and a reader's entry raise the version to the floor in the same step.
        .token_floor(true)
    }

    fn defaults(&self) -> ClientDefaults {
        self.client.defaults()
    }

    async fn try_acquire(&self, name: &LockName, opts: &AcquireOptions) -> Result<Option<Lease>> {
        self.try_write(name, opts.owner_or_random(), opts, None)
            .await
    }

    async fn acquire_wait(
        &self,
        name: &LockName,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Lease>> {
        self.wait_for(name, opts.owner_or_random(), deadline, true, opts)
            .await
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
        self.wait_for(name, opts.owner_or_random(), deadline, false, opts)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<Released> {
        if lease.handle() == Some(READER) {
            return Ok(match self.read_exit(lease.name(), lease.owner()).await? {
                true => Released::Released,
                false => Released::NotHeld,
            });
        }
        let Some(expiry) = proof_of(lease) else {
            return Ok(Released::NotHeld);
        };
        // The proof and the owner both: a lease of this client names its own acquisition.
        let answer = self
            .unlock(
                lease.name(),
                &expiry.to_string(),
                &lease.owner().to_string(),
                true,
            )
            .await?;
        Ok(match answer {
            ExpireUnlock::Unlocked | ExpireUnlock::CountedDown => Released::Released,
            ExpireUnlock::NotCurrent => Released::NotHeld,
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        lockcore::check_ttl(ttl)?;
        let started = Instant::now();
        let lost = || Error::lock_lost(TAIR, lease.name(), "extend");
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
            .eval("inspect", name, &self.call(&scripts::TAIR_INSPECT, name))
            .await?;
        let items = scripts::array(&value).map_err(|e| protocol_error("inspect", Some(name), e))?;
        let holder = items
            .first()
            .and_then(scripts::text)
            .filter(|h| !h.is_empty());
        let left = items.get(1).and_then(scripts::int).unwrap_or(-1);
        let version = u64_at(items, 2).unwrap_or(0);
        let readers = u64_at(items, 3).unwrap_or(0);
        if holder.is_none() && version == 0 && readers == 0 {
            return Ok(None);
        }
        let mut info = LockInfo::new(
            name,
            holder,
            (version > 0).then_some(FencingToken(version)),
            u64::try_from(left).ok().map(Duration::from_millis),
            None,
        );
        if readers > 0 {
            info = info.with_details(vec![format!("{readers} reader(s) inside")]);
        }
        Ok(Some(info))
    }

    async fn forget(&self, name: &LockName) -> Result<bool> {
        let value = self
            .eval("forget", name, &self.call(&scripts::TAIR_FORGET, name))
            .await?;
        scripts::parse_flag(&value).map_err(|e| protocol_error("forget", Some(name), e))
    }

    fn raw_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.client.raw_floor()
    }

    fn fenced_floor(&self) -> Option<Arc<dyn RawFloor>> {
        self.client.fenced_floor()
    }
}
