//! `kleym credential spiffe-x509`: an `ExecCredential` with `clientCertificateData` /
//! `clientKeyData`: an X.509-SVID (URI SAN = the hub's SPIFFE ID, CN = the username spokes
//! map, client-auth only, default TTL 1 h) signed by the hub CA kept in the issuer Secret.
//! The CA key stays in this process's memory; the SVID's key is new for every credential.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde_json::json;

use super::PluginError;
use super::exec_info::ExecInfo;
use super::spiffe_jwt::resolve_hub_spiffe_id;
use crate::issuer::keys::Algorithm;
use crate::issuer::secret::{SecretRef, load_or_create};
use crate::issuer::x509::HubCa;

/// Default SVID lifetime (seconds).
pub const DEFAULT_TTL_SECONDS: i64 = 3600;

/// What to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffeX509Options {
    /// The issuer Secret holding the CA.
    pub secret: SecretRef,
    /// The algorithm of the Secret's signing key (checked when reading it).
    pub algorithm: Algorithm,
    /// `--hub-spiffe-id`.
    pub hub_spiffe_id: Option<String>,
    /// `--trust-domain`.
    pub trust_domain: Option<String>,
    /// Prefix of the CN (the username spokes map), as `kleym trust-config --username-prefix`.
    pub username_prefix: String,
    /// Lifetime in seconds (300 ..= 86400).
    pub ttl_seconds: i64,
}

/// Issues an SVID with `ca` for `info` as of `now` and renders the ExecCredential.
pub fn issue_credential(
    ca: &HubCa,
    info: &ExecInfo,
    opts: &SpiffeX509Options,
    now: DateTime<Utc>,
) -> Result<String, PluginError> {
    if !(300..=86_400).contains(&opts.ttl_seconds) {
        return Err(PluginError::Input(format!(
            "--ttl-seconds must be between 300 and 86400, got {}",
            opts.ttl_seconds
        )));
    }
    if opts.username_prefix.starts_with("system:") {
        return Err(PluginError::Input(format!(
            "--username-prefix {:?}: system: usernames are reserved",
            opts.username_prefix
        )));
    }
    let id = resolve_hub_spiffe_id(opts.hub_spiffe_id.as_deref(), opts.trust_domain.as_deref())?;
    let cn = format!("{}{id}", opts.username_prefix);
    let (cert, key, not_after) = ca
        .issue_svid(&id, &cn, now, Duration::seconds(opts.ttl_seconds))
        .map_err(|e| PluginError::Input(e.to_string()))?;
    let margin = (opts.ttl_seconds / 10).clamp(1, 300);
    let refresh_at = not_after - Duration::seconds(margin);
    Ok(json!({
        "apiVersion": info.api_version.as_str(),
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": cert,
            "clientKeyData": key,
            "expirationTimestamp": refresh_at.to_rfc3339_opts(SecondsFormat::Secs, true),
        },
    })
    .to_string())
}

/// Runs the plugin against the hub cluster: reads the CA from the issuer Secret (never
/// creating it) and returns the ExecCredential JSON to print.
pub async fn spiffe_x509(
    hub: kube::Client,
    info: &ExecInfo,
    opts: &SpiffeX509Options,
) -> Result<String, PluginError> {
    let ring = load_or_create(hub, &opts.secret, opts.algorithm, false)
        .await
        .map_err(|e| PluginError::Input(e.to_string()))?;
    let ca = ring.ca().ok_or_else(|| {
        PluginError::Input(format!(
            "issuer Secret {} has no X.509 CA yet (the hub's leader adds one within its refresh period)",
            opts.secret
        ))
    })?;
    issue_credential(ca, info, opts, Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ExecApiVersion;

    #[test]
    fn credential_carries_a_client_certificate_the_runtime_accepts() {
        let now = Utc::now();
        let ca = HubCa::generate(now).unwrap();
        let info = ExecInfo {
            api_version: ExecApiVersion::V1,
            server: Some("https://spoke:6443".into()),
            config: None,
        };
        let mut opts = SpiffeX509Options {
            secret: SecretRef {
                namespace: "kleym".into(),
                name: "issuer".into(),
            },
            algorithm: Algorithm::Es256,
            hub_spiffe_id: None,
            trust_domain: Some("example.org".into()),
            username_prefix: "kleym:".into(),
            ttl_seconds: DEFAULT_TTL_SECONDS,
        };
        let out = issue_credential(&ca, &info, &opts, now).unwrap();
        let c =
            crate::credentials::exec_output::parse_exec_output(out.as_bytes(), ExecApiVersion::V1)
                .unwrap();
        assert!(c.client_certificate.is_some());
        assert!(c.token.is_none());
        let exp = c.expires_at.unwrap();
        assert!(exp < now + Duration::hours(1) && exp > now + Duration::minutes(50));
        opts.ttl_seconds = 10;
        assert!(issue_credential(&ca, &info, &opts, now).is_err());
        opts.ttl_seconds = DEFAULT_TTL_SECONDS;
        opts.hub_spiffe_id = Some("spiffe://other.org/x".into());
        assert!(
            issue_credential(&ca, &info, &opts, now).is_err(),
            "outside the trust domain"
        );
    }
}
