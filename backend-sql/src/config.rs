//! URL and option parsing. Everything here runs before any I/O, and no message it produces
//! contains a password.

use std::fmt;
use std::path::PathBuf;

use lockcore::{ClientDefaults, Error, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::SqliteSynchronous;

mod speedups;
mod tls;

pub use speedups::{Speedup, Speedups};
use tls::TlsChoice;
pub(crate) use tls::{TlsFiles, WithTls};

/// The table used when the URL does not name one.
pub const DEFAULT_TABLE: &str = "dlock_leases";

/// Options every SQL URL accepts.
const COMMON_OPTIONS: &[&str] = &["table", "ttl", "drift", "timeout"];

/// Options every SQL URL accepts, listed after the dialect's own.
const LAST_OPTIONS: &[&str] = &["speedups"];

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
    /// The speed-ups in use (the `speedups` option).
    pub(crate) speedups: Speedups,
}

impl fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConfig")
            .field("url", &self.redacted)
            .field("table", &self.table)
            .field("defaults", &self.defaults)
            .field("speedups", &self.speedups)
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

    /// The speed-ups a client of this configuration uses (the `speedups` option; all by
    /// default). See [`Speedup`] for what each does.
    pub fn speedups(&self) -> Speedups {
        self.speedups
    }

    /// This configuration with `speedups` in use instead (see [`Speedups`]).
    #[must_use]
    pub fn with_speedups(mut self, speedups: Speedups) -> Self {
        self.speedups = speedups;
        self
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
        return Ok(());
    }
    let why = format!(
        "table name {table:?} is not a plain SQL identifier: use 1 to 63 characters from \
         [A-Za-z0-9_], not starting with a digit"
    );
    Err(Error::invalid_config(backend, why))
}

/// Parses a URL's query: the options every SQL URL accepts, and the dialect's own (`extra`)
/// through `dialect`. An unknown option, one given twice, or a drift not shorter than the ttl is
/// refused. Returns the table, the defaults and the speed-ups.
fn parse_query(
    backend: &'static str,
    scheme: &str,
    query: &str,
    extra: &[&str],
    mut dialect: impl FnMut(&str, String) -> Result<()>,
) -> Result<(String, ClientDefaults, Speedups)> {
    let bad = |why: String| Err(Error::invalid_config(backend, why));
    let (mut table, mut defaults, mut seen) = (None, ClientDefaults::default(), Vec::new());
    let mut speedups = Speedups::ALL;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let known = [COMMON_OPTIONS, extra, LAST_OPTIONS];
        if !known.iter().flat_map(|k| k.iter()).any(|k| *k == key) {
            let accepted = known.concat().join(", ");
            return bad(format!(
                "unknown option `{key}`; {scheme}:// accepts {accepted}"
            ));
        }
        if seen.contains(&key) {
            return bad(format!("option `{key}` is given more than once"));
        }
        if key == "table" {
            validate_table(backend, &value)?;
            table = Some(value.into_owned());
        } else if key == "speedups" {
            speedups =
                Speedups::parse(&value).map_err(|why| Error::invalid_config(backend, why))?;
        } else if !defaults.apply(backend, &key, &value)? {
            dialect(&key, value.into_owned())?;
        }
        seen.push(key);
    }
    let drift = defaults
        .drift
        .unwrap_or_else(|| lockcore::backend_support::default_drift(defaults.ttl));
    if drift >= defaults.ttl {
        return bad(format!(
            "drift {drift:?} must be shorter than the ttl {:?}",
            defaults.ttl
        ));
    }
    let table = table.unwrap_or_else(|| DEFAULT_TABLE.to_owned());
    Ok((table, defaults, speedups))
}

fn percent_decode(backend: &'static str, what: &str, text: &str) -> Result<String> {
    lockcore::percent_decode(text).map_err(|e| {
        Error::invalid_config(
            backend,
            match e {
                lockcore::PercentError::BadEscape => {
                    format!("bad percent-encoding in the {what}")
                }
                lockcore::PercentError::NotUtf8 => {
                    format!("the {what} is not UTF-8")
                }
            },
        )
    })
}

fn parse_sqlite(url: &str, redacted: String) -> Result<SqlConfig> {
    const B: &str = "sqlite";
    let usage = "expected sqlite://relative/path.db, sqlite:///absolute/path.db or sqlite::memory:";
    let rest = &url["sqlite:".len()..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = percent_decode(B, "path", path)?;
    let bad = |why: String| Err(Error::invalid_config(B, why));
    let path = match path.as_str() {
        "" => return bad(format!("the URL has no database path; {usage}")),
        ":memory:" => SqlitePath::Memory,
        p if p.ends_with('/') => {
            return bad(format!(
                "the database path {p:?} names a directory, not a file; {usage}"
            ));
        }
        p => SqlitePath::File(PathBuf::from(p)),
    };
    let mut synchronous = SqliteSynchronous::Full;
    // `synchronous` is SQLite's one option of its own.
    let (table, defaults, speedups) =
        parse_query(B, "sqlite", query, &["synchronous"], |_, value| {
            synchronous = match value.to_ascii_lowercase().as_str() {
                "full" => SqliteSynchronous::Full,
                "extra" => SqliteSynchronous::Extra,
                "normal" => SqliteSynchronous::Normal,
                other => {
                    let why = format!(
                        "option `synchronous={other}`: use full (default), extra or normal"
                    );
                    return Err(Error::invalid_config(B, why));
                }
            };
            Ok(())
        })?;
    Ok(SqlConfig {
        dialect: Dialect::Sqlite,
        target: Target::Sqlite { path, synchronous },
        table,
        defaults,
        redacted,
        tls_files: TlsFiles::default(),
        speedups,
    })
}

fn parse_server(url: &str, dialect: Dialect, redacted: String) -> Result<SqlConfig> {
    let b = dialect.backend();
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    // The user-info runs to the `@` before the host (see `lockcore::backend_support::UrlParts`), so
    // a password may hold `/`, `?`, `#` or `@` unencoded; written back encoded, the `url` crate
    // reads the same host. Past the user-info, messages quote nothing when the URL reads two ways.
    let expected = format!("expected {scheme}://user[:password]@host[:port]/database");
    // Unsplittable text is not quoted at all: where the password ends is unknown.
    let bad = |why: String| Error::invalid_config(b, why);
    let parts = lockcore::backend_support::UrlParts::split(url)
        .map_err(|e| bad(format!("cannot parse the {scheme}:// URL: {e}; {expected}")))?;
    let standard = parts
        .standard()
        .map_err(|(what, e)| bad(format!("the {what} in the URL: {e}")))?;
    parse_standard(&standard, dialect, redacted, scheme, &expected).map_err(|e| match e {
        Error::InvalidConfig { backend, reason } if parts.ambiguous => {
            Error::invalid_config(backend, parts.hint(reason))
        }
        e => e,
    })
}

fn parse_standard(
    url: &str,
    dialect: Dialect,
    redacted: String,
    scheme: &str,
    expected: &str,
) -> Result<SqlConfig> {
    let b = dialect.backend();
    let bad = |why: String| Error::invalid_config(b, why);
    let parsed = url::Url::parse(url).map_err(|e| {
        bad(format!(
            "cannot parse the URL {redacted:?}: {e}; {expected}"
        ))
    })?;
    if parsed.fragment().is_some() {
        return Err(bad(
            "the URL has a #fragment; options go in the ?query".into()
        ));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => a.to_string(),
        _ => return Err(bad(format!("the URL {redacted:?} has no host; {expected}"))),
    };
    let user = percent_decode(b, "user name", parsed.username())?;
    let password = parsed
        .password()
        .map(|p| percent_decode(b, "password", p))
        .transpose()?;
    let path = parsed.path().trim_start_matches('/');
    if path.contains('/') {
        let why = format!("the URL path must be just a database name, not {path:?}");
        return Err(bad(why));
    }
    let database = percent_decode(b, "database name", path)?;
    let query = parsed.query().unwrap_or("");

    if dialect == Dialect::MySql && database.is_empty() {
        return Err(bad(format!(
            "the URL {redacted:?} names no database; {expected}"
        )));
    }
    let (mut tls, mut application_name) = (TlsChoice::default(), "dlock".to_owned());
    let options = tls::options(dialect);
    let (table, defaults, speedups) =
        parse_query(b, scheme, query, options, |key, value| match key {
            "application_name" => {
                application_name = value;
                Ok(())
            }
            "sslmode" | "ssl-mode" => tls.mode(b, key, value),
            _ => tls.file(b, key, value),
        })?;
    let (target, tls_files) = match dialect {
        Dialect::Postgres => {
            let port = parsed.port().unwrap_or(5432);
            let mut o = PgConnectOptions::new().host(&host).port(port);
            if !user.is_empty() {
                o = o.username(&user);
            }
            if let Some(p) = &password {
                o = o.password(p);
            }
            if !database.is_empty() {
                o = o.database(&database);
            }
            let (mode, files) =
                tls.resolve(b, PgSslMode::VerifyFull, tls::PG_MODES, tls::pg_mode)?;
            if let Some(mode) = mode {
                o = o.ssl_mode(mode);
            }
            (
                Target::Postgres(o.application_name(&application_name)),
                files,
            )
        }
        _ => {
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
            let with_ca = MySqlSslMode::VerifyIdentity;
            let (mode, files) = tls.resolve(b, with_ca, tls::MYSQL_MODES, tls::mysql_mode)?;
            if let Some(mode) = mode {
                o = o.ssl_mode(mode);
            }
            (Target::MySql(o), files)
        }
    };
    Ok(SqlConfig {
        dialect,
        target,
        table,
        defaults,
        redacted,
        tls_files,
        speedups,
    })
}

#[cfg(test)]
mod tests;
