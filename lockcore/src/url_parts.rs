//! Splitting a store URL into user, password, hosts, path and query: one rule for every scheme,
//! so that a password works (or is refused) the same way on all of them.
//!
//! Users paste passwords into URLs without percent-encoding them, so a password may hold `/`,
//! `?`, `#`, `:` or `@`. A standard URL parser would end the authority at the first `/`, `?` or
//! `#` and read part of such a password as the host or port (and then quote it in its error).
//! The rule here: **the user-info ends at an `@` after which a host list begins**, a host list
//! being `host[:port]` items separated by commas (a host is letters, digits, `-`, `.`, `_` or an
//! IPv6 address in brackets; a port is digits), followed by the end, `/`, `?` or `#`.
//!
//! When more than one reading fits (a query value that contains `@` and a host-like word after
//! it, say), the first one wins, as in a standard URL, and [`UrlParts::ambiguous`] says so: a
//! parser that then fails on the path or query must not quote them, since they may hold the
//! rest of a password; [`UrlParts::hint`] gives the message to use instead.

use std::fmt;

/// What to tell a user whose URL could not be read, without quoting any of it.
pub const ENCODE_HINT: &str = "a password (or user name) that contains `/`, `?`, `#`, `@`, `%` \
     or `&` must be percent-encoded in the URL: `/` as %2F, `?` as %3F, `#` as %23, `@` as %40, \
     `%` as %25, `&` as %26 (for example with python3 -c 'import urllib.parse,sys; \
     print(urllib.parse.quote(sys.argv[1], safe=\"\"))' PASSWORD)";

/// Why a URL could not be split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// No `scheme://`.
    NoScheme,
    /// No reading of the text puts a valid host list after `scheme://` or after an `@`.
    NoHost {
        /// The characters that, unencoded in a password, commonly cause this.
        offending: Vec<char>,
    },
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::NoScheme => f.write_str("not a URL: expected scheme://..."),
            UrlError::NoHost { offending } if offending.is_empty() => {
                write!(f, "no host: found no valid host[:port] list in the URL")
            }
            UrlError::NoHost { offending } => {
                let chars: Vec<String> = offending.iter().map(|c| format!("`{c}`")).collect();
                write!(
                    f,
                    "no host: found no valid host[:port] list in the URL; its user-info seems to \
                     contain {} unencoded: {ENCODE_HINT}",
                    chars.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for UrlError {}

/// The parts of a URL of the form `scheme://[user[:password]@]hosts[/path][?query][#fragment]`,
/// as written (nothing is percent-decoded).
#[derive(Clone, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// The scheme as written.
    pub scheme: &'a str,
    /// The user name as written (percent-encoded), when the URL has user-info.
    pub user: Option<&'a str>,
    /// The password as written (percent-encoded), when the user-info has a `:`.
    pub password: Option<&'a str>,
    /// The host list as written (`h1:p1,h2:p2`); empty when the URL has no authority
    /// (`sqlite:///path`, `dual://?first=...`).
    pub hosts: &'a str,
    /// From the `/` after the hosts up to the query (empty when there is none).
    pub path: &'a str,
    /// After the `?` (empty when there is none).
    pub query: &'a str,
    /// After a `#`, when there is one.
    pub fragment: Option<&'a str>,
    /// Whether another reading of the text would have found the hosts elsewhere.
    pub ambiguous: bool,
}

impl fmt::Debug for UrlParts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlParts")
            .field("scheme", &self.scheme)
            .field("user", &self.user)
            .field("password", &self.password.map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("fragment", &self.fragment)
            .field("ambiguous", &self.ambiguous)
            .finish()
    }
}

/// Whether `item` is `host`, `host:port`, `[v6]` or `[v6]:port`.
fn valid_host(item: &str) -> bool {
    let (host, port) = if let Some(v6) = item.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return false;
        };
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.' | '%'))
        {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(port) => ("v6", port),
                None => return false,
            },
        }
    } else {
        match item.split_once(':') {
            Some((h, p)) => (h, p),
            None => (item, "0"),
        }
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '%'))
        && !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is a host list (one or more valid hosts separated by commas).
fn valid_host_list(text: &str) -> bool {
    !text.is_empty() && text.split(',').all(valid_host)
}

/// The end of the host list that starts at `start`: the first `/`, `?` or `#`, or the end.
fn hosts_end(rest: &str, start: usize) -> usize {
    rest[start..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| start + i)
}

impl<'a> UrlParts<'a> {
    /// Splits `url` by the rule in the module docs. No I/O, nothing decoded.
    ///
    /// # Errors
    /// [`UrlError::NoScheme`] without `scheme://`; [`UrlError::NoHost`] when the text after
    /// `scheme://` is not `[userinfo@]hosts...` in any reading (and it does not start with `/`
    /// or `?`, which means "no authority").
    pub fn split(url: &'a str) -> Result<Self, UrlError> {
        let (scheme, rest) = url.split_once("://").ok_or(UrlError::NoScheme)?;
        // (start of the hosts, end of the user-info) for each reading that fits.
        let mut readings: Vec<(usize, Option<usize>)> = Vec::new();
        // No authority at all (`sqlite:///path`, `dual://?...`), or hosts right away.
        if rest.is_empty()
            || rest.starts_with(['/', '?', '#'])
            || valid_host_list(&rest[..hosts_end(rest, 0)])
        {
            readings.push((0, None));
        }
        for (at, _) in rest.match_indices('@') {
            let start = at + 1;
            if valid_host_list(&rest[start..hosts_end(rest, start)]) {
                readings.push((start, Some(at)));
            }
        }
        // Without any `@` there is no user-info, so no password to protect: the standard
        // reading stands, and the backend's own host parser says what is wrong with it.
        if readings.is_empty() && !rest.contains('@') {
            readings.push((0, None));
        }
        let Some(&(start, userinfo_end)) = readings.first() else {
            let offending = ['/', '?', '#']
                .into_iter()
                .filter(|c| rest.split('@').next().is_some_and(|s| s.contains(*c)))
                .collect();
            return Err(UrlError::NoHost { offending });
        };
        let (user, password) = match userinfo_end {
            None => (None, None),
            Some(end) => match rest[..end].split_once(':') {
                Some((u, p)) => (Some(u), Some(p)),
                None => (Some(&rest[..end]), None),
            },
        };
        let end = hosts_end(rest, start);
        let hosts = &rest[start..end];
        let after = &rest[end..];
        let (after, fragment) = match after.split_once('#') {
            Some((a, f)) => (a, Some(f)),
            None => (after, None),
        };
        let (path, query) = after.split_once('?').unwrap_or((after, ""));
        Ok(UrlParts {
            scheme,
            user,
            password,
            hosts,
            path,
            query,
            fragment,
            ambiguous: readings.len() > 1,
        })
    }

    /// The URL written back in standard form: the user name and password percent-encoded, so
    /// that a standard URL parser (the `url` crate) reads the same hosts. Nothing else changes.
    ///
    /// # Errors
    /// [`PercentError`](crate::percent::PercentError) naming `user name` or `password` when either is not
    /// valid percent-encoding as written (a `%` without two hex digits).
    pub fn standard(&self) -> Result<String, (&'static str, crate::percent::PercentError)> {
        let mut out = format!("{}://", self.scheme);
        if let Some(user) = self.user {
            let user = crate::percent::percent_decode(user).map_err(|e| ("user name", e))?;
            out.push_str(&crate::percent::percent_encode(&user));
            if let Some(password) = self.password {
                let password =
                    crate::percent::percent_decode(password).map_err(|e| ("password", e))?;
                out.push(':');
                out.push_str(&crate::percent::percent_encode(&password));
            }
            out.push('@');
        }
        out.push_str(self.hosts);
        out.push_str(self.path);
        if !self.query.is_empty() {
            out.push('?');
            out.push_str(self.query);
        }
        if let Some(fragment) = self.fragment {
            out.push('#');
            out.push_str(fragment);
        }
        Ok(out)
    }

    /// The URL as written, with its query replaced by `query` (no `?` when it is empty).
    pub fn with_query(&self, query: &str) -> String {
        let mut out = format!("{}://", self.scheme);
        if let Some(user) = self.user {
            out.push_str(user);
            if let Some(password) = self.password {
                out.push(':');
                out.push_str(password);
            }
            out.push('@');
        }
        out.push_str(self.hosts);
        out.push_str(self.path);
        if !query.is_empty() {
            out.push('?');
            out.push_str(query);
        }
        if let Some(fragment) = self.fragment {
            out.push('#');
            out.push_str(fragment);
        }
        out
    }

    /// `message` when the reading was unambiguous, else a message that quotes nothing of the
    /// path or query (they may hold part of a password) and says how to encode one.
    pub fn hint(&self, message: String) -> String {
        if self.ambiguous {
            format!("the URL could not be read: {ENCODE_HINT}")
        } else {
            message
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> UrlParts<'_> {
        UrlParts::split(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn plain_urls() {
        let p = parts("redis://app:s%40cret@db.example:6380/3?prefix=x");
        assert_eq!(
            (p.scheme, p.user, p.password, p.hosts, p.path, p.query),
            (
                "redis",
                Some("app"),
                Some("s%40cret"),
                "db.example:6380",
                "/3",
                "prefix=x"
            )
        );
        assert!(!p.ambiguous);
        let p = parts("zk://h1:2181,h2,[::1]:2183/app/locks");
        assert_eq!(
            (p.user, p.hosts, p.path),
            (None, "h1:2181,h2,[::1]:2183", "/app/locks")
        );
        let p = parts("sqlite:///home/a@b/locks.db?table=t");
        assert_eq!(
            (p.hosts, p.path, p.query),
            ("", "/home/a@b/locks.db", "table=t")
        );
        let p = parts("dual://?first=zk%3A%2F%2Fh&second=redis://u:p@h");
        assert_eq!((p.hosts, p.path, p.user), ("", "", None));
        let p = parts("redis://:pw@h");
        assert_eq!((p.user, p.password, p.hosts), (Some(""), Some("pw"), "h"));
    }

    #[test]
    fn unencoded_password_characters() {
        for (url, password, hosts) in [
            (
                "redis://user:ab/?s3cr3tXYZ@127.0.0.1:6391",
                "ab/?s3cr3tXYZ",
                "127.0.0.1:6391",
            ),
            ("redis://:ab#cd@127.0.0.1:6391/0", "ab#cd", "127.0.0.1:6391"),
            ("postgres://u:pa/ss@db:1/app", "pa/ss", "db:1"),
            ("mysql://u:p@ss:w/rd@db/app?x=1", "p@ss:w/rd", "db"),
            (
                "zk://u:a?b#c/d@h1:2181,h2:2182/app",
                "a?b#c/d",
                "h1:2181,h2:2182",
            ),
        ] {
            let p = parts(url);
            assert_eq!(p.password, Some(password), "{url}");
            assert_eq!(p.hosts, hosts, "{url}");
            assert!(!p.ambiguous, "{url}");
        }
    }

    #[test]
    fn first_reading_wins_and_ambiguity_is_flagged() {
        // An `@` in a query value after a valid host list.
        let p = parts("redis://h:6379/?ca=/x@y");
        assert_eq!((p.user, p.hosts, p.query), (None, "h:6379", "ca=/x@y"));
        assert!(p.ambiguous);
        assert_eq!(
            p.hint("unknown option `ca`".into()),
            format!("the URL could not be read: {ENCODE_HINT}")
        );
        let p = parts("redis://u:p@host/?ca=/a@b");
        assert_eq!((p.password, p.hosts), (Some("p"), "host"));
        assert!(p.ambiguous);
        assert_eq!(
            parts("redis://u:p@host/0").hint("m".into()),
            "m",
            "an unambiguous reading keeps the parser's own message"
        );
    }

    #[test]
    fn query_replaced_as_written() {
        let url = "redis://u:a/b?c#d@h:1/0?prefix=x#frag";
        let p = parts(url);
        assert_eq!(p.with_query(p.query), url);
        assert_eq!(
            p.with_query("ttl=3s"),
            "redis://u:a/b?c#d@h:1/0?ttl=3s#frag"
        );
        let p = parts("sqlite:///tmp/a.db");
        assert_eq!(p.with_query("ttl=1s"), "sqlite:///tmp/a.db?ttl=1s");
        let p = parts("dual://?first=a&second=b");
        assert_eq!(p.with_query(""), "dual://");
    }

    #[test]
    fn standard_form_encodes_the_user_info_only() {
        assert_eq!(
            parts("postgres://u:pa/ss#1@db:5432/app?sslmode=disable").standard(),
            Ok("postgres://u:pa%2Fss%231@db:5432/app?sslmode=disable".to_owned())
        );
        assert_eq!(
            parts("mysql://a%40b:c@h/d").standard(),
            Ok("mysql://a%40b:c@h/d".to_owned())
        );
        assert_eq!(
            parts("mysql://h/d").standard(),
            Ok("mysql://h/d".to_owned())
        );
        assert!(matches!(
            parts("mysql://u:50%@h/d").standard(),
            Err(("password", _))
        ));
    }

    #[test]
    fn no_host_names_the_characters_but_not_the_password() {
        let e = UrlParts::split("redis://user:ab/?s3cret@").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`/`") && text.contains("`?`"), "{text}");
        assert!(!text.contains("s3cret") && !text.contains("ab"), "{text}");
        assert_eq!(UrlParts::split("nothing").unwrap_err(), UrlError::NoScheme);
        // No `@`, no password: the hosts are read the standard way, for the backend to judge.
        assert_eq!(parts("redis://h:notaport/0").hosts, "h:notaport");
        assert!(!format!("{:?}", parts("redis://u:hunter2@h")).contains("hunter2"));
    }
}
