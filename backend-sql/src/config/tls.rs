//! The TLS options of a server URL (`sslmode`/`ssl-mode`, `ca`, `cert`, `key` and their
//! aliases): collected in any order, checked together before any I/O, and the files they name
//! read when connecting.

use std::path::PathBuf;

use lockcore::{Error, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::SqlConfig;

/// How much a TLS mode does, for checking the file options against it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TlsUse {
    /// Never TLS (`disable`).
    Never,
    /// TLS when the server offers it, or always, without checking the certificate.
    Unverified,
    /// TLS with the server's certificate checked.
    Verified,
}

/// The TLS options of a server URL, collected in any order and checked together.
#[derive(Default)]
pub(super) struct TlsChoice {
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

impl TlsChoice {
    pub(super) fn mode(&mut self, backend: &'static str, key: &str, value: String) -> Result<()> {
        set_once(backend, &mut self.mode, key, value)
    }

    pub(super) fn file(&mut self, backend: &'static str, key: &str, value: String) -> Result<()> {
        if value.is_empty() {
            let why = format!("option `{key}` needs the path of a PEM file");
            return Err(Error::invalid_config(backend, why));
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
    pub(super) fn resolve<M>(
        &self,
        backend: &'static str,
        with_ca: M,
        names: &str,
        parse: impl Fn(&str) -> Option<(M, TlsUse)>,
    ) -> Result<(Option<M>, TlsFiles)> {
        let bad = |why: String| Err(Error::invalid_config(backend, why));
        let parsed = match &self.mode {
            None => None,
            Some((key, value)) => match parse(value) {
                None => return bad(format!("option `{key}={value}`: use {names}")),
                parsed => parsed,
            },
        };
        let ignored = |option: &str, what: &str| {
            let (key, value) = self.mode.as_ref().expect("a mode was parsed");
            bad(format!(
                "option `{option}` {what}, but `{key}={value}` would ignore it"
            ))
        };
        let client = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some((cert, _)), None) => {
                return bad(format!(
                    "option `{cert}` needs `key`, the client certificate's private key"
                ));
            }
            (None, Some((key, _))) => {
                return bad(format!(
                    "option `{key}` needs `cert`, the client certificate"
                ));
            }
            (Some((cert, _)), Some(_)) if matches!(parsed, Some((_, TlsUse::Never))) => {
                return ignored(cert, "names a client certificate");
            }
            (Some((_, cert)), Some((_, key))) => Some((cert.clone(), key.clone())),
        };
        let mode = match (&self.ca, parsed) {
            (None, parsed) => parsed.map(|(m, _)| m),
            (Some(_), None) => Some(with_ca),
            (Some(_), Some((m, TlsUse::Verified))) => Some(m),
            (Some((ca, _)), Some(_)) => return ignored(ca, "names a CA to verify the server with"),
        };
        let ca = self.ca.as_ref().map(|(_, path)| path.clone());
        Ok((mode, TlsFiles { ca, client }))
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
        let why = format!("options `{first}` and `{key}` are the same setting; give one");
        return Err(Error::invalid_config(backend, why));
    }
    *slot = Some((key.to_owned(), value));
    Ok(())
}

/// Connect options of a server driver, which take the TLS files' contents.
pub(crate) trait WithTls: Sized {
    /// With the CA to verify the server with.
    fn ca(self, pem: Vec<u8>) -> Self;
    /// With a client certificate and its key.
    fn client(self, cert: Vec<u8>, key: Vec<u8>) -> Self;

    /// With the TLS files `config` names, read now, each checked to hold what it should.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a file that cannot be read or does not hold a PEM block of
    /// the right kind (a certificate, or a private key). Key contents never appear in messages.
    fn with_tls(self, config: &SqlConfig) -> Result<Self> {
        let backend = config.dialect.backend();
        let read = |what: &str, path: &PathBuf, marker: &str| -> Result<Vec<u8>> {
            let bad = |why| Err(Error::invalid_config(backend, why));
            let pem = match std::fs::read(path) {
                Ok(pem) => pem,
                Err(e) => {
                    return bad(format!(
                        "the {what} file {} cannot be read: {e}",
                        path.display()
                    ));
                }
            };
            if !pem.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                return bad(format!(
                    "the {what} file {} holds no PEM block with `{marker}`",
                    path.display()
                ));
            }
            Ok(pem)
        };
        const CERT: &str = "BEGIN CERTIFICATE-----";
        // PKCS#8 (`BEGIN PRIVATE KEY`), and the older `BEGIN EC/RSA PRIVATE KEY`.
        const KEY: &str = "PRIVATE KEY-----";
        let files = &config.tls_files;
        let mut opts = self;
        if let Some(ca) = &files.ca {
            opts = opts.ca(read("CA", ca, CERT)?);
        }
        if let Some((cert, key)) = &files.client {
            let cert = read("client certificate", cert, CERT)?;
            opts = opts.client(cert, read("client key", key, KEY)?);
        }
        Ok(opts)
    }
}

/// The two server drivers take the TLS files' contents through methods of the same names, but
/// for the CA's.
macro_rules! with_tls {
    ($options:ty, $ca:ident) => {
        impl WithTls for $options {
            fn ca(self, pem: Vec<u8>) -> Self {
                self.$ca(pem)
            }

            fn client(self, cert: Vec<u8>, key: Vec<u8>) -> Self {
                self.ssl_client_cert_from_pem(cert)
                    .ssl_client_key_from_pem(key)
            }
        }
    };
}

with_tls!(PgConnectOptions, ssl_root_cert_from_pem);
with_tls!(MySqlConnectOptions, ssl_ca_from_pem);

/// The options of a server URL besides the shared ones, in the order an error lists them.
pub(super) fn options(dialect: super::Dialect) -> &'static [&'static str] {
    match dialect {
        super::Dialect::Postgres => &[
            "sslmode",
            "ca",
            "cert",
            "key",
            "sslrootcert",
            "sslcert",
            "sslkey",
            "application_name",
        ],
        _ => &[
            "ssl-mode", "sslmode", "ca", "cert", "key", "ssl-ca", "ssl-cert", "ssl-key",
        ],
    }
}

/// PostgreSQL's TLS modes, as an error lists them.
pub(super) const PG_MODES: &str = "disable, allow, prefer, require, verify-ca or verify-full";

/// A PostgreSQL TLS mode and what it does.
pub(super) fn pg_mode(v: &str) -> Option<(PgSslMode, TlsUse)> {
    Some(match v {
        "disable" => (PgSslMode::Disable, TlsUse::Never),
        "allow" => (PgSslMode::Allow, TlsUse::Unverified),
        "prefer" => (PgSslMode::Prefer, TlsUse::Unverified),
        "require" => (PgSslMode::Require, TlsUse::Unverified),
        "verify-ca" => (PgSslMode::VerifyCa, TlsUse::Verified),
        "verify-full" => (PgSslMode::VerifyFull, TlsUse::Verified),
        _ => return None,
    })
}

/// MySQL's TLS modes, as an error lists them.
pub(super) const MYSQL_MODES: &str = "disabled, preferred, required, verify_ca or verify_identity";

/// A MySQL TLS mode and what it does: MySQL's names, and PostgreSQL's for the same modes.
pub(super) fn mysql_mode(v: &str) -> Option<(MySqlSslMode, TlsUse)> {
    Some(match v.to_ascii_lowercase().as_str() {
        "disabled" | "disable" => (MySqlSslMode::Disabled, TlsUse::Never),
        "preferred" | "prefer" => (MySqlSslMode::Preferred, TlsUse::Unverified),
        "required" | "require" => (MySqlSslMode::Required, TlsUse::Unverified),
        "verify_ca" | "verify-ca" => (MySqlSslMode::VerifyCa, TlsUse::Verified),
        "verify_identity" | "verify-full" => (MySqlSslMode::VerifyIdentity, TlsUse::Verified),
        _ => return None,
    })
}
