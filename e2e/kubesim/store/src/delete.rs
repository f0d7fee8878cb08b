//! Deletion: preconditions, finalizers, propagation policies and garbage collection of
//! dependents (done synchronously, inside the deleting call), namespace termination, and
//! what deleting a CRD does to its objects.

use crate::kinds::{CRDS, NAMESPACES};
use crate::meta::{self, meta_str};
use crate::state::{Inner, ObjKey, owner_uids};
use crate::{ApiError, DeleteOptions};
use serde_json::Value;
use std::sync::Arc;

/// `propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub fn parse(p: Option<&str>) -> Result<Self, ApiError> {
        match p.unwrap_or("Background") {
            "" | "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                ),
            )),
        }
    }
}

/// The outcome of a delete.
#[derive(Debug, Clone)]
pub(crate) enum Deleted {
    /// The object is gone (its last state).
    Gone(Arc<Value>),
    /// The object waits for finalizers (its state with `deletionTimestamp`).
    Pending(Arc<Value>),
}

impl Inner {
    /// Delete one object. `res_for_errors` names the resource in messages.
    pub(crate) fn delete_key(
        &mut self,
        res: &crate::ResourceInfo,
        key: &str,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let policy = Propagation::parse(opts.propagation_policy.as_deref())?;
        let Some(obj) = self.get(key, ns, name) else {
            return Err(crate::write::not_found(res, name));
        };
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&obj, "uid")
        {
            return Err(crate::write::precondition_failed(
                res,
                name,
                &format!(
                    "UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&obj, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_resource_version
            && Some(rv.as_str()) != meta_str(&obj, "resourceVersion")
        {
            return Err(crate::write::precondition_failed(
                res,
                name,
                &format!(
                    "ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        let deleting = obj
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some();
        if key == NAMESPACES && deleting {
            return Err(meta::with_details(
                ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on namespaces \"{name}\": The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system."
                    ),
                ),
                "",
                "namespaces",
                name,
            ));
        }
        self.validating_admission(&crate::admission::AdmissionRequest {
            operation: "DELETE",
            res,
            subresource: None,
            namespace: ns,
            name,
            object: None,
            old_object: Some(&obj),
            user: opts.user.as_ref(),
            dry_run: opts.dry_run,
        })?;
        if opts.dry_run || deleting {
            return Ok(Deleted::Pending(obj));
        }
        Ok(self.delete_now(key, ns, name, policy))
    }

    /// Delete without preconditions (GC, namespace cleanup, delete_key).
    fn delete_now(&mut self, key: &str, ns: &str, name: &str, policy: Propagation) -> Deleted {
        let Some(obj) = self.get(key, ns, name) else {
            return Deleted::Gone(Arc::new(Value::Null));
        };
        if obj
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some()
        {
            return Deleted::Pending(obj);
        }
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        match policy {
            Propagation::Orphan => self.orphan_dependents(&uid),
            Propagation::Foreground => self.collect_dependents(&uid, Propagation::Foreground),
            Propagation::Background => {}
        }
        if key == NAMESPACES {
            return self.terminate_namespace(name, &obj);
        }
        if !meta::finalizers(&obj).is_empty() {
            let mut next = (*obj).clone();
            mark_deleting(&mut next);
            return Deleted::Pending(self.put(key, ns, name, next));
        }
        match self.remove(key, ns, name) {
            Some(last) => {
                self.after_removal(key, ns, &last);
                Deleted::Gone(last)
            }
            None => Deleted::Gone(obj),
        }
    }

    /// Garbage-collect what depended on a removed object and finish namespace termination.
    pub(crate) fn after_removal(&mut self, key: &str, ns: &str, last: &Value) {
        if key == CRDS
            && let Some(name) = meta_str(last, "name")
        {
            self.drop_crd_type(name);
        }
        if let Some(uid) = meta_str(last, "uid") {
            self.collect_dependents(uid, Propagation::Background);
        }
        if !ns.is_empty() && key != NAMESPACES {
            self.try_finalize_namespace(ns);
        }
    }

    /// Delete dependents of `uid` whose every owner is gone (or is `uid` itself, which is
    /// being deleted in the foreground).
    fn collect_dependents(&mut self, uid: &str, policy: Propagation) {
        let deps: Vec<ObjKey> = self
            .dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (k, ns, name) in deps {
            let Some(dep) = self.get(&k, &ns, &name) else {
                continue;
            };
            let orphaned = owner_uids(&dep)
                .iter()
                .all(|o| o == uid || !self.owner_present(o, &ns));
            if orphaned {
                self.delete_now(&k, &ns, &name, policy);
            }
        }
    }

    /// Whether the owner with `uid` is live for a dependent in namespace `dep_ns`: the GC
    /// looks owners up in the dependent's namespace (or cluster scope), so an owner in
    /// another namespace, or in another cluster, counts as absent.
    fn owner_present(&self, uid: &str, dep_ns: &str) -> bool {
        self.uids
            .get(uid)
            .is_some_and(|(_, owner_ns, _)| owner_ns.is_empty() || owner_ns == dep_ns)
    }

    /// What the garbage collector does to an object whose ownerReferences all point at
    /// owners that do not exist: delete it (kube's GC does so shortly after the write;
    /// kubesim right away).
    pub(crate) fn collect_if_dangling(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        owners: &[String],
    ) {
        if !owners.is_empty()
            && self.exists(key, ns, name)
            && owners.iter().all(|o| !self.owner_present(o, ns))
        {
            self.delete_now(key, ns, name, Propagation::Background);
        }
    }

    /// Remove ownerReferences to `uid` from its dependents (`propagationPolicy=Orphan`).
    fn orphan_dependents(&mut self, uid: &str) {
        let deps: Vec<ObjKey> = self
            .dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (k, ns, name) in deps {
            let Some(dep) = self.get(&k, &ns, &name) else {
                continue;
            };
            let mut next = (*dep).clone();
            if let Some(Value::Array(refs)) = next
                .get_mut("metadata")
                .and_then(|m| m.get_mut("ownerReferences"))
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                if refs.is_empty()
                    && let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.remove("ownerReferences");
                }
            }
            self.put(&k, &ns, &name, next);
        }
    }

    /// Mark a namespace `Terminating`, delete everything in it, and remove it when nothing
    /// is left (and it has no finalizers).
    fn terminate_namespace(&mut self, name: &str, obj: &Value) -> Deleted {
        let mut next = obj.clone();
        mark_deleting(&mut next);
        if let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut) {
            // namespaces are not graceful: kube-apiserver sets only the timestamp
            m.remove("deletionGracePeriodSeconds");
        }
        next["status"] = serde_json::json!({"phase": "Terminating"});
        let marked = self.put(NAMESPACES, "", name, next);
        let keys: Vec<String> = self
            .types
            .iter()
            .filter(|(k, t)| k.as_str() != NAMESPACES && t.range(Some(name)).next().is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            let names: Vec<String> = self
                .types
                .get(&k)
                .map(|t| t.range(Some(name)).map(|((_, n), _)| n.clone()).collect())
                .unwrap_or_default();
            for n in names {
                self.delete_now(&k, name, &n, Propagation::Background);
            }
        }
        self.try_finalize_namespace(name);
        match self.get(NAMESPACES, "", name) {
            Some(still) => Deleted::Pending(still),
            None => Deleted::Gone(marked),
        }
    }

    /// Remove a terminating namespace once it is empty and has no finalizers.
    pub(crate) fn try_finalize_namespace(&mut self, name: &str) {
        let Some(ns) = self.get(NAMESPACES, "", name) else {
            return;
        };
        if ns
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_none()
            || !meta::finalizers(&ns).is_empty()
        {
            return;
        }
        let empty = self
            .types
            .iter()
            .all(|(k, t)| k.as_str() == NAMESPACES || t.range(Some(name)).next().is_none());
        if empty && let Some(last) = self.remove(NAMESPACES, "", name) {
            self.after_removal(NAMESPACES, "", &last);
        }
    }

    /// Stop serving a removed CRD's resources and delete all its objects (finalizers on
    /// them are not waited for).
    fn drop_crd_type(&mut self, crd_name: &str) {
        self.crds.remove(crd_name);
        self.resources
            .retain(|_, r| !(r.custom && r.resource_group() == crd_name));
        self.types_changed();
        let keys: Vec<(String, String)> = self
            .types
            .get(crd_name)
            .map(|t| t.objects.keys().cloned().collect())
            .unwrap_or_default();
        for (ns, name) in keys {
            if let Some(last) = self.remove(crd_name, &ns, &name)
                && let Some(uid) = meta_str(&last, "uid")
            {
                self.collect_dependents(uid, Propagation::Background);
            }
        }
        // dropping the store drops its watchers: their streams end
        self.types.remove(crd_name);
    }
}

/// `deletionTimestamp` = now, `deletionGracePeriodSeconds` = 0, generation bumped when
/// tracked (kube-apiserver's `markAsDeleting`).
fn mark_deleting(obj: &mut Value) {
    if !meta::ensure_metadata(obj) {
        return;
    }
    obj["metadata"]["deletionTimestamp"] = Value::from(meta::now_rfc3339());
    obj["metadata"]["deletionGracePeriodSeconds"] = Value::from(0);
    if let Some(g) = obj["metadata"].get("generation").and_then(Value::as_i64)
        && g > 0
    {
        obj["metadata"]["generation"] = Value::from(g + 1);
    }
}
