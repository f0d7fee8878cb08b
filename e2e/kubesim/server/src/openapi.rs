//! OpenAPI v3 documents, just enough for kubectl.
//!
//! kubectl uses OpenAPI v3 for two things kubesim must get right:
//! - **server-side field validation**: before `apply`/`create`, kubectl checks that the PATCH
//!   operation of the object's GVK accepts the `fieldValidation` query parameter; if it does,
//!   validation happens on the server (our store), otherwise kubectl falls back to client-side
//!   validation against `/openapi/v2`, which kubesim does not serve;
//! - **client-side apply patch computation**: if the PATCH operation lists
//!   `application/strategic-merge-patch+json`, kubectl computes the patch from the OpenAPI
//!   schema. kubesim deliberately does not list it, so kubectl uses its compiled-in Go types
//!   for built-in kinds (exact strategic-merge metadata) and a JSON merge patch for custom
//!   resources — exactly what it does against a real apiserver for CRDs.
//!
//! Served: `/openapi/v3` (the index) and `/openapi/v3/api/v1`, `/openapi/v3/apis/<g>/<v>`
//! with one path item per resource (get/put/patch/delete, GVK extension, the usual query
//! parameters) and component schemas: the CRD's `openAPIV3Schema` for custom resources, a
//! permissive object schema for built-ins. `/openapi/v2` answers 404 (kubectl copes).

use kubesim_store::{Cluster, ResourceInfo};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The group/versions with resources, as OpenAPI v3 index keys (`api/v1`, `apis/g/v`).
fn group_versions(resources: &[ResourceInfo]) -> Vec<(String, String)> {
    let mut gvs: Vec<(String, String)> = resources
        .iter()
        .map(|r| (r.group.clone(), r.version.clone()))
        .collect();
    gvs.sort();
    gvs.dedup();
    gvs
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of per-group-version documents.
pub fn index(cluster: &Cluster) -> Value {
    let resources = cluster.resources();
    let mut paths = Map::new();
    for (g, v) in group_versions(&resources) {
        let doc = group_version_doc(cluster, &resources, &g, &v);
        let hash = hex::encode_upper(Sha256::digest(doc.to_string().as_bytes()));
        let key = gv_path(&g, &v);
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<rest>` (`api/v1` or `apis/<g>/<v>`): the document, or `None`.
pub fn document(cluster: &Cluster, rest: &str) -> Option<Value> {
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    let (group, version) = match parts.as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let resources = cluster.resources();
    if !resources
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return None;
    }
    Some(group_version_doc(cluster, &resources, group, version))
}

/// The component schema name kube-apiserver uses for a kind.
pub fn schema_name(group: &str, version: &str, kind: &str) -> String {
    if group.is_empty() {
        return format!("io.k8s.api.core.{version}.{kind}");
    }
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

fn query_param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn group_version_doc(
    cluster: &Cluster,
    resources: &[ResourceInfo],
    group: &str,
    version: &str,
) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(),
        json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
    );
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    for r in resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let name = schema_name(&r.group, &r.version, &r.kind);
        let schema_ref = json!({"$ref": format!("#/components/schemas/{name}")});
        let body = |ct: &[&str]| {
            let mut content = Map::new();
            for c in ct {
                content.insert((*c).to_string(), json!({"schema": schema_ref.clone()}));
            }
            json!({"content": content, "required": true})
        };
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema_ref.clone()}}}});
        let write_params = vec![
            query_param("dryRun"),
            query_param("fieldManager"),
            query_param("fieldValidation"),
        ];
        let collection = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        let mut coll_item = json!({
            "post": {
                "operationId": format!("create{}", r.kind),
                "x-kubernetes-action": "post",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": write_params,
                "requestBody": body(&["application/json", "application/yaml"]),
                "responses": ok,
            }
        });
        if !r.virtual_only {
            coll_item["get"] = json!({
                "operationId": format!("list{}", r.kind),
                "x-kubernetes-action": "list",
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK"}},
            });
        }
        paths.insert(collection.clone(), coll_item);
        if r.virtual_only {
            schemas.insert(name, builtin_schema(r));
            continue;
        }
        let mut patch_params = write_params.clone();
        patch_params.push(query_param("force"));
        let patch_body = {
            let mut content = Map::new();
            for c in [
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
            ] {
                content.insert(
                    c.to_string(),
                    json!({"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}}),
                );
            }
            json!({"content": content, "required": true})
        };
        let item = json!({
            "get": {
                "operationId": format!("read{}", r.kind),
                "x-kubernetes-action": "get",
                "x-kubernetes-group-version-kind": gvk,
                "responses": ok,
            },
            "put": {
                "operationId": format!("replace{}", r.kind),
                "x-kubernetes-action": "put",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": write_params,
                "requestBody": body(&["application/json", "application/yaml"]),
                "responses": ok,
            },
            "patch": {
                "operationId": format!("patch{}", r.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": patch_params,
                "requestBody": patch_body,
                "responses": ok,
            },
            "delete": {
                "operationId": format!("delete{}", r.kind),
                "x-kubernetes-action": "delete",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [query_param("dryRun"), query_param("propagationPolicy")],
                "responses": {"200": {"description": "OK"}},
            },
            "parameters": [
                {"name": "name", "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}}
            ],
        });
        paths.insert(format!("{collection}/{{name}}"), item);
        let schema = cluster
            .openapi_v3_schema(&r.group, &r.version, &r.kind)
            .map(|s| crd_schema(s, r))
            .unwrap_or_else(|| builtin_schema(r));
        schemas.insert(name, schema);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn gvk_ext(r: &ResourceInfo) -> Value {
    json!([{"group": r.group, "version": r.version, "kind": r.kind}])
}

fn builtin_schema(r: &ResourceInfo) -> Value {
    json!({
        "type": "object",
        "description": format!("{} (kubesim serves a permissive schema for built-in kinds).", r.kind),
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-group-version-kind": gvk_ext(r),
    })
}

fn crd_schema(mut schema: Value, r: &ResourceInfo) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("x-kubernetes-group-version-kind".into(), gvk_ext(r));
        let props = obj.entry("properties").or_insert_with(|| json!({}));
        if let Some(props) = props.as_object_mut() {
            props
                .entry("apiVersion")
                .or_insert_with(|| json!({"type": "string"}));
            props
                .entry("kind")
                .or_insert_with(|| json!({"type": "string"}));
            props
                .entry("metadata")
                .or_insert_with(|| json!({"type": "object"}));
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_follow_kube_apiserver() {
        assert_eq!(schema_name("", "v1", "Pod"), "io.k8s.api.core.v1.Pod");
        assert_eq!(
            schema_name("spire.spiffe.io", "v1alpha1", "ClusterSPIFFEID"),
            "io.spiffe.spire.v1alpha1.ClusterSPIFFEID"
        );
    }

    #[test]
    fn gv_paths() {
        assert_eq!(gv_path("", "v1"), "api/v1");
        assert_eq!(gv_path("x.io", "v2"), "apis/x.io/v2");
    }
}
