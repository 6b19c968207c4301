//! The ZooKeeper → Redis migration, phase by phase, against a kit ZooKeeper server and a kit
//! Redis server: for every pair of adjacent phases, clients of both kinds contend for the
//! same names while writing through one fenced resource per name. Each run checks its
//! recorded history (no two holders' windows overlap, tokens grow with acquisition order),
//! that no fenced resource refused a write (so no stale write was ever made, let alone
//! accepted), and that a whole migration run gives one increasing token sequence per name.
//! The last test shows what the guide warns about: with ZooKeeper-only and Redis-only clients
//! at once (a skipped phase), two clients hold the same lock.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::kit::{Redis, ZooKeeper};
use conformance_tests::{FencedResource, History, Violation};
use lockcore::{AcquireOptions, DistributedLock, KeepAlive, LockExt, Wait};

use common::dual_url;

/// Which store(s) a client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Zk,
    Dual,
    Redis,
}

/// The five phases of the guide.
const ALL_ZK: &[Kind] = &[Kind::Zk];
const ZK_AND_DUAL: &[Kind] = &[Kind::Zk, Kind::Dual];
const ALL_DUAL: &[Kind] = &[Kind::Dual];
const DUAL_AND_REDIS: &[Kind] = &[Kind::Dual, Kind::Redis];
const ALL_REDIS: &[Kind] = &[Kind::Redis];

/// URLs of one test's stores: its own ZooKeeper chroot and Redis key prefix, on the servers
/// this binary shares.
struct Stores {
    zk: String,
    redis: String,
}

impl Stores {
    async fn new(test: &str) -> Stores {
        let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
        let redis = Redis::shared().await.expect("kit Redis");
        Stores {
            zk: format!("{}/phases-{test}", zk.url()),
            redis: format!("{}?prefix=phases-{test}", redis.url()),
        }
    }

    async fn client(&self, kind: Kind) -> Arc<dyn DistributedLock> {
        let url = match kind {
            Kind::Zk => self.zk.clone(),
            Kind::Redis => self.redis.clone(),
            Kind::Dual => dual_url(&self.zk, &self.redis, ""),
        };
        let connect = match kind {
            Kind::Dual => common::dual(url).await,
            _ => common::store(url).await,
        };
        connect.unwrap_or_else(|e| panic!("connect a {kind:?} client: {e}"))
    }
}

/// One history and one fenced resource per name, for a whole test.
#[derive(Default)]
struct Record {
    history: History,
    fenced: HashMap<String, FencedResource>,
    /// Every accepted write as (name, token, kind), in acceptance order.
    writes: std::sync::Mutex<Vec<(String, u64, Kind)>>,
    /// Client ids, unique across the whole test.
    next_id: std::sync::atomic::AtomicUsize,
}

const NAMES: &[&str] = &["orders/daily", "ledger"];

/// Clients of `kinds` (two of each) take turns on every name for `rounds` rounds each,
/// writing through the name's fenced resource while they hold it.
async fn contend(stores: &Stores, kinds: &[Kind], rounds: usize, record: &Arc<Record>) {
    let mut tasks = Vec::new();
    for &kind in kinds {
        for _ in 0..2 {
            let id = record
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let client = stores.client(kind).await;
            let record = record.clone();
            tasks.push(tokio::spawn(async move {
                let opts = AcquireOptions::new()
                    .ttl(Duration::from_secs(20))
                    .keep_alive(KeepAlive::Off)
                    .wait(Wait::For(Duration::from_secs(60)));
                for round in 0..rounds {
                    let name = NAMES[(id + round) % NAMES.len()];
                    let guard = client
                        .lock(name, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("{kind:?} client {id} acquires {name}: {e}"));
                    let hold = record.history.acquired(id, &guard.lease());
                    let token = guard.fencing_token();
                    record.fenced[name]
                        .write(token, id as u64)
                        .unwrap_or_else(|stale| {
                            panic!("{kind:?} client {id} holds {name} but its write was refused: {stale:?}")
                        });
                    record
                        .writes
                        .lock()
                        .unwrap()
                        .push((name.to_owned(), token.0, kind));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    record.history.ended(hold);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("a client did not finish within 120 s")
            .expect("client task");
    }
}

fn new_record() -> Arc<Record> {
    Arc::new(Record {
        fenced: NAMES
            .iter()
            .map(|n| (n.to_string(), FencedResource::new()))
            .collect(),
        ..Record::default()
    })
}

/// Checks the history and the fenced resources, and that every kind in `kinds` took part.
fn assert_safe(record: &Record, kinds: &[Kind]) {
    record.history.assert_safe();
    for (name, fenced) in &record.fenced {
        assert_eq!(fenced.rejected(), 0, "{name}: a write was refused as stale");
        fenced.assert_never_accepted_stale();
    }
    let writes = record.writes.lock().unwrap();
    for kind in kinds {
        assert!(
            writes.iter().any(|(_, _, k)| k == kind),
            "no {kind:?} client wrote at all"
        );
    }
    // Tokens per name increase in the order the resource accepted them, across kinds.
    for name in NAMES {
        let tokens: Vec<(u64, Kind)> = writes
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, t, k)| (*t, *k))
            .collect();
        for w in tokens.windows(2) {
            assert!(
                w[1].0 > w[0].0,
                "{name}: {:?} token {} came after {:?} token {}",
                w[1].1,
                w[1].0,
                w[0].1,
                w[0].0
            );
        }
    }
}

async fn adjacent(test: &str, from: &[Kind], to: &[Kind]) {
    let stores = Stores::new(test).await;
    let record = new_record();
    // A rolling deploy: clients of the old phase and the new one run side by side.
    let mut kinds: Vec<Kind> = from.to_vec();
    for k in to {
        if !kinds.contains(k) {
            kinds.push(*k);
        }
    }
    contend(&stores, &kinds, 12, &record).await;
    assert_safe(&record, &kinds);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_zookeeper_to_zookeeper_and_dual() {
    adjacent("p12", ALL_ZK, ZK_AND_DUAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zookeeper_and_dual_to_all_dual() {
    adjacent("p23", ZK_AND_DUAL, ALL_DUAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_dual_to_dual_and_redis() {
    adjacent("p34", ALL_DUAL, DUAL_AND_REDIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dual_and_redis_to_all_redis() {
    adjacent("p45", DUAL_AND_REDIS, ALL_REDIS).await;
}

/// The whole migration on the same names, one phase after the other with each transition
/// rolling (the old phase's clients still running as the new phase's start): one history and
/// one fenced resource per name across all of it, so tokens must keep increasing from
/// ZooKeeper's czxids, through dual tokens, to Redis-only tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_migration_keeps_one_token_sequence() {
    let stores = Stores::new("whole").await;
    let record = new_record();
    let phases = [ALL_ZK, ZK_AND_DUAL, ALL_DUAL, DUAL_AND_REDIS, ALL_REDIS];
    for pair in phases.windows(2) {
        let mut kinds = pair[0].to_vec();
        kinds.extend(pair[1].iter().filter(|k| !pair[0].contains(k)));
        contend(&stores, &kinds, 6, &record).await;
    }
    assert_safe(&record, &[Kind::Zk, Kind::Dual, Kind::Redis]);
    let writes = record.writes.lock().unwrap();
    let first_zk = writes.iter().find(|w| w.2 == Kind::Zk).expect("a zk write");
    let last_redis = writes
        .iter()
        .rev()
        .find(|w| w.2 == Kind::Redis && w.0 == first_zk.0)
        .expect("a redis write");
    assert!(
        last_redis.1 > first_zk.1,
        "Redis-only tokens ended below ZooKeeper's"
    );
}

/// Skipping the dual phases: a ZooKeeper-only client and a Redis-only client never share a
/// store, so both get the same lock at once. Shown deterministically: the ZooKeeper client
/// holds, and the Redis client's single attempt succeeds anyway. The recorded history shows
/// the overlap; the fenced resource refuses the Redis client's write only because its token
/// happens to be lower, which is exactly the window the phases close.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skipping_the_dual_phases_breaks_mutual_exclusion() {
    let stores = Stores::new("skip").await;
    let (zk, redis) = (
        stores.client(Kind::Zk).await,
        stores.client(Kind::Redis).await,
    );
    let history = History::new();
    let fenced = FencedResource::new();
    let opts = AcquireOptions::new()
        .ttl(Duration::from_secs(20))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No);
    let a = zk
        .try_lock("ledger", &opts)
        .await
        .expect("zk try_lock")
        .expect("the name is free on ZooKeeper");
    history.acquired(1, &a.lease());
    fenced
        .write(a.fencing_token(), 1)
        .expect("the ZooKeeper holder writes");
    let b = redis
        .try_lock("ledger", &opts)
        .await
        .expect("redis try_lock")
        .expect("Redis knows nothing of the ZooKeeper hold, so the lock is free there");
    history.acquired(2, &b.lease());
    let violations = history.violations();
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, Violation::Overlap { .. })),
        "expected an overlap between the two holders, got {violations:?}"
    );
    assert!(
        fenced.write(b.fencing_token(), 2).is_err(),
        "Redis's fresh counter ({}) is below ZooKeeper's czxid ({}), so the resource refuses it",
        b.fencing_token(),
        a.fencing_token()
    );
    b.release().await.expect("release");
    a.release().await.expect("release");
}
