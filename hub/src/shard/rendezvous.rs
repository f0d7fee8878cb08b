//! Weighted rendezvous (highest random weight) hashing: which live replica owns a key.
//!
//! Every replica computes the same owner from the same member set, without talking to the
//! others: each (key, replica) pair gets a score from a stable hash, and the highest score
//! wins. Adding a replica moves only the keys the newcomer now wins; removing one moves only
//! the keys it owned. Weights use the logarithmic method (score `-weight / ln(u)` with `u`
//! uniform in (0, 1)), which gives each replica a share of the keys proportional to its
//! weight.

use sha2::{Digest, Sha256};

/// A live replica with its weight.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    /// The replica's identity (its Lease holder identity).
    pub identity: String,
    /// Its share (1..=100).
    pub weight: u32,
}

impl Member {
    /// A member with `identity` and `weight`.
    pub fn new(identity: impl Into<String>, weight: u32) -> Self {
        Self {
            identity: identity.into(),
            weight,
        }
    }
}

/// `u` in (0, 1) for the pair: SHA-256 of `key \0 identity`, its first 53 bits, shifted off
/// zero (the same on every platform and in every process, unlike `std`'s hashers).
fn unit(key: &str, identity: &str) -> f64 {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0u8]);
    h.update(identity.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let bits = u64::from_be_bytes(first) >> 11;
    // (bits + 0.5) / 2^53: never 0, never 1.
    (bits as f64 + 0.5) / (1u64 << 53) as f64
}

/// The score of `key` on a replica of `weight`: higher wins. A weight of 0 never wins
/// against a positive one.
pub fn score(key: &str, identity: &str, weight: u32) -> f64 {
    if weight == 0 {
        return f64::NEG_INFINITY;
    }
    // ln(u) < 0 for u in (0, 1), so the score is positive and grows with the weight.
    -f64::from(weight) / unit(key, identity).ln()
}

/// The member owning `key`, or `None` when there is none. Ties (practically impossible)
/// go to the smaller identity, so every replica agrees.
pub fn owner<'a>(key: &str, members: &'a [Member]) -> Option<&'a Member> {
    members
        .iter()
        .map(|m| (score(key, &m.identity, m.weight), m))
        .max_by(|(a, ma), (b, mb)| a.total_cmp(b).then_with(|| mb.identity.cmp(&ma.identity)))
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn members(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member::new(format!("hub-{i}_x"), 10))
            .collect()
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("fleet/cluster-{i}")).collect()
    }

    #[test]
    fn the_owner_does_not_depend_on_the_order_of_the_members() {
        let mut m = members(5);
        let before: Vec<String> = keys(200)
            .iter()
            .map(|k| owner(k, &m).unwrap().identity.clone())
            .collect();
        m.reverse();
        m.swap(1, 3);
        let after: Vec<String> = keys(200)
            .iter()
            .map(|k| owner(k, &m).unwrap().identity.clone())
            .collect();
        assert_eq!(before, after);
        assert_eq!(owner("k", &[]), None);
    }

    #[test]
    fn equal_weights_spread_keys_evenly() {
        let m = members(3);
        let mut counts = [0usize; 3];
        for k in keys(3000) {
            let o = owner(&k, &m).unwrap();
            let i = m.iter().position(|x| x == o).unwrap();
            counts[i] += 1;
        }
        // Each expects 1000; the bounds are many standard deviations (about 26) wide.
        for c in counts {
            assert!((850..=1150).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn weights_spread_load_proportionally() {
        let m = vec![
            Member::new("a", 10),
            Member::new("b", 20),
            Member::new("c", 30),
        ];
        let mut counts = [0usize; 3];
        let n = 6000;
        for k in keys(n) {
            let o = owner(&k, &m).unwrap();
            counts[m.iter().position(|x| x == o).unwrap()] += 1;
        }
        // Shares 1/6, 2/6, 3/6 of 6000: 1000, 2000, 3000 (standard deviations 29-39).
        let expected = [1000f64, 2000.0, 3000.0];
        for (c, e) in counts.iter().zip(expected) {
            let c = *c as f64;
            assert!((c - e).abs() < 200.0, "{counts:?} vs {expected:?}");
        }
    }

    #[test]
    fn a_zero_weight_never_wins() {
        let m = vec![Member::new("a", 0), Member::new("b", 1)];
        for k in keys(100) {
            assert_eq!(owner(&k, &m).unwrap().identity, "b");
        }
    }

    proptest! {
        /// Going from N to N+1 replicas moves only keys to the newcomer; going back (the
        /// newcomer leaves) returns exactly those keys to where they were.
        #[test]
        fn adding_a_replica_moves_keys_only_to_it(
            n in 1usize..6,
            weights in proptest::collection::vec(1u32..=100, 7),
            new_weight in 1u32..=100,
            salt in "[a-z0-9]{1,8}",
        ) {
            let before: Vec<Member> = (0..n)
                .map(|i| Member::new(format!("r{i}-{salt}"), weights[i]))
                .collect();
            let mut after = before.clone();
            after.push(Member::new(format!("new-{salt}"), new_weight));
            let mut moved = 0;
            for k in keys(300) {
                let was = owner(&k, &before).unwrap();
                let now = owner(&k, &after).unwrap();
                if was != now {
                    moved += 1;
                    prop_assert_eq!(&now.identity, &format!("new-{salt}"));
                }
            }
            // Not vacuous: with 300 keys the newcomer wins some unless its share is tiny.
            let share = f64::from(new_weight)
                / (f64::from(new_weight) + weights[..n].iter().map(|w| f64::from(*w)).sum::<f64>());
            if share > 0.1 {
                prop_assert!(moved > 0, "share {share}, nothing moved");
            }
        }
    }
}
