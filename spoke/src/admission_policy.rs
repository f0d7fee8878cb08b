//! The spoke-side `ValidatingAdmissionPolicy` that bounds what kleym's own user (the hub's
//! mapped user, or the `kleym spoke` ServiceAccount) may do to ClusterSPIFFEIDs: only what
//! the compiler would ever write ([`super::compiler::output`]), only to objects that carry
//! kleym's ownership annotation ([`crate::ownership`]).
//!
//! A leaked hub credential, a compromised hub or a compiler bug then cannot mint an
//! identity outside one namespace of the spoke's trust domain: the spoke's API server
//! refuses it. Other users (platform admins, SPIRE's controller manager) are not matched.
//!
//! `kleym trust-config` prints these documents per spoke, and `deploy/spoke/admission-policy.yaml`
//! is this module's output for the `kleym spoke` ServiceAccount (a test keeps them equal).

use kleym_api::labels;
use serde_json::{Value, json};

use crate::ownership::{LEGACY_BINDING_UID_ANNOTATION, OWNER_ANNOTATION};

/// What the policy is generated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyOptions {
    /// Name of the policy and of its binding (`kleym-hub-bounds`, `kleym-spoke-bounds`).
    pub name: String,
    /// The users whose requests are bounded (exact usernames as the API server sees them).
    pub usernames: Vec<String>,
    /// The spoke's SPIFFE trust domain: IDs must be `spiffe://<it>/ns/<namespace>/...`.
    pub trust_domain: String,
    /// The cluster DNS domain (`cluster.local`): DNS names may be `<svc>.<ns>.svc` or
    /// `<svc>.<ns>.svc.<it>`.
    pub cluster_domain: String,
}

/// Name of the policy and binding `kleym trust-config` prints for the hub's user.
pub const HUB_POLICY_NAME: &str = "kleym-hub-bounds";
/// Name of the policy and binding of `deploy/spoke/` for the `kleym spoke` ServiceAccount.
pub const SPOKE_POLICY_NAME: &str = "kleym-spoke-bounds";
/// The `kleym spoke` ServiceAccount's username (`deploy/spoke/serviceaccount.yaml`).
pub const SPOKE_USERNAME: &str = "system:serviceaccount:kleym-system:kleym-spoke";
/// Length of the hash suffix of kleym's ClusterSPIFFEID names.
const NAME_HASH_HEX: usize = 10;

/// A CEL string literal (single-quoted, escaped).
fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A regular expression matching `s` literally (for the trust and cluster domains).
fn regex_literal(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_string()
            } else {
                format!("[{c}]")
            }
        })
        .collect()
}

/// One validation: `rule` must hold on CREATE and UPDATE; `message` (a CEL string
/// expression) names the rule broken.
fn on_write(rule: &str, message: &str) -> Value {
    json!({
        "expression": format!("request.operation == 'DELETE' || ({rule})"),
        "messageExpression": format!("'ClusterSPIFFEID ' + request.name + ': ' + {message}"),
        "reason": "Forbidden",
    })
}

/// The `ValidatingAdmissionPolicy` and its `ValidatingAdmissionPolicyBinding`.
pub fn admission_policy(opts: &PolicyOptions) -> Vec<Value> {
    let users: Vec<String> = opts.usernames.iter().map(|u| cel_string(u)).collect();
    let owner = cel_string(OWNER_ANNOTATION);
    let legacy = cel_string(LEGACY_BINDING_UID_ANNOTATION);
    let managed_by = cel_string(labels::MANAGED_BY);
    let managed_by_value = cel_string(labels::MANAGED_BY_VALUE);
    let binding_ns = cel_string(labels::BINDING_NAMESPACE);
    let ns_label = cel_string(crate::compiler::output::NAMESPACE_NAME_LABEL);
    let id_prefix = cel_string(&format!("spiffe://{}/ns/", opts.trust_domain));
    let cluster_domain = regex_literal(&opts.cluster_domain);
    let name_re = format!("^kleym-[a-z0-9.-]*-[0-9a-f]{{{NAME_HASH_HEX}}}$");
    let variables = json!([
        {"name": "labels", "expression": "object != null && has(object.metadata.labels) ? object.metadata.labels : {}"},
        {"name": "annotations", "expression": "object != null && has(object.metadata.annotations) ? object.metadata.annotations : {}"},
        {"name": "oldAnnotations", "expression": "oldObject != null && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
        {"name": "spec", "expression": "object != null && has(object.spec) ? object.spec : {}"},
        {"name": "nsLabels", "expression": "has(variables.spec.namespaceSelector) && has(variables.spec.namespaceSelector.matchLabels) ? variables.spec.namespaceSelector.matchLabels : {}"},
        {"name": "ns", "expression": format!("{ns_label} in variables.nsLabels ? string(variables.nsLabels[{ns_label}]) : ''")},
        {"name": "selectors", "expression": "has(variables.spec.workloadSelectorTemplates) ? variables.spec.workloadSelectorTemplates : []"},
        {"name": "dnsNames", "expression": "has(variables.spec.dnsNameTemplates) ? variables.spec.dnsNameTemplates : []"},
    ]);
    let validations = vec![
        json!({
            "expression": format!(
                "request.operation == 'CREATE' || {owner} in variables.oldAnnotations || {legacy} in variables.oldAnnotations"
            ),
            "messageExpression": format!(
                "'ClusterSPIFFEID ' + request.name + ': it has no {OWNER_ANNOTATION} annotation (not kleym\\'s): kleym may not ' + (request.operation == 'DELETE' ? 'delete' : 'change') + ' it'"
            ),
            "reason": "Forbidden",
        }),
        on_write(
            &format!("request.name.matches('{name_re}')"),
            "'the name is not one kleym gives (kleym-<namespace>-<binding>-<hash>)'",
        ),
        on_write(
            &format!(
                "{managed_by} in variables.labels && variables.labels[{managed_by}] == {managed_by_value}"
            ),
            &format!(
                "'the label {}={} is missing'",
                labels::MANAGED_BY,
                labels::MANAGED_BY_VALUE
            ),
        ),
        on_write(
            "!has(variables.spec.admin) || variables.spec.admin == false",
            "'spec.admin is set: kleym never writes admin identities'",
        ),
        on_write(
            "!has(variables.spec.downstream) || variables.spec.downstream == false",
            "'spec.downstream is set: kleym never writes downstream identities'",
        ),
        on_write(
            "variables.ns != '' && size(variables.nsLabels) == 1 && (!has(variables.spec.namespaceSelector.matchExpressions) || size(variables.spec.namespaceSelector.matchExpressions) == 0)",
            &format!(
                "'spec.namespaceSelector must pin exactly one namespace by the label {} and nothing else'",
                crate::compiler::output::NAMESPACE_NAME_LABEL
            ),
        ),
        on_write(
            &format!(
                "{binding_ns} in variables.labels && variables.labels[{binding_ns}] == variables.ns && {owner} in variables.annotations && variables.annotations[{owner}].startsWith(variables.ns + '/')"
            ),
            &format!(
                "'the label {} and the annotation {OWNER_ANNOTATION} must name the namespace ' + variables.ns + ' that spec.namespaceSelector pins'",
                labels::BINDING_NAMESPACE
            ),
        ),
        on_write(
            &format!(
                "has(variables.spec.spiffeIDTemplate) && variables.spec.spiffeIDTemplate.startsWith({id_prefix} + variables.ns + '/') && !variables.spec.spiffeIDTemplate.contains('/../')"
            ),
            &format!("'spec.spiffeIDTemplate must be under ' + {id_prefix} + variables.ns + '/'"),
        ),
        on_write(
            "('k8s:ns:' + variables.ns) in variables.selectors && variables.selectors.all(s, !s.startsWith('k8s:ns:') || s == 'k8s:ns:' + variables.ns) && size(variables.selectors.filter(s, s.startsWith('k8s:sa:'))) == 1",
            "'spec.workloadSelectorTemplates must include k8s:ns:' + variables.ns + ', no other k8s:ns:, and exactly one k8s:sa:'",
        ),
        on_write(
            &format!(
                "variables.dnsNames.all(d, d.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?[.]' + variables.ns + '[.]svc([.]{cluster_domain})?$'))"
            ),
            &format!(
                "'spec.dnsNameTemplates may only name services of ' + variables.ns + ' (<service>.' + variables.ns + '.svc[.{}])'",
                opts.cluster_domain.replace('\'', "")
            ),
        ),
    ];
    let labels = json!({"app.kubernetes.io/name": "kleym", "app.kubernetes.io/component": "admission-policy"});
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": opts.name, "labels": labels},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["spire.spiffe.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["clusterspiffeids"],
                }]},
                "matchConditions": [{
                    "name": "kleym-user",
                    "expression": format!("request.userInfo.username in [{}]", users.join(", ")),
                }],
                "variables": variables,
                "validations": validations,
            },
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": opts.name, "labels": labels},
            "spec": {"policyName": opts.name, "validationActions": ["Deny"]},
        }),
    ]
}

/// `deploy/spoke/admission-policy.yaml`: the policy for the `kleym spoke` ServiceAccount,
/// with the example trust domain of `deploy/spoke/deployment.yaml`.
pub fn deploy_spoke_yaml() -> String {
    let docs = admission_policy(&PolicyOptions {
        name: SPOKE_POLICY_NAME.into(),
        usernames: vec![SPOKE_USERNAME.into()],
        trust_domain: "example.org".into(),
        cluster_domain: "cluster.local".into(),
    });
    let mut out = String::from(
        "# Generated by kleym (spoke/src/admission_policy.rs); a test keeps it equal.\n\
         # Bounds what the kleym-spoke ServiceAccount may do to ClusterSPIFFEIDs (docs/spoke.md).\n\
         # Set example.org to your SPIRE trust domain (as --trust-domain in deployment.yaml).\n",
    );
    for d in docs {
        out.push_str("---\n");
        out.push_str(&kleym_api::yaml::to_string(&d).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `deploy/spoke/admission-policy.yaml` is this module's output (set
    /// `KLEYM_BLESS=1` to rewrite it after changing the policy).
    #[test]
    fn deploy_spoke_file_is_generated_from_this_module() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/spoke/admission-policy.yaml");
        let want = deploy_spoke_yaml();
        if std::env::var_os("KLEYM_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} differs from admission_policy::deploy_spoke_yaml(); run this test with KLEYM_BLESS=1",
            path.display()
        );
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(cel_string("a'b\\c"), "'a\\'b\\\\c'");
        assert_eq!(regex_literal("cluster.local"), "cluster[.]local");
    }
}
