//! What a spoke's operator applies so that the spoke trusts the hub's JWT-SVIDs (`kleym
//! trust-config`): the `AuthenticationConfiguration` `jwt` entry for the spoke's API server
//! and the RBAC that binds the mapped user to the spoke ClusterRole of `deploy/spoke/`.
//! Pure: no I/O.

use serde_json::{Value, json};

use crate::access::AccessProfile;
use crate::access::audience::{AUDIENCE_KEY, derived_audience, validate_audience};

/// The spoke ClusterRole (`deploy/spoke/clusterrole.yaml`), embedded.
pub const SPOKE_CLUSTER_ROLE_YAML: &str = include_str!("../../../deploy/spoke/clusterrole.yaml");
/// Name of the ClusterRoleBinding printed for the hub's identity: apart from the hub
/// chart's own `<release>-hub` ClusterRoleBinding, which a hub cluster that is also its own
/// spoke holds beside it.
pub const BINDING_NAME: &str = "kleym-hub-access";
/// The optional spoke ClusterRole for `kleym explain --hub-url`
/// (`deploy/spoke/explain-clusterrole.yaml`), embedded.
pub const EXPLAIN_CLUSTER_ROLE_YAML: &str =
    include_str!("../../../deploy/spoke/explain-clusterrole.yaml");
/// Name of the ClusterRoleBinding of the hub's identity to [`EXPLAIN_CLUSTER_ROLE_YAML`].
pub const EXPLAIN_BINDING_NAME: &str = "kleym-hub-explain";
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
    /// `apiVersion` of the printed `AuthenticationConfiguration` (see
    /// [`authentication_api_version`]).
    pub authentication_api_version: &'static str,
    /// Bind [`TrustInputs::subject`] as a group instead of a user (credentials whose
    /// identity the spoke's own authenticators establish).
    pub bind_group: bool,
}

impl TrustInputs {
    /// The username each spoke maps the hub's token to.
    pub fn username(&self) -> String {
        format!("{}{}", self.username_prefix, self.subject)
    }
}

/// The `apiserver.config.k8s.io` version of `AuthenticationConfiguration` that a spoke API
/// server of Kubernetes `1.<minor>` reads: `v1alpha1` from 1.29 (behind the
/// `StructuredAuthenticationConfiguration` feature gate, off by default there), `v1beta1`
/// from 1.30 (gate on by default) and `v1` from 1.34 (GA). Later servers still read
/// `v1beta1`, so the oldest version a fleet runs decides.
pub fn authentication_api_version(minor: u32) -> Result<&'static str, String> {
    match minor {
        0..=28 => Err(format!(
            "Kubernetes 1.{minor} has no structured authentication configuration \
             (--authentication-config needs 1.29 with the StructuredAuthenticationConfiguration \
             feature gate, or 1.30 and later)"
        )),
        29 => Ok("apiserver.config.k8s.io/v1alpha1"),
        30..=33 => Ok("apiserver.config.k8s.io/v1beta1"),
        _ => Ok("apiserver.config.k8s.io/v1"),
    }
}

/// Parses a Kubernetes version as `--apiserver-version` takes it (`1.30`, `v1.33`,
/// `1.34.2`) into its minor number.
pub fn parse_kubernetes_minor(text: &str) -> Result<u32, String> {
    let bad = || format!("{text:?}: expected a Kubernetes version such as 1.30 or v1.34.1");
    let rest = text.strip_prefix('v').unwrap_or(text);
    let mut parts = rest.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    if major != "1" || parts.clone().count() > 1 {
        return Err(bad());
    }
    if let Some(patch) = parts.next()
        && (patch.is_empty() || !patch.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    minor.parse().map_err(|_| bad())
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
        "apiVersion": inputs.authentication_api_version,
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

/// The ClusterRoleBinding of the hub's user (or group) to the spoke ClusterRole: the one
/// binding of the hub's identity in a spoke, whatever the credential.
pub fn cluster_role_binding(inputs: &TrustInputs) -> Value {
    let kind = if inputs.bind_group { "Group" } else { "User" };
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": BINDING_NAME,
            "labels": {"app.kubernetes.io/name": "kleym", "app.kubernetes.io/component": "hub-access"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kleym-spoke"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": inputs.username()}],
    })
}

/// The ClusterRoleBinding of the hub's user (or group) to the optional explain reader role:
/// printed only when the operator opts in, since it lets the hub's credential read pod specs.
pub fn explain_role_binding(inputs: &TrustInputs) -> Value {
    let mut b = cluster_role_binding(inputs);
    b["metadata"]["name"] = json!(EXPLAIN_BINDING_NAME);
    b["metadata"]["labels"]["app.kubernetes.io/component"] = json!("hub-explain");
    b["roleRef"]["name"] = json!("kleym-explain-reader");
    b
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
            authentication_api_version: "apiserver.config.k8s.io/v1beta1",
            bind_group: false,
        }
    }

    #[test]
    fn authentication_config_version_follows_the_spoke_kubernetes_version() {
        let v = |t: &str| authentication_api_version(parse_kubernetes_minor(t).unwrap());
        assert!(v("1.28").is_err());
        assert_eq!(v("1.29").unwrap(), "apiserver.config.k8s.io/v1alpha1");
        assert_eq!(v("v1.30").unwrap(), "apiserver.config.k8s.io/v1beta1");
        assert_eq!(v("1.33.4").unwrap(), "apiserver.config.k8s.io/v1beta1");
        assert_eq!(v("1.34").unwrap(), "apiserver.config.k8s.io/v1");
        assert_eq!(v("1.40").unwrap(), "apiserver.config.k8s.io/v1");
        for bad in ["", "1", "2.30", "1.x", "1.30.", "1.30.1.2", "v", "1..3"] {
            assert!(parse_kubernetes_minor(bad).is_err(), "{bad:?}");
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
        assert_eq!(c["apiVersion"], "apiserver.config.k8s.io/v1beta1");
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
        assert_eq!(b["subjects"][0]["kind"], "User");
        let g = cluster_role_binding(&TrustInputs {
            subject: "eks:kleym-hub".into(),
            username_prefix: String::new(),
            bind_group: true,
            ..inputs()
        });
        assert_eq!(
            g["subjects"][0],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "eks:kleym-hub"})
        );
        assert!(SPOKE_CLUSTER_ROLE_YAML.contains("name: kleym-spoke"));
        assert_eq!(cel_string("a'b\\c"), r"'a\'b\\c'");
    }
}
