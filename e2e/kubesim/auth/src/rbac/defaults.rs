//! The subset of kube-apiserver's bootstrap RBAC policy (`plugin/pkg/auth/authorizer/rbac/
//! bootstrappolicy`) that clients and tests rely on.

use serde_json::{Value, json};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const AGG_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const AGG_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const AGG_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn url_rule(urls: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": urls, "verbs": verbs})
}

fn metadata(name: &str, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
    for (k, v) in extra_labels {
        labels.insert((*k).into(), json!(v));
    }
    json!({
        "name": name,
        "labels": labels,
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    })
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata(name, labels),
        "rules": rules,
    })
}

fn aggregated_role(name: &str, labels: &[(&str, &str)], aggregate_label: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata(name, labels),
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {aggregate_label: "true"}}
        ]},
        "rules": [],
    })
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": metadata(name, &[]),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

/// The default ClusterRoles and ClusterRoleBindings kube-apiserver bootstraps, for the store
/// to preload:
///
/// - `cluster-admin` (everything) bound to group `system:masters`;
/// - `system:discovery` (`/api`, `/apis`, `/version`, `/healthz`, `/openapi`, …) and
///   `system:basic-user` (create selfsubjectaccessreviews, selfsubjectrulesreviews,
///   selfsubjectreviews) bound to `system:authenticated`;
/// - `system:public-info-viewer` (`/healthz`, `/livez`, `/readyz`, `/version`) bound to
///   `system:authenticated` and `system:unauthenticated`;
/// - `system:service-account-issuer-discovery` (OIDC discovery and JWKS) bound to
///   `system:serviceaccounts`;
/// - `system:auth-delegator` (create tokenreviews and subjectaccessreviews), unbound;
/// - the aggregated user-facing roles `admin` ⊇ `edit` ⊇ `view` with their
///   `system:aggregate-to-*` parts (core, apps, batch, autoscaling, policy, networking and
///   discovery resources; condensed from upstream).
pub fn default_cluster_roles_and_bindings() -> Vec<Value> {
    vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![rule(&["*"], &["*"], &["*"]), url_rule(&["*"], &["*"])],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![url_rule(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![url_rule(
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
                &["get"],
            )],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            &[],
            vec![url_rule(
                &[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
        aggregated_role("admin", &[], AGG_ADMIN),
        aggregated_role("edit", &[(AGG_ADMIN, "true")], AGG_EDIT),
        aggregated_role("view", &[(AGG_EDIT, "true")], AGG_VIEW),
        cluster_role(
            "system:aggregate-to-admin",
            &[(AGG_ADMIN, "true")],
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                    &["create"],
                ),
                rule(
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings", "roles"],
                    &[
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                ),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(AGG_EDIT, "true")],
            vec![
                rule(
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                    READ,
                ),
                rule(&[""], &["serviceaccounts"], &["impersonate"]),
                rule(
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                    WRITE,
                ),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                    WRITE,
                ),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                    WRITE,
                ),
                rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
                rule(&["batch"], &["cronjobs", "jobs"], WRITE),
                rule(
                    &["networking.k8s.io"],
                    &["ingresses", "networkpolicies"],
                    WRITE,
                ),
                rule(&["policy"], &["poddisruptionbudgets"], WRITE),
                rule(&["discovery.k8s.io"], &["endpointslices"], WRITE),
            ],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(AGG_VIEW, "true")],
            vec![
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                    READ,
                ),
                rule(
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                    READ,
                ),
                rule(&[""], &["namespaces"], READ),
                rule(&["discovery.k8s.io"], &["endpointslices"], READ),
                rule(
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                    READ,
                ),
                rule(
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                    READ,
                ),
                rule(
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                    READ,
                ),
                rule(
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                    READ,
                ),
                rule(
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                    READ,
                ),
            ],
        ),
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding(
            "system:discovery",
            "system:discovery",
            &["system:authenticated"],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            &["system:authenticated"],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
        binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            &["system:serviceaccounts"],
        ),
    ]
}
