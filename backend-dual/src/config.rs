//! `dual://` URL parsing, complete before any I/O.

use std::fmt;

use lockcore::{ClientDefaults, Error, Result, redact_url};

use crate::BACKEND;

/// A parsed `dual://?first=<url>&second=<url>[&ttl=..&drift=..&timeout=..]` URL.
///
/// `first` and `second` are the two stores' own URLs, percent-encoded as query values (at least
/// `&`, `+`, `%` and `#` must be encoded; encoding the whole URL is simplest, e.g. with
/// `python3 -c 'import urllib.parse,sys; print(urllib.parse.quote(sys.argv[1], safe=""))' URL`).
/// `ttl` and `drift` set the defaults for acquisitions on both stores (else the first store's);
/// `timeout` bounds one attempt on each store (else each store's own). Nothing else is accepted.
#[derive(Clone, PartialEq, Eq)]
pub struct DualConfig {
    /// The store every acquisition starts on, and whose queue waiters wait in.
    pub first: String,
    /// The store taken second, whose counter carries the tokens forward.
    pub second: String,
    /// The ttl, drift and timeout given on the dual URL itself; `None` leaves each to the
    /// stores' own defaults.
    pub ttl: Option<std::time::Duration>,
    /// See [`DualConfig::ttl`].
    pub drift: Option<std::time::Duration>,
    /// See [`DualConfig::ttl`].
    pub timeout: Option<std::time::Duration>,
}

impl fmt::Debug for DualConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DualConfig")
            .field("first", &redact_url(&self.first))
            .field("second", &redact_url(&self.second))
            .field("ttl", &self.ttl)
            .field("drift", &self.drift)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::invalid_config(BACKEND, reason)
}

/// The scheme of an inner URL, checked the way the facade checks any URL.
fn inner_scheme<'a>(which: &str, url: &'a str) -> Result<&'a str> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    if scheme.contains(' ') {
        return Err(invalid(format!(
            "`{which}` decodes to `{}`: a `+` in a query value means a space; write `%2B` \
             (for example redis%2Bcluster://)",
            redact_url(url)
        )));
    }
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(invalid(format!(
            "`{which}` must be a store URL such as zk://host:2181/app or redis://host:6379, \
             percent-encoded; got `{}`",
            redact_url(url)
        )));
    }
    Ok(scheme)
}

impl DualConfig {
    /// Parses a `dual://` URL.
    ///
    /// # Errors
    /// [`Error::UnsupportedScheme`] for another scheme; [`Error::InvalidConfig`] when `first`
    /// or `second` is missing, repeated or not a URL, when either is itself `dual://`, when both
    /// name the same store URL, or for an unknown option. Messages show URLs redacted.
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let Some(rest) = url.strip_prefix("dual://") else {
            let scheme = url.split_once(':').map_or(url, |(s, _)| s);
            return Err(Error::UnsupportedScheme {
                scheme: scheme.to_owned(),
                available: crate::SCHEMES.to_vec(),
            });
        };
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !authority.is_empty() && authority != "/" {
            return Err(invalid(format!(
                "a dual URL names its stores in the query, not a host: write \
                 dual://?first=...&second=..., not `{}`",
                redact_url(url)
            )));
        }
        let mut first = None;
        let mut second = None;
        let mut defaults = ClientDefaults::default();
        let (mut ttl, mut drift, mut timeout) = (None, None, None);
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match key.as_ref() {
                "first" => &mut first,
                "second" => &mut second,
                "ttl" | "drift" | "timeout" => {
                    defaults.apply(BACKEND, &key, &value)?;
                    match key.as_ref() {
                        "ttl" => ttl = Some(defaults.ttl),
                        "drift" => drift = defaults.drift,
                        _ => timeout = Some(defaults.timeout),
                    }
                    continue;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown option `{other}` (dual:// takes first, second, ttl, drift, \
                         timeout; options of a store go inside its own URL)"
                    )));
                }
            };
            if slot.is_some() {
                return Err(invalid(format!("`{key}` is given twice")));
            }
            *slot = Some(value.into_owned());
        }
        let first =
            first.ok_or_else(|| invalid("`first` is missing: dual://?first=...&second=..."))?;
        let second =
            second.ok_or_else(|| invalid("`second` is missing: dual://?first=...&second=..."))?;
        for (which, inner) in [("first", &first), ("second", &second)] {
            if inner_scheme(which, inner)?.eq_ignore_ascii_case("dual") {
                return Err(invalid(format!(
                    "`{which}` is itself a dual URL; nest no deeper than one pair"
                )));
            }
        }
        if first.trim() == second.trim() {
            return Err(invalid(
                "`first` and `second` are the same store: a lock would wait for itself",
            ));
        }
        Ok(DualConfig {
            first,
            second,
            ttl,
            drift,
            timeout,
        })
    }
}

impl DualConfig {
    /// The two stores' URLs to connect with, first store's first. A `ttl` on the dual URL is
    /// also the default `ttl` of a store whose own URL sets none, so that a session store
    /// (ZooKeeper, whose session timeout follows its `ttl` unless `session_timeout` is set)
    /// ends a dead holder's lock after about that ttl too.
    pub fn store_urls(&self) -> (String, String) {
        let with_ttl = |url: &str| -> String {
            let Some(ttl) = self.ttl else {
                return url.to_owned();
            };
            let Ok(parts) = lockcore::backend_support::UrlParts::split(url) else {
                return url.to_owned();
            };
            let sets_ttl = parts
                .query
                .split('&')
                .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == "ttl");
            if sets_ttl {
                return url.to_owned();
            }
            let value = if ttl.subsec_nanos() % 1_000_000 == 0 {
                format!("{}ms", ttl.as_millis())
            } else {
                format!("{}ns", ttl.as_nanos())
            };
            let query = match parts.query {
                "" => format!("ttl={value}"),
                q => format!("{q}&ttl={value}"),
            };
            parts.with_query(&query)
        };
        (with_ttl(&self.first), with_ttl(&self.second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(text: &str) -> String {
        url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
    }

    #[test]
    fn parses_encoded_inner_urls_and_shared_options() {
        let zk = "zk://u:p%40w@h1:2181,h2:2181/app?session_timeout=10s";
        let redis = "redis+cluster://:pw@h:7000/?prefix=a&timeout=2s";
        let c = DualConfig::parse(&format!(
            "dual://?first={}&second={}&ttl=20s&timeout=3s",
            enc(zk),
            enc(redis)
        ))
        .unwrap();
        assert_eq!(c.first, zk);
        assert_eq!(c.second, redis);
        assert_eq!(c.ttl, Some(std::time::Duration::from_secs(20)));
        assert_eq!(c.timeout, Some(std::time::Duration::from_secs(3)));
        assert_eq!(c.drift, None);
        let shown = format!("{c:?}");
        assert!(!shown.contains("pw") && !shown.contains("p%40w"), "{shown}");
    }

    #[test]
    fn the_dual_ttl_is_the_default_ttl_of_each_store() {
        let c = DualConfig::parse(&format!(
            "dual://?first={}&second={}&ttl=3s",
            enc("zk://u:a?b@h:2181/app"),
            enc("redis://h:6379/0?ttl=9s")
        ))
        .unwrap();
        assert_eq!(
            c.store_urls(),
            (
                "zk://u:a?b@h:2181/app?ttl=3000ms".to_owned(),
                "redis://h:6379/0?ttl=9s".to_owned()
            )
        );
        let c = DualConfig::parse("dual://?first=zk://h/app&second=redis://h").unwrap();
        assert_eq!(
            c.store_urls(),
            ("zk://h/app".to_owned(), "redis://h".to_owned()),
            "without a dual ttl each store keeps its own"
        );
    }

    #[test]
    fn unencoded_urls_without_special_characters_work() {
        let c = DualConfig::parse("dual://?first=zk://h:2181/app&second=redis://h:6379/0").unwrap();
        assert_eq!(c.first, "zk://h:2181/app");
        assert_eq!(c.second, "redis://h:6379/0");
    }

    #[test]
    fn bad_urls_are_refused_with_reasons() {
        for (url, says) in [
            ("dual://?first=zk://h", "`second` is missing"),
            ("dual://?second=zk://h", "`first` is missing"),
            ("dual://h:1?first=zk://h&second=redis://h", "not a host"),
            (
                "dual://?first=zk://h&second=redis://h&prefix=x",
                "unknown option `prefix`",
            ),
            (
                "dual://?first=zk://h&first=zk://g&second=redis://h",
                "given twice",
            ),
            ("dual://?first=zk://h&second=redis+cluster://h", "%2B"),
            (
                "dual://?first=h:2181&second=redis://h",
                "must be a store URL",
            ),
            (
                "dual://?first=dual://x&second=redis://h",
                "itself a dual URL",
            ),
            ("dual://?first=redis://h&second=redis://h", "the same store"),
            ("dual://?first=zk://h&second=redis://h&ttl=1ms", "ttl"),
        ] {
            let e = DualConfig::parse(url).expect_err(url).to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        assert!(matches!(
            DualConfig::parse("redis://h"),
            Err(Error::UnsupportedScheme { .. })
        ));
    }

    #[test]
    fn errors_never_show_inner_passwords() {
        let url = format!(
            "dual://?first={}&second=redis://h&prefix=1",
            enc("zk://u:hunter2@h:1")
        );
        let e = DualConfig::parse(&url).unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
        let e = DualConfig::parse("dual://?first=hunter2@h:1&second=redis://h")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a store URL"), "{e}");
    }
}
