//! The part of Go's `text/template` that ClusterSPIFFEID templates use in practice: literal
//! text and `{{ .Field.Field }}` actions (with `{{-`/`-}}` trimming) over the data SPIRE
//! Controller Manager passes (`.TrustDomain`, `.ClusterName`, `.ClusterDomain`, `.PodMeta`,
//! `.PodSpec`, `.NodeMeta`, `.NodeSpec`). Anything else (pipelines, functions, `if`,
//! `range`, variables) is refused by name rather than guessed at, so an explanation never
//! shows a rendering SPIRE would not produce.

use serde_json::Value;

/// Why a template could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoTemplateError {
    /// `{{` without a closing `}}`.
    #[error("unclosed action starting at byte {0}")]
    Unclosed(usize),
    /// Syntax kleym does not evaluate (SPIRE may accept it).
    #[error(
        "unsupported template syntax {0:?}: kleym explains only field access like {{{{ .PodMeta.Name }}}}"
    )]
    Unsupported(String),
    /// A field the Go type does not have: SPIRE fails the same way at render time.
    #[error("can't evaluate field {field} in {path}")]
    NoField {
        /// The field asked for.
        field: String,
        /// The path up to it.
        path: String,
    },
    /// `.PodMeta` or `.PodSpec` in a parent ID template: SPIRE Controller Manager renders
    /// the parent before it sets the pod's data, and Go fails on the nil pointer.
    #[error(
        "nil pointer evaluating {0}: the parent ID template is rendered without the pod's data"
    )]
    NilPointer(String),
    /// The value is a struct or list, which Go would print in its own `%v` format.
    #[error(
        "{0} is not a scalar value; kleym does not reproduce Go's formatting of structs and lists"
    )]
    NotScalar(String),
}

/// The data a ClusterSPIFFEID template sees for one pod.
#[derive(Debug, Clone, Copy)]
pub struct TemplateData<'a> {
    /// `.TrustDomain`.
    pub trust_domain: &'a str,
    /// `.ClusterName`.
    pub cluster_name: &'a str,
    /// `.ClusterDomain`.
    pub cluster_domain: &'a str,
    /// `.PodMeta`: the pod's `metadata` as JSON.
    pub pod_meta: &'a Value,
    /// `.PodSpec`: the pod's `spec` as JSON.
    pub pod_spec: &'a Value,
    /// `.NodeMeta`: the node's `metadata` as JSON.
    pub node_meta: &'a Value,
    /// `.NodeSpec`: the node's `spec` as JSON.
    pub node_spec: &'a Value,
}

/// Fields of `metav1.ObjectMeta` (Go names): a name outside this list fails as in Go.
const OBJECT_META_FIELDS: [&str; 15] = [
    "Name",
    "GenerateName",
    "Namespace",
    "SelfLink",
    "UID",
    "ResourceVersion",
    "Generation",
    "CreationTimestamp",
    "DeletionTimestamp",
    "DeletionGracePeriodSeconds",
    "Labels",
    "Annotations",
    "OwnerReferences",
    "Finalizers",
    "ManagedFields",
];

/// Go fields of type `map[string]string` reachable from the data: after them a name is a
/// map key, used as written (a missing key renders `<no value>`, as Go's default does).
const MAP_FIELDS: [&str; 3] = ["Labels", "Annotations", "NodeSelector"];

/// Render `template` with `data`.
pub fn render(template: &str, data: &TemplateData<'_>) -> Result<String, GoTemplateError> {
    render_with(template, |action| evaluate(action, data))
}

/// Render a parent ID template (the manager's `parentIDTemplate`): the same data as
/// [`render`] without the pod's, which SPIRE Controller Manager sets only after it rendered
/// the parent (`renderPodEntry` in `pkg/spireentry/entries.go`).
pub fn render_without_pod(
    template: &str,
    data: &TemplateData<'_>,
) -> Result<String, GoTemplateError> {
    render_with(template, |action| {
        let root = action
            .strip_prefix('.')
            .and_then(|p| p.split('.').next())
            .unwrap_or_default();
        if matches!(root, "PodMeta" | "PodSpec") {
            return Err(GoTemplateError::NilPointer(action.to_string()));
        }
        evaluate(action, data)
    })
}

/// Render `template`, each action's text (trimmed, such as `.PodMeta.Name`) evaluated by
/// `eval`: the same parsing and trimming as [`render`], over other data.
pub fn render_with(
    template: &str,
    mut eval: impl FnMut(&str) -> Result<String, GoTemplateError>,
) -> Result<String, GoTemplateError> {
    let mut out = String::new();
    let mut rest = template;
    let mut offset = 0usize;
    while let Some(start) = rest.find("{{") {
        let mut text = &rest[..start];
        let after_open = &rest[start + 2..];
        let (trim_left, body_start) = match after_open.strip_prefix("- ") {
            Some(_) => (true, 2),
            None => (false, 0),
        };
        if trim_left {
            text = text.trim_end();
        }
        out.push_str(text);
        let inner = &after_open[body_start..];
        let end = inner
            .find("}}")
            .ok_or(GoTemplateError::Unclosed(offset + start))?;
        let mut action = &inner[..end];
        let trim_right = action.ends_with(" -");
        if trim_right {
            action = &action[..action.len() - 2];
        }
        out.push_str(&eval(action.trim())?);
        let consumed = start + 2 + body_start + end + 2;
        offset += consumed;
        rest = &rest[consumed..];
        if trim_right {
            let trimmed = rest.trim_start();
            offset += rest.len() - trimmed.len();
            rest = trimmed;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn evaluate(action: &str, data: &TemplateData<'_>) -> Result<String, GoTemplateError> {
    let unsupported = || GoTemplateError::Unsupported(action.to_string());
    let path = action.strip_prefix('.').ok_or_else(unsupported)?;
    if path.is_empty()
        || !path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' || c == '/')
    {
        return Err(unsupported());
    }
    let mut parts = path.split('.');
    let root = parts.next().unwrap_or_default();
    let (mut value, is_meta): (&Value, bool) = match root {
        "TrustDomain" => return scalar_rest(data.trust_domain, parts, root),
        "ClusterName" => return scalar_rest(data.cluster_name, parts, root),
        "ClusterDomain" => return scalar_rest(data.cluster_domain, parts, root),
        "PodMeta" => (data.pod_meta, true),
        "PodSpec" => (data.pod_spec, false),
        "NodeMeta" => (data.node_meta, true),
        "NodeSpec" => (data.node_spec, false),
        other => {
            return Err(GoTemplateError::NoField {
                field: other.to_string(),
                path: ".".to_string(),
            });
        }
    };
    let mut walked = format!(".{root}");
    let mut in_map = false;
    let mut first = true;
    let null = Value::Null;
    for part in parts {
        if part.is_empty() {
            return Err(unsupported());
        }
        if in_map {
            // A map value is a string: going further is a field access on a string.
            match value.get(part) {
                Some(v) => value = v,
                None => return Ok("<no value>".to_string()),
            }
            in_map = false;
            walked = format!("{walked}.{part}");
            continue;
        }
        if !part.starts_with(|c: char| c.is_ascii_uppercase()) {
            return Err(GoTemplateError::NoField {
                field: part.to_string(),
                path: walked,
            });
        }
        if first && is_meta && !OBJECT_META_FIELDS.contains(&part) {
            return Err(GoTemplateError::NoField {
                field: part.to_string(),
                path: walked,
            });
        }
        if !value.is_object() && !value.is_null() {
            return Err(GoTemplateError::NoField {
                field: part.to_string(),
                path: walked,
            });
        }
        in_map = MAP_FIELDS.contains(&part);
        // An absent field is Go's zero value: kube omits empty fields from JSON.
        value = value.get(json_name(part)).unwrap_or(&null);
        walked = format!("{walked}.{part}");
        first = false;
    }
    if in_map {
        return Err(GoTemplateError::NotScalar(walked));
    }
    match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Array(_) | Value::Object(_) => Err(GoTemplateError::NotScalar(walked)),
    }
}

fn scalar_rest<'a>(
    value: &str,
    mut rest: impl Iterator<Item = &'a str>,
    root: &str,
) -> Result<String, GoTemplateError> {
    match rest.next() {
        None => Ok(value.to_string()),
        Some(field) => Err(GoTemplateError::NoField {
            field: field.to_string(),
            path: format!(".{root}"),
        }),
    }
}

/// The JSON name Kubernetes gives a Go field: the leading capitals lowercased (`UID` →
/// `uid`, `DNSPolicy` → `dnsPolicy`, `ServiceAccountName` → `serviceAccountName`).
fn json_name(go: &str) -> String {
    let chars: Vec<char> = go.chars().collect();
    let run = chars.iter().take_while(|c| c.is_ascii_uppercase()).count();
    let lower_upto = if run == chars.len() || run <= 1 {
        run
    } else {
        run - 1
    };
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i < lower_upto {
                c.to_ascii_lowercase()
            } else {
                *c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with<T>(f: impl FnOnce(&TemplateData<'_>) -> T) -> T {
        let pod_meta = json!({"name": "p", "namespace": "ns", "uid": "u-1",
            "labels": {"app": "a", "k8s.io/x": "y"}});
        let pod_spec = json!({"serviceAccountName": "sa", "nodeName": "n1", "dnsPolicy": "X"});
        let node_meta = json!({"name": "n1", "uid": "nu"});
        let node_spec = json!({"podCIDR": "10.0.0.0/24"});
        f(&TemplateData {
            trust_domain: "example.org",
            cluster_name: "c1",
            cluster_domain: "cluster.local",
            pod_meta: &pod_meta,
            pod_spec: &pod_spec,
            node_meta: &node_meta,
            node_spec: &node_spec,
        })
    }

    #[test]
    fn field_access_renders_like_go() {
        let cases = [
            (
                "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}",
                "spiffe://example.org/ns/ns/sa/sa",
            ),
            ("{{.PodMeta.UID}}", "u-1"),
            ("{{ .PodMeta.Labels.app }}", "a"),
            ("{{ .PodMeta.Labels.missing }}", "<no value>"),
            (
                "{{ .PodSpec.DNSPolicy }}/{{ .NodeSpec.PodCIDR }}",
                "X/10.0.0.0/24",
            ),
            (
                "{{ .NodeMeta.UID }}:{{ .ClusterName }}.{{ .ClusterDomain }}",
                "nu:c1.cluster.local",
            ),
            ("a {{- .PodMeta.Name -}} b", "apb"),
            ("{{ .PodSpec.Hostname }}", ""),
            ("no actions", "no actions"),
        ];
        for (template, want) in cases {
            assert_eq!(
                with(|d| render(template, d)),
                Ok(want.to_string()),
                "{template}"
            );
        }
    }

    #[test]
    fn unsupported_syntax_and_bad_fields_fail_clearly() {
        type Check = fn(&GoTemplateError) -> bool;
        let cases: [(&str, Check); 7] = [
            ("{{ printf \"%s\" .PodMeta.Name }}", |e| {
                matches!(e, GoTemplateError::Unsupported(_))
            }),
            ("{{ if .PodMeta.Name }}x{{ end }}", |e| {
                matches!(e, GoTemplateError::Unsupported(_))
            }),
            ("{{ .PodMeta.Name | lower }}", |e| {
                matches!(e, GoTemplateError::Unsupported(_))
            }),
            ("{{ .PodMeta.Nmae }}", |e| {
                matches!(e, GoTemplateError::NoField { .. })
            }),
            ("{{ .Pod.Name }}", |e| {
                matches!(e, GoTemplateError::NoField { .. })
            }),
            ("{{ .PodMeta.Labels }}", |e| {
                matches!(e, GoTemplateError::NotScalar(_))
            }),
            ("{{ .PodMeta.Name ", |e| {
                matches!(e, GoTemplateError::Unclosed(0))
            }),
        ];
        for (template, check) in cases {
            let err = with(|d| render(template, d)).expect_err(template);
            assert!(check(&err), "{template}: {err}");
        }
    }

    #[test]
    fn json_names_follow_kubernetes_conventions() {
        for (go, json) in [
            ("UID", "uid"),
            ("ServiceAccountName", "serviceAccountName"),
            ("DNSPolicy", "dnsPolicy"),
            ("PodCIDR", "podCIDR"),
            ("NodeName", "nodeName"),
        ] {
            assert_eq!(json_name(go), json);
        }
    }
}
