//! The Lua scripts of one node (in `lua/`), the key layout, and the script calls built from
//! them (their replies are decoded in `replies`).
//!
//! Every script runs atomically on the server that owns the lock's hash slot. The same scripts
//! run unchanged on a single server and in a Cluster: all keys of one lock carry the hash tag
//! `{<prefix>:<escaped name>}`, so they live in one slot. Wake-ups go to a channel of the
//! head waiter's client (the node's wake-up hub): its own plain channel, which belongs to no
//! slot, or in a Redis 7 Cluster a shard channel under the lock's hash tag, in the lock's slot.
//! The shared helpers of `lua/queue.lua` and `lua/common.lua` are pasted at each script's
//! `--@common` line.

use std::sync::LazyLock;

use lockcore::{AcquireOptions, Error, LockName, OwnerId};
use redis::{Cmd, ToRedisArgs};

use super::replies::owner_hex;

/// One Lua script: its source (with the shared helpers inserted) and SHA1 for `EVALSHA`.
pub(crate) struct Lua {
    pub(crate) code: String,
    pub(crate) sha: String,
    /// Running it twice leaves the store as running it once (see [`Lua::repeatable`]).
    pub(crate) repeatable: bool,
}

/// The FIFO queue's Lua helpers (`lua/queue.lua`): the clock, the queue, the wake-up. The Tair
/// emulation's scripts take these alone.
pub(crate) const QUEUE: &str = include_str!("lua/queue.lua");

/// The node's shared Lua helpers: [`QUEUE`], then `lua/common.lua` (tokens, the lock key's
/// forms, grants), which builds on them.
pub(crate) const COMMON: &str = concat!(
    include_str!("lua/queue.lua"),
    include_str!("lua/common.lua")
);

impl Lua {
    /// `body` with the node's shared helpers ([`COMMON`]) inserted at its `--@common` line, so
    /// a fast path above that line runs without defining them.
    fn new(body: &str) -> Self {
        Self::with_prelude(body, "--@common", COMMON)
    }

    /// `body` with `prelude` inserted at its `marker` line (the Tair emulation's scripts share
    /// a prelude of their own).
    pub(crate) fn with_prelude(body: &str, marker: &str, prelude: &str) -> Self {
        let code = body.replacen(marker, prelude, 1);
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Lua {
            code,
            sha,
            repeatable: false,
        }
    }

    /// Marks a script that leaves the store as it found it when run a second time with the
    /// same arguments (owner- and token-checked releases, extends, cancels, reads), so that a
    /// call whose connection turned out to be closed may be sent again over a new one (see
    /// `Single::send`). An acquire is not: its second run could queue or grant again.
    pub(crate) fn repeatable(mut self) -> Self {
        self.repeatable = true;
        self
    }
}

/// `try` / `wait` acquire with fence INCR and the FIFO queue (`lua/acquire.lua`).
pub(crate) static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/acquire.lua")));
/// The fast path of a `try` acquire: free and nobody queued (`lua/try_fast.lua`).
pub(crate) static TRY_FAST: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/try_fast.lua")));
/// A release script with the plain case both begin with (`lua/release_head.lua`) in place of
/// its line `--@head` (the whole line: the comments above it name the marker too).
fn release_with_head(body: &str) -> Lua {
    let head = concat!("\n", include_str!("lua/release_head.lua"));
    Lua::new(&body.replacen("\n--@head\n", head, 1)).repeatable()
}
/// Compare-owner-then-delete plus wake-up of the head waiter (`lua/release.lua`).
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| release_with_head(include_str!("lua/release.lua")));
/// The release of a lock the fast path granted, while its key is plain (`lua/release_plain.lua`).
pub(crate) static RELEASE_PLAIN: LazyLock<Lua> =
    LazyLock::new(|| release_with_head(include_str!("lua/release_plain.lua")));
/// Compare-owner-then-PEXPIRE (`lua/extend.lua`).
pub(crate) static EXTEND: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/extend.lua")).repeatable());
/// Undo of an abandoned acquire (`lua/cancel.lua`).
pub(crate) static CANCEL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/cancel.lua")).repeatable());
/// Read-only state for `inspect` (`lua/inspect.lua`).
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/inspect.lua")).repeatable());
/// Deletes what is left of a name nobody holds or waits for (`lua/forget.lua`).
pub(crate) static FORGET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/forget.lua")).repeatable());
/// Redlock's max-only write-back of a fencing token (`lua/fence_max.lua`).
pub(crate) static FENCE_MAX: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/fence_max.lua")).repeatable());
/// `try` / `wait` for a semaphore's permit, with the count check (`lua/sem_acquire.lua`).
pub(crate) static SEM_ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/sem_acquire.lua")));
/// Owner- and token-checked release of a permit, waking the head waiter (`lua/sem_release.lua`).
pub(crate) static SEM_RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/sem_release.lua")).repeatable());
/// Owner- and token-checked extend of a permit (`lua/sem_extend.lua`).
pub(crate) static SEM_EXTEND: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/sem_extend.lua")).repeatable());
/// Undo of an abandoned permit acquire (`lua/sem_cancel.lua`).
pub(crate) static SEM_CANCEL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/sem_cancel.lua")).repeatable());
/// Read-only state of a semaphore (`lua/sem_inspect.lua`).
pub(crate) static SEM_INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/sem_inspect.lua")).repeatable());

/// The source of the script in `file` (a name in `src/node/lua/`, such as `"acquire.lua"`),
/// exactly as a node sends it (the shared helpers inserted); `None` for a file that is no
/// script of its own. For audits, and for measuring what each script costs.
pub fn script_source(file: &str) -> Option<&'static str> {
    let lua: &'static Lua = match file {
        "acquire.lua" => &ACQUIRE,
        "try_fast.lua" => &TRY_FAST,
        "release.lua" => &RELEASE,
        "release_plain.lua" => &RELEASE_PLAIN,
        "extend.lua" => &EXTEND,
        "cancel.lua" => &CANCEL,
        "inspect.lua" => &INSPECT,
        "forget.lua" => &FORGET,
        "fence_max.lua" => &FENCE_MAX,
        "sem_acquire.lua" => &SEM_ACQUIRE,
        "sem_release.lua" => &SEM_RELEASE,
        "sem_extend.lua" => &SEM_EXTEND,
        "sem_cancel.lua" => &SEM_CANCEL,
        "sem_inspect.lua" => &SEM_INSPECT,
        _ => return None,
    };
    Some(&lua.code)
}

/// Every script of a node, for tests that compare hashes.
#[cfg(test)]
pub(crate) fn all() -> [&'static Lua; 14] {
    [
        &*ACQUIRE,
        &*TRY_FAST,
        &*RELEASE,
        &*RELEASE_PLAIN,
        &*EXTEND,
        &*CANCEL,
        &*INSPECT,
        &*FORGET,
        &*FENCE_MAX,
        &*SEM_ACQUIRE,
        &*SEM_RELEASE,
        &*SEM_EXTEND,
        &*SEM_CANCEL,
        &*SEM_INSPECT,
    ]
}

/// The largest token minimum the scripts carry exactly: Lua numbers are doubles, which hold every
/// integer up to 2^53 and no more.
pub const MAX_MIN_TOKEN: u64 = 1 << 53;

/// The token minimum of `opts` as a script argument: 0 when none is set.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `backend` for a minimum above [`MAX_MIN_TOKEN`]: refused
/// (before any I/O) rather than rounded.
pub fn min_token_arg(backend: &'static str, opts: &AcquireOptions) -> lockcore::Result<u64> {
    match opts.min_token_value() {
        None => Ok(0),
        Some(f) if f.0 <= MAX_MIN_TOKEN => Ok(f.0),
        Some(f) => Err(Error::invalid_argument(
            "min_token",
            format!("{backend} carries token minimums up to 2^53 ({MAX_MIN_TOKEN}), not {f}"),
        )),
    }
}

/// One script call, built once as `EVALSHA sha numkeys keys... args...`.
///
/// The command is written straight from a lock's [`Keys`] and the arguments, with no
/// intermediate strings: this is on every acquire and release.
pub(crate) struct Call {
    pub(crate) lua: &'static Lua,
    cmd: Cmd,
}

impl Call {
    /// A call of `lua` on explicitly named keys (tests call scripts on keys of their own).
    #[cfg(test)]
    pub(crate) fn on(lua: &'static Lua, keys: &[&str]) -> Self {
        let mut call = Self::start(lua, keys.len(), keys.iter().map(|k| k.len()).sum());
        for k in keys {
            call.cmd.arg(*k);
        }
        call
    }

    fn start(lua: &'static Lua, nkeys: usize, key_bytes: usize) -> Self {
        // EVALSHA, sha, numkeys, the keys, and up to five arguments of a few dozen bytes.
        let mut cmd = Cmd::with_capacity(3 + nkeys + 5, 64 + key_bytes + 5 * 48);
        cmd.arg("EVALSHA").arg(lua.sha.as_str()).arg(nkeys);
        Call { lua, cmd }
    }

    /// Appends one argument (`ARGV[n]`).
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Appends the 32-hex-digit owner id as an argument.
    pub(crate) fn owner_arg(self, owner: OwnerId) -> Self {
        self.arg(&owner_hex(owner)[..])
    }

    /// Appends a token minimum as the last argument of a fast attempt (`try_fast.lua`, on a node
    /// and in the Tair emulation), and nothing for no minimum (0): the scripts read an absent
    /// min_token as none, and every argument costs the server an object and a Lua string per call.
    pub(crate) fn min_token_arg(self, min_token: u64) -> Self {
        if min_token > 0 {
            self.arg(min_token)
        } else {
            self
        }
    }

    /// The command to send.
    pub(crate) fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// The first key (it decides the Cluster slot); empty for a call without keys.
    pub(crate) fn first_key(&self) -> &[u8] {
        let mut after_sha = self.cmd.args_iter().skip(2);
        match (after_sha.next(), after_sha.next()) {
            (Some(redis::Arg::Simple(n)), Some(redis::Arg::Simple(key))) if n != b"0" => key,
            _ => &[],
        }
    }
}

/// One of a lock's keys, or of the semaphore of the same name; all share the hash tag
/// `{<prefix>:<escaped name>}`. The semaphore's suffixes begin with `:sem:`, so its keys never
/// meet the lock's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// Holder key: the holder's owner id (unique per acquisition) with the lease's PX.
    Lock,
    /// Fencing counter (never deleted, but by `forget`).
    Fence,
    /// FIFO queue of waiting owners (ZSET by ticket).
    Queue,
    /// Waiter liveness deadlines (ZSET by server time in ms).
    Alive,
    /// Arrival ticket counter.
    Seq,
    /// A read-write lock's read holds: ZSET of `<owner id>:<token>` scored by the server time
    /// (ms) at which each runs out (the write hold is [`Key::Lock`]).
    Readers,
    /// A semaphore's permits: ZSET of `<owner id>:<token>` scored by the server time (ms) at
    /// which each runs out.
    SemHolders,
    /// A semaphore's own fencing counter (never deleted, but by `forget`).
    SemFence,
    /// A semaphore's FIFO queue of waiters (ZSET by ticket).
    SemQueue,
    /// A semaphore's waiter liveness deadlines.
    SemAlive,
    /// A semaphore's arrival ticket counter.
    SemSeq,
    /// A semaphore's count, as recorded while it is in use.
    SemCount,
    /// A semaphore's waiters' terms (HASH from queue entry to `<alive_ms> <ttl_ms> <min_token>`),
    /// which a release needs to hand a waiter a permit.
    SemTerms,
}

/// A semaphore's keys in the order its scripts take them (`KEYS[1..7]` of `sem_acquire.lua`).
pub(crate) const SEM_KEYS: [Key; 7] = [
    Key::SemHolders,
    Key::SemFence,
    Key::SemQueue,
    Key::SemAlive,
    Key::SemSeq,
    Key::SemCount,
    Key::SemTerms,
];

impl Key {
    fn suffix(self) -> &'static str {
        match self {
            Key::Lock => ":lock",
            Key::Fence => ":fence",
            Key::Queue => ":queue",
            Key::Alive => ":alive",
            Key::Seq => ":seq",
            // Not `:readers`: the Tair emulation keeps its readers under that suffix of the same
            // hash tag, and the two layouts are different locks.
            Key::Readers => ":shared",
            Key::SemHolders => ":sem:holders",
            Key::SemFence => ":sem:fence",
            Key::SemQueue => ":sem:queue",
            Key::SemAlive => ":sem:alive",
            Key::SemSeq => ":sem:seq",
            Key::SemCount => ":sem:permits",
            Key::SemTerms => ":sem:terms",
        }
    }
}

/// The keys of one lock name.
pub(crate) struct Keys {
    base: String,
}

impl Keys {
    /// Keys for `name` under `prefix` (the prefix was checked to contain no braces).
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let mut base = String::with_capacity(prefix.len() + name.as_str().len() + 16);
        base.push('{');
        base.push_str(prefix);
        base.push(':');
        name.escape_into(&mut base);
        base.push('}');
        Keys { base }
    }

    /// The prefix of this lock's shard channels, `{<prefix>:<name>}:wake:` (same slot as its
    /// keys).
    pub(crate) fn wakes(&self) -> String {
        format!("{}:wake:", self.base)
    }

    /// One key as a string.
    #[cfg(test)]
    pub(crate) fn get(&self, key: Key) -> String {
        let mut out = String::with_capacity(self.base.len() + 10);
        out.push_str(&self.base);
        out.push_str(key.suffix());
        out
    }

    /// A call of `lua` on these keys, in this order (`KEYS[1]`, ...); add arguments with
    /// [`Call::arg`] and the like.
    pub(crate) fn call(&self, lua: &'static Lua, keys: &[Key]) -> Call {
        self.call_suffixed(lua, keys.iter().map(|k| k.suffix()))
    }

    /// A call of `lua` on the keys with these suffixes (`:tair`, ...), in this order: the keys
    /// of a lock kept in another layout, under the same hash tag.
    pub(crate) fn call_suffixed<'s>(
        &self,
        lua: &'static Lua,
        suffixes: impl ExactSizeIterator<Item = &'s str>,
    ) -> Call {
        let n = suffixes.len();
        let mut call = Call::start(lua, n, n * (self.base.len() + 10));
        let mut key = String::with_capacity(self.base.len() + 10);
        key.push_str(&self.base);
        for suffix in suffixes {
            key.truncate(self.base.len());
            key.push_str(suffix);
            call.cmd.arg(key.as_str());
        }
        call
    }

    /// The hash tag every key of the lock carries, braces included: it decides the Cluster slot.
    pub(crate) fn tag(&self) -> &str {
        &self.base
    }
}

/// The `SCAN MATCH` pattern of every fence key under `prefix` (glob characters in the prefix
/// are escaped; escaped names contain none).
pub(crate) fn fence_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 12);
    pattern.push('{');
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str(":*}");
    pattern.push_str(Key::Fence.suffix());
    pattern
}

/// The lock name a fence key under `prefix` belongs to; `None` for any other key.
pub(crate) fn name_of_fence_key(prefix: &str, key: &str) -> Option<LockName> {
    let escaped = key
        .strip_prefix('{')?
        .strip_prefix(prefix)?
        .strip_prefix(':')?
        .strip_suffix(Key::Fence.suffix())?
        .strip_suffix('}')?;
    LockName::from_escaped(escaped)
}

#[cfg(test)]
mod tests;
