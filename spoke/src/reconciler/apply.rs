//! The API writes of a reconcile: server-side apply of the ClusterSPIFFEID and of the
//! binding status (field manager `kleym`), deletes with a UID precondition, and finalizer
//! patches with a resourceVersion precondition. Every write is counted in the metrics.

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, InferenceIdentityBindingStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::error::Error;

/// Server-side applies `obj`. Creating (`force = false`) never takes fields over from
/// another manager: if a foreign object appeared under our name since the cache saw it,
/// the apply conflicts (409) instead of modifying it.
pub async fn apply_cluster_spiffe_id(
    ctx: &Context,
    obj: &ClusterSPIFFEID,
    force: bool,
) -> Result<ClusterSPIFFEID, Error> {
    let name = obj.name_any();
    let api: Api<ClusterSPIFFEID> = Api::all(ctx.client.clone());
    let mut pp = PatchParams::apply(&ctx.config.field_manager);
    pp.force = force;
    ctx.metrics.count_write("clusterspiffeid_apply");
    api.patch(&name, &pp, &Patch::Apply(obj))
        .await
        .map_err(|e| Error::kube(format!("apply ClusterSPIFFEID {name}"), e))
}

/// Deletes our ClusterSPIFFEID `name` only if it still has `uid`. Returns `Ok` when it is
/// gone or is another incarnation (not ours).
pub async fn delete_cluster_spiffe_id(ctx: &Context, name: &str, uid: &str) -> Result<(), Error> {
    let api: Api<ClusterSPIFFEID> = Api::all(ctx.client.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    ctx.metrics.count_write("clusterspiffeid_delete");
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        // 404: already gone; 409: the UID precondition failed, the object is not ours.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete ClusterSPIFFEID {name}"), e)),
    }
}

/// Server-side applies the binding's status subresource.
pub async fn apply_status(
    ctx: &Context,
    binding: &InferenceIdentityBinding,
    status: &InferenceIdentityBindingStatus,
) -> Result<InferenceIdentityBinding, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let api: Api<InferenceIdentityBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({
        "apiVersion": InferenceIdentityBinding::api_version(&()),
        "kind": InferenceIdentityBinding::kind(&()),
        "metadata": { "name": name, "namespace": ns },
        "status": status,
    });
    let pp = PatchParams::apply(&ctx.config.field_manager).force();
    ctx.metrics.count_write("status_apply");
    api.patch_status(&name, &pp, &Patch::Apply(&body))
        .await
        .map_err(|e| {
            Error::kube(
                format!("apply status of InferenceIdentityBinding {ns}/{name}"),
                e,
            )
        })
}

/// Sets the binding's finalizers to `finalizers`, guarded by the cached resourceVersion
/// (a concurrent change by someone else makes this fail with 409 and retry).
pub async fn set_finalizers(
    ctx: &Context,
    binding: &InferenceIdentityBinding,
    finalizers: Vec<String>,
) -> Result<InferenceIdentityBinding, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let api: Api<InferenceIdentityBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": binding.resource_version(),
        }
    });
    ctx.metrics.count_write("finalizer");
    let pp = PatchParams {
        field_manager: Some(ctx.config.field_manager.clone()),
        ..PatchParams::default()
    };
    api.patch(&name, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| {
            Error::kube(
                format!("update finalizers of InferenceIdentityBinding {ns}/{name}"),
                e,
            )
        })
}
