//! Prometheus metrics of the credential runtime (registered on a caller-supplied registry).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `kleym_credential_exec_total` and `kleym_credential_exec_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecResultLabels {
    /// Access provider name.
    pub provider: String,
    /// `success` or an error label (`timeout`, `exit_error`, `invalid_output`, …).
    pub result: String,
}

/// Labels of `kleym_issuer_tokens_signed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignedLabels {
    /// `spiffe-jwt` or `spiffe-x509`.
    pub credential_type: String,
    /// Who signed: `hub-key` (the issuer Secret's key or CA) or `workload-api` (a SPIRE agent).
    pub signer: String,
}

/// The SVID type and signer when `exec` runs one of kleym's bundled SPIFFE plugins
/// (`kleym credential spiffe-jwt|spiffe-x509`): each successful run of it is one credential
/// signed, in the plugin's own process, so the hub counts them here.
pub fn bundled_spiffe_plugin(exec: &crate::access::ExecConfig) -> Option<SignedLabels> {
    let program = std::path::Path::new(&exec.command).file_name()?;
    if program != "kleym" || exec.args.first().map(String::as_str) != Some("credential") {
        return None;
    }
    let credential_type = match exec.args.get(1).map(String::as_str) {
        Some(t @ ("spiffe-jwt" | "spiffe-x509")) => t,
        _ => return None,
    };
    let from_agent = exec
        .args
        .iter()
        .any(|a| a == "--workload-api-socket" || a.starts_with("--workload-api-socket="));
    Some(SignedLabels {
        credential_type: credential_type.into(),
        signer: if from_agent {
            "workload-api"
        } else {
            "hub-key"
        }
        .into(),
    })
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~41 s
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Exec counters and latency histogram. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct CredentialMetrics {
    /// `kleym_credential_exec_total{provider,result}`.
    pub exec_total: Family<ExecResultLabels, Counter>,
    /// `kleym_credential_exec_duration_seconds{provider,result}`.
    pub exec_duration: Family<ExecResultLabels, Histogram, fn() -> Histogram>,
    /// `kleym_issuer_tokens_signed_total{credential_type,signer}`: SVIDs the bundled SPIFFE
    /// plugins returned to this hub.
    pub tokens_signed: Family<SignedLabels, Counter>,
}

impl Default for CredentialMetrics {
    fn default() -> Self {
        Self {
            exec_total: Family::default(),
            exec_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            tokens_signed: Family::default(),
        }
    }
}

impl CredentialMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kleym_credential_exec",
            "Credential plugin executions by provider and result",
            m.exec_total.clone(),
        );
        registry.register(
            "kleym_credential_exec_duration_seconds",
            "Credential plugin execution latency by provider and result",
            m.exec_duration.clone(),
        );
        registry.register(
            "kleym_issuer_tokens_signed",
            "SVIDs (JWT or X.509) the bundled SPIFFE plugins returned, by type and signer",
            m.tokens_signed.clone(),
        );
        m
    }

    /// Records one plugin run.
    pub fn observe(&self, provider: &str, result: &str, elapsed: Duration) {
        let labels = ExecResultLabels {
            provider: provider.to_string(),
            result: result.to_string(),
        };
        self.exec_total.get_or_create(&labels).inc();
        self.exec_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// The current value of `kleym_credential_exec_total{provider,result}`.
    pub fn exec_count(&self, provider: &str, result: &str) -> u64 {
        self.exec_total
            .get_or_create(&ExecResultLabels {
                provider: provider.to_string(),
                result: result.to_string(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{ExecApiVersion, ExecConfig};

    fn exec(command: &str, args: &[&str]) -> ExecConfig {
        ExecConfig {
            api_version: ExecApiVersion::V1,
            command: command.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![],
            provide_cluster_info: true,
            install_hint: None,
        }
    }

    #[test]
    fn bundled_spiffe_plugins_are_recognised_with_their_signer() {
        let got = |c: &str, a: &[&str]| {
            bundled_spiffe_plugin(&exec(c, a)).map(|l| (l.credential_type, l.signer))
        };
        let pair = |t: &str, s: &str| Some((t.to_string(), s.to_string()));
        assert_eq!(
            got(
                "/usr/local/bin/kleym",
                &["credential", "spiffe-jwt", "--issuer-url", "u"]
            ),
            pair("spiffe-jwt", "hub-key")
        );
        assert_eq!(
            got(
                "kleym",
                &[
                    "credential",
                    "spiffe-x509",
                    "--workload-api-socket=unix:///s"
                ]
            ),
            pair("spiffe-x509", "workload-api")
        );
        assert_eq!(
            got(
                "kleym",
                &[
                    "credential",
                    "spiffe-jwt",
                    "--workload-api-socket",
                    "unix:///s"
                ]
            ),
            pair("spiffe-jwt", "workload-api")
        );
        for (c, a) in [
            ("kleym", &["credential", "token-request"][..]),
            ("aws", &["credential", "spiffe-jwt"][..]),
            ("kleym", &["hub"][..]),
            ("kleym", &[][..]),
        ] {
            assert_eq!(got(c, a), None, "{c} {a:?}");
        }
    }

    #[test]
    fn latency_is_labelled_by_provider_and_result() {
        let mut registry = Registry::default();
        let m = CredentialMetrics::register(&mut registry);
        m.observe("eks", "success", Duration::from_millis(20));
        m.observe("eks", "timeout", Duration::from_secs(30));
        m.observe("eks", "timeout", Duration::from_secs(30));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"kleym_credential_exec_duration_seconds_count{provider="eks",result="success"} 1"#,
            r#"kleym_credential_exec_duration_seconds_count{provider="eks",result="timeout"} 2"#,
            r#"kleym_credential_exec_total{provider="eks",result="timeout"} 2"#,
            // The unit is seconds: 20 ms is 0.02 in the sum and in the 0.02 bucket, not in
            // the 0.01 one; two 30 s timeouts sum to 60.
            r#"kleym_credential_exec_duration_seconds_sum{provider="eks",result="success"} 0.02"#,
            r#"kleym_credential_exec_duration_seconds_bucket{le="0.01",provider="eks",result="success"} 0"#,
            r#"kleym_credential_exec_duration_seconds_bucket{le="0.02",provider="eks",result="success"} 1"#,
            r#"kleym_credential_exec_duration_seconds_sum{provider="eks",result="timeout"} 60.0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
