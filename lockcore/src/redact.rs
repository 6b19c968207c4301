//! Keeping credentials out of every message: one rule for every scheme, on text that need not
//! be a valid URL.
//!
//! Users paste passwords into URLs without percent-encoding them, so a password may hold `/`,
//! `@`, `:`, `#`, `?` or `%`. The rule therefore never parses the URL; it hides more rather than
//! less:
//!
//! * After `scheme://`, unless what follows starts with `/` (no authority: `sqlite:///path`),
//!   the user ends at the first `:` or `@`. If it ends at `:` and an `@` comes later anywhere
//!   in the text, everything from that `:` to the **last** `@` is the password.
//! * The values of `password=`-like query parameters (`password`, `passwd`, `pass`, `pwd`,
//!   `secret`, `token`, `auth`, `sslpassword`, compared case-insensitively) are hidden.
//! * A query parameter whose value is itself a URL (percent-encoded or not, as in
//!   `dual://?first=zk%3A%2F%2Fu%3Apw%40h&second=...`) is redacted by the same rule, and
//!   written back in the form it came in.
//!
//! [`redact_url`] applies the rule to a URL. [`scrub`] removes the same secrets (as written and
//! percent-decoded) from any other text, such as an error message from a driver that quoted a
//! part of the URL.

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

/// Where the password of `text` is, as a byte range, by the rule above.
fn password_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find("://")? + 3;
    let rest = &text[start..];
    // `scheme:///path` has no authority; `scheme://?query` neither (a user name never starts
    // with `?`, and the query may hold URLs of its own).
    if rest.starts_with(['/', '?']) {
        return None;
    }
    let user_end = rest.find([':', '@'])?;
    if rest.as_bytes()[user_end] != b':' {
        return None;
    }
    let last_at = rest.rfind('@')?;
    (last_at > user_end).then_some((start + user_end + 1, start + last_at))
}

/// The byte ranges of secret query-parameter values in `text`.
fn query_secret_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut pos = 0;
    // A parameter starts after '?', '&' or ';'.
    while let Some(sep) = text[pos..].find(['?', '&', ';']) {
        let key_start = pos + sep + 1;
        let key_end = text[key_start..]
            .find(['=', '&', ';', '#'])
            .map_or(text.len(), |i| key_start + i);
        pos = key_start;
        if text[key_end..].starts_with('=')
            && SECRET_PARAMS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(&text[key_start..key_end]))
        {
            let value_start = key_end + 1;
            let value_end = text[value_start..]
                .find(['&', ';', '#'])
                .map_or(text.len(), |i| value_start + i);
            spans.push((value_start, value_end));
            pos = value_end;
        }
    }
    spans
}

/// `url` with every password replaced by `***`: the password of its user-info and the values
/// of `password=`-like query parameters. Works on any text, valid URL or not.
///
/// ```
/// use lockcore::redact_url;
/// assert_eq!(redact_url("redis://alice:s3cret@cache:6379/0"), "redis://alice:***@cache:6379/0");
/// assert_eq!(redact_url("postgres://u:pa/ss@db:1/app"), "postgres://u:***@db:1/app");
/// assert_eq!(redact_url("postgres://db/locks?user=a&password=x"), "postgres://db/locks?user=a&password=***");
/// assert_eq!(redact_url("sqlite:///home/a@b/locks.db"), "sqlite:///home/a@b/locks.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let mut spans: Vec<(usize, usize, String)> = query_secret_spans(url)
        .into_iter()
        .map(|(s, e)| (s, e, MASK.to_owned()))
        .collect();
    let password = password_span(url);
    if password.is_none() {
        spans.extend(nested_url_spans(url));
    }
    if let Some((start, end)) = password {
        // The password hides whatever query-like text it contains.
        spans.retain(|&(s, _, _)| s >= end);
        spans.push((start, end, MASK.to_owned()));
    }
    spans.sort_unstable_by_key(|&(s, e, _)| (s, e));
    let mut out = String::with_capacity(url.len());
    let mut pos = 0;
    for (start, end, replacement) in spans {
        if start < pos {
            continue;
        }
        out.push_str(&url[pos..start]);
        out.push_str(&replacement);
        pos = end;
    }
    out.push_str(&url[pos..]);
    out
}

/// Query parameter values of `text` that are URLs holding a secret, with their redacted form
/// (percent-encoded again when the value came encoded).
fn nested_url_spans(text: &str) -> Vec<(usize, usize, String)> {
    let Some(query_start) = text.find('?').map(|q| q + 1) else {
        return Vec::new();
    };
    let query_end = text[query_start..]
        .find('#')
        .map_or(text.len(), |i| query_start + i);
    let mut spans = Vec::new();
    let mut pos = query_start;
    for param in text[query_start..query_end].split('&') {
        let start = pos;
        pos += param.len() + 1;
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        let value_start = start + key.len() + 1;
        let value_end = value_start + value.len();
        if value.contains("://") {
            let shown = redact_url(value);
            if shown != value {
                spans.push((value_start, value_end, shown));
            }
        } else {
            let decoded = crate::percent::percent_decode_lossy(value);
            if decoded.contains("://") {
                let shown = redact_url(&decoded);
                if shown != decoded {
                    spans.push((value_start, value_end, percent_encode(&shown)));
                }
            }
        }
    }
    spans
}

/// Percent-encodes everything but unreserved characters and the mask's `*`.
fn percent_encode(text: &str) -> String {
    crate::percent::encode_keeping(text, b"*")
}

/// The secrets [`redact_url`] hides in `url`, as written and percent-decoded (empty ones left
/// out).
pub fn secrets_of(url: &str) -> Vec<String> {
    let mut spans = query_secret_spans(url);
    spans.extend(password_span(url));
    let mut secrets = Vec::new();
    for (start, end) in spans {
        let raw = &url[start..end];
        if raw.is_empty() {
            continue;
        }
        let decoded = crate::percent::percent_decode_lossy(raw);
        if decoded != raw && !decoded.is_empty() {
            secrets.push(decoded);
        }
        secrets.push(raw.to_owned());
    }
    if password_span(url).is_none()
        && let Some(q) = url.find('?')
    {
        for param in url[q + 1..].split(['&', '#']) {
            if let Some((_, value)) = param.split_once('=') {
                let decoded = crate::percent::percent_decode_lossy(value);
                if decoded.contains("://") {
                    secrets.extend(secrets_of(&decoded));
                }
            }
        }
    }
    // Longest first, so that a secret containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `text` (an error message, a log line) with every secret of `url` replaced by `***`, and any
/// URL in it redacted by the same rule.
pub fn scrub(text: &str, url: &str) -> String {
    let mut out = redact_url(text);
    for secret in secrets_of(url) {
        out = out.replace(&secret, MASK);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORDS: &[&str] = &[
        "s3cret",
        "pa/ss",
        "p@ss",
        "pa:ss",
        "pa#ss",
        "pa?ss",
        "pa%ss",
        "pa%2Fss",
        "a/b?c#d@e:f%",
        "pa&ss=1",
    ];
    const SCHEMES: &[&str] = &[
        "sqlite",
        "postgres",
        "postgresql",
        "mysql",
        "mariadb",
        "redis",
        "rediss",
        "redis+cluster",
        "redlock",
        "zk",
        "tair",
        "memory",
        "nosuch",
    ];

    #[test]
    fn no_password_survives_in_any_scheme_or_position() {
        for scheme in SCHEMES {
            for pw in PASSWORDS {
                for rest in [
                    "h:1/db",
                    "h:1",
                    "h1:1,h2:2,h3:3/chroot?ttl=5s",
                    "127.0.0.1:1/db?sslmode=disable",
                    "h/db?cert=/etc/a.pem",
                ] {
                    let url = format!("{scheme}://user:{pw}@{rest}");
                    let shown = redact_url(&url);
                    assert!(!shown.contains(pw), "{url} shown as {shown}");
                    assert!(
                        shown.starts_with(&format!("{scheme}://user:***@")),
                        "{shown}"
                    );
                    let message = format!("cannot parse the URL {url}: bad port near {pw}");
                    assert!(!scrub(&message, &url).contains(pw), "{message}");
                }
                let url = format!("{scheme}://h:1/db?user=u&password={pw}");
                assert!(!redact_url(&url).contains(pw), "{url}");
            }
        }
    }

    #[test]
    fn what_holds_no_password_is_left_alone() {
        for url in [
            "redis://u@h:1/0",
            "redis://h:6379",
            "sqlite:///home/a@b/locks.db",
            "sqlite:locks.db",
            "memory://default",
            "redis://h?passwordless=1",
            "not a url at all",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(redact_url("redis://:p@h"), "redis://:***@h");
        assert_eq!(redact_url("redis://h?password="), "redis://h?password=***");
        assert_eq!(
            redact_url("mysql://h/db?a=1&PASSWORD=x#f"),
            "mysql://h/db?a=1&PASSWORD=***#f"
        );
    }

    #[test]
    fn urls_inside_query_values_are_redacted_in_their_own_form() {
        for pw in PASSWORDS {
            let zk = format!("zk://u:{pw}@h1:1,h2:2/app?ttl=5s");
            let redis = format!("redis://:{pw}@h:1/0");
            let encoded = format!(
                "dual://?first={}&second={}&ttl=9s",
                percent_encode(&zk),
                percent_encode(&redis)
            );
            let shown = redact_url(&encoded);
            assert!(!shown.contains(pw), "{encoded} shown as {shown}");
            assert!(
                !shown.contains(&percent_encode(pw)),
                "{encoded} shown as {shown}"
            );
            assert!(shown.ends_with("&ttl=9s"), "{shown}");
            let first = shown
                .split_once("first=")
                .and_then(|(_, r)| r.split_once('&'))
                .map(|(v, _)| crate::percent::percent_decode_lossy(v))
                .expect("first=");
            assert_eq!(first, "zk://u:***@h1:1,h2:2/app?ttl=5s");
            let message = format!("second store failed: {redis}");
            assert!(!scrub(&message, &encoded).contains(pw), "{message}");
        }
        assert_eq!(
            redact_url("dual://?first=zk://u:pw@h:1&second=redis://h:2"),
            "dual://?first=zk://u:***@h:1&second=redis://h:2"
        );
        let plain = "dual://?first=zk%3A%2F%2Fh%3A1&second=redis%3A%2F%2Fh%3A2";
        assert_eq!(redact_url(plain), plain);
    }

    #[test]
    fn scrub_removes_decoded_secrets_from_other_text() {
        let url = "postgres://u:pa%2Fss@h/db";
        let text = "password authentication failed: pa/ss and pa%2Fss";
        assert_eq!(
            scrub(text, url),
            "password authentication failed: *** and ***"
        );
        assert_eq!(secrets_of("redis://h:1"), Vec::<String>::new());
    }
}
