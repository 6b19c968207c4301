//! Decoding what a node's scripts answer: each reply checked for its shape, and a grant
//! checked to echo the owner it was asked for (a reply for another owner is an error, never a
//! grant).

use lockcore::OwnerId;
use redis::Value;

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
pub(crate) fn owner_hex(owner: OwnerId) -> [u8; 32] {
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
    /// Granted now with this token by the `try` fast path (`lua/try_fast.lua`), which leaves
    /// the lock key in its plain form: the lease's release may send `lua/release_plain.lua`
    /// first (see [`PLAIN`](super::PLAIN)).
    Plain(u64),
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
mod tests;
