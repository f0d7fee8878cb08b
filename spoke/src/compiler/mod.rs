//! The identity compiler: pure functions from a binding and its resolved inputs to the
//! ClusterSPIFFEID that registers its identity, or to a [`Refusal`].
//!
//! - [`compile`] handles one binding: resolution ([`resolve`]), templates ([`template`]),
//!   SPIFFE ID rules ([`spiffe_id`]), confinement proofs ([`selectors`]), what a tenant may
//!   ask for in its SVIDs ([`svid`]) and the output object ([`output`]).
//! - [`analyze`] looks at all compiled bindings of a cluster at once for collisions,
//!   duplicates and warnings ([`collisions`]).
//! - [`conditions`] turns a verdict into the binding's status conditions.
//!
//! No I/O, no clocks (callers pass `now`), no global state: the same inputs always give
//! the same bytes.

pub mod collisions;
pub mod conditions;
pub mod input;
pub mod output;
pub mod refusal;
pub mod resolve;
pub mod selectors;
pub mod spiffe_id;
pub mod svid;
pub mod template;

use std::collections::BTreeSet;

use kleym_api::label_map::LabelMap;
use kleym_api::{DiscriminatorType, IdentityMode, TargetKind};

pub use collisions::{
    Analysis, BindingRef, CollisionFindings, ForeignSpiffeId, NamespaceLabels, OutputPrecedence,
    analyze, analyze_observed, analyze_refs,
};
pub use input::{BindingInput, ClusterConfig, Lookup, PoolRefView, PoolView, TargetView};
pub use output::ClusterSpiffeIdOutput;
pub use refusal::{Reason, Refusal, RefusalKind};
pub use resolve::PoolKey;
pub use svid::{SvidPolicy, SvidPolicyError, SvidPolicySettings};

use spiffe_id::{SpiffeId, TrustDomain};
use template::Variables;

/// A binding compiled into its identity and output object.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledIdentity {
    /// The binding.
    pub binding: BindingRef,
    /// Identity boundary.
    pub mode: IdentityMode,
    /// The resolved pool.
    pub pool: PoolKey,
    /// The one service account the identity is confined to.
    pub service_account: String,
    /// `k8s:container-name:…` / `k8s:container-image:…` (PerObjective only).
    pub container_selector: Option<String>,
    /// The ClusterSPIFFEID to apply. Its spec holds the SPIFFE ID, the selectors and the
    /// pool labels, read through the methods below rather than kept twice: a hub keeps
    /// one compiled identity per binding of every spoke.
    pub output: ClusterSpiffeIdOutput,
}

/// What [`CompiledIdentity::pool_labels`] reads when the output has no pod selector
/// (never, as `compile` builds it).
static NO_LABELS: LabelMap = LabelMap::new();

impl CompiledIdentity {
    /// The SPIFFE ID (the output's `spiffeIDTemplate`, a literal ID).
    pub fn spiffe_id(&self) -> &str {
        &self.output.spec.spiffe_id_template
    }

    /// Sorted, de-duplicated workload selectors (the output's `workloadSelectorTemplates`).
    pub fn selectors(&self) -> &[String] {
        self.output
            .spec
            .workload_selector_templates
            .as_deref()
            .unwrap_or_default()
    }

    /// The ClusterSPIFFEID's name ([`output::cluster_spiffe_id_name`] of the binding).
    pub fn output_name(&self) -> String {
        output::cluster_spiffe_id_name(&self.binding.namespace, &self.binding.name)
    }

    /// The ClusterSPIFFEID's labels ([`output::output_labels`] of the binding).
    pub fn output_labels(&self) -> LabelMap {
        output::output_labels(&self.binding.namespace, &self.binding.name)
    }

    /// The pool's `matchLabels`, the pod set within the namespace (the output's
    /// `podSelector.matchLabels`).
    pub fn pool_labels(&self) -> &LabelMap {
        self.output
            .spec
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .unwrap_or(&NO_LABELS)
    }
}

/// The default SPIFFE ID: PerObjective `spiffe://<TD>/ns/<N>/objective/<O>` (legacy
/// InferenceModel targets: `…/model/<M>`), PoolOnly `spiffe://<TD>/ns/<N>/pool/<P>`.
pub fn default_spiffe_id(
    trust_domain: &str,
    namespace: &str,
    mode: IdentityMode,
    target_kind: TargetKind,
    target_name: &str,
    pool_name: &str,
) -> String {
    match (mode, target_kind) {
        (IdentityMode::PoolOnly, _) => {
            format!("spiffe://{trust_domain}/ns/{namespace}/pool/{pool_name}")
        }
        (IdentityMode::PerObjective, TargetKind::InferenceObjective) => {
            format!("spiffe://{trust_domain}/ns/{namespace}/objective/{target_name}")
        }
        (IdentityMode::PerObjective, TargetKind::InferenceModel) => {
            format!("spiffe://{trust_domain}/ns/{namespace}/model/{target_name}")
        }
    }
}

fn template_refusal(binding_desc: &str, field: &str, e: &template::TemplateError) -> Refusal {
    Refusal::new(
        Reason::TemplateError,
        format!("{binding_desc}: {field}: {e}"),
    )
}

/// Compile one binding. Pure and deterministic.
pub fn compile(input: &BindingInput, config: &ClusterConfig) -> Result<CompiledIdentity, Refusal> {
    let ns = input.namespace.as_str();
    let spec = &input.spec;
    let binding_desc = format!("binding {ns}/{}", input.name);
    let trust_domain = TrustDomain::parse(&config.trust_domain).map_err(|e| {
        Refusal::new(
            Reason::InvalidTrustDomain,
            format!(
                "cluster trust domain {:?} is invalid: {e}",
                config.trust_domain
            ),
        )
    })?;
    let resolved = resolve::resolve(input)?;
    let (target, pool) = (resolved.target, resolved.pool);

    let pool_desc = format!("InferencePool {ns}/{} ({})", pool.name, pool.group);
    let pool_selectors = selectors::pool_label_selectors(&pool_desc, &pool.match_labels)?;
    let container_selector = selectors::discriminator_selector(
        &binding_desc,
        spec.mode,
        spec.container_discriminator.as_ref(),
    )?;

    let vars = Variables {
        namespace: ns,
        objective_name: &target.name,
        pool_name: &pool.name,
        binding_name: &input.name,
        mode: spec.mode.as_str(),
        container_name: spec
            .container_discriminator
            .as_ref()
            .filter(|d| d.type_ == DiscriminatorType::ContainerName)
            .map(|d| d.value.as_str()),
        trust_domain: trust_domain.as_str(),
    };

    let rendered = spec
        .workload_selector_templates
        .iter()
        .enumerate()
        .map(|(i, t)| {
            template::render(t, &vars).map(|s| (i, s)).map_err(|e| {
                template_refusal(
                    &binding_desc,
                    &format!("spec.workloadSelectorTemplates[{i}]"),
                    &e,
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let confinement = selectors::prove_confinement(
        &binding_desc,
        ns,
        &rendered,
        &pool.match_labels,
        container_selector.as_deref(),
    )?;

    let spiffe_id = compile_spiffe_id(&binding_desc, input, target, pool, &vars, &trust_domain)?;
    if config.svid.is_hub_spiffe_id(&spiffe_id) {
        return Err(Refusal::new(
            Reason::ReservedHubIdentity,
            format!(
                "{binding_desc}: spec.spiffeIDTemplate renders to {spiffe_id:?}, which is the hub's SPIFFE ID: no binding may be issued the hub's identity"
            ),
        ));
    }

    let selectors: Vec<String> = rendered
        .into_iter()
        .map(|(_, s)| s)
        .chain(pool_selectors)
        .chain(container_selector.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();

    let svid = svid::compile_svid(&binding_desc, ns, spec.svid.as_ref(), &vars, &config.svid)?;
    let hint = match spec.mode {
        IdentityMode::PoolOnly => pool.name.clone(),
        IdentityMode::PerObjective => target.name.clone(),
    };
    let spec_out = output::cluster_spiffe_id_spec(output::SpecParts {
        spiffe_id,
        namespace: ns.to_string(),
        pool_labels: pool.match_labels.clone(),
        selectors,
        dns_names: svid.dns_names,
        ttl: svid.ttl,
        jwt_ttl: svid.jwt_ttl,
        federates_with: svid.federates_with,
        class_name: config.class_name.clone(),
        hint,
    });
    Ok(CompiledIdentity {
        binding: BindingRef {
            namespace: ns.to_string(),
            name: input.name.clone(),
        },
        mode: spec.mode,
        pool: PoolKey {
            group: pool.group.clone(),
            namespace: ns.to_string(),
            name: pool.name.clone(),
        },
        service_account: confinement.service_account,
        container_selector,
        output: ClusterSpiffeIdOutput { spec: spec_out },
    })
}

/// Render (or default) the SPIFFE ID and prove it lies in the trust domain under
/// `/ns/<namespace>/`.
fn compile_spiffe_id(
    binding_desc: &str,
    input: &BindingInput,
    target: &TargetView,
    pool: &PoolView,
    vars: &Variables<'_>,
    trust_domain: &TrustDomain,
) -> Result<String, Refusal> {
    let ns = input.namespace.as_str();
    let field = "spec.spiffeIDTemplate";
    let raw = match &input.spec.spiffe_id_template {
        Some(t) => {
            template::render(t, vars).map_err(|e| template_refusal(binding_desc, field, &e))?
        }
        None => default_spiffe_id(
            trust_domain.as_str(),
            ns,
            input.spec.mode,
            target.kind,
            &target.name,
            &pool.name,
        ),
    };
    let id = SpiffeId::parse(&raw).map_err(|e| {
        Refusal::new(
            Reason::InvalidSPIFFEID,
            format!("{binding_desc}: {field} renders to {raw:?}, which is not a SPIFFE ID: {e}"),
        )
    })?;
    if id.trust_domain() != trust_domain {
        return Err(Refusal::new(
            Reason::ForeignTrustDomain,
            format!(
                "{binding_desc}: {field} renders to {raw:?}, outside this cluster's trust domain {trust_domain:?}"
            ),
        ));
    }
    let mut segments = id.segments();
    let confined =
        segments.next() == Some("ns") && segments.next() == Some(ns) && segments.next().is_some();
    if !confined {
        return Err(Refusal::new(
            Reason::SPIFFEIDOutsideNamespace,
            format!(
                "{binding_desc}: {field} renders to {raw:?}; its path must start with \"/ns/{ns}/\" so a tenant can only claim identities of its own namespace"
            ),
        ));
    }
    Ok(id.to_string())
}
