//! The Helm chart (`charts/kleym/`) through the REAL `helm`: `helm lint --strict` passes
//! under every value set `deploy_chart.rs` exercises (and a few more), `helm template`
//! renders exactly the documents the home-made renderer (`deploy_support`) renders — which
//! proves that renderer, and so `deploy_chart.rs`'s assertions, faithful — and every rendered
//! object of a kind kubesim serves passes `kubectl apply --dry-run=server` against a kubesim
//! cluster with every CRD installed.
//!
//! helm is located as every tool is (`test_tools`: PATH first, then the project's tool cache
//! that `scripts/ensure-tools` fills); without it the tests fail, they never skip.

mod deploy_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use deploy_support::{Release, documents, merge, render, repo_root};
use kleym_e2e::fleet::all_crds;
use kleym_e2e::kubesim::testing::Kubectl;
use kleym_e2e::kubesim::{Kubesim, KubesimOptions};
use serde_json::{Value, json};

/// Kinds the chart renders that kubesim does not serve, with the resource name
/// `kubectl api-resources -o name` would list: the dry run leaves them out (a test checks
/// kubesim still lacks them, so this list cannot go stale). kubesim has no workload API
/// (`apps/v1` Deployments) and no Services; the ServiceMonitor's CRD
/// (`monitoring.coreos.com`, Prometheus Operator) is not among the CRDs it installs. Those
/// objects are checked by `deploy_chart.rs` and by the renderer comparison here.
const NOT_SERVED_BY_KUBESIM: [(&str, &str); 3] = [
    ("Deployment", "deployments.apps"),
    ("Service", "services"),
    ("ServiceMonitor", "servicemonitors.monitoring.coreos.com"),
];

fn chart() -> PathBuf {
    repo_root().join("charts/kleym")
}

/// The helm binary, found as every test finds its tools (`test_tools`: PATH first, then the
/// project's tool cache); panics naming the command that installs it.
fn find_helm() -> PathBuf {
    test_tools::require(test_tools::Tool::Helm)
}

/// Runs helm with private config/cache/data directories (no user state leaks in) and
/// returns stdout; panics with helm's output on failure.
fn helm(args: &[&str], home: &Path) -> String {
    let out = Command::new(find_helm())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("spawn helm");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {} failed ({}):\nstdout: {stdout}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One value set: overrides of values.yaml plus the release it is installed as.
struct Case {
    what: &'static str,
    overrides: Value,
    release: &'static str,
    namespace: &'static str,
}

fn case(what: &'static str, overrides: Value) -> Case {
    Case {
        what,
        overrides,
        release: "kleym",
        namespace: "kleym-system",
    }
}

/// The value sets of `deploy_chart.rs`, plus the non-default branches it does not take.
///
/// Known divergence, deliberately not exercised: helm reads numeric values as float64 and
/// prints integers >= 1e6 as `1e+06` (`--concurrency=1e+06`), where the home-made renderer
/// prints `1000000`; no value of this chart is meant to be that large.
fn cases() -> Vec<Case> {
    vec![
        case("defaults (fleet mode)", json!({})),
        case(
            "plugin switches flipped",
            json!({"credentialPlugins": {
                "tokenRequest": false, "secretReader": true, "secretNamespace": "spoke-tokens"}}),
        ),
        // `secretNamespace` empty: `default .Release.Namespace`.
        case(
            "secret-reader in the release namespace",
            json!({"credentialPlugins": {"secretReader": true}}),
        ),
        case(
            "API (TLS) and ServiceMonitor on, optional hub flags",
            json!({
                "serviceMonitor": {"enabled": true},
                "api": {"enabled": true},
                "spireClassName": "spire-system",
                "hub": {"clusterProfileNamespace": "fleet", "clusterProfileSelector": "env=prod",
                        "providerFile": "providers:\n  - name: eks\n    execConfig:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n      args: [eks, get-token]\n"}
            }),
        ),
        case(
            "one replica, no leader election, cleanup",
            json!({"hub": {"replicas": 1, "leaderElection": false, "removalPolicy": "cleanup"},
                   "logFormat": "text", "logLevel": "info,kleym_hub=debug"}),
        ),
        case("single-cluster mode", json!({"mode": "single-cluster"})),
        case(
            "single-cluster mode with ServiceMonitor and SPIRE class",
            json!({"mode": "single-cluster", "serviceMonitor": {"enabled": true},
                   "spireClassName": "spire-system"}),
        ),
        Case {
            what: "another release name and namespace",
            overrides: json!({"credentialPlugins": {"secretReader": true}}),
            release: "acme",
            namespace: "elsewhere",
        },
    ]
}

/// Writes the case's overrides as a values file (JSON is YAML) and returns its path.
fn values_file(case: &Case, dir: &Path) -> PathBuf {
    let path = dir.join("values.json");
    std::fs::write(&path, serde_json::to_string(&case.overrides).unwrap()).unwrap();
    path
}

/// `helm template` of the chart for `case`, parsed; `--include-crds` adds `crds/`.
fn helm_template(case: &Case, include_crds: bool) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let values = values_file(case, dir.path());
    let chart = chart();
    let mut args = vec![
        "template",
        case.release,
        chart.to_str().unwrap(),
        "--namespace",
        case.namespace,
        "-f",
        values.to_str().unwrap(),
    ];
    if include_crds {
        args.push("--include-crds");
    }
    let out = helm(&args, dir.path());
    documents(&out).unwrap_or_else(|e| panic!("{}: helm output does not parse: {e}", case.what))
}

/// The home-made renderer's output for `case` (as `deploy_chart.rs` renders it).
fn home_made_render(case: &Case) -> Vec<Value> {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let mut values: Value = serde_yaml_ng::from_str(&text).unwrap();
    merge(&mut values, &case.overrides);
    let release = Release {
        name: case.release.into(),
        namespace: case.namespace.into(),
    };
    let mut paths: Vec<_> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let mut docs = Vec::new();
    for path in paths {
        let src = std::fs::read_to_string(&path).unwrap();
        let out =
            render(&src, &values, &release).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        docs.extend(documents(&out).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    }
    docs
}

/// `Kind namespace/name`, the identity of a rendered object.
fn identity(doc: &Value) -> String {
    format!(
        "{} {}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["namespace"].as_str().unwrap_or(""),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Documents sorted by identity (helm orders by kind, the renderer by file).
fn by_identity(mut docs: Vec<Value>) -> Vec<(String, Value)> {
    docs.sort_by_cached_key(identity);
    docs.into_iter().map(|d| (identity(&d), d)).collect()
}

/// Paths where `helm` and `ours` differ, as `path: helm=… ours=…` lines.
fn differences(helm: &Value, ours: &Value, path: &str, out: &mut Vec<String>) {
    match (helm, ours) {
        (Value::Object(h), Value::Object(o)) => {
            let keys: std::collections::BTreeSet<&String> = h.keys().chain(o.keys()).collect();
            for k in keys {
                let null = Value::Null;
                let (hv, ov) = (h.get(k).unwrap_or(&null), o.get(k).unwrap_or(&null));
                differences(hv, ov, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(h), Value::Array(o)) if h.len() == o.len() => {
            for (i, (hv, ov)) in h.iter().zip(o).enumerate() {
                differences(hv, ov, &format!("{path}[{i}]"), out);
            }
        }
        _ if helm != ours => out.push(format!("  {path}: helm={helm} ours={ours}")),
        _ => {}
    }
}

#[test]
fn helm_lint_strict_passes_under_every_value_set() {
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let out = helm(&["lint", "--strict", chart], dir.path());
    assert!(out.contains("0 chart(s) failed"), "{out}");
    for case in cases() {
        let values = values_file(&case, dir.path());
        let out = helm(
            &[
                "lint",
                "--strict",
                chart,
                "--namespace",
                case.namespace,
                "-f",
                values.to_str().unwrap(),
            ],
            dir.path(),
        );
        assert!(out.contains("0 chart(s) failed"), "{}: {out}", case.what);
    }
}

#[test]
fn helm_template_equals_the_home_made_renderer() {
    for case in cases() {
        let helm_docs = by_identity(helm_template(&case, false));
        let ours = by_identity(home_made_render(&case));
        assert!(
            !helm_docs.is_empty(),
            "{}: helm rendered nothing",
            case.what
        );
        let helm_ids: Vec<&String> = helm_docs.iter().map(|(id, _)| id).collect();
        let our_ids: Vec<&String> = ours.iter().map(|(id, _)| id).collect();
        assert_eq!(helm_ids, our_ids, "{}: different objects", case.what);
        for ((id, h), (_, o)) in helm_docs.iter().zip(&ours) {
            let mut diffs = Vec::new();
            differences(h, o, "", &mut diffs);
            assert!(
                diffs.is_empty(),
                "{}: {id} differs between helm and the home-made renderer:\n{}",
                case.what,
                diffs.join("\n")
            );
        }
    }
}

#[test]
fn helm_template_renders_the_chart_crds_only_with_include_crds() {
    let case = case("defaults (fleet mode)", json!({}));
    let crd = |docs: &[Value]| {
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .count()
    };
    assert_eq!(crd(&helm_template(&case, false)), 0);
    let files = std::fs::read_dir(chart().join("crds")).unwrap().count();
    assert_eq!(crd(&helm_template(&case, true)), files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_template_passes_server_side_dry_run() {
    // Render first (helm is a blocking child process), then talk to the cluster.
    let rendered: Vec<(Case, Vec<Value>)> = cases()
        .into_iter()
        .map(|c| {
            let docs = helm_template(&c, true);
            (c, docs)
        })
        .collect();

    let sim = Kubesim::start(
        &["c"],
        KubesimOptions {
            crds: all_crds().unwrap(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = sim.cluster("c").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::admin(&c, dir.path()).expect("kubectl is required for this test");
    // Namespaces the releases and the secret-reader Role live in (a dry run creates none).
    for ns in ["kleym-system", "spoke-tokens", "elsewhere"] {
        k.run_async(&["create", "namespace", ns], None)
            .await
            .unwrap();
    }

    let served_resources = k
        .run_async(&["api-resources", "-o", "name"], None)
        .await
        .unwrap();
    assert!(
        served_resources.lines().any(|r| r == "configmaps"),
        "{served_resources}"
    );
    for (kind, resource) in NOT_SERVED_BY_KUBESIM {
        assert!(
            !served_resources.lines().any(|r| r == resource),
            "kubesim now serves {kind}: drop it from NOT_SERVED_BY_KUBESIM"
        );
    }

    let mut kinds_checked = std::collections::BTreeSet::new();
    let mut kinds_skipped = std::collections::BTreeSet::new();
    for (case, docs) in rendered {
        let (skipped, served): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| {
            NOT_SERVED_BY_KUBESIM
                .iter()
                .any(|(kind, _)| d["kind"] == *kind)
        });
        let kind = |d: &Value| d["kind"].as_str().unwrap_or("?").to_string();
        kinds_skipped.extend(skipped.iter().map(kind));
        kinds_checked.extend(served.iter().map(kind));
        // The whole release in one apply, as `helm template | kubectl apply -f -` sends it: a
        // multi-document YAML stream.
        let stream: Vec<String> = served
            .iter()
            .map(|d| serde_yaml_ng::to_string(d).unwrap())
            .collect();
        let out = k
            .run_async(
                &["apply", "--dry-run=server", "-f", "-"],
                Some(&stream.join("---\n")),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.what));
        let accepted = out
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert_eq!(accepted, served.len(), "{}: {out}", case.what);
    }
    for kind in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        assert!(
            kinds_checked.contains(kind),
            "{kind} never dry-run: {kinds_checked:?}"
        );
    }
    assert_eq!(
        kinds_skipped.len(),
        NOT_SERVED_BY_KUBESIM.len(),
        "{kinds_skipped:?}"
    );
    // Nothing was created for real.
    let left = k
        .run_async(
            &[
                "get",
                "configmaps,serviceaccounts,roles",
                "-A",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(!left.contains("kleym") && !left.contains("acme"), "{left}");
}
