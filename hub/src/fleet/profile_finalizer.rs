//! kleym's finalizer on ClusterProfiles, `kleym.io/spoke-removal`.
//!
//! The leader puts it on a profile before the spoke's reconciler first writes anything, so
//! deleting the profile leaves it in place (with a `deletionTimestamp`) until the removal
//! policy has run — even when the profile is deleted while the spoke is waiting or refused,
//! while this replica is on standby, or while no hub runs at all: the next leader finds the
//! profile in its initial list. The hub removes the finalizer when removal is done (or gave
//! up), or when the profile leaves `--clusterprofile-selector`.
//!
//! Every write is a metadata-only merge patch carrying the `resourceVersion` it was computed
//! from: a concurrent change fails with 409 (then the profile is read again), so another
//! controller's finalizers are never lost, and a patch never creates a profile.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kleym_api::external::clusterprofile::{
    ClusterProfile, ClusterProfileVersion, VersionedClusterProfile,
};
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use serde_json::json;

use super::errors::EngageError;
use super::state::ErrorCategory;

/// The finalizer kleym's hub puts on every ClusterProfile it engages.
pub const PROFILE_FINALIZER: &str = "kleym.io/spoke-removal";

/// Action named in errors of [`ensure`].
pub(crate) const ADD_ACTION: &str =
    "adding finalizer kleym.io/spoke-removal to the ClusterProfile (hub cluster)";
/// Action named in errors of [`release`].
pub(crate) const REMOVE_ACTION: &str =
    "removing finalizer kleym.io/spoke-removal from the ClusterProfile (hub cluster)";
const READ_ACTION: &str = "reading the ClusterProfile (hub cluster)";

/// A 409 means someone changed the profile between our read and our write; give up on the
/// write after this many in a row (the caller backs off and tries again).
const CONFLICT_ATTEMPTS: usize = 5;

/// One ClusterProfile, by namespace, name and (when known) UID: a recreated profile of the
/// same name is another object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProfileRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

impl ProfileRef {
    /// The reference of a watched profile.
    pub fn of(cp: &ClusterProfile) -> Self {
        Self {
            namespace: cp
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: cp.metadata.name.clone().unwrap_or_default(),
            uid: cp.metadata.uid.clone(),
        }
    }

    /// Whether `uid` is this profile's (an unknown UID matches anything).
    fn same_object(&self, uid: Option<&str>) -> bool {
        match (&self.uid, uid) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

impl std::fmt::Display for ProfileRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Kubernetes timestamp as chrono's (second precision is all a deadline needs).
pub(crate) fn to_utc(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(t.0.as_second(), 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Whether the profile carries kleym's finalizer.
pub fn has_profile_finalizer(cp: &ClusterProfile) -> bool {
    contains(cp.metadata.finalizers.as_deref())
}

fn contains(finalizers: Option<&[String]>) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|x| x == PROFILE_FINALIZER))
}

/// `finalizers` plus ours, in order, without duplicating it (kube-apiserver treats the list
/// as a set).
pub(crate) fn with_ours(finalizers: &[String]) -> Vec<String> {
    let mut out = finalizers.to_vec();
    if !out.iter().any(|f| f == PROFILE_FINALIZER) {
        out.push(PROFILE_FINALIZER.to_string());
    }
    out
}

/// `finalizers` without ours, order kept.
pub(crate) fn without_ours(finalizers: &[String]) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| *f != PROFILE_FINALIZER)
        .cloned()
        .collect()
}

/// The profile's metadata as last seen.
#[derive(Clone, Debug, Default)]
struct Seen {
    uid: Option<String>,
    resource_version: Option<String>,
    finalizers: Vec<String>,
    deleting: bool,
}

impl Seen {
    fn from_meta(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Self {
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            finalizers: m.finalizers.clone().unwrap_or_default(),
            deleting: m.deletion_timestamp.is_some(),
        }
    }
}

/// What [`ensure`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// The profile carries the finalizer (it did, or now does): engaging is safe.
    Present,
    /// The profile is being deleted (no finalizer can be added any more): do not engage.
    Deleting,
    /// The profile is gone, or its name now belongs to another object: do not engage.
    Gone,
}

/// What [`release`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// The finalizer was removed.
    Removed,
    /// The profile did not carry it.
    Absent,
    /// The profile is gone (or was replaced by another object of the same name).
    Gone,
}

async fn bounded<T>(
    limit: Duration,
    action: &'static str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, EngageError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(|source| EngageError::Kube { action, source }),
        Err(_) => Err(EngageError::Timeout {
            action,
            seconds: limit.as_secs(),
            category: ErrorCategory::Unreachable,
        }),
    }
}

/// The profiles of `namespace`, read and written through `version` (the one the inventory
/// reads: the finalizer works the same whichever version the hub cluster serves).
fn profiles(
    hub: &kube::Client,
    namespace: &str,
    version: ClusterProfileVersion,
) -> Api<VersionedClusterProfile> {
    Api::namespaced_with(hub.clone(), namespace, &version.api_resource())
}

async fn read(
    api: &Api<VersionedClusterProfile>,
    name: &str,
    limit: Duration,
) -> Result<Option<Seen>, EngageError> {
    let got: Option<PartialObjectMeta<VersionedClusterProfile>> =
        bounded(limit, READ_ACTION, api.get_metadata_opt(name)).await?;
    Ok(got.map(|m| Seen::from_meta(&m.metadata)))
}

fn is_code(e: &EngageError, code: u16) -> bool {
    matches!(e, EngageError::Kube { source: kube::Error::Api(s), .. } if s.code == code)
}

/// Sets the profile's finalizers to `finalizers`, guarded by `rv`.
async fn write(
    api: &Api<VersionedClusterProfile>,
    name: &str,
    finalizers: Vec<String>,
    rv: Option<&str>,
    action: &'static str,
    limit: Duration,
) -> Result<(), EngageError> {
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": rv}});
    bounded(
        limit,
        action,
        api.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    .map(|_| ())
}

/// Makes sure the profile carries [`PROFILE_FINALIZER`], starting from `known` (the watched
/// object; read from the API when absent or stale). Each request is bounded by `limit`.
pub(crate) async fn ensure(
    hub: &kube::Client,
    version: ClusterProfileVersion,
    profile: &ProfileRef,
    known: Option<&ClusterProfile>,
    limit: Duration,
) -> Result<Ensured, EngageError> {
    let api = profiles(hub, &profile.namespace, version);
    let mut seen = match known {
        Some(cp) => Some(Seen::from_meta(&cp.metadata)),
        None => read(&api, &profile.name, limit).await?,
    };
    let mut attempts = 0;
    loop {
        let Some(s) = seen.take() else {
            return Ok(Ensured::Gone);
        };
        if !profile.same_object(s.uid.as_deref()) {
            return Ok(Ensured::Gone);
        }
        if contains(Some(&s.finalizers)) {
            return Ok(Ensured::Present);
        }
        if s.deleting {
            return Ok(Ensured::Deleting);
        }
        attempts += 1;
        let r = write(
            &api,
            &profile.name,
            with_ours(&s.finalizers),
            s.resource_version.as_deref(),
            ADD_ACTION,
            limit,
        )
        .await;
        match r {
            Ok(()) => return Ok(Ensured::Present),
            Err(e) if is_code(&e, 404) => return Ok(Ensured::Gone),
            Err(e) if is_code(&e, 409) && attempts < CONFLICT_ATTEMPTS => {
                seen = read(&api, &profile.name, limit).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Removes [`PROFILE_FINALIZER`] from the profile (read fresh; never from another object of
/// the same name). Each request is bounded by `limit`.
pub(crate) async fn release(
    hub: &kube::Client,
    version: ClusterProfileVersion,
    profile: &ProfileRef,
    limit: Duration,
) -> Result<Released, EngageError> {
    let api = profiles(hub, &profile.namespace, version);
    let mut attempts = 0;
    loop {
        let Some(s) = read(&api, &profile.name, limit).await? else {
            return Ok(Released::Gone);
        };
        if !profile.same_object(s.uid.as_deref()) {
            return Ok(Released::Gone);
        }
        if !contains(Some(&s.finalizers)) {
            return Ok(Released::Absent);
        }
        attempts += 1;
        let r = write(
            &api,
            &profile.name,
            without_ours(&s.finalizers),
            s.resource_version.as_deref(),
            REMOVE_ACTION,
            limit,
        )
        .await;
        match r {
            Ok(()) => return Ok(Released::Removed),
            Err(e) if is_code(&e, 404) => return Ok(Released::Gone),
            Err(e) if is_code(&e, 409) && attempts < CONFLICT_ATTEMPTS => {}
            Err(e) => return Err(e),
        }
    }
}

/// What a GET of a profile that left the watch found (see [`look_up`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// 404, or the name now belongs to another object.
    Gone,
    /// Still there: it left the selection (or is being deleted, `deleting_since`).
    Present {
        deleting_since: Option<DateTime<Utc>>,
        has_finalizer: bool,
    },
}

/// Reads the profile once to tell "deleted" from "no longer selected".
pub(crate) async fn look_up(
    hub: &kube::Client,
    version: ClusterProfileVersion,
    profile: &ProfileRef,
    limit: Duration,
) -> Result<Lookup, EngageError> {
    let api = profiles(hub, &profile.namespace, version);
    let got: Option<PartialObjectMeta<VersionedClusterProfile>> =
        bounded(limit, READ_ACTION, api.get_metadata_opt(&profile.name)).await?;
    Ok(match got {
        Some(m) if profile.same_object(m.metadata.uid.as_deref()) => Lookup::Present {
            deleting_since: m.metadata.deletion_timestamp.as_ref().map(to_utc),
            has_finalizer: contains(m.metadata.finalizers.as_deref()),
        },
        _ => Lookup::Gone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finalizer_lists_are_sets_and_keep_other_entries_in_order() {
        assert_eq!(with_ours(&[]), v(&[PROFILE_FINALIZER]));
        assert_eq!(
            with_ours(&v(&["a", "b"])),
            v(&["a", "b", PROFILE_FINALIZER])
        );
        assert_eq!(
            with_ours(&v(&["a", PROFILE_FINALIZER, "b"])),
            v(&["a", PROFILE_FINALIZER, "b"])
        );
        assert_eq!(
            without_ours(&v(&["a", PROFILE_FINALIZER, "b"])),
            v(&["a", "b"])
        );
        assert_eq!(without_ours(&v(&["a"])), v(&["a"]));
    }

    #[test]
    fn a_profile_ref_matches_only_its_own_uid() {
        let r = ProfileRef {
            namespace: "fleet".into(),
            name: "c1".into(),
            uid: Some("u1".into()),
        };
        assert!(r.same_object(Some("u1")));
        assert!(!r.same_object(Some("u2")));
        assert!(r.same_object(None));
        assert_eq!(r.to_string(), "fleet/c1");
        let unknown = ProfileRef { uid: None, ..r };
        assert!(unknown.same_object(Some("u2")));
    }
}
