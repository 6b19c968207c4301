//! URL and option parsing. Everything here runs before any I/O, and nothing it produces
//! (`Debug`, messages, the redacted URL) contains a password.

use std::fmt;
use std::path::PathBuf;

use lockcore::{ClientDefaults, Error, Result};

use crate::BACKEND;

/// The key prefix used when the URL does not set `prefix`.
pub const DEFAULT_PREFIX: &str = "dlock";

/// The port used when a host has none.
pub const DEFAULT_PORT: u16 = 6379;

/// Every scheme [`RedisConfig::parse`] reads: this crate's ([`crate::SCHEMES`] and
/// [`crate::tair::SCHEMES`]) and Redlock's (`redlock`, `redlocks`), whose URLs `backend-redlock`
/// reads here, so that one parser serves every Redis deployment.
pub const PARSED_SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+cluster",
    "redlock",
    "redlocks",
    "tair",
];

/// Options every Redis URL accepts (besides `ca` for `rediss://`).
const OPTIONS: &str = "prefix, ttl, drift, timeout (node_timeout for redlock://; ca, cert, key for rediss:// and redlocks://)";

/// Which deployment a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// One server (`redis://` or, with TLS, `rediss://`).
    Single {
        /// Host name or IP address.
        host: String,
        /// TCP port.
        port: u16,
        /// Whether to speak TLS (`rediss://`).
        tls: bool,
    },
    /// A Redis Cluster reached through one or more seed nodes (`redis+cluster://h1:p1,h2:p2`).
    Cluster {
        /// Seed nodes as `(host, port)`.
        nodes: Vec<(String, u16)>,
    },
    /// Redlock over an odd number (at least 3) of independent masters
    /// (`redlock://h1:p1,h2:p2,h3:p3`, or with TLS to every node `redlocks://`).
    Redlock {
        /// The masters as `(host, port)`, in URL order.
        nodes: Vec<(String, u16)>,
        /// Whether to speak TLS to every node (`redlocks://`).
        tls: bool,
    },
}

/// A password that never shows in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The password itself, for the connection handshake only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A parsed and validated Redis backend URL.
///
/// URL forms:
/// * `redis://[user:password@]host[:port][/db][?options]`
/// * `rediss://[user:password@]host[:port][/db][?ca=/path/to/ca.pem&options]` (TLS)
/// * `redis+cluster://[user:password@]host1:port1,host2:port2[?options]`
/// * `tair://[user:password@]host[:port][/db][?options]` (the Tair-style expireLock/expireUnlock
///   emulation on one server)
/// * `redlock://[user:password@]h1:p1,h2:p2,h3:p3[/db][?node_timeout=..&options]` (Redlock over
///   an odd number, at least 3, of independent masters; `redlocks://` speaks TLS to every node)
///
/// Options: `prefix` (key prefix, default `dlock`; no `{`, `}` or whitespace), `ttl`, `drift`,
/// `timeout` (connect and round-trip limit, default 5 s), for Redlock `node_timeout` (how long
/// one node may take to answer one request, default ttl/100 but at least 50 ms), and for
/// `rediss://` and `redlocks://` `ca` (a PEM file
/// of the certificate authority to trust instead of the system's roots) and `cert` + `key` (a
/// client certificate and its private key, PEM files, for servers that authenticate clients). The user and password
/// may be percent-encoded; a password without a user (`redis://:secret@host`) authenticates as
/// the `default` user.
#[derive(Clone)]
pub struct RedisConfig {
    /// The deployment and its address(es).
    pub deployment: Deployment,
    /// ACL user name, if any.
    pub username: Option<String>,
    /// Password, if any (never printed).
    pub password: Option<Secret>,
    /// Database number (single server only).
    pub db: i64,
    /// Key prefix.
    pub prefix: String,
    /// CA certificate file for `rediss://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key files for `rediss://`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// ttl, drift and timeout from the URL.
    pub defaults: ClientDefaults,
    /// Redlock only: the per-node request limit (`None`: ttl/100, at least 50 ms).
    pub node_timeout: Option<std::time::Duration>,
    /// `tair://`: the Tair-style expireLock/expireUnlock emulation on this single server.
    pub tair: bool,
    redacted: String,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted)
            .field("prefix", &self.prefix)
            .field("defaults", &self.defaults)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::invalid_config(BACKEND, reason)
}

impl RedisConfig {
    /// Parses and validates `url` without any I/O.
    ///
    /// # Errors
    /// [`Error::UnsupportedScheme`] for a scheme other than [`PARSED_SCHEMES`];
    /// [`Error::InvalidConfig`] for a URL without a host, a bad port, database, prefix or
    /// percent-encoding, or an unknown or malformed option. Messages never contain the password.
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let redacted = redact_url(url);
        // Unsplittable text is not quoted at all: where a password would end is unknown.
        let parts = lockcore::backend_support::UrlParts::split(url).map_err(|e| {
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            invalid(format!(
                "cannot read the {scheme}:// URL ({e}); expected redis://host:port, \
                 rediss://host:port, redis+cluster://h1:p1,h2:p2 or redlock://h1:p1,h2:p2,h3:p3"
            ))
        })?;
        let scheme = parts.scheme.to_ascii_lowercase();
        if !PARSED_SCHEMES.contains(&scheme.as_str()) {
            return Err(Error::UnsupportedScheme {
                scheme,
                available: PARSED_SCHEMES.to_vec(),
            });
        }
        // Past the user-info, a message may only quote the path or query when the URL reads
        // one way only: otherwise they may hold part of a password.
        Self::parse_parts(&parts, scheme, redacted).map_err(|e| match e {
            Error::InvalidConfig { reason, .. } if parts.ambiguous => invalid(parts.hint(reason)),
            e => e,
        })
    }

    fn parse_parts(
        parts: &lockcore::backend_support::UrlParts<'_>,
        scheme: String,
        redacted: String,
    ) -> Result<Self> {
        if parts.fragment.is_some() {
            return Err(invalid(format!(
                "`{redacted}`: URL fragments (#...) are not supported"
            )));
        }
        let (hosts, path, query) = (parts.hosts, parts.path, parts.query);
        let username = parts
            .user
            .map(|u| lockcore::percent_decode(u).map_err(|e| invalid(format!("user name: {e}"))))
            .transpose()?
            .filter(|u| !u.is_empty());
        let password = parts
            .password
            .map(|p| {
                lockcore::percent_decode(p)
                    .map_err(|_| invalid("the password is not valid percent-encoding"))
            })
            .transpose()?
            .filter(|p| !p.is_empty())
            .map(Secret);
        if hosts.is_empty() {
            return Err(invalid(format!(
                "`{redacted}` has no host; expected e.g. {scheme}://127.0.0.1:6379"
            )));
        }
        let redlock = scheme == "redlock" || scheme == "redlocks";
        let tair = scheme == "tair";
        let deployment = if scheme == "redis+cluster" || redlock {
            let mut nodes = Vec::new();
            for node in hosts.split(',') {
                if node.is_empty() {
                    return Err(invalid(format!(
                        "`{redacted}`: empty node in the host list"
                    )));
                }
                nodes.push(parse_host_port(node, &redacted)?);
            }
            if redlock {
                check_redlock_nodes(&nodes, &redacted)?;
                Deployment::Redlock {
                    nodes,
                    tls: scheme == "redlocks",
                }
            } else {
                Deployment::Cluster { nodes }
            }
        } else {
            if hosts.contains(',') {
                return Err(invalid(format!(
                    "`{redacted}` names several hosts; use redis+cluster:// for a Redis Cluster"
                )));
            }
            let (host, port) = parse_host_port(hosts, &redacted)?;
            Deployment::Single {
                host,
                port,
                tls: scheme == "rediss",
            }
        };
        let db = match path.trim_start_matches('/') {
            "" => 0,
            text => text
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| {
                    invalid(format!(
                        "`{redacted}`: the path must be a database number, e.g. /0"
                    ))
                })?,
        };
        if db != 0 && matches!(deployment, Deployment::Cluster { .. }) {
            return Err(invalid("Redis Cluster has only database 0"));
        }
        let mut config = RedisConfig {
            deployment,
            username,
            password,
            db,
            prefix: DEFAULT_PREFIX.to_owned(),
            ca_file: None,
            client_cert: None,
            defaults: ClientDefaults::default(),
            node_timeout: None,
            tair,
            redacted,
        };
        let (mut cert_file, mut key_file) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = lockcore::percent_decode(value)
                .map_err(|e| invalid(format!("option `{key}`: {e}")))?;
            if config.defaults.apply(BACKEND, key, &value)? {
                continue;
            }
            match key {
                "prefix" => config.prefix = check_prefix(&value)?,
                "node_timeout" if redlock => {
                    let limit = lockcore::backend_support::option_duration(BACKEND, key, &value)?;
                    if limit.is_zero() || limit > std::time::Duration::from_secs(60) {
                        return Err(invalid(format!(
                            "option `node_timeout={value}` must be above 0 and at most 60s"
                        )));
                    }
                    config.node_timeout = Some(limit);
                }
                "node_timeout" => {
                    return Err(invalid(
                        "option `node_timeout` only applies to redlock:// URLs",
                    ));
                }
                "ca" | "cert" | "key" if scheme == "rediss" || scheme == "redlocks" => {
                    if value.is_empty() {
                        return Err(invalid(format!("option `{key}` needs a file path")));
                    }
                    let slot = match key {
                        "ca" => &mut config.ca_file,
                        "cert" => &mut cert_file,
                        _ => &mut key_file,
                    };
                    *slot = Some(PathBuf::from(value));
                }
                "ca" | "cert" | "key" => {
                    return Err(invalid(format!(
                        "option `{key}` only applies to rediss:// and redlocks:// (TLS) URLs"
                    )));
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown option `{key}`; {scheme}:// accepts {OPTIONS}"
                    )));
                }
            }
        }
        config.client_cert = match (cert_file, key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(invalid(
                    "option `cert` needs `key`, the client certificate's private key",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid("option `key` needs `cert`, the client certificate"));
            }
        };
        Ok(config)
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }
}

/// Redlock needs a majority of independent masters: an odd number, at least three, each named
/// once (the same server twice would count one vote twice).
fn check_redlock_nodes(nodes: &[(String, u16)], redacted: &str) -> Result<()> {
    let n = nodes.len();
    if n < 3 {
        return Err(invalid(format!(
            "`{redacted}` names {n} node(s); Redlock needs at least 3 independent masters (a majority of 1 or 2 survives no failure)"
        )));
    }
    if n.is_multiple_of(2) {
        return Err(invalid(format!(
            "`{redacted}` names {n} nodes; Redlock needs an odd number: {n} nodes need a majority of {} and survive no more failures than {} nodes do",
            n / 2 + 1,
            n - 1
        )));
    }
    for (i, node) in nodes.iter().enumerate() {
        if nodes[..i].contains(node) {
            return Err(invalid(format!(
                "`{redacted}` names {}:{} twice; each Redlock node must be a different master",
                node.0, node.1
            )));
        }
    }
    Ok(())
}

fn check_prefix(prefix: &str) -> Result<String> {
    if prefix.is_empty() {
        return Err(invalid("option `prefix` must not be empty"));
    }
    if prefix
        .chars()
        .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(invalid(format!(
            "option `prefix={prefix}`: `{{`, `}}`, whitespace and control characters are not allowed (the prefix is part of a Cluster hash tag)"
        )));
    }
    if prefix.len() > 256 {
        return Err(invalid("option `prefix` is longer than 256 bytes"));
    }
    Ok(prefix.to_owned())
}

fn parse_host_port(text: &str, redacted: &str) -> Result<(String, u16)> {
    let (host, port) =
        if let Some(rest) = text.strip_prefix('[') {
            // [v6addr]:port
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| invalid(format!("`{redacted}`: unclosed `[` in an IPv6 address")))?;
            match after {
                "" => (host, None),
                p => (
                    host,
                    Some(p.strip_prefix(':').ok_or_else(|| {
                        invalid(format!("`{redacted}`: expected `:port` after `]`"))
                    })?),
                ),
            }
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            }
        };
    if host.is_empty() {
        return Err(invalid(format!(
            "`{redacted}` has no host; expected e.g. redis://127.0.0.1:6379"
        )));
    }
    let port =
        match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                invalid(format!("`{redacted}`: `{p}` is not a TCP port (1..=65535)"))
            })?,
        };
    Ok((host.to_owned(), port))
}

/// The workspace's one redaction rule (see [`lockcore::redact_url`]).
pub use lockcore::redact_url;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn single_with_everything() {
        let c = RedisConfig::parse(
            "redis://app:s%40cret@db.example:6380/3?prefix=locks&ttl=10s&timeout=2s&drift=5ms",
        )
        .unwrap();
        assert_eq!(
            c.deployment,
            Deployment::Single {
                host: "db.example".into(),
                port: 6380,
                tls: false
            }
        );
        assert_eq!(c.username.as_deref(), Some("app"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert_eq!(c.db, 3);
        assert_eq!(c.prefix, "locks");
        assert_eq!(c.defaults.ttl, Duration::from_secs(10));
        assert_eq!(c.defaults.timeout, Duration::from_secs(2));
        assert_eq!(c.defaults.drift, Some(Duration::from_millis(5)));
        let shown = format!("{c:?}");
        assert!(!shown.contains("cret"), "{shown}");
        assert!(!c.redacted_url().contains("cret"));
    }

    #[test]
    fn defaults_and_password_only() {
        let c = RedisConfig::parse("redis://:pw@localhost").unwrap();
        assert_eq!(c.username, None);
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("pw"));
        assert_eq!(c.prefix, DEFAULT_PREFIX);
        assert_eq!(c.db, 0);
        assert!(matches!(
            c.deployment,
            Deployment::Single { port: 6379, .. }
        ));
    }

    #[test]
    fn tls_and_ca() {
        let c = RedisConfig::parse("rediss://h:1/0?ca=/tmp/ca.pem").unwrap();
        assert!(matches!(c.deployment, Deployment::Single { tls: true, .. }));
        assert_eq!(c.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert!(RedisConfig::parse("redis://h:1/0?ca=/tmp/ca.pem").is_err());
        let c = RedisConfig::parse("rediss://h:1/0?cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(
            c.client_cert,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        let e = RedisConfig::parse("rediss://h:1/0?cert=/c.pem").unwrap_err();
        assert!(e.to_string().contains("needs `key`"), "{e}");
        let e = RedisConfig::parse("rediss://h:1/0?key=/k.pem").unwrap_err();
        assert!(e.to_string().contains("needs `cert`"), "{e}");
        let e = RedisConfig::parse("redis://h:1/0?cert=/c.pem&key=/k.pem").unwrap_err();
        assert!(e.to_string().contains("only applies to rediss://"), "{e}");
    }

    #[test]
    fn cluster_hosts() {
        let c = RedisConfig::parse("redis+cluster://u:p@a:1,b:2,[::1]:3,c").unwrap();
        assert_eq!(
            c.deployment,
            Deployment::Cluster {
                nodes: vec![
                    ("a".into(), 1),
                    ("b".into(), 2),
                    ("::1".into(), 3),
                    ("c".into(), 6379)
                ]
            }
        );
        assert!(RedisConfig::parse("redis+cluster://a:1/2").is_err());
        assert!(RedisConfig::parse("redis+cluster://a:1,,b:2").is_err());
    }

    #[test]
    fn redlock_nodes_and_options() {
        let c = RedisConfig::parse("redlock://u:p@a:1,b:2,c:3/2?node_timeout=20ms&ttl=5s").unwrap();
        assert_eq!(
            c.deployment,
            Deployment::Redlock {
                nodes: vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)],
                tls: false
            }
        );
        assert_eq!(c.db, 2);
        assert_eq!(c.node_timeout, Some(std::time::Duration::from_millis(20)));
        let c = RedisConfig::parse("redlocks://a:1,b:2,c:3,d:4,e:5?ca=/ca.pem").unwrap();
        assert!(
            matches!(c.deployment, Deployment::Redlock { tls: true, ref nodes } if nodes.len() == 5)
        );
        for (url, needle) in [
            ("redlock://a:1", "at least 3"),
            ("redlock://a:1,b:2", "at least 3"),
            ("redlock://a:1,b:2,c:3,d:4", "odd number"),
            ("redlock://a:1,b:2,a:1", "twice"),
            ("redlock://a:1,b:2,c:3?node_timeout=0s", "node_timeout"),
            ("redlock://a:1,b:2,c:3?node_timeout=soon", "node_timeout"),
            ("redis://a:1?node_timeout=5ms", "only applies to redlock"),
            ("redlock://a:1,b:2,c:3?ca=/x", "only applies to rediss"),
        ] {
            let err = RedisConfig::parse(url).unwrap_err();
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn bad_input_is_clear_and_never_shows_the_password() {
        for (url, needle) in [
            ("redis://", "no host"),
            ("redis://:hunter2@", "no host"),
            ("redis://:hunter2@/0", "no host"),
            ("redis://u:hunter2@h:99999", "not a TCP port"),
            ("redis://u:hunter2@h:1/x", "database number"),
            ("redis://u:hunter2@h:1?bogus=1", "unknown option `bogus`"),
            ("redis://u:hunter2@h:1?prefix={x}", "prefix"),
            ("redis://u:hunter2@h:1?prefix=", "prefix"),
            ("redis://u:hunter2@a:1,b:2", "redis+cluster"),
            ("redis://u:hunter2@h:1?ttl=1ms", "ttl"),
        ] {
            let err = RedisConfig::parse(url).unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{url}: {text}");
            assert!(!text.contains("hunter2"), "{url}: {text}");
            assert!(matches!(err, Error::InvalidConfig { .. }), "{url}: {err:?}");
        }
        assert!(matches!(
            RedisConfig::parse("memcached://h:1"),
            Err(Error::UnsupportedScheme { .. })
        ));
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("redis://u:p@h:1/0?x=1"),
            "redis://u:***@h:1/0?x=1"
        );
        assert_eq!(redact_url("redis://:p@w@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://u@h:1"), "redis://u@h:1");
        assert_eq!(redact_url("redis://u:pa/ss@h/0"), "redis://u:***@h/0");
        assert_eq!(
            redact_url("redis://u:pa?ss@h/0?x=1"),
            "redis://u:***@h/0?x=1"
        );
        assert_eq!(redact_url("redis://u:p#w@h"), "redis://u:***@h");
    }

    #[test]
    fn passwords_with_special_characters() {
        for (url, password) in [
            ("redis://u:pa/ss@h:1/2", "pa/ss"),
            ("redis://u:pa?ss@h:1/2?prefix=x", "pa?ss"),
            ("redis://u:p#w@h:1", "p#w"),
            ("redis://u:p@w@h:1", "p@w"),
            ("redis+cluster://u:p,w@a:1,b:2", "p,w"),
            // Q1: the user-info ends at the `@` before the host, whatever it holds.
            ("redis://user:ab/?s3cr3tXYZ@127.0.0.1:6391", "ab/?s3cr3tXYZ"),
            ("redis://:ab#cd@127.0.0.1:6391", "ab#cd"),
            ("redlock://:a/b?c#d@h1:1,h2:2,h3:3", "a/b?c#d"),
            ("tair://:x?y@h:1/0", "x?y"),
        ] {
            let c = RedisConfig::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                c.password.as_ref().map(Secret::expose),
                Some(password),
                "{url}"
            );
            assert!(!c.redacted_url().contains(password), "{url}");
        }
        let c = RedisConfig::parse("redis://u:pa/ss@h:1/2").unwrap();
        assert_eq!(c.db, 2);
    }
}
