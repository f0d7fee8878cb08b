//! Dereference and compile: gathers each binding's inputs from the caches (no API reads),
//! hands the namespace to the pure [`crate::compiler`] (per-binding [`compiler::compile`],
//! then [`compiler::analyze`] for collisions and warnings) and returns one verdict per
//! binding for the reconcile to apply. Reads only [`SpokeState`]: compiling has no effect.
//!
//! Two levels of reuse keep a burst of reconciles in one namespace linear: the
//! [`CompileMemo`] recompiles only bindings whose inputs changed, and the namespace
//! evaluation itself is shared until the watch handlers invalidate it
//! ([`super::ns_cache`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use kleym_api::{InferenceIdentityBinding, TargetKind};
use kube::{Resource, ResourceExt};

use super::api_availability::{ApiKind, ServedApis};
use super::error::Error;
#[cfg(doc)]
use super::evaluation::CompileMemo;
use super::evaluation::{
    BindingDecision, InputFingerprint, NamespaceEvaluation, SeenFp, compile_namespace_observed,
    merge,
};
use super::queue::ObjectKey;
use super::state::SpokeState;
use super::target_record::TargetRecord;
use super::trim::CacheEntry;
use crate::compiler::{
    self, BindingInput, ClusterConfig, ForeignSpiffeId, Lookup, NamespaceLabels, PoolView,
    TargetView, resolve,
};

/// Caches a dereference needs must be synced before compiling, or the verdict would be
/// built on a partial picture ("objective missing" while its list is still loading).
fn require_synced(state: &SpokeState) -> Result<(), Error> {
    let c = &state.caches;
    // The binding being reconciled came from its own cache: only its inputs' are checked.
    let inputs = ApiKind::ALL.into_iter().filter(|k| *k != ApiKind::Bindings);
    for kind in inputs {
        let cache = c.of_kind(kind);
        if cache.is_active() && !cache.is_ready() {
            return Err(Error::CacheNotReady(kind.crd_name()));
        }
    }
    if !c.namespaces.is_ready() {
        return Err(Error::CacheNotReady("namespaces"));
    }
    Ok(())
}

fn lookup<T, K: CacheEntry>(
    group: &'static str,
    served: bool,
    found: Option<Arc<K>>,
    view: impl Fn(&K) -> T,
) -> (Lookup<T>, SeenFp) {
    match (served, found) {
        (false, _) => (Lookup::CrdNotServed, SeenFp::CrdNotServed),
        (true, Some(o)) => (
            Lookup::Found(view(&o)),
            SeenFp::Found(group, o.entry_version().unwrap_or_default().to_string()),
        ),
        (true, None) => (Lookup::NotFound, SeenFp::NotFound),
    }
}

fn target_view(record: &TargetRecord) -> TargetView {
    record.view().clone()
}

/// Reads one binding's target and pool from the caches.
pub fn gather(
    state: &SpokeState,
    served: &ServedApis,
    binding: &InferenceIdentityBinding,
) -> (BindingInput, InputFingerprint) {
    use kleym_api::external::{model, objective, pool};
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.spec.target_ref.name.as_str();
    let c = &state.caches;
    let (target, target_fp) = match binding.spec.target_ref.kind {
        TargetKind::InferenceObjective => {
            let (llmd, llmd_fp) = lookup(
                objective::GROUP_LLMD,
                served.serves(ApiKind::ObjectivesLlmd),
                c.objectives_llmd.get(&ns, name),
                target_view,
            );
            let (gaie, gaie_fp) = lookup(
                objective::GROUP_GAIE,
                served.serves(ApiKind::ObjectivesGaie),
                c.objectives_gaie.get(&ns, name),
                target_view,
            );
            // Same preference as the compiler: llm-d when it holds the object.
            let fp = match (&llmd_fp, &gaie_fp) {
                (SeenFp::Found(..), _) => llmd_fp.clone(),
                (_, SeenFp::Found(..)) => gaie_fp.clone(),
                (SeenFp::CrdNotServed, SeenFp::CrdNotServed) => SeenFp::CrdNotServed,
                _ => SeenFp::NotFound,
            };
            (resolve::prefer_objective(llmd, gaie), fp)
        }
        TargetKind::InferenceModel => lookup(
            model::GROUP,
            served.serves(ApiKind::Models),
            c.models.get(&ns, name),
            target_view,
        ),
    };
    let (pool, pool_fp) = match target.found().map(|t| resolve::pool_key(&ns, t)) {
        Some(Ok(key)) if key.group == pool::GROUP_V1 => lookup(
            pool::GROUP_V1,
            served.serves(ApiKind::PoolsV1),
            c.pools_v1.get(&ns, &key.name),
            PoolView::from_v1,
        ),
        Some(Ok(key)) if key.group == pool::GROUP_LEGACY => lookup(
            pool::GROUP_LEGACY,
            served.serves(ApiKind::PoolsLegacy),
            c.pools_legacy.get(&ns, &key.name),
            PoolView::from_v1alpha2,
        ),
        // Unsupported references are refused by the compiler from the target alone.
        _ => (Lookup::NotFound, SeenFp::NotFound),
    };
    let fp = InputFingerprint {
        binding_uid: binding.uid(),
        binding_generation: binding.metadata.generation,
        target: target_fp,
        pool: pool_fp,
    };
    (
        BindingInput {
            namespace: ns,
            name: binding.name_any(),
            spec: binding.spec.clone(),
            target,
            pool,
        },
        fp,
    )
}

/// ClusterSPIFFEIDs not managed by kleym (for overlap warnings).
fn foreign_spiffe_ids(state: &SpokeState) -> Vec<ForeignSpiffeId> {
    state
        .foreign_spiffe_ids
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect()
}

/// Compiles every live binding of `namespace` (collisions are a namespace-wide property)
/// and returns the verdict per binding name, outputs included.
pub fn evaluate_namespace(
    state: &SpokeState,
    cluster: &ClusterConfig,
    namespace: &str,
    served: &ServedApis,
) -> Result<BTreeMap<String, BindingDecision>, Error> {
    Ok(evaluate_namespace_shared(state, cluster, namespace, served)?.verdicts())
}

/// The evaluation of `namespace`, shared with every reconcile of the namespace until one
/// of its inputs changes (see [`super::ns_cache`]): a burst of reconciles in one
/// namespace analyses it once instead of once per binding.
pub fn evaluate_namespace_shared(
    state: &SpokeState,
    cluster: &ClusterConfig,
    namespace: &str,
    served: &ServedApis,
) -> Result<Arc<NamespaceEvaluation>, Error> {
    require_synced(state)?;
    // The stamp is taken before any input is read: see NamespaceCache::store.
    let (stamp, hit) = state.namespace_cache.lookup(namespace, served);
    if let Some(evaluation) = hit {
        return Ok(evaluation);
    }
    let evaluation = Arc::new(evaluate_namespace_uncached(
        state, cluster, namespace, served,
    ));
    // An empty namespace is cheap to evaluate; keeping it would only hold a slot.
    if !evaluation.is_empty() {
        state
            .namespace_cache
            .store(namespace, stamp, served, Arc::clone(&evaluation));
    }
    Ok(evaluation)
}

/// Evaluates `namespace` from the caches, bypassing the namespace cache (per-binding
/// compile results still come from the [`CompileMemo`]). The caller checks the caches
/// are synced.
pub fn evaluate_namespace_uncached(
    state: &SpokeState,
    cluster: &ClusterConfig,
    namespace: &str,
    served: &ServedApis,
) -> NamespaceEvaluation {
    let keys = state
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let mut results = Vec::with_capacity(keys.len());
    for key in &keys {
        let Some(b) = live_binding(state, key) else {
            continue;
        };
        let (input, fp) = gather(state, served, &b);
        let result = state
            .compile_memo
            .get_or_compile_shared(key, fp, || compiler::compile(&input, cluster));
        results.push((input, result));
    }
    let outputs = output_precedence(
        state,
        results.iter().filter_map(|(_, r)| r.as_ref().as_ref().ok()),
    );
    merge(
        results,
        &foreign_spiffe_ids(state),
        &namespace_labels(state, namespace),
        &outputs,
    )
}

/// When each compiled binding's ClusterSPIFFEID was created, for the masking analysis
/// (an identical older foreign entry masks kleym's). Only an object proven kleym's counts
/// (a foreign object holding our name is no output of ours, and refuses the binding).
///
/// The namespace evaluation that reads this is not invalidated when kleym creates an
/// output: an output missing here counts as created after every existing object, which is
/// what its creation then makes true.
fn output_precedence<'a>(
    state: &SpokeState,
    compiled: impl Iterator<Item = &'a compiler::CompiledIdentity>,
) -> compiler::OutputPrecedence {
    compiled
        .filter_map(|id| {
            let observed = state.current_cluster_spiffe_id(&id.output_name())?;
            observed.foreign().is_none().then(|| {
                (
                    id.binding.clone(),
                    crate::explain::Precedence::of_meta(observed.meta()),
                )
            })
        })
        .collect()
}

/// The binding `key` unless it is gone or being deleted (which no longer claims an
/// identity).
fn live_binding(state: &SpokeState, key: &ObjectKey) -> Option<Arc<InferenceIdentityBinding>> {
    state
        .current_binding(key)
        .filter(|b| b.metadata.deletion_timestamp.is_none())
}

/// The labels of `namespace` (absent when the namespace is not cached).
fn namespace_labels(state: &SpokeState, namespace: &str) -> NamespaceLabels {
    let mut ns_labels = NamespaceLabels::new();
    if let Some(ns) = state.caches.namespaces.get("", namespace) {
        ns_labels.insert(namespace.to_string(), ns.labels().clone());
    }
    ns_labels
}

/// Reference evaluation for tests: gathers every live binding of `namespace` and runs the
/// pure [`compile_namespace_observed`], with neither the namespace cache nor the compile memo.
pub fn evaluate_namespace_reference(
    state: &SpokeState,
    cluster: &ClusterConfig,
    namespace: &str,
    served: &ServedApis,
) -> BTreeMap<String, BindingDecision> {
    let keys = state
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let inputs: Vec<BindingInput> = keys
        .iter()
        .filter_map(|k| live_binding(state, k))
        .map(|b| gather(state, served, &b).0)
        .collect();
    let compiled: Vec<compiler::CompiledIdentity> = inputs
        .iter()
        .filter_map(|i| compiler::compile(i, cluster).ok())
        .collect();
    compile_namespace_observed(
        &inputs,
        cluster,
        &foreign_spiffe_ids(state),
        &namespace_labels(state, namespace),
        &output_precedence(state, compiled.iter()),
    )
}
