//! The POSIX calls the standard library and tokio do not offer: sending a chosen signal to the
//! child (and, on Linux, to the processes it started), asking whether the terminal's signals
//! already reach the child, and (on Linux) tying the child's life to dlock's.
#![allow(unsafe_code)]

use std::io;

/// Sends `signal` to process `pid`.
///
/// The caller must only pass the pid of its own child that it has not reaped yet (tokio's
/// `Child::id()` returns `None` once reaped), so the pid cannot have been reused.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether dlock is in the foreground process group of its controlling terminal. The child runs
/// in dlock's process group, so a Ctrl-C typed there has already reached it: forwarding the
/// SIGINT would deliver it twice.
pub fn in_terminal_foreground() -> bool {
    for fd in 0..3 {
        // SAFETY: tcgetpgrp(3) and getpgrp(2) take and return plain integers; an fd that is not
        // a terminal makes tcgetpgrp fail with -1, which is handled.
        let (foreground, ours) = unsafe { (libc::tcgetpgrp(fd), libc::getpgrp()) };
        if foreground > 0 {
            return foreground == ours;
        }
    }
    false
}

/// Makes the command `cmd` starts die with SIGKILL when dlock dies (Linux's parent-death
/// signal): a dlock killed with SIGKILL, crashed or killed for memory no longer renews the
/// lease, so a command left running would go on without the lock once the lease ran out, beside
/// the next holder's. Only the command itself gets the signal, not processes it started (they
/// are not dlock's children). Elsewhere this does nothing.
///
/// The signal is sent when the *thread* that started the command ends: dlock starts it from the
/// thread that runs `main`'s `block_on`, which lives as long as dlock.
#[cfg(target_os = "linux")]
pub fn die_with_dlock(cmd: &mut tokio::process::Command) {
    let dlock = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls (prctl, getppid); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // dlock died between the fork and the prctl: nobody will send the signal now.
            if u32::try_from(libc::getppid()).ok() != Some(dlock) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// See the Linux version: other systems have no parent-death signal.
#[cfg(not(target_os = "linux"))]
pub fn die_with_dlock(_cmd: &mut tokio::process::Command) {}

/// The processes of the tree under `root` (its children, theirs, ...), found by their parent
/// ids in `/proc`; `root` not included. Processes whose parent exited (orphans, reparented
/// elsewhere) are no longer in the tree.
#[cfg(target_os = "linux")]
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = parent(pid) {
            parent_of.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.remove(0);
    tree
}

/// The state letter and parent id of `pid` from `/proc/<pid>/stat` (the two fields after the
/// command name in parentheses, which may itself hold spaces and parentheses).
#[cfg(target_os = "linux")]
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

#[cfg(target_os = "linux")]
fn parent(pid: u32) -> Option<u32> {
    state_and_parent(pid).map(|(_, p)| p)
}

/// Whether `pid` has stopped (or is gone, or a zombie): it runs no more code.
#[cfg(target_os = "linux")]
fn halted(pid: u32) -> bool {
    state_and_parent(pid).is_none_or(|(state, _)| matches!(state, 'T' | 't' | 'Z' | 'X'))
}

/// A pidfd of `pid` if it is still a child of one of `parents`: the pidfd names one process,
/// whose parent is checked after it is opened, so a pid that was freed and given to another
/// process meanwhile is never taken. `None` when it is gone, has left the tree, or pidfds are
/// not supported.
#[cfg(target_os = "linux")]
fn pidfd_in_tree(pid: u32, parents: &[u32]) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let raw = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = libc::c_int::try_from(unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) }).ok()?;
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    parent(pid)
        .is_some_and(|p| parents.contains(&p))
        .then_some(fd)
}

/// Sends `signal` to the process `pidfd` names; `false` if it is gone.
#[cfg(target_os = "linux")]
fn pidfd_signal(pidfd: &std::os::fd::OwnedFd, signal: i32) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal(2) takes the pidfd, a signal number, a null siginfo and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// Sends `signal` to the child `root` (as [`send_signal`]) and to every process of the tree
/// under it, as a Ctrl-C at a terminal reaches a whole job: a shell script's own children get
/// it too.
pub fn signal_tree(root: u32, signal: i32) -> io::Result<()> {
    send_signal(root, signal)?;
    #[cfg(target_os = "linux")]
    {
        let tree = descendants(root);
        let mut parents = tree.clone();
        parents.push(root);
        for pid in tree {
            if let Some(pidfd) = pidfd_in_tree(pid, &parents) {
                pidfd_signal(&pidfd, signal);
            }
        }
    }
    Ok(())
}

/// Kills the child `root` and every process of the tree under it with SIGKILL. The tree is
/// stopped first (SIGSTOP, until every process of it has stopped and a last look finds none it
/// has not stopped), so that none of it forks, or exits and is reaped, while it is walked; then
/// each is killed through the pidfd it was stopped by, deepest first. Blocks for at most about
/// a tenth of a second.
pub fn kill_tree(root: u32) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        send_signal(root, libc::SIGSTOP)?;
        let mut stopped: Vec<u32> = vec![root];
        let mut pidfds = Vec::new();
        for _ in 0..100 {
            let fresh: Vec<u32> = descendants(root)
                .into_iter()
                .filter(|p| !stopped.contains(p))
                .collect();
            if fresh.is_empty() {
                if stopped.iter().all(|p| halted(*p)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            for pid in fresh {
                if let Some(pidfd) = pidfd_in_tree(pid, &stopped)
                    && pidfd_signal(&pidfd, libc::SIGSTOP)
                {
                    stopped.push(pid);
                    pidfds.push(pidfd);
                }
            }
        }
        for pidfd in pidfds.iter().rev() {
            pidfd_signal(pidfd, libc::SIGKILL);
        }
    }
    send_signal(root, libc::SIGKILL)
}
