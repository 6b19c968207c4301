//! The `dlock` binary on `dual://` over a kit ZooKeeper server and a kit Redis server: `status`
//! shows both sides, `migrate check` reports modes and token order, `migrate prepare` carries
//! Redis's counters up to ZooKeeper's tokens, and a dual client killed -9 leaves both sides to
//! free themselves by their own expiry.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::kit::{Redis, ZooKeeper};
use dlock::{AcquireOptions, DistributedLock, KeepAlive, LockExt, Wait};

mod common;

use common::{dlock, enc, run, text};

struct Stores {
    _zk: ZooKeeper,
    _redis: Redis,
    zk: String,
    redis: String,
    dual: String,
}

async fn stores() -> Stores {
    let (zk, redis) = tokio::join!(ZooKeeper::start(), Redis::start());
    let (zk, redis) = (zk.expect("kit ZooKeeper"), redis.expect("kit Redis"));
    let zk_url = format!("{}/app?session_timeout=4s", zk.url());
    let redis_url = redis.url();
    let dual = format!("dual://?first={}&second={}", enc(&zk_url), enc(&redis_url));
    Stores {
        _zk: zk,
        _redis: redis,
        zk: zk_url,
        redis: redis_url,
        dual,
    }
}

fn opts() -> AcquireOptions {
    AcquireOptions::new()
        .ttl(Duration::from_secs(30))
        .keep_alive(KeepAlive::Off)
        .wait(Wait::No)
}

async fn client(url: &str) -> Arc<dyn DistributedLock> {
    dlock::connect(url).await.expect("connect")
}

#[test]
fn status_and_migrate_check_and_prepare() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let s = stores().await;
        let (zk, redis, dual) = (
            client(&s.zk).await,
            client(&s.redis).await,
            client(&s.dual).await,
        );

        // A ZooKeeper-only client holds `a`; a dual client holds `b`; `c` was used on
        // ZooKeeper and is free.
        let a = zk.try_lock("a", &opts()).await.unwrap().expect("a is free");
        let b = dual
            .try_lock("b", &opts())
            .await
            .unwrap()
            .expect("b is free");
        let c = zk.try_lock("c", &opts()).await.unwrap().expect("c is free");
        let c_token = c.fencing_token().0;
        c.release().await.unwrap();
        let e = zk.try_lock("e", &opts()).await.unwrap().expect("e is free");
        e.release().await.unwrap();
        let e = redis
            .try_lock("e", &opts())
            .await
            .unwrap()
            .expect("e is free on Redis");
        // `r` is known only to Redis: check finds it without a --name.
        let r_only = redis
            .try_lock("r", &opts())
            .await
            .unwrap()
            .expect("r is free on Redis");

        let o = run(dlock().args(["status", "--url", &s.dual, "b"]));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("first (zookeeper): held by"), "{out}");
        assert!(out.contains("second (redis): held by"), "{out}");
        assert!(out.contains(&b.lease().owner().to_string()), "{out}");

        let check = |json: bool| {
            let mut cmd = dlock();
            cmd.args([
                "migrate", "check", "--from", &s.zk, "--to", &s.redis, "--name", "a",
            ]);
            if json {
                cmd.arg("--json");
            }
            run(&mut cmd)
        };
        let o = check(false);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = text(&o);
        assert!(out.contains("source-only"), "{out}");
        assert!(out.contains("dual"), "{out}");
        assert!(out.contains("run `dlock migrate prepare`"), "{out}");
        let o = check(true);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let mode = |n: &str| {
            v["names"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == n)
                .unwrap_or_else(|| panic!("{n} missing in {v}"))["mode"]
                .clone()
        };
        assert_eq!(mode("a"), "source_only");
        assert_eq!(mode("b"), "dual");
        assert_eq!(mode("c"), "free");
        assert_eq!(mode("r"), "target_only");
        r_only.release().await.unwrap();

        // Prepare: the Redis counter of `c` moves up to ZooKeeper's mark, so a Redis-only
        // client's next token is above the last ZooKeeper token.
        let o = run(dlock().args([
            "migrate",
            "prepare",
            "--from",
            &s.zk,
            "--to",
            &s.redis,
            "--dry-run",
        ]));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            text(&o).contains("c: would raise counter 0 ->"),
            "{}",
            text(&o)
        );
        let o = run(dlock().args(["migrate", "prepare", "--from", &s.zk, "--to", &s.redis]));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let out = text(&o);
        assert!(out.contains("c: raised counter 0 ->"), "{out}");
        // The dual holder of `b` already carried Redis's counter to ZooKeeper's token; `e`,
        // held on Redis by a Redis-only client below ZooKeeper's token, is left alone.
        assert!(out.contains("b: already at"), "{out}");
        assert!(out.contains("e: held on the target"), "{out}");
        e.release().await.unwrap();
        let r = redis
            .try_lock("c", &opts())
            .await
            .unwrap()
            .expect("c is free");
        assert!(
            r.fencing_token().0 > c_token,
            "Redis token {} after prepare is not above ZooKeeper's {c_token}",
            r.fencing_token()
        );
        r.release().await.unwrap();

        // A skipped phase: a Redis-only client takes `a` while the ZooKeeper-only client holds
        // it. check sees the split and exits 1.
        let split = redis
            .try_lock("a", &opts())
            .await
            .unwrap()
            .expect("Redis knows nothing of a");
        let o = check(false);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("SPLIT"), "{}", text(&o));
        split.release().await.unwrap();
        a.release().await.unwrap();
        b.release().await.unwrap();
    });
}

#[test]
fn dual_client_killed_leaves_both_sides_to_expire() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let s = stores().await;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
            .env_remove("DLOCK_URL")
            .env_remove("RUST_LOG")
            .args([
                "run",
                "--url",
                &s.dual,
                "--name",
                "job",
                "--ttl",
                "3s",
                "--",
                "sh",
                "-c",
                "echo \"token=$DLOCK_FENCING_TOKEN\"; exec sleep 60",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start dlock run");
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("dlock run did not acquire within 60 s")
            .unwrap()
            .expect("a token line");
        let token: u64 = line.trim().strip_prefix("token=").unwrap().parse().unwrap();

        let (zk, redis) = (client(&s.zk).await, client(&s.redis).await);
        assert!(
            zk.try_lock("job", &opts()).await.unwrap().is_none(),
            "ZooKeeper side free while held"
        );
        assert!(
            redis.try_lock("job", &opts()).await.unwrap().is_none(),
            "Redis side free while held"
        );

        // kill -9 dlock (its `sleep` child is orphaned; it holds nothing).
        child.start_kill().expect("kill -9");
        child.wait().await.expect("reap");
        for (side, store) in [("ZooKeeper", &zk), ("Redis", &redis)] {
            let g = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    if let Some(g) = store.try_lock("job", &opts()).await.expect("try_lock") {
                        break g;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("the {side} side was still held 60 s after the kill"));
            g.release().await.unwrap();
        }
        let dual = client(&s.dual).await;
        let g = dual
            .try_lock("job", &opts())
            .await
            .unwrap()
            .expect("free on both sides");
        assert!(
            g.fencing_token().0 > token,
            "token did not grow after the kill"
        );
        g.release().await.unwrap();
    });
}
