//! The reserved `Cluster.extensions` entries of KEP-5339 and the rules for profile-sourced
//! environment variables.

use std::collections::BTreeMap;

use serde_json::Value;

/// Passed through verbatim as `ExecCredential.spec.cluster.config`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// Extra CLI arguments for the plugin (honoured only under the `Append` policy).
pub const ADDITIONAL_ARGS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// Extra environment variables for the plugin (honoured only under `AppendIfNotExists`/`Replace`).
pub const ADDITIONAL_ENVS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// Exact variable names a ClusterProfile may never set: they change which code the plugin
/// process loads or runs (dynamic loader, shells, interpreters, program lookup) or would
/// overwrite the exec protocol's own input.
pub const FORBIDDEN_ENV_NAMES: &[&str] = &[
    "PATH",
    "KUBERNETES_EXEC_INFO",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_CHECK_",
    "HOSTALIASES",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PERL5LIB",
    "PERL5OPT",
    "PERLLIB",
    "RUBYLIB",
    "RUBYOPT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
];

/// Name prefixes a ClusterProfile may never set: the glibc/musl dynamic loader (`LD_PRELOAD`,
/// `LD_LIBRARY_PATH`, `LD_AUDIT`, …) and the macOS one (`DYLD_INSERT_LIBRARIES`, …).
pub const FORBIDDEN_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_"];

/// Whether a profile-sourced variable name is refused (compared case-insensitively, so that
/// `ld_preload` cannot slip through on a platform that folds case).
pub fn is_forbidden_env_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    FORBIDDEN_ENV_NAMES.contains(&upper.as_str())
        || FORBIDDEN_ENV_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// Parses the additional-args payload. Accepted forms:
/// - a list of strings (the KEP's form);
/// - an object `{"args": [...]}` (what the upstream CRD, whose `extension` schema is
///   `type: object`, can actually store);
/// - a string holding a YAML or JSON list (raw YAML bytes, as the Go library reads them).
pub fn parse_additional_args(payload: &Value) -> Result<Vec<String>, String> {
    match payload {
        Value::Array(items) => string_list(items),
        Value::Object(map) => match map.get("args") {
            Some(Value::Array(items)) if map.len() == 1 => string_list(items),
            Some(_) if map.len() == 1 => Err("\"args\" must be a list of strings".into()),
            _ => Err(
                "object payload must have exactly one key, \"args\", holding a list of strings"
                    .into(),
            ),
        },
        Value::String(text) => {
            let parsed: Value = serde_yaml_ng::from_str(text)
                .map_err(|e| format!("string payload is not a YAML list: {e}"))?;
            match parsed {
                Value::Array(items) => string_list(&items),
                _ => Err("string payload must hold a YAML list of strings".into()),
            }
        }
        _ => Err("payload must be a list of strings or {\"args\": [...]}".into()),
    }
}

fn string_list(items: &[Value]) -> Result<Vec<String>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if !s.contains('\0') => Ok(s.clone()),
            Value::String(_) => Err(format!("item {i} contains NUL")),
            _ => Err(format!("item {i} is not a string")),
        })
        .collect()
}

/// Parses the additional-envs payload: a string map (or a string holding a YAML map). Scalar
/// numbers and booleans are taken as their text, as YAML decoding into `map[string]string`
/// does in the Go library. The result is sorted by name, so merging is deterministic.
pub fn parse_additional_envs(payload: &Value) -> Result<BTreeMap<String, String>, String> {
    let owned;
    let map = match payload {
        Value::Object(map) => map,
        Value::String(text) => {
            owned = serde_yaml_ng::from_str::<Value>(text)
                .map_err(|e| format!("string payload is not a YAML map: {e}"))?;
            match &owned {
                Value::Object(map) => map,
                _ => return Err("string payload must hold a YAML map of strings".into()),
            }
        }
        _ => return Err("payload must be a map of variable names to string values".into()),
    };
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let value = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(format!("value of {k:?} is not a string")),
        };
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(format!("invalid variable name {k:?}"));
        }
        if value.contains('\0') {
            return Err(format!("value of {k:?} contains NUL"));
        }
        out.insert(k.clone(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn args_payload_forms() {
        let want = vec!["-audience".to_string(), "https://x".to_string()];
        assert_eq!(
            parse_additional_args(&json!(["-audience", "https://x"])).unwrap(),
            want
        );
        assert_eq!(
            parse_additional_args(&json!({"args": ["-audience", "https://x"]})).unwrap(),
            want
        );
        assert_eq!(
            parse_additional_args(&json!("- -audience\n- https://x\n")).unwrap(),
            want
        );
        assert!(parse_additional_args(&json!([1])).is_err());
        assert!(parse_additional_args(&json!({"args": "x"})).is_err());
        assert!(parse_additional_args(&json!({"other": []})).is_err());
        assert!(parse_additional_args(&json!(3)).is_err());
    }

    #[test]
    fn envs_payload_forms() {
        let m = parse_additional_envs(&json!({"B": "2", "A": 1, "C": true})).unwrap();
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "2".into()),
                ("C".into(), "true".into())
            ]
        );
        assert!(parse_additional_envs(&json!(["A"])).is_err());
        assert!(parse_additional_envs(&json!({"A": {"x": 1}})).is_err());
        assert!(parse_additional_envs(&json!({"A=B": "x"})).is_err());
    }

    #[test]
    fn loader_variables_are_forbidden() {
        for n in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "ld_preload",
            "DYLD_INSERT_LIBRARIES",
            "PATH",
            "BASH_ENV",
        ] {
            assert!(is_forbidden_env_name(n), "{n}");
        }
        for n in ["CLIENT_ID", "TENANT_ID", "HOME", "LDAP_URL"] {
            assert!(!is_forbidden_env_name(n), "{n}");
        }
    }
}
