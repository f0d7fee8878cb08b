//! The Helm chart (`charts/kleym/`) through the REAL `helm`: `helm lint --strict` passes
//! under several value sets, invalid values (a typo in an enum, an unknown key) are rejected
//! by values.schema.json, `helm template` renders what the chart promises (hardened hub and
//! spoke whose flags the binaries accept, probes on their own port, minimal RBAC following
//! the plugin switches and the ServiceAccount values, the standard labels, names within 63
//! characters, pod scheduling values, the PodDisruptionBudget, the Grafana dashboard
//! ConfigMap), `helm install --dry-run` prints the next steps, and every rendered object of
//! a kind kubesim serves passes `kubectl apply --dry-run=server` against a kubesim cluster
//! with every CRD installed.
//!
//! helm is located as every tool is (`test_tools`: PATH first, then the project's tool cache
//! that `scripts/ensure-tools` fills); without it the tests fail, they never skip.

use crate::deploy_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use deploy_support::{assert_kleym_accepts, documents, repo_root, run_kleym_without_cluster};
use kleym_e2e::fixtures::all_crds;
use kubesim::testing::Kubectl;
use kubesim::{Kubesim, KubesimOptions};
use serde_json::{Value, json};

/// Kinds the chart renders that kubesim does not serve, with the resource name
/// `kubectl api-resources -o name` would list: the dry run leaves them out (a test checks
/// kubesim still lacks them, so this list cannot go stale). kubesim has no workload API
/// (`apps/v1` Deployments), no Services and no PodDisruptionBudgets; the ServiceMonitor's
/// CRD (`monitoring.coreos.com`, Prometheus Operator) is not among the CRDs it installs.
/// Those objects are checked by the assertions on `helm template`'s output here.
const NOT_SERVED_BY_KUBESIM: [(&str, &str); 4] = [
    ("Deployment", "deployments.apps"),
    ("Service", "services"),
    ("ServiceMonitor", "servicemonitors.monitoring.coreos.com"),
    ("PodDisruptionBudget", "poddisruptionbudgets.policy"),
];

fn chart() -> PathBuf {
    repo_root().join("charts/kleym")
}

/// The helm binary, found as every test finds its tools (`test_tools`: PATH first, then the
/// project's tool cache); panics naming the command that installs it.
fn find_helm() -> PathBuf {
    test_tools::require(test_tools::Tool::Helm)
}

/// The image every render names: the chart refuses to render without `image.repository`
/// (no image is published), as [`a_missing_image_fails_naming_the_value_and_the_fix`] shows.
const IMAGE_REPOSITORY: &str = "registry.example.com/kleym";

/// `args` plus `--set image.repository=...` for the commands that render the chart.
fn with_image(args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if matches!(
        args.first(),
        Some(&("template" | "lint" | "install" | "upgrade"))
    ) {
        out.push("--set".into());
        out.push(format!("image.repository={IMAGE_REPOSITORY}"));
    }
    out
}

/// Runs helm with private config/cache/data directories (no user state leaks in) and
/// returns stdout; panics with helm's output on failure. Renders name an image
/// ([`with_image`]).
fn helm(args: &[&str], home: &Path) -> String {
    let out = Command::new(find_helm())
        .args(with_image(args))
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

/// Runs helm as [`helm`] does and returns whether it succeeded, its stdout and its stderr
/// (for runs that are meant to fail).
fn helm_result(args: &[&str], home: &Path) -> (bool, String, String) {
    helm_result_exact(&with_image(args), home)
}

/// [`helm_result`] with exactly `args` (no image added).
fn helm_result_exact(args: &[String], home: &Path) -> (bool, String, String) {
    let out = Command::new(find_helm())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("spawn helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

/// A release name of helm's maximum length (53) that does not contain the chart's name.
const LONG_RELEASE: &str = "a-release-name-of-fifty-three-characters-at-the-limit";

/// The value sets every test below renders: each non-default branch of the chart.
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
            "API (TLS), ServiceMonitor and dashboard on, optional hub flags",
            json!({
                "serviceMonitor": {"enabled": true, "labels": {"release": "prometheus"}},
                "grafanaDashboard": {"enabled": true, "annotations": {"grafana_folder": "kleym"}},
                "api": {"enabled": true},
                "spireClassName": "spire-system",
                "hub": {"clusterProfileNamespace": "fleet", "clusterProfileSelector": "env in (prod, staging),!legacy",
                        "providerFile": "providers:\n  - name: eks\n    execConfig:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n      args: [eks, get-token]\n"}
            }),
        ),
        case(
            "hub as an issuer: TLS listener, ConfigMap publishing",
            json!({"issuer": {"enabled": true, "url": "https://issuer.example.org/fleet",
                              "publishConfigMap": "kleym-issuer-docs", "port": 9443}}),
        ),
        case(
            "hub as an issuer with its X.509 CA in a Secret of its own",
            json!({"issuer": {"enabled": true, "url": "https://issuer.example.org/fleet",
                              "x509": {"enabled": true, "caSecret": "kleym-client-ca"}}}),
        ),
        case(
            "hub as an issuer behind a TLS-terminating ingress",
            json!({"issuer": {"enabled": true, "url": "http://kleym.kleym-system:8444",
                              "insecureHttp": true, "keyRotation": "off"}}),
        ),
        case(
            "one replica, no leader election, cleanup, no PDB",
            json!({"hub": {"replicas": 1, "leaderElection": false, "removalPolicy": "cleanup",
                           "podDisruptionBudget": {"enabled": false}},
                   "logFormat": "text", "logLevel": "info,kleym_hub=debug"}),
        ),
        case(
            "workload identity on an existing ServiceAccount, scheduling, other ports",
            json!({
                "serviceAccount": {"create": false, "name": "kleym-cloud",
                                   "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/kleym-hub"}},
                "podAnnotations": {"example.com/team": "identity"},
                "podLabels": {"azure.workload.identity/use": "true",
                              "app.kubernetes.io/component": "not-the-component"},
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "hub"}}}}]}},
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                     "labelSelector": {"matchLabels": {"custom": "selector"}}}],
                "imagePullSecrets": [{"name": "registry-credentials"}],
                "priorityClassName": "system-cluster-critical",
                "image": {"tag": "1.2.3"},
                "hub": {"metricsPort": 9090, "healthPort": 9091, "podDisruptionBudget": {"maxUnavailable": "50%"}}
            }),
        ),
        case(
            "sharded mode, three replicas, a weight",
            json!({"hub": {"replicas": 3, "shardMode": "sharded", "shardWeight": 20}}),
        ),
        case("single-cluster mode", json!({"mode": "single-cluster"})),
        case(
            "single-cluster mode with SVID bounds",
            json!({"mode": "single-cluster", "spoke": {"svid": wider_svid_values()}}),
        ),
        case(
            "single-cluster mode without the admission policy",
            json!({"mode": "single-cluster", "spoke": {"admissionPolicy": {"enabled": false}}}),
        ),
        case(
            "single-cluster mode with ServiceMonitor, SPIRE class, scheduling and a named ServiceAccount",
            json!({"mode": "single-cluster", "serviceMonitor": {"enabled": true},
                   "spireClassName": "spire-system",
                   "grafanaDashboard": {"enabled": true},
                   "serviceAccount": {"name": "spoke-sa", "annotations": {"iam.gke.io/gcp-service-account": "kleym@p.iam.gserviceaccount.com"}},
                   "podLabels": {"team": "identity"},
                   "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                   "topologySpreadConstraints": [
                       {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}],
                   "spoke": {"metricsPort": 9100, "healthPort": 9101}}),
        ),
        Case {
            what: "another release name and namespace",
            overrides: json!({"credentialPlugins": {"secretReader": true}}),
            release: "acme",
            namespace: "elsewhere",
        },
        Case {
            what: "longest release name",
            overrides: json!({"serviceMonitor": {"enabled": true},
                              "grafanaDashboard": {"enabled": true},
                              "credentialPlugins": {"secretReader": true}}),
            release: LONG_RELEASE,
            namespace: "kleym-system",
        },
        case(
            "fullnameOverride of 63 characters",
            json!({"fullnameOverride": "x".repeat(63), "api": {"enabled": true}}),
        ),
        case(
            "nameOverride, single-cluster",
            json!({"nameOverride": "identity", "mode": "single-cluster"}),
        ),
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

/// `helm template` of release `kleym` in `kleym-system` with `overrides`.
fn render(overrides: Value) -> Vec<Value> {
    helm_template(&case("render", overrides), false)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn rules_mention(docs: &[Value], resource: &str) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == resource))
        })
        .collect()
}

/// The first container's arguments.
fn container_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// Where the chart says the containers' probes and metrics are: the `health` port gets the
/// probes and is what `--health-addr` binds; `metrics` is `--metrics-addr`.
fn assert_probes_on_their_own_port(dep: &Value, args: &[String], metrics: u16, health: u16) {
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    let ports = c["ports"].as_array().unwrap();
    let port = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no port {name}: {ports:?}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("metrics"), u64::from(metrics));
    assert_eq!(port("health"), u64::from(health));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "health", "{probe}");
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(
        args.contains(&format!("--metrics-addr=0.0.0.0:{metrics}")),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--health-addr=0.0.0.0:{health}")),
        "{args:?}"
    );
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
fn invalid_values_are_rejected_by_helm() {
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    let chart = chart.to_str().unwrap();
    // (values, what helm says, whether values.schema.json catches it: then `helm lint`
    // fails too; a template `fail` only fails rendering, lint renders leniently).
    for (overrides, needle, schema) in [
        (
            json!({"mode": "fleeet"}),
            "mode must be one of the following",
            true,
        ),
        (
            json!({"hub": {"removalPolicy": "Cleanup"}}),
            "hub.removalPolicy",
            true,
        ),
        (json!({"logFormat": "yaml"}), "logFormat", true),
        (
            json!({"api": {"authMode": "enforced"}}),
            "api.authMode",
            true,
        ),
        (
            json!({"image": {"pullPolicy": "Sometimes"}}),
            "image.pullPolicy",
            true,
        ),
        (json!({"hub": {"replica": 3}}), "replica", true),
        (json!({"hub": {"replicas": 0}}), "hub.replicas", true),
        (
            json!({"trustDomain": "spiffe://example.org"}),
            "trustDomain",
            true,
        ),
        (
            json!({"serviceAccount": {"create": false}}),
            "serviceAccount.name",
            true,
        ),
        (
            json!({"hub": {"replicas": 2, "leaderElection": false}}),
            "hub.leaderElection",
            true,
        ),
        (
            json!({"hub": {"replicas": 1, "leaderElection": false, "shardMode": "sharded"}}),
            "hub.leaderElection",
            true,
        ),
        (
            json!({"hub": {"shardMode": "Sharded"}}),
            "hub.shardMode",
            true,
        ),
        (json!({"hub": {"shardWeight": 0}}), "hub.shardWeight", true),
        (
            json!({"hub": {"shardWeight": 101}}),
            "hub.shardWeight",
            true,
        ),
        (
            json!({"hub": {"podAntiAffinity": "required"}}),
            "hub.podAntiAffinity",
            true,
        ),
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]}),
            "whenUnsatisfiable",
            true,
        ),
        (
            json!({"serviceMonitor": {"interval": "30 seconds"}}),
            "serviceMonitor.interval",
            true,
        ),
        (
            json!({"issuer": {"enabled": true, "url": "https://issuer.example.org/"}}),
            "issuer.url",
            true,
        ),
        (
            json!({"issuer": {"keyAlgorithm": "EdDSA"}}),
            "issuer.keyAlgorithm",
            true,
        ),
        (
            json!({"issuer": {"keyRotation": "7 days"}}),
            "issuer.keyRotation",
            true,
        ),
        (
            json!({"issuer": {"enabled": true}}),
            "issuer.url is required when issuer.enabled is true",
            false,
        ),
        (
            json!({"hub": {"healthPort": 8080}}),
            "hub.healthPort must differ from hub.metricsPort",
            false,
        ),
        (
            json!({"mode": "single-cluster", "spoke": {"healthPort": 8080}}),
            "spoke.healthPort must differ",
            false,
        ),
    ] {
        let values = dir.path().join("invalid.json");
        std::fs::write(&values, overrides.to_string()).unwrap();
        let values = values.to_str().unwrap();
        let (ok, stdout, stderr) =
            helm_result(&["template", "kleym", chart, "-f", values], dir.path());
        assert!(!ok, "{overrides}: rendered\n{stdout}");
        assert!(stderr.contains(needle), "{overrides}: {stderr}");
        if schema {
            assert!(
                stderr.contains("values don't meet the specifications of the schema"),
                "{overrides}: {stderr}"
            );
            let (ok, stdout, _) =
                helm_result(&["lint", "--strict", chart, "-f", values], dir.path());
            assert!(!ok, "{overrides}: lint passed\n{stdout}");
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

#[test]
fn fleet_mode_hub_is_hardened_and_its_args_parse() {
    let docs = render(json!({}));
    let dep = find(&docs, "Deployment", "kleym-hub").expect("hub Deployment");
    assert!(find(&docs, "Deployment", "kleym-spoke").is_none());
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kleym-hub");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["image"], format!("{IMAGE_REPOSITORY}:0.1.0"));
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    let args = container_args(dep);
    assert_eq!(args[0], "hub");
    assert!(args.contains(&"--leader-elect=true".to_string()));
    assert!(args.contains(&"--lease-name=kleym-hub".to_string()));
    assert_probes_on_their_own_port(dep, &args, 8080, 8081);
    // The flags are those of `kleym hub` (same parser, in-process).
    let parsed = kleym_e2e::fixtures::harness::parse_hub_args(&args[1..]).unwrap();
    assert!(parsed.leader_elect);
    assert_eq!(parsed.trust_domain.as_deref(), Some("example.org"));
    assert_eq!(parsed.removal_timeout_seconds, 600);
    assert_eq!(parsed.health_addr, Some("0.0.0.0:8081".parse().unwrap()));
    // A changed provider file rolls the hub pods.
    let checksum = dep["spec"]["template"]["metadata"]["annotations"]["checksum/providers"]
        .as_str()
        .expect("checksum annotation");
    let other = render(json!({"hub": {"providerFile": "providers: []\n"}}));
    let other = find(&other, "Deployment", "kleym-hub").unwrap();
    assert_ne!(
        other["spec"]["template"]["metadata"]["annotations"]["checksum/providers"],
        checksum
    );

    // The provider ConfigMap is a provider file the hub loads.
    let cm = find(&docs, "ConfigMap", "kleym-hub-providers").expect("provider ConfigMap");
    let file: Value =
        kleym_api::yaml::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        file["providers"][0]["execConfig"]["args"][3],
        "kleym-system/kleym-hub"
    );
    let dir = tempfile::tempdir().unwrap();
    let pf = dir.path().join("providers.yaml");
    std::fs::write(&pf, cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    let with_file = kleym_e2e::fixtures::harness::parse_hub_args(&[
        "--clusterprofile-provider-file".into(),
        pf.to_string_lossy().into(),
    ])
    .unwrap();
    with_file
        .access
        .provider_set()
        .expect("provider file loads");

    // The Service exposes /metrics, not the probe port.
    let svc = find(&docs, "Service", "kleym").expect("Service");
    let ports: Vec<&Value> = svc["spec"]["ports"].as_array().unwrap().iter().collect();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["name"], "metrics");
    assert!(find(&docs, "ServiceMonitor", "kleym").is_none());
    assert!(of_kind(&docs, "ConfigMap").len() == 1, "only the providers");

    // The PodDisruptionBudget covers exactly the hub pods.
    let pdb = find(&docs, "PodDisruptionBudget", "kleym-hub").expect("hub PDB");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    let selector = pdb["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert_eq!(
        selector,
        dep["spec"]["selector"]["matchLabels"].as_object().unwrap()
    );
    for (k, v) in selector {
        assert_eq!(pod_labels.get(k), Some(v), "PDB selector {k}");
    }
    // The rolling update of the hub is fine: leader election keeps one writer.
    assert!(dep["spec"]["strategy"].is_null());
}

/// The hub's preferred anti-affinity by hostname: on by default with more than one replica,
/// off with one replica, with `podAntiAffinity: none`, and when `affinity` is set (the
/// operator's wins whole).
#[test]
fn hub_replicas_prefer_different_nodes() {
    let affinity = |overrides: Value| {
        let docs = render(overrides);
        find(&docs, "Deployment", "kleym-hub").unwrap()["spec"]["template"]["spec"]["affinity"]
            .clone()
    };
    let default = affinity(json!({}));
    let terms = default["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .unwrap_or_else(|| panic!("no preferred anti-affinity: {default}"));
    assert_eq!(terms.len(), 1, "{default}");
    assert_eq!(terms[0]["weight"], 100);
    let term = &terms[0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let docs = render(json!({}));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    // It selects exactly this release's hub pods.
    assert_eq!(
        term["labelSelector"]["matchLabels"],
        dep["spec"]["selector"]["matchLabels"]
    );
    assert!(default["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_null());
    for off in [
        json!({"hub": {"replicas": 1, "leaderElection": false}}),
        json!({"hub": {"podAntiAffinity": "none"}}),
    ] {
        assert!(affinity(off.clone()).is_null(), "{off}");
    }
    let own = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["control"]}]}]}}});
    assert_eq!(affinity(json!({"affinity": own.clone()})), own);
}

/// Whether this build's `kleym hub` knows `--shard-mode` (the sharded mode's flags).
/// `hub.shardMode: sharded` renders `--shard-mode=sharded` and `--shard-weight`, keeps
/// leader election on (the singleton work needs the Lease), and grants what replica Leases
/// need (list, watch, delete besides get, create, update) in the release namespace only;
/// leader mode renders neither flag (leader is the hub's default) and keeps the Lease rule
/// as it was. The rendered flags parse with `kleym hub`'s own parser.
#[test]
fn sharded_mode_renders_its_flags_and_the_replica_lease_rbac() {
    let leader = render(json!({}));
    let dep = find(&leader, "Deployment", "kleym-hub").unwrap();
    let args = container_args(dep);
    assert!(
        !args.iter().any(|a| a.starts_with("--shard-")),
        "leader mode renders no shard flag: {args:?}"
    );
    let leases = rules_mention(&leader, "leases");
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0]["verbs"], json!(["get", "create", "update"]));

    let sharded =
        render(json!({"hub": {"replicas": 3, "shardMode": "sharded", "shardWeight": 20}}));
    let dep = find(&sharded, "Deployment", "kleym-hub").unwrap();
    assert_eq!(dep["spec"]["replicas"], 3);
    let args = container_args(dep);
    for flag in [
        "--shard-mode=sharded",
        "--shard-weight=20",
        "--leader-elect=true",
        "--namespace=kleym-system",
    ] {
        assert!(args.contains(&flag.to_string()), "{flag} missing: {args:?}");
    }
    let verbs: Vec<String> = rules_mention(&sharded, "leases")
        .iter()
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    for verb in ["get", "list", "watch", "create", "update", "delete"] {
        assert!(
            verbs.iter().any(|v| v == verb),
            "no {verb} on leases: {verbs:?}"
        );
    }
    // Only the namespaced Role grants Leases: no replica may touch Leases elsewhere.
    for d in &sharded {
        if d["kind"] == "ClusterRole" {
            assert!(
                !d["rules"].to_string().contains("leases"),
                "a ClusterRole grants leases: {d}"
            );
        }
    }
    let role = find(&sharded, "Role", "kleym-hub").unwrap();
    assert_eq!(role["metadata"]["namespace"], "kleym-system");

    let parsed = kleym_e2e::fixtures::harness::parse_hub_args(&args[1..])
        .unwrap_or_else(|e| panic!("the rendered flags do not parse: {e}"));
    assert!(parsed.leader_elect);
    assert_eq!(
        parsed.shard_mode,
        kleym_hub::runtime::args::ShardMode::Sharded
    );
}

#[test]
fn hub_rbac_is_minimal_and_follows_the_plugin_switches() {
    let default = render(json!({}));
    // token-request on (default): tokens for its own ServiceAccount only; no Secrets.
    let token = rules_mention(&default, "serviceaccounts/token");
    assert_eq!(token.len(), 1);
    assert_eq!(token[0]["resourceNames"], json!(["kleym-hub"]));
    assert_eq!(token[0]["verbs"], json!(["create"]));
    assert!(rules_mention(&default, "secrets").is_empty());
    for r in [
        "clusterprofiles",
        "tokenreviews",
        "subjectaccessreviews",
        "leases",
        "events",
    ] {
        assert!(!rules_mention(&default, r).is_empty(), "no rule for {r}");
    }
    let profiles = rules_mention(&default, "clusterprofiles");
    // get/patch: kleym's finalizer on the profiles it engages (removal on deletion).
    assert_eq!(
        profiles[0]["verbs"],
        json!(["get", "list", "watch", "patch"])
    );
    // Published observations: one namespaced rule, in the release namespace's Role only.
    let observations = rules_mention(&default, "clusteridentityobservations");
    assert_eq!(observations.len(), 1);
    assert!(
        of_kind(&default, "ClusterRole").iter().all(|d| !d["rules"]
            .to_string()
            .contains("clusteridentityobservations")),
        "observations granted cluster-wide"
    );
    // No wildcard anywhere.
    for d in &default {
        for r in d["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !r[field].as_array().unwrap().iter().any(|x| x == "*"),
                    "wildcard in {r}"
                );
            }
        }
    }

    let flipped = render(json!({"credentialPlugins": {
        "tokenRequest": false, "secretReader": true, "secretNamespace": "spoke-tokens"}}));
    assert!(rules_mention(&flipped, "serviceaccounts/token").is_empty());
    let secrets = rules_mention(&flipped, "secrets");
    assert_eq!(secrets.len(), 1);
    assert_eq!(secrets[0]["verbs"], json!(["get"]));
    let role = find(&flipped, "Role", "kleym-hub-secret-reader").unwrap();
    assert_eq!(role["metadata"]["namespace"], "spoke-tokens");
}

#[test]
fn service_account_values_reach_the_pod_the_rbac_and_the_provider() {
    // Created, with workload identity annotations (IRSA).
    let arn = "arn:aws:iam::111122223333:role/kleym-hub";
    let docs =
        render(json!({"serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": arn}}}));
    let sa = find(&docs, "ServiceAccount", "kleym-hub").expect("ServiceAccount");
    assert_eq!(
        sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        arn
    );

    // Existing (not created): every reference uses its name.
    let docs = render(json!({"serviceAccount": {"create": false, "name": "kleym-cloud"}}));
    assert!(of_kind(&docs, "ServiceAccount").is_empty());
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    assert_eq!(
        dep["spec"]["template"]["spec"]["serviceAccountName"],
        "kleym-cloud"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for b in of_kind(&docs, kind) {
            assert_eq!(b["subjects"][0]["name"], "kleym-cloud", "{kind}");
            assert_eq!(b["subjects"][0]["namespace"], "kleym-system", "{kind}");
        }
    }
    let token = rules_mention(&docs, "serviceaccounts/token");
    assert_eq!(token[0]["resourceNames"], json!(["kleym-cloud"]));
    let cm = find(&docs, "ConfigMap", "kleym-hub-providers").unwrap();
    let file: Value =
        kleym_api::yaml::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        file["providers"][0]["execConfig"]["args"][3],
        "kleym-system/kleym-cloud"
    );

    // Single-cluster mode: the spoke's ServiceAccount, named.
    let docs = render(json!({"mode": "single-cluster", "serviceAccount": {"name": "spoke-sa"}}));
    assert!(find(&docs, "ServiceAccount", "spoke-sa").is_some());
    let crb = find(&docs, "ClusterRoleBinding", "kleym-spoke").unwrap();
    assert_eq!(crb["subjects"][0]["name"], "spoke-sa");
}

#[test]
fn pod_values_reach_the_hub_and_spoke_pods() {
    let values = json!({
        "podAnnotations": {"example.com/team": "identity"},
        "podLabels": {"azure.workload.identity/use": "true",
                      "app.kubernetes.io/component": "not-the-component"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["control"]}]}]}}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"custom": "selector"}}}],
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "priorityClassName": "system-cluster-critical",
    });
    for (mode, name, component) in [
        ("fleet", "kleym-hub", "hub"),
        ("single-cluster", "kleym-spoke", "spoke"),
    ] {
        let mut v = values.clone();
        v["mode"] = json!(mode);
        let docs = render(v);
        let dep = find(&docs, "Deployment", name).expect(name);
        let meta = &dep["spec"]["template"]["metadata"];
        let pod = &dep["spec"]["template"]["spec"];
        assert_eq!(
            meta["annotations"]["example.com/team"], "identity",
            "{mode}"
        );
        assert_eq!(
            meta["labels"]["azure.workload.identity/use"], "true",
            "{mode}"
        );
        // The chart's own labels win: the selector still matches.
        assert_eq!(
            meta["labels"]["app.kubernetes.io/component"], component,
            "{mode}"
        );
        for (k, v) in dep["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&meta["labels"][k], v, "{mode}: selector {k}");
        }
        assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux", "{mode}");
        assert_eq!(pod["tolerations"], values["tolerations"], "{mode}");
        assert_eq!(pod["affinity"], values["affinity"], "{mode}");
        assert_eq!(
            pod["imagePullSecrets"],
            json!([{"name": "registry-credentials"}]),
            "{mode}"
        );
        assert_eq!(
            pod["priorityClassName"], "system-cluster-critical",
            "{mode}"
        );
        let spread = pod["topologySpreadConstraints"].as_array().unwrap();
        assert_eq!(spread.len(), 2, "{mode}");
        // Without a labelSelector: one selecting this workload's pods is added.
        assert_eq!(
            spread[0]["labelSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"],
            "{mode}"
        );
        assert_eq!(spread[0]["topologyKey"], "topology.kubernetes.io/zone");
        assert_eq!(
            spread[1]["labelSelector"]["matchLabels"],
            json!({"custom": "selector"}),
            "{mode}"
        );
    }
    // Unset, none of these fields appear (but the hub's default anti-affinity, see
    // `hub_replicas_prefer_different_nodes`).
    let docs = render(json!({"hub": {"podAntiAffinity": "none"}}));
    let pod = &find(&docs, "Deployment", "kleym-hub").unwrap()["spec"]["template"]["spec"];
    for field in [
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "imagePullSecrets",
        "priorityClassName",
    ] {
        assert!(pod[field].is_null(), "{field}: {}", pod[field]);
    }
}

#[test]
fn every_object_has_the_standard_labels_and_names_fit() {
    let chart_yaml: Value =
        kleym_api::yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    let chart_label = format!(
        "kleym-{}",
        chart_yaml["version"].as_str().expect("chart version")
    );
    let app_version = chart_yaml["appVersion"].as_str().expect("appVersion");
    for case in cases() {
        let docs = helm_template(&case, false);
        let name_label = case.overrides["nameOverride"].as_str().unwrap_or("kleym");
        for d in &docs {
            let id = format!("{}: {} {}", case.what, d["kind"], d["metadata"]["name"]);
            let labels = &d["metadata"]["labels"];
            assert_eq!(labels["helm.sh/chart"], chart_label.as_str(), "{id}");
            assert_eq!(labels["app.kubernetes.io/name"], name_label, "{id}");
            assert_eq!(labels["app.kubernetes.io/instance"], case.release, "{id}");
            assert_eq!(labels["app.kubernetes.io/version"], app_version, "{id}");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{id}");
            assert!(
                ["hub", "spoke"]
                    .contains(&labels["app.kubernetes.io/component"].as_str().unwrap_or("")),
                "{id}: {labels}"
            );
            let name = d["metadata"]["name"].as_str().unwrap();
            assert!(name.len() <= 63, "{id}: {} characters", name.len());
            assert!(!name.ends_with('-'), "{id}");
        }
    }
    // The name rules: a release containing the chart's name is the base name; others get
    // `<release>-kleym`, cut to 63; fullnameOverride wins.
    let acme = helm_template(
        &Case {
            what: "acme",
            overrides: json!({}),
            release: "acme",
            namespace: "x",
        },
        false,
    );
    assert!(find(&acme, "Deployment", "acme-kleym-hub").is_some());
    assert!(find(&acme, "Service", "acme-kleym").is_some());
    let long = helm_template(
        &Case {
            what: "long",
            overrides: json!({"grafanaDashboard": {"enabled": true}}),
            release: LONG_RELEASE,
            namespace: "x",
        },
        false,
    );
    // `<release>-kleym` is 59 characters: whole before `-hub`, cut before longer suffixes.
    let base = format!("{LONG_RELEASE}-kleym");
    assert_eq!(base.len(), 59);
    assert!(find(&long, "Deployment", &format!("{base}-hub")).is_some());
    let providers = format!("{}-hub-providers", &base[..49]);
    assert!(
        find(&long, "ConfigMap", &providers).is_some(),
        "{providers}"
    );
    let dashboard = format!("{}-hub-dashboard", &base[..49]);
    assert!(
        find(&long, "ConfigMap", &dashboard).is_some(),
        "{dashboard}"
    );
    let over = render(json!({"fullnameOverride": "identity"}));
    assert!(find(&over, "Deployment", "identity-hub").is_some());
    assert!(find(&over, "Service", "identity").is_some());
    let args = container_args(find(&over, "Deployment", "identity-hub").unwrap());
    assert!(args.contains(&"--lease-name=identity-hub".to_string()));
}

#[test]
fn optional_parts_render_as_valid_yaml() {
    let docs = render(json!({
        "serviceMonitor": {"enabled": true, "labels": {"release": "prometheus"}},
        "api": {"enabled": true},
        "spireClassName": "spire-system",
        "image": {"tag": "1.2.3"},
        "hub": {"clusterProfileNamespace": "fleet", "clusterProfileSelector": "env in (prod, staging)",
                "providerFile": "providers:\n  - name: eks\n    execConfig:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n      args: [eks, get-token]\n"}
    }));
    let sm = find(&docs, "ServiceMonitor", "kleym").expect("ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    let svc = find(&docs, "Service", "kleym").unwrap();
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k}"
        );
    }
    assert_eq!(svc["spec"]["ports"][1]["name"], "api");
    let cm = find(&docs, "ConfigMap", "kleym-hub-providers").unwrap();
    let file: Value =
        kleym_api::yaml::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(file["providers"][0]["name"], "eks");
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("{IMAGE_REPOSITORY}:1.2.3")
    );
    let args = container_args(dep);
    assert!(args.contains(&"--spire-class-name=spire-system".to_string()));
    // A selector with spaces and parentheses stays one argument.
    assert!(
        args.contains(&"--clusterprofile-selector=env in (prod, staging)".to_string()),
        "{args:?}"
    );
    // With the API on, the flags are still those of `kleym hub`.
    let parsed = kleym_e2e::fixtures::harness::parse_hub_args(&args[1..]).unwrap();
    assert_eq!(parsed.api.api_addr.port(), 8443);
    assert_eq!(
        parsed.clusterprofile_selector.as_deref(),
        Some("env in (prod, staging)")
    );
}

#[test]
fn grafana_dashboard_ships_behind_its_switch() {
    let file = std::fs::read_to_string(chart().join("dashboards/kleym-hub.json")).unwrap();
    let file: Value = serde_json::from_str(&file).unwrap();
    let off = render(json!({}));
    assert!(find(&off, "ConfigMap", "kleym-hub-dashboard").is_none());
    let on = render(json!({"grafanaDashboard": {"enabled": true,
        "namespace": "monitoring", "annotations": {"grafana_folder": "kleym"}}}));
    let cm = find(&on, "ConfigMap", "kleym-hub-dashboard").expect("dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "kleym");
    let shipped: Value =
        serde_json::from_str(cm["data"]["kleym-hub.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, file);
    // Only the hub has these metrics.
    let spoke = render(json!({"mode": "single-cluster", "grafanaDashboard": {"enabled": true}}));
    assert!(
        of_kind(&spoke, "ConfigMap")
            .iter()
            .all(|c| c["data"].get("kleym-hub.json").is_none())
    );
    assert!(find(&spoke, "ConfigMap", "kleym-spoke-dashboard").is_none());
}

#[test]
fn single_cluster_mode_runs_the_spoke_with_the_deploy_spoke_rules() {
    let docs = render(json!({"mode": "single-cluster",
        "spoke": {"metricsPort": 9100, "healthPort": 9101}, "spireClassName": "spire-a"}));
    assert!(find(&docs, "Deployment", "kleym-hub").is_none());
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
    assert!(rules_mention(&docs, "clusterprofiles").is_empty());
    let dep = find(&docs, "Deployment", "kleym-spoke").expect("spoke Deployment");
    // No leader election: never two spoke pods at once.
    assert_eq!(dep["spec"]["replicas"], 1);
    assert_eq!(dep["spec"]["strategy"], json!({"type": "Recreate"}));
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        dep["spec"]["template"]["spec"]["serviceAccountName"],
        "kleym-spoke"
    );
    assert!(find(&docs, "ServiceAccount", "kleym-spoke").is_some());
    let args = container_args(dep);
    assert_eq!(args[0], "spoke");
    assert_probes_on_their_own_port(dep, &args, 9100, 9101);
    // The flags are those of `kleym spoke`.
    assert_kleym_accepts(&args);
    let role = find(&docs, "ClusterRole", "kleym-spoke").unwrap();
    let deploy: Value = kleym_api::yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/spoke/clusterrole.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        role["rules"], deploy["rules"],
        "chart and deploy/spoke differ"
    );
    let svc = find(&docs, "Service", "kleym").unwrap();
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/component"],
        "spoke"
    );
    assert_eq!(svc["spec"]["ports"][0]["port"], 9100);
}

/// `spoke.svid` values beyond the defaults (lists in the order kleym writes them).
fn wider_svid_values() -> Value {
    json!({
        "clusterDomain": "corp.internal",
        "dnsSuffixes": ["apps.example.org", "b.example"],
        "namespaceDNSSuffixes": ["web=web.web.svc.corp.internal", "web=x.example"],
        "maxTtl": "48h",
        "maxJwtTtl": "90m",
        "federatesWith": ["partner.example"],
    })
}

/// The chart's spoke mode installs the admission policy of `kleym_spoke::admission_policy`
/// for its own ServiceAccount and trust domain, and the ConfigMap of its parameters holds
/// exactly what the spoke's rendered flags configure (parsed by kleym's own flag parser).
#[test]
fn single_cluster_mode_installs_the_admission_policy_of_the_spokes_flags() {
    use clap::Parser;
    use kleym_spoke::admission_policy::{ParamsRef, PolicyOptions, admission_policy_with};
    #[derive(Parser)]
    struct SvidOnly {
        #[command(flatten)]
        svid: kleym_hub::flags::SvidPolicyFlags,
    }
    for overrides in [
        json!({"mode": "single-cluster", "trustDomain": "prod.example.org"}),
        json!({"mode": "single-cluster", "serviceAccount": {"name": "spoke-sa"},
               "spoke": {"svid": wider_svid_values()}}),
    ] {
        let docs = render(overrides.clone());
        let dep = find(&docs, "Deployment", "kleym-spoke").expect("spoke Deployment");
        let args = container_args(dep);
        assert_kleym_accepts(&args);
        let svid_args = args.iter().filter(|a| {
            a.starts_with("--cluster-domain=")
                || a.starts_with("--svid-")
                || a.starts_with("--hub-")
        });
        let flags =
            SvidOnly::try_parse_from(std::iter::once(&"kleym".to_string()).chain(svid_args))
                .unwrap_or_else(|e| panic!("{overrides}: {e}"));
        let svid = flags.svid.policy().unwrap();
        let sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap();
        let td = args
            .iter()
            .find_map(|a| a.strip_prefix("--trust-domain="))
            .unwrap();
        let want = admission_policy_with(
            &PolicyOptions {
                name: "kleym-spoke".into(),
                usernames: vec![format!("system:serviceaccount:kleym-system:{sa}")],
                trust_domain: td.into(),
                cluster_domain: svid.cluster_domain().into(),
            },
            &ParamsRef {
                namespace: "kleym-system".into(),
                name: "kleym-spoke".into(),
            },
            &svid,
        );
        let policy = find(&docs, "ValidatingAdmissionPolicy", "kleym-spoke").expect("policy");
        assert_eq!(policy["spec"], want[0]["spec"], "{overrides}");
        let binding =
            find(&docs, "ValidatingAdmissionPolicyBinding", "kleym-spoke").expect("binding");
        assert_eq!(binding["spec"], want[1]["spec"], "{overrides}");
        let cm = find(&docs, "ConfigMap", "kleym-spoke").expect("parameters");
        assert_eq!(cm["metadata"]["namespace"], "kleym-system");
        assert_eq!(
            cm["data"], want[2]["data"],
            "{overrides}: flags and ConfigMap agree"
        );
    }
    // Switched off, or in fleet mode: none of the three.
    for overrides in [
        json!({"mode": "single-cluster", "spoke": {"admissionPolicy": {"enabled": false}}}),
        json!({}),
    ] {
        let docs = render(overrides);
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            assert!(of_kind(&docs, kind).is_empty(), "{kind}");
        }
        assert!(find(&docs, "ConfigMap", "kleym-spoke").is_none());
    }
}

#[test]
fn the_spoke_check_rejects_flags_kleym_does_not_know() {
    // What assert_kleym_accepts tells apart: an unknown flag is clap's usage error (exit 2,
    // naming the flag), never the run stopping at the missing kubeconfig (exit 1).
    let bad = vec!["spoke".to_string(), "--trust-domainn=x".to_string()];
    let (code, stderr) = run_kleym_without_cluster(&bad);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unexpected argument '--trust-domainn'"),
        "{stderr}"
    );
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
    // The same command line with the flag spelled right reaches the kubeconfig.
    assert_kleym_accepts(&["spoke".to_string(), "--trust-domain=x".to_string()]);
}

/// Copies the directory `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// templates/NOTES.txt as `helm install` prints it after installing `release` with `set`.
/// `helm template` does not render the notes and `helm install --dry-run` needs a cluster
/// serving Deployments, so a copy of the chart renders them into a ConfigMap instead
/// (`tpl` of the file, with the chart's named templates).
fn notes(release: &str, set: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("kleym");
    copy_dir(&chart(), &copy);
    std::fs::rename(copy.join("templates/NOTES.txt"), copy.join("notes.txt")).unwrap();
    std::fs::write(
        copy.join("templates/zz-notes.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  \
         notes: {{ tpl (.Files.Get \"notes.txt\") . | toJson }}\n",
    )
    .unwrap();
    let mut args = vec![
        "template",
        release,
        copy.to_str().unwrap(),
        "--namespace",
        "kleym-system",
        "--show-only",
        "templates/zz-notes.yaml",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = helm(&args, dir.path());
    let docs = documents(&out).unwrap();
    docs[0]["data"]["notes"]
        .as_str()
        .expect("rendered notes")
        .to_string()
}

#[test]
fn notes_say_what_to_do_next() {
    let fleet = notes(
        "kleym",
        &["api.enabled=true", "grafanaDashboard.enabled=true"],
    );
    for needle in [
        "rollout status deployment/kleym-hub",
        "ClusterProfile",
        "kleym-hub-providers",
        "kleym trust-config",
        "--service-account kleym-system/kleym-hub",
        "--credential external",
        "kubectl get clusteridentitystatuses -A",
        "kubectl get fleetidentityreports -A",
        "kleym report",
        "/v1/report",
        "kleym-hub-dashboard",
        "helm upgrade",
    ] {
        assert!(
            fleet.contains(needle),
            "fleet NOTES lack {needle:?}:\n{fleet}"
        );
    }
    let single = notes("acme", &["mode=single-cluster"]);
    for needle in [
        "rollout status deployment/acme-kleym-spoke",
        "kubectl get inferenceidentitybindings -A",
        "kubectl get clusterspiffeids",
    ] {
        assert!(
            single.contains(needle),
            "single-cluster NOTES lack {needle:?}:\n{single}"
        );
    }
    assert!(!single.contains("ClusterProfile"), "{single}");
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
            .map(|d| kleym_api::yaml::to_string(d).unwrap())
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

/// `issuer.*` values become `--issuer-*` flags that the real `kleym hub` parser accepts and
/// turns into the issuer settings the values describe; the TLS files it names are in the
/// mounted Secret; the Service exposes the listener; the Role grants the key Secret and the
/// publishing ConfigMap by name (only `create`, which Kubernetes cannot limit by name, is
/// unscoped). Off by default: no flag, port or rule.
#[test]
fn issuer_values_become_flags_the_hub_parses_a_service_port_and_scoped_rbac() {
    use kleym_e2e::fixtures::harness::parse_hub_args;
    let docs = render(
        json!({"issuer": {"enabled": true, "url": "https://issuer.example.org/fleet",
        "keyRotation": "12h", "keyPublishAhead": "30m", "publishConfigMap": "kleym-issuer-docs",
        "port": 9443, "tlsSecret": "issuer-serving"}}),
    );
    let dep = find(&docs, "Deployment", "kleym-hub").expect("hub Deployment");
    let args = container_args(dep);
    let parsed = parse_hub_args(&args[1..]).unwrap();
    let settings = parsed
        .issuer
        .settings()
        .unwrap()
        .expect("the hub is an issuer");
    assert_eq!(settings.url, "https://issuer.example.org/fleet");
    assert_eq!(
        (
            settings.secret.namespace.as_str(),
            settings.secret.name.as_str()
        ),
        ("kleym-system", "kleym-issuer")
    );
    assert_eq!(settings.listen_addr, "0.0.0.0:9443".parse().unwrap());
    let policy = settings.rotation.expect("rotation");
    assert_eq!(
        (policy.period_seconds, policy.publish_ahead_seconds),
        (12 * 3600, 1800)
    );
    let cm = settings.publish_configmap.expect("ConfigMap publishing");
    assert_eq!(
        (cm.namespace.as_str(), cm.name.as_str()),
        ("kleym-system", "kleym-issuer-docs")
    );
    let (cert, key) = settings.tls.expect("TLS listener");
    let pod = &dep["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "issuer-tls")
        .expect("issuer TLS mount");
    let dir = mount["mountPath"].as_str().unwrap();
    assert!(
        cert.starts_with(dir) && key.starts_with(dir),
        "{cert:?} {key:?} under {dir}"
    );
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "issuer-tls")
        .expect("issuer TLS volume");
    assert_eq!(volume["secret"]["secretName"], "issuer-serving");
    let port = pod["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "issuer")
        .expect("issuer container port");
    assert_eq!(port["containerPort"], 9443);
    let svc = find(&docs, "Service", "kleym").expect("Service");
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "issuer")
        .expect("Service port issuer");
    assert_eq!(
        (&svc_port["port"], &svc_port["targetPort"]),
        (&json!(9443), &json!("issuer"))
    );
    assert_eq!(
        rules_mention(&docs, "secrets"),
        vec![
            json!({"apiGroups": [""], "resources": ["secrets"],
                   "resourceNames": ["kleym-issuer"], "verbs": ["get", "update"]}),
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
        ]
    );
    assert_eq!(
        rules_mention(&docs, "configmaps"),
        vec![
            json!({"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["kleym-issuer-docs"], "verbs": ["get", "patch"]}),
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}),
        ]
    );
    let role = find(&docs, "Role", "kleym-hub").expect("hub Role");
    assert_eq!(role["metadata"]["namespace"], "kleym-system");
    // No X.509 CA unless asked for: no flag, and no grant on any CA Secret.
    assert!(settings.x509_ca_secret.is_none());
    assert!(
        !args.iter().any(|a| a.starts_with("--issuer-x509")),
        "{args:?}"
    );

    // With X.509: the CA Secret by its own flag and its own rule, apart from the keys.
    for (x509, ca_secret) in [
        (json!({"enabled": true}), "kleym-issuer-x509-ca"),
        (
            json!({"enabled": true, "caSecret": "hub-client-ca"}),
            "hub-client-ca",
        ),
    ] {
        let docs = render(json!({"issuer": {"enabled": true,
            "url": "https://issuer.example.org/fleet", "x509": x509}}));
        let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
        let parsed = parse_hub_args(&container_args(dep)[1..]).unwrap();
        let settings = parsed
            .issuer
            .settings()
            .unwrap()
            .expect("the hub is an issuer");
        let ca = settings.x509_ca_secret.expect("X.509 CA Secret");
        assert_eq!(
            (ca.namespace.as_str(), ca.name.as_str()),
            ("kleym-system", ca_secret)
        );
        assert_eq!(settings.secret.name, "kleym-issuer");
        assert_eq!(
            rules_mention(&docs, "secrets"),
            vec![
                json!({"apiGroups": [""], "resources": ["secrets"],
                       "resourceNames": ["kleym-issuer"], "verbs": ["get", "update"]}),
                json!({"apiGroups": [""], "resources": ["secrets"],
                       "resourceNames": [ca_secret], "verbs": ["get", "update"]}),
                json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
            ]
        );
    }

    // Behind a TLS-terminating ingress: plain HTTP, no TLS volume, no ConfigMap rule.
    let docs = render(json!({"issuer": {"enabled": true,
        "url": "http://kleym.kleym-system:8444", "insecureHttp": true, "keyRotation": "off"}}));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    let parsed = parse_hub_args(&container_args(dep)[1..]).unwrap();
    let settings = parsed
        .issuer
        .settings()
        .unwrap()
        .expect("the hub is an issuer");
    assert!(settings.tls.is_none() && settings.rotation.is_none());
    assert!(settings.publish_configmap.is_none());
    assert!(!dep.to_string().contains("issuer-tls"));
    assert!(rules_mention(&docs, "configmaps").is_empty());

    // Off by default.
    let docs = render(json!({}));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    assert!(
        !container_args(dep)
            .iter()
            .any(|a| a.starts_with("--issuer"))
    );
    assert!(rules_mention(&docs, "secrets").is_empty());
    let svc = find(&docs, "Service", "kleym").unwrap();
    assert!(!svc.to_string().contains("issuer"));
}

/// The `kleym` command line of a provider entry's `execConfig`.
fn provider_argv(provider: &Value) -> Vec<String> {
    let exec = &provider["execConfig"];
    std::iter::once(exec["command"].as_str().unwrap().to_string())
        .chain(
            exec["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        )
        .collect()
}

/// With the issuer on, the default provider file gains the bundled SPIFFE plugins with the
/// issuer the values describe (URL, key Secret, trust domain, hub SPIFFE ID), and the real
/// `kleym` binary accepts each command line (it gets as far as loading the hub kubeconfig).
/// Mirror mode (`publishClusterIssuer`) serves the hub cluster's own ServiceAccount issuer
/// instead: `--publish-cluster-issuer`, no key Secret flag or rule, no SPIFFE providers.
#[test]
fn issuer_values_add_spiffe_providers_or_mirror_the_cluster_issuer() {
    use kleym_e2e::fixtures::harness::parse_hub_args;

    let providers = |docs: &[Value]| -> Vec<Value> {
        let cm = find(docs, "ConfigMap", "kleym-hub-providers").expect("provider ConfigMap");
        let file: Value =
            kleym_api::yaml::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
        file["providers"].as_array().unwrap().clone()
    };
    // Without issuer.x509 there is no CA, so no X.509 provider.
    let docs = render(json!({"issuer": {"enabled": true,
        "url": "https://issuer.example.org/fleet"}}));
    let names: Vec<String> = providers(&docs)
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["kleym-token-request", "kleym-spiffe-jwt"]);
    let docs = render(
        json!({"trustDomain": "prod.example.org", "issuer": {"enabled": true,
        "url": "https://issuer.example.org/fleet", "hubSpiffeId": "spiffe://prod.example.org/hubs/eu",
        "x509": {"enabled": true}}}),
    );
    let list = providers(&docs);
    let names: Vec<&str> = list.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "kleym-token-request",
            "kleym-spiffe-jwt",
            "kleym-spiffe-x509"
        ]
    );
    let common = [
        "--trust-domain=prod.example.org",
        "--hub-spiffe-id=spiffe://prod.example.org/hubs/eu",
    ];
    // Each plugin names only the Secret it reads: the JWT keys, or the X.509 CA.
    for (provider, plugin, extra) in [
        (
            &list[1],
            "spiffe-jwt",
            vec![
                "--issuer-url=https://issuer.example.org/fleet",
                "--issuer-key-secret=kleym-system/kleym-issuer",
                "--issuer-key-algorithm=ES256",
            ],
        ),
        (
            &list[2],
            "spiffe-x509",
            vec!["--issuer-x509-ca-secret=kleym-system/kleym-issuer-x509-ca"],
        ),
    ] {
        let argv = provider_argv(provider);
        assert_eq!(argv[..3], ["/usr/local/bin/kleym", "credential", plugin]);
        let mut want: Vec<&str> = extra.into_iter().chain(common).collect();
        let mut got: Vec<&str> = argv[3..].iter().map(String::as_str).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{plugin}");
        // Parsed by the real binary, run as the hub runs a plugin.
        let kleym = kleym_e2e::fixtures::plugins::kleym_binary().expect("kleym binary");
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(kleym)
            .args(&argv[1..])
            .arg("--kubeconfig")
            .arg(dir.path().join("missing"))
            .env_remove("KUBECONFIG")
            .env(
                "KUBERNETES_EXEC_INFO",
                json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                       "spec": {"interactive": false, "cluster": {"server": "https://spoke-a:6443"}}})
                .to_string(),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{plugin}: {stderr}");
        assert!(stderr.contains("kubeconfig"), "{plugin}: {stderr}");
    }
    // The JWT's audience is the spoke's server URL, which the plugin gets from the hub.
    assert_eq!(list[1]["execConfig"]["provideClusterInfo"], true);

    // Mirror mode.
    let docs = render(json!({"issuer": {"enabled": true,
        "url": "https://issuer.example.org/fleet", "publishClusterIssuer": true,
        "publishConfigMap": "ignored-in-mirror-mode"}}));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    let args = container_args(dep);
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--issuer-key") || a.starts_with("--issuer-publish")),
        "{args:?}"
    );
    let parsed = parse_hub_args(&args[1..]).unwrap();
    let mirror = parsed
        .issuer
        .mirror_settings()
        .unwrap()
        .expect("the hub mirrors the cluster's issuer");
    assert_eq!(mirror.url, "https://issuer.example.org/fleet");
    assert!(parsed.issuer.settings().unwrap().is_none());
    assert!(rules_mention(&docs, "secrets").is_empty());
    assert!(rules_mention(&docs, "configmaps").is_empty());
    let names: Vec<String> = providers(&docs)
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["kleym-token-request"]);
}

/// `spireAgent.enabled`: the hub pod mounts the agent's socket (the SPIFFE CSI driver by
/// default, or a hostPath) read-only where the two added providers point, and the rendered
/// plugin command lines are valid for the real binary: it gets as far as dialling the socket.
#[test]
fn spire_agent_values_mount_the_socket_and_add_workload_api_providers() {
    let providers = |docs: &[Value]| -> Vec<Value> {
        let cm = find(docs, "ConfigMap", "kleym-hub-providers").expect("provider ConfigMap");
        let file: Value =
            kleym_api::yaml::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
        file["providers"].as_array().unwrap().clone()
    };
    let socket_volume = |docs: &[Value]| -> (Value, Value) {
        let pod = &find(docs, "Deployment", "kleym-hub").unwrap()["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "spire-agent-socket")
            .cloned()
            .unwrap_or(Value::Null);
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "spire-agent-socket")
            .cloned()
            .unwrap_or(Value::Null);
        (volume, mount)
    };

    // Off by default: no volume, no provider.
    let docs = render(json!({}));
    assert_eq!(socket_volume(&docs), (Value::Null, Value::Null));
    assert!(
        providers(&docs)
            .iter()
            .all(|p| !p["name"].as_str().unwrap().starts_with("kleym-spire"))
    );

    let docs = render(
        json!({"trustDomain": "prod.example.org", "spireAgent": {"enabled": true,
        "hubSpiffeId": "spiffe://prod.example.org/kleym/hub",
        "timeoutSeconds": 5}}),
    );
    let (volume, mount) = socket_volume(&docs);
    assert_eq!(volume["csi"]["driver"], "csi.spiffe.io");
    assert_eq!(mount["mountPath"], "/run/spire/agent-sockets");
    assert_eq!(mount["readOnly"], true);
    let list = providers(&docs);
    let names: Vec<&str> = list.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["kleym-token-request", "kleym-spire-jwt", "kleym-spire-x509"]
    );
    let socket = "unix:///run/spire/agent-sockets/spire-agent.sock";
    let kleym = kleym_e2e::fixtures::plugins::kleym_binary().expect("kleym binary");
    for (provider, plugin) in [(&list[1], "spiffe-jwt"), (&list[2], "spiffe-x509")] {
        let argv = provider_argv(provider);
        assert_eq!(
            argv,
            [
                "/usr/local/bin/kleym",
                "credential",
                plugin,
                &format!("--workload-api-socket={socket}"),
                "--workload-api-timeout-seconds=5",
                "--trust-domain=prod.example.org",
                "--hub-spiffe-id=spiffe://prod.example.org/kleym/hub",
            ]
        );
        // The real binary accepts every flag (a usage error would exit 2) and fails only at
        // the socket, which does not exist here, naming it. The hub sets the audience it
        // decided for the spoke on every run; so does this.
        let out = Command::new(&kleym)
            .args(&argv[1..])
            .env("KLEYM_CLUSTER_AUDIENCE", "kleym.io/clusterprofile/fleet/spoke-a")
            .env("KLEYM_CLUSTER_PROFILE", "fleet/spoke-a")
            .env(
                "KUBERNETES_EXEC_INFO",
                json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                       "spec": {"interactive": false, "cluster": {"server": "https://spoke-a:6443"}}})
                .to_string(),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{plugin}: {stderr}");
        assert!(stderr.contains(socket), "{plugin}: {stderr}");
    }
    assert_eq!(list[1]["execConfig"]["provideClusterInfo"], true);

    // hostPath instead of the CSI driver.
    let docs = render(
        json!({"spireAgent": {"enabled": true, "socketVolume": "hostPath",
        "hostPath": "/run/spire/sockets", "socketName": "agent.sock"}}),
    );
    let (volume, _) = socket_volume(&docs);
    assert_eq!(volume["hostPath"]["path"], "/run/spire/sockets");
    assert!(
        provider_argv(&providers(&docs)[1])
            .contains(&"--workload-api-socket=unix:///run/spire/agent-sockets/agent.sock".into())
    );
}

/// `tenantAccess.aggregate` (on by default, in both modes) renders the two aggregated
/// ClusterRoles of `deploy/tenant-access/`: the same rules and aggregation labels, so a spoke
/// gets from the plain manifest what the chart's cluster gets. Off: neither is rendered.
#[test]
fn tenant_access_roles_match_deploy_and_follow_their_switch() {
    let deploy = documents(
        &std::fs::read_to_string(repo_root().join("deploy/tenant-access/clusterroles.yaml"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(deploy.len(), 2);
    const AGGREGATION: [&str; 3] = [
        "rbac.authorization.k8s.io/aggregate-to-admin",
        "rbac.authorization.k8s.io/aggregate-to-edit",
        "rbac.authorization.k8s.io/aggregate-to-view",
    ];
    let aggregation = |role: &Value| -> Vec<(String, String)> {
        AGGREGATION
            .iter()
            .filter_map(|k| {
                role["metadata"]["labels"][*k]
                    .as_str()
                    .map(|v| (k.to_string(), v.to_string()))
            })
            .collect()
    };
    for mode in [json!({}), json!({"mode": "single-cluster"})] {
        let docs = render(mode.clone());
        for d in &deploy {
            let name = d["metadata"]["name"].as_str().unwrap();
            let role = find(&docs, "ClusterRole", name)
                .unwrap_or_else(|| panic!("{mode}: the chart renders no ClusterRole {name}"));
            assert_eq!(role["rules"], d["rules"], "{mode}: {name}'s rules differ");
            assert_eq!(aggregation(role), aggregation(d), "{mode}: {name}'s labels");
            assert!(!aggregation(role).is_empty(), "{name} aggregates nowhere");
        }
    }
    let off = render(json!({"tenantAccess": {"aggregate": false}}));
    for d in &deploy {
        let name = d["metadata"]["name"].as_str().unwrap();
        assert!(
            find(&off, "ClusterRole", name).is_none(),
            "{name} rendered when off"
        );
    }
}

/// No image is published, so the chart names none by default: a render without
/// `image.repository` fails with a message naming the value and how to get an image.
#[test]
fn a_missing_image_fails_naming_the_value_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    for mode in ["fleet", "single-cluster"] {
        let args: Vec<String> = ["template", "kleym", chart.to_str().unwrap(), "--set"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("mode={mode}")])
            .collect();
        let (ok, stdout, stderr) = helm_result_exact(&args, dir.path());
        assert!(!ok, "{mode}: rendered without an image\n{stdout}");
        assert!(
            stderr.contains("image.repository is required") && stderr.contains("Dockerfile"),
            "{mode}: {stderr}"
        );
    }
}

/// `hub.extraArgs`/`hub.extraEnv` (and the spoke's) reach the container after the chart's
/// own arguments, the binary accepts the flags the docs name, and the schema refuses what
/// is not a flag or not an EnvVar.
#[test]
fn extra_args_and_env_reach_the_container_and_are_schema_checked() {
    let docs = render(json!({
        "hub": {
            "extraArgs": ["--log-plugin-stderr", "--engage-condition=ControlPlaneHealthy",
                          "--clusterprofile-version=v1alpha1", "--initial-sync-timeout-seconds=120"],
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        }
    }));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    let args = container_args(dep);
    let tail: Vec<&str> = args[args.len() - 4..].iter().map(String::as_str).collect();
    assert_eq!(
        tail,
        [
            "--log-plugin-stderr",
            "--engage-condition=ControlPlaneHealthy",
            "--clusterprofile-version=v1alpha1",
            "--initial-sync-timeout-seconds=120"
        ]
    );
    // The flags are those of `kleym hub` (same parser, in-process).
    let parsed = kleym_e2e::fixtures::harness::parse_hub_args(&args[1..]).unwrap();
    assert_eq!(parsed.initial_sync_timeout_seconds, 120);
    let env = &dep["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "HTTPS_PROXY", "value": "http://proxy:3128"})),
        "{env}"
    );
    let docs = render(
        json!({"mode": "single-cluster", "spoke": {"extraArgs": ["--concurrency=8"],
        "extraEnv": [{"name": "A", "value": "b"}]}}),
    );
    let dep = find(&docs, "Deployment", "kleym-spoke").unwrap();
    let args = container_args(dep);
    assert_eq!(args.last().map(String::as_str), Some("--concurrency=8"));
    assert_kleym_accepts(&args);

    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    for bad in [
        json!({"hub": {"extraArgs": ["log-plugin-stderr"]}}),
        json!({"hub": {"extraArgs": [42]}}),
        json!({"hub": {"extraEnv": [{"value": "no name"}]}}),
        json!({"spoke": {"extraEnv": [{"name": "A", "valu": "typo"}]}}),
    ] {
        let values = dir.path().join("bad.json");
        std::fs::write(&values, bad.to_string()).unwrap();
        let (ok, _, stderr) = helm_result(
            &[
                "template",
                "kleym",
                chart.to_str().unwrap(),
                "-f",
                values.to_str().unwrap(),
            ],
            dir.path(),
        );
        assert!(!ok, "{bad}: rendered");
        assert!(
            stderr.contains("values don't meet the specifications of the schema"),
            "{bad}: {stderr}"
        );
    }
}

/// The default memory limit fits the measured peak of the largest fleet the docs size
/// (5000 spokes: about 700 MiB), and the chart's version moved with its values (so
/// `helm upgrade --reuse-values` from 0.2.0 is not handed values it lacks unnoticed).
#[test]
fn default_resources_fit_the_measured_sizing() {
    let docs = render(json!({}));
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    let limit = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        .as_str()
        .unwrap()
        .to_string();
    let mib = |q: &str| -> u64 {
        if let Some(n) = q.strip_suffix("Gi") {
            n.parse::<u64>().unwrap() * 1024
        } else {
            q.strip_suffix("Mi").unwrap().parse().unwrap()
        }
    };
    assert!(
        mib(&limit) >= 700 * 5 / 4,
        "limit {limit} leaves no headroom over 700 MiB"
    );
    let chart: Value = kleym_api::yaml::from_str(
        &std::fs::read_to_string(repo_root().join("charts/kleym/Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_ne!(
        chart["version"], "0.2.0",
        "values changed: bump the chart version"
    );
}

/// The paths of `rendered` (below `path`) that are missing from `typed`, the same object
/// after a trip through its Kubernetes API type: fields the type does not have (a misspelled
/// or invented field, which the API server would drop or refuse). `null`s are skipped (they
/// mean "unset").
fn dropped_fields(rendered: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (rendered, typed) {
        (Value::Object(r), Value::Object(t)) => {
            for (k, v) in r {
                let here = format!("{path}.{k}");
                match t.get(k) {
                    _ if v.is_null() => {}
                    None => out.push(here),
                    Some(tv) => dropped_fields(v, tv, &here, out),
                }
            }
        }
        (Value::Array(r), Value::Array(t)) => {
            for (i, v) in r.iter().enumerate() {
                let here = format!("{path}[{i}]");
                match t.get(i) {
                    None => out.push(here),
                    Some(tv) => dropped_fields(v, tv, &here, out),
                }
            }
        }
        _ => {}
    }
}

/// `doc` through the k8s-openapi type of its kind and back: the fields it has that the type
/// does not, or the error when it does not fit the type at all (a wrong value type, a wrong
/// apiVersion). `None` for a kind that is not a built-in type.
fn fields_outside_the_api_type(doc: &Value) -> Option<Result<Vec<String>, String>> {
    use k8s_openapi::api::{admissionregistration, apps, core, policy, rbac};
    fn trip<K: serde::de::DeserializeOwned + serde::Serialize>(
        doc: &Value,
    ) -> Result<Vec<String>, String> {
        let typed: K = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
        let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        dropped_fields(doc, &back, "", &mut out);
        Ok(out)
    }
    let kind = (doc["apiVersion"].as_str()?, doc["kind"].as_str()?);
    Some(match kind {
        ("apps/v1", "Deployment") => trip::<apps::v1::Deployment>(doc),
        ("v1", "ServiceAccount") => trip::<core::v1::ServiceAccount>(doc),
        ("v1", "Service") => trip::<core::v1::Service>(doc),
        ("v1", "ConfigMap") => trip::<core::v1::ConfigMap>(doc),
        ("policy/v1", "PodDisruptionBudget") => trip::<policy::v1::PodDisruptionBudget>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => trip::<rbac::v1::ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            trip::<rbac::v1::ClusterRoleBinding>(doc)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => trip::<rbac::v1::Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => trip::<rbac::v1::RoleBinding>(doc),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            trip::<admissionregistration::v1::ValidatingAdmissionPolicy>(doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            trip::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(doc)
        }
        _ => return None,
    })
}

/// Every object the chart renders, under every value set, has only fields of its Kubernetes
/// API type (k8s-openapi, an independent copy of the API's types): a misspelled field
/// (`imagePullPolicy` as `imagePulPolicy`, `readinessProbe` nested one level off) fails here,
/// where helm and YAML parsing accept it and the API server would drop it silently.
#[test]
fn every_rendered_object_has_only_fields_of_its_kubernetes_type() {
    let mut checked = std::collections::BTreeSet::new();
    for case in cases() {
        for doc in helm_template(&case, false) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            match fields_outside_the_api_type(&doc) {
                Some(Ok(unknown)) => {
                    assert!(
                        unknown.is_empty(),
                        "{}: {kind} {name} has fields its API type does not: {unknown:?}",
                        case.what
                    );
                    checked.insert(kind);
                }
                Some(Err(e)) => panic!("{}: {kind} {name} is not a valid {kind}: {e}", case.what),
                // The Prometheus Operator's CRD, not a built-in type: its fields are checked
                // in `optional_parts_render_as_valid_yaml`.
                None if kind == "ServiceMonitor" => {}
                None => panic!(
                    "{}: {kind} {name}: add its k8s-openapi type to fields_outside_the_api_type",
                    case.what
                ),
            }
        }
    }
    // Every built-in kind the chart has was checked under some value set.
    for kind in [
        "Deployment",
        "ServiceAccount",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        assert!(checked.contains(kind), "no {kind} rendered: {checked:?}");
    }
}

#[test]
fn the_field_check_finds_a_misspelled_or_misplaced_field() {
    let mut dep = render(json!({}))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    assert_eq!(fields_outside_the_api_type(&dep), Some(Ok(vec![])));
    let container = &mut dep["spec"]["template"]["spec"]["containers"][0];
    container["imagePulPolicy"] = json!("Always");
    dep["spec"]["template"]["spec"]["readinessProbe"] = json!({"httpGet": {"path": "/readyz"}});
    assert_eq!(
        fields_outside_the_api_type(&dep),
        Some(Ok(vec![
            ".spec.template.spec.containers[0].imagePulPolicy".to_string(),
            ".spec.template.spec.readinessProbe".to_string(),
        ]))
    );
    dep["spec"]["replicas"] = json!("two");
    assert!(matches!(fields_outside_the_api_type(&dep), Some(Err(_))));
}

/// The notes name the mode, and warn when sharded mode runs a single replica (nothing to
/// share the spokes with, no one to take them over), not otherwise.
#[test]
fn notes_warn_about_sharded_mode_with_one_replica() {
    let one = notes("kleym", &["hub.shardMode=sharded", "hub.replicas=1"]);
    assert!(one.contains("sharded mode)"), "{one}");
    assert!(
        one.contains("WARNING: sharded mode with 1 replica"),
        "{one}"
    );
    let three = notes("kleym", &["hub.shardMode=sharded", "hub.replicas=3"]);
    assert!(!three.contains("WARNING"), "{three}");
    let leader = notes("kleym", &["hub.replicas=1", "hub.leaderElection=false"]);
    assert!(leader.contains("leader mode)"), "{leader}");
    assert!(!leader.contains("WARNING"), "{leader}");
}
