//! What a spoke's operator applies so that the spoke trusts the hub's JWT-SVIDs (`kleym
//! trust-config`): the `AuthenticationConfiguration` `jwt` entry for the spoke's API server
//! and the RBAC that binds the mapped user to the spoke ClusterRole of `deploy/spoke/`.
//! Pure: no I/O.

use serde_json::{Value, json};

use crate::access::AccessProfile;
use crate::access::audience::{AUDIENCE_KEY, derived_audience, validate_audience};

/// The spoke ClusterRole (`deploy/spoke/clusterrole.yaml`), embedded.
pub const SPOKE_CLUSTER_ROLE_YAML: &str = include_str!("../../../deploy/spoke/clusterrole.yaml");
/// Name of the ClusterRoleBinding printed for the hub's user.
pub const BINDING_NAME: &str = "kleym-hub";
/// The kubeconfig extension the exec plugin reads as `spec.cluster.config`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// The hub-wide inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustInputs {
    /// The issuer URL (`iss`).
    pub issuer_url: String,
    /// PEM CA bundle that verifies the issuer listener's certificate.
    pub issuer_ca_pem: String,
    /// The `sub` the spokes pin: the hub's SPIFFE ID (`spiffe-jwt`) or its ServiceAccount's
    /// username (`token-request`).
    pub subject: String,
    /// Prefix of the mapped username (e.g. `kleym:`).
    pub username_prefix: String,
}

impl TrustInputs {
    /// The username each spoke maps the hub's token to.
    pub fn username(&self) -> String {
        format!("{}{}", self.username_prefix, self.subject)
    }
}

/// One spoke as the profile describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpokeTarget {
    /// `<namespace>/<name>` of the ClusterProfile.
    pub spoke: String,
    /// The server URL as the profile gives it.
    pub server: String,
    /// The audience the hub puts in the spoke's tokens: derived from the profile's namespace
    /// and name (see [`crate::access::audience`]), or the exec extension's `audience` when
    /// the provider entry allows it.
    pub audience: String,
    /// During a migration from kleym versions whose audience was the server URL: that URL,
    /// accepted as well.
    pub legacy_audience: Option<String>,
}

/// How `kleym trust-config` chooses each spoke's audience; mirrors the provider entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AudienceRule {
    /// The provider entry says `profileSourcedAudiencePolicy: Allow`: a profile's exec
    /// extension `audience` is the audience.
    pub profile_sourced: bool,
    /// Also accept the server URL, the audience of earlier kleym versions.
    pub legacy_server_audience: bool,
}

/// The spoke a profile describes, from its provider `provider` (else its first provider with a
/// server). Errors name the profile and what is missing.
pub fn spoke_target(
    profile: &AccessProfile,
    provider: Option<&str>,
    rule: AudienceRule,
) -> Result<SpokeTarget, String> {
    let spoke = profile.spoke_name();
    let all = profile
        .access_providers
        .iter()
        .chain(profile.credential_providers.iter());
    let chosen = match provider {
        Some(name) => all.clone().find(|p| p.name == name).ok_or_else(|| {
            format!("ClusterProfile {spoke}: no access provider named {name:?} in status.accessProviders")
        })?,
        None => all
            .clone()
            .find(|p| p.cluster.get("server").and_then(Value::as_str).is_some_and(|s| !s.is_empty()))
            .ok_or_else(|| format!("ClusterProfile {spoke}: no status.accessProviders[].cluster.server"))?,
    };
    let server = chosen
        .cluster
        .get("server")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!(
                "ClusterProfile {spoke}: status.accessProviders[{:?}].cluster.server is empty",
                chosen.name
            )
        })?
        .to_string();
    let from_profile = chosen
        .cluster
        .get("extensions")
        .and_then(Value::as_array)
        .and_then(|exts| {
            exts.iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(EXEC_EXTENSION))
        })
        .and_then(|e| e.get("extension"))
        .and_then(|e| e.get(AUDIENCE_KEY))
        .and_then(Value::as_str)
        .filter(|a| rule.profile_sourced && !a.is_empty());
    let audience = match from_profile {
        Some(a) => {
            validate_audience(a).map_err(|r| {
                format!("ClusterProfile {spoke}: the exec extension's {AUDIENCE_KEY} {r}")
            })?;
            a.to_string()
        }
        None => derived_audience(&profile.namespace, &profile.name),
    };
    Ok(SpokeTarget {
        spoke,
        legacy_audience: rule.legacy_server_audience.then(|| server.clone()),
        server,
        audience,
    })
}

/// Refuses targets that share an audience, naming both profiles: a token for one would be
/// accepted by the other's cluster (the hub refuses such profiles too).
pub fn check_distinct_audiences(targets: &[SpokeTarget]) -> Result<(), String> {
    let mut seen: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for t in targets {
        let all = std::iter::once(&t.audience).chain(t.legacy_audience.as_ref());
        for a in all {
            if let Some(other) = seen.insert(a.as_str(), t.spoke.as_str())
                && other != t.spoke
            {
                return Err(format!(
                    "ClusterProfiles {other} and {} have the same audience {a:?}: a token for \
                     one would be accepted by the other's cluster",
                    t.spoke
                ));
            }
        }
    }
    Ok(())
}

/// The `AuthenticationConfiguration` for one spoke: one `jwt` entry trusting the hub issuer
/// for that spoke's audience only, `sub` pinned to the hub's SPIFFE ID, the username mapped
/// with the prefix, and `system:` usernames refused.
pub fn authentication_configuration(inputs: &TrustInputs, target: &SpokeTarget) -> Value {
    let mut issuer = json!({
        "url": inputs.issuer_url,
        "audiences": [target.audience],
        "certificateAuthority": inputs.issuer_ca_pem,
    });
    if let Some(legacy) = &target.legacy_audience {
        issuer["audiences"] = json!([target.audience, legacy]);
        issuer["audienceMatchPolicy"] = json!("MatchAny");
    }
    json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": issuer,
            "claimValidationRules": [{
                "expression": format!("claims.sub == {}", cel_string(&inputs.subject)),
                "message": format!("only the kleym hub ({}) is accepted", inputs.subject),
            }],
            "claimMappings": {
                "username": {"claim": "sub", "prefix": inputs.username_prefix},
            },
            "userValidationRules": [{
                "expression": "!user.username.startsWith('system:')",
                "message": "system: usernames are reserved",
            }],
        }],
    })
}

/// The ClusterRoleBinding of the hub's user to the spoke ClusterRole.
pub fn cluster_role_binding(inputs: &TrustInputs) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": BINDING_NAME,
            "labels": {"app.kubernetes.io/name": "kleym", "app.kubernetes.io/component": "hub-access"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kleym-spoke"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": inputs.username()}],
    })
}

/// A CEL string literal (single-quoted, escaped).
fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ProfileProvider;

    fn inputs() -> TrustInputs {
        TrustInputs {
            issuer_url: "https://issuer.example.org".into(),
            issuer_ca_pem: "-----BEGIN CERTIFICATE-----\n...\n".into(),
            subject: "spiffe://example.org/kleym/hub".into(),
            username_prefix: "kleym:".into(),
        }
    }

    fn profile(cluster: Value) -> AccessProfile {
        AccessProfile {
            namespace: "fleet".into(),
            name: "a".into(),
            access_providers: vec![ProfileProvider {
                name: "kleym-spiffe-jwt".into(),
                cluster,
            }],
            credential_providers: vec![],
        }
    }

    #[test]
    fn audience_is_the_profiles_identity_unless_the_provider_allows_its_own() {
        let rule = AudienceRule::default();
        let t = spoke_target(&profile(json!({"server": "https://a:6443"})), None, rule).unwrap();
        assert_eq!(
            (t.server.as_str(), t.audience.as_str()),
            ("https://a:6443", "kleym.io/clusterprofile/fleet/a")
        );
        assert_eq!(t.legacy_audience, None);
        // The profile names another spoke's URL as its audience: ignored by default.
        let ext = json!({"server": "https://a:6443", "extensions": [{"name": EXEC_EXTENSION, "extension": {"audience": "https://b:6443"}}]});
        assert_eq!(
            spoke_target(&profile(ext.clone()), None, rule)
                .unwrap()
                .audience,
            "kleym.io/clusterprofile/fleet/a"
        );
        let allow = AudienceRule {
            profile_sourced: true,
            ..rule
        };
        assert_eq!(
            spoke_target(&profile(ext), None, allow).unwrap().audience,
            "https://b:6443"
        );
        let legacy = AudienceRule {
            legacy_server_audience: true,
            ..rule
        };
        let t = spoke_target(&profile(json!({"server": "https://a:6443"})), None, legacy).unwrap();
        assert_eq!(t.legacy_audience.as_deref(), Some("https://a:6443"));
        let c = authentication_configuration(&inputs(), &t);
        assert_eq!(
            c["jwt"][0]["issuer"]["audiences"],
            json!(["kleym.io/clusterprofile/fleet/a", "https://a:6443"])
        );
        assert_eq!(c["jwt"][0]["issuer"]["audienceMatchPolicy"], "MatchAny");
        let err = spoke_target(&profile(json!({})), None, rule).unwrap_err();
        assert!(err.contains("fleet/a"), "{err}");
        let err = spoke_target(
            &profile(json!({"server": "https://a"})),
            Some("other"),
            rule,
        )
        .unwrap_err();
        assert!(err.contains("\"other\""), "{err}");
    }

    #[test]
    fn two_profiles_with_one_audience_are_refused_naming_both() {
        let target = |spoke: &str, audience: &str| SpokeTarget {
            spoke: spoke.into(),
            server: "https://s".into(),
            audience: audience.into(),
            legacy_audience: None,
        };
        assert!(
            check_distinct_audiences(&[target("fleet/a", "x"), target("fleet/b", "y")]).is_ok()
        );
        let err = check_distinct_audiences(&[target("fleet/a", "x"), target("fleet/b", "x")])
            .unwrap_err();
        assert!(err.contains("fleet/a") && err.contains("fleet/b"), "{err}");
        // A legacy server audience counts too.
        let mut b = target("fleet/b", "y");
        b.legacy_audience = Some("x".into());
        assert!(check_distinct_audiences(&[target("fleet/a", "x"), b]).is_err());
    }

    #[test]
    fn documents_pin_the_hub_and_one_audience() {
        let t = spoke_target(
            &profile(json!({"server": "https://a:6443"})),
            None,
            AudienceRule::default(),
        )
        .unwrap();
        let c = authentication_configuration(&inputs(), &t);
        let jwt = &c["jwt"][0];
        assert_eq!(
            jwt["issuer"]["audiences"],
            json!(["kleym.io/clusterprofile/fleet/a"])
        );
        assert!(jwt["issuer"].get("audienceMatchPolicy").is_none());
        assert_eq!(
            jwt["claimValidationRules"][0]["expression"],
            "claims.sub == 'spiffe://example.org/kleym/hub'"
        );
        assert_eq!(jwt["claimMappings"]["username"]["prefix"], "kleym:");
        let b = cluster_role_binding(&inputs());
        assert_eq!(
            b["subjects"][0]["name"],
            "kleym:spiffe://example.org/kleym/hub"
        );
        assert_eq!(b["roleRef"]["name"], "kleym-spoke");
        assert!(SPOKE_CLUSTER_ROLE_YAML.contains("name: kleym-spoke"));
        assert_eq!(cel_string("a'b\\c"), r"'a\'b\\c'");
    }
}
