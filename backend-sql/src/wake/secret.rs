//! A queued waiter's secret: what lets it tell a hand-over that the store made from a
//! notification that anyone could send.
//!
//! PostgreSQL lets every role that can connect `LISTEN` and `NOTIFY` on any channel, with no
//! right on this crate's tables. So the waiter stores a fresh random secret in its own waiter
//! row when it joins, and a hand-over's notification carries a tag of what it grants, made with
//! the secret it read from that row (SHA-256 over the secret, the fields and the secret again,
//! computed by the statement). The secret itself is never sent on a channel: only a writer
//! that can read the waiters table can make the tag, and a tag fits one grant of one join.

use std::fmt;

use sha2::{Digest, Sha256};

/// A waiter's secret for one join (128 random bits), bound as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret([u8; 16]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh secret.
    pub fn random() -> Self {
        Secret(rand::random())
    }

    /// How it is stored: 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// The tag of `fields` made with this secret, as the hand-over statement makes it:
    /// the SHA-256 of `<secret>,<fields>,<secret>` in lowercase hex.
    pub fn tag(&self, fields: &str) -> String {
        let secret = self.hex();
        let mut digest = Sha256::new();
        for part in [secret.as_str(), ",", fields, ",", secret.as_str()] {
            digest.update(part.as_bytes());
        }
        hex(&digest.finalize())
    }

    /// Whether `tag` is this secret's tag of `fields`.
    pub fn signed(&self, fields: &str, tag: &str) -> bool {
        let mine = self.tag(fields);
        // Compared in full whatever differs first: how long a wrong tag took says nothing.
        mine.len() == tag.len()
            && mine
                .bytes()
                .zip(tag.bytes())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tag is the SHA-256 of the secret's hex, the fields and the hex again, with commas
    /// between (what the hand-over statement hashes); it fits those fields and that secret only.
    #[test]
    fn the_tag_is_sha256_of_the_secret_around_the_fields() {
        let mut one = [0u8; 16];
        one[15] = 1;
        let secret = Secret(one);
        assert_eq!(secret.hex(), format!("{}1", "0".repeat(31)));
        let text = format!("{0},5,6,{0}", secret.hex());
        let expected = hex(&Sha256::digest(text.as_bytes()));
        assert_eq!(secret.tag("5,6"), expected);
        assert!(secret.signed("5,6", &expected));
        assert!(!secret.signed("5,7", &expected), "another grant's fields");
        assert!(!Secret::random().signed("5,6", &expected), "another secret");
        assert!(!secret.signed("5,6", &expected[..63]), "a cut tag");
    }
}
