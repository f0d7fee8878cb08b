//! Provider selection and extension policies: a pure function from the hub's provider set and
//! one ClusterProfile to the [`EffectiveAccess`] for that spoke.
//!
//! Semantics follow the Go reference library (`pkg/access.BuildConfigFromCP`):
//! - the *hub's* provider order decides: the first configured provider that the profile offers
//!   wins; offered providers come from `credentialProviders` overridden by name by
//!   `accessProviders`;
//! - the `client.authentication.k8s.io/exec` extension passes through to
//!   `ExecCredential.spec.cluster.config`;
//! - `additional-args` / `additional-envs` obey the provider's policies (`Ignore` default).
//!
//! and fix its bugs: the shared provider config is never mutated (a new value is returned),
//! env order is deterministic (provider env in configured order, then profile variables sorted
//! by name), TLS fields are honoured and validated, `insecure-skip-tls-verify` is refused unless
//! the hub allows it, profile-sourced env can never set a variable of the deny list
//! ([`FORBIDDEN_ENV`](super::extensions::FORBIDDEN_ENV)) nor, when the provider has one, a
//! variable outside its allow list, and duplicate extension names are refused.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use rustls_pki_types::pem::{PemObject, SectionKind};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::audience::{AUDIENCE_KEY, derived_audience, validate_audience};
use super::extensions::{
    ADDITIONAL_ARGS_EXTENSION, ADDITIONAL_ENVS_EXTENSION, EXEC_EXTENSION, forbidden_env_rule,
    parse_additional_args, parse_additional_envs,
};
use super::profile::{AccessProfile, ProfileProvider};
use super::provider_config::{
    AudiencePolicy, CliArgsPolicy, EnvVar, EnvVarsPolicy, ExecConfig, ProviderSet,
};

/// Hub-level switches for what a ClusterProfile may ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectOptions {
    /// Accept `insecure-skip-tls-verify: true` (refused by default).
    pub allow_insecure_skip_tls_verify: bool,
    /// Accept `http://` server URLs (refused by default: tokens would travel in clear text).
    /// Meant for tests against local servers.
    pub allow_plain_http: bool,
}

/// How to reach one spoke's API server (from the chosen provider's `cluster`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ClusterAccess {
    /// API server URL.
    pub server: String,
    /// PEM CA bundle (decoded from `certificate-authority-data`, validated as certificates).
    /// Shared, not copied, by the spec's clones (the supervisor's slot, the engagement, the
    /// credential cache each keep one per spoke); serialized as the bytes it holds.
    #[serde(serialize_with = "serialize_pem")]
    pub certificate_authority_pem: Option<Bytes>,
    /// `tls-server-name`.
    pub tls_server_name: Option<String>,
    /// `insecure-skip-tls-verify` (only ever true when the hub allows it).
    pub insecure_skip_tls_verify: bool,
    /// `proxy-url`; when absent the usual `HTTPS_PROXY`/`NO_PROXY` environment applies.
    pub proxy_url: Option<String>,
    /// `disable-compression`.
    pub disable_compression: bool,
    /// The `client.authentication.k8s.io/exec` extension payload as canonical JSON (object
    /// keys sorted), passed to the plugin as `spec.cluster.config`.
    pub exec_extension: Option<String>,
}

/// The effective access configuration of one spoke: what to exec and where to connect.
/// Equal values mean "nothing to re-engage"; [`EffectiveAccess::fingerprint`] gives a stable
/// digest of the same content.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct EffectiveAccess {
    /// Spoke name `<namespace>/<name>`.
    pub spoke: String,
    /// Chosen provider name.
    pub provider: String,
    /// Connection details.
    pub cluster: ClusterAccess,
    /// The plugin invocation, after extension policies.
    pub exec: ExecConfig,
    /// The audience of the tokens obtained for this spoke, decided by the hub (see
    /// [`audience`](super::audience)): the plugin receives it in `KLEYM_CLUSTER_AUDIENCE`.
    pub audience: String,
}

impl EffectiveAccess {
    /// SHA-256 (hex) over the canonical JSON form; changes iff the effective config changes.
    pub fn fingerprint(&self) -> String {
        // Serializing plain structs, strings and vectors cannot fail.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&bytes))
    }
}

/// The CA bundle as a sequence of bytes, as when it was a `Vec<u8>`: fingerprints made
/// before it was shared stay equal.
fn serialize_pem<S: serde::Serializer>(pem: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
    pem.as_deref().serialize(s)
}

/// Why a ClusterProfile cannot be used with this hub's providers.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SelectError {
    /// None of the hub's providers is offered by the profile.
    #[error(
        "no matching cluster accessor found for cluster profile {profile:?} (profile offers {offered:?}; hub has {configured:?})"
    )]
    NoMatchingProvider {
        /// Spoke name.
        profile: String,
        /// Names the profile offers.
        offered: Vec<String>,
        /// Names the hub has configured.
        configured: Vec<String>,
    },
    /// A `cluster` field is missing or invalid.
    #[error("cluster profile {profile:?}, provider {provider:?}: cluster field {field}: {reason}")]
    InvalidCluster {
        /// Spoke name.
        profile: String,
        /// Provider name.
        provider: String,
        /// Field, in kubeconfig spelling.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A reserved extension is malformed or asks for something refused.
    #[error(
        "cluster profile {profile:?}, provider {provider:?}: extension {extension:?}: {reason}"
    )]
    Extension {
        /// Spoke name.
        profile: String,
        /// Provider name.
        provider: String,
        /// Extension name.
        extension: String,
        /// What is wrong.
        reason: String,
    },
}

/// Chooses the provider for `profile` and computes the effective access configuration.
/// Pure: `providers` is only read.
pub fn select(
    providers: &ProviderSet,
    profile: &AccessProfile,
    opts: &SelectOptions,
) -> Result<EffectiveAccess, SelectError> {
    let spoke = profile.spoke_name();
    // Offered providers by name: deprecated list first, then accessProviders overriding.
    let mut offered: BTreeMap<&str, &ProfileProvider> = BTreeMap::new();
    for p in profile
        .credential_providers
        .iter()
        .chain(profile.access_providers.iter())
    {
        offered.insert(p.name.as_str(), p);
    }
    let Some((provider, offer)) = providers
        .providers()
        .iter()
        .find_map(|p| offered.get(p.name.as_str()).map(|o| (p, *o)))
    else {
        return Err(SelectError::NoMatchingProvider {
            profile: spoke,
            offered: offered.keys().map(|s| s.to_string()).collect(),
            configured: providers
                .providers()
                .iter()
                .map(|p| p.name.clone())
                .collect(),
        });
    };
    let ctx = Ctx {
        spoke: &spoke,
        provider: &provider.name,
    };
    let parsed = parse_cluster(&ctx, &offer.cluster, opts)?;

    let mut exec = provider.exec.clone();
    // Policies are checked first: under `Ignore` even a malformed payload is ignored.
    if provider.cli_args_policy == CliArgsPolicy::Append
        && let Some(payload) = parsed.extensions.get(ADDITIONAL_ARGS_EXTENSION)
    {
        let extra =
            parse_additional_args(payload).map_err(|r| ctx.ext(ADDITIONAL_ARGS_EXTENSION, r))?;
        exec.args.extend(extra);
    }
    if provider.env_vars_policy != EnvVarsPolicy::Ignore
        && let Some(payload) = parsed.extensions.get(ADDITIONAL_ENVS_EXTENSION)
    {
        let extra =
            parse_additional_envs(payload).map_err(|r| ctx.ext(ADDITIONAL_ENVS_EXTENSION, r))?;
        merge_env(
            &ctx,
            &mut exec.env,
            extra,
            provider.env_vars_policy,
            provider.env_vars_allow_list.as_deref(),
        )?;
    }
    let exec_extension = parsed.extensions.get(EXEC_EXTENSION).map(|v| v.to_string());
    let audience = effective_audience(&ctx, profile, provider.audience_policy, &parsed)?;
    Ok(EffectiveAccess {
        spoke: spoke.clone(),
        provider: provider.name.clone(),
        cluster: ClusterAccess {
            server: parsed.server,
            certificate_authority_pem: parsed.ca_pem.map(Bytes::from),
            tls_server_name: parsed.tls_server_name,
            insecure_skip_tls_verify: parsed.insecure,
            proxy_url: parsed.proxy_url,
            disable_compression: parsed.disable_compression,
            exec_extension,
        },
        exec,
        audience,
    })
}

/// The audience of the spoke's tokens: derived from the profile's namespace and name, or,
/// where the provider allows it, the `audience` of the profile's exec extension.
fn effective_audience(
    ctx: &Ctx<'_>,
    profile: &AccessProfile,
    policy: AudiencePolicy,
    parsed: &ParsedCluster,
) -> Result<String, SelectError> {
    let derived = derived_audience(&profile.namespace, &profile.name);
    if policy == AudiencePolicy::Ignore {
        return Ok(derived);
    }
    match parsed
        .extensions
        .get(EXEC_EXTENSION)
        .and_then(|c| c.get(AUDIENCE_KEY))
    {
        None | Some(Value::Null) => Ok(derived),
        Some(Value::String(a)) => {
            validate_audience(a)
                .map_err(|r| ctx.ext(EXEC_EXTENSION, format!("{AUDIENCE_KEY} {r}")))?;
            Ok(a.clone())
        }
        Some(_) => Err(ctx.ext(EXEC_EXTENSION, format!("{AUDIENCE_KEY} must be a string"))),
    }
}

struct Ctx<'a> {
    spoke: &'a str,
    provider: &'a str,
}

impl Ctx<'_> {
    fn cluster(&self, field: &'static str, reason: impl Into<String>) -> SelectError {
        SelectError::InvalidCluster {
            profile: self.spoke.to_string(),
            provider: self.provider.to_string(),
            field,
            reason: reason.into(),
        }
    }

    fn ext(&self, extension: &str, reason: impl Into<String>) -> SelectError {
        SelectError::Extension {
            profile: self.spoke.to_string(),
            provider: self.provider.to_string(),
            extension: extension.to_string(),
            reason: reason.into(),
        }
    }
}

fn merge_env(
    ctx: &Ctx<'_>,
    env: &mut Vec<EnvVar>,
    extra: BTreeMap<String, String>,
    policy: EnvVarsPolicy,
    allow_list: Option<&[String]>,
) -> Result<(), SelectError> {
    for (name, value) in extra {
        if let Some((pattern, why)) = forbidden_env_rule(&name) {
            return Err(ctx.ext(
                ADDITIONAL_ENVS_EXTENSION,
                format!(
                    "variable {name:?} may not be set from a ClusterProfile (deny list: {pattern}, {why})"
                ),
            ));
        }
        if let Some(allowed) = allow_list
            && !allowed.contains(&name)
        {
            return Err(ctx.ext(
                ADDITIONAL_ENVS_EXTENSION,
                format!(
                    "variable {name:?} is not in the provider's profileSourcedEnvVarsAllowList {allowed:?}"
                ),
            ));
        }
        match env.iter_mut().find(|e| e.name == name) {
            Some(existing) => {
                if policy == EnvVarsPolicy::Replace {
                    existing.value = value;
                }
            }
            None => env.push(EnvVar { name, value }),
        }
    }
    Ok(())
}

struct ParsedCluster {
    server: String,
    ca_pem: Option<Vec<u8>>,
    tls_server_name: Option<String>,
    insecure: bool,
    proxy_url: Option<String>,
    disable_compression: bool,
    extensions: BTreeMap<String, Value>,
}

fn opt_str<'v>(
    ctx: &Ctx<'_>,
    obj: &'v serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<Option<&'v str>, SelectError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ctx.cluster(key, "must be a string")),
    }
}

fn opt_bool(
    ctx: &Ctx<'_>,
    obj: &serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<bool, SelectError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ctx.cluster(key, "must be a boolean")),
    }
}

fn parse_cluster(
    ctx: &Ctx<'_>,
    cluster: &Value,
    opts: &SelectOptions,
) -> Result<ParsedCluster, SelectError> {
    let obj = cluster
        .as_object()
        .ok_or_else(|| ctx.cluster("cluster", "missing or not an object"))?;
    let server = opt_str(ctx, obj, "server")?.ok_or_else(|| ctx.cluster("server", "missing"))?;
    validate_server(server, opts.allow_plain_http).map_err(|r| ctx.cluster("server", r))?;

    let ca_pem = match opt_str(ctx, obj, "certificate-authority-data")? {
        None => None,
        Some(b64) => {
            Some(decode_ca(b64).map_err(|r| ctx.cluster("certificate-authority-data", r))?)
        }
    };
    let tls_server_name = opt_str(ctx, obj, "tls-server-name")?.map(str::to_string);
    if let Some(name) = &tls_server_name
        && name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(ctx.cluster("tls-server-name", "not a DNS name or IP address"));
    }
    let insecure = opt_bool(ctx, obj, "insecure-skip-tls-verify")?;
    if insecure {
        if !opts.allow_insecure_skip_tls_verify {
            return Err(ctx.cluster(
                "insecure-skip-tls-verify",
                "refused: this hub does not allow skipping TLS verification (--allow-insecure-skip-tls-verify)",
            ));
        }
        if ca_pem.is_some() {
            return Err(ctx.cluster(
                "insecure-skip-tls-verify",
                "cannot be combined with certificate-authority-data",
            ));
        }
    }
    let proxy_url = opt_str(ctx, obj, "proxy-url")?.map(str::to_string);
    if let Some(p) = &proxy_url {
        validate_proxy(p).map_err(|r| ctx.cluster("proxy-url", r))?;
    }
    let disable_compression = opt_bool(ctx, obj, "disable-compression")?;

    let mut extensions = BTreeMap::new();
    match obj.get("extensions") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| ctx.cluster("extensions", format!("entry {i} has no name")))?;
                let payload = item.get("extension").cloned().unwrap_or(Value::Null);
                if extensions.insert(name.to_string(), payload).is_some() {
                    return Err(
                        ctx.cluster("extensions", format!("duplicate extension name {name:?}"))
                    );
                }
            }
        }
        Some(_) => return Err(ctx.cluster("extensions", "must be a list")),
    }
    Ok(ParsedCluster {
        server: server.to_string(),
        ca_pem,
        tls_server_name,
        insecure,
        proxy_url,
        disable_compression,
        extensions,
    })
}

fn validate_server(server: &str, allow_http: bool) -> Result<(), String> {
    let uri: http::Uri = server.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if allow_http => {}
        Some("http") => return Err("plain http is refused; use https".into()),
        Some(other) => return Err(format!("unsupported scheme {other:?}")),
        None => return Err("missing scheme (want https://host[:port])".into()),
    }
    let authority = uri.authority().ok_or("missing host")?;
    if authority.host().is_empty() {
        return Err("missing host".into());
    }
    if authority.as_str().contains('@') {
        return Err("user information in the URL is not allowed".into());
    }
    if uri.query().is_some() {
        return Err("query strings are not allowed".into());
    }
    Ok(())
}

fn validate_proxy(proxy: &str) -> Result<(), String> {
    let uri: http::Uri = proxy.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some("socks5") => return Err("socks5 proxies are not supported by the hub".into()),
        _ => return Err("scheme must be http or https".into()),
    }
    match uri.host() {
        Some(h) if !h.is_empty() => Ok(()),
        _ => Err("missing host".into()),
    }
}

/// Decodes `certificate-authority-data` (base64 of PEM) and checks that it holds only
/// parseable X.509 certificates.
fn decode_ca(b64: &str) -> Result<Vec<u8>, String> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("not valid base64: {e}"))?;
    let ders = pem_certificates(&pem)?;
    for (i, der) in ders.iter().enumerate() {
        x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("certificate {i} does not parse: {e}"))?;
    }
    Ok(pem)
}

/// Extracts the DER certificates from a PEM bundle; refuses non-certificate blocks and
/// bundles without any certificate.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        match item.map_err(|e| format!("not valid PEM: {e}"))? {
            (SectionKind::Certificate, der) => out.push(der),
            _ => return Err("contains a PEM block that is not a CERTIFICATE".into()),
        }
    }
    if out.is_empty() {
        return Err("no PEM CERTIFICATE block found".into());
    }
    Ok(out)
}
