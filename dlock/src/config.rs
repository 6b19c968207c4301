//! [`LockConfig`]: a connection described in an application's own configuration file.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Error, Result, redact};

/// Where a [`LockConfig`] error is reported from.
const CONFIG: &str = "dlock config";

/// A lock store connection as an application keeps it in its own TOML/JSON/YAML configuration.
///
/// ```
/// let cfg: dlock::LockConfig = serde_json::from_str(
///     r#"{ "url": "memory://jobs", "ttl": "10s", "timeout": "2s" }"#,
/// ).unwrap();
/// assert_eq!(cfg.url_with_options().unwrap(), "memory://jobs?ttl=10s&timeout=2s");
/// ```
///
/// Durations are humantime strings (`"30s"`, `"250ms"`, `"1m 30s"`). Unknown fields are
/// rejected, so a typo does not silently fall back to a default.
///
/// **Precedence: the configuration's fields win over the same option in the URL's query
/// string.** The URL often comes from a secret store or an environment variable shared between
/// programs, while `ttl`/`drift`/`timeout` are the application's own tuning; the explicit,
/// typed field is the one the application author wrote for this program. When both are given
/// with different values, the URL's value is dropped and a warning is logged (with the URL
/// redacted).
#[derive(Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LockConfig {
    /// Connection URL, e.g. `redis://:secret@cache:6379/0?prefix=app` or `memory://default`.
    pub url: String,
    /// Default lease ttl for acquisitions that do not set one (the URL option `ttl`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub ttl: Option<Duration>,
    /// Clock drift allowance (the URL option `drift`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub drift: Option<Duration>,
    /// Time limit for one round trip to the store (the URL option `timeout`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub timeout: Option<Duration>,
    /// Further backend options merged into the query string the same way (`prefix`, `table`,
    /// `session_timeout`, ...). Values may not contain `&`, `#`, `=` or whitespace; put such
    /// values percent-encoded into the URL instead.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockConfig")
            .field("url", &redact(&self.url))
            .field("ttl", &self.ttl)
            .field("drift", &self.drift)
            .field("timeout", &self.timeout)
            .field("options", &self.options)
            .finish()
    }
}

impl LockConfig {
    /// A configuration for `url` with no overrides.
    pub fn new(url: impl Into<String>) -> Self {
        LockConfig {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Sets the default ttl.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the drift allowance.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// Sets the per-request timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets a further backend option (`prefix`, `table`, ...).
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// The URL with the configuration's options merged into its query string (configuration
    /// wins; see the type's docs). Durations are written as whole seconds, milliseconds,
    /// microseconds or nanoseconds (`30s`, `250ms`), whichever is exact.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty URL or an option key or value that cannot be put
    /// into a query string.
    pub fn url_with_options(&self) -> Result<String> {
        if self.url.trim().is_empty() {
            return Err(Error::invalid_config(CONFIG, "`url` is empty"));
        }
        let mut overrides: Vec<(String, String)> = Vec::new();
        for (key, value) in [
            ("ttl", self.ttl),
            ("drift", self.drift),
            ("timeout", self.timeout),
        ] {
            if let Some(d) = value {
                overrides.push((key.to_owned(), format_duration(d)));
            }
        }
        for (key, value) in &self.options {
            if matches!(key.as_str(), "ttl" | "drift" | "timeout") {
                return Err(Error::invalid_config(
                    CONFIG,
                    format!("set `{key}` as its own field, not under `options`"),
                ));
            }
            check_key(key)?;
            check_value(key, value)?;
            overrides.push((key.clone(), value.clone()));
        }
        Ok(merge_query(&self.url, &overrides))
    }
}

fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_config(
            CONFIG,
            format!("option name `{key}` must be letters, digits, `_`, `-` or `.`"),
        ))
    }
}

fn check_value(key: &str, value: &str) -> Result<()> {
    if value
        .chars()
        .any(|c| matches!(c, '&' | '#' | '=') || c.is_whitespace())
    {
        return Err(Error::invalid_config(
            CONFIG,
            format!(
                "the value of option `{key}` contains `&`, `#`, `=` or whitespace; put it percent-encoded into the URL"
            ),
        ));
    }
    Ok(())
}

/// Replaces (or adds) `overrides` in `url`'s query string, keeping the other parameters and
/// their order, and any `#fragment`.
fn merge_query(url: &str, overrides: &[(String, String)]) -> String {
    if overrides.is_empty() {
        return url.to_owned();
    }
    // The query is found by the one URL rule (a password may contain `?` or `#`).
    let parts = match lockcore::backend_support::UrlParts::split(url) {
        Ok(parts) => parts,
        // Connecting will say what is wrong with it; the options are added at the end.
        Err(_) => {
            let params: Vec<String> = overrides.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let sep = if url.contains('?') { '&' } else { '?' };
            return format!("{url}{sep}{}", params.join("&"));
        }
    };
    let query = parts.query;
    let mut params: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        match overrides.iter().find(|(k, _)| k == key) {
            Some((_, new)) => {
                let old = pair.split_once('=').map_or("", |(_, v)| v);
                if old != new {
                    tracing::warn!(
                        url = %redact(url),
                        option = key,
                        "option given both in the URL and in the configuration; the configuration's value is used"
                    );
                }
            }
            None => params.push(pair.to_owned()),
        }
    }
    params.extend(overrides.iter().map(|(k, v)| format!("{k}={v}")));
    parts.with_query(&params.join("&"))
}

/// `d` as the largest exact unit humantime parses back: `30s`, `250ms`, `1500us`, `7ns`.
fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", d.as_secs())
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| {
        humantime::parse_duration(t.trim()).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{t}` is not a duration ({e}); try \"30s\" or \"250ms\""
            ))
        })
    })
    .transpose()
}

fn ser_duration<S: Serializer>(d: &Option<Duration>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_replaces_and_appends() {
        let o = vec![("ttl".to_owned(), "5s".to_owned())];
        assert_eq!(merge_query("memory://a", &o), "memory://a?ttl=5s");
        assert_eq!(
            merge_query("memory://a?x=1&ttl=9s&y=2#f", &o),
            "memory://a?x=1&y=2&ttl=5s#f"
        );
    }

    #[test]
    fn merge_finds_the_query_after_a_password_with_url_characters() {
        let o = vec![("ttl".to_owned(), "3s".to_owned())];
        assert_eq!(
            merge_query("redis://:a?b#c@h:1/0", &o),
            "redis://:a?b#c@h:1/0?ttl=3s"
        );
        assert_eq!(
            merge_query("zk://u:p/w@h/app?ttl=9s&prefix=x", &o),
            "zk://u:p/w@h/app?prefix=x&ttl=3s"
        );
    }

    #[test]
    fn durations_roundtrip() {
        for d in [
            Duration::from_secs(30),
            Duration::from_millis(250),
            Duration::from_micros(1500),
            Duration::from_nanos(7),
        ] {
            assert_eq!(humantime::parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
