//! URL and option parsing through the public API, before any I/O: the forms accepted, the
//! reason each refused one gives, and passwords kept out of every message. (The TLS mode and
//! files a URL sets, which only the connect options show, are checked in `src/config/tests.rs`.)

use std::time::Duration;

use backend_sql::{DEFAULT_TABLE, Dialect, Speedup, Speedups, SqlConfig, SqlitePath, redact_url};
use lockcore::Error;

fn err(url: &str) -> String {
    SqlConfig::parse(url).unwrap_err().to_string()
}

#[test]
fn redaction() {
    for (url, redacted) in [
        (
            "postgres://u:s3cret@h:5/db?x=1",
            "postgres://u:***@h:5/db?x=1",
        ),
        // The last @ ends the user info.
        ("mysql://u:p@ss@h/db", "mysql://u:***@h/db"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("sqlite:///a:b@c", "sqlite:///a:b@c"),
        ("garbage", "garbage"),
    ] {
        assert_eq!(redact_url(url), redacted, "{url}");
    }
}

#[test]
fn sqlite_forms() {
    let c = SqlConfig::parse("sqlite://data/locks.db").unwrap();
    assert_eq!(
        c.sqlite_path(),
        Some(&SqlitePath::File("data/locks.db".into()))
    );
    let c = SqlConfig::parse("sqlite:///tmp/x.db?table=t1&ttl=5s").unwrap();
    assert_eq!(c.sqlite_path(), Some(&SqlitePath::File("/tmp/x.db".into())));
    assert_eq!(c.table(), "t1");
    assert_eq!(c.defaults().ttl, Duration::from_secs(5));
    let c = SqlConfig::parse("sqlite::memory:").unwrap();
    assert_eq!(c.sqlite_path(), Some(&SqlitePath::Memory));
    assert_eq!(c.table(), DEFAULT_TABLE);
}

#[test]
fn server_forms() {
    let c =
        SqlConfig::parse("postgres://u:pw@127.0.0.1:5433/db?sslmode=disable&timeout=2s").unwrap();
    assert_eq!(c.dialect(), Dialect::Postgres);
    assert_eq!(c.defaults().timeout, Duration::from_secs(2));
    assert!(!format!("{c:?}").contains("pw"));
    let c = SqlConfig::parse("postgresql://h/db").unwrap();
    assert_eq!(c.dialect(), Dialect::Postgres);
    let c = SqlConfig::parse("mariadb://root@[::1]:3307/test?table=locks").unwrap();
    assert_eq!(c.dialect(), Dialect::MySql);
    assert_eq!(c.table(), "locks");
    let c = SqlConfig::parse("mysql://root:a/b?c#d@h.example:3307/test").unwrap();
    assert_eq!(c.dialect(), Dialect::MySql);
}

/// Each bad URL is refused with a message that says why, and without its password.
#[test]
fn bad_urls_say_why() {
    for (url, why) in [
        ("sqlite://", "no database path"),
        ("sqlite://?ttl=1s", "no database path"),
        ("sqlite://dir/", "directory"),
        ("sqlite::memory:?synchronous=sometimes", "synchronous"),
        ("mysql://root@h", "names no database"),
        ("postgres:///db", "no host"),
        ("postgres://h/a/b", "just a database name"),
        (
            "postgres://u:s3cr3t@h/db?colour=blue",
            "unknown option `colour`; postgres:// accepts table, ttl, drift, timeout, sslmode",
        ),
        ("mysql://h/db?ttl=1ms", "ttl"),
        ("mysql://h/db?ttl=1s&ttl=2s", "more than once"),
        ("sqlite::memory:?timeout=0s", "timeout"),
        ("sqlite::memory:?ttl=100ms&drift=1s", "drift"),
        ("sqlite::memory:?ca=/etc/ca.pem", "unknown option `ca`"),
        // TLS: a CA the mode would ignore, aliases given twice, bad values.
        (
            "postgres://h/db?sslmode=require&ca=/etc/ca.pem",
            "`ca` names a CA to verify the server with, but `sslmode=require` would ignore it",
        ),
        (
            "mysql://h/db?ssl-ca=/etc/ca.pem&ssl-mode=preferred",
            "`ssl-ca` names a CA to verify the server with, but `ssl-mode=preferred` would \
             ignore it",
        ),
        (
            "postgres://h/db?ca=/a.pem&sslrootcert=/b.pem",
            "same setting",
        ),
        (
            "mysql://h/db?sslmode=required&ssl-mode=required",
            "same setting",
        ),
        ("postgres://h/db?ca=", "path of a PEM file"),
        (
            "postgres://h/db?sslmode=verify_identity",
            "use disable, allow, prefer",
        ),
        ("mysql://h/db?ssl-mode=allow", "use disabled, preferred"),
        // Client certificates: only with their key, and not where TLS is off.
        ("postgres://h/db?cert=/c.pem", "needs `key`"),
        ("mysql://h/db?ssl-key=/k.pem", "needs `cert`"),
        (
            "postgres://h/db?cert=/c.pem&key=/k.pem&sslmode=disable",
            "would ignore it",
        ),
        (
            "mysql://h/db?cert=/c.pem&key=/k.pem&ssl-mode=DISABLED",
            "would ignore it",
        ),
        (
            "postgres://h/db?cert=/c.pem&sslcert=/d.pem&key=/k.pem",
            "same setting",
        ),
        ("mysql://h/db?key=", "path of a PEM file"),
    ] {
        let e = err(url);
        assert!(e.contains(why), "{url}: {e}");
        assert!(!e.contains("s3cr3t"), "{url}: {e}");
    }
}

#[test]
fn table_names_and_schemes_checked() {
    for bad in ["1abc", "a-b", "a b", "\"x\"", "x;drop", "", &"a".repeat(64)] {
        let e = err(&format!(
            "sqlite::memory:?table={}",
            bad.replace(' ', "%20")
        ));
        assert!(e.contains("table name"), "{bad}: {e}");
    }
    assert!(SqlConfig::parse(&format!("sqlite::memory:?table=_{}", "a".repeat(62))).is_ok());
    let e = SqlConfig::parse("redis://h").unwrap_err();
    assert!(matches!(e, Error::UnsupportedScheme { .. }), "{e}");
}

#[test]
fn malformed_urls_hide_passwords() {
    for url in [
        "postgres://u:s3cr3t@h:notaport/db",
        "mysql://u:s3cr3t@h:99999/db",
        "postgres://u:s3cr3t@/db",
        "mysql://u:s3cr3t@h",
        "postgres://u:s3cr3t@h/db?sslmode=sometimes",
        "postgres://u:s3cr3t@h/db?table=bad-name",
        "postgres://u:s3cr3t@h/db#frag",
        "postgres://u:ab/?s3cr3t@",
        "postgres://u:1234/?s3cr3t@h/db",
    ] {
        let e = SqlConfig::parse(url).unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("s3cr3t"), "{url}: {text}");
    }
}

#[test]
fn speedups_option() {
    let all = SqlConfig::parse("sqlite:///tmp/x.db").unwrap();
    assert_eq!(all.speedups(), Speedups::ALL);
    let none = SqlConfig::parse("postgres://h/db?speedups=none").unwrap();
    assert_eq!(none.speedups(), Speedups::NONE);
    let some = SqlConfig::parse("mysql://h/db?speedups=-hand-over,-doorbell").unwrap();
    let expected = Speedups::ALL
        .without(Speedup::HandOver)
        .without(Speedup::Doorbell);
    assert_eq!(some.speedups(), expected);
    assert!(format!("{some:?}").contains("-doorbell,-hand-over"));
    let with = all.with_speedups(Speedups::NONE);
    assert_eq!(with.speedups(), Speedups::NONE);

    for url in [
        "sqlite:///tmp/x.db?speedups=fast",
        "postgres://h/db?speedups=-doorbell,-turbo",
        "mysql://h/db?speedups=",
    ] {
        let e = SqlConfig::parse(url).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{url}: {e:?}");
        let why = e.to_string();
        for name in Speedup::ALL.map(Speedup::name) {
            assert!(why.contains(name), "{url}: {why}");
        }
    }
    assert!(err("sqlite:///x.db?speedups=none&speedups=all").contains("more than once"));
}
