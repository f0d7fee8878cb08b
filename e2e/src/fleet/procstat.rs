//! Resource figures of a Linux process read from `/proc/<pid>` (peak and current RSS, CPU
//! seconds, open file descriptors), and a sampler that tracks the peak number of open fds
//! (the kernel keeps a peak for RSS, VmHWM, but none for fds).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Clock ticks per second of `utime`/`stime` in `/proc/<pid>/stat`: Linux's `USER_HZ`, fixed
/// at 100 in the user-space ABI (independent of the kernel's internal `HZ`).
const USER_HZ: f64 = 100.0;

/// Which process to read: this one or another by pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc {
    /// The calling process (`/proc/self`).
    SelfProcess,
    /// Another process.
    Pid(u32),
}

impl Proc {
    fn dir(self) -> String {
        match self {
            Proc::SelfProcess => "/proc/self".to_string(),
            Proc::Pid(pid) => format!("/proc/{pid}"),
        }
    }
}

/// One reading of a process's resources.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcUsage {
    /// Peak resident set size so far (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Current resident set size (VmRSS), KiB.
    pub rss_kib: u64,
    /// CPU time used so far, user + system, seconds.
    pub cpu_seconds: f64,
    /// File descriptors open now (`None` when `/proc/<pid>/fd` could not be listed, e.g.
    /// because the reader itself has no fd left).
    pub open_fds: Option<usize>,
}

impl ProcUsage {
    /// Reads `proc`'s figures; `None` when the process is gone (or `/proc` unreadable).
    pub fn read(proc: Proc) -> Option<Self> {
        let dir = proc.dir();
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        Some(Self {
            peak_rss_kib: status_kib(&status, "VmHWM:")?,
            rss_kib: status_kib(&status, "VmRSS:")?,
            cpu_seconds: cpu_seconds(&stat)?,
            open_fds: open_fds(proc),
        })
    }

    /// Peak RSS in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        self.peak_rss_kib / 1024
    }
}

/// `/proc/<pid>/status` and `/proc/<pid>/stat` opened once and re-read in place, so readings
/// keep working when the reading process has run out of file descriptors (kubesim does, near
/// the open-file limit, with ~1 400 simulated spokes).
pub struct ProcReader {
    proc: Proc,
    status: File,
    stat: File,
}

impl ProcReader {
    /// Opens `proc`'s files (`/proc/self` is resolved now, to this process).
    pub fn open(proc: Proc) -> std::io::Result<Self> {
        let dir = proc.dir();
        Ok(Self {
            proc,
            status: File::open(format!("{dir}/status"))?,
            stat: File::open(format!("{dir}/stat"))?,
        })
    }

    /// Reads the figures now; fails once the process is gone. `open_fds` is best effort (it
    /// needs a new fd to list the directory).
    pub fn read(&self) -> std::io::Result<ProcUsage> {
        let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let status = read_all_at(&self.status)?;
        let stat = read_all_at(&self.stat)?;
        Ok(ProcUsage {
            peak_rss_kib: status_kib(&status, "VmHWM:").ok_or_else(|| invalid("no VmHWM"))?,
            rss_kib: status_kib(&status, "VmRSS:").ok_or_else(|| invalid("no VmRSS"))?,
            cpu_seconds: cpu_seconds(&stat).ok_or_else(|| invalid("unparsable stat"))?,
            open_fds: open_fds(self.proc),
        })
    }
}

/// The whole of an open file from offset 0 (`pread`: no seek state, no new fd).
pub fn read_all_at(f: &File) -> std::io::Result<String> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = f.read_at(&mut chunk, out.len() as u64)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A `Vm*:` field of `/proc/<pid>/status`, in KiB.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its closing `)`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// Number of entries in `/proc/<pid>/fd`.
pub fn open_fds(proc: Proc) -> Option<usize> {
    Some(
        std::fs::read_dir(format!("{}/fd", proc.dir()))
            .ok()?
            .count(),
    )
}

/// Samples the open fds of a few processes on a plain thread (so the sampling never competes
/// with the async runtime it measures) and keeps each one's peak.
pub struct FdPeakSampler {
    peaks: Arc<Vec<(Proc, AtomicUsize)>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FdPeakSampler {
    /// Starts sampling `procs` every `every`.
    pub fn start(procs: &[Proc], every: Duration) -> Self {
        let peaks: Arc<Vec<(Proc, AtomicUsize)>> =
            Arc::new(procs.iter().map(|p| (*p, AtomicUsize::new(0))).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peaks, stop) = (peaks.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (proc, peak) in peaks.iter() {
                        if let Some(n) = open_fds(*proc) {
                            peak.fetch_max(n, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(every);
                }
            })
        };
        Self {
            peaks,
            stop,
            thread: Some(thread),
        }
    }

    /// The peak seen so far for `proc` (0 if it was never sampled).
    pub fn peak(&self, proc: Proc) -> usize {
        self.peaks
            .iter()
            .find(|(p, _)| *p == proc)
            .map_or(0, |(_, n)| n.load(Ordering::Relaxed))
    }
}

impl Drop for FdPeakSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_counts_fields_after_the_command_name() {
        // comm with a space and a ')' inside; utime 250, stime 50 ticks.
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("42 (x) S 1"), None);
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tkleym\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmHWM:"), Some(204_800));
        assert_eq!(status_kib(status, "VmRSS:"), Some(102_400));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn this_process_is_readable_and_its_fd_peak_is_sampled() {
        let usage = ProcUsage::read(Proc::SelfProcess).unwrap();
        assert!(usage.peak_rss_kib >= usage.rss_kib && usage.rss_kib > 0);
        assert!(usage.open_fds.unwrap() > 0);
        let sampler = FdPeakSampler::start(&[Proc::SelfProcess], Duration::from_millis(5));
        let files: Vec<_> = (0..20)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sampler.peak(Proc::SelfProcess) < 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(sampler.peak(Proc::SelfProcess) >= 20);
        assert_eq!(sampler.peak(Proc::Pid(u32::MAX)), 0);
        drop(files);
    }

    #[test]
    fn a_reader_rereads_in_place_and_fails_once_the_process_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let reader = ProcReader::open(Proc::Pid(child.id())).unwrap();
        let first = reader.read().unwrap();
        let again = reader.read().unwrap();
        assert!(first.rss_kib > 0 && again.peak_rss_kib >= first.rss_kib);
        assert!(again.cpu_seconds >= first.cpu_seconds);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(reader.read().is_err(), "a reaped process has no figures");
        assert!(ProcReader::open(Proc::Pid(child.id())).is_err());
    }
}
