//! The objectives, models and pools of one namespace, read for `kleym explain pod`: which
//! bindings of the pod's namespace target the pod's pool is resolved from them with the
//! compiler's rules ([`kleym_spoke::explain::targets`]). Reads only: `list` on the
//! namespace's InferenceObjectives (both groups), InferenceModels and InferencePools (both
//! groups); a resource the cluster does not serve (404) is recorded as such, as the
//! compiler distinguishes it.

use kleym_api::external::{model, objective, pool};
use kleym_spoke::compiler::{PoolView, TargetView};
use kleym_spoke::explain::targets::NamespaceTargets;
use kube::api::ListParams;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// A list that failed: what was listed, and the API's error.
#[derive(Debug, thiserror::Error)]
#[error("reading {what}: {source}")]
pub struct ReadError {
    /// What was listed.
    pub what: String,
    /// The API error.
    pub source: kube::Error,
}

/// List every `K` of namespace `ns` and map it with `view`; `None` when the cluster does
/// not serve `K`.
async fn list<K, V>(
    client: &kube::Client,
    ns: &str,
    what: &str,
    view: impl Fn(&K) -> V,
) -> Result<Option<Vec<V>>, ReadError>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    match Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(l) => Ok(Some(l.items.iter().map(view).collect())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(source) => Err(ReadError {
            what: format!("{what} in {ns}"),
            source,
        }),
    }
}

/// Read the objectives, models and pools of namespace `ns`.
pub async fn read_namespace_targets(
    client: &kube::Client,
    ns: &str,
) -> Result<NamespaceTargets, ReadError> {
    Ok(NamespaceTargets {
        llmd_objectives: list::<objective::llmd::InferenceObjective, _>(
            client,
            ns,
            &format!("InferenceObjectives ({})", objective::GROUP_LLMD),
            TargetView::from_llmd_objective,
        )
        .await?,
        gaie_objectives: list::<objective::gaie::InferenceObjective, _>(
            client,
            ns,
            &format!("InferenceObjectives ({})", objective::GROUP_GAIE),
            TargetView::from_gaie_objective,
        )
        .await?,
        models: list::<model::InferenceModel, _>(
            client,
            ns,
            "InferenceModels",
            TargetView::from_model,
        )
        .await?,
        pools_v1: list::<pool::v1::InferencePool, _>(
            client,
            ns,
            &format!("InferencePools ({})", pool::GROUP_V1),
            PoolView::from_v1,
        )
        .await?,
        pools_legacy: list::<pool::v1alpha2::InferencePool, _>(
            client,
            ns,
            &format!("InferencePools ({})", pool::GROUP_LEGACY),
            PoolView::from_v1alpha2,
        )
        .await?,
    })
}
