//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against a
//! single Redis server, a 3-master Redis Cluster, Redlock over 3 and over 5 independent masters,
//! and the Tair emulation, all started by the test kit and shared by every case of this test binary (fault
//! scenarios start private servers). Every client has its own connections and subscribers. This
//! is where each declares, once, how it fares in every fault scenario.

use std::process::ExitCode;

use conformance_tests::kit::{Redis, RedisCluster, RedisSet};
use conformance_tests::{Expect, Persistence, Spawned, Target};

/// Redis started with every write fsynced to its AOF before it is acknowledged.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// Redlock over `n` kit masters. A fault scenario breaks every node at once (the kit's
/// `RedisSet` control); faults of single nodes are Redlock's own, in `tests/redlock.rs`.
fn redlock(n: usize) -> Target {
    let connect = |url: String| async move { backend_redis::connect(&url).await };
    Target::lazy(
        &format!("redlock{n}"),
        move || async move {
            RedisSet::shared(n)
                .await
                .expect("kit redis-servers")
                .redlock_url()
        },
        connect,
    )
    .spawn_with(move |persistence| async move {
        let args = match persistence {
            Persistence::Durable => DURABLE,
            Persistence::None => &[],
        };
        let set = RedisSet::start(n, args).await?;
        Ok(Spawned {
            url: set.redlock_url(),
            server: Box::new(set),
            keep: None,
        })
    })
    .fault("server_killed_and_restarted", Expect::Safe)
    .fault(
        "server_killed_and_restarted_without_persistence",
        Expect::DocumentedUnsafe(
            "every node keeps its fence counter in memory only: when all of them restart empty, \
             the counters start again at 1 and the next token is below the old holder's \
             (capabilities say Conditional unless every node runs appendfsync always)",
        ),
    )
    .fault("server_paused_past_ttl", Expect::Safe)
    .fault(
        "holder_replies_blackholed_past_ttl",
        Expect::NotApplicable(
            "the proxy sits in front of one node, a minority: the holder keeps its majority; \
             Redlock's node blackhole tests are in tests/redlock.rs",
        ),
    )
    .fault(
        "holder_requests_blackholed_past_ttl",
        Expect::NotApplicable(
            "the proxy sits in front of one node, a minority: the holder keeps its majority; \
             Redlock's node blackhole tests are in tests/redlock.rs",
        ),
    )
    .fault("store_connections_killed", Expect::Safe)
    .fault("holder_process_killed", Expect::Safe)
    .fault("client_paused_past_ttl", Expect::Safe)
}

/// The Tair emulation on a kit server; fault scenarios break that server.
fn tair() -> Target {
    let connect = |url: String| async move { backend_redis::connect(&url).await };
    let tair_url = |redis: &Redis| redis.url().replacen("redis://", "tair://", 1);
    Target::lazy(
        "tair",
        move || async move { tair_url(Redis::shared().await.expect("kit redis-server")) },
        connect,
    )
    .spawn_with(move |persistence| async move {
        let redis = match persistence {
            Persistence::Durable => Redis::start_with(DURABLE).await?,
            Persistence::None => Redis::start().await?,
        };
        Ok(Spawned {
            url: tair_url(&redis),
            server: Box::new(redis),
            keep: None,
        })
    })
    .fault("server_killed_and_restarted", Expect::Safe)
    .fault(
        "server_killed_and_restarted_without_persistence",
        Expect::DocumentedUnsafe(
            "the version (the fencing token) lives in the server's memory: restarted without \
             AOF, it starts again at 1 (capabilities say Conditional unless the server runs \
             appendfsync always)",
        ),
    )
    .fault("server_paused_past_ttl", Expect::Safe)
    .fault("holder_replies_blackholed_past_ttl", Expect::Safe)
    .fault("holder_requests_blackholed_past_ttl", Expect::Safe)
    .fault("store_connections_killed", Expect::Safe)
    .fault("holder_process_killed", Expect::Safe)
    .fault("client_paused_past_ttl", Expect::Safe)
}

fn main() -> ExitCode {
    let connect = |url: String| async move { backend_redis::connect(&url).await };
    let single = Target::lazy(
        "redis",
        || async { Redis::shared().await.expect("kit redis-server").url() },
        connect,
    )
    .spawn_with(|persistence| async move {
        let redis = match persistence {
            Persistence::Durable => Redis::start_with(DURABLE).await?,
            Persistence::None => Redis::start().await?,
        };
        Ok(Spawned {
            url: redis.url(),
            server: Box::new(redis),
            keep: None,
        })
    })
    .fault("server_killed_and_restarted", Expect::Safe)
    .fault(
        "server_killed_and_restarted_without_persistence",
        Expect::DocumentedUnsafe(
            "the fence counter lives in the server's memory: restarted without AOF, it starts \
             again at 1, so the next holder's token is below the old holder's (the client \
             declares Fencing::Conditional unless the server runs appendfsync always)",
        ),
    )
    .fault("server_paused_past_ttl", Expect::Safe)
    .fault("holder_replies_blackholed_past_ttl", Expect::Safe)
    .fault("holder_requests_blackholed_past_ttl", Expect::Safe)
    .fault("store_connections_killed", Expect::Safe)
    .fault("holder_process_killed", Expect::Safe)
    .fault("client_paused_past_ttl", Expect::Safe);

    let cluster = Target::lazy(
        "redis_cluster",
        || async {
            RedisCluster::shared()
                .await
                .expect("kit redis cluster")
                .url()
        },
        connect,
    )
    .fault("holder_process_killed", Expect::Safe)
    .fault("client_paused_past_ttl", Expect::Safe)
    .without_server(
        "a cluster's node faults are their own scenario: cluster_master_kill9_resets_the_fence \
         in backend-redis/tests/faults.rs",
    );
    conformance_tests::harness::main(
        vec![single, cluster, redlock(3), redlock(5), tair()],
        env!("CARGO_TARGET_TMPDIR"),
    )
}
