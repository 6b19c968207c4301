//! Which lock store `run` and `status` use: --url, else $DLOCK_URL, else a per-user SQLite file.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::exit;

/// Where the locks live (run and status).
#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// Lock store URL, e.g. redis://host:6379, postgres://user:pass@host/db, memory://x.
    /// Default: $DLOCK_URL, else a per-user SQLite file (shown below).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true, value_name = "URL")]
    pub(crate) url: Option<String>,
}

/// `$XDG_STATE_HOME/dlock/locks.db` (when that is an absolute path), else
/// `$HOME/.local/state/dlock/locks.db`.
pub fn default_db_path() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|home| home.join(".local/state"))
        })?;
    Some(state.join("dlock").join("locks.db"))
}

/// The `sqlite://` URL of `path`, each of its components percent-encoded, so the backend
/// decodes it back to exactly `path` (a `%`, `?`, `#` or space in HOME stays part of the path).
/// `None` when the path is not UTF-8, which no URL can carry.
fn sqlite_url(path: &Path) -> Option<String> {
    let parts: Vec<String> = path
        .to_str()?
        .split('/')
        .map(dlock::percent_encode)
        .collect();
    Some(format!("sqlite://{}", parts.join("/")))
}

fn sqlite_compiled_in() -> bool {
    dlock::schemes().contains(&"sqlite")
}

/// Text for the long help of run and status.
pub fn help_text() -> String {
    let location = match default_db_path() {
        Some(p) => sqlite_url(&p).unwrap_or_else(|| format!("{} (not UTF-8)", p.display())),
        None => "(none: neither XDG_STATE_HOME nor HOME is set)".to_owned(),
    };
    let note = if sqlite_compiled_in() {
        ""
    } else {
        "\n  (this build has no SQLite support: build with the `sql` feature, or give --url)"
    };
    format!(
        "Lock store: --url, else $DLOCK_URL, else the per-user SQLite file\n  {location}{note}\nCompiled-in schemes: {}",
        dlock::schemes().join(", ")
    )
}

/// The URL to use, or an exit code after printing why there is none.
pub fn resolve(url: Option<String>) -> Result<String, u8> {
    match url {
        Some(url) if url.trim().is_empty() => {
            eprintln!(
                "dlock: the lock store URL is empty (--url or DLOCK_URL); give a URL, or leave both unset for the default SQLite file"
            );
            return Err(exit::CONFIG);
        }
        Some(url) => return Ok(url),
        None => {}
    }
    let Some(path) = default_db_path() else {
        eprintln!(
            "dlock: no lock store: give --url or set DLOCK_URL (the default SQLite file needs XDG_STATE_HOME or HOME)"
        );
        return Err(exit::CONFIG);
    };
    let Some(url) = sqlite_url(&path) else {
        eprintln!(
            "dlock: the default SQLite file {} is not a UTF-8 path; give --url or set DLOCK_URL",
            path.display()
        );
        return Err(exit::CONFIG);
    };
    if !sqlite_compiled_in() {
        eprintln!(
            "dlock: no lock store given (--url or DLOCK_URL) and this build cannot use the default {url}: it has no SQLite support; compiled-in schemes: {}",
            dlock::schemes().join(", ")
        );
        return Err(exit::CONFIG);
    }
    if let Err(e) = create_private(&path) {
        eprintln!("dlock: cannot create {}: {e}", path.display());
        return Err(exit::CONFIG);
    }
    tracing::debug!(url, "using the default lock store");
    Ok(url)
}

/// Creates the database file's folders (mode 0700) and the file itself (mode 0600, empty: SQLite
/// takes an empty file for a new database and gives its journal files the file's mode), unless
/// they exist.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}
