//! Resources kube-apiserver computes rather than stores: `tokenreviews`,
//! `subjectaccessreviews`, `selfsubjectaccessreviews`, `localsubjectaccessreviews`, and the
//! `serviceaccounts/<name>/token` subresource (TokenRequest).

use crate::authn;
use crate::authz::{self, Attributes};
use crate::server::{ClusterServer, internal};
use kubesim_auth::UserInfo;
use kubesim_auth::jwt::{ObjectRef, SaTokenRequest};
use kubesim_store::{ApiError, ResourceInfo};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Default TokenRequest lifetime (kube-apiserver: one hour).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

fn invalid(kind: &str, field: &str, msg: &str) -> ApiError {
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("{kind} \"\" is invalid: {field}: {msg}"),
    );
    e.details = Some(
        json!({"kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field}]}),
    );
    e
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn user_json(u: &UserInfo) -> Value {
    let mut v = json!({"username": u.username, "groups": u.groups});
    if !u.uid.is_empty() {
        v["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        v["extra"] = json!(u.extra);
    }
    v
}

/// Answer a create on a virtual review resource: `(http code, body)`.
pub async fn review(
    server: &ClusterServer,
    requester: &UserInfo,
    res: &ResourceInfo,
    ns: Option<&str>,
    body: Value,
) -> Result<(u16, Value), ApiError> {
    let mut out = body.clone();
    out["apiVersion"] = json!(res.api_version());
    out["kind"] = json!(res.kind);
    if out.get("metadata").is_none_or(|m| !m.is_object()) {
        out["metadata"] = json!({});
    }
    out["metadata"]["creationTimestamp"] = Value::Null;
    let spec = body.get("spec").cloned().unwrap_or(json!({}));
    match res.plural.as_str() {
        "tokenreviews" => {
            let token = spec.get("token").and_then(Value::as_str).unwrap_or("");
            if token.is_empty() {
                return Err(invalid(
                    "TokenReview.authentication.k8s.io",
                    "spec.token",
                    "Required value",
                ));
            }
            let mut audiences = strings(spec.get("audiences"));
            if audiences.is_empty() {
                audiences = server.api_audiences();
            }
            out["status"] = match authn::authenticate_token(server, token, &audiences).await {
                Ok(t) => json!({
                    "authenticated": true,
                    "user": user_json(&t.user),
                    "audiences": t.audiences,
                }),
                Err(reason) => json!({
                    "authenticated": false,
                    "user": {},
                    "error": reason,
                }),
            };
            Ok((201, out))
        }
        "subjectaccessreviews" | "selfsubjectaccessreviews" | "localsubjectaccessreviews" => {
            let kind = format!("{}.authorization.k8s.io", res.kind);
            let user = if res.plural == "selfsubjectaccessreviews" {
                requester.clone()
            } else {
                let username = spec.get("user").and_then(Value::as_str).unwrap_or("");
                let groups = strings(spec.get("groups"));
                if username.is_empty() && groups.is_empty() {
                    return Err(invalid(
                        &kind,
                        "spec.user",
                        "Invalid value: \"\": at least one of user or group must be specified",
                    ));
                }
                let extra: BTreeMap<String, Vec<String>> = spec
                    .get("extra")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), strings(Some(v))))
                            .collect()
                    })
                    .unwrap_or_default();
                UserInfo {
                    username: username.to_string(),
                    uid: spec
                        .get("uid")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    groups,
                    extra,
                }
            };
            let attrs = attributes_from_spec(&spec, user, &kind, ns)?;
            let d = authz::authorize(server, &attrs);
            let mut status = json!({"allowed": d.allowed});
            if !d.reason.is_empty() {
                status["reason"] = json!(d.reason);
            }
            out["status"] = status;
            if let Some(ns) = ns {
                out["metadata"]["namespace"] = json!(ns);
            }
            Ok((201, out))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    }
}

fn attributes_from_spec(
    spec: &Value,
    user: UserInfo,
    kind: &str,
    url_ns: Option<&str>,
) -> Result<Attributes, ApiError> {
    let s = |v: Option<&Value>, k: &str| {
        v.and_then(|o| o.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let ra = spec.get("resourceAttributes");
    let nra = spec.get("nonResourceAttributes");
    match (ra, nra) {
        (Some(_), Some(_)) => Err(invalid(
            kind,
            "spec.resourceAttributes",
            "Invalid value: \"resourceAttributes\": cannot be specified in combination with nonResourceAttributes",
        )),
        (None, None) => Err(invalid(
            kind,
            "spec.resourceAttributes",
            "Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        (Some(_), None) => {
            let namespace = s(ra, "namespace");
            if let Some(u) = url_ns
                && namespace != u
            {
                return Err(invalid(
                    kind,
                    "spec.resourceAttributes.namespace",
                    &format!("Invalid value: {namespace:?}: must match metadata.namespace"),
                ));
            }
            Ok(Attributes {
                user,
                verb: s(ra, "verb"),
                resource_request: true,
                api_group: s(ra, "group"),
                api_version: s(ra, "version"),
                resource: s(ra, "resource"),
                subresource: s(ra, "subresource"),
                namespace,
                name: s(ra, "name"),
                path: String::new(),
            })
        }
        (None, Some(_)) => Ok(Attributes {
            user,
            verb: s(nra, "verb"),
            resource_request: false,
            path: s(nra, "path"),
            ..Default::default()
        }),
    }
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
pub async fn token_request(
    server: &ClusterServer,
    ns: &str,
    sa_name: &str,
    body: Value,
) -> Result<Value, ApiError> {
    let sa_res = server
        .store
        .resolve("", "v1", "serviceaccounts")
        .ok_or_else(|| internal("serviceaccounts are not served"))?;
    let sa = server.store.get(&sa_res, Some(ns), sa_name)?;
    let sa_uid = sa
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut spec = body.get("spec").cloned().unwrap_or(json!({}));
    if !spec.is_object() {
        spec = json!({});
    }
    let mut audiences = strings(spec.get("audiences"));
    if audiences.is_empty() {
        audiences = server.api_audiences();
    }
    let expiration_seconds = spec
        .get("expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
    let mut pod = None;
    if let Some(bound) = spec.get("boundObjectRef").filter(|b| !b.is_null()).cloned() {
        let kind = bound.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = bound.get("name").and_then(Value::as_str).unwrap_or("");
        if kind != "Pod" {
            return Err(invalid(
                "TokenRequest.authentication.k8s.io",
                "spec.boundObjectRef.kind",
                &format!(
                    "Unsupported value: {kind:?}: supported values: \"Pod\" (kubesim binds tokens to pods only)"
                ),
            ));
        }
        let pods = server
            .store
            .resolve("", "v1", "pods")
            .ok_or_else(|| internal("pods are not served"))?;
        let p = server.store.get(&pods, Some(ns), name)?;
        let uid = p
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(want) = bound
            .get("uid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        spec["boundObjectRef"]["uid"] = json!(uid);
        spec["boundObjectRef"]["apiVersion"] = json!("v1");
        pod = Some(ObjectRef {
            name: name.to_string(),
            uid,
        });
    }
    let (token, expires) = issue(
        server,
        &SaTokenRequest {
            namespace: ns.to_string(),
            sa_name: sa_name.to_string(),
            sa_uid,
            audiences: audiences.clone(),
            expiration_seconds,
            pod,
            node: None,
        },
    )
    .await?;
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(expiration_seconds);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa_name, "namespace": ns, "creationTimestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)},
        "spec": spec,
        "status": {
            "token": token,
            "expirationTimestamp": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        },
    }))
}

/// Issue a ServiceAccount token on `server` and remember its issue time.
pub async fn issue(
    server: &ClusterServer,
    req: &SaTokenRequest,
) -> Result<(String, chrono::DateTime<chrono::Utc>), ApiError> {
    let issuer = server.sa_issuer().await?;
    let (token, expires) = issuer.issue(req).map_err(|e| match e {
        kubesim_auth::AuthError::InvalidRequest(m) => {
            invalid("TokenRequest.authentication.k8s.io", "spec", &m)
        }
        other => internal(other.to_string()),
    })?;
    // The jti is needed to honour "revoke every token issued so far"; read it back through
    // verification (the token was just signed by this issuer).
    if let Ok(claims) = issuer.verify(&token, &req.audiences, chrono::Utc::now()) {
        server.record_issued(claims.jti());
    }
    Ok((token, expires))
}
