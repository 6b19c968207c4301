//! `zk://` URL parsing, done by hand (the `url` crate rejects `h1:p1,h2:p2`) and completely
//! before any I/O.

use std::fmt;
use std::time::Duration;

use lockcore::{ClientDefaults, Error, Result};

use crate::BACKEND;
use crate::names::Layout;

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

    /// The id ZooKeeper's digest scheme gives these credentials in an ACL:
    /// `user:base64(sha1(user:password))`. Derived from the password: never shown.
    pub(crate) fn digest_id(&self) -> String {
        use base64::Engine as _;
        let hash = sha1_smol::Sha1::from(self.digest_auth()).digest().bytes();
        format!(
            "{}:{}",
            self.user,
            base64::engine::general_purpose::STANDARD.encode(hash)
        )
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
/// (default lease ttl, 30 s), `drift`, `timeout` (limit for one request, default 5 s), `layout`
/// (`dlock`, the default, `curator` or `kazoo`: see [`Layout`]), `prefix` (the node under the
/// chroot that holds the locks in dlock's layout, default `dlock`; refused with the others,
/// whose lock names are paths under the chroot).
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// `host:port` of every server, in the given order.
    pub hosts: Vec<String>,
    /// The chroot path (`""` for none, else `/a/b`).
    pub chroot: String,
    /// In dlock's layout lock nodes live under `{chroot}/{prefix}`; empty in the others.
    pub prefix: String,
    /// Where lock nodes live and how they are named.
    pub layout: Layout,
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
            lockcore::PercentError::BadEscape => {
                format!("bad percent escape in the {what}")
            }
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
        let Some(after_scheme) = url.strip_prefix("zk://") else {
            let scheme = url.split_once(':').map_or(url, |(s, _)| s);
            return Err(Error::UnsupportedScheme {
                scheme: scheme.to_owned(),
                available: crate::SCHEMES.to_vec(),
            });
        };
        if after_scheme.is_empty() || after_scheme.starts_with(['/', '?']) {
            return Err(invalid(format!(
                "no hosts in `{redacted}`; expected zk://host:port[,host:port...][/chroot]"
            )));
        }
        // The user-info runs to the `@` before the host list (see `lockcore::backend_support::UrlParts`), so a
        // password may contain `/`, `?`, `#` or `@` unencoded.
        // Unsplittable text is not quoted at all: where a password would end is unknown.
        let parts = lockcore::backend_support::UrlParts::split(url)
            .map_err(|e| invalid(format!("zk:// URL: {e}")))?;
        Self::parse_parts(&parts, redacted).map_err(|e| match e {
            Error::InvalidConfig { reason, .. } if parts.ambiguous => invalid(parts.hint(reason)),
            e => e,
        })
    }

    fn parse_parts(
        parts: &lockcore::backend_support::UrlParts<'_>,
        redacted: String,
    ) -> Result<Self> {
        if parts.fragment.is_some() {
            return Err(invalid("URL fragments (#...) are not supported"));
        }
        let (hostlist, path, query) = (parts.hosts, parts.path, parts.query);
        let credentials = match (parts.user, parts.password) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "credentials must be user:password (digest authentication)",
                ));
            }
            (Some(user), Some(password)) => {
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
            layout: Layout::Dlock,
            session_timeout: Duration::ZERO,
            credentials,
            defaults: ClientDefaults::default(),
            redacted,
        };
        let mut session_timeout = None;
        let mut prefix_given = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if config.defaults.apply(BACKEND, key, value)? {
                continue;
            }
            match key {
                "session_timeout" => {
                    let t = lockcore::backend_support::option_duration(BACKEND, key, value)?;
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
                    prefix_given = true;
                }
                "layout" => {
                    config.layout = Layout::parse(value).ok_or_else(|| {
                        invalid(format!(
                            "unknown layout `{value}`; expected dlock, curator or kazoo"
                        ))
                    })?;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown option `{other}`; zk:// accepts session_timeout, ttl, drift, \
                         timeout, layout, prefix"
                    )));
                }
            }
        }
        if config.layout.names_are_paths() {
            if prefix_given {
                return Err(invalid(format!(
                    "prefix is not used with layout={}: lock names are znode paths under the \
                     chroot",
                    config.layout.as_str()
                )));
            }
            config.prefix.clear();
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

    /// The node under which every lock lives: `{chroot}/{prefix}` in dlock's layout, the
    /// chroot (`""` for none) in the others.
    pub fn base_path(&self) -> String {
        if self.layout.names_are_paths() {
            self.chroot.clone()
        } else {
            format!("{}/{}", self.chroot, self.prefix)
        }
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
    fn digest_id_is_user_and_base64_sha1() {
        let c = ZkConfig::parse("zk://alice:s3cret@h1/app").unwrap();
        // base64(sha1("alice:s3cret")), as ZooKeeper's DigestAuthenticationProvider makes it.
        assert_eq!(
            c.credentials.unwrap().digest_id(),
            "alice:uLxpHc/uhT86OXPoSjJTp1M8CJY="
        );
    }

    #[test]
    fn digest_passwords_with_url_characters() {
        for (url, auth) in [
            ("zk://u:a/b?c#d@h1:2181/app", &b"u:a/b?c#d"[..]),
            ("zk://u:x@y@h1,h2:2182?ttl=5s", b"u:x@y"),
        ] {
            let c = ZkConfig::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.credentials.unwrap().digest_auth(), auth, "{url}");
        }
        let c = ZkConfig::parse("zk://u:a/b?c#d@h1:2181/app?ttl=5s").unwrap();
        assert_eq!(
            (c.chroot.as_str(), c.defaults.ttl),
            ("/app", Duration::from_secs(5))
        );
        let c = ZkConfig::parse("zk://h1:2181/app?session_timeout=banana");
        assert!(
            matches!(c, Err(Error::InvalidConfig { .. })),
            "a bad option value is a configuration error: {c:?}"
        );
    }

    #[test]
    fn layouts_put_locks_under_the_chroot() {
        let c = ZkConfig::parse("zk://h1/app?layout=curator").unwrap();
        assert_eq!((c.layout, c.base_path()), (Layout::Curator, "/app".into()));
        let c = ZkConfig::parse("zk://h1?layout=kazoo").unwrap();
        assert_eq!((c.layout, c.base_path()), (Layout::Kazoo, String::new()));
        let c = ZkConfig::parse("zk://h1/app?layout=dlock&prefix=p").unwrap();
        assert_eq!((c.layout, c.base_path()), (Layout::Dlock, "/app/p".into()));
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
            "zk://h1?layout=zookeeper",
            "zk://h1/app?layout=curator&prefix=x",
            "zk://h1/app?prefix=x&layout=kazoo",
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
