//! The process around a long-running subcommand (`mount`, `serve`): stop signals,
//! readiness for systemd (`sd_notify`) and for a `--daemon` parent (the pipe named by
//! `ZCFS_READY_FD`), and starting the detached child of `--daemon`.

use anyhow::{bail, Result};
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// The environment variable naming the readiness pipe's write end in a detached child.
const READY_FD_VAR: &str = "ZCFS_READY_FD";

/// SIGINT, SIGTERM and SIGHUP, blocked so that only [`StopSignals::wait`] sees them.
pub struct StopSignals(libc::sigset_t);

impl StopSignals {
    /// Block the stop signals in this thread. Call before starting any thread, so the
    /// threads inherit the mask and none of them is killed by a signal.
    pub fn block() -> StopSignals {
        // SAFETY: sigset_t is plain data; sigemptyset initializes it.
        let set = unsafe {
            let mut s: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut s);
            libc::sigaddset(&mut s, libc::SIGINT);
            libc::sigaddset(&mut s, libc::SIGTERM);
            libc::sigaddset(&mut s, libc::SIGHUP);
            s
        };
        // SAFETY: a valid, initialized signal set; blocking signals in this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        StopSignals(set)
    }

    /// Wait up to `timeout` for a stop signal; the signal's number if one came.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: valid signal set and timeout; no siginfo requested.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

/// systemd `Type=notify` readiness (no-op outside systemd).
pub fn sd_notify(msg: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let p = path.to_string_lossy();
    let r = if let Some(abs) = p.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())
            .and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
    } else {
        sock.send_to(msg.as_bytes(), &*p)
    };
    if let Err(e) = r {
        tracing::warn!("sd_notify: {e}");
    }
}

/// The write end of the pipe a `--daemon` parent reads: one line, `ready` or `error: ...`.
/// Reporting consumes it, so it is written and closed once.
pub struct ReadyPipe(File);

impl ReadyPipe {
    /// The pipe our `--daemon` parent passed us, if it did.
    pub fn from_env() -> Option<ReadyPipe> {
        let fd: i32 = std::env::var(READY_FD_VAR).ok()?.parse().ok()?;
        // SAFETY: the parent opened this fd for us alone and nothing else in this process
        // uses it: we take it over.
        let file = unsafe { File::from_raw_fd(fd) };
        // Programs we start (fusermount3) must not hold the parent's pipe open.
        // SAFETY: setting a flag on an fd we own.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        Some(ReadyPipe(file))
    }

    pub fn ready(mut self) {
        let _ = writeln!(self.0, "ready");
    }

    pub fn failed(mut self, e: &anyhow::Error) {
        let _ = writeln!(self.0, "error: {e:#}");
    }
}

/// What the detached child reported through the readiness pipe.
pub enum ChildReport {
    Ready {
        pid: u32,
    },
    Failed(String),
    /// It closed the pipe (exited) without a word.
    Silent,
}

/// Start this program again with `args` in a new session, without our terminal or
/// pipes, and wait for it to report through its [`ReadyPipe`].
pub fn spawn_detached(args: &[OsString]) -> Result<ChildReport> {
    let mut fds = [0i32; 2];
    // SAFETY: a two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just opened both fds, and nothing else owns them.
    let (rd, wr) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let wr_fd = wr.as_raw_fd();
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(args)
        .env(READY_FD_VAR, wr_fd.to_string())
        // A daemon must not hold its caller's terminal or pipes open; errors before
        // readiness come back through the readiness pipe.
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec we only call async-signal-safe functions (setsid,
    // fcntl) on our own fds.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            // Keep the write end open across exec for the readiness message.
            libc::fcntl(wr_fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // Only the child may hold the write end now, so the read ends when the child is
    // ready, fails or dies.
    drop(wr);
    let mut msg = String::new();
    let _ = (&rd).read_to_string(&mut msg);
    if msg.starts_with("ready") {
        return Ok(ChildReport::Ready { pid: child.id() });
    }
    let _ = child.wait();
    Ok(match msg.trim().strip_prefix("error: ") {
        Some(e) => ChildReport::Failed(e.to_string()),
        None => ChildReport::Silent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe: (read end, write end).
    fn pipe() -> (File, File) {
        let mut fds = [0i32; 2];
        // SAFETY: a two-element array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 just opened both fds, and nothing else owns them.
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
    }

    #[test]
    fn the_ready_pipe_carries_one_line_then_closes() {
        for (report, want) in [(true, "ready\n"), (false, "error: no volume: gone\n")] {
            let (mut rd, wr) = pipe();
            let pipe = ReadyPipe(wr);
            if report {
                pipe.ready();
            } else {
                pipe.failed(&anyhow::anyhow!("gone").context("no volume"));
            }
            // Reading to the end returns: the write end is closed.
            let mut got = String::new();
            rd.read_to_string(&mut got).unwrap();
            assert_eq!(got, want);
        }
    }
}
