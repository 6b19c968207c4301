//! The shared conformance suite against a single Redis server and a 3-master Redis Cluster,
//! both started by the test kit and shared by every case of this test binary. Every factory call
//! makes a new client (own connection, own subscriber) on the same store.

use std::sync::Arc;

use lockcore::DistributedLock;

async fn make_single() -> Arc<dyn DistributedLock> {
    let redis = conformance_tests::kit::Redis::shared()
        .await
        .expect("kit redis-server");
    backend_redis::connect(&redis.url())
        .await
        .expect("redis client")
}

conformance_tests::suite!(redis, make_single, [ttl, fifo]);

async fn make_cluster() -> Arc<dyn DistributedLock> {
    let cluster = conformance_tests::kit::RedisCluster::shared()
        .await
        .expect("kit redis cluster");
    backend_redis::connect(&cluster.url())
        .await
        .expect("redis cluster client")
}

conformance_tests::suite!(redis_cluster, make_cluster, [ttl, fifo]);
