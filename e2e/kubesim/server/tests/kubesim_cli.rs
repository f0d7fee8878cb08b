//! The `kubesim` command: starts clusters, preloads CRDs, writes the state directory, prints
//! `ready`, serves kubectl, and exits cleanly on SIGTERM.

use kubesim::testing::find_kubectl;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn upstream_crds() -> PathBuf {
    upstream_crds::upstream_dir()
}

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let bin = find_kubectl().expect("kubectl is required for this test");
    Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubesim_command_serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .args(["--clusters", "hub,spoke-1", "--state-dir"])
        .arg(dir.path())
        .arg("--crds")
        .arg(upstream_crds())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
        .await
        .expect("ready in time")
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));

    for name in ["hub", "spoke-1"] {
        let d = dir.path().join(name);
        let server = std::fs::read_to_string(d.join("server")).unwrap();
        assert!(server.starts_with("https://127.0.0.1:"), "{server}");
        let ca = std::fs::read_to_string(d.join("ca.crt")).unwrap();
        assert!(ca.contains("BEGIN CERTIFICATE"));
        use std::os::unix::fs::PermissionsExt;
        for secret in ["admin.token", "kubeconfig"] {
            let mode = std::fs::metadata(d.join(secret))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{secret} must be private");
        }
        let token = std::fs::read_to_string(d.join("admin.token")).unwrap();
        assert!(!token.trim().is_empty());
        let kc = std::fs::read_to_string(d.join("kubeconfig")).unwrap();
        assert!(kc.contains(&server) && kc.contains("certificate-authority-data"));
        let out = kubectl(&d.join("kubeconfig"), &["get", "crd", "-o", "name"]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let crds = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            crds.lines().count(),
            8,
            "every upstream CRD is preloaded:\n{crds}"
        );
        assert!(crds.contains("clusterspiffeids.spire.spiffe.io"));
    }
    // Each cluster has its own CA: the hub's kubeconfig with the spoke's URL must fail TLS.
    let hub_kc = std::fs::read_to_string(dir.path().join("hub/kubeconfig")).unwrap();
    let spoke_url = std::fs::read_to_string(dir.path().join("spoke-1/server")).unwrap();
    let hub_url = std::fs::read_to_string(dir.path().join("hub/server")).unwrap();
    let crossed = dir.path().join("crossed.kubeconfig");
    std::fs::write(&crossed, hub_kc.replace(&hub_url, &spoke_url)).unwrap();
    let out = kubectl(&crossed, &["get", "ns"]).await;
    assert!(
        !out.status.success(),
        "another cluster's CA must not be trusted"
    );

    // The combined kubeconfig has one context per cluster.
    let out = kubectl(
        &dir.path().join("kubeconfig"),
        &["config", "get-contexts", "-o", "name"],
    )
    .await;
    let contexts = String::from_utf8_lossy(&out.stdout);
    assert!(
        contexts.contains("hub") && contexts.contains("spoke-1"),
        "{contexts}"
    );

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "clean exit: {status:?}");
    assert_eq!(
        stdout.next_line().await.unwrap(),
        None,
        "only one line on stdout"
    );
}

#[tokio::test]
async fn kubesim_help_documents_the_fault_endpoint() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .arg("--help")
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--clusters",
        "--state-dir",
        "--crds",
        "/kubesim/faults",
        "blackhole",
        "ready",
    ] {
        assert!(help.contains(want), "--help lacks {want}");
    }
}

#[tokio::test]
async fn kubesim_rejects_bad_crd_paths() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .args(["--clusters", "hub", "--state-dir"])
        .arg(dir.path())
        .args(["--crds", "/nonexistent/crds.yaml"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/crds.yaml"));
    assert!(out.stdout.is_empty(), "no `ready` on failure");
}
