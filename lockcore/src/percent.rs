//! Percent-decoding of URL parts (user info, paths, query values): one implementation for every
//! backend's URL parser and for [`redact_url`](crate::redact_url).

use std::fmt;

/// Why a text is not validly percent-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentError {
    /// A `%` that is not followed by two hex digits.
    BadEscape,
    /// The decoded bytes are not UTF-8.
    NotUtf8,
}

impl fmt::Display for PercentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PercentError::BadEscape => "bad percent-encoding (expected %XX)",
            PercentError::NotUtf8 => "percent-encoding does not decode to UTF-8",
        })
    }
}

impl std::error::Error for PercentError {}

/// The byte a `%XX` escape at `i` stands for, if `bytes[i..]` starts with one.
fn escape_at(bytes: &[u8], i: usize) -> Option<u8> {
    if bytes.get(i) != Some(&b'%') {
        return None;
    }
    let hex = bytes.get(i + 1..i + 3)?;
    // Two hex digits exactly (`from_str_radix` alone would take a sign, as in `%+1`).
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// Decodes every `%XX` escape; with `strict`, a `%` without two hex digits is an error,
/// otherwise it is kept as it is.
fn decode(text: &str, strict: bool) -> Result<Vec<u8>, PercentError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match escape_at(bytes, i) {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None if strict && bytes[i] == b'%' => return Err(PercentError::BadEscape),
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Decodes the `%XX` escapes of `text` (`+` stays a `+`).
///
/// # Errors
/// [`PercentError::BadEscape`] for a `%` without two hex digits after it,
/// [`PercentError::NotUtf8`] when the result is not UTF-8.
pub fn percent_decode(text: &str) -> Result<String, PercentError> {
    String::from_utf8(decode(text, true)?).map_err(|_| PercentError::NotUtf8)
}

/// Percent-encodes every byte of `text` but the unreserved characters (letters, digits, `-`,
/// `.`, `_`, `~`), so that it can stand anywhere in a URL.
pub fn percent_encode(text: &str) -> String {
    encode_keeping(text, b"")
}

/// As [`percent_encode`], also keeping the bytes in `keep`.
pub(crate) fn encode_keeping(text: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// As [`percent_decode`], but never fails: a malformed escape is kept, bytes that are not UTF-8
/// become U+FFFD. For looking for secrets in text that may not be a valid URL.
pub(crate) fn percent_decode_lossy(text: &str) -> String {
    let bytes = decode(text, false).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_says_what_is_wrong() {
        assert_eq!(percent_decode("p%40ss%2Fw%3Ard+x").unwrap(), "p@ss/w:rd+x");
        assert_eq!(percent_decode("%e2%82%AC").unwrap(), "€");
        assert_eq!(percent_decode("a%4"), Err(PercentError::BadEscape));
        assert_eq!(percent_decode("a%zz"), Err(PercentError::BadEscape));
        assert_eq!(percent_decode("%+1"), Err(PercentError::BadEscape));
        assert_eq!(percent_decode("%ff"), Err(PercentError::NotUtf8));
        assert_eq!(percent_decode_lossy("a%zz%41%"), "a%zzA%");
        assert_eq!(percent_decode_lossy("%ff!"), "\u{fffd}!");
    }
}
