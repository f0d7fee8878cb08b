//! Dereference and compile: gathers each binding's inputs from the caches (no API reads),
//! hands the namespace to the pure [`crate::compiler`] (per-binding [`compiler::compile`],
//! then [`compiler::analyze`] for collisions and warnings) and returns one verdict per
//! binding for the reconcile to apply.

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

/// The verdict for one binding, in the reconciler's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
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

impl Verdict {
    /// The SPIFFE IDs, for messages.
    pub fn spiffe_id_summary(&self) -> String {
        self.computed_spiffe_ids
            .iter()
            .map(|c| c.spiffe_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
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
/// and returns the verdict per binding name.
pub fn evaluate_namespace(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> Result<BTreeMap<String, Verdict>, Error> {
    evaluate_namespace_for(ctx, namespace, served, None)
}

/// [`evaluate_namespace`], building [`Verdict::output`] only for the binding named `focus`
/// (every binding when `None`): peers' verdicts are read only for their namespace-wide
/// findings, and cloning each peer's ClusterSPIFFEID spec on every reconcile dominated
/// the cost of large namespaces.
pub fn evaluate_namespace_for(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
    focus: Option<&str>,
) -> Result<BTreeMap<String, Verdict>, Error> {
    require_synced(ctx)?;
    let keys = ctx
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let config = ClusterConfig {
        trust_domain: ctx.config.trust_domain.clone(),
        class_name: ctx.config.class_name.clone(),
    };
    let mut results = Vec::with_capacity(keys.len());
    for key in &keys {
        let Some(b) = current_binding(ctx, key) else {
            continue;
        };
        // A binding being deleted no longer claims an identity.
        if b.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (input, fp) = gather(ctx, served, &b);
        let result = ctx
            .compile_memo
            .get_or_compile_shared(key, fp, || compiler::compile(&input, &config));
        results.push((input, result));
    }
    let mut ns_labels = NamespaceLabels::new();
    if let Some(ns) = ctx.caches.namespaces.get("", namespace) {
        ns_labels.insert(namespace.to_string(), ns.labels().clone());
    }
    Ok(merge(results, &foreign_spiffe_ids(ctx), &ns_labels, focus))
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
) -> BTreeMap<String, Verdict> {
    let results = inputs
        .iter()
        .map(|i| (i.clone(), compiler::compile(i, config)))
        .collect();
    merge(results, foreign, namespaces, None)
}

/// Merges compile results with the namespace analysis; `focus` as in
/// [`evaluate_namespace_for`].
fn merge<R: std::borrow::Borrow<CompileResult>>(
    results: Vec<(BindingInput, R)>,
    foreign: &[ForeignSpiffeId],
    namespaces: &NamespaceLabels,
    focus: Option<&str>,
) -> BTreeMap<String, Verdict> {
    let compiled: Vec<&compiler::CompiledIdentity> = results
        .iter()
        .filter_map(|(_, r)| r.borrow().as_ref().ok())
        .collect();
    let analysis = compiler::analyze_refs(&compiled, foreign, namespaces);
    results
        .into_iter()
        .map(|(input, result)| {
            let wants_output = focus.is_none_or(|f| f == input.name);
            let verdict = match result.borrow() {
                Err(refusal) => Verdict {
                    output: None,
                    refusal: Some(refusal.clone()),
                    computed_spiffe_ids: Vec::new(),
                    rendered_selectors: Vec::new(),
                    conflict_peers: Vec::new(),
                    warnings: Vec::new(),
                },
                Ok(id) => {
                    let bref = BindingRef {
                        namespace: input.namespace.clone(),
                        name: input.name.clone(),
                    };
                    let findings = analysis.verdict(&bref);
                    let refusal = findings.refusal(&bref);
                    Verdict {
                        output: (refusal.is_none() && wants_output).then(|| DesiredOutput {
                            name: id.output.name.clone(),
                            spec: id.output.spec.clone(),
                            labels: id.output.labels.clone(),
                        }),
                        refusal,
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
            (input.name, verdict)
        })
        .collect()
}
