//! `deploy/tenant-access/`: with its two ClusterRoles applied, the users a namespace's
//! RoleBindings give Kubernetes' `edit` or `view` manage or read InferenceIdentityBindings
//! there, through ClusterRole aggregation (kubesim aggregates as kube-apiserver's
//! clusterrole-aggregation controller does). Nobody gets the status subresource, another
//! namespace, or ClusterSPIFFEIDs; and without the roles, `edit` grants nothing on bindings.

use crate::deploy_support;

use deploy_support::{documents, repo_root};
use kleym_e2e::fixtures::all_crds;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use serde_json::{Value, json};

fn user(name: &str) -> kubesim_auth::UserInfo {
    kubesim_auth::UserInfo {
        username: name.to_string(),
        ..Default::default()
    }
}

fn bindings_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kleym.io", "v1alpha1", "InferenceIdentityBinding"),
        "inferenceidentitybindings",
    )
}

fn binding(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": "chat"},
            "mode": "PoolOnly",
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"],
        },
    }))
    .unwrap()
}

/// The HTTP status of a failed call, `None` when it succeeded.
fn status<T>(r: Result<T, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(e.code),
        Err(e) => panic!("not an API answer: {e}"),
    }
}

async fn apply_admin(c: &ClusterHandle, doc: &Value) {
    let admin = c.kube_client().await.unwrap();
    let api_version = doc["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = doc["kind"].as_str().unwrap();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    // Namespace, RoleBinding, ClusterRole: the plural is the kind's lowercase plus `s`.
    let plural = format!("{}s", kind.to_ascii_lowercase());
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(admin, ns, &ar),
        None => Api::all_with(admin, &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", doc["metadata"]["name"]));
}

fn role_binding(namespace: &str, user: &str, cluster_role: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": format!("{user}-{cluster_role}"), "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_editors_manage_bindings_and_viewers_read_them_through_aggregation() {
    let sim = Kubesim::start(
        &["c"],
        KubesimOptions {
            crds: all_crds().unwrap(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = sim.cluster("c").unwrap();
    for ns in ["team", "other"] {
        apply_admin(
            &c,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    apply_admin(&c, &role_binding("team", "alice", "edit")).await;
    apply_admin(&c, &role_binding("team", "bob", "view")).await;
    c.add_static_token("alice-token-0123456789", user("alice"));
    c.add_static_token("bob-token-0123456789", user("bob"));
    let ar = bindings_resource();
    let alice = c.client_for_token("alice-token-0123456789").await.unwrap();
    let bob = c.client_for_token("bob-token-0123456789").await.unwrap();
    let alice_team: Api<DynamicObject> = Api::namespaced_with(alice.clone(), "team", &ar);
    let bob_team: Api<DynamicObject> = Api::namespaced_with(bob, "team", &ar);

    // Before the roles exist, `edit` and `view` say nothing about kleym's API group.
    assert_eq!(
        status(
            alice_team
                .create(&PostParams::default(), &binding("early"))
                .await
        ),
        Some(403)
    );
    assert_eq!(
        status(bob_team.list(&ListParams::default()).await),
        Some(403)
    );

    let text = std::fs::read_to_string(repo_root().join("deploy/tenant-access/clusterroles.yaml"))
        .unwrap();
    let roles = documents(&text).unwrap();
    assert_eq!(roles.len(), 2);
    for r in &roles {
        apply_admin(&c, r).await;
    }

    // An editor creates, changes and deletes bindings in its namespace...
    assert_eq!(
        status(
            alice_team
                .create(&PostParams::default(), &binding("chat"))
                .await
        ),
        None
    );
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}));
    assert_eq!(
        status(
            alice_team
                .patch("chat", &PatchParams::default(), &relabel)
                .await
        ),
        None
    );
    assert_eq!(status(alice_team.get("chat").await), None);
    // ... but never writes its status (kleym's output), ...
    let fake_status = Patch::Merge(json!({"status": {"observedGeneration": 7}}));
    assert_eq!(
        status(
            alice_team
                .patch_status("chat", &PatchParams::default(), &fake_status)
                .await
        ),
        Some(403)
    );
    // ... nor acts in another namespace, nor touches ClusterSPIFFEIDs.
    let alice_other: Api<DynamicObject> = Api::namespaced_with(alice.clone(), "other", &ar);
    assert_eq!(
        status(
            alice_other
                .create(&PostParams::default(), &binding("chat"))
                .await
        ),
        Some(403)
    );
    let csid = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("spire.spiffe.io", "v1alpha1", "ClusterSPIFFEID"),
        "clusterspiffeids",
    );
    let alice_csids: Api<DynamicObject> = Api::all_with(alice, &csid);
    assert_eq!(
        status(alice_csids.list(&ListParams::default()).await),
        Some(403)
    );

    // A viewer reads bindings and their status, and writes nothing.
    let listed = bob_team.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(status(bob_team.get_status("chat").await), None);
    assert_eq!(
        status(
            bob_team
                .create(&PostParams::default(), &binding("mine"))
                .await
        ),
        Some(403)
    );
    assert_eq!(
        status(bob_team.delete("chat", &Default::default()).await),
        Some(403)
    );
    assert_eq!(
        status(alice_team.delete("chat", &Default::default()).await),
        None
    );
}
