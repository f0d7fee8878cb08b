//! The X.509-SVID CA of `kleym credential spiffe-x509`, in a Secret of its own
//! (`--issuer-x509-ca-secret`), apart from the JWT signing keys (`--issuer-key-secret`).
//!
//! The two hold different powers: a reader of the CA Secret can mint a client certificate for
//! every spoke that trusts the CA; a reader of the key Secret can mint a JWT for every spoke
//! that trusts the issuer. Keeping them apart lets each consumer be granted only the Secret
//! it needs, and the CA exists only when X.509 is enabled (`--issuer-x509`).
//!
//! Data keys: `x509-ca.crt`/`x509-ca.key` (the CA that signs), `x509-ca-next.*` (the next
//! CA during a rotation, trusted ahead), `x509-ca-bundle.crt` (what spokes trust: current,
//! next, then replaced CAs) and [`CA_STATE_KEY`] (the replaced CAs with their end of trust).
//!
//! Rotation with an overlap, in two steps (`kleym issuer rotate-ca`): [`CaRing::begin_rotation`]
//! adds a next CA to the bundle while the current one keeps signing; once every spoke trusts
//! the new bundle, [`CaRing::finish_rotation`] makes it sign and keeps the replaced CA in the
//! bundle for [`CA_OVERLAP_SECONDS`]; [`CaRing::step`] then drops it. The periodic step also
//! takes both steps on its own as the CA nears its end: it begins [`CA_PUBLISH_AHEAD_SECONDS`]
//! before the CA expires and finishes [`CA_SWITCH_AHEAD_SECONDS`] before, so a CA never
//! expires under the fleet; operators who rotate earlier by command are never overtaken.
//!
//! Upgrade from a key Secret that still holds the CA (written before the split): when the CA
//! Secret does not exist, [`load_or_create`] copies the CA (current, next, replaced CAs, the
//! bundle) from the key Secret into a new CA Secret, and only once that create succeeded
//! removes the CA from the key Secret (a write guarded by its `resourceVersion`). The CA that
//! spokes trust is therefore never lost: it is in one Secret or the other, or briefly both.
//! Without `--issuer-x509` nothing is moved or removed; the hub warns that the key Secret
//! still holds a CA (see [`legacy_ca_warning`]).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::IssuerError;
use super::rotation::{KeyRing, PreviousCa};
use super::secret::{SecretRef, parse_secret_ref};
use super::x509::{
    CA_BUNDLE_KEY, CA_CERT_KEY, CA_KEY_KEY, CA_OVERLAP_SECONDS, CA_PUBLISH_AHEAD_SECONDS,
    CA_SWITCH_AHEAD_SECONDS, HubCa, NEXT_CA_CERT_KEY, NEXT_CA_KEY_KEY,
};

/// Data key of the CA Secret holding the replaced CAs still trusted (JSON).
pub const CA_STATE_KEY: &str = "x509-ca-state.json";
/// `type` of the CA Secrets the hub creates.
pub const CA_SECRET_TYPE: &str = "kleym.io/issuer-x509-ca";
/// Suffix of the default CA Secret name: `<key Secret name>-x509-ca`, in its namespace.
pub const DEFAULT_CA_SECRET_SUFFIX: &str = "-x509-ca";

/// The default CA Secret for the key Secret `key_secret`: same namespace, name +
/// [`DEFAULT_CA_SECRET_SUFFIX`].
pub fn default_ca_secret(key_secret: &SecretRef) -> SecretRef {
    SecretRef {
        namespace: key_secret.namespace.clone(),
        name: format!("{}{DEFAULT_CA_SECRET_SUFFIX}", key_secret.name),
    }
}

/// clap parser for `--issuer-x509-ca-secret`.
pub fn parse_ca_secret(s: &str) -> Result<SecretRef, String> {
    parse_secret_ref(s, "--issuer-x509-ca-secret").map_err(|e| e.to_string())
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct CaStateDoc {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous_cas: Vec<PreviousCa>,
}

/// The CA that signs, the next one during a rotation and the replaced ones still trusted.
/// `Debug` never shows a private key.
#[derive(Debug)]
pub struct CaRing {
    ca: HubCa,
    next_ca: Option<HubCa>,
    previous_cas: Vec<PreviousCa>,
}

impl CaRing {
    /// A new CA, valid from `now`.
    pub fn generate(now: i64) -> Result<Self, IssuerError> {
        Ok(CaRing {
            ca: new_ca(now)?,
            next_ca: None,
            previous_cas: Vec::new(),
        })
    }

    /// Parses CA data (`origin` names the Secret in errors). `previous_cas` comes from the
    /// data's [`CA_STATE_KEY`] unless given (a key Secret from before the split keeps them in
    /// its own state).
    pub fn from_data(
        data: &BTreeMap<String, ByteString>,
        previous: Option<&[PreviousCa]>,
        origin: &str,
    ) -> Result<Self, IssuerError> {
        let text = |k: &str| {
            data.get(k)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        };
        let pair = |cert_key: &str, key_key: &str| match (text(cert_key), text(key_key)) {
            (None, None) => Ok(None),
            (Some(c), Some(k)) => HubCa::from_pem(&c, &k, origin).map(Some),
            _ => Err(IssuerError::Key(format!(
                "{origin}: data[{cert_key}] and data[{key_key}] go together"
            ))),
        };
        let next_ca = pair(NEXT_CA_CERT_KEY, NEXT_CA_KEY_KEY)?;
        let ca = pair(CA_CERT_KEY, CA_KEY_KEY)?.ok_or_else(|| {
            IssuerError::Key(if next_ca.is_some() {
                format!("{origin}: data[{NEXT_CA_CERT_KEY}] without data[{CA_CERT_KEY}]")
            } else {
                format!(
                    "{origin}: no data[{CA_CERT_KEY}] (the Secret exists, so kleym will not overwrite it; delete it to let the hub create one)"
                )
            })
        })?;
        let previous_cas = match previous {
            Some(p) => p.to_vec(),
            None => match data.get(CA_STATE_KEY) {
                None => Vec::new(),
                Some(b) => {
                    serde_json::from_slice::<CaStateDoc>(&b.0)
                        .map_err(|e| {
                            IssuerError::Key(format!(
                                "{origin} data[{CA_STATE_KEY}]: malformed: {e}"
                            ))
                        })?
                        .previous_cas
                }
            },
        };
        for (i, p) in previous_cas.iter().enumerate() {
            if !p.cert.contains("-----BEGIN CERTIFICATE-----") {
                return Err(IssuerError::Key(format!(
                    "{origin} data[{CA_STATE_KEY}]: previous_cas[{i}].cert is not a PEM certificate"
                )));
            }
        }
        Ok(CaRing {
            ca,
            next_ca,
            previous_cas,
        })
    }

    /// The Secret data for this ring.
    pub fn to_data(&self) -> BTreeMap<String, ByteString> {
        let b = |s: &str| ByteString(s.as_bytes().to_vec());
        let mut data = BTreeMap::from([
            (CA_CERT_KEY.to_string(), b(&self.ca.cert_pem)),
            (CA_KEY_KEY.to_string(), b(self.ca.key_pem())),
            (CA_BUNDLE_KEY.to_string(), b(&self.bundle())),
        ]);
        if let Some(next) = &self.next_ca {
            data.insert(NEXT_CA_CERT_KEY.into(), b(&next.cert_pem));
            data.insert(NEXT_CA_KEY_KEY.into(), b(next.key_pem()));
        }
        if !self.previous_cas.is_empty() {
            let state = CaStateDoc {
                previous_cas: self.previous_cas.clone(),
            };
            data.insert(
                CA_STATE_KEY.into(),
                ByteString(serde_json::to_vec(&state).unwrap_or_default()),
            );
        }
        data
    }

    /// The CA that signs.
    pub fn ca(&self) -> &HubCa {
        &self.ca
    }

    /// The CA that will sign once the rotation under way finishes.
    pub fn next_ca(&self) -> Option<&HubCa> {
        self.next_ca.as_ref()
    }

    /// Replaced CAs still in the bundle.
    pub fn previous_cas(&self) -> &[PreviousCa] {
        &self.previous_cas
    }

    /// The PEM bundle spokes trust for client certificates: the current CA, the next one,
    /// then replaced ones.
    pub fn bundle(&self) -> String {
        let mut out = String::new();
        let certs = std::iter::once(&self.ca)
            .chain(self.next_ca.iter())
            .map(|c| c.cert_pem.as_str())
            .chain(self.previous_cas.iter().map(|p| p.cert.as_str()));
        for c in certs {
            out.push_str(c.trim_end());
            out.push('\n');
        }
        out
    }

    /// First step of a rotation: a next CA joins the bundle; the current CA keeps signing.
    /// Refused while one is under way.
    pub fn begin_rotation(&mut self, now: i64) -> Result<(), IssuerError> {
        if self.next_ca.is_some() {
            return Err(IssuerError::Key(
                "a CA rotation is already under way: finish it first".into(),
            ));
        }
        self.next_ca = Some(new_ca(now)?);
        Ok(())
    }

    /// Second step: the next CA signs from now; the replaced one stays in the bundle for
    /// `overlap_seconds`. Refused without a next CA.
    pub fn finish_rotation(&mut self, now: i64, overlap_seconds: i64) -> Result<(), IssuerError> {
        let next = self
            .next_ca
            .take()
            .ok_or_else(|| IssuerError::Key("no CA rotation under way: begin one first".into()))?;
        let old = std::mem::replace(&mut self.ca, next);
        self.previous_cas.push(PreviousCa {
            cert: old.cert_pem,
            retires: now + overlap_seconds,
        });
        Ok(())
    }

    /// The leader's periodic step: drops replaced CAs past their overlap; a next CA joins the
    /// bundle once the current CA has less than [`CA_PUBLISH_AHEAD_SECONDS`] left, and signs
    /// once it has less than [`CA_SWITCH_AHEAD_SECONDS`] left. Returns whether the ring
    /// changed (then the caller writes it).
    pub fn step(&mut self, now: i64) -> Result<bool, IssuerError> {
        let before = self.previous_cas.len();
        self.previous_cas.retain(|p| p.retires > now);
        let mut changed = self.previous_cas.len() != before;
        let left = self.ca.not_after()? - now;
        if self.next_ca.is_none() && left <= CA_PUBLISH_AHEAD_SECONDS {
            self.begin_rotation(now)?;
            tracing::warn!(
                expires_in_days = left / 86_400,
                "issuer: the X.509 CA nears its end; a next CA joined the bundle (x509-ca-bundle.crt): give every spoke the new bundle (kleym trust-config --credential spiffe-x509)"
            );
            changed = true;
        } else if self.next_ca.is_some() && left <= CA_SWITCH_AHEAD_SECONDS {
            self.finish_rotation(now, CA_OVERLAP_SECONDS)?;
            tracing::warn!(
                "issuer: the next X.509 CA signs from now on; spokes without the new bundle refuse the hub's certificates"
            );
            changed = true;
        }
        Ok(changed)
    }
}

fn new_ca(now: i64) -> Result<HubCa, IssuerError> {
    let at = chrono::DateTime::from_timestamp(now, 0)
        .ok_or_else(|| IssuerError::Key(format!("time {now} out of range")))?;
    HubCa::generate(at)
}

fn api_err(what: String) -> impl FnOnce(kube::Error) -> IssuerError {
    move |source| IssuerError::Api { what, source }
}

/// The CA Secret and its ring, for a read-modify-write.
pub async fn read(client: kube::Client, at: &SecretRef) -> Result<(Secret, CaRing), IssuerError> {
    let api: Api<Secret> = Api::namespaced(client, &at.namespace);
    let s = api
        .get_opt(&at.name)
        .await
        .map_err(api_err(format!("reading X.509 CA Secret {at}")))?
        .ok_or_else(|| {
            IssuerError::Key(format!(
                "X.509 CA Secret {at} does not exist: the hub creates it when started with --issuer-x509 (moving the CA out of the issuer key Secret, if it holds one)"
            ))
        })?;
    let ring = ring_of(&s, at)?;
    Ok((s, ring))
}

fn ring_of(s: &Secret, at: &SecretRef) -> Result<CaRing, IssuerError> {
    let empty = BTreeMap::new();
    CaRing::from_data(
        s.data.as_ref().unwrap_or(&empty),
        None,
        &format!("X.509 CA Secret {at}"),
    )
}

/// Writes `ring` into `secret` (read with [`read`]) with its `resourceVersion`, so a
/// concurrent writer makes this fail (409) instead of being overwritten.
pub async fn write(
    client: kube::Client,
    at: &SecretRef,
    mut secret: Secret,
    ring: &CaRing,
) -> Result<(), IssuerError> {
    let api: Api<Secret> = Api::namespaced(client, &at.namespace);
    secret.data = Some(ring.to_data());
    secret.string_data = None;
    api.replace(&at.name, &PostParams::default(), &secret)
        .await
        .map_err(api_err(format!("writing X.509 CA Secret {at}")))?;
    Ok(())
}

/// The line the hub logs (at start-up, and each time it reads the key Secret) when the key
/// Secret still holds an X.509 CA but X.509 is not enabled: what the operator should do.
pub fn legacy_ca_warning(key_secret: &SecretRef) -> String {
    format!(
        "issuer key Secret {key_secret} still holds an X.509 CA (data[{CA_KEY_KEY}], written before the CA had a Secret of its own): whoever reads that Secret can mint client certificates for every spoke trusting the CA. If you use kleym credential spiffe-x509, start the hub with --issuer-x509 (the CA moves to {}, or --issuer-x509-ca-secret); if not, remove the x509-ca* data keys from {key_secret}. kleym leaves it untouched until then",
        default_ca_secret(key_secret)
    )
}

/// The CA of the CA Secret `at`. When it does not exist and `create` is set (the hub with
/// `--issuer-x509`): moves the CA of the key Secret `key_secret` into it when that one holds
/// one (see the module doc), else creates it with a new CA. Concurrent creators are safe: the
/// loser of the create reads the winner's Secret. When the CA Secret exists and the key
/// Secret still holds the very CA it has (an interrupted move), the copy in the key Secret is
/// removed; a different CA there is left alone and logged.
pub async fn load_or_create(
    client: kube::Client,
    at: &SecretRef,
    key_secret: &SecretRef,
    create: bool,
) -> Result<CaRing, IssuerError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    if at == key_secret {
        return Err(IssuerError::Config(format!(
            "--issuer-x509-ca-secret {at} must differ from --issuer-key-secret: the CA and the signing keys are kept apart"
        )));
    }
    if let Some(s) = api
        .get_opt(&at.name)
        .await
        .map_err(api_err(format!("reading X.509 CA Secret {at}")))?
    {
        let ring = ring_of(&s, at)?;
        if create {
            finish_move(client, &ring, key_secret).await?;
        }
        return Ok(ring);
    }
    if !create {
        return read(client, at).await.map(|(_, r)| r);
    }
    let key_api: Api<Secret> = Api::namespaced(client.clone(), &key_secret.namespace);
    let legacy = match key_api
        .get_opt(&key_secret.name)
        .await
        .map_err(api_err(format!("reading issuer Secret {key_secret}")))?
    {
        Some(s) => {
            let empty = BTreeMap::new();
            let ring = KeyRing::from_data(
                s.data.as_ref().unwrap_or(&empty),
                &format!("issuer Secret {key_secret}"),
            )?;
            if ring.has_legacy_ca() {
                let (data, previous) = ring.legacy_ca_data();
                Some(CaRing::from_data(
                    data,
                    Some(previous),
                    &format!("issuer Secret {key_secret}"),
                )?)
            } else {
                None
            }
        }
        None => None,
    };
    let moved = legacy.is_some();
    let ring = match legacy {
        Some(r) => r,
        None => CaRing::generate(chrono::Utc::now().timestamp())?,
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(at.name.clone()),
            namespace: Some(at.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "kleym".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(CA_SECRET_TYPE.to_string()),
        data: Some(ring.to_data()),
        ..Default::default()
    };
    let ring = match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            if moved {
                tracing::info!(secret = %at, from = %key_secret, "X.509 CA copied from the issuer key Secret into a Secret of its own");
            } else {
                tracing::info!(secret = %at, "X.509 CA Secret created with a new CA");
            }
            ring
        }
        Err(kube::Error::Api(s)) if s.code == 409 => read(client.clone(), at).await?.1,
        Err(source) => {
            return Err(IssuerError::Api {
                what: format!("creating X.509 CA Secret {at}"),
                source,
            });
        }
    };
    finish_move(client, &ring, key_secret).await?;
    Ok(ring)
}

/// Removes the CA from the key Secret once the CA Secret holds it: only when the key
/// Secret's CA is the CA Secret's current or next CA, or in its bundle (so nothing spokes
/// trust is lost), with the key Secret's `resourceVersion`. A failed write is logged, not
/// returned: a concurrent writer wins, and the leader's next CA step tries again.
async fn finish_move(
    client: kube::Client,
    ca: &CaRing,
    key_secret: &SecretRef,
) -> Result<(), IssuerError> {
    let key_api: Api<Secret> = Api::namespaced(client.clone(), &key_secret.namespace);
    let Some(s) = key_api
        .get_opt(&key_secret.name)
        .await
        .map_err(api_err(format!("reading issuer Secret {key_secret}")))?
    else {
        return Ok(());
    };
    let empty = BTreeMap::new();
    let mut ring = KeyRing::from_data(
        s.data.as_ref().unwrap_or(&empty),
        &format!("issuer Secret {key_secret}"),
    )?;
    if !ring.has_legacy_ca() {
        return Ok(());
    }
    let (data, previous) = ring.legacy_ca_data();
    let bundle = ca.bundle();
    let held = |pem: &str| bundle.contains(pem.trim());
    let text = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let all_held = [CA_CERT_KEY, NEXT_CA_CERT_KEY]
        .iter()
        .filter_map(|k| text(k))
        .all(|c| held(&c))
        && previous
            .iter()
            .all(|p| held(&p.cert) || p.retires <= chrono::Utc::now().timestamp());
    if !all_held {
        tracing::warn!(
            key_secret = %key_secret,
            "issuer key Secret holds an X.509 CA that the CA Secret does not: left in place; remove its x509-ca* data keys once no spoke trusts it"
        );
        return Ok(());
    }
    ring.clear_legacy_ca();
    match super::secret::write(client, key_secret, s, &ring).await {
        Ok(()) => {
            tracing::info!(key_secret = %key_secret, "X.509 CA removed from the issuer key Secret (it is in its own Secret now)")
        }
        // Another replica or a rotation wrote first: the CA is safe in its own Secret either
        // way, and the leader's next step (or the next start) removes the copy.
        Err(e) => {
            tracing::warn!(key_secret = %key_secret, error = %e, "X.509 CA not yet removed from the issuer key Secret; retrying later")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::issuer::x509::CA_VALIDITY_DAYS;

    const H: i64 = 3600;

    fn certs(bundle: &str) -> Vec<String> {
        bundle
            .split_inclusive("-----END CERTIFICATE-----")
            .map(str::trim)
            .filter(|c| c.contains("BEGIN CERTIFICATE"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn ca_rotation_trusts_the_next_ca_first_then_keeps_the_old_one_for_the_overlap() {
        let t0 = 1_000_000;
        let mut ring = CaRing::generate(t0).unwrap();
        let old = ring.ca().cert_pem.trim().to_string();
        assert_eq!(certs(&ring.bundle()), vec![old.clone()]);
        assert!(ring.finish_rotation(t0, 60).is_err(), "nothing begun");

        // Begin: both CAs trusted, the old one still signs; a second begin is refused.
        ring.begin_rotation(t0 + 10).unwrap();
        let next = ring.next_ca().unwrap().cert_pem.trim().to_string();
        assert_ne!(next, old);
        assert_eq!(ring.ca().cert_pem.trim(), old);
        assert_eq!(certs(&ring.bundle()), vec![old.clone(), next.clone()]);
        assert!(ring.begin_rotation(t0 + 11).is_err());

        // The state survives the Secret, bundle included.
        let data = ring.to_data();
        assert_eq!(
            certs(&String::from_utf8(data[CA_BUNDLE_KEY].0.clone()).unwrap()),
            vec![old.clone(), next.clone()]
        );
        let mut ring = CaRing::from_data(&data, None, "secret kleym/ca").unwrap();
        assert_eq!(ring.next_ca().unwrap().cert_pem.trim(), next);

        // Finish: the new CA signs, the old one stays trusted until the overlap ends.
        let t1 = t0 + 100;
        ring.finish_rotation(t1, 3600).unwrap();
        assert_eq!(ring.ca().cert_pem.trim(), next);
        assert!(ring.next_ca().is_none());
        assert_eq!(certs(&ring.bundle()), vec![next.clone(), old.clone()]);
        let mut ring = CaRing::from_data(&ring.to_data(), None, "secret kleym/ca").unwrap();
        assert_eq!(ring.previous_cas()[0].retires, t1 + 3600);
        assert!(!ring.step(t1 + 3599).unwrap());
        assert_eq!(certs(&ring.bundle()).len(), 2);
        // Then the leader's step drops it.
        assert!(ring.step(t1 + 3600).unwrap());
        assert_eq!(certs(&ring.bundle()), vec![next]);
    }

    #[test]
    fn the_periodic_step_rotates_a_ca_near_its_end_in_two_steps() {
        let day = 24 * H;
        let t0 = 1_000_000;
        let mut ring = CaRing::generate(t0).unwrap();
        let old = ring.ca().cert_pem.trim().to_string();
        let end = ring.ca().not_after().unwrap();
        assert_eq!(end, t0 + CA_VALIDITY_DAYS * day);
        // Months before the end: nothing.
        assert!(!ring.step(t0 + 300 * day).unwrap());
        assert!(ring.next_ca().is_none());
        // 30 days before: a next CA joins the bundle; the old one still signs.
        let begin = end - CA_PUBLISH_AHEAD_SECONDS;
        assert!(!ring.step(begin - 1).unwrap());
        assert!(ring.step(begin).unwrap());
        let next = ring.next_ca().unwrap().cert_pem.trim().to_string();
        assert_eq!(ring.ca().cert_pem.trim(), old);
        assert_eq!(certs(&ring.bundle()), vec![old.clone(), next.clone()]);
        // Through the Secret, as a restarted or new leader reads it: nothing more until 7 days
        // before the end.
        let mut ring = CaRing::from_data(&ring.to_data(), None, "secret kleym/ca").unwrap();
        let switch = end - CA_SWITCH_AHEAD_SECONDS;
        assert!(!ring.step(switch - 1).unwrap());
        assert_eq!(ring.ca().cert_pem.trim(), old);
        // 7 days before: the next CA signs, the old one stays trusted for the overlap.
        assert!(ring.step(switch).unwrap());
        assert_eq!(ring.ca().cert_pem.trim(), next);
        assert!(ring.next_ca().is_none());
        assert_eq!(certs(&ring.bundle()), vec![next.clone(), old]);
        assert!(ring.step(switch + CA_OVERLAP_SECONDS).unwrap());
        assert_eq!(certs(&ring.bundle()), vec![next]);
        // The new CA is a year from the switch away from its own rotation.
        assert!(!ring.step(switch + 300 * day).unwrap());
    }

    #[test]
    fn a_half_written_next_ca_or_a_junk_previous_ca_is_refused_and_named() {
        let mut ring = CaRing::generate(1_000_000).unwrap();
        ring.begin_rotation(1_000_000).unwrap();
        let mut data = ring.to_data();
        data.remove(NEXT_CA_KEY_KEY);
        let e = CaRing::from_data(&data, None, "secret kleym/ca")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(NEXT_CA_CERT_KEY) && e.contains("secret kleym/ca"),
            "{e}"
        );
        let mut data = ring.to_data();
        data.insert(
            CA_STATE_KEY.into(),
            ByteString(br#"{"previous_cas":[{"cert":"junk","retires":1}]}"#.to_vec()),
        );
        let e = CaRing::from_data(&data, None, "secret kleym/ca")
            .unwrap_err()
            .to_string();
        assert!(e.contains("previous_cas[0]"), "{e}");
        let e = CaRing::from_data(&BTreeMap::new(), None, "secret kleym/ca")
            .unwrap_err()
            .to_string();
        assert!(e.contains(CA_CERT_KEY), "{e}");
    }

    #[test]
    fn debug_of_a_ca_ring_shows_no_key_material() {
        let mut ring = CaRing::generate(1_000_000).unwrap();
        ring.begin_rotation(1_000_000).unwrap();
        let text = format!("{ring:?} {ring:#?}");
        for key in [ring.ca().key_pem(), ring.next_ca().unwrap().key_pem()] {
            let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
            assert!(!text.contains(&body[..40]), "{text}");
        }
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }

    #[test]
    fn the_default_ca_secret_sits_beside_the_key_secret() {
        let key = SecretRef {
            namespace: "kleym-system".into(),
            name: "kleym-issuer".into(),
        };
        assert_eq!(
            default_ca_secret(&key).to_string(),
            "kleym-system/kleym-issuer-x509-ca"
        );
    }
}
