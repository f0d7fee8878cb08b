//! `kleym credential spiffe-x509`: an `ExecCredential` with `clientCertificateData` /
//! `clientKeyData`: an X.509-SVID (URI SAN = the hub's SPIFFE ID, CN = the username spokes
//! map, client-auth only, default TTL 1 h) signed by the hub CA kept in the X.509 CA Secret
//! (`kleym hub --issuer-x509-ca-secret`; the JWT signing keys are not read). The CA key stays
//! in this process's memory; the SVID's key is new for every credential.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde_json::json;

use super::PluginError;
use super::exec_info::ExecInfo;
use super::spiffe_id::resolve_hub_spiffe_id;
use super::workload_api::{WorkloadApiOptions, choose, fetch_x509_svids, proto};
use crate::issuer::keys::pem_encode;
use crate::issuer::secret::SecretRef;
use crate::issuer::x509::HubCa;

/// Default SVID lifetime (seconds).
pub const DEFAULT_TTL_SECONDS: i64 = 3600;

/// What to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffeX509Options {
    /// The X.509 CA Secret.
    pub secret: SecretRef,
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

/// Runs the plugin against the hub cluster: reads the CA from the X.509 CA Secret (never
/// creating it) and returns the ExecCredential JSON to print.
pub async fn spiffe_x509(
    hub: kube::Client,
    info: &ExecInfo,
    opts: &SpiffeX509Options,
) -> Result<String, PluginError> {
    let (_, ring) = crate::issuer::ca::read(hub, &opts.secret)
        .await
        .map_err(|e| PluginError::Input(e.to_string()))?;
    issue_credential(ring.ca(), info, opts, Utc::now())
}

/// Runs the plugin against a SPIRE agent: the first message of `FetchX509SVID`, checked, as
/// an ExecCredential with the certificate chain and key in PEM.
pub async fn spiffe_x509_from_workload_api(
    info: &ExecInfo,
    opts: &WorkloadApiOptions,
) -> Result<String, PluginError> {
    let svids = fetch_x509_svids(&opts.socket, opts.timeout).await?;
    let svid = choose(
        &svids,
        |s| s.spiffe_id.as_str(),
        opts.hub_spiffe_id.as_deref(),
        opts.trust_domain.as_deref(),
    )?;
    render_x509_svid(info, svid, Utc::now())
}

/// The ExecCredential for an X.509-SVID from the agent. The leaf must carry the SVID's
/// SPIFFE ID as its URI SAN, be valid now, and have a subject CN: kube-apiserver takes the
/// user name from the CN (SPIRE sets it to the registration entry's first DNS name), and a
/// `system:` name is refused. Messages name the SPIFFE ID, never key material.
pub fn render_x509_svid(
    info: &ExecInfo,
    svid: &proto::X509Svid,
    now: DateTime<Utc>,
) -> Result<String, PluginError> {
    let id = &svid.spiffe_id;
    let refuse = |why: String| PluginError::WorkloadApi(format!("X.509-SVID for {id}: {why}"));
    let mut chain = Vec::new();
    let mut rest = svid.x509_svid.as_slice();
    while !rest.is_empty() {
        let (after, _) = x509_parser::parse_x509_certificate(rest)
            .map_err(|_| refuse(format!("certificate {} is not DER", chain.len() + 1)))?;
        chain.push(&rest[..rest.len() - after.len()]);
        rest = after;
    }
    let leaf_der = chain
        .first()
        .ok_or_else(|| refuse("no certificate".into()))?;
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf_der)
        .map_err(|_| refuse("the leaf is not DER".into()))?;
    let uri_sans: Vec<&str> = leaf
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(*u),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if uri_sans != [id.as_str()] {
        return Err(refuse(format!(
            "the leaf's URI SANs are {uri_sans:?}, not the SVID's SPIFFE ID alone"
        )));
    }
    let cn = leaf
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default();
    if cn.is_empty() {
        return Err(refuse(
            "the leaf has no subject CN, which kube-apiserver takes as the user name: give the \
             hub's registration entry a DNS name (spire-server entry create -dns ...)"
                .into(),
        ));
    }
    if cn.starts_with("system:") {
        return Err(refuse(format!("the CN {cn:?} is a reserved system: name")));
    }
    let not_before = leaf.validity().not_before.timestamp();
    let not_after = leaf.validity().not_after.timestamp();
    if not_after <= now.timestamp() {
        return Err(refuse("expired (is this machine's clock right?)".into()));
    }
    if svid.x509_svid_key.is_empty() {
        return Err(refuse("no private key".into()));
    }
    let margin = ((not_after - not_before) / 10)
        .clamp(1, 300)
        .min(not_after - now.timestamp() - 1)
        .max(0);
    let refresh_at = DateTime::from_timestamp(not_after - margin, 0)
        .ok_or_else(|| refuse("notAfter out of range".into()))?;
    let certs: String = chain
        .iter()
        .map(|der| pem_encode("CERTIFICATE", der))
        .collect();
    Ok(json!({
        "apiVersion": info.api_version.as_str(),
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": certs,
            "clientKeyData": pem_encode("PRIVATE KEY", &svid.x509_svid_key),
            "expirationTimestamp": refresh_at.to_rfc3339_opts(SecondsFormat::Secs, true),
        },
    })
    .to_string())
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
            hub_audience: None,
            hub_profile: None,
        };
        let mut opts = SpiffeX509Options {
            secret: SecretRef {
                namespace: "kleym".into(),
                name: "issuer".into(),
            },
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

    fn agent_svid(ca: &HubCa, id: &str, cn: &str, now: DateTime<Utc>) -> proto::X509Svid {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key, _) = ca.issue_svid(id, cn, now, Duration::hours(1)).unwrap();
        let mut chain = CertificateDer::from_pem_slice(cert.as_bytes())
            .unwrap()
            .to_vec();
        // The chain as an agent sends it: leaf, then the intermediate (here the CA itself).
        chain.extend_from_slice(&CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap());
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        proto::X509Svid {
            spiffe_id: id.into(),
            x509_svid: chain,
            x509_svid_key: key.secret_der().to_vec(),
            bundle: vec![],
            hint: String::new(),
        }
    }

    #[test]
    fn an_x509_svid_from_the_agent_becomes_a_client_certificate_or_is_refused() {
        let now = Utc::now();
        let ca = HubCa::generate(now).unwrap();
        let info = ExecInfo {
            api_version: ExecApiVersion::V1,
            server: Some("https://spoke:6443".into()),
            config: None,
            hub_audience: None,
            hub_profile: None,
        };
        let id = "spiffe://example.org/kleym/hub";
        let svid = agent_svid(&ca, id, "kleym-hub.example.org", now);
        let out = render_x509_svid(&info, &svid, now).unwrap();
        let c =
            crate::credentials::exec_output::parse_exec_output(out.as_bytes(), ExecApiVersion::V1)
                .unwrap();
        let pem = c.client_certificate.unwrap();
        assert_eq!(pem.certificate_pem.matches("BEGIN CERTIFICATE").count(), 2);
        let exp = c.expires_at.unwrap();
        assert!(exp > now + Duration::minutes(50) && exp < now + Duration::hours(1));

        let mut other = svid.clone();
        other.spiffe_id = "spiffe://example.org/other".into();
        let err = render_x509_svid(&info, &other, now)
            .unwrap_err()
            .to_string();
        assert!(err.contains("URI SANs"), "{err}");
        let no_cn = agent_svid(&ca, id, "", now);
        let err = render_x509_svid(&info, &no_cn, now)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no subject CN"), "{err}");
        let system = agent_svid(&ca, id, "system:admin", now);
        assert!(render_x509_svid(&info, &system, now).is_err());
        let err = render_x509_svid(&info, &svid, now + Duration::hours(2))
            .unwrap_err()
            .to_string();
        assert!(err.contains("expired"), "{err}");
        let mut garbage = svid.clone();
        garbage.x509_svid.truncate(40);
        assert!(render_x509_svid(&info, &garbage, now).is_err());
        let mut keyless = svid;
        keyless.x509_svid_key.clear();
        assert!(render_x509_svid(&info, &keyless, now).is_err());
    }
}
