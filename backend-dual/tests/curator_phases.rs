//! The migration from a Curator fleet to Redis, phase by phase (the README's "From a Curator or
//! kazoo fleet"): real Curator 5.4 clients (`InterProcessMutex`, run by the test kit as JVMs
//! of their own) are the fleet of phases 1 and 2; `dual://` clients take the same lock on the
//! same znode path through `zk://...?layout=curator` first and Redis second; Redis-only clients
//! follow. The phases run one after the other on one lock, each transition rolling (the old
//! phase's clients still running as the new phase's start), and every holder writes to one
//! fenced resource with its token (a Curator holder's is its node's czxid). The recorded
//! history must show no two holders at once, and the resource must never have refused a write
//! (so nobody wrote stale, let alone had it accepted).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance_tests::kit::{LockPeer, PeerLock, Redis, ZooKeeper};
use conformance_tests::{FencedResource, History, Hold};
use lockcore::{AcquireOptions, DistributedLock, FencingToken, KeepAlive, LockExt, Wait};

use common::dual_url;

/// Which kind of client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Curator,
    Dual,
    Redis,
}

const NAME: &str = "orders";

struct Fleet {
    curator: Vec<Arc<LockPeer>>,
    /// The lock's znode path, as the Curator fleet names it.
    path: String,
    /// `zk://.../chroot?layout=curator`: the same path for dlock.
    zk: String,
    redis: String,
    history: History,
    fenced: FencedResource,
    /// Every accepted write as (token, kind), in acceptance order.
    writes: std::sync::Mutex<Vec<(u64, Kind)>>,
}

impl Fleet {
    async fn new() -> Fleet {
        let zk = ZooKeeper::shared().await.expect("kit ZooKeeper");
        let redis = Redis::shared().await.expect("kit Redis");
        let chroot = format!("curator-fleet-{:08x}", lockcore::OwnerId::random().0 as u32);
        let mut curator = Vec::new();
        for _ in 0..2 {
            let peer = LockPeer::curator(&zk.connect_string(), Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("cannot start a Curator client: {e}"));
            curator.push(Arc::new(peer));
        }
        Fleet {
            curator,
            path: format!("/{chroot}/{NAME}"),
            zk: format!("{}/{chroot}?layout=curator", zk.url()),
            redis: format!("{}?prefix={chroot}", redis.url()),
            history: History::new(),
            fenced: FencedResource::new(),
            writes: std::sync::Mutex::new(Vec::new()),
        }
    }

    async fn dlock(&self, kind: Kind) -> Arc<dyn DistributedLock> {
        let connected = match kind {
            Kind::Dual => common::dual(dual_url(&self.zk, &self.redis, "")).await,
            _ => common::store(self.redis.clone()).await,
        };
        connected.unwrap_or_else(|e| panic!("connect a {kind:?} client: {e}"))
    }

    /// Records a write the resource accepted.
    fn write(&self, token: u64, kind: Kind, client: usize) {
        self.fenced
            .write(FencingToken(token), client as u64)
            .unwrap_or_else(|stale| {
                panic!(
                    "{kind:?} client {client} holds the lock but its write was refused: {stale:?}"
                )
            });
        self.writes.lock().unwrap().push((token, kind));
    }
}

/// Two clients of each of `kinds` take `rounds` turns each on the lock.
async fn contend(fleet: &Arc<Fleet>, kinds: &[Kind], rounds: usize, first_id: usize) {
    let mut tasks = Vec::new();
    let mut id = first_id;
    for &kind in kinds {
        for i in 0..2 {
            id += 1;
            let fleet = fleet.clone();
            if kind == Kind::Curator {
                let peer = fleet.curator[i].clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..rounds {
                        let hold = peer
                            .acquire(PeerLock::Mutex, &fleet.path, Some(Duration::from_secs(60)))
                            .expect("send acquire")
                            .await
                            .expect("Curator acquires")
                            .expect("Curator got the lock within 60 s");
                        let acquired = Instant::now();
                        fleet.write(hold.czxid, kind, id);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        fleet.history.push(Hold {
                            client: id,
                            name: NAME.to_owned(),
                            token: hold.czxid,
                            acquired,
                            // No lease: Curator holds until it releases.
                            valid_until: acquired + Duration::from_secs(3600),
                            ended: Some(Instant::now()),
                        });
                        peer.release(&hold).await.expect("Curator releases");
                    }
                }));
                continue;
            }
            let client = fleet.dlock(kind).await;
            tasks.push(tokio::spawn(async move {
                let opts = AcquireOptions::new()
                    .ttl(Duration::from_secs(20))
                    .keep_alive(KeepAlive::Off)
                    .wait(Wait::For(Duration::from_secs(60)));
                for _ in 0..rounds {
                    let guard = client
                        .lock(NAME, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("{kind:?} client {id} acquires: {e}"));
                    let hold = fleet.history.acquired(id, &guard.lease());
                    fleet.write(guard.fencing_token().0, kind, id);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    fleet.history.ended(hold);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(300), task)
            .await
            .expect("a client did not finish within 300 s")
            .expect("client task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_fleet_to_redis_keeps_one_holder_and_one_token_sequence() {
    let fleet = Arc::new(Fleet::new().await);
    let phases: [&[Kind]; 5] = [
        &[Kind::Curator],
        &[Kind::Curator, Kind::Dual],
        &[Kind::Dual],
        &[Kind::Dual, Kind::Redis],
        &[Kind::Redis],
    ];
    for (i, pair) in phases.windows(2).enumerate() {
        let mut kinds = pair[0].to_vec();
        kinds.extend(pair[1].iter().filter(|k| !pair[0].contains(k)));
        contend(&fleet, &kinds, 6, 10 * i).await;
    }
    fleet.history.assert_safe();
    assert_eq!(fleet.fenced.rejected(), 0, "a write was refused as stale");
    fleet.fenced.assert_never_accepted_stale();
    let writes = fleet.writes.lock().unwrap();
    for kind in [Kind::Curator, Kind::Dual, Kind::Redis] {
        assert!(
            writes.iter().any(|(_, k)| *k == kind),
            "no {kind:?} client wrote"
        );
    }
    for w in writes.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "{:?} token {} came after {:?} token {}",
            w[1].1,
            w[1].0,
            w[0].1,
            w[0].0
        );
    }
}
