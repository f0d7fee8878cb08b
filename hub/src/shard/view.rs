//! Views and the hand-over barrier (pure).
//!
//! A [`View`] is the sorted set of live replicas with their weights; its [`View::hash`] is
//! what a replica writes into its Lease's `kleym.io/shard-view` annotation once it has
//! stopped every spoke it does not own under that view (release before take). A replica
//! takes a spoke it newly owns under a view only when every member of the view shows that
//! view's hash ([`barrier_passed`]): then every other member has released it.
//!
//! [`Ownership`] is what the rest of the hub sees: which keys this replica owns, under
//! which view, and whether the barrier passed.

use sha2::{Digest, Sha256};

use super::rendezvous::{Member, owner};

/// The live replicas as one replica sees them (sorted by identity, one entry each).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct View {
    members: Vec<Member>,
}

impl View {
    /// The view of `members` (sorted; a repeated identity keeps its first weight).
    pub fn new(members: impl IntoIterator<Item = Member>) -> Self {
        let mut members: Vec<Member> = members.into_iter().collect();
        members.sort_by(|a, b| a.identity.cmp(&b.identity));
        members.dedup_by(|b, a| a.identity == b.identity);
        Self { members }
    }

    /// Its members, sorted by identity.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether `identity` is a member.
    pub fn contains(&self, identity: &str) -> bool {
        self.members.iter().any(|m| m.identity == identity)
    }

    /// A stable digest of the members and weights (16 hex digits of SHA-256): equal views
    /// have equal hashes on every replica.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for m in &self.members {
            h.update(m.identity.as_bytes());
            h.update([0u8]);
            h.update(m.weight.to_be_bytes());
            h.update([b'\n']);
        }
        let d = h.finalize();
        d[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The identity owning `key` under this view.
    pub fn owner(&self, key: &str) -> Option<&str> {
        owner(key, &self.members).map(|m| m.identity.as_str())
    }
}

/// What one replica's Lease shows, as another replica reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    /// Its identity.
    pub identity: String,
    /// Its `kleym.io/shard-view` annotation (the view whose release it completed).
    pub view: Option<String>,
}

/// Whether every member of `view` shows `view`'s hash: the peers' records in `peers`, this
/// replica's own in `mine` (what it last wrote to its Lease). A member without a record
/// counts as not there yet.
pub fn barrier_passed(view: &View, me: &str, mine: Option<&str>, peers: &[PeerRecord]) -> bool {
    let hash = view.hash();
    view.members().iter().all(|m| {
        if m.identity == me {
            mine == Some(hash.as_str())
        } else {
            peers
                .iter()
                .any(|p| p.identity == m.identity && p.view.as_deref() == Some(hash.as_str()))
        }
    })
}

/// Which spokes this replica may engage, published on a watch channel to the supervisor,
/// the status writer and the hub API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Leader mode: every spoke (the leader Lease decides whether the replica acts at all).
    All,
    /// Sharded mode: the keys this replica owns under its current view.
    Shard(Shard),
}

/// This replica's share in sharded mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This replica's identity.
    pub me: String,
    /// The current view; `None` while this replica is not a member (before its Lease was
    /// first written, and after it could not renew it within the renew deadline): it then
    /// owns nothing.
    pub view: Option<View>,
    /// Every member of the view shows it (see [`barrier_passed`]).
    pub ready: bool,
}

impl Ownership {
    /// Sharded mode before the first view: owns nothing.
    pub fn none(me: impl Into<String>) -> Self {
        Ownership::Shard(Shard {
            me: me.into(),
            view: None,
            ready: false,
        })
    }

    /// Whether this replica owns `key` under its current view (settled or not). A spoke it
    /// does not own must not run here; one it owns may start only once [`Self::is_ready`].
    pub fn owns(&self, key: &str) -> bool {
        match self {
            Ownership::All => true,
            Ownership::Shard(s) => s
                .view
                .as_ref()
                .and_then(|v| v.owner(key))
                .is_some_and(|o| o == s.me),
        }
    }

    /// The owner of `key` under the current view (`None` in leader mode or without a view).
    pub fn owner_of(&self, key: &str) -> Option<&str> {
        match self {
            Ownership::All => None,
            Ownership::Shard(s) => s.view.as_ref().and_then(|v| v.owner(key)),
        }
    }

    /// The current view's hash (`None` in leader mode or without a view).
    pub fn view_hash(&self) -> Option<String> {
        match self {
            Ownership::All => None,
            Ownership::Shard(s) => s.view.as_ref().map(View::hash),
        }
    }

    /// Whether newly owned spokes may be taken (always in leader mode).
    pub fn is_ready(&self) -> bool {
        match self {
            Ownership::All => true,
            Ownership::Shard(s) => s.ready && s.view.is_some(),
        }
    }

    /// Whether this is sharded mode.
    pub fn is_sharded(&self) -> bool {
        matches!(self, Ownership::Shard(_))
    }
}

/// The ownership key of a spoke: its profile's inventory member id where it has one (all
/// profiles of one member cluster go to one replica), else the spoke name
/// (`<namespace>/<name>`).
pub fn ownership_key(spoke: &str, member_id: Option<&str>) -> String {
    match member_id.map(str::trim).filter(|m| !m.is_empty()) {
        Some(m) => format!("member:{m}"),
        None => spoke.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ids: &[(&str, u32)]) -> View {
        View::new(ids.iter().map(|(i, w)| Member::new(*i, *w)))
    }

    #[test]
    fn a_view_is_sorted_and_its_hash_ignores_order_but_not_weights() {
        let a = view(&[("b", 10), ("a", 10), ("b", 20)]);
        assert_eq!(
            a.members()
                .iter()
                .map(|m| m.identity.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(a.hash(), view(&[("a", 10), ("b", 10)]).hash());
        assert_ne!(a.hash(), view(&[("a", 10), ("b", 20)]).hash());
        assert_ne!(a.hash(), view(&[("a", 10)]).hash());
        assert_eq!(a.hash().len(), 16);
    }

    #[test]
    fn the_barrier_needs_every_member_including_this_replica() {
        let v = view(&[("a", 10), ("b", 10), ("c", 10)]);
        let h = v.hash();
        let rec = |i: &str, v: Option<&str>| PeerRecord {
            identity: i.into(),
            view: v.map(str::to_string),
        };
        let peers = [rec("b", Some(&h)), rec("c", Some(&h))];
        assert!(barrier_passed(&v, "a", Some(&h), &peers));
        // This replica has not published it yet.
        assert!(!barrier_passed(&v, "a", None, &peers));
        assert!(!barrier_passed(&v, "a", Some("other"), &peers));
        // A peer still on another view, or not seen at all.
        assert!(!barrier_passed(
            &v,
            "a",
            Some(&h),
            &[rec("b", Some(&h)), rec("c", Some("old"))]
        ));
        assert!(!barrier_passed(&v, "a", Some(&h), &[rec("b", Some(&h))]));
        // Peers outside the view do not matter.
        let mut more = peers.to_vec();
        more.push(rec("z", None));
        assert!(barrier_passed(&v, "a", Some(&h), &more));
    }

    #[test]
    fn ownership_follows_the_view_and_readiness() {
        let v = view(&[("a", 10), ("b", 10)]);
        let key = (0..100)
            .map(|i| format!("fleet/c{i}"))
            .find(|k| v.owner(k) == Some("a"))
            .unwrap();
        let other = (0..100)
            .map(|i| format!("fleet/c{i}"))
            .find(|k| v.owner(k) == Some("b"))
            .unwrap();
        let mut o = Ownership::Shard(Shard {
            me: "a".into(),
            view: Some(v.clone()),
            ready: false,
        });
        assert!(o.owns(&key) && !o.owns(&other) && !o.is_ready());
        assert_eq!(o.owner_of(&other), Some("b"));
        assert_eq!(o.view_hash(), Some(v.hash()));
        if let Ownership::Shard(s) = &mut o {
            s.ready = true;
        }
        assert!(o.is_ready());
        // No view: owns nothing, never ready.
        let none = Ownership::none("a");
        assert!(!none.owns(&key) && !none.is_ready() && none.view_hash().is_none());
        // Leader mode: everything.
        assert!(Ownership::All.owns(&other) && Ownership::All.is_ready());
    }

    #[test]
    fn the_key_is_the_member_id_where_there_is_one() {
        assert_eq!(ownership_key("fleet/a", Some("m-1")), "member:m-1");
        assert_eq!(ownership_key("fleet/a", Some("  ")), "fleet/a");
        assert_eq!(ownership_key("fleet/a", None), "fleet/a");
        // Two profiles of one member share an owner.
        assert_eq!(
            ownership_key("fleet/a", Some("m-1")),
            ownership_key("other/b", Some("m-1"))
        );
    }
}
