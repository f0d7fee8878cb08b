//! The resource registry: built-in kinds and the group/version/plurals CRDs serve.

use serde_json::Value;

/// A subresource other than `status` that discovery lists (e.g. `serviceaccounts/token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubresourceInfo {
    /// Subresource name (`token`).
    pub name: String,
    /// Group of the subresource's kind (`authentication.k8s.io`).
    pub group: String,
    /// Version of the subresource's kind (`v1`).
    pub version: String,
    /// Kind (`TokenRequest`).
    pub kind: String,
    /// Verbs (`create`).
    pub verbs: Vec<String>,
}

/// One served resource (a group/version/plural), as discovery lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group (`""` for core).
    pub group: String,
    /// Version (`v1`, `v1alpha1` …).
    pub version: String,
    /// Plural resource name (`pods`).
    pub plural: String,
    /// Singular name (`pod`).
    pub singular: String,
    /// Kind (`Pod`).
    pub kind: String,
    /// `ListKind` (`PodList`).
    pub list_kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Verbs for discovery.
    pub verbs: Vec<String>,
    /// Short names (`po`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource.
    pub has_status: bool,
    /// Whether this version is the storage version (CRDs) / preferred.
    pub storage: bool,
    /// Other subresources discovery lists (`serviceaccounts/token`); their logic is the HTTP
    /// layer's.
    pub subresources: Vec<SubresourceInfo>,
    /// Create-only virtual resources (`tokenreviews`, `subjectaccessreviews` …): the store
    /// keeps nothing for them; the HTTP layer answers them.
    pub virtual_only: bool,
    /// CRD `additionalPrinterColumns` of this version (raw), for Table output.
    pub printer_columns: Vec<Value>,
    /// `true` for resources served from a CustomResourceDefinition.
    pub custom: bool,
}

impl ResourceInfo {
    /// `group/version`, or `version` for the core group (the `apiVersion` of objects).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, or `plural` for the core group, as kube-apiserver names a resource in
    /// messages (`pods`, `clusterspiffeids.spire.spiffe.io`).
    pub fn resource_group(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const RW_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    categories: &[&str],
    has_status: bool,
) -> ResourceInfo {
    ResourceInfo {
        group: group.to_string(),
        version: "v1".to_string(),
        plural: plural.to_string(),
        singular: singular.to_string(),
        kind: kind.to_string(),
        list_kind: format!("{kind}List"),
        namespaced,
        verbs: RW_VERBS.iter().map(|v| v.to_string()).collect(),
        short_names: short.iter().map(|v| v.to_string()).collect(),
        categories: categories.iter().map(|v| v.to_string()).collect(),
        has_status,
        storage: true,
        subresources: Vec::new(),
        virtual_only: false,
        printer_columns: Vec::new(),
        custom: false,
    }
}

fn virtual_create_only(group: &str, plural: &str, kind: &str, namespaced: bool) -> ResourceInfo {
    let mut r = builtin(
        group,
        plural,
        &plural[..plural.len() - 1],
        kind,
        namespaced,
        &[],
        &[],
        false,
    );
    r.verbs = vec!["create".to_string()];
    r.virtual_only = true;
    r
}

/// Group of `ValidatingAdmissionPolicy` and its bindings.
pub const ADMISSION_GROUP: &str = "admissionregistration.k8s.io";

/// The built-in resources every simulated cluster serves.
pub fn builtins() -> Vec<ResourceInfo> {
    let rbac = "rbac.authorization.k8s.io";
    let mut namespaces = builtin(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        &[],
        true,
    );
    // kube-apiserver serves no deletecollection for namespaces
    namespaces.verbs.retain(|v| v != "deletecollection");
    let mut serviceaccounts = builtin(
        "",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        &[],
        false,
    );
    serviceaccounts.subresources.push(SubresourceInfo {
        name: "token".to_string(),
        group: "authentication.k8s.io".to_string(),
        version: "v1".to_string(),
        kind: "TokenRequest".to_string(),
        verbs: vec!["create".to_string()],
    });
    let mut crds = builtin(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        &["api-extensions"],
        true,
    );
    crds.categories = vec!["api-extensions".to_string()];
    let admission_policies = builtin(
        ADMISSION_GROUP,
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
        &[],
        &["api-extensions"],
        true,
    );
    vec![
        namespaces,
        builtin("", "pods", "pod", "Pod", true, &["po"], &["all"], true),
        // Cluster-scoped as in kube-apiserver; read by tools that render a pod's node data.
        builtin("", "nodes", "node", "Node", false, &["no"], &[], true),
        serviceaccounts,
        builtin("", "secrets", "secret", "Secret", true, &[], &[], false),
        builtin(
            "",
            "configmaps",
            "configmap",
            "ConfigMap",
            true,
            &["cm"],
            &[],
            false,
        ),
        builtin("", "events", "event", "Event", true, &["ev"], &[], false),
        builtin(
            "events.k8s.io",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            &[],
            false,
        ),
        builtin(
            "coordination.k8s.io",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            &[],
            false,
        ),
        builtin(rbac, "roles", "role", "Role", true, &[], &[], false),
        builtin(
            rbac,
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            &[],
            false,
        ),
        builtin(
            rbac,
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            &[],
            false,
        ),
        builtin(
            rbac,
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            &[],
            false,
        ),
        crds,
        admission_policies,
        builtin(
            ADMISSION_GROUP,
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicybinding",
            "ValidatingAdmissionPolicyBinding",
            false,
            &[],
            &["api-extensions"],
            false,
        ),
        virtual_create_only(
            "authentication.k8s.io",
            "tokenreviews",
            "TokenReview",
            false,
        ),
        virtual_create_only(
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
            false,
        ),
        virtual_create_only(
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            false,
        ),
        virtual_create_only(
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            "LocalSubjectAccessReview",
            true,
        ),
    ]
}

/// Fields a kind supports in field selectors (besides `metadata.name`/`metadata.namespace`),
/// the cheap subset of kube-apiserver's per-kind conversion functions.
pub fn extra_selectable_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        _ => &[],
    }
}

/// Kinds whose `update` creates a missing object (`AllowCreateOnUpdate` in kube-apiserver's
/// registry strategies).
pub fn allows_create_on_update(group: &str, plural: &str) -> bool {
    matches!(
        (group, plural),
        ("rbac.authorization.k8s.io", _)
            | ("", "events")
            | ("events.k8s.io", "events")
            | ("coordination.k8s.io", "leases")
    )
}

/// Kinds whose DELETE answers with the deleted object rather than a `Status`
/// (`ReturnDeletedObject` in kube-apiserver's registries).
pub fn returns_deleted_object(group: &str, plural: &str, custom: bool) -> bool {
    custom
        || matches!(
            (group, plural),
            ("", "pods") | ("", "namespaces") | ("apiextensions.k8s.io", _)
        )
}
