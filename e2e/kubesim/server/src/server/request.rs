//! Request parsing: kube-apiserver's `RequestInfo` (verb, group, version, resource,
//! subresource, namespace, name) and query parameters.

use http::Method;
use std::collections::BTreeMap;

/// What a request addresses, as kube-apiserver's `RequestInfoFactory` computes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `true` for `/api/v1/...` and `/apis/<g>/<v>/...` paths that name a resource.
    pub is_resource_request: bool,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`) or, for non-resource paths, the lower-case HTTP method.
    pub verb: String,
    /// The URL path.
    pub path: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Namespace from the path (for the `namespaces` resource: the namespace's own name).
    pub namespace: Option<String>,
    /// Resource plural.
    pub resource: String,
    /// Subresource (`status`, `token`).
    pub subresource: Option<String>,
    /// Object name.
    pub name: Option<String>,
}

impl RequestInfo {
    /// Parse `path` + `method` (+ `watch` query flag) like kube-apiserver.
    pub fn parse(method: &Method, path: &str, query: &Query) -> Self {
        let mut info = RequestInfo {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            ..Default::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let rest: &[&str] = match parts.as_slice() {
            ["api", v, rest @ ..] if !rest.is_empty() => {
                info.api_version = (*v).to_string();
                rest
            }
            ["apis", g, v, rest @ ..] if !rest.is_empty() => {
                info.api_group = (*g).to_string();
                info.api_version = (*v).to_string();
                rest
            }
            _ => return info,
        };
        let mut cur: &[&str] = rest;
        if cur[0] == "namespaces" && cur.len() > 1 {
            info.namespace = Some(cur[1].to_string());
            if cur.len() > 2 && !matches!(cur[2], "status" | "finalize") {
                cur = &cur[2..];
            }
        }
        info.is_resource_request = true;
        info.resource = cur[0].to_string();
        if cur.len() >= 2 {
            info.name = Some(cur[1].to_string());
        }
        if cur.len() >= 3 {
            info.subresource = Some(cur[2..].join("/"));
        }
        let watch = query.flag("watch");
        info.verb = match (method.clone(), info.name.is_some()) {
            (Method::GET | Method::HEAD, _) if watch => "watch",
            (Method::GET | Method::HEAD, true) => "get",
            (Method::GET | Method::HEAD, false) => "list",
            (Method::POST, _) => "create",
            (Method::PUT, _) => "update",
            (Method::PATCH, _) => "patch",
            (Method::DELETE, true) => "delete",
            (Method::DELETE, false) => "deletecollection",
            _ => "unknown",
        }
        .to_string();
        info
    }

    /// The namespace for store calls: `None` for the `namespaces` resource itself.
    pub fn store_namespace(&self) -> Option<&str> {
        if self.api_group.is_empty() && self.resource == "namespaces" {
            None
        } else {
            self.namespace.as_deref()
        }
    }
}

/// Decoded query parameters (last value wins, as Go's `url.Values.Get` returns the first;
/// duplicates are not meaningful for kube-apiserver's parameters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query(BTreeMap<String, String>);

impl Query {
    /// Parse a raw query string (`a=b&c=d`), percent-decoding keys and values.
    pub fn parse(raw: Option<&str>) -> Self {
        let mut map = BTreeMap::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.entry(percent_decode(k))
                .or_insert_with(|| percent_decode(v));
        }
        Self(map)
    }

    /// The value of `key`, if present and non-empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// `true` for `key=true`/`key=1`.
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True"))
    }

    /// The value of `key` parsed as a number.
    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.get(key).and_then(|v| v.parse().ok())
    }
}

/// Percent-decode a query component (`+` is a space, as in forms).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str, q: &str) -> RequestInfo {
        RequestInfo::parse(&method, path, &Query::parse(Some(q)))
    }

    #[test]
    fn namespaced_resource_paths() {
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/web", "");
        assert_eq!(i.verb, "get");
        assert_eq!(i.namespace.as_deref(), Some("default"));
        assert_eq!(i.resource, "pods");
        assert_eq!(i.name.as_deref(), Some("web"));
        let i = info(Method::GET, "/api/v1/namespaces/default/pods", "watch=true");
        assert_eq!(i.verb, "watch");
        let i = info(
            Method::POST,
            "/api/v1/namespaces/ns1/serviceaccounts/default/token",
            "",
        );
        assert_eq!(i.verb, "create");
        assert_eq!(i.subresource.as_deref(), Some("token"));
        let i = info(
            Method::DELETE,
            "/apis/spire.spiffe.io/v1alpha1/clusterspiffeids",
            "",
        );
        assert_eq!(i.verb, "deletecollection");
        assert_eq!(i.api_group, "spire.spiffe.io");
        assert_eq!(i.namespace, None);
    }

    #[test]
    fn namespaces_resource_itself() {
        let i = info(Method::GET, "/api/v1/namespaces/foo", "");
        assert_eq!(i.resource, "namespaces");
        assert_eq!(i.name.as_deref(), Some("foo"));
        assert_eq!(i.namespace.as_deref(), Some("foo"));
        assert_eq!(i.store_namespace(), None);
        let i = info(Method::PUT, "/api/v1/namespaces/foo/status", "");
        assert_eq!(i.resource, "namespaces");
        assert_eq!(i.subresource.as_deref(), Some("status"));
        let i = info(Method::GET, "/api/v1/namespaces", "");
        assert_eq!(i.verb, "list");
        assert_eq!(i.namespace, None);
    }

    #[test]
    fn non_resource_paths() {
        let i = info(Method::GET, "/apis/apps/v1", "");
        assert!(!i.is_resource_request);
        assert_eq!(i.verb, "get");
        let i = info(Method::GET, "/healthz", "");
        assert!(!i.is_resource_request);
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "labelSelector=app%3Dweb%2Ctier+in+(a%2Cb)&watch=1&limit=5&x=%zz",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a,b)"));
        assert!(q.flag("watch"));
        assert_eq!(q.number::<usize>("limit"), Some(5));
        assert_eq!(q.get("x"), Some("%zz"));
        assert_eq!(q.get("missing"), None);
    }
}
