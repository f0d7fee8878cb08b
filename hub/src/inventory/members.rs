//! Member clusters: ClusterProfiles that describe the same cluster.
//!
//! Profiles carrying the same `multicluster.x-k8s.io/inventory-member-id` label describe one
//! member cluster (two cluster managers, or two inventory namespaces, listing it). The hub
//! must engage that cluster once: engaging it twice would run two reconcilers against one
//! API server and count its bindings twice, as cross-cluster drift with itself. The
//! [`MemberIndex`] picks one profile per member (the *chosen* one, engaged as usual) and
//! marks the others [`Role::Duplicate`], naming the chosen profile. Profiles without the
//! label are their own member, as before.
//!
//! The choice, among the profiles of a member, is a function of the profiles alone (so every
//! replica, and every restart, picks the same one whatever order the profiles arrive in):
//! 1. the best [`Readiness`]: a profile the hub can engage, then one waiting for its
//!    cluster to become healthy, then a refused one, then one being deleted;
//! 2. then the oldest (`creationTimestamp`): a profile added later for a member already
//!    engaged (a second cluster manager) never takes it over while the first is usable;
//! 3. then the smallest `namespace/name`.
//!
//! So the chosen profile changes only when another becomes better: the chosen one is
//! deleted, refused, or its cluster reported unhealthy while another profile of the member
//! is engageable (and back, once the older one is engageable again).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

/// How usable a profile is as the one a member is engaged through (better first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Readiness {
    /// The hub engages it (decision: engage).
    Engageable,
    /// Waiting for its cluster to become healthy.
    Waiting,
    /// Refused (no usable access provider, bad content, ...).
    Refused,
    /// Being deleted (`deletionTimestamp` set).
    Deleting,
}

/// What the index knows of one profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The `inventory-member-id` label (`None`: unset or empty; the profile is its own
    /// member).
    pub member_id: Option<String>,
    /// How usable the profile is.
    pub readiness: Readiness,
    /// `creationTimestamp` (`None` sorts last).
    pub created: Option<DateTime<Utc>>,
}

/// A profile's part in its member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Engaged as usual: no member id, or the member's chosen profile.
    Engage,
    /// Another profile of the same member is engaged: this one is not.
    Duplicate {
        /// The member id.
        member_id: String,
        /// The chosen profile (`namespace/name`).
        of: String,
    },
}

/// The profiles by member, and the one chosen per member (see the module documentation).
#[derive(Clone, Debug, Default)]
pub struct MemberIndex {
    profiles: BTreeMap<String, Candidate>,
    chosen: BTreeMap<String, String>,
}

impl MemberIndex {
    /// Records `profile` (`namespace/name`) as `candidate`; returns the profiles whose
    /// [`Role`] changed, with their new role.
    pub fn upsert(&mut self, profile: &str, candidate: Candidate) -> Vec<(String, Role)> {
        let before = self.roles_of_members(profile, Some(&candidate));
        let old = self.profiles.insert(profile.to_string(), candidate);
        let mut touched: BTreeSet<String> = BTreeSet::new();
        if let Some(m) = old.and_then(|c| c.member_id) {
            touched.insert(m);
        }
        if let Some(m) = self.profiles.get(profile).and_then(|c| c.member_id.clone()) {
            touched.insert(m);
        }
        self.rechoose(&touched);
        self.changes(before)
    }

    /// Forgets `profile`; returns the profiles whose [`Role`] changed (the removed one is not
    /// among them).
    pub fn remove(&mut self, profile: &str) -> Vec<(String, Role)> {
        let before = self.roles_of_members(profile, None);
        let Some(old) = self.profiles.remove(profile) else {
            return Vec::new();
        };
        if let Some(m) = old.member_id {
            self.rechoose(&BTreeSet::from([m]));
        }
        self.changes(before)
            .into_iter()
            .filter(|(p, _)| p != profile)
            .collect()
    }

    /// The role of `profile` (a profile the index does not know is engaged as usual).
    pub fn role(&self, profile: &str) -> Role {
        let Some(member_id) = self
            .profiles
            .get(profile)
            .and_then(|c| c.member_id.as_ref())
        else {
            return Role::Engage;
        };
        match self.chosen.get(member_id) {
            Some(of) if of != profile => Role::Duplicate {
                member_id: member_id.clone(),
                of: of.clone(),
            },
            _ => Role::Engage,
        }
    }

    /// Another profile of `profile`'s member that is not being deleted (the member stays in
    /// the fleet through it): the spoke's identities must survive `profile`'s removal.
    pub fn successor(&self, profile: &str) -> Option<String> {
        let member_id = self.profiles.get(profile)?.member_id.as_ref()?;
        self.profiles
            .iter()
            .filter(|(p, c)| {
                p.as_str() != profile
                    && c.member_id.as_ref() == Some(member_id)
                    && c.readiness != Readiness::Deleting
            })
            .min_by(order)
            .map(|(p, _)| p.clone())
    }

    /// Member ids with more than one profile, each with its chosen profile and the others.
    pub fn duplicated(&self) -> BTreeMap<String, (String, Vec<String>)> {
        let mut out: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for (p, c) in &self.profiles {
            let Some(m) = &c.member_id else { continue };
            let Some(chosen) = self.chosen.get(m) else {
                continue;
            };
            if p != chosen {
                out.entry(m.clone())
                    .or_insert_with(|| (chosen.clone(), Vec::new()))
                    .1
                    .push(p.clone());
            }
        }
        out
    }

    /// Roles of every profile in the members `profile` belongs to now and will belong to
    /// with `next` (before a change), to diff against afterwards.
    fn roles_of_members(&self, profile: &str, next: Option<&Candidate>) -> BTreeMap<String, Role> {
        let mut members: BTreeSet<&String> = BTreeSet::new();
        if let Some(m) = self
            .profiles
            .get(profile)
            .and_then(|c| c.member_id.as_ref())
        {
            members.insert(m);
        }
        if let Some(m) = next.and_then(|c| c.member_id.as_ref()) {
            members.insert(m);
        }
        let mut roles: BTreeMap<String, Role> = self
            .profiles
            .iter()
            .filter(|(_, c)| c.member_id.as_ref().is_some_and(|m| members.contains(m)))
            .map(|(p, _)| (p.clone(), self.role(p)))
            .collect();
        roles
            .entry(profile.to_string())
            .or_insert_with(|| self.role(profile));
        roles
    }

    fn changes(&self, before: BTreeMap<String, Role>) -> Vec<(String, Role)> {
        before
            .into_iter()
            .filter_map(|(p, old)| {
                let new = self.role(&p);
                (new != old).then_some((p, new))
            })
            .collect()
    }

    fn rechoose(&mut self, members: &BTreeSet<String>) {
        for m in members {
            let best = self
                .profiles
                .iter()
                .filter(|(_, c)| c.member_id.as_ref() == Some(m))
                .min_by(|a, b| a.1.readiness.cmp(&b.1.readiness).then_with(|| order(a, b)))
                .map(|(p, _)| p.clone());
            match best {
                Some(p) => {
                    self.chosen.insert(m.clone(), p);
                }
                None => {
                    self.chosen.remove(m);
                }
            }
        }
    }
}

/// Oldest first (unknown creation last), then by name: the tie-break that makes the choice
/// independent of arrival order.
fn order(a: &(&String, &Candidate), b: &(&String, &Candidate)) -> std::cmp::Ordering {
    let key = |c: &Candidate| (c.created.is_none(), c.created);
    key(a.1).cmp(&key(b.1)).then_with(|| a.0.cmp(b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(secs, 0)
    }

    fn cand(member: Option<&str>, readiness: Readiness, created: i64) -> Candidate {
        Candidate {
            member_id: member.map(str::to_string),
            readiness,
            created: at(created),
        }
    }

    fn dup(member: &str, of: &str) -> Role {
        Role::Duplicate {
            member_id: member.into(),
            of: of.into(),
        }
    }

    #[test]
    fn profiles_without_a_member_id_are_their_own_member() {
        let mut idx = MemberIndex::default();
        assert!(
            idx.upsert("a/x", cand(None, Readiness::Engageable, 1))
                .is_empty()
        );
        assert!(
            idx.upsert("b/x", cand(None, Readiness::Engageable, 2))
                .is_empty()
        );
        assert_eq!(idx.role("a/x"), Role::Engage);
        assert_eq!(idx.role("b/x"), Role::Engage);
        assert!(idx.duplicated().is_empty());
        assert_eq!(idx.successor("a/x"), None);
    }

    #[test]
    fn the_oldest_engageable_profile_is_chosen_whatever_the_arrival_order() {
        let profiles = [
            ("ocm/c1", cand(Some("m1"), Readiness::Engageable, 20)),
            ("capi/c1", cand(Some("m1"), Readiness::Engageable, 10)),
            ("other/c1", cand(Some("m1"), Readiness::Refused, 5)),
        ];
        // Every order of arrival gives the same choice.
        for perm in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut idx = MemberIndex::default();
            for i in perm {
                idx.upsert(profiles[i].0, profiles[i].1.clone());
            }
            assert_eq!(idx.role("capi/c1"), Role::Engage, "{perm:?}");
            assert_eq!(idx.role("ocm/c1"), dup("m1", "capi/c1"), "{perm:?}");
            assert_eq!(idx.role("other/c1"), dup("m1", "capi/c1"), "{perm:?}");
            let d = idx.duplicated();
            assert_eq!(
                d.get("m1"),
                Some(&(
                    "capi/c1".to_string(),
                    vec!["ocm/c1".to_string(), "other/c1".to_string()]
                ))
            );
        }
    }

    #[test]
    fn the_grouping_depends_only_on_label_equality() {
        // Renaming every member id (consistently) changes nothing but the names.
        let build = |m1: &str, m2: &str| {
            let mut idx = MemberIndex::default();
            idx.upsert("a/p", cand(Some(m1), Readiness::Engageable, 3));
            idx.upsert("b/p", cand(Some(m1), Readiness::Engageable, 1));
            idx.upsert("a/q", cand(Some(m2), Readiness::Waiting, 1));
            idx.upsert("b/q", cand(Some(m2), Readiness::Engageable, 2));
            ["a/p", "b/p", "a/q", "b/q"].map(|p| match idx.role(p) {
                Role::Engage => None,
                Role::Duplicate { of, .. } => Some(of),
            })
        };
        assert_eq!(build("m1", "m2"), build("zz-9", "aa-0"));
        assert_eq!(
            build("m1", "m2"),
            [Some("b/p".to_string()), None, Some("b/q".to_string()), None]
        );
    }

    #[test]
    fn ties_break_by_name_and_unknown_creation_sorts_last() {
        let mut idx = MemberIndex::default();
        idx.upsert("b/c", cand(Some("m"), Readiness::Engageable, 7));
        idx.upsert("a/c", cand(Some("m"), Readiness::Engageable, 7));
        assert_eq!(idx.role("b/c"), dup("m", "a/c"));
        let mut idx = MemberIndex::default();
        idx.upsert(
            "a/c",
            Candidate {
                created: None,
                ..cand(Some("m"), Readiness::Engageable, 0)
            },
        );
        idx.upsert("z/c", cand(Some("m"), Readiness::Engageable, 99));
        assert_eq!(idx.role("a/c"), dup("m", "z/c"));
    }

    #[test]
    fn a_younger_profile_never_takes_over_and_an_unhealthy_chosen_one_fails_over() {
        let mut idx = MemberIndex::default();
        idx.upsert("early/c", cand(Some("m"), Readiness::Engageable, 10));
        // A second cluster manager lists the cluster later: a duplicate.
        let changes = idx.upsert("late/c", cand(Some("m"), Readiness::Engageable, 50));
        assert_eq!(changes, vec![("late/c".to_string(), dup("m", "early/c"))]);
        // The chosen one's cluster turns unhealthy: hand over to the engageable one.
        let changes = idx.upsert("early/c", cand(Some("m"), Readiness::Waiting, 10));
        assert_eq!(
            changes,
            vec![
                ("early/c".to_string(), dup("m", "late/c")),
                ("late/c".to_string(), Role::Engage),
            ]
        );
        // Refused is worse than waiting: still late.
        assert!(
            idx.upsert("early/c", cand(Some("m"), Readiness::Refused, 10))
                .is_empty()
        );
        // Engageable again: the older one is chosen again.
        let changes = idx.upsert("early/c", cand(Some("m"), Readiness::Engageable, 10));
        assert_eq!(
            changes,
            vec![
                ("early/c".to_string(), Role::Engage),
                ("late/c".to_string(), dup("m", "early/c")),
            ]
        );
    }

    #[test]
    fn deleting_the_chosen_profile_hands_over_to_its_successor() {
        let mut idx = MemberIndex::default();
        idx.upsert("a/c", cand(Some("m"), Readiness::Engageable, 1));
        idx.upsert("b/c", cand(Some("m"), Readiness::Engageable, 2));
        assert_eq!(idx.successor("a/c").as_deref(), Some("b/c"));
        // deletionTimestamp set: b takes over while a's removal runs.
        let changes = idx.upsert("a/c", cand(Some("m"), Readiness::Deleting, 1));
        assert_eq!(
            changes,
            vec![
                ("a/c".to_string(), dup("m", "b/c")),
                ("b/c".to_string(), Role::Engage),
            ]
        );
        assert_eq!(idx.successor("a/c").as_deref(), Some("b/c"));
        // Gone: nothing else changes.
        assert!(idx.remove("a/c").is_empty());
        assert_eq!(idx.role("b/c"), Role::Engage);
        // The last profile of a member has no successor.
        assert_eq!(idx.successor("b/c"), None);
        assert!(idx.remove("b/c").is_empty());
        assert!(idx.duplicated().is_empty());
    }

    #[test]
    fn relabelling_moves_a_profile_between_members() {
        let mut idx = MemberIndex::default();
        idx.upsert("a/c", cand(Some("m"), Readiness::Engageable, 1));
        idx.upsert("b/c", cand(Some("m"), Readiness::Engageable, 2));
        assert_eq!(idx.role("b/c"), dup("m", "a/c"));
        // b is relabelled to another member: engaged on its own.
        let changes = idx.upsert("b/c", cand(Some("n"), Readiness::Engageable, 2));
        assert_eq!(changes, vec![("b/c".to_string(), Role::Engage)]);
        // a loses its label: still engaged, and now b's old member is empty.
        assert!(
            idx.upsert("a/c", cand(None, Readiness::Engageable, 1))
                .is_empty()
        );
        assert!(idx.duplicated().is_empty());
        // a joins n, older than b and as good: a is chosen, b becomes its duplicate.
        let changes = idx.upsert("a/c", cand(Some("n"), Readiness::Engageable, 1));
        assert_eq!(changes, vec![("b/c".to_string(), dup("n", "a/c"))]);
    }
}
