//! `kleym credential token-request`: a short-lived token for a hub ServiceAccount via the
//! TokenRequest API, with the audience the hub decided for the spoke
//! (`KLEYM_CLUSTER_AUDIENCE`, see [`token_audience`]). The spoke trusts the
//! hub's ServiceAccount issuer (OIDC discovery/JWKS), so no long-lived secret exists anywhere.

use chrono::{DateTime, Utc};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

use super::PluginError;
use super::exec_info::{ExecInfo, render_credential, token_audience};

/// Which ServiceAccount, for which audience, for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequestOptions {
    /// `namespace/name` of the hub ServiceAccount.
    pub service_account: String,
    /// `--audience`: the audience when run outside the hub (see [`token_audience`]).
    pub audience: Option<String>,
    /// Requested lifetime (the API server may shorten it).
    pub expiration_seconds: i64,
}

/// Splits `ns/name`.
pub fn parse_service_account(s: &str) -> Result<(String, String), PluginError> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.into(), name.into()))
        }
        _ => Err(PluginError::Input(format!(
            "--service-account must be <namespace>/<name>, got {s:?}"
        ))),
    }
}

/// The audience to request: the hub's, else `--audience` ([`token_audience`]).
pub fn audience(opts: &TokenRequestOptions, info: &ExecInfo) -> Result<String, PluginError> {
    token_audience(info, opts.audience.as_deref())
}

/// The TokenRequest object sent to the hub.
pub fn token_request_body(audience: &str, expiration_seconds: i64) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(expiration_seconds),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    }
}

/// Runs the plugin against `hub`: returns the ExecCredential JSON to print.
pub async fn token_request(
    hub: kube::Client,
    info: &ExecInfo,
    opts: &TokenRequestOptions,
) -> Result<String, PluginError> {
    if opts.expiration_seconds < 600 {
        return Err(PluginError::Input(
            "--expiration-seconds must be at least 600 (the API minimum)".into(),
        ));
    }
    let (ns, name) = parse_service_account(&opts.service_account)?;
    let audience = audience(opts, info)?;
    let body = token_request_body(&audience, opts.expiration_seconds);
    let resp: TokenRequest = Api::<ServiceAccount>::namespaced(hub, &ns)
        .create_subresource("token", &name, &PostParams::default(), &body)
        .await
        .map_err(|source| PluginError::Api {
            what: format!("TokenRequest for serviceaccount {ns}/{name}"),
            source,
        })?;
    let status = resp.status.ok_or_else(|| {
        PluginError::Input(format!(
            "TokenRequest for serviceaccount {ns}/{name} returned no status"
        ))
    })?;
    if status.token.is_empty() {
        return Err(PluginError::Input(format!(
            "TokenRequest for serviceaccount {ns}/{name} returned an empty token"
        )));
    }
    let expires_at = DateTime::<Utc>::from_timestamp(status.expiration_timestamp.0.as_second(), 0)
        .ok_or_else(|| {
            PluginError::Input(format!(
                "TokenRequest for serviceaccount {ns}/{name} returned an out-of-range expiry"
            ))
        })?;
    Ok(render_credential(
        info.api_version,
        &status.token,
        Some(expires_at),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ExecApiVersion;

    #[test]
    fn service_account_and_audience() {
        assert_eq!(
            parse_service_account("kleym/hub").unwrap(),
            ("kleym".into(), "hub".into())
        );
        assert!(parse_service_account("hub").is_err());
        assert!(parse_service_account("a/b/c").is_err());
        let mut info = ExecInfo {
            api_version: ExecApiVersion::V1,
            server: Some("https://spoke:6443".into()),
            config: None,
            hub_audience: None,
            hub_profile: None,
        };
        let mut opts = TokenRequestOptions {
            service_account: "a/b".into(),
            audience: None,
            expiration_seconds: 3600,
        };
        // The server URL is never the audience.
        assert!(audience(&opts, &info).is_err());
        opts.audience = Some("custom".into());
        assert_eq!(audience(&opts, &info).unwrap(), "custom");
        info.hub_audience = Some("kleym.io/clusterprofile/fleet/a".into());
        assert!(audience(&opts, &info).is_err(), "differs from the hub's");
        opts.audience = None;
        assert_eq!(
            audience(&opts, &info).unwrap(),
            "kleym.io/clusterprofile/fleet/a"
        );
        let body = serde_json::to_value(token_request_body("aud", 3600)).unwrap();
        assert_eq!(body["spec"]["audiences"][0], "aud");
        assert_eq!(body["spec"]["expirationSeconds"], 3600);
        assert_eq!(body["kind"], "TokenRequest");
    }
}
