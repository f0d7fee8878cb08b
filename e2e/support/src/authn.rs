//! Who a cluster says a credential belongs to, and RBAC applied as an operator would: for
//! tests of keyless access (JWT issuers, client certificates) on kubesim.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kubesim::ClusterHandle;
use serde_json::Value;

/// The user `cluster` authenticates `token` as (a TokenReview: the API server's own
/// verdict), or `None` when it refuses the token. Panics when the review itself fails.
pub async fn whoami(cluster: &ClusterHandle, token: &str) -> Option<String> {
    let client = cluster.kube_client().await.expect("admin client");
    let review = Api::<TokenReview>::all(client)
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("TokenReview");
    let s = review.status.unwrap_or_default();
    s.authenticated
        .unwrap_or(false)
        .then(|| s.user.and_then(|u| u.username).unwrap_or_default())
}

/// Server-side applies `doc` (an `rbac.authorization.k8s.io/v1` object, e.g. what
/// `kleym trust-config` prints) to `cluster`, forced, as field manager `kleym-e2e`.
pub async fn apply_rbac(cluster: &ClusterHandle, doc: &Value) {
    let client = cluster.kube_client().await.expect("admin client");
    let kind = doc["kind"].as_str().expect("an RBAC object has a kind");
    let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
    let (ar, _) = kube::discovery::pinned_kind(&client, &gvk)
        .await
        .expect("RBAC kinds are served");
    let name = doc["metadata"]["name"].as_str().expect("a named object");
    Api::<DynamicObject>::all_with(client, &ar)
        .patch(
            name,
            &PatchParams::apply("kleym-e2e").force(),
            &Patch::Apply(doc.clone()),
        )
        .await
        .expect("RBAC applied");
}
