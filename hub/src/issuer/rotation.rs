//! The issuer's key ring and its rotation with overlap. State lives in the Secret beside the
//! keys (`key-state.json`: per `kid`, when it starts signing and when it stops being
//! published), so restarts and leader changes neither drop nor duplicate keys.
//!
//! - The signing key is the key with the latest `activates` not in the future (ties: the
//!   earlier key in the PEM bundle; keys without state activate at 0, so a hand-made Secret's
//!   first key signs).
//! - Published: every key whose `retires` is unset or in the future, including keys that do
//!   not sign yet (published ahead).
//! - [`KeyRing::rotate_step`] (the leader, periodically): drops retired keys; when the signing
//!   key is older than `period - publish_ahead` and no key is pending, adds a new ES256 key
//!   that activates `publish_ahead` later; gives every key older than the signing key a
//!   `retires` of the signing key's activation + `retire_after` (max token lifetime + skew).
//! - [`KeyRing::rotate_now`] (`kleym issuer rotate`): a new key that signs at once; the others
//!   retire after `retire_after`, or are removed at once with `revoke_old`.
//! - The X.509 CA rotates with an overlap in two steps (`kleym issuer rotate-ca`):
//!   [`KeyRing::begin_ca_rotation`] adds a next CA to the bundle spokes trust
//!   (`x509-ca-bundle.crt`) while the current one keeps signing; once every spoke trusts the
//!   new bundle, [`KeyRing::finish_ca_rotation`] makes it sign and keeps the replaced CA in the
//!   bundle for [`super::x509::CA_OVERLAP_SECONDS`]; [`KeyRing::rotate_step`] then drops it.
//!   The periodic step also takes both steps on its own as the CA nears its end: it begins
//!   [`super::x509::CA_PUBLISH_AHEAD_SECONDS`] before the CA expires and finishes
//!   [`super::x509::CA_SWITCH_AHEAD_SECONDS`] before, so a CA never expires under the fleet;
//!   operators who rotate earlier by command are never overtaken.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};

use super::keys::{Algorithm, SigningKey};
use super::x509::{
    CA_BUNDLE_KEY, CA_CERT_KEY, CA_KEY_KEY, CA_OVERLAP_SECONDS, CA_PUBLISH_AHEAD_SECONDS,
    CA_SWITCH_AHEAD_SECONDS, HubCa, NEXT_CA_CERT_KEY, NEXT_CA_KEY_KEY,
};
use super::{IssuerError, MAX_TOKEN_LIFETIME_SECONDS, SECRET_KEY};

/// Data key of the Secret holding the key state.
pub const STATE_KEY: &str = "key-state.json";
/// Clock skew allowed for verifiers, added to the token lifetime before a key retires.
pub const SKEW_SECONDS: i64 = 300;

/// When one key signs and stops being published (unix seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTimes {
    /// From when it may sign.
    #[serde(default)]
    pub activates: i64,
    /// From when it is no longer published (and is removed from the Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires: Option<i64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateDoc {
    #[serde(default)]
    keys: BTreeMap<String, KeyTimes>,
    /// Replaced X.509 CAs still trusted (certificates only: their keys are gone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous_cas: Vec<PreviousCa>,
}

/// A replaced X.509 CA kept in the bundle until the SVIDs it signed have expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousCa {
    /// Its certificate (PEM).
    pub cert: String,
    /// From when it leaves the bundle (unix seconds).
    pub retires: i64,
}

/// One key of the ring.
#[derive(Debug)]
pub struct KeyEntry {
    /// The key.
    pub key: SigningKey,
    /// Its PKCS#8 PEM block (written back to the Secret; never logged).
    pem: String,
    /// Its times.
    pub times: KeyTimes,
}

/// How keys rotate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// A key signs for this long before the next one takes over (`--issuer-key-rotation`).
    pub period_seconds: i64,
    /// A new key is published this long before it signs (`--issuer-key-publish-ahead`).
    pub publish_ahead_seconds: i64,
    /// A replaced key stays published this long after its successor signs.
    pub retire_after_seconds: i64,
}

impl Default for RotationPolicy {
    fn default() -> Self {
        RotationPolicy {
            period_seconds: 7 * 24 * 3600,
            publish_ahead_seconds: 3600,
            retire_after_seconds: MAX_TOKEN_LIFETIME_SECONDS + SKEW_SECONDS,
        }
    }
}

/// The keys of the issuer Secret with their times, and the X.509 CA.
#[derive(Debug)]
pub struct KeyRing {
    entries: Vec<KeyEntry>,
    ca: Option<HubCa>,
    next_ca: Option<HubCa>,
    previous_cas: Vec<PreviousCa>,
}

impl KeyRing {
    /// Parses the Secret's data (`origin` names it in errors). Unknown `kid`s in the state are
    /// ignored; keys without state activate at 0.
    pub fn from_data(
        data: &BTreeMap<String, ByteString>,
        origin: &str,
    ) -> Result<Self, IssuerError> {
        let keys_origin = format!("{origin} data[{SECRET_KEY}]");
        let bytes = data.get(SECRET_KEY).map(|b| b.0.as_slice()).ok_or_else(|| {
            IssuerError::Key(format!(
                "{keys_origin}: missing (the Secret exists, so kleym will not overwrite it; delete it to let the hub create one)"
            ))
        })?;
        let pairs = SigningKey::all_from_pem_with_pem(bytes, &keys_origin)?;
        let state: StateDoc = match data.get(STATE_KEY) {
            None => StateDoc::default(),
            Some(b) => serde_json::from_slice(&b.0).map_err(|e| {
                IssuerError::Key(format!("{origin} data[{STATE_KEY}]: malformed: {e}"))
            })?,
        };
        let mut seen = std::collections::BTreeSet::new();
        let mut entries = Vec::new();
        for (key, pem) in pairs {
            if !seen.insert(key.kid().to_string()) {
                return Err(IssuerError::Key(format!(
                    "{keys_origin}: key {} is listed twice",
                    key.kid()
                )));
            }
            let times = state.keys.get(key.kid()).copied().unwrap_or_default();
            entries.push(KeyEntry { key, pem, times });
        }
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
        let ca = pair(CA_CERT_KEY, CA_KEY_KEY)?;
        let next_ca = pair(NEXT_CA_CERT_KEY, NEXT_CA_KEY_KEY)?;
        if next_ca.is_some() && ca.is_none() {
            return Err(IssuerError::Key(format!(
                "{origin}: data[{NEXT_CA_CERT_KEY}] without data[{CA_CERT_KEY}]"
            )));
        }
        for (i, p) in state.previous_cas.iter().enumerate() {
            if !p.cert.contains("-----BEGIN CERTIFICATE-----") {
                return Err(IssuerError::Key(format!(
                    "{origin} data[{STATE_KEY}]: previous_cas[{i}].cert is not a PEM certificate"
                )));
            }
        }
        Ok(KeyRing {
            entries,
            ca,
            next_ca,
            previous_cas: state.previous_cas,
        })
    }

    /// The X.509-SVID CA, when the Secret has one.
    pub fn ca(&self) -> Option<&HubCa> {
        self.ca.as_ref()
    }

    /// The CA that will sign once the CA rotation under way finishes.
    pub fn next_ca(&self) -> Option<&HubCa> {
        self.next_ca.as_ref()
    }

    /// Replaced CAs still in the bundle.
    pub fn previous_cas(&self) -> &[PreviousCa] {
        &self.previous_cas
    }

    /// The PEM bundle spokes trust for client certificates: the current CA, the next one,
    /// then replaced ones (empty without a CA).
    pub fn ca_bundle(&self) -> String {
        let mut out = String::new();
        let certs = self
            .ca
            .iter()
            .chain(self.next_ca.iter())
            .map(|c| c.cert_pem.as_str())
            .chain(self.previous_cas.iter().map(|p| p.cert.as_str()));
        for c in certs {
            out.push_str(c.trim_end());
            out.push('\n');
        }
        out
    }

    /// First step of a CA rotation: a next CA joins the bundle; the current CA keeps signing.
    /// Refused while one is under way or without a current CA.
    pub fn begin_ca_rotation(&mut self, now: i64) -> Result<(), IssuerError> {
        if self.ca.is_none() {
            return Err(IssuerError::Key(
                "no X.509 CA to rotate yet (the hub's leader adds one)".into(),
            ));
        }
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
    pub fn finish_ca_rotation(
        &mut self,
        now: i64,
        overlap_seconds: i64,
    ) -> Result<(), IssuerError> {
        let next = self
            .next_ca
            .take()
            .ok_or_else(|| IssuerError::Key("no CA rotation under way: begin one first".into()))?;
        if let Some(old) = self.ca.replace(next) {
            self.previous_cas.push(PreviousCa {
                cert: old.cert_pem,
                retires: now + overlap_seconds,
            });
        }
        Ok(())
    }

    /// A ring of one new ES256 key, signing from `now`.
    pub fn generate(now: i64) -> Result<Self, IssuerError> {
        let (key, pem) = SigningKey::generate_es256()?;
        Ok(KeyRing {
            next_ca: None,
            previous_cas: Vec::new(),
            ca: Some(new_ca(now)?),
            entries: vec![KeyEntry {
                key,
                pem,
                times: KeyTimes {
                    activates: now,
                    retires: None,
                },
            }],
        })
    }

    /// The Secret data for this ring.
    pub fn to_data(&self) -> BTreeMap<String, ByteString> {
        let pem: String = self.entries.iter().map(|e| e.pem.as_str()).collect();
        let state = StateDoc {
            keys: self
                .entries
                .iter()
                .map(|e| (e.key.kid().to_string(), e.times))
                .collect(),
            previous_cas: self.previous_cas.clone(),
        };
        let mut data = BTreeMap::from([
            (SECRET_KEY.to_string(), ByteString(pem.into_bytes())),
            (
                STATE_KEY.to_string(),
                ByteString(serde_json::to_vec(&state).unwrap_or_default()),
            ),
        ]);
        if let Some(ca) = &self.ca {
            data.insert(
                CA_CERT_KEY.into(),
                ByteString(ca.cert_pem.clone().into_bytes()),
            );
            data.insert(
                CA_KEY_KEY.into(),
                ByteString(ca.key_pem().as_bytes().to_vec()),
            );
            data.insert(
                CA_BUNDLE_KEY.into(),
                ByteString(self.ca_bundle().into_bytes()),
            );
        }
        if let Some(next) = &self.next_ca {
            data.insert(
                NEXT_CA_CERT_KEY.into(),
                ByteString(next.cert_pem.clone().into_bytes()),
            );
            data.insert(
                NEXT_CA_KEY_KEY.into(),
                ByteString(next.key_pem().as_bytes().to_vec()),
            );
        }
        data
    }

    /// Every entry, in Secret order.
    pub fn entries(&self) -> &[KeyEntry] {
        &self.entries
    }

    fn live(e: &KeyEntry, now: i64) -> bool {
        e.times.retires.is_none_or(|r| r > now)
    }

    fn signing_index(&self, now: i64) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.times.activates <= now
                && Self::live(e, now)
                && best.is_none_or(|b| e.times.activates > self.entries[b].times.activates)
            {
                best = Some(i);
            }
        }
        best
    }

    /// The key that signs at `now`.
    pub fn signing(&self, now: i64) -> Result<&SigningKey, IssuerError> {
        self.signing_index(now)
            .map(|i| &self.entries[i].key)
            .ok_or_else(|| {
                IssuerError::Key("no issuer key may sign now (all retired or pending)".into())
            })
    }

    /// Since when the key that signs at `now` signs.
    pub fn signing_since(&self, now: i64) -> Option<i64> {
        self.signing_index(now)
            .map(|i| self.entries[i].times.activates)
    }

    /// The keys published at `now`.
    pub fn published(&self, now: i64) -> Vec<&SigningKey> {
        self.entries
            .iter()
            .filter(|e| Self::live(e, now))
            .map(|e| &e.key)
            .collect()
    }

    /// Checks that the signing key has the configured algorithm.
    pub fn check_algorithm(
        &self,
        now: i64,
        expected: Algorithm,
        origin: &str,
    ) -> Result<(), IssuerError> {
        let k = self.signing(now)?;
        if k.algorithm() != expected {
            return Err(IssuerError::Key(format!(
                "{origin} data[{SECRET_KEY}]: the signing key is {} but --issuer-key-algorithm is {}",
                k.algorithm().as_str(),
                expected.as_str()
            )));
        }
        Ok(())
    }

    fn retire_older(&mut self, now: i64, policy: &RotationPolicy) -> bool {
        let Some(s) = self.signing_index(now) else {
            return false;
        };
        let active_at = self.entries[s].times.activates;
        let mut changed = false;
        for e in &mut self.entries {
            if e.times.activates < active_at && e.times.retires.is_none() {
                e.times.retires = Some(active_at + policy.retire_after_seconds);
                changed = true;
            }
        }
        changed
    }

    fn drop_retired(&mut self, now: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| Self::live(e, now));
        self.entries.len() != before
    }

    /// One periodic rotation step at `now` (see the module doc). Returns whether the ring
    /// changed (then the caller writes it). New keys are ES256; with an RS256 signing key
    /// nothing new is generated.
    pub fn rotate_step(&mut self, now: i64, policy: &RotationPolicy) -> Result<bool, IssuerError> {
        let mut changed = self.drop_retired(now);
        let cas = self.previous_cas.len();
        self.previous_cas.retain(|p| p.retires > now);
        changed |= self.previous_cas.len() != cas;
        if self.ca.is_none() {
            // A Secret from before the X.509 CA existed (or made by hand): add one.
            self.ca = Some(new_ca(now)?);
            changed = true;
        }
        changed |= self.rotate_ca_near_expiry(now)?;
        changed |= self.retire_older(now, policy);
        let pending = self.entries.iter().any(|e| e.times.activates > now);
        if let Some(s) = self.signing_index(now)
            && !pending
            && self.entries[s].key.algorithm() == Algorithm::Es256
            && now
                >= self.entries[s].times.activates + policy.period_seconds
                    - policy.publish_ahead_seconds
        {
            let (key, pem) = SigningKey::generate_es256()?;
            let activates = (self.entries[s].times.activates + policy.period_seconds)
                .max(now + policy.publish_ahead_seconds);
            self.entries.push(KeyEntry {
                key,
                pem,
                times: KeyTimes {
                    activates,
                    retires: None,
                },
            });
            changed = true;
        }
        Ok(changed)
    }

    /// The CA part of the periodic step: a next CA joins the bundle once the current CA has
    /// less than [`CA_PUBLISH_AHEAD_SECONDS`] left, and signs once it has less than
    /// [`CA_SWITCH_AHEAD_SECONDS`] left. Returns whether the ring changed.
    fn rotate_ca_near_expiry(&mut self, now: i64) -> Result<bool, IssuerError> {
        let Some(ca) = &self.ca else {
            return Ok(false);
        };
        let left = ca.not_after()? - now;
        if self.next_ca.is_none() && left <= CA_PUBLISH_AHEAD_SECONDS {
            self.begin_ca_rotation(now)?;
            tracing::warn!(
                expires_in_days = left / 86_400,
                "issuer: the X.509 CA nears its end; a next CA joined the bundle (x509-ca-bundle.crt): give every spoke the new bundle (kleym trust-config --credential spiffe-x509)"
            );
            return Ok(true);
        }
        if self.next_ca.is_some() && left <= CA_SWITCH_AHEAD_SECONDS {
            self.finish_ca_rotation(now, CA_OVERLAP_SECONDS)?;
            tracing::warn!(
                "issuer: the next X.509 CA signs from now on; spokes without the new bundle refuse the hub's certificates"
            );
            return Ok(true);
        }
        Ok(false)
    }

    /// An immediate rotation (`kleym issuer rotate`): a new ES256 key signs from `now`; every
    /// other key retires after `retire_after`, or is removed now with `revoke_old`.
    /// Returns the new key's `kid`.
    pub fn rotate_now(
        &mut self,
        now: i64,
        policy: &RotationPolicy,
        revoke_old: bool,
    ) -> Result<String, IssuerError> {
        let (key, pem) = SigningKey::generate_es256()?;
        let kid = key.kid().to_string();
        if revoke_old {
            self.entries.clear();
        } else {
            for e in &mut self.entries {
                let r = now + policy.retire_after_seconds;
                e.times.retires = Some(e.times.retires.map_or(r, |x| x.min(r)));
                // Older than the emergency key, which must win the signing choice (a pending
                // key must not take over from it).
                e.times.activates = e.times.activates.min(now - 1);
            }
        }
        self.entries.push(KeyEntry {
            key,
            pem,
            times: KeyTimes {
                activates: now,
                retires: None,
            },
        });
        Ok(kid)
    }
}

fn new_ca(now: i64) -> Result<HubCa, IssuerError> {
    let at = chrono::DateTime::from_timestamp(now, 0)
        .ok_or_else(|| IssuerError::Key(format!("time {now} out of range")))?;
    HubCa::generate(at)
}

/// Parses a duration such as `7d`, `1h`, `30m`, `45s` (one number and one unit) into seconds.
pub fn parse_duration_seconds(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (s, m, h, d), e.g. 7d"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{s:?}: unit must be s, m, h or d")),
    };
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{s:?}: must be positive"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::issuer::x509::CA_VALIDITY_DAYS;

    const H: i64 = 3600;

    fn policy() -> RotationPolicy {
        RotationPolicy {
            period_seconds: 24 * H,
            publish_ahead_seconds: H,
            retire_after_seconds: 1200,
        }
    }

    fn kids(keys: Vec<&SigningKey>) -> Vec<String> {
        keys.into_iter().map(|k| k.kid().to_string()).collect()
    }

    #[test]
    fn publish_ahead_then_switch_then_retire() {
        let t0 = 1_000_000;
        let mut ring = KeyRing::generate(t0).unwrap();
        let first = ring.signing(t0).unwrap().kid().to_string();
        // Nothing to do before period - publish_ahead.
        assert!(!ring.rotate_step(t0 + 22 * H, &policy()).unwrap());
        // Then a new key is published, not yet signing.
        assert!(ring.rotate_step(t0 + 23 * H, &policy()).unwrap());
        let published = kids(ring.published(t0 + 23 * H));
        assert_eq!(published.len(), 2);
        let second = published[1].clone();
        assert_eq!(ring.signing(t0 + 23 * H).unwrap().kid(), first);
        // No second pending key on the next step.
        assert!(!ring.rotate_step(t0 + 23 * H + 60, &policy()).unwrap());
        // At period it signs; the old key gets its retirement and stays published meanwhile.
        let t1 = t0 + 24 * H;
        assert_eq!(ring.signing(t1).unwrap().kid(), second);
        assert!(ring.rotate_step(t1, &policy()).unwrap());
        assert_eq!(ring.entries()[0].times.retires, Some(t1 + 1200));
        assert_eq!(kids(ring.published(t1 + 1199)).len(), 2);
        // After retirement it is dropped.
        assert!(ring.rotate_step(t1 + 1200, &policy()).unwrap());
        assert_eq!(kids(ring.published(t1 + 1200)), vec![second.clone()]);
        assert_eq!(ring.entries().len(), 1);
    }

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
        let mut ring = KeyRing::generate(t0).unwrap();
        let old = ring.ca().unwrap().cert_pem.trim().to_string();
        assert_eq!(certs(&ring.ca_bundle()), vec![old.clone()]);
        assert!(ring.finish_ca_rotation(t0, 60).is_err(), "nothing begun");

        // Begin: both CAs trusted, the old one still signs; a second begin is refused.
        ring.begin_ca_rotation(t0 + 10).unwrap();
        let next = ring.next_ca().unwrap().cert_pem.trim().to_string();
        assert_ne!(next, old);
        assert_eq!(ring.ca().unwrap().cert_pem.trim(), old);
        assert_eq!(certs(&ring.ca_bundle()), vec![old.clone(), next.clone()]);
        assert!(ring.begin_ca_rotation(t0 + 11).is_err());

        // The state survives the Secret, bundle included.
        let data = ring.to_data();
        assert_eq!(
            certs(&String::from_utf8(data[CA_BUNDLE_KEY].0.clone()).unwrap()),
            vec![old.clone(), next.clone()]
        );
        let mut ring = KeyRing::from_data(&data, "secret kleym/issuer").unwrap();
        assert_eq!(ring.next_ca().unwrap().cert_pem.trim(), next);

        // Finish: the new CA signs, the old one stays trusted until the overlap ends.
        let t1 = t0 + 100;
        ring.finish_ca_rotation(t1, 3600).unwrap();
        assert_eq!(ring.ca().unwrap().cert_pem.trim(), next);
        assert!(ring.next_ca().is_none());
        assert_eq!(certs(&ring.ca_bundle()), vec![next.clone(), old.clone()]);
        let mut ring = KeyRing::from_data(&ring.to_data(), "secret kleym/issuer").unwrap();
        assert_eq!(ring.previous_cas()[0].retires, t1 + 3600);
        let policy = RotationPolicy {
            period_seconds: 1000 * H,
            ..policy()
        };
        assert!(!ring.rotate_step(t1 + 3599, &policy).unwrap());
        assert_eq!(certs(&ring.ca_bundle()).len(), 2);
        // Then the leader's step drops it.
        assert!(ring.rotate_step(t1 + 3600, &policy).unwrap());
        assert_eq!(certs(&ring.ca_bundle()), vec![next]);
    }

    #[test]
    fn the_periodic_step_rotates_a_ca_near_its_end_in_two_steps() {
        let day = 24 * H;
        let t0 = 1_000_000;
        let policy = RotationPolicy {
            period_seconds: 10_000 * day,
            ..policy()
        };
        let mut ring = KeyRing::generate(t0).unwrap();
        let old = ring.ca().unwrap().cert_pem.trim().to_string();
        let end = ring.ca().unwrap().not_after().unwrap();
        assert_eq!(end, t0 + CA_VALIDITY_DAYS * day);
        // Months before the end: nothing.
        assert!(!ring.rotate_step(t0 + 300 * day, &policy).unwrap());
        assert!(ring.next_ca().is_none());
        // 30 days before: a next CA joins the bundle; the old one still signs.
        let begin = end - CA_PUBLISH_AHEAD_SECONDS;
        assert!(!ring.rotate_step(begin - 1, &policy).unwrap());
        assert!(ring.rotate_step(begin, &policy).unwrap());
        let next = ring.next_ca().unwrap().cert_pem.trim().to_string();
        assert_eq!(ring.ca().unwrap().cert_pem.trim(), old);
        assert_eq!(certs(&ring.ca_bundle()), vec![old.clone(), next.clone()]);
        // Through the Secret, as a restarted or new leader reads it: nothing more until 7 days
        // before the end.
        let mut ring = KeyRing::from_data(&ring.to_data(), "secret kleym/issuer").unwrap();
        let switch = end - CA_SWITCH_AHEAD_SECONDS;
        assert!(!ring.rotate_step(switch - 1, &policy).unwrap());
        assert_eq!(ring.ca().unwrap().cert_pem.trim(), old);
        // 7 days before: the next CA signs, the old one stays trusted for the overlap.
        assert!(ring.rotate_step(switch, &policy).unwrap());
        assert_eq!(ring.ca().unwrap().cert_pem.trim(), next);
        assert!(ring.next_ca().is_none());
        assert_eq!(certs(&ring.ca_bundle()), vec![next.clone(), old]);
        assert!(
            ring.rotate_step(switch + CA_OVERLAP_SECONDS, &policy)
                .unwrap()
        );
        assert_eq!(certs(&ring.ca_bundle()), vec![next]);
        // The new CA is a year from the switch away from its own rotation.
        assert!(!ring.rotate_step(switch + 300 * day, &policy).unwrap());
    }

    #[test]
    fn a_half_written_next_ca_or_a_junk_previous_ca_is_refused_and_named() {
        let mut ring = KeyRing::generate(1_000_000).unwrap();
        ring.begin_ca_rotation(1_000_000).unwrap();
        let mut data = ring.to_data();
        data.remove(NEXT_CA_KEY_KEY);
        let e = KeyRing::from_data(&data, "secret kleym/issuer")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(NEXT_CA_CERT_KEY) && e.contains("secret kleym/issuer"),
            "{e}"
        );
        let mut data = ring.to_data();
        data.insert(
            STATE_KEY.into(),
            ByteString(br#"{"keys":{},"previous_cas":[{"cert":"junk","retires":1}]}"#.to_vec()),
        );
        let e = KeyRing::from_data(&data, "secret kleym/issuer")
            .unwrap_err()
            .to_string();
        assert!(e.contains("previous_cas[0]"), "{e}");
    }

    #[test]
    fn state_round_trips_through_the_secret_data() {
        let t0 = 1_000_000;
        let mut ring = KeyRing::generate(t0).unwrap();
        ring.rotate_step(t0 + 23 * H, &policy()).unwrap();
        let data = ring.to_data();
        let again = KeyRing::from_data(&data, "secret kleym/issuer").unwrap();
        assert_eq!(
            kids(again.published(t0 + 23 * H)),
            kids(ring.published(t0 + 23 * H))
        );
        assert_eq!(
            again.signing(t0 + 24 * H).unwrap().kid(),
            ring.signing(t0 + 24 * H).unwrap().kid()
        );
        // A restart in between neither adds nor drops a key.
        let mut restarted = KeyRing::from_data(&data, "x").unwrap();
        assert!(!restarted.rotate_step(t0 + 23 * H + 1, &policy()).unwrap());
        assert_eq!(restarted.entries().len(), 2);
        let mut bad = data.clone();
        bad.insert(STATE_KEY.into(), ByteString(b"{".to_vec()));
        let err = KeyRing::from_data(&bad, "secret kleym/issuer")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secret kleym/issuer data[key-state.json]"),
            "{err}"
        );
    }

    #[test]
    fn rotate_now_signs_at_once_and_revoke_old_drops_the_rest() {
        let t0 = 1_000_000;
        let mut ring = KeyRing::generate(t0).unwrap();
        ring.rotate_step(t0 + 23 * H, &policy()).unwrap(); // a pending key too
        let now = t0 + 23 * H + 10;
        let kid = ring.rotate_now(now, &policy(), false).unwrap();
        assert_eq!(ring.signing(now).unwrap().kid(), kid);
        // Still the emergency key after the pending one's planned activation.
        assert_eq!(ring.signing(t0 + 24 * H).unwrap().kid(), kid);
        assert_eq!(ring.published(now).len(), 3);
        assert_eq!(kids(ring.published(now + 1200)), vec![kid.clone()]);
        let kid2 = ring.rotate_now(now, &policy(), true).unwrap();
        assert_eq!(kids(ring.published(now)), vec![kid2]);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_seconds("7d"), Ok(7 * 86400));
        assert_eq!(parse_duration_seconds("1h"), Ok(3600));
        assert_eq!(parse_duration_seconds("45s"), Ok(45));
        for bad in ["", "7", "d", "1w", "0s", "-1h"] {
            assert!(parse_duration_seconds(bad).is_err(), "{bad}");
        }
    }
}
