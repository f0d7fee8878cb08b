//! RBAC authorization evaluated from stored Role/ClusterRole/RoleBinding/ClusterRoleBinding.
//!
//! Semantics follow kube-apiserver's RBAC authorizer (`plugin/pkg/auth/authorizer/rbac`):
//! rules only add permissions; `*` matches any verb/group/resource; a rule resource matches
//! `resource/subresource` exactly or as `*/subresource`; `resourceNames` restrict by object
//! name; `nonResourceURLs` match exactly or by a trailing-`*` prefix; subjects are users,
//! groups or ServiceAccounts (namespace defaulting to the binding's); a RoleBinding that
//! references a ClusterRole grants it only in the binding's namespace; ClusterRoles with an
//! `aggregationRule` get the union of the rules of the ClusterRoles its selectors match (what
//! the clusterrole-aggregation controller would have written). Members of `system:masters`
//! are allowed everything (kube-apiserver's privileged-group authorizer runs before RBAC).
//!
//! Build an [`RbacSnapshot`] whenever RBAC objects change (it is immutable and cheap to
//! share), then call [`authorize`] per request. [`RequestAttributes::from_http`] derives
//! attributes from a request like kube-apiserver's `RequestInfoFactory`.

mod defaults;
mod messages;
mod request_info;
mod selector;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use serde_json::Value;

pub use defaults::default_cluster_roles_and_bindings;
pub use messages::{forbidden_message, forbidden_message_with_reason, forbidden_status};
pub use selector::label_selector_matches;

use crate::jwt::parse_service_account_username;
use crate::{AuthError, GROUP_MASTERS, Result, UserInfo};

/// The attributes of a request that authorization looks at (kube's `authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    /// Who is asking.
    pub user: UserInfo,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, …
    /// (for non-resource requests: the lowercase HTTP method, e.g. `get`).
    pub verb: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// API version (informational; not used by RBAC).
    pub api_version: String,
    /// Resource (plural), e.g. `pods`.
    pub resource: String,
    /// Subresource, e.g. `status`, `token`.
    pub subresource: String,
    /// Namespace (`""` for cluster scope).
    pub namespace: String,
    /// Object name (`""` for collections).
    pub name: String,
    /// Request path (used for non-resource requests).
    pub path: String,
    /// Whether this is a resource request (else a non-resource URL like `/version`).
    pub resource_request: bool,
}

impl RequestAttributes {
    /// A resource request.
    pub fn resource(
        user: UserInfo,
        verb: &str,
        api_group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        RequestAttributes {
            user,
            verb: verb.to_string(),
            api_group: api_group.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            resource_request: true,
            ..Default::default()
        }
    }

    /// A non-resource request (`/version`, `/apis`, …).
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Self {
        RequestAttributes {
            user,
            verb: verb.to_string(),
            path: path.to_string(),
            resource_request: false,
            ..Default::default()
        }
    }
}

/// An authorization decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// kube-apiserver's reason: on allow, `RBAC: allowed by ClusterRoleBinding "x" of
    /// ClusterRole "y" to User "z"` (empty for `system:masters`); on denial, empty unless
    /// bindings referenced missing roles (`RBAC: clusterrole.rbac.authorization.k8s.io "x"
    /// not found`). Goes into SubjectAccessReview `status.reason` and after the 403 message.
    pub reason: String,
}

/// Called per applicable rule (or resolution error) with the binding and matching subject;
/// returns `false` to stop visiting.
type RuleVisitor<'a> =
    dyn FnMut(&Binding, &Subject, Option<&PolicyRule>, Option<String>) -> bool + 'a;

/// One binding, normalized from a RoleBinding or ClusterRoleBinding.
#[derive(Debug, Clone)]
struct Binding {
    name: String,
    /// `""` for ClusterRoleBindings.
    namespace: String,
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn describe(&self, subject: &Subject) -> String {
        let described = describe_subject(subject, &self.namespace);
        if self.namespace.is_empty() {
            format!(
                "ClusterRoleBinding {:?} of {} {:?} to {described}",
                self.name, self.role_kind, self.role_name
            )
        } else {
            format!(
                "RoleBinding {:?} of {} {:?} to {described}",
                format!("{}/{}", self.name, self.namespace),
                self.role_kind,
                self.role_name
            )
        }
    }
}

fn describe_subject(s: &Subject, binding_namespace: &str) -> String {
    if s.kind == "ServiceAccount" {
        let ns = s
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(binding_namespace);
        format!("{} {:?}", s.kind, format!("{}/{ns}", s.name))
    } else {
        format!("{} {:?}", s.kind, s.name)
    }
}

/// An immutable view of a cluster's RBAC objects, with ClusterRole aggregation resolved.
#[derive(Debug, Clone, Default)]
pub struct RbacSnapshot {
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    /// Effective rules (aggregated where the ClusterRole has an aggregationRule).
    cluster_roles: HashMap<String, Vec<PolicyRule>>,
    /// Sorted by name (deterministic reasons).
    cluster_role_bindings: Vec<Binding>,
    /// Per namespace, sorted by name.
    role_bindings: HashMap<String, Vec<Binding>>,
}

impl RbacSnapshot {
    /// Builds a snapshot from typed objects.
    pub fn new(
        roles: Vec<Role>,
        cluster_roles: Vec<ClusterRole>,
        role_bindings: Vec<RoleBinding>,
        cluster_role_bindings: Vec<ClusterRoleBinding>,
    ) -> Self {
        let roles = roles
            .into_iter()
            .map(|r| {
                let key = (
                    r.metadata.namespace.unwrap_or_default(),
                    r.metadata.name.unwrap_or_default(),
                );
                (key, r.rules.unwrap_or_default())
            })
            .collect();
        let cluster_roles = aggregate_cluster_roles(&cluster_roles)
            .into_iter()
            .collect();
        let mut crbs: Vec<Binding> = cluster_role_bindings
            .into_iter()
            .map(|b| Binding {
                name: b.metadata.name.unwrap_or_default(),
                namespace: String::new(),
                role_kind: b.role_ref.kind,
                role_name: b.role_ref.name,
                subjects: b.subjects.unwrap_or_default(),
            })
            .collect();
        crbs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut rbs: HashMap<String, Vec<Binding>> = HashMap::new();
        for b in role_bindings {
            let namespace = b.metadata.namespace.unwrap_or_default();
            rbs.entry(namespace.clone()).or_default().push(Binding {
                name: b.metadata.name.unwrap_or_default(),
                namespace,
                role_kind: b.role_ref.kind,
                role_name: b.role_ref.name,
                subjects: b.subjects.unwrap_or_default(),
            });
        }
        for list in rbs.values_mut() {
            list.sort_by(|a, b| a.name.cmp(&b.name));
        }
        RbacSnapshot {
            roles,
            cluster_roles,
            cluster_role_bindings: crbs,
            role_bindings: rbs,
        }
    }

    /// Builds a snapshot from JSON objects (as stored): `Role`, `ClusterRole`, `RoleBinding`
    /// and `ClusterRoleBinding` by `kind`; objects of other kinds are ignored.
    pub fn from_values<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Result<Self> {
        let (mut roles, mut cluster_roles, mut rbs, mut crbs) = (vec![], vec![], vec![], vec![]);
        fn parse<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T> {
            T::deserialize(v).map_err(|e| {
                AuthError::InvalidRequest(format!(
                    "invalid {} {:?}: {e}",
                    v["kind"].as_str().unwrap_or_default(),
                    v["metadata"]["name"].as_str().unwrap_or_default()
                ))
            })
        }
        for v in objects {
            match v.get("kind").and_then(Value::as_str) {
                Some("Role") => roles.push(parse(v)?),
                Some("ClusterRole") => cluster_roles.push(parse(v)?),
                Some("RoleBinding") => rbs.push(parse(v)?),
                Some("ClusterRoleBinding") => crbs.push(parse(v)?),
                _ => {}
            }
        }
        Ok(Self::new(roles, cluster_roles, rbs, crbs))
    }

    /// The effective rules of a ClusterRole (aggregated if it has an aggregationRule).
    pub fn cluster_role_rules(&self, name: &str) -> Option<&[PolicyRule]> {
        self.cluster_roles.get(name).map(Vec::as_slice)
    }

    /// Visits the rules that apply to `user` in `namespace` (cluster-wide bindings first,
    /// then the namespace's RoleBindings), like kube's `VisitRulesFor`. The visitor returns
    /// `false` to stop. Missing roles are reported as errors to the visitor.
    fn visit_rules(&self, user: &UserInfo, namespace: &str, visit: &mut RuleVisitor<'_>) {
        let namespaced = self
            .role_bindings
            .get(namespace)
            .filter(|_| !namespace.is_empty());
        let all = self
            .cluster_role_bindings
            .iter()
            .chain(namespaced.into_iter().flatten());
        for binding in all {
            let Some(subject) = binding
                .subjects
                .iter()
                .find(|s| applies_to(user, s, &binding.namespace))
            else {
                continue;
            };
            match self.rules_for_binding(binding) {
                Ok(rules) => {
                    for rule in rules {
                        if !visit(binding, subject, Some(rule), None) {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if !visit(binding, subject, None, Some(e)) {
                        return;
                    }
                }
            }
        }
    }

    fn rules_for_binding(&self, b: &Binding) -> std::result::Result<&[PolicyRule], String> {
        match b.role_kind.as_str() {
            "ClusterRole" => self
                .cluster_roles
                .get(&b.role_name)
                .map(Vec::as_slice)
                .ok_or_else(|| {
                    format!(
                        "clusterrole.rbac.authorization.k8s.io {:?} not found",
                        b.role_name
                    )
                }),
            "Role" if !b.namespace.is_empty() => self
                .roles
                .get(&(b.namespace.clone(), b.role_name.clone()))
                .map(Vec::as_slice)
                .ok_or_else(|| {
                    format!("role.rbac.authorization.k8s.io {:?} not found", b.role_name)
                }),
            other => Err(format!("unsupported role reference kind: {other:?}")),
        }
    }

    /// Every rule that applies to `user` in `namespace` (for SelfSubjectRulesReview), and the
    /// errors met resolving them (`incomplete` when non-empty).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let (mut rules, mut errors) = (Vec::new(), Vec::new());
        self.visit_rules(user, namespace, &mut |_, _, rule, err| {
            if let Some(rule) = rule {
                rules.push(rule.clone());
            }
            if let Some(err) = err {
                errors.push(err);
            }
            true
        });
        (rules, errors)
    }
}

/// Whether a binding subject matches the user (kube's `appliesToUser`).
fn applies_to(user: &UserInfo, subject: &Subject, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => user.username == subject.name,
        "Group" => user.in_group(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            !ns.is_empty()
                && parse_service_account_username(&user.username)
                    == Some((ns, subject.name.as_str()))
        }
        _ => false,
    }
}

/// The effective rules of every ClusterRole: its own rules, or for a ClusterRole with an
/// `aggregationRule`, the de-duplicated union of the effective rules of every other ClusterRole
/// matched by any of its selectors (resolved transitively; cycles are cut). This is what the
/// clusterrole-aggregation controller writes into `rules`; the store can use it to do the same.
pub fn aggregate_cluster_roles(cluster_roles: &[ClusterRole]) -> BTreeMap<String, Vec<PolicyRule>> {
    let by_name: BTreeMap<&str, &ClusterRole> = cluster_roles
        .iter()
        .map(|r| (r.metadata.name.as_deref().unwrap_or_default(), r))
        .collect();
    let mut out = BTreeMap::new();
    for name in by_name.keys() {
        let mut visiting = BTreeSet::new();
        let rules = effective_rules(name, &by_name, &mut visiting);
        out.insert(name.to_string(), rules);
    }
    out
}

fn effective_rules<'a>(
    name: &'a str,
    by_name: &BTreeMap<&'a str, &'a ClusterRole>,
    visiting: &mut BTreeSet<&'a str>,
) -> Vec<PolicyRule> {
    let Some(role) = by_name.get(name) else {
        return Vec::new();
    };
    let selectors = role
        .aggregation_rule
        .as_ref()
        .and_then(|a| a.cluster_role_selectors.as_ref());
    let Some(selectors) = selectors else {
        return role.rules.clone().unwrap_or_default();
    };
    if !visiting.insert(name) {
        return Vec::new();
    }
    let mut rules: Vec<PolicyRule> = Vec::new();
    // Name order, like the controller's sorted listing.
    for (other, other_role) in by_name {
        if *other == name {
            continue;
        }
        let labels = other_role.metadata.labels.clone().unwrap_or_default();
        if selectors.iter().any(|s| label_selector_matches(s, &labels)) {
            for rule in effective_rules(other, by_name, visiting) {
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
            }
        }
    }
    visiting.remove(name);
    rules
}

/// Authorizes a request: `system:masters` bypass, then RBAC.
pub fn authorize(attrs: &RequestAttributes, snapshot: &RbacSnapshot) -> Decision {
    if attrs.user.in_group(GROUP_MASTERS) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut decision = Decision::default();
    let mut errors = Vec::new();
    let namespace = if attrs.resource_request {
        attrs.namespace.as_str()
    } else {
        ""
    };
    snapshot.visit_rules(
        &attrs.user,
        namespace,
        &mut |binding, subject, rule, err| {
            if let Some(rule) = rule
                && rule_allows(attrs, rule)
            {
                decision.allowed = true;
                decision.reason = format!("RBAC: allowed by {}", binding.describe(subject));
                return false;
            }
            if let Some(err) = err {
                errors.push(err);
            }
            true
        },
    );
    if !decision.allowed && !errors.is_empty() {
        decision.reason = if errors.len() == 1 {
            format!("RBAC: {}", errors[0])
        } else {
            format!("RBAC: [{}]", errors.join(", "))
        };
    }
    decision
}

/// Whether one rule allows the request (kube's `RuleAllows`).
pub fn rule_allows(attrs: &RequestAttributes, rule: &PolicyRule) -> bool {
    let verb_ok = rule.verbs.iter().any(|v| v == "*" || *v == attrs.verb);
    if !verb_ok {
        return false;
    }
    if !attrs.resource_request {
        return rule
            .non_resource_urls
            .iter()
            .flatten()
            .any(|u| non_resource_url_matches(u, &attrs.path));
    }
    let group_ok = rule
        .api_groups
        .iter()
        .flatten()
        .any(|g| g == "*" || *g == attrs.api_group);
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resource_ok = rule.resources.iter().flatten().any(|r| {
        r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    let name_ok = match &rule.resource_names {
        None => true,
        Some(names) if names.is_empty() => true,
        Some(names) => names.contains(&attrs.name),
    };
    group_ok && resource_ok && name_ok
}

fn non_resource_url_matches(rule_url: &str, path: &str) -> bool {
    rule_url == "*"
        || rule_url == path
        || rule_url
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix.trim_end_matches('*')))
}

#[cfg(test)]
mod tests;
