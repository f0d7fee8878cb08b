//! The API writes of a reconcile: server-side apply of the ClusterSPIFFEID and of the
//! binding status (field manager `kleym`), deletes with a UID precondition, and finalizer
//! patches with a resourceVersion precondition. Every write is counted in the metrics.
//!
//! [`apply_output`] is the reconcile's apply step: it carries out a [`BindingPlan`]'s
//! ClusterSPIFFEID writes and remembers what they returned (read-your-writes).

use std::sync::Arc;

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_api::{InferenceIdentityBinding, InferenceIdentityBindingStatus, OwnedClusterSpiffeId};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::core::Status;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::caches::Cache;
use super::effects::Effects;
use super::error::Error;
use super::lean::{Lean, from_json};
use super::list_watch::peek_object_head;
use super::observed_output::ObservedOutput;
use super::plan::{BindingPlan, name_taken};
use super::queue::ObjectKey;
use super::state::SpokeState;
use crate::compiler::Refusal;
use crate::ownership::Foreign;

/// What the apply step did to the binding's ClusterSPIFFEID.
#[derive(Debug)]
pub struct Applied {
    /// The ownership record now (the apply's result, or the plan's when nothing was
    /// written or the write failed).
    pub owned: Option<OwnedClusterSpiffeId>,
    /// Set when creating conflicted: an object appeared under the name meanwhile. Replaces
    /// the plan's refusal.
    pub refusal: Option<Refusal>,
    /// The write failed (RBAC, apiserver errors): the status says pending, and the
    /// reconcile fails with this error after the status is written.
    pub failure: Option<ApplyFailure>,
}

/// A failed ClusterSPIFFEID write.
#[derive(Debug)]
pub struct ApplyFailure {
    /// For the `Ready=False` condition.
    pub message: String,
    /// The error the reconcile ends with.
    pub error: Error,
}

/// The apply step: deletes the plan's withdrawn object and applies its output. A delete
/// failure ends the reconcile (`Err`); an apply failure is reported in [`Applied`] so the
/// status can say so first.
pub async fn apply_output(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    plan: &BindingPlan,
) -> Result<Applied, Error> {
    if let Some(gone) = &plan.delete {
        delete_cluster_spiffe_id(fx, &gone.name, &gone.uid).await?;
        state.record_cluster_spiffe_id_deleted(&gone.name, &gone.uid);
    }
    let mut applied = Applied {
        owned: plan.owned.clone(),
        refusal: None,
        failure: None,
    };
    let Some(write) = &plan.write else {
        return Ok(applied);
    };
    let name = write.object.name_any();
    let base = state
        .current_cluster_spiffe_id(&name)
        .and_then(|current| current.resource_version());
    let written = apply_cluster_spiffe_id(fx, field_manager, &write.object, !write.creates, || {
        newer_in_cache(&state.caches.cluster_spiffe_ids, "", &name, base.as_deref())
    });
    match written.await {
        Ok(Returned::Decoded(written)) => {
            applied.owned = Some(OwnedClusterSpiffeId {
                name: written.name_any(),
                uid: written.uid().unwrap_or_default(),
            });
            state
                .csid_overlay
                .record(ObservedOutput::observe(written, field_manager));
        }
        // The cache holds it already: nothing to remember.
        Ok(Returned::Delivered(observed)) => {
            applied.owned = Some(OwnedClusterSpiffeId {
                name: observed.name_any(),
                uid: observed.uid().unwrap_or_default(),
            });
        }
        // Creating without force conflicted: someone else's object holds the name.
        Err(e) if write.creates && e.status_code() == Some(409) => {
            applied.refusal = Some(name_taken(&Foreign {
                object: name,
                why: "it appeared while kleym was creating it (the apply conflicted)".into(),
            }));
            applied.owned = None;
        }
        Err(e) => {
            applied.failure = Some(ApplyFailure {
                message: format!("could not write ClusterSPIFFEID {name}: {e}"),
                error: e,
            });
        }
    }
    Ok(applied)
}

/// Sets the binding's finalizers to `finalizers` and returns the binding as written.
pub async fn write_finalizers(
    state: &SpokeState,
    fx: &Effects,
    field_manager: &str,
    key: &ObjectKey,
    binding: &InferenceIdentityBinding,
    finalizers: Vec<String>,
) -> Result<Arc<InferenceIdentityBinding>, Error> {
    let base = binding.resource_version();
    let updated = set_finalizers(fx, field_manager, binding, finalizers, || {
        newer_in_cache(
            &state.caches.bindings,
            &key.namespace,
            &key.name,
            base.as_deref(),
        )
    })
    .await?;
    Ok(record_binding(state, key, updated))
}

/// The binding a write returned, as the reconcile goes on with it: remembered when decoded
/// (read-your-writes), the cache's own copy when the watch delivered it first.
pub fn record_binding(
    state: &SpokeState,
    key: &ObjectKey,
    returned: Returned<InferenceIdentityBinding, InferenceIdentityBinding>,
) -> Arc<InferenceIdentityBinding> {
    match returned {
        Returned::Decoded(updated) => state.record_binding_write(key, updated),
        Returned::Delivered(cached) => cached,
    }
}

/// Server-side applies `obj`. Creating (`force = false`) never takes fields over from
/// another manager: if a foreign object appeared under our name since the cache saw it,
/// the apply conflicts (409) instead of modifying it.
///
/// `delivered` is asked, once the response is in, for the watch's copy of the object (see
/// [`send_write`]).
pub async fn apply_cluster_spiffe_id(
    fx: &Effects,
    field_manager: &str,
    obj: &ClusterSPIFFEID,
    force: bool,
    delivered: impl FnOnce() -> Option<Arc<ObservedOutput>>,
) -> Result<Returned<ClusterSPIFFEID, ObservedOutput>, Error> {
    let name = obj.name_any();
    let mut pp = PatchParams::apply(field_manager);
    pp.force = force;
    fx.metrics.count_write("clusterspiffeid_apply");
    let url = ClusterSPIFFEID::url_path(&(), None);
    let request = kube::core::Request::new(url).patch(&name, &pp, &Patch::Apply(obj));
    send_write(fx, request, delivered)
        .await
        .map_err(|e| Error::kube(format!("apply ClusterSPIFFEID {name}"), e))
}

/// Deletes our ClusterSPIFFEID `name` only if it still has `uid`. Returns `Ok` when it is
/// gone or is another incarnation (not ours).
pub async fn delete_cluster_spiffe_id(fx: &Effects, name: &str, uid: &str) -> Result<(), Error> {
    let api: Api<ClusterSPIFFEID> = Api::all(fx.client.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    fx.metrics.count_write("clusterspiffeid_delete");
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        // 404: already gone; 409: the UID precondition failed, the object is not ours.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete ClusterSPIFFEID {name}"), e)),
    }
}

/// Server-side applies the binding's status subresource. `delivered`: as for
/// [`send_write`].
pub async fn apply_status(
    fx: &Effects,
    field_manager: &str,
    binding: &InferenceIdentityBinding,
    status: &InferenceIdentityBindingStatus,
    delivered: impl FnOnce() -> Option<Arc<InferenceIdentityBinding>>,
) -> Result<Returned<InferenceIdentityBinding, InferenceIdentityBinding>, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let api_version = InferenceIdentityBinding::api_version(&());
    let kind = InferenceIdentityBinding::kind(&());
    let body = StatusApply {
        api_version: &api_version,
        kind: &kind,
        metadata: NameRef {
            name: &name,
            namespace: &ns,
        },
        status,
    };
    let pp = PatchParams::apply(field_manager).force();
    fx.metrics.count_write("status_apply");
    let url = InferenceIdentityBinding::url_path(&(), Some(&ns));
    let request =
        kube::core::Request::new(url).patch_subresource("status", &name, &pp, &Patch::Apply(&body));
    send_write(fx, request, delivered).await.map_err(|e| {
        Error::kube(
            format!("apply status of InferenceIdentityBinding {ns}/{name}"),
            e,
        )
    })
}

/// The applied configuration of a status write. Typed rather than `json!`: that copied the
/// whole status into a `serde_json::Value` tree on every write only to serialize it again.
/// The same JSON object (keys in the status type's order rather than sorted).
#[derive(Debug, Serialize)]
struct StatusApply<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    metadata: NameRef<'a>,
    status: &'a InferenceIdentityBindingStatus,
}

/// `metadata` naming an object and nothing else.
#[derive(Debug, Serialize)]
struct NameRef<'a> {
    name: &'a str,
    namespace: &'a str,
}

/// Sets the binding's finalizers to `finalizers`, guarded by the cached resourceVersion
/// (a concurrent change by someone else makes this fail with 409 and retry). `delivered`:
/// as for [`send_write`].
pub async fn set_finalizers(
    fx: &Effects,
    field_manager: &str,
    binding: &InferenceIdentityBinding,
    finalizers: Vec<String>,
    delivered: impl FnOnce() -> Option<Arc<InferenceIdentityBinding>>,
) -> Result<Returned<InferenceIdentityBinding, InferenceIdentityBinding>, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = binding.name_any();
    let body = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": binding.resource_version(),
        }
    });
    fx.metrics.count_write("finalizer");
    let pp = PatchParams {
        field_manager: Some(field_manager.to_string()),
        ..PatchParams::default()
    };
    let url = InferenceIdentityBinding::url_path(&(), Some(&ns));
    let request = kube::core::Request::new(url).patch(&name, &pp, &Patch::Merge(&body));
    send_write(fx, request, delivered).await.map_err(|e| {
        Error::kube(
            format!("update finalizers of InferenceIdentityBinding {ns}/{name}"),
            e,
        )
    })
}

/// What a write returned.
#[derive(Debug)]
pub enum Returned<K, C> {
    /// The object in the response, decoded.
    Decoded(K),
    /// The watch had delivered this very version already (same name, resourceVersion):
    /// the cache's copy, the response not decoded a second time.
    Delivered(Arc<C>),
}

/// Sends a write built by `request` and reads the object the API server returns, as
/// [`Lean`] (without the field sets the ownership proof does not read).
///
/// What `Api::patch` does, without two copies per write: kube reads the body into a
/// `String` (a copy and a UTF-8 pass over it) to decode it with `from_str`; this checks the
/// received bytes' UTF-8 and decodes them in place ([`from_json`]). And no `Api` handle is
/// built per write. Errors are kube's own: an error status becomes
/// [`kube::Error::Api`] with the server's `Status`, or one made from the body and the code
/// when the body is not a `Status`, as kube-client does.
///
/// The response and the watch event of a write travel apart, and either can be read first
/// (kubesim sends both at once; the echo found first is decoded whole). When the event came
/// first, `delivered` (asked once the response is in) gives the cache's copy, and if the
/// response is that version of that object its head is all that is read. An echo that
/// comes after the response is the overlay's object, even after later writes of the same
/// object (the overlay keeps the last few), so each version is decoded once.
async fn send_write<K: DeserializeOwned, C: Resource>(
    fx: &Effects,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    delivered: impl FnOnce() -> Option<Arc<C>>,
) -> Result<Returned<K, C>, kube::Error> {
    let request = request.map_err(kube::Error::BuildRequest)?;
    let (status, body) = fx.send_write(request).await?;
    if status.is_client_error() || status.is_server_error() {
        return Err(api_error(status, &body));
    }
    if let Some(copy) = delivered().and_then(|cached| same_version(&body, cached)) {
        return Ok(Returned::Delivered(copy));
    }
    from_json::<Lean<K>>(&body)
        .map(|Lean(written)| Returned::Decoded(written))
        .map_err(kube::Error::SerdeError)
}

/// `cached` when `object` (a response's bytes) is the same version of the same object.
fn same_version<C: Resource>(object: &[u8], cached: Arc<C>) -> Option<Arc<C>> {
    let head = peek_object_head(object)?;
    let meta = cached.meta();
    let same = meta.name.as_deref() == Some(head.name.as_str())
        && meta.namespace.as_deref().unwrap_or_default() == head.namespace
        && meta.resource_version.as_deref() == Some(head.resource_version.as_str());
    same.then_some(cached)
}

/// The cache's copy of `namespace/name` when its watch moved past `base_rv`, the version
/// the write started from (`None`: there was none): only then can the watch have delivered
/// the write's result before its response was read, so only then is the response's head
/// read twice. Numeric resourceVersions only, as in the overlay; otherwise `None` (the
/// response is decoded).
pub fn newer_in_cache<C: Resource + Clone>(
    cache: &Cache<C>,
    namespace: &str,
    name: &str,
    base_rv: Option<&str>,
) -> Option<Arc<C>> {
    let cached = cache.get(namespace, name)?;
    let cached_rv = cached
        .meta()
        .resource_version
        .as_deref()?
        .parse::<u64>()
        .ok()?;
    match base_rv {
        None => Some(cached),
        Some(base) => (cached_rv > base.parse::<u64>().ok()?).then_some(cached),
    }
}

/// The error of a write answered with `status`: the server's `Status`, or (a proxy's page,
/// a path the server does not serve) one carrying the body's text and the code.
fn api_error(status: http::StatusCode, body: &[u8]) -> kube::Error {
    let status = serde_json::from_slice::<Status>(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(body);
        Status::failure(text.trim(), "Failed to parse error data").with_code(status.as_u16())
    });
    kube::Error::Api(status.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::{ConflictPeer, IdentityWarning};

    fn config_map(name: &str, rv: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("llm".into());
        cm.metadata.resource_version = Some(rv.into());
        cm
    }

    /// A response body as the API server writes a custom resource: keys in order, so
    /// `managedFields` before `name`.
    fn response(name: &str, rv: &str) -> Vec<u8> {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "creationTimestamp": "2026-11-28T10:00:00Z",
                "managedFields": [{"manager": "kleym", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {}}}],
                "name": name, "namespace": "llm", "resourceVersion": rv, "uid": "u"
            },
            "data": {"k": "v"}
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn the_watchs_copy_stands_for_the_same_version_only() {
        let cached = Arc::new(config_map("a", "7"));
        let same = same_version(&response("a", "7"), cached.clone());
        assert!(same.is_some_and(|c| Arc::ptr_eq(&c, &cached)));
        assert!(same_version(&response("a", "8"), cached.clone()).is_none());
        assert!(same_version(&response("b", "7"), cached.clone()).is_none());
        let mut other_ns = config_map("a", "7");
        other_ns.metadata.namespace = Some("other".into());
        assert!(same_version(&response("a", "7"), Arc::new(other_ns)).is_none());
        assert!(same_version(b"not json", cached.clone()).is_none());
        assert!(same_version(b"{\"metadata\":{\"name\":\"a\"}}", cached).is_none());
    }

    #[test]
    fn only_a_cache_past_the_writes_base_is_consulted() {
        use kube::runtime::watcher::Event;
        let cache: Cache<k8s_openapi::api::core::v1::ConfigMap> = Cache::default();
        assert!(
            newer_in_cache(&cache, "llm", "a", None).is_none(),
            "nothing cached"
        );
        cache.apply(Event::Apply(Arc::new(config_map("a", "12"))));
        let rv = |c: Option<Arc<k8s_openapi::api::core::v1::ConfigMap>>| {
            c.and_then(|c| c.metadata.resource_version.clone())
        };
        assert_eq!(
            rv(newer_in_cache(&cache, "llm", "a", None)).as_deref(),
            Some("12")
        );
        assert_eq!(
            rv(newer_in_cache(&cache, "llm", "a", Some("9"))).as_deref(),
            Some("12")
        );
        // Numerically, not as text ("12" < "9").
        assert!(
            newer_in_cache(&cache, "llm", "a", Some("12")).is_none(),
            "not moved"
        );
        assert!(newer_in_cache(&cache, "llm", "a", Some("13")).is_none());
        assert!(newer_in_cache(&cache, "llm", "a", Some("opaque")).is_none());
        assert!(newer_in_cache(&cache, "llm", "b", Some("1")).is_none());
        cache.apply(Event::Apply(Arc::new(config_map("c", "x1"))));
        assert!(
            newer_in_cache(&cache, "llm", "c", None).is_none(),
            "opaque version"
        );
    }

    #[test]
    fn an_error_status_is_the_servers_or_made_from_the_body() {
        let conflict = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Apply failed with 1 conflict","reason":"Conflict","code":409}"#;
        let kube::Error::Api(status) = api_error(http::StatusCode::CONFLICT, conflict) else {
            panic!("not an API error");
        };
        assert_eq!(status.code, 409);
        assert_eq!(status.reason, "Conflict");
        assert_eq!(status.message, "Apply failed with 1 conflict");

        // A proxy's page: kube-client's fallback, the text and the response's code.
        let kube::Error::Api(status) =
            api_error(http::StatusCode::BAD_GATEWAY, b"  upstream unreachable\n")
        else {
            panic!("not an API error");
        };
        assert_eq!(status.code, 502);
        assert_eq!(status.message, "upstream unreachable");
        assert_eq!(status.reason, "Failed to parse error data");
        let err = Error::kube("apply ClusterSPIFFEID x", kube::Error::Api(status));
        assert_eq!(err.status_code(), Some(502));
    }

    #[test]
    fn status_apply_body_is_the_json_it_replaced() {
        let status = InferenceIdentityBindingStatus {
            conflict_peers: vec![ConflictPeer {
                name: "b".into(),
                reason: "IdentityCollision".into(),
            }],
            warnings: vec![IdentityWarning {
                reason: "Overlap".into(),
                message: "m \"quoted\"".into(),
            }],
            observed_generation: Some(3),
            ..Default::default()
        };
        let typed = StatusApply {
            api_version: "kleym.io/v1alpha1",
            kind: "InferenceIdentityBinding",
            metadata: NameRef {
                name: "a",
                namespace: "llm",
            },
            status: &status,
        };
        let untyped = json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "InferenceIdentityBinding",
            "metadata": { "name": "a", "namespace": "llm" },
            "status": status,
        });
        assert_eq!(serde_json::to_value(&typed).unwrap(), untyped);
    }
}
