//! What the kit takes from the machine besides processes: free ports (reserved against every
//! other test process on the machine), temp dirs (reaped with the servers), binaries, and one-shot
//! commands.
#![allow(unsafe_code)]

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use super::error::{KitError, KitErrorKind, KitResult};
use super::process::{COMMAND_TIMEOUT, is_alive, register_dir, set_pdeathsig, unregister_dir};

// ---------------------------------------------------------------------------------------------
// Port reservations shared by this user's test processes.

/// The one lock file whose byte N stands for port N, with its path; opened once and never
/// closed, so this process's locks live exactly as long as the process. None (after a warning
/// that says why) when no private folder for it could be had.
fn port_lock_file() -> Option<&'static (PathBuf, fs::File)> {
    static FILE: OnceLock<Option<(PathBuf, fs::File)>> = OnceLock::new();
    FILE.get_or_init(|| match open_port_lock() {
        Ok(file) => Some(file),
        Err(why) => {
            tracing::warn!(
                "dlock kit: free ports are not reserved against other test processes: {why}"
            );
            None
        }
    })
    .as_ref()
}

/// Where this user's port reservations live, best first: `$XDG_RUNTIME_DIR/dlock-kit` when
/// that runtime dir is ours and closed to others, then `<temp dir>/dlock-kit-ports-<uid>`. Only
/// this user can reach either, so nobody else can hold a port's lock and stall the kit.
fn port_lock_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && runtime.is_absolute()
        && owned_and_closed(&runtime, 0o022).is_ok()
    {
        dirs.push(runtime.join("dlock-kit"));
    }
    // Not `dlock-kit-<number>-`: that is a workdir's name, which the stale-dir sweep removes.
    dirs.push(std::env::temp_dir().join(format!("dlock-kit-ports-{}", effective_uid())));
    dirs
}

fn open_port_lock() -> Result<(PathBuf, fs::File), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut refused = Vec::new();
    for dir in port_lock_dirs() {
        let path = dir.join("ports.lock");
        let opened = private_dir(&dir).and_then(|()| {
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))
        });
        match opened {
            Ok(file) => return Ok((path, file)),
            Err(why) => refused.push(why),
        }
    }
    Err(refused.join("; "))
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Makes `dir` a folder only this user can reach: created 0700 when missing; one that exists
/// must be a real folder (not a symlink), this user's, with no access for group or others.
/// The error says what is wrong with it.
pub(crate) fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    owned_and_closed(dir, 0o077)
}

/// Whether `dir` is a folder (not a symlink) owned by this user whose mode has none of the
/// `closed` bits.
fn owned_and_closed(dir: &Path, closed: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta =
        fs::symlink_metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a folder", dir.display()));
    }
    let me = effective_uid();
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me}); remove it",
            dir.display(),
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o777;
    if mode & closed != 0 {
        return Err(format!(
            "{} has mode {mode:o}: other users can reach it; `chmod 700` it or remove it",
            dir.display()
        ));
    }
    Ok(())
}

/// Reserves `port` against this user's other test processes using the kit (two test binaries
/// at once, or another process picking a killed server's port before its restart): an
/// open-file-description lock on byte `port` of one lock file in a private folder, released by
/// the kernel when this process exits, however it exits. False when another live process holds
/// it. When the lock file is unusable it reserves nothing and says true: the bind check and
/// start-up retries still apply.
pub(crate) fn reserve_port(port: u16) -> bool {
    use std::os::fd::AsRawFd as _;
    let Some((_, file)) = port_lock_file() else {
        return true;
    };
    // SAFETY: `flock` is a plain C struct for which all-zero bytes is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = libc::off_t::from(port);
    lock.l_len = 1;
    // SAFETY: fcntl on a descriptor that stays open for the whole process, with a pointer to
    // an initialised `flock` that outlives the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if rc == 0 {
        return true;
    }
    let errno = io::Error::last_os_error().raw_os_error();
    !matches!(errno, Some(libc::EAGAIN | libc::EACCES))
}

// ---------------------------------------------------------------------------------------------
// Credentials, private files and the accounts servers run as.

/// The password every server the kit starts in this process requires (PostgreSQL's and
/// MariaDB's superuser, Redis's default user): 128 random bits in hex, made on first use and
/// never written anywhere but 0600 files in the servers' 0700 temp dirs. One per process, so
/// that a Redlock URL, which carries one password for all its masters, can name any of them.
pub fn password() -> &'static str {
    static PASSWORD: OnceLock<String> = OnceLock::new();
    PASSWORD.get_or_init(|| format!("{:032x}", rand::random::<u128>()))
}

/// Writes `contents` to `path` (replacing it) as a file only its owner can read (0600), owned
/// by the account `run_as` names.
pub(crate) fn write_private(path: &Path, contents: &str, run_as: &RunAs) -> KitResult<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let what = || format!("cannot write {}", path.display());
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| KitError::io(what(), e))?;
    // A file that was there already keeps its mode through `open`.
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(contents.as_bytes()))
        .map_err(|e| KitError::io(what(), e))?;
    run_as.give(path)
}

/// Who a server runs as: the tests' own user, or, when they run as root, the server's system
/// account (PostgreSQL refuses to run as root, and a MariaDB running as root writes root-owned
/// files), switched to by `setpriv`, which execs without forking and keeps the parent-death
/// signal.
#[derive(Debug)]
pub(crate) enum RunAs {
    /// The user running the tests.
    Me,
    /// A system account.
    System {
        /// Its name (`postgres`, `mysql`).
        name: &'static str,
        /// Its uid.
        uid: u32,
        /// Its primary gid.
        gid: u32,
        /// The `setpriv` binary.
        setpriv: PathBuf,
    },
}

impl RunAs {
    /// `account` when the tests run as root, else [`RunAs::Me`]; the error names the Debian
    /// `package` that creates the account.
    pub(crate) fn server_account(account: &'static str, package: &str) -> KitResult<RunAs> {
        if !super::process::running_as_root() {
            return Ok(RunAs::Me);
        }
        let setpriv = find_binary("setpriv", "util-linux")?;
        let (uid, gid) = system_user(account).ok_or_else(|| {
            KitError::new(
                KitErrorKind::MissingBinary,
                format!(
                    "system user `{account}` not found: install it with `apt-get install \
                     {package}` or run scripts/install-deps"
                ),
            )
        })?;
        Ok(RunAs::System {
            name: account,
            uid,
            gid,
            setpriv,
        })
    }

    /// A command that runs `program` as this account.
    pub(crate) fn command(&self, program: &Path) -> Command {
        match self {
            RunAs::Me => Command::new(program),
            RunAs::System { name, setpriv, .. } => {
                let mut cmd = Command::new(setpriv);
                cmd.arg(format!("--reuid={name}"))
                    .arg(format!("--regid={name}"))
                    .arg("--init-groups")
                    // Changing credentials clears the parent-death signal set in pre_exec.
                    .arg("--pdeathsig=SIGKILL")
                    .arg("--")
                    .arg(program);
                cmd
            }
        }
    }

    /// Hands `path` to this account (a no-op for [`RunAs::Me`]).
    pub(crate) fn give(&self, path: &Path) -> KitResult<()> {
        match self {
            RunAs::Me => Ok(()),
            RunAs::System { name, uid, gid, .. } => {
                std::os::unix::fs::chown(path, Some(*uid), Some(*gid)).map_err(|e| {
                    KitError::io(format!("cannot give {} to `{name}`", path.display()), e)
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Temp dirs.

/// A temp dir registered for removal at exit (for shared servers that are never dropped), 0700:
/// a server's data, sockets, config and credentials are its owner's alone.
#[derive(Debug)]
pub(crate) struct Workdir {
    dir: tempfile::TempDir,
}

impl Workdir {
    pub(crate) fn new(kind: &str) -> KitResult<Self> {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_stale_workdirs);
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-kit-{}-{kind}-", std::process::id()))
            .permissions(fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|e| KitError::io("cannot create a temp dir", e))?;
        register_dir(dir.path());
        Ok(Self { dir })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes the temp dirs of earlier test processes that were SIGKILLed (no atexit ran): their
/// names carry the pid of the process that made them.
fn sweep_stale_workdirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("dlock-kit-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !is_alive(pid) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        unregister_dir(self.dir.path());
    }
}

// ---------------------------------------------------------------------------------------------
// Binaries and one-shot commands.

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds `name` on PATH or in the usual system dirs; the error names the Debian `package`.
pub(crate) fn find_binary(name: &str, package: &str) -> KitResult<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| KitError::missing(name, package))
}

/// Finds the first of `names` that exists (e.g. `mariadbd` or the older `mysqld`).
pub(crate) fn find_any_binary(names: &[&str], package: &str) -> KitResult<PathBuf> {
    names
        .iter()
        .find_map(|name| find_binary(name, package).ok())
        .ok_or_else(|| KitError::missing(names[0], package))
}

/// Runs a one-shot helper to completion (bounded by [`COMMAND_TIMEOUT`]); stdout on success.
pub(crate) async fn run_command(what: &str, mut cmd: Command) -> KitResult<String> {
    // Dies with the test process instead of finishing as an orphan.
    set_pdeathsig(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| KitError::io(format!("cannot run {what}"), e))?;
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| {
            KitError::new(
                KitErrorKind::Command,
                format!(
                    "{what} did not finish within {}s",
                    COMMAND_TIMEOUT.as_secs()
                ),
            )
        })?
        .map_err(|e| KitError::io(format!("cannot run {what}"), e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(KitError::new(
            KitErrorKind::Command,
            format!(
                "{what} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                String::from_utf8_lossy(&output.stdout).trim()
            ),
        ))
    }
}

/// Runs a quick probe command; true when it exits 0 within `timeout`.
pub(crate) async fn probe_command(mut cmd: Command, timeout: Duration) -> bool {
    set_pdeathsig(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let Ok(mut child) = cmd.spawn() else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, child.wait()).await,
        Ok(Ok(status)) if status.success()
    )
}

/// The uid and gid of a system user, from /etc/passwd.
pub(crate) fn system_user(name: &str) -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != name {
            return None;
        }
        let _password = f.next()?;
        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn a_handed_out_port_is_locked_against_other_processes() {
        let port = crate::kit::free_port();
        let (path, _) = port_lock_file().expect("the lock file is open");
        // Another open file description stands for another process: OFD locks conflict.
        let other = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("the lock file exists");
        // SAFETY: all-zero bytes is a valid `flock`.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = libc::off_t::from(port);
        lock.l_len = 1;
        // SAFETY: fcntl on an open descriptor with a pointer to a live `flock`.
        let rc = unsafe { libc::fcntl(other.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
        assert_eq!(rc, -1, "port {port} must already be locked");
        // Beyond 65535 no port maps, so nobody holds that byte.
        lock.l_start = libc::off_t::from(port) + 70_000;
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(other.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
        assert_eq!(rc, 0, "a byte beyond every port is free");
    }

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Nobody else can hold (or even open) the ports lock: it is a 0600 file of ours in a 0700
    /// folder of ours.
    #[test]
    fn the_ports_lock_is_this_users_alone() {
        use std::os::unix::fs::MetadataExt as _;
        let (path, _) = port_lock_file().expect("the lock file is open");
        let dir = path.parent().expect("a folder");
        for (what, path, mode) in [("folder", dir, 0o700), ("lock file", path.as_path(), 0o600)] {
            assert_eq!(mode_of(path), mode, "{what} {}", path.display());
            let owner = fs::metadata(path).unwrap().uid();
            assert_eq!(owner, effective_uid(), "{what} {}", path.display());
        }
    }

    /// A missing folder is made 0700; one that others can reach, one of another user's, or a
    /// symlink is refused with a message that says why.
    #[test]
    fn a_private_dir_is_made_0700_and_an_open_or_foreign_one_refused() {
        let base = tempfile::tempdir().unwrap();
        let fresh = base.path().join("fresh");
        private_dir(&fresh).expect("made");
        assert_eq!(mode_of(&fresh), 0o700);
        private_dir(&fresh).expect("ours and 0700: kept");

        let open = base.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let why = private_dir(&open).expect_err("mode 777");
        assert!(why.contains("mode 777"), "{why}");

        let link = base.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let why = private_dir(&link).expect_err("a symlink");
        assert!(why.contains("not a folder"), "{why}");

        // Root can make a folder of another user's; anyone else finds one in `/`.
        let theirs = if effective_uid() == 0 {
            let theirs = base.path().join("theirs");
            fs::DirBuilder::new().create(&theirs).unwrap();
            fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            theirs
        } else {
            PathBuf::from("/")
        };
        let why = private_dir(&theirs).expect_err("another user's");
        assert!(why.contains("not to this user"), "{why}");
    }

    /// Private files are 0600 even when a file with a wider mode was there before.
    #[test]
    fn private_files_are_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "new", &RunAs::Me).unwrap();
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
    }
}
