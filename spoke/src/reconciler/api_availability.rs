//! Which of the APIs kleym uses the cluster serves, found through discovery.
//!
//! The reconciler polls discovery for the handful of group-versions it needs (one small
//! `GET /apis/<group>/<version>` each) instead of watching `customresourcedefinitions`:
//! discovery is readable by every authenticated user (`system:discovery`), so the operator
//! needs no RBAC on CRDs, and it also sees APIs served by aggregation rather than by a CRD.
//! A newly served API starts its watch on the next poll; bindings report the missing CRD
//! until then. Transient discovery errors keep the previous answer (no flapping).

use std::collections::BTreeSet;
use std::fmt;

use kleym_api::external::{model, objective, pool, spiffeid};

/// An API (group, version, plural) the reconciler may use and watch: the one list of
/// watched kinds ([`ApiKind::ALL`]). Namespaces are watched too but are not listed: the core
/// API is always served.
///
/// Adding a kind takes, besides a variant here and its entry in [`ApiKind::ALL`]:
/// - its group-version and plural: [`ApiKind::api_version`], [`ApiKind::plural`],
///   [`ApiKind::crd_name`] (exhaustive matches: the compiler asks for them);
/// - a cache: a field of [`super::caches::Caches`] and its arm in
///   [`super::caches::Caches::of_kind`] (exhaustive);
/// - a watch: its arm in [`super::watches::spawn_watch`] (exhaustive) and an `on_*` handler
///   in `watches.rs` that enqueues the bindings a change affects;
/// - if bindings read it: its lookup in `compile::gather` and the compiler's inputs;
/// - outside this crate: the spoke's RBAC (`deploy/spoke/clusterrole.yaml`, the chart's
///   `templates/spoke.yaml`), the CRD fixtures of the e2e tests and `docs/spoke.md`.
///
/// The test `every_kind_has_a_cache_and_a_watch` (`watches.rs`) fails for a kind in
/// [`ApiKind::ALL`] whose watch does not feed its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiKind {
    /// `kleym.io/v1alpha1` `inferenceidentitybindings` (ours; required).
    Bindings,
    /// `llm-d.ai/v1alpha2` `inferenceobjectives` (preferred objective group).
    ObjectivesLlmd,
    /// `inference.networking.x-k8s.io/v1alpha2` `inferenceobjectives`.
    ObjectivesGaie,
    /// `inference.networking.x-k8s.io/v1alpha2` `inferencemodels` (legacy targets).
    Models,
    /// `inference.networking.k8s.io/v1` `inferencepools`.
    PoolsV1,
    /// `inference.networking.x-k8s.io/v1alpha2` `inferencepools` (legacy).
    PoolsLegacy,
    /// `spire.spiffe.io/v1alpha1` `clusterspiffeids`.
    ClusterSpiffeIds,
}

impl ApiKind {
    /// Every API, in a stable order.
    pub const ALL: [ApiKind; 7] = [
        ApiKind::Bindings,
        ApiKind::ObjectivesLlmd,
        ApiKind::ObjectivesGaie,
        ApiKind::Models,
        ApiKind::PoolsV1,
        ApiKind::PoolsLegacy,
        ApiKind::ClusterSpiffeIds,
    ];

    /// `group/version` as discovery serves it.
    pub fn api_version(self) -> String {
        let (g, v) = match self {
            ApiKind::Bindings => (kleym_api::GROUP, kleym_api::VERSION),
            ApiKind::ObjectivesLlmd => (objective::GROUP_LLMD, "v1alpha2"),
            ApiKind::ObjectivesGaie => (objective::GROUP_GAIE, "v1alpha2"),
            ApiKind::Models => (model::GROUP, "v1alpha2"),
            ApiKind::PoolsV1 => (pool::GROUP_V1, "v1"),
            ApiKind::PoolsLegacy => (pool::GROUP_LEGACY, "v1alpha2"),
            ApiKind::ClusterSpiffeIds => (spiffeid::GROUP, "v1alpha1"),
        };
        format!("{g}/{v}")
    }

    /// The resource plural.
    pub fn plural(self) -> &'static str {
        match self {
            ApiKind::Bindings => "inferenceidentitybindings",
            ApiKind::ObjectivesLlmd | ApiKind::ObjectivesGaie => "inferenceobjectives",
            ApiKind::Models => "inferencemodels",
            ApiKind::PoolsV1 | ApiKind::PoolsLegacy => "inferencepools",
            ApiKind::ClusterSpiffeIds => "clusterspiffeids",
        }
    }

    /// The CRD name (`<plural>.<group>`), for messages and errors (a static name: errors
    /// carry it without allocating; a test checks it against [`Self::plural`] and the group).
    pub fn crd_name(self) -> &'static str {
        match self {
            ApiKind::Bindings => "inferenceidentitybindings.kleym.io",
            ApiKind::ObjectivesLlmd => "inferenceobjectives.llm-d.ai",
            ApiKind::ObjectivesGaie => "inferenceobjectives.inference.networking.x-k8s.io",
            ApiKind::Models => "inferencemodels.inference.networking.x-k8s.io",
            ApiKind::PoolsV1 => "inferencepools.inference.networking.k8s.io",
            ApiKind::PoolsLegacy => "inferencepools.inference.networking.x-k8s.io",
            ApiKind::ClusterSpiffeIds => "clusterspiffeids.spire.spiffe.io",
        }
    }
}

impl fmt::Display for ApiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.plural(), self.api_version())
    }
}

/// The set of served APIs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedApis(BTreeSet<ApiKind>);

impl ServedApis {
    /// Nothing served.
    pub fn none() -> Self {
        Self::default()
    }

    /// Everything served (tests).
    pub fn all() -> Self {
        Self(ApiKind::ALL.into_iter().collect())
    }

    /// Builds from a list.
    pub fn from_kinds(kinds: impl IntoIterator<Item = ApiKind>) -> Self {
        Self(kinds.into_iter().collect())
    }

    /// Is `kind` served?
    pub fn serves(&self, kind: ApiKind) -> bool {
        self.0.contains(&kind)
    }

    /// Marks `kind` served or not.
    pub fn set(&mut self, kind: ApiKind, served: bool) {
        if served {
            self.0.insert(kind);
        } else {
            self.0.remove(&kind);
        }
    }

    /// Kinds served here and not in `before`, and kinds served in `before` but not here.
    pub fn diff(&self, before: &ServedApis) -> (Vec<ApiKind>, Vec<ApiKind>) {
        let appeared = self.0.difference(&before.0).copied().collect();
        let vanished = before.0.difference(&self.0).copied().collect();
        (appeared, vanished)
    }

    /// Is any InferenceObjective group served?
    pub fn any_objective(&self) -> bool {
        self.serves(ApiKind::ObjectivesLlmd) || self.serves(ApiKind::ObjectivesGaie)
    }
}

/// Outcome of probing one group-version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Discovery answered with these resource plurals.
    Served(Vec<String>),
    /// The group-version is not served (404).
    NotServed,
    /// Discovery failed otherwise; keep the previous answer.
    Unknown,
}

/// Folds per-group-version probes into the new served set, keeping `previous` for kinds
/// whose probe was inconclusive.
pub fn fold_probes(previous: &ServedApis, probe: impl Fn(&str) -> Probe) -> ServedApis {
    let mut next = previous.clone();
    let mut cache: Vec<(String, Probe)> = Vec::new();
    for kind in ApiKind::ALL {
        let av = kind.api_version();
        let result = match cache.iter().find(|(k, _)| *k == av) {
            Some((_, p)) => p.clone(),
            None => {
                let p = probe(&av);
                cache.push((av.clone(), p.clone()));
                p
            }
        };
        match result {
            Probe::Served(plurals) => next.set(kind, plurals.iter().any(|p| p == kind.plural())),
            Probe::NotServed => next.set(kind, false),
            Probe::Unknown => {}
        }
    }
    next
}

/// Probes one group-version through discovery.
pub async fn probe(client: &kube::Client, api_version: &str) -> Probe {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => Probe::Served(
            list.resources
                .into_iter()
                .filter(|r| !r.name.contains('/'))
                .map(|r| r.name)
                .collect(),
        ),
        Err(kube::Error::Api(status)) if status.code == 404 => Probe::NotServed,
        Err(err) => {
            tracing::debug!(api_version, error = %err, "discovery failed; keeping previous answer");
            Probe::Unknown
        }
    }
}

/// Probes every API kleym uses.
pub async fn discover(client: &kube::Client, previous: &ServedApis) -> ServedApis {
    let mut probes: Vec<(String, Probe)> = Vec::new();
    for kind in ApiKind::ALL {
        let av = kind.api_version();
        if !probes.iter().any(|(k, _)| *k == av) {
            let p = probe(client, &av).await;
            probes.push((av, p));
        }
    }
    fold_probes(previous, |av| {
        probes
            .iter()
            .find(|(k, _)| k == av)
            .map(|(_, p)| p.clone())
            .unwrap_or(Probe::Unknown)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_group_version_serves_several_kinds_independently() {
        let served = fold_probes(&ServedApis::none(), |av| match av {
            "inference.networking.x-k8s.io/v1alpha2" => {
                Probe::Served(vec!["inferencepools".into(), "inferenceobjectives".into()])
            }
            "kleym.io/v1alpha1" => Probe::Served(vec!["inferenceidentitybindings".into()]),
            _ => Probe::NotServed,
        });
        assert!(served.serves(ApiKind::PoolsLegacy));
        assert!(served.serves(ApiKind::ObjectivesGaie));
        assert!(!served.serves(ApiKind::Models));
        assert!(served.serves(ApiKind::Bindings));
        assert!(!served.serves(ApiKind::ClusterSpiffeIds));
        assert!(served.any_objective());
    }

    #[test]
    fn inconclusive_probe_keeps_previous_answer() {
        let before = ServedApis::from_kinds([ApiKind::ClusterSpiffeIds, ApiKind::PoolsV1]);
        let after = fold_probes(&before, |av| match av {
            "spire.spiffe.io/v1alpha1" => Probe::Unknown,
            _ => Probe::NotServed,
        });
        assert!(after.serves(ApiKind::ClusterSpiffeIds));
        assert!(!after.serves(ApiKind::PoolsV1));
        let (appeared, vanished) = after.diff(&before);
        assert!(appeared.is_empty());
        assert_eq!(vanished, vec![ApiKind::PoolsV1]);
    }

    #[test]
    fn crd_names_are_plural_dot_group() {
        assert_eq!(
            ApiKind::ClusterSpiffeIds.crd_name(),
            "clusterspiffeids.spire.spiffe.io"
        );
        assert_eq!(
            ApiKind::ObjectivesLlmd.crd_name(),
            "inferenceobjectives.llm-d.ai"
        );
        for kind in ApiKind::ALL {
            let av = kind.api_version();
            let group = av.split('/').next().unwrap_or_default();
            assert_eq!(kind.crd_name(), format!("{}.{group}", kind.plural()));
        }
    }
}
