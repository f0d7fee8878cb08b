//! Legacy discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`) as
//! kube-apiserver serves them, built from the store's served resources.
//!
//! Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList` at `/api` and
//! `/apis`) is served when the client asks for it first in `Accept`, as kubectl does; other
//! clients get the legacy documents.

use kubesim_store::ResourceInfo;
use serde_json::{Value, json};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// `/api`: `APIVersions`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ]
    })
}

/// Group name → its versions, most preferred first.
fn groups(resources: &[ResourceInfo]) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        let versions = map.entry(r.group.clone()).or_default();
        if !versions.contains(&r.version) {
            versions.push(r.version.clone());
        }
    }
    for versions in map.values_mut() {
        versions.sort_by(|a, b| compare_kube_versions(a, b));
    }
    map
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

/// `/apis`: `APIGroupList` (every non-core group).
pub fn api_group_list(resources: &[ResourceInfo]) -> Value {
    let groups: Vec<Value> = groups(resources)
        .iter()
        .map(|(name, versions)| group_json(name, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: `APIGroup`, or `None` if the group is not served.
pub fn api_group(resources: &[ResourceInfo], group: &str) -> Option<Value> {
    let all = groups(resources);
    let versions = all.get(group)?;
    let mut g = group_json(group, versions);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/v1` or `/apis/<group>/<version>`: `APIResourceList`, or `None` if not served.
pub fn api_resource_list(resources: &[ResourceInfo], group: &str, version: &str) -> Option<Value> {
    let mut entries = Vec::new();
    for r in resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut main = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            main["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            main["categories"] = json!(r.categories);
        }
        entries.push(main);
        if r.has_status {
            entries.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        for s in &r.subresources {
            let mut e = json!({
                "name": format!("{}/{}", r.plural, s.name),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": s.kind,
                "verbs": s.verbs,
            });
            if !s.group.is_empty() {
                e["group"] = json!(s.group);
                e["version"] = json!(s.version);
            }
            entries.push(e);
        }
    }
    if entries.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": entries,
    }))
}

/// The media type of aggregated discovery responses.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether `Accept` asks for aggregated discovery (v2) before anything else.
pub fn wants_aggregated(accept: Option<&str>) -> bool {
    let Some(first) = accept.and_then(|a| a.split(',').next()) else {
        return false;
    };
    let params: Vec<&str> = first.split(';').map(str::trim).collect();
    params.contains(&"g=apidiscovery.k8s.io")
        && params.contains(&"v=v2")
        && params.contains(&"as=APIGroupDiscoveryList")
}

fn aggregated_resource(r: &ResourceInfo) -> Value {
    let mut subresources = Vec::new();
    if r.has_status {
        subresources.push(json!({
            "subresource": "status",
            "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
            "verbs": ["get", "patch", "update"],
        }));
    }
    for s in &r.subresources {
        subresources.push(json!({
            "subresource": s.name,
            "responseKind": {"group": s.group, "version": s.version, "kind": s.kind},
            "verbs": s.verbs,
        }));
    }
    let mut v = json!({
        "resource": r.plural,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": r.verbs,
    });
    if !r.short_names.is_empty() {
        v["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        v["categories"] = json!(r.categories);
    }
    if !subresources.is_empty() {
        v["subresources"] = json!(subresources);
    }
    v
}

fn aggregated_group(resources: &[ResourceInfo], group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| {
            let rs: Vec<Value> = resources
                .iter()
                .filter(|r| r.group == group && &r.version == version)
                .map(aggregated_resource)
                .collect();
            json!({"version": version, "resources": rs, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
}

/// Aggregated discovery: `core = true` for `/api` (the core group), else `/apis`.
pub fn aggregated(resources: &[ResourceInfo], core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(resources, "", &["v1".to_string()])]
    } else {
        groups(resources)
            .iter()
            .map(|(name, versions)| aggregated_group(resources, name, versions))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// Kubernetes version priority (`v1` > `v1beta2` > `v1beta1` > `v1alpha1` > other strings),
/// as `Ordering::Less` for the preferred one.
pub fn compare_kube_versions(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u32 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 3, 0));
        }
        let (kind, num) = if let Some(n) = tail.strip_prefix("beta") {
            (2, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (1, n)
        } else {
            return None;
        };
        Some((major, kind, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((am, ak, an)), Some((bm, bk, bn))) => bk.cmp(&ak).then(bm.cmp(&am)).then(bn.cmp(&an)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(group: &str, version: &str, plural: &str, kind: &str) -> ResourceInfo {
        ResourceInfo {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced: true,
            verbs: vec!["get".into(), "list".into()],
            short_names: vec![],
            categories: vec![],
            has_status: true,
            storage: true,
            subresources: vec![],
            virtual_only: false,
            printer_columns: vec![],
            custom: false,
        }
    }

    #[test]
    fn aggregated_negotiation_and_shape() {
        assert!(wants_aggregated(Some(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        )));
        assert!(!wants_aggregated(Some("application/json")));
        assert!(!wants_aggregated(None));
        let rs = vec![
            res("x.io", "v1", "things", "Thing"),
            res("", "v1", "pods", "Pod"),
        ];
        let apis = aggregated(&rs, false);
        assert_eq!(apis["items"].as_array().unwrap().len(), 1);
        let thing = &apis["items"][0]["versions"][0]["resources"][0];
        assert_eq!(thing["resource"], "things");
        assert_eq!(thing["scope"], "Namespaced");
        assert_eq!(thing["subresources"][0]["subresource"], "status");
        let core = aggregated(&rs, true);
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        assert_eq!(
            core["items"][0]["versions"][0]["resources"][0]["resource"],
            "pods"
        );
    }

    #[test]
    fn version_priority() {
        let mut v = vec![
            "v1alpha1",
            "v2",
            "v1beta1",
            "v1",
            "foo",
            "v1beta2",
            "v10alpha1",
        ];
        v.sort_by(|a, b| compare_kube_versions(a, b));
        assert_eq!(
            v,
            vec![
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v10alpha1",
                "v1alpha1",
                "foo"
            ]
        );
    }

    #[test]
    fn group_list_prefers_highest_version() {
        let rs = vec![
            res("x.io", "v1alpha2", "things", "Thing"),
            res("x.io", "v1", "things", "Thing"),
            res("", "v1", "pods", "Pod"),
        ];
        let list = api_group_list(&rs);
        assert_eq!(list["groups"].as_array().unwrap().len(), 1);
        assert_eq!(list["groups"][0]["preferredVersion"]["version"], "v1");
        assert_eq!(
            list["groups"][0]["versions"][1]["groupVersion"],
            "x.io/v1alpha2"
        );
        assert!(api_group(&rs, "y.io").is_none());
        assert_eq!(api_group(&rs, "x.io").unwrap()["kind"], "APIGroup");
    }

    #[test]
    fn resource_list_includes_status_subresource() {
        let rs = vec![res("", "v1", "pods", "Pod")];
        let l = api_resource_list(&rs, "", "v1").unwrap();
        assert_eq!(l["groupVersion"], "v1");
        let names: Vec<&str> = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["pods", "pods/status"]);
        assert!(api_resource_list(&rs, "", "v2").is_none());
    }
}
