//! Removing credentials from connection URLs before they reach a message or a log: the one rule
//! of [`lockcore::redact_url`], under the facade's name.

/// `url` with every password replaced by `***` (see [`lockcore::redact_url`] for the rule: it
/// works on text that is not a valid URL, and on passwords with unencoded `/`, `@`, `:`, `#`,
/// `?` or `%`).
///
/// ```
/// assert_eq!(dlock::redact("redis://alice:s3cret@cache:6379/0"), "redis://alice:***@cache:6379/0");
/// assert_eq!(dlock::redact("postgres://u:pa/ss@db/app"), "postgres://u:***@db/app");
/// assert_eq!(dlock::redact("memory://default"), "memory://default");
/// ```
pub fn redact(url: &str) -> String {
    lockcore::redact_url(url)
}
