//! `docs/install.md`'s walkthrough, executed as written: every fenced block with the info
//! string `sh install-test` in the section "Walkthrough: a self-managed fleet, end to end"
//! runs in `bash`, in order, against two kubesim clusters (hub and `spoke-a`), with the real
//! `kleym`, `kubectl` and `helm` on `PATH`. The document names its inputs as environment
//! variables, which the test sets: `HUB_KUBECONFIG`, `SPOKE_KUBECONFIG` (admin kubeconfigs)
//! and `KLEYM_IMAGE`. The working directory holds `charts/` and `deploy/` of this checkout,
//! as a reader's checkout does.
//!
//! Two steps of the walkthrough need a real cluster's machinery, and only those are stood in
//! for, from what the document itself produced:
//! - `helm ... install ...`: kubesim serves no Deployments and runs no pods, so the same
//!   arguments go to `helm template`; every rendered object kubesim serves is applied with
//!   `kubectl`, and the rendered Deployment's container becomes a `kleym` process with the
//!   container's own arguments and environment: the mounted provider file is written from
//!   the rendered ConfigMap (its `/usr/local/bin/kleym` is this build's binary), the listen
//!   addresses are loopback ports, and the pod's in-cluster credentials are a kubeconfig
//!   with a token of the chart's ServiceAccount, so the hub runs with the chart's RBAC.
//!   `kubectl ... rollout status` waits for that process's `/readyz`.
//! - the spoke API server's `--authentication-config`: the file `kleym trust-config` wrote
//!   under `trust/<namespace>_<name>/` is loaded into the spoke as kube-apiserver loads it.
//!
//! The walkthrough must end with a converged fleet: every binding of the example
//! environment compiled into a ClusterSPIFFEID in the spoke, the spoke `Ready` in its
//! `ClusterIdentityStatus`, and the `FleetIdentityReport` counting it.

use crate::deploy_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use deploy_support::{documents, repo_root};
use kleym_api::hub_status::{ClusterIdentityStatus, FLEET_REPORT_NAME, FleetIdentityReport};
use kleym_e2e::fixtures::harness::wait_for;
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::fixtures::upstream_crds;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kubesim::kubeconfig::Credentials;
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECTION: &str = "## Walkthrough: a self-managed fleet, end to end";
const LIMIT: Duration = Duration::from_secs(60);
/// Kinds `helm template` renders that kubesim does not serve (see `deploy_helm.rs`).
const NOT_SERVED: [&str; 4] = [
    "Deployment",
    "Service",
    "ServiceMonitor",
    "PodDisruptionBudget",
];

/// The runnable blocks of the walkthrough section, in order.
fn runnable_blocks(markdown: &str) -> Vec<String> {
    let start = markdown
        .find(SECTION)
        .unwrap_or_else(|| panic!("docs/install.md has no section {SECTION:?}"));
    let section = &markdown[start + SECTION.len()..];
    let section = section.find("\n## ").map_or(section, |end| &section[..end]);
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in section.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```") => {
                if line.trim() == "```sh install-test" {
                    current = Some(String::new());
                } else if line.trim() != "```" {
                    // Another fenced block: skip to its end.
                    current = None;
                }
            }
            None => {}
            Some(block) if line.trim() == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// One step of a block: shell text run as is, or a command the test stands in for.
#[derive(Debug, PartialEq)]
enum Step {
    Shell(String),
    HelmInstall(String),
    RolloutStatus(String),
}

/// Splits a block at the commands the test stands in for (a `helm` command with its `\`
/// continuation lines; a `kubectl ... rollout status` line); the rest stays shell text.
fn steps(block: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut shell = String::new();
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("helm ") {
            let mut cmd = line.to_string();
            let mut last = line;
            while last.trim_end().ends_with('\\') {
                let Some(next) = lines.next() else { break };
                cmd.push('\n');
                cmd.push_str(next);
                last = next;
            }
            if !shell.is_empty() {
                out.push(Step::Shell(std::mem::take(&mut shell)));
            }
            out.push(Step::HelmInstall(cmd));
        } else if line.starts_with("kubectl ") && line.contains(" rollout status ") {
            if !shell.is_empty() {
                out.push(Step::Shell(std::mem::take(&mut shell)));
            }
            out.push(Step::RolloutStatus(line.to_string()));
        } else {
            shell.push_str(line);
            shell.push('\n');
        }
    }
    if !shell.trim().is_empty() {
        out.push(Step::Shell(shell));
    }
    out
}

/// Where the walkthrough runs.
struct World {
    sim: Kubesim,
    hub: ClusterHandle,
    work: PathBuf,
    env: Vec<(String, String)>,
    kleym: PathBuf,
    helm: PathBuf,
    kubectl: PathBuf,
    hub_process: Option<tokio::process::Child>,
    health_addr: Option<std::net::SocketAddr>,
    applied_authn: BTreeSet<PathBuf>,
}

impl World {
    /// Runs `script` in bash (`-euo pipefail`) in the work directory; panics with its output
    /// when it fails.
    async fn bash(&self, script: &str) -> String {
        let out = tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&self.work)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("HELM_CONFIG_HOME", self.work.join(".helm/config"))
            .env("HELM_CACHE_HOME", self.work.join(".helm/cache"))
            .env("HELM_DATA_HOME", self.work.join(".helm/data"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("spawn bash");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "the walkthrough failed ({}) at:\n{script}\nstdout: {stdout}\nstderr: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.hub_log_tail()
        );
        stdout
    }

    fn hub_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.work.join("hub.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("\nhub log (last lines):\n{}", tail.join("\n"))
    }

    /// The words of a shell command after the shell's expansion (variables, quotes,
    /// continuation lines), as the command would receive them.
    async fn words(&self, command: &str) -> Vec<String> {
        let out = self
            .bash(&format!("set -- {command}\nprintf '%s\\0' \"$@\""))
            .await;
        out.split('\0')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// `helm ... install RELEASE CHART ...`: the same arguments to `helm template`, the
    /// served objects applied with kubectl, the Deployment's container run as a process.
    async fn helm_install(&mut self, command: &str) {
        let words = self.words(command).await;
        assert_eq!(words.first().map(String::as_str), Some("helm"), "{words:?}");
        let mut args: Vec<String> = Vec::new();
        let mut namespace = "default".to_string();
        let mut create_namespace = false;
        let mut i = 1;
        while i < words.len() {
            let w = &words[i];
            match w.as_str() {
                "install" => args.push("template".into()),
                "--kubeconfig" => i += 1,
                _ if w.starts_with("--kubeconfig=") => {}
                "--create-namespace" => create_namespace = true,
                "--wait" => {}
                "-n" | "--namespace" => {
                    namespace = words.get(i + 1).cloned().unwrap_or_default();
                    args.push(w.clone());
                    args.push(namespace.clone());
                    i += 1;
                }
                _ => args.push(w.clone()),
            }
            i += 1;
        }
        assert!(
            args.first().is_some_and(|a| a == "template"),
            "only `helm install` is stood in for: {words:?}"
        );
        let out = tokio::process::Command::new(&self.helm)
            .args(&args)
            .current_dir(&self.work)
            .env("HELM_CONFIG_HOME", self.work.join(".helm/config"))
            .env("HELM_CACHE_HOME", self.work.join(".helm/cache"))
            .env("HELM_DATA_HOME", self.work.join(".helm/data"))
            .env_remove("KUBECONFIG")
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = documents(&String::from_utf8_lossy(&out.stdout)).unwrap();
        if create_namespace {
            self.bash(&format!(
                "kubectl --kubeconfig \"$HUB_KUBECONFIG\" create namespace {namespace}"
            ))
            .await;
        }
        let served: Vec<&Value> = rendered
            .iter()
            .filter(|d| !NOT_SERVED.contains(&d["kind"].as_str().unwrap_or_default()))
            .collect();
        // JSON documents are YAML documents.
        let file = self.work.join("rendered-served.yaml");
        let stream: Vec<String> = served.iter().map(|d| d.to_string()).collect();
        std::fs::write(&file, stream.join("\n---\n")).unwrap();
        self.bash(&format!(
            "kubectl --kubeconfig \"$HUB_KUBECONFIG\" apply -n {namespace} -f {}",
            file.display()
        ))
        .await;
        let deployment = rendered
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("the chart renders a Deployment");
        self.run_deployment(deployment, &rendered, &namespace).await;
    }

    /// Runs the Deployment's first container as a process (see the module docs).
    async fn run_deployment(&mut self, deployment: &Value, rendered: &[Value], namespace: &str) {
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        // Volumes from ConfigMaps become directories of files.
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = m["name"].as_str().unwrap();
            let mount_path = m["mountPath"].as_str().unwrap().to_string();
            let volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .unwrap();
            let dir = self.work.join("pod").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(cm) = volume["configMap"]["name"].as_str() {
                let cm = rendered
                    .iter()
                    .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == cm)
                    .unwrap_or_else(|| panic!("ConfigMap {cm} not rendered"));
                for (key, value) in cm["data"].as_object().unwrap() {
                    let text = value
                        .as_str()
                        .unwrap()
                        .replace("/usr/local/bin/kleym", self.kleym.to_str().unwrap());
                    std::fs::write(dir.join(key), text).unwrap();
                }
            }
            mounts.push((mount_path, dir));
        }
        // The longest mount path first, so nested mounts win.
        mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        let health = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut args: Vec<String> = Vec::new();
        for a in container["args"].as_array().unwrap() {
            let mut a = a.as_str().unwrap().to_string();
            if let Some((flag, value)) = a.split_once('=') {
                let value = match flag {
                    "--health-addr" => health.to_string(),
                    "--metrics-addr" => metrics.to_string(),
                    _ => mounts
                        .iter()
                        .find_map(|(path, dir)| {
                            value
                                .strip_prefix(path.as_str())
                                .map(|rest| format!("{}{rest}", dir.display()))
                        })
                        .unwrap_or_else(|| value.to_string()),
                };
                a = format!("{flag}={value}");
            }
            args.push(a);
        }
        // The pod's credentials: a token of its ServiceAccount, as the kubelet mounts one.
        let sa = pod["serviceAccountName"].as_str().unwrap();
        let token = self
            .hub
            .issue_sa_token(namespace, sa, &[], Duration::from_secs(3600), None)
            .await
            .unwrap();
        let kubeconfig = self.work.join("pod").join("in-cluster.kubeconfig");
        std::fs::write(
            &kubeconfig,
            self.hub.kubeconfig_yaml_with(Credentials::Token(token)),
        )
        .unwrap();
        let log = std::fs::File::create(self.work.join("hub.log")).unwrap();
        let mut command = tokio::process::Command::new(&self.kleym);
        command
            .args(&args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", &kubeconfig)
            .env("NO_COLOR", "1")
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap();
            let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::String(f)) if f == "metadata.name" => "kleym-hub-walkthrough-0".into(),
                other => panic!("env {name}: {other:?} is not stood in for"),
            };
            command.env(name, value);
        }
        self.hub_process = Some(command.spawn().expect("spawn kleym"));
        self.health_addr = Some(health);
    }

    /// `kubectl rollout status`: the hub process answers `/readyz` with 200.
    async fn rollout_status(&mut self) {
        let addr = self
            .health_addr
            .expect("rollout status before helm install");
        let ready = wait_for("the hub's /readyz", LIMIT, || async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).await.ok()?;
            out.starts_with("HTTP/1.1 200").then_some(())
        })
        .await;
        if let Err(e) = ready {
            panic!("{e}{}", self.hub_log_tail());
        }
    }

    /// Loads every `trust/<namespace>_<name>/authentication-config.yaml` not loaded yet into
    /// the spoke `<name>`, as its API server's `--authentication-config`.
    fn load_authentication_configs(&mut self) {
        let Ok(dirs) = std::fs::read_dir(self.work.join("trust")) else {
            return;
        };
        for d in dirs {
            let d = d.unwrap().path();
            let file = d.join("authentication-config.yaml");
            if !file.is_file() || self.applied_authn.contains(&file) {
                continue;
            }
            let dir_name = d.file_name().unwrap().to_string_lossy().into_owned();
            let (_, spoke) = dir_name.split_once('_').unwrap();
            let cluster = self
                .sim
                .cluster(spoke)
                .unwrap_or_else(|| panic!("trust-config wrote {dir_name}: no such spoke"));
            cluster
                .set_authentication_config(&std::fs::read_to_string(&file).unwrap())
                .unwrap_or_else(|e| panic!("{}: the spoke refuses it: {e}", file.display()));
            self.applied_authn.insert(file);
        }
    }
}

#[test]
fn the_runnable_blocks_are_found_and_split_at_the_stand_ins() {
    let text = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
    let blocks = runnable_blocks(&text);
    assert!(blocks.len() >= 4, "{blocks:?}");
    let all: Vec<Step> = blocks.iter().flat_map(|b| steps(b)).collect();
    let helm = all
        .iter()
        .filter(|s| matches!(s, Step::HelmInstall(_)))
        .count();
    let rollout = all
        .iter()
        .filter(|s| matches!(s, Step::RolloutStatus(_)))
        .count();
    assert_eq!((helm, rollout), (1, 1), "{all:?}");
    assert_eq!(
        steps(
            "a \\\n  b\nhelm install x \\\n  --set a=b\nkubectl -n x rollout status deployment/y\nc\n"
        ),
        vec![
            Step::Shell("a \\\n  b\n".into()),
            Step::HelmInstall("helm install x \\\n  --set a=b".into()),
            Step::RolloutStatus("kubectl -n x rollout status deployment/y".into()),
            Step::Shell("c\n".into()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_walkthrough_reaches_a_converged_fleet_and_a_report() {
    let text = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
    let blocks = runnable_blocks(&text);
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().to_path_buf();
    for d in ["charts", "deploy"] {
        std::os::unix::fs::symlink(repo_root().join(d), work.join(d)).unwrap();
    }
    // Both clusters serve what the walkthrough takes as given (GAIE, SPIRE Controller
    // Manager, ClusterProfile), and none of kleym's CRDs: the walkthrough installs those.
    let sim = Kubesim::start(
        &["hub", "spoke-a"],
        KubesimOptions {
            crds: upstream_crds().unwrap(),
            ..KubesimOptions::default()
        },
    )
    .await
    .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let spoke = sim.cluster("spoke-a").unwrap();
    std::fs::write(work.join("hub.kubeconfig"), hub.kubeconfig_yaml()).unwrap();
    std::fs::write(work.join("spoke-a.kubeconfig"), spoke.kubeconfig_yaml()).unwrap();
    let kleym = kleym_binary().unwrap();
    let kubectl = test_tools::require(test_tools::Tool::Kubectl);
    let helm = test_tools::require(test_tools::Tool::Helm);
    let path = [&kleym, &kubectl, &helm]
        .iter()
        .map(|p| p.parent().unwrap().display().to_string())
        .chain(std::env::var("PATH").ok())
        .collect::<Vec<_>>()
        .join(":");
    let env = vec![
        ("PATH".to_string(), path),
        (
            "HUB_KUBECONFIG".to_string(),
            work.join("hub.kubeconfig").display().to_string(),
        ),
        (
            "SPOKE_KUBECONFIG".to_string(),
            work.join("spoke-a.kubeconfig").display().to_string(),
        ),
        (
            "KLEYM_IMAGE".to_string(),
            "registry.example.com/kleym".to_string(),
        ),
    ];
    let mut world = World {
        sim,
        hub: hub.clone(),
        work: work.clone(),
        env,
        kleym,
        helm,
        kubectl,
        hub_process: None,
        health_addr: None,
        applied_authn: BTreeSet::new(),
    };
    assert!(world.kubectl.is_file());
    for block in &blocks {
        for step in steps(block) {
            match step {
                Step::Shell(script) => {
                    world.bash(&script).await;
                }
                Step::HelmInstall(cmd) => world.helm_install(&cmd).await,
                Step::RolloutStatus(_) => world.rollout_status().await,
            }
            world.load_authentication_configs();
        }
    }
    assert!(
        world.hub_process.is_some(),
        "the walkthrough never installed the hub"
    );
    assert_eq!(
        world.applied_authn.len(),
        1,
        "trust-config wrote one spoke's authentication config"
    );

    // Converged: every binding of the example environment has its ClusterSPIFFEID, the
    // spoke is Ready with them all ready, and the fleet report counts it.
    let environment =
        std::fs::read_to_string(repo_root().join("deploy/examples/gaie/environment.yaml")).unwrap();
    let bindings = documents(&environment)
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "InferenceIdentityBinding")
        .count();
    assert!(bindings > 0);
    let hub_client = hub.kube_client().await.unwrap();
    let spoke_client = spoke.kube_client().await.unwrap();
    let spiffeids = ApiResource {
        group: "spire.spiffe.io".into(),
        version: "v1alpha1".into(),
        api_version: "spire.spiffe.io/v1alpha1".into(),
        kind: "ClusterSPIFFEID".into(),
        plural: "clusterspiffeids".into(),
    };
    let converged = wait_for("the spoke converged and reported", LIMIT, || {
        let (hub_client, spoke_client, spiffeids) =
            (hub_client.clone(), spoke_client.clone(), spiffeids.clone());
        async move {
            let ids = Api::<DynamicObject>::all_with(spoke_client, &spiffeids)
                .list(&Default::default())
                .await
                .ok()?;
            let status = Api::<ClusterIdentityStatus>::namespaced(hub_client.clone(), "fleet")
                .get_opt("spoke-a")
                .await
                .ok()??
                .status?;
            let report = Api::<FleetIdentityReport>::all(hub_client)
                .get_opt(FLEET_REPORT_NAME)
                .await
                .ok()??
                .status?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ids.items.len() == bindings
                && ready
                && status.bindings.ready == bindings as i64
                && report.clusters.ready == 1
                && report.bindings == bindings as i64)
                .then_some((status, report))
        }
    })
    .await;
    let (status, report) = match converged {
        Ok(v) => v,
        Err(e) => panic!("{e}{}", world.hub_log_tail()),
    };
    assert_eq!(status.bindings.total, bindings as i64, "{status:?}");
    assert_eq!(report.finding_counts.collisions, 0, "{report:?}");
    if let Some(mut child) = world.hub_process.take() {
        let _ = child.kill().await;
    }
}
