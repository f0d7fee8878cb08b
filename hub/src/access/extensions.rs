//! The reserved `Cluster.extensions` entries of KEP-4322 (formerly KEP-5339) and the rules for profile-sourced
//! environment variables.

use std::collections::BTreeMap;

use serde_json::Value;

/// Passed to the plugin as `ExecCredential.spec.cluster.config` (the same JSON value, re-serialised).
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// Extra CLI arguments for the plugin (honoured only under the `Append` policy).
pub const ADDITIONAL_ARGS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// Extra environment variables for the plugin (honoured only under `AppendIfNotExists`/`Replace`).
pub const ADDITIONAL_ENVS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// How a deny-list rule matches a variable name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvPattern {
    /// This exact name (case-sensitive, as Linux compares names).
    Exact(&'static str),
    /// Every name starting with this (case-sensitive).
    Prefix(&'static str),
    /// Every name ending with this, in any case: Python's `urllib` lowercases every name
    /// before looking for `*_proxy`, so `Http_Proxy` counts too.
    SuffixAnyCase(&'static str),
}

impl EnvPattern {
    /// Whether `name` matches.
    pub fn matches(self, name: &str) -> bool {
        match self {
            EnvPattern::Exact(n) => name == n,
            EnvPattern::Prefix(p) => name.starts_with(p),
            EnvPattern::SuffixAnyCase(s) => {
                name.len() >= s.len()
                    && name.is_char_boundary(name.len() - s.len())
                    && name[name.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

impl std::fmt::Display for EnvPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvPattern::Exact(n) => f.write_str(n),
            EnvPattern::Prefix(p) => write!(f, "{p}*"),
            EnvPattern::SuffixAnyCase(s) => write!(f, "*{s} (any case)"),
        }
    }
}

/// The variables a ClusterProfile may never set through the additional-envs extension, by
/// why: whoever can write a profile's status must not be able to make the plugin (which runs
/// as the hub, with the hub's cloud identity) load or run other code, send its credentials
/// elsewhere, trust other certificates, or read another configuration. A provider's
/// `profileSourcedEnvVarsAllowList` narrows further; nothing can widen this list.
pub const FORBIDDEN_ENV: &[(&str, &[EnvPattern])] = {
    use EnvPattern::{Exact, Prefix, SuffixAnyCase};
    &[
        (
            "dynamic loader and C library",
            &[
                Prefix("LD_"),
                Prefix("DYLD_"),
                Prefix("GLIBC_"),
                Prefix("MALLOC_"),
                Exact("GCONV_PATH"),
                Exact("LOCPATH"),
                Exact("NLSPATH"),
                Exact("HOSTALIASES"),
                Exact("RESOLV_HOST_CONF"),
                Exact("LOCALDOMAIN"),
                Exact("RES_OPTIONS"),
            ],
        ),
        (
            "shell start-up and program lookup",
            &[
                Exact("PATH"),
                Exact("IFS"),
                Exact("ENV"),
                Exact("BASH_ENV"),
                Prefix("BASH_FUNC_"),
                Exact("SHELLOPTS"),
                Exact("BASHOPTS"),
                Exact("PS4"),
                Exact("PROMPT_COMMAND"),
                Exact("CDPATH"),
                Exact("GLOBIGNORE"),
                Exact("ZDOTDIR"),
                Exact("SHELL"),
            ],
        ),
        (
            "interpreter and runtime start-up",
            &[
                Prefix("PYTHON"),
                Prefix("PERL"),
                Prefix("RUBY"),
                Prefix("GEM_"),
                Prefix("BUNDLE_"),
                Prefix("NODE_"),
                Prefix("NPM_CONFIG_"),
                Prefix("npm_config_"),
                Prefix("JAVA_"),
                Prefix("_JAVA_"),
                Prefix("JDK_"),
                Exact("CLASSPATH"),
                Prefix("DOTNET_"),
                Prefix("CORECLR_"),
                Prefix("COMPlus_"),
                Prefix("LUA_"),
                Exact("PHPRC"),
                Exact("PHP_INI_SCAN_DIR"),
            ],
        ),
        (
            "programs a plugin may start",
            &[
                Exact("BROWSER"),
                Exact("EDITOR"),
                Exact("VISUAL"),
                Exact("PAGER"),
                Exact("LESSOPEN"),
                Exact("LESSCLOSE"),
                Prefix("GIT_"),
            ],
        ),
        (
            "TLS trust and key logging",
            &[
                Prefix("SSL_"),
                Exact("SSLKEYLOGFILE"),
                Prefix("OPENSSL_"),
                Prefix("CURL_"),
                Exact("REQUESTS_CA_BUNDLE"),
                Exact("AWS_CA_BUNDLE"),
                Exact("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"),
                Exact("GODEBUG"),
            ],
        ),
        ("proxies", &[SuffixAnyCase("_PROXY")]),
        (
            "home directory and configuration files",
            &[
                Exact("HOME"),
                Prefix("XDG_"),
                Exact("TMPDIR"),
                Exact("KUBECONFIG"),
                Exact("AWS_CONFIG_FILE"),
                Exact("AWS_SHARED_CREDENTIALS_FILE"),
                Exact("AZURE_CONFIG_DIR"),
                Prefix("CLOUDSDK_"),
                Exact("GOOGLE_APPLICATION_CREDENTIALS"),
                Exact("GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES"),
                Prefix("KRB5"),
            ],
        ),
        (
            "identity-provider and credential endpoints",
            &[
                Exact("AZURE_AUTHORITY_HOST"),
                Prefix("AWS_ENDPOINT_URL"),
                Prefix("AWS_CONTAINER_"),
                Prefix("AWS_EC2_METADATA_"),
            ],
        ),
        (
            "the exec protocol and in-cluster configuration",
            &[Prefix("KUBERNETES_")],
        ),
        (
            "kleym's own settings, and the spoke the hub runs the plugin for",
            &[Prefix("KLEYM_")],
        ),
    ]
};

/// The deny-list rule `name` matches, with the reason of its group; `None` when a profile may
/// set it (subject to the provider's allow list).
pub fn forbidden_env_rule(name: &str) -> Option<(EnvPattern, &'static str)> {
    FORBIDDEN_ENV.iter().find_map(|(why, patterns)| {
        patterns
            .iter()
            .find(|p| p.matches(name))
            .map(|p| (*p, *why))
    })
}

/// Whether a profile-sourced variable name is on the deny list ([`FORBIDDEN_ENV`]).
pub fn is_forbidden_env_name(name: &str) -> bool {
    forbidden_env_rule(name).is_some()
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
            let parsed: Value = kleym_api::yaml::from_str(text)
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
            owned = kleym_api::yaml::from_str::<Value>(text)
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
    fn deny_list_is_case_sensitive_except_proxies() {
        for n in [
            "LD_PRELOAD",
            "DYLD_INSERT_LIBRARIES",
            "PATH",
            "PYTHONWARNINGS",
            "BROWSER",
            "HTTPS_PROXY",
            "https_proxy",
            "Http_Proxy",
            "NO_PROXY",
            "npm_config_userconfig",
            "KUBERNETES_SERVICE_HOST",
            "KLEYM_CLUSTER_AUDIENCE",
            "KLEYM_TRUST_DOMAIN",
        ] {
            assert!(is_forbidden_env_name(n), "{n}");
        }
        // Linux compares names case-sensitively: these are not the loader's variables.
        for n in [
            "ld_preload",
            "path",
            "CLIENT_ID",
            "TENANT_ID",
            "AZURE_CLIENT_ID",
            "LDAP_URL",
            "PROXY",
            "NODEJS",
        ] {
            assert!(!is_forbidden_env_name(n), "{n}");
        }
        let (pattern, why) = forbidden_env_rule("PERL5DB").unwrap();
        assert_eq!(pattern.to_string(), "PERL*");
        assert_eq!(why, "interpreter and runtime start-up");
    }
}
