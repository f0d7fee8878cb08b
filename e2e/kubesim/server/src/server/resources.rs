//! Resource requests (`/api/v1/...`, `/apis/<g>/<v>/...`) mapped onto the store's verbs.

use super::ClusterServer;
use super::request::{Query, RequestInfo};
use super::response::{self, Body, bad_request};
use super::table::{IncludeObject, Representation, to_partial, to_table};
use super::watch;
use crate::virtual_resources;
use bytes::Bytes;
use http::{HeaderMap, Response, header};
use kubesim_auth::UserInfo;
use kubesim_store::{
    ApiError, DeleteOptions, FieldValidation, ListOptions, PatchType, RequestUser, ResourceInfo,
    Subresource, WatchOptions, WriteOptions, WriteResult,
};
use serde_json::Value;

/// Handle a resource request (already authenticated and authorized).
pub async fn handle(
    server: &ClusterServer,
    user: &UserInfo,
    info: &RequestInfo,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Response<Body> {
    match dispatch(server, user, info, query, headers, body).await {
        Ok(resp) => resp,
        Err(e) => response::error(&e),
    }
}

fn no_such_resource() -> ApiError {
    let mut e = ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    e.details = Some(serde_json::json!({}));
    e
}

async fn dispatch(
    server: &ClusterServer,
    user: &UserInfo,
    info: &RequestInfo,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let res = server
        .store
        .resolve_shared(&info.api_group, &info.api_version, &info.resource)
        .ok_or_else(no_such_resource)?;
    let is_namespaces = res.group.is_empty() && res.plural == "namespaces";
    if !res.namespaced && info.namespace.is_some() && !is_namespaces {
        return Err(no_such_resource());
    }
    if res.namespaced && info.name.is_some() && info.namespace.is_none() {
        return Err(no_such_resource());
    }
    let ns = info.store_namespace();
    // Namespaced kinds are only routed under /namespaces/<ns>/ for writes and single objects
    // (lists and watches across all namespaces are fine).
    if res.namespaced && ns.is_none() && matches!(info.verb.as_str(), "create" | "deletecollection")
    {
        return Err(no_such_resource());
    }
    if info.name.is_none() && matches!(info.verb.as_str(), "update" | "patch") {
        return Err(method_not_allowed());
    }

    if res.virtual_only {
        if info.verb != "create" || info.name.is_some() {
            return Err(method_not_allowed());
        }
        let obj = decode_body(headers, &body)?;
        let (code, v) = virtual_resources::review(server, user, &res, ns, obj).await?;
        return Ok(response::json(code, &v));
    }

    let sub = match info.subresource.as_deref() {
        None => Subresource::Main,
        Some("status") if res.has_status => Subresource::Status,
        Some("token") if res.group.is_empty() && res.plural == "serviceaccounts" => {
            if info.verb != "create" {
                return Err(method_not_allowed());
            }
            let name = info.name.as_deref().unwrap_or_default();
            let obj = decode_body(headers, &body)?;
            let v = virtual_resources::token_request(server, ns.unwrap_or(""), name, obj).await?;
            return Ok(response::json(201, &v));
        }
        Some(_) => return Err(no_such_resource()),
    };

    let repr =
        Representation::from_accept(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let include = IncludeObject::parse(query.get("includeObject"));
    let render = |v: &Value, is_list: bool| -> Value {
        match repr {
            Representation::Object => v.clone(),
            Representation::Table => to_table(&res, v, include, true),
            Representation::PartialMetadata if is_list || v.get("items").is_none() => to_partial(v),
            Representation::PartialMetadata => v.clone(),
        }
    };

    match info.verb.as_str() {
        "get" => {
            let name = info.name.as_deref().unwrap_or_default();
            let obj = server.store.get(&res, ns, name)?;
            Ok(response::json(200, &render(&obj, false)))
        }
        "list" => {
            let list = server.store.list(&res, ns, &list_options(query))?;
            Ok(response::json(200, &render(&list, true)))
        }
        "watch" => {
            let opts = watch_options(query);
            if server.faults.take_forced_gone() {
                return Ok(watch::gone_response(
                    opts.resource_version.as_deref(),
                    server.store.current_resource_version(),
                ));
            }
            let stream = server.store.watch(&res, ns, &opts)?;
            Ok(watch::stream_response(
                stream,
                ResourceInfo::clone(&res),
                repr,
                include,
                server.faults.subscribe(),
                server.shutdown.clone(),
            ))
        }
        "create" => {
            if info.name.is_some() {
                return Err(method_not_allowed());
            }
            let obj = decode_body(headers, &body)?;
            check_namespace_matches(&obj, ns, &res)?;
            let opts = write_options(query, headers, false)?.by(user);
            let r = server.store.create(&res, ns, obj, &opts)?;
            Ok(write_response(r))
        }
        "update" => {
            let name = info.name.as_deref().unwrap_or_default();
            let obj = decode_body(headers, &body)?;
            check_namespace_matches(&obj, ns, &res)?;
            if let Some(body_name) = obj.pointer("/metadata/name").and_then(Value::as_str)
                && body_name != name
            {
                return Err(bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            let opts = write_options(query, headers, false)?.by(user);
            let r = server.store.update(&res, ns, name, obj, sub, &opts)?;
            Ok(write_response(r))
        }
        "patch" => {
            let name = info.name.as_deref().unwrap_or_default();
            let pt = patch_type(headers)?;
            let patch = match pt {
                PatchType::Apply => parse_yaml_or_json(&body)?,
                _ => serde_json::from_slice(&body)
                    .map_err(|e| bad_request(format!("error decoding patch: {e}")))?,
            };
            let opts = write_options(query, headers, pt == PatchType::Apply)?.by(user);
            let r = server.store.patch(&res, ns, name, pt, &patch, sub, &opts)?;
            Ok(write_response(r))
        }
        "delete" => {
            let name = info.name.as_deref().unwrap_or_default();
            let mut opts = delete_options(query, &body)?;
            opts.user = Some(request_user(user));
            let obj = server.store.delete(&res, ns, name, &opts)?;
            let pending = obj.pointer("/metadata/deletionTimestamp").is_some()
                && obj
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
            Ok(response::json(if pending { 202 } else { 200 }, &obj))
        }
        "deletecollection" => {
            let mut opts = delete_options(query, &body)?;
            opts.user = Some(request_user(user));
            let list = server
                .store
                .delete_collection(&res, ns, &list_options(query), &opts)?;
            Ok(response::json(200, &list))
        }
        _ => Err(method_not_allowed()),
    }
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

fn write_response(r: WriteResult) -> Response<Body> {
    let code = if r.created { 201 } else { 200 };
    // the store's serialisation of the object, when it has one, is byte for byte ours
    let mut resp = match &r.json {
        Some(text) => response::json_text(code, text),
        None => response::json(code, &r.object),
    };
    response::add_warnings(&mut resp, &r.warnings);
    resp
}

fn check_namespace_matches(
    obj: &Value,
    ns: Option<&str>,
    res: &ResourceInfo,
) -> Result<(), ApiError> {
    if !res.namespaced {
        return Ok(());
    }
    let body_ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
    match (body_ns, ns) {
        (Some(b), Some(u)) if !b.is_empty() && b != u => Err(bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn unsupported_media_type(ct: &str) -> ApiError {
    ApiError::new(
        415,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct:?})"
        ),
    )
}

fn parse_yaml_or_json(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| bad_request(format!("request body is not UTF-8: {e}")))?;
    crate::yaml::from_str::<Value>(text)
        .map_err(|e| bad_request(format!("error decoding YAML: {e}")))
}

/// Decode a create/update body (JSON or YAML).
pub fn decode_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type(headers);
    let v = match ct.as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| bad_request(format!("error decoding request body: {e}")))?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => parse_yaml_or_json(body)?,
        "application/vnd.kubernetes.protobuf" => super::protobuf::decode(body)
            .map_err(|e| ApiError::new(415, "UnsupportedMediaType", e.to_string()))?,
        other => return Err(unsupported_media_type(other)),
    };
    if !v.is_object() {
        return Err(bad_request("the request body must be a JSON object"));
    }
    Ok(v)
}

fn patch_type(headers: &HeaderMap) -> Result<PatchType, ApiError> {
    match content_type(headers).as_str() {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
            ),
        )),
    }
}

/// kube-apiserver's default field manager: the user agent up to the first `/`.
fn manager_from_user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let prefix = ua.split('/').next().unwrap_or("");
    prefix.chars().take(128).collect()
}

fn write_options(
    query: &Query,
    headers: &HeaderMap,
    apply: bool,
) -> Result<WriteOptions, ApiError> {
    let dry_run = match query.get("dryRun") {
        None => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!("Invalid dryRun value: {other:?}: supported values: \"All\""),
            ));
        }
    };
    let field_validation = match query.get("fieldValidation") {
        None => FieldValidation::default(),
        Some("Strict") => FieldValidation::Strict,
        Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    let field_manager = match query.get("fieldManager") {
        Some(m) => m.to_string(),
        None if apply => {
            let mut e = ApiError::new(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            );
            e.details = Some(
                serde_json::json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
                    {"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}
                ]}),
            );
            return Err(e);
        }
        None => manager_from_user_agent(headers),
    };
    let force = query.flag("force");
    if force && !apply {
        return Err(ApiError::new(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    Ok(WriteOptions {
        dry_run,
        field_manager,
        force,
        field_validation,
        user: None,
    })
}

/// The authenticated user as validating admission policies see it.
fn request_user(user: &UserInfo) -> RequestUser {
    RequestUser {
        username: user.username.clone(),
        uid: user.uid.clone(),
        groups: user.groups.clone(),
    }
}

/// Sets the requesting user of write options.
trait ByUser {
    fn by(self, user: &UserInfo) -> Self;
}

impl ByUser for WriteOptions {
    fn by(mut self, user: &UserInfo) -> Self {
        self.user = Some(request_user(user));
        self
    }
}

fn list_options(query: &Query) -> ListOptions {
    ListOptions {
        label_selector: query.get("labelSelector").map(str::to_string),
        field_selector: query.get("fieldSelector").map(str::to_string),
        limit: query.number("limit").filter(|l: &usize| *l > 0),
        continue_token: query.get("continue").map(str::to_string),
        resource_version: query.get("resourceVersion").map(str::to_string),
    }
}

fn watch_options(query: &Query) -> WatchOptions {
    WatchOptions {
        label_selector: query.get("labelSelector").map(str::to_string),
        field_selector: query.get("fieldSelector").map(str::to_string),
        resource_version: query.get("resourceVersion").map(str::to_string),
        allow_bookmarks: query.flag("allowWatchBookmarks"),
        send_initial_events: query.flag("sendInitialEvents"),
        timeout_seconds: query.number("timeoutSeconds"),
    }
}

fn delete_options(query: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        propagation_policy: query.get("propagationPolicy").map(str::to_string),
        dry_run: query.get("dryRun") == Some("All"),
        ..Default::default()
    };
    if body.iter().any(|b| !b.is_ascii_whitespace()) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            opts.propagation_policy = Some(p.to_string());
        }
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true)
            && opts.propagation_policy.is_none()
        {
            opts.propagation_policy = Some("Orphan".into());
        }
        if let Some(dr) = v.get("dryRun").and_then(Value::as_array) {
            opts.dry_run |= dr.iter().any(|d| d == "All");
        }
        opts.precondition_uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.precondition_resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(p) = &opts.propagation_policy
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(bad_request(format!(
            "propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
        )));
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_types_from_content_type() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "application/apply-patch+yaml; charset=utf-8"
                .parse()
                .unwrap(),
        );
        assert_eq!(patch_type(&h).unwrap(), PatchType::Apply);
        h.insert(
            header::CONTENT_TYPE,
            "application/merge-patch+json".parse().unwrap(),
        );
        assert_eq!(patch_type(&h).unwrap(), PatchType::Merge);
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert_eq!(patch_type(&h).unwrap_err().code, 415);
    }

    #[test]
    fn apply_requires_field_manager() {
        let h = HeaderMap::new();
        let e = write_options(&Query::parse(None), &h, true).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("fieldManager"));
        let mut h = HeaderMap::new();
        h.insert(
            header::USER_AGENT,
            "kubectl/v1.32.4 (linux/amd64)".parse().unwrap(),
        );
        let o = write_options(
            &Query::parse(Some("dryRun=All&fieldValidation=Strict")),
            &h,
            false,
        )
        .unwrap();
        assert_eq!(o.field_manager, "kubectl");
        assert!(o.dry_run);
        assert_eq!(o.field_validation, FieldValidation::Strict);
        assert!(write_options(&Query::parse(Some("fieldValidation=Bogus")), &h, false).is_err());
        assert!(write_options(&Query::parse(Some("force=true")), &h, false).is_err());
    }

    #[test]
    fn yaml_bodies() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/yaml".parse().unwrap());
        let v = decode_body(
            &h,
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        )
        .unwrap();
        assert_eq!(v["metadata"]["name"], "x");
        // A multi-document stream, a key given twice: 400, as the strict apiserver answers.
        for bad in [
            &b"kind: ConfigMap\n---\nkind: Secret\n"[..],
            b"kind: ConfigMap\nkind: Secret\n",
        ] {
            assert_eq!(decode_body(&h, bad).unwrap_err().code, 400);
        }
        h.insert(
            header::CONTENT_TYPE,
            "application/vnd.kubernetes.protobuf".parse().unwrap(),
        );
        assert_eq!(decode_body(&h, b"x").unwrap_err().code, 415);
    }

    #[test]
    fn delete_options_from_body_and_query() {
        let o = delete_options(
            &Query::parse(Some("propagationPolicy=Foreground")),
            br#"{"preconditions": {"uid": "u1", "resourceVersion": "7"}, "dryRun": ["All"]}"#,
        )
        .unwrap();
        assert_eq!(o.propagation_policy.as_deref(), Some("Foreground"));
        assert_eq!(o.precondition_uid.as_deref(), Some("u1"));
        assert_eq!(o.precondition_resource_version.as_deref(), Some("7"));
        assert!(o.dry_run);
        assert!(delete_options(&Query::parse(Some("propagationPolicy=Nope")), b"").is_err());
    }
}
