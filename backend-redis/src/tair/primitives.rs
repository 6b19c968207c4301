//! The Tair primitives: `expireLock`, `expireUnlock`, the extend that keeps the proof, and
//! the read-write form's reader entry, exit and renewal, each one script on the server.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use lockcore::{Error, LockName, OwnerId, Result};
use redis::Value;

use crate::config::RedisConfig;
use crate::lock::RedisLock;
use crate::node::replies;
use crate::node::scripts::{self, Call, Lua};
use crate::node::{ALIVE, millis, protocol_error};

/// The emulation's keys of one name: the lock's hash (flag, expiry, proof, owner, count,
/// version), the readers' ZSET (scored by expiry), and dlock's FIFO queue of waiters (entries,
/// their liveness, the ticket counter), under the name's hash tag.
const KEYS: [&str; 5] = [
    ":tair",
    ":readers",
    ":tair:queue",
    ":tair:alive",
    ":tair:seq",
];

/// A script with the node's queue helpers and the emulation's own pasted at its `--@tair` line
/// (not the node's other helpers: Redis defines each helper on every call).
fn tair_script(body: &str) -> Lua {
    let prelude = format!("{}\n{}", scripts::QUEUE, include_str!("lua/common.lua"));
    Lua::with_prelude(body, "--@tair", &prelude)
}

/// How an acquire treats dlock's queue (`ARGV` mode of `lock.lua` and `read.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queue {
    /// Tair's own commands: the queue plays no part.
    Bypass,
    /// One attempt that never jumps a live queue.
    Try,
    /// The queue's head (or a newcomer to an empty queue) is granted; anyone else queues.
    Wait,
}

impl Queue {
    fn arg(self) -> &'static str {
        match self {
            Queue::Bypass => "plain",
            Queue::Try => "try",
            Queue::Wait => "wait",
        }
    }
}

/// An acquire's answer in full (a refusal says what is in the way and the place in the queue).
pub(super) enum Answer {
    /// Granted: the proof (a writer's; a reader's expiry) and the version.
    Granted { proof: u64, version: u64 },
    /// Refused: the hold in the way lasts `blocked` ms unless released (negative: only the
    /// queue is ahead); `rank` is the place in the queue (-1: not queued).
    Refused { blocked: i64, rank: i64 },
}

/// Decodes the refusal fields `{0, _, _, rank, ms_blocked}` of `lock.lua` and `read.lua`.
fn refusal(items: &[Value]) -> Answer {
    let at = |i: usize| items.get(i).and_then(replies::int).unwrap_or(-1);
    Answer::Refused {
        blocked: at(4),
        rank: at(3),
    }
}

/// `expireLock` (`lua/lock.lua`).
static LOCK: LazyLock<Lua> = LazyLock::new(|| tair_script(include_str!("lua/lock.lua")));
/// dlock's single attempt at the write lock when nobody reads or queues (`lua/try_fast.lua`).
static TRY_FAST: LazyLock<Lua> = LazyLock::new(|| tair_script(include_str!("lua/try_fast.lua")));
/// `expireUnlock` (`lua/unlock.lua`). Not repeatable: a reentrant holder's unlock counts down.
static UNLOCK: LazyLock<Lua> = LazyLock::new(|| tair_script(include_str!("lua/unlock.lua")));
/// Extend a held lock, keeping its proof (`lua/extend.lua`).
static EXTEND: LazyLock<Lua> =
    LazyLock::new(|| tair_script(include_str!("lua/extend.lua")).repeatable());
/// Readers enter, exit, renew; a waiting writer gives up (`lua/read.lua`).
static READ: LazyLock<Lua> = LazyLock::new(|| tair_script(include_str!("lua/read.lua")));
/// State for `inspect` (`lua/inspect.lua`).
pub(super) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| tair_script(include_str!("lua/inspect.lua")).repeatable());
/// Delete a free name (`lua/forget.lua`).
pub(super) static FORGET: LazyLock<Lua> =
    LazyLock::new(|| tair_script(include_str!("lua/forget.lua")).repeatable());

/// The source of the script in `file` (a name in `src/tair/lua/`, such as `"lock.lua"`),
/// exactly as the emulation sends it (its prelude inserted); `None` for a file that is no
/// script of its own. For audits, and for measuring what each script costs.
pub fn script_source(file: &str) -> Option<&'static str> {
    let lua: &'static Lua = match file {
        "lock.lua" => &LOCK,
        "try_fast.lua" => &TRY_FAST,
        "unlock.lua" => &UNLOCK,
        "extend.lua" => &EXTEND,
        "read.lua" => &READ,
        "inspect.lua" => &INSPECT,
        "forget.lua" => &FORGET,
        _ => return None,
    };
    Some(&lua.code)
}

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
    pub(super) client: RedisLock,
}

impl fmt::Debug for TairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TairLock")
            .field("server", &self.client)
            .finish()
    }
}

pub(super) fn reply_error(operation: &'static str, name: &LockName, value: &Value) -> Error {
    protocol_error(operation, Some(name), format!("unexpected reply {value:?}"))
}

/// Decodes an `expireLock` reply (`lock.lua`'s or `try_fast.lua`'s).
fn decode_lock(name: &LockName, value: &Value) -> Result<ExpireLock> {
    let items = replies::array(value).map_err(|e| protocol_error("expireLock", Some(name), e))?;
    match items.first().and_then(replies::int) {
        Some(1) => match (u64_at(items, 1), u64_at(items, 2), u64_at(items, 3)) {
            (Some(expiry), Some(version), Some(count)) => Ok(ExpireLock::Locked {
                expiry,
                version,
                count,
            }),
            _ => Err(reply_error("expireLock", name, value)),
        },
        Some(0) => match items.get(2).and_then(replies::text) {
            Some(holder) if holder == "readers" => Ok(ExpireLock::Readers),
            Some(holder) => Ok(ExpireLock::Held {
                expiry: u64_at(items, 1).unwrap_or(0),
                holder,
            }),
            None => Err(reply_error("expireLock", name, value)),
        },
        _ => Err(reply_error("expireLock", name, value)),
    }
}

pub(super) fn u64_at(items: &[Value], i: usize) -> Option<u64> {
    items
        .get(i)
        .and_then(replies::int)
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

    pub(super) fn call(&self, lua: &'static Lua, name: &LockName) -> Call {
        self.client.inner.node.call_on(lua, name, &KEYS)
    }

    pub(super) async fn eval(
        &self,
        operation: &'static str,
        name: &LockName,
        call: &Call,
    ) -> Result<Value> {
        self.client.inner.node.run(operation, name, call).await
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
        self.lock_as(name, owner, ttl, reentrant, None, 0, Queue::Bypass)
            .await
    }

    /// `expire_lock` by a writer that will wait (`waiting` = how long its mark lasts without
    /// being refreshed): refused, it marks the name so that new readers stay out. A fresh
    /// lock's version is at least `min_token` (0 = none). `queue` says how dlock's queue counts.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lock_as(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        reentrant: bool,
        waiting: Option<Duration>,
        min_token: u64,
        queue: Queue,
    ) -> Result<ExpireLock> {
        let value = self
            .lock_call(name, owner, ttl, reentrant, waiting, min_token, queue)
            .await?;
        decode_lock(name, &value)
    }

    /// dlock's single attempt at the write lock (`lock_as` in mode `try`, not reentrant,
    /// without a waiting mark): `try_fast.lua`, with the one key and the arguments its common
    /// case reads (the token minimum only when there is one), and `lock.lua` only where that
    /// answers that someone may read or queue (or this owner's mark stands).
    pub(super) async fn try_lock(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        min_token: u64,
    ) -> Result<ExpireLock> {
        lockcore::backend_support::check_ttl(ttl)?;
        let node = &self.client.inner.node;
        let call = node.call_on(&TRY_FAST, name, &KEYS[..1]);
        let call = call
            .owner_arg(owner)
            .arg(millis(ttl))
            .min_token_arg(min_token);
        let value = self.eval("expireLock", name, &call).await?;
        if replies::int(&value) == Some(-1) {
            let full = self.lock_as(name, owner, ttl, false, None, min_token, Queue::Try);
            return full.await;
        }
        decode_lock(name, &value)
    }
    /// One run of `lock.lua`.
    #[allow(clippy::too_many_arguments)]
    async fn lock_call(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        reentrant: bool,
        waiting: Option<Duration>,
        min_token: u64,
        queue: Queue,
    ) -> Result<Value> {
        lockcore::backend_support::check_ttl(ttl)?;
        let node = &self.client.inner.node;
        let (client, wakes) = node.wake_args(name);
        let call = self
            .call(&LOCK, name)
            .owner_arg(owner)
            .arg(millis(ttl))
            .arg(if reentrant { "1" } else { "0" })
            .arg(waiting.map_or(0, millis))
            .arg(min_token)
            .arg(queue.arg())
            .arg(millis(ALIVE))
            .arg(client)
            .arg(&*wakes);
        self.eval("expireLock", name, &call).await
    }

    /// A waiting writer's or reader's attempt in dlock's queue (`Queue::Wait`): a writer marks
    /// the name while it waits (see [`lock_as`](Self::lock_as)).
    pub(super) async fn queued_attempt(
        &self,
        name: &LockName,
        owner: OwnerId,
        ttl: Duration,
        min_token: u64,
        writer: Option<Duration>,
    ) -> Result<Answer> {
        let (value, operation) = match writer {
            Some(waiting) => (
                self.lock_call(
                    name,
                    owner,
                    ttl,
                    false,
                    Some(waiting),
                    min_token,
                    Queue::Wait,
                )
                .await?,
                "expireLock",
            ),
            None => {
                lockcore::backend_support::check_ttl(ttl)?;
                let read = self.read(name, owner, ttl, "enter", min_token, Queue::Wait);
                (read.await?, "read enter")
            }
        };
        let items = replies::array(&value).map_err(|e| protocol_error(operation, Some(name), e))?;
        match items.first().and_then(replies::int) {
            Some(1) => match (u64_at(items, 1), u64_at(items, 2)) {
                (Some(proof), Some(version)) => Ok(Answer::Granted { proof, version }),
                _ => Err(reply_error(operation, name, &value)),
            },
            Some(0) => Ok(refusal(items)),
            _ => Err(reply_error(operation, name, &value)),
        }
    }

    /// Takes `owner`'s entries out of dlock's queue of `name` and wakes the head if it may go
    /// now; `true` when there was one.
    pub(super) async fn leave_queue(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let value = self
            .read(name, owner, Duration::ZERO, "leave", 0, Queue::Wait)
            .await?;
        replies::parse_flag(&value).map_err(|e| protocol_error("leave queue", Some(name), e))
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
        self.unlock(name, &expiry.to_string(), None, whole).await
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
        self.unlock(name, "", Some(owner), true).await
    }

    /// One run of `unlock.lua`: `expiry` the proof (`""`: any), `owner` the holder (`None`:
    /// any).
    pub(super) async fn unlock(
        &self,
        name: &LockName,
        expiry: &str,
        owner: Option<OwnerId>,
        whole: bool,
    ) -> Result<ExpireUnlock> {
        let (_, wakes) = self.client.inner.node.wake_args(name);
        // The four keys `unlock.lua` reads, not the ticket counter: every key is an object and
        // a Lua string per call.
        let node = &self.client.inner.node;
        let call = node.call_on(&UNLOCK, name, &KEYS[..4]).arg(expiry);
        let call = match owner {
            Some(owner) => call.owner_arg(owner),
            None => call.arg(""),
        };
        let call = call.arg(if whole { "1" } else { "0" }).arg(&*wakes);
        let value = self.eval("expireUnlock", name, &call).await?;
        match replies::int(&value) {
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
        lockcore::backend_support::check_ttl(ttl)?;
        let call = self
            .call(&EXTEND, name)
            .arg(expiry)
            .owner_arg(owner)
            .arg(millis(ttl));
        let value = self.eval("extend", name, &call).await?;
        match replies::int(&value) {
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
        self.read_enter_as(name, reader, ttl, 0, Queue::Bypass)
            .await
    }

    /// [`read_enter`](Self::read_enter) with a token minimum (0 = none): the version the entry
    /// bumps is at least `min_token`; `queue` says how dlock's queue counts.
    pub(super) async fn read_enter_as(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
        min_token: u64,
        queue: Queue,
    ) -> Result<ReadEnter> {
        lockcore::backend_support::check_ttl(ttl)?;
        let value = self
            .read(name, reader, ttl, "enter", min_token, queue)
            .await?;
        let items =
            replies::array(&value).map_err(|e| protocol_error("read enter", Some(name), e))?;
        match items.first().and_then(replies::int) {
            Some(1) => Ok(ReadEnter::Entered {
                expiry: u64_at(items, 1).unwrap_or(0),
                version: u64_at(items, 2).unwrap_or(0),
            }),
            Some(0) => Ok(ReadEnter::Writer {
                expiry: u64_at(items, 1).unwrap_or(0),
                holder: items.get(2).and_then(replies::text).unwrap_or_default(),
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
        let value = self
            .read(name, reader, Duration::ZERO, "exit", 0, Queue::Bypass)
            .await?;
        replies::parse_flag(&value).map_err(|e| protocol_error("read exit", Some(name), e))
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
        lockcore::backend_support::check_ttl(ttl)?;
        let value = self
            .read(name, reader, ttl, "renew", 0, Queue::Bypass)
            .await?;
        replies::parse_flag(&value).map_err(|e| protocol_error("read renew", Some(name), e))
    }

    /// One run of the read script: `op` for `reader`; `min_token` (0 = none) and `queue` only
    /// count for `enter`.
    pub(super) async fn read(
        &self,
        name: &LockName,
        reader: OwnerId,
        ttl: Duration,
        op: &str,
        min_token: u64,
        queue: Queue,
    ) -> Result<Value> {
        let (client, wakes) = self.client.inner.node.wake_args(name);
        let call = self
            .call(&READ, name)
            .owner_arg(reader)
            .arg(millis(ttl).max(1))
            .arg(op)
            .arg(min_token)
            .arg(queue.arg())
            .arg(millis(ALIVE))
            .arg(client)
            .arg(&*wakes);
        self.eval("read", name, &call).await
    }
}

/// How long a waiting writer's mark keeps new readers out without being refreshed (a writer
/// that crashed while waiting holds readers up for at most this).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_have_distinct_hashes_and_differ_from_the_nodes() {
        let ours = [&*LOCK, &*UNLOCK, &*EXTEND, &*READ, &*INSPECT, &*FORGET];
        let mut shas: Vec<&str> = ours.iter().map(|l| l.sha.as_str()).collect();
        shas.extend(scripts::all().iter().map(|l| l.sha.as_str()));
        let n = shas.len();
        shas.sort_unstable();
        shas.dedup();
        assert_eq!(shas.len(), n);
    }
}
