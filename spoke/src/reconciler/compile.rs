//! Dereference and compile: gathers each binding's inputs from the caches (no API reads)
//! and hands the namespace to the pure compiler, whose verdicts the reconcile applies.

use std::collections::BTreeMap;
use std::sync::Arc;

use kleym_api::external::model::InferenceModel;
use kleym_api::external::objective::{gaie, llmd};
use kleym_api::external::pool::{v1, v1alpha2};
use kleym_api::{
    ComputedSpiffeId, ConflictPeer, IdentityWarning, InferenceIdentityBinding, TargetKind,
};
use kube::ResourceExt;

use super::api_availability::{ApiKind, ServedApis};
use super::context::Context;
use super::error::Error;
use super::plan::DesiredOutput;
use super::reconcile::current_binding;
use super::status::Refusal;

/// The compiler's verdict for one binding, in the reconciler's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The ClusterSPIFFEID to have, or `None` when refused.
    pub output: Option<DesiredOutput>,
    /// The refusal, or `None` when the output is good.
    pub refusal: Option<Refusal>,
    /// Computed SPIFFE IDs.
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// Rendered selectors.
    pub rendered_selectors: Vec<String>,
    /// Conflict peers.
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings.
    pub warnings: Vec<IdentityWarning>,
}

impl Verdict {
    /// The SPIFFE IDs for messages.
    pub fn spiffe_id_summary(&self) -> String {
        self.computed_spiffe_ids
            .iter()
            .map(|c| c.spiffe_id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The target object a binding resolved to, from whichever group served it.
#[derive(Debug, Clone)]
pub enum Target {
    /// `llm-d.ai/v1alpha2` InferenceObjective.
    ObjectiveLlmd(Arc<llmd::InferenceObjective>),
    /// `inference.networking.x-k8s.io/v1alpha2` InferenceObjective.
    ObjectiveGaie(Arc<gaie::InferenceObjective>),
    /// Legacy InferenceModel.
    Model(Arc<InferenceModel>),
}

/// The pool a target resolved to.
#[derive(Debug, Clone)]
pub enum Pool {
    /// `inference.networking.k8s.io/v1`.
    V1(Arc<v1::InferencePool>),
    /// `inference.networking.x-k8s.io/v1alpha2`.
    Legacy(Arc<v1alpha2::InferencePool>),
}

/// One binding's inputs, as read from the caches.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The binding.
    pub binding: Arc<InferenceIdentityBinding>,
    /// Its target, if found.
    pub target: Option<Target>,
    /// The pool the target points at, if found in the group the target names.
    pub pool: Option<Pool>,
}

/// Caches a binding's dereference needs must be synced before compiling, or the verdict
/// would be built on a partial picture ("objective missing" while the list is loading).
fn require_synced(ctx: &Context) -> Result<(), Error> {
    let c = &ctx.caches;
    let checks: [(&'static str, bool, bool); 6] = [
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
        ("inferencemodels", c.models.is_active(), c.models.is_ready()),
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
            "clusterspiffeids",
            c.cluster_spiffe_ids.is_active(),
            c.cluster_spiffe_ids.is_ready(),
        ),
    ];
    for (name, active, ready) in checks {
        if active && !ready {
            return Err(Error::CacheNotReady(name));
        }
    }
    Ok(())
}

/// Reads one binding's target and pool from the caches. Objectives prefer `llm-d.ai`.
pub fn gather(
    ctx: &Context,
    served: &ServedApis,
    binding: Arc<InferenceIdentityBinding>,
) -> Gathered {
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.spec.target_ref.name.as_str();
    let c = &ctx.caches;
    let target = match binding.spec.target_ref.kind {
        TargetKind::InferenceObjective => {
            let llmd = served
                .serves(ApiKind::ObjectivesLlmd)
                .then(|| c.objectives_llmd.get(&ns, name))
                .flatten()
                .map(Target::ObjectiveLlmd);
            llmd.or_else(|| {
                served
                    .serves(ApiKind::ObjectivesGaie)
                    .then(|| c.objectives_gaie.get(&ns, name))
                    .flatten()
                    .map(Target::ObjectiveGaie)
            })
        }
        TargetKind::InferenceModel => served
            .serves(ApiKind::Models)
            .then(|| c.models.get(&ns, name))
            .flatten()
            .map(Target::Model),
    };
    let pool = target.as_ref().and_then(|t| {
        let (group, pool_name) = match t {
            Target::ObjectiveLlmd(o) => (
                o.spec.pool_group().to_string(),
                o.spec.pool_ref.name.clone(),
            ),
            Target::ObjectiveGaie(o) => (
                o.spec.pool_group().to_string(),
                o.spec.pool_ref.name.clone(),
            ),
            Target::Model(m) => (
                m.spec.pool_group().to_string(),
                m.spec.pool_ref.name.clone(),
            ),
        };
        if group == kleym_api::external::pool::GROUP_V1 {
            c.pools_v1.get(&ns, &pool_name).map(Pool::V1)
        } else if group == kleym_api::external::pool::GROUP_LEGACY {
            c.pools_legacy.get(&ns, &pool_name).map(Pool::Legacy)
        } else {
            None
        }
    });
    Gathered {
        binding,
        target,
        pool,
    }
}

/// Compiles every live binding of `namespace` (collisions are a namespace-wide property)
/// and returns the verdict per binding name.
pub fn evaluate_namespace(
    ctx: &Context,
    namespace: &str,
    served: &ServedApis,
) -> Result<BTreeMap<String, Verdict>, Error> {
    require_synced(ctx)?;
    let keys = ctx
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .bindings_in_namespace(namespace);
    let gathered: Vec<Gathered> = keys
        .iter()
        .filter_map(|k| current_binding(ctx, k))
        // A binding being deleted no longer claims an identity.
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .map(|b| gather(ctx, served, b))
        .collect();
    Ok(compile_namespace(ctx, served, &gathered))
}

/// Hands the gathered namespace to the pure compiler.
fn compile_namespace(
    _ctx: &Context,
    _served: &ServedApis,
    gathered: &[Gathered],
) -> BTreeMap<String, Verdict> {
    gathered
        .iter()
        .map(|g| {
            (
                g.binding.name_any(),
                Verdict {
                    output: None,
                    refusal: Some(Refusal {
                        condition: kleym_api::conditions::RENDER_FAILURE,
                        reason: "CompilerUnavailable".into(),
                        message: "the compiler is not wired in yet".into(),
                    }),
                    computed_spiffe_ids: Vec::new(),
                    rendered_selectors: Vec::new(),
                    conflict_peers: Vec::new(),
                    warnings: Vec::new(),
                },
            )
        })
        .collect()
}
