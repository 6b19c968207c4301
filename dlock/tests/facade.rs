//! The facade: connecting by URL and by configuration, the scheme registry, redaction.

use std::time::Duration;

use dlock::{AcquireOptions, Error, LockConfig, LockExt, Wait, redact};

#[tokio::test]
async fn memory_url_connects_and_locks() {
    let locks = dlock::connect("memory://facade-connect").await.unwrap();
    assert_eq!(locks.capabilities().backend, "memory");
    let guard = locks.lock("job", &AcquireOptions::new()).await.unwrap();
    // A second client of the same namespace sees the lock held.
    let other = dlock::connect("memory://facade-connect").await.unwrap();
    assert!(
        other
            .try_lock("job", &AcquireOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    let again = other.try_lock("job", &AcquireOptions::new()).await.unwrap();
    assert!(again.is_some());
    again.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn scheme_is_case_insensitive_and_url_options_apply() {
    let locks = dlock::connect("  MeMoRy://facade-case?ttl=7s ")
        .await
        .unwrap();
    assert_eq!(locks.defaults().ttl, Duration::from_secs(7));
}

#[tokio::test]
async fn unknown_scheme_lists_compiled_in_schemes() {
    let err = dlock::connect("nope://u:hunter2@somewhere/x")
        .await
        .unwrap_err();
    match &err {
        Error::UnsupportedScheme { scheme, available } => {
            assert_eq!(scheme, "nope");
            assert!(available.contains(&"memory"), "{available:?}");
            assert_eq!(available, &dlock::schemes());
        }
        other => panic!("expected UnsupportedScheme, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("nope") && msg.contains("memory"), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");
}

#[tokio::test]
async fn multi_host_urls_are_split_by_hand() {
    // The `url` crate rejects `h1:p1,h2:p2`; the registry must still find the scheme.
    // Redlock's three closed local ports: the URL reaches the backend, which tries every node.
    let err = dlock::connect("redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "redlock",
                ..
            }
        ),
        "expected the backend's connect error, got {err:?}"
    );
    assert!(msg.contains("only 0 of 3 nodes"), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(dlock::schemes().contains(&"redlock"));
    assert_eq!(
        dlock::scheme_of("zk://h1:2181,h2:2181/chroot").unwrap(),
        "zk"
    );
    assert_eq!(
        dlock::scheme_of("redis+cluster://h:1").unwrap(),
        "redis+cluster"
    );
    assert_eq!(dlock::scheme_of("sqlite:relative.db").unwrap(), "sqlite");
}

#[tokio::test]
async fn text_that_is_not_a_url_is_a_config_error_without_the_password() {
    for bad in ["", "no scheme here", "://x", "1redis://h", "/tmp/locks.db"] {
        let err = dlock::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "{bad:?}: {err:?}"
        );
    }
    let err = dlock::connect("://u:hunter2@h").await.unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn memory_url_errors_pass_through() {
    let err = dlock::connect("memory://").await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    let err = dlock::connect("memory://x?bogus=1").await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
}

#[test]
fn redact_hides_passwords_in_all_forms() {
    let cases = [
        (
            "redis://alice:s3cret@cache:6379/0",
            "redis://alice:***@cache:6379/0",
        ),
        ("rediss://:s3cret@cache:6380", "rediss://:***@cache:6380"),
        ("redis://alice@cache", "redis://alice@cache"),
        ("memory://default", "memory://default"),
        (
            "redlock://u:s3cret@h1:1,h2:2,h3:3/0",
            "redlock://u:***@h1:1,h2:2,h3:3/0",
        ),
        ("postgres://u:p%40ss@db/locks", "postgres://u:***@db/locks"),
        // Unencoded special characters inside the password.
        ("mysql://u:s3@cret@db:3306/x", "mysql://u:***@db:3306/x"),
        ("mysql://u:s3/cret@db:3306/x", "mysql://u:***@db:3306/x"),
        (
            "mysql://u:s3?cret@db:3306/x?ttl=1s",
            "mysql://u:***@db:3306/x?ttl=1s",
        ),
        ("mysql://u:s3,cret@db:3306/x", "mysql://u:***@db:3306/x"),
        // Query parameters.
        (
            "postgres://db/locks?user=u&password=s3cret&ttl=5s",
            "postgres://db/locks?user=u&password=***&ttl=5s",
        ),
        (
            "postgres://db/locks?Password=s3cret",
            "postgres://db/locks?Password=***",
        ),
        ("redis://h?auth=s3cret#x", "redis://h?auth=***#x"),
        (
            "zk://h1:1,h2:2/chroot?token=s3cret",
            "zk://h1:1,h2:2/chroot?token=***",
        ),
        (
            "sqlite:///var/lib/a@b/locks.db?mode=rwc",
            "sqlite:///var/lib/a@b/locks.db?mode=rwc",
        ),
        (
            "postgres://u:s3cret@db/x?sslpassword=s3cret",
            "postgres://u:***@db/x?sslpassword=***",
        ),
    ];
    for (input, want) in cases {
        let got = redact(input);
        assert_eq!(got, want, "redact({input:?})");
        assert!(!got.contains("s3cret") && !got.contains("cret"), "{got}");
    }
    // Redacting twice changes nothing more.
    let once = redact("redis://a:b@h?password=c");
    assert_eq!(redact(&once), once);
}

#[tokio::test]
async fn lock_config_from_json() {
    let cfg: LockConfig = serde_json::from_str(
        r#"{
            "url": "memory://facade-config?ttl=5s",
            "ttl": "12s",
            "drift": "20ms",
            "timeout": "1s 500ms"
        }"#,
    )
    .unwrap();
    assert_eq!(cfg.ttl, Some(Duration::from_secs(12)));
    assert_eq!(cfg.timeout, Some(Duration::from_millis(1500)));
    // The configuration wins over the URL's own `ttl`.
    assert_eq!(
        cfg.url_with_options().unwrap(),
        "memory://facade-config?ttl=12s&drift=20ms&timeout=1500ms"
    );
    let locks = dlock::connect_config(&cfg).await.unwrap();
    let defaults = locks.defaults();
    assert_eq!(defaults.ttl, Duration::from_secs(12));
    assert_eq!(defaults.drift, Some(Duration::from_millis(20)));
    assert_eq!(defaults.timeout, Duration::from_millis(1500));
    let guard = locks
        .lock("x", &AcquireOptions::new().wait(Wait::No))
        .await
        .unwrap();
    assert_eq!(guard.lease().ttl(), Duration::from_secs(12));
    guard.release().await.unwrap();
}

#[test]
fn lock_config_url_only_and_builder() {
    let cfg: LockConfig = serde_json::from_str(r#"{"url":"memory://a"}"#).unwrap();
    assert_eq!(cfg.url_with_options().unwrap(), "memory://a");
    let cfg = LockConfig::new("redis://h/0?prefix=x")
        .ttl(Duration::from_millis(250))
        .option("prefix", "billing");
    assert_eq!(
        cfg.url_with_options().unwrap(),
        "redis://h/0?ttl=250ms&prefix=billing"
    );
}

#[test]
fn lock_config_rejects_mistakes() {
    // Typo in a field name.
    assert!(serde_json::from_str::<LockConfig>(r#"{"url":"memory://a","tll":"5s"}"#).is_err());
    // Not a duration.
    let err = serde_json::from_str::<LockConfig>(r#"{"url":"memory://a","ttl":"soon"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("soon"), "{err}");
    // Missing url.
    assert!(serde_json::from_str::<LockConfig>(r#"{"ttl":"5s"}"#).is_err());
    // Values that cannot go into a query string.
    let cfg = LockConfig::new("memory://a").option("prefix", "a&b");
    assert!(matches!(
        cfg.url_with_options(),
        Err(Error::InvalidConfig { .. })
    ));
    let cfg = LockConfig::new("memory://a").option("ttl", "5s");
    assert!(matches!(
        cfg.url_with_options(),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(LockConfig::new("  ").url_with_options().is_err());
}

#[test]
fn lock_config_debug_is_redacted() {
    let cfg: LockConfig =
        serde_json::from_str(r#"{"url":"redis://u:hunter2@h/0?password=hunter2"}"#).unwrap();
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("u:***@h"), "{shown}");
}

/// What `native_primitives` reads from a URL (no I/O) is what the connected client says, for
/// the stores that need no server; a malformed URL is the same error as `connect`'s.
#[tokio::test]
async fn native_primitives_from_the_url_match_the_connected_client() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("native.db").display());
    let dual = format!(
        "dual://?first={}&second={}",
        dlock::percent_encode("memory://native-first"),
        dlock::percent_encode(&sqlite)
    );
    for url in ["memory://native", sqlite.as_str(), dual.as_str()] {
        let from_url = dlock::native_primitives(url).unwrap();
        let connected = dlock::connect(url).await.unwrap().capabilities().native;
        assert_eq!(from_url, connected, "{url}");
    }
    assert!(dlock::native_primitives("memory://x").unwrap().semaphore);
    assert!(matches!(
        dlock::native_primitives("nosuch://x"),
        Err(Error::UnsupportedScheme { .. })
    ));
    assert!(matches!(
        dlock::native_primitives("dual://?first=memory://a"),
        Err(Error::InvalidConfig { .. })
    ));
}
