//! Audiences in use: two profiles the hub would engage must not share the audience of the
//! hub's tokens, or a token minted for one would be accepted by the other's cluster.
//!
//! Derived audiences (`kleym.io/clusterprofile/<namespace>/<name>`) never collide; an
//! audience a profile chooses itself (where its provider entry says
//! `profileSourcedAudiencePolicy: Allow`) may collide with any other. The [`AudienceIndex`]
//! records the audience each profile *would* be engaged with (its decision before this rule,
//! and only the profile a member cluster is engaged through), so that every profile sharing
//! an audience is refused, whatever the order they arrived in, and both come back once one
//! of them changes.

use std::collections::{BTreeMap, BTreeSet};

/// The audience each profile claims, and the profiles claiming each audience.
#[derive(Clone, Debug, Default)]
pub struct AudienceIndex {
    by_profile: BTreeMap<String, String>,
    by_audience: BTreeMap<String, BTreeSet<String>>,
}

impl AudienceIndex {
    /// Records that `profile` claims `audience` (`None`: claims none, e.g. it is not to be
    /// engaged). Returns the other profiles whose peers changed (they must be decided again).
    pub fn set(&mut self, profile: &str, audience: Option<&str>) -> Vec<String> {
        let old = self.by_profile.get(profile).cloned();
        if old.as_deref() == audience {
            return Vec::new();
        }
        let mut touched = BTreeSet::new();
        if let Some(old) = old {
            self.by_profile.remove(profile);
            if let Some(set) = self.by_audience.get_mut(&old) {
                set.remove(profile);
                touched.extend(set.iter().cloned());
                if set.is_empty() {
                    self.by_audience.remove(&old);
                }
            }
        }
        if let Some(new) = audience {
            self.by_profile.insert(profile.to_string(), new.to_string());
            let set = self.by_audience.entry(new.to_string()).or_default();
            touched.extend(set.iter().cloned());
            set.insert(profile.to_string());
        }
        touched.into_iter().collect()
    }

    /// The other profiles claiming `profile`'s audience, with that audience; `None` when it
    /// claims none or is alone with it.
    pub fn clash(&self, profile: &str) -> Option<(&str, Vec<&str>)> {
        let audience = self.by_profile.get(profile)?;
        let others: Vec<&str> = self
            .by_audience
            .get(audience)?
            .iter()
            .map(String::as_str)
            .filter(|p| *p != profile)
            .collect();
        (!others.is_empty()).then_some((audience.as_str(), others))
    }
}

/// Why `profile` is refused: it shares `audience` with `others`. Names every profile and the
/// field the audience comes from.
pub fn clash_reason(profile: &str, audience: &str, others: &[&str]) -> String {
    format!(
        "cluster profiles {profile} and {} have the same effective audience {audience:?} \
         (the exec extension's audience, allowed by their provider's \
         profileSourcedAudiencePolicy, or a derived audience named by another profile): a \
         token for one would be accepted by the other's cluster, so neither is engaged",
        others.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_sharing_an_audience_clash_whatever_the_order() {
        for order in [["fleet/a", "fleet/b"], ["fleet/b", "fleet/a"]] {
            let mut idx = AudienceIndex::default();
            assert!(idx.set(order[0], Some("https://b")).is_empty());
            assert_eq!(idx.clash(order[0]), None);
            // The second claimant makes the first one clash: it is named to be decided again.
            assert_eq!(idx.set(order[1], Some("https://b")), vec![order[0]]);
            for p in order {
                let (aud, others) = idx.clash(p).unwrap();
                assert_eq!(aud, "https://b");
                assert_eq!(
                    others,
                    vec![if p == order[0] { order[1] } else { order[0] }]
                );
            }
        }
    }

    #[test]
    fn a_claim_that_moves_or_ends_frees_its_peers() {
        let mut idx = AudienceIndex::default();
        idx.set("fleet/a", Some("x"));
        idx.set("fleet/b", Some("x"));
        // The same claim again changes nothing and names nobody.
        assert!(idx.set("fleet/b", Some("x")).is_empty());
        // b moves to another audience: a is alone again.
        assert_eq!(idx.set("fleet/b", Some("y")), vec!["fleet/a"]);
        assert_eq!(idx.clash("fleet/a"), None);
        assert_eq!(idx.clash("fleet/b"), None);
        // b claims x again, then stops claiming (not engaged any more).
        idx.set("fleet/b", Some("x"));
        assert!(idx.clash("fleet/a").is_some());
        assert_eq!(idx.set("fleet/b", None), vec!["fleet/a"]);
        assert_eq!(idx.clash("fleet/a"), None);
        assert_eq!(idx.clash("fleet/b"), None);
    }

    #[test]
    fn three_claimants_name_each_other() {
        let mut idx = AudienceIndex::default();
        idx.set("fleet/a", Some("x"));
        idx.set("fleet/b", Some("x"));
        assert_eq!(idx.set("fleet/c", Some("x")), vec!["fleet/a", "fleet/b"]);
        let (_, others) = idx.clash("fleet/b").unwrap();
        assert_eq!(others, vec!["fleet/a", "fleet/c"]);
        let reason = clash_reason("fleet/b", "x", &others);
        assert!(
            reason.contains("fleet/a") && reason.contains("fleet/b") && reason.contains("fleet/c"),
            "{reason}"
        );
        assert!(reason.contains("audience"), "{reason}");
        // One leaves: the other two still clash.
        assert_eq!(idx.set("fleet/a", None), vec!["fleet/b", "fleet/c"]);
        assert!(idx.clash("fleet/b").is_some());
    }
}
