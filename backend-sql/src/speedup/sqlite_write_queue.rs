//! The write turn of a SQLite database file: the order in which writers reach SQLite's one
//! write lock, so that they queue instead of meeting in SQLite's busy handler, which sleeps 1,
//! 2, 5, 10 ms and more between its tries (under contention a grant waited up to 200 ms there,
//! and each meeting cost at least a millisecond: as long as a whole hand-over).
//!
//! Two levels, taken in this order by every statement and transaction that writes (see
//! `StatementRunner::run_as`):
//! * **in this process**, a queue per file ([`write_queue`]) with two lines: writes that keep
//!   something alive (an extend, a waiter's refresh: [`WritePriority::KeepAlive`]) go before
//!   the other writers waiting, each line in arrival order. A burst of acquires on a slow disk
//!   (a commit's `fsync` can take milliseconds each) otherwise held a renewal back until its
//!   lease ran out;
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

use std::collections::{HashMap, VecDeque};
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Which line a writer waits in for its turn in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePriority {
    /// A write that keeps a lease or a waiter's place alive: served before every
    /// [`WritePriority::Normal`] writer that waits, because a late one loses what it keeps,
    /// where a late acquire only waits longer. Such writes come at most every few hundred
    /// milliseconds per lease, so they cannot starve the other line.
    KeepAlive,
    /// Every other write, in arrival order.
    Normal,
}

/// The write turn of one database file in this process.
#[derive(Default)]
pub struct SqliteWriteQueue {
    /// This process's writers: whether a turn is out, and who waits for the next.
    local: Mutex<Waiters>,
    /// The sidecar whose `flock` orders the processes (`None`: it could not be opened).
    between: Option<Arc<File>>,
}

/// The writers waiting in each line, each told by its sender when the turn is its own.
#[derive(Default)]
struct Waiters {
    out: bool,
    keep_alive: VecDeque<oneshot::Sender<()>>,
    normal: VecDeque<oneshot::Sender<()>>,
}

/// A writer's turn; ends when dropped.
pub struct Turn<'a> {
    _local: LocalTurn<'a>,
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

/// The turn in this process; hands it to the next writer when dropped.
struct LocalTurn<'a>(&'a SqliteWriteQueue);

impl Drop for LocalTurn<'_> {
    fn drop(&mut self) {
        self.0.hand_on();
    }
}

/// A writer waiting in a line. Dropped after the turn was handed to it but before it saw
/// that, it hands the turn on, so a cancelled writer never keeps it.
struct Waiting<'a> {
    queue: &'a SqliteWriteQueue,
    told: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut told) = self.told.take() {
            told.close();
            if told.try_recv().is_ok() {
                self.queue.hand_on();
            }
        }
    }
}

impl SqliteWriteQueue {
    /// A turn ordered between processes by `sidecar` (created if missing, beside the database
    /// `file`), or in this process only if it cannot be opened.
    ///
    /// Whoever can open the sidecar can hold its lock and so hold up every writer, so a new one
    /// is open only to those who may write the database anyway (who can hold up its writers
    /// with a transaction): each class of users gets read and write on it where it has write
    /// on the database, nothing elsewhere.
    fn beside(file: &Path, sidecar: &Path) -> SqliteWriteQueue {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let db = std::fs::metadata(file).map_or(0o600, |m| m.permissions().mode());
        let writers = db & 0o222;
        let between = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(writers | (writers << 1))
            .open(sidecar)
            .inspect_err(|e| tracing::debug!(error = %e, "sqlite write turn: no sidecar"))
            .ok()
            .map(Arc::new);
        SqliteWriteQueue {
            local: Mutex::default(),
            between,
        }
    }

    /// Waits for this writer's turn, with `priority`.
    ///
    /// # Cancel safety
    /// Cancel safe: a writer dropped while it waits in this process leaves its line (or, if
    /// the turn had just been handed to it, hands it on). One dropped while it waits for
    /// another process leaves a blocking thread waiting for the lock, which unlocks it again
    /// as soon as it gets it.
    pub async fn take(&self, priority: WritePriority) -> Turn<'_> {
        let local = self.take_local(priority).await;
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

    /// The turn in this process: at once when nobody has it, else when [`hand_on`] picks
    /// this writer.
    ///
    /// [`hand_on`]: SqliteWriteQueue::hand_on
    async fn take_local(&self, priority: WritePriority) -> LocalTurn<'_> {
        let told = {
            let mut waiters = self.waiters();
            if !waiters.out {
                waiters.out = true;
                return LocalTurn(self);
            }
            let (tell, told) = oneshot::channel();
            match priority {
                WritePriority::KeepAlive => waiters.keep_alive.push_back(tell),
                WritePriority::Normal => waiters.normal.push_back(tell),
            }
            told
        };
        let mut waiting = Waiting {
            queue: self,
            told: Some(told),
        };
        if let Some(told) = waiting.told.as_mut() {
            // `hand_on` drops a sender only after its send failed, which needs this receiver
            // gone: the answer is always `Ok`.
            let _ = told.await;
        }
        waiting.told = None;
        LocalTurn(self)
    }

    /// Gives the turn in this process to the first keep-alive writer, else the first
    /// normal one, skipping writers that stopped waiting; or marks it free.
    fn hand_on(&self) {
        let mut guard = self.waiters();
        let waiters = &mut *guard;
        while let Some(next) = waiters
            .keep_alive
            .pop_front()
            .or_else(|| waiters.normal.pop_front())
        {
            if next.send(()).is_ok() {
                return;
            }
        }
        waiters.out = false;
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
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
pub fn write_queue(file: &Path) -> Arc<SqliteWriteQueue> {
    static QUEUES: LazyLock<Mutex<HashMap<PathBuf, Arc<SqliteWriteQueue>>>> =
        LazyLock::new(Mutex::default);
    let key = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    let queue = queues.entry(key.clone()).or_insert_with(|| {
        let mut sidecar = key.into_os_string();
        sidecar.push("-turn");
        Arc::new(SqliteWriteQueue::beside(file, Path::new(&sidecar)))
    });
    queue.clone()
}

#[cfg(test)]
mod tests;
