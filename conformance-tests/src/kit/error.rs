//! The kit's one error type.

use std::fmt;

/// What went wrong in the kit, for tests that want to tell failures apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KitErrorKind {
    /// A server or tool binary is not installed; the message names the Debian package.
    MissingBinary,
    /// A server process exited before it answered.
    ServerExited,
    /// A server did not answer within the start-up timeout.
    NotReady,
    /// A helper command (initdb, psql, mariadb, ...) failed.
    Command,
    /// An I/O error in the kit itself (temp dirs, sockets, spawning).
    Io,
    /// A bad argument (for example a database name the kit refuses to quote).
    InvalidArgument,
}

/// An error from the test kit: a clear message, with the server's log tail where there is one.
///
/// When a binary is missing the message names the package to install, for example
/// ``redis-server not found: install it with `apt-get install redis-server` or run scripts/install-deps``.
#[derive(Debug, Clone)]
pub struct KitError {
    kind: KitErrorKind,
    message: String,
}

impl KitError {
    /// An error of `kind` with `message` (for servers and spawners written outside the kit).
    pub fn new(kind: KitErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A binary that is not installed, with the Debian package that provides it.
    pub(crate) fn missing(binary: &str, package: &str) -> Self {
        Self::new(
            KitErrorKind::MissingBinary,
            format!(
                "{binary} not found: install it with `apt-get install {package}` or run scripts/install-deps"
            ),
        )
    }

    /// An I/O error with what the kit was doing.
    pub(crate) fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        Self::new(KitErrorKind::Io, format!("{context}: {err}"))
    }

    /// Which kind of failure this is.
    pub fn kind(&self) -> KitErrorKind {
        self.kind
    }

    /// The full message (the same text as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for KitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KitError {}

/// The kit's result type.
pub type KitResult<T> = Result<T, KitError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_package_to_install() {
        let err = KitError::missing("redis-server", "redis-server");
        assert_eq!(err.kind(), KitErrorKind::MissingBinary);
        assert_eq!(
            err.to_string(),
            "redis-server not found: install it with `apt-get install redis-server` or run scripts/install-deps"
        );
    }

    #[test]
    fn binary_lookup_fails_with_the_package_name() {
        let err = crate::kit::host::find_binary("dlock-kit-no-such-binary", "dlock-pkg")
            .expect_err("no such binary");
        assert_eq!(err.kind(), KitErrorKind::MissingBinary);
        assert!(
            err.to_string().contains("apt-get install dlock-pkg"),
            "{err}"
        );
    }
}
