//! The demo end to end (`kleym-demo --exit-when-converged`): a hub and three spokes on
//! kubesim, the hub engaging them through both bundled credential plugins, a fleet
//! report with exactly the two planted findings, and `kleym explain pod` showing them from
//! a scheduled pod's side.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

fn members(f: &Value) -> BTreeSet<String> {
    f["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}: {}/{}",
                m["cluster"].as_str().unwrap(),
                m["namespace"].as_str().unwrap(),
                m["binding"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn demo_converges_and_reports_exactly_the_planted_findings() {
    let dir = tempfile::tempdir().unwrap();
    // Run a copy of the binary, from a working directory outside the repository, as an
    // installed `kleym-demo` would run: it must need nothing from the source tree (the
    // upstream CRDs are embedded) and, with no `kleym` beside it, runs the credential
    // plugins from its own binary.
    let elsewhere = tempfile::tempdir().unwrap();
    let installed = elsewhere.path().join("kleym-demo");
    std::fs::copy(env!("CARGO_BIN_EXE_kleym-demo"), &installed).unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap();
    let cwd = elsewhere.path().canonicalize().unwrap();
    assert!(!cwd.starts_with(&repo), "{cwd:?} is inside {repo:?}");
    let out = Command::new(&installed)
        .current_dir(&cwd)
        .args(["--exit-when-converged", "--spokes", "3", "--timeout", "120"])
        .args(["--trust-domain", "test.example"])
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("Clusters: 3 (2 ready, 0 unhealthy)"),
        "{stdout}"
    );
    assert!(stdout.contains("exactly the planted findings"), "{stdout}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["bindings"], 10);
    assert_eq!(report["clusters"]["total"], 3);
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 2, "{findings:#?}");

    let collision = findings
        .iter()
        .find(|f| f["kind"] == "IdentityCollision")
        .expect("the planted collision");
    assert_eq!(
        members(collision),
        BTreeSet::from([
            "fleet/spoke-1: llm/summarize".to_string(),
            "fleet/spoke-1: llm/summarize-canary".to_string()
        ])
    );
    let drift = findings
        .iter()
        .find(|f| f["kind"] == "CrossClusterDrift")
        .expect("the planted drift");
    assert_eq!(
        drift["spiffeID"],
        "spiffe://test.example/ns/llm/objective/chat"
    );
    assert_eq!(
        members(drift),
        (1..=3)
            .map(|i| format!("fleet/spoke-{i}: llm/chat"))
            .collect::<BTreeSet<_>>()
    );
    // The planted mistakes from a pod's side (`kleym explain pod`, with the pods scheduled):
    // in spoke-1 the summarize container gets no SVID, both colliding bindings refused …
    assert!(stdout.contains("From a pod's side"), "{stdout}");
    let spoke1 = std::fs::read_to_string(dir.path().join("explain-spoke-1.txt")).unwrap();
    let chat_id = "spiffe://test.example/ns/llm/objective/chat";
    assert!(
        spoke1.contains(&format!("  chat: {chat_id}\n")) && spoke1.contains("  summarize: none\n"),
        "{spoke1}"
    );
    for refused in ["summarize", "summarize-canary"] {
        assert!(
            spoke1.contains(&format!(
                "  {refused} (no output): does not reach the pod\n    the binding is refused: IdentityCollision"
            )),
            "{spoke1}"
        );
    }
    assert!(
        spoke1.contains("parent    spiffe://test.example/spire/agent/k8s_psat/spoke-1/"),
        "{spoke1}"
    );
    // The bindings are grouped by whether their objective's pool selects the pod: `embed`
    // targets the embedding pool.
    let (mine, others) = spoke1
        .split_once("\nOther bindings in namespace llm:\n")
        .unwrap_or_else(|| panic!("no group of other bindings in:\n{spoke1}"));
    assert!(
        mine.contains("Bindings in namespace llm that target the pod's pool:\n")
            && mine.contains("  summarize-canary (no output)"),
        "{spoke1}"
    );
    assert!(
        others.contains("  embed (")
            && others.contains("it targets InferencePool embed-pool (inference.networking.k8s.io) via InferenceObjective llm/embed (llm-d.ai), which does not select the pod: needs app=text-embedder (the pod has app=vllm-qwen)"),
        "{spoke1}"
    );
    // … and in spoke-2 the chat ID goes to the renamed container: the drift.
    let spoke2 = std::fs::read_to_string(dir.path().join("explain-spoke-2.txt")).unwrap();
    assert!(
        spoke2.contains(&format!("  chat-v2: {chat_id}\n")),
        "{spoke2}"
    );
    // The state directory holds what the printed next steps point at.
    for f in [
        "kubeconfig",
        "spoke-1/kubeconfig",
        "hub/kubeconfig",
        "providers.json",
        "report.txt",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    // Only spoke-1 (the collision) is not ready.
    let ready: Vec<(String, String)> = report["spokes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let c = s["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Ready")
                .unwrap();
            (
                s["cluster"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        ready,
        vec![
            ("fleet/spoke-1".to_string(), "False".to_string()),
            ("fleet/spoke-2".to_string(), "True".to_string()),
            ("fleet/spoke-3".to_string(), "True".to_string()),
        ]
    );
}

#[test]
fn demo_fails_clearly_without_its_options_making_sense() {
    let out = Command::new(env!("CARGO_BIN_EXE_kleym-demo"))
        .args(["--spokes", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let help = Command::new(env!("CARGO_BIN_EXE_kleym-demo"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--state-dir",
        "--spokes",
        "--keep-running",
        "--exit-when-converged",
        "--timeout",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}: {text}");
    }
}
