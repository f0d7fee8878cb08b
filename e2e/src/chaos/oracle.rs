//! The oracle: what each binding of a spoke must show, computed from the spoke's final
//! objects with the pure compiler (`kleym_spoke::reconciler::evaluation::compile_namespace`,
//! which runs `kleym_spoke::compiler::compile` per binding and the namespace analysis), and
//! the one cluster rule the compiler cannot know: a ClusterSPIFFEID not proven to be the
//! binding's that holds its output name refuses it (`ForeignObjectHoldsName`), as the
//! reconciler's plan does. Nothing here reads what kleym wrote about a binding.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kleym_api::InferenceIdentityBinding;
use kleym_api::conditions::READY;
use kleym_api::external::objective::llmd::InferenceObjective as LlmdObjective;
use kleym_api::external::pool::v1::InferencePool;
use kleym_api::external::spiffeid::{ClusterSPIFFEID, ClusterSPIFFEIDSpec};
use kleym_spoke::compiler::conditions::{ConditionOutcome, build_conditions};
use kleym_spoke::compiler::{
    BindingInput, ClusterConfig, ForeignSpiffeId, Lookup, NamespaceLabels, PoolView, Reason,
    Refusal, TargetView, resolve,
};
use kleym_spoke::ownership::{self, Owner};
use kleym_spoke::reconciler::api_availability::ApiKind;
use kleym_spoke::reconciler::context::DEFAULT_FIELD_MANAGER;
use kleym_spoke::reconciler::evaluation::compile_namespace;
use kube::ResourceExt;
use kubesim_store::Cluster;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::churn::CSIDS;

/// What one live binding must show.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedBinding {
    /// The binding (as listed).
    pub binding: InferenceIdentityBinding,
    /// Its one ClusterSPIFFEID when it is not refused: name, spec and kleym's labels.
    pub output: Option<(String, ClusterSPIFFEIDSpec, BTreeMap<String, String>)>,
    /// `(type, status, reason)` of every condition, sorted by type.
    pub conditions: Vec<(String, String, String)>,
    /// Whether it is Ready.
    pub ready: bool,
    /// What its status shows besides conditions: computed SPIFFE IDs, rendered selectors,
    /// conflict peers and warnings (peers and warnings sorted and de-duplicated, as the
    /// reconciler writes them).
    pub shown: Shown,
}

/// The status fields the compiler decides besides conditions.
#[derive(Clone, Debug, PartialEq)]
pub struct Shown {
    /// `status.computedSpiffeIDs`.
    pub computed_spiffe_ids: Vec<kleym_api::ComputedSpiffeId>,
    /// `status.renderedSelectors`.
    pub rendered_selectors: Vec<String>,
    /// `status.conflictPeers`.
    pub conflict_peers: Vec<kleym_api::ConflictPeer>,
    /// `status.warnings`.
    pub warnings: Vec<kleym_api::IdentityWarning>,
}

impl Shown {
    /// What `status` shows.
    pub fn of(status: &kleym_api::InferenceIdentityBindingStatus) -> Self {
        Self::new(
            status.computed_spiffe_ids.clone(),
            status.rendered_selectors.clone(),
            status.conflict_peers.clone(),
            status.warnings.clone(),
        )
    }

    fn new(
        computed_spiffe_ids: Vec<kleym_api::ComputedSpiffeId>,
        rendered_selectors: Vec<String>,
        mut conflict_peers: Vec<kleym_api::ConflictPeer>,
        mut warnings: Vec<kleym_api::IdentityWarning>,
    ) -> Self {
        conflict_peers.sort();
        conflict_peers.dedup();
        warnings.sort();
        warnings.dedup();
        Self {
            computed_spiffe_ids,
            rendered_selectors,
            conflict_peers,
            warnings,
        }
    }
}

/// The final objects of one spoke and what the oracle expects of them.
#[derive(Debug, Default)]
pub struct SpokeOracle {
    /// Live bindings (no deletion timestamp), by name, with what they must show.
    pub expected: BTreeMap<String, ExpectedBinding>,
    /// Bindings being deleted (a settled fleet has none: kleym's finalizer is gone).
    pub deleting: Vec<String>,
    /// Every ClusterSPIFFEID, by name.
    pub csids: BTreeMap<String, ClusterSPIFFEID>,
    /// Bindings whose object did not parse (name, error): should never happen.
    pub unreadable: Vec<String>,
    /// The live bindings as listed (spec and final status): what the hub's report objects
    /// must show of this spoke, as the report oracle (`crate::report_oracle`) reads them.
    pub listed: Vec<InferenceIdentityBinding>,
}

/// Every object of `(group, version, plural)` in `store` (empty when not served).
pub fn list_values(store: &Cluster, (g, v, p): (&str, &str, &str)) -> Vec<Value> {
    kleym_test_support::env::list(store, g, v, p)
}

fn typed<T: DeserializeOwned>(store: &Cluster, gvp: (&str, &str, &str)) -> Vec<T> {
    list_values(store, gvp)
        .into_iter()
        .filter_map(|o| serde_json::from_value(o).ok())
        .collect()
}

fn served(store: &Cluster, kind: ApiKind) -> bool {
    let gv = kind.api_version();
    let (g, v) = gv.split_once('/').unwrap_or(("", gv.as_str()));
    store.resolve(g, v, kind.plural()).is_some()
}

fn lookup<T: Clone>(served: bool, found: Option<&T>) -> Lookup<T> {
    match (served, found) {
        (false, _) => Lookup::CrdNotServed,
        (true, Some(t)) => Lookup::Found(t.clone()),
        (true, None) => Lookup::NotFound,
    }
}

/// The oracle for one spoke whose hub compiles with `trust_domain` (no SPIRE class).
pub fn spoke_oracle(store: &Cluster, trust_domain: &str) -> SpokeOracle {
    let mut out = SpokeOracle::default();
    let bindings_gvp = ("kleym.io", "v1alpha1", "inferenceidentitybindings");
    let mut bindings = Vec::new();
    for v in list_values(store, bindings_gvp) {
        let name = v["metadata"]["name"].as_str().unwrap_or("?").to_string();
        match serde_json::from_value::<InferenceIdentityBinding>(v) {
            Ok(b) if b.metadata.deletion_timestamp.is_some() => out.deleting.push(name),
            Ok(b) => {
                out.listed.push(b.clone());
                bindings.push(b)
            }
            Err(e) => out.unreadable.push(format!("{name}: {e}")),
        }
    }
    let objectives: BTreeMap<(String, String), TargetView> =
        typed::<LlmdObjective>(store, ("llm-d.ai", "v1alpha2", "inferenceobjectives"))
            .iter()
            .map(|o| {
                (
                    (o.namespace().unwrap_or_default(), o.name_any()),
                    TargetView::from_llmd_objective(o),
                )
            })
            .collect();
    let pools: BTreeMap<(String, String), PoolView> = typed::<InferencePool>(
        store,
        ("inference.networking.k8s.io", "v1", "inferencepools"),
    )
    .iter()
    .map(|p| {
        (
            (p.namespace().unwrap_or_default(), p.name_any()),
            PoolView::from_v1(p),
        )
    })
    .collect();
    out.csids = typed::<ClusterSPIFFEID>(store, CSIDS)
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let foreign: Vec<ForeignSpiffeId> = out
        .csids
        .values()
        .filter_map(|c| ForeignSpiffeId::from_object(c, DEFAULT_FIELD_MANAGER))
        .collect();
    let (llmd, gaie, pools_v1, pools_legacy) = (
        served(store, ApiKind::ObjectivesLlmd),
        served(store, ApiKind::ObjectivesGaie),
        served(store, ApiKind::PoolsV1),
        served(store, ApiKind::PoolsLegacy),
    );
    let mut by_ns: BTreeMap<String, Vec<BindingInput>> = BTreeMap::new();
    for b in &bindings {
        let ns = b.namespace().unwrap_or_default();
        let key = (ns.clone(), b.spec.target_ref.name.clone());
        // The churn's bindings all target InferenceObjectives (llm-d's; none of GAIE's).
        let target = resolve::prefer_objective(
            lookup(llmd, objectives.get(&key)),
            lookup::<TargetView>(gaie, None),
        );
        let pool = match target.found().map(|t| resolve::pool_key(&ns, t)) {
            Some(Ok(k)) if k.group == kleym_api::external::pool::GROUP_V1 => {
                lookup(pools_v1, pools.get(&(ns.clone(), k.name.clone())))
            }
            Some(Ok(k)) if k.group == kleym_api::external::pool::GROUP_LEGACY => {
                lookup::<PoolView>(pools_legacy, None)
            }
            _ => Lookup::NotFound,
        };
        by_ns.entry(ns.clone()).or_default().push(BindingInput {
            namespace: ns,
            name: b.name_any(),
            spec: b.spec.clone(),
            target,
            pool,
        });
    }
    let ns_labels: NamespaceLabels = list_values(store, ("", "v1", "namespaces"))
        .iter()
        .filter_map(|n| {
            let name = n["metadata"]["name"].as_str()?.to_string();
            let labels = n["metadata"]["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, labels))
        })
        .collect();
    let config = ClusterConfig {
        trust_domain: trust_domain.to_string(),
        class_name: None,
        ..ClusterConfig::default()
    };
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    // Collisions are a namespace-wide property: one analysis per namespace.
    let decisions: BTreeMap<String, _> = by_ns
        .iter()
        .map(|(ns, inputs)| {
            let mut labels = NamespaceLabels::new();
            if let Some(l) = ns_labels.get(ns) {
                labels.insert(ns.clone(), l.clone());
            }
            (
                ns.clone(),
                compile_namespace(inputs, &config, &foreign, &labels),
            )
        })
        .collect();
    for b in bindings {
        let ns = b.namespace().unwrap_or_default();
        let name = b.name_any();
        let Some(d) = decisions.get(&ns).and_then(|d| d.get(&name)).cloned() else {
            continue;
        };
        let owner = Owner {
            namespace: ns.clone(),
            name: name.clone(),
            uid: b.uid().unwrap_or_default(),
        };
        let shown = Shown::new(
            d.computed_spiffe_ids.clone(),
            d.rendered_selectors.clone(),
            d.conflict_peers.clone(),
            d.warnings.clone(),
        );
        let (refusal, output) = match (d.refusal, d.output) {
            (Some(r), _) => (Some(r), None),
            (None, Some(o)) => match out.csids.get(&o.name) {
                Some(obj) if ownership::verify(obj, DEFAULT_FIELD_MANAGER, &owner).is_err() => (
                    Some(Refusal::new(Reason::ForeignObjectHoldsName, String::new())),
                    None,
                ),
                _ => (None, Some((o.name, o.spec, o.labels.to_btree_map()))),
            },
            (None, None) => (None, None),
        };
        let outcome = match refusal {
            Some(r) => ConditionOutcome::Refused(r),
            None => ConditionOutcome::Ready {
                message: String::new(),
            },
        };
        let conditions = summarize(&build_conditions(
            &outcome,
            b.metadata.generation,
            &[],
            &now,
        ));
        let ready = conditions.iter().any(|(t, s, _)| t == READY && s == "True");
        out.expected.insert(
            name,
            ExpectedBinding {
                binding: b,
                output,
                conditions,
                ready,
                shown,
            },
        );
    }
    out
}

/// `(type, status, reason)` of each condition, sorted by type.
pub fn summarize(conditions: &[Condition]) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect();
    v.sort();
    v
}
