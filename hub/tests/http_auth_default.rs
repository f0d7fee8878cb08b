//! `--api-auth-mode` defaults to `enforce` whenever the hub API listens, in a cluster or not
//! (a pod without a mounted ServiceAccount token included); a weaker mode only when asked
//! for. When `enforce` cannot work because the hub may not create TokenReviews in its cluster
//! (credentials refused: 401; no RBAC: 403), the real `kleym hub` exits at start-up with an
//! error naming the flag, instead of serving an API that refuses everyone or, as before, one
//! that lets everyone in.

use crate::hub_sim;

use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Parser;
use kleym_hub::http::ApiArgs;
use kleym_hub::http::auth::AuthMode;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    api: ApiArgs,
}

#[test]
fn the_default_is_enforce_and_weaker_modes_are_explicit() {
    let default = Cli::try_parse_from(["t", "--api-insecure-http"])
        .unwrap()
        .api;
    assert_eq!(default.auth_mode(), AuthMode::Enforce);
    for (flag, mode) in [
        ("permissive", AuthMode::Permissive),
        ("off", AuthMode::Off),
        ("enforce", AuthMode::Enforce),
    ] {
        let args = Cli::try_parse_from(["t", "--api-insecure-http", "--api-auth-mode", flag])
            .unwrap()
            .api;
        assert_eq!(args.auth_mode(), mode);
    }
}

/// Runs `kleym hub` against the hub cluster with `token`, the API on plain HTTP, and
/// `extra` flags; returns its exit status and stderr once it exits. A hub that keeps running
/// is killed after `limit` and reported as `None`.
async fn run_hub(
    hub: &hub_sim::Hub,
    token: &str,
    extra: &[&str],
    limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let dir = tempfile::tempdir().unwrap();
    let kc = hub_sim::write_kubeconfig(dir.path(), hub);
    let text = std::fs::read_to_string(&kc)
        .unwrap()
        .replace(&hub.cluster.admin_token(), token);
    std::fs::write(&kc, text).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(["hub", "--kubeconfig"])
        .arg(&kc)
        .args(["--trust-domain", "example.org", "--leader-elect=false"])
        .args(["--clusterprofile-access-provider", "tok=/bin/true"])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(["--api-addr", "127.0.0.1:0", "--api-insecure-http"])
        .args(extra)
        .env_remove("KLEYM_API_AUTH_MODE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_refuses_to_start_when_enforce_cannot_review_tokens() {
    let hub = hub_sim::start("unused").await;
    // A ServiceAccount without RBAC for tokenreviews (403), and a token the cluster does not
    // know (401).
    let no_rbac = hub
        .cluster
        .issue_sa_token("kleym", "hub", &[], Duration::from_secs(3600), None)
        .await
        .unwrap();
    for (token, code) in [(no_rbac.as_str(), "403"), ("not-a-known-token", "401")] {
        let (status, stderr) = run_hub(&hub, token, &[], Duration::from_secs(60)).await;
        let status = status.unwrap_or_else(|| panic!("the hub kept running: {stderr}"));
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains("--api-auth-mode") && stderr.contains(code),
            "{code}: {stderr}"
        );
    }
}
