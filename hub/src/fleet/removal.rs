//! What happens to a spoke's objects when its ClusterProfile is deleted.

use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::reconciler::context::FINALIZER;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use serde_json::json;

/// `--removal-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RemovalPolicy {
    /// Stop managing the spoke and remove kleym's finalizer from its bindings; the
    /// ClusterSPIFFEIDs stay (workloads keep their identities).
    #[default]
    Orphan,
    /// Also delete the ClusterSPIFFEIDs kleym created (only those whose UID the binding's
    /// status records), then remove the finalizers.
    Cleanup,
}

/// What a removal did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemovalReport {
    /// Bindings whose finalizer was removed.
    pub finalizers_removed: usize,
    /// ClusterSPIFFEIDs deleted (Cleanup only).
    pub cluster_spiffe_ids_deleted: usize,
}

fn ignore_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        // 404: already gone; 409: the UID precondition failed (not the object we created).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other,
    }
}

/// Applies `policy` to the spoke behind `client`. The caller bounds it with a timeout.
pub async fn apply_removal(
    client: &kube::Client,
    policy: RemovalPolicy,
) -> Result<RemovalReport, kube::Error> {
    let all: Api<InferenceIdentityBinding> = Api::all(client.clone());
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    let mut report = RemovalReport::default();
    for b in all.list(&ListParams::default()).await? {
        if !b.finalizers().iter().any(|f| f == FINALIZER) {
            continue;
        }
        let ns = b.namespace().unwrap_or_default();
        let name = b.name_any();
        if policy == RemovalPolicy::Cleanup
            && let Some(owned) = b.status.as_ref().and_then(|s| s.cluster_spiffe_id.as_ref())
        {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(owned.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let deleted = csids.delete(&owned.name, &dp).await.map(|_| ());
            if deleted.is_ok() {
                report.cluster_spiffe_ids_deleted += 1;
            }
            ignore_gone(deleted)?;
        }
        let rest: Vec<String> = b
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        // resourceVersion makes this an optimistic update: a concurrent change fails with 409
        // rather than losing someone else's finalizer.
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": b.resource_version()}});
        let api: Api<InferenceIdentityBinding> = Api::namespaced(client.clone(), &ns);
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => report.finalizers_removed += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}
