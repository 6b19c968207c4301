//! Removing credentials from connection URLs before they reach a message or a log.

/// Query parameter names whose values are secrets (compared case-insensitively).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "passwd",
    "pass",
    "pwd",
    "secret",
    "token",
    "auth",
    "sslpassword",
];

const MASK: &str = "***";

/// `url` with every password replaced by `***`: the password in `user:pass@` (one or several hosts,
/// also `:pass@` without a user) and the values of `password=`-like query parameters (`password`,
/// `passwd`, `pass`, `pwd`, `secret`, `token`, `auth`, `sslpassword`).
///
/// The URL is never parsed with the `url` crate, so multi-host URLs (`redlock://u:p@h1:1,h2:2`)
/// and unencoded special characters in a password are handled. When in doubt it hides more
/// rather than less: an unencoded `/` in a password hides everything up to the last `@` before
/// the query string.
///
/// ```
/// assert_eq!(dlock::redact("redis://alice:s3cret@cache:6379/0"), "redis://alice:***@cache:6379/0");
/// assert_eq!(dlock::redact("postgres://db/locks?user=a&password=x"), "postgres://db/locks?user=a&password=***");
/// assert_eq!(dlock::redact("memory://default"), "memory://default");
/// ```
pub fn redact(url: &str) -> String {
    let without_userinfo = redact_userinfo(url);
    redact_query(&without_userinfo)
}

fn redact_userinfo(url: &str) -> String {
    let Some(sep) = url.find("://") else {
        return url.to_owned();
    };
    let (head, rest) = url.split_at(sep + 3);
    // The authority normally ends at the first '/'. A password may contain '?', '#' or ','
    // unencoded, so only '/' ends it here.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let userinfo_end = match authority.rfind('@') {
        Some(at) => Some(at),
        // No '@' before the first '/': a password containing '/' unencoded
        // (`u:pa/ss@host/db`) still has its '@' later, before the query. Only look there if the
        // text before the '/' looks like `user:pass`.
        None if authority.contains(':') => {
            let query_start = rest.find('?').unwrap_or(rest.len());
            rest[..query_start]
                .rfind('@')
                .filter(|&at| at > authority_end)
        }
        None => None,
    };
    let Some(end) = userinfo_end else {
        return url.to_owned();
    };
    let userinfo = &rest[..end];
    let redacted = match userinfo.find(':') {
        Some(colon) => format!("{}:{MASK}", &userinfo[..colon]),
        // `user@host`: no password to hide.
        None => userinfo.to_owned(),
    };
    format!("{head}{redacted}{}", &rest[end..])
}

fn redact_query(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    // Walk parameter by parameter: a parameter starts after '?', '&' or ';'.
    while let Some(pos) = rest.find(['?', '&', ';']) {
        out.push_str(&rest[..=pos]);
        rest = &rest[pos + 1..];
        let key_end = rest.find(['=', '&', ';', '#']).unwrap_or(rest.len());
        let key = &rest[..key_end];
        if rest[key_end..].starts_with('=')
            && SECRET_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(key))
        {
            let value_end = rest[key_end + 1..]
                .find(['&', ';', '#'])
                .map_or(rest.len(), |i| key_end + 1 + i);
            out.push_str(key);
            out.push('=');
            out.push_str(MASK);
            rest = &rest[value_end..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn userinfo_forms() {
        assert_eq!(redact("redis://u:p@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:p@h"), "redis://:***@h");
        assert_eq!(redact("redis://u@h"), "redis://u@h");
        assert_eq!(redact("redis://u:p@ss@h"), "redis://u:***@h");
        assert_eq!(redact("redis://u:pa/ss@h/0"), "redis://u:***@h/0");
        assert_eq!(redact("redis://u:pa?ss@h/0?x=1"), "redis://u:***@h/0?x=1");
        assert_eq!(
            redact("redlock://u:p@h1:1,h2:2,h3:3"),
            "redlock://u:***@h1:1,h2:2,h3:3"
        );
        assert_eq!(
            redact("sqlite:///home/a@b/locks.db"),
            "sqlite:///home/a@b/locks.db"
        );
        assert_eq!(redact("sqlite:locks.db"), "sqlite:locks.db");
    }

    #[test]
    fn query_forms() {
        assert_eq!(
            redact("postgres://h/db?password=x&ttl=5s"),
            "postgres://h/db?password=***&ttl=5s"
        );
        assert_eq!(
            redact("mysql://h/db?a=1&PASSWORD=x"),
            "mysql://h/db?a=1&PASSWORD=***"
        );
        assert_eq!(redact("redis://h?auth=x#frag"), "redis://h?auth=***#frag");
        assert_eq!(
            redact("redis://h?passwordless=1"),
            "redis://h?passwordless=1"
        );
        assert_eq!(redact("redis://h?password="), "redis://h?password=***");
    }
}
