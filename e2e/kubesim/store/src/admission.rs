//! `ValidatingAdmissionPolicy` (`admissionregistration.k8s.io/v1`): checking policies and
//! bindings when they are written, and enforcing them on create, update and delete of the
//! resources they match, as kube-apiserver's validating admission policy plugin does.
//!
//! Supported: `matchConstraints.resourceRules` / `excludeResourceRules` (apiGroups,
//! apiVersions, operations, resources with `*` and `plural/sub` forms, scope),
//! `matchConditions`, `variables`, `validations` (`expression`, `message`,
//! `messageExpression`, `reason`), `failurePolicy`, `paramKind` with a binding's
//! `paramRef.name`/`namespace`/`parameterNotFoundAction`, and `validationActions: [Deny]`.
//! Refused when written, with a message saying kubesim does not support it: `Warn` and
//! `Audit` actions, `auditAnnotations`, non-empty `namespaceSelector`/`objectSelector`,
//! a binding's `matchResources`, `paramRef.selector`. Expressions are compiled when the
//! policy is written; names they reference must be declared (`object`, `oldObject`,
//! `request`, `params` with a `paramKind`, `namespaceObject`, `variables`, and only
//! variables declared before them) and fields of `request` and `namespaceObject` exist.
//! Fields of `object` are checked against the matched CRDs' schemas after the write, into
//! `status.typeChecking`, as kube-controller-manager's policy status controller does.

use std::collections::BTreeMap;
use std::sync::Arc;

use kubesim_schema::cel_types::{CelType, admission_request_type, display_issues, namespace_type};
use kubesim_schema::expr::CelExpression;
use serde_json::{Map, Value, json};

use crate::ApiError;
use crate::meta::Cause;
use crate::registry::{ADMISSION_GROUP, ResourceInfo};
use crate::state::Inner;

/// Type key of `ValidatingAdmissionPolicy`.
pub(crate) const POLICIES: &str = "validatingadmissionpolicies.admissionregistration.k8s.io";
/// Type key of `ValidatingAdmissionPolicyBinding`.
pub(crate) const BINDINGS: &str = "validatingadmissionpolicybindings.admissionregistration.k8s.io";

/// Who makes a request, as admission sees it (`request.userInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestUser {
    /// `userInfo.username`.
    pub username: String,
    /// `userInfo.uid`.
    pub uid: String,
    /// `userInfo.groups`.
    pub groups: Vec<String>,
}

/// One write as admission sees it.
pub(crate) struct AdmissionRequest<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    pub res: &'a ResourceInfo,
    /// `status` for `/status` writes.
    pub subresource: Option<&'a str>,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The new object (`None` on delete).
    pub object: Option<&'a Value>,
    /// The stored object (`None` on create).
    pub old_object: Option<&'a Value>,
    pub user: Option<&'a RequestUser>,
    pub dry_run: bool,
}

/// Root names an expression may use (kube-apiserver's CEL environment for policies, less
/// `authorizer`, which kubesim does not provide).
const DECLARED: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
];

fn cause(field: String, detail: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        field,
        detail,
    }
}

fn unsupported(field: String, what: &str) -> Cause {
    Cause {
        reason: "FieldValueNotSupported".into(),
        field,
        detail: format!("Unsupported value: kubesim does not support {what}"),
    }
}

fn required(field: String) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        field,
        detail: "Required value".into(),
    }
}

/// The variables an expression is checked with when the policy is written: `object`,
/// `oldObject` and `params` are untyped (kube-apiserver declares them `dyn`), `request` and
/// `namespaceObject` have their fixed types, `variables` the variables declared before.
struct Declared {
    has_params: bool,
    request: CelType,
    namespace: CelType,
    variables: BTreeMap<String, CelType>,
}

impl Declared {
    fn new(has_params: bool) -> Self {
        Declared {
            has_params,
            request: admission_request_type(),
            namespace: namespace_type(),
            variables: BTreeMap::new(),
        }
    }
}

/// Compiles `text` and type-checks it as kube-apiserver does when the policy is written
/// (undeclared names, fields `request`, `namespaceObject` and `variables` do not have);
/// the error is the cause's detail. Returns the expression's type.
fn check_expression(text: &str, declared: &Declared) -> Result<CelType, String> {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    let e = CelExpression::compile(text).map_err(|e| format!("Invalid value: {quoted}: {e}"))?;
    let undeclared: Vec<String> = e
        .variables()
        .into_iter()
        .filter(|v| !DECLARED.contains(&v.as_str()) || (v == "params" && !declared.has_params))
        .collect();
    let variables = CelType::Object(Arc::new(declared.variables.clone()));
    let mut roots = vec![
        ("object", &CelType::Dyn),
        ("oldObject", &CelType::Dyn),
        ("request", &declared.request),
        ("namespaceObject", &declared.namespace),
        ("variables", &variables),
    ];
    if declared.has_params {
        roots.push(("params", &CelType::Dyn));
    }
    let (t, issues) = e.check_types(&roots, &undeclared);
    if issues.is_empty() {
        Ok(t)
    } else {
        Err(format!(
            "Invalid value: {quoted}: compilation failed: {}",
            display_issues(text, &issues)
        ))
    }
}

fn str_at<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str)
}

fn non_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => m.values().any(|x| non_empty(Some(x))),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// Why kube-apiserver (or kubesim) refuses this `ValidatingAdmissionPolicy`.
pub(crate) fn policy_causes(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    match str_at(&spec, "/failurePolicy") {
        None | Some("Fail") | Some("Ignore") => {}
        Some(other) => causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            field: "spec.failurePolicy".into(),
            detail: format!(
                "Unsupported value: \"{other}\": supported values: \"Fail\", \"Ignore\""
            ),
        }),
    }
    let mc = spec.get("matchConstraints");
    let rules = mc
        .and_then(|m| m.get("resourceRules"))
        .and_then(Value::as_array);
    match rules {
        None => causes.push(required("spec.matchConstraints.resourceRules".into())),
        Some(rules) if rules.is_empty() => {
            causes.push(required("spec.matchConstraints.resourceRules".into()))
        }
        Some(rules) => {
            for (i, r) in rules.iter().enumerate() {
                for (j, op) in r
                    .get("operations")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let op = op.as_str().unwrap_or_default();
                    if !["*", "CREATE", "UPDATE", "DELETE", "CONNECT"].contains(&op) {
                        causes.push(Cause {
                            reason: "FieldValueNotSupported".into(),
                            field: format!(
                                "spec.matchConstraints.resourceRules[{i}].operations[{j}]"
                            ),
                            detail: format!(
                                "Unsupported value: \"{op}\": supported values: \"*\", \"CONNECT\", \"CREATE\", \"DELETE\", \"UPDATE\""
                            ),
                        });
                    }
                }
            }
        }
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if non_empty(mc.and_then(|m| m.get(sel))) {
            causes.push(unsupported(
                format!("spec.matchConstraints.{sel}"),
                "label selectors in admission policies",
            ));
        }
    }
    if non_empty(spec.get("auditAnnotations")) {
        causes.push(unsupported(
            "spec.auditAnnotations".into(),
            "audit annotations",
        ));
    }
    if let Some(pk) = spec.get("paramKind").filter(|p| !p.is_null()) {
        for f in ["apiVersion", "kind"] {
            if str_at(pk, &format!("/{f}")).is_none_or(str::is_empty) {
                causes.push(required(format!("spec.paramKind.{f}")));
            }
        }
    }
    let has_params = spec.get("paramKind").is_some_and(|p| !p.is_null());
    let mut declared = Declared::new(has_params);
    for (i, c) in array(&spec, "matchConditions").iter().enumerate() {
        let name = str_at(c, "/name").unwrap_or_default();
        if name.is_empty() {
            causes.push(required(format!("spec.matchConditions[{i}].name")));
        }
        check_field(
            &mut causes,
            c,
            "expression",
            &format!("spec.matchConditions[{i}].expression"),
            &declared,
            true,
        );
    }
    for (i, v) in array(&spec, "variables").iter().enumerate() {
        let name = str_at(v, "/name").unwrap_or_default();
        if name.is_empty() {
            causes.push(required(format!("spec.variables[{i}].name")));
        }
        let t = check_field(
            &mut causes,
            v,
            "expression",
            &format!("spec.variables[{i}].expression"),
            &declared,
            true,
        );
        // A variable that does not compile is still declared (as `dyn`).
        declared
            .variables
            .insert(name.to_string(), t.unwrap_or(CelType::Dyn));
    }
    let validations = array(&spec, "validations");
    if validations.is_empty() {
        causes.push(required("spec.validations".into()));
    }
    for (i, v) in validations.iter().enumerate() {
        let at = format!("spec.validations[{i}]");
        check_field(
            &mut causes,
            v,
            "expression",
            &format!("{at}.expression"),
            &declared,
            true,
        );
        check_field(
            &mut causes,
            v,
            "messageExpression",
            &format!("{at}.messageExpression"),
            &declared,
            false,
        );
        if str_at(v, "/message").is_some_and(|m| m.contains('\n')) {
            causes.push(cause(
                format!("{at}.message"),
                "Invalid value: message must not contain line breaks".into(),
            ));
        }
        if let Some(r) = str_at(v, "/reason")
            && ![
                "Unauthorized",
                "Forbidden",
                "Invalid",
                "RequestEntityTooLarge",
            ]
            .contains(&r)
        {
            causes.push(Cause {
                reason: "FieldValueNotSupported".into(),
                field: format!("{at}.reason"),
                detail: format!(
                    "Unsupported value: \"{r}\": supported values: \"Unauthorized\", \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\""
                ),
            });
        }
    }
    causes
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn check_field(
    causes: &mut Vec<Cause>,
    v: &Value,
    key: &str,
    field: &str,
    declared: &Declared,
    is_required: bool,
) -> Option<CelType> {
    match str_at(v, &format!("/{key}")) {
        None if !is_required => None,
        None => {
            causes.push(required(field.to_string()));
            None
        }
        Some(text) => match check_expression(text, declared) {
            Ok(t) => Some(t),
            Err(detail) => {
                causes.push(cause(field.to_string(), detail));
                None
            }
        },
    }
}

/// Why kube-apiserver (or kubesim) refuses this `ValidatingAdmissionPolicyBinding`.
pub(crate) fn binding_causes(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    if str_at(&spec, "/policyName").is_none_or(str::is_empty) {
        causes.push(required("spec.policyName".into()));
    }
    let actions = array(&spec, "validationActions");
    if actions.is_empty() {
        causes.push(required("spec.validationActions".into()));
    }
    for (i, a) in actions.iter().enumerate() {
        let field = format!("spec.validationActions[{i}]");
        match a.as_str().unwrap_or_default() {
            "Deny" => {}
            "Warn" | "Audit" => causes.push(unsupported(
                field,
                "the Warn and Audit validation actions (only Deny)",
            )),
            other => causes.push(Cause {
                reason: "FieldValueNotSupported".into(),
                field,
                detail: format!(
                    "Unsupported value: \"{other}\": supported values: \"Audit\", \"Deny\", \"Warn\""
                ),
            }),
        }
    }
    if non_empty(spec.get("matchResources")) {
        causes.push(unsupported(
            "spec.matchResources".into(),
            "matchResources in bindings",
        ));
    }
    if let Some(pr) = spec.get("paramRef").filter(|p| !p.is_null()) {
        if non_empty(pr.get("selector")) {
            causes.push(unsupported(
                "spec.paramRef.selector".into(),
                "parameter selectors (name one parameter object)",
            ));
        } else if str_at(pr, "/name").is_none_or(str::is_empty) {
            causes.push(required("spec.paramRef.name".into()));
        }
        match str_at(pr, "/parameterNotFoundAction") {
            Some("Allow") | Some("Deny") => {}
            None => causes.push(required("spec.paramRef.parameterNotFoundAction".into())),
            Some(other) => causes.push(Cause {
                reason: "FieldValueNotSupported".into(),
                field: "spec.paramRef.parameterNotFoundAction".into(),
                detail: format!(
                    "Unsupported value: \"{other}\": supported values: \"Allow\", \"Deny\""
                ),
            }),
        }
    }
    causes
}

fn list_matches(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|x| x == "*" || x == want))
}

/// Whether one `NamedRuleWithOperations` matches the request.
fn rule_matches(rule: &Value, req: &AdmissionRequest<'_>) -> bool {
    let resource_ok = rule
        .get("resources")
        .and_then(Value::as_array)
        .is_some_and(|rs| {
            rs.iter().filter_map(Value::as_str).any(|r| {
                let (rp, rs) = r.split_once('/').unwrap_or((r, ""));
                let plural_ok = rp == "*" || rp == req.res.plural;
                match req.subresource {
                    None => plural_ok && rs.is_empty(),
                    Some(sub) => plural_ok && (rs == "*" || rs == sub),
                }
            })
        });
    let scope_ok = match str_at(rule, "/scope").unwrap_or("*") {
        "Cluster" => !req.res.namespaced,
        "Namespaced" => req.res.namespaced,
        _ => true,
    };
    resource_ok
        && scope_ok
        && list_matches(rule.get("apiGroups"), &req.res.group)
        && list_matches(rule.get("apiVersions"), &req.res.version)
        && list_matches(rule.get("operations"), req.operation)
}

fn policy_matches(policy: &Value, req: &AdmissionRequest<'_>) -> bool {
    let mc = policy.pointer("/spec/matchConstraints");
    let any = |key: &str| {
        mc.and_then(|m| m.get(key))
            .and_then(Value::as_array)
            .is_some_and(|rs| rs.iter().any(|r| rule_matches(r, req)))
    };
    any("resourceRules") && !any("excludeResourceRules")
}

/// kube-apiserver's `reasonToCode`.
fn reason_code(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// The denial as kube-apiserver's `admission.NewForbidden` wraps it, with the validation's
/// reason and its status code.
fn denied(
    req: &AdmissionRequest<'_>,
    policy: &str,
    binding: &str,
    message: &str,
    reason: &str,
) -> ApiError {
    let msg = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    );
    let resource = req.res.resource_group();
    let full = if req.name.is_empty() {
        format!("{resource} is forbidden: {msg}")
    } else {
        format!("{resource} \"{}\" is forbidden: {msg}", req.name)
    };
    let mut e = ApiError::new(reason_code(reason), reason, full);
    e.details = Some(json!({
        "name": req.name,
        "group": req.res.group,
        "kind": req.res.plural,
        "causes": [{"message": msg}],
    }));
    e
}

impl Inner {
    /// Runs every binding (in name order) whose policy matches `req`; the first denial is
    /// returned, as kube-apiserver reports its first denied decision.
    pub(crate) fn validating_admission(&self, req: &AdmissionRequest<'_>) -> Result<(), ApiError> {
        // Policies never apply to the admission configuration itself (no lock-out).
        if req.res.group == ADMISSION_GROUP {
            return Ok(());
        }
        let Some(bindings) = self.types.get(BINDINGS) else {
            return Ok(());
        };
        if bindings.objects.is_empty() {
            return Ok(());
        }
        let bindings: Vec<Value> = bindings.range(None).map(|(_, s)| s.value()).collect();
        for binding in &bindings {
            let binding_name = str_at(binding, "/metadata/name").unwrap_or_default();
            let Some(policy_name) = str_at(binding, "/spec/policyName") else {
                continue;
            };
            let Some(policy) = self.get(POLICIES, "", policy_name) else {
                continue; // a binding to a missing policy does nothing, as upstream
            };
            if !policy_matches(&policy, req) {
                continue;
            }
            self.evaluate_policy(&policy, binding, policy_name, binding_name, req)?;
        }
        Ok(())
    }

    fn evaluate_policy(
        &self,
        policy: &Value,
        binding: &Value,
        policy_name: &str,
        binding_name: &str,
        req: &AdmissionRequest<'_>,
    ) -> Result<(), ApiError> {
        let fail_closed = str_at(policy, "/spec/failurePolicy") != Some("Ignore");
        let deny =
            |message: &str, reason: &str| denied(req, policy_name, binding_name, message, reason);
        // A configuration or evaluation error denies under `Fail` and admits under `Ignore`.
        let error = |message: String| -> Result<(), ApiError> {
            if fail_closed {
                Err(deny(&message, "Invalid"))
            } else {
                Ok(())
            }
        };
        let params = match policy.pointer("/spec/paramKind").filter(|p| !p.is_null()) {
            None => Value::Null,
            Some(kind) => match self.params_for(kind, binding, req) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(ParamError::NotFound) => {
                    return Err(deny(
                        "no params found for policy binding with `Deny` parameterNotFoundAction",
                        "Invalid",
                    ));
                }
                Err(ParamError::Config(m)) => return error(m),
            },
        };
        let namespace_object = if req.res.namespaced && !req.namespace.is_empty() {
            self.get(crate::kinds::NAMESPACES, "", req.namespace)
                .map(|n| (*n).clone())
                .unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        let user = req.user.cloned().unwrap_or_default();
        let request = json!({
            "operation": req.operation,
            "name": req.name,
            "namespace": req.namespace,
            "dryRun": req.dry_run,
            "subResource": req.subresource.unwrap_or_default(),
            "kind": {"group": req.res.group, "version": req.res.version, "kind": req.res.kind},
            "resource": {"group": req.res.group, "version": req.res.version, "resource": req.res.plural},
            "userInfo": {"username": user.username, "uid": user.uid, "groups": user.groups},
        });
        let object = req.object.cloned().unwrap_or(Value::Null);
        let old_object = req.old_object.cloned().unwrap_or(Value::Null);
        let spec = policy.get("spec").cloned().unwrap_or(Value::Null);
        let mut variables = Map::new();
        let eval = |text: &str, variables: &Map<String, Value>| -> Result<Value, String> {
            let e = CelExpression::compile(text)?;
            let vars = Value::Object(variables.clone());
            e.evaluate(&[
                ("object", &object),
                ("oldObject", &old_object),
                ("request", &request),
                ("params", &params),
                ("namespaceObject", &namespace_object),
                ("variables", &vars),
            ])
        };
        for c in array(&spec, "matchConditions") {
            let name = str_at(c, "/name").unwrap_or_default();
            let text = str_at(c, "/expression").unwrap_or_default();
            match eval(text, &variables) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Ok(()),
                Ok(other) => {
                    return error(format!(
                        "failed to evaluate match condition '{name}': expression did not return a bool ({other})"
                    ));
                }
                Err(e) => {
                    return error(format!("failed to evaluate match condition '{name}': {e}"));
                }
            }
        }
        // Variables are evaluated in order; one that fails is left undefined, so only the
        // expressions that use it fail (kube-apiserver evaluates them lazily).
        for v in array(&spec, "variables") {
            let name = str_at(v, "/name").unwrap_or_default();
            let text = str_at(v, "/expression").unwrap_or_default();
            if let Ok(value) = eval(text, &variables) {
                variables.insert(name.to_string(), value);
            }
        }
        for v in array(&spec, "validations") {
            let text = str_at(v, "/expression").unwrap_or_default();
            match eval(text, &variables) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let from_expression = str_at(v, "/messageExpression")
                        .and_then(|m| eval(m, &variables).ok())
                        .and_then(|m| m.as_str().map(|s| s.trim().to_string()))
                        .filter(|m| !m.is_empty() && !m.contains('\n'));
                    let message = from_expression
                        .or_else(|| {
                            str_at(v, "/message")
                                .filter(|m| !m.trim().is_empty())
                                .map(|m| m.trim().to_string())
                        })
                        .unwrap_or_else(|| format!("failed expression: {}", text.trim()));
                    let reason = str_at(v, "/reason").unwrap_or("Invalid");
                    return Err(deny(&message, reason));
                }
                Ok(other) => {
                    return error(format!(
                        "expression '{}' resulted in error: expected a bool, got {other}",
                        text.trim()
                    ));
                }
                Err(e) => {
                    return error(format!(
                        "expression '{}' resulted in error: {e}",
                        text.trim()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The parameter object a binding names, `Ok(None)` when it is missing and the binding
    /// says `parameterNotFoundAction: Allow`.
    fn params_for(
        &self,
        kind: &Value,
        binding: &Value,
        req: &AdmissionRequest<'_>,
    ) -> Result<Option<Value>, ParamError> {
        let api_version = str_at(kind, "/apiVersion").unwrap_or_default();
        let kind_name = str_at(kind, "/kind").unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let Some(res) = self
            .resources
            .values()
            .find(|r| r.group == group && r.version == version && r.kind == kind_name)
        else {
            return Err(ParamError::Config(format!(
                "failed to configure binding: paramKind {api_version}, Kind={kind_name} is not served"
            )));
        };
        let Some(pr) = binding.pointer("/spec/paramRef").filter(|p| !p.is_null()) else {
            return Err(ParamError::Config(
                "failed to configure binding: no paramRef provided for a policy with paramKind"
                    .into(),
            ));
        };
        let name = str_at(pr, "/name").unwrap_or_default();
        let ns = if res.namespaced {
            str_at(pr, "/namespace")
                .filter(|n| !n.is_empty())
                .unwrap_or(req.namespace)
        } else {
            ""
        };
        let key = if res.group.is_empty() {
            res.plural.clone()
        } else {
            format!("{}.{}", res.plural, res.group)
        };
        match self.get(&key, ns, name) {
            Some(p) => Ok(Some((*p).clone())),
            None if str_at(pr, "/parameterNotFoundAction") == Some("Allow") => Ok(None),
            None => Err(ParamError::NotFound),
        }
    }
}

enum ParamError {
    NotFound,
    Config(String),
}

/// At most this many kinds are type-checked per policy, as kube-apiserver's type checker.
const MAX_TYPES_TO_CHECK: usize = 10;

/// `schema.GroupVersionKind.String()`: `group/version, Kind=Kind`.
fn gvk_string(group: &str, version: &str, kind: &str) -> String {
    format!("{group}/{version}, Kind={kind}")
}

/// A rule's `apiGroups`/`apiVersions` without wildcards, or nothing (the type checker
/// gives up on a rule with a wildcard group or version).
fn exact(rule: &Value, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    for x in array(rule, key) {
        let x = x.as_str().unwrap_or_default();
        if x.contains('*') {
            return Vec::new();
        }
        out.push(x.to_string());
    }
    out.sort();
    out
}

impl Inner {
    /// The kinds kube-apiserver's type checker checks a policy against (`typesToCheck`):
    /// every exact group × version × resource of `matchConstraints.resourceRules` that is
    /// served (wildcards and subresources skipped), at most ten, sorted by group, version
    /// and kind. Each comes with the schema kubesim has for it (custom resources only).
    fn types_to_check(&self, policy: &Value) -> Vec<(String, Option<CelType>)> {
        let mut gvks: BTreeMap<(String, String, String), Option<CelType>> = BTreeMap::new();
        let mut count = 0;
        let rules = policy
            .pointer("/spec/matchConstraints")
            .map(|m| array(m, "resourceRules"))
            .unwrap_or_default();
        'rules: for rule in rules {
            let groups = exact(rule, "apiGroups");
            let versions = exact(rule, "apiVersions");
            let mut resources: Vec<String> = array(rule, "resources")
                .iter()
                .filter_map(Value::as_str)
                .filter(|r| !r.contains('*') && !r.contains('/'))
                .map(str::to_string)
                .collect();
            resources.sort();
            for g in &groups {
                for v in &versions {
                    for r in &resources {
                        let key = (g.clone(), v.clone(), r.clone());
                        let Some(res) = self.resources.get(&key) else {
                            continue;
                        };
                        let schema = if res.custom {
                            self.crds
                                .get(&format!("{}.{}", res.plural, res.group))
                                .and_then(|d| d.versions.get(&res.version))
                                .and_then(|cv| CelType::custom_resource(&cv.raw_schema))
                        } else {
                            None // kubesim has no schemas for built-in kinds
                        };
                        gvks.insert((g.clone(), v.clone(), res.kind.clone()), schema);
                        count += 1;
                        if count == MAX_TYPES_TO_CHECK {
                            break 'rules;
                        }
                    }
                }
            }
        }
        gvks.into_iter()
            .map(|((g, v, k), t)| (gvk_string(&g, &v, &k), t))
            .collect()
    }

    /// The type of `params`: the schema of `paramKind` when kubesim has one.
    fn params_type(&self, policy: &Value) -> CelType {
        let Some(pk) = policy.pointer("/spec/paramKind").filter(|p| !p.is_null()) else {
            return CelType::Dyn;
        };
        let api_version = str_at(pk, "/apiVersion").unwrap_or_default();
        let kind = str_at(pk, "/kind").unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        self.resources
            .values()
            .find(|r| r.custom && r.group == group && r.version == version && r.kind == kind)
            .and_then(|r| self.crds.get(&format!("{}.{}", r.plural, r.group)))
            .and_then(|d| d.versions.get(version))
            .and_then(|cv| CelType::custom_resource(&cv.raw_schema))
            .unwrap_or(CelType::Dyn)
    }

    /// `status.typeChecking.expressionWarnings` as kube-controller-manager's policy status
    /// controller computes them: each validation's `expression` and `messageExpression`
    /// type-checked with `object`/`oldObject` of every kind the policy matches that has a
    /// schema; the warning lists, per kind, cel-go's issues.
    pub(crate) fn policy_type_warnings(&self, policy: &Value) -> Vec<Value> {
        let kinds: Vec<(String, CelType)> = self
            .types_to_check(policy)
            .into_iter()
            .filter_map(|(gvk, t)| t.map(|t| (gvk, t)))
            .collect();
        if kinds.is_empty() {
            return Vec::new();
        }
        let spec = policy.get("spec").cloned().unwrap_or(Value::Null);
        let params = self.params_type(policy);
        let request = admission_request_type();
        let namespace = namespace_type();
        // Per kind, the variables' types (a variable's type depends on `object`'s).
        let variables: Vec<CelType> = kinds
            .iter()
            .map(|(_, object)| {
                let mut vars = BTreeMap::new();
                for v in array(&spec, "variables") {
                    let name = str_at(v, "/name").unwrap_or_default();
                    let t = CelExpression::compile(str_at(v, "/expression").unwrap_or_default())
                        .map(|e| {
                            let so_far = CelType::Object(Arc::new(vars.clone()));
                            e.check_types(
                                &[
                                    ("object", object),
                                    ("oldObject", object),
                                    ("params", &params),
                                    ("request", &request),
                                    ("namespaceObject", &namespace),
                                    ("variables", &so_far),
                                ],
                                &[],
                            )
                            .0
                        })
                        .unwrap_or(CelType::Dyn);
                    vars.insert(name.to_string(), t);
                }
                CelType::Object(Arc::new(vars))
            })
            .collect();
        let check = |text: &str| -> String {
            let Ok(e) = CelExpression::compile(text) else {
                return String::new();
            };
            let mut parts = Vec::new();
            for ((gvk, object), vars) in kinds.iter().zip(&variables) {
                let (_, issues) = e.check_types(
                    &[
                        ("object", object),
                        ("oldObject", object),
                        ("params", &params),
                        ("request", &request),
                        ("namespaceObject", &namespace),
                        ("variables", vars),
                    ],
                    &[],
                );
                if !issues.is_empty() {
                    parts.push(format!("{gvk}: {}\n", display_issues(text, &issues)));
                }
            }
            parts.join("\n")
        };
        let mut warnings = Vec::new();
        for (i, v) in array(&spec, "validations").iter().enumerate() {
            for key in ["expression", "messageExpression"] {
                let text = str_at(v, &format!("/{key}")).unwrap_or_default();
                if text.is_empty() {
                    continue;
                }
                let warning = check(text);
                if !warning.is_empty() {
                    warnings.push(json!({
                        "fieldRef": format!("spec.validations[{i}].{key}"),
                        "warning": warning,
                    }));
                }
            }
        }
        warnings
    }

    /// What kube-controller-manager's policy status controller does after a policy's
    /// generation changes: `status.observedGeneration` and `status.typeChecking`.
    pub(crate) fn sync_policy_status(&mut self, name: &str) {
        let Some(stored) = self.get(POLICIES, "", name) else {
            return;
        };
        let generation = stored
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let observed = stored
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if generation <= observed {
            return;
        }
        let warnings = self.policy_type_warnings(&stored);
        let mut next = (*stored).clone();
        if !next.get("status").is_some_and(Value::is_object) {
            next["status"] = json!({});
        }
        next["status"]["observedGeneration"] = Value::from(generation);
        next["status"]["typeChecking"] = if warnings.is_empty() {
            json!({})
        } else {
            json!({ "expressionWarnings": warnings })
        };
        self.put(POLICIES, "", name, next);
    }
}
