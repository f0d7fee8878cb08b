//! Parsing and validating a plugin's stdout as an `ExecCredential`, with client-go's rules
//! plus one of ours (an `expirationTimestamp` must be in the future). Errors name the rule that
//! failed and never include credential values; the only output values they echo are `kind`
//! and `apiVersion`, bounded and with token-like words redacted.

use chrono::{DateTime, Utc};
use serde_json::Value;
use thiserror::Error;

use super::credential::{ClientCertificate, Credential};
use super::secret::{Secret, redact_token_like};
use crate::access::ExecApiVersion;

/// Which output rule a plugin broke.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OutputError {
    /// stdout is neither JSON nor YAML.
    #[error("plugin output is not a JSON (or YAML) document: {0}")]
    NotADocument(String),
    /// The document is not an object.
    #[error("plugin output is not an object")]
    NotAnObject,
    /// `kind` is not `ExecCredential`.
    #[error("plugin output has kind {0:?}, want \"ExecCredential\"")]
    WrongKind(String),
    /// `apiVersion` differs from the configured one.
    #[error(
        "exec plugin is configured to use API version {expected}, plugin returned version {got:?}"
    )]
    ApiVersionMismatch {
        /// Configured version.
        expected: &'static str,
        /// Returned version.
        got: String,
    },
    /// `status` is absent or null.
    #[error("exec plugin didn't return a status field")]
    MissingStatus,
    /// A status field has the wrong JSON type.
    #[error("exec plugin returned status.{0} with the wrong type (want a string)")]
    FieldType(&'static str),
    /// Neither a token nor a certificate/key pair.
    #[error("exec plugin didn't return a token or cert/key pair")]
    NoCredential,
    /// Only one of certificate and key.
    #[error("exec plugin returned only certificate or private key, not both")]
    IncompletePair,
    /// `expirationTimestamp` is not RFC 3339. The value is not shown (a plugin could put
    /// anything there); its length helps tell an empty-ish value from a wrong format.
    #[error(
        "exec plugin returned a status.expirationTimestamp that is not an RFC 3339 timestamp (a {length}-character string; value not shown)"
    )]
    BadExpiry {
        /// Length of the value in characters.
        length: usize,
    },
    /// `expirationTimestamp` is at or before the time the output was read: the credential is
    /// unusable, and accepting it would mean an exec on every request.
    #[error(
        "exec plugin returned a status.expirationTimestamp that is not in the future ({seconds_ago} s at or before now)"
    )]
    ExpiryNotInFuture {
        /// How far in the past (whole seconds, 0 = within the current second).
        seconds_ago: i64,
    },
    /// `clientCertificateData` holds no PEM certificate.
    #[error("exec plugin returned clientCertificateData without a PEM certificate")]
    BadCertificate,
    /// `clientKeyData` holds no PEM private key.
    #[error("exec plugin returned clientKeyData without a PEM private key")]
    BadKey,
}

/// Parses `stdout` into a [`Credential`], checking that it is an `ExecCredential` of the
/// configured version with a valid status that expires (if at all) after now.
pub fn parse_exec_output(
    stdout: &[u8],
    expected: ExecApiVersion,
) -> Result<Credential, OutputError> {
    parse_exec_output_at(stdout, expected, Utc::now())
}

/// [`parse_exec_output`] with an explicit "now" for the expiry rule.
pub fn parse_exec_output_at(
    stdout: &[u8],
    expected: ExecApiVersion,
    now: DateTime<Utc>,
) -> Result<Credential, OutputError> {
    let doc: Value = match serde_json::from_slice(stdout) {
        Ok(v) => v,
        // client-go's decoder accepts YAML too (the reference integration test prints YAML).
        // Garbage that YAML reads as a plain scalar is still reported as "not a document".
        Err(json_err) => match serde_yaml_ng::from_slice::<Value>(stdout) {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(OutputError::NotADocument(json_err.to_string())),
        },
    };
    let obj = doc.as_object().ok_or(OutputError::NotAnObject)?;
    let got_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if got_version != expected.as_str() {
        return Err(OutputError::ApiVersionMismatch {
            expected: expected.as_str(),
            got: bounded(got_version),
        });
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != "ExecCredential" {
        return Err(OutputError::WrongKind(bounded(kind)));
    }
    let status = match obj.get("status") {
        None | Some(Value::Null) => return Err(OutputError::MissingStatus),
        Some(Value::Object(s)) => s,
        Some(_) => return Err(OutputError::MissingStatus),
    };
    let field = |name: &'static str| -> Result<Option<String>, OutputError> {
        match status.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(OutputError::FieldType(name)),
        }
    };
    let token = field("token")?;
    let cert = field("clientCertificateData")?;
    let key = field("clientKeyData")?;
    let expiry = field("expirationTimestamp")?;
    if cert.is_some() != key.is_some() {
        return Err(OutputError::IncompletePair);
    }
    if token.is_none() && cert.is_none() {
        return Err(OutputError::NoCredential);
    }
    let expires_at = match expiry {
        None => None,
        Some(ts) => {
            let exp = DateTime::parse_from_rfc3339(&ts)
                .map_err(|_| OutputError::BadExpiry {
                    length: ts.chars().count(),
                })?
                .with_timezone(&Utc);
            if exp <= now {
                return Err(OutputError::ExpiryNotInFuture {
                    seconds_ago: (now - exp).num_seconds(),
                });
            }
            Some(exp)
        }
    };
    let client_certificate = match (cert, key) {
        (Some(cert), Some(key)) => {
            validate_cert_pem(&cert)?;
            validate_key_pem(&key)?;
            Some(ClientCertificate {
                certificate_pem: cert,
                key_pem: Secret::new(key),
            })
        }
        _ => None,
    };
    Ok(Credential {
        token: token.map(Secret::new),
        client_certificate,
        expires_at,
    })
}

/// An echoed output value (`kind`, `apiVersion`): at most 64 characters, token-like words
/// redacted, since a misbehaving plugin could put anything there.
fn bounded(s: &str) -> String {
    redact_token_like(&s.chars().take(64).collect::<String>())
}

fn validate_cert_pem(pem: &str) -> Result<(), OutputError> {
    let mut reader = pem.as_bytes();
    let certs: Vec<_> = rustls_pemfile::certs(&mut reader)
        .collect::<Result<_, _>>()
        .map_err(|_| OutputError::BadCertificate)?;
    if certs.is_empty() {
        return Err(OutputError::BadCertificate);
    }
    Ok(())
}

fn validate_key_pem(pem: &str) -> Result<(), OutputError> {
    let mut reader = pem.as_bytes();
    match rustls_pemfile::private_key(&mut reader) {
        Ok(Some(_)) => Ok(()),
        _ => Err(OutputError::BadKey),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: ExecApiVersion = ExecApiVersion::V1;

    #[test]
    fn token_with_expiry() {
        let c = parse_exec_output(
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"abc","expirationTimestamp":"2099-01-02T03:04:05Z"}}"#,
            V1,
        )
        .unwrap();
        assert_eq!(c.token.unwrap().expose(), "abc");
        assert_eq!(
            c.expires_at.unwrap().to_rfc3339(),
            "2099-01-02T03:04:05+00:00"
        );
    }

    #[test]
    fn yaml_output_is_accepted() {
        let c = parse_exec_output(b"apiVersion: client.authentication.k8s.io/v1\nkind: ExecCredential\nstatus:\n  token: t\n", V1).unwrap();
        assert!(c.expires_at.is_none());
    }

    #[test]
    fn rule_violations() {
        let cases: &[(&[u8], OutputError)] = &[
            (b"not json {", OutputError::NotADocument(String::new())),
            (b"{unterminated: [", OutputError::NotADocument(String::new())),
            (b"[1]", OutputError::NotAnObject),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}"#, OutputError::ApiVersionMismatch { expected: "client.authentication.k8s.io/v1", got: "client.authentication.k8s.io/v1beta1".into() }),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Other","status":{"token":"t"}}"#, OutputError::WrongKind("Other".into())),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#, OutputError::MissingStatus),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#, OutputError::NoCredential),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":5}}"#, OutputError::FieldType("token")),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"x"}}"#, OutputError::IncompletePair),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t","expirationTimestamp":"tomorrow"}}"#, OutputError::BadExpiry { length: 8 }),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"x","clientKeyData":"y"}}"#, OutputError::BadCertificate),
        ];
        for (input, want) in cases {
            let got = parse_exec_output(input, V1).unwrap_err();
            match (want, &got) {
                (OutputError::NotADocument(_), OutputError::NotADocument(_)) => {}
                _ => assert_eq!(&got, want, "{}", String::from_utf8_lossy(input)),
            }
        }
    }

    #[test]
    fn expiry_rules_never_echo_the_value() {
        let at = |ts: &str| {
            format!(
                r#"{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"t","expirationTimestamp":"{ts}"}}}}"#
            )
        };
        let now = DateTime::parse_from_rfc3339("2030-01-01T00:00:10Z")
            .unwrap()
            .with_timezone(&Utc);
        let secretish = "s3cr3t-Tok3n-in-the-expiry-field";
        let err = parse_exec_output_at(at(secretish).as_bytes(), V1, now).unwrap_err();
        assert_eq!(err, OutputError::BadExpiry { length: 32 });
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert!(err.to_string().contains("expirationTimestamp"), "{err}");
        // At or before now: refused, saying by how much.
        for (ts, ago) in [("2030-01-01T00:00:10Z", 0), ("2030-01-01T00:00:00Z", 10)] {
            let err = parse_exec_output_at(at(ts).as_bytes(), V1, now).unwrap_err();
            assert_eq!(err, OutputError::ExpiryNotInFuture { seconds_ago: ago });
            assert!(
                err.to_string()
                    .contains("status.expirationTimestamp that is not in the future"),
                "{err}"
            );
        }
        let ok = parse_exec_output_at(at("2030-01-01T00:00:11Z").as_bytes(), V1, now).unwrap();
        assert!(ok.expires_at.is_some());
    }

    #[test]
    fn echoed_kind_is_redacted() {
        let err = parse_exec_output(
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Ab3dE9xQ7z","status":{"token":"t"}}"#,
            V1,
        )
        .unwrap_err();
        assert!(!err.to_string().contains("Ab3dE9xQ7z"), "{err}");
    }
}
