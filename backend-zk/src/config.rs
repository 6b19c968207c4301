//! `zk://` URL parsing, done by hand (the `url` crate rejects `h1:p1,h2:p2`) and completely
//! before any I/O.

use std::fmt;
use std::time::Duration;

use lockcore::{ClientDefaults, Error, Result};

use crate::BACKEND;

/// Port used for a host given without one.
pub const DEFAULT_PORT: u16 = 2181;

/// Node under the chroot that holds every lock of a client, unless `prefix=` says otherwise.
pub const DEFAULT_PREFIX: &str = "dlock";

/// Digest credentials from the URL's user-info. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    password: String,
}

impl Credentials {
    /// The `user:password` bytes ZooKeeper's digest scheme expects.
    pub(crate) fn digest_auth(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// A parsed `zk://[user:pass@]h1:p1,h2:p2/chroot[?options]` URL.
///
/// Options: `session_timeout` (the session timeout to negotiate; default: the `ttl`), `ttl`
/// (default lease ttl, 30 s), `drift`, `timeout` (limit for one request, default 5 s), `prefix`
/// (the node under the chroot that holds the locks, default `dlock`).
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// `host:port` of every server, in the given order.
    pub hosts: Vec<String>,
    /// The chroot path (`""` for none, else `/a/b`).
    pub chroot: String,
    /// Lock nodes live under `{chroot}/{prefix}`.
    pub prefix: String,
    /// The session timeout asked of the server (the server clamps it to its own bounds).
    pub session_timeout: Duration,
    /// Digest credentials: lock nodes are then created creator-only.
    pub credentials: Option<Credentials>,
    /// ttl, drift and timeout defaults.
    pub defaults: ClientDefaults,
    redacted: String,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("url", &self.redacted)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::invalid_config(BACKEND, reason)
}

/// Percent-decodes user-info text (`%40` for `@`, `%3A` for `:`).
fn percent_decode(text: &str, what: &str) -> Result<String> {
    lockcore::percent_decode(text).map_err(|e| {
        invalid(match e {
            lockcore::PercentError::BadEscape => format!("bad percent escape in the {what}"),
            lockcore::PercentError::NotUtf8 => format!("the {what} is not UTF-8"),
        })
    })
}

/// Checks one path segment: non-empty, not `.`/`..`, no control characters.
fn check_segment(segment: &str, what: &str) -> Result<()> {
    if segment.is_empty() || segment == "." || segment == ".." {
        return Err(invalid(format!(
            "the {what} has an empty, `.` or `..` segment"
        )));
    }
    if segment.chars().any(char::is_control) {
        return Err(invalid(format!("the {what} contains a control character")));
    }
    Ok(())
}

fn check_host(host: &str) -> Result<String> {
    if host.is_empty() {
        return Err(invalid("empty host in the host list"));
    }
    let (name, port) = match host.rsplit_once(':') {
        // `[::1]:2181` or `h:2181`; a bare IPv6 address needs brackets.
        Some((name, port)) if !name.is_empty() && (!name.contains(':') || name.ends_with(']')) => {
            let port: u16 = port
                .parse()
                .map_err(|_| invalid(format!("bad port `{port}` for host `{name}`")))?;
            if port == 0 {
                return Err(invalid(format!("port 0 for host `{name}`")));
            }
            (name, port)
        }
        Some(_) if !host.starts_with('[') => {
            return Err(invalid(format!(
                "bad host `{host}` (write IPv6 addresses in brackets)"
            )));
        }
        _ => (host, DEFAULT_PORT),
    };
    if name
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || "/?#@".contains(c))
    {
        return Err(invalid(format!("bad host name `{name}`")));
    }
    Ok(format!("{name}:{port}"))
}

impl ZkConfig {
    /// Parses `zk://[user:pass@]h1:p1,h2:p2/chroot[?session_timeout=..&timeout=..&prefix=..&ttl=..&drift=..]`.
    ///
    /// # Errors
    /// [`Error::UnsupportedScheme`] for another scheme; [`Error::InvalidConfig`] for an empty or
    /// malformed host list, a bad chroot or prefix, or an unknown or out-of-range option. No
    /// message contains the password.
    pub fn parse(url: &str) -> Result<Self> {
        let redacted = lockcore::redact_url(url);
        let Some(rest) = url.strip_prefix("zk://") else {
            let scheme = url.split_once(':').map_or(url, |(s, _)| s);
            return Err(Error::UnsupportedScheme {
                scheme: scheme.to_owned(),
                available: crate::SCHEMES.to_vec(),
            });
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // As `redact_url` reads it: the user-info runs to the last `@`, so a password may
        // contain `/` (and a chroot may not contain `@`).
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, rest),
        };
        let (hostlist, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let credentials = match userinfo {
            None => None,
            Some(u) => {
                let (user, password) = u.split_once(':').ok_or_else(|| {
                    invalid("credentials must be user:password (digest authentication)")
                })?;
                let user = percent_decode(user, "user name")?;
                if user.is_empty() {
                    return Err(invalid("the user name is empty"));
                }
                Some(Credentials {
                    user,
                    password: percent_decode(password, "password")?,
                })
            }
        };
        if hostlist.is_empty() {
            return Err(invalid(format!(
                "no hosts in `{redacted}`; expected zk://host:port[,host:port...][/chroot]"
            )));
        }
        let hosts = hostlist
            .split(',')
            .map(check_host)
            .collect::<Result<Vec<_>>>()?;
        let chroot = path.trim_end_matches('/');
        for segment in chroot.split('/').skip(1) {
            check_segment(segment, "chroot")?;
        }
        let mut config = ZkConfig {
            hosts,
            chroot: chroot.to_owned(),
            prefix: DEFAULT_PREFIX.to_owned(),
            session_timeout: Duration::ZERO,
            credentials,
            defaults: ClientDefaults::default(),
            redacted,
        };
        let mut session_timeout = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if config.defaults.apply(BACKEND, key, value)? {
                continue;
            }
            match key {
                "session_timeout" => {
                    let t = humantime::parse_duration(value)
                        .map_err(|e| invalid(format!("option `session_timeout={value}`: {e}")))?;
                    if t < Duration::from_millis(100) || t > Duration::from_secs(3600) {
                        return Err(invalid(format!(
                            "session_timeout {t:?} is outside 100ms ..= 1h"
                        )));
                    }
                    session_timeout = Some(t);
                }
                "prefix" => {
                    let prefix = value.trim_matches('/');
                    for segment in prefix.split('/') {
                        check_segment(segment, "prefix")?;
                    }
                    config.prefix = prefix.to_owned();
                }
                other => {
                    return Err(invalid(format!(
                        "unknown option `{other}`; zk:// accepts session_timeout, ttl, drift, \
                         timeout, prefix"
                    )));
                }
            }
        }
        // Without an explicit session_timeout the default lease ttl is the session timeout:
        // a lease is never trusted longer than the session that backs it.
        config.session_timeout = session_timeout
            .unwrap_or(config.defaults.ttl)
            .clamp(Duration::from_millis(100), Duration::from_secs(3600));
        Ok(config)
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// `h1:p1,h2:p2` for the client library (the chroot is handled by this crate).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The node holding every lock: `{chroot}/{prefix}`.
    pub fn base_path(&self) -> String {
        format!("{}/{}", self.chroot, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_and_options() {
        let c = ZkConfig::parse(
            "zk://u:p%40s/s@h1:2181,h2:2182,h3/app/locks?session_timeout=4s&prefix=x/y&ttl=10s",
        )
        .unwrap();
        assert_eq!(c.hosts, ["h1:2181", "h2:2182", "h3:2181"]);
        assert_eq!(c.chroot, "/app/locks");
        assert_eq!(c.base_path(), "/app/locks/x/y");
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(c.defaults.ttl, Duration::from_secs(10));
        let creds = c.credentials.clone().unwrap();
        assert_eq!(creds.digest_auth(), b"u:p@s/s");
        let shown = format!("{c:?} {creds:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
    }

    #[test]
    fn session_timeout_defaults_to_ttl() {
        let c = ZkConfig::parse("zk://127.0.0.1:2181?ttl=12s").unwrap();
        assert_eq!(c.session_timeout, Duration::from_secs(12));
        assert_eq!(c.base_path(), "/dlock");
        assert!(c.credentials.is_none());
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "zk://",
            "zk:///chroot",
            "zk://h1:2181,,h2",
            "zk://h1:99999",
            "zk://h1:0",
            "zk://h1/a/../b",
            "zk://h1?prefix=..",
            "zk://h1?session_timeout=1ms",
            "zk://h1?nope=1",
            "zk://h1?ttl=1ms",
            "zk://user@h1",
            "zk://u:secret@h1?bogus=1",
        ] {
            match ZkConfig::parse(bad) {
                Err(Error::InvalidConfig { reason, .. }) => {
                    assert!(!reason.contains("secret"), "{bad}: {reason}")
                }
                other => panic!("{bad}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(matches!(
            ZkConfig::parse("redis://h1"),
            Err(Error::UnsupportedScheme { .. })
        ));
    }
}
