//! Structured authentication: a real `apiserver.config.k8s.io` `AuthenticationConfiguration`
//! with `jwt[]` authenticators, validated and evaluated as kube-apiserver does. The API
//! versions accepted are those of the Kubernetes release kubesim reports at `/version`
//! (1.33): `v1beta1` and `v1alpha1`; `v1` is served from 1.34 on and refused here, as a
//! 1.33 API server refuses it.
//!
//! Supported: `issuer.url`, `issuer.discoveryURL`, `issuer.certificateAuthority`,
//! `issuer.audiences`, `issuer.audienceMatchPolicy`, `claimValidationRules` (`claim` +
//! `requiredValue`, or CEL `expression` + `message`), `claimMappings.username` and
//! `claimMappings.groups` (`claim` + `prefix`, or `expression`), `claimMappings.uid` (`claim`
//! or `expression`), `userValidationRules` (CEL `expression` + `message`). Refused at load
//! with the field named: everything else (`issuer.egressSelectorType`, `claimMappings.extra`,
//! `anonymous`, unknown fields).
//!
//! Discovery: `<issuer.url>/.well-known/openid-configuration` (or `discoveryURL`) over HTTPS
//! trusting only `certificateAuthority`; its `issuer` must equal `issuer.url`; keys come from
//! the `jwks_uri` it names and are refetched on an unknown `kid`, rate limited.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kubesim_schema::expr::CelExpression;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::external::{ExternalIssuer, ExternalIssuerConfig};
use crate::{AuthError, Result, UserInfo};

/// The API versions of `AuthenticationConfiguration` accepted: those kube-apiserver 1.33
/// decodes (`v1alpha1` since 1.29, `v1beta1` since 1.30; `v1` only from 1.34).
pub const API_VERSIONS: &[&str] = &[
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    jwt: Vec<Value>,
    #[serde(default)]
    anonymous: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawJwt {
    issuer: RawIssuer,
    #[serde(default)]
    claim_validation_rules: Vec<RawClaimRule>,
    claim_mappings: RawClaimMappings,
    #[serde(default)]
    user_validation_rules: Vec<RawUserRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawIssuer {
    #[serde(default)]
    url: String,
    #[serde(default, rename = "discoveryURL")]
    discovery_url: Option<String>,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default)]
    audience_match_policy: Option<String>,
    #[serde(default)]
    egress_selector_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawClaimRule {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    required_value: Option<String>,
    #[serde(default)]
    expression: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPrefixedClaim {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    expression: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawClaimMappings {
    #[serde(default)]
    username: RawPrefixedClaim,
    #[serde(default)]
    groups: Option<RawPrefixedClaim>,
    #[serde(default)]
    uid: Option<RawPrefixedClaim>,
    #[serde(default)]
    extra: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawUserRule {
    #[serde(default)]
    expression: String,
    #[serde(default)]
    message: Option<String>,
}

/// How a claim becomes a user attribute.
#[derive(Debug, Clone)]
enum Mapping {
    Claim { claim: String, prefix: String },
    Expression(CelExpression),
}

/// One claim validation rule.
#[derive(Debug, Clone)]
enum ClaimRule {
    Required {
        claim: String,
        value: String,
    },
    Expression {
        expr: CelExpression,
        message: String,
    },
}

/// One validated `jwt` authenticator with its issuer's key cache.
#[derive(Debug)]
pub struct JwtAuthenticator {
    issuer: ExternalIssuer,
    claim_rules: Vec<ClaimRule>,
    username: Mapping,
    groups: Option<Mapping>,
    uid: Option<Mapping>,
    user_rules: Vec<(CelExpression, String)>,
}

/// A validated `AuthenticationConfiguration`: its `jwt` authenticators, in order.
#[derive(Debug)]
pub struct AuthenticationConfiguration {
    /// The authenticators (issuer URLs are unique).
    pub jwt: Vec<JwtAuthenticator>,
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> AuthError {
    AuthError::InvalidRequest(format!("{field}: {msg}"))
}

fn unsupported(field: &str) -> AuthError {
    AuthError::InvalidRequest(format!(
        "{field}: Unsupported: kubesim does not implement it"
    ))
}

/// Checks an issuer or discovery URL as kube-apiserver does: https, a host, no user info,
/// query or fragment.
fn check_https_url(field: &str, url: &str) -> Result<()> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(field, format!("Invalid value: {url:?}: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid(
            field,
            format!("Invalid value: {url:?}: URL scheme must be https"),
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid(
            field,
            format!("Invalid value: {url:?}: URL must have a host"),
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(invalid(
            field,
            format!("Invalid value: {url:?}: URL must not contain a username or password"),
        ));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(invalid(
            field,
            format!("Invalid value: {url:?}: URL must not contain a query or fragment"),
        ));
    }
    Ok(())
}

fn compile(field: &str, text: &str, variable: &str) -> Result<CelExpression> {
    let e = CelExpression::compile(text)
        .map_err(|m| invalid(field, format!("Invalid value: {text:?}: {m}")))?;
    let other = if variable == "claims" {
        "user"
    } else {
        "claims"
    };
    if e.uses_variable(other) {
        return Err(invalid(
            field,
            format!("Invalid value: {text:?}: undeclared reference to '{other}'"),
        ));
    }
    Ok(e)
}

fn mapping(field: &str, raw: &RawPrefixedClaim, prefix_allowed: bool) -> Result<Mapping> {
    match (&raw.claim, &raw.expression) {
        (Some(_), Some(_)) => Err(invalid(
            field,
            "Invalid value: claim and expression can't both be set",
        )),
        (None, None) | (Some(_), None) | (None, Some(_))
            if raw.claim.as_deref().is_some_and(str::is_empty)
                || raw.expression.as_deref().is_some_and(str::is_empty) =>
        {
            Err(invalid(
                field,
                "Required value: claim or expression is required",
            ))
        }
        (None, None) => Err(invalid(
            field,
            "Required value: claim or expression is required",
        )),
        (Some(claim), None) => {
            let prefix = match (&raw.prefix, prefix_allowed) {
                (Some(p), true) => p.clone(),
                (None, true) => {
                    return Err(invalid(
                        &format!("{field}.prefix"),
                        "Required value: prefix is required when claim is set. It can be set to an empty string to disable prefixing",
                    ));
                }
                (_, false) => String::new(),
            };
            Ok(Mapping::Claim {
                claim: claim.clone(),
                prefix,
            })
        }
        (None, Some(text)) => {
            if raw.prefix.is_some() {
                return Err(invalid(
                    &format!("{field}.prefix"),
                    "Invalid value: may not be specified when expression is set",
                ));
            }
            Ok(Mapping::Expression(compile(
                &format!("{field}.expression"),
                text,
                "claims",
            )?))
        }
    }
}

impl AuthenticationConfiguration {
    /// Parses and validates a configuration (already decoded from YAML or JSON). Errors name
    /// the field, like kube-apiserver's validation (`jwt[0].issuer.url: ...`).
    pub fn from_value(value: &Value) -> Result<Self> {
        Self::from_value_with(value, Duration::from_secs(10))
    }

    /// As [`Self::from_value`], with the minimum interval between JWKS refetches caused by an
    /// unknown `kid` (kube-apiserver's is fixed; tests rotate keys faster).
    pub fn from_value_with(value: &Value, min_refetch_interval: Duration) -> Result<Self> {
        let raw: RawConfig = serde_json::from_value(value.clone())
            .map_err(|e| invalid("AuthenticationConfiguration", e))?;
        if !API_VERSIONS.contains(&raw.api_version.as_str()) {
            return Err(invalid(
                "apiVersion",
                format!(
                    "Unsupported value: {:?}: supported values: {}",
                    raw.api_version,
                    API_VERSIONS.join(", ")
                ),
            ));
        }
        if raw.kind != "AuthenticationConfiguration" {
            return Err(invalid(
                "kind",
                format!(
                    "Unsupported value: {:?}: expected AuthenticationConfiguration",
                    raw.kind
                ),
            ));
        }
        if raw.anonymous.is_some() {
            return Err(unsupported("anonymous"));
        }
        let mut seen = BTreeSet::new();
        let mut jwt = Vec::new();
        for (i, v) in raw.jwt.iter().enumerate() {
            let field = format!("jwt[{i}]");
            let r: RawJwt = serde_json::from_value(v.clone()).map_err(|e| invalid(&field, e))?;
            let a = JwtAuthenticator::from_raw(&field, r, min_refetch_interval)?;
            let url = a.issuer_url().to_string();
            if !seen.insert(url.clone()) {
                return Err(invalid(
                    &format!("{field}.issuer.url"),
                    format!("Duplicate value: {url:?}"),
                ));
            }
            jwt.push(a);
        }
        Ok(AuthenticationConfiguration { jwt })
    }
}

impl JwtAuthenticator {
    fn from_raw(field: &str, r: RawJwt, min_refetch_interval: Duration) -> Result<Self> {
        let f = |s: &str| format!("{field}.{s}");
        let iss = &r.issuer;
        if iss.url.is_empty() {
            return Err(invalid(&f("issuer.url"), "Required value: URL is required"));
        }
        check_https_url(&f("issuer.url"), &iss.url)?;
        if let Some(d) = &iss.discovery_url {
            check_https_url(&f("issuer.discoveryURL"), d)?;
            if d.trim_end_matches('/') == iss.url.trim_end_matches('/') {
                return Err(invalid(
                    &f("issuer.discoveryURL"),
                    format!("Invalid value: {d:?}: discoveryURL must be different from URL"),
                ));
            }
        }
        if iss.egress_selector_type.is_some() {
            return Err(unsupported(&f("issuer.egressSelectorType")));
        }
        if iss.audiences.is_empty() {
            return Err(invalid(
                &f("issuer.audiences"),
                "Required value: at least one issuer.audiences is required",
            ));
        }
        let mut auds = BTreeSet::new();
        for (j, a) in iss.audiences.iter().enumerate() {
            if a.is_empty() {
                return Err(invalid(
                    &f(&format!("issuer.audiences[{j}]")),
                    "Required value: audience can't be empty",
                ));
            }
            if !auds.insert(a) {
                return Err(invalid(
                    &f(&format!("issuer.audiences[{j}]")),
                    format!("Duplicate value: {a:?}"),
                ));
            }
        }
        match (iss.audiences.len(), iss.audience_match_policy.as_deref()) {
            (_, Some("MatchAny")) | (1, None | Some("")) => {}
            (_, Some(p)) if !p.is_empty() => {
                return Err(invalid(
                    &f("issuer.audienceMatchPolicy"),
                    format!("Unsupported value: {p:?}: supported values: \"MatchAny\""),
                ));
            }
            _ => {
                return Err(invalid(
                    &f("issuer.audienceMatchPolicy"),
                    "Invalid value: \"\": audienceMatchPolicy must be MatchAny for multiple audiences",
                ));
            }
        }
        let ca = iss.certificate_authority.clone().unwrap_or_default();
        if ca.is_empty() {
            // kube-apiserver would use the host's roots; kubesim only trusts what it is given.
            return Err(invalid(
                &f("issuer.certificateAuthority"),
                "Required value: kubesim trusts no system roots: give the issuer's CA",
            ));
        }
        crate::pki::root_store_from_pem(&ca).map_err(|e| {
            invalid(
                &f("issuer.certificateAuthority"),
                format!("Invalid value: {e}"),
            )
        })?;
        let discovery = iss.discovery_url.clone().unwrap_or_else(|| {
            format!(
                "{}/.well-known/openid-configuration",
                iss.url.trim_end_matches('/')
            )
        });
        let config =
            ExternalIssuerConfig::with_discovery(&iss.url, iss.audiences.clone(), &discovery, &ca);
        let issuer = ExternalIssuer::new(config)
            .map_err(|e| invalid(&f("issuer"), e))?
            .with_min_refetch_interval(min_refetch_interval);

        let mut claim_rules = Vec::new();
        let mut claims_seen = BTreeSet::new();
        for (j, rule) in r.claim_validation_rules.iter().enumerate() {
            let rf = f(&format!("claimValidationRules[{j}]"));
            match (&rule.claim, &rule.expression) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        &rf,
                        "Invalid value: claim and expression can't both be set",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        &rf,
                        "Required value: claim or expression is required",
                    ));
                }
                (Some(claim), None) => {
                    if rule.message.is_some() {
                        return Err(invalid(
                            &format!("{rf}.message"),
                            "Invalid value: message can't be set when claim is set",
                        ));
                    }
                    if !claims_seen.insert(claim.clone()) {
                        return Err(invalid(
                            &format!("{rf}.claim"),
                            format!("Duplicate value: {claim:?}"),
                        ));
                    }
                    claim_rules.push(ClaimRule::Required {
                        claim: claim.clone(),
                        value: rule.required_value.clone().unwrap_or_default(),
                    });
                }
                (None, Some(text)) => {
                    if rule.required_value.is_some() {
                        return Err(invalid(
                            &format!("{rf}.requiredValue"),
                            "Invalid value: requiredValue can't be set when expression is set",
                        ));
                    }
                    claim_rules.push(ClaimRule::Expression {
                        expr: compile(&format!("{rf}.expression"), text, "claims")?,
                        message: rule.message.clone().unwrap_or_default(),
                    });
                }
            }
        }
        let m = &r.claim_mappings;
        if m.extra.is_some() {
            return Err(unsupported(&f("claimMappings.extra")));
        }
        let username = mapping(&f("claimMappings.username"), &m.username, true)?;
        let groups = match &m.groups {
            Some(g) if g.claim.is_some() || g.expression.is_some() => {
                Some(mapping(&f("claimMappings.groups"), g, true)?)
            }
            _ => None,
        };
        let uid = match &m.uid {
            Some(u) if u.prefix.is_some() => {
                return Err(invalid(
                    &f("claimMappings.uid.prefix"),
                    "Forbidden: uid has no prefix",
                ));
            }
            Some(u) if u.claim.is_some() || u.expression.is_some() => {
                Some(mapping(&f("claimMappings.uid"), u, false)?)
            }
            _ => None,
        };
        let mut user_rules = Vec::new();
        for (j, rule) in r.user_validation_rules.iter().enumerate() {
            let rf = f(&format!("userValidationRules[{j}].expression"));
            if rule.expression.is_empty() {
                return Err(invalid(&rf, "Required value: expression is required"));
            }
            user_rules.push((
                compile(&rf, &rule.expression, "user")?,
                rule.message.clone().unwrap_or_default(),
            ));
        }
        Ok(JwtAuthenticator {
            issuer,
            claim_rules,
            username,
            groups,
            uid,
            user_rules,
        })
    }

    /// `issuer.url`: the `iss` this authenticator verifies.
    pub fn issuer_url(&self) -> &str {
        &self.issuer.config().issuer
    }

    /// How many discovery/JWKS fetches were attempted (for tests).
    pub fn fetch_count(&self) -> u64 {
        self.issuer.fetch_count()
    }

    /// Verifies `token` as of `now` and maps it to a user: signature, `iss`, `aud`, `exp`,
    /// `nbf`, the claim validation rules, the claim mappings, the user validation rules.
    /// Errors never contain the token.
    pub async fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<UserInfo> {
        let claims = self.issuer.verify_claims(token, now).await?;
        self.map(&claims)
    }

    fn map(&self, claims: &Map<String, Value>) -> Result<UserInfo> {
        let bad = |m: String| AuthError::InvalidToken(m);
        let claims_value = Value::Object(claims.clone());
        let eval = |e: &CelExpression| {
            e.evaluate(&[("claims", &claims_value)])
                .map_err(|m| bad(format!("expression {:?}: {m}", e.text())))
        };
        for rule in &self.claim_rules {
            match rule {
                ClaimRule::Required { claim, value } => match claims.get(claim) {
                    Some(Value::String(s)) if s == value => {}
                    Some(Value::String(_)) => {
                        return Err(bad(format!("required claim {claim} value does not match")));
                    }
                    Some(_) => return Err(bad(format!("required claim {claim} is not a string"))),
                    None => return Err(bad(format!("required claim {claim} not found"))),
                },
                ClaimRule::Expression { expr, message } => match eval(expr)? {
                    Value::Bool(true) => {}
                    Value::Bool(false) => {
                        return Err(bad(format!(
                            "claim validation rule failed: {}",
                            if message.is_empty() {
                                expr.text()
                            } else {
                                message
                            }
                        )));
                    }
                    _ => {
                        return Err(bad(format!(
                            "expression {:?} must return bool",
                            expr.text()
                        )));
                    }
                },
            }
        }
        let username = match &self.username {
            Mapping::Claim { claim, prefix } => {
                let v = claims
                    .get(claim)
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("claim not present: {claim}")))?;
                if claim == "email"
                    && claims
                        .get("email_verified")
                        .is_some_and(|v| v != &Value::Bool(true))
                {
                    return Err(bad("email_verified claim must be true".into()));
                }
                format!("{prefix}{v}")
            }
            Mapping::Expression(e) => match eval(e)? {
                Value::String(s) => s,
                _ => return Err(bad("username expression must return a string".into())),
            },
        };
        if username.is_empty() {
            return Err(bad("username is empty".into()));
        }
        let strings = |v: Value, what: &str| -> Result<Vec<String>> {
            match v {
                Value::Null => Ok(Vec::new()),
                Value::String(s) => Ok(vec![s]),
                Value::Array(a) => a
                    .into_iter()
                    .map(|x| match x {
                        Value::String(s) => Ok(s),
                        _ => Err(bad(format!("{what} must be a string or a list of strings"))),
                    })
                    .collect(),
                _ => Err(bad(format!("{what} must be a string or a list of strings"))),
            }
        };
        let groups = match &self.groups {
            None => Vec::new(),
            Some(Mapping::Claim { claim, prefix }) => strings(
                claims.get(claim).cloned().unwrap_or(Value::Null),
                "groups claim",
            )?
            .into_iter()
            .map(|g| format!("{prefix}{g}"))
            .collect(),
            Some(Mapping::Expression(e)) => strings(eval(e)?, "groups expression")?,
        };
        let uid = match &self.uid {
            None => String::new(),
            Some(Mapping::Claim { claim, .. }) => claims
                .get(claim)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            Some(Mapping::Expression(e)) => match eval(e)? {
                Value::String(s) => s,
                _ => return Err(bad("uid expression must return a string".into())),
            },
        };
        let user = UserInfo {
            username,
            uid,
            groups,
            ..Default::default()
        };
        let user_value = json!({
            "username": user.username,
            "uid": user.uid,
            "groups": user.groups,
            "extra": {},
        });
        for (expr, message) in &self.user_rules {
            match expr.evaluate(&[("user", &user_value)]) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    return Err(bad(format!(
                        "user validation rule failed: {}",
                        if message.is_empty() {
                            expr.text()
                        } else {
                            message
                        }
                    )));
                }
                Ok(_) => {
                    return Err(bad(format!(
                        "expression {:?} must return bool",
                        expr.text()
                    )));
                }
                Err(m) => return Err(bad(format!("expression {:?}: {m}", expr.text()))),
            }
        }
        Ok(user.with_authenticated_group())
    }
}

#[cfg(test)]
mod tests;
