//! Which ClusterProfile API version the hub reads.
//!
//! cluster-inventory-api v0.2.0 serves `v1alpha2` beside `v1alpha1`; cluster managers and
//! consumers are moving to v1alpha2, which drops the deprecated `status.credentialProviders`.
//! The hub asks the hub cluster's discovery which versions serve `clusterprofiles`
//! ([`discover`]) and [`choose`]s: the version pinned by `--clusterprofile-version`, else
//! v1alpha2 when served, else v1alpha1. Discovery is asked again periodically, so a CRD
//! upgraded while the hub runs is picked up without a restart; the current choice (and why,
//! or why there is none) is kept in an [`InventoryVersion`] that `/readyz`, the status writer
//! and the finalizer code read.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use kleym_api::external::clusterprofile::{ClusterProfileVersion, PLURAL};
use serde::Serialize;

/// What `--clusterprofile-version` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The newest version the hub cluster serves (v1alpha2, else v1alpha1).
    #[default]
    Auto,
    /// Exactly this version; the hub is not ready while the hub cluster does not serve it.
    Pinned(ClusterProfileVersion),
}

impl FromStr for VersionPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        ClusterProfileVersion::parse(s)
            .map(Self::Pinned)
            .ok_or_else(|| format!("{s:?} is not one of auto, v1alpha1, v1alpha2"))
    }
}

impl fmt::Display for VersionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Pinned(v) => f.write_str(v.version()),
        }
    }
}

/// The ClusterProfile versions the hub cluster serves.
pub type ServedVersions = BTreeSet<ClusterProfileVersion>;

/// The version the hub reads, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VersionChoice {
    /// The version read.
    #[serde(rename = "apiVersion", serialize_with = "as_api_version")]
    pub version: ClusterProfileVersion,
    /// Why this version (for the log line and `/readyz`).
    pub reason: String,
}

fn as_api_version<S: serde::Serializer>(
    v: &ClusterProfileVersion,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.api_version())
}

/// Why no version can be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoVersion {
    /// The hub cluster serves no ClusterProfile version at all (CRD not installed).
    #[error(
        "the hub cluster serves no ClusterProfile API (multicluster.x-k8s.io clusterprofiles): \
         install the cluster-inventory-api CRD"
    )]
    NothingServed,
    /// `--clusterprofile-version` names a version the hub cluster does not serve.
    #[error(
        "--clusterprofile-version={pinned} but the hub cluster serves ClusterProfile only as \
         {served}"
    )]
    PinnedNotServed {
        /// The pinned version.
        pinned: &'static str,
        /// The versions served, comma-separated.
        served: String,
    },
}

/// Picks the version to read from what the hub cluster serves (pure; see the module
/// documentation for the order).
pub fn choose(policy: VersionPolicy, served: &ServedVersions) -> Result<VersionChoice, NoVersion> {
    match policy {
        VersionPolicy::Pinned(v) if served.contains(&v) => Ok(VersionChoice {
            version: v,
            reason: "pinned by --clusterprofile-version".to_string(),
        }),
        VersionPolicy::Pinned(_) if served.is_empty() => Err(NoVersion::NothingServed),
        VersionPolicy::Pinned(v) => Err(NoVersion::PinnedNotServed {
            pinned: v.version(),
            served: served
                .iter()
                .map(|s| s.version())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        VersionPolicy::Auto => {
            if served.contains(&ClusterProfileVersion::V1alpha2) {
                Ok(VersionChoice {
                    version: ClusterProfileVersion::V1alpha2,
                    reason: "the hub cluster serves v1alpha2, the newest version \
                             (accessProviders only)"
                        .to_string(),
                })
            } else if served.contains(&ClusterProfileVersion::V1alpha1) {
                Ok(VersionChoice {
                    version: ClusterProfileVersion::V1alpha1,
                    reason: "the hub cluster does not serve v1alpha2 \
                             (accessProviders, then credentialProviders)"
                        .to_string(),
                })
            } else {
                Err(NoVersion::NothingServed)
            }
        }
    }
}

/// Asks the hub cluster's discovery which versions serve `clusterprofiles`. A version whose
/// group-version is absent (404) is not served; any other error is returned (the caller keeps
/// its last answer and asks again later).
pub async fn discover(client: &kube::Client) -> Result<ServedVersions, kube::Error> {
    let mut served = ServedVersions::new();
    for v in ClusterProfileVersion::ALL {
        match client.list_api_group_resources(v.api_version()).await {
            Ok(list) => {
                if list.resources.iter().any(|r| r.name == PLURAL) {
                    served.insert(v);
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(served)
}

/// The ClusterProfile version the hub currently reads, shared by the inventory watch (which
/// sets it) and the readers (`/readyz`, the status writer, the profile finalizer). Clones
/// share the value.
#[derive(Clone, Debug, Default)]
pub struct InventoryVersion(Arc<RwLock<Option<Result<VersionChoice, NoVersion>>>>);

impl InventoryVersion {
    /// A handle that already reads `version` (tests, and callers that do not discover).
    pub fn fixed(version: ClusterProfileVersion) -> Self {
        let this = Self::default();
        this.set(Ok(VersionChoice {
            version,
            reason: "fixed".to_string(),
        }));
        this
    }

    /// The version read now; `None` before the first discovery or while none can be read.
    pub fn current(&self) -> Option<ClusterProfileVersion> {
        match &*self.0.read().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(c)) => Some(c.version),
            _ => None,
        }
    }

    /// The version to write about profiles with: the one read, or v1alpha1 (served by every
    /// cluster-inventory-api release) before anything was read.
    pub fn for_writes(&self) -> ClusterProfileVersion {
        self.current().unwrap_or(ClusterProfileVersion::V1alpha1)
    }

    /// The last outcome of [`choose`] (`None` before the first discovery).
    pub fn outcome(&self) -> Option<Result<VersionChoice, NoVersion>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records a new outcome; returns whether it differs from the previous one.
    pub(crate) fn set(&self, outcome: Result<VersionChoice, NoVersion>) -> bool {
        let mut cur = self.0.write().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref() == Some(&outcome) {
            return false;
        }
        *cur = Some(outcome);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClusterProfileVersion::{V1alpha1, V1alpha2};

    fn served(vs: &[ClusterProfileVersion]) -> ServedVersions {
        vs.iter().copied().collect()
    }

    #[test]
    fn auto_prefers_v1alpha2_and_falls_back_to_v1alpha1() {
        let both = choose(VersionPolicy::Auto, &served(&[V1alpha1, V1alpha2])).unwrap();
        assert_eq!(both.version, V1alpha2);
        assert!(both.reason.contains("serves v1alpha2"), "{}", both.reason);
        let only_new = choose(VersionPolicy::Auto, &served(&[V1alpha2])).unwrap();
        assert_eq!(only_new.version, V1alpha2);
        let old = choose(VersionPolicy::Auto, &served(&[V1alpha1])).unwrap();
        assert_eq!(old.version, V1alpha1);
        assert!(
            old.reason.contains("does not serve v1alpha2"),
            "{}",
            old.reason
        );
        assert_eq!(
            choose(VersionPolicy::Auto, &served(&[])),
            Err(NoVersion::NothingServed)
        );
    }

    #[test]
    fn a_pin_is_honoured_or_named_when_not_served() {
        for v in ClusterProfileVersion::ALL {
            let c = choose(VersionPolicy::Pinned(v), &served(&[V1alpha1, V1alpha2])).unwrap();
            assert_eq!(c.version, v);
        }
        let err = choose(VersionPolicy::Pinned(V1alpha2), &served(&[V1alpha1])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--clusterprofile-version=v1alpha2 but the hub cluster serves ClusterProfile only \
             as v1alpha1"
        );
        assert_eq!(
            choose(VersionPolicy::Pinned(V1alpha1), &served(&[])),
            Err(NoVersion::NothingServed)
        );
    }

    #[test]
    fn the_flag_parses_and_prints() {
        for s in ["auto", "v1alpha1", "v1alpha2"] {
            assert_eq!(s.parse::<VersionPolicy>().unwrap().to_string(), s);
        }
        let err = "v1beta1".parse::<VersionPolicy>().unwrap_err();
        assert!(err.contains("auto, v1alpha1, v1alpha2"), "{err}");
    }

    #[test]
    fn the_shared_handle_reports_changes_only() {
        let h = InventoryVersion::default();
        assert_eq!(h.current(), None);
        assert_eq!(h.for_writes(), V1alpha1);
        let c = choose(VersionPolicy::Auto, &served(&[V1alpha1, V1alpha2]));
        assert!(h.set(c.clone()));
        assert!(!h.set(c));
        assert_eq!(h.clone().current(), Some(V1alpha2));
        assert!(h.set(Err(NoVersion::NothingServed)));
        assert_eq!(h.current(), None);
    }
}
