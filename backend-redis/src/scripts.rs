//! The Lua scripts (in `src/lua/`), the key layout, and reply decoding.
//!
//! Every script runs atomically on the server that owns the lock's hash slot. The same scripts
//! run unchanged on a single server and in a Cluster: all keys of one lock carry the hash tag
//! `{<prefix>:<escaped name>}`, so they live in one slot, and the release channel carries it too.
//! The shared helpers of `lua/common.lua` are pasted at each script's `--@common` line.

use std::sync::LazyLock;

use lockcore::{LockName, OwnerId};
use redis::Value;

/// One Lua script: its source (with the shared helpers prepended) and SHA1 for `EVALSHA`.
pub(crate) struct Lua {
    pub(crate) code: String,
    pub(crate) sha: String,
}

impl Lua {
    /// `body` with the shared helpers (`lua/common.lua`) inserted at its `--@common` line, so a
    /// fast path above that line runs without defining them.
    fn new(body: &str) -> Self {
        let code = body.replacen("--@common", include_str!("lua/common.lua"), 1);
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Lua { code, sha }
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
    LazyLock::new(|| Lua::new(include_str!("lua/release.lua")));
/// Compare-owner-then-PEXPIRE (`lua/extend.lua`).
pub(crate) static EXTEND: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/extend.lua")));
/// Undo of an abandoned acquire (`lua/cancel.lua`).
pub(crate) static CANCEL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/cancel.lua")));
/// Read-only state for `inspect` (`lua/inspect.lua`).
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/inspect.lua")));
/// The bench floor's compare-and-delete (`lua/floor_delete.lua`).
pub(crate) static FLOOR_DELETE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/floor_delete.lua")));

/// One script call: which script, its keys and arguments.
pub(crate) struct Call {
    pub(crate) lua: &'static Lua,
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

impl Call {
    /// `EVALSHA sha numkeys keys... args...`.
    pub(crate) fn evalsha(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.lua.sha).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k);
        }
        for a in &self.args {
            cmd.arg(a);
        }
        cmd
    }

    /// The first key (it decides the Cluster slot).
    pub(crate) fn first_key(&self) -> &str {
        self.keys.first().map(String::as_str).unwrap_or("")
    }
}

/// The keys and channel of one lock name.
pub(crate) struct Keys {
    base: String,
}

impl Keys {
    /// Keys for `name` under `prefix` (the prefix was checked to contain no braces).
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        Keys {
            base: format!("{{{prefix}:{}}}", name.escaped()),
        }
    }

    /// Holder key: `"<owner>:<token>"` with the lease's PX.
    pub(crate) fn lock(&self) -> String {
        format!("{}:lock", self.base)
    }
    /// Fencing counter (never deleted).
    pub(crate) fn fence(&self) -> String {
        format!("{}:fence", self.base)
    }
    /// FIFO queue of waiting owners (ZSET by ticket).
    pub(crate) fn queue(&self) -> String {
        format!("{}:queue", self.base)
    }
    /// Waiter liveness deadlines (ZSET by server time in ms).
    pub(crate) fn alive(&self) -> String {
        format!("{}:alive", self.base)
    }
    /// Arrival ticket counter.
    pub(crate) fn seq(&self) -> String {
        format!("{}:seq", self.base)
    }
    /// Pub/sub channel for release notifications (the payload names the head waiter).
    pub(crate) fn channel(&self) -> String {
        format!("{}:released", self.base)
    }
}

/// The holder value stored in the lock key.
pub(crate) fn holder_value(owner: OwnerId, token: u64) -> String {
    format!("{owner}:{token}")
}

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Granted with this fencing token.
    Granted(u64),
    /// Not granted. `pttl`: the holder's remaining ms (negative when free); `rank`: this
    /// owner's place in the queue (0 = head; -1 for a `try`).
    Waiting { pttl: i64, rank: i64 },
}

/// Decodes the acquire script's reply, checking that it answers for `owner` (a reply matched to
/// the wrong request is an error, never a grant).
pub(crate) fn parse_acquire(value: &Value, owner: OwnerId) -> Result<AcquireReply, String> {
    let items = array(value)?;
    let echoed = items.get(2).and_then(text).unwrap_or_default();
    if echoed != owner.to_string() {
        return Err(format!(
            "acquire reply for another request (owner {echoed:?})"
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
        }),
        _ => Err(format!("unexpected acquire reply {value:?}")),
    }
}

/// Decodes the fast try script's reply: `Some(reply)`, or `None` when someone is queued and
/// the full script must decide.
pub(crate) fn parse_try_fast(
    value: &Value,
    owner: OwnerId,
) -> Result<Option<AcquireReply>, String> {
    match value {
        Value::Int(0) => Ok(Some(AcquireReply::Waiting { pttl: -1, rank: -1 })),
        Value::Int(-1) => Ok(None),
        Value::Array(items) => {
            let echoed = items.get(1).and_then(text).unwrap_or_default();
            if echoed != owner.to_string() {
                return Err(format!(
                    "acquire reply for another request (owner {echoed:?})"
                ));
            }
            items
                .first()
                .and_then(int)
                .filter(|t| *t > 0)
                .map(|t| Some(AcquireReply::Granted(t as u64)))
                .ok_or_else(|| format!("acquire: bad token in {value:?}"))
        }
        other => Err(format!("unexpected acquire reply {other:?}")),
    }
}

/// What the inspect script answered.
pub(crate) struct InspectReply {
    pub(crate) holder: Option<(String, u64)>,
    pub(crate) pttl: i64,
    pub(crate) fence: Option<u64>,
    pub(crate) live_waiters: i64,
    pub(crate) queued: i64,
}

/// Decodes the inspect script's reply.
pub(crate) fn parse_inspect(value: &Value) -> Result<InspectReply, String> {
    let items = array(value)?;
    let bad = || format!("unexpected inspect reply {value:?}");
    let holder_text = items.first().and_then(text).ok_or_else(bad)?;
    let holder = holder_text
        .split_once(':')
        .and_then(|(owner, token)| token.parse::<u64>().ok().map(|t| (owner.to_owned(), t)));
    let fence = items.get(2).and_then(int).ok_or_else(bad)?;
    Ok(InspectReply {
        holder,
        pttl: items.get(1).and_then(int).ok_or_else(bad)?,
        fence: (fence > 0).then_some(fence as u64),
        live_waiters: items.get(3).and_then(int).ok_or_else(bad)?,
        queued: items.get(4).and_then(int).ok_or_else(bad)?,
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

fn array(value: &Value) -> Result<&[Value], String> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(format!("expected an array reply, got {other:?}")),
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
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
        let slot = crate::cluster::slot(keys.lock().as_bytes());
        for k in [
            keys.fence(),
            keys.queue(),
            keys.alive(),
            keys.seq(),
            keys.channel(),
        ] {
            assert_eq!(crate::cluster::slot(k.as_bytes()), slot, "{k}");
        }
        assert_eq!(keys.lock(), "{dlock:a%2F%7Bb%7D%3Ac}:lock");
    }

    #[test]
    fn scripts_have_distinct_hashes() {
        let all = [
            &*ACQUIRE,
            &*RELEASE,
            &*EXTEND,
            &*CANCEL,
            &*INSPECT,
            &*FLOOR_DELETE,
        ];
        let mut shas: Vec<&str> = all.iter().map(|l| l.sha.as_str()).collect();
        shas.sort_unstable();
        shas.dedup();
        assert_eq!(shas.len(), all.len());
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
}
