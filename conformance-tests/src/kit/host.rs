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
// Port reservations shared by every test process on the machine.

/// The one lock file whose byte N stands for port N; opened once and never closed, so this
/// process's locks live exactly as long as the process.
fn port_lock_file() -> Option<&'static fs::File> {
    static FILE: OnceLock<Option<fs::File>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join("dlock-kit-ports.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .ok()?;
        // Shared by every user's test processes, like /tmp itself.
        let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o666));
        Some(file)
    })
    .as_ref()
}

/// Reserves `port` against other test processes using the kit (two test binaries at once, or
/// another process picking a killed server's port before its restart): an open-file-description
/// lock on byte `port` of one shared lock file, released by the kernel when this process exits,
/// however it exits. False when another live process holds it. When the lock file is unusable
/// it reserves nothing and says true: the bind check and start-up retries still apply.
pub(crate) fn reserve_port(port: u16) -> bool {
    use std::os::fd::AsRawFd as _;
    let Some(file) = port_lock_file() else {
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
// Temp dirs.

/// A temp dir registered for removal at exit (for shared servers that are never dropped).
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
        // Another open file description stands for another process: OFD locks conflict.
        let other = OpenOptions::new()
            .read(true)
            .write(true)
            .open(std::env::temp_dir().join("dlock-kit-ports.lock"))
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
}
