//! `kleym` as the container's PID 1: reaping orphans, as an init does.
//!
//! In the image `kleym` is the entrypoint, so it runs as PID 1, and every process of the
//! container whose parent dies is handed to it. A credential plugin killed on timeout
//! leaves such processes: its whole process group gets SIGKILL, and whatever it had
//! started (in the group, or in a session of its own) outlives it for a moment or longer.
//! When they exit they stay zombies until PID 1 waits for them; a PID 1 that never does
//! collects one pid per leftover, until the pid limit stops every plugin from starting.
//!
//! Waiting for them in the process that runs the hub would race its async runtime: tokio
//! waits for each plugin by its pid, and a `waitpid(-1)` of ours could take a plugin's exit
//! status first. So, as tini and dumb-init do, PID 1 forks at start, before any thread
//! exists: the child runs `kleym` as usual, and PID 1 does nothing but reap every child
//! (the orphans are handed to it, not to the child) and pass on the signals it gets to the
//! child. It exits with the child's exit code (128 + the signal when the child was killed).
//! As PID 1 it has no other children, so nothing it reaps is waited for by anyone else.
//!
//! Outside a container's pid namespace (`kleym` is not PID 1) nothing of this runs.

use std::process::ExitCode;

/// Signals that are never blocked (nor passed on): those raised by a fault in PID 1
/// itself, and the terminal stops, which must not stop PID 1.
#[cfg(target_os = "linux")]
const NOT_PASSED_ON: [libc::c_int; 9] = [
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGABRT,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// When this process is PID 1: forks; the child returns `None` and goes on as `kleym`, and
/// PID 1 reaps and passes on signals until the child exits, then returns its exit code.
/// Not PID 1, or the fork failed (said on stderr): `None`, and this process goes on as
/// `kleym` without an init. Call it first thing in `main`, before any thread is started.
pub fn init_if_pid1() -> Option<ExitCode> {
    #[cfg(target_os = "linux")]
    if std::process::id() == 1 {
        return linux::init();
    }
    None
}

#[cfg(target_os = "linux")]
mod linux {
    use super::NOT_PASSED_ON;
    use std::process::ExitCode;

    pub(super) fn init() -> Option<ExitCode> {
        // SAFETY: plain libc calls on stack values this function owns; `fork` runs before
        // any other thread exists (the caller's contract), so the child may go on freely.
        unsafe {
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut blocked);
            for sig in NOT_PASSED_ON {
                libc::sigdelset(&mut blocked, sig);
            }
            // Blocked before the fork, so no signal is lost between it and the wait loop;
            // the child restores the mask it would have had.
            libc::sigprocmask(libc::SIG_SETMASK, &blocked, &mut previous);
            match libc::fork() {
                -1 => {
                    let err = std::io::Error::last_os_error();
                    libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                    eprintln!(
                        "kleym: running as PID 1 without reaping orphaned processes: fork failed: {err}"
                    );
                    None
                }
                0 => {
                    libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                    None
                }
                child => Some(reap_until_exit(child, &blocked)),
            }
        }
    }

    /// PID 1's loop: passes on each signal to `child`, reaps every child that exited, and
    /// returns once `child` did, with its exit code.
    ///
    /// # Safety
    /// `blocked` is the set of signals blocked in this thread.
    unsafe fn reap_until_exit(child: libc::pid_t, blocked: &libc::sigset_t) -> ExitCode {
        // A wake-up now and then even without SIGCHLD, as tini does: reaping is then never
        // late by more than this, whatever happens to the signals.
        let tick = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        loop {
            // SAFETY: `info` is written by the kernel; the sets are valid.
            let sig = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::sigtimedwait(blocked, &mut info, &tick)
            };
            if sig > 0 && sig != libc::SIGCHLD {
                // SAFETY: kill(2) has no memory-safety preconditions; `child` is ours and
                // not reaped yet (the loop returns once it is).
                unsafe {
                    libc::kill(child, sig);
                }
            }
            loop {
                let mut status: libc::c_int = 0;
                // SAFETY: `status` is a valid out-pointer.
                let reaped = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if reaped <= 0 {
                    break;
                }
                if reaped == child {
                    return ExitCode::from(exit_code(status));
                }
            }
        }
    }

    /// The exit code a shell gives for `status`: the child's own, or 128 + its signal.
    fn exit_code(status: libc::c_int) -> u8 {
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            1
        };
        u8::try_from(code).unwrap_or(1)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn exit_codes_are_a_shells() {
            // Encoded as the kernel reports them: code << 8, or the signal number.
            assert_eq!(exit_code(3 << 8), 3);
            assert_eq!(exit_code(0), 0);
            assert_eq!(exit_code(libc::SIGTERM), 128 + 15);
            assert_eq!(exit_code(libc::SIGKILL), 128 + 9);
        }
    }
}
