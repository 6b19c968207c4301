//! Redis-specific tests against kit servers: TLS, ACL users, bad input, credentials never
//! printed, the key layout, queue liveness, script reloading, pipelined renewals, inspect.

use std::sync::Arc;
use std::time::Duration;

use backend_redis::node::{AcquireReply, AttemptReply};
use backend_redis::{RedisConfig, RedisLock};
use conformance_tests::kit::{Redis, RedisCluster, RedisReply, RedisTls};
use conformance_tests::within;
use lockcore::{
    AcquireOptions, DistributedLock, Error, Fencing, FencingToken, KeepAlive, LockExt, LockName,
    Released, SemaphoreExt, Wait,
};

const SEC: Duration = Duration::from_secs(1);
const PASSWORD: &str = "s3cr3t-Pa55";

fn unique(label: &str) -> String {
    format!("redis-tests/{label}/{:08x}", rand::random::<u32>())
}

fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::Off)
        .wait(Wait::For(30 * SEC))
}

async fn shared() -> &'static Redis {
    Redis::shared().await.expect("kit redis")
}

async fn ok(redis: &Redis, args: &[&str]) {
    if let RedisReply::Error(e) = redis.command(args).await.expect("redis command") {
        panic!("{args:?}: {e}");
    }
}

async fn basic_round(c: &Arc<dyn DistributedLock>, label: &str) {
    let name = unique(label);
    let g = c.lock(&name, &opts(10 * SEC)).await.expect("acquire");
    assert!(
        c.try_lock(&name, &opts(10 * SEC))
            .await
            .expect("try")
            .is_none()
    );
    assert_eq!(g.release().await.expect("release"), Released::Released);
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "the password leaked: {text}");
}

/// A `rediss://` client trusting the kit's CA acquires and releases; the same works for an ACL
/// user with a password over TLS; without the CA the handshake is refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_test_ca() {
    let server = RedisTls::start().await.expect("kit redis with TLS");
    let ca = server.ca_cert();
    let url = format!("{}?ca={}", server.tls_url(), ca.display());
    let c = backend_redis::connect(&url).await.expect("TLS client");
    basic_round(&c, "tls").await;

    ok(
        server.redis(),
        &[
            "ACL",
            "SETUSER",
            "tlsuser",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ],
    )
    .await;
    let url = format!(
        "rediss://tlsuser:{PASSWORD}@127.0.0.1:{}?ca={}",
        server.tls_port(),
        ca.display()
    );
    let c = backend_redis::connect(&url)
        .await
        .expect("TLS client with an ACL user");
    basic_round(&c, "tls-acl").await;
    assert_no_secret(&format!("{c:?}"));

    // Without the kit's CA the server's certificate is not trusted.
    let err = backend_redis::connect(&format!(
        "rediss://tlsuser:{PASSWORD}@127.0.0.1:{}",
        server.tls_port()
    ))
    .await
    .expect_err("an untrusted certificate must be refused");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert_no_secret(&format!("{err} {err:?}"));

    let err = backend_redis::connect(&format!("{}?ca=/nonexistent/ca.pem", server.tls_url()))
        .await
        .expect_err("a missing CA file");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("CA file"), "{err}");
}

/// A server that authenticates clients by certificate (`tls-auth-clients yes`): a `cert` + `key`
/// signed by the CA it trusts gets in, a client without one is refused, and files that are not
/// what they should be are a config error before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates() {
    let server = RedisTls::start_with(&["--tls-auth-clients", "yes"])
        .await
        .expect("kit redis with TLS");
    let mine = server
        .tls()
        .issue_client("dlock-client")
        .await
        .expect("client certificate");
    let base = format!("{}?ca={}", server.tls_url(), server.ca_cert().display());
    let url = format!(
        "{base}&cert={}&key={}",
        mine.cert.display(),
        mine.key.display()
    );
    let c = backend_redis::connect(&url)
        .await
        .expect("client with a certificate");
    basic_round(&c, "tls-client-cert").await;

    let err = backend_redis::connect(&format!("{base}&timeout=5s"))
        .await
        .expect_err("the server requires a client certificate");
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");

    let err = backend_redis::connect(&format!(
        "{base}&cert={}&key={}",
        mine.cert.display(),
        mine.cert.display()
    ))
    .await
    .expect_err("a certificate is not a key");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("private key"), "{err}");
    let err = backend_redis::connect(&format!("{base}&cert=/nonexistent/c.pem&key=/k.pem"))
        .await
        .expect_err("a missing file");
    assert!(err.to_string().contains("client certificate file"), "{err}");
}

/// An ACL user with a password works; a wrong password, an unknown user and a password-less
/// connection to a protected user fail with a clear, non-retryable error that never shows the
/// password (in `Display` or `Debug`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_and_wrong_passwords() {
    let redis = Redis::start().await.expect("kit redis");
    ok(
        &redis,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ],
    )
    .await;
    let port = redis.port();
    let c = backend_redis::connect(&format!("redis://app:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("ACL user");
    basic_round(&c, "acl").await;
    assert_no_secret(&format!("{c:?}"));

    // A user restricted to other keys cannot take locks: a clear error, not a hang.
    ok(
        &redis,
        &[
            "ACL",
            "SETUSER",
            "narrow",
            "on",
            &format!(">{PASSWORD}"),
            "~other:*",
            "&*",
            "+@all",
        ],
    )
    .await;
    let narrow = backend_redis::connect(&format!("redis://narrow:{PASSWORD}@127.0.0.1:{port}"))
        .await
        .expect("narrow user connects");
    let err = narrow
        .lock(&unique("narrow"), &opts(10 * SEC))
        .await
        .expect_err("no permission on the lock keys");
    assert!(
        !err.is_retryable(),
        "a permission error is not retryable: {err}"
    );
    assert!(
        err.to_string().contains("NOPERM") || err.to_string().to_lowercase().contains("permission"),
        "{err}"
    );

    for url in [
        format!("redis://app:wrong-{PASSWORD}@127.0.0.1:{port}"),
        format!("redis://nobody:{PASSWORD}@127.0.0.1:{port}"),
    ] {
        let err = backend_redis::connect(&url)
            .await
            .expect_err("bad credentials");
        let text = format!("{err} | {err:?}");
        assert!(
            matches!(
                err,
                Error::AccessDenied {
                    operation: "connect",
                    ..
                }
            ),
            "{text}"
        );
        assert!(!err.is_retryable(), "{text}");
        assert!(
            text.contains("WRONGPASS"),
            "the message says the credentials were refused: {text}"
        );
        assert_no_secret(&text);
    }
}

/// Unreachable hosts, URLs without a host and unknown options fail with clear errors of the
/// right kind (no timing assertions: the connect timeout only bounds how long it may take).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_clearly() {
    // Nothing listens on a port the kit handed out and never used.
    let port = conformance_tests::kit::free_port();
    let err = backend_redis::connect(&format!("redis://u:{PASSWORD}@127.0.0.1:{port}?timeout=2s"))
        .await
        .expect_err("unreachable");
    let text = format!("{err} | {err:?}");
    assert!(
        matches!(
            err,
            Error::Backend {
                retryable: true,
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("127.0.0.1:{port}")),
        "names the address: {text}"
    );
    assert_no_secret(&text);

    let cluster_err =
        backend_redis::connect(&format!("redis+cluster://127.0.0.1:{port}?timeout=2s"))
            .await
            .expect_err("unreachable cluster");
    assert!(
        matches!(cluster_err, Error::Backend { .. }),
        "{cluster_err:?}"
    );

    for (url, needle) in [
        (format!("redis://:{PASSWORD}@"), "no host"),
        ("redis://".to_owned(), "no host"),
        ("redis+cluster://".to_owned(), "no host"),
        (
            "redis://127.0.0.1:6379?colour=blue".to_owned(),
            "unknown option `colour`",
        ),
        ("redis://127.0.0.1:notaport".to_owned(), "not a TCP port"),
    ] {
        let err = backend_redis::connect(&url).await.expect_err("bad URL");
        let text = format!("{err} | {err:?}");
        assert!(matches!(err, Error::InvalidConfig { .. }), "{url}: {text}");
        assert!(text.contains(needle), "{url}: {text}");
        assert_no_secret(&text);
    }
    assert!(matches!(
        backend_redis::connect("memcached://127.0.0.1:1").await,
        Err(Error::UnsupportedScheme { .. })
    ));
    let cfg = RedisConfig::parse(&format!("redis://u:{PASSWORD}@h:1")).unwrap();
    assert_no_secret(&format!("{cfg:?}"));
    assert_no_secret(cfg.redacted_url());
}

/// The keys of one lock share a hash tag and the fence counter survives release and expiry;
/// the holder value is the lease's owner id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_and_fence_key() {
    let redis = shared().await;
    let c = backend_redis::connect(&format!("{}?prefix=layout", redis.url()))
        .await
        .expect("client");
    let name = unique("layout");
    let esc = LockName::new(&name).unwrap().escaped();
    let g = c.lock(&name, &opts(10 * SEC)).await.expect("acquire");
    let lock_key = format!("{{layout:{esc}}}:lock");
    let fence_key = format!("{{layout:{esc}}}:fence");
    let value = redis.command(&["GET", &lock_key]).await.unwrap().as_text();
    assert_eq!(value, Some(g.lease().owner().to_string()));
    assert_eq!(
        redis.command(&["GET", &fence_key]).await.unwrap().as_text(),
        Some(g.fencing_token().to_string()),
        "while held, the fence counter is the holder's token"
    );
    g.release().await.expect("release");
    assert_eq!(
        redis.command(&["GET", &fence_key]).await.unwrap().as_text(),
        Some("1".to_owned()),
        "the fence counter stays after release"
    );
    assert_eq!(
        redis.command(&["EXISTS", &lock_key]).await.unwrap(),
        RedisReply::Integer(0)
    );
}

/// `names()` as sorted strings.
async fn sorted_names(client: &Arc<dyn DistributedLock>) -> Vec<String> {
    let mut names: Vec<String> = client
        .names()
        .await
        .expect("names")
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    names.sort();
    names
}

/// `names()` lists every name with a fence counter under the client's own prefix (decoded,
/// whatever characters the name has), held or not, and none of another prefix's; a forgotten
/// name is gone from the list. On a Cluster, the names on every master are found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_lists_this_prefixs_names() {
    let redis = shared().await;
    let prefix = format!("names{:08x}", rand::random::<u32>());
    let c = backend_redis::connect(&format!("{}?prefix={prefix}", redis.url()))
        .await
        .expect("client");
    let other = backend_redis::connect(&format!("{}?prefix={prefix}x", redis.url()))
        .await
        .expect("client of another prefix");
    let (free, held, odd) = ("orders/eu", "ledger", "a b:c{d}*?%");
    c.lock(free, &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let g = c.lock(held, &opts(10 * SEC)).await.expect("acquire");
    c.lock(odd, &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    other
        .lock("elsewhere", &opts(10 * SEC))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let names = sorted_names(&c).await;
    let mut expected = vec![free.to_owned(), held.to_owned(), odd.to_owned()];
    expected.sort();
    assert_eq!(names, expected);
    g.release().await.expect("release");
    assert!(
        c.forget(&LockName::new(free).unwrap())
            .await
            .expect("forget")
    );
    let names = c.names().await.expect("names");
    assert!(
        !names.iter().any(|n| n.as_str() == free),
        "a forgotten name is not listed: {names:?}"
    );
    assert_eq!(names.len(), 2);

    // A Cluster: every master is scanned (enough names that they land on all three).
    let cluster = backend_redis::connect(&format!(
        "{}?prefix={prefix}",
        RedisCluster::shared().await.unwrap().url()
    ))
    .await
    .expect("cluster client");
    let mut expected: Vec<String> = (0..24).map(|i| format!("spread/{i}")).collect();
    for name in &expected {
        cluster
            .lock(name, &opts(10 * SEC))
            .await
            .expect("acquire")
            .release()
            .await
            .expect("release");
    }
    let names = sorted_names(&cluster).await;
    expected.sort();
    assert_eq!(names, expected);
}

/// A token floor is honoured on every path that grants (the `try` fast path, an uncontended
/// waiting acquire, a queued waiter handed the lock by a release, a reader): the token is the
/// floor and the fence counter holds it, so the next plain grant is one above. A floor Lua
/// numbers cannot carry exactly is refused before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_floor_on_every_granting_path() {
    let redis = shared().await;
    let (a, b) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("floor-paths");
    let lock_name = LockName::new(&name).unwrap();
    let fence_key = format!("{{dlock:{}}}:fence", lock_name.escaped());
    let fence = || async { redis.command(&["GET", &fence_key]).await.unwrap().as_text() };
    let floored = |f: u64| opts(30 * SEC).token_floor(FencingToken(f));

    // An uncontended waiting acquire: the acquire script's first branch.
    let g = a.lock(&name, &floored(500)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(500));
    assert_eq!(fence().await, Some("500".to_owned()));
    g.release().await.expect("release");

    // A `try`: the fast script.
    let g = a
        .try_lock(&name, &floored(1000))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(g.fencing_token(), FencingToken(1000));
    assert_eq!(fence().await, Some("1000".to_owned()));

    // A queued waiter, granted by the full script once the holder releases.
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name, &floored(5000)).await })
    };
    within(30 * SEC, "the waiter queued", async {
        while a.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) != Some(1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    g.release().await.expect("release");
    let gw = within(30 * SEC, "the waiter gets the lock", waiter)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(gw.fencing_token(), FencingToken(5000));
    assert_eq!(fence().await, Some("5000".to_owned()));
    assert_eq!(gw.release().await.expect("release"), Released::Released);

    // A floor below the counter changes nothing; a plain grant continues from the floor.
    let g = a.lock(&name, &floored(3)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(5001));
    g.release().await.expect("release");

    let err = a
        .try_lock(&name, &floored((1 << 53) + 1))
        .await
        .expect_err("a floor above 2^53");
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                argument: "token_floor",
                ..
            }
        ),
        "got {err}"
    );
    assert_eq!(
        fence().await,
        Some("5001".to_owned()),
        "the refused floor wrote"
    );
    assert_eq!(
        a.inspect(&lock_name).await.unwrap().and_then(|i| i.holder),
        None,
        "the refused floor took the lock"
    );

    // Readers draw from the same counter, and their grants (a `try`, a wait) raise it too.
    use lockcore::ReadWriteExt;
    let r1 = a
        .try_read_lock(&name, &floored(7000))
        .await
        .expect("try read")
        .expect("free");
    assert_eq!(r1.fencing_token(), FencingToken(7000));
    let r2 = b.read_lock(&name, &floored(8000)).await.expect("read");
    assert_eq!(r2.fencing_token(), FencingToken(8000));
    assert_eq!(fence().await, Some("8000".to_owned()));
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let g = a.lock(&name, &opts(30 * SEC)).await.expect("acquire");
    assert_eq!(g.fencing_token(), FencingToken(8001));
    g.release().await.expect("release");
}

/// A waiter that stops re-checking (a crashed client) is dropped from the queue once its
/// liveness runs out, so the live waiter behind it gets the lock; `try_lock` does not jump a
/// queue with a live waiter; `inspect` counts live waiters only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_does_not_block_the_queue() {
    let redis = shared().await;
    let (a, b, c) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("dead-waiter");
    let esc = LockName::new(&name).unwrap().escaped();
    let ga = a.lock(&name, &opts(30 * SEC)).await.expect("a holds");
    // A crashed waiter: queued first, alive for one more second, never re-checks.
    let (queue, alive) = (
        format!("{{dlock:{esc}}}:queue"),
        format!("{{dlock:{esc}}}:alive"),
    );
    let time = redis.command(&["TIME"]).await.unwrap();
    let now_ms = match time {
        RedisReply::Array(Some(items)) => {
            let s: u64 = items[0].as_text().unwrap().parse().unwrap();
            let us: u64 = items[1].as_text().unwrap().parse().unwrap();
            s * 1000 + us / 1000
        }
        other => panic!("TIME: {other:?}"),
    };
    // A queue entry is the owner id followed by the client id.
    let ghost = "0".repeat(48);
    ok(redis, &["ZADD", &queue, "0", &ghost]).await;
    ok(
        redis,
        &["ZADD", &alive, &(now_ms + 1000).to_string(), &ghost],
    )
    .await;

    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    let lock_name = LockName::new(&name).unwrap();
    within(30 * SEC, "b queued", async {
        while c.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) != Some(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    ga.release().await.expect("release");
    assert!(
        c.try_lock(&name, &opts(10 * SEC)).await.unwrap().is_none(),
        "try_lock jumped a queue with live waiters"
    );
    let gb = within(60 * SEC, "b gets the lock past the dead waiter", waiter)
        .await
        .expect("task")
        .expect("b acquires");
    let info = c.inspect(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.waiters, Some(0));
    assert_eq!(info.holder, Some(gb.lease().owner().to_string()));
    assert_eq!(
        redis.command(&["ZSCORE", &queue, &ghost]).await.unwrap(),
        RedisReply::Bulk(None),
        "the dead waiter was pruned"
    );
    gb.release().await.expect("release");
}

/// After `SCRIPT FLUSH` (as after a restart) every operation reloads its script and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_flush() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    basic_round(&c, "before-flush").await;
    let name = unique("flush");
    let g = c
        .lock(&name, &opts(2 * SEC).keep_alive(KeepAlive::renew()))
        .await
        .unwrap();
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    // Keep-alive (a pipeline of EVALSHAs) must survive NOSCRIPT too.
    tokio::time::sleep(2 * SEC).await;
    assert!(g.is_held(), "keep-alive failed after SCRIPT FLUSH");
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(g.release().await.unwrap(), Released::Released);
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    basic_round(&c, "after-flush").await;
    let info = c.inspect(&LockName::new(&name).unwrap()).await.unwrap();
    assert!(info.is_some_and(|i| !i.is_held()));
}

/// The connect-time probe reads the four persistence settings (one pipeline on a single
/// server) and judges them: no persistence (the kit's server) is conditional on persistence; a
/// user whose ACL refuses `CONFIG` still locks, conditional on what could not be checked; a
/// server that fsyncs every write and evicts nothing is strict, each setting asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_judges_persistence() {
    let redis = Redis::start().await.expect("kit redis");
    let plain = backend_redis::connect(&redis.url()).await.unwrap();
    assert_eq!(
        plain.capabilities().fencing,
        Fencing::Conditional {
            assumption: backend_redis::ASSUMPTION_NO_PERSISTENCE
        }
    );

    let password = format!(">{PASSWORD}");
    let user = ["ACL", "SETUSER", "noconfig", "on", &password, "~*", "&*"];
    ok(&redis, &[&user[..], &["+@all", "-config"]].concat()).await;
    let port = redis.port();
    let url = format!("redis://noconfig:{PASSWORD}@127.0.0.1:{port}");
    let blind = backend_redis::connect(&url)
        .await
        .expect("connects without CONFIG");
    assert_eq!(
        blind.capabilities().fencing,
        Fencing::Conditional {
            assumption: backend_redis::ASSUMPTION_UNKNOWN
        }
    );
    basic_round(&blind, "noconfig").await;

    ok(&redis, &["CONFIG", "SET", "appendonly", "yes"]).await;
    ok(&redis, &["CONFIG", "SET", "appendfsync", "always"]).await;
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    let durable = backend_redis::connect(&redis.url()).await.unwrap();
    assert_eq!(durable.capabilities().fencing, Fencing::Strict);
    assert_eq!(redis.calls("config|get").await.unwrap(), 4);
}

/// A script the server does not know (after a restart or `SCRIPT FLUSH`) is loaded with
/// `SCRIPT LOAD` (never `EVAL`, whose cached scripts Redis 8 evicts) once, however many calls
/// of it met `NOSCRIPT`: a pipeline of 20 renewals that all met it loads the script once and
/// sends the 20 again behind the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_loads_each_script_once() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    basic_round(&c, "first-load").await;
    let loads = redis.calls("script|load").await.unwrap();
    // The round runs a lock, a refused try and a release: two or three scripts.
    assert!(
        (2..=3).contains(&loads),
        "{loads} SCRIPT LOADs for one round"
    );
    assert_eq!(redis.calls("eval").await.unwrap(), 0);

    let keep = AcquireOptions::new()
        .ttl(3 * SEC)
        .keep_alive(KeepAlive::renew());
    let mut guards = Vec::new();
    for i in 0..20 {
        let name = unique(&format!("batch-{i}"));
        guards.push(c.lock(&name, &keep).await.expect("acquire"));
    }
    ok(&redis, &["SCRIPT", "FLUSH"]).await;
    ok(&redis, &["CONFIG", "RESETSTAT"]).await;
    // Renewals are due a third of the ttl after each grant; after 2.5 s every lease has been
    // renewed at least once, through the flushed cache.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        guards.iter().all(|g| g.is_held()),
        "a renewal failed after SCRIPT FLUSH"
    );
    assert!(redis.calls("evalsha").await.unwrap() >= 40);
    assert_eq!(
        redis.calls("script|load").await.unwrap(),
        1,
        "one script, loaded once"
    );
    assert_eq!(redis.calls("eval").await.unwrap(), 0);
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Released);
    }
}

/// A release wakes the head waiter's client only: with B and C queued behind A, A's release
/// sends one message, to B; C hears nothing until B releases and C is the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_head_waiters_client() {
    let redis = shared().await;
    wakes_only_the_head(&redis.url(), &[redis], None).await;
}

/// In a Redis 7 Cluster the same, on shard channels: each waiter's client subscribes a channel
/// in the lock's own slot on the node serving it (`SSUBSCRIBE`), and no node holds a plain
/// wake-up subscription, so a release's message never crosses the cluster bus (whose
/// outgoing links Redis 7.0 opens without `TCP_NODELAY`, delaying messages up to 40 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wakes_the_head_on_a_shard_channel_of_the_locks_node() {
    let cluster = RedisCluster::shared().await.expect("kit cluster");
    let nodes: Vec<&Redis> = cluster.nodes().iter().collect();
    wakes_only_the_head(&cluster.url(), &nodes, Some(cluster)).await;
}

/// How many channels `PUBSUB <what> <pattern>` lists on `node`.
async fn pubsub_count(node: &Redis, what: &str, pattern: &str) -> usize {
    match node.command(&["PUBSUB", what, pattern]).await {
        Ok(RedisReply::Array(Some(items))) => items.len(),
        other => panic!("PUBSUB {what}: {other:?}"),
    }
}

/// The wake-head case on `url` (served by `nodes`; `cluster` when it is one).
async fn wakes_only_the_head(url: &str, nodes: &[&Redis], cluster: Option<&RedisCluster>) {
    let prefix = format!("wake{:08x}", rand::random::<u32>());
    let url = format!("{url}?prefix={prefix}");
    let config = RedisConfig::parse(&url).unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(RedisLock::connect(&config).await.expect("client")));
    }
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let dyn_of = |l: &Arc<RedisLock>| -> Arc<dyn DistributedLock> { l.clone() };
    let name = unique("wake-head");
    let lock_name = LockName::new(&name).unwrap();
    // Where the waiters' channels must be: the plain `<prefix>:wake:<client>` on a single
    // server; in a Cluster the shard channels `{<prefix>:<name>}:wake:<client>` on the node
    // serving the lock's slot.
    let tag = format!("{{{prefix}:{}}}", lock_name.escaped());
    let (owner, plain_pattern, shard_pattern) = match cluster {
        None => (nodes[0], format!("{prefix}:wake:*"), None),
        Some(cluster) => {
            let slot = match nodes[0]
                .command(&["CLUSTER", "KEYSLOT", &format!("{tag}:lock")])
                .await
                .expect("keyslot")
            {
                RedisReply::Integer(s) => u16::try_from(s).expect("slot"),
                other => panic!("CLUSTER KEYSLOT: {other:?}"),
            };
            let owner = nodes[cluster.node_for_slot(slot)];
            (
                owner,
                format!("{prefix}:wake:*"),
                Some(format!("{tag}:wake:*")),
            )
        }
    };
    let ga = dyn_of(a)
        .lock(&name, &opts(30 * SEC))
        .await
        .expect("a holds");
    let wait = |who: &Arc<RedisLock>| {
        let (who, name) = (dyn_of(who), name.clone());
        tokio::spawn(async move {
            who.lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    // Queued and subscribed, in this order, before anything is released.
    let queued = |n: usize, channels: usize| {
        let (a, lock_name) = (a.clone(), lock_name.clone());
        let (plain, shard) = (plain_pattern.clone(), shard_pattern.clone());
        async move {
            within(30 * SEC, "waiters queued and subscribed", async {
                loop {
                    let waiters = a.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters);
                    let subscribed = match &shard {
                        None => pubsub_count(owner, "CHANNELS", &plain).await,
                        Some(shard) => pubsub_count(owner, "SHARDCHANNELS", shard).await,
                    };
                    if waiters == Some(n) && subscribed == channels {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
        }
    };
    let b_task = wait(b);
    queued(1, 1).await;
    let c_task = wait(c);
    queued(2, 2).await;
    if cluster.is_some() {
        for node in nodes {
            assert_eq!(
                pubsub_count(node, "CHANNELS", &plain_pattern).await,
                0,
                "a plain wake-up channel is subscribed on {}",
                node.port()
            );
        }
    }

    ga.release().await.expect("a releases");
    let gb = within(30 * SEC, "b takes over", b_task)
        .await
        .expect("task")
        .expect("b acquires");
    assert_eq!(b.stats().wakeups, 1, "the head's client is told once");
    assert_eq!(c.stats().wakeups, 0, "a waiter behind the head is not told");
    assert!(!c_task.is_finished());

    gb.release().await.expect("b releases");
    let gc = within(30 * SEC, "c takes over", c_task)
        .await
        .expect("task")
        .expect("c acquires");
    assert_eq!(c.stats().wakeups, 1);
    assert_eq!(b.stats().wakeups, 1, "b no longer waits");
    assert_eq!(a.stats().wakeups, 0, "a never waited");
    gc.release().await.expect("c releases");
}

/// Many leases with keep-alive on one client are renewed in pipelines, not one round trip per
/// lease: the client's counters show far fewer pipelines than renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_pipelined() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let config = RedisConfig::parse(&url).unwrap();
        let lock = Arc::new(RedisLock::connect(&config).await.expect("client"));
        let c: Arc<dyn DistributedLock> = lock.clone();
        let opts = AcquireOptions::new()
            .ttl(3 * SEC)
            .keep_alive(KeepAlive::renew())
            .wait(Wait::No);
        let base = unique("pipelined");
        let mut guards = Vec::new();
        for i in 0..200 {
            guards.push(
                c.lock(&format!("{base}/{i}"), &opts)
                    .await
                    .expect("acquire"),
            );
        }
        tokio::time::sleep(4 * SEC).await;
        for g in &guards {
            assert!(g.is_held(), "{url}: keep-alive let a lease go");
        }
        let stats = lock.stats();
        eprintln!("{url}: {stats:?}");
        assert!(stats.renewals >= 600, "{url}: {stats:?}");
        assert_eq!(stats.renewals_lost, 0, "{url}: {stats:?}");
        assert!(
            stats.renewal_batches * 50 <= stats.renewals,
            "{url}: renewals were not batched: {stats:?}"
        );
        if !url.starts_with("redis+cluster") {
            assert!(
                stats.renewal_pipelines * 20 <= stats.renewals,
                "{url}: {stats:?}"
            );
        }
        for g in guards {
            g.release().await.expect("release");
        }
    }
}

/// `inspect` reports holder, token, remaining time and live waiters; capabilities are as
/// documented for a server without persistence and for a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_capabilities() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let caps = c.capabilities();
    assert_eq!(caps.backend, "redis");
    assert!(matches!(caps.fencing, Fencing::Conditional { .. }));
    assert_eq!(caps.fairness, lockcore::Fairness::Fifo);
    assert_eq!(caps.waiting, lockcore::WaitMechanism::PubSub);
    assert_eq!(caps.expiry, lockcore::Expiry::Ttl);
    let cluster = backend_redis::connect(&RedisCluster::shared().await.unwrap().url())
        .await
        .unwrap();
    assert!(matches!(
        cluster.capabilities().fencing,
        Fencing::Conditional { assumption } if assumption.contains("failover")
    ));

    let name = unique("inspect");
    let lock_name = LockName::new(&name).unwrap();
    assert_eq!(c.inspect(&lock_name).await.unwrap(), None, "never seen");
    let g = c.lock(&name, &opts(20 * SEC)).await.unwrap();
    let info = c.inspect(&lock_name).await.unwrap().expect("seen");
    assert_eq!(info.holder, Some(g.lease().owner().to_string()));
    assert_eq!(info.token, Some(g.fencing_token()));
    let left = info.remaining.expect("remaining");
    assert!(left > 10 * SEC && left <= 20 * SEC, "{left:?}");
    assert_eq!(info.waiters, Some(0));
    let token = g.fencing_token();
    g.release().await.unwrap();
    let info = c.inspect(&lock_name).await.unwrap().expect("seen");
    assert!(!info.is_held());
    assert_eq!(info.remaining, None);
    assert_eq!(
        info.token,
        Some(token),
        "a free lock reports its last token"
    );
}

// ---- Counting semaphores ----

/// Options for a permit: no keep-alive, the given ttl, waiting up to 30 s.
fn permit_opts(ttl: Duration) -> AcquireOptions {
    opts(ttl)
}

/// The keys of the semaphore `name` under prefix `dlock`: holders, queue, alive, fence, count.
fn sem_keys(name: &str) -> [String; 5] {
    let esc = LockName::new(name).unwrap().escaped();
    ["holders", "queue", "alive", "fence", "permits"].map(|k| format!("{{dlock:{esc}}}:sem:{k}"))
}

/// The members of a ZSET (or nothing when it does not exist).
async fn members(redis: &Redis, key: &str) -> Vec<String> {
    match redis.command(&["ZRANGE", key, "0", "-1"]).await.unwrap() {
        RedisReply::Array(Some(items)) => items.iter().filter_map(|i| i.as_text()).collect(),
        other => panic!("ZRANGE {key}: {other:?}"),
    }
}

/// Polls `check` until it holds (the waits here end on events, never on a timed assertion;
/// the limit only turns a hang into a failure).
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(30 * SEC, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// A Redis ACL user allowed only pub/sub (no key, no script) sees the wake-up channels and
/// publishes forged permit hand-overs on each while a holder holds the only permit and three
/// waiters queue (each in a client of its own, as processes are): for every waiter, every token
/// the semaphore could have given, in the form a hand-over had before it was tagged and with
/// tags of its own. No waiter takes one for a permit: after the holder's release the permits go
/// to the waiters in queue order with increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_permit_hand_overs_grant_nothing() {
    let redis = shared().await;
    let user = format!("mallory{:08x}", rand::random::<u32>());
    let acl = ["ACL", "SETUSER", &user, "on", &format!(">{PASSWORD}")];
    ok(
        redis,
        &[&acl[..], &["resetchannels", "&*", "-@all", "+@pubsub"]].concat(),
    )
    .await;
    let name = unique("forged-permits");
    let lock_name = LockName::new(&name).expect("name");
    let holder = backend_redis::connect(&redis.url()).await.expect("holder");
    let sem = holder.semaphore(&name, 1).expect("semaphore");
    let held = sem.acquire(&permit_opts(60 * SEC)).await.expect("free");
    let owners = [(); 3].map(|_| lockcore::OwnerId::random());
    let mut tasks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let c = backend_redis::connect(&redis.url()).await.expect("waiter");
        let sem = c.semaphore(&name, 1).expect("semaphore");
        let opts = permit_opts(60 * SEC)
            .wait(Wait::For(60 * SEC))
            .owner(*owner);
        tasks.push(tokio::spawn(async move { sem.acquire(&opts).await }));
        until("the waiter queued", || async {
            let info = holder.inspect_semaphore(&lock_name).await.unwrap();
            info.and_then(|i| i.waiters) == Some(i + 1)
        })
        .await;
    }

    let attacker = redis::Client::open(format!(
        "redis://{user}:{PASSWORD}@127.0.0.1:{}",
        redis.port()
    ))
    .expect("url")
    .get_multiplexed_async_connection()
    .await
    .expect("the user connects");
    let mut con = attacker.clone();
    let read: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg("dlock").query_async(&mut con).await;
    let refused = read.expect_err("the user can read keys").to_string();
    assert!(refused.to_lowercase().contains("permission"), "{refused}");
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query_async(&mut con)
        .await
        .expect("PUBSUB CHANNELS");
    assert!(channels.len() >= 3, "the waiters' channels: {channels:?}");
    let mut forged = redis::pipe();
    for channel in &channels {
        for owner in owners {
            for token in 1..=50 {
                let tag = format!("{:040x}", rand::random::<u128>());
                for message in [
                    format!("{owner}:{token}"),
                    format!("{owner}:{token}:{}", "0".repeat(40)),
                    format!("{owner}:{token}:{tag}"),
                ] {
                    forged.cmd("PUBLISH").arg(channel).arg(message).ignore();
                }
            }
        }
    }
    let () = forged
        .query_async(&mut con)
        .await
        .expect("the user publishes");
    // The server sent every message out before it answers a command sent after them.
    let _: i64 = redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query_async(&mut con)
        .await
        .expect("PUBSUB NUMPAT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (owner, task) in owners.iter().zip(&tasks) {
        assert!(!task.is_finished(), "waiter {owner} took a forged permit");
    }

    held.release().await.expect("release");
    let mut last = FencingToken(0);
    for (owner, task) in owners.iter().zip(tasks) {
        let permit = within(30 * SEC, "a waiter's permit", task)
            .await
            .expect("task")
            .expect("acquire");
        assert_eq!(permit.lease().owner(), *owner, "granted out of queue order");
        assert!(
            permit.fencing_token() > last,
            "tokens went {last} then {}",
            permit.fencing_token()
        );
        last = permit.fencing_token();
        permit.release().await.expect("release");
    }
}

/// A semaphore and the lock of the same name are two objects, on a single server and in a
/// Cluster: all permits held, the lock is free (and the other way round); the lock's queue does
/// not see the semaphore's waiters; the semaphore's tokens are its own sequence. On a single
/// server the keys are checked too: `{dlock:<name>}:sem:*`, the permits as `<owner>:<token>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_the_lock_of_its_name_are_apart() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let c = backend_redis::connect(&url).await.expect("client");
        assert!(c.capabilities().native.semaphore, "{url}");
        let name = unique("sem-apart");
        let lock_name = LockName::new(&name).unwrap();
        let sem = c.semaphore(&name, 2).expect("semaphore");
        let p1 = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit 1");
        let p2 = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit 2");
        assert!(p2.fencing_token() > p1.fencing_token(), "{url}");
        assert!(
            sem.try_acquire(&permit_opts(30 * SEC))
                .await
                .unwrap()
                .is_none(),
            "{url}: a third permit of two"
        );
        // Every permit is held, and the lock of the name is free.
        let lock = c
            .try_lock(&name, &opts(30 * SEC))
            .await
            .expect("try lock")
            .expect("the lock is not excluded by the semaphore");
        assert_eq!(
            lock.fencing_token(),
            FencingToken(1),
            "{url}: the lock's own counter"
        );

        // A permit waiter queues with the semaphore only.
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire(&permit_opts(30 * SEC)).await })
        };
        until("the permit waiter queued", || async {
            let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
            info.waiters == Some(1)
        })
        .await;
        let lock_info = c.inspect(&lock_name).await.unwrap().expect("lock seen");
        assert_eq!(
            lock_info.waiters,
            Some(0),
            "{url}: the lock's queue saw a permit waiter"
        );
        assert_eq!(lock_info.holder, Some(lock.lease().owner().to_string()));

        // Releasing the lock wakes no permit waiter; releasing a permit does.
        lock.release().await.expect("release lock");
        p1.release().await.expect("release permit 1");
        let p3 = within(30 * SEC, "the waiter gets the freed permit", waiter)
            .await
            .expect("task")
            .expect("permit 3");
        assert!(p3.fencing_token() > p2.fencing_token(), "{url}");
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert_eq!(info.permits, Some(2));
        assert_eq!(info.waiters, Some(0));
        let holders: Vec<_> = info.holders.iter().map(|h| h.token).collect();
        assert_eq!(holders, [p2.fencing_token(), p3.fencing_token()], "{url}");

        if !url.starts_with("redis+cluster") {
            let redis = shared().await;
            let [holders, queue, _, fence, count] = sem_keys(&name);
            let mut expected = vec![
                format!("{}:{}", p2.lease().owner(), p2.fencing_token()),
                format!("{}:{}", p3.lease().owner(), p3.fencing_token()),
            ];
            expected.sort();
            let mut got = members(redis, &holders).await;
            got.sort();
            assert_eq!(got, expected);
            assert_eq!(
                redis.command(&["GET", &fence]).await.unwrap().as_text(),
                Some(p3.fencing_token().to_string()),
                "the semaphore's own counter"
            );
            assert_eq!(
                redis.command(&["GET", &count]).await.unwrap().as_text(),
                Some("2".to_owned())
            );
            assert_eq!(
                redis.command(&["EXISTS", &queue]).await.unwrap(),
                RedisReply::Integer(0)
            );
        }
        p2.release().await.expect("release 2");
        p3.release().await.expect("release 3");
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert!(info.holders.is_empty());
        assert_eq!(info.permits, None, "an idle semaphore binds no count");
        assert!(c.forget(&lock_name).await.unwrap());
        assert_eq!(c.inspect_semaphore(&lock_name).await.unwrap(), None);
    }
}

/// While a semaphore is in use (a live permit or a queued waiter) another count is refused with
/// `InvalidArgument`, by a try and by a wait, and changes nothing; once idle, the next caller's
/// count is the semaphore's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_count_is_refused_while_in_use_and_taken_once_idle() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-count");
    let lock_name = LockName::new(&name).unwrap();
    let one = c.semaphore(&name, 1).unwrap();
    let three = c.semaphore(&name, 3).unwrap();
    let held = one.acquire(&permit_opts(30 * SEC)).await.expect("permit");
    let refused = |r: lockcore::Result<Option<lockcore::PermitGuard>>| match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    refused(three.try_acquire(&permit_opts(30 * SEC)).await);
    refused(three.acquire(&permit_opts(30 * SEC)).await.map(Some));
    // A waiter with the recorded count keeps the semaphore in use after the holder leaves.
    let waiter = {
        let one = one.clone();
        tokio::spawn(async move { one.acquire(&permit_opts(30 * SEC)).await })
    };
    until("the waiter queued", || async {
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.permits, Some(1));
    held.release().await.unwrap();
    let second = within(30 * SEC, "the waiter's permit", waiter)
        .await
        .unwrap()
        .expect("waiter");
    refused(three.try_acquire(&permit_opts(30 * SEC)).await);
    second.release().await.unwrap();
    // Idle: the next caller's count is the semaphore's.
    let a = three
        .acquire(&permit_opts(30 * SEC))
        .await
        .expect("count 3 once idle");
    let b = three
        .acquire(&permit_opts(30 * SEC))
        .await
        .expect("second of three");
    refused(one.try_acquire(&permit_opts(30 * SEC)).await);
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.permits, Some(3));
    assert_eq!(info.holders.len(), 2);
    a.release().await.unwrap();
    b.release().await.unwrap();
}

/// Each grant's token is above every earlier one of the semaphore, across release and across
/// a permit that ran out (freed by the server's clock, with no release); an expired permit's
/// lease can neither be extended nor released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_tokens_increase_across_release_and_expiry() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-tokens");
    let lock_name = LockName::new(&name).unwrap();
    let sem = c.semaphore(&name, 1).unwrap();
    let mut last = FencingToken(0);
    for round in 0..3 {
        let p = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
        assert!(p.fencing_token() > last, "round {round}");
        last = p.fencing_token();
        p.release().await.expect("release");

        // A short permit that is never released: the next one comes once it ran out.
        let short = sem
            .acquire(&permit_opts(Duration::from_millis(200)))
            .await
            .expect("short permit");
        assert!(short.fencing_token() > last);
        last = short.fencing_token();
        let lease = short.lease();
        std::mem::forget(short);
        let next = sem
            .acquire(&permit_opts(30 * SEC))
            .await
            .expect("the permit after the expired one");
        assert!(next.fencing_token() > last, "round {round}");
        last = next.fencing_token();
        assert!(matches!(
            c.extend(&lease, 10 * SEC).await,
            Err(Error::LockLost { .. })
        ));
        assert_eq!(c.release(&lease).await.unwrap(), Released::NotHeld);
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert_eq!(info.holders.len(), 1, "the expired permit is not reported");
        assert_eq!(info.holders[0].token, next.fencing_token());
        next.release().await.unwrap();
    }
}

/// Release and extend of a permit are owner- and token-checked: another owner's lease, a lease
/// with the right owner but another token, a released (stale) lease, and a lock's lease with the
/// permit's owner and token all free nothing and extend nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_release_and_extend_are_owner_checked() {
    let c = backend_redis::connect(&shared().await.url()).await.unwrap();
    let name = unique("sem-owner");
    let lock_name = LockName::new(&name).unwrap();
    let sem = c.semaphore(&name, 2).unwrap();
    let p = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
    let real = p.lease();
    assert_eq!(real.handle(), Some(backend_redis::node::PERMIT));
    let forged = |owner: lockcore::OwnerId, token: FencingToken| {
        lockcore::Lease::new(
            lock_name.clone(),
            owner,
            token,
            std::time::Instant::now(),
            30 * SEC,
            Duration::from_millis(2),
        )
    };
    let permit = |l: lockcore::Lease| l.with_handle(backend_redis::node::PERMIT);
    let other_owner = permit(forged(lockcore::OwnerId::random(), real.token()));
    let other_token = permit(forged(real.owner(), FencingToken(real.token().0 + 1)));
    let as_lock = forged(real.owner(), real.token());
    for lease in [&other_owner, &other_token, &as_lock] {
        assert_eq!(
            c.release(lease).await.unwrap(),
            Released::NotHeld,
            "{lease:?}"
        );
        assert!(
            matches!(c.extend(lease, 60 * SEC).await, Err(Error::LockLost { .. })),
            "{lease:?}"
        );
    }
    let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1, "the permit is still held");
    assert_eq!(info.holders[0].owner, real.owner().to_string());
    assert!(info.holders[0].remaining.unwrap() <= 30 * SEC);
    // The real lease extends and releases; then it is stale.
    let extended = c.extend(&real, 60 * SEC).await.expect("extend");
    assert_eq!(extended.token(), real.token());
    assert!(
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .holders[0]
            .remaining
            .unwrap()
            > 30 * SEC
    );
    assert_eq!(c.release(&real).await.unwrap(), Released::Released);
    let again = sem.acquire(&permit_opts(30 * SEC)).await.expect("again");
    assert_eq!(c.release(&real).await.unwrap(), Released::NotHeld, "stale");
    assert!(matches!(
        c.extend(&real, 60 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    assert_eq!(
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .holders
            .len(),
        1
    );
    drop(p);
    again.release().await.unwrap();
}

/// A waiting permit acquire that is dropped (its task aborted) leaves no queue entry and no
/// permit: whether it was still queued, or the freed permit was granted to it just as it was
/// dropped, the clean-up it armed removes what it had. Checked on the keys themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_wait_leaves_no_entry_and_no_permit() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    for round in 0..6 {
        let name = unique("sem-dropped");
        let lock_name = LockName::new(&name).unwrap();
        let [holders, queue, alive, _, _] = sem_keys(&name);
        let sem = c.semaphore(&name, 1).unwrap();
        let held = sem.acquire(&permit_opts(30 * SEC)).await.expect("permit");
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire(&permit_opts(30 * SEC)).await })
        };
        until("the waiter queued", || async {
            members(redis, &queue).await.len() == 1
        })
        .await;
        if round % 2 == 1 {
            // Free the permit first: the waiter may be granted just as it is dropped.
            held.release().await.unwrap();
            tokio::task::yield_now().await;
            waiter.abort();
        } else {
            waiter.abort();
            held.release().await.unwrap();
        }
        let _ = waiter.await;
        until("the clean-up ran", || async {
            members(redis, &queue).await.is_empty()
                && members(redis, &alive).await.is_empty()
                && members(redis, &holders).await.is_empty()
        })
        .await;
        let info = c.inspect_semaphore(&lock_name).await.unwrap().unwrap();
        assert!(info.holders.is_empty(), "round {round}: {info:?}");
        assert_eq!(info.waiters, Some(0), "round {round}");
    }
}

/// One node of this crate on the kit's `redis`, for the tests that call its primitives.
fn node_of(redis: &Redis) -> backend_redis::node::Node {
    let config = RedisConfig::parse(&redis.url()).unwrap();
    backend_redis::node::Node::open(&config, "127.0.0.1", redis.port(), false, "test").unwrap()
}

/// The node's clean-up of a permit acquire frees a permit granted to that owner (the case of a
/// reply lost with its request) and wakes the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_permit_grant_is_freed() {
    let node = node_of(shared().await);
    let name = LockName::new(unique("sem-cancel")).unwrap();
    let owner = lockcore::OwnerId::random();
    let o = opts(30 * SEC);
    let (node_ref, name_ref, o_ref) = (&node, &name, &o);
    let try_permit = |who| async move {
        let try_mode = backend_redis::node::Mode::Try;
        node_ref
            .acquire_permit(name_ref, who, o_ref, try_mode, 0, 1, false)
            .await
            .unwrap()
    };
    let granted = try_permit(owner).await;
    assert!(matches!(
        granted,
        AttemptReply::Now(AcquireReply::Granted(_))
    ));
    let other = lockcore::OwnerId::random();
    let refused = try_permit(other).await;
    assert!(matches!(
        refused,
        AttemptReply::Now(AcquireReply::Waiting { .. })
    ));
    assert!(
        !node.cancel_permit(&name, other).await.unwrap(),
        "held nothing"
    );
    assert!(node.cancel_permit(&name, owner).await.unwrap(), "freed");
    let reply = node.inspect_semaphore(&name).await.unwrap();
    assert!(reply.holders.is_empty());
    let again = try_permit(other).await;
    assert!(matches!(again, AttemptReply::Now(AcquireReply::Granted(2))));
}

/// A permit's release hands the free permit to the head waiter in the same script: the waiter
/// is told its token through the hub and holds without another request; an attempt it sends
/// meanwhile (a message it missed) is answered with the same handed permit; a waiter that
/// never said it queued is not answered so; the handed permit's lease runs out no later than
/// the waiter's last queued attempt plus the ttl, and its token respects the waiter's floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_hands_the_permit_to_the_head_waiter() {
    use backend_redis::node::Mode;
    let node = node_of(shared().await);
    let name = LockName::new(unique("sem-hand")).unwrap();
    let o = opts(30 * SEC);
    let (holder, waiter) = (lockcore::OwnerId::random(), lockcore::OwnerId::random());
    let Ok(AttemptReply::Now(AcquireReply::Granted(first))) = node
        .acquire_permit(&name, holder, &o, Mode::Try, 0, 1, false)
        .await
    else {
        panic!("the free permit is granted");
    };
    let (registration, _) = node.register(&waiter.to_string(), &name);
    node.ensure_subscribed(&name).await.unwrap();
    let queued_at = std::time::Instant::now();
    // The waiter's token floor (a `dual://` migration's) binds the permit handed to it too.
    let floor = first + 500;
    let queued = node
        .acquire_permit(&name, waiter, &o, Mode::Wait, floor, 1, false)
        .await
        .unwrap();
    assert!(
        matches!(
            queued,
            AttemptReply::Now(AcquireReply::Waiting { rank: 0, .. })
        ),
        "{queued:?}"
    );
    assert_eq!(registration.handed(), None, "nothing handed yet");
    let lease = backend_redis::node::lease(&name, holder, first, queued_at, &o)
        .with_handle(backend_redis::node::PERMIT);
    assert!(node.release(&lease).await.unwrap(), "released");
    tokio::time::timeout(30 * SEC, registration.notified())
        .await
        .expect("the waiter is told");
    assert_eq!(
        registration.handed(),
        Some(floor),
        "the message carries the handed token"
    );
    let state = node.inspect_semaphore(&name).await.unwrap();
    assert_eq!(state.queued, 0, "the waiter left the queue: {state:?}");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].owner, waiter.to_string());
    assert_eq!(state.holders[0].token, floor);
    assert!(
        state.holders[0].remaining_ms <= 30_000,
        "no longer than the ttl from the waiter's queued attempt: {state:?}"
    );
    // A queued owner's next attempt finds the permit handed to it; the same attempt without
    // `queued` would queue again instead.
    let again = node
        .acquire_permit(&name, waiter, &o, Mode::Wait, floor, 1, true)
        .await
        .unwrap();
    assert_eq!(again, AttemptReply::Handed(floor));
    let third = lockcore::OwnerId::random();
    let other = node
        .acquire_permit(&name, third, &o, Mode::Wait, 0, 1, true)
        .await
        .unwrap();
    assert!(
        matches!(other, AttemptReply::Now(AcquireReply::Waiting { .. })),
        "a permit handed to another owner is not this one's: {other:?}"
    );
    assert!(
        !node.cancel_permit(&name, third).await.unwrap(),
        "the third owner held nothing"
    );
    assert!(
        node.cancel_permit(&name, waiter).await.unwrap(),
        "the undo of the waiter's acquire frees the handed permit"
    );
    assert!(node.forget(&name).await.unwrap(), "nothing is left in use");
}

/// `forget` forgets an idle semaphore (its counter and count too), not one in use; the lock
/// and the semaphore of a name are forgotten each on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_takes_an_idle_semaphore_only() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("sem-forget");
    let lock_name = LockName::new(&name).unwrap();
    let [holders, _, _, fence, count] = sem_keys(&name);
    let sem = c.semaphore(&name, 2).unwrap();
    let p = sem.acquire(&permit_opts(30 * SEC)).await.unwrap();
    assert!(!c.forget(&lock_name).await.unwrap(), "a permit is held");
    assert_eq!(members(redis, &holders).await.len(), 1);
    // The lock held, the semaphore idle: the semaphore goes, the lock stays.
    p.release().await.unwrap();
    let lock = c.lock(&name, &opts(30 * SEC)).await.unwrap();
    assert!(!c.forget(&lock_name).await.unwrap(), "the lock is held");
    for key in [&fence, &count] {
        assert_eq!(
            redis.command(&["EXISTS", key]).await.unwrap(),
            RedisReply::Integer(0),
            "{key}"
        );
    }
    assert_eq!(c.inspect_semaphore(&lock_name).await.unwrap(), None);
    assert!(c.inspect(&lock_name).await.unwrap().unwrap().is_held());
    lock.release().await.unwrap();
    assert!(c.forget(&lock_name).await.unwrap());
    assert_eq!(c.inspect(&lock_name).await.unwrap(), None);
}

/// Keep-alive batches hold locks and permits together: one `extend_many` renews both kinds (in
/// one pipeline on a single server, per master in a Cluster), each with its own script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_permits_renew_in_one_batch() {
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let c = backend_redis::connect(&url).await.unwrap();
        let base = unique("sem-batch");
        let mut leases = Vec::new();
        let mut guards = Vec::new();
        for i in 0..20 {
            let name = format!("{base}/{i}");
            let g = c.lock(&name, &opts(30 * SEC)).await.unwrap();
            leases.push((g.lease(), 60 * SEC));
            guards.push(g);
            let p = c
                .semaphore(&name, 3)
                .unwrap()
                .acquire(&opts(30 * SEC))
                .await
                .unwrap();
            leases.push((p.lease(), 60 * SEC));
            guards.push(p.into_inner());
        }
        let renewed = c.extend_many(&leases).await;
        for ((lease, _), r) in leases.iter().zip(&renewed) {
            let r = r
                .as_ref()
                .unwrap_or_else(|e| panic!("{url}: {lease:?}: {e}"));
            assert_eq!(r.token(), lease.token());
            assert_eq!(r.handle(), lease.handle());
        }
        let name = LockName::new(format!("{base}/0")).unwrap();
        let info = c.inspect_semaphore(&name).await.unwrap().unwrap();
        assert!(info.holders[0].remaining.unwrap() > 30 * SEC, "{url}");
        let info = c.inspect(&name).await.unwrap().unwrap();
        assert!(info.remaining.unwrap() > 30 * SEC, "{url}");
        for g in guards {
            assert_eq!(g.release().await.unwrap(), Released::Released, "{url}");
        }
    }
}

/// A token floor lifts a permit's token (on a try and on a queued waiter's grant) and the
/// semaphore's counter with it, so later permits are above the floor; the lock's counter is
/// not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_floor_lifts_permits() {
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("sem-floor");
    let lock_name = LockName::new(&name).unwrap();
    let [_, _, _, fence, _] = sem_keys(&name);
    let sem = c.semaphore(&name, 1).unwrap();
    let floored = |f: u64| permit_opts(30 * SEC).token_floor(FencingToken(f));
    let p = sem.try_acquire(&floored(700)).await.unwrap().expect("free");
    assert_eq!(p.fencing_token(), FencingToken(700));
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(&floored(900)).await })
    };
    until("the waiter queued", || async {
        c.inspect_semaphore(&lock_name)
            .await
            .unwrap()
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    p.release().await.unwrap();
    let q = within(30 * SEC, "the floored waiter", waiter)
        .await
        .unwrap()
        .expect("granted");
    assert_eq!(q.fencing_token(), FencingToken(900));
    q.release().await.unwrap();
    let r = sem.acquire(&permit_opts(30 * SEC)).await.unwrap();
    assert_eq!(r.fencing_token(), FencingToken(901));
    assert_eq!(
        redis.command(&["GET", &fence]).await.unwrap().as_text(),
        Some("901".to_owned())
    );
    assert_eq!(
        c.inspect(&lock_name).await.unwrap(),
        None,
        "the lock never seen"
    );
    r.release().await.unwrap();
}

// ---- Read-write locks ----

/// The server's clock in milliseconds (`TIME`), as the scripts read it.
async fn server_ms(redis: &Redis) -> u64 {
    match redis.command(&["TIME"]).await.unwrap() {
        RedisReply::Array(Some(items)) => {
            let s: u64 = items[0].as_text().unwrap().parse().unwrap();
            let us: u64 = items[1].as_text().unwrap().parse().unwrap();
            s * 1000 + us / 1000
        }
        other => panic!("TIME: {other:?}"),
    }
}

/// The keys of the lock `name` under prefix `dlock`: lock, fence, queue, shared (the readers).
fn rw_keys(name: &str) -> [String; 4] {
    let esc = LockName::new(name).unwrap().escaped();
    ["lock", "fence", "queue", "shared"].map(|k| format!("{{dlock:{esc}}}:{k}"))
}

/// Polls `inspect` until `n` live waiters are queued for `name`.
async fn queued(c: &Arc<dyn DistributedLock>, name: &str, n: usize) {
    let lock_name = LockName::new(name).unwrap();
    until("waiters queued", || async {
        c.inspect(&lock_name).await.unwrap().and_then(|i| i.waiters) == Some(n)
    })
    .await
}

/// The key layout of a read hold: `{dlock:<name>}:shared` holds `<owner>:<token>` per reader,
/// the tokens come from the lock's own fence counter, a queued reader's entry is marked `r`,
/// and `inspect` reports the oldest reader. The lock and the readers are one object: no write
/// lock while a reader holds, on a single server and in a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_share_the_locks_keys_and_counter() {
    use lockcore::ReadWriteExt;
    for url in [
        shared().await.url(),
        RedisCluster::shared().await.expect("kit cluster").url(),
    ] {
        let (a, b) = (
            backend_redis::connect(&url).await.unwrap(),
            backend_redis::connect(&url).await.unwrap(),
        );
        assert!(a.capabilities().native.read_write, "{url}");
        let name = unique("rw-layout");
        let lock_name = LockName::new(&name).unwrap();
        let w = a.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
        // A reader queues behind the writer.
        let reader = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { b.read_lock(&name, &opts(30 * SEC)).await })
        };
        queued(&a, &name, 1).await;
        if !url.starts_with("redis+cluster") {
            let [_, _, queue, _] = rw_keys(&name);
            let entries = members(shared().await, &queue).await;
            assert_eq!(entries.len(), 1, "{entries:?}");
            assert!(entries[0].ends_with('r'), "a reader's entry: {entries:?}");
            assert_eq!(entries[0].len(), 49, "{entries:?}");
        }
        let wt = w.fencing_token();
        w.release().await.expect("release writer");
        let r1 = within(30 * SEC, "the queued reader", reader)
            .await
            .expect("task")
            .expect("reader 1");
        let r2 = a.read_lock(&name, &opts(30 * SEC)).await.expect("reader 2");
        assert!(r1.fencing_token() > wt && r2.fencing_token() > r1.fencing_token());
        assert!(
            b.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
            "{url}: the exclusive lock while readers hold"
        );
        let info = a.inspect(&lock_name).await.unwrap().expect("seen");
        assert_eq!(info.holder, Some(r1.lease().owner().to_string()), "{url}");
        assert_eq!(info.token, Some(r1.fencing_token()), "{url}");
        assert!(info.remaining.is_some_and(|r| r > 10 * SEC), "{info:?}");
        assert!(
            info.details.iter().any(|d| d.contains("2 reader")),
            "{info:?}"
        );
        assert!(
            !a.forget(&lock_name).await.unwrap(),
            "{url}: forget took a read-locked name"
        );
        if !url.starts_with("redis+cluster") {
            let redis = shared().await;
            let [lock, fence, queue, readers] = rw_keys(&name);
            let mut got = members(redis, &readers).await;
            got.sort();
            let mut expected = vec![
                format!("{}:{}", r1.lease().owner(), r1.fencing_token()),
                format!("{}:{}", r2.lease().owner(), r2.fencing_token()),
            ];
            expected.sort();
            assert_eq!(got, expected);
            assert_eq!(
                redis.command(&["GET", &fence]).await.unwrap().as_text(),
                Some(r2.fencing_token().to_string()),
                "readers draw from the lock's counter"
            );
            assert_eq!(
                redis.command(&["EXISTS", &queue]).await.unwrap(),
                RedisReply::Integer(0)
            );
            assert_eq!(
                redis
                    .command(&["GET", &lock])
                    .await
                    .unwrap()
                    .as_text()
                    .as_deref(),
                Some("-"),
                "while readers hold, the lock key is reserved"
            );
        }
        let r2t = r2.fencing_token();
        assert_eq!(r1.release().await.unwrap(), Released::Released);
        assert_eq!(r2.release().await.unwrap(), Released::Released);
        if !url.starts_with("redis+cluster") {
            let [lock, ..] = rw_keys(&name);
            assert_eq!(
                shared().await.command(&["EXISTS", &lock]).await.unwrap(),
                RedisReply::Integer(0),
                "the last reader's release with nobody queued deletes the reserved key"
            );
        }
        let w = b
            .try_write_lock(&name, &opts(30 * SEC))
            .await
            .unwrap()
            .expect("the writer once the readers left");
        assert!(w.fencing_token() > r2t);
        w.release().await.unwrap();
        assert!(a.forget(&lock_name).await.unwrap(), "{url}");
    }
}

/// A reader that crashed (its hold recorded but expired by the server's clock, and the lock key
/// it reserved gone with it) does not block a writer, neither a `try` nor a queued writer behind
/// a reader that runs out without releasing. The ghost readers are written as a reader's grant
/// writes them: the member in `shared`, and the lock key RESERVED (`-`) for as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_reader_does_not_block_a_writer() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-expired");
    let [lock, _, _, readers] = rw_keys(&name);
    let ghost = format!("{}:7", "0".repeat(32));
    let past = (server_ms(redis).await - 1000).to_string();
    ok(redis, &["ZADD", &readers, &past, &ghost]).await;
    let w = c
        .try_write_lock(&name, &opts(30 * SEC))
        .await
        .unwrap()
        .expect("an expired reader does not hold");
    w.release().await.unwrap();

    // A live ghost reader that never releases: the writer queues, and gets in once the
    // reader's time is up (expiry publishes nothing; the writer looks again when it ends).
    let soon = (server_ms(redis).await + 1500).to_string();
    ok(redis, &["ZADD", &readers, &soon, &ghost]).await;
    ok(redis, &["SET", &lock, "-", "PX", "1500"]).await;
    assert!(
        c.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
        "the exclusive lock while a reader is live"
    );
    let w = within(
        30 * SEC,
        "the writer after the reader ran out",
        c.write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC))),
    )
    .await
    .expect("the writer gets in");
    assert_eq!(members(redis, &readers).await, Vec::<String>::new());
    w.release().await.unwrap();
}

/// Readers hold; a writer queues; a reader's `try` is refused while the writer waits, and a
/// waiting reader queues behind it. Releasing one reader does not wake the writer (another
/// still reads); the last reader's release does, and the writer gets in before the reader that
/// came after it, which gets in when the writer releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_readers_release_wakes_the_queued_writer() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let config = RedisConfig::parse(&redis.url()).unwrap();
    let writer_lock = Arc::new(RedisLock::connect(&config).await.unwrap());
    let writer: Arc<dyn DistributedLock> = writer_lock.clone();
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let late = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-wake");
    let r1 = c.read_lock(&name, &opts(30 * SEC)).await.expect("r1");
    let r2 = c.read_lock(&name, &opts(30 * SEC)).await.expect("r2");
    let w_task = {
        let (writer, name) = (writer.clone(), name.clone());
        tokio::spawn(async move {
            writer
                .write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 1).await;
    assert!(
        late.try_read_lock(&name, &opts(30 * SEC))
            .await
            .unwrap()
            .is_none(),
        "a reader's try jumped a queued writer"
    );
    let r_task = {
        let (late, name) = (late.clone(), name.clone());
        tokio::spawn(async move {
            late.read_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 2).await;

    assert_eq!(r1.release().await.unwrap(), Released::Released);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!w_task.is_finished(), "the writer got in beside a reader");
    assert_eq!(
        writer_lock.stats().wakeups,
        0,
        "a reader's release that leaves another reader woke the writer"
    );
    let r2t = r2.fencing_token();
    assert_eq!(r2.release().await.unwrap(), Released::Released);
    let w = within(30 * SEC, "the writer after the last reader", w_task)
        .await
        .expect("task")
        .expect("the writer");
    assert!(
        writer_lock.stats().wakeups >= 1,
        "the last reader's release wakes the writer"
    );
    assert!(w.fencing_token() > r2t);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !r_task.is_finished(),
        "the late reader got in beside the writer"
    );
    let wt = w.fencing_token();
    w.release().await.unwrap();
    let r3 = within(30 * SEC, "the late reader after the writer", r_task)
        .await
        .expect("task")
        .expect("the late reader");
    assert!(r3.fencing_token() > wt);
    r3.release().await.unwrap();
}

/// A run of readers queued behind a writer gets in together when the writer releases: all hold
/// at once, none has released yet; a writer queued after them waits for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_queued_readers_gets_in_together() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-run");
    let w = c.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
    let mut tasks = Vec::new();
    for i in 0..3 {
        let r = backend_redis::connect(&redis.url()).await.unwrap();
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            r.read_lock(&n, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        }));
        queued(&c, &name, i + 1).await;
    }
    let w2_task = {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move {
            c.write_lock(&name, &opts(30 * SEC).wait(Wait::For(60 * SEC)))
                .await
        })
    };
    queued(&c, &name, 4).await;
    w.release().await.unwrap();
    let mut readers = Vec::new();
    for t in tasks {
        readers.push(
            within(30 * SEC, "a queued reader", t)
                .await
                .expect("task")
                .expect("reader"),
        );
    }
    let info = c
        .inspect(&LockName::new(&name).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        info.details.iter().any(|d| d.contains("3 reader")),
        "{info:?}"
    );
    assert_eq!(info.waiters, Some(1), "the second writer still waits");
    assert!(!w2_task.is_finished());
    for r in readers {
        r.release().await.unwrap();
    }
    let w2 = within(30 * SEC, "the second writer", w2_task)
        .await
        .expect("task")
        .expect("writer 2");
    w2.release().await.unwrap();
}

/// A reader's wait dropped while queued leaves no queue entry behind, and the writer behind it
/// is not held up; a read lease is owner-checked on release and extend like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_leases_are_owner_checked_and_dropped_waits_leave_nothing() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    let name = unique("rw-drop");
    let lock_name = LockName::new(&name).unwrap();
    let [_, _, queue, readers] = rw_keys(&name);
    let w = c.write_lock(&name, &opts(30 * SEC)).await.expect("writer");
    let reader = {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move { c.read_lock(&name, &opts(30 * SEC)).await })
    };
    queued(&c, &name, 1).await;
    reader.abort();
    let _ = reader.await;
    until("the dropped reader left the queue", || async {
        members(redis, &queue).await.is_empty()
    })
    .await;
    w.release().await.unwrap();

    let lease = c
        .try_acquire_shared(&lock_name, &opts(30 * SEC))
        .await
        .unwrap()
        .expect("a free name");
    assert_eq!(lease.handle(), Some(backend_redis::node::READER));
    let renewed = c.extend(&lease, 20 * SEC).await.expect("extend a reader");
    assert_eq!(renewed.token(), lease.token());
    // Another owner's lease with the same token, and the reader's own lease as an exclusive
    // one (no handle), free nothing.
    let forged = lockcore::Lease::new(
        lock_name.clone(),
        lockcore::OwnerId(1),
        lease.token(),
        std::time::Instant::now(),
        30 * SEC,
        Duration::ZERO,
    )
    .with_handle(backend_redis::node::READER);
    assert_eq!(c.release(&forged).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&forged, 20 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    let as_lock = lockcore::Lease::new(
        lock_name.clone(),
        lease.owner(),
        lease.token(),
        std::time::Instant::now(),
        30 * SEC,
        Duration::ZERO,
    );
    assert_eq!(c.release(&as_lock).await.unwrap(), Released::NotHeld);
    assert_eq!(members(redis, &readers).await.len(), 1);
    assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
    assert_eq!(c.release(&lease).await.unwrap(), Released::NotHeld);
    assert!(matches!(
        c.extend(&lease, 20 * SEC).await,
        Err(Error::LockLost { .. })
    ));
    assert_eq!(
        redis.command(&["EXISTS", &readers]).await.unwrap(),
        RedisReply::Integer(0)
    );
}

// ---- The lock key says whether anyone waits ----

/// The lock key's value as text (`None` when absent).
async fn lock_value(redis: &Redis, key: &str) -> Option<String> {
    redis.command(&["GET", key]).await.unwrap().as_text()
}

/// The lock key tells a `SET NX` whether it may take the lock: a holder nobody queued behind is
/// plain (its owner id) and its release deletes the key; a queued waiter marks the holder; the
/// release of a marked holder leaves the key reserved for the queue, so a newcomer's `try` is
/// refused until the head takes it, and the head's grant is plain again once nobody else waits.
/// A marked holder whose lease runs out unreleased leaves the key in place while its waiter is
/// live, so a newcomer's `try` still cannot jump the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_key_keeps_the_queue_from_a_set_nx() {
    use backend_redis::node::{Mode, lease};
    use std::time::Instant;
    let redis = shared().await;
    let node = node_of(redis);
    let refused = |reply: &AcquireReply| matches!(reply, AcquireReply::Waiting { .. });

    let name = LockName::new(unique("marked")).unwrap();
    let [lock, ..] = rw_keys(name.as_str());
    let [a, b, c] = [(); 3].map(|_| lockcore::OwnerId::random());
    let o = opts(30 * SEC);
    let started = Instant::now();
    let AcquireReply::Granted(ta) = node.try_once(&name, a, &o, 0).await.unwrap() else {
        panic!("a takes the free lock");
    };
    assert_eq!(lock_value(redis, &lock).await, Some(a.to_string()), "plain");
    let queued = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
    assert!(
        matches!(queued, AcquireReply::Waiting { rank: 0, .. }),
        "{queued:?}"
    );
    let value = lock_value(redis, &lock).await.unwrap();
    assert!(value.starts_with(&format!("{a}+")), "marked: {value}");
    assert!(
        node.release(&lease(&name, a, ta, started, &o))
            .await
            .unwrap()
    );
    assert_eq!(
        lock_value(redis, &lock).await.as_deref(),
        Some("-"),
        "reserved"
    );
    assert!(
        refused(&node.try_once(&name, c, &o, 0).await.unwrap()),
        "c jumped b"
    );
    let AcquireReply::Granted(tb) = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap() else {
        panic!("the head takes the reserved lock");
    };
    assert!(tb > ta);
    assert_eq!(
        lock_value(redis, &lock).await,
        Some(b.to_string()),
        "plain again"
    );
    assert!(
        node.release(&lease(&name, b, tb, started, &o))
            .await
            .unwrap()
    );
    assert_eq!(
        lock_value(redis, &lock).await,
        None,
        "a plain release deletes"
    );

    // A marked lease that runs out unreleased: the key stays while its waiter is live.
    let short = opts(Duration::from_millis(200));
    for _ in 0..5 {
        let name = LockName::new(unique("marked-expiry")).unwrap();
        let [lock, _, queue, _] = rw_keys(name.as_str());
        let alive = queue.replace(":queue", ":alive");
        let [a, b, c] = [(); 3].map(|_| lockcore::OwnerId::random());
        let granted = node.try_once(&name, a, &short, 0).await.unwrap();
        assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
        let queued = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
        assert!(refused(&queued), "{queued:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The waiter's liveness must outlast the next requests by a wide margin, or this round
        // proves nothing (a stalled machine): then try again with new names.
        let entries = members(redis, &alive).await;
        assert_eq!(entries.len(), 1, "{entries:?}");
        let until = redis
            .command(&["ZSCORE", &alive, &entries[0]])
            .await
            .unwrap();
        let until: u64 = until.as_text().unwrap().parse().unwrap();
        if until < server_ms(redis).await + 1000 {
            continue;
        }
        assert!(
            lock_value(redis, &lock).await.is_some(),
            "the key outlives the lease"
        );
        let info = node.inspect(&name).await.unwrap();
        assert!(info.holder.is_none(), "the lease ran out: {info:?}");
        assert!(
            refused(&node.try_once(&name, c, &o, 0).await.unwrap()),
            "a newcomer jumped a live waiter after the holder's lease ran out"
        );
        let granted = node.acquire(&name, b, &o, Mode::Wait, 0).await.unwrap();
        assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
        return;
    }
    panic!("five rounds in a row stalled past the waiter's liveness");
}

/// A reader renewed past its first ttl keeps the lock key reserved as long, so a writer's `try`
/// (a `SET NX` first) stays out for as long as the reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_reader_keeps_writers_out_past_its_first_ttl() {
    use lockcore::ReadWriteExt;
    let redis = shared().await;
    let (a, b) = (
        backend_redis::connect(&redis.url()).await.unwrap(),
        backend_redis::connect(&redis.url()).await.unwrap(),
    );
    let name = unique("renewed-reader");
    let ttl = Duration::from_millis(600);
    let renewed = AcquireOptions::new()
        .ttl(ttl)
        .keep_alive(KeepAlive::renew())
        .wait(Wait::For(30 * SEC));
    let r = a.read_lock(&name, &renewed).await.expect("reader");
    for _ in 0..4 {
        tokio::time::sleep(ttl / 2).await;
        assert!(r.lost_reason().is_none(), "the reader's renewals failed");
        assert!(
            b.try_lock(&name, &opts(30 * SEC)).await.unwrap().is_none(),
            "a writer got in while a renewed reader held"
        );
    }
    assert_eq!(r.release().await.unwrap(), Released::Released);
    let w = b.try_lock(&name, &opts(30 * SEC)).await.unwrap();
    assert!(w.is_some(), "the writer once the reader left");
    w.unwrap().release().await.unwrap();
}

/// The number of keys of each `EVALSHA` that carried `owner` among its arguments since the
/// slow log was reset, oldest first (the server must log every command: `slowlog-log-slower-than
/// 0`).
async fn scripts_of(redis: &Redis, owner: lockcore::OwnerId) -> Vec<String> {
    let RedisReply::Array(Some(entries)) =
        redis.command(&["SLOWLOG", "GET", "1000"]).await.unwrap()
    else {
        panic!("SLOWLOG GET: not an array");
    };
    let owner = owner.to_string();
    let mut calls: Vec<String> = entries
        .iter()
        .filter_map(|entry| {
            let RedisReply::Array(Some(fields)) = entry else {
                return None;
            };
            let Some(RedisReply::Array(Some(args))) = fields.get(3) else {
                return None;
            };
            let args: Vec<String> = args.iter().filter_map(RedisReply::as_text).collect();
            let script = args.first()?.eq_ignore_ascii_case("evalsha");
            (script && args.contains(&owner)).then(|| args.get(2).cloned().unwrap_or_default())
        })
        .collect();
    calls.reverse();
    calls
}

/// A lock the `try` fast path granted is released by the short `release_plain.lua` (two keys)
/// while nobody queued behind it. Once a waiter has marked its key, the short script declines
/// and the full release (four keys) frees it and wakes the waiter. A stale lease is refused by
/// the short script alone, and the new holder keeps the lock. (The first round loads the scripts:
/// a call that meets `NOSCRIPT` is sent again, and the slow log shows it twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lease_is_released_by_the_short_script_until_a_waiter_marks_it() {
    let redis = Redis::start().await.expect("kit redis");
    let c = backend_redis::connect(&redis.url()).await.unwrap();
    ok(&redis, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).await;
    ok(&redis, &["CONFIG", "SET", "slowlog-max-len", "1000"]).await;
    for round in 0..2 {
        let label = unique("plain");
        let name = LockName::new(&label).unwrap();
        let o = opts(30 * SEC);
        let seen = |owner, expected: &'static [&'static str]| {
            let redis = &redis;
            async move {
                let calls = scripts_of(redis, owner).await;
                if round == 1 {
                    assert_eq!(calls, expected);
                }
            }
        };

        let lease = c.try_acquire(&name, &o).await.unwrap().expect("free");
        assert_eq!(lease.handle(), Some(backend_redis::node::PLAIN));
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        seen(lease.owner(), &["2"]).await;

        // A waiter marks the key: the short script declines, the full one releases and wakes.
        let lease = c.try_acquire(&name, &o).await.unwrap().expect("free");
        let c2 = backend_redis::connect(&redis.url()).await.unwrap();
        let waiter = tokio::spawn({
            let label = label.clone();
            async move { c2.lock(&label, &opts(30 * SEC)).await }
        });
        within(10 * SEC, "the waiter queued", queued(&c, &label, 1)).await;
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&lease).await.unwrap(), Released::Released);
        seen(lease.owner(), &["2", "4"]).await;
        let next = within(10 * SEC, "the waiter was woken", waiter)
            .await
            .unwrap()
            .expect("the waiter acquires");
        assert_eq!(next.release().await.unwrap(), Released::Released);

        // A stale lease: its fence moved on with the next grant.
        let short = opts(Duration::from_millis(200));
        let old = c.try_acquire(&name, &short).await.unwrap().expect("free");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let new = c.try_acquire(&name, &o).await.unwrap().expect("expired");
        ok(&redis, &["SLOWLOG", "RESET"]).await;
        assert_eq!(c.release(&old).await.unwrap(), Released::NotHeld);
        seen(old.owner(), &["2"]).await;
        let info = c.inspect(&name).await.unwrap().expect("held");
        assert_eq!(info.holder, Some(new.owner().to_string()));
        assert_eq!(c.release(&new).await.unwrap(), Released::Released);
    }
}
