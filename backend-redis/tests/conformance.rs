//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against a
//! single Redis server, a 3-master Redis Cluster and the Tair emulation, all started by the test
//! kit and shared by every case of this test binary (fault scenarios start private servers).
//! Every client has its own connections and subscribers. How each fares in every fault
//! scenario is declared once, in `conformance_tests::catalog`, which `dlock compare` reads too.
//! Redlock's targets are in backend-redlock.

use std::process::ExitCode;

use conformance_tests::Target;
use conformance_tests::catalog::declare;
use conformance_tests::kit::{Redis, RedisCluster};
use conformance_tests::spawn::SpawnName;

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_redis::connect(&url).await };
    let single = Target::lazy(
        "redis",
        || async { Redis::shared().await.expect("kit redis-server").url() },
        connect,
    );
    let cluster = Target::lazy(
        "redis_cluster",
        || async {
            RedisCluster::shared()
                .await
                .expect("kit redis cluster")
                .url()
        },
        connect,
    );
    let tair = Target::lazy(
        "tair",
        || async {
            let redis = Redis::shared().await.expect("kit redis-server");
            redis.url().replacen("redis://", "tair://", 1)
        },
        connect,
    );
    conformance_tests::harness::main(
        vec![
            declare(SpawnName::Redis, single),
            declare(SpawnName::RedisCluster, cluster),
            declare(SpawnName::Tair, tair),
        ],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
