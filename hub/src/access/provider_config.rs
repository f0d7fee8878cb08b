//! The hub's access-provider configuration: the Go reference library's provider file
//! (`--clusterprofile-provider-file`, JSON or YAML) and the repeated
//! `--clusterprofile-access-provider "name=/path/plugin --flag v"` flag (KEP-5339).
//!
//! Precedence: the file's providers come first, in file order; each flag either replaces the
//! file provider of the same name *in its position* or, for a new name, is appended after the
//! file providers in flag order. Order matters: the first configured provider that a
//! ClusterProfile offers is chosen.

use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::shell_words;

/// `client.authentication.k8s.io/v1`.
pub const EXEC_API_V1: &str = "client.authentication.k8s.io/v1";
/// `client.authentication.k8s.io/v1beta1`.
pub const EXEC_API_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// The ExecCredential API version a plugin speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExecApiVersion {
    /// `client.authentication.k8s.io/v1`
    #[serde(rename = "client.authentication.k8s.io/v1")]
    V1,
    /// `client.authentication.k8s.io/v1beta1`
    #[serde(rename = "client.authentication.k8s.io/v1beta1")]
    V1Beta1,
}

impl ExecApiVersion {
    /// The `apiVersion` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecApiVersion::V1 => EXEC_API_V1,
            ExecApiVersion::V1Beta1 => EXEC_API_V1BETA1,
        }
    }

    /// Parses an `apiVersion` string; `None` for anything but the two supported versions.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            EXEC_API_V1 => Some(ExecApiVersion::V1),
            EXEC_API_V1BETA1 => Some(ExecApiVersion::V1Beta1),
            _ => None,
        }
    }
}

/// What to do with the `clusterprofiles.multicluster.x-k8s.io/exec/additional-args` extension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CliArgsPolicy {
    /// Ignore the extension (default; also what an empty string means).
    #[default]
    Ignore,
    /// Append the profile's arguments after the configured ones.
    Append,
}

/// What to do with the `clusterprofiles.multicluster.x-k8s.io/exec/additional-envs` extension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EnvVarsPolicy {
    /// Ignore the extension (default; also what an empty string means).
    #[default]
    Ignore,
    /// Add profile variables whose names the provider config does not set.
    AppendIfNotExists,
    /// Add profile variables; on a name clash the profile's value wins.
    Replace,
}

/// One environment variable for a plugin. Its `Debug` hides the value (provider env can hold
/// secrets such as `AWS_SECRET_ACCESS_KEY`): it shows the name, the length and a short hash.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Variable value.
    pub value: String,
}

impl std::fmt::Debug for EnvVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_env(f, "EnvVar", &self.name, Some(&self.value))
    }
}

/// `Name { name, value: <N chars, sha256:xxxxxxxx> }`, never the value itself.
fn debug_env(
    f: &mut std::fmt::Formatter<'_>,
    type_name: &str,
    name: &dyn std::fmt::Debug,
    value: Option<&str>,
) -> std::fmt::Result {
    use sha2::{Digest, Sha256};
    let hidden = value.map(|v| {
        let digest = Sha256::digest(v.as_bytes());
        format!(
            "<{} chars, sha256:{}>",
            v.chars().count(),
            hex::encode(&digest[..4])
        )
    });
    f.debug_struct(type_name)
        .field("name", name)
        .field(
            "value",
            &format_args!("{}", hidden.as_deref().unwrap_or("None")),
        )
        .finish()
}

/// A validated exec configuration (client-go's `ExecConfig`, minus the interactive parts:
/// the hub never runs plugins interactively, so `interactiveMode` is forced to `Never`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ExecConfig {
    /// ExecCredential version the plugin speaks.
    pub api_version: ExecApiVersion,
    /// The executable (path or a name looked up on `PATH`).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment set on top of the hub's own environment.
    pub env: Vec<EnvVar>,
    /// Whether `KUBERNETES_EXEC_INFO` carries `spec.cluster`.
    pub provide_cluster_info: bool,
    /// Shown in errors when the command is not found.
    pub install_hint: Option<String>,
}

/// One validated access provider.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ProviderConfig {
    /// Provider name, matched against `status.accessProviders[].name`.
    pub name: String,
    /// How to run the plugin.
    pub exec: ExecConfig,
    /// Policy for profile-sourced CLI arguments.
    pub cli_args_policy: CliArgsPolicy,
    /// Policy for profile-sourced environment variables.
    pub env_vars_policy: EnvVarsPolicy,
}

/// The validated, ordered set of access providers the hub knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ProviderSet {
    providers: Vec<ProviderConfig>,
}

impl ProviderSet {
    /// Builds a set from already-validated providers; duplicate names are refused.
    pub fn new(providers: Vec<ProviderConfig>) -> Result<Self, ProviderConfigError> {
        for (i, p) in providers.iter().enumerate() {
            if providers[..i].iter().any(|q| q.name == p.name) {
                return Err(ProviderConfigError::Duplicate {
                    provider: p.name.clone(),
                    source_kind: "provider list",
                });
            }
        }
        Ok(Self { providers })
    }

    /// Providers in precedence order.
    pub fn providers(&self) -> &[ProviderConfig] {
        &self.providers
    }

    /// The provider with this name.
    pub fn get(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// True when no provider is configured.
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// Loads the provider file (if any) and the flag values, validates them and merges them
    /// with the precedence described in the module documentation.
    pub fn load(file: Option<&Path>, flags: &[String]) -> Result<Self, ProviderConfigError> {
        let mut providers = match file {
            Some(path) => parse_provider_file(path)?,
            None => Vec::new(),
        };
        let mut seen_flags: Vec<String> = Vec::new();
        for flag in flags {
            let p = parse_provider_flag(flag)?;
            if seen_flags.contains(&p.name) {
                return Err(ProviderConfigError::Duplicate {
                    provider: p.name,
                    source_kind: "--clusterprofile-access-provider flags",
                });
            }
            seen_flags.push(p.name.clone());
            match providers.iter_mut().find(|q| q.name == p.name) {
                Some(slot) => *slot = p,
                None => providers.push(p),
            }
        }
        Ok(Self { providers })
    }
}

/// Why the provider configuration was refused. Every variant names the provider (when known)
/// and the offending field.
#[derive(Debug, Error)]
pub enum ProviderConfigError {
    /// The provider file could not be read.
    #[error("failed to read access config file {path}: {source}")]
    Read {
        /// File path.
        path: String,
        /// I/O error.
        source: std::io::Error,
    },
    /// The provider file is neither valid JSON nor valid YAML of the expected shape.
    #[error("failed to unmarshal access providers from {path}: {detail}")]
    Parse {
        /// File path.
        path: String,
        /// Parser message.
        detail: String,
    },
    /// Two providers share a name.
    #[error("duplicate access provider {provider:?} in {source_kind}")]
    Duplicate {
        /// Provider name.
        provider: String,
        /// Where the duplicate was found.
        source_kind: &'static str,
    },
    /// A field has an invalid value.
    #[error("access provider {provider:?}: field {field}: {reason}")]
    Invalid {
        /// Provider name (`providers[<index>]` when the name itself is missing).
        provider: String,
        /// The field, in the file's spelling.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A `--clusterprofile-access-provider` value is malformed.
    #[error("invalid --clusterprofile-access-provider {value:?}: {reason}")]
    Flag {
        /// The flag value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Reads and validates a provider file (JSON, or YAML as an extension of the Go format).
pub fn parse_provider_file(path: &Path) -> Result<Vec<ProviderConfig>, ProviderConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProviderConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_provider_document(&text).map_err(|e| match e {
        ProviderConfigError::Parse { detail, .. } => ProviderConfigError::Parse {
            path: path.display().to_string(),
            detail,
        },
        other => other,
    })
}

/// Parses and validates provider-file content. JSON is tried first (the reference format);
/// YAML is accepted as well. `{}` is an empty configuration.
pub fn parse_provider_document(text: &str) -> Result<Vec<ProviderConfig>, ProviderConfigError> {
    let raw: RawProviderFile = match serde_json::from_str(text) {
        Ok(raw) => raw,
        Err(json_err) => {
            serde_yaml_ng::from_str(text).map_err(|yaml_err| ProviderConfigError::Parse {
                path: String::new(),
                detail: format!("not JSON ({json_err}) nor YAML ({yaml_err})"),
            })?
        }
    };
    let mut out: Vec<ProviderConfig> = Vec::new();
    for (index, rp) in raw.providers.unwrap_or_default().into_iter().enumerate() {
        let p = validate_raw_provider(index, rp)?;
        if out.iter().any(|q| q.name == p.name) {
            return Err(ProviderConfigError::Duplicate {
                provider: p.name,
                source_kind: "provider file",
            });
        }
        out.push(p);
    }
    Ok(out)
}

/// Parses one `--clusterprofile-access-provider` value: `name=<command> [args...]`, where
/// the part after `=` is split into words like a POSIX shell would (see
/// [`shell_words`](super::shell_words)); the whole part may also be wrapped in one pair
/// of quotes, as in the KEP's `google='/usr/bin/plugin --flag1 value1'`.
///
/// Flag-defined providers use `apiVersion: client.authentication.k8s.io/v1`,
/// `provideClusterInfo: true` and the `Ignore` policies; use the provider file for anything
/// else.
pub fn parse_provider_flag(value: &str) -> Result<ProviderConfig, ProviderConfigError> {
    let flag_err = |reason: &str| ProviderConfigError::Flag {
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let (name, rest) = value
        .split_once('=')
        .ok_or_else(|| flag_err("expected name=<command> [args...]"))?;
    let name = name.trim();
    validate_name(name).map_err(|reason| flag_err(&reason))?;
    let words = shell_words::split(rest).map_err(|e| flag_err(&e.to_string()))?;
    // The KEP quotes the whole command line; after one round of splitting that leaves a
    // single word holding the real command line, which we split again.
    let words = if words.len() == 1 && words[0].contains(char::is_whitespace) {
        shell_words::split(&words[0]).map_err(|e| flag_err(&e.to_string()))?
    } else {
        words
    };
    let mut words = words.into_iter();
    let command = words
        .next()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| flag_err("empty command"))?;
    Ok(ProviderConfig {
        name: name.to_string(),
        exec: ExecConfig {
            api_version: ExecApiVersion::V1,
            command,
            args: words.collect(),
            env: Vec::new(),
            provide_cluster_info: true,
            install_hint: None,
        },
        cli_args_policy: CliArgsPolicy::Ignore,
        env_vars_policy: EnvVarsPolicy::Ignore,
    })
}

fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty provider name".into());
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("provider name contains whitespace or control characters".into());
    }
    Ok(())
}

/// The provider file as written (the Go library's JSON keys); validated into [`ProviderConfig`].
#[derive(Debug, Default, Deserialize)]
struct RawProviderFile {
    #[serde(default)]
    providers: Option<Vec<RawProvider>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProvider {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    exec_config: Option<RawExecConfig>,
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    profile_sourced_cli_args_policy: Option<String>,
    #[serde(default)]
    profile_sourced_env_vars_policy: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawExecConfig {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<RawEnvVar>>,
    #[serde(default)]
    provide_cluster_info: Option<bool>,
    #[serde(default)]
    install_hint: Option<String>,
    #[serde(default)]
    interactive_mode: Option<String>,
}

#[derive(Deserialize)]
struct RawEnvVar {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

impl std::fmt::Debug for RawEnvVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_env(f, "RawEnvVar", &self.name, self.value.as_deref())
    }
}

fn validate_raw_provider(
    index: usize,
    rp: RawProvider,
) -> Result<ProviderConfig, ProviderConfigError> {
    let label = rp
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("providers[{index}]"));
    let invalid = |field: &'static str, reason: String| ProviderConfigError::Invalid {
        provider: label.clone(),
        field,
        reason,
    };
    let name = rp.name.clone().unwrap_or_default();
    validate_name(&name).map_err(|r| invalid("name", r))?;
    let exec = rp.exec_config.ok_or_else(|| {
        invalid(
            "execConfig",
            "missing (no exec config found for provider)".into(),
        )
    })?;
    let api_version = match exec.api_version.as_deref() {
        None | Some("") => return Err(invalid("execConfig.apiVersion", "missing".into())),
        Some(v) => ExecApiVersion::parse(v).ok_or_else(|| {
            invalid(
                "execConfig.apiVersion",
                format!("unknown apiVersion {v:?} (want {EXEC_API_V1} or {EXEC_API_V1BETA1})"),
            )
        })?,
    };
    let command = exec.command.unwrap_or_default();
    if command.trim().is_empty() {
        return Err(invalid("execConfig.command", "empty command".into()));
    }
    let mut env: Vec<EnvVar> = Vec::new();
    for (i, e) in exec.env.unwrap_or_default().into_iter().enumerate() {
        let name = e.name.unwrap_or_default();
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(invalid(
                "execConfig.env",
                format!("entry {i}: invalid variable name {name:?}"),
            ));
        }
        let value = e.value.unwrap_or_default();
        if value.contains('\0') {
            return Err(invalid(
                "execConfig.env",
                format!("entry {i} ({name}): value contains NUL"),
            ));
        }
        // client-go applies entries in order, so a later duplicate wins; keep one entry.
        match env.iter_mut().find(|x| x.name == name) {
            Some(slot) => slot.value = value,
            None => env.push(EnvVar { name, value }),
        }
    }
    match exec.interactive_mode.as_deref() {
        None | Some("" | "Never" | "IfAvailable" | "Always") => {}
        Some(other) => {
            return Err(invalid(
                "execConfig.interactiveMode",
                format!(
                    "unknown interactiveMode {other:?} (want Never, IfAvailable or Always; the hub always runs Never)"
                ),
            ));
        }
    }
    let cli_args_policy = match rp.profile_sourced_cli_args_policy.as_deref() {
        None | Some("" | "Ignore") => CliArgsPolicy::Ignore,
        Some("Append") => CliArgsPolicy::Append,
        Some(other) => {
            return Err(invalid(
                "profileSourcedCLIArgsPolicy",
                format!(
                    "unsupported ProfileSourcedCLIArgsPolicy {other:?} (want Ignore or Append)"
                ),
            ));
        }
    };
    let env_vars_policy = match rp.profile_sourced_env_vars_policy.as_deref() {
        None | Some("" | "Ignore") => EnvVarsPolicy::Ignore,
        Some("AppendIfNotExists") => EnvVarsPolicy::AppendIfNotExists,
        Some("Replace") => EnvVarsPolicy::Replace,
        Some(other) => {
            return Err(invalid(
                "profileSourcedEnvVarsPolicy",
                format!(
                    "unsupported ProfileSourcedEnvVarsPolicy {other:?} (want Ignore, AppendIfNotExists or Replace)"
                ),
            ));
        }
    };
    Ok(ProviderConfig {
        name,
        exec: ExecConfig {
            api_version,
            command,
            args: exec.args.unwrap_or_default(),
            env,
            provide_cluster_info: exec.provide_cluster_info.unwrap_or(false),
            install_hint: exec.install_hint.filter(|h| !h.is_empty()),
        },
        cli_args_policy,
        env_vars_policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parses_quoted_command_line() {
        let p =
            parse_provider_flag("google='/usr/bin/gke --flag1 value1 --flag2 \"v 2\"'").unwrap();
        assert_eq!(p.name, "google");
        assert_eq!(p.exec.command, "/usr/bin/gke");
        assert_eq!(p.exec.args, vec!["--flag1", "value1", "--flag2", "v 2"]);
        let p = parse_provider_flag("x=/bin/p --a 'b c'").unwrap();
        assert_eq!(p.exec.args, vec!["--a", "b c"]);
    }

    #[test]
    fn flag_errors() {
        assert!(matches!(
            parse_provider_flag("noequals"),
            Err(ProviderConfigError::Flag { .. })
        ));
        assert!(matches!(
            parse_provider_flag("=/bin/x"),
            Err(ProviderConfigError::Flag { .. })
        ));
        let e = parse_provider_flag("a=").unwrap_err().to_string();
        assert!(e.contains("empty command"), "{e}");
        let e = parse_provider_flag("a='/bin/x").unwrap_err().to_string();
        assert!(e.contains("unterminated"), "{e}");
    }

    #[test]
    fn env_debug_hides_values() {
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        let env = EnvVar {
            name: "AWS_SECRET_ACCESS_KEY".into(),
            value: secret.into(),
        };
        let raw: RawProviderFile = serde_json::from_str(&format!(
            r#"{{"providers":[{{"name":"eks","execConfig":{{"env":[{{"name":"AWS_SECRET_ACCESS_KEY","value":"{secret}"}}]}}}}]}}"#
        ))
        .unwrap();
        for dbg in [format!("{env:?}"), format!("{env:#?}"), format!("{raw:?}")] {
            assert!(!dbg.contains("wJalrXUtnFEMI"), "{dbg}");
            assert!(dbg.contains("AWS_SECRET_ACCESS_KEY"), "{dbg}");
            assert!(dbg.contains("40 chars, sha256:"), "{dbg}");
        }
    }
}
