//! Request attributes from an HTTP request, as kube-apiserver's `RequestInfoFactory`
//! (`apiserver/pkg/endpoints/request/requestinfo.go`).

use super::RequestAttributes;
use crate::UserInfo;

/// Namespace subresources that are not resources of their own (`/namespaces/x/status`).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl RequestAttributes {
    /// Derives the attributes of an HTTP request from its method, path and query string.
    ///
    /// - `/api/<v>/...` and `/apis/<group>/<v>/...` are resource requests; everything else
    ///   (including `/api`, `/apis`, `/apis/<group>`, `/apis/<group>/<v>` discovery) is a
    ///   non-resource request whose verb is the lowercase method.
    /// - verbs: `POST` create, `GET`/`HEAD` get (list without a name; watch with
    ///   `watch=true|1` or a `/watch/` prefix), `PUT` update, `PATCH` patch, `DELETE` delete
    ///   (deletecollection without a name).
    /// - `/namespaces/<ns>/<resource>/<name>/<subresource>`; a list filtered by
    ///   `fieldSelector=metadata.name=<n>` is authorized for name `<n>`.
    pub fn from_http(user: UserInfo, method: &str, path: &str, query: Option<&str>) -> Self {
        let mut attrs = RequestAttributes {
            user,
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
            ..Default::default()
        };
        let parts: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return attrs;
        }
        let mut rest = &parts[1..];
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return attrs;
            }
            attrs.api_group = rest[0].to_string();
            rest = &rest[1..];
        }
        attrs.resource_request = true;
        attrs.api_version = rest[0].to_string();
        rest = &rest[1..];

        if matches!(rest.first(), Some(&"watch") | Some(&"proxy")) {
            if rest.len() < 2 {
                // kube answers this with an error; nothing here can be authorized.
                attrs.resource_request = false;
                return attrs;
            }
            attrs.verb = rest[0].to_string();
            rest = &rest[1..];
        } else {
            attrs.verb = match method.to_ascii_uppercase().as_str() {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            }
            .to_string();
        }

        if rest.first() == Some(&"namespaces")
            && let Some(ns) = rest.get(1)
        {
            attrs.namespace = ns.to_string();
            if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
                rest = &rest[2..];
            }
        }
        if rest.len() >= 3 && attrs.verb != "proxy" {
            attrs.subresource = rest[2].to_string();
        }
        if rest.len() >= 2 {
            attrs.name = rest[1].to_string();
        }
        if let Some(resource) = rest.first() {
            attrs.resource = resource.to_string();
        }

        let params = query_params(query.unwrap_or_default());
        if attrs.name.is_empty() && attrs.verb == "get" {
            let watch = params
                .iter()
                .any(|(k, v)| k == "watch" && matches!(v.as_str(), "true" | "1"));
            attrs.verb = if watch { "watch" } else { "list" }.to_string();
            if let Some(name) = params
                .iter()
                .find(|(k, _)| k == "fieldSelector")
                .and_then(|(_, v)| exact_name(v))
            {
                attrs.name = name;
            }
        }
        if attrs.name.is_empty() && attrs.verb == "delete" {
            attrs.verb = "deletecollection".to_string();
        }
        attrs
    }
}

/// The name a field selector pins with `metadata.name=<n>` / `metadata.name==<n>`, if that is
/// its only requirement on `metadata.name` and the name is a valid path segment.
fn exact_name(selector: &str) -> Option<String> {
    let mut found = None;
    for term in selector.split(',') {
        let term = term.trim();
        if let Some(rest) = term.strip_prefix("metadata.name") {
            let value = rest.strip_prefix("==").or_else(|| rest.strip_prefix('='))?;
            if value.starts_with('=') || found.is_some() {
                return None;
            }
            found = Some(value.to_string());
        }
    }
    found.filter(|n| !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '%']))
}

/// Decoded `key=value` pairs of a query string.
fn query_params(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, path: &str, query: Option<&str>) -> RequestAttributes {
        RequestAttributes::from_http(UserInfo::default(), method, path, query)
    }

    /// (resource_request, verb, group, resource, subresource, namespace, name)
    type Expected<'a> = (bool, &'a str, &'a str, &'a str, &'a str, &'a str, &'a str);

    #[test]
    fn request_info_table() {
        // (method, path, query) -> (resource_request, verb, group, resource, sub, ns, name)
        let cases: &[(&str, &str, Option<&str>, Expected)] = &[
            ("GET", "/version", None, (false, "get", "", "", "", "", "")),
            ("GET", "/apis", None, (false, "get", "", "", "", "", "")),
            ("GET", "/api/v1", None, (false, "get", "", "", "", "", "")),
            (
                "GET",
                "/apis/apps/v1",
                None,
                (false, "get", "", "", "", "", ""),
            ),
            (
                "GET",
                "/api/v1/pods",
                None,
                (true, "list", "", "pods", "", "", ""),
            ),
            (
                "GET",
                "/api/v1/pods",
                Some("watch=true"),
                (true, "watch", "", "pods", "", "", ""),
            ),
            (
                "GET",
                "/api/v1/watch/namespaces/d/pods",
                None,
                (true, "watch", "", "pods", "", "d", ""),
            ),
            (
                "GET",
                "/api/v1/namespaces/d/pods/web",
                None,
                (true, "get", "", "pods", "", "d", "web"),
            ),
            (
                "PUT",
                "/api/v1/namespaces/d/pods/web/status",
                None,
                (true, "update", "", "pods", "status", "d", "web"),
            ),
            (
                "POST",
                "/api/v1/namespaces/kleym/serviceaccounts/hub/token",
                None,
                (
                    true,
                    "create",
                    "",
                    "serviceaccounts",
                    "token",
                    "kleym",
                    "hub",
                ),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/d/pods",
                None,
                (true, "deletecollection", "", "pods", "", "d", ""),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/d/pods/x",
                None,
                (true, "delete", "", "pods", "", "d", "x"),
            ),
            (
                "GET",
                "/api/v1/namespaces/d",
                None,
                (true, "get", "", "namespaces", "", "d", "d"),
            ),
            (
                "PUT",
                "/api/v1/namespaces/d/finalize",
                None,
                (true, "update", "", "namespaces", "finalize", "d", "d"),
            ),
            (
                "GET",
                "/api/v1/namespaces",
                None,
                (true, "list", "", "namespaces", "", "", ""),
            ),
            (
                "PATCH",
                "/apis/spire.spiffe.io/v1alpha1/clusterspiffeids/x",
                Some("fieldManager=kleym"),
                (
                    true,
                    "patch",
                    "spire.spiffe.io",
                    "clusterspiffeids",
                    "",
                    "",
                    "x",
                ),
            ),
            (
                "GET",
                "/apis/kleym.io/v1alpha1/namespaces/a/inferenceidentitybindings",
                Some("fieldSelector=metadata.name%3Dweb"),
                (
                    true,
                    "list",
                    "kleym.io",
                    "inferenceidentitybindings",
                    "",
                    "a",
                    "web",
                ),
            ),
            (
                "GET",
                "/apis/kleym.io/v1alpha1/inferenceidentitybindings",
                Some("watch=1&fieldSelector=metadata.name%3D%3Dweb"),
                (
                    true,
                    "watch",
                    "kleym.io",
                    "inferenceidentitybindings",
                    "",
                    "",
                    "web",
                ),
            ),
            (
                "GET",
                "/api/v1/pods",
                Some("fieldSelector=metadata.name!%3Dweb"),
                (true, "list", "", "pods", "", "", ""),
            ),
            (
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                None,
                (
                    true,
                    "create",
                    "authorization.k8s.io",
                    "selfsubjectaccessreviews",
                    "",
                    "",
                    "",
                ),
            ),
        ];
        for (method, path, query, want) in cases {
            let a = attrs(method, path, *query);
            let got = (
                a.resource_request,
                a.verb.as_str(),
                a.api_group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str(),
                a.name.as_str(),
            );
            assert_eq!(got, *want, "{method} {path} {query:?}");
            assert_eq!(a.path, *path);
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%3Db+c%"), "a=b c%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
