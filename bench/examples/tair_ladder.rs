//! What each part of the Tair emulation costs an uncontended `expireLock` + `expireUnlock`,
//! against `dlock bench`'s fenced floor.
//!
//! The emulation keeps each lock in one hash whose expiry is a server-clock timestamp, the
//! holder's proof (`expireUnlock` needs it), a reentrant count and a version that is never
//! reset. So it cannot be a `SET NX PX` on a string: even its least acquire reads the server's
//! clock and the hash and writes the hash, and so does its least release. The steps:
//!
//! 0. the fenced floor: a script of `SET NX PX` + `INCR`, then `GET`/`DEL` (`dlock bench`'s);
//! 1. the same with `TIME` in both scripts (the price of the server's clock alone);
//! 2. the least that keeps the emulation's hash: `TIME` + `HMGET` + `HSET` each way;
//! 3. the scripts the backend's single attempt and release send (`tair/lua/try_fast.lua`,
//!    `unlock.lua`), which also keep dlock's FIFO queue and the readers out (a `busy` field
//!    read with the hash, which the readers' and the queue's entries set), called from bare
//!    redis-rs;
//! 4. the backend's `try_acquire` + `release` through `DistributedLock`;
//! 5. lockcore's `lock()` and guard.
//!
//! The steps alternate in blocks of 200 pairs, in a new order each round, so they see the same
//! machine load; each prints its median, mean and p90 pair, and its pairs/s relative to the
//! floor's (total pairs over total time), as `dlock bench` reports `fenced_floor.ratio`.
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example tair_ladder -- tair://127.0.0.1:6379 [rounds=100]
//! ```
//!
//! Use a server nobody else uses: it writes keys under the `{tair-ladder-*}` hash tags and
//! `dlock`.

use std::sync::Arc;

use dlock_bench::ladder::{self, Failure, OWNER, RealScripts, TairScripts};
use lockcore::DistributedLock;
use redis::aio::MultiplexedConnection;
use redis::{Script, Value};

/// Step 1's acquire: the fenced floor's, after reading the server's clock.
const CLOCK_ACQUIRE: &str = "redis.call('TIME') \
    if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
    return redis.call('INCR', KEYS[2]) end return 0";

/// Step 1's release: the floor's compare-and-delete, after reading the server's clock.
const CLOCK_DELETE: &str = "redis.call('TIME') \
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Step 2's acquire: the least `expireLock` on the emulation's hash (KEYS hash; ARGV owner,
/// ttl_ms). Locks when the flag is clear or the expiry passed; the proof is the new expiry,
/// above the old one; the version counts up. Replies `{1, proof, version, count}` as the real
/// script does, or 0.
const HASH_LOCK: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local f = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'version') \
    local was = tonumber(f[2] or '0') \
    if f[1] == '1' and was > now then return 0 end \
    local proof = string.format('%d', math.max(now + tonumber(ARGV[2]), was + 1)) \
    local v = tonumber(f[3] or '0') + 1 \
    redis.call('HSET', KEYS[1], 'locked', 1, 'expire', proof, 'proof', proof, 'owner', ARGV[1], \
    'count', 1, 'version', string.format('%d', v)) \
    return {1, proof, v, 1}";

/// Step 2's release: the least `expireUnlock` (KEYS hash; ARGV proof, owner): unlocks only a
/// live lock with this proof and owner.
const HASH_UNLOCK: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'proof') \
    if not (h[1] == '1' and tonumber(h[2] or '0') > now) then return 0 end \
    if h[4] ~= ARGV[1] or h[3] ~= ARGV[2] then return 0 end \
    redis.call('HSET', KEYS[1], 'locked', 0, 'count', 0) \
    return 1";

const STEPS: [&str; 6] = [
    "fenced floor: SET NX PX + INCR, then GET/DEL",
    "+ server clock: TIME in both scripts",
    "the emulation's hash: TIME + HMGET + HSET each way",
    "+ dlock's queue and readers (real scripts)",
    "this backend: try_acquire + release",
    "lockcore: lock() + guard.release()",
];

struct Scripts {
    con: MultiplexedConnection,
    floor: RealScripts,
    clock_acquire: Script,
    clock_delete: Script,
    hash_lock: Script,
    hash_unlock: Script,
    tair: TairScripts,
}

/// The proof in a granting `{1, proof, version, count}` reply.
fn proof_of(reply: &Value) -> Result<String, Failure> {
    let Value::Array(items) = reply else {
        return Err(format!("not granted: {reply:?}").into());
    };
    match (items.first(), items.get(1)) {
        (Some(Value::Int(1)), Some(Value::BulkString(proof))) => {
            Ok(String::from_utf8(proof.clone())?)
        }
        _ => Err(format!("not granted: {reply:?}").into()),
    }
}

/// The release's reply: 1 when it released.
fn released(reply: i64) -> Result<(), Failure> {
    if reply == 1 {
        Ok(())
    } else {
        Err("not released".into())
    }
}

/// One acquire + release of `step` with raw scripts (steps 0 to 3).
impl ladder::Steps for Scripts {
    async fn pair(&mut self, step: usize) -> Result<(), Failure> {
        let s = self;
        let con = &mut s.con;
        let tag = format!("{{tair-ladder-{step}}}");
        let key = |k: &str| format!("{tag}:{k}");
        match step {
            0 | 1 => {
                let (acquire, delete) = match step {
                    0 => (&s.floor.floor_fenced, &s.floor.floor_delete),
                    _ => (&s.clock_acquire, &s.clock_delete),
                };
                let token: i64 = acquire
                    .key(key("lock"))
                    .key(key("fence"))
                    .arg(OWNER)
                    .arg(10_000)
                    .invoke_async(con)
                    .await?;
                if token <= 0 {
                    return Err("the floor's key was held".into());
                }
                released(delete.key(key("lock")).arg(OWNER).invoke_async(con).await?)
            }
            2 => {
                let reply: Value = s
                    .hash_lock
                    .key(key("tair"))
                    .arg(OWNER)
                    .arg(10_000)
                    .invoke_async(con)
                    .await?;
                let proof = proof_of(&reply)?;
                let mut unlock = s.hash_unlock.prepare_invoke();
                unlock.key(key("tair")).arg(proof).arg(OWNER);
                released(unlock.invoke_async(con).await?)
            }
            _ => {
                // As the backend calls them: its single attempt, which never jumps the queue, then
                // the unlock by proof and owner.
                let keys = ["tair", "readers", "tair:queue", "tair:alive"].map(key);
                let mut lock = s.tair.try_fast.prepare_invoke();
                lock.key(&keys[0]);
                // No token minimum, so no floor argument, as the backend sends it.
                lock.arg(OWNER).arg(10_000);
                let reply: Value = lock.invoke_async(con).await?;
                let proof = proof_of(&reply)?;
                let mut unlock = s.tair.unlock.prepare_invoke();
                for k in &keys {
                    unlock.key(k);
                }
                unlock.arg(proof).arg(OWNER).arg(1).arg(key("wakes:"));
                released(unlock.invoke_async(con).await?)
            }
        }
    }
}

async fn ladder(url: String, rounds: usize) -> Result<(), Failure> {
    if !url.starts_with("tair://") {
        return Err(format!("expected a tair:// URL, got {url}").into());
    }
    let backend: Arc<dyn DistributedLock> = backend_redis::connect(&url).await?;
    // The same server, as plain Redis, for the raw steps.
    let plain = url.replacen("tair://", "redis://", 1);
    let con = redis::Client::open(plain.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut s = Scripts {
        con,
        floor: RealScripts::load(),
        clock_acquire: Script::new(CLOCK_ACQUIRE),
        clock_delete: Script::new(CLOCK_DELETE),
        hash_lock: Script::new(HASH_LOCK),
        hash_unlock: Script::new(HASH_UNLOCK),
        tair: TairScripts::load(),
    };
    let backend = ladder::BackendSteps::new(backend, "tair-ladder")?;

    ladder::climb(&STEPS, rounds, &mut s, &backend).await
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let usage = "usage: tair_ladder [TAIR_URL] [rounds]";
    ladder::run(Some("tair://127.0.0.1:6379"), usage, 100, ladder).await
}
