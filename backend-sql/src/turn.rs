//! The write turn of a SQLite database file: the order in which writers reach SQLite's one
//! write lock, so that they queue instead of meeting in SQLite's busy handler, which sleeps 1,
//! 2, 5, 10 ms and more between its tries (under contention a grant waited up to 200 ms there,
//! and each meeting cost at least a millisecond: as long as a whole hand-over).
//!
//! Two levels, taken in this order by every statement and transaction that writes (see
//! `Core::run_as`):
//! * **in this process**, a FIFO mutex per file ([`write_turn`]);
//! * **between processes**, an exclusive `flock` on a file beside the database,
//!   `<database>-turn`, which the kernel hands to the next process as soon as it is unlocked.
//!   It is tried without blocking first (a system call, when nobody else writes); only a
//!   writer that finds it taken waits, on a blocking thread.
//!
//! The turn only orders writers; SQLite's own locking still decides who writes, so a writer
//! that does not take the turn (another program, an older dlock, a sidecar that cannot be
//! opened: the turn is then in-process only) is safe, just met in the busy handler again. The
//! sidecar is a separate file because POSIX locks are per process and file: closing any other
//! descriptor of the database file would drop the locks SQLite holds on it.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use tokio::sync::{MutexGuard, oneshot};

/// The write turn of one database file in this process.
#[derive(Default)]
pub struct WriteTurn {
    /// This process's writers, in arrival order.
    local: tokio::sync::Mutex<()>,
    /// The sidecar whose `flock` orders the processes (`None`: it could not be opened).
    between: Option<Arc<File>>,
}

/// A writer's turn; ends when dropped.
pub struct Turn<'a> {
    _local: MutexGuard<'a, ()>,
    /// The sidecar, while this turn holds its lock.
    locked: Option<&'a File>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.locked {
            let _ = file.unlock();
        }
    }
}

impl WriteTurn {
    /// A turn ordered between processes by `sidecar` (created if missing), or in this process
    /// only if it cannot be opened.
    fn beside(sidecar: &Path) -> WriteTurn {
        let between = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(sidecar)
            .inspect_err(|e| tracing::debug!(error = %e, "sqlite write turn: no sidecar"))
            .ok()
            .map(Arc::new);
        WriteTurn {
            local: tokio::sync::Mutex::new(()),
            between,
        }
    }

    /// Waits for this writer's turn.
    ///
    /// # Cancel safety
    /// Cancel safe. A writer dropped while it waits for another process leaves a blocking
    /// thread waiting for the lock, which unlocks it again as soon as it gets it.
    pub async fn take(&self) -> Turn<'_> {
        let local = self.local.lock().await;
        let Some(file) = self.between.as_deref() else {
            return Turn {
                _local: local,
                locked: None,
            };
        };
        let locked = match file.try_lock() {
            Ok(()) => true,
            Err(TryLockError::WouldBlock) => self.wait().await,
            Err(TryLockError::Error(e)) => {
                tracing::debug!(error = %e, "sqlite write turn: no lock between processes");
                false
            }
        };
        Turn {
            _local: local,
            locked: locked.then_some(file),
        }
    }

    /// Waits on a blocking thread for another process to unlock the sidecar; whether it is now
    /// locked for this writer.
    async fn wait(&self) -> bool {
        let Some(shared) = self.between.clone() else {
            return false;
        };
        let (tell, told) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let locked = shared.lock().is_ok();
            // Nobody waits any more (the writer was dropped): give the turn on.
            if tell.send(locked).is_err() && locked {
                let _ = shared.unlock();
            }
        });
        told.await.unwrap_or(false)
    }
}

/// The write turn of the database `file` in this process, shared by every client of the file.
pub fn write_turn(file: &Path) -> Arc<WriteTurn> {
    static TURNS: LazyLock<Mutex<HashMap<PathBuf, Arc<WriteTurn>>>> = LazyLock::new(Mutex::default);
    let key = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let mut turns = TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    let turn = turns.entry(key.clone()).or_insert_with(|| {
        let mut sidecar = key.into_os_string();
        sidecar.push("-turn");
        Arc::new(WriteTurn::beside(Path::new(&sidecar)))
    });
    turn.clone()
}

#[cfg(test)]
mod tests;
