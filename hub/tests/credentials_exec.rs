//! The exec runtime against test plugin scripts.

use crate::support;

use std::time::Duration;

use kleym_hub::access::ExecApiVersion;
use kleym_hub::credentials::exec_output::OutputError;
use kleym_hub::credentials::{ExecError, ExecOptions, run_plugin};
use serde_json::Value;
use support::*;

const V1: &str = "client.authentication.k8s.io/v1";
const V1B: &str = "client.authentication.k8s.io/v1beta1";

fn opts() -> ExecOptions {
    ExecOptions {
        timeout: Duration::from_secs(20),
        ..ExecOptions::default()
    }
}

#[tokio::test]
async fn v1_token_with_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        &print_token(V1, "tok-v1", Some("2099-01-02T03:04:05Z")),
    );
    let c = run_plugin(
        &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        &opts(),
    )
    .await
    .unwrap();
    assert_eq!(c.token.unwrap().expose(), "tok-v1");
    assert_eq!(
        c.expires_at.unwrap().to_rfc3339(),
        "2099-01-02T03:04:05+00:00"
    );
    assert!(c.client_certificate.is_none());
}

#[tokio::test]
async fn v1beta1_token_without_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", &print_token(V1B, "tok-beta", None));
    let c = run_plugin(
        &access_for(&s, ExecApiVersion::V1Beta1, "https://spoke:6443"),
        &opts(),
    )
    .await
    .unwrap();
    assert_eq!(c.token.unwrap().expose(), "tok-beta");
    assert!(c.expires_at.is_none());
}

#[tokio::test]
async fn client_certificate_output() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["hub".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let doc = serde_json::json!({
        "apiVersion": V1, "kind": "ExecCredential",
        "status": {"clientCertificateData": cert.pem(), "clientKeyData": key.serialize_pem(), "expirationTimestamp": "2099-01-01T00:00:00Z"}
    });
    std::fs::write(dir.path().join("cred.json"), doc.to_string()).unwrap();
    let s = write_script(dir.path(), "p.sh", r#"cat "$KLEYM_TEST_DIR/cred.json""#);
    let c = run_plugin(
        &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        &opts(),
    )
    .await
    .unwrap();
    let cc = c.client_certificate.unwrap();
    assert_eq!(cc.certificate_pem, cert.pem());
    assert_eq!(cc.key_pem.expose(), key.serialize_pem());
    assert!(c.token.is_none());
}

#[tokio::test]
async fn exec_info_env_args_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!(
            r#"printf '%s' "$KUBERNETES_EXEC_INFO" > "$KLEYM_TEST_DIR/info.json"
printf '%s|%s|%s' "$EXTRA" "$1" "$2" > "$KLEYM_TEST_DIR/args.txt"
cat > "$KLEYM_TEST_DIR/stdin.txt"
{}"#,
            print_token(V1, "t", None)
        ),
    );
    let mut access = access_for(&s, ExecApiVersion::V1, "https://spoke.example:6443");
    access
        .exec
        .args
        .extend(["--audience".to_string(), "a b".to_string()]);
    access.exec.env.push(kleym_hub::access::EnvVar {
        name: "EXTRA".into(),
        value: "from-config".into(),
    });
    access.cluster.exec_extension = Some(r#"{"clusterName":"spoke-1"}"#.into());
    access.cluster.certificate_authority_pem = Some(b"PEM".to_vec().into());
    access.cluster.tls_server_name = Some("api.spoke".into());
    access.cluster.proxy_url = Some("http://proxy:3128".into());
    access.cluster.disable_compression = true;
    run_plugin(&access, &opts()).await.unwrap();

    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("info.json")).unwrap())
            .unwrap();
    assert_eq!(info["apiVersion"], V1);
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    let cluster = &info["spec"]["cluster"];
    assert_eq!(cluster["server"], "https://spoke.example:6443");
    assert_eq!(cluster["config"]["clusterName"], "spoke-1");
    assert_eq!(cluster["certificate-authority-data"], "UEVN");
    assert_eq!(cluster["tls-server-name"], "api.spoke");
    assert_eq!(cluster["proxy-url"], "http://proxy:3128");
    assert_eq!(cluster["disable-compression"], true);
    assert!(cluster.get("insecure-skip-tls-verify").is_none());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("args.txt")).unwrap(),
        "from-config|--audience|a b"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("stdin.txt")).unwrap(),
        ""
    );

    // Without provideClusterInfo, no spec.cluster.
    access.exec.provide_cluster_info = false;
    run_plugin(&access, &opts()).await.unwrap();
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("info.json")).unwrap())
            .unwrap();
    assert!(info["spec"].get("cluster").is_none(), "{info}");
    assert_eq!(info["spec"]["interactive"], false);
}

#[tokio::test]
async fn hung_plugin_and_its_children_are_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        r#"echo $$ > "$KLEYM_TEST_DIR/self.pid"; sleep 300 & echo $! > "$KLEYM_TEST_DIR/child.pid"; wait"#,
    );
    let o = ExecOptions {
        timeout: Duration::from_millis(1500),
        ..ExecOptions::default()
    };
    let started = std::time::Instant::now();
    let err = run_plugin(
        &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        &o,
    )
    .await
    .unwrap_err();
    let elapsed = started.elapsed();
    // The configured limit is what ended the run: the error carries and names it, and the
    // plugin was not cut short before it (no upper bound: a loaded machine may be late).
    assert!(
        matches!(err, ExecError::Timeout { timeout, .. } if timeout == o.timeout),
        "{err}"
    );
    assert!(err.to_string().contains("timed out after 1.5s"), "{err}");
    assert!(elapsed >= o.timeout, "gave up after {elapsed:?}");
    assert_eq!(err.result_label(), "timeout");
    for f in ["child.pid", "self.pid"] {
        let pid: u32 = std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut gone = false;
        for _ in 0..100 {
            if process_gone(pid) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "{f} ({pid}) still running after the timeout");
    }
}

async fn output_error(body: &str, api: ExecApiVersion) -> ExecError {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", body);
    run_plugin(&access_for(&s, api, "https://spoke:6443"), &opts())
        .await
        .unwrap_err()
}

#[tokio::test]
async fn invalid_outputs_are_rejected_with_the_rule_that_failed() {
    let garbage = output_error("echo 'this is not json {'", ExecApiVersion::V1).await;
    assert!(
        matches!(
            garbage,
            ExecError::InvalidOutput {
                source: OutputError::NotADocument { .. },
                ..
            }
        ),
        "{garbage}"
    );

    let wrong = output_error(&print_token(V1B, "t", None), ExecApiVersion::V1).await;
    assert!(
        matches!(
            wrong,
            ExecError::InvalidOutput {
                source: OutputError::ApiVersionMismatch { .. },
                ..
            }
        ),
        "{wrong}"
    );
    assert!(
        wrong
            .to_string()
            .contains("configured to use API version client.authentication.k8s.io/v1"),
        "{wrong}"
    );

    let no_status = output_error(
        &format!(r#"echo '{{"apiVersion":"{V1}","kind":"ExecCredential"}}'"#),
        ExecApiVersion::V1,
    )
    .await;
    assert!(
        matches!(
            no_status,
            ExecError::InvalidOutput {
                source: OutputError::MissingStatus,
                ..
            }
        ),
        "{no_status}"
    );

    let bad_ts = output_error(
        &print_token(V1, "t", Some("next tuesday")),
        ExecApiVersion::V1,
    )
    .await;
    assert!(
        matches!(
            bad_ts,
            ExecError::InvalidOutput {
                source: OutputError::BadExpiry { .. },
                ..
            }
        ),
        "{bad_ts}"
    );

    let no_key = output_error(&format!(r#"echo '{{"apiVersion":"{V1}","kind":"ExecCredential","status":{{"clientCertificateData":"x"}}}}'"#), ExecApiVersion::V1).await;
    assert!(
        matches!(
            no_key,
            ExecError::InvalidOutput {
                source: OutputError::IncompletePair,
                ..
            }
        ),
        "{no_key}"
    );
}

#[tokio::test]
async fn oversized_output_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(dir.path(), "p.sh", "head -c 200000 /dev/zero; sleep 300");
    let o = ExecOptions {
        max_stdout_bytes: 64 * 1024,
        timeout: Duration::from_secs(20),
        ..ExecOptions::default()
    };
    let err = run_plugin(
        &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        &o,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, ExecError::StdoutTooLarge { limit: 65536, .. }),
        "{err}"
    );
}

/// The error names the exit code and stderr's size and hash, never its text (the error
/// reaches status objects); the redacted excerpt is kept for the log.
#[tokio::test]
async fn non_zero_exit_reports_code_and_stderr_hash_with_the_text_for_logs_only() {
    let token = long_token(1);
    let err = output_error(
        &format!("echo 'cannot reach issuer; last token {token}' >&2; exit 3"),
        ExecApiVersion::V1,
    )
    .await;
    let msg = err.to_string();
    assert!(matches!(err, ExecError::Failed { .. }), "{msg}");
    assert!(msg.contains("exit code 3"), "{msg}");
    let stderr = err.stderr().unwrap();
    let line = format!("cannot reach issuer; last token {token}\n");
    assert_eq!(stderr.len(), line.len() as u64);
    let sha = stderr.sha256_prefix();
    assert_eq!(sha.len(), 12);
    assert!(sha.chars().all(|c| c.is_ascii_hexdigit()), "{sha}");
    assert!(
        msg.contains(&format!("stderr: {} bytes, sha256:{sha}", line.len())),
        "{msg}"
    );
    for shown in [&msg, &format!("{err:?}")] {
        assert!(!shown.contains("cannot reach issuer"), "{shown}");
        assert!(!shown.contains(&token), "{shown}");
    }
    assert!(
        stderr.log_excerpt().contains("cannot reach issuer"),
        "{}",
        stderr.log_excerpt()
    );
    assert!(!stderr.log_excerpt().contains(&token));
}

/// Text no pattern recognises as a secret stays out of every error form for a plugin that
/// exits 1 after printing it, one that prints it and hangs until killed, and one that prints
/// invalid JSON containing it (on stdout, and on stderr).
#[tokio::test]
async fn plugin_output_that_is_not_token_shaped_never_reaches_the_error() {
    const SECRET: &str = "swordfishcorrecthorse";
    let o = ExecOptions {
        timeout: Duration::from_millis(1500),
        ..ExecOptions::default()
    };
    for (body, label) in [
        (
            format!("echo 'client secret is {SECRET}' >&2; exit 1"),
            "exit_error",
        ),
        (
            format!(
                "echo 'client secret is {SECRET}' >&2; echo 'client secret is {SECRET}'; exec sleep 300"
            ),
            "timeout",
        ),
        (
            format!("echo 'client secret is {SECRET}' >&2; echo '{{\"token\": \"{SECRET}\"'"),
            "invalid_output",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let s = write_script(dir.path(), "p.sh", &body);
        let err = run_plugin(
            &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
            &o,
        )
        .await
        .unwrap_err();
        assert_eq!(err.result_label(), label, "{err}");
        let shown = format!("{err} / {err:?}");
        assert!(!shown.contains("swordfish"), "{label}: {shown}");
        let stderr = err.stderr().unwrap();
        assert_eq!(stderr.len(), 39, "{label}: stderr counted even when killed");
        assert!(
            shown.contains(&format!("sha256:{}", stderr.sha256_prefix())),
            "{shown}"
        );
        // The log may carry it: redaction does not recognise it (which is the point).
        assert!(stderr.log_excerpt().contains(SECRET), "{label}");
    }
}

/// A plugin flooding stderr: the excerpt is bounded, the size and hash cover all of it.
#[tokio::test]
async fn stderr_excerpt_is_bounded_and_the_hash_covers_everything() {
    let o = ExecOptions {
        max_stderr_bytes: 1000,
        ..opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        "head -c 300000 /dev/zero | tr '\\0' 'a' >&2; exit 2",
    );
    let err = run_plugin(
        &access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        &o,
    )
    .await
    .unwrap_err();
    let stderr = err.stderr().unwrap();
    assert_eq!(stderr.len(), 300_000, "{err}");
    assert!(
        stderr.log_excerpt().len() <= 1000,
        "{}",
        stderr.log_excerpt().len()
    );
    // SHA-256 of 300000 'a's.
    use sha2::Digest;
    let want = hex::encode(sha2::Sha256::digest(vec![b'a'; 300_000]));
    assert_eq!(stderr.sha256_prefix(), &want[..12]);
}

#[tokio::test]
async fn missing_binary_is_reported_with_install_hint() {
    let dir = tempfile::tempdir().unwrap();
    let mut access = access_for(
        &dir.path().join("x"),
        ExecApiVersion::V1,
        "https://spoke:6443",
    );
    access.exec.command = dir.path().join("no-such-plugin").display().to_string();
    access.exec.install_hint = Some("install it with apt".into());
    let err = run_plugin(&access, &opts()).await.unwrap_err();
    assert!(matches!(err, ExecError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("install it with apt"), "{err}");
}

#[tokio::test]
async fn cancelling_the_caller_kills_the_plugin_group() {
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        r#"sleep 300 & echo $! > "$KLEYM_TEST_DIR/child.tmp"; mv "$KLEYM_TEST_DIR/child.tmp" "$KLEYM_TEST_DIR/child.pid"; wait"#,
    );
    let access = access_for(&s, ExecApiVersion::V1, "https://spoke:6443");
    let task = tokio::spawn(async move { run_plugin(&access, &opts()).await });
    let pid_file = dir.path().join("child.pid");
    for _ in 0..200 {
        if pid_file.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    task.abort();
    let _ = task.await;
    let mut gone = false;
    for _ in 0..100 {
        if process_gone(pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "plugin child {pid} survived the cancelled exec");
}

#[tokio::test]
async fn a_plugin_still_open_for_writing_is_retried_not_failed() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    // The exec's own debug log, to see its ETXTBSY retry happen (the runtime has one thread,
    // so the spawned exec logs to this thread's subscriber).
    #[derive(Clone, Default)]
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.sh");
    // The executable stays open for writing until the exec was seen failing with ETXTBSY, as
    // it does when another thread's forked child still holds a just-written plugin open.
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "#!/bin/sh\n{}",
        print_token(V1, "tok-busy", Some("2099-01-02T03:04:05Z"))
    )
    .unwrap();
    f.flush().unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut access = access_for(&path, ExecApiVersion::V1, "https://spoke:6443");
    access.exec.command = path.display().to_string();
    access.exec.args.clear();
    let run = tokio::spawn(async move { run_plugin(&access, &opts()).await });
    let busy = || String::from_utf8_lossy(&log.0.lock().unwrap()).contains("ETXTBSY");
    for _ in 0..1000 {
        if busy() || run.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(busy(), "the exec never met the busy executable");
    drop(f);
    let c = run.await.unwrap().expect("retried once the file is closed");
    assert_eq!(c.token.unwrap().expose(), "tok-busy");
}
