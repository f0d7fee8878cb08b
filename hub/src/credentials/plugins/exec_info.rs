//! Reading the plugin side of the exec protocol and writing the answer.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::PluginError;
use crate::access::ExecApiVersion;
use crate::access::audience::{AUDIENCE_ENV, PROFILE_ENV};

/// What a bundled plugin needs from `KUBERNETES_EXEC_INFO`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecInfo {
    /// The version the caller speaks (the answer uses it too).
    pub api_version: ExecApiVersion,
    /// `spec.cluster.server`, when cluster info was provided.
    pub server: Option<String>,
    /// `spec.cluster.config` (the `client.authentication.k8s.io/exec` extension).
    pub config: Option<Value>,
    /// The audience the hub decided for this spoke (`KLEYM_CLUSTER_AUDIENCE`), when run by
    /// the hub.
    pub hub_audience: Option<String>,
    /// The ClusterProfile (`namespace/name`) the hub runs the plugin for
    /// (`KLEYM_CLUSTER_PROFILE`), when run by the hub.
    pub hub_profile: Option<String>,
}

/// Reads `KUBERNETES_EXEC_INFO`, and what the hub says of the spoke (`KLEYM_CLUSTER_AUDIENCE`,
/// `KLEYM_CLUSTER_PROFILE`), from the environment.
pub fn exec_info_from_env() -> Result<ExecInfo, PluginError> {
    let raw = std::env::var("KUBERNETES_EXEC_INFO")
        .map_err(|_| PluginError::ExecInfo("not set (run me as a client-go exec plugin)".into()))?;
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    Ok(ExecInfo {
        hub_audience: var(AUDIENCE_ENV),
        hub_profile: var(PROFILE_ENV),
        ..parse_exec_info(&raw)?
    })
}

/// The audience of the token to obtain: the hub's (`KLEYM_CLUSTER_AUDIENCE`) when the hub
/// runs the plugin, else `--audience` (`flag`). Under the hub a different `--audience` is
/// refused rather than used: a profile allowed to append arguments must not choose the
/// audience, and an operator's fixed audience would be one audience for every spoke. Neither
/// the profile's `server` nor its exec extension is ever read here: the hub has already
/// applied the provider's `profileSourcedAudiencePolicy`.
pub fn token_audience(info: &ExecInfo, flag: Option<&str>) -> Result<String, PluginError> {
    let flag = flag.filter(|f| !f.is_empty());
    match (&info.hub_audience, flag) {
        (Some(hub), Some(f)) if hub != f => Err(PluginError::Input(format!(
            "--audience {f:?} differs from the audience the hub decided for ClusterProfile {} \
             ({hub:?}); when the hub runs the plugin the audience is the hub's: remove --audience",
            info.hub_profile.as_deref().unwrap_or("(unnamed)")
        ))),
        (Some(hub), _) => Ok(hub.clone()),
        (None, Some(f)) => Ok(f.to_string()),
        (None, None) => Err(PluginError::Input(format!(
            "no audience: {AUDIENCE_ENV} is not set (the kleym hub sets it on every run); \
             outside the hub pass --audience"
        ))),
    }
}

/// Parses the `KUBERNETES_EXEC_INFO` document.
pub fn parse_exec_info(raw: &str) -> Result<ExecInfo, PluginError> {
    let doc: Value =
        serde_json::from_str(raw).map_err(|e| PluginError::ExecInfo(format!("not JSON: {e}")))?;
    if doc.get("kind").and_then(Value::as_str) != Some("ExecCredential") {
        return Err(PluginError::ExecInfo("kind is not ExecCredential".into()));
    }
    let version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let api_version = ExecApiVersion::parse(version)
        .ok_or_else(|| PluginError::ExecInfo(format!("unsupported apiVersion {version:?}")))?;
    let cluster = doc
        .get("spec")
        .and_then(|s| s.get("cluster"))
        .filter(|c| !c.is_null());
    let server = cluster
        .and_then(|c| c.get("server"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && *s != "null")
        .map(str::to_string);
    let config = cluster
        .and_then(|c| c.get("config"))
        .filter(|c| !c.is_null())
        .cloned();
    Ok(ExecInfo {
        api_version,
        server,
        config,
        hub_audience: None,
        hub_profile: None,
    })
}

/// The `ExecCredential` answer carrying `token` (and its expiry, when known).
pub fn render_credential(
    api_version: ExecApiVersion,
    token: &str,
    expires_at: Option<DateTime<Utc>>,
) -> String {
    let mut status = json!({ "token": token });
    if let Some(exp) = expires_at {
        status["expirationTimestamp"] = exp.to_rfc3339_opts(SecondsFormat::Secs, true).into();
    }
    json!({
        "apiVersion": api_version.as_str(),
        "kind": "ExecCredential",
        "status": status,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_info_and_config() {
        let info = parse_exec_info(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"server":"https://s","config":{"clusterName":"c1"}},"interactive":false}}"#,
        )
        .unwrap();
        assert_eq!(info.api_version, ExecApiVersion::V1);
        assert_eq!(info.server.as_deref(), Some("https://s"));
        assert_eq!(info.config.unwrap()["clusterName"], "c1");
        let bare = parse_exec_info(r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#).unwrap();
        assert_eq!(bare.server, None);
        assert!(parse_exec_info("{}").is_err());
        assert!(parse_exec_info(r#"{"apiVersion":"x/v9","kind":"ExecCredential"}"#).is_err());
    }

    #[test]
    fn the_audience_is_the_hubs_and_a_different_flag_is_refused() {
        let mut info = parse_exec_info(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"server":"https://b:6443","config":{"audience":"https://b:6443"}}}}"#,
        )
        .unwrap();
        // Outside the hub: only an explicit flag, never the server or the extension.
        assert!(token_audience(&info, None).is_err());
        assert_eq!(token_audience(&info, Some("x")).unwrap(), "x");
        info.hub_audience = Some("kleym.io/clusterprofile/fleet/a".into());
        info.hub_profile = Some("fleet/a".into());
        assert_eq!(
            token_audience(&info, None).unwrap(),
            "kleym.io/clusterprofile/fleet/a"
        );
        assert_eq!(
            token_audience(&info, Some("kleym.io/clusterprofile/fleet/a")).unwrap(),
            "kleym.io/clusterprofile/fleet/a"
        );
        let err = token_audience(&info, Some("https://b:6443"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fleet/a") && err.contains("--audience"),
            "{err}"
        );
    }

    #[test]
    fn renders_answer_that_the_runtime_accepts() {
        let exp = DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let out = render_credential(ExecApiVersion::V1, "tok", Some(exp));
        let c =
            crate::credentials::exec_output::parse_exec_output(out.as_bytes(), ExecApiVersion::V1)
                .unwrap();
        assert_eq!(c.token.unwrap().expose(), "tok");
        assert_eq!(c.expires_at, Some(exp));
    }
}
