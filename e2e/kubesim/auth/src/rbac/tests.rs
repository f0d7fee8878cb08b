use serde_json::json;

use super::*;

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        username: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    }
    .with_authenticated_group()
}

fn sa(ns: &str, name: &str) -> UserInfo {
    user(
        &format!("system:serviceaccount:{ns}:{name}"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{ns}"),
        ],
    )
}

fn role(kind: &str, ns: Option<&str>, name: &str, rules: Value) -> Value {
    let mut v = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                       "metadata": {"name": name}, "rules": rules});
    if let Some(ns) = ns {
        v["metadata"]["namespace"] = json!(ns);
    }
    v
}

fn binding(
    kind: &str,
    ns: Option<&str>,
    name: &str,
    role_kind: &str,
    role: &str,
    subjects: Value,
) -> Value {
    let mut v = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                       "metadata": {"name": name},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                       "subjects": subjects});
    if let Some(ns) = ns {
        v["metadata"]["namespace"] = json!(ns);
    }
    v
}

/// The default policy plus a fixture covering every matching feature.
fn snapshot() -> RbacSnapshot {
    let mut objects = default_cluster_roles_and_bindings();
    objects.extend([
        role("Role", Some("default"), "pod-reader", json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        ])),
        binding("RoleBinding", Some("default"), "bob-reads", "Role", "pod-reader",
                json!([{"kind": "User", "name": "bob"}])),
        role("Role", Some("default"), "named", json!([
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["web"], "verbs": ["get", "update"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["update"]},
            {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["update"]},
        ])),
        binding("RoleBinding", Some("default"), "carol-named", "Role", "named",
                json!([{"kind": "User", "name": "carol"}])),
        role("ClusterRole", None, "spire-writer", json!([
            {"apiGroups": ["spire.spiffe.io"], "resources": ["clusterspiffeids"], "verbs": ["*"]},
            {"apiGroups": ["*"], "resources": ["leases"], "verbs": ["get"]},
        ])),
        // A RoleBinding to a ClusterRole grants only in its namespace; the SA subject has no
        // namespace and defaults to the binding's.
        binding("RoleBinding", Some("kleym"), "hub-spire", "ClusterRole", "spire-writer",
                json!([{"kind": "ServiceAccount", "name": "hub"}])),
        binding("ClusterRoleBinding", None, "ops-spire", "ClusterRole", "spire-writer",
                json!([{"kind": "Group", "name": "ops"},
                       {"kind": "ServiceAccount", "name": "agent", "namespace": "spire"},
                       {"kind": "ServiceAccount", "name": "nons"}])),
        role("ClusterRole", None, "health", json!([
            {"nonResourceURLs": ["/healthz/*", "/metrics"], "verbs": ["get"]},
        ])),
        binding("ClusterRoleBinding", None, "dave-health", "ClusterRole", "health",
                json!([{"kind": "User", "name": "dave"}])),
        binding("RoleBinding", Some("team"), "erin-admin", "ClusterRole", "admin",
                json!([{"kind": "User", "name": "erin"}])),
        binding("RoleBinding", Some("team"), "frank-view", "ClusterRole", "view",
                json!([{"kind": "User", "name": "frank"}])),
        // Extends `view` (and so `edit` and `admin`) by aggregation.
        {
            let mut r = role("ClusterRole", None, "kleym-view", json!([
                {"apiGroups": ["kleym.io"], "resources": ["inferenceidentitybindings"], "verbs": ["get", "list", "watch"]},
            ]));
            r["metadata"]["labels"] = json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"});
            r
        },
        binding("ClusterRoleBinding", None, "ghost", "ClusterRole", "does-not-exist",
                json!([{"kind": "User", "name": "gus"}])),
        binding("RoleBinding", Some("default"), "ghost-role", "Role", "nope",
                json!([{"kind": "User", "name": "gus"}])),
    ]);
    RbacSnapshot::from_values(objects.iter()).unwrap()
}

fn res(
    u: &UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    ns: &str,
    name: &str,
) -> RequestAttributes {
    RequestAttributes::resource(u.clone(), verb, group, resource, ns, name)
}

#[test]
fn authorization_table() {
    let s = snapshot();
    let bob = user("bob", &[]);
    let carol = user("carol", &[]);
    let hub = sa("kleym", "hub");
    let ops = user("olga", &["ops"]);
    let agent = sa("spire", "agent");
    let erin = user("erin", &[]);
    let frank = user("frank", &[]);
    let admin = user("root", &["system:masters"]);
    let cases: Vec<(RequestAttributes, bool)> = vec![
        // verbs and namespaces
        (res(&bob, "get", "", "pods", "default", "web"), true),
        (res(&bob, "list", "", "pods", "default", ""), true),
        (res(&bob, "watch", "", "pods", "default", ""), false),
        (res(&bob, "get", "", "pods", "other", "web"), false),
        (res(&bob, "get", "", "pods", "", ""), false),
        (res(&bob, "get", "apps", "pods", "default", "web"), false),
        // a rule for `pods` does not cover subresources
        (res(&bob, "get", "", "pods/log", "default", "web"), false),
        // resourceNames
        (res(&carol, "get", "", "configmaps", "default", "web"), true),
        (res(&carol, "get", "", "configmaps", "default", "db"), false),
        (
            res(&carol, "update", "", "configmaps", "default", "web"),
            true,
        ),
        (res(&carol, "get", "", "configmaps", "default", ""), false),
        // subresources: exact and */sub
        (
            res(&carol, "update", "", "pods/status", "default", "web"),
            true,
        ),
        (res(&carol, "update", "", "pods", "default", "web"), false),
        (
            res(
                &carol,
                "update",
                "apps",
                "deployments/scale",
                "default",
                "d",
            ),
            true,
        ),
        (
            res(
                &carol,
                "update",
                "apps",
                "deployments/status",
                "default",
                "d",
            ),
            false,
        ),
        (
            res(&carol, "update", "apps", "deployments", "default", "d"),
            false,
        ),
        // RoleBinding -> ClusterRole is namespace-scoped; SA subject defaults to binding ns
        (
            res(
                &hub,
                "list",
                "spire.spiffe.io",
                "clusterspiffeids",
                "kleym",
                "",
            ),
            true,
        ),
        (
            res(&hub, "list", "spire.spiffe.io", "clusterspiffeids", "", ""),
            false,
        ),
        (
            res(
                &hub,
                "list",
                "spire.spiffe.io",
                "clusterspiffeids",
                "other",
                "",
            ),
            false,
        ),
        (
            res(&hub, "get", "coordination.k8s.io", "leases", "kleym", "x"),
            true,
        ),
        (
            res(
                &sa("other", "hub"),
                "list",
                "spire.spiffe.io",
                "clusterspiffeids",
                "kleym",
                "",
            ),
            false,
        ),
        // ClusterRoleBinding: groups and namespaced SA subjects, everywhere
        (
            res(
                &ops,
                "delete",
                "spire.spiffe.io",
                "clusterspiffeids",
                "",
                "x",
            ),
            true,
        ),
        (
            res(
                &agent,
                "create",
                "spire.spiffe.io",
                "clusterspiffeids",
                "",
                "",
            ),
            true,
        ),
        (
            res(
                &agent,
                "create",
                "spire.spiffe.io",
                "clusterspiffeids/status",
                "",
                "",
            ),
            false,
        ),
        // an SA subject without namespace in a ClusterRoleBinding matches nobody
        (
            res(
                &sa("default", "nons"),
                "get",
                "spire.spiffe.io",
                "clusterspiffeids",
                "",
                "x",
            ),
            false,
        ),
        // aggregation: admin ⊇ edit ⊇ view ⊇ kleym-view
        (res(&erin, "get", "", "pods", "team", "p"), true),
        (
            res(&erin, "create", "", "serviceaccounts/token", "team", "sa"),
            true,
        ),
        (
            res(
                &erin,
                "create",
                "rbac.authorization.k8s.io",
                "rolebindings",
                "team",
                "",
            ),
            true,
        ),
        (
            res(
                &erin,
                "list",
                "kleym.io",
                "inferenceidentitybindings",
                "team",
                "",
            ),
            true,
        ),
        (
            res(
                &erin,
                "list",
                "kleym.io",
                "inferenceidentitybindings",
                "other",
                "",
            ),
            false,
        ),
        (
            res(
                &frank,
                "list",
                "kleym.io",
                "inferenceidentitybindings",
                "team",
                "",
            ),
            true,
        ),
        (res(&frank, "get", "", "secrets", "team", "s"), false),
        (res(&frank, "create", "", "pods", "team", ""), false),
        (
            res(&frank, "get", "apps", "deployments/scale", "team", "d"),
            true,
        ),
        // defaults for every authenticated user
        (
            res(
                &bob,
                "create",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "",
                "",
            ),
            true,
        ),
        (
            res(
                &bob,
                "create",
                "authorization.k8s.io",
                "selfsubjectrulesreviews",
                "",
                "",
            ),
            true,
        ),
        (
            res(
                &bob,
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
                "",
                "",
            ),
            false,
        ),
        // system:masters
        (
            res(
                &admin,
                "deletecollection",
                "anything.io",
                "whatever/sub",
                "",
                "",
            ),
            true,
        ),
    ];
    for (attrs, want) in cases {
        let d = authorize(&attrs, &s);
        assert_eq!(
            d.allowed,
            want,
            "{} {} {}/{} ns={:?} name={:?}: {d:?}",
            attrs.user.username,
            attrs.verb,
            attrs.api_group,
            attrs.resource,
            attrs.namespace,
            attrs.name
        );
    }
}

#[test]
fn non_resource_urls() {
    let s = snapshot();
    let dave = user("dave", &[]);
    let bob = user("bob", &[]);
    let anon = UserInfo::anonymous();
    let sa_user = sa("a", "b");
    let cases = [
        (&dave, "get", "/healthz/etcd", true),
        (&dave, "get", "/healthz/", true),
        (&dave, "get", "/metrics", true),
        (&dave, "get", "/metrics/extra", false),
        (&dave, "post", "/metrics", false),
        (&bob, "get", "/metrics", false),
        (&bob, "get", "/version", true),
        (&bob, "get", "/apis", true),
        (&bob, "get", "/apis/apps/v1", true),
        (&bob, "get", "/api", true),
        (&bob, "get", "/openid/v1/jwks", false),
        (&sa_user, "get", "/openid/v1/jwks", true),
        (&sa_user, "get", "/.well-known/openid-configuration", true),
        (&anon, "get", "/healthz", true),
        (&anon, "get", "/version", true),
        (&anon, "get", "/apis", false),
    ];
    for (u, verb, path, want) in cases {
        let d = authorize(&RequestAttributes::non_resource(u.clone(), verb, path), &s);
        assert_eq!(d.allowed, want, "{} {verb} {path}", u.username);
    }
    assert!(non_resource_url_matches("*", "/anything"));
    assert!(non_resource_url_matches("/a/**", "/a/b"));
    assert!(!non_resource_url_matches("/a", "/a/b"));
}

#[test]
fn reasons_name_the_binding() {
    let s = snapshot();
    let d = authorize(
        &res(&user("bob", &[]), "get", "", "pods", "default", "web"),
        &s,
    );
    assert_eq!(
        d.reason,
        r#"RBAC: allowed by RoleBinding "bob-reads/default" of Role "pod-reader" to User "bob""#
    );
    let d = authorize(
        &res(
            &sa("kleym", "hub"),
            "list",
            "spire.spiffe.io",
            "clusterspiffeids",
            "kleym",
            "",
        ),
        &s,
    );
    assert_eq!(
        d.reason,
        r#"RBAC: allowed by RoleBinding "hub-spire/kleym" of ClusterRole "spire-writer" to ServiceAccount "hub/kleym""#
    );
    let d = authorize(
        &res(
            &user("olga", &["ops"]),
            "get",
            "spire.spiffe.io",
            "clusterspiffeids",
            "",
            "x",
        ),
        &s,
    );
    assert_eq!(
        d.reason,
        r#"RBAC: allowed by ClusterRoleBinding "ops-spire" of ClusterRole "spire-writer" to Group "ops""#
    );
    let d = authorize(
        &res(
            &user("root", &["system:masters"]),
            "get",
            "",
            "pods",
            "",
            "",
        ),
        &s,
    );
    assert_eq!(
        d,
        Decision {
            allowed: true,
            reason: String::new()
        }
    );
    // Denials are silent unless a binding points at a missing role.
    let d = authorize(
        &res(&user("bob", &[]), "delete", "", "pods", "default", "web"),
        &s,
    );
    assert_eq!(d, Decision::default());
    let d = authorize(
        &res(&user("gus", &[]), "get", "", "pods", "default", "x"),
        &s,
    );
    assert!(!d.allowed);
    assert_eq!(
        d.reason,
        r#"RBAC: [clusterrole.rbac.authorization.k8s.io "does-not-exist" not found, role.rbac.authorization.k8s.io "nope" not found]"#
    );
    let d = authorize(&res(&user("gus", &[]), "get", "", "pods", "", "x"), &s);
    assert_eq!(
        d.reason,
        r#"RBAC: clusterrole.rbac.authorization.k8s.io "does-not-exist" not found"#
    );
}

#[test]
fn aggregation_is_transitive_deduplicated_and_cycle_safe() {
    let s = snapshot();
    let view = s.cluster_role_rules("view").unwrap();
    let edit = s.cluster_role_rules("edit").unwrap();
    let admin = s.cluster_role_rules("admin").unwrap();
    assert!(view.iter().all(|r| edit.contains(r)));
    assert!(edit.iter().all(|r| admin.contains(r)));
    assert!(admin.len() > edit.len() && edit.len() > view.len());
    assert!(
        view.iter()
            .any(|r| r.api_groups.as_deref() == Some(&["kleym.io".to_string()][..]))
    );

    let labelled = |name: &str, label: &str, aggregates: Option<&str>, rules: Value| {
        let mut r = role("ClusterRole", None, name, rules);
        r["metadata"]["labels"] = json!({label: "true"});
        if let Some(sel) = aggregates {
            r["aggregationRule"] =
                json!({"clusterRoleSelectors": [{"matchLabels": {sel: "true"}}]});
        }
        serde_json::from_value::<ClusterRole>(r).unwrap()
    };
    let rule = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    let roles = vec![
        labelled("a", "x", Some("y"), json!([])),
        labelled("b", "y", Some("x"), json!([])),
        labelled("c", "y", None, rule.clone()),
        labelled("d", "y", None, rule.clone()),
    ];
    let agg = aggregate_cluster_roles(&roles);
    assert_eq!(agg["a"].len(), 1, "deduplicated: {:?}", agg["a"]);
    assert_eq!(agg["b"], agg["a"]);
    assert_eq!(agg["c"].len(), 1);
}

#[test]
fn rules_for_lists_applicable_rules() {
    let s = snapshot();
    let (rules, errors) = s.rules_for(&user("bob", &[]), "default");
    assert!(errors.is_empty());
    assert!(
        rules
            .iter()
            .any(|r| r.resources.as_deref() == Some(&["pods".to_string()][..]))
    );
    let (rules_other, _) = s.rules_for(&user("bob", &[]), "other");
    assert!(rules_other.len() < rules.len());
    let (_, errors) = s.rules_for(&user("gus", &[]), "default");
    assert_eq!(errors.len(), 2);
}

#[test]
fn forbidden_messages_match_kube_apiserver() {
    let bob = user("bob", &[]);
    assert_eq!(
        forbidden_message(&res(&bob, "get", "", "pods", "default", "web")),
        r#"pods "web" is forbidden: User "bob" cannot get resource "pods" in API group "" in the namespace "default""#
    );
    assert_eq!(
        forbidden_message(&res(
            &sa("kleym", "hub"),
            "list",
            "spire.spiffe.io",
            "clusterspiffeids",
            "",
            ""
        )),
        r#"clusterspiffeids.spire.spiffe.io is forbidden: User "system:serviceaccount:kleym:hub" cannot list resource "clusterspiffeids" in API group "spire.spiffe.io" at the cluster scope"#
    );
    assert_eq!(
        forbidden_message(&res(
            &bob,
            "create",
            "",
            "serviceaccounts/token",
            "kleym",
            "hub"
        )),
        r#"serviceaccounts "hub" is forbidden: User "bob" cannot create resource "serviceaccounts/token" in API group "" in the namespace "kleym""#
    );
    let x = user("x", &[]);
    assert_eq!(
        forbidden_message(&RequestAttributes::non_resource(x.clone(), "get", "/apis")),
        r#"forbidden: User "x" cannot get path "/apis""#
    );
    let reason = r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#;
    let status = forbidden_status(&res(&bob, "get", "apps", "deployments", "d", "web"), reason);
    assert_eq!(status["code"], 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(status["status"], "Failure");
    assert_eq!(
        status["details"],
        json!({"name": "web", "group": "apps", "kind": "deployments"})
    );
    assert_eq!(
        status["message"],
        format!(
            r#"deployments.apps "web" is forbidden: User "bob" cannot get resource "deployments" in API group "apps" in the namespace "d": {reason}"#
        )
    );
    let html = forbidden_message(&RequestAttributes::non_resource(
        user("<b>", &[]),
        "get",
        "/x",
    ));
    assert_eq!(html, r#"forbidden: User "&lt;b&gt;" cannot get path "/x""#);
}

#[test]
fn from_values_rejects_malformed_rbac_objects_and_ignores_others() {
    let bad = json!({"kind": "RoleBinding", "metadata": {"name": "x"}, "roleRef": 5});
    assert!(RbacSnapshot::from_values([&bad]).is_err());
    let other = json!({"kind": "Pod", "metadata": {"name": "x"}});
    let s = RbacSnapshot::from_values([&other]).unwrap();
    assert!(!authorize(&res(&user("a", &[]), "get", "", "pods", "", ""), &s).allowed);
}

#[test]
fn defaults_are_well_formed() {
    let objects = default_cluster_roles_and_bindings();
    let mut names = std::collections::BTreeSet::new();
    for o in &objects {
        let kind = o["kind"].as_str().unwrap();
        assert!(names.insert((
            kind.to_string(),
            o["metadata"]["name"].as_str().unwrap().to_string()
        )));
        match kind {
            "ClusterRole" => {
                serde_json::from_value::<ClusterRole>(o.clone()).unwrap();
            }
            "ClusterRoleBinding" => {
                let b: ClusterRoleBinding = serde_json::from_value(o.clone()).unwrap();
                assert!(names.contains(&("ClusterRole".to_string(), b.role_ref.name)));
            }
            other => panic!("unexpected kind {other}"),
        }
    }
    assert!(names.contains(&(
        "ClusterRoleBinding".to_string(),
        "cluster-admin".to_string()
    )));
}
