//! The hub's X.509 CA for `kleym credential spiffe-x509`: a P-256 CA kept in a Secret of its
//! own (`x509-ca.crt`, `x509-ca.key`; see [`super::ca`]), and X.509-SVIDs it signs: URI SAN =
//! the SPIFFE ID, CN = the username spokes map (client-certificate authentication),
//! client-auth only, short TTL.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::IssuerError;

/// Data key of the CA certificate (PEM).
pub const CA_CERT_KEY: &str = "x509-ca.crt";
/// Data key of the CA private key (PKCS#8 PEM).
pub const CA_KEY_KEY: &str = "x509-ca.key";
/// Data key of the next CA's certificate during a CA rotation (trusted ahead, not signing).
pub const NEXT_CA_CERT_KEY: &str = "x509-ca-next.crt";
/// Data key of the next CA's private key (PKCS#8 PEM).
pub const NEXT_CA_KEY_KEY: &str = "x509-ca-next.key";
/// Data key of the bundle spokes trust for client certificates: the current CA, the next one
/// during a rotation, and replaced ones until every SVID they signed has expired.
pub const CA_BUNDLE_KEY: &str = "x509-ca-bundle.crt";
/// Every data key of the CA: in the CA Secret, and in a key Secret written before the CA had
/// a Secret of its own.
pub const LEGACY_CA_DATA_KEYS: [&str; 5] = [
    CA_CERT_KEY,
    CA_KEY_KEY,
    NEXT_CA_CERT_KEY,
    NEXT_CA_KEY_KEY,
    CA_BUNDLE_KEY,
];
/// How long a replaced CA stays in the bundle: the longest X.509-SVID lifetime (24 h) plus
/// the verifiers' clock skew.
pub const CA_OVERLAP_SECONDS: i64 = 86_400 + super::rotation::SKEW_SECONDS;
/// Validity of a generated CA (days).
pub const CA_VALIDITY_DAYS: i64 = 365;
/// The leader's periodic rotation adds a next CA to the bundle this long before the current
/// one expires: the time operators have to give every spoke the new bundle.
pub const CA_PUBLISH_AHEAD_SECONDS: i64 = 30 * 86_400;
/// ... and makes it sign this long before the current one expires (after 23 days in the
/// bundle), leaving room for the longest SVID and the replaced CA's overlap.
pub const CA_SWITCH_AHEAD_SECONDS: i64 = 7 * 86_400;

/// The CA: its certificate and key (PEM). The key is never logged (`Debug` omits it).
#[derive(Clone)]
pub struct HubCa {
    /// The CA certificate, PEM (what spokes add to their client CAs).
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for HubCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubCa").finish_non_exhaustive()
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> IssuerError {
    IssuerError::Key(format!("{what}: {e}"))
}

fn to_offset(t: chrono::DateTime<chrono::Utc>) -> Result<time::OffsetDateTime, IssuerError> {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|e| err("time", e))
}

impl HubCa {
    /// A new CA valid from `now` for [`CA_VALIDITY_DAYS`].
    pub fn generate(now: chrono::DateTime<chrono::Utc>) -> Result<Self, IssuerError> {
        let key = KeyPair::generate().map_err(|e| err("generating the CA key", e))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kleym hub X.509-SVID CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = to_offset(now - chrono::Duration::minutes(5))?;
        params.not_after = to_offset(now + chrono::Duration::days(CA_VALIDITY_DAYS))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| err("signing the CA certificate", e))?;
        Ok(HubCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA of a Secret's data, checked (`origin` names the Secret in errors).
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &str) -> Result<Self, IssuerError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| err(&format!("{origin} data[{CA_KEY_KEY}]"), e))?;
        Issuer::from_ca_cert_pem(cert_pem, &key)
            .map_err(|e| err(&format!("{origin} data[{CA_CERT_KEY}]"), e))?;
        Ok(HubCa {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    /// When the CA certificate expires (unix seconds).
    pub fn not_after(&self) -> Result<i64, IssuerError> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| err("CA certificate PEM", e))?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&der).map_err(|e| err("CA certificate", e))?;
        Ok(cert.validity().not_after.timestamp())
    }

    /// The private key PEM (to write into the Secret only).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// An X.509-SVID for `spiffe_id` with CN `common_name`, valid from `now` (minus a minute
    /// of skew) for `ttl`: `(certificate PEM, private key PEM, not after)`.
    pub fn issue_svid(
        &self,
        spiffe_id: &str,
        common_name: &str,
        now: chrono::DateTime<chrono::Utc>,
        ttl: chrono::Duration,
    ) -> Result<(String, String, chrono::DateTime<chrono::Utc>), IssuerError> {
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(|e| err("CA key", e))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)
            .map_err(|e| err("CA certificate", e))?;
        let key = KeyPair::generate().map_err(|e| err("generating the SVID key", e))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.subject_alt_names = vec![SanType::URI(
            spiffe_id
                .try_into()
                .map_err(|e| err("SPIFFE ID as a URI SAN", e))?,
        )];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyAgreement,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let not_after = now + ttl;
        params.not_before = to_offset(now - chrono::Duration::minutes(1))?;
        params.not_after = to_offset(not_after)?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| err("signing the SVID", e))?;
        Ok((cert.pem(), key.serialize_pem(), not_after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svid_names_the_spiffe_id_and_the_user_and_chains_to_the_ca() {
        let now = chrono::Utc::now();
        let ca = HubCa::generate(now).unwrap();
        let again = HubCa::from_pem(&ca.cert_pem, ca.key_pem(), "secret kleym/issuer").unwrap();
        assert!(!format!("{again:?}").contains("PRIVATE"));
        let (cert, key, not_after) = ca
            .issue_svid(
                "spiffe://example.org/kleym/hub",
                "kleym:spiffe://example.org/kleym/hub",
                now,
                chrono::Duration::hours(1),
            )
            .unwrap();
        assert!(key.contains("PRIVATE KEY"));
        assert_eq!(not_after, now + chrono::Duration::hours(1));
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = parsed.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "kleym:spiffe://example.org/kleym/hub");
        let san = parsed.subject_alternative_name().unwrap().unwrap();
        assert!(format!("{:?}", san.value).contains("spiffe://example.org/kleym/hub"));
        let ca_der =
            rustls_pki_types::CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        assert_eq!(parsed.issuer(), ca_parsed.subject());
        assert!(HubCa::from_pem("junk", ca.key_pem(), "secret kleym/issuer").is_err());
    }
}
