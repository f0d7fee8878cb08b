//! A hub cluster plus spokes on kubesim, and an in-process `kleym hub` on it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use kleym_hub::runtime::{HubArgs, HubHandle, start_hub};
use kleym_spoke::reconciler::CancellationToken;
use kubesim_store::WriteOptions;
use serde_json::json;

use super::all_crds;
use super::profiles::create_profile_namespace;
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};

/// Namespace of the hub's own objects (ServiceAccount, Secrets, Lease).
pub const HUB_NS: &str = "kleym";
/// The hub's ServiceAccount (for `kleym credential token-request`).
pub const HUB_SA: &str = "hub";

#[derive(Parser)]
struct ArgsWrapper {
    #[command(flatten)]
    args: HubArgs,
}

/// Parses `kleym hub` flags.
pub fn parse_hub_args(flags: &[String]) -> Result<HubArgs, String> {
    let argv = std::iter::once("kleym".to_string()).chain(flags.iter().cloned());
    ArgsWrapper::try_parse_from(argv)
        .map(|w| w.args)
        .map_err(|e| e.to_string())
}

/// The simulated fleet.
pub struct FleetHarness {
    /// The simulator (keep it alive).
    pub sim: Kubesim,
    /// The hub cluster.
    pub hub: ClusterHandle,
    /// Admin client of the hub cluster.
    pub hub_client: kube::Client,
    /// Work directory (kubeconfigs, scripts, provider files).
    pub dir: PathBuf,
}

/// A running in-process hub.
pub struct RunningHub {
    /// Its handle (state, metrics, credentials).
    pub handle: HubHandle,
    /// Cancel to stop it.
    pub shutdown: CancellationToken,
}

impl RunningHub {
    /// Stops the hub and waits (bounded) for it.
    pub async fn stop(self) -> Result<(), String> {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.handle.task)
            .await
            .map_err(|_| "hub did not stop within 60s".to_string())?
            .map_err(|e| e.to_string())
    }
}

fn create_obj(
    cluster: &ClusterHandle,
    group: &str,
    version: &str,
    plural: &str,
    ns: Option<&str>,
    obj: serde_json::Value,
) -> Result<(), String> {
    let store = cluster.store();
    let res = store
        .resolve(group, version, plural)
        .ok_or_else(|| format!("{plural} not served"))?;
    match store.create(&res, ns, obj, &WriteOptions::default()) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("create {plural}: {}", e.message)),
    }
}

/// Binds `user` to `cluster-admin` in `cluster`.
pub fn grant_admin(cluster: &ClusterHandle, user: &str) -> Result<(), String> {
    let name = format!("kleym-e2e-{}", user.replace(':', "-"));
    create_obj(
        cluster,
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
        }),
    )
}

/// Creates a Secret in the hub namespace (for `kleym credential secret-reader`).
pub fn hub_secret(hub: &ClusterHandle, name: &str, token: &str) -> Result<(), String> {
    create_obj(
        hub,
        "",
        "v1",
        "secrets",
        Some(HUB_NS),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": HUB_NS},
               "stringData": {"token": token}}),
    )
}

impl FleetHarness {
    /// Starts `hub` plus `spokes` (all with every CRD), creates the profile namespace, the
    /// hub namespace and ServiceAccount, and writes the hub's admin kubeconfig into `dir`.
    pub async fn start(spokes: &[&str], dir: &Path) -> Result<Self, String> {
        let mut names = vec!["hub"];
        names.extend_from_slice(spokes);
        let sim = Kubesim::start(
            &names,
            KubesimOptions {
                crds: all_crds()?,
                ..KubesimOptions::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        let hub = sim.cluster("hub").ok_or("no hub")?;
        let hub_client = hub.kube_client().await.map_err(|e| e.to_string())?;
        create_profile_namespace(&hub_client)
            .await
            .map_err(|e| e.to_string())?;
        create_obj(
            &hub,
            "",
            "v1",
            "namespaces",
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HUB_NS}}),
        )?;
        create_obj(
            &hub,
            "",
            "v1",
            "serviceaccounts",
            Some(HUB_NS),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": HUB_SA, "namespace": HUB_NS}}),
        )?;
        std::fs::write(dir.join("hub.kubeconfig"), hub.kubeconfig_yaml())
            .map_err(|e| e.to_string())?;
        Ok(Self {
            sim,
            hub,
            hub_client,
            dir: dir.to_path_buf(),
        })
    }

    /// A spoke by name.
    pub fn spoke(&self, name: &str) -> ClusterHandle {
        self.sim
            .cluster(name)
            .unwrap_or_else(|| panic!("no cluster {name}"))
    }

    /// Path of the hub's admin kubeconfig.
    pub fn hub_kubeconfig(&self) -> PathBuf {
        self.dir.join("hub.kubeconfig")
    }

    /// The hub identity of `kleym credential token-request` (`system:serviceaccount:kleym:hub`).
    pub fn hub_sa_user() -> String {
        format!("system:serviceaccount:{HUB_NS}:{HUB_SA}")
    }

    /// Starts an in-process hub with `flags` (plus `--kubeconfig`-less wiring to the hub).
    pub async fn start_hub(&self, flags: &[String]) -> Result<RunningHub, String> {
        let args = parse_hub_args(flags)?;
        let shutdown = CancellationToken::new();
        let client = self.hub.kube_client().await.map_err(|e| e.to_string())?;
        let handle = start_hub(&args, client, shutdown.clone()).map_err(|e| format!("{e:#}"))?;
        Ok(RunningHub { handle, shutdown })
    }
}

/// Polls `check` every 50 ms until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {limit:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
