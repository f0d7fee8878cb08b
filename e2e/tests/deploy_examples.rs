//! Every manifest under `deploy/` is accepted by an API server with every CRD installed
//! (`kubectl apply --dry-run=server` against kubesim), the example provider file loads as
//! the hub loads it, and the one binding of the hub's identity in a spoke is the one `kleym
//! trust-config` prints, granting exactly `deploy/spoke/`'s ClusterRole.

use crate::deploy_support;

use std::path::{Path, PathBuf};

use deploy_support::{documents, repo_root};
use kleym_e2e::fixtures::all_crds;
use kubesim::testing::Kubectl;
use kubesim::{Kubesim, KubesimOptions};

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml")
            && p.file_name().is_some_and(|n| n != "kustomization.yaml")
            && !p.starts_with(repo_root().join("deploy/examples/providers"))
        {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deploy_manifest_passes_server_side_dry_run() {
    // The ClusterProfile CRD as cluster-inventory-api v0.2.0 ships it (v1alpha1 and
    // v1alpha2), so the v1alpha2 examples are checked against v1alpha2's rules.
    let two_versions = kubesim::parse_crds(
        "clusterprofiles",
        upstream_crds::CLUSTERPROFILE_V1ALPHA2.yaml,
    )
    .unwrap();
    let mut crds: Vec<serde_json::Value> = all_crds()
        .unwrap()
        .into_iter()
        .filter(|c| c["metadata"]["name"] != "clusterprofiles.multicluster.x-k8s.io")
        .collect();
    crds.extend(two_versions);
    let sim = Kubesim::start(
        &["c"],
        KubesimOptions {
            crds,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = sim.cluster("c").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::admin(&c, dir.path()).expect("kubectl is required for this test");
    // Namespaces the examples live in (a dry run does not create them).
    for ns in ["fleet", "inventory-capi", "kleym-system", "llm"] {
        k.run_async(&["create", "namespace", ns], None)
            .await
            .unwrap();
    }
    let mut files = Vec::new();
    yaml_files(&repo_root().join("deploy"), &mut files);
    assert!(files.len() >= 10, "{files:?}");
    let mut checked = 0;
    for f in &files {
        let path = f.display().to_string();
        for doc in documents(&std::fs::read_to_string(f).unwrap()).unwrap() {
            // kubesim serves no workload API (apps/v1): Deployments are checked by the chart
            // test's and deploy/spoke's own tests, not here.
            if doc["kind"] == "Deployment" {
                continue;
            }
            let body = serde_json::to_string(&doc).unwrap();
            let out = k
                .run_async(&["apply", "--dry-run=server", "-f", "-"], Some(&body))
                .await
                .unwrap_or_else(|e| panic!("{path} {}: {e:?}", doc["metadata"]["name"]));
            assert!(out.contains("(server dry run)"), "{path}: {out}");
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} objects checked");
    // The GAIE example is also valid for real, and every binding compiles in kleym's eyes
    // only later (the reconciler's tests); here: it is stored as written.
    let gaie = repo_root().join("deploy/examples/gaie/environment.yaml");
    k.run_async(&["apply", "-f", &gaie.to_string_lossy()], None)
        .await
        .unwrap();
    let got = k
        .run_async(
            &[
                "get",
                "inferenceidentitybindings",
                "-n",
                "llm",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(got.lines().count(), 3, "{got}");
}

#[test]
fn example_provider_file_loads_like_the_hub_loads_it() {
    let pf = repo_root().join("deploy/examples/providers/providers.yaml");
    let args = kleym_e2e::fixtures::harness::parse_hub_args(&[
        "--clusterprofile-provider-file".into(),
        pf.to_string_lossy().into(),
    ])
    .unwrap();
    args.access.provider_set().expect("example provider file");
    // Every provider an example ClusterProfile names is configured.
    let text = std::fs::read_to_string(&pf).unwrap();
    let file: serde_json::Value = kleym_api::yaml::from_str(&text).unwrap();
    let names: Vec<&str> = file["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let mut profiles = Vec::new();
    yaml_files(
        &repo_root().join("deploy/examples/clusterprofiles"),
        &mut profiles,
    );
    for f in profiles {
        for d in documents(&std::fs::read_to_string(&f).unwrap()).unwrap() {
            if d["kind"] != "ClusterProfile" {
                continue;
            }
            // `by-hand.yaml` has no status: its providers are patched in (docs/install.md).
            for p in d["status"]["accessProviders"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let n = p["name"].as_str().unwrap();
                assert!(
                    names.contains(&n),
                    "{}: provider {n} not in providers.yaml",
                    f.display()
                );
            }
        }
    }
}

/// One source of truth for the hub's access to a spoke: `kleym trust-config` prints the
/// ClusterRoleBinding of the hub's identity (its subject depends on the credential method),
/// binding exactly `deploy/spoke/`'s ClusterRole; no manifest under `deploy/` or the chart
/// defines a binding of that name, which would overwrite it (or be overwritten) on apply.
#[test]
fn the_hub_access_binding_comes_from_trust_config_alone() {
    use kleym_hub::issuer::trust::{BINDING_NAME, SPOKE_CLUSTER_ROLE_YAML};
    let role: serde_json::Value = kleym_api::yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/spoke/clusterrole.yaml")).unwrap(),
    )
    .unwrap();
    let embedded: serde_json::Value = kleym_api::yaml::from_str(SPOKE_CLUSTER_ROLE_YAML).unwrap();
    assert_eq!(
        embedded, role,
        "trust-config embeds deploy/spoke/clusterrole.yaml"
    );
    let mut files = Vec::new();
    yaml_files(&repo_root().join("deploy"), &mut files);
    for f in &files {
        for d in documents(&std::fs::read_to_string(f).unwrap()).unwrap() {
            assert!(
                !(d["kind"] == "ClusterRoleBinding" && d["metadata"]["name"] == BINDING_NAME),
                "{}: a second source of the ClusterRoleBinding {BINDING_NAME}",
                f.display()
            );
        }
    }
    // The chart's templates name the hub's own bindings `<fullname>-hub...`: none may be
    // the spoke-access binding's name (a hub cluster can be its own spoke).
    for entry in std::fs::read_dir(repo_root().join("charts/kleym/templates")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(
            !text.contains(BINDING_NAME),
            "chart template names {BINDING_NAME}"
        );
    }
    // No second copy of the rules anywhere under deploy/ (the chart's copy is tested in
    // deploy_chart.rs): only deploy/spoke defines a ClusterRole that is not aggregated into
    // the user-facing roles, and those of deploy/tenant-access/ grant nothing on the
    // objects only kleym writes.
    let mut roles = Vec::new();
    for f in &files {
        for d in documents(&std::fs::read_to_string(f).unwrap()).unwrap() {
            if d["kind"] != "ClusterRole" {
                continue;
            }
            let aggregated = d["metadata"]["labels"].as_object().is_some_and(|l| {
                l.keys()
                    .any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
            });
            if !aggregated {
                roles.push(f.clone());
                continue;
            }
            for rule in d["rules"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    assert_eq!(
                        r.as_str().unwrap().split('/').next(),
                        Some("inferenceidentitybindings"),
                        "{}: an aggregated role grants {r}",
                        f.display()
                    );
                }
                let verbs = rule["verbs"].as_array().unwrap();
                if rule["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r.as_str().unwrap().ends_with("/status"))
                {
                    assert!(
                        verbs
                            .iter()
                            .all(|v| ["get", "list", "watch"].contains(&v.as_str().unwrap())),
                        "{}: status writable through aggregation: {rule}",
                        f.display()
                    );
                }
            }
        }
    }
    // ...and the optional explain reader role, embedded as trust-config prints it.
    assert_eq!(
        roles,
        vec![
            repo_root().join("deploy/spoke/clusterrole.yaml"),
            repo_root().join("deploy/spoke/explain-clusterrole.yaml")
        ]
    );
    let explain: serde_json::Value = kleym_api::yaml::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/spoke/explain-clusterrole.yaml"))
            .unwrap(),
    )
    .unwrap();
    let embedded: serde_json::Value =
        kleym_api::yaml::from_str(kleym_hub::issuer::trust::EXPLAIN_CLUSTER_ROLE_YAML).unwrap();
    assert_eq!(embedded, explain, "trust-config embeds the explain role");
}

/// The plain single-cluster Deployment matches what the chart renders for it: the spoke has
/// no leader election, so an update must stop the old pod first (`Recreate`); the probes use
/// their own port (`--health-addr`), apart from `/metrics`; and the arguments are ones
/// `kleym spoke` accepts (it parses them, then stops at the missing kubeconfig).
#[test]
fn the_plain_spoke_deployment_recreates_probes_its_health_port_and_parses() {
    let path = repo_root().join("deploy/spoke/deployment.yaml");
    let docs = documents(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    let port_of = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("port {name}"))["containerPort"]
            .as_i64()
            .unwrap()
    };
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert!(args.contains(&format!("--health-addr=0.0.0.0:{}", port_of("health"))));
    assert!(args.contains(&format!("--metrics-addr=0.0.0.0:{}", port_of("metrics"))));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "health", "{probe}");
    }
    deploy_support::assert_kleym_accepts(&args);
}
