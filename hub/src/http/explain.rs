//! `GET /v1/clusters/{namespace}/{name}/explain/pod/{ns}/{pod}` and
//! `.../explain/binding/{ns}/{binding}`: `kleym explain` through the hub, for any spoke it
//! engages. Behind the `/v1` guard (the same authentication and base authorization as every
//! `/v1` route), each request needs one more access check in the hub cluster:
//! `get explanations.kleym.io` in namespace `{ns}` for the object name
//! `{namespace}/{name}` (the cluster), so that a caller learns only about namespaces it was
//! granted. The answer is also limited to that namespace
//! ([`Scope::Namespace`](crate::explain::Scope)).
//!
//! A replica that runs the spoke answers from that spoke reconciler's caches, and reads the
//! spoke with the hub's own client for it only for what the caches do not hold
//! ([`SpokeReach::Cached`], [`HubCaches`](crate::explain_source::HubCaches)); until those
//! caches synced it answers 503. A replica that does not run the spoke answers 503 without
//! reaching it.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::explain::{ExplainError, Scope};
use crate::explain_source::{ClusterReads, ExplainSource};
use crate::http::auth::{AccessCheck, Caller};
use crate::http::router::{ApiState, error_body, failure_response};
use crate::http::view::SpokeReach;
use kleym_spoke::explain::ManagerConfig;

/// The API group and resource of the per-namespace access check.
pub const EXPLAIN_GROUP: &str = "kleym.io";
/// See [`EXPLAIN_GROUP`].
pub const EXPLAIN_RESOURCE: &str = "explanations";

/// How long one explanation may read the spoke before the request fails.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// The query of an explain request: the controller manager's settings (as the CLI flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplainQuery {
    /// The manager's settings.
    pub manager: ManagerConfig,
    /// kleym's field manager, for the ownership proof.
    pub field_manager: String,
    /// Pods listed per group (`explain binding`).
    pub sample: usize,
}

/// The query string of `q`, as the CLI sends it.
pub fn query_string(q: &ExplainQuery) -> String {
    let m = &q.manager;
    let mut pairs: Vec<(&str, String)> = vec![
        ("trustDomain", m.trust_domain.clone()),
        ("clusterName", m.cluster_name.clone()),
        ("clusterDomain", m.cluster_domain.clone()),
        ("spireClass", m.class_name.clone()),
        ("watchClassless", m.watch_classless.to_string()),
        ("parentIDTemplate", m.parent_id_template.clone()),
        ("fieldManager", q.field_manager.clone()),
        ("sample", q.sample.to_string()),
    ];
    for i in &m.ignore_namespaces {
        pairs.push(("ignoreNamespace", i.clone()));
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encoding of everything but RFC 3986's unreserved characters.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

/// Parse an explain query; the error names the parameter.
pub fn parse_query(raw: Option<&str>) -> Result<ExplainQuery, String> {
    let mut q = ExplainQuery {
        manager: ManagerConfig {
            trust_domain: String::new(),
            cluster_name: String::new(),
            cluster_domain: "cluster.local".into(),
            class_name: String::new(),
            watch_classless: false,
            ignore_namespaces: Vec::new(),
            parent_id_template: String::new(),
        },
        field_manager: kleym_spoke::reconciler::config::DEFAULT_FIELD_MANAGER.to_string(),
        sample: crate::explain_binding::DEFAULT_SAMPLE,
    };
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v).map_err(|e| format!("query parameter {k}: {e}"))?;
        match k {
            "trustDomain" => q.manager.trust_domain = v,
            "clusterName" => q.manager.cluster_name = v,
            "clusterDomain" => q.manager.cluster_domain = v,
            "spireClass" => q.manager.class_name = v,
            "watchClassless" => {
                q.manager.watch_classless = v.parse().map_err(|_| {
                    format!("query parameter watchClassless: {v:?} is not true or false")
                })?
            }
            "ignoreNamespace" => q.manager.ignore_namespaces.push(v),
            "parentIDTemplate" => q.manager.parent_id_template = v,
            "fieldManager" => q.field_manager = v,
            "sample" => {
                q.sample = v.parse().map_err(|_| {
                    format!("query parameter sample: {v:?} is not a non-negative integer")
                })?
            }
            other => return Err(format!("unknown query parameter {other:?}")),
        }
    }
    if q.manager.trust_domain.is_empty() {
        return Err("query parameter trustDomain is required".into());
    }
    if q.field_manager.is_empty() {
        return Err("query parameter fieldManager must not be empty".into());
    }
    Ok(q)
}

/// What is explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Binding,
}

/// The path parameters: cluster namespace and name, object namespace and name.
type ExplainPath = Path<(String, String, String, String)>;

/// `GET /v1/clusters/{namespace}/{name}/explain/pod/{ns}/{pod}`.
pub(crate) async fn explain_pod(
    State(s): State<ApiState>,
    caller: Option<Extension<Caller>>,
    Path(p): ExplainPath,
    RawQuery(q): RawQuery,
) -> Response {
    explain(s, caller.map(|Extension(c)| c), p, q, Kind::Pod).await
}

/// `GET /v1/clusters/{namespace}/{name}/explain/binding/{ns}/{binding}`.
pub(crate) async fn explain_binding(
    State(s): State<ApiState>,
    caller: Option<Extension<Caller>>,
    Path(p): ExplainPath,
    RawQuery(q): RawQuery,
) -> Response {
    explain(s, caller.map(|Extension(c)| c), p, q, Kind::Binding).await
}

async fn explain(
    s: ApiState,
    caller: Option<Caller>,
    (cluster_ns, cluster_name, ns, name): (String, String, String, String),
    raw_query: Option<String>,
    kind: Kind,
) -> Response {
    let cluster = format!("{cluster_ns}/{cluster_name}");
    let query = match parse_query(raw_query.as_deref()) {
        Ok(q) => q,
        Err(message) => {
            return error_body(StatusCode::BAD_REQUEST, "BadRequest", &message, Value::Null);
        }
    };
    // Whether the cluster exists is no secret to a caller past the /v1 guard (it lists
    // /v1/clusters); anything about the namespace needs the further check first.
    let reach = s.view.spoke_reach(&cluster_ns, &cluster_name);
    let unknown = || {
        error_body(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("cluster {cluster} is not in the hub's inventory"),
            json!({"cluster": {"namespace": cluster_ns, "name": cluster_name}}),
        )
    };
    if let SpokeReach::Unknown = reach {
        return unknown();
    }
    let check = AccessCheck {
        verb: "get".into(),
        group: EXPLAIN_GROUP.into(),
        resource: EXPLAIN_RESOURCE.into(),
        namespace: Some(ns.clone()),
        name: Some(cluster.clone()),
    };
    if let Err(f) = s.auth.authorize_also(caller.as_ref(), &check).await {
        return failure_response(&f);
    }
    // The one ownership check: only a replica that runs the spoke holds its reconciler's
    // caches and its client (in a sharded hub, only the replica that owns the cluster).
    let m = &query.manager;
    let fm = query.field_manager.as_str();
    let answer = match reach {
        SpokeReach::Cached(caches) => {
            // Until the caches synced they cannot answer, and nothing is read from the
            // spoke.
            if let Err(e) = caches.ready() {
                return not_synced(&cluster, &e, &cluster_ns, &cluster_name);
            }
            tokio::time::timeout(
                READ_LIMIT,
                answer(&caches, kind, &ns, &name, m, fm, query.sample),
            )
            .await
        }
        SpokeReach::Client(client) => {
            let source = ClusterReads(&client);
            tokio::time::timeout(
                READ_LIMIT,
                answer(&source, kind, &ns, &name, m, fm, query.sample),
            )
            .await
        }
        SpokeReach::NotHere(why) => {
            return error_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "SpokeNotReachable",
                &why,
                json!({"cluster": {"namespace": cluster_ns, "name": cluster_name}}),
            );
        }
        SpokeReach::Unknown => return unknown(),
    };
    match answer {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e @ ExplainError::NotCached(_))) => {
            not_synced(&cluster, &e, &cluster_ns, &cluster_name)
        }
        Ok(Err(e @ (ExplainError::PodNotFound { .. } | ExplainError::BindingNotFound { .. }))) => {
            error_body(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("{e} in cluster {cluster}"),
                Value::Null,
            )
        }
        Ok(Err(e @ ExplainError::Model(_))) => error_body(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &e.to_string(),
            Value::Null,
        ),
        Ok(Err(e)) => {
            // The shipped spoke role grants nothing on pods or nodes; say which optional role
            // the operator grants rather than leaving a bare RBAC refusal.
            let hint = match &e {
                ExplainError::Read {
                    source: kube::Error::Api(s),
                    ..
                } if s.code == 403 => {
                    "; the hub's identity needs the optional ClusterRole kleym-explain-reader on \
                     this spoke (kleym trust-config --allow-explain)"
                }
                _ => "",
            };
            error_body(
                StatusCode::BAD_GATEWAY,
                "SpokeReadFailed",
                &format!("cluster {cluster}: {e}{hint}"),
                Value::Null,
            )
        }
        Err(_) => error_body(
            StatusCode::GATEWAY_TIMEOUT,
            "SpokeReadTimeout",
            &format!(
                "cluster {cluster}: reading the spoke took longer than {}s",
                READ_LIMIT.as_secs()
            ),
            Value::Null,
        ),
    }
}

/// 503 `SpokeNotSynced`: the hub's caches of the spoke cannot answer yet.
fn not_synced(cluster: &str, e: &ExplainError, cluster_ns: &str, cluster_name: &str) -> Response {
    error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        "SpokeNotSynced",
        &format!("cluster {cluster}: {e}"),
        json!({"cluster": {"namespace": cluster_ns, "name": cluster_name}}),
    )
}

/// The explanation of `kind` `ns/name` from `source`, as JSON.
async fn answer(
    source: &impl ExplainSource,
    kind: Kind,
    ns: &str,
    name: &str,
    manager: &ManagerConfig,
    field_manager: &str,
    sample: usize,
) -> Result<Value, ExplainError> {
    match kind {
        Kind::Pod => crate::explain::explain_pod_from(
            source,
            ns,
            name,
            manager,
            field_manager,
            Scope::Namespace,
        )
        .await
        .and_then(|e| serde_json::to_value(e).map_err(|e| encoding(&e))),
        Kind::Binding => crate::explain_binding::explain_binding_from(
            source,
            ns,
            name,
            manager,
            field_manager,
            sample,
            Scope::Namespace,
        )
        .await
        .and_then(|e| serde_json::to_value(e).map_err(|e| encoding(&e))),
    }
}

fn encoding(e: &serde_json::Error) -> ExplainError {
    ExplainError::Encode(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_round_trips_and_names_a_bad_parameter() {
        let q = ExplainQuery {
            manager: ManagerConfig {
                trust_domain: "prod.example.org".into(),
                cluster_name: "spoke 1".into(),
                cluster_domain: "cluster.local".into(),
                class_name: "a&b".into(),
                watch_classless: true,
                ignore_namespaces: vec!["^kube-.*$".into(), "=x%".into()],
                parent_id_template: "spiffe://{{ .TrustDomain }}/agent/{{ .NodeMeta.Name }}".into(),
            },
            field_manager: "kleym".into(),
            sample: 3,
        };
        assert_eq!(parse_query(Some(&query_string(&q))), Ok(q));
        assert_eq!(
            parse_query(Some("clusterName=x")),
            Err("query parameter trustDomain is required".into())
        );
        assert!(
            parse_query(Some("trustDomain=t&sample=-1"))
                .unwrap_err()
                .contains("sample")
        );
        assert!(
            parse_query(Some("trustDomain=t&nope=1"))
                .unwrap_err()
                .contains("nope")
        );
    }
}
