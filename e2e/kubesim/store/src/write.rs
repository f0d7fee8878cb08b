//! The write pipeline shared by create, update, patch and apply: type checks, scoping,
//! server-set metadata, schema handling for custom resources, managedFields, generation,
//! no-op detection, and the store.

use crate::convert::Conversion;
use crate::kinds::{self, CRDS, NAMESPACES};
use crate::meta::{self, Cause, ensure_metadata, meta_str};
use crate::state::{Inner, owner_uids};
use crate::{ApiError, FieldValidation, ResourceInfo, Subresource, WriteOptions, WriteResult};
use kubesim_apply::TypeInfo;
use kubesim_schema::{CompiledSchema, FieldErrorKind};
use serde_json::{Value, json};
use std::sync::Arc;

/// How often `generateName` is retried on a name clash.
const GENERATE_NAME_ATTEMPTS: usize = 8;

/// A resolved resource type for one request.
#[derive(Debug, Clone)]
pub(crate) struct TypeCtx {
    /// The served resource (requested version).
    pub res: ResourceInfo,
    /// Storage key of the type.
    pub key: String,
    /// Schema of the requested version (custom resources).
    pub schema: Option<Arc<CompiledSchema>>,
    /// Merge semantics for apply.
    pub type_info: Arc<TypeInfo>,
    /// Stored form ↔ served form.
    pub conversion: Conversion,
    /// Field selector fields besides `metadata.name`/`metadata.namespace`.
    pub selectable: Vec<String>,
}

impl TypeCtx {
    /// The stored object as served in the requested version.
    pub fn out(&self, stored: &Value) -> Value {
        self.served(stored.clone())
    }

    /// As [`TypeCtx::out`], without copying when nobody else holds `stored` (a freshly
    /// read object, or one no watcher received).
    pub fn out_owned(&self, stored: Arc<Value>) -> Value {
        self.served(Arc::unwrap_or_clone(stored))
    }

    /// The stored JSON of an object when its served form serialises to the same bytes
    /// (no conversion, or a custom resource served in its storage version).
    pub fn served_json(&self, stored: Arc<str>) -> Option<Arc<str>> {
        match &self.conversion {
            Conversion::Identity => Some(stored),
            Conversion::ApiVersion { served, storage } if served == storage => Some(stored),
            _ => None,
        }
    }

    /// A stored-form object the caller owns, turned into the served form.
    pub fn served(&self, mut v: Value) -> Value {
        self.conversion.to_served(&mut v);
        // A custom resource read through another version than its storage one: after the
        // `None` conversion kube-apiserver's schema-coercing converter prunes the object
        // with the served version's schema, and the read path applies that version's
        // defaults (a field only the storage version knows is not shown).
        if let (Conversion::ApiVersion { served, storage }, Some(schema)) =
            (&self.conversion, &self.schema)
            && served != storage
            && v.is_object()
        {
            schema.prune(&mut v);
            schema.apply_defaults(&mut v);
        }
        v
    }

    fn tracks_generation(&self) -> bool {
        kinds::tracks_generation(&self.key, self.res.custom)
    }
}

/// How managedFields are maintained for a write.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode<'a> {
    /// Non-apply write: `record_update` by this manager.
    Update(&'a str),
    /// Server-side apply: managedFields already computed by `server_side_apply`.
    Apply,
}

pub(crate) fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError::new(400, "BadRequest", msg)
}

fn conflict(res: &ResourceInfo, name: &str, why: &str) -> ApiError {
    meta::with_details(
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.resource_group()
            ),
        ),
        &res.group,
        &res.plural,
        name,
    )
}

/// 409 for a stale `metadata.resourceVersion`.
pub(crate) fn stale(res: &ResourceInfo, name: &str) -> ApiError {
    conflict(
        res,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// 409 for a failed delete/update precondition.
pub(crate) fn precondition_failed(res: &ResourceInfo, name: &str, why: &str) -> ApiError {
    conflict(res, name, &format!("Precondition failed: {why}"))
}

/// 404 for an object of `res`.
pub(crate) fn not_found(res: &ResourceInfo, name: &str) -> ApiError {
    meta::with_details(
        ApiError::not_found(&res.resource_group(), name),
        &res.group,
        &res.plural,
        name,
    )
}

fn field_reason(k: &FieldErrorKind) -> String {
    // `FieldValue<Kind>` is apimachinery's CauseType naming; the fallback keeps this
    // working when the schema crate adds kinds.
    match k {
        FieldErrorKind::InternalError => "InternalError".to_string(),
        other => format!("FieldValue{other:?}"),
    }
}

fn check_type_meta(obj: &Value, res: &ResourceInfo) -> Result<(), ApiError> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != res.api_version()
    {
        return Err(bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            res.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != res.kind
    {
        return Err(bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind
        )));
    }
    Ok(())
}

fn sanitize_body(obj: &mut Value, res: &ResourceInfo) -> Result<(), ApiError> {
    if !ensure_metadata(obj) {
        return Err(bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: the body must be a JSON object with an object metadata",
            res.kind, res.version, res.kind
        )));
    }
    check_type_meta(obj, res)?;
    obj["apiVersion"] = Value::from(res.api_version());
    obj["kind"] = Value::from(res.kind.clone());
    Ok(())
}

fn remove_meta(obj: &mut Value, fields: &[&str]) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in fields {
            m.remove(*f);
        }
    }
}

fn copy_meta(obj: &mut Value, from: &Value, fields: &[&str]) {
    for f in fields {
        match from.get("metadata").and_then(|m| m.get(*f)) {
            Some(v) => obj["metadata"][*f] = v.clone(),
            None => remove_meta(obj, &[f]),
        }
    }
}

/// Whether two JSON objects are equal apart from the keys `skip` names.
fn eq_except(
    a: &serde_json::Map<String, Value>,
    b: &serde_json::Map<String, Value>,
    skip: impl Fn(&str) -> bool,
) -> bool {
    let kept = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !skip(k)).count();
    kept(a) == kept(b)
        && a.iter()
            .filter(|(k, _)| !skip(k))
            .all(|(k, v)| b.get(k) == Some(v))
}

/// Whether `a` and `b` are the same write apart from what may differ in a no-op:
/// `metadata.resourceVersion` and the `time` of managedFields entries. Compares in place
/// rather than copying both objects (this runs on every update).
fn same_but_rv_and_times(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    if !eq_except(a, b, |k| k == "metadata") {
        return false;
    }
    let (Some(Value::Object(ma)), Some(Value::Object(mb))) = (a.get("metadata"), b.get("metadata"))
    else {
        return a.get("metadata") == b.get("metadata");
    };
    if !eq_except(ma, mb, |k| k == "resourceVersion" || k == "managedFields") {
        return false;
    }
    match (ma.get("managedFields"), mb.get("managedFields")) {
        (Some(Value::Array(ea)), Some(Value::Array(eb))) => {
            ea.len() == eb.len()
                && ea.iter().zip(eb).all(|(x, y)| match (x, y) {
                    (Value::Object(x), Value::Object(y)) => eq_except(x, y, |k| k == "time"),
                    _ => x == y,
                })
        }
        (fa, fb) => fa == fb,
    }
}

/// Whether `a` and `b` differ in what bumps generation: everything but `metadata` and
/// `apiVersion` (and `status` when it is a subresource).
fn generation_relevant_differs(a: &Value, b: &Value, has_status: bool) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => !eq_except(a, b, |k| {
            k == "metadata" || k == "apiVersion" || (has_status && k == "status")
        }),
        _ => a != b,
    }
}

/// kube-apiserver's `ValidateObjectMeta` name checks: `metadata.generateName` (as a prefix)
/// when given, then `metadata.name` (the generated one, when generated), one cause per
/// message, with the resource's [`kinds::name_rule`].
fn name_causes(res: &ResourceInfo, name: &str, generate_name: &str) -> Vec<Cause> {
    let rule = kinds::name_rule(res);
    let invalid = |field: &str, value: &str, msg: String| Cause {
        reason: "FieldValueInvalid".into(),
        field: field.into(),
        detail: format!("Invalid value: \"{value}\": {msg}"),
    };
    let mut causes = Vec::new();
    if !generate_name.is_empty() {
        causes.extend(
            rule.errors(generate_name, true)
                .into_iter()
                .map(|msg| invalid("metadata.generateName", generate_name, msg)),
        );
    }
    causes.extend(
        rule.errors(name, false)
            .into_iter()
            .map(|msg| invalid("metadata.name", name, msg)),
    );
    causes
}

impl Inner {
    /// Defaults → unknown fields per `fieldValidation` → prune → validate, for custom
    /// resources; built-in validation for the kinds kubesim checks.
    fn admit(
        &self,
        ctx: &TypeCtx,
        obj: &mut Value,
        old: Option<&Value>,
        fv: FieldValidation,
        warnings: &mut Vec<String>,
        mut causes: Vec<Cause>,
    ) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").unwrap_or_default().to_string();
        for detail in crate::selector::label_errors(obj) {
            causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                field: "metadata.labels".into(),
                detail,
            });
        }
        if let Some(schema) = &ctx.schema {
            schema.apply_defaults(obj);
            let unknown = schema.unknown_fields(obj);
            if !unknown.is_empty() {
                match fv {
                    FieldValidation::Strict => {
                        let list: Vec<String> = unknown
                            .iter()
                            .map(|u| format!("unknown field \"{u}\""))
                            .collect();
                        return Err(bad_request(format!(
                            "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
                            list.join(", "),
                            kind = ctx.res.kind,
                            v = ctx.res.version,
                        )));
                    }
                    FieldValidation::Warn => {
                        warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")));
                    }
                    FieldValidation::Ignore => {}
                }
            }
            schema.prune(obj);
            for e in schema.validate(obj, old) {
                let detail = e
                    .detail
                    .strip_prefix(&format!("{}: ", e.path))
                    .unwrap_or(&e.detail)
                    .to_string();
                causes.push(Cause {
                    reason: field_reason(&e.kind),
                    field: e.path.clone(),
                    detail,
                });
            }
        }
        if ctx.key == CRDS {
            match crate::crd::parse_crd(obj) {
                Ok(def) => {
                    if let Some(old) = old
                        && let Ok(old_def) = crate::crd::parse_crd(old)
                    {
                        for (field, a, b) in [
                            ("spec.group", &old_def.group, &def.group),
                            ("spec.names.plural", &old_def.plural, &def.plural),
                        ] {
                            if a != b {
                                causes.push(Cause {
                                    reason: "FieldValueInvalid".into(),
                                    field: field.into(),
                                    detail: format!("Invalid value: \"{b}\": field is immutable"),
                                });
                            }
                        }
                        // `ValidateCustomResourceDefinitionStoredVersions`: a version
                        // objects may still be stored in cannot leave spec.versions until
                        // it is removed from status.storedVersions.
                        let stored_versions = old
                            .get("status")
                            .and_then(|st| st.get("storedVersions"))
                            .and_then(Value::as_array);
                        for (i, v) in stored_versions.into_iter().flatten().enumerate() {
                            if let Some(v) = v.as_str()
                                && !def.versions.contains_key(v)
                            {
                                causes.push(Cause {
                                    reason: "FieldValueInvalid".into(),
                                    field: format!("status.storedVersions[{i}]"),
                                    detail: format!(
                                        "Invalid value: \"{v}\": must appear in spec.versions"
                                    ),
                                });
                            }
                        }
                        if old_def.namespaced != def.namespaced {
                            causes.push(Cause {
                                reason: "FieldValueInvalid".into(),
                                field: "spec.scope".into(),
                                detail: "Invalid value: \"\": field is immutable".into(),
                            });
                        }
                    }
                }
                Err(errs) => causes.extend(errs),
            }
        }
        if ctx.key == crate::admission::POLICIES {
            causes.extend(crate::admission::policy_causes(obj));
        }
        if ctx.key == crate::admission::BINDINGS {
            causes.extend(crate::admission::binding_causes(obj));
        }
        if let Some(old) = old
            && (ctx.key == "configmaps" || ctx.key == "secrets")
        {
            causes.extend(kinds::immutable_causes(obj, old));
        }
        if let (Some(old), Some(true)) = (
            old,
            old.map(|o| {
                o.get("metadata")
                    .and_then(|m| m.get("deletionTimestamp"))
                    .is_some()
            }),
        ) {
            let before = meta::finalizers(old);
            if meta::finalizers(obj).iter().any(|f| !before.contains(f)) {
                causes.push(Cause {
                    reason: "FieldValueForbidden".into(),
                    field: "metadata.finalizers".into(),
                    detail:
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                });
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(meta::invalid(&ctx.res.group, &ctx.res.kind, &name, &causes))
        }
    }

    fn check_namespace_open(
        &self,
        ns: &str,
        res: &ResourceInfo,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(nsobj) = self.get(NAMESPACES, "", ns) else {
            return Err(meta::with_details(
                ApiError::not_found("namespaces", ns),
                "",
                "namespaces",
                ns,
            ));
        };
        let terminating = nsobj
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some()
            || nsobj
                .get("status")
                .and_then(|s| s.get("phase"))
                .and_then(Value::as_str)
                == Some("Terminating");
        if terminating {
            let mut e = ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    res.resource_group()
                ),
            );
            e.details = Some(json!({
                "name": name, "group": res.group, "kind": res.plural,
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {ns} is being terminated"),
                    "field": "metadata.namespace",
                }],
            }));
            return Err(e);
        }
        Ok(())
    }

    /// Scope the object: the request's namespace for namespaced kinds (a different
    /// `metadata.namespace` is a 400), none for cluster-scoped ones. Returns the storage
    /// namespace (`""` when cluster-scoped).
    fn scope(&self, ctx: &TypeCtx, ns: Option<&str>, obj: &mut Value) -> Result<String, ApiError> {
        if ctx.res.namespaced {
            let Some(ns) = ns.filter(|n| !n.is_empty()) else {
                return Err(bad_request(
                    "the namespace of the object must be set in the request URL",
                ));
            };
            if let Some(body_ns) = meta_str(obj, "namespace")
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            obj["metadata"]["namespace"] = Value::from(ns);
            Ok(ns.to_string())
        } else {
            remove_meta(obj, &["namespace"]);
            Ok(String::new())
        }
    }

    /// Create `obj`. `url_name` is set when the create comes from an update or apply to a
    /// named URL.
    pub(crate) fn create_obj(
        &mut self,
        ctx: &TypeCtx,
        ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
        mode: Mode<'_>,
        url_name: Option<&str>,
    ) -> Result<WriteResult, ApiError> {
        sanitize_body(&mut obj, &ctx.res)?;
        let ns = self.scope(ctx, ns, &mut obj)?;
        if let Some(n) = url_name {
            match meta_str(&obj, "name") {
                Some(b) if !b.is_empty() && b != n => {
                    return Err(bad_request(format!(
                        "the name of the object ({b}) does not match the name on the URL ({n})"
                    )));
                }
                _ => obj["metadata"]["name"] = Value::from(n),
            }
        }
        if matches!(mode, Mode::Update(_))
            && url_name.is_none()
            && meta_str(&obj, "resourceVersion").is_some_and(|s| !s.is_empty())
        {
            return Err(bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        remove_meta(
            &mut obj,
            &[
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "generation",
                "selfLink",
            ],
        );
        let given_name = meta_str(&obj, "name").unwrap_or_default().to_string();
        let generate = meta_str(&obj, "generateName")
            .unwrap_or_default()
            .to_string();
        if given_name.is_empty() && generate.is_empty() {
            return Err(meta::invalid(
                &ctx.res.group,
                &ctx.res.kind,
                "",
                &[Cause {
                    reason: "FieldValueRequired".into(),
                    field: "metadata.name".into(),
                    detail: "Required value: name or generateName is required".into(),
                }],
            ));
        }
        let mut name = if given_name.is_empty() {
            meta::generate_name(&generate)
        } else {
            given_name.clone()
        };
        obj["metadata"]["name"] = Value::from(name.clone());
        if ctx.res.namespaced {
            self.check_namespace_open(&ns, &ctx.res, &name)?;
        }
        if ctx.key == "secrets" {
            kinds::normalize_secret(&mut obj, true)?;
        }
        kinds::prepare_create(
            &ctx.key,
            ctx.res.has_status,
            ctx.res.custom,
            &mut obj,
            &name,
        );
        let mut warnings = Vec::new();
        let causes = name_causes(&ctx.res, &name, &generate);
        self.admit(
            ctx,
            &mut obj,
            None,
            opts.field_validation,
            &mut warnings,
            causes,
        )?;
        self.validating_admission(&crate::admission::AdmissionRequest {
            operation: "CREATE",
            res: &ctx.res,
            subresource: None,
            namespace: &ns,
            name: &name,
            object: Some(&obj),
            old_object: None,
            user: opts.user.as_ref(),
            dry_run: opts.dry_run,
        })?;
        let now = meta::now_rfc3339();
        obj["metadata"]["uid"] = Value::from(meta::new_uid());
        obj["metadata"]["creationTimestamp"] = Value::from(now.clone());
        if ctx.tracks_generation() {
            obj["metadata"]["generation"] = Value::from(1);
        }
        if let Mode::Update(manager) = mode {
            kubesim_apply::record_update(None, &mut obj, &ctx.type_info, manager, None, &now);
        }
        // generateName: retry on a clash, as kube-apiserver's name generator does
        let mut attempts = 0;
        while self.get(&ctx.key, &ns, &name).is_some() {
            attempts += 1;
            if given_name.is_empty() && attempts < GENERATE_NAME_ATTEMPTS {
                name = meta::generate_name(&generate);
                obj["metadata"]["name"] = Value::from(name.clone());
                continue;
            }
            return Err(meta::with_details(
                ApiError::new(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", ctx.res.resource_group()),
                ),
                &ctx.res.group,
                &ctx.res.plural,
                &name,
            ));
        }
        if opts.dry_run {
            return Ok(WriteResult {
                object: obj,
                created: true,
                warnings,
                json: None,
            });
        }
        ctx.conversion.to_storage(&mut obj);
        let (stored, json) = self.put_over(&ctx.key, &ns, &name, obj, None);
        let owners = owner_uids(&stored);
        let object = ctx.out_owned(stored);
        self.after_write(&ctx.key, &ns, &name, true, &owners);
        Ok(WriteResult {
            object,
            created: true,
            warnings,
            json: ctx.served_json(json),
        })
    }

    /// Update an existing object with the full `candidate` (the request body, or the
    /// result of a patch/apply on the stored object). Creates when allowed and missing.
    /// `live` is the stored object as served when the caller has just read it under the
    /// same lock (saves reading it again); `None` reads it here.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update_obj(
        &mut self,
        ctx: &TypeCtx,
        ns: Option<&str>,
        name: &str,
        mut candidate: Value,
        sub: Subresource,
        opts: &WriteOptions,
        mode: Mode<'_>,
        live: Option<Value>,
    ) -> Result<WriteResult, ApiError> {
        sanitize_body(&mut candidate, &ctx.res)?;
        if let Some(b) = meta_str(&candidate, "name")
            && !b.is_empty()
            && b != name
        {
            return Err(bad_request(format!(
                "the name of the object ({b}) does not match the name on the URL ({name})"
            )));
        }
        let store_ns = if ctx.res.namespaced {
            ns.unwrap_or_default().to_string()
        } else {
            String::new()
        };
        let old = match live {
            Some(live) => Some(live),
            None => self
                .get(&ctx.key, &store_ns, name)
                .map(|o| ctx.out_owned(o)),
        };
        let Some(old) = old else {
            let creatable = sub == Subresource::Main
                && (matches!(mode, Mode::Apply)
                    || crate::registry::allows_create_on_update(&ctx.res.group, &ctx.res.plural));
            if creatable {
                return self.create_obj(ctx, ns, candidate, opts, mode, Some(name));
            }
            return Err(not_found(&ctx.res, name));
        };
        let ns_scoped = self.scope(ctx, ns, &mut candidate)?;
        if let Some(rv) = meta_str(&candidate, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(stale(&ctx.res, name));
        }
        if let Some(uid) = meta_str(&candidate, "uid")
            && !uid.is_empty()
            && Some(uid) != meta_str(&old, "uid")
        {
            return Err(precondition_failed(
                &ctx.res,
                name,
                &format!(
                    "UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            ));
        }
        let mut new = match sub {
            Subresource::Status => {
                let mut n = old.clone();
                match candidate.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                if matches!(mode, Mode::Apply) {
                    copy_meta(&mut n, &candidate, &["managedFields"]);
                }
                n
            }
            Subresource::Main => {
                let mut n = candidate;
                if ctx.res.has_status {
                    match old.get("status") {
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            if let Some(m) = n.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                if n.get("metadata")
                    .and_then(|m| m.get("managedFields"))
                    .is_none()
                {
                    copy_meta(&mut n, &old, &["managedFields"]);
                }
                copy_meta(
                    &mut n,
                    &old,
                    &[
                        "uid",
                        "creationTimestamp",
                        "deletionTimestamp",
                        "deletionGracePeriodSeconds",
                        "generation",
                    ],
                );
                if ctx.key == "secrets" {
                    kinds::normalize_secret(&mut n, false)?;
                }
                kinds::prepare_update(&ctx.key, &mut n, &old, name);
                n
            }
        };
        remove_meta(&mut new, &["resourceVersion", "selfLink"]);
        if ctx.res.namespaced {
            new["metadata"]["namespace"] = Value::from(ns_scoped.clone());
        }
        let mut warnings = Vec::new();
        self.admit(
            ctx,
            &mut new,
            Some(&old),
            opts.field_validation,
            &mut warnings,
            Vec::new(),
        )?;
        self.validating_admission(&crate::admission::AdmissionRequest {
            operation: "UPDATE",
            res: &ctx.res,
            subresource: (sub == Subresource::Status).then_some("status"),
            namespace: &ns_scoped,
            name,
            object: Some(&new),
            old_object: Some(&old),
            user: opts.user.as_ref(),
            dry_run: opts.dry_run,
        })?;
        let now = meta::now_rfc3339();
        if let Mode::Update(manager) = mode {
            let subname = (sub == Subresource::Status).then_some("status");
            kubesim_apply::record_update(
                Some(&old),
                &mut new,
                &ctx.type_info,
                manager,
                subname,
                &now,
            );
        }
        if ctx.tracks_generation() && generation_relevant_differs(&new, &old, ctx.res.has_status) {
            let g = old
                .get("metadata")
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            new["metadata"]["generation"] = Value::from(g + 1);
        }
        if let Some(rv) = meta_str(&old, "resourceVersion") {
            new["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        }
        if same_but_rv_and_times(&new, &old) {
            return Ok(WriteResult {
                object: old,
                created: false,
                warnings,
                json: None,
            });
        }
        if opts.dry_run {
            return Ok(WriteResult {
                object: new,
                created: false,
                warnings,
                json: None,
            });
        }
        ctx.conversion.to_storage(&mut new);
        let deleting = new
            .get("metadata")
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some();
        if deleting && meta::finalizers(&new).is_empty() && ctx.key != NAMESPACES {
            // the last finalizer is gone: the object goes away now
            self.put_over(&ctx.key, &store_ns, name, new, Some(&old));
            let last = self
                .remove(&ctx.key, &store_ns, name)
                .map(|l| ctx.out(&l))
                .unwrap_or(Value::Null);
            self.after_removal(&ctx.key, &store_ns, &last);
            return Ok(WriteResult {
                object: last,
                created: false,
                warnings,
                json: None,
            });
        }
        let (stored, json) = self.put_over(&ctx.key, &store_ns, name, new, Some(&old));
        let owners = owner_uids(&stored);
        let object = ctx.out_owned(stored);
        if ctx.key == NAMESPACES && deleting {
            self.try_finalize_namespace(name);
        }
        if sub == Subresource::Main {
            self.after_write(&ctx.key, &store_ns, name, false, &owners);
        }
        Ok(WriteResult {
            object,
            created: false,
            warnings,
            json: ctx.served_json(json),
        })
    }

    /// Controller-like reactions to a stored write: a namespace gets its `default`
    /// ServiceAccount, a CRD gets served and established, an object whose owners are all
    /// absent is garbage-collected. `owners` are the owner UIDs of the written object
    /// (neither reaction changes them).
    fn after_write(&mut self, key: &str, ns: &str, name: &str, created: bool, owners: &[String]) {
        match key {
            NAMESPACES if created => self.ensure_default_sa(name),
            CRDS => self.sync_crd(name),
            crate::admission::POLICIES => self.sync_policy_status(name),
            _ => {}
        }
        self.collect_if_dangling(key, ns, name, owners);
    }

    fn ensure_default_sa(&mut self, ns: &str) {
        if self.get(kinds::SERVICEACCOUNTS, ns, "default").is_some() {
            return;
        }
        let sa = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": "default",
                "namespace": ns,
                "uid": meta::new_uid(),
                "creationTimestamp": meta::now_rfc3339(),
            },
        });
        self.put(kinds::SERVICEACCOUNTS, ns, "default", sa);
    }

    /// Serve the CRD's versions and set the status the apiextensions controllers would
    /// (`NamesAccepted`, `Established`, `acceptedNames`, `storedVersions`).
    pub(crate) fn sync_crd(&mut self, name: &str) {
        let Some(stored) = self.get(CRDS, "", name) else {
            return;
        };
        let Ok(def) = crate::crd::parse_crd(&stored) else {
            return;
        };
        let key = def.type_key();
        self.resources
            .retain(|_, r| !(r.custom && r.resource_group() == key));
        for r in def.resources() {
            self.register(r);
        }
        // Watches through a version no longer served end, as kube-apiserver tears down the
        // CRD's old storage (and its watches) when the CRD changes; clients re-watch.
        if let Some(ts) = self.types.get_mut(&key) {
            ts.watchers
                .retain(|w| def.versions.get(&w.version).is_some_and(|v| v.served));
        }
        let status =
            crate::crd::established_status(&def, stored.get("status"), &meta::now_rfc3339());
        self.crds.insert(key, def);
        self.types_changed();
        if stored.get("status") != Some(&status) {
            let mut next = (*stored).clone();
            next["status"] = status;
            self.put(CRDS, "", name, next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copying definitions the in-place comparisons replace.
    fn normalized(v: &Value) -> Value {
        let mut n = v.clone();
        remove_meta(&mut n, &["resourceVersion"]);
        if let Some(Value::Array(entries)) = n
            .get_mut("metadata")
            .and_then(|m| m.get_mut("managedFields"))
        {
            for e in entries.iter_mut() {
                if let Some(m) = e.as_object_mut() {
                    m.remove("time");
                }
            }
        }
        n
    }

    fn generation_relevant(v: &Value, has_status: bool) -> Value {
        let mut n = v.clone();
        if let Some(m) = n.as_object_mut() {
            m.remove("metadata");
            m.remove("apiVersion");
            if has_status {
                m.remove("status");
            }
        }
        n
    }

    fn variants() -> Vec<Value> {
        let mf = |t: &str| json!([{"manager": "m", "time": t, "fieldsV1": {"f:spec": {}}}, "odd"]);
        vec![
            json!(null),
            json!("x"),
            json!({}),
            json!({"metadata": "odd"}),
            json!({"spec": {"a": 1}}),
            json!({"spec": {"a": 2}}),
            json!({"apiVersion": "v1", "spec": {"a": 1}}),
            json!({"spec": {"a": 1}, "status": {"s": 1}}),
            json!({"spec": {"a": 1}, "metadata": {"resourceVersion": "1"}}),
            json!({"spec": {"a": 1}, "metadata": {"resourceVersion": "2"}}),
            json!({"spec": {"a": 1}, "metadata": {"resourceVersion": "2", "labels": {"a": "b"}}}),
            json!({"spec": {"a": 1}, "metadata": {"managedFields": mf("t1")}}),
            json!({"spec": {"a": 1}, "metadata": {"managedFields": mf("t2")}}),
            json!({"spec": {"a": 1}, "metadata": {"managedFields": [{"manager": "m"}]}}),
            json!({"spec": {"a": 1}, "metadata": {"managedFields": "odd"}}),
            json!({"spec": {"a": 1}, "metadata": {"managedFields": mf("t1"), "resourceVersion": "9"}}),
        ]
    }

    #[test]
    fn in_place_comparisons_agree_with_the_copying_ones() {
        let vs = variants();
        for a in &vs {
            for b in &vs {
                assert_eq!(
                    same_but_rv_and_times(a, b),
                    normalized(a) == normalized(b),
                    "{a} vs {b}"
                );
                for has_status in [false, true] {
                    assert_eq!(
                        generation_relevant_differs(a, b, has_status),
                        generation_relevant(a, has_status) != generation_relevant(b, has_status),
                        "{a} vs {b}, status subresource {has_status}"
                    );
                }
            }
        }
        // sanity: the comparisons do tell differences apart
        assert!(same_but_rv_and_times(&vs[8], &vs[9]));
        assert!(!same_but_rv_and_times(&vs[9], &vs[10]));
        assert!(same_but_rv_and_times(&vs[11], &vs[12]));
        assert!(generation_relevant_differs(&vs[4], &vs[5], false));
        assert!(!generation_relevant_differs(&vs[4], &vs[7], true));
    }
}
