//! What each guarantee of the Redis backend costs an uncontended acquire + release.
//!
//! Starts from `dlock bench`'s raw floor (`SET NX PX`, then an `EVALSHA` compare-and-delete)
//! and adds one thing per step: drawing a fencing token in the acquire, the FIFO queue check as
//! an `EXISTS queue` in both scripts, then the backend's real acquire (the owner echo in its
//! reply; FIFO kept by the lock key's form instead of the `EXISTS`) and its real release of a
//! lease that acquire granted (`release_plain.lua`: the token check; no `EXISTS`), as `dlock_bench::ladder::RealScripts` hands them out, then
//! this backend through `DistributedLock`, then lockcore's `lock()` and guard. The steps
//! alternate in blocks of 200 pairs, in a new order each round, so they see the same machine
//! load; each prints its median, mean and p90 pair, and its pairs/s relative to the floor's
//! (total pairs over total time).
//!
//! ```text
//! cargo run --release -p fencedlock-bench --example cost_ladder -- redis://127.0.0.1:6379 [rounds=100]
//! ```
//!
//! Use a server nobody else uses: it writes keys under the `{ladder-*}` hash tags and `dlock`.

use std::sync::Arc;

use dlock_bench::ladder::{self, FAIR, FAIR_DELETE, Failure, OWNER, RealScripts};
use lockcore::DistributedLock;
use redis::Script;
use redis::aio::MultiplexedConnection;

/// The floor's compare-and-delete (also the release of the first two steps).
const DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// Acquire that also draws a fencing token in the same step.
const FENCED: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0";
const STEPS: [&str; 7] = [
    "floor: SET NX PX + EVALSHA GET/DEL",
    "+ token: acquire script SET NX PX + INCR",
    "+ fairness: EXISTS queue in acquire and release",
    "+ owner echo, FIFO by the lock key (real try script)",
    "+ token check, no EXISTS: MGET lock fence (real release)",
    "this backend: try_acquire + release",
    "lockcore: lock() + guard.release()",
];

struct Scripts {
    con: MultiplexedConnection,
    delete: Script,
    fenced: Script,
    fair: Script,
    fair_delete: Script,
    try_fast: Script,
    release_plain: Script,
}

fn keys(step: usize) -> [String; 3] {
    ["lock", "fence", "queue"].map(|k| format!("{{ladder-{step}}}:{k}"))
}

/// One acquire + release of `step` with raw commands (steps 0 to 4).
impl ladder::Steps for Scripts {
    async fn pair(&mut self, step: usize) -> Result<(), Failure> {
        let s = self;
        let con = &mut s.con;
        let [lock, fence, queue] = keys(step);
        if step == 0 {
            let set: Option<String> = redis::cmd("SET")
                .arg(&lock)
                .arg(OWNER)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(con)
                .await?;
            if set.is_none() {
                return Err("floor key was held".into());
            }
        } else {
            let (script, nkeys) = match step {
                1 => (&s.fenced, 2),
                2 => (&s.fair, 3),
                _ => (&s.try_fast, 2),
            };
            let mut invocation = script.prepare_invoke();
            for key in [&lock, &fence, &queue].into_iter().take(nkeys) {
                invocation.key(key);
            }
            // The real try script as the backend sends it: no token minimum, no argument.
            invocation.arg(OWNER).arg(10_000);
            let reply: redis::Value = invocation.invoke_async(con).await?;
            let token = ladder::granted_token(&reply)?;
            if step == 4 {
                // As the backend releases a lease the fast path granted.
                let released: i64 = s
                    .release_plain
                    .key(&lock)
                    .key(&fence)
                    .arg(OWNER)
                    .arg(token)
                    .invoke_async(con)
                    .await?;
                return if released == 1 {
                    Ok(())
                } else {
                    Err("not released".into())
                };
            }
        }
        let released: i64 = match step {
            0 | 1 => s.delete.key(&lock).arg(OWNER).invoke_async(con).await?,
            _ => {
                s.fair_delete
                    .key(&lock)
                    .key(&queue)
                    .arg(OWNER)
                    .invoke_async(con)
                    .await?
            }
        };
        if released == 1 {
            Ok(())
        } else {
            Err("not released".into())
        }
    }
}

async fn ladder(url: String, rounds: usize) -> Result<(), Failure> {
    let backend: Arc<dyn DistributedLock> = backend_redis::connect(&url).await?;
    let con = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let real = RealScripts::load();
    let mut s = Scripts {
        con,
        delete: Script::new(DELETE),
        fenced: Script::new(FENCED),
        fair: Script::new(FAIR),
        fair_delete: Script::new(FAIR_DELETE),
        try_fast: real.try_fast,
        release_plain: real.release_plain,
    };
    let backend = ladder::BackendSteps::new(backend, "ladder")?;

    ladder::climb(&STEPS, rounds, &mut s, &backend).await
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let usage = "usage: cost_ladder [REDIS_URL] [rounds]";
    ladder::run(Some("redis://127.0.0.1:6379"), usage, 100, ladder).await
}
