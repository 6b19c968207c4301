//! The two POSIX calls the standard library and tokio do not offer: sending a chosen signal to the
//! child, and asking whether the terminal's signals already reach the child.
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
