//! The real `kleym hub` binary as a child process (for `fleet-bench`): its stdout and stderr
//! go to a log file, its `/metrics` is read from the health port it was given, and it is
//! stopped with SIGTERM and a bounded wait (then SIGKILL). The child is killed when the
//! handle is dropped, so no error path of the caller leaves it running.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::procstat::{Proc, ProcReader, ProcUsage};

/// Why the hub process could not be started, observed or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HubProcessError {
    /// The log file could not be created.
    #[error("creating the hub log file {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No local port could be reserved for `--metrics-addr`.
    #[error("reserving a local port for --metrics-addr: {0}")]
    Port(std::io::Error),
    /// The binary could not be started.
    #[error("starting {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The hub exited while it should be running.
    #[error("the kleym hub (pid {pid}) exited early with {status}; its log: {log}")]
    Exited {
        /// Its pid.
        pid: u32,
        /// Its exit status.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
    },
    /// SIGTERM could not be sent.
    #[error("sending SIGTERM to the kleym hub (pid {pid}): {detail}")]
    Signal {
        /// Its pid.
        pid: u32,
        /// What failed.
        detail: String,
    },
    /// Waiting for the child failed.
    #[error("waiting for the kleym hub: {0}")]
    Wait(std::io::Error),
}

/// How the hub ended after [`HubProcess::stop`].
#[derive(Debug)]
pub struct Stopped {
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether it exited by itself after SIGTERM (false: it was killed after the grace).
    pub graceful: bool,
    /// Time from SIGTERM to exit.
    pub took: Duration,
}

/// A running `kleym hub` child process.
pub struct HubProcess {
    child: tokio::process::Child,
    pid: u32,
    metrics_addr: SocketAddr,
    log_path: PathBuf,
    /// Opened at spawn, so readings survive the bench running out of fds.
    proc_reader: Option<ProcReader>,
}

/// A local address that was free a moment ago (the listener is closed again so the child can
/// bind it; the window for another process to take it is tiny on a test machine).
fn free_local_addr() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl HubProcess {
    /// Starts `kleym hub --kubeconfig <kubeconfig> --metrics-addr <free port> <flags>`, with
    /// stdout and stderr written to `log_path` (created or truncated) and `NO_COLOR=1`.
    pub fn spawn(
        kleym: &Path,
        kubeconfig: &Path,
        flags: &[String],
        log_path: &Path,
    ) -> Result<Self, HubProcessError> {
        let log_err = |source| HubProcessError::Log {
            path: log_path.to_path_buf(),
            source,
        };
        let stdout = std::fs::File::create(log_path).map_err(log_err)?;
        let stderr = stdout.try_clone().map_err(log_err)?;
        let metrics_addr = free_local_addr().map_err(HubProcessError::Port)?;
        let mut command = tokio::process::Command::new(kleym);
        command
            .arg("hub")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-addr", &metrics_addr.to_string()])
            .args(flags)
            // Plain text in the log file (tracing's text format colours by default).
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        // A binary written moments ago can still be open for writing in a child another
        // thread forked meanwhile (until that child execs): exec then fails with ETXTBSY.
        // The window is short, so a few short retries are enough.
        let mut attempts = 0;
        let child = loop {
            match command.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 20 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => {
                    break other.map_err(|source| HubProcessError::Spawn {
                        path: kleym.to_path_buf(),
                        source,
                    })?;
                }
            }
        };
        // `id()` is `None` only once the child was reaped, which cannot have happened yet.
        let pid = child.id().unwrap_or_default();
        Ok(Self {
            child,
            pid,
            metrics_addr,
            log_path: log_path.to_path_buf(),
            proc_reader: ProcReader::open(Proc::Pid(pid)).ok(),
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// The child's log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `Ok` while the child runs; [`HubProcessError::Exited`] once it has exited.
    pub fn check_running(&mut self) -> Result<(), HubProcessError> {
        match self.child.try_wait().map_err(HubProcessError::Wait)? {
            None => Ok(()),
            Some(status) => Err(HubProcessError::Exited {
                pid: self.pid,
                status,
                log: self.log_path.clone(),
            }),
        }
    }

    /// The child's resource figures now (an error once it is gone).
    pub fn usage(&self) -> std::io::Result<ProcUsage> {
        match &self.proc_reader {
            Some(r) => r.read(),
            None => ProcReader::open(Proc::Pid(self.pid))?.read(),
        }
    }

    /// The text of `GET /metrics` (`None` if the port does not answer 200 within 10 s).
    pub async fn metrics(&self) -> Option<String> {
        http_get_body(self.metrics_addr, "/metrics", Duration::from_secs(10)).await
    }

    /// Sends SIGTERM and waits up to `grace` for the exit; after that kills it (SIGKILL) and
    /// reaps it.
    pub async fn stop(mut self, grace: Duration) -> Result<Stopped, HubProcessError> {
        let started = std::time::Instant::now();
        if let Some(status) = self.child.try_wait().map_err(HubProcessError::Wait)? {
            return Err(HubProcessError::Exited {
                pid: self.pid,
                status,
                log: self.log_path.clone(),
            });
        }
        // `kill` (procps/coreutils) rather than a libc binding: the e2e crate has none, and
        // the tests that run the binary signal it the same way.
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .map_err(|e| HubProcessError::Signal {
                pid: self.pid,
                detail: e.to_string(),
            })?;
        if !sent.success() {
            return Err(HubProcessError::Signal {
                pid: self.pid,
                detail: format!("kill exited with {sent}"),
            });
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => Ok(Stopped {
                status: status.map_err(HubProcessError::Wait)?,
                graceful: true,
                took: started.elapsed(),
            }),
            Err(_) => {
                let _ = self.child.start_kill();
                let status = self.child.wait().await.map_err(HubProcessError::Wait)?;
                Ok(Stopped {
                    status,
                    graceful: false,
                    took: started.elapsed(),
                })
            }
        }
    }
}

/// One plain-HTTP/1.1 `GET` with `Connection: close`; the body of a 200 response.
async fn http_get_body(addr: SocketAddr, path: &str, limit: Duration) -> Option<String> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    };
    tokio::time::timeout(limit, get).await.ok()?
}

/// The value of one series (`name{labels}` exactly as exposed) in Prometheus/OpenMetrics
/// text.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Every `label` value of metric `name` with its value, for series whose only label is
/// `label` (e.g. `kleym_hub_spokes{phase="Engaged"} 3` → `("Engaged", 3.0)`).
pub fn metric_by_label(metrics: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}{{{label}=\"");
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (value_of_label, rest) = rest.split_once("\"} ")?;
            let v = rest.split_whitespace().next()?.parse().ok()?;
            Some((value_of_label.to_string(), v))
        })
        .collect()
}

/// Every series of metric `name` with its labels (in exposition order) and value, e.g.
/// `kleym_spoke_api_writes_total{cluster="fleet/a",write="finalizer"} 3` →
/// `([("cluster", "fleet/a"), ("write", "finalizer")], 3.0)`. Lines that do not parse are
/// skipped.
pub fn metric_series(metrics: &str, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, rest) = match rest.strip_prefix('{') {
                Some(r) => parse_labels(r)?,
                None => (Vec::new(), rest),
            };
            let v = rest
                .strip_prefix(' ')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((labels, v))
        })
        .collect()
}

/// `a="x",b="y"} rest` → the labels and ` rest` (backslash escapes in values kept as
/// their escaped character).
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => value.push(chars.next()?.1),
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = &rest[end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// The last `lines` lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP kleym_hub_spokes Spokes by phase\n\
        # TYPE kleym_hub_spokes gauge\n\
        kleym_hub_spokes{phase=\"Pending\"} 0\n\
        kleym_hub_spokes{phase=\"Engaged\"} 998\n\
        kleym_hub_spokes{phase=\"BackingOff\"} 2\n\
        kleym_hub_spokes_other 7\n\
        kleym_hub_leader 1\n# EOF\n";

    #[test]
    fn metric_value_matches_the_whole_series_name() {
        assert_eq!(
            metric_value(METRICS, "kleym_hub_spokes{phase=\"Engaged\"}"),
            Some(998.0)
        );
        assert_eq!(metric_value(METRICS, "kleym_hub_leader"), Some(1.0));
        assert_eq!(metric_value(METRICS, "kleym_hub_spokes"), None);
        assert_eq!(metric_value(METRICS, "kleym_hub_missing"), None);
    }

    #[test]
    fn metric_by_label_lists_every_phase() {
        let phases = metric_by_label(METRICS, "kleym_hub_spokes", "phase");
        assert_eq!(
            phases,
            vec![
                ("Pending".to_string(), 0.0),
                ("Engaged".to_string(), 998.0),
                ("BackingOff".to_string(), 2.0)
            ]
        );
    }

    #[test]
    fn metric_series_reads_every_label() {
        let m = "# TYPE kleym_spoke_api_writes counter\n\
            kleym_spoke_api_writes_total{cluster=\"fleet/a\",write=\"finalizer\"} 3\n\
            kleym_spoke_api_writes_total{cluster=\"fleet/b\",write=\"status_apply\"} 4\n\
            kleym_spoke_api_writes_total{cluster=\"q\\\"x\",write=\"finalizer\"} 1\n\
            kleym_spoke_api_writes_totally{cluster=\"fleet/a\"} 9\n\
            kleym_hub_leader 1\n";
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            metric_series(m, "kleym_spoke_api_writes_total"),
            vec![
                (
                    pairs(&[("cluster", "fleet/a"), ("write", "finalizer")]),
                    3.0
                ),
                (
                    pairs(&[("cluster", "fleet/b"), ("write", "status_apply")]),
                    4.0
                ),
                (pairs(&[("cluster", "q\"x"), ("write", "finalizer")]), 1.0),
            ]
        );
        assert_eq!(metric_series(m, "kleym_hub_leader"), vec![(vec![], 1.0)]);
        assert!(metric_series(m, "kleym_missing").is_empty());
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hub.log");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(log_tail(&p, 2), "b\nc");
        assert_eq!(log_tail(&p, 10), "a\nb\nc");
        assert_eq!(log_tail(&dir.path().join("missing"), 3), "");
    }

    #[tokio::test]
    async fn a_child_is_stopped_with_sigterm_and_an_early_exit_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("unused");
        // A stand-in binary: ignores its arguments, logs, sleeps until signalled.
        let sleeper = super::super::plugins::write_script(
            dir.path(),
            "sleeper",
            "#!/bin/sh\necho \"up $NO_COLOR\"\nexec sleep 60\n",
        )
        .unwrap();
        let log = dir.path().join("sleeper.log");
        let p = HubProcess::spawn(&sleeper, &kubeconfig, &[], &log).unwrap();
        let pid = p.pid();
        assert!(p.usage().unwrap().rss_kib > 0);
        // SIGTERM before the script has written its line would leave the log empty (seen
        // under load): wait for the line first.
        for _ in 0..600 {
            if !log_tail(&log, 1).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stopped = p.stop(Duration::from_secs(30)).await.unwrap();
        assert!(stopped.graceful);
        assert!(
            !stopped.status.success(),
            "killed by SIGTERM: {:?}",
            stopped.status
        );
        assert!(ProcUsage::read(Proc::Pid(pid)).is_none());
        assert_eq!(log_tail(&log, 1), "up 1", "NO_COLOR=1 for a plain-text log");

        let quitter = super::super::plugins::write_script(
            dir.path(),
            "quitter",
            "#!/bin/sh\necho bye >&2\nexit 3\n",
        )
        .unwrap();
        let log = dir.path().join("quitter.log");
        let mut p = HubProcess::spawn(&quitter, &kubeconfig, &[], &log).unwrap();
        let mut exited = None;
        for _ in 0..600 {
            if let Err(e) = p.check_running() {
                exited = Some(e);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            matches!(exited, Some(HubProcessError::Exited { status, .. }) if status.code() == Some(3))
        );
        assert_eq!(log_tail(&log, 1), "bye");
    }
}
