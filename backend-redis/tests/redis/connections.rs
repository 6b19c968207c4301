//! Connecting: TLS, client certificates, ACL users and passwords, bad input refused clearly.

use backend_redis::RedisConfig;
use conformance_tests::kit::{Redis, RedisTls};
use lockcore::{Error, LockExt};

use crate::support::*;

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
