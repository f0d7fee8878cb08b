//! The hub's access-provider configuration: the Go reference library's provider file
//! (`--clusterprofile-provider-file`, JSON or YAML) and the repeated
//! `--clusterprofile-access-provider "name=/path/plugin --flag v"` flag (KEP-4322, formerly KEP-5339).
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

/// Whether a ClusterProfile may choose the audience of the hub's tokens for its cluster
/// (`profileSourcedAudiencePolicy`, a kleym extension of the file format).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AudiencePolicy {
    /// The audience is the hub's: derived from the profile's namespace and name (default).
    #[default]
    Ignore,
    /// The `audience` of the profile's `client.authentication.k8s.io/exec` extension, when
    /// it has one, replaces the derived audience. Whoever writes the profile's status then
    /// chooses which spoke accepts the token, so allow it only for profiles whose status
    /// writers the operator trusts as much as the hub; two engaged profiles with one
    /// audience are refused.
    Allow,
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
/// Its `Debug` passes the arguments through the token redaction (a plugin may take
/// `--token=…`) and hides env values.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
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

impl std::fmt::Debug for ExecConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| crate::credentials::secret::redact_token_like(a))
            .collect();
        f.debug_struct("ExecConfig")
            .field("api_version", &self.api_version)
            .field("command", &self.command)
            .field("args", &args)
            .field("env", &self.env)
            .field("provide_cluster_info", &self.provide_cluster_info)
            .field("install_hint", &self.install_hint)
            .finish()
    }
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
    /// `profileSourcedEnvVarsAllowList` (a kleym extension of the file format): when set,
    /// the only variable names a ClusterProfile may set (the deny list still applies).
    pub env_vars_allow_list: Option<Vec<String>>,
    /// `profileSourcedAudiencePolicy` (a kleym extension of the file format): whether the
    /// profile's exec extension may set the audience of the hub's tokens.
    pub audience_policy: AudiencePolicy,
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
        /// The field, in the file's spelling (a path such as `execConfig.args[1]`).
        field: String,
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

/// A key of the provider file that kleym does not know. Go's `encoding/json` ignores such
/// keys silently; the hub logs them, so a misspelt key (`comand`) is visible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKey {
    /// The provider (its name, or `providers[<index>]`); `None` at the top level.
    pub provider: Option<String>,
    /// Path of the key within the provider (or the top level), e.g. `execConfig.comand`.
    pub key: String,
}

/// A parsed provider file: the validated providers and the keys that were ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderDocument {
    /// Validated providers, in file order.
    pub providers: Vec<ProviderConfig>,
    /// Ignored keys, in file order.
    pub unknown_keys: Vec<UnknownKey>,
}

/// Reads and validates a provider file (JSON, or YAML as an extension of the Go format), and
/// logs a warning for every unknown key (file, provider, key).
pub fn parse_provider_file(path: &Path) -> Result<Vec<ProviderConfig>, ProviderConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProviderConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let doc = parse_provider_document_with_unknown_keys(&text).map_err(|e| match e {
        ProviderConfigError::Parse { detail, .. } => ProviderConfigError::Parse {
            path: path.display().to_string(),
            detail,
        },
        other => other,
    })?;
    for k in &doc.unknown_keys {
        tracing::warn!(
            file = %path.display(),
            provider = %k.provider.as_deref().unwrap_or("-"),
            key = %k.key,
            "unknown key in the access provider file, ignored"
        );
    }
    Ok(doc.providers)
}

/// Parses and validates provider-file content. See
/// [`parse_provider_document_with_unknown_keys`].
pub fn parse_provider_document(text: &str) -> Result<Vec<ProviderConfig>, ProviderConfigError> {
    parse_provider_document_with_unknown_keys(text).map(|d| d.providers)
}

/// Parses and validates provider-file content. JSON is tried first (the reference format);
/// YAML is accepted as well. `{}` is an empty configuration. As with Go's `encoding/json`,
/// keys match case-insensitively (`profileSourcedCliArgsPolicy` is
/// `profileSourcedCLIArgsPolicy`) and unknown keys are ignored (and reported); one key given
/// twice in different cases is an error.
pub fn parse_provider_document_with_unknown_keys(
    text: &str,
) -> Result<ProviderDocument, ProviderConfigError> {
    let parse_err = |detail: String| ProviderConfigError::Parse {
        path: String::new(),
        detail,
    };
    let root: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(json_err) => kleym_api::yaml::from_str(text).map_err(|yaml_err| {
            parse_err(format!("not JSON ({json_err}) nor YAML ({yaml_err})"))
        })?,
    };
    let serde_json::Value::Object(root) = root else {
        return Err(parse_err(
            "expected an object with a \"providers\" list".into(),
        ));
    };
    let mut unknown = Vec::new();
    let mut root = canonical_keys(root, ROOT_KEYS, "", None, &mut unknown)?;
    let items = match root.remove("providers") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items,
        Some(_) => return Err(parse_err("\"providers\" must be a list".into())),
    };
    let mut out: Vec<ProviderConfig> = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let label = item
            .get("name")
            .or_else(|| {
                // The name key may be spelt in another case too.
                item.as_object()?
                    .iter()
                    .find(|(k, _)| k.to_lowercase() == "name")
                    .map(|(_, v)| v)
            })
            .and_then(|v| v.as_str())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("providers[{index}]"));
        let item = canonical_provider(item, &label, &mut unknown)?;
        let rp: RawProvider =
            serde_path_to_error::deserialize(&item).map_err(|e| ProviderConfigError::Invalid {
                provider: label.clone(),
                field: e.path().to_string(),
                reason: e.into_inner().to_string(),
            })?;
        let p = validate_raw_provider(index, rp)?;
        if out.iter().any(|q| q.name == p.name) {
            return Err(ProviderConfigError::Duplicate {
                provider: p.name,
                source_kind: "provider file",
            });
        }
        out.push(p);
    }
    Ok(ProviderDocument {
        providers: out,
        unknown_keys: unknown,
    })
}

const ROOT_KEYS: &[&str] = &["providers"];
const PROVIDER_KEYS: &[&str] = &[
    "name",
    "execConfig",
    "profileSourcedCLIArgsPolicy",
    "profileSourcedEnvVarsPolicy",
    "profileSourcedEnvVarsAllowList",
    "profileSourcedAudiencePolicy",
];
/// client-go's `clientcmd/api.ExecConfig` JSON keys (`Config`, `StdinUnavailable` and
/// `PluginPolicy` are `json:"-"` there, so they are unknown keys here as well).
const EXEC_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "apiVersion",
    "installHint",
    "provideClusterInfo",
    "interactiveMode",
];
const ENV_KEYS: &[&str] = &["name", "value"];

/// Renames the keys of `obj` to their spelling in `known`, matching case-insensitively like
/// Go's `encoding/json` (an exact match first); records the others in `unknown` and drops
/// them.
fn canonical_keys(
    obj: serde_json::Map<String, serde_json::Value>,
    known: &[&'static str],
    path: &str,
    provider: Option<&str>,
    unknown: &mut Vec<UnknownKey>,
) -> Result<serde_json::Map<String, serde_json::Value>, ProviderConfigError> {
    let mut out = serde_json::Map::new();
    let mut spelt: Vec<(&'static str, String)> = Vec::new();
    for (key, value) in obj {
        let canonical = known.iter().find(|k| **k == key).or_else(|| {
            known
                .iter()
                .find(|k| k.to_lowercase() == key.to_lowercase())
        });
        let Some(canonical) = canonical else {
            unknown.push(UnknownKey {
                provider: provider.map(str::to_string),
                key: format!("{path}{key}"),
            });
            continue;
        };
        if let Some((_, first)) = spelt.iter().find(|(c, _)| c == canonical) {
            let reason =
                format!("given twice, as {first:?} and {key:?} (keys match case-insensitively)");
            let field = format!("{path}{canonical}");
            return Err(match provider {
                Some(p) => ProviderConfigError::Invalid {
                    provider: p.to_string(),
                    field,
                    reason,
                },
                None => ProviderConfigError::Parse {
                    path: String::new(),
                    detail: format!("{field}: {reason}"),
                },
            });
        }
        spelt.push((canonical, key));
        out.insert((*canonical).to_string(), value);
    }
    Ok(out)
}

/// [`canonical_keys`] for one `providers[]` item and its `execConfig` and `env[]` objects;
/// values of another type are left for the typed decoding to report.
fn canonical_provider(
    item: serde_json::Value,
    label: &str,
    unknown: &mut Vec<UnknownKey>,
) -> Result<serde_json::Value, ProviderConfigError> {
    use serde_json::Value;
    let Value::Object(obj) = item else {
        return Ok(item);
    };
    let mut obj = canonical_keys(obj, PROVIDER_KEYS, "", Some(label), unknown)?;
    if let Some(Value::Object(exec)) = obj.get_mut("execConfig") {
        *exec = canonical_keys(
            std::mem::take(exec),
            EXEC_KEYS,
            "execConfig.",
            Some(label),
            unknown,
        )?;
        if let Some(Value::Array(env)) = exec.get_mut("env") {
            for (i, e) in env.iter_mut().enumerate() {
                if let Value::Object(entry) = e {
                    *entry = canonical_keys(
                        std::mem::take(entry),
                        ENV_KEYS,
                        &format!("execConfig.env[{i}]."),
                        Some(label),
                        unknown,
                    )?;
                }
            }
        }
    }
    Ok(Value::Object(obj))
}

/// Parses one `--clusterprofile-access-provider` value: `name=<command> [args...]`, where
/// the part after `=` is split into words like a POSIX shell would (see
/// [`shell_words`](super::shell_words)).
///
/// The KEP writes the whole command line as one quoted string,
/// `google='/usr/bin/plugin --flag1 value1'`: when the part after `=` is exactly one quoted
/// string containing blanks, that string is split once more. Blanks that are escaped
/// (`x=/opt/my\ plugins/p`) or quoted inside a longer word (`x=/opt/'my plugins'/p`) are
/// never split again; inside the KEP form, quote or escape them once more
/// (`x='"/opt/my plugins/p" --v'`).
///
/// Flag-defined providers use `apiVersion: client.authentication.k8s.io/v1`,
/// `provideClusterInfo: true` and the `Ignore` policies; use the provider file for anything
/// else.
pub fn parse_provider_flag(value: &str) -> Result<ProviderConfig, ProviderConfigError> {
    // The value is echoed in the error: redacted, since plugin arguments may carry a secret.
    let flag_err = |reason: &str| ProviderConfigError::Flag {
        value: crate::credentials::secret::redact_token_like(value),
        reason: reason.to_string(),
    };
    let (name, rest) = value
        .split_once('=')
        .ok_or_else(|| flag_err("expected name=<command> [args...]"))?;
    let name = name.trim();
    validate_name(name).map_err(|reason| flag_err(&reason))?;
    let words = shell_words::split_words(rest).map_err(|e| flag_err(&e.to_string()))?;
    let words = match words.as_slice() {
        [only] if only.whole_quoted && only.text.contains(char::is_whitespace) => {
            let inner = shell_words::split(&only.text).map_err(|e| flag_err(&e.to_string()))?;
            kep_form_path_hint(&only.text, &inner).map_err(|r| flag_err(&r))?;
            inner
        }
        _ => words.into_iter().map(|w| w.text).collect(),
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
        env_vars_allow_list: None,
        audience_policy: AudiencePolicy::Ignore,
    })
}

/// `x='/opt/my plugins/p'` is the KEP form: command `/opt/my`, argument `plugins/p`. When
/// that command does not exist but the whole quoted string is a file, the operator surely
/// meant the file: say how to write it instead of exec'ing a missing command later.
fn kep_form_path_hint(whole: &str, words: &[String]) -> Result<(), String> {
    let Some(first) = words.first() else {
        return Ok(());
    };
    let (first, whole) = (Path::new(first), Path::new(whole));
    if first.is_absolute() && !first.exists() && whole.is_file() {
        return Err(format!(
            "a single quoted string is the KEP's whole command line, so this runs {:?} with arguments {:?}, which does not exist; {:?} does: write the path with its blanks escaped (NAME=/opt/my\\ plugins/p) or quoted once more (NAME='\"/opt/my plugins/p\"')",
            first.display(),
            &words[1..],
            whole.display()
        ));
    }
    Ok(())
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

/// One `providers[]` item as written (the Go library's JSON keys, after
/// [`canonical_provider`]); validated into [`ProviderConfig`].
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
    #[serde(default)]
    profile_sourced_env_vars_allow_list: Option<Vec<String>>,
    #[serde(default)]
    profile_sourced_audience_policy: Option<String>,
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
    let invalid = |field: &str, reason: String| ProviderConfigError::Invalid {
        provider: label.clone(),
        field: field.to_string(),
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
    let audience_policy = match rp.profile_sourced_audience_policy.as_deref() {
        None | Some("" | "Ignore") => AudiencePolicy::Ignore,
        Some("Allow") => AudiencePolicy::Allow,
        Some(other) => {
            return Err(invalid(
                "profileSourcedAudiencePolicy",
                format!(
                    "unsupported profileSourcedAudiencePolicy {other:?} (want Ignore or Allow)"
                ),
            ));
        }
    };
    let env_vars_allow_list = match rp.profile_sourced_env_vars_allow_list {
        None => None,
        Some(names) => {
            for (i, n) in names.iter().enumerate() {
                if n.is_empty() || n.contains('=') || n.contains('\0') {
                    return Err(invalid(
                        "profileSourcedEnvVarsAllowList",
                        format!("entry {i}: invalid variable name {n:?}"),
                    ));
                }
                if let Some((pattern, why)) = super::extensions::forbidden_env_rule(n) {
                    return Err(invalid(
                        "profileSourcedEnvVarsAllowList",
                        format!(
                            "entry {i}: {n:?} is on the deny list ({pattern}, {why}) and can never be set from a ClusterProfile"
                        ),
                    ));
                }
            }
            Some(names)
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
        env_vars_allow_list,
        audience_policy,
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
    fn flag_keeps_escaped_and_inner_quoted_blanks_in_the_command() {
        for (flag, command, args) in [
            (r"x=/opt/my\ plugins/p", "/opt/my plugins/p", vec![]),
            (
                r"x=/opt/my\ plugins/p --v 1",
                "/opt/my plugins/p",
                vec!["--v", "1"],
            ),
            (r"x=/opt/'my plugins'/p", "/opt/my plugins/p", vec![]),
            (
                r#"x="'/opt/my plugins/p' --v""#,
                "/opt/my plugins/p",
                vec!["--v"],
            ),
            (r#"x='"/opt/my plugins/p"'"#, "/opt/my plugins/p", vec![]),
            (
                r"x='/opt/my\ plugins/p --v'",
                "/opt/my plugins/p",
                vec!["--v"],
            ),
            (
                r"x='/opt/my plugins/p' --v",
                "/opt/my plugins/p",
                vec!["--v"],
            ),
            // The KEP form: one quoted string is the whole command line.
            ("x='/opt/my plugins/p'", "/opt/my", vec!["plugins/p"]),
        ] {
            let p = parse_provider_flag(flag).unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(p.exec.command, command, "{flag}");
            assert_eq!(p.exec.args, args, "{flag}");
        }
    }

    #[test]
    fn kep_form_over_an_existing_path_with_blanks_is_an_error_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("my plugins");
        std::fs::create_dir(&sub).unwrap();
        let plugin = sub.join("p");
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        let e = parse_provider_flag(&format!("x='{}'", plugin.display()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist") && e.contains("escaped"), "{e}");
        // Written as the error says, it is the command.
        let escaped = plugin.display().to_string().replace(' ', "\\ ");
        let p = parse_provider_flag(&format!("x={escaped}")).unwrap();
        assert_eq!(Path::new(&p.exec.command), plugin);
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
    fn exec_config_debug_and_flag_errors_redact_secret_arguments() {
        let secret = "s3cr3t-V4lue-0f-a-t0ken";
        let p = parse_provider_flag(&format!("a=/bin/plugin --token={secret}")).unwrap();
        let dbg = format!("{:?}", p.exec);
        assert!(!dbg.contains(secret), "{dbg}");
        assert!(dbg.contains("--token="), "{dbg}");
        let e = parse_provider_flag(&format!("a=/bin/plugin --token={secret} 'unterminated"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(secret), "{e}");
        assert!(e.contains("unterminated"), "{e}");
    }

    #[test]
    fn env_debug_hides_values() {
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        let env = EnvVar {
            name: "AWS_SECRET_ACCESS_KEY".into(),
            value: secret.into(),
        };
        let raw: RawProvider = serde_json::from_str(&format!(
            r#"{{"name":"eks","execConfig":{{"env":[{{"name":"AWS_SECRET_ACCESS_KEY","value":"{secret}"}}]}}}}"#
        ))
        .unwrap();
        for dbg in [format!("{env:?}"), format!("{env:#?}"), format!("{raw:?}")] {
            assert!(!dbg.contains("wJalrXUtnFEMI"), "{dbg}");
            assert!(dbg.contains("AWS_SECRET_ACCESS_KEY"), "{dbg}");
            assert!(dbg.contains("40 chars, sha256:"), "{dbg}");
        }
    }
}
