//! The spoke-side `ValidatingAdmissionPolicy` that bounds what kleym's own user (the hub's
//! mapped user, or the `kleym spoke` ServiceAccount) may do to ClusterSPIFFEIDs: only what
//! the compiler would ever write ([`super::compiler::output`]), only to objects that carry
//! kleym's ownership annotation ([`crate::ownership`]).
//!
//! A leaked hub credential, a compromised hub or a compiler bug then cannot mint an
//! identity outside one namespace of the spoke's trust domain: the spoke's API server
//! refuses it. Other users (platform admins, SPIRE's controller manager) are not matched.
//!
//! The operator's SVID settings (`--cluster-domain`, `--svid-dns-suffix`,
//! `--svid-namespace-dns-suffix`, `--svid-max-ttl`, `--svid-max-jwt-ttl`,
//! `--svid-federates-with`, `--hub-x509-username`: [`crate::compiler::svid`]) are the
//! policy's parameters, read from a ConfigMap (`paramKind` `v1` ConfigMap, `paramRef` by
//! name and namespace, `parameterNotFoundAction: Deny`), so changing what a spoke allows
//! needs no edit of the policy. Its keys ([`params_config_map`] writes them from the checked
//! [`SvidPolicy`]; lists are comma-separated, blanks around entries ignored):
//!
//! | key | value |
//! |---|---|
//! | `clusterDomain` | the cluster DNS domain (`cluster.local`) |
//! | `dnsSuffixes` | DNS suffixes every namespace may use |
//! | `namespaceDNSSuffixes` | `NAMESPACE=SUFFIX` entries: a suffix one namespace may use |
//! | `maxTtl` | the longest `spec.ttl`, a Go duration (`24h`) |
//! | `maxJwtTtl` | the longest `spec.jwtTtl`, a Go duration (`1h`) |
//! | `federatesWith` | trust domains `spec.federatesWith` may list |
//! | `reservedDNSNames` | names no DNS name may be (the hub's X.509 user names) |
//!
//! A missing key allows nothing of its kind (no suffix, no TTL, no federation); a missing
//! ConfigMap denies every request of kleym's user.
//!
//! `kleym trust-config` prints these documents per spoke, `deploy/spoke/admission-policy.yaml`
//! is this module's output for the `kleym spoke` ServiceAccount (a test keeps them equal), and
//! the chart's single-cluster mode renders them from the same values as the spoke's flags.

use kleym_api::labels;
use serde_json::{Value, json};

use crate::compiler::svid::{SvidPolicy, SvidPolicySettings, duration_text};
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
    /// The cluster DNS domain of the default parameters [`admission_policy`] writes
    /// ([`admission_policy_with`] takes the whole [`SvidPolicy`] instead).
    pub cluster_domain: String,
}

/// Where the policy's parameters live: a ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamsRef {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl ParamsRef {
    /// The default place of the parameters of the policy named `policy_name`: a ConfigMap
    /// of the same name in `kube-system`, which every cluster has and only its admins write.
    pub fn default_for(policy_name: &str) -> Self {
        ParamsRef {
            namespace: DEFAULT_PARAMS_NAMESPACE.into(),
            name: policy_name.into(),
        }
    }
}

/// Name of the policy and binding `kleym trust-config` prints for the hub's user.
pub const HUB_POLICY_NAME: &str = "kleym-hub-bounds";
/// Name of the policy and binding of `deploy/spoke/` for the `kleym spoke` ServiceAccount.
pub const SPOKE_POLICY_NAME: &str = "kleym-spoke-bounds";
/// The `kleym spoke` ServiceAccount's username (`deploy/spoke/serviceaccount.yaml`).
pub const SPOKE_USERNAME: &str = "system:serviceaccount:kleym-system:kleym-spoke";
/// Namespace of the parameters' ConfigMap when none is given ([`ParamsRef::default_for`]).
pub const DEFAULT_PARAMS_NAMESPACE: &str = "kube-system";
/// Namespace of `deploy/spoke/` (the ConfigMap of its policy's parameters lives there).
pub const SPOKE_NAMESPACE: &str = "kleym-system";
/// A TTL as kleym writes it: the binding CRD's pattern for `spec.svid.ttl`/`jwtTtl`
/// (`kleym_api::SvidOptions`), a positive Go duration, once its micro sign is `u`
/// ([`normalized_duration`]). kleym drops a zero TTL; the policy refuses one.
const GO_DURATION_RE: &str = "^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$";
/// A DNS name as the compiler's syntax check admits it (plus the length checks beside it).
const DNS_NAME_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Length of the hash suffix of kleym's ClusterSPIFFEID names.
const NAME_HASH_HEX: usize = 10;

/// A CEL string literal (single-quoted, escaped).
fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
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

/// A parameter's CEL value: `key` of the ConfigMap's data, trimmed, or `missing`.
fn param(key: &str, missing: &str) -> String {
    format!(
        "'{key}' in variables.p ? variables.p['{key}'].trim() : {}",
        cel_string(missing)
    )
}

/// A list parameter's CEL value: `key`'s comma-separated entries, trimmed, blanks dropped.
fn param_list(key: &str) -> String {
    format!(
        "('{key}' in variables.p ? variables.p['{key}'] : '').split(',').map(e, e.trim()).filter(e, e != '')"
    )
}

/// `value` (a CEL string) with its micro sign (U+00B5) as `u`: Go reads `µs` and `us`
/// alike; the policy checks and compares the `us` form.
fn normalized_duration(value: &str) -> String {
    format!("{value}.replace('\\u00b5', 'u')")
}

/// The validation of a TTL field (`ttl`, `jwtTtl`) against its maximum variable.
fn ttl_rule(field: &str, max_var: &str, max_key: &str, at: &str) -> Value {
    let v = format!("variables.spec.{field}");
    let d = format!("duration({})", normalized_duration(&v));
    on_write(
        &format!(
            "!has(variables.spec.{field}) || ({}.matches('{GO_DURATION_RE}') && {d} > duration('0s') && {d} <= duration(variables.{max_var}))",
            normalized_duration(&v)
        ),
        &format!(
            "'spec.{field} ' + {v} + ' is not a positive duration of at most ' + variables.{max_var} + ' ({max_key} in {at})'"
        ),
    )
}

/// The `ValidatingAdmissionPolicy` and its `ValidatingAdmissionPolicyBinding`, reading
/// their parameters from the ConfigMap `params`.
fn policy_and_binding(opts: &PolicyOptions, params: &ParamsRef) -> Vec<Value> {
    let users: Vec<String> = opts.usernames.iter().map(|u| cel_string(u)).collect();
    let owner = cel_string(OWNER_ANNOTATION);
    let legacy = cel_string(LEGACY_BINDING_UID_ANNOTATION);
    let managed_by = cel_string(labels::MANAGED_BY);
    let managed_by_value = cel_string(labels::MANAGED_BY_VALUE);
    let binding_ns = cel_string(labels::BINDING_NAMESPACE);
    let ns_label = cel_string(crate::compiler::output::NAMESPACE_NAME_LABEL);
    let id_prefix = cel_string(&format!("spiffe://{}/ns/", opts.trust_domain));
    let name_re = format!("^kleym-[a-z0-9.-]*-[0-9a-f]{{{NAME_HASH_HEX}}}$");
    // Where the parameters are, for messages (names are DNS labels and subdomains: no quote).
    let at = format!("ConfigMap {}/{}", params.namespace, params.name).replace('\'', "");
    let variables = json!([
        {"name": "labels", "expression": "object != null && has(object.metadata.labels) ? object.metadata.labels : {}"},
        {"name": "annotations", "expression": "object != null && has(object.metadata.annotations) ? object.metadata.annotations : {}"},
        {"name": "oldAnnotations", "expression": "oldObject != null && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
        {"name": "spec", "expression": "object != null && has(object.spec) ? object.spec : {}"},
        {"name": "nsLabels", "expression": "has(variables.spec.namespaceSelector) && has(variables.spec.namespaceSelector.matchLabels) ? variables.spec.namespaceSelector.matchLabels : {}"},
        {"name": "ns", "expression": format!("{ns_label} in variables.nsLabels ? string(variables.nsLabels[{ns_label}]) : ''")},
        {"name": "selectors", "expression": "has(variables.spec.workloadSelectorTemplates) ? variables.spec.workloadSelectorTemplates : []"},
        {"name": "dnsNames", "expression": "has(variables.spec.dnsNameTemplates) ? variables.spec.dnsNameTemplates : []"},
        // The operator's settings (the ConfigMap's data; absent keys allow nothing).
        {"name": "p", "expression": "params != null && has(params.data) ? params.data : {}"},
        {"name": "clusterDomain", "expression": param("clusterDomain", "")},
        {"name": "suffixes", "expression": format!(
            "{} + {}.filter(e, e.startsWith(variables.ns + '=')).map(e, e.substring(size(variables.ns) + 1).trim())",
            param_list("dnsSuffixes"),
            param_list("namespaceDNSSuffixes"),
        )},
        {"name": "reservedDNSNames", "expression": param_list("reservedDNSNames")},
        {"name": "federatesWith", "expression": param_list("federatesWith")},
        {"name": "maxTtl", "expression": param("maxTtl", "0s")},
        {"name": "maxJwtTtl", "expression": param("maxJwtTtl", "0s")},
    ]);
    // One DNS name `d`, as the compiler allows it (`compiler::svid`): valid syntax; then a
    // Service name of the namespace when it has the form `<label>.<ns>.svc[.<domain>]`;
    // else under the first allowed suffix it ends with, with no IDNA (`xn--`) label before.
    let svc_rest = "d.substring(d.indexOf('.') + 1)";
    let dns_rule = format!(
        "variables.dnsNames.all(d, size(d) <= 253 && d.matches('{DNS_NAME_RE}') && d.split('.').all(l, size(l) <= 63) && \
         ((d.contains('.') && ({svc_rest} == variables.ns + '.svc' || {svc_rest} == variables.ns + '.svc.' + variables.clusterDomain)) \
         ? (d.substring(0, d.indexOf('.')).matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && !d.matches('^[^.]{{2}}--')) \
         : (variables.suffixes.exists(s, d.endsWith('.' + s)) && \
            !('.' + d.substring(0, size(d) - size(variables.suffixes.filter(s, d.endsWith('.' + s))[0]) - 1)).matches('[.][^.]{{2}}--'))))"
    );
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
            "!has(variables.spec.autoPopulateDNSNames) || variables.spec.autoPopulateDNSNames == false",
            "'spec.autoPopulateDNSNames is set: kleym never lets SPIRE add DNS names'",
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
            "variables.dnsNames.all(d, !(d in variables.reservedDNSNames))",
            &format!(
                "'spec.dnsNameTemplates names one of the reserved names (the hub\\'s X.509 user names, reservedDNSNames in {at})'"
            ),
        ),
        on_write(
            &dns_rule,
            &format!(
                "'spec.dnsNameTemplates may only name services of ' + variables.ns + ' (<service>.' + variables.ns + '.svc[.' + variables.clusterDomain + ']) or names under the DNS suffixes allowed to ' + variables.ns + ' in {at}' + (size(variables.suffixes) == 0 ? ' (none)' : ': ' + variables.suffixes.join(', '))"
            ),
        ),
        ttl_rule("ttl", "maxTtl", "maxTtl", &at),
        ttl_rule("jwtTtl", "maxJwtTtl", "maxJwtTtl", &at),
        on_write(
            "!has(variables.spec.federatesWith) || variables.spec.federatesWith.all(td, td in variables.federatesWith)",
            &format!(
                "'spec.federatesWith may only list the trust domains {at} allows (federatesWith)' + (size(variables.federatesWith) == 0 ? ': none' : ': ' + variables.federatesWith.join(', '))"
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
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
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
            "spec": {
                "policyName": opts.name,
                "paramRef": {
                    "name": params.name,
                    "namespace": params.namespace,
                    "parameterNotFoundAction": "Deny",
                },
                "validationActions": ["Deny"],
            },
        }),
    ]
}

/// The parameters' data: the checked settings, in the order the compiler applies them.
pub fn params_data(svid: &SvidPolicy) -> serde_json::Map<String, Value> {
    let namespaced: Vec<String> = svid
        .namespace_dns_suffixes()
        .iter()
        .flat_map(|(ns, list)| list.iter().map(move |s| format!("{ns}={s}")))
        .collect();
    // Only a DNS name can equal a DNS name: other user names need no entry (and could hold
    // the list's comma).
    let reserved: Vec<&str> = svid
        .hub_x509_usernames()
        .iter()
        .map(String::as_str)
        .filter(|u| crate::compiler::selectors::is_dns_name(u))
        .collect();
    let list = |v: Vec<&str>| Value::String(v.join(","));
    let mut data = serde_json::Map::new();
    data.insert("clusterDomain".into(), svid.cluster_domain().into());
    data.insert(
        "dnsSuffixes".into(),
        list(svid.dns_suffixes().iter().map(String::as_str).collect()),
    );
    data.insert(
        "namespaceDNSSuffixes".into(),
        list(namespaced.iter().map(String::as_str).collect()),
    );
    data.insert("maxTtl".into(), duration_text(svid.max_ttl()).into());
    data.insert("maxJwtTtl".into(), duration_text(svid.max_jwt_ttl()).into());
    data.insert(
        "federatesWith".into(),
        list(svid.federates_with().iter().map(String::as_str).collect()),
    );
    data.insert("reservedDNSNames".into(), list(reserved));
    data
}

/// The ConfigMap holding the policy's parameters: the settings `svid` (the same as the
/// spoke's or hub's `--cluster-domain` and `--svid-*` flags) at `at`.
pub fn params_config_map(at: &ParamsRef, svid: &SvidPolicy) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": at.name,
            "namespace": at.namespace,
            "labels": {"app.kubernetes.io/name": "kleym", "app.kubernetes.io/component": "admission-policy"},
        },
        "data": params_data(svid),
    })
}

/// The `ValidatingAdmissionPolicy`, its `ValidatingAdmissionPolicyBinding` and the ConfigMap
/// of its parameters (in that order) for the settings `svid`, the ConfigMap at `params`.
pub fn admission_policy_with(
    opts: &PolicyOptions,
    params: &ParamsRef,
    svid: &SvidPolicy,
) -> Vec<Value> {
    let mut docs = policy_and_binding(opts, params);
    docs.push(params_config_map(params, svid));
    docs
}

/// [`admission_policy_with`] the default settings (with `opts.cluster_domain`), the
/// ConfigMap at [`ParamsRef::default_for`] the policy's name. A cluster domain the compiler
/// would refuse falls back to the default `cluster.local`.
pub fn admission_policy(opts: &PolicyOptions) -> Vec<Value> {
    let svid = SvidPolicy::new(SvidPolicySettings {
        cluster_domain: opts.cluster_domain.clone(),
        ..SvidPolicySettings::default()
    })
    .unwrap_or_default();
    admission_policy_with(opts, &ParamsRef::default_for(&opts.name), &svid)
}

/// Where `deploy/spoke/`'s policy reads its parameters: `kleym-system/kleym-spoke-bounds`.
pub fn spoke_params_ref() -> ParamsRef {
    ParamsRef {
        namespace: SPOKE_NAMESPACE.into(),
        name: SPOKE_POLICY_NAME.into(),
    }
}

/// `deploy/spoke/admission-policy.yaml`: the policy for the `kleym spoke` ServiceAccount,
/// with the example trust domain of `deploy/spoke/deployment.yaml`.
pub fn deploy_spoke_yaml() -> String {
    let docs = admission_policy_with(
        &PolicyOptions {
            name: SPOKE_POLICY_NAME.into(),
            usernames: vec![SPOKE_USERNAME.into()],
            trust_domain: "example.org".into(),
            cluster_domain: crate::compiler::svid::DEFAULT_CLUSTER_DOMAIN.into(),
        },
        &spoke_params_ref(),
        &SvidPolicy::default(),
    );
    let mut out = String::from(
        "# Generated by kleym (spoke/src/admission_policy.rs); a test keeps it equal.\n\
         # Bounds what the kleym-spoke ServiceAccount may do to ClusterSPIFFEIDs (docs/spoke.md).\n\
         # Set example.org to your SPIRE trust domain (as --trust-domain in deployment.yaml).\n\
         # The ConfigMap holds the SVID settings the policy allows, the defaults of kleym spoke's\n\
         # flags: keep it equal to the --cluster-domain and --svid-* flags in deployment.yaml.\n",
    );
    for d in docs {
        out.push_str("---\n");
        out.push_str(&kleym_api::yaml::to_string(&d).unwrap_or_default());
    }
    out
}

/// Stand-ins the chart template replaces with Helm expressions ([`helm_template`]): none
/// occurs in the policy's own text, and each survives YAML serialization unchanged.
const HELM_STAND_INS: [(&str, &str); 4] = [
    ("helmxnamespacex", "{{ .Release.Namespace }}"),
    ("helmxnamex", "{{ include \"kleym.spokeName\" . }}"),
    ("helmxtrustxdomainx", "{{ .Values.trustDomain }}"),
    (
        "helmxusernamex",
        "system:serviceaccount:{{ .Release.Namespace }}:{{ include \"kleym.serviceAccountName\" . }}",
    ),
];

/// `charts/kleym/templates/spoke-admission-policy.yaml`: in single-cluster mode, unless
/// `spoke.admissionPolicy.enabled` is false, this module's policy and binding for the
/// chart's spoke ServiceAccount, named as the spoke's objects, in `trustDomain`, with the
/// ConfigMap of its parameters from `spoke.svid` (the values the spoke's flags get). A test
/// keeps the file equal; `e2e/tests/deploy_helm.rs` checks what helm renders against
/// [`admission_policy_with`].
pub fn helm_template() -> String {
    let [ns, name, td, user] = HELM_STAND_INS.map(|(k, _)| k);
    let docs = policy_and_binding(
        &PolicyOptions {
            name: name.into(),
            usernames: vec![user.into()],
            trust_domain: td.into(),
            cluster_domain: String::new(),
        },
        &ParamsRef {
            namespace: ns.into(),
            name: name.into(),
        },
    );
    let mut out = String::from(
        "{{- /* Generated by kleym (spoke/src/admission_policy.rs, helm_template); a test keeps it equal. */}}\n\
         {{- if and (eq .Values.mode \"single-cluster\") .Values.spoke.admissionPolicy.enabled }}\n\
         # Bounds what the spoke's ServiceAccount may do to ClusterSPIFFEIDs (docs/spoke.md,\n\
         # \"Admission policy\"); its parameters are spoke.svid, the values of the spoke's flags.\n",
    );
    for d in &docs {
        let spec = kleym_api::yaml::to_string(&json!({"spec": d["spec"]})).unwrap_or_default();
        out.push_str(&format!(
            "---\napiVersion: {}\nkind: {}\nmetadata:\n  name: {name}\n  labels:\n    {{{{- include \"kleym.labels\" . | nindent 4 }}}}\n{spec}",
            d["apiVersion"].as_str().unwrap_or_default(),
            d["kind"].as_str().unwrap_or_default(),
        ));
    }
    out.push_str(
        "---\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata:\n  name: helmxnamex\n  namespace: helmxnamespacex\n  labels:\n    {{- include \"kleym.labels\" . | nindent 4 }}\n\
         data:\n\
         \x20 clusterDomain: {{ .Values.spoke.svid.clusterDomain | quote }}\n\
         \x20 dnsSuffixes: {{ join \",\" .Values.spoke.svid.dnsSuffixes | quote }}\n\
         \x20 namespaceDNSSuffixes: {{ join \",\" .Values.spoke.svid.namespaceDNSSuffixes | quote }}\n\
         \x20 maxTtl: {{ .Values.spoke.svid.maxTtl | quote }}\n\
         \x20 maxJwtTtl: {{ .Values.spoke.svid.maxJwtTtl | quote }}\n\
         \x20 federatesWith: {{ join \",\" .Values.spoke.svid.federatesWith | quote }}\n\
         \x20 reservedDNSNames: \"\"\n\
         {{- end }}\n",
    );
    for (stand_in, helm) in HELM_STAND_INS {
        out = out.replace(stand_in, helm);
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

    /// `charts/kleym/templates/spoke-admission-policy.yaml` is [`helm_template`]'s output
    /// (`KLEYM_BLESS=1` rewrites it).
    #[test]
    fn chart_template_is_generated_from_this_module() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/kleym/templates/spoke-admission-policy.yaml");
        let want = helm_template();
        if std::env::var_os("KLEYM_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} differs from admission_policy::helm_template(); run this test with KLEYM_BLESS=1",
            path.display()
        );
    }

    /// The stand-ins occur nowhere in the policy's own text (they would be replaced there
    /// too), and the policy has no `{{`/`}}` of its own for Helm to read.
    #[test]
    fn the_chart_stand_ins_are_unique() {
        let docs = policy_and_binding(
            &PolicyOptions {
                name: "n".into(),
                usernames: vec!["u".into()],
                trust_domain: "t".into(),
                cluster_domain: String::new(),
            },
            &ParamsRef {
                namespace: "s".into(),
                name: "n".into(),
            },
        );
        fn strings(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::String(s) => out.push(s.clone()),
                Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
                Value::Object(m) => m.iter().for_each(|(k, x)| {
                    out.push(k.clone());
                    strings(x, out)
                }),
                _ => {}
            }
        }
        let mut all = Vec::new();
        docs.iter().for_each(|d| strings(d, &mut all));
        assert!(
            all.iter().any(|s| s.contains("matches(")),
            "the texts were read"
        );
        for s in &all {
            assert!(!s.contains("{{") && !s.contains("}}"), "{s}");
            for (stand_in, _) in HELM_STAND_INS {
                assert!(!s.contains(stand_in), "{stand_in} in {s}");
            }
        }
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(cel_string("a'b\\c"), "'a\\'b\\\\c'");
    }
}
