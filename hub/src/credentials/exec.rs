//! The async exec runtime: runs one credential plugin the way client-go does, with the
//! safety client-go lacks (a timeout that kills the plugin's whole process group, bounded
//! stdout and stderr, errors free of plugin output).
//!
//! What a plugin prints never reaches an error message: errors end up in status objects, the
//! HTTP API and the fleet report, and no pattern recognises every secret a plugin may print
//! (`client secret is swordfish`). An error names the exit code or signal, the timeout, or the
//! protocol rule the output broke, plus the size and a SHA-256 prefix of stderr
//! ([`PluginStderr`]); a bounded excerpt of stderr, with token-like words and labelled values
//! redacted, is kept for the hub's log only ([`PluginStderr::log_excerpt`]).
//!
//! Protocol: the plugin inherits the hub's environment, then the configured env on top, then
//! kleym's `KLEYM_CLUSTER_AUDIENCE` and `KLEYM_CLUSTER_PROFILE` (see
//! [`audience`](crate::access::audience)), then `KUBERNETES_EXEC_INFO` (`{"apiVersion",
//! "kind": "ExecCredential", "spec": {"cluster"?, "interactive": false}}`); stdin is closed;
//! stdout must hold one ExecCredential.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::credential::Credential;
use super::exec_output::{OutputError, parse_exec_output};
use super::secret::redact_token_like;
use crate::access::EffectiveAccess;
use crate::access::audience::{AUDIENCE_ENV, PROFILE_ENV};

/// Limits for one plugin run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    /// Wall-clock limit; on expiry the plugin's process group is killed.
    pub timeout: Duration,
    /// Maximum stdout size; larger output is an error.
    pub max_stdout_bytes: usize,
    /// How much stderr is kept for the log excerpt (the rest is drained, hashed and
    /// counted, and dropped).
    pub max_stderr_bytes: usize,
    /// Whether a failing plugin's redacted stderr excerpt goes into the hub's log. Off by
    /// default: plugin output may hold secrets that no pattern recognises, so by default the
    /// log, like status, carries only stderr's size and hash (`--log-plugin-stderr`).
    pub log_stderr_excerpt: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_stdout_bytes: 1 << 20,
            max_stderr_bytes: 4096,
            log_stderr_excerpt: false,
        }
    }
}

/// What a plugin wrote to stderr. Its [`Display`](std::fmt::Display) and `Debug` forms
/// show only the size and a hash, so errors that carry it are safe for status objects; the
/// excerpt is for logs ([`PluginStderr::log_excerpt`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PluginStderr {
    bytes: u64,
    sha256: String,
    excerpt: String,
}

/// Hex digits of the stderr hash shown in errors: enough to tell two outputs apart or match
/// one with the log, too few to guess a short secret from.
const STDERR_HASH_HEX: usize = 12;

impl PluginStderr {
    /// Total bytes the plugin wrote to stderr.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether the plugin wrote nothing to stderr.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The first 12 hex digits of the SHA-256 of everything the plugin wrote to stderr
    /// (empty when it wrote nothing).
    pub fn sha256_prefix(&self) -> &str {
        &self.sha256
    }

    /// For the hub's log only, never for status, Events or API responses: the first
    /// [`ExecOptions::max_stderr_bytes`] bytes of stderr, trimmed, with token-like words and
    /// labelled values redacted. Redaction cannot recognise every secret (a plain-word
    /// password in prose passes), which is why nothing else carries this.
    pub fn log_excerpt(&self) -> &str {
        &self.excerpt
    }
}

impl std::fmt::Display for PluginStderr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            f.write_str("no stderr")
        } else {
            write!(f, "stderr: {} bytes, sha256:{}", self.bytes, self.sha256)
        }
    }
}

impl std::fmt::Debug for PluginStderr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginStderr")
            .field("bytes", &self.bytes)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

/// Collects stderr as it is read: the total size, its hash, and the first bytes.
struct StderrCollector {
    cap: usize,
    bytes: u64,
    hasher: Sha256,
    kept: Vec<u8>,
}

impl StderrCollector {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            bytes: 0,
            hasher: Sha256::new(),
            kept: Vec::new(),
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        self.hasher.update(chunk);
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    fn finish(self) -> PluginStderr {
        if self.bytes == 0 {
            return PluginStderr::default();
        }
        let digest = self.hasher.finalize();
        let mut sha256 = hex::encode(digest);
        sha256.truncate(STDERR_HASH_HEX);
        let text = String::from_utf8_lossy(&self.kept);
        PluginStderr {
            bytes: self.bytes,
            sha256,
            excerpt: redact_token_like(text.trim()),
        }
    }
}

/// Why a plugin run produced no credential. No variant carries what the plugin printed
/// (see the module docs): these messages reach status objects.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The command does not exist.
    #[error("exec: executable {command} not found{hint}")]
    NotFound {
        /// The command.
        command: String,
        /// `\n<installHint>` when configured.
        hint: String,
    },
    /// The command exists but could not be started.
    #[error("exec: failed to start {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// OS error.
        source: std::io::Error,
    },
    /// Reading the plugin's output or waiting for it failed.
    #[error("exec: I/O error talking to {command}: {source}")]
    Io {
        /// The command.
        command: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The plugin did not finish in time and was killed.
    #[error("exec: executable {command} timed out after {timeout:?} and was killed ({stderr})")]
    Timeout {
        /// The command.
        command: String,
        /// The limit.
        timeout: Duration,
        /// What it wrote to stderr until then.
        stderr: PluginStderr,
    },
    /// The plugin wrote more than the stdout limit.
    #[error("exec: executable {command} wrote more than {limit} bytes to stdout")]
    StdoutTooLarge {
        /// The command.
        command: String,
        /// The limit.
        limit: usize,
    },
    /// The plugin exited unsuccessfully.
    #[error("exec: executable {command} failed with {status} ({stderr})")]
    Failed {
        /// The command.
        command: String,
        /// `exit code N` or `signal N`.
        status: String,
        /// What it wrote to stderr.
        stderr: PluginStderr,
    },
    /// The output broke an ExecCredential rule.
    #[error("exec: executable {command} returned an invalid credential: {source} ({stderr})")]
    InvalidOutput {
        /// The command.
        command: String,
        /// The rule.
        source: OutputError,
        /// What it wrote to stderr.
        stderr: PluginStderr,
    },
}

impl ExecError {
    /// A short label for metrics (`result` label).
    pub fn result_label(&self) -> &'static str {
        match self {
            ExecError::NotFound { .. } | ExecError::Spawn { .. } => "spawn_error",
            ExecError::Io { .. } => "io_error",
            ExecError::Timeout { .. } => "timeout",
            ExecError::StdoutTooLarge { .. } => "output_too_large",
            ExecError::Failed { .. } => "exit_error",
            ExecError::InvalidOutput { .. } => "invalid_output",
        }
    }

    /// What the plugin wrote to stderr, when it ran to an end (exit, timeout, bad output).
    pub fn stderr(&self) -> Option<&PluginStderr> {
        match self {
            ExecError::Timeout { stderr, .. }
            | ExecError::Failed { stderr, .. }
            | ExecError::InvalidOutput { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

/// The `KUBERNETES_EXEC_INFO` document for this access configuration.
pub fn exec_info(access: &EffectiveAccess) -> Value {
    let mut spec = Map::new();
    if access.exec.provide_cluster_info {
        let c = &access.cluster;
        let mut cluster = Map::new();
        cluster.insert("server".into(), json!(c.server));
        if let Some(name) = &c.tls_server_name {
            cluster.insert("tls-server-name".into(), json!(name));
        }
        if c.insecure_skip_tls_verify {
            cluster.insert("insecure-skip-tls-verify".into(), json!(true));
        }
        if let Some(ca) = &c.certificate_authority_pem {
            cluster.insert(
                "certificate-authority-data".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(ca)),
            );
        }
        if let Some(proxy) = &c.proxy_url {
            cluster.insert("proxy-url".into(), json!(proxy));
        }
        if c.disable_compression {
            cluster.insert("disable-compression".into(), json!(true));
        }
        if let Some(config) = &c.exec_extension {
            // Canonical JSON produced by selection; parse so it is embedded, not quoted.
            if let Ok(v) = serde_json::from_str::<Value>(config) {
                cluster.insert("config".into(), v);
            }
        }
        spec.insert("cluster".into(), Value::Object(cluster));
    }
    spec.insert("interactive".into(), json!(false));
    json!({
        "apiVersion": access.exec.api_version.as_str(),
        "kind": "ExecCredential",
        "spec": Value::Object(spec),
    })
}

/// Runs the plugin of `access` once and returns its validated credential.
pub async fn run_plugin(
    access: &EffectiveAccess,
    opts: &ExecOptions,
) -> Result<Credential, ExecError> {
    let command = access.exec.command.clone();
    let info = exec_info(access).to_string();
    let mut cmd = Command::new(&access.exec.command);
    cmd.args(&access.exec.args)
        .envs(
            access
                .exec
                .env
                .iter()
                .map(|e| (e.name.as_str(), e.value.as_str())),
        )
        // Set last, over the configured and the profile's variables: which spoke the run is
        // for, and the audience of its token, are the hub's to say.
        .env(AUDIENCE_ENV, &access.audience)
        .env(PROFILE_ENV, &access.spoke)
        .env("KUBERNETES_EXEC_INFO", info)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Own process group, so a timeout also kills whatever the plugin started.
    #[cfg(unix)]
    cmd.process_group(0);
    // A plugin replaced moments ago (an in-place upgrade, a test writing its script) can still be
    // open for writing in a child some other thread forked and has not exec'ed yet: exec then
    // fails with ETXTBSY for a few milliseconds. Retry that briefly rather than fail the spoke.
    let mut busy_retries = 0;
    let spawned = loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && busy_retries < 10 => {
                // 5 ms doubling to 200 ms: about a second in all, then the error stands.
                let wait = (5u64 << busy_retries).min(200);
                busy_retries += 1;
                tracing::debug!(
                    command = %command,
                    retry = busy_retries,
                    retry_in_ms = wait,
                    "plugin executable busy (ETXTBSY); retrying"
                );
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            other => break other,
        }
    };
    let mut child = spawned.map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ExecError::NotFound {
                command: command.clone(),
                hint: access
                    .exec
                    .install_hint
                    .as_ref()
                    .map(|h| format!("\n{h}"))
                    .unwrap_or_default(),
            }
        } else {
            ExecError::Spawn {
                command: command.clone(),
                source,
            }
        }
    })?;
    let pid = child.id();
    // If this future is dropped mid-run (the caller was cancelled), the guard kills the whole
    // group; `kill_on_drop` alone would only reach the direct child.
    let mut guard = GroupGuard { pid, armed: true };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ExecError::Io {
            command,
            source: std::io::Error::other("missing stdio pipes"),
        });
    };

    // Filled as stderr is read, so a plugin killed on timeout still has its stderr reported.
    // A std mutex: locked only between reads, never across an await.
    let collected = std::sync::Mutex::new(StderrCollector::new(opts.max_stderr_bytes));
    let take_stderr = |collected: std::sync::Mutex<StderrCollector>| {
        collected
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .finish()
    };
    let work = async {
        let out = async {
            let r = read_bounded(stdout, opts.max_stdout_bytes).await;
            if !matches!(r, Ok(Some(_))) {
                kill_group(pid);
            }
            r
        };
        let (out, err) = tokio::join!(out, read_stderr(stderr, &collected));
        let status = child.wait().await;
        (out, err, status)
    };
    let finished = tokio::time::timeout(opts.timeout, work).await;
    let (out, err, status) = match finished {
        Ok(done) => done,
        Err(_) => {
            kill_group(pid);
            let _ = child.kill().await;
            guard.armed = false;
            return Err(ExecError::Timeout {
                command,
                timeout: opts.timeout,
                stderr: take_stderr(collected),
            });
        }
    };
    // The plugin has exited and been reaped: its pid may be reused, never signal it again.
    guard.armed = false;
    let io = |source| ExecError::Io {
        command: command.clone(),
        source,
    };
    let stdout = out.map_err(io)?;
    let status = status.map_err(io)?;
    // A stderr read error only shortens what is reported; the exit status still counts.
    let _ = err;
    let stderr = take_stderr(collected);
    let Some(stdout) = stdout else {
        return Err(ExecError::StdoutTooLarge {
            command,
            limit: opts.max_stdout_bytes,
        });
    };
    if !status.success() {
        return Err(ExecError::Failed {
            command,
            status: describe_status(&status),
            stderr,
        });
    }
    parse_exec_output(&stdout, access.exec.api_version).map_err(|source| ExecError::InvalidOutput {
        command,
        source,
        stderr,
    })
}

fn describe_status(status: &std::process::ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("signal {sig}");
        }
    }
    "unknown status".into()
}

/// Reads all of `r`; `Ok(None)` when it holds more than `limit` bytes (reading stops there).
async fn read_bounded<R: AsyncRead + Unpin>(
    mut r: R,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Some(buf));
        }
        if buf.len() + n > limit {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads all of `r` into `into` (which keeps the first bytes and hashes and counts all), so
/// the plugin never blocks on a full stderr pipe.
async fn read_stderr<R: AsyncRead + Unpin>(
    mut r: R,
    into: &std::sync::Mutex<StderrCollector>,
) -> std::io::Result<()> {
    let mut chunk = [0u8; 8192];
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        into.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(&chunk[..n]);
    }
}

/// Kills the plugin's process group when dropped while armed.
struct GroupGuard {
    pid: Option<u32>,
    armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            kill_group(self.pid);
        }
    }
}

/// SIGKILLs the plugin's process group (the plugin was started as its leader).
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0) {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses the
        // process group we created with `process_group(0)`.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}
