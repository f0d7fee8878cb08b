//! Conformance: the real kubectl (a client nobody here wrote) against kubesim.
//!
//! Each test starts its own simulated cluster and writes a kubeconfig into a tempdir.
//! kubectl is located as every tool is (`test_tools`: PATH, then the tool cache); the tests fail
//! with a message naming `scripts/ensure-tools` without it.

use kubesim::testing::Kubectl;
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Env {
    _sim: Kubesim,
    cluster: ClusterHandle,
    k: Kubectl,
    dir: tempfile::TempDir,
}

async fn setup() -> Env {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let dir = tempfile::tempdir().unwrap();
    let cluster = sim.cluster("hub").unwrap();
    let k = Kubectl::admin(&cluster, dir.path()).expect("kubectl is required for these tests");
    Env {
        _sim: sim,
        cluster,
        k,
        dir,
    }
}

fn upstream_crds() -> PathBuf {
    upstream_crds::upstream_dir()
}

impl Env {
    async fn ok(&self, args: &[&str]) -> String {
        self.k
            .run_async(args, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
    async fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        self.k
            .run_async(args, Some(stdin))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_api_resources() {
    let env = setup().await;
    let v: Value = serde_json::from_str(&env.ok(&["version", "-o", "json"]).await).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1");
    let out = env.ok(&["api-resources"]).await;
    for want in [
        "namespaces",
        "pods",
        "serviceaccounts",
        "customresourcedefinitions",
        "clusterroles",
        "leases",
        "tokenreviews",
        "selfsubjectaccessreviews",
    ] {
        assert!(out.contains(want), "api-resources lacks {want}:\n{out}");
    }
    let ns = env.ok(&["get", "ns"]).await;
    assert!(ns.starts_with("NAME"), "{ns}");
    assert!(ns.contains("kube-system"), "{ns}");
}

const CM: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: default
  labels: {app: web}
data:
  a: \"1\"
  b: \"2\"
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_client_side_is_idempotent_then_server_side() {
    let env = setup().await;
    let out = env.ok_stdin(&["apply", "-f", "-"], CM).await;
    assert!(out.contains("configmap/settings created"), "{out}");
    let first = env.json(&["get", "configmap", "settings"]).await;
    let rv = first["metadata"]["resourceVersion"].clone();
    assert!(
        first["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    let out = env.ok_stdin(&["apply", "-f", "-"], CM).await;
    assert!(out.contains("configmap/settings unchanged"), "{out}");
    let again = env.json(&["get", "configmap", "settings"]).await;
    assert_eq!(
        again["metadata"]["resourceVersion"], rv,
        "re-apply must not write"
    );

    // A real change through client-side apply (strategic merge patch) removes `b`.
    let changed = CM.replace("  b: \"2\"\n", "  c: \"3\"\n");
    let out = env.ok_stdin(&["apply", "-f", "-"], &changed).await;
    assert!(out.contains("configured"), "{out}");
    let after = env.json(&["get", "configmap", "settings"]).await;
    assert_eq!(after["data"], serde_json::json!({"a": "1", "c": "3"}));
    assert_ne!(after["metadata"]["resourceVersion"], rv);

    // Server-side apply of another object, then a no-op re-apply.
    let ss = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  k: v\n";
    let out = env
        .ok_stdin(
            &[
                "apply",
                "--server-side",
                "--field-manager=tester",
                "-f",
                "-",
            ],
            ss,
        )
        .await;
    assert!(out.contains("serverside-applied"), "{out}");
    let obj = env
        .json(&["get", "configmap", "ssa", "--show-managed-fields"])
        .await;
    let managers: Vec<&str> = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, vec!["tester"]);
    let rv = obj["metadata"]["resourceVersion"].clone();
    env.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=tester",
            "-f",
            "-",
        ],
        ss,
    )
    .await;
    let obj = env.json(&["get", "configmap", "ssa"]).await;
    assert_eq!(obj["metadata"]["resourceVersion"], rv);

    // Client-side apply with a server dry run stores nothing either.
    let dry_cs = changed.replace("c: \"3\"", "c: \"dry\"");
    let out = env
        .ok_stdin(&["apply", "--dry-run=server", "-f", "-"], &dry_cs)
        .await;
    assert!(out.contains("server dry run"), "{out}");
    let after_dry = env.json(&["get", "configmap", "settings"]).await;
    assert_eq!(after_dry["data"]["c"], "3");

    // Server-side dry run stores nothing.
    let dry = ss.replace("k: v", "k: changed");
    env.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=tester",
            "--dry-run=server",
            "-f",
            "-",
        ],
        &dry,
    )
    .await;
    let obj = env.json(&["get", "configmap", "ssa"]).await;
    assert_eq!(obj["data"]["k"], "v");
    // A plain delete (kubectl waits for the object to be gone by watching it).
    let out = env.ok(&["delete", "configmap", "ssa", "settings"]).await;
    assert_eq!(out.matches("deleted").count(), 2, "{out}");
    let left = env.ok(&["get", "configmaps", "-o", "name"]).await;
    assert!(
        !left.contains("ssa") && !left.contains("settings"),
        "{left}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_streams_events() {
    let env = setup().await;
    // Two watchers: `-o name` (plain objects) and the default table output (Table events).
    let mut named = env
        .k
        .spawn(&[
            "get",
            "configmaps",
            "-w",
            "-o",
            "name",
            "--request-timeout=30s",
        ])
        .unwrap();
    let mut table = env
        .k
        .spawn(&["get", "configmaps", "-w", "--request-timeout=30s"])
        .unwrap();
    let mut named_lines = BufReader::new(named.stdout.take().unwrap()).lines();
    let mut table_lines = BufReader::new(table.stdout.take().unwrap()).lines();
    // Give the watches a moment to be established, then create objects.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for n in ["w1", "w2"] {
        env.ok(&["create", "configmap", n, "--from-literal=x=y"])
            .await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = tokio::time::timeout_at(deadline, named_lines.next_line())
            .await
            .expect("watch events in time")
            .unwrap()
            .expect("stream open");
        if line.contains("w1") || line.contains("w2") {
            seen.push(line);
        }
    }
    assert_eq!(seen, vec!["configmap/w1", "configmap/w2"]);
    let mut rows = Vec::new();
    let mut header = String::new();
    while rows.len() < 2 {
        let line = tokio::time::timeout_at(deadline, table_lines.next_line())
            .await
            .expect("table watch events in time")
            .unwrap()
            .expect("stream open");
        if line.starts_with("NAME") {
            header = line;
        } else if line.starts_with("w1") || line.starts_with("w2") {
            rows.push(
                line.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
    }
    assert!(header.contains("AGE"), "table header: {header:?}");
    assert_eq!(rows, vec!["w1", "w2"]);
    let _ = named.kill().await;
    let _ = table.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crds_install_wait_and_validate() {
    let env = setup().await;
    let dir = upstream_crds();
    let out = env.ok(&["apply", "-f", dir.to_str().unwrap()]).await;
    assert_eq!(out.matches("created").count(), 8, "{out}");
    env.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=20s",
        "crd/clusterspiffeids.spire.spiffe.io",
        "crd/inferencepools.inference.networking.k8s.io",
    ])
    .await;

    // One valid and one invalid object per CRD; the invalid one is rejected naming the field.
    let cases: &[(&str, &str, &str)] = &[
        (
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: pool, namespace: default}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  targetPorts: [{number: 8000}]\n  endpointPickerRef: {name: epp, port: {number: 9002}}\n",
            "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: bad-pool, namespace: default}\nspec:\n  selector: {matchLabels: {app: vllm}}\n  endpointPickerRef: {name: epp, port: {number: 9002}}\n",
            "spec.targetPorts",
        ),
        (
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: model, namespace: default}\nspec:\n  modelName: llama\n  criticality: Critical\n  poolRef: {name: pool}\n",
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: bad-model, namespace: default}\nspec:\n  modelName: llama\n  criticality: Urgent\n  poolRef: {name: pool}\n",
            "spec.criticality",
        ),
        (
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: obj, namespace: default}\nspec:\n  poolRef: {name: pool}\n  priority: 1\n",
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: bad-obj, namespace: default}\nspec:\n  priority: 1\n",
            "spec.poolRef",
        ),
        (
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata: {name: legacy-pool, namespace: default}\nspec:\n  selector: {app: vllm}\n  targetPortNumber: 8000\n  extensionRef: {name: epp}\n",
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata: {name: bad-legacy-pool, namespace: default}\nspec:\n  selector: {app: vllm}\n  targetPortNumber: 70000\n  extensionRef: {name: epp}\n",
            "spec.targetPortNumber",
        ),
        (
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: llmd-obj, namespace: default}\nspec:\n  poolRef: {name: pool}\n",
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: bad-llmd-obj, namespace: default}\nspec:\n  poolRef: {name: \"\"}\n",
            "spec.poolRef.name",
        ),
        (
            "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ClusterProfile\nmetadata: {name: spoke-1, namespace: default}\nspec:\n  clusterManager: {name: kleym}\n",
            "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ClusterProfile\nmetadata: {name: bad-spoke, namespace: default}\nspec:\n  displayName: x\n",
            "spec.clusterManager",
        ),
        (
            "apiVersion: spire.spiffe.io/v1alpha1\nkind: ClusterSPIFFEID\nmetadata: {name: csid}\nspec:\n  spiffeIDTemplate: \"spiffe://example.org/ns/default/sa/x\"\n",
            "apiVersion: spire.spiffe.io/v1alpha1\nkind: ClusterSPIFFEID\nmetadata: {name: bad-csid}\nspec:\n  hint: missing-template\n",
            "spec.spiffeIDTemplate",
        ),
        (
            "apiVersion: spire.spiffe.io/v1alpha1\nkind: ClusterStaticEntry\nmetadata: {name: cse}\nspec:\n  parentID: spiffe://example.org/node\n  spiffeID: spiffe://example.org/w\n  selectors: [\"unix:uid:0\"]\n",
            "apiVersion: spire.spiffe.io/v1alpha1\nkind: ClusterStaticEntry\nmetadata: {name: bad-cse}\nspec:\n  parentID: spiffe://example.org/node\n  spiffeID: spiffe://example.org/w\n  selectors: \"unix:uid:0\"\n",
            "spec.selectors",
        ),
    ];
    for (valid, invalid, field) in cases {
        let out = env.ok_stdin(&["apply", "-f", "-"], valid).await;
        assert!(out.contains("created"), "valid object not created: {out}");
        let err = env
            .k
            .run_async(&["apply", "-f", "-"], Some(invalid))
            .await
            .expect_err("invalid object must be rejected");
        assert!(
            err.stderr.contains(field) && err.stderr.contains("is invalid"),
            "rejection should name {field}: {}",
            err.stderr
        );
    }
    // Printer columns come through as a Table.
    let out = env
        .ok(&["get", "inferencemodels.inference.networking.x-k8s.io"])
        .await;
    assert!(out.contains("MODEL NAME") && out.contains("llama"), "{out}");
    let csid = env.json(&["get", "clusterspiffeid", "csid"]).await;
    assert_eq!(
        csid["spec"]["spiffeIDTemplate"],
        "spiffe://example.org/ns/default/sa/x"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_with_finalizer_waits_for_the_finalizer() {
    let env = setup().await;
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: guarded\n  namespace: default\n  finalizers: [example.com/guard]\n";
    env.ok_stdin(&["apply", "-f", "-"], cm).await;
    let out = env
        .ok(&["delete", "configmap", "guarded", "--wait=false"])
        .await;
    assert!(out.contains("deleted"), "{out}");
    let obj = env.json(&["get", "configmap", "guarded"]).await;
    assert!(obj["metadata"]["deletionTimestamp"].is_string(), "{obj}");
    env.ok(&[
        "patch",
        "configmap",
        "guarded",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ])
    .await;
    let err = env
        .k
        .run_async(&["get", "configmap", "guarded"], None)
        .await
        .expect_err("gone after the finalizer is removed");
    assert!(
        err.stderr.contains("NotFound") || err.stderr.contains("not found"),
        "{}",
        err.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_follows_rbac_and_create_token_works() {
    let env = setup().await;
    env.ok(&["create", "serviceaccount", "reader"]).await;
    env.ok(&[
        "create",
        "role",
        "cm-reader",
        "--verb=get,list",
        "--resource=configmaps",
    ])
    .await;
    env.ok(&[
        "create",
        "rolebinding",
        "reader-binding",
        "--role=cm-reader",
        "--serviceaccount=default:reader",
    ])
    .await;
    let sa = "system:serviceaccount:default:reader";
    let yes = env
        .ok(&["auth", "can-i", "list", "configmaps", "--as", sa])
        .await;
    assert_eq!(yes.trim(), "yes");
    let no = env
        .k
        .run_async(&["auth", "can-i", "delete", "configmaps", "--as", sa], None)
        .await
        .expect_err("can-i exits 1 on no");
    assert_eq!(no.stdout.trim(), "no");

    // A real token for the ServiceAccount, used by kubectl itself.
    let token = env
        .ok(&["create", "token", "reader", "--duration=10m"])
        .await;
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let k_sa = Kubectl::with_kubeconfig(
        &env.cluster
            .kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::Token(token.into())),
        env.dir.path(),
        "reader",
    )
    .unwrap();
    let listed = k_sa.run_async(&["get", "configmaps"], None).await;
    assert!(listed.is_ok(), "{listed:?}");
    let forbidden = k_sa
        .run_async(&["delete", "configmap", "kube-root-ca.crt"], None)
        .await
        .expect_err("delete is not granted");
    assert!(
        forbidden.stderr.contains("is forbidden")
            && forbidden
                .stderr
                .contains("cannot delete resource \"configmaps\""),
        "{}",
        forbidden.stderr
    );
    let can_i = k_sa
        .run_async(&["auth", "can-i", "get", "configmaps"], None)
        .await;
    assert_eq!(can_i.unwrap().trim(), "yes");
}

/// `kubectl create <kind>` sends protobuf for built-in kinds; kubesim decodes it faithfully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_builtins_via_protobuf() {
    let env = setup().await;
    env.ok(&["create", "namespace", "team-a"]).await;
    let ns = env.json(&["get", "namespace", "team-a"]).await;
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "team-a"
    );
    env.ok(&[
        "create",
        "secret",
        "generic",
        "creds",
        "-n",
        "team-a",
        "--from-literal=user=admin",
        "--from-literal=pass=s3cr3t",
    ])
    .await;
    let secret = env.json(&["get", "secret", "creds", "-n", "team-a"]).await;
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(
        secret["data"]["user"], "YWRtaW4=",
        "bytes are base64 in JSON"
    );
    env.ok(&[
        "create",
        "configmap",
        "labels",
        "-n",
        "team-a",
        "--from-literal=a=1",
    ])
    .await;
    env.ok(&["label", "configmap", "labels", "-n", "team-a", "tier=web"])
        .await;
    let cm = env
        .json(&["get", "configmap", "labels", "-n", "team-a"])
        .await;
    assert_eq!(cm["data"]["a"], "1");
    assert_eq!(cm["metadata"]["labels"]["tier"], "web");
    env.ok(&[
        "create",
        "clusterrole",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
        "--resource-name=web",
    ])
    .await;
    let cr = env.json(&["get", "clusterrole", "pod-reader"]).await;
    assert_eq!(cr["rules"][0]["verbs"], serde_json::json!(["get", "list"]));
    assert_eq!(cr["rules"][0]["resources"], serde_json::json!(["pods"]));
    assert_eq!(cr["rules"][0]["resourceNames"], serde_json::json!(["web"]));
    assert_eq!(cr["rules"][0]["apiGroups"], serde_json::json!([""]));
    env.ok(&[
        "create",
        "clusterrolebinding",
        "bob-reads",
        "--clusterrole=pod-reader",
        "--user=bob",
        "--group=readers",
    ])
    .await;
    let crb = env.json(&["get", "clusterrolebinding", "bob-reads"]).await;
    assert_eq!(
        crb["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-reader"})
    );
    let subjects = crb["subjects"].as_array().unwrap();
    assert_eq!(subjects.len(), 2);
    assert!(
        subjects
            .iter()
            .any(|s| s["kind"] == "User" && s["name"] == "bob")
    );
    assert!(
        subjects
            .iter()
            .any(|s| s["kind"] == "Group" && s["name"] == "readers")
    );
    // The binding is live: bob may get the named pod only.
    let yes = env
        .ok(&["auth", "can-i", "get", "pods/web", "--as", "bob"])
        .await;
    assert_eq!(yes.trim(), "yes");
    let no = env
        .k
        .run_async(&["auth", "can-i", "get", "pods/db", "--as", "bob"], None)
        .await
        .expect_err("other pod names are not granted");
    assert_eq!(no.stdout.trim(), "no");
}

/// ValidatingAdmissionPolicies through the real kubectl: a policy whose expression does not
/// compile is refused when written; a policy with a ConfigMap parameter, a match condition
/// and a variable denies creates (also `--dry-run=server`, which stores nothing), updates
/// and deletes with kube-apiserver's message and status (reason `Invalid` → 422 by default,
/// `Forbidden` → 403); other users are not matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_admission_policy_denials() {
    let env = setup().await;
    let bad = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: bad}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  validations:
  - expression: "object.data.size =="
  - expression: "undeclared.size == 'small'"
"#;
    let err = env
        .k
        .run_async(&["apply", "-f", "-"], Some(bad))
        .await
        .unwrap_err();
    let out = err.to_string();
    assert!(
        out.contains(r#"The ValidatingAdmissionPolicy "bad" is invalid: "#)
            && out.contains("spec.validations[0].expression: Invalid value: \"object.data.size ==\": compilation failed")
            && out.contains("spec.validations[1].expression: Invalid value: \"undeclared.size == 'small'\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'undeclared' (in container '')\n | undeclared.size == 'small'\n | ^"),
        "{out}"
    );
    let warn = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: warn}
spec: {policyName: sizes, validationActions: [Warn]}
"#;
    let out = env
        .k
        .run_async(&["apply", "-f", "-"], Some(warn))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        out.contains("spec.validationActions[0]: Unsupported value: kubesim does not support the Warn and Audit validation actions"),
        "{out}"
    );

    env.ok(&[
        "create",
        "configmap",
        "limits",
        "--from-literal=allowed=small,medium",
    ])
    .await;
    env.ok(&["create", "configmap", "kept", "--from-literal=size=small"])
        .await;
    env.ok(&["label", "configmap", "kept", "keep=true"]).await;
    let policy = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: sizes}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE", "UPDATE", "DELETE"], resources: ["configmaps"]}]
  matchConditions:
  - name: admin-only
    expression: "request.userInfo.username == 'kubesim-admin'"
  variables:
  - name: size
    expression: "object != null && has(object.data) && 'size' in object.data ? object.data.size : ''"
  validations:
  - expression: "request.operation == 'DELETE' || request.name == 'limits' || variables.size in params.data.allowed.split(',')"
    messageExpression: "'size ' + variables.size + ' is not one of ' + params.data.allowed"
  - expression: "request.operation != 'DELETE' || !has(oldObject.metadata.labels) || !('keep' in oldObject.metadata.labels)"
    message: "kept ConfigMaps stay"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: sizes-default}
spec:
  policyName: sizes
  validationActions: [Deny]
  paramRef: {name: limits, namespace: default, parameterNotFoundAction: Deny}
"#;
    let out = env.ok_stdin(&["apply", "-f", "-"], policy).await;
    assert!(
        out.contains("validatingadmissionpolicy.admissionregistration.k8s.io/sizes created")
            && out.contains(
                "validatingadmissionpolicybinding.admissionregistration.k8s.io/sizes-default created"
            ),
        "{out}"
    );
    let denied = "configmaps \"big\" is forbidden: ValidatingAdmissionPolicy 'sizes' with binding 'sizes-default' denied request: size large is not one of small,medium";
    for dry in [true, false] {
        let mut args = vec!["create", "configmap", "big", "--from-literal=size=large"];
        if dry {
            args.push("--dry-run=server");
        }
        let out = env.k.run_async(&args, None).await.unwrap_err().to_string();
        assert!(out.contains(denied), "{out}");
    }
    // Allowed under a dry run, stored only without one.
    env.ok(&[
        "create",
        "configmap",
        "ok",
        "--from-literal=size=medium",
        "--dry-run=server",
    ])
    .await;
    let out = env
        .k
        .run_async(&["get", "configmap", "ok"], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        out.contains("NotFound") || out.contains("not found"),
        "{out}"
    );
    env.ok(&["create", "configmap", "ok", "--from-literal=size=medium"])
        .await;
    // Updates are checked on the new object; the reason is `Invalid` (422) by default.
    let out = env
        .k
        .run_async(
            &["apply", "-f", "-"],
            Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\ndata: {size: huge}\n"),
        )
        .await
        .unwrap_err()
        .to_string();
    // kubectl renders a 422 from its causes; the policy's cause has a message and no field,
    // hence the empty field before the message (as with kube-apiserver).
    assert!(
        out.contains("The configmaps \"ok\" is invalid: : ValidatingAdmissionPolicy 'sizes' with binding 'sizes-default' denied request: size huge is not one of small,medium"),
        "{out}"
    );
    // Deletes see `oldObject`; this validation's reason is `Forbidden` (403).
    let out = env
        .k
        .run_async(&["delete", "configmap", "kept"], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        out.contains("Error from server (Forbidden): configmaps \"kept\" is forbidden: ValidatingAdmissionPolicy 'sizes' with binding 'sizes-default' denied request: kept ConfigMaps stay"),
        "{out}"
    );
    // Another user is not matched by the condition.
    env.ok(&[
        "create",
        "configmap",
        "big",
        "--from-literal=size=large",
        "--as",
        "platform-admin",
        "--as-group",
        "system:masters",
    ])
    .await;
    // Without its parameter object, the binding denies (`parameterNotFoundAction: Deny`).
    env.ok(&["delete", "configmap", "limits"]).await;
    let out = env
        .k
        .run_async(
            &["create", "configmap", "x", "--from-literal=size=small"],
            None,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        out.contains(
            "denied request: no params found for policy binding with `Deny` parameterNotFoundAction"
        ),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_admission_policy_type_checking() {
    let env = setup().await;
    let crd = upstream_crds().join("spire.spiffe.io_clusterspiffeids.yaml");
    env.ok(&["apply", "-f", &crd.to_string_lossy()]).await;
    // A field the admission request does not have refuses the policy, as kube-apiserver's
    // compiler does, with cel-go's position and caret.
    let bad = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: bad}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [spire.spiffe.io], apiVersions: [v1alpha1], operations: [CREATE], resources: [clusterspiffeids]}]
  validations:
  - expression: "request.userInfo.user == 'x'"
"#;
    let out = env
        .k
        .run_async(&["apply", "-f", "-"], Some(bad))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        out.contains("spec.validations[0].expression: Invalid value: \"request.userInfo.user == 'x'\": compilation failed: ERROR: <input>:1:17: undefined field 'user'\n | request.userInfo.user == 'x'\n | ................^"),
        "{out}"
    );
    // A field the ClusterSPIFFEID schema does not have is accepted and reported in the
    // policy's status, as kube-controller-manager's type-checking controller does.
    let typo = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: typo}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [spire.spiffe.io], apiVersions: [v1alpha1], operations: [CREATE], resources: [clusterspiffeids]}]
  validations:
  - expression: "object.spec.nosuchfield == 'x'"
  - expression: "has(object.spec.spiffeIDTemplate)"
"#;
    env.ok_stdin(&["create", "-f", "-"], typo).await;
    let warnings = env
        .ok(&[
            "get",
            "validatingadmissionpolicy",
            "typo",
            "-o",
            "jsonpath={.status.typeChecking}",
        ])
        .await;
    let warnings: serde_json::Value = serde_json::from_str(&warnings).unwrap();
    assert_eq!(
        warnings,
        serde_json::json!({"expressionWarnings": [{
            "fieldRef": "spec.validations[0].expression",
            "warning": "spire.spiffe.io/v1alpha1, Kind=ClusterSPIFFEID: ERROR: <input>:1:12: undefined field 'nosuchfield'\n | object.spec.nosuchfield == 'x'\n | ...........^\n",
        }]})
    );
    let observed = env
        .ok(&[
            "get",
            "validatingadmissionpolicy",
            "typo",
            "-o",
            "jsonpath={.metadata.generation} {.status.observedGeneration}",
        ])
        .await;
    assert_eq!(observed.trim(), "1 1");
}
