//! The pure engage/refuse decision for one ClusterProfile.

use kleym_api::external::clusterprofile::ClusterProfile;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::access::{AccessProfile, EffectiveAccess, ProviderSet, SelectOptions, select};

/// Profile property naming the spoke's SPIFFE trust domain.
pub const TRUST_DOMAIN_PROPERTY: &str = "kleym.io/trust-domain";
/// Profile property naming the SPIRE Controller Manager class of the spoke.
pub const SPIRE_CLASS_PROPERTY: &str = "kleym.io/spire-class-name";

/// Hub-wide inventory settings (from `kleym hub` flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryOptions {
    /// Condition type that must be `True` to engage; `None` engages regardless of conditions.
    pub engage_condition: Option<String>,
    /// Default trust domain when the profile has no `kleym.io/trust-domain` property.
    pub trust_domain: Option<String>,
    /// Default SPIRE class when the profile has no `kleym.io/spire-class-name` property.
    pub spire_class_name: Option<String>,
    /// Provider selection switches.
    pub select: SelectOptions,
    /// The most providers one profile may offer (`accessProviders` and
    /// `credentialProviders` each); a profile offering more is refused. Selection is
    /// linear in the offer, and no real cluster has this many ways in.
    pub max_offered_providers: usize,
}

/// Default of [`InventoryOptions::max_offered_providers`] (`--clusterprofile-max-providers`).
pub const DEFAULT_MAX_OFFERED_PROVIDERS: usize = 16;

impl Default for InventoryOptions {
    fn default() -> Self {
        Self {
            engage_condition: Some(
                kleym_api::external::clusterprofile::CONTROL_PLANE_HEALTHY.to_string(),
            ),
            trust_domain: None,
            spire_class_name: None,
            select: SelectOptions::default(),
            max_offered_providers: DEFAULT_MAX_OFFERED_PROVIDERS,
        }
    }
}

/// The per-spoke reconciler settings taken from the profile (or the hub defaults).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpokeSettings {
    /// SPIFFE trust domain.
    pub trust_domain: String,
    /// SPIRE Controller Manager class, if any.
    pub spire_class_name: Option<String>,
}

/// Everything that decides how a spoke is engaged. Two equal specs mean "nothing to
/// re-engage": profile heartbeats (condition times, unrelated properties) do not change it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpokeSpec {
    /// Spoke name `<namespace>/<name>`.
    pub name: String,
    /// The effective access configuration.
    pub access: EffectiveAccess,
    /// The reconciler settings.
    pub settings: SpokeSettings,
}

/// What to do with one ClusterProfile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Engage (or keep engaged) with this spec.
    Engage(Box<SpokeSpec>),
    /// Valid but not to be engaged now (the engage condition is not `True`).
    Waiting {
        /// Why.
        reason: String,
    },
    /// Unusable: no matching provider, bad server URL or CA, bad extensions, no trust domain.
    Refused {
        /// Why, naming the field or rule.
        reason: String,
    },
}

/// Everything [`evaluate`] reads from a ClusterProfile, and nothing else: the access view,
/// the two kleym properties, the conditions without their times, and what did not decode.
/// Two profiles with equal inputs get the same decision, so the inventory watch forwards a
/// profile only when its inputs change (a status heartbeat — new condition or property
/// times, other properties, the version — is not forwarded and not re-logged).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionInputs {
    /// The access view (spoke name and offered providers).
    pub access: AccessProfile,
    /// The `kleym.io/trust-domain` property, trimmed (`None` when absent or empty).
    pub trust_domain: Option<String>,
    /// The `kleym.io/spire-class-name` property, trimmed (`None` when absent or empty).
    pub spire_class_name: Option<String>,
    /// `(type, status, reason, message)` of every condition, in order.
    pub conditions: Vec<(String, String, String, String)>,
    /// What of the received profile did not decode (`path: message`).
    pub decode_issues: Vec<String>,
}

impl DecisionInputs {
    /// Extracts the inputs from a (possibly partly undecodable) profile.
    pub fn from_profile(cp: &ClusterProfile) -> Self {
        let status = cp.status.as_ref();
        let property = |name: &str| -> Option<String> {
            status?
                .properties
                .as_ref()?
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.value.trim())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        Self {
            access: AccessProfile::from_cluster_profile(cp),
            trust_domain: property(TRUST_DOMAIN_PROPERTY),
            spire_class_name: property(SPIRE_CLASS_PROPERTY),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .map(|cs| {
                    cs.iter()
                        .map(|c| {
                            (
                                c.type_.clone(),
                                c.status.clone(),
                                c.reason.clone(),
                                c.message.clone(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            decode_issues: cp
                .spec
                .decode_issues
                .iter()
                .chain(status.map(|s| s.decode_issues.as_slice()).unwrap_or(&[]))
                .map(ToString::to_string)
                .collect(),
        }
    }

    /// A digest of the inputs (SHA-256 of their JSON form): equal digests, equal decisions.
    pub fn digest(&self) -> [u8; 32] {
        // Serializing strings, vectors and JSON values cannot fail.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&bytes).into()
    }
}

fn condition_true(inputs: &DecisionInputs, ty: &str) -> Result<(), String> {
    match inputs.conditions.iter().find(|c| c.0 == ty) {
        Some((_, status, _, _)) if status == "True" => Ok(()),
        Some((_, status, reason, message)) => {
            Err(format!("condition {ty} is {status} ({reason}: {message})"))
        }
        None => Err(format!("condition {ty} is not reported")),
    }
}

/// A trust domain as SPIFFE allows it: lowercase letters, digits, `.`, `-`, `_`; at most
/// 255 bytes. The identity compiler's own rule, so that a profile engaged with it never
/// has every binding refused as `InvalidTrustDomain`.
pub fn valid_trust_domain(td: &str) -> bool {
    kleym_spoke::compiler::spiffe_id::TrustDomain::parse(td).is_ok()
}

/// Decides what to do with `cp`. Pure; never panics on any profile content.
pub fn evaluate(cp: &ClusterProfile, providers: &ProviderSet, opts: &InventoryOptions) -> Decision {
    evaluate_inputs(&DecisionInputs::from_profile(cp), providers, opts)
}

/// [`evaluate`] on already extracted inputs.
pub fn evaluate_inputs(
    inputs: &DecisionInputs,
    providers: &ProviderSet,
    opts: &InventoryOptions,
) -> Decision {
    let profile = &inputs.access;
    if !inputs.decode_issues.is_empty() {
        return Decision::Refused {
            reason: format!(
                "cluster profile {:?} does not decode: {}",
                profile.spoke_name(),
                inputs.decode_issues.join("; ")
            ),
        };
    }
    for (field, offered) in [
        ("status.accessProviders", profile.access_providers.len()),
        (
            "status.credentialProviders",
            profile.credential_providers.len(),
        ),
    ] {
        if offered > opts.max_offered_providers {
            return Decision::Refused {
                reason: format!(
                    "cluster profile {:?}: {field} offers {offered} providers; this hub reads \
                     at most {} (--clusterprofile-max-providers)",
                    profile.spoke_name(),
                    opts.max_offered_providers
                ),
            };
        }
    }
    let access = match select(providers, profile, &opts.select) {
        Ok(a) => a,
        Err(e) => {
            return Decision::Refused {
                reason: e.to_string(),
            };
        }
    };
    let trust_domain = match inputs
        .trust_domain
        .as_deref()
        .or(opts.trust_domain.as_deref())
    {
        Some(td) if valid_trust_domain(td) => td.to_string(),
        Some(td) => {
            return Decision::Refused {
                reason: format!(
                    "trust domain {td:?} is invalid (lowercase letters, digits, '.', '-', '_')"
                ),
            };
        }
        None => {
            return Decision::Refused {
                reason: format!(
                    "no trust domain: set the profile property {TRUST_DOMAIN_PROPERTY} or --trust-domain"
                ),
            };
        }
    };
    if let Some(ty) = &opts.engage_condition
        && let Err(reason) = condition_true(inputs, ty)
    {
        return Decision::Waiting { reason };
    }
    Decision::Engage(Box::new(SpokeSpec {
        name: profile.spoke_name(),
        access,
        settings: SpokeSettings {
            trust_domain,
            spire_class_name: inputs
                .spire_class_name
                .clone()
                .or_else(|| opts.spire_class_name.clone()),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A self-signed certificate is enough for selection (it only parses the PEM).
    fn ca_b64() -> String {
        use base64::Engine as _;
        static CA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        CA.get_or_init(|| {
            let cert = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
            base64::engine::general_purpose::STANDARD.encode(cert.cert.pem())
        })
        .clone()
    }

    fn providers() -> ProviderSet {
        ProviderSet::load(None, &["tok=/bin/echo hi".to_string()]).unwrap()
    }

    fn profile(status: serde_json::Value) -> ClusterProfile {
        serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "test"}},
            "status": status
        }))
        .unwrap()
    }

    fn healthy(extra_props: serde_json::Value, heartbeat: &str) -> ClusterProfile {
        profile(json!({
            "accessProviders": [{"name": "tok", "cluster": {
                "server": "https://10.0.0.1:6443", "certificate-authority-data": ca_b64()}}],
            "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "Ok",
                "message": "", "lastTransitionTime": heartbeat}],
            "properties": extra_props
        }))
    }

    fn opts() -> InventoryOptions {
        InventoryOptions {
            trust_domain: Some("default.example".into()),
            ..InventoryOptions::default()
        }
    }

    #[test]
    fn engages_healthy_profile_with_property_overrides() {
        let cp = healthy(
            json!([{"name": TRUST_DOMAIN_PROPERTY, "value": "east.example"},
                   {"name": SPIRE_CLASS_PROPERTY, "value": "spire-east"}]),
            "2026-01-01T00:00:00Z",
        );
        let Decision::Engage(spec) = evaluate(&cp, &providers(), &opts()) else {
            panic!("expected engage");
        };
        assert_eq!(spec.name, "fleet/c1");
        assert_eq!(spec.settings.trust_domain, "east.example");
        assert_eq!(
            spec.settings.spire_class_name.as_deref(),
            Some("spire-east")
        );
        assert_eq!(spec.access.provider, "tok");
    }

    #[test]
    fn heartbeats_do_not_change_the_spec() {
        let a = evaluate(
            &healthy(json!([]), "2026-01-01T00:00:00Z"),
            &providers(),
            &opts(),
        );
        let b = evaluate(
            &healthy(
                json!([{"name": "other", "value": "x"}]),
                "2026-01-02T00:00:00Z",
            ),
            &providers(),
            &opts(),
        );
        assert!(matches!(a, Decision::Engage(_)));
        assert_eq!(a, b);
    }

    #[test]
    fn waits_when_not_healthy_unless_disabled() {
        let cp = profile(json!({
            "accessProviders": [{"name": "tok", "cluster": {"server": "https://10.0.0.1:6443"}}],
            "conditions": [{"type": "ControlPlaneHealthy", "status": "False", "reason": "Down",
                "message": "probe failed", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }));
        let d = evaluate(&cp, &providers(), &opts());
        assert!(
            matches!(&d, Decision::Waiting { reason } if reason.contains("False") && reason.contains("probe failed")),
            "{d:?}"
        );
        let disabled = InventoryOptions {
            engage_condition: None,
            ..opts()
        };
        assert!(matches!(
            evaluate(&cp, &providers(), &disabled),
            Decision::Engage(_)
        ));
    }

    #[test]
    fn refuses_unusable_profiles_with_reasons() {
        let cases = [
            (
                json!({"accessProviders": [{"name": "other", "cluster": {"server": "https://h"}}]}),
                "no matching cluster accessor",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {"server": "not a url"}}]}),
                "server",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {"server": "https://h",
                "certificate-authority-data": "bm90IGEgY2VydA=="}}]}),
                "certificate-authority-data",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {"server": "https://h",
                "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {}},
                               {"name": "client.authentication.k8s.io/exec", "extension": {}}]}}]}),
                "extension",
            ),
        ];
        for (status, needle) in cases {
            let d = evaluate(&profile(status.clone()), &providers(), &opts());
            assert!(
                matches!(&d, Decision::Refused { reason } if reason.contains(needle)),
                "{status}: {d:?}"
            );
        }
        let no_td = InventoryOptions {
            trust_domain: None,
            engage_condition: None,
            ..opts()
        };
        let cp = profile(
            json!({"accessProviders": [{"name": "tok", "cluster": {"server": "https://h"}}]}),
        );
        assert!(
            matches!(evaluate(&cp, &providers(), &no_td), Decision::Refused { reason } if reason.contains("trust domain"))
        );
    }

    /// `status` as a v1alpha2 object read through v1alpha2 (what the hub's watch makes of it).
    fn profile_v1alpha2(status: serde_json::Value) -> ClusterProfile {
        use kleym_api::external::clusterprofile::{ClusterProfileVersion, VersionedClusterProfile};
        let obj: VersionedClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha2",
            "kind": "ClusterProfile",
            "metadata": {"name": "c1", "namespace": "fleet"},
            "spec": {"clusterManager": {"name": "test"}},
            "status": status
        }))
        .unwrap();
        ClusterProfile::from_versioned(obj, ClusterProfileVersion::V1alpha2)
    }

    #[test]
    fn v1alpha2_profiles_kleym_cannot_use_are_refused_naming_the_field() {
        let ok = |name: &str| json!({"name": name, "cluster": {"server": "https://h"}});
        let many: Vec<_> = (0..=DEFAULT_MAX_OFFERED_PROVIDERS)
            .map(|i| ok(&format!("p{i}")))
            .collect();
        let cases = [
            (
                json!({"accessProviders": [ok("other")]}),
                "no matching cluster accessor",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {"server": "https://h",
                "certificate-authority-data": "bm90IGEgY2VydA=="}}]}),
                "certificate-authority-data",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {"server": "https://h",
                "extensions": [{"name": "example.com/unknown", "extension": {"a": 1}},
                               {"name": "example.com/unknown", "extension": {}}]}}]}),
                "extension",
            ),
            (
                json!({"accessProviders": many}),
                "status.accessProviders offers 17 providers",
            ),
            // v1alpha2 has no credentialProviders: a profile offering only those offers nothing.
            (json!({"credentialProviders": [ok("tok")]}), "offers []"),
        ];
        for (status, needle) in cases {
            let d = evaluate(&profile_v1alpha2(status.clone()), &providers(), &opts());
            assert!(
                matches!(&d, Decision::Refused { reason } if reason.contains(needle)),
                "{status}: {d:?}"
            );
        }
        // The same content read as v1alpha1 keeps credentialProviders and engages.
        let v1 = profile(json!({"credentialProviders": [ok("tok")]}));
        let lenient = InventoryOptions {
            engage_condition: None,
            ..opts()
        };
        assert!(matches!(
            evaluate(&v1, &providers(), &lenient),
            Decision::Engage(_)
        ));
    }

    #[test]
    fn undecodable_profiles_are_refused_naming_the_field() {
        let cases = [
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {
                    "server": "https://10.0.0.1:6443", "certificate-authority-data": "QR=="}}],
                    "conditions": [{"type": "ControlPlaneHealthy", "status": "True",
                        "reason": "Ok", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
                "status.accessProviders[0].cluster.certificate-authority-data",
            ),
            (
                json!({"accessProviders": [{"name": "tok", "cluster": {
                    "server": "https://10.0.0.1:6443"}}],
                    "conditions": [{"type": "ControlPlaneHealthy", "status": "True",
                        "reason": "Ok", "message": "", "lastTransitionTime": "2026-01-01T00:00:00"}]}),
                "status.conditions[0].lastTransitionTime",
            ),
        ];
        for (status, field) in cases {
            let d = evaluate(&profile(status.clone()), &providers(), &opts());
            assert!(
                matches!(&d, Decision::Refused { reason }
                    if reason.contains(field) && reason.contains("fleet/c1")),
                "{status}: {d:?}"
            );
        }
    }

    #[test]
    fn decision_inputs_ignore_heartbeats_but_see_every_input() {
        let digest = |cp: &ClusterProfile| DecisionInputs::from_profile(cp).digest();
        let base = healthy(
            json!([{"name": TRUST_DOMAIN_PROPERTY, "value": "a.example", "lastObservedTime": "2026-01-01T00:00:00Z"}]),
            "2026-01-01T00:00:00Z",
        );
        let heartbeat = healthy(
            json!([{"name": TRUST_DOMAIN_PROPERTY, "value": "a.example", "lastObservedTime": "2026-01-02T00:00:00Z"},
                   {"name": "vendor.example/zone", "value": "z1"}]),
            "2026-01-02T00:00:00Z",
        );
        assert_eq!(digest(&base), digest(&heartbeat));
        let td = healthy(
            json!([{"name": TRUST_DOMAIN_PROPERTY, "value": "b.example"}]),
            "2026-01-01T00:00:00Z",
        );
        let class = healthy(
            json!([{"name": TRUST_DOMAIN_PROPERTY, "value": "a.example"},
                   {"name": SPIRE_CLASS_PROPERTY, "value": "c"}]),
            "2026-01-01T00:00:00Z",
        );
        let mut sick = base.clone();
        if let Some(c) = sick
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.status = "False".into();
        }
        let mut moved = base.clone();
        if let Some(p) = moved
            .status
            .as_mut()
            .and_then(|s| s.access_providers.as_mut())
            .and_then(|p| p.first_mut())
            .and_then(|p| p.cluster.as_mut())
        {
            p.server = "https://10.0.0.2:6443".into();
        }
        for changed in [td, class, sick, moved] {
            assert_ne!(digest(&base), digest(&changed), "{changed:?}");
        }
    }
}
