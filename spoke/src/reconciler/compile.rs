//! Dereference and compile: gathers each binding's inputs from the caches (no API reads),
//! hands the namespace to the pure [`crate::compiler`] (per-binding [`compiler::compile`],
//! then [`compiler::analyze`] for collisions and warnings) and returns one verdict per
//! binding for the reconcile to apply.
//!
//! Two levels of reuse keep a burst of reconciles in one namespace linear: the
//! [`CompileMemo`] recompiles only bindings whose inputs changed, and the namespace
//! evaluation itself is shared until the watch handlers invalidate it
//! ([`super::ns_cache`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kleym_api::{
    ComputedSpiffeId, ConflictPeer, IdentityWarning, InferenceIdentityBinding, TargetKind,
};
use kube::ResourceExt;

use super::api_availability::{ApiKind, ServedApis};
use super::context::Context;
use super::error::Error;
use super::plan::DesiredOutput;
use super::queue::ObjectKey;
use super::reconcile::current_binding;
use crate::compiler::{
    self, BindingInput, BindingRef, ClusterConfig, ForeignSpiffeId, Lookup, NamespaceLabels,
    PoolView, Refusal, TargetView, resolve,
};

/// What the reconciler decided for one binding: the output to apply (or the refusal)
/// and what its status shows.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDecision {
    /// The ClusterSPIFFEID to have, or `None` when refused.
    pub output: Option<DesiredOutput>,
    /// The refusal, or `None` when the output is good.
    pub refusal: Option<Refusal>,
    /// Computed SPIFFE IDs (also shown when refused by a conflict, to explain it).
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// Rendered selectors.
    pub rendered_selectors: Vec<String>,
    /// Conflict peers.
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings.
    pub warnings: Vec<IdentityWarning>,
}

impl BindingDecision {
    /// The SPIFFE IDs, for messages.
    pub fn spiffe_id_summary(&self) -> String {
        spiffe_id_summary(&self.computed_spiffe_ids)
    }
}

/// The SPIFFE IDs of `ids`, comma-separated, for messages.
pub fn spiffe_id_summary(ids: &[ComputedSpiffeId]) -> String {
    ids.iter()
        .map(|c| c.spiffe_id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Caches a dereference needs must be synced before compiling, or the verdict would be
/// built on a partial picture ("objective missing" while its list is still loading).
fn require_synced(ctx: &Context) -> Result<(), Error> {
    let c = &ctx.caches;
    let checks: [(&'static str, bool, bool); 7] = [
        (
            "inferenceobjectives.llm-d.ai",
            c.objectives_llmd.is_active(),
            c.objectives_llmd.is_ready(),
        ),
        (
            "inferenceobjectives.inference.networking.x-k8s.io",
            c.objectives_gaie.is_active(),
            c.objectives_gaie.is_ready(),
        ),
        (
            "inferencemodels.inference.networking.x-k8s.io",
            c.models.is_active(),
            c.models.is_ready(),
        ),
        (
            "inferencepools.inference.networking.k8s.io",
            c.pools_v1.is_active(),
            c.pools_v1.is_ready(),
        ),
        (
            "inferencepools.inference.networking.x-k8s.io",
            c.pools_legacy.is_active(),
            c.pools_legacy.is_ready(),
        ),
        (
            "clusterspiffeids.spire.spiffe.io",
            c.cluster_spiffe_ids.is_active(),
            c.cluster_spiffe_ids.is_ready(),
        ),
        ("namespaces", true, c.namespaces.is_ready()),
    ];
    for (name, active, ready) in checks {
        if active && !ready {
            return Err(Error::CacheNotReady(name));
        }
    }
    Ok(())
}

/// What a cache lookup saw, for the compile memo: the group and resourceVersion of the
/// object found, or why nothing was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenFp {
    /// Found: group and resourceVersion.
    Found(&'static str, String),
    /// Served, absent.
    NotFound,
    /// Not served.
    CrdNotServed,
}

/// Everything a binding's compile result depends on besides the (fixed) cluster config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFingerprint {
    binding_uid: Option<String>,
    binding_generation: Option<i64>,
    target: SeenFp,
    pool: SeenFp,
}

fn lookup<T, K: kube::Resource>(
    group: &'static str,
    served: bool,
    found: Option<Arc<K>>,
    view: impl Fn(&K) -> T,
) -> (Lookup<T>, SeenFp) {
    match (served, found) {
        (false, _) => (Lookup::CrdNotServed, SeenFp::CrdNotServed),
        (true, Some(o)) => (
            Lookup::Found(view(&o)),
            SeenFp::Found(group, o.meta().resource_version.clone().unwrap_or_default()),
        ),
        (true, None) => (Lookup::NotFound, SeenFp::NotFound),
    }
}

/// Reads one binding's target and pool from the caches.
pub fn gather(
    ctx: &Context,
    served: &ServedApis,
    binding: &InferenceIdentityBinding,
) -> (BindingInput, InputFingerprint) {
    use kleym_api::external::{model, objective, pool};
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.spec.target_ref.name.as_str();
    let c = &ctx.caches;
    let (target, target_fp) = match binding.spec.target_ref.kind {
        TargetKind::InferenceObjective => {
            let (llmd, llmd_fp) = lookup(
                objective::GROUP_LLMD,
                served.serves(ApiKind::ObjectivesLlmd),
                c.objectives_llmd.get(&ns, name),
                TargetView::from_llmd_objective,
            );
            let (gaie, gaie_fp) = lookup(
                objective::GROUP_GAIE,
                served.serves(ApiKind::ObjectivesGaie),
                c.objectives_gaie.get(&ns, name),
                TargetView::from_gaie_objective,
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
            TargetView::from_model,
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
fn foreign_spiffe_ids(ctx: &Context) -> Vec<ForeignSpiffeId> {
    ctx.foreign_spiffe_ids
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect()
}

/// Compiles every live binding of `namespace` (collisions are a namespace-wide property)
/// and returns the verdict per binding name, outputs included.
pub fn evaluate_namespace(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> Result<BTreeMap<String, BindingDecision>, Error> {
    Ok(evaluate_namespace_shared(ctx, namespace, served)?.verdicts())
}

/// The evaluation of `namespace`, shared with every reconcile of the namespace until one
/// of its inputs changes (see [`super::ns_cache`]): a burst of reconciles in one
/// namespace analyses it once instead of once per binding.
pub fn evaluate_namespace_shared(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> Result<Arc<NamespaceEvaluation>, Error> {
    require_synced(ctx)?;
    // The stamp is taken before any input is read: see NamespaceCache::store.
    let (stamp, hit) = ctx.namespace_cache.lookup(namespace, served);
    if let Some(evaluation) = hit {
        return Ok(evaluation);
    }
    let evaluation = Arc::new(evaluate_namespace_uncached(ctx, namespace, served));
    // An empty namespace is cheap to evaluate; keeping it would only hold a slot.
    if !evaluation.is_empty() {
        ctx.namespace_cache
            .store(namespace, stamp, served, Arc::clone(&evaluation));
    }
    Ok(evaluation)
}

/// Evaluates `namespace` from the caches, bypassing the namespace cache (per-binding
/// compile results still come from the [`CompileMemo`]). The caller checks the caches
/// are synced.
pub fn evaluate_namespace_uncached(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> NamespaceEvaluation {
    let keys = ctx
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let config = cluster_config(ctx);
    let mut results = Vec::with_capacity(keys.len());
    for key in &keys {
        let Some(b) = live_binding(ctx, key) else {
            continue;
        };
        let (input, fp) = gather(ctx, served, &b);
        let result = ctx
            .compile_memo
            .get_or_compile_shared(key, fp, || compiler::compile(&input, &config));
        results.push((input, result));
    }
    merge(
        results,
        &foreign_spiffe_ids(ctx),
        &namespace_labels(ctx, namespace),
    )
}

/// The binding `key` unless it is gone or being deleted (which no longer claims an
/// identity).
fn live_binding(ctx: &Context, key: &ObjectKey) -> Option<Arc<InferenceIdentityBinding>> {
    current_binding(ctx, key).filter(|b| b.metadata.deletion_timestamp.is_none())
}

fn cluster_config(ctx: &Context) -> ClusterConfig {
    ClusterConfig {
        trust_domain: ctx.config.trust_domain.clone(),
        class_name: ctx.config.class_name.clone(),
    }
}

/// The labels of `namespace` (absent when the namespace is not cached).
fn namespace_labels(ctx: &Context, namespace: &str) -> NamespaceLabels {
    let mut ns_labels = NamespaceLabels::new();
    if let Some(ns) = ctx.caches.namespaces.get("", namespace) {
        ns_labels.insert(namespace.to_string(), ns.labels().clone());
    }
    ns_labels
}

/// Reference evaluation for tests: gathers every live binding of `namespace` and runs the
/// pure [`compile_namespace`], with neither the namespace cache nor the compile memo.
pub fn evaluate_namespace_reference(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> BTreeMap<String, BindingDecision> {
    let keys = ctx
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let inputs: Vec<BindingInput> = keys
        .iter()
        .filter_map(|k| live_binding(ctx, k))
        .map(|b| gather(ctx, served, &b).0)
        .collect();
    compile_namespace(
        &inputs,
        &cluster_config(ctx),
        &foreign_spiffe_ids(ctx),
        &namespace_labels(ctx, namespace),
    )
}

/// A namespace's evaluation: each live binding's namespace-wide verdict and compile
/// result. Peers are read for their findings only; [`Self::verdict`] builds the output of
/// the one binding being reconciled (cloning every peer's ClusterSPIFFEID spec per
/// reconcile dominated large namespaces).
#[derive(Debug, Default)]
pub struct NamespaceEvaluation {
    bindings: BTreeMap<String, Evaluated>,
}

#[derive(Debug)]
struct Evaluated {
    /// The verdict with `output` left `None`.
    findings: BindingDecision,
    compiled: Arc<CompileResult>,
}

impl Evaluated {
    fn verdict(&self) -> BindingDecision {
        let mut verdict = self.findings.clone();
        if verdict.refusal.is_none()
            && let Ok(id) = self.compiled.as_ref()
        {
            verdict.output = Some(DesiredOutput {
                name: id.output.name.clone(),
                spec: id.output.spec.clone(),
                labels: id.output.labels.clone(),
            });
        }
        verdict
    }
}

impl NamespaceEvaluation {
    /// The full verdict (output included) of the binding `name`, if it is live.
    pub fn verdict(&self, name: &str) -> Option<BindingDecision> {
        self.bindings.get(name).map(Evaluated::verdict)
    }

    /// Every binding's verdict without its output (`output` is `None`), by name.
    pub fn findings(&self) -> impl Iterator<Item = (&String, &BindingDecision)> {
        self.bindings.iter().map(|(name, e)| (name, &e.findings))
    }

    /// Every binding's full verdict, by name.
    pub fn verdicts(&self) -> BTreeMap<String, BindingDecision> {
        self.bindings
            .iter()
            .map(|(name, e)| (name.clone(), e.verdict()))
            .collect()
    }

    /// Number of live bindings evaluated.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// True when the namespace has no live binding.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

/// Memo of compile results per binding, valid while the binding's inputs (binding
/// generation, target and pool resourceVersions, served APIs) are unchanged: a reconcile
/// compiles its namespace peers only when they changed.
#[derive(Debug, Default)]
pub struct CompileMemo(Mutex<HashMap<ObjectKey, MemoEntry>>);

type CompileResult = Result<compiler::CompiledIdentity, Refusal>;

/// Shared so a hit costs a reference count, not a deep clone of the identity.
type MemoEntry = (InputFingerprint, Arc<CompileResult>);

impl CompileMemo {
    /// The memoised result for `key` if `fp` matches, else `compile()` (remembered).
    pub fn get_or_compile(
        &self,
        key: &ObjectKey,
        fp: InputFingerprint,
        compile: impl FnOnce() -> Result<compiler::CompiledIdentity, Refusal>,
    ) -> Result<compiler::CompiledIdentity, Refusal> {
        (*self.get_or_compile_shared(key, fp, compile)).clone()
    }

    /// [`Self::get_or_compile`] without cloning the result.
    pub fn get_or_compile_shared(
        &self,
        key: &ObjectKey,
        fp: InputFingerprint,
        compile: impl FnOnce() -> CompileResult,
    ) -> Arc<CompileResult> {
        if let Some((seen, result)) = self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key)
            && *seen == fp
        {
            return Arc::clone(result);
        }
        let result = Arc::new(compile());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), (fp, Arc::clone(&result)));
        result
    }

    /// Forgets a deleted binding.
    pub fn forget(&self, key: &ObjectKey) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// The pure part: compile each binding, analyse the namespace, merge into verdicts.
pub fn compile_namespace(
    inputs: &[BindingInput],
    config: &ClusterConfig,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
) -> BTreeMap<String, BindingDecision> {
    let results = inputs
        .iter()
        .map(|i| (i.clone(), Arc::new(compiler::compile(i, config))))
        .collect();
    merge(results, foreign, namespaces).verdicts()
}

/// Merges compile results with the namespace analysis.
fn merge(
    results: Vec<(BindingInput, Arc<CompileResult>)>,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
) -> NamespaceEvaluation {
    let compiled: Vec<&compiler::CompiledIdentity> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().as_ref().ok())
        .collect();
    let analysis = compiler::analyze_refs(&compiled, foreign, namespaces);
    let bindings = results
        .into_iter()
        .map(|(input, compiled)| {
            let findings = match compiled.as_ref() {
                Err(refusal) => BindingDecision {
                    output: None,
                    refusal: Some(refusal.clone()),
                    computed_spiffe_ids: Vec::new(),
                    rendered_selectors: Vec::new(),
                    conflict_peers: Vec::new(),
                    warnings: Vec::new(),
                },
                Ok(id) => {
                    let bref = BindingRef {
                        namespace: input.namespace,
                        name: input.name.clone(),
                    };
                    let findings = analysis.verdict(&bref);
                    BindingDecision {
                        output: None,
                        refusal: findings.refusal(&bref),
                        computed_spiffe_ids: vec![ComputedSpiffeId {
                            mode: id.mode,
                            spiffe_id: id.spiffe_id.clone(),
                        }],
                        rendered_selectors: id.selectors.clone(),
                        conflict_peers: findings.conflict_peers(),
                        warnings: findings.status_warnings(),
                    }
                }
            };
            (input.name, Evaluated { findings, compiled })
        })
        .collect();
    NamespaceEvaluation { bindings }
}
