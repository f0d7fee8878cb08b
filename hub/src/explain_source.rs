//! Where `kleym explain` reads its inputs ([`ExplainSource`]), with its two implementations:
//!
//! - [`ClusterReads`]: everything read from the cluster with the caller's client (the local
//!   command, `--kubeconfig`);
//! - [`HubCaches`]: the hub's path, answered from the caches of the spoke reconciler the
//!   replica runs for the cluster (`kleym_spoke::reconciler::explain_view`): the namespace,
//!   the bindings, a binding's target and pool, and every ClusterSPIFFEID whose spec the
//!   caches know. Only what no hub cache holds is read from the spoke: the pod and its node
//!   (the hub does not watch pods: docs/explain.md says why), a binding's pool pods (one
//!   list by label) and their nodes, and a kleym ClusterSPIFFEID whose spec is not the one
//!   kleym compiles for its binding (one `get` by name each).

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::compiler::{Lookup, PoolView, TargetView};
use kleym_spoke::reconciler::context::Context;
use kleym_spoke::reconciler::explain_view;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// Why a pod or binding could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The pod does not exist.
    #[error("pod {namespace}/{name} not found")]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The binding does not exist.
    #[error("binding {namespace}/{name} not found")]
    BindingNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Reading an object failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The hub's caches of the spoke cannot answer now (not synced yet).
    #[error("{0}")]
    NotCached(String),
    /// The answer could not be encoded.
    #[error("encoding the explanation: {0}")]
    Encode(String),
    /// The model refused its input.
    #[error(transparent)]
    Model(#[from] kleym_spoke::explain::ExplainError),
}

use kleym_spoke::explain::targets::{LookedUp, TargetsOf};

fn read(what: String) -> impl FnOnce(kube::Error) -> ExplainError {
    move |source| ExplainError::Read { what, source }
}

/// What an explanation reads. Each method answers as the API server would for the read it
/// names.
pub trait ExplainSource: Sync {
    /// The pod `namespace/name` (`None`: not found).
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, ExplainError>> + Send;
    /// The namespace `name`.
    fn namespace(&self, name: &str)
    -> impl Future<Output = Result<Namespace, ExplainError>> + Send;
    /// The node `name` (`None`: not found).
    fn node(&self, name: &str) -> impl Future<Output = Result<Option<Node>, ExplainError>> + Send;
    /// The pods of `namespace` that the label selector `selector` (`k=v,...`) selects.
    fn pods(
        &self,
        namespace: &str,
        selector: &str,
    ) -> impl Future<Output = Result<Vec<Pod>, ExplainError>> + Send;
    /// Every ClusterSPIFFEID of the cluster.
    fn cluster_spiffe_ids(
        &self,
    ) -> impl Future<Output = Result<Vec<ClusterSPIFFEID>, ExplainError>> + Send;
    /// The bindings of `namespace`, in name order.
    fn bindings(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<InferenceIdentityBinding>, ExplainError>> + Send;
    /// The binding `namespace/name` (`None`: not found).
    fn binding(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<InferenceIdentityBinding>, ExplainError>> + Send;
    /// The binding's target and pool, looked up as the reconciler looks them up (both
    /// objective groups, llm-d preferred; the pool in the group the target names).
    fn target_and_pool(
        &self,
        binding: &InferenceIdentityBinding,
    ) -> impl Future<Output = Result<(Lookup<TargetView>, Lookup<PoolView>), ExplainError>> + Send;
    /// Where the targets and pools of `bindings` (all of `namespace`) are looked up.
    fn namespace_targets(
        &self,
        namespace: &str,
        bindings: &[InferenceIdentityBinding],
    ) -> impl Future<Output = Result<Box<dyn TargetsOf + Send + Sync>, ExplainError>> + Send;
}

/// Reads everything from the cluster with `client` (the local command).
#[derive(Clone)]
pub struct ClusterReads<'a>(pub &'a kube::Client);

impl ExplainSource for ClusterReads<'_> {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ExplainError> {
        Api::<Pod>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(read(format!("pod {namespace}/{name}")))
    }

    async fn namespace(&self, name: &str) -> Result<Namespace, ExplainError> {
        Api::<Namespace>::all(self.0.clone())
            .get(name)
            .await
            .map_err(read(format!("namespace {name}")))
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, ExplainError> {
        Api::<Node>::all(self.0.clone())
            .get_opt(name)
            .await
            .map_err(read(format!("node {name}")))
    }

    async fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Pod>, ExplainError> {
        Ok(Api::<Pod>::namespaced(self.0.clone(), namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(read(format!("pods in {namespace} ({selector})")))?
            .items)
    }

    async fn cluster_spiffe_ids(&self) -> Result<Vec<ClusterSPIFFEID>, ExplainError> {
        Ok(Api::<ClusterSPIFFEID>::all(self.0.clone())
            .list(&ListParams::default())
            .await
            .map_err(read("ClusterSPIFFEIDs".to_string()))?
            .items)
    }

    async fn bindings(
        &self,
        namespace: &str,
    ) -> Result<Vec<InferenceIdentityBinding>, ExplainError> {
        Ok(
            Api::<InferenceIdentityBinding>::namespaced(self.0.clone(), namespace)
                .list(&ListParams::default())
                .await
                .map_err(read(format!("InferenceIdentityBindings in {namespace}")))?
                .items,
        )
    }

    async fn binding(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<InferenceIdentityBinding>, ExplainError> {
        Api::<InferenceIdentityBinding>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(read(format!("InferenceIdentityBinding {namespace}/{name}")))
    }

    async fn target_and_pool(
        &self,
        binding: &InferenceIdentityBinding,
    ) -> Result<(Lookup<TargetView>, Lookup<PoolView>), ExplainError> {
        read_target_and_pool(self.0, binding).await
    }

    /// One list per kind for the whole namespace, rather than per binding.
    async fn namespace_targets(
        &self,
        namespace: &str,
        _bindings: &[InferenceIdentityBinding],
    ) -> Result<Box<dyn TargetsOf + Send + Sync>, ExplainError> {
        Ok(Box::new(read_namespace_targets(self.0, namespace).await?))
    }
}

/// [`ExplainSource::target_and_pool`] of [`ClusterReads`]: the namespace's objectives,
/// models and pools as listed for `explain pod`, looked up for `b` with the compiler's rules.
async fn read_target_and_pool(
    client: &kube::Client,
    b: &InferenceIdentityBinding,
) -> Result<(Lookup<TargetView>, Lookup<PoolView>), ExplainError> {
    let ns = b.namespace().unwrap_or_default();
    let targets = read_namespace_targets(client, &ns).await?;
    let input = targets.input_for(b);
    Ok((input.target, input.pool))
}

/// The namespace's objectives, models and pools, read from the cluster.
async fn read_namespace_targets(
    client: &kube::Client,
    namespace: &str,
) -> Result<kleym_spoke::explain::targets::NamespaceTargets, ExplainError> {
    crate::explain_targets::read_namespace_targets(client, namespace)
        .await
        .map_err(|e| ExplainError::Read {
            what: e.what,
            source: e.source,
        })
}

/// The hub's path: the caches of the spoke reconciler this replica runs for the cluster,
/// and its client for the reads they cannot answer (see the module documentation).
#[derive(Clone)]
pub struct HubCaches {
    /// The hub's client for the spoke.
    pub client: kube::Client,
    /// The running reconciler of the spoke.
    pub context: Arc<Context>,
    /// The cluster, `namespace/name`, for log lines.
    pub cluster: String,
}

impl HubCaches {
    /// Whether the caches can answer now (every cache completed its first list); checked
    /// before anything is read from the spoke.
    pub fn ready(&self) -> Result<(), ExplainError> {
        explain_view::synced(&self.context).map_err(not_cached)
    }
}

fn not_cached(e: explain_view::NotAnswerable) -> ExplainError {
    ExplainError::NotCached(e.to_string())
}

impl ExplainSource for HubCaches {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ExplainError> {
        ClusterReads(&self.client).pod(namespace, name).await
    }

    async fn namespace(&self, name: &str) -> Result<Namespace, ExplainError> {
        explain_view::namespace(&self.context, name)
            .map_err(not_cached)?
            .ok_or_else(|| {
                ExplainError::NotCached(format!(
                    "namespace {name} is not in the hub's cache of the spoke (yet)"
                ))
            })
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, ExplainError> {
        ClusterReads(&self.client).node(name).await
    }

    async fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Pod>, ExplainError> {
        ClusterReads(&self.client).pods(namespace, selector).await
    }

    async fn cluster_spiffe_ids(&self) -> Result<Vec<ClusterSPIFFEID>, ExplainError> {
        let cached = explain_view::cluster_spiffe_ids(&self.context).map_err(not_cached)?;
        let mut objects = cached.known;
        let api = Api::<ClusterSPIFFEID>::all(self.client.clone());
        for o in cached.to_read {
            tracing::info!(
                cluster = %self.cluster,
                object = %o.name,
                why = %o.why,
                "explain: reading a ClusterSPIFFEID from the spoke, its spec is not the one in the hub's cache"
            );
            if let Some(obj) = api
                .get_opt(&o.name)
                .await
                .map_err(read(format!("ClusterSPIFFEID {}", o.name)))?
            {
                objects.push(obj);
            }
        }
        objects.sort_by_key(|o| o.name_any());
        Ok(objects)
    }

    async fn bindings(
        &self,
        namespace: &str,
    ) -> Result<Vec<InferenceIdentityBinding>, ExplainError> {
        explain_view::bindings(&self.context, namespace).map_err(not_cached)
    }

    async fn binding(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<InferenceIdentityBinding>, ExplainError> {
        explain_view::binding(&self.context, namespace, name).map_err(not_cached)
    }

    async fn target_and_pool(
        &self,
        binding: &InferenceIdentityBinding,
    ) -> Result<(Lookup<TargetView>, Lookup<PoolView>), ExplainError> {
        explain_view::target_and_pool(&self.context, binding).map_err(not_cached)
    }

    /// Each binding's lookups in the reconciler's caches: nothing is read from the spoke.
    async fn namespace_targets(
        &self,
        _namespace: &str,
        bindings: &[InferenceIdentityBinding],
    ) -> Result<Box<dyn TargetsOf + Send + Sync>, ExplainError> {
        let mut looked_up = LookedUp::default();
        for b in bindings {
            let found = explain_view::target_and_pool(&self.context, b).map_err(not_cached)?;
            looked_up.0.insert(b.name_any(), found);
        }
        Ok(Box::new(looked_up))
    }
}
