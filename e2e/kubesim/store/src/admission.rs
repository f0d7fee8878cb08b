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
//! `request`, `params`, `namespaceObject`, `variables`, and only variables declared
//! before them), but field accesses are not type-checked against the object's schema.

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

/// Compiles `text` and checks the names it references; the error is the cause's detail.
fn check_expression(text: &str, declared_variables: &[String]) -> Result<CelExpression, String> {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    let e = CelExpression::compile(text).map_err(|e| format!("Invalid value: {quoted}: {e}"))?;
    for v in e.variables() {
        if !DECLARED.contains(&v.as_str()) {
            return Err(format!(
                "Invalid value: {quoted}: compilation failed: ERROR: <input>: undeclared reference to '{v}'"
            ));
        }
    }
    // `variables.<name>` must name a variable declared earlier in `spec.variables`.
    let mut rest = text;
    while let Some(i) = rest.find("variables.") {
        let before_ok = i == 0
            || !rest[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
        rest = &rest[i + "variables.".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if before_ok && !name.is_empty() && !declared_variables.contains(&name) {
            return Err(format!(
                "Invalid value: {quoted}: compilation failed: ERROR: <input>: undefined field '{name}'"
            ));
        }
    }
    Ok(e)
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
    let mut names = Vec::new();
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
            &[],
            true,
        );
    }
    for (i, v) in array(&spec, "variables").iter().enumerate() {
        let name = str_at(v, "/name").unwrap_or_default();
        if name.is_empty() {
            causes.push(required(format!("spec.variables[{i}].name")));
        }
        check_field(
            &mut causes,
            v,
            "expression",
            &format!("spec.variables[{i}].expression"),
            &names,
            true,
        );
        names.push(name.to_string());
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
            &names,
            true,
        );
        check_field(
            &mut causes,
            v,
            "messageExpression",
            &format!("{at}.messageExpression"),
            &names,
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
    names: &[String],
    is_required: bool,
) {
    match str_at(v, &format!("/{key}")) {
        None if !is_required => {}
        None => causes.push(required(field.to_string())),
        Some(text) => {
            if let Err(detail) = check_expression(text, names) {
                causes.push(cause(field.to_string(), detail));
            }
        }
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
