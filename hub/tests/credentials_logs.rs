//! Token values never appear in logs, even at trace level (hyper, kube and our own spans
//! included), across success, 401 retry, plugin failure and invalid output; short tokens and
//! labelled secrets a failing plugin prints on stderr are redacted in the log's stderr
//! excerpt, and errors carry no stderr text at all; provider env values never show in
//! `Debug` output.

use crate::http401;
use crate::support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kleym_hub::access::{EnvVar, ExecApiVersion};
use kleym_hub::credentials::{
    CacheOptions, ClientOptions, CredentialMetrics, ExecOptions, SpokeCredentials,
    build_spoke_client,
};
use support::*;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn accept_second(token: &str) -> bool {
    token == long_token(2)
}

#[tokio::test]
async fn tokens_never_reach_trace_logs() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let opts = CacheOptions {
        failure_backoff: Duration::ZERO,
        exec: ExecOptions {
            timeout: Duration::from_secs(20),
            ..ExecOptions::default()
        },
        ..CacheOptions::default()
    };
    let (addr, seen) = http401::start(accept_second).await;
    let dir = tempfile::tempdir().unwrap();
    // tok 1 is rejected by the server, tok 2 accepted; the 3rd run fails and echoes a token on
    // stderr; the 4th returns an invalid credential that still carries a token.
    let t = |n| long_token(n);
    let body = format!(
        r#"{COUNT}
case "$n" in
  1|2) printf '{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"%s"}}}}' "kleymtesttoken${{n}}AAAABBBBCCCCDDDDEEEEFFFF" ;;
  3) echo "refusing, old token was {t3}" >&2; exit 2 ;;
  *) printf '{{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{{"token":"{t4}"}}}}' ;;
esac"#,
        t3 = t(3),
        t4 = t(4),
    );
    let s = write_script(dir.path(), "p.sh", &body);
    let creds = Arc::new(SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, &format!("http://{addr}")),
        opts,
        CredentialMetrics::default(),
    ));
    let client = build_spoke_client(creds.clone(), &ClientOptions::default())
        .await
        .unwrap();
    client.client.apiserver_version().await.unwrap();
    assert_eq!(seen.list().len(), 2);
    let current = creds.get().await.unwrap();
    tracing::trace!(credential = ?current.credential, "debug form of a credential");

    creds.invalidate_after_401(current.generation);
    let failed = creds.get().await.unwrap_err();
    tracing::trace!(error = %failed, "exit failure");
    let invalid = creds.get().await.unwrap_err();
    tracing::trace!(error = %invalid, "invalid output");
    assert_eq!(count(dir.path()), 4);

    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("credential plugin succeeded"), "{logs}");
    assert!(logs.contains("credential plugin failed"), "{logs}");
    assert!(logs.contains("TRACE"), "trace level not captured");
    for n in 1..=4 {
        assert!(!logs.contains(&t(n)), "token {n} leaked into logs:\n{logs}");
    }
}

fn capture() -> (Buffer, tracing::subscriber::DefaultGuard) {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (buffer, tracing::subscriber::set_default(subscriber))
}

/// Runs a failing plugin that prints a phrase, three short secrets and a plain-words secret
/// on stderr, with `--log-plugin-stderr` on or off; returns (error text, captured logs).
async fn failing_plugin_run(log_stderr_excerpt: bool) -> (String, String) {
    let (buffer, _guard) = capture();
    // Short values the old "20 characters or longer" rule let through: a 9-character token,
    // a plain-word password and a mixed-case key.
    let (token, password, key) = SHORT_SECRETS;
    let dir = tempfile::tempdir().unwrap();
    let s = write_script(
        dir.path(),
        "p.sh",
        &format!(
            "echo 'issuer said no, token {token} expired' >&2\n\
             echo 'password: {password}' >&2\n\
             echo 'AWS_SECRET_ACCESS_KEY={key}' >&2\n\
             echo 'client secret is {PLAIN_SECRET}' >&2\n\
             exit 4"
        ),
    );
    let creds = SpokeCredentials::new(
        access_for(&s, ExecApiVersion::V1, "https://spoke:6443"),
        CacheOptions {
            failure_backoff: Duration::ZERO,
            exec: ExecOptions {
                log_stderr_excerpt,
                ..ExecOptions::default()
            },
            ..CacheOptions::default()
        },
        CredentialMetrics::default(),
    );
    let err = creds.get().await.unwrap_err().to_string();
    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    (err, logs)
}

const SHORT_SECRETS: (&str, &str, &str) = ("Xq7bN2kLp", "correcthorsebattery", "AbCdEfGhIjKl");
/// A secret in plain words: no pattern can tell it from prose.
const PLAIN_SECRET: &str = "swordfish";

#[tokio::test]
async fn plugin_stderr_reaches_neither_errors_nor_logs_by_default() {
    let (err, logs) = failing_plugin_run(false).await;
    assert!(logs.contains("credential plugin failed"), "{logs}");
    // The error (it reaches status objects) and the log carry stderr's size and hash only.
    for text in [&err, &logs] {
        assert!(text.contains("exit code 4"), "{text}");
        assert!(text.contains("sha256:"), "{text}");
        assert!(!text.contains("issuer said no"), "{text}");
        assert!(!text.contains("stderr_excerpt"), "{text}");
        assert!(!text.contains(PLAIN_SECRET), "{text}");
    }
}

#[tokio::test]
async fn with_log_plugin_stderr_the_log_gets_a_redacted_excerpt() {
    let (err, logs) = failing_plugin_run(true).await;
    // The error still has no stderr text at all, only its size and hash.
    assert!(err.contains("exit code 4"), "{err}");
    assert!(err.contains("sha256:"), "{err}");
    assert!(!err.contains("issuer said no"), "{err}");
    // The log has the redacted excerpt: what went wrong is readable…
    assert!(logs.contains("exit code 4"), "{logs}");
    assert!(logs.contains("issuer said no, token"), "{logs}");
    assert!(logs.contains("AWS_SECRET_ACCESS_KEY"), "{logs}");
    // …the values that look like secrets are not (a plain-words one would be: that is why
    // the excerpt is opt-in).
    let (token, password, key) = SHORT_SECRETS;
    for text in [&err, &logs] {
        for secret in [token, password, key] {
            assert!(!text.contains(secret), "{secret} leaked:\n{text}");
        }
    }
}

#[test]
fn provider_env_values_never_show_in_debug() {
    let dir = tempfile::tempdir().unwrap();
    let mut access = access_for(&dir.path().join("p.sh"), ExecApiVersion::V1, "https://x");
    let secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYzz";
    access.exec.env.push(EnvVar {
        name: "AWS_SECRET_ACCESS_KEY".into(),
        value: secret.into(),
    });
    for dbg in [format!("{access:?}"), format!("{:#?}", access.exec.env)] {
        assert!(!dbg.contains(secret), "{dbg}");
        assert!(dbg.contains("AWS_SECRET_ACCESS_KEY"), "{dbg}");
    }
}
