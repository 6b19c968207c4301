//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// Longest accepted name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 1024;

/// A validated lock name: non-empty UTF-8, at most [`MAX_NAME_BYTES`] bytes, no NUL.
///
/// Names are case-sensitive and every backend keeps distinct names distinct (by escaping or by
/// hashing with a suffix, never by truncating). Cloning is cheap.
///
/// One exception: where a store shares its locks with other libraries by path, a name *is* that
/// path, and names that are no such path are refused with
/// [`Error::InvalidName`] before any I/O. On `zk://` with
/// `layout=curator` or `layout=kazoo` the name is the znode path under the chroot (`a/b` is
/// `{chroot}/a/b`), so an empty, `.` or `..` segment, a character ZooKeeper refuses in a path, or
/// `zookeeper/...` without a chroot is refused. Such a backend says so in
/// [`Capabilities::path_names`](crate::Capabilities::path_names), and the shared suite's
/// unusual-names case does not apply to it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] if it is empty, contains NUL, or is longer than 1024 bytes.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Error::InvalidName {
                reason: "the name is empty".into(),
            });
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::InvalidName {
                reason: format!(
                    "the name is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
                    name.len()
                ),
            });
        }
        if let Some(at) = name.find('\0') {
            return Err(Error::InvalidName {
                reason: format!("the name contains NUL at byte {at}"),
            });
        }
        Ok(LockName(Arc::from(name)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name with every byte outside `[A-Za-z0-9_-]` written as `%XX`, so the result is safe
    /// as a path segment, a key part or a node name and distinct names stay distinct
    /// (`.`/`..` and case differences included).
    pub fn escaped(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        self.escape_into(&mut out);
        out
    }

    /// The name whose [`escaped`](Self::escaped) form is `text`; `None` when `text` is not
    /// such a form (a byte outside `[A-Za-z0-9_%-]`, a malformed or needless `%XX`, or an
    /// invalid name once decoded). Stores that keep escaped names use it to list them.
    pub fn from_escaped(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' => {
                    let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                    if hex.bytes().any(|h| h.is_ascii_lowercase()) {
                        return None;
                    }
                    let b = u8::from_str_radix(hex, 16).ok()?;
                    if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                        return None;
                    }
                    out.push(b);
                    i += 3;
                }
                b if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' => {
                    out.push(b);
                    i += 1;
                }
                _ => return None,
            }
        }
        LockName::new(String::from_utf8(out).ok()?).ok()
    }

    /// Appends [`LockName::escaped`] to `out` (for callers that build a longer key around it).
    pub fn escape_into(&self, out: &mut String) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        for b in self.0.bytes() {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                out.push(b as char);
            } else {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xF)] as char);
            }
        }
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        LockName::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        LockName::new(value)
    }
}

impl std::str::FromStr for LockName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_round_trip_and_nothing_else_parses() {
        for name in [
            "a",
            "orders/daily",
            ".",
            "..",
            "Ünïcode ☃",
            "100%",
            "a-b_c",
            "%41",
        ] {
            let n = LockName::new(name).unwrap();
            assert_eq!(
                LockName::from_escaped(&n.escaped()),
                Some(n.clone()),
                "{name}"
            );
        }
        for text in ["", "a/b", "%4", "%zz", "%41", "%2f", "a~1", "%00"] {
            assert_eq!(LockName::from_escaped(text), None, "{text}");
        }
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(LockName::new(""), Err(Error::InvalidName { .. })));
        assert!(matches!(
            LockName::new("a\0b"),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            LockName::new("x".repeat(1025)),
            Err(Error::InvalidName { .. })
        ));
        assert!(LockName::new("x".repeat(1024)).is_ok());
    }

    #[test]
    fn escaping_keeps_names_distinct() {
        let names = [".", "..", "a/b", "a%2Fb", "A", "a", "zookeeper", "ä", "a b"];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let e = LockName::new(n).unwrap().escaped();
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"%_-".contains(&b)),
                "{e}"
            );
            assert!(seen.insert(e.clone()), "collision on {e}");
        }
    }
}
