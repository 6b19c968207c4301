//! URL and option parsing. Everything here runs before any I/O, and no message it produces
//! contains a password.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockcore::{ClientDefaults, Error, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::SqliteSynchronous;

/// The table used when the URL does not name one.
pub const DEFAULT_TABLE: &str = "dlock_leases";

/// Options every SQL URL accepts.
const COMMON_OPTIONS: &[&str] = &["table", "ttl", "drift", "timeout"];

/// Which database family a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    MySql,
    /// SQLite (`sqlite://path`, `sqlite::memory:`).
    Sqlite,
}

impl Dialect {
    /// The backend name used in capabilities and error messages.
    pub fn backend(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }
}

/// Where a SQLite database lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqlitePath {
    /// `sqlite::memory:`: private to one client (one pool), gone when it is dropped.
    Memory,
    /// A database file (relative paths are relative to the working directory).
    File(PathBuf),
}

/// Dialect-specific connection settings.
#[derive(Clone)]
pub(crate) enum Target {
    Postgres(PgConnectOptions),
    MySql(MySqlConnectOptions),
    Sqlite {
        path: SqlitePath,
        synchronous: SqliteSynchronous,
    },
}

/// A parsed and validated SQL backend URL.
///
/// `Debug` and [`redacted_url`](Self::redacted_url) never show the password.
#[derive(Clone)]
pub struct SqlConfig {
    pub(crate) dialect: Dialect,
    pub(crate) target: Target,
    pub(crate) table: String,
    pub(crate) defaults: ClientDefaults,
    pub(crate) redacted: String,
    /// Files for TLS (`ca`, `cert`, `key`), read when connecting.
    pub(crate) tls_files: TlsFiles,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("url", &self.redacted)
            .field("table", &self.table)
            .field("defaults", &self.defaults)
            .finish()
    }
}

impl SqlConfig {
    /// Parses and validates `url` without any I/O.
    ///
    /// # Errors
    /// [`Error::UnsupportedScheme`] for a scheme other than [`crate::SCHEMES`];
    /// [`Error::InvalidConfig`] for a malformed URL, a bad table name, an unknown or malformed
    /// option. Messages never contain the password.
    pub fn parse(url: &str) -> Result<Self> {
        let redacted = redact_url(url);
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => parse_sqlite(url, redacted),
            "postgres" | "postgresql" => parse_server(url, Dialect::Postgres, redacted),
            "mysql" | "mariadb" => parse_server(url, Dialect::MySql, redacted),
            _ => Err(Error::UnsupportedScheme {
                scheme: scheme.to_owned(),
                available: crate::SCHEMES.to_vec(),
            }),
        }
    }

    /// The database family.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The lease table name (validated identifier).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// ttl, drift and timeout from the URL.
    pub fn defaults(&self) -> &ClientDefaults {
        &self.defaults
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// The SQLite location, for SQLite URLs.
    pub fn sqlite_path(&self) -> Option<&SqlitePath> {
        match &self.target {
            Target::Sqlite { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// The workspace's one redaction rule (see [`lockcore::redact_url`]).
pub use lockcore::redact_url;

/// Checks a table name against `[A-Za-z_][A-Za-z0-9_]{0,62}`, so it can be quoted into SQL.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the rule.
pub fn validate_table(backend: &'static str, table: &str) -> Result<()> {
    let mut bytes = table.bytes();
    let ok = match bytes.next() {
        Some(b) if b.is_ascii_alphabetic() || b == b'_' => {
            table.len() <= 63 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_config(
            backend,
            format!(
                "table name {table:?} is not a plain SQL identifier: use 1 to 63 characters from \
                 [A-Za-z0-9_], not starting with a digit"
            ),
        ))
    }
}

/// Collects query pairs, rejecting duplicates; returns the shared options applied.
struct Options {
    backend: &'static str,
    scheme: String,
    accepted: Vec<&'static str>,
    table: Option<String>,
    defaults: ClientDefaults,
    seen: Vec<String>,
}

impl Options {
    fn new(backend: &'static str, scheme: &str, extra: &[&'static str]) -> Self {
        let mut accepted = COMMON_OPTIONS.to_vec();
        accepted.extend_from_slice(extra);
        Options {
            backend,
            scheme: scheme.to_owned(),
            accepted,
            table: None,
            defaults: ClientDefaults::default(),
            seen: Vec::new(),
        }
    }

    /// Handles a shared option; returns `Ok(false)` for a dialect option (already checked to be
    /// in `accepted`).
    fn apply(&mut self, key: &str, value: &str) -> Result<bool> {
        if !self.accepted.contains(&key) {
            return Err(Error::invalid_config(
                self.backend,
                format!(
                    "unknown option `{key}`; {}:// accepts {}",
                    self.scheme,
                    self.accepted.join(", ")
                ),
            ));
        }
        if self.seen.iter().any(|k| k == key) {
            return Err(Error::invalid_config(
                self.backend,
                format!("option `{key}` is given more than once"),
            ));
        }
        self.seen.push(key.to_owned());
        if key == "table" {
            validate_table(self.backend, value)?;
            self.table = Some(value.to_owned());
            return Ok(true);
        }
        self.defaults.apply(self.backend, key, value)
    }

    fn finish(self) -> Result<(String, ClientDefaults)> {
        let d = &self.defaults;
        let drift = d.drift.unwrap_or_else(|| lockcore::default_drift(d.ttl));
        if drift >= d.ttl {
            return Err(Error::invalid_config(
                self.backend,
                format!("drift {drift:?} must be shorter than the ttl {:?}", d.ttl),
            ));
        }
        Ok((
            self.table.unwrap_or_else(|| DEFAULT_TABLE.to_owned()),
            self.defaults,
        ))
    }
}

fn percent_decode(backend: &'static str, what: &str, text: &str) -> Result<String> {
    lockcore::percent_decode(text).map_err(|e| {
        Error::invalid_config(
            backend,
            match e {
                lockcore::PercentError::BadEscape => format!("bad percent-encoding in the {what}"),
                lockcore::PercentError::NotUtf8 => format!("the {what} is not UTF-8"),
            },
        )
    })
}

fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    url::form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

fn parse_sqlite(url: &str, redacted: String) -> Result<SqlConfig> {
    const B: &str = "sqlite";
    let usage = "expected sqlite://relative/path.db, sqlite:///absolute/path.db or sqlite::memory:";
    let rest = &url["sqlite:".len()..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = percent_decode(B, "path", path)?;
    let path = match path.as_str() {
        "" => {
            return Err(Error::invalid_config(
                B,
                format!("the URL has no database path; {usage}"),
            ));
        }
        ":memory:" => SqlitePath::Memory,
        p if p.ends_with('/') => {
            return Err(Error::invalid_config(
                B,
                format!("the database path {p:?} names a directory, not a file; {usage}"),
            ));
        }
        p => SqlitePath::File(PathBuf::from(p)),
    };
    let mut opts = Options::new(B, "sqlite", &["synchronous"]);
    let mut synchronous = SqliteSynchronous::Full;
    for (k, v) in query_pairs(query) {
        if opts.apply(&k, &v)? {
            continue;
        }
        if k == "synchronous" {
            synchronous = match v.to_ascii_lowercase().as_str() {
                "full" => SqliteSynchronous::Full,
                "extra" => SqliteSynchronous::Extra,
                "normal" => SqliteSynchronous::Normal,
                other => {
                    return Err(Error::invalid_config(
                        B,
                        format!(
                            "option `synchronous={other}`: use full (default), extra or normal"
                        ),
                    ));
                }
            };
        }
    }
    let (table, defaults) = opts.finish()?;
    Ok(SqlConfig {
        dialect: Dialect::Sqlite,
        target: Target::Sqlite { path, synchronous },
        table,
        defaults,
        redacted,
        tls_files: TlsFiles::default(),
    })
}

/// How much a TLS mode does, for checking the file options against it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TlsUse {
    /// Never TLS (`disable`).
    Never,
    /// TLS when the server offers it, or always, without checking the certificate.
    Unverified,
    /// TLS with the server's certificate checked.
    Verified,
}

/// The TLS options of a server URL, collected in any order and checked together.
#[derive(Default)]
struct TlsChoice {
    /// Each as (option name as given, value).
    mode: Option<(String, String)>,
    ca: Option<(String, PathBuf)>,
    cert: Option<(String, PathBuf)>,
    key: Option<(String, PathBuf)>,
}

/// The files a server URL names for TLS, read when connecting so [`SqlConfig::parse`] does no
/// I/O.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    /// The CA to verify the server with (`ca`).
    pub(crate) ca: Option<PathBuf>,
    /// The client certificate and its key (`cert`, `key`).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// The contents of [`TlsFiles`], checked to hold what they should.
pub(crate) struct TlsPem {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsChoice {
    fn mode(&mut self, backend: &'static str, key: &str, value: String) -> Result<()> {
        set_once(backend, &mut self.mode, key, value)
    }

    fn file(&mut self, backend: &'static str, key: &str, value: String) -> Result<()> {
        if value.is_empty() {
            return Err(Error::invalid_config(
                backend,
                format!("option `{key}` needs the path of a PEM file"),
            ));
        }
        let slot = match key {
            "ca" | "sslrootcert" | "ssl-ca" => &mut self.ca,
            "cert" | "sslcert" | "ssl-cert" => &mut self.cert,
            _ => &mut self.key,
        };
        set_once(backend, slot, key, PathBuf::from(value))
    }

    /// The mode to set (`None`: the driver's default, which tries TLS and falls back to plain)
    /// and the files. A CA without a mode means `with_ca`. A CA with a mode that does not
    /// verify, or a client certificate with a mode that never uses TLS, is refused, since it
    /// would be silently ignored; so is a certificate without its key or the other way round.
    ///
    /// `parse` maps a mode's name to the mode and what it does.
    fn resolve<M>(
        &self,
        backend: &'static str,
        with_ca: M,
        names: &str,
        parse: impl Fn(&str) -> Option<(M, TlsUse)>,
    ) -> Result<(Option<M>, TlsFiles)> {
        let parsed = match &self.mode {
            None => None,
            Some((key, value)) => Some(parse(value).ok_or_else(|| {
                Error::invalid_config(backend, format!("option `{key}={value}`: use {names}"))
            })?),
        };
        let ignored = |option: &str, what: &str| {
            let (key, value) = self.mode.as_ref().expect("a mode was parsed");
            Error::invalid_config(
                backend,
                format!("option `{option}` {what}, but `{key}={value}` would ignore it"),
            )
        };
        let client = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some((cert, _)), None) => {
                return Err(Error::invalid_config(
                    backend,
                    format!("option `{cert}` needs `key`, the client certificate's private key"),
                ));
            }
            (None, Some((key, _))) => {
                return Err(Error::invalid_config(
                    backend,
                    format!("option `{key}` needs `cert`, the client certificate"),
                ));
            }
            (Some((cert, cert_path)), Some((_, key_path))) => {
                if matches!(parsed, Some((_, TlsUse::Never))) {
                    return Err(ignored(cert, "names a client certificate"));
                }
                Some((cert_path.clone(), key_path.clone()))
            }
        };
        let mode = match (&self.ca, parsed) {
            (None, parsed) => parsed.map(|(m, _)| m),
            (Some(_), None) => Some(with_ca),
            (Some(_), Some((m, TlsUse::Verified))) => Some(m),
            (Some((ca, _)), Some(_)) => {
                return Err(ignored(ca, "names a CA to verify the server with"));
            }
        };
        let files = TlsFiles {
            ca: self.ca.as_ref().map(|(_, path)| path.clone()),
            client,
        };
        Ok((mode, files))
    }
}

/// Stores an option that has several spellings (`Options` already refuses the same name twice).
fn set_once<T>(
    backend: &'static str,
    slot: &mut Option<(String, T)>,
    key: &str,
    value: T,
) -> Result<()> {
    if let Some((first, _)) = slot {
        return Err(Error::invalid_config(
            backend,
            format!("options `{first}` and `{key}` are the same setting; give one"),
        ));
    }
    *slot = Some((key.to_owned(), value));
    Ok(())
}

/// Reads the TLS files `config` names, if any.
///
/// # Errors
/// [`Error::InvalidConfig`] for a file that cannot be read or does not hold a PEM block of the
/// right kind (a certificate, or a private key). Key contents never appear in messages.
pub(crate) fn read_tls(config: &SqlConfig) -> Result<TlsPem> {
    let backend = config.dialect.backend();
    let read = |what: &str, path: &PathBuf, marker: &str| -> Result<Vec<u8>> {
        let pem = std::fs::read(path).map_err(|e| {
            Error::invalid_config(
                backend,
                format!("the {what} file {} cannot be read: {e}", path.display()),
            )
        })?;
        if !pem.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            return Err(Error::invalid_config(
                backend,
                format!(
                    "the {what} file {} holds no PEM block with `{marker}`",
                    path.display()
                ),
            ));
        }
        Ok(pem)
    };
    const CERT: &str = "BEGIN CERTIFICATE-----";
    // PKCS#8 (`BEGIN PRIVATE KEY`), and the older `BEGIN EC/RSA PRIVATE KEY`.
    const KEY: &str = "PRIVATE KEY-----";
    let files = &config.tls_files;
    Ok(TlsPem {
        ca: files
            .ca
            .as_ref()
            .map(|path| read("CA", path, CERT))
            .transpose()?,
        client: match &files.client {
            None => None,
            Some((cert, key)) => Some((
                read("client certificate", cert, CERT)?,
                read("client key", key, KEY)?,
            )),
        },
    })
}

fn parse_server(url: &str, dialect: Dialect, redacted: String) -> Result<SqlConfig> {
    let b = dialect.backend();
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::invalid_config(
            b,
            format!("cannot parse the URL {redacted:?}: {e}; expected {scheme}://user[:password]@host[:port]/database"),
        )
    })?;
    if parsed.fragment().is_some() {
        return Err(Error::invalid_config(
            b,
            "the URL has a #fragment; options go in the ?query",
        ));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => a.to_string(),
        _ => {
            return Err(Error::invalid_config(
                b,
                format!(
                    "the URL {redacted:?} has no host; expected {scheme}://user[:password]@host[:port]/database"
                ),
            ));
        }
    };
    let user = percent_decode(b, "user name", parsed.username())?;
    let password = parsed
        .password()
        .map(|p| percent_decode(b, "password", p))
        .transpose()?;
    let path = parsed.path().trim_start_matches('/');
    if path.contains('/') {
        return Err(Error::invalid_config(
            b,
            format!("the URL path must be just a database name, not {path:?}"),
        ));
    }
    let database = percent_decode(b, "database name", path)?;
    let query = parsed.query().unwrap_or("");

    let tls_files;
    let (target, table, defaults) = match dialect {
        Dialect::Postgres => {
            let mut o = PgConnectOptions::new()
                .host(&host)
                .port(parsed.port().unwrap_or(5432));
            if !user.is_empty() {
                o = o.username(&user);
            }
            if let Some(p) = &password {
                o = o.password(p);
            }
            if !database.is_empty() {
                o = o.database(&database);
            }
            let mut opts = Options::new(
                b,
                scheme,
                &[
                    "sslmode",
                    "ca",
                    "cert",
                    "key",
                    "sslrootcert",
                    "sslcert",
                    "sslkey",
                    "application_name",
                ],
            );
            let mut tls = TlsChoice::default();
            o = o.application_name("dlock");
            for (k, v) in query_pairs(query) {
                if opts.apply(&k, &v)? {
                    continue;
                }
                match k.as_str() {
                    "sslmode" => tls.mode(b, &k, v)?,
                    "ca" | "cert" | "key" | "sslrootcert" | "sslcert" | "sslkey" => {
                        tls.file(b, &k, v)?
                    }
                    "application_name" => o = o.application_name(&v),
                    _ => unreachable!("accepted options are handled"),
                }
            }
            let names = "disable, allow, prefer, require, verify-ca or verify-full";
            let (mode, files) = tls.resolve(b, PgSslMode::VerifyFull, names, |v| {
                Some(match v {
                    "disable" => (PgSslMode::Disable, TlsUse::Never),
                    "allow" => (PgSslMode::Allow, TlsUse::Unverified),
                    "prefer" => (PgSslMode::Prefer, TlsUse::Unverified),
                    "require" => (PgSslMode::Require, TlsUse::Unverified),
                    "verify-ca" => (PgSslMode::VerifyCa, TlsUse::Verified),
                    "verify-full" => (PgSslMode::VerifyFull, TlsUse::Verified),
                    _ => return None,
                })
            })?;
            if let Some(mode) = mode {
                o = o.ssl_mode(mode);
            }
            tls_files = files;
            let (table, defaults) = opts.finish()?;
            (Target::Postgres(o), table, defaults)
        }
        Dialect::MySql => {
            if database.is_empty() {
                return Err(Error::invalid_config(
                    b,
                    format!(
                        "the URL {redacted:?} names no database; expected {scheme}://user[:password]@host[:port]/database"
                    ),
                ));
            }
            let mut o = MySqlConnectOptions::new()
                .host(&host)
                .port(parsed.port().unwrap_or(3306))
                .database(&database)
                // Every session in UTC, so DATETIME values written by NOW(6) compare the same
                // way from every client.
                .timezone(Some("+00:00".to_owned()));
            if !user.is_empty() {
                o = o.username(&user);
            }
            if let Some(p) = &password {
                o = o.password(p);
            }
            let mut opts = Options::new(
                b,
                scheme,
                &[
                    "ssl-mode", "sslmode", "ca", "cert", "key", "ssl-ca", "ssl-cert", "ssl-key",
                ],
            );
            let mut tls = TlsChoice::default();
            for (k, v) in query_pairs(query) {
                if opts.apply(&k, &v)? {
                    continue;
                }
                match k.as_str() {
                    "ssl-mode" | "sslmode" => tls.mode(b, &k, v)?,
                    "ca" | "cert" | "key" | "ssl-ca" | "ssl-cert" | "ssl-key" => {
                        tls.file(b, &k, v)?
                    }
                    _ => unreachable!("accepted options are handled"),
                }
            }
            let names = "disabled, preferred, required, verify_ca or verify_identity";
            let (mode, files) = tls.resolve(b, MySqlSslMode::VerifyIdentity, names, |v| {
                // MySQL's names, and PostgreSQL's for the same modes.
                Some(match v.to_ascii_lowercase().as_str() {
                    "disabled" | "disable" => (MySqlSslMode::Disabled, TlsUse::Never),
                    "preferred" | "prefer" => (MySqlSslMode::Preferred, TlsUse::Unverified),
                    "required" | "require" => (MySqlSslMode::Required, TlsUse::Unverified),
                    "verify_ca" | "verify-ca" => (MySqlSslMode::VerifyCa, TlsUse::Verified),
                    "verify_identity" | "verify-full" => {
                        (MySqlSslMode::VerifyIdentity, TlsUse::Verified)
                    }
                    _ => return None,
                })
            })?;
            if let Some(mode) = mode {
                o = o.ssl_mode(mode);
            }
            tls_files = files;
            let (table, defaults) = opts.finish()?;
            (Target::MySql(o), table, defaults)
        }
        Dialect::Sqlite => unreachable!("sqlite URLs are parsed by parse_sqlite"),
    };
    Ok(SqlConfig {
        dialect,
        target,
        table,
        defaults,
        redacted,
        tls_files,
    })
}

/// Round-trip budget for one statement, from the `timeout` option.
pub(crate) fn timeout_of(config: &SqlConfig) -> Duration {
    config.defaults.timeout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        SqlConfig::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("postgres://u:s3cret@h:5/db?x=1"),
            "postgres://u:***@h:5/db?x=1"
        );
        assert_eq!(
            redact_url("mysql://u:p@ss@h/db"),
            "mysql://u:***@h/db",
            "the last @ ends the user info"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite:///a:b@c"), "sqlite:///a:b@c");
        assert_eq!(redact_url("garbage"), "garbage");
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
        assert!(err("sqlite://").contains("no database path"));
        assert!(err("sqlite://?ttl=1s").contains("no database path"));
        assert!(err("sqlite://dir/").contains("directory"));
        assert!(err("sqlite::memory:?synchronous=sometimes").contains("synchronous"));
    }

    #[test]
    fn server_forms() {
        let c = SqlConfig::parse("postgres://u:pw@127.0.0.1:5433/db?sslmode=disable&timeout=2s")
            .unwrap();
        assert_eq!(c.dialect(), Dialect::Postgres);
        assert_eq!(c.defaults().timeout, Duration::from_secs(2));
        assert!(!format!("{c:?}").contains("pw"));
        let c = SqlConfig::parse("postgresql://h/db").unwrap();
        assert_eq!(c.dialect(), Dialect::Postgres);
        let c = SqlConfig::parse("mariadb://root@[::1]:3307/test?table=locks").unwrap();
        assert_eq!(c.dialect(), Dialect::MySql);
        assert_eq!(c.table(), "locks");
        assert!(err("mysql://root@h").contains("names no database"));
        assert!(err("postgres:///db").contains("no host"));
        assert!(err("postgres://h/a/b").contains("just a database name"));
    }

    #[test]
    fn options_checked() {
        let e = err("postgres://u:hunter2@h/db?colour=blue");
        assert!(e.contains("unknown option `colour`"), "{e}");
        assert!(e.contains("table, ttl, drift, timeout, sslmode"), "{e}");
        assert!(!e.contains("hunter2"));
        assert!(err("mysql://h/db?ttl=1ms").contains("ttl"));
        assert!(err("mysql://h/db?ttl=1s&ttl=2s").contains("more than once"));
        assert!(err("sqlite::memory:?timeout=0s").contains("timeout"));
        assert!(err("sqlite::memory:?ttl=100ms&drift=1s").contains("drift"));
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
        assert_eq!(
            tls_of("postgres://h/db").0,
            "Prefer",
            "the driver's default"
        );
        assert_eq!(
            tls_of("mysql://h/db").0,
            "Preferred",
            "the driver's default"
        );
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
        // A CA alone means full verification; with a verifying mode, that mode.
        assert_eq!(
            tls_of("postgres://h/db?ca=/etc/ca.pem"),
            ("VerifyFull".into(), ca.clone())
        );
        assert_eq!(
            tls_of("postgres://h/db?sslrootcert=/etc/ca.pem&sslmode=verify-ca"),
            ("VerifyCa".into(), ca.clone())
        );
        assert_eq!(
            tls_of("mysql://h/db?ca=/etc/ca.pem"),
            ("VerifyIdentity".into(), ca.clone())
        );
        assert_eq!(
            tls_of("mysql://h/db?ssl-mode=VERIFY_CA&ssl-ca=/etc/ca.pem"),
            ("VerifyCa".into(), ca)
        );
        // A CA the mode would ignore, aliases given twice, bad values: refused.
        let e = err("postgres://h/db?sslmode=require&ca=/etc/ca.pem");
        assert!(e.contains("`ca`") && e.contains("would ignore it"), "{e}");
        let e = err("mysql://h/db?ssl-ca=/etc/ca.pem&ssl-mode=preferred");
        assert!(
            e.contains("`ssl-ca`") && e.contains("would ignore it"),
            "{e}"
        );
        let e = err("postgres://h/db?ca=/a.pem&sslrootcert=/b.pem");
        assert!(e.contains("same setting"), "{e}");
        let e = err("mysql://h/db?sslmode=required&ssl-mode=required");
        assert!(e.contains("same setting"), "{e}");
        assert!(err("postgres://h/db?ca=").contains("path of a PEM file"));
        let e = err("postgres://h/db?sslmode=verify_identity");
        assert!(e.contains("use disable, allow, prefer"), "{e}");
        let e = err("mysql://h/db?ssl-mode=allow");
        assert!(e.contains("use disabled, preferred"), "{e}");
        assert!(err("sqlite::memory:?ca=/etc/ca.pem").contains("unknown option `ca`"));
    }

    #[test]
    fn client_certificates_checked() {
        let client = |url: &str| {
            SqlConfig::parse(url)
                .unwrap_or_else(|e| panic!("{url}: {e}"))
                .tls_files
                .client
        };
        let pair = Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
        assert_eq!(client("postgres://h/db?cert=/c.pem&key=/k.pem"), pair);
        assert_eq!(client("postgres://h/db?sslkey=/k.pem&sslcert=/c.pem"), pair);
        assert_eq!(
            client("mysql://h/db?ssl-cert=/c.pem&ssl-key=/k.pem&ssl-mode=required"),
            pair
        );
        assert_eq!(client("postgres://h/db"), None);
        // A client certificate does not change the mode.
        assert_eq!(tls_of("postgres://h/db?cert=/c.pem&key=/k.pem").0, "Prefer");
        assert!(err("postgres://h/db?cert=/c.pem").contains("needs `key`"));
        assert!(err("mysql://h/db?ssl-key=/k.pem").contains("needs `cert`"));
        let e = err("postgres://h/db?cert=/c.pem&key=/k.pem&sslmode=disable");
        assert!(e.contains("would ignore it"), "{e}");
        let e = err("mysql://h/db?cert=/c.pem&key=/k.pem&ssl-mode=DISABLED");
        assert!(e.contains("would ignore it"), "{e}");
        let e = err("postgres://h/db?cert=/c.pem&sslcert=/d.pem&key=/k.pem");
        assert!(e.contains("same setting"), "{e}");
        assert!(err("mysql://h/db?key=").contains("path of a PEM file"));
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
        ] {
            let e = SqlConfig::parse(url).unwrap_err();
            let text = format!("{e} {e:?}");
            assert!(!text.contains("s3cr3t"), "{url}: {text}");
        }
    }
}
