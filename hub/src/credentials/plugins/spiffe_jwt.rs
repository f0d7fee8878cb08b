//! `kleym credential spiffe-jwt`: an `ExecCredential` whose token is a JWT-SVID signed with
//! the hub's issuer key. `sub` is the hub's SPIFFE ID, `aud` the audience the hub decided for
//! the spoke (`KLEYM_CLUSTER_AUDIENCE`, see [`token_audience`]), `iss` the issuer URL;
//! lifetime at most 15 minutes. The plugin reads the key from the issuer Secret in the hub cluster and
//! keeps it in memory only: it never reaches a file, a log, argv or the environment; only the
//! signed token is printed.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use super::PluginError;
use super::exec_info::{ExecInfo, render_credential, token_audience};
use super::spiffe_id::resolve_hub_spiffe_id;
use super::workload_api::{WorkloadApiOptions, choose, fetch_jwt_svids};
use crate::issuer::keys::{Algorithm, SigningKey};
use crate::issuer::secret::{SecretRef, load_or_create};
use crate::issuer::{MAX_TOKEN_LIFETIME_SECONDS, validate_issuer_url};

/// Default JWT-SVID lifetime (seconds).
pub const DEFAULT_LIFETIME_SECONDS: i64 = 600;

/// What to sign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffeJwtOptions {
    /// The issuer URL (`iss`).
    pub issuer_url: String,
    /// Accept an `http://` issuer URL (`--issuer-insecure-http` of the hub).
    pub allow_http_issuer: bool,
    /// The issuer Secret.
    pub secret: SecretRef,
    /// The algorithm of the signing key.
    pub algorithm: Algorithm,
    /// `--hub-spiffe-id`; default `spiffe://<trust domain>/kleym/hub`.
    pub hub_spiffe_id: Option<String>,
    /// The trust domain (`--trust-domain`, `KLEYM_TRUST_DOMAIN`).
    pub trust_domain: Option<String>,
    /// Lifetime in seconds (60 ..= 900).
    pub lifetime_seconds: i64,
    /// `--audience`: the audience when run outside the hub (see [`token_audience`]).
    pub audience: Option<String>,
}

/// The SPIFFE ID the JWT-SVID names: `--hub-spiffe-id`, else
/// `spiffe://<trust domain>/kleym/hub`. An ID outside the trust domain (when one is given) or
/// not a valid SPIFFE ID is refused.
pub fn hub_spiffe_id(opts: &SpiffeJwtOptions) -> Result<String, PluginError> {
    resolve_hub_spiffe_id(opts.hub_spiffe_id.as_deref(), opts.trust_domain.as_deref())
}

/// The JWT-SVID claims, and when the credential should be considered expired by the caller
/// (a little before `exp`, so its cache refreshes early).
pub fn claims(
    issuer_url: &str,
    sub: &str,
    audience: &str,
    lifetime_seconds: i64,
    now: DateTime<Utc>,
    jti: &str,
) -> (Value, DateTime<Utc>) {
    let iat = now.timestamp();
    let exp = iat + lifetime_seconds;
    let margin = (lifetime_seconds / 10).clamp(1, 60);
    let claims = json!({
        "iss": issuer_url,
        "sub": sub,
        "aud": [audience],
        "iat": iat,
        "nbf": iat,
        "exp": exp,
        "jti": jti,
    });
    (claims, now + Duration::seconds(lifetime_seconds - margin))
}

/// A random `jti` (128 bits, hex).
fn new_jti() -> Result<String, PluginError> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| PluginError::Input("no randomness for jti".into()))?;
    Ok(hex::encode(bytes))
}

/// Signs a JWT-SVID for `info` with `key` as of `now` and renders the ExecCredential.
pub fn sign_credential(
    key: &SigningKey,
    info: &ExecInfo,
    opts: &SpiffeJwtOptions,
    now: DateTime<Utc>,
) -> Result<String, PluginError> {
    validate_issuer_url(&opts.issuer_url, opts.allow_http_issuer)
        .map_err(|e| PluginError::Input(e.to_string()))?;
    if !(60..=MAX_TOKEN_LIFETIME_SECONDS).contains(&opts.lifetime_seconds) {
        return Err(PluginError::Input(format!(
            "--lifetime-seconds must be between 60 and {MAX_TOKEN_LIFETIME_SECONDS}, got {}",
            opts.lifetime_seconds
        )));
    }
    let sub = hub_spiffe_id(opts)?;
    let aud = token_audience(info, opts.audience.as_deref())?;
    let (claims, refresh_at) = claims(
        &opts.issuer_url,
        &sub,
        &aud,
        opts.lifetime_seconds,
        now,
        &new_jti()?,
    );
    let token = key
        .sign_jwt(&claims)
        .map_err(|e| PluginError::Input(e.to_string()))?;
    Ok(render_credential(
        info.api_version,
        &token,
        Some(refresh_at),
    ))
}

/// Runs the plugin against the hub cluster: reads the signing key from the issuer Secret
/// (never creating it) and returns the ExecCredential JSON to print.
pub async fn spiffe_jwt(
    hub: kube::Client,
    info: &ExecInfo,
    opts: &SpiffeJwtOptions,
) -> Result<String, PluginError> {
    let ring = load_or_create(hub, &opts.secret, opts.algorithm, false)
        .await
        .map_err(|e| PluginError::Input(e.to_string()))?;
    let now = Utc::now();
    let key = ring
        .signing(now.timestamp())
        .map_err(|e| PluginError::Input(e.to_string()))?;
    sign_credential(key, info, opts, now)
}

/// Runs the plugin against a SPIRE agent: `FetchJWTSVID` with the spoke's audience, checks
/// the answer, and returns the ExecCredential JSON to print.
pub async fn spiffe_jwt_from_workload_api(
    info: &ExecInfo,
    audience_flag: Option<&str>,
    opts: &WorkloadApiOptions,
) -> Result<String, PluginError> {
    let aud = token_audience(info, audience_flag)?;
    let svids = fetch_jwt_svids(
        &opts.socket,
        &aud,
        opts.hub_spiffe_id.as_deref(),
        opts.timeout,
    )
    .await?;
    let svid = choose(
        &svids,
        |s| s.spiffe_id.as_str(),
        opts.hub_spiffe_id.as_deref(),
        opts.trust_domain.as_deref(),
    )?;
    let refresh_at = check_jwt_svid(&svid.svid, &svid.spiffe_id, &aud, Utc::now())?;
    Ok(render_credential(
        info.api_version,
        &svid.svid,
        Some(refresh_at),
    ))
}

/// Checks that a JWT-SVID from the agent is what was asked for (its `sub` is the SVID's
/// SPIFFE ID, its `aud` holds `audience`, it has not expired) and returns when the caller
/// should refresh it (a little before `exp`). The signature is the spoke's to verify; the
/// claims are read only so that a wrong token fails here, named, rather than as a 401 later.
/// Messages never contain the token.
pub fn check_jwt_svid(
    token: &str,
    spiffe_id: &str,
    audience: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, PluginError> {
    let refuse = |why: String| PluginError::WorkloadApi(format!("JWT-SVID for {spiffe_id}: {why}"));
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(refuse("not a compact JWS".into()));
    };
    let claims: Value = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        payload.trim_end_matches('='),
    )
    .ok()
    .and_then(|raw| serde_json::from_slice(&raw).ok())
    .ok_or_else(|| refuse("its claims are not base64url JSON".into()))?;
    if claims.get("sub").and_then(Value::as_str) != Some(spiffe_id) {
        return Err(refuse("its sub is not the SVID's SPIFFE ID".into()));
    }
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => a == audience,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(audience)),
        _ => false,
    };
    if !aud_ok {
        return Err(refuse(format!("its aud does not hold {audience:?}")));
    }
    let exp = claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or_else(|| refuse("no numeric exp".into()))?;
    let now_s = now.timestamp();
    if exp <= now_s {
        return Err(refuse(format!(
            "expired {} s ago (is this machine's clock right?)",
            now_s - exp
        )));
    }
    let iat = claims
        .get("iat")
        .and_then(Value::as_i64)
        .filter(|iat| *iat <= exp)
        .unwrap_or(now_s);
    let margin = ((exp - iat) / 10).clamp(1, 60);
    DateTime::from_timestamp(exp - margin.min(exp - now_s - 1).max(0), 0)
        .ok_or_else(|| refuse("exp out of range".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ExecApiVersion;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn opts() -> SpiffeJwtOptions {
        SpiffeJwtOptions {
            issuer_url: "https://hub.example.org".into(),
            allow_http_issuer: false,
            secret: SecretRef {
                namespace: "kleym".into(),
                name: "issuer".into(),
            },
            algorithm: Algorithm::Es256,
            hub_spiffe_id: None,
            trust_domain: Some("example.org".into()),
            lifetime_seconds: DEFAULT_LIFETIME_SECONDS,
            audience: None,
        }
    }

    fn info(config: Option<Value>) -> ExecInfo {
        ExecInfo {
            api_version: ExecApiVersion::V1,
            server: Some("https://spoke-a:6443".into()),
            config,
            hub_audience: Some("kleym.io/clusterprofile/fleet/spoke-a".into()),
            hub_profile: Some("fleet/spoke-a".into()),
        }
    }

    #[test]
    fn spiffe_id_defaults_and_refusals() {
        let mut o = opts();
        assert_eq!(hub_spiffe_id(&o).unwrap(), "spiffe://example.org/kleym/hub");
        o.hub_spiffe_id = Some("spiffe://other.org/kleym/hub".into());
        let err = hub_spiffe_id(&o).unwrap_err().to_string();
        assert!(err.contains("outside the trust domain"), "{err}");
        for bad in [
            "https://example.org/x",
            "spiffe://example.org",
            "spiffe://Ex.org/x",
            "spiffe://example.org/a//b",
        ] {
            o.hub_spiffe_id = Some(bad.into());
            assert!(hub_spiffe_id(&o).is_err(), "{bad}");
        }
        o.trust_domain = None;
        o.hub_spiffe_id = None;
        assert!(hub_spiffe_id(&o).is_err());
    }

    #[test]
    fn the_audience_is_the_hubs_never_the_profiles() {
        // The profile names another spoke as its audience and server: ignored.
        let i = ExecInfo {
            server: Some("https://spoke-b:6443".into()),
            ..info(Some(json!({"audience": "https://spoke-b:6443"})))
        };
        let (key, _) = SigningKey::generate_es256().unwrap();
        let out = sign_credential(&key, &i, &opts(), Utc::now()).unwrap();
        let cred: Value = serde_json::from_str(&out).unwrap();
        let token = cred["status"]["token"].as_str().unwrap();
        let claims: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            claims["aud"],
            json!(["kleym.io/clusterprofile/fleet/spoke-a"])
        );
        // Without the hub's audience there is no token.
        let bare = ExecInfo {
            hub_audience: None,
            ..i
        };
        assert!(sign_credential(&key, &bare, &opts(), Utc::now()).is_err());
    }

    #[test]
    fn credential_is_a_short_lived_jwt_svid() {
        let (key, _) = SigningKey::generate_es256().unwrap();
        let now = DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let out = sign_credential(&key, &info(None), &opts(), now).unwrap();
        let cred: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            cred["status"]["expirationTimestamp"],
            "2030-01-01T00:09:00Z"
        );
        let token = cred["status"]["token"].as_str().unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(header["kid"], key.kid());
        assert_eq!(claims["sub"], "spiffe://example.org/kleym/hub");
        assert_eq!(
            claims["aud"],
            json!(["kleym.io/clusterprofile/fleet/spoke-a"])
        );
        assert_eq!(claims["iss"], "https://hub.example.org");
        assert_eq!(
            claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
            600
        );
        assert_eq!(claims["jti"].as_str().unwrap().len(), 32);
        // Two credentials never share a jti.
        let other: Value =
            serde_json::from_str(&sign_credential(&key, &info(None), &opts(), now).unwrap())
                .unwrap();
        assert_ne!(other["status"]["token"], cred["status"]["token"]);

        let mut long = opts();
        long.lifetime_seconds = 901;
        assert!(sign_credential(&key, &info(None), &long, now).is_err());
        let mut http = opts();
        http.issuer_url = "http://hub.example.org".into();
        assert!(sign_credential(&key, &info(None), &http, now).is_err());
    }

    fn unsigned(claims: Value) -> String {
        format!(
            "{}.{}.sig",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256"}"#),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }

    #[test]
    fn a_jwt_svid_from_the_agent_must_be_what_was_asked_for() {
        let now = DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let id = "spiffe://example.org/kleym/hub";
        let aud = "https://spoke-a:6443";
        let t = now.timestamp();
        let good = json!({"sub": id, "aud": [aud], "iat": t, "exp": t + 300});
        // Refreshed a tenth of its lifetime before exp.
        assert_eq!(
            check_jwt_svid(&unsigned(good.clone()), id, aud, now).unwrap(),
            now + Duration::seconds(270)
        );
        let mut single = good.clone();
        single["aud"] = json!(aud);
        assert!(check_jwt_svid(&unsigned(single), id, aud, now).is_ok());
        // Nearly expired: refreshed at once, never before now.
        let mut late = good.clone();
        late["exp"] = json!(t + 5);
        late["iat"] = json!(t - 3000);
        assert!(check_jwt_svid(&unsigned(late), id, aud, now).unwrap() > now);
        for (claims, why) in [
            (
                json!({"sub": "spiffe://example.org/x", "aud": [aud], "exp": t + 300}),
                "sub",
            ),
            (
                json!({"sub": id, "aud": ["https://spoke-b:6443"], "exp": t + 300}),
                "aud",
            ),
            (json!({"sub": id, "aud": [aud]}), "exp"),
            (json!({"sub": id, "aud": [aud], "exp": t - 1}), "expired"),
        ] {
            let token = unsigned(claims);
            let err = check_jwt_svid(&token, id, aud, now)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{why}: {err}");
            assert!(!err.contains(&token), "{err}");
        }
        assert!(check_jwt_svid("not-a-jwt", id, aud, now).is_err());
        assert!(check_jwt_svid("a.b!.c", id, aud, now).is_err());
    }
}
