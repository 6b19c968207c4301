//! The Lua scripts of one node (in `lua/`), the key layout, and reply decoding.
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
use redis::{Cmd, ToRedisArgs, Value};

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
/// Compare-owner-then-delete plus wake-up of the head waiter (`lua/release.lua`).
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/release.lua")).repeatable());
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
/// The fenced bench floor's acquire: `SET NX PX` + `INCR` in one script (`lua/floor_fenced.lua`).
pub(crate) static FLOOR_FENCED: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/floor_fenced.lua")));
/// The bench floor's compare-and-delete (`lua/floor_delete.lua`).
pub(crate) static FLOOR_DELETE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/floor_delete.lua")));
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

/// Every script of a node, for tests that compare hashes.
#[cfg(test)]
pub(crate) fn all() -> [&'static Lua; 15] {
    [
        &*ACQUIRE,
        &*TRY_FAST,
        &*RELEASE,
        &*EXTEND,
        &*CANCEL,
        &*INSPECT,
        &*FORGET,
        &*FENCE_MAX,
        &*FLOOR_FENCED,
        &*FLOOR_DELETE,
        &*SEM_ACQUIRE,
        &*SEM_RELEASE,
        &*SEM_EXTEND,
        &*SEM_CANCEL,
        &*SEM_INSPECT,
    ]
}

/// The largest token floor the scripts carry exactly: Lua numbers are doubles, which hold every
/// integer up to 2^53 and no more.
pub const MAX_FLOOR: u64 = 1 << 53;

/// The token floor of `opts` as a script argument: 0 when none is set.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `backend` for a floor above [`MAX_FLOOR`]: refused
/// (before any I/O) rather than rounded.
pub fn floor_arg(backend: &'static str, opts: &AcquireOptions) -> lockcore::Result<u64> {
    match opts.token_floor_value() {
        None => Ok(0),
        Some(f) if f.0 <= MAX_FLOOR => Ok(f.0),
        Some(f) => Err(Error::invalid_argument(
            "token_floor",
            format!("{backend} carries token floors up to 2^53 ({MAX_FLOOR}), not {f}"),
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
    /// A call of `lua` on explicitly named keys (the bench floor's key is not a lock's).
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
    /// A semaphore's waiters' terms (HASH from queue entry to `<alive_ms> <ttl_ms> <floor>`),
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

/// Decodes a `SCAN` reply: the next cursor and this batch's keys.
pub(crate) fn parse_scan(value: &Value) -> Result<(u64, Vec<String>), String> {
    let Value::Array(items) = value else {
        return Err(format!("unexpected SCAN reply {value:?}"));
    };
    let cursor = items
        .first()
        .and_then(int)
        .and_then(|c| u64::try_from(c).ok())
        .ok_or_else(|| format!("SCAN reply without a cursor: {value:?}"))?;
    let keys = match items.get(1) {
        Some(Value::Array(keys)) => keys.iter().filter_map(text).collect(),
        _ => return Err(format!("SCAN reply without keys: {value:?}")),
    };
    Ok((cursor, keys))
}

/// The owner id's `Display` form (32 lowercase hex digits) without allocating.
fn owner_hex(owner: OwnerId) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        let shift = 4 * (31 - i);
        *byte = HEX[((owner.0 >> shift) & 0xF) as usize];
    }
    out
}

/// Whether a reply element is the 32-hex-digit id of `owner`.
fn echoes(value: Option<&Value>, owner: OwnerId) -> bool {
    match value {
        Some(Value::BulkString(b)) => b.as_slice() == owner_hex(owner).as_slice(),
        Some(Value::SimpleString(s)) => s.as_bytes() == owner_hex(owner).as_slice(),
        _ => false,
    }
}

/// The echoed owner of a reply, for an error message.
fn echoed(value: Option<&Value>) -> String {
    value.and_then(text).unwrap_or_default()
}

/// What a node's acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted with this fencing token (the node's counter after its grant).
    Granted(u64),
    /// Not granted.
    Waiting {
        /// The holder's remaining ms (negative when free).
        pttl: i64,
        /// This owner's place in the queue (0 = head; -1 for a `try`).
        rank: i64,
        /// The node's fence counter (the last token it handed out), 0 when the reply does not
        /// say.
        fence: u64,
    },
}

/// Decodes the acquire script's reply, checking that it answers for `owner` (a reply matched to
/// the wrong request is an error, never a grant).
pub(crate) fn parse_acquire(value: &Value, owner: OwnerId) -> Result<AcquireReply, String> {
    let items = array(value)?;
    if !echoes(items.get(2), owner) {
        return Err(format!(
            "acquire reply for another request (owner {:?})",
            echoed(items.get(2))
        ));
    }
    match items.first().and_then(int) {
        Some(1) => items
            .get(1)
            .and_then(int)
            .filter(|t| *t > 0)
            .map(|t| AcquireReply::Granted(t as u64))
            .ok_or_else(|| format!("acquire: bad token in {value:?}")),
        Some(0) => Ok(AcquireReply::Waiting {
            pttl: items.get(1).and_then(int).unwrap_or(-2),
            rank: items.get(3).and_then(int).unwrap_or(-1),
            fence: items
                .get(4)
                .and_then(int)
                .and_then(|f| u64::try_from(f).ok())
                .unwrap_or(0),
        }),
        _ => Err(format!("unexpected acquire reply {value:?}")),
    }
}

/// Decodes the fast try script's reply: `Some(reply)`, or `None` when someone is queued and
/// the full script must decide. A refusal carries the holder's fence; only a grant carries (and
/// must echo) the owner, as the one string `<owner id>:<token>`.
pub(crate) fn parse_try_fast(
    value: &Value,
    owner: OwnerId,
) -> Result<Option<AcquireReply>, String> {
    match value {
        Value::Int(-1) => Ok(None),
        Value::BulkString(b) => {
            let (echo, token) = std::str::from_utf8(b)
                .ok()
                .and_then(split_member)
                .ok_or_else(|| format!("acquire: bad grant {value:?}"))?;
            if echo.as_bytes() != owner_hex(owner).as_slice() {
                return Err(format!(
                    "acquire reply for another request (owner {echo:?})"
                ));
            }
            (token > 0)
                .then_some(Some(AcquireReply::Granted(token)))
                .ok_or_else(|| format!("acquire: bad token in {value:?}"))
        }
        Value::Array(items) if items.first().and_then(int) == Some(0) => {
            Ok(Some(AcquireReply::Waiting {
                pttl: -1,
                rank: -1,
                fence: items
                    .get(1)
                    .and_then(int)
                    .and_then(|f| u64::try_from(f).ok())
                    .unwrap_or(0),
            }))
        }
        other => Err(format!("unexpected acquire reply {other:?}")),
    }
}

/// What one acquire attempt on a node got, when a release may have granted it in the
/// meantime (a semaphore's permit: see `lua/sem_release.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptReply {
    /// What this attempt itself did: granted now, or not.
    Now(AcquireReply),
    /// A release handed this queued owner a permit with this token before the attempt ran. The
    /// permit's lease runs from the owner's last attempt that was answered with a place in the
    /// queue, not from this one.
    Handed(u64),
}

/// What a node's permit acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitAnswer {
    /// Granted now, handed earlier, or not granted.
    Acquire(AttemptReply),
    /// The semaphore is in use with this other count; nothing changed.
    Counted(u64),
}

/// Decodes the permit acquire script's reply, checking that it answers for `owner` (a reply
/// matched to the wrong request is an error, never a grant or a refusal).
pub(crate) fn parse_permit(value: &Value, owner: OwnerId) -> Result<PermitAnswer, String> {
    let items = array(value)?;
    if !echoes(items.get(2), owner) {
        return Err(format!(
            "permit reply for another request (owner {:?})",
            echoed(items.get(2))
        ));
    }
    match items.first().and_then(int) {
        Some(-1) => items
            .get(1)
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok())
            .map(PermitAnswer::Counted)
            .ok_or_else(|| format!("permit: bad count in {value:?}")),
        Some(2) => items
            .get(1)
            .and_then(int)
            .filter(|t| *t > 0)
            .map(|t| PermitAnswer::Acquire(AttemptReply::Handed(t as u64)))
            .ok_or_else(|| format!("permit: bad handed token in {value:?}")),
        _ => parse_acquire(value, owner).map(|r| PermitAnswer::Acquire(AttemptReply::Now(r))),
    }
}

/// The holders ZSET member of a permit, or of a reader of a read-write lock: `<owner id>:<token>`,
/// as `sem_acquire.lua` and `acquire.lua` write it.
pub(crate) fn permit_member(owner: OwnerId, token: u64) -> String {
    format!("{owner}:{token}")
}

/// The owner id and token of a member `<owner id>:<token>` as [`permit_member`] writes it (also
/// the fast try's grant), or `None` when `member` is not one.
fn split_member(member: &str) -> Option<(&str, u64)> {
    let (owner, token) = member.split_once(':')?;
    Some((owner, token.parse().ok()?))
}

/// One live permit, as a node's semaphore inspect reports it; or one live reader of a
/// read-write lock, as a node's inspect reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitReply {
    /// The holder's owner id (32 hex digits).
    pub owner: String,
    /// The permit's fencing token.
    pub token: u64,
    /// Its remaining ms by the server's clock.
    pub remaining_ms: u64,
}

/// What a node's semaphore inspect script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreReply {
    /// The semaphore's fence counter (the last token handed out); `None` when it never had one.
    pub fence: Option<u64>,
    /// The count the semaphore records (0 when none); it binds only while the semaphore is in
    /// use (a live permit or a live waiter).
    pub permits: u64,
    /// The live permits, oldest grant (lowest token) first.
    pub holders: Vec<PermitReply>,
    /// Waiters whose liveness has not run out.
    pub live_waiters: i64,
    /// Entries in the queue, live or not.
    pub queued: i64,
}

/// Decodes the semaphore inspect script's reply.
pub(crate) fn parse_sem_inspect(value: &Value) -> Result<SemaphoreReply, String> {
    let items = array(value)?;
    let bad = || format!("unexpected semaphore inspect reply {value:?}");
    let num = |i: usize| items.get(i).and_then(int).ok_or_else(bad);
    let fence = num(0)?;
    let mut holders = Vec::with_capacity(items.len().saturating_sub(4) / 2);
    for pair in items.get(4..).unwrap_or_default().chunks(2) {
        let member = pair.first().and_then(text).ok_or_else(bad)?;
        let (owner, token) = split_member(&member).ok_or_else(bad)?;
        holders.push(PermitReply {
            owner: owner.to_owned(),
            token,
            remaining_ms: pair
                .get(1)
                .and_then(int)
                .and_then(|ms| u64::try_from(ms).ok())
                .ok_or_else(bad)?,
        });
    }
    holders.sort_by_key(|h| h.token);
    Ok(SemaphoreReply {
        fence: (fence > 0).then_some(fence as u64),
        permits: u64::try_from(num(1)?).unwrap_or(0),
        holders,
        live_waiters: num(2)?,
        queued: num(3)?,
    })
}

/// What a node's inspect script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectReply {
    /// The holder's owner id, if the lock is held.
    pub holder: Option<String>,
    /// The holder's remaining ms (negative when free).
    pub pttl: i64,
    /// The fence counter: the holder's token while held, else the last one handed out; `None`
    /// when the name never had one.
    pub fence: Option<u64>,
    /// Waiters whose liveness has not run out (a holder that kept its queue entry not counted).
    pub live_waiters: i64,
    /// Entries in the queue, live or not.
    pub queued: i64,
    /// Live readers (shared holds of the read-write lock).
    pub readers: i64,
    /// The live reader granted first (lowest token), if any.
    pub oldest_reader: Option<PermitReply>,
}

/// Decodes the inspect script's reply.
pub(crate) fn parse_inspect(value: &Value) -> Result<InspectReply, String> {
    let items = array(value)?;
    let bad = || format!("unexpected inspect reply {value:?}");
    let holder = items.first().and_then(text).ok_or_else(bad)?.to_owned();
    let holder = (!holder.is_empty()).then_some(holder);
    let fence = items.get(2).and_then(int).ok_or_else(bad)?;
    let member = items.get(6).and_then(text).ok_or_else(bad)?;
    let oldest_reader = match split_member(&member) {
        None if member.is_empty() => None,
        None => return Err(bad()),
        Some((owner, token)) => Some(PermitReply {
            owner: owner.to_owned(),
            token,
            remaining_ms: items
                .get(7)
                .and_then(int)
                .and_then(|ms| u64::try_from(ms).ok())
                .ok_or_else(bad)?,
        }),
    };
    Ok(InspectReply {
        holder,
        pttl: items.get(1).and_then(int).ok_or_else(bad)?,
        fence: (fence > 0).then_some(fence as u64),
        live_waiters: items.get(3).and_then(int).ok_or_else(bad)?,
        queued: items.get(4).and_then(int).ok_or_else(bad)?,
        readers: items.get(5).and_then(int).ok_or_else(bad)?,
        oldest_reader,
    })
}

/// Decodes a 0/1 integer reply.
pub(crate) fn parse_flag(value: &Value) -> Result<bool, String> {
    match int(value) {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        _ => Err(format!("unexpected reply {value:?}")),
    }
}

pub(crate) fn array(value: &Value) -> Result<&[Value], String> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(format!("expected an array reply, got {other:?}")),
    }
}

pub(crate) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let name = LockName::new("a/{b}:c").unwrap();
        let keys = Keys::new("dlock", &name);
        let slot = super::super::cluster::slot(keys.get(Key::Lock).as_bytes());
        for k in [Key::Fence, Key::Queue, Key::Alive, Key::Seq, Key::Readers]
            .into_iter()
            .chain(SEM_KEYS)
        {
            let k = keys.get(k);
            assert_eq!(super::super::cluster::slot(k.as_bytes()), slot, "{k}");
        }
        assert_eq!(keys.get(Key::Lock), "{dlock:a%2F%7Bb%7D%3Ac}:lock");
        assert_eq!(
            keys.get(Key::SemHolders),
            "{dlock:a%2F%7Bb%7D%3Ac}:sem:holders"
        );
        // No semaphore key is a lock key, nor matches the fence pattern `names()` scans for.
        let lock_keys: Vec<String> = [
            Key::Lock,
            Key::Fence,
            Key::Queue,
            Key::Alive,
            Key::Seq,
            Key::Readers,
        ]
        .map(|k| keys.get(k))
        .into();
        assert_eq!(keys.get(Key::Readers), "{dlock:a%2F%7Bb%7D%3Ac}:shared");
        assert_eq!(name_of_fence_key("dlock", &keys.get(Key::Readers)), None);
        for k in SEM_KEYS.map(|k| keys.get(k)) {
            assert!(!lock_keys.contains(&k), "{k}");
            assert_eq!(name_of_fence_key("dlock", &k), None, "{k}");
        }
    }

    #[test]
    fn permit_replies_must_echo_the_owner_and_carry_a_count_mismatch() {
        let owner = OwnerId(7);
        let echo = Value::BulkString(owner.to_string().into_bytes());
        let granted = Value::Array(vec![Value::Int(1), Value::Int(5), echo.clone()]);
        assert_eq!(
            parse_permit(&granted, owner),
            Ok(PermitAnswer::Acquire(AttemptReply::Now(
                AcquireReply::Granted(5)
            )))
        );
        assert!(parse_permit(&granted, OwnerId(8)).is_err());
        let handed = Value::Array(vec![Value::Int(2), Value::Int(6), echo.clone()]);
        assert_eq!(
            parse_permit(&handed, owner),
            Ok(PermitAnswer::Acquire(AttemptReply::Handed(6)))
        );
        assert!(
            parse_permit(&handed, OwnerId(8)).is_err(),
            "a permit handed to another request is an error, never a grant"
        );
        let counted = Value::Array(vec![Value::Int(-1), Value::Int(3), echo]);
        assert_eq!(parse_permit(&counted, owner), Ok(PermitAnswer::Counted(3)));
        assert!(
            parse_permit(&counted, OwnerId(8)).is_err(),
            "a mismatch for another request is an error too"
        );
        assert_eq!(permit_member(owner, 42), format!("{owner}:42"));
    }

    #[test]
    fn semaphore_inspect_lists_permits_by_token() {
        let member = |o: u128, t: u64| Value::BulkString(permit_member(OwnerId(o), t).into_bytes());
        let reply = Value::Array(vec![
            Value::Int(9),
            Value::Int(2),
            Value::Int(1),
            Value::Int(1),
            member(2, 9),
            Value::Int(100),
            member(1, 8),
            Value::Int(2500),
        ]);
        let r = parse_sem_inspect(&reply).unwrap();
        assert_eq!(r.fence, Some(9));
        assert_eq!(r.permits, 2);
        assert_eq!((r.live_waiters, r.queued), (1, 1));
        let tokens: Vec<u64> = r.holders.iter().map(|h| h.token).collect();
        assert_eq!(tokens, [8, 9], "oldest grant first");
        assert_eq!(r.holders[0].owner, OwnerId(1).to_string());
        assert_eq!(r.holders[0].remaining_ms, 2500);
        let never = Value::Array(vec![
            Value::Int(-1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]);
        let r = parse_sem_inspect(&never).unwrap();
        assert_eq!((r.fence, r.holders.len()), (None, 0));
    }

    /// The command a call sends: what `EVALSHA` receives.
    fn words(call: &Call) -> Vec<String> {
        call.cmd()
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_call_is_evalsha_with_keys_then_arguments() {
        let keys = Keys::new("p", &LockName::new("n").unwrap());
        let owner = OwnerId(0xab);
        let call = keys
            .call(&RELEASE, &[Key::Lock, Key::Queue])
            .owner_arg(owner)
            .arg(77u64)
            .arg("p:wake:");
        assert_eq!(
            words(&call),
            [
                "EVALSHA".to_owned(),
                RELEASE.sha.clone(),
                "2".to_owned(),
                "{p:n}:lock".to_owned(),
                "{p:n}:queue".to_owned(),
                owner.to_string(),
                "77".to_owned(),
                "p:wake:".to_owned(),
            ]
        );
        assert_eq!(call.first_key(), b"{p:n}:lock");
        let bare = Call::on(&INSPECT, &[]);
        assert_eq!(bare.first_key(), b"");
    }

    #[test]
    fn inspect_reports_the_oldest_reader() {
        let bulk = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let reply = |member: &str| {
            Value::Array(vec![
                bulk(""),
                Value::Int(-2),
                Value::Int(12),
                Value::Int(1),
                Value::Int(1),
                Value::Int(2),
                bulk(member),
                Value::Int(2500),
            ])
        };
        let member = permit_member(OwnerId(3), 11);
        let r = parse_inspect(&reply(&member)).unwrap();
        assert_eq!(r.holder, None);
        assert_eq!(r.readers, 2);
        assert_eq!(
            r.oldest_reader,
            Some(PermitReply {
                owner: OwnerId(3).to_string(),
                token: 11,
                remaining_ms: 2500
            })
        );
        let r = parse_inspect(&reply("")).unwrap();
        assert_eq!(r.oldest_reader, None);
        assert!(parse_inspect(&reply("no-token")).is_err());
    }

    #[test]
    fn owner_hex_matches_the_display_form() {
        for owner in [
            OwnerId(0),
            OwnerId(u128::MAX),
            OwnerId(1 << 100),
            OwnerId(0xab),
        ] {
            assert_eq!(owner_hex(owner).as_slice(), owner.to_string().as_bytes());
        }
    }

    #[test]
    fn scripts_have_distinct_hashes() {
        let mut shas: Vec<&str> = all().iter().map(|l| l.sha.as_str()).collect();
        shas.sort_unstable();
        shas.dedup();
        assert_eq!(shas.len(), all().len());
    }

    #[test]
    fn acquire_reply_must_echo_the_owner() {
        let owner = OwnerId(7);
        let other = OwnerId(8);
        let granted = Value::Array(vec![
            Value::Int(1),
            Value::Int(42),
            Value::BulkString(owner.to_string().into_bytes()),
        ]);
        assert_eq!(
            parse_acquire(&granted, owner),
            Ok(AcquireReply::Granted(42))
        );
        assert!(parse_acquire(&granted, other).is_err());
    }

    #[test]
    fn fence_keys_map_back_to_their_names_under_their_prefix_only() {
        let name = LockName::new("orders/eu 1").unwrap();
        let key = Keys::new("app", &name).get(Key::Fence);
        assert_eq!(name_of_fence_key("app", &key), Some(name.clone()));
        assert_eq!(name_of_fence_key("ap", &key), None);
        assert_eq!(
            name_of_fence_key("app", &Keys::new("app", &name).get(Key::Lock)),
            None
        );
        // A longer prefix's keys match the pattern but do not decode as this prefix's names.
        let nested = Keys::new("app:x", &LockName::new("y").unwrap()).get(Key::Fence);
        assert_eq!(name_of_fence_key("app", &nested), None);
        assert_eq!(fence_pattern("app"), "{app:*}:fence");
        assert_eq!(fence_pattern("a*[b]?"), r"{a\*\[b\]\?:*}:fence");
    }

    #[test]
    fn fast_try_reply_grants_only_with_the_owner_and_refuses_with_the_fence() {
        let owner = OwnerId(7);
        let granted = Value::BulkString(format!("{owner}:42").into_bytes());
        assert_eq!(
            parse_try_fast(&granted, owner),
            Ok(Some(AcquireReply::Granted(42)))
        );
        assert!(parse_try_fast(&granted, OwnerId(8)).is_err());
        for bad in [
            format!("{owner}:0"),
            format!("{owner}:"),
            format!("{owner}42"),
            format!("{owner}:4x"),
            "short:42".to_owned(),
        ] {
            let reply = Value::BulkString(bad.clone().into_bytes());
            assert!(parse_try_fast(&reply, owner).is_err(), "{bad}");
        }
        // The old two-element grant is not a grant.
        let old = Value::Array(vec![
            Value::Int(42),
            Value::BulkString(owner.to_string().into_bytes()),
        ]);
        assert!(parse_try_fast(&old, owner).is_err());
        // Held: the counter comes back as GET returns it (a bulk string), or 0 if never set.
        let held = Value::Array(vec![Value::Int(0), Value::BulkString(b"17".to_vec())]);
        assert_eq!(
            parse_try_fast(&held, owner),
            Ok(Some(AcquireReply::Waiting {
                pttl: -1,
                rank: -1,
                fence: 17
            }))
        );
        let never = Value::Array(vec![Value::Int(0), Value::Int(0)]);
        assert!(matches!(
            parse_try_fast(&never, owner),
            Ok(Some(AcquireReply::Waiting { fence: 0, .. }))
        ));
        assert_eq!(parse_try_fast(&Value::Int(-1), owner), Ok(None));
        assert!(parse_try_fast(&Value::Int(0), owner).is_err());
    }
}
