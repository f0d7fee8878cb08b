//! Whether a spoke enforces kleym's admission policy (the `ValidatingAdmissionPolicy` that
//! `kleym trust-config` prints and `kleym_spoke::admission_policy` generates).
//!
//! The hub asks the spoke's API server itself, as its own user, with a server-side dry run
//! (`dryRun=All`, nothing is stored) of a ClusterSPIFFEID that the policy forbids but that
//! is otherwise exactly what kleym writes: kleym's name form, labels and owner annotation,
//! one pinned namespace, an ID under `/ns/<namespace>/`, and `spec.admin: true`. Denied by
//! a `ValidatingAdmissionPolicy`: the policy is in force. Accepted: the spoke would let a
//! stolen hub credential mint admin identities, which the status shows as a warning. Any
//! other answer (RBAC without `create`, the CRD missing, an error) says nothing about the
//! policy and is reported as unknown, never as missing.

use std::time::Duration;

use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::compiler::output::{NAMESPACE_NAME_LABEL, cluster_spiffe_id_name, output_labels};
use kleym_spoke::ownership::OWNER_ANNOTATION;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The namespace the probe object claims (it need not exist: nothing is stored).
pub const PROBE_NAMESPACE: &str = "kleym-admission-probe";
/// The binding the probe object claims to come from.
pub const PROBE_BINDING: &str = "admin-probe";

/// What the last check found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum AdmissionPolicyCheck {
    /// A `ValidatingAdmissionPolicy` denied the forbidden object; `policy` is its name as
    /// the denial gave it (empty when the name was not a plain object name).
    Installed {
        /// The denying policy's name.
        policy: String,
    },
    /// The dry run of the forbidden object would have succeeded.
    Missing,
    /// The dry run says nothing about the policy; `why` says what happened.
    Unknown {
        /// What the spoke answered (no credential material).
        why: String,
    },
}

impl AdmissionPolicyCheck {
    /// The `state` label of `kleym_hub_spoke_admission_policy`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Installed { .. } => "installed",
            Self::Missing => "missing",
            Self::Unknown { .. } => "unknown",
        }
    }
}

/// The ClusterSPIFFEID the probe dry-runs: kleym-shaped in every respect the policy checks,
/// except `spec.admin`.
pub fn probe_object(trust_domain: &str) -> serde_json::Value {
    let ns = PROBE_NAMESPACE;
    let labels: serde_json::Map<String, serde_json::Value> = output_labels(ns, PROBE_BINDING)
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {
            "name": cluster_spiffe_id_name(ns, PROBE_BINDING),
            "labels": labels,
            // A UID no binding has: the object is never stored.
            "annotations": {OWNER_ANNOTATION: format!("{ns}/{PROBE_BINDING}/00000000-0000-0000-0000-000000000000")},
        },
        "spec": {
            "spiffeIDTemplate": format!("spiffe://{trust_domain}/ns/{ns}/admission-probe"),
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}},
            "podSelector": {"matchLabels": {"kleym.io/admission-probe": "true"}},
            "workloadSelectorTemplates": [format!("k8s:ns:{ns}"), "k8s:sa:admission-probe"],
            "admin": true,
        },
    })
}

/// Dry-runs [`probe_object`] on the spoke as the hub's user, bounded by `timeout`. The
/// flag says whether the spoke answered at all (`false`: the request failed or timed out
/// on the way, and the result is [`AdmissionPolicyCheck::Unknown`]).
pub async fn check(
    client: &kube::Client,
    trust_domain: &str,
    timeout: Duration,
) -> (AdmissionPolicyCheck, bool) {
    let obj: ClusterSPIFFEID = match serde_json::from_value(probe_object(trust_domain)) {
        Ok(o) => o,
        Err(e) => {
            let why = format!("building the probe object: {e}");
            return (AdmissionPolicyCheck::Unknown { why }, false);
        }
    };
    let api: Api<ClusterSPIFFEID> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match tokio::time::timeout(timeout, api.create(&params, &obj)).await {
        Ok(r) => {
            let answered = !matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_)));
            (classify(r.map(|_| ())), answered)
        }
        Err(_) => {
            let why = format!("the dry run got no answer within {}s", timeout.as_secs());
            (AdmissionPolicyCheck::Unknown { why }, false)
        }
    }
}

/// The longest message part taken from a spoke's answer.
const MAX_QUOTED: usize = 200;

/// What the answer to the dry run means.
pub fn classify(result: Result<(), kube::Error>) -> AdmissionPolicyCheck {
    let ae = match result {
        Ok(()) => return AdmissionPolicyCheck::Missing,
        Err(kube::Error::Api(ae)) => ae,
        Err(e) => {
            return AdmissionPolicyCheck::Unknown {
                why: format!("the dry run failed: {}", shorten(&e.to_string())),
            };
        }
    };
    const MARK: &str = "ValidatingAdmissionPolicy '";
    if (400..500).contains(&ae.code)
        && let Some(at) = ae.message.find(MARK)
    {
        let rest = &ae.message[at + MARK.len()..];
        let name = rest.split('\'').next().unwrap_or_default();
        // The spoke wrote this; only a plain object name is repeated.
        let plain = name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        return AdmissionPolicyCheck::Installed {
            policy: if plain {
                name.to_string()
            } else {
                String::new()
            },
        };
    }
    let why = match ae.code {
        403 => "the hub's user may not create ClusterSPIFFEIDs here (403 Forbidden by RBAC), \
                so the dry run cannot tell"
            .to_string(),
        404 => "the ClusterSPIFFEID CRD is not served (404)".to_string(),
        409 => format!(
            "a ClusterSPIFFEID named {} already exists (409)",
            cluster_spiffe_id_name(PROBE_NAMESPACE, PROBE_BINDING)
        ),
        code => format!(
            "the dry run was answered {code} {}: {}",
            shorten(&ae.reason),
            shorten(&ae.message)
        ),
    };
    AdmissionPolicyCheck::Unknown { why }
}

fn shorten(s: &str) -> String {
    if s.len() <= MAX_QUOTED {
        return s.to_string();
    }
    let mut end = MAX_QUOTED;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> Result<(), kube::Error> {
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(message, reason).with_code(code),
        )))
    }

    #[test]
    fn a_policy_denial_means_installed_and_anything_else_is_no_alarm() {
        let denial = "clusterspiffeids.spire.spiffe.io \"kleym-x-0123456789\" is forbidden: \
                      ValidatingAdmissionPolicy 'kleym-hub-bounds' with binding 'kleym-hub-bounds' \
                      denied request: spec.admin is set";
        assert_eq!(
            classify(api(403, "Forbidden", denial)),
            AdmissionPolicyCheck::Installed {
                policy: "kleym-hub-bounds".into()
            }
        );
        assert_eq!(
            classify(api(
                422,
                "Invalid",
                &denial.replace("kleym-hub-bounds'", "Evil Name'")
            )),
            AdmissionPolicyCheck::Installed {
                policy: String::new()
            }
        );
        assert_eq!(classify(Ok(())), AdmissionPolicyCheck::Missing);
        // RBAC, a missing CRD, a name taken, a server error: unknown, never missing.
        for (code, reason, message) in [
            (
                403,
                "Forbidden",
                "clusterspiffeids is forbidden: User \"hub\" cannot create",
            ),
            (
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
            (409, "AlreadyExists", "already exists"),
            (500, "InternalError", "etcd is unhappy"),
            (
                503,
                "ServiceUnavailable",
                "ValidatingAdmissionPolicy 'x' is unavailable",
            ),
        ] {
            let got = classify(api(code, reason, message));
            assert!(
                matches!(got, AdmissionPolicyCheck::Unknown { .. }),
                "{code}: {got:?}"
            );
        }
    }

    #[test]
    fn the_probe_is_kleym_shaped_but_admin() {
        let o = probe_object("example.org");
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("kleym-kleym-admission-probe-admin-probe-"),
            "{name}"
        );
        assert_eq!(o["spec"]["admin"], json!(true));
        assert_eq!(
            o["spec"]["spiffeIDTemplate"],
            json!("spiffe://example.org/ns/kleym-admission-probe/admission-probe")
        );
        let typed: ClusterSPIFFEID = serde_json::from_value(o).unwrap();
        assert_eq!(typed.spec.admin, Some(true));
    }
}
