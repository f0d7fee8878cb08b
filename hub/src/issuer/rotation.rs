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
//!
//! The X.509 CA lives in a Secret of its own ([`super::ca`]). A key Secret written before
//! that split may still hold it (`x509-ca.*` data keys, `previous_cas` in the state): the
//! ring carries those values through every write untouched ([`KeyRing::legacy_ca_data`]),
//! so rotating keys never loses a CA that spokes trust; [`super::ca`] moves them out.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};

use super::keys::{Algorithm, SigningKey};
use super::x509::LEGACY_CA_DATA_KEYS;
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
    /// Replaced X.509 CAs still trusted, in a key Secret written before the CA moved to a
    /// Secret of its own (kept verbatim until [`super::ca`] moves them).
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

/// One key of the ring. `Debug` shows the key ID and times, never the private key.
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

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEntry")
            .field("key", &self.key)
            .field("pem", &"<redacted>")
            .field("times", &self.times)
            .finish()
    }
}

/// The signing keys of the issuer Secret with their times. `Debug` shows key IDs and times,
/// never private keys (nor the legacy CA data the ring carries).
pub struct KeyRing {
    entries: Vec<KeyEntry>,
    /// `x509-ca.*` data of a key Secret from before the CA had a Secret of its own, verbatim.
    legacy_ca: BTreeMap<String, ByteString>,
    /// `previous_cas` of that Secret's state, verbatim.
    legacy_previous_cas: Vec<PreviousCa>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("entries", &self.entries)
            .field("legacy_ca_keys", &self.legacy_ca.keys().collect::<Vec<_>>())
            .field("legacy_previous_cas", &self.legacy_previous_cas.len())
            .finish()
    }
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
        let legacy_ca: BTreeMap<String, ByteString> = LEGACY_CA_DATA_KEYS
            .iter()
            .filter_map(|k| data.get(*k).map(|v| ((*k).to_string(), v.clone())))
            .collect();
        Ok(KeyRing {
            entries,
            legacy_ca,
            legacy_previous_cas: state.previous_cas,
        })
    }

    /// Whether the Secret still holds an X.509 CA from before the CA had a Secret of its own.
    pub fn has_legacy_ca(&self) -> bool {
        !self.legacy_ca.is_empty() || !self.legacy_previous_cas.is_empty()
    }

    /// That legacy CA data (`x509-ca.*` data keys) and previous CAs, to move them.
    pub fn legacy_ca_data(&self) -> (&BTreeMap<String, ByteString>, &[PreviousCa]) {
        (&self.legacy_ca, &self.legacy_previous_cas)
    }

    /// Forgets the legacy CA data (once it is safely in the CA Secret): the next write
    /// removes it from the key Secret.
    pub fn clear_legacy_ca(&mut self) {
        self.legacy_ca.clear();
        self.legacy_previous_cas.clear();
    }

    /// A ring of one new ES256 key, signing from `now` (no X.509 CA: see [`super::ca`]).
    pub fn generate(now: i64) -> Result<Self, IssuerError> {
        let (key, pem) = SigningKey::generate_es256()?;
        Ok(KeyRing {
            legacy_ca: BTreeMap::new(),
            legacy_previous_cas: Vec::new(),
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
            previous_cas: self.legacy_previous_cas.clone(),
        };
        let mut data = BTreeMap::from([
            (SECRET_KEY.to_string(), ByteString(pem.into_bytes())),
            (
                STATE_KEY.to_string(),
                ByteString(serde_json::to_vec(&state).unwrap_or_default()),
            ),
        ]);
        data.extend(self.legacy_ca.clone());
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
    fn a_key_ring_holds_no_ca_and_carries_a_legacy_one_until_it_is_moved() {
        let t0 = 1_000_000;
        let mut ring = KeyRing::generate(t0).unwrap();
        let data = ring.to_data();
        for k in LEGACY_CA_DATA_KEYS {
            assert!(!data.contains_key(k), "{k} in a new key Secret");
        }
        // The periodic step never adds one either.
        ring.rotate_step(t0 + 30 * H, &policy()).unwrap();
        assert!(!ring.has_legacy_ca());
        assert!(!ring.to_data().keys().any(|k| k.starts_with("x509-ca")));
        // A legacy CA (and its replaced CAs) survives key rotations byte for byte...
        let mut data = ring.to_data();
        for k in LEGACY_CA_DATA_KEYS {
            data.insert(k.into(), ByteString(format!("legacy {k}").into_bytes()));
        }
        data.insert(
            STATE_KEY.into(),
            ByteString(
                br#"{"keys":{},"previous_cas":[{"cert":"-----BEGIN CERTIFICATE-----","retires":5}]}"#
                    .to_vec(),
            ),
        );
        let mut ring = KeyRing::from_data(&data, "x").unwrap();
        ring.rotate_now(t0 + 31 * H, &policy(), true).unwrap();
        let again = KeyRing::from_data(&ring.to_data(), "x").unwrap();
        let (legacy, previous) = again.legacy_ca_data();
        for k in LEGACY_CA_DATA_KEYS {
            assert_eq!(legacy[k].0, format!("legacy {k}").into_bytes());
        }
        assert_eq!(previous.len(), 1);
        // ...until it is cleared (once moved).
        let mut again = again;
        again.clear_legacy_ca();
        let data = again.to_data();
        assert!(!data.keys().any(|k| k.starts_with("x509-ca")));
        assert!(!KeyRing::from_data(&data, "x").unwrap().has_legacy_ca());
    }

    /// The base64 body of every PEM block of `pem` (what would leak if formatted).
    fn pem_bodies(pem: &str) -> Vec<String> {
        pem.split("-----END")
            .map(|block| {
                block
                    .lines()
                    .filter(|l| !l.starts_with("-----") && !l.trim().is_empty())
                    .collect::<String>()
            })
            .filter(|b| b.len() > 40)
            .collect()
    }

    #[test]
    fn debug_of_keys_and_rings_shows_no_key_material() {
        let t0 = 1_000_000;
        let mut ring = KeyRing::generate(t0).unwrap();
        ring.rotate_step(t0 + 23 * H, &policy()).unwrap(); // a second, pending key
        // A key Secret from before the CA had its own Secret: the CA key rides along.
        let ca = crate::issuer::x509::HubCa::generate(chrono::Utc::now()).unwrap();
        let mut data = ring.to_data();
        data.insert(
            crate::issuer::x509::CA_CERT_KEY.into(),
            ByteString(ca.cert_pem.clone().into_bytes()),
        );
        data.insert(
            crate::issuer::x509::CA_KEY_KEY.into(),
            ByteString(ca.key_pem().as_bytes().to_vec()),
        );
        let ring = KeyRing::from_data(&data, "secret kleym/issuer").unwrap();
        assert!(ring.has_legacy_ca());
        let secret_pem = String::from_utf8(data[SECRET_KEY].0.clone()).unwrap();
        let mut secrets = pem_bodies(&secret_pem);
        secrets.extend(pem_bodies(ca.key_pem()));
        assert_eq!(secrets.len(), 3, "two signing keys and the CA key");
        let mut texts = vec![format!("{ring:?}"), format!("{ring:#?}")];
        for e in ring.entries() {
            texts.push(format!("{e:?}"));
            texts.push(format!("{e:#?}"));
        }
        for text in &texts {
            assert!(!text.contains("PRIVATE KEY"), "{text}");
            for body in &secrets {
                // Any 32-character run of the key's base64 would be a leak.
                for start in (0..body.len() - 32).step_by(16) {
                    assert!(!text.contains(&body[start..start + 32]), "{text}");
                }
            }
        }
        // What Debug is for is still there: the key IDs.
        let kid = ring.entries()[0].key.kid();
        assert!(texts[0].contains(kid), "{}", texts[0]);
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
