//! Parsing and validating a plugin's stdout as an `ExecCredential`, with client-go's rules
//! plus one of ours (an `expirationTimestamp` must be in the future). Errors name the rule that
//! failed and never include what the plugin printed (they reach status objects): an
//! `apiVersion` is named only when it is one of the protocol's own versions, any other value
//! is described by its length and a hash ([`Echo`]).

use chrono::{DateTime, Utc};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::credential::{ClientCertificate, Credential};
use super::secret::Secret;
use crate::access::ExecApiVersion;

/// The ExecCredential API versions client-go has known: a plugin returning one of them is
/// named in the error (the value is the protocol's, not a secret).
const KNOWN_API_VERSIONS: [&str; 3] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
];

/// A value the plugin printed where the protocol expects a fixed one, as an error may show
/// it: named when it is one of the protocol's own values, else only its length and the
/// first 12 hex digits of its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Echo {
    /// Absent, empty or not a string.
    Missing,
    /// A value the protocol defines.
    Known(&'static str),
    /// Anything else.
    Other {
        /// Length in characters.
        chars: usize,
        /// First 12 hex digits of the SHA-256 of the value.
        sha256: String,
    },
}

impl Echo {
    /// Describes `value`, naming it only when it is in `known`.
    pub fn of(value: &str, known: &[&'static str]) -> Self {
        if value.is_empty() {
            return Echo::Missing;
        }
        if let Some(k) = known.iter().find(|k| **k == value) {
            return Echo::Known(k);
        }
        let mut sha256 = hex::encode(Sha256::digest(value.as_bytes()));
        sha256.truncate(12);
        Echo::Other {
            chars: value.chars().count(),
            sha256,
        }
    }
}

impl std::fmt::Display for Echo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Echo::Missing => f.write_str("none"),
            Echo::Known(v) => write!(f, "{v:?}"),
            Echo::Other { chars, sha256 } => write!(
                f,
                "another value ({chars} characters, sha256:{sha256}; not shown)"
            ),
        }
    }
}

/// Which output rule a plugin broke.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OutputError {
    /// stdout is neither JSON nor YAML. Only where the JSON parser gave up is shown (its
    /// messages are not guaranteed to leave the input out).
    #[error(
        "plugin output is not a JSON (or YAML) document ({stdout_bytes} bytes; JSON {problem} at line {line}, column {column})"
    )]
    NotADocument {
        /// Size of stdout.
        stdout_bytes: usize,
        /// `syntax error`, `unexpected end of input`, …
        problem: &'static str,
        /// Line of the error (1-based).
        line: usize,
        /// Column of the error (1-based).
        column: usize,
    },
    /// The document is not an object.
    #[error("plugin output is not an object")]
    NotAnObject,
    /// `kind` is not `ExecCredential`.
    #[error("plugin output has kind {0}, want \"ExecCredential\"")]
    WrongKind(Echo),
    /// `apiVersion` differs from the configured one.
    #[error(
        "exec plugin is configured to use API version {expected}, plugin returned version {got}"
    )]
    ApiVersionMismatch {
        /// Configured version.
        expected: &'static str,
        /// Returned version.
        got: Echo,
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
        Err(json_err) => match kleym_api::yaml::from_slice::<Value>(stdout) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                use serde_json::error::Category;
                return Err(OutputError::NotADocument {
                    stdout_bytes: stdout.len(),
                    problem: match json_err.classify() {
                        Category::Eof => "unexpected end of input",
                        Category::Syntax => "syntax error",
                        Category::Data => "data error",
                        Category::Io => "read error",
                    },
                    line: json_err.line(),
                    column: json_err.column(),
                });
            }
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
            got: Echo::of(got_version, &KNOWN_API_VERSIONS),
        });
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != "ExecCredential" {
        return Err(OutputError::WrongKind(Echo::of(kind, &[])));
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

fn validate_cert_pem(pem: &str) -> Result<(), OutputError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| OutputError::BadCertificate)?;
    if certs.is_empty() {
        return Err(OutputError::BadCertificate);
    }
    Ok(())
}

fn validate_key_pem(pem: &str) -> Result<(), OutputError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map(|_| ())
        .map_err(|_| OutputError::BadKey)
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
            (b"not json {", OutputError::NotADocument { stdout_bytes: 10, problem: "syntax error", line: 1, column: 2 }),
            (b"{unterminated: [", OutputError::NotADocument { stdout_bytes: 16, problem: "syntax error", line: 1, column: 2 }),
            (b"[1]", OutputError::NotAnObject),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}"#, OutputError::ApiVersionMismatch { expected: "client.authentication.k8s.io/v1", got: Echo::Known("client.authentication.k8s.io/v1beta1") }),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Other","status":{"token":"t"}}"#, OutputError::WrongKind(Echo::of("Other", &[]))),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#, OutputError::MissingStatus),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#, OutputError::NoCredential),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":5}}"#, OutputError::FieldType("token")),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"x"}}"#, OutputError::IncompletePair),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t","expirationTimestamp":"tomorrow"}}"#, OutputError::BadExpiry { length: 8 }),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"x","clientKeyData":"y"}}"#, OutputError::BadCertificate),
        ];
        for (input, want) in cases {
            let got = parse_exec_output(input, V1).unwrap_err();
            assert_eq!(&got, want, "{}", String::from_utf8_lossy(input));
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

    /// Whatever a plugin prints where a rule expects something else, its error (which
    /// reaches status objects) names the rule, never the text.
    #[test]
    fn plugin_output_never_reaches_the_error() {
        let secret = "swordfishcorrecthorse";
        let v1 = "client.authentication.k8s.io/v1";
        for out in [
            format!("client secret is {secret}"),
            format!("{{\"status\": {{\"token\": \"{secret}\""),
            format!("{{\"token\": {secret}}}"),
            format!(
                r#"{{"apiVersion":"{secret}","kind":"ExecCredential","status":{{"token":"t"}}}}"#
            ),
            format!(r#"{{"apiVersion":"{v1}","kind":"{secret}","status":{{"token":"t"}}}}"#),
            format!(
                r#"{{"apiVersion":"{v1}","kind":"ExecCredential","status":{{"token":"t","expirationTimestamp":"{secret}"}}}}"#
            ),
        ] {
            let err = parse_exec_output(out.as_bytes(), V1).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains(secret), "{out}: {shown}");
            assert!(!shown.contains("swordfish"), "{out}: {shown}");
        }
        let err = parse_exec_output(
            format!(r#"{{"apiVersion":"{secret}","kind":"ExecCredential"}}"#).as_bytes(),
            V1,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("another value (21 characters, sha256:"),
            "{err}"
        );
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
