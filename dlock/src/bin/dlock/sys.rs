//! The POSIX calls the standard library and tokio do not offer: sending a chosen signal to the
//! child, asking whether the terminal's signals already reach the child, and (on Linux) tying
//! the child's life to dlock's.
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
