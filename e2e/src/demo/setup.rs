//! Setting the simulated fleet up: state directory, spoke RBAC and credentials, the spoke
//! environments, the provider file and the ClusterProfiles.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use crate::fixtures::harness::{FleetHarness, HUB_NS, HUB_SA, hub_secret};
use crate::fixtures::profiles::{access_provider, apply_profile, status};
use kubesim::ClusterHandle;
use kubesim_store::WriteOptions;
use serde_json::{Value, json};

use super::DemoError;
use super::scenario;

/// The spoke-side RBAC the hub's identity needs: the very ClusterRole of `deploy/spoke/`.
const SPOKE_CLUSTERROLE: &str = include_str!("../../../deploy/spoke/clusterrole.yaml");

/// Provider names in the provider file.
const TOKEN_REQUEST: &str = "kleym-token-request";
const SECRET_READER: &str = "kleym-secret-reader";

/// How to run the bundled credential plugins: the `kleym` binary, or the demo's own.
#[derive(Debug, Clone)]
pub struct PluginCommand {
    /// Executable.
    pub command: PathBuf,
}

impl PluginCommand {
    /// The `kleym` binary next to `exe` (`target/<profile>/kleym`), else `exe` itself.
    pub fn locate(exe: &Path) -> Self {
        let kleym = exe.parent().map(|d| d.join("kleym"));
        match kleym {
            Some(k) if k.is_file() => Self { command: k },
            _ => Self {
                command: exe.to_path_buf(),
            },
        }
    }

    /// For messages.
    pub fn display(&self) -> String {
        format!("{} credential …", self.command.display())
    }
}

/// Whether spoke `i` uses the secret-reader plugin (every third spoke), else token-request.
fn uses_secret_reader(i: usize) -> bool {
    i.is_multiple_of(3)
}

/// "token-request: spoke-1, spoke-2; secret-reader: spoke-3".
pub fn provider_summary(spokes: usize) -> String {
    let (sr, tr): (Vec<usize>, Vec<usize>) = (1..=spokes).partition(|i| uses_secret_reader(*i));
    let names = |v: &[usize]| {
        v.iter()
            .map(|i| scenario::spoke_name(*i))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = vec![format!("token-request for {}", names(&tr))];
    if !sr.is_empty() {
        parts.push(format!("secret-reader for {}", names(&sr)));
    }
    parts.join("; ")
}

fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    std::fs::write(path, content)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// `DIR/<cluster>/{kubeconfig,ca.crt,server}` for every cluster and `DIR/kubeconfig` with all
/// contexts (admin credentials, mode 0600).
pub fn write_state_dir(fleet: &FleetHarness, dir: &Path) -> std::io::Result<()> {
    for c in fleet.sim.clusters() {
        let d = dir.join(c.name());
        std::fs::create_dir_all(&d)?;
        write_private(&d.join("kubeconfig"), &c.kubeconfig_yaml())?;
        std::fs::write(d.join("ca.crt"), c.ca_pem())?;
        std::fs::write(d.join("server"), c.url())?;
    }
    write_private(&dir.join("kubeconfig"), &fleet.sim.kubeconfig_yaml())
}

fn create(cluster: &ClusterHandle, seed: &scenario::Seed) -> Result<(), DemoError> {
    let (group, version, plural, ns, body) = seed;
    let store = cluster.store();
    let res = store.resolve(group, version, plural).ok_or_else(|| {
        DemoError::Setup(format!(
            "{}: {group}/{version} {plural} is not served",
            cluster.name()
        ))
    })?;
    match store.create(&res, *ns, body.clone(), &WriteOptions::default()) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(DemoError::Setup(format!(
            "{}: create {plural}: {}",
            cluster.name(),
            e.message
        ))),
    }
}

/// RBAC, credentials and the inference environment of spoke `i`.
pub async fn prepare_spoke(fleet: &FleetHarness, i: usize, _dir: &Path) -> Result<(), DemoError> {
    let spoke = fleet.spoke(&scenario::spoke_name(i));
    let role: Value = kleym_api::yaml::from_str(SPOKE_CLUSTERROLE)
        .map_err(|e| DemoError::Setup(format!("deploy/spoke/clusterrole.yaml: {e}")))?;
    let role_name = role["metadata"]["name"]
        .as_str()
        .unwrap_or("kleym-spoke")
        .to_string();
    create(
        &spoke,
        &(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            None,
            role,
        ),
    )?;
    let subject = if uses_secret_reader(i) {
        // A static token known to the spoke, stored in the hub as Secret kleym/<spoke>.
        let token = format!("demo-{}", uuid::Uuid::new_v4().simple());
        spoke.add_static_token(
            &token,
            kubesim_auth::UserInfo {
                username: "kleym-hub".into(),
                ..Default::default()
            },
        );
        hub_secret(&fleet.hub, spoke.name(), &token).map_err(DemoError::Setup)?;
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kleym-hub"})
    } else {
        // The spoke trusts the hub's ServiceAccount issuer for its own audience only: the one
        // the hub derives from its ClusterProfile.
        let audience = kleym_hub::access::audience::derived_audience(
            crate::fixtures::profiles::PROFILE_NS,
            spoke.name(),
        );
        spoke
            .trust_issuer(&fleet.hub, &[audience])
            .await
            .map_err(|e| DemoError::Setup(e.to_string()))?;
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
               "name": format!("system:serviceaccount:{HUB_NS}:{HUB_SA}")})
    };
    create(
        &spoke,
        &(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            None,
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "kleym-hub"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                "subjects": [subject]
            }),
        ),
    )?;
    for seed in scenario::spoke_objects(i) {
        create(&spoke, &seed)?;
    }
    Ok(())
}

/// `DIR/providers.json`: the two bundled plugins, in the Go reference library's format.
pub fn write_provider_file(dir: &Path, plugin: &PluginCommand) -> Result<PathBuf, DemoError> {
    let cmd = plugin.command.to_string_lossy().to_string();
    let hub_kc = dir
        .join("hub")
        .join("kubeconfig")
        .to_string_lossy()
        .to_string();
    let file = json!({"providers": [
        {"name": TOKEN_REQUEST, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": cmd,
            "args": ["credential", "token-request", "--service-account", format!("{HUB_NS}/{HUB_SA}"), "--kubeconfig", hub_kc],
            "provideClusterInfo": true, "interactiveMode": "Never"}},
        {"name": SECRET_READER, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": cmd,
            "args": ["credential", "secret-reader", "--namespace", HUB_NS, "--kubeconfig", hub_kc],
            "provideClusterInfo": true, "interactiveMode": "Never"}}
    ]});
    let path = dir.join("providers.json");
    let text = serde_json::to_string_pretty(&file).map_err(|e| DemoError::Setup(e.to_string()))?;
    std::fs::write(&path, text)?;
    Ok(path)
}

/// One healthy ClusterProfile per spoke, with the spoke's access provider.
pub async fn register_profiles(fleet: &FleetHarness, spokes: usize) -> Result<(), DemoError> {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    for i in 1..=spokes {
        let name = scenario::spoke_name(i);
        let spoke = fleet.spoke(&name);
        let provider = if uses_secret_reader(i) {
            access_provider(SECRET_READER, &spoke, Some(json!({"clusterName": name})))
        } else {
            access_provider(TOKEN_REQUEST, &spoke, None)
        };
        apply_profile(
            &fleet.hub_client,
            &name,
            status(vec![provider], true, &now, &[]),
        )
        .await
        .map_err(|e| DemoError::Setup(format!("ClusterProfile {name}: {e}")))?;
    }
    Ok(())
}
