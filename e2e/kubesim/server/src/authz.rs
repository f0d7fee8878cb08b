//! Authorization: RBAC over the cluster's stored Role/ClusterRole/RoleBinding/
//! ClusterRoleBinding objects (`system:masters` bypasses), 403 `Status` otherwise.

use crate::server::ClusterServer;
use crate::server::request::RequestInfo;
use crate::server::response::{self, Body};
use futures::FutureExt;
use http::Response;
use kubesim_auth::UserInfo;
use kubesim_auth::rbac::{self, RbacSnapshot};
use kubesim_store::{ListOptions, WatchOptions};
use std::sync::{Arc, Mutex};

pub use kubesim_auth::rbac::{Decision, RequestAttributes as Attributes};

/// Attributes of a parsed request.
pub fn attributes(user: &UserInfo, info: &RequestInfo) -> Attributes {
    Attributes {
        user: user.clone(),
        verb: info.verb.clone(),
        api_group: info.api_group.clone(),
        api_version: info.api_version.clone(),
        resource: info.resource.clone(),
        subresource: info.subresource.clone().unwrap_or_default(),
        namespace: info.namespace.clone().unwrap_or_default(),
        name: info.name.clone().unwrap_or_default(),
        path: info.path.clone(),
        resource_request: info.is_resource_request,
    }
}

/// The RBAC snapshot of a cluster, rebuilt only when an RBAC object changed.
///
/// Changes are detected with a store watch on the four RBAC types, polled without waiting
/// at each lookup: the store queues watch events while the write holds its lock, so any
/// write that completed before the lookup is seen, and unrelated writes cost nothing.
#[derive(Default)]
pub struct RbacCache(Mutex<CacheState>);

#[derive(Default)]
struct CacheState {
    snapshot: Option<Arc<RbacSnapshot>>,
    changes: Option<futures::stream::SelectAll<kubesim_store::WatchStream>>,
}

const RBAC_RESOURCES: [&str; 4] = [
    "roles",
    "clusterroles",
    "rolebindings",
    "clusterrolebindings",
];

/// Drain queued change events without waiting; `true` if anything changed or the watch
/// ended (then it must be re-established).
fn drain_changes(state: &mut CacheState) -> bool {
    let Some(changes) = state.changes.as_mut() else {
        return true;
    };
    let mut changed = false;
    loop {
        match futures::StreamExt::next(changes).now_or_never() {
            Some(Some(ev)) => {
                changed = true;
                if ev.event_type == "ERROR" {
                    state.changes = None;
                    return true;
                }
            }
            Some(None) => {
                state.changes = None;
                return true;
            }
            None => return changed,
        }
    }
}

fn watch_changes(server: &ClusterServer) -> futures::stream::SelectAll<kubesim_store::WatchStream> {
    let rv = server.store.current_resource_version();
    let opts = WatchOptions {
        resource_version: (rv > 0).then(|| rv.to_string()),
        ..Default::default()
    };
    let streams = RBAC_RESOURCES.iter().filter_map(|plural| {
        let res = server
            .store
            .resolve("rbac.authorization.k8s.io", "v1", plural)?;
        server.store.watch(&res, None, &opts).ok()
    });
    futures::stream::select_all(streams)
}

fn build_snapshot(server: &ClusterServer) -> RbacSnapshot {
    let mut objects = Vec::new();
    for plural in RBAC_RESOURCES {
        let Some(res) = server
            .store
            .resolve("rbac.authorization.k8s.io", "v1", plural)
        else {
            continue;
        };
        if let Ok(list) = server.store.list(&res, None, &ListOptions::default())
            && let Some(items) = list.get("items").and_then(|i| i.as_array())
        {
            for item in items {
                let mut item = item.clone();
                item["kind"] = serde_json::json!(res.kind);
                objects.push(item);
            }
        }
    }
    RbacSnapshot::from_values(objects.iter()).unwrap_or_else(|e| {
        tracing::warn!(cluster = %server.name, error = %e, "invalid RBAC object; ignoring all RBAC");
        RbacSnapshot::default()
    })
}

fn snapshot(server: &ClusterServer) -> Arc<RbacSnapshot> {
    let Ok(mut state) = server.rbac_cache.0.lock() else {
        return Arc::new(build_snapshot(server));
    };
    let changed = drain_changes(&mut state);
    if let (false, Some(snap)) = (changed, state.snapshot.as_ref()) {
        return snap.clone();
    }
    if state.changes.is_none() {
        // Watch first, then read: a write racing the read shows up as a change next time.
        state.changes = Some(watch_changes(server));
    }
    let snap = Arc::new(build_snapshot(server));
    state.snapshot = Some(snap.clone());
    snap
}

/// Decide `attrs` on `server`'s stored RBAC objects.
pub fn authorize(server: &ClusterServer, attrs: &Attributes) -> Decision {
    if attrs.user.in_group(kubesim_auth::GROUP_MASTERS) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    rbac::authorize(attrs, &snapshot(server))
}

/// Authorize a request; `Err` carries the 403 response.
pub fn check(
    server: &ClusterServer,
    user: &UserInfo,
    info: &RequestInfo,
) -> Result<(), Box<Response<Body>>> {
    let attrs = attributes(user, info);
    let d = authorize(server, &attrs);
    if d.allowed {
        return Ok(());
    }
    Err(Box::new(response::json(
        403,
        &rbac::forbidden_status(&attrs, &d.reason),
    )))
}

/// May `user` impersonate what `imp` asks for? kube-apiserver checks the `impersonate` verb
/// on `users`, `groups`, `serviceaccounts` (namespaced), `uids` and
/// `userextras/<key>` (group `authentication.k8s.io`).
pub fn check_impersonation(
    server: &ClusterServer,
    user: &UserInfo,
    imp: &crate::authn::Impersonation,
) -> Result<(), Box<Response<Body>>> {
    let mut checks = Vec::new();
    match kubesim_auth::jwt::parse_service_account_username(&imp.user) {
        Some((ns, name)) => checks.push(("", "serviceaccounts", "", ns, name.to_string())),
        None => checks.push(("", "users", "", "", imp.user.clone())),
    }
    for g in &imp.groups {
        checks.push(("", "groups", "", "", g.clone()));
    }
    if !imp.uid.is_empty() {
        checks.push(("authentication.k8s.io", "uids", "", "", imp.uid.clone()));
    }
    for (k, values) in &imp.extra {
        for v in values {
            checks.push((
                "authentication.k8s.io",
                "userextras",
                k.as_str(),
                "",
                v.clone(),
            ));
        }
    }
    for (group, resource, sub, ns, name) in checks {
        let attrs = Attributes {
            user: user.clone(),
            verb: "impersonate".into(),
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name,
            resource_request: true,
            ..Default::default()
        };
        let d = authorize(server, &attrs);
        if !d.allowed {
            return Err(Box::new(response::json(
                403,
                &rbac::forbidden_status(&attrs, &d.reason),
            )));
        }
    }
    Ok(())
}

/// The default ClusterRoles/ClusterRoleBindings kube-apiserver bootstraps.
pub fn default_rbac_objects() -> Vec<serde_json::Value> {
    rbac::default_cluster_roles_and_bindings()
}
