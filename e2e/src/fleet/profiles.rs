//! ClusterProfiles pointing at kubesim spokes, written to the hub cluster.

use base64::Engine as _;
use kleym_api::external::clusterprofile::ClusterProfile;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use kubesim::ClusterHandle;

/// Namespace the fixtures put profiles in.
pub const PROFILE_NS: &str = "fleet";

/// One `status.accessProviders[]` entry for `spoke` (server URL and CA from kubesim), with an
/// optional `client.authentication.k8s.io/exec` extension payload.
pub fn access_provider(provider: &str, spoke: &ClusterHandle, exec_config: Option<Value>) -> Value {
    let ca = base64::engine::general_purpose::STANDARD.encode(spoke.ca_pem());
    let mut cluster = json!({"server": spoke.url(), "certificate-authority-data": ca});
    if let Some(cfg) = exec_config {
        cluster["extensions"] =
            json!([{"name": "client.authentication.k8s.io/exec", "extension": cfg}]);
    }
    json!({"name": provider, "cluster": cluster})
}

/// A profile status: the providers, `ControlPlaneHealthy` (with `heartbeat` as its time, so
/// callers can simulate status heartbeats) and properties.
pub fn status(
    providers: Vec<Value>,
    healthy: bool,
    heartbeat: &str,
    properties: &[(&str, &str)],
) -> Value {
    json!({
        "accessProviders": providers,
        "conditions": [{
            "type": "ControlPlaneHealthy",
            "status": if healthy { "True" } else { "False" },
            "reason": if healthy { "Healthy" } else { "Unhealthy" },
            "message": "",
            "lastTransitionTime": heartbeat
        }],
        "properties": properties
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect::<Vec<_>>()
    })
}

/// Creates the profile if missing and sets its status (the status subresource).
pub async fn apply_profile(
    hub: &kube::Client,
    name: &str,
    status: Value,
) -> Result<(), kube::Error> {
    let api: Api<ClusterProfile> = Api::namespaced(hub.clone(), PROFILE_NS);
    if api.get_opt(name).await?.is_none() {
        let cp: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": PROFILE_NS},
            "spec": {"clusterManager": {"name": "kleym-e2e"}}
        }))
        .map_err(kube::Error::SerdeError)?;
        match api.create(&PostParams::default(), &cp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}

/// Deletes a profile.
pub async fn delete_profile(hub: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let api: Api<ClusterProfile> = Api::namespaced(hub.clone(), PROFILE_NS);
    api.delete(name, &DeleteParams::default()).await.map(|_| ())
}

/// The profile namespace in the hub.
pub async fn create_profile_namespace(hub: &kube::Client) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(hub.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": PROFILE_NS}}))
        .map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The common single-spoke setup: `spoke` accepts the static `token` as user `hub` (bound to
/// `cluster-admin`), holds the standard environment with `objectives` objectives and the
/// bindings `bindings`, and is registered as a healthy ClusterProfile `spoke` reached through
/// the access provider `provider`.
pub async fn register_admin_token_spoke(
    hub: &kube::Client,
    spoke_name: &str,
    spoke: &ClusterHandle,
    provider: &str,
    token: &str,
    objectives: usize,
    bindings: std::ops::Range<usize>,
) -> Result<(), String> {
    spoke.add_static_token(
        token,
        kubesim_auth::UserInfo {
            username: "hub".into(),
            ..Default::default()
        },
    );
    super::harness::grant_admin(spoke, "hub")?;
    let store = spoke.store();
    super::env::seed_environment(&store, objectives)?;
    super::env::create_bindings(&store, bindings)?;
    apply_profile(
        hub,
        spoke_name,
        status(
            vec![access_provider(provider, spoke, None)],
            true,
            "2026-01-01T00:00:00Z",
            &[],
        ),
    )
    .await
    .map_err(|e| format!("apply ClusterProfile {spoke_name}: {e}"))
}
