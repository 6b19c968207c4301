//! Redis: kill -9 with and without persistence, pause and resume, the shared server.

use std::time::Duration;

use conformance_tests::kit::{Redis, RedisReply, password, read_redis_reply, redis_encode};
use tokio::io::AsyncWriteExt;
use tokio::time::timeout;

use crate::support::{PAUSED_PROBE, authenticated, bulk, kill9_and_restart, redis_pongs, refuses};

#[tokio::test]
async fn redis_without_persistence_loses_keys_on_kill9_and_restarts_on_the_same_port() {
    let redis = Redis::start().await.expect("redis starts");
    assert_eq!(
        redis.url(),
        format!("redis://:{}@127.0.0.1:{}", password(), redis.port())
    );
    assert_ne!(redis.port(), 6379, "never the system server's port");
    assert_eq!(
        redis.command(&["PING"]).await.unwrap(),
        RedisReply::Status("PONG".into())
    );
    assert_eq!(
        redis.command(&["SET", "k", "v"]).await.unwrap(),
        RedisReply::Status("OK".into())
    );
    assert_eq!(redis.command(&["GET", "k"]).await.unwrap(), bulk("v"));

    kill9_and_restart(&redis).await;
    assert_eq!(
        redis.command(&["GET", "k"]).await.unwrap(),
        RedisReply::Bulk(None),
        "without persistence the key is gone"
    );
}

#[tokio::test]
async fn redis_with_aof_always_keeps_keys_across_kill9() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .await
        .expect("redis with AOF starts");
    assert_eq!(
        redis.command(&["SET", "durable", "yes"]).await.unwrap(),
        RedisReply::Status("OK".into())
    );
    redis.kill9();
    assert!(refuses(redis.addr()).await);
    redis
        .restart()
        .await
        .expect("redis restarts and loads its AOF");
    assert_eq!(
        redis.command(&["GET", "durable"]).await.unwrap(),
        bulk("yes"),
        "a key SET before kill -9 survives with appendfsync always"
    );
}

#[tokio::test]
async fn redis_pause_freezes_and_resume_thaws() {
    let redis = Redis::start().await.expect("redis starts");
    let mut conn = authenticated(redis.addr()).await.unwrap();
    redis.pause();
    assert!(
        !redis_pongs(redis.addr(), PAUSED_PROBE).await,
        "a paused redis does not answer PING"
    );
    conn.get_mut()
        .write_all(&redis_encode(&["PING"]))
        .await
        .unwrap();
    assert!(
        timeout(PAUSED_PROBE, read_redis_reply(&mut conn))
            .await
            .is_err(),
        "no reply on an open connection while paused"
    );
    redis.resume();
    assert!(redis_pongs(redis.addr(), Duration::from_secs(10)).await);
    assert_eq!(
        timeout(Duration::from_secs(10), read_redis_reply(&mut conn))
            .await
            .expect("the pending PING is answered after resume")
            .unwrap(),
        RedisReply::Status("PONG".into())
    );
}

#[tokio::test]
async fn redis_shared_is_one_server() {
    let a = Redis::shared().await.expect("shared redis");
    let b = Redis::shared().await.expect("shared redis");
    assert!(std::ptr::eq(a, b));
    assert!(redis_pongs(a.addr(), Duration::from_secs(10)).await);
}
