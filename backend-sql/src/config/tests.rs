//! Unit tests of what only the connect options show: the TLS mode and files a URL sets, and the
//! host of a URL whose password holds URL characters. The rest of URL parsing is checked through
//! the public API in `tests/config.rs`.

use super::*;

/// The TLS mode each URL ends up with, as sqlx's `Debug` names it, and the CA file.
fn tls_of(url: &str) -> (String, Option<PathBuf>) {
    let c = SqlConfig::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let mode = match &c.target {
        Target::Postgres(o) => format!("{:?}", o.get_ssl_mode()),
        Target::MySql(o) => format!("{:?}", o.get_ssl_mode()),
        Target::Sqlite { .. } => unreachable!("not a server URL"),
    };
    (mode, c.tls_files.ca)
}

#[test]
fn tls_options_checked() {
    let ca = Some(PathBuf::from("/etc/ca.pem"));
    for (url, mode, with_ca) in [
        // The driver's default, which a client certificate does not change.
        ("postgres://h/db", "Prefer", false),
        ("mysql://h/db", "Preferred", false),
        ("postgres://h/db?cert=/c.pem&key=/k.pem", "Prefer", false),
        // A CA alone means full verification; with a verifying mode, that mode.
        ("postgres://h/db?ca=/etc/ca.pem", "VerifyFull", true),
        (
            "postgres://h/db?sslrootcert=/etc/ca.pem&sslmode=verify-ca",
            "VerifyCa",
            true,
        ),
        ("mysql://h/db?ca=/etc/ca.pem", "VerifyIdentity", true),
        (
            "mysql://h/db?ssl-mode=VERIFY_CA&ssl-ca=/etc/ca.pem",
            "VerifyCa",
            true,
        ),
    ] {
        let expected = (mode.to_owned(), ca.clone().filter(|_| with_ca));
        assert_eq!(tls_of(url), expected, "{url}");
    }
    for (mode, expected) in [
        ("disable", "Disable"),
        ("allow", "Allow"),
        ("prefer", "Prefer"),
        ("require", "Require"),
        ("verify-ca", "VerifyCa"),
        ("verify-full", "VerifyFull"),
    ] {
        assert_eq!(
            tls_of(&format!("postgres://h/db?sslmode={mode}")).0,
            expected
        );
    }
    for (mode, expected) in [
        ("DISABLED", "Disabled"),
        ("preferred", "Preferred"),
        ("REQUIRED", "Required"),
        ("require", "Required"),
        ("VERIFY_CA", "VerifyCa"),
        ("verify_identity", "VerifyIdentity"),
        ("verify-full", "VerifyIdentity"),
    ] {
        assert_eq!(tls_of(&format!("mysql://h/db?ssl-mode={mode}")).0, expected);
        assert_eq!(
            tls_of(&format!("mariadb://h/db?sslmode={mode}")).0,
            expected
        );
    }
}

#[test]
fn client_certificates_checked() {
    let pair = Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
    for (url, client) in [
        ("postgres://h/db?cert=/c.pem&key=/k.pem", &pair),
        ("postgres://h/db?sslkey=/k.pem&sslcert=/c.pem", &pair),
        (
            "mysql://h/db?ssl-cert=/c.pem&ssl-key=/k.pem&ssl-mode=required",
            &pair,
        ),
        ("postgres://h/db", &None),
    ] {
        let c = SqlConfig::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(&c.tls_files.client, client, "{url}");
    }
}

#[test]
fn passwords_with_url_characters_keep_the_host() {
    for url in [
        "postgres://u:pa/ss?x#y@h.example:5433/db?sslmode=disable",
        "postgres://u:p@ss@h.example:5433/db?sslmode=disable",
    ] {
        let c = SqlConfig::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let Target::Postgres(o) = &c.target else {
            panic!("{url}: not PostgreSQL")
        };
        assert_eq!((o.get_host(), o.get_port()), ("h.example", 5433), "{url}");
        assert_eq!(o.get_database(), Some("db"), "{url}");
        assert_eq!(o.get_username(), "u", "{url}");
    }
}
