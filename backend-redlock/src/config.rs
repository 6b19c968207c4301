//! URL and option parsing: a Redlock URL is read by backend-redis's [`RedisConfig`] (the same
//! credentials, TLS files, `prefix`, `ttl`, `drift` and `timeout` as a single server), which
//! also checks the node list (an odd number, at least 3, each once) and reads `node_timeout`.
//! This module adds only what is Redlock's: the scheme check and the per-node request limit.
//! Everything here runs before any I/O.

use std::time::Duration;

use backend_redis::RedisConfig;
use lockcore::{Error, Result};

use crate::SCHEMES;

/// The smallest default node timeout. ttl/100 is the default; below this a busy machine's
/// scheduling pauses alone would make healthy nodes look dead.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// Parses and validates a `redlock://` or `redlocks://` URL without any I/O.
///
/// # Errors
/// [`Error::UnsupportedScheme`] for a scheme other than [`SCHEMES`]; [`Error::InvalidConfig`]
/// as [`RedisConfig::parse`] raises it (a node list that is not an odd number of at least 3
/// distinct masters, an unknown or malformed option). Messages never contain the password.
pub fn parse(url: &str) -> Result<RedisConfig> {
    let scheme = url
        .trim()
        .split_once("://")
        .map_or("", |(s, _)| s)
        .to_ascii_lowercase();
    if !SCHEMES.contains(&scheme.as_str()) {
        return Err(Error::UnsupportedScheme {
            scheme,
            available: SCHEMES.to_vec(),
        });
    }
    // Either scheme reads as `Deployment::Redlock`.
    RedisConfig::parse(url)
}

/// How long one node may take to answer one request for a lease of `ttl`: the URL's
/// `node_timeout` (`configured`), else ttl/100 but at least [`MIN_NODE_TIMEOUT`].
pub(crate) fn node_limit(configured: Option<Duration>, ttl: Duration) -> Duration {
    configured.unwrap_or_else(|| (ttl / 100).max(MIN_NODE_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_redis::Deployment;

    #[test]
    fn only_redlock_schemes_and_urls() {
        let c = parse("redlocks://a:1,b:2,c:3?node_timeout=20ms").unwrap();
        assert!(matches!(
            c.deployment,
            Deployment::Redlock { tls: true, .. }
        ));
        assert_eq!(c.node_timeout, Some(Duration::from_millis(20)));
        assert!(parse("REDLOCK://a:1,b:2,c:3").is_ok());
        for url in [
            "redis://a:1",
            "tair://a:1",
            "memcached://a:1",
            "a:1,b:2,c:3",
        ] {
            match parse(url) {
                Err(Error::UnsupportedScheme { available, .. }) => {
                    assert_eq!(available, SCHEMES.to_vec(), "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let err = parse("redlock://:hunter2@a:1,b:2").unwrap_err();
        assert!(err.to_string().contains("at least 3"), "{err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    }

    #[test]
    fn node_limit_defaults_to_a_hundredth_of_the_ttl_but_not_below_the_minimum() {
        let s = Duration::from_secs(1);
        assert_eq!(node_limit(None, 30 * s), Duration::from_millis(300));
        assert_eq!(node_limit(None, s), MIN_NODE_TIMEOUT);
        assert_eq!(
            node_limit(Some(Duration::from_millis(7)), 30 * s),
            Duration::from_millis(7)
        );
    }
}
