//! The shared suite (every case and fault scenario of `conformance_tests::registry`) against a
//! single Redis server, a 3-master Redis Cluster and the Tair emulation, all started by the test
//! kit and shared by every case of this test binary (fault scenarios start private servers).
//! Every client has its own connections and subscribers. This is where each declares, once,
//! how it fares in every fault scenario. Redlock's targets are in backend-redlock.

use std::process::ExitCode;

use conformance_tests::kit::{Redis, RedisCluster};
use conformance_tests::{Expect, Persistence, Spawned, Target};

/// Redis started with every write fsynced to its AOF before it is acknowledged.
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

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
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    // Permits are the single server's (see the single target below), on the same server.
    .fault("sem_server_killed_and_restarted", Expect::Safe)
    .fault("sem_holder_blackholed_past_ttl", Expect::Safe)
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_server_killed_and_restarted", Expect::Safe)
    .fault("rw_reader_blackholed_past_ttl", Expect::Safe)
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
    .fault("client_paused_past_ttl", Expect::Safe)
    // Permits are kept like locks: the AOF holds each grant's ZADD with its absolute expiry
    // and the semaphore's counter, and a permit's expiry runs on the server's clock.
    .fault("sem_server_killed_and_restarted", Expect::Safe)
    .fault("sem_holder_blackholed_past_ttl", Expect::Safe)
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_server_killed_and_restarted", Expect::Safe)
    .fault("rw_reader_blackholed_past_ttl", Expect::Safe);

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
    .fault("sem_client_paused_past_ttl", Expect::Safe)
    .fault("rw_reader_paused_past_ttl", Expect::Safe)
    .without_server(
        "a cluster's node faults are their own scenario: cluster_master_kill9_resets_the_fence \
         in backend-redis/tests/faults.rs",
    );
    conformance_tests::harness::main(vec![single, cluster, tair()], env!("CARGO_TARGET_TMPDIR"))
}
