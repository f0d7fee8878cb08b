//! Conformance: the real kubectl against a CRD that serves two versions — the vendored
//! ClusterProfile CRD of cluster-inventory-api v0.2.0 (v1alpha1 storage, v1alpha2 served,
//! `None` conversion) — installed over its v1alpha1-only predecessor while kubesim runs.

use kubesim::testing::Kubectl;
use kubesim::{Kubesim, KubesimOptions};
use serde_json::Value;

const CRD: &str = "crd/clusterprofiles.multicluster.x-k8s.io";
const V2: &str = "clusterprofiles.v1alpha2.multicluster.x-k8s.io";
const V1: &str = "clusterprofiles.v1alpha1.multicluster.x-k8s.io";
const BAD_SERVER: &str = "status.accessProviders[0].cluster.server: Invalid value: \"string\": server must be a valid absolute URL with a host";

struct Env {
    _sim: Kubesim,
    k: Kubectl,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let sim = Kubesim::start(&["hub"], KubesimOptions::default())
            .await
            .expect("kubesim starts");
        let dir = tempfile::tempdir().unwrap();
        let cluster = sim.cluster("hub").unwrap();
        let k = Kubectl::admin(&cluster, dir.path()).expect("kubectl is required for these tests");
        Env {
            _sim: sim,
            k,
            _dir: dir,
        }
    }

    async fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.k
            .run_async(args, stdin)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a, None).await).unwrap()
    }

    /// Install the v1alpha1-only CRD, then apply the two-version one over it.
    async fn install_two_versions(&self) {
        let v1_only =
            upstream_crds::upstream_dir().join("multicluster.x-k8s.io_clusterprofiles.yaml");
        let out = self
            .ok(&["apply", "-f", v1_only.to_str().unwrap()], None)
            .await;
        assert!(out.contains("created"), "{out}");
        self.ok(
            &["wait", "--for=condition=Established", "--timeout=20s", CRD],
            None,
        )
        .await;
        let versions = self.ok(&["api-versions"], None).await;
        assert!(
            versions.contains("multicluster.x-k8s.io/v1alpha1"),
            "{versions}"
        );
        assert!(
            !versions.contains("multicluster.x-k8s.io/v1alpha2"),
            "{versions}"
        );

        let both = upstream_crds::clusterprofile_v1alpha2_dir()
            .join(upstream_crds::CLUSTERPROFILE_V1ALPHA2.name);
        let out = self
            .ok(&["apply", "-f", both.to_str().unwrap()], None)
            .await;
        assert!(out.contains("configured"), "{out}");
        // Discovery (re-read by api-versions and api-resources) lists v1alpha2 at once.
        let versions = self.ok(&["api-versions"], None).await;
        assert!(
            versions.contains("multicluster.x-k8s.io/v1alpha1"),
            "{versions}"
        );
        assert!(
            versions.contains("multicluster.x-k8s.io/v1alpha2"),
            "{versions}"
        );
        let res = self
            .ok(
                &[
                    "api-resources",
                    "--api-group=multicluster.x-k8s.io",
                    "-o",
                    "wide",
                ],
                None,
            )
            .await;
        assert!(res.contains("multicluster.x-k8s.io/v1alpha2"), "{res}");
    }
}

fn profile(name: &str, status_server: Option<&str>) -> String {
    let mut y = format!(
        "apiVersion: multicluster.x-k8s.io/v1alpha2\nkind: ClusterProfile\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  displayName: {name}\n  clusterManager: {{name: kleym}}\n"
    );
    if let Some(s) = status_server {
        y.push_str(&format!(
            "status:\n  accessProviders:\n  - name: kubeconfig\n    cluster: {{server: \"{s}\"}}\n"
        ));
    }
    y
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_v1alpha2_clusterprofiles_after_crd_upgrade() {
    let env = Env::start().await;
    env.install_two_versions().await;
    let out = env
        .ok(&["apply", "-f", "-"], Some(&profile("spoke-1", None)))
        .await;
    assert!(out.contains("created"), "{out}");

    let table = env.ok(&["get", V2, "-A"], None).await;
    let header = table.lines().next().unwrap_or_default();
    for col in ["NAMESPACE", "NAME", "DISPLAY NAME", "MANAGER", "AGE"] {
        assert!(header.contains(col), "{table}");
    }
    assert!(
        table.contains("spoke-1") && table.contains("kleym"),
        "{table}"
    );

    let as_v2 = env.json(&["get", V2, "spoke-1"]).await;
    assert_eq!(as_v2["apiVersion"], "multicluster.x-k8s.io/v1alpha2");
    let as_v1 = env.json(&["get", V1, "spoke-1"]).await;
    assert_eq!(as_v1["apiVersion"], "multicluster.x-k8s.io/v1alpha1");
    assert_eq!(as_v1["spec"]["clusterManager"]["name"], "kleym");
    // Unqualified, kubectl uses the group's preferred version: the highest by Kubernetes'
    // version priority (v1alpha2), not the storage version.
    let preferred = env.json(&["get", "clusterprofiles", "spoke-1"]).await;
    assert_eq!(preferred["apiVersion"], "multicluster.x-k8s.io/v1alpha2");

    // Removing v1alpha2 from the CRD takes it out of discovery again.
    let v1_only = upstream_crds::upstream_dir().join("multicluster.x-k8s.io_clusterprofiles.yaml");
    env.ok(&["apply", "-f", v1_only.to_str().unwrap()], None)
        .await;
    let versions = env.ok(&["api-versions"], None).await;
    assert!(
        !versions.contains("multicluster.x-k8s.io/v1alpha2"),
        "{versions}"
    );
    assert!(env.k.run_async(&["get", V2, "-A"], None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_status_writes_through_v1alpha2_are_validated_with_its_rules() {
    let env = Env::start().await;
    env.install_two_versions().await;

    // Client-side apply writes the main resource only: with a status subresource the
    // status in the manifest is dropped on create (as kube-apiserver's strategy does),
    // so even an invalid server is not validated here.
    let out = env
        .ok(
            &["apply", "-f", "-"],
            Some(&profile("spoke-1", Some("not-a-url"))),
        )
        .await;
    assert!(out.contains("created"), "{out}");
    let got = env.json(&["get", V2, "spoke-1"]).await;
    assert!(got.get("status").is_none(), "{got}");

    // Server-side apply of the status subresource validates status with v1alpha2's rules.
    let err = env
        .k
        .run_async(
            &["apply", "--server-side", "--subresource=status", "-f", "-"],
            Some(&profile("spoke-1", Some("not-a-url"))),
        )
        .await
        .expect_err("an invalid server must be rejected");
    assert!(err.stderr.contains(BAD_SERVER), "{}", err.stderr);
    assert!(err.stderr.contains("is invalid"), "{}", err.stderr);

    // So does a merge patch of the status subresource.
    let err = env
        .k
        .run_async(
            &[
                "patch",
                V2,
                "spoke-1",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"accessProviders":[{"name":"kubeconfig","cluster":{"server":"localhost:6443"}}]}}"#,
            ],
            None,
        )
        .await
        .expect_err("a server without a host must be rejected");
    assert!(err.stderr.contains(BAD_SERVER), "{}", err.stderr);

    // A valid server is written, and is visible through v1alpha1 too.
    env.ok(
        &["apply", "--server-side", "--subresource=status", "-f", "-"],
        Some(&profile("spoke-1", Some("https://spoke-1.example:6443"))),
    )
    .await;
    let as_v1 = env.json(&["get", V1, "spoke-1"]).await;
    assert_eq!(
        as_v1["status"]["accessProviders"][0]["cluster"]["server"],
        "https://spoke-1.example:6443"
    );

    // An invalid clusterManager.name is rejected through v1alpha2 on the main resource.
    let bad = profile("spoke-2", None).replace("{name: kleym}", "{name: \"not a label\"}");
    let err = env
        .k
        .run_async(&["apply", "-f", "-"], Some(&bad))
        .await
        .expect_err("an invalid label value must be rejected");
    assert!(
        err.stderr.contains("spec.clusterManager.name: Invalid value: \"string\": must be a valid Kubernetes label value"),
        "{}",
        err.stderr
    );
}
