//! Replica membership: every replica in sharded mode holds a `coordination.k8s.io/v1`
//! Lease of its own in the hub namespace, renews it every retry period, and reads the
//! others' to know the live set (watching them in between, to see each renewal as it is
//! written). Liveness is judged as the leader election does it: a
//! Lease whose record (its resourceVersion) has not changed for the lease duration, on the
//! observer's own clock, is gone (clock skew between replicas does not matter). So is a
//! Lease that disappeared without a release: someone may have deleted it under a running
//! replica. A released Lease (no holder: its replica stopped cleanly) is gone at once.
//!
//! A replica that could not renew its own Lease (and read the others') within the renew
//! deadline publishes "owns nothing": its supervisor stops every spoke, before the others,
//! who wait the whole lease duration from the last change they saw, count it gone.
//!
//! The task publishes [`Ownership`] on a watch channel and writes into its Lease's
//! `kleym.io/shard-view` annotation the view hash the supervisor says it has released
//! for (see [`super::view`]).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinHandle;
// Tokio's clock, so membership runs on virtual time in tests.
use tokio::time::Instant;

use super::metrics::ShardMetrics;
use super::rendezvous::Member;
use super::view::{Ownership, PeerRecord, Shard, View, barrier_passed};

/// Label on every replica Lease (with value `"true"`).
pub const REPLICA_LABEL: &str = "kleym.io/hub-replica";
/// Annotation carrying a replica's weight.
pub const WEIGHT_ANNOTATION: &str = "kleym.io/shard-weight";
/// Annotation carrying the view a replica has released for.
pub const VIEW_ANNOTATION: &str = "kleym.io/shard-view";
/// Prefix of a replica Lease's name.
pub const LEASE_PREFIX: &str = "kleym-hub-replica-";
/// The weight of a replica whose Lease shows none (or an invalid one).
pub const DEFAULT_WEIGHT: u32 = 10;

/// Membership settings (the Lease timings are the leader election's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipOptions {
    /// Namespace of the replica Leases (the leader Lease's).
    pub namespace: String,
    /// This replica's identity (the leader election's).
    pub identity: String,
    /// This replica's weight (1..=100).
    pub weight: u32,
    /// A Lease unchanged for this long is gone.
    pub lease_duration: Duration,
    /// This replica owns nothing once it has not renewed for this long (< `lease_duration`).
    pub renew_deadline: Duration,
    /// Interval between renewals.
    pub retry_period: Duration,
}

/// The name of `identity`'s Lease: `kleym-hub-replica-` + the identity made DNS-safe
/// (lowercase, other characters `-`, at most 36 of them: the name stays within 63) + 8 hex digits of its SHA-256, so
/// two identities that differ only in characters the mapping loses get distinct names.
pub fn lease_name(identity: &str) -> String {
    let mut safe: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .take(36)
        .collect();
    safe = safe.trim_matches('-').to_string();
    let digest = Sha256::digest(identity.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    if safe.is_empty() {
        format!("{LEASE_PREFIX}{short}")
    } else {
        format!("{LEASE_PREFIX}{safe}-{short}")
    }
}

/// The running membership task.
pub struct ShardHandle {
    /// What this replica owns.
    pub ownership: watch::Receiver<Ownership>,
    /// The supervisor sends here the hash of the view it has released for (every spoke it
    /// does not own under that view has stopped).
    pub released: watch::Sender<Option<String>>,
    /// Ends after `stop` fired and the Lease was deleted.
    pub task: JoinHandle<()>,
}

/// A peer's Lease as last seen, and when its record last changed on this replica's clock.
struct Seen {
    record: String,
    identity: String,
    weight: u32,
    view: Option<String>,
    changed_at: Instant,
}

struct Membership {
    api: Api<Lease>,
    opts: MembershipOptions,
    name: String,
    peers: BTreeMap<String, Seen>,
    /// When the last round that renewed and listed started.
    last_ok: Option<Instant>,
    /// When this process first renewed its Lease (see [`JOIN_SETTLE`]).
    joined_at: Option<Instant>,
    /// When the last successful read of the others' Leases started.
    last_read: Option<Instant>,
    /// The view annotation our Lease shows (as last written).
    published: Option<String>,
    /// When the current view was first computed (for the barrier-wait metric).
    view_since: Option<(String, Instant)>,
    metrics: ShardMetrics,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// The label selector of every replica Lease.
fn replica_selector() -> String {
    format!("{REPLICA_LABEL}=true")
}

/// The view a Lease announces.
fn view_of(lease: &Lease) -> Option<String> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VIEW_ANNOTATION))
        .cloned()
}

fn weight_of(lease: &Lease) -> u32 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WEIGHT_ANNOTATION))
        .and_then(|w| w.trim().parse::<u32>().ok())
        .filter(|w| (1..=100).contains(w))
        .unwrap_or(DEFAULT_WEIGHT)
}

/// The identity of the replica holding `lease`: its holder, when the Lease carries the
/// name that identity's own Lease has. A Lease naming another replica as its holder (a
/// copy, or a forgery) is not that replica's: counting its `shard-view` would let the
/// barrier pass before the real replica released its spokes.
pub fn replica_identity(lease: &Lease) -> Option<String> {
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())?;
    (lease.metadata.name.as_deref() == Some(lease_name(&holder).as_str())).then_some(holder)
}

impl Membership {
    /// A replica's membership before its first round: no peer seen, nothing written.
    fn new(client: kube::Client, opts: MembershipOptions, metrics: ShardMetrics) -> Self {
        Membership {
            api: Api::namespaced(client, &opts.namespace),
            name: lease_name(&opts.identity),
            opts,
            peers: BTreeMap::new(),
            last_ok: None,
            joined_at: None,
            last_read: None,
            published: None,
            view_since: None,
            metrics,
        }
    }

    fn desired(&self, existing: Option<Lease>, view: Option<&str>) -> Lease {
        let mut lease = existing.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.opts.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert("app.kubernetes.io/name".into(), "kleym".into());
        labels.insert(REPLICA_LABEL.into(), "true".into());
        let ann = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(WEIGHT_ANNOTATION.into(), self.opts.weight.to_string());
        match view {
            Some(v) => ann.insert(VIEW_ANNOTATION.into(), v.to_string()),
            None => ann.remove(VIEW_ANNOTATION),
        };
        let old = lease.spec.take().unwrap_or_default();
        let same_holder = old.holder_identity.as_deref() == Some(self.opts.identity.as_str());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.opts.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.opts.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: old
                .acquire_time
                .filter(|_| same_holder)
                .or_else(|| Some(now())),
            renew_time: Some(now()),
            ..LeaseSpec::default()
        });
        lease
    }

    /// Writes our Lease (renewal, weight, `view`); returns the view annotation written.
    async fn renew(&self, view: Option<String>) -> Result<Option<String>, kube::Error> {
        let existing = self.api.get_opt(&self.name).await?;
        let created = existing.is_none();
        let lease = self.desired(existing, view.as_deref());
        if created {
            self.api.create(&PostParams::default(), &lease).await?;
        } else {
            // Carries the resourceVersion read: a concurrent writer makes this 409.
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await?;
        }
        Ok(view)
    }

    /// Clears the holder of our Lease (a clean stop, after every spoke was halted).
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }

    /// Reads every replica Lease and notes which records changed.
    async fn observe(&mut self) -> Result<(), kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(&replica_selector()))
            .await?;
        let at = Instant::now();
        let mut next = BTreeMap::new();
        for lease in list.items {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            if name == self.name {
                continue;
            }
            let prev = self.peers.remove(&name);
            // Released (no holder: its replica stopped cleanly and halted every spoke
            // first) or not its holder's: out of the live set at once.
            let Some(identity) = replica_identity(&lease) else {
                continue;
            };
            let record = lease.metadata.resource_version.clone().unwrap_or_default();
            let changed_at = match prev {
                Some(prev) if prev.record == record => prev.changed_at,
                _ => at,
            };
            let view = view_of(&lease);
            next.insert(
                name,
                Seen {
                    record,
                    identity,
                    weight: weight_of(&lease),
                    view,
                    changed_at,
                },
            );
        }
        // A Lease gone without a release seen (deleted by someone else while its replica
        // runs, which writes it again at its next renewal; or a release we missed) stays
        // live until it expires, like a Lease no longer renewed: taking its spokes sooner
        // could overlap with its replica still running them.
        let lease_duration = self.opts.lease_duration;
        next.extend(
            std::mem::take(&mut self.peers)
                .into_iter()
                .filter(|(_, p)| at.duration_since(p.changed_at) < lease_duration),
        );
        self.peers = next;
        Ok(())
    }

    /// Notes a peer's Lease as the watch delivered it `at`, between reads. A new record of a
    /// peer already known restarts its lease duration at once, when it was written (to
    /// within the watch's delay), rather than at the next read, up to a retry period later:
    /// a dead peer is then counted gone a lease duration after its last renewal, not up to
    /// a retry period after that, and every survivor counts it gone at the same moment.
    /// Returns whether a read is needed now: the Lease is of a replica not known yet, was
    /// released, is not its holder's, or shows another view or weight. Only reads change
    /// the live set and the views the barrier trusts, so a stale event can only keep a peer
    /// live a little longer, never make one look gone or ready.
    fn note_watched(&mut self, lease: &Lease, at: Instant) -> bool {
        let Some(name) = lease.metadata.name.as_deref() else {
            return false;
        };
        if name == self.name {
            return false;
        }
        let Some(peer) = self.peers.get_mut(name) else {
            return true;
        };
        if replica_identity(lease).as_deref() != Some(peer.identity.as_str()) {
            return true;
        }
        let record = lease.metadata.resource_version.clone().unwrap_or_default();
        if record != peer.record {
            peer.record = record;
            peer.changed_at = at;
        }
        view_of(lease) != peer.view || weight_of(lease) != peer.weight
    }

    /// The ownership after a round (pure over what was observed).
    fn ownership(&mut self) -> Ownership {
        let at = Instant::now();
        let alive = self
            .last_ok
            .is_some_and(|t| at < t + self.opts.renew_deadline);
        if !alive {
            self.view_since = None;
            return Ownership::none(self.opts.identity.clone());
        }
        let live: Vec<&Seen> = self
            .peers
            .values()
            .filter(|p| at.duration_since(p.changed_at) < self.opts.lease_duration)
            .filter(|p| p.identity != self.opts.identity)
            .collect();
        let view = View::new(
            live.iter()
                .map(|p| Member::new(p.identity.clone(), p.weight))
                .chain(std::iter::once(Member::new(
                    self.opts.identity.clone(),
                    self.opts.weight,
                ))),
        );
        let records: Vec<PeerRecord> = live
            .iter()
            .map(|p| PeerRecord {
                identity: p.identity.clone(),
                view: p.view.clone(),
            })
            .collect();
        // Replicas started together (a rollout) write their Leases within moments of each
        // other: the first to read must not take the whole fleet alone and hand two thirds
        // of it back a round later.
        let settled = match (self.joined_at, self.last_read) {
            (Some(joined), Some(read)) => read >= joined + JOIN_SETTLE,
            _ => false,
        };
        let ready = settled
            && barrier_passed(
                &view,
                &self.opts.identity,
                self.published.as_deref(),
                &records,
            );
        let hash = view.hash();
        match &self.view_since {
            Some((h, since)) if *h == hash => {
                if ready {
                    self.metrics
                        .barrier_wait
                        .observe(at.duration_since(*since).as_secs_f64());
                    // Observed once per view.
                    self.view_since = Some((hash, at + Duration::from_secs(86400 * 365)));
                }
            }
            _ => {
                self.metrics.view_changes.inc();
                self.view_since = Some((hash, at));
            }
        }
        self.metrics
            .live
            .set(i64::try_from(view.members().len()).unwrap_or(i64::MAX));
        Ownership::Shard(Shard {
            me: self.opts.identity.clone(),
            view: Some(view),
            ready,
        })
    }
}

impl Membership {
    /// How long a round may take. While this replica is alive, no longer than until its
    /// renew deadline, so that a hung request cannot keep it owning past it; once it is
    /// past (it owns nothing), a whole renew deadline, so that it can come back.
    fn round_limit(&self, started: Instant) -> Duration {
        match self.last_ok {
            Some(t) if started < t + self.opts.renew_deadline => {
                (t + self.opts.renew_deadline).saturating_duration_since(started)
            }
            _ => self.opts.renew_deadline,
        }
        .max(Duration::from_millis(1))
    }

    /// When the next round starts: at the next renewal, or sooner
    /// - at this replica's renew deadline (it owns nothing from then on);
    /// - when a peer that has looked alive turns out gone (its record unchanged for the
    ///   lease duration): its spokes are taken over then, not up to a retry period later;
    /// - every [`BARRIER_POLL`] while the current view waits for its barrier: the others
    ///   announce it within a round of each other, and each round a spoke waits is a
    ///   round in which no binding on it converges.
    fn next_wake(&self, now: Instant, renew_due: Instant, barrier_pending: bool) -> Instant {
        let mut wake = renew_due;
        if let Some(t) = self.last_ok {
            let deadline = t + self.opts.renew_deadline;
            if deadline > now {
                wake = wake.min(deadline);
            }
        }
        let expiry = self
            .peers
            .values()
            .filter(|p| p.identity != self.opts.identity)
            .map(|p| p.changed_at + self.opts.lease_duration)
            .filter(|e| *e > now)
            .min();
        if let Some(e) = expiry {
            wake = wake.min(e);
        }
        if barrier_pending {
            wake = wake.min(now + BARRIER_POLL.min(self.opts.retry_period));
        }
        wake.max(now)
    }
}

/// How often a replica reads the others' Leases while its view waits for the barrier.
pub const BARRIER_POLL: Duration = Duration::from_millis(200);

/// A starting replica takes spokes only from a read of the others' Leases made at least
/// this long after its own Lease was first written, so that replicas started together see
/// each other before any of them engages a spoke.
pub const JOIN_SETTLE: Duration = BARRIER_POLL;

/// Runs membership until `stop`; then releases this replica's Lease (clears its holder) and
/// deletes it. Cancel `stop` only after the supervisor stopped every spoke: the others take
/// them over as soon as they see the release. The task runs on `on` (with `client`'s
/// connections there too: see `runtime::coordination`).
pub fn spawn(
    on: &tokio::runtime::Handle,
    client: kube::Client,
    opts: MembershipOptions,
    metrics: ShardMetrics,
    stop: CancellationToken,
) -> ShardHandle {
    let (tx, rx) = watch::channel(Ownership::none(opts.identity.clone()));
    let (released_tx, mut released) = watch::channel(None::<String>);
    let mut m = Membership::new(client, opts, metrics);
    let task = on.spawn(async move {
        // Between reads, the watch delivers the peers' renewals as they are written (see
        // `note_watched`); the reads stay the source of the live set and of the views, and
        // keep it right when the watch lags or breaks (its own backoff reconnects it).
        let mut watched = watcher(
            m.api.clone(),
            watcher::Config::default().labels(&replica_selector()),
        )
        .default_backoff()
        .boxed();
        let mut watching = true;
        // When the next renewal is due (at once for the first).
        let mut renew_due = Instant::now();
        // Whether this wake reads the Leases (every wake but a watched event that needs none).
        let mut read = true;
        loop {
            let started = Instant::now();
            // The view we may announce: the supervisor released for it and it is still
            // ours (an announcement for an older view could be false by now); else what we
            // announced before, which stays true (nothing is taken until announced).
            let current = tx.borrow().view_hash();
            let released_for = released.borrow_and_update().clone();
            let announce = match (&released_for, &current) {
                (Some(r), Some(c)) if r == c => Some(r.clone()),
                _ => m.published.clone(),
            };
            // Between renewals a round only reads the others' Leases (see `next_wake`).
            let renewing = m.last_ok.is_none() || announce != m.published || started >= renew_due;
            let limit = m.round_limit(started);
            let round = async {
                if !(renewing || read) {
                    return Ok(None);
                }
                let written = if renewing {
                    Some(m.renew(announce).await?)
                } else {
                    None
                };
                m.observe().await?;
                Ok::<_, kube::Error>(written)
            };
            let reading = renewing || read;
            match tokio::time::timeout(limit, round).await {
                Ok(Ok(_)) if !reading => {}
                Ok(Ok(Some(written))) => {
                    m.joined_at.get_or_insert(started);
                    m.last_read = Some(started);
                    m.last_ok = Some(started);
                    m.published = written;
                    renew_due = Instant::now() + m.opts.retry_period;
                }
                Ok(Ok(None)) => m.last_read = Some(started),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, lease = %m.name, "renewing the replica Lease failed");
                    renew_due = Instant::now() + m.opts.retry_period;
                }
                Err(_) => {
                    tracing::warn!(lease = %m.name, "renewing the replica Lease timed out");
                    renew_due = Instant::now() + m.opts.retry_period;
                }
            }
            let next = m.ownership();
            if *tx.borrow() != next {
                tracing::info!(
                    identity = %m.opts.identity,
                    view = ?next.view_hash(),
                    ready = next.is_ready(),
                    "shard view changed"
                );
                tx.send_replace(next);
            }
            let pending =
                matches!(&*tx.borrow(), Ownership::Shard(s) if s.view.is_some() && !s.ready);
            let wait = m
                .next_wake(Instant::now(), renew_due, pending)
                .saturating_duration_since(Instant::now());
            read = true;
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
                r = released.changed() => {
                    if r.is_err() {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
                event = watched.next(), if watching => match event {
                    Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                        read = m.note_watched(&lease, Instant::now());
                    }
                    // A deletion changes nothing until a read (see `observe`); an error is
                    // retried by the watcher's backoff.
                    Some(Ok(_)) => read = false,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watching the replica Leases failed; reading them every round");
                        read = false;
                    }
                    None => {
                        watching = false;
                        read = false;
                    }
                },
            }
        }
        tx.send_replace(Ownership::none(m.opts.identity.clone()));
        // Released first (no holder): the others drop us from the live set when they see
        // it (their watch shows it at once; else at their next read, within a retry
        // period); deleted two retry periods later. A Lease that merely disappears counts
        // as live until it expires (it may have been deleted under a running replica), so
        // the release is what hands our spokes over at once.
        let leave = async {
            m.release().await?;
            tokio::time::sleep(2 * m.opts.retry_period).await;
            m.api.delete(&m.name, &DeleteParams::default()).await?;
            Ok::<_, kube::Error>(())
        };
        match tokio::time::timeout(m.opts.renew_deadline + 2 * m.opts.retry_period, leave).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the replica Lease failed"),
            Err(_) => tracing::warn!("releasing the replica Lease timed out"),
        }
    });
    ShardHandle {
        ownership: rx,
        released: released_tx,
        task,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_dns_safe_and_distinct() {
        let a = lease_name("Hub-0_ABC123");
        assert!(a.starts_with("kleym-hub-replica-hub-0-abc123-"), "{a}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert_ne!(lease_name("hub_0"), lease_name("hub-0"));
        let long = lease_name(&"x".repeat(300));
        assert!(long.len() <= 63, "{long}");
        assert!(lease_name("__").starts_with(LEASE_PREFIX));
        assert!(!lease_name("__").ends_with('-'));
    }

    #[test]
    fn a_lease_not_named_after_its_holder_is_ignored() {
        let lease = |name: &str, holder: Option<&str>| Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                ..LeaseSpec::default()
            }),
        };
        let b = "replica-b_0123";
        assert_eq!(
            replica_identity(&lease(&lease_name(b), Some(b))).as_deref(),
            Some(b)
        );
        // Another Lease claiming b (it could announce a view b never released for).
        assert_eq!(
            replica_identity(&lease("kleym-hub-replica-evil", Some(b))),
            None
        );
        assert_eq!(
            replica_identity(&lease(&lease_name("replica-c_9"), Some(b))),
            None
        );
        // Released (no holder).
        assert_eq!(replica_identity(&lease(&lease_name(b), None)), None);
        assert_eq!(replica_identity(&lease(&lease_name(b), Some(""))), None);
    }

    /// A watched renewal only restarts a known peer's lease duration; whatever could change
    /// the live set or the barrier (a replica not known, a release, a forgery, a new view or
    /// weight) waits for a read, so a stale or forged event cannot make a peer look gone or
    /// ready.
    #[tokio::test]
    async fn a_watched_lease_restarts_a_known_peers_duration_and_nothing_else() {
        let (_sim, _hub, client) = hub().await;
        let mut m = Membership::new(client, opts("a"), ShardMetrics::default());
        let seen_at = Instant::now();
        m.peers.insert(
            lease_name("b"),
            Seen {
                record: "7".into(),
                identity: "b".into(),
                weight: DEFAULT_WEIGHT,
                view: Some("v1".into()),
                changed_at: seen_at,
            },
        );
        let lease = |name: &str, holder: Option<&str>, record: &str, view: &str, weight: u32| {
            let mut annotations =
                BTreeMap::from([(WEIGHT_ANNOTATION.to_string(), weight.to_string())]);
            annotations.insert(VIEW_ANNOTATION.into(), view.into());
            Lease {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    resource_version: Some(record.into()),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: holder.map(str::to_string),
                    ..LeaseSpec::default()
                }),
            }
        };
        let b = lease_name("b");
        let later = seen_at + Duration::from_secs(3);

        // The same record again (a relist): nothing changes.
        assert!(!m.note_watched(&lease(&b, Some("b"), "7", "v1", DEFAULT_WEIGHT), later));
        assert_eq!(m.peers[&b].changed_at, seen_at);
        // A renewal: b's lease duration restarts now, no read needed.
        assert!(!m.note_watched(&lease(&b, Some("b"), "8", "v1", DEFAULT_WEIGHT), later));
        assert_eq!(m.peers[&b].changed_at, later);
        assert_eq!(m.peers[&b].record, "8");

        let again = later + Duration::from_secs(1);
        // A new view: read first; the barrier never trusts the event's annotation.
        assert!(m.note_watched(&lease(&b, Some("b"), "9", "v2", DEFAULT_WEIGHT), again));
        assert_eq!(m.peers[&b].view.as_deref(), Some("v1"));
        // A new weight: read first, the view is unchanged.
        assert!(m.note_watched(&lease(&b, Some("b"), "10", "v1", 50), again));
        assert_eq!(m.peers[&b].weight, DEFAULT_WEIGHT);
        // Released (no holder), or claimed by another replica: read; b stays as it was.
        assert!(m.note_watched(&lease(&b, None, "11", "v1", DEFAULT_WEIGHT), again));
        assert!(m.note_watched(&lease(&b, Some("c"), "12", "v1", DEFAULT_WEIGHT), again));
        assert_eq!(m.peers[&b].identity, "b");
        // A replica not known yet: read (joins change the live set only through reads).
        let c = lease_name("c");
        assert!(m.note_watched(&lease(&c, Some("c"), "1", "v1", DEFAULT_WEIGHT), again));
        assert!(!m.peers.contains_key(&c));
        // Our own Lease: nothing.
        assert!(!m.note_watched(&lease(&lease_name("a"), Some("a"), "5", "v9", 1), again));
        assert!(!m.peers.contains_key(&lease_name("a")));
    }

    fn opts(identity: &str) -> MembershipOptions {
        MembershipOptions {
            namespace: "kleym".into(),
            identity: identity.into(),
            weight: 10,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    async fn hub() -> (kubesim::Kubesim, kubesim::ClusterHandle, kube::Client) {
        let sim = kubesim::Kubesim::start(&["hub"], kubesim::KubesimOptions::default())
            .await
            .unwrap();
        let hub = sim.cluster("hub").unwrap();
        let client = hub.in_process_client();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "kleym"}})).unwrap();
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        (sim, hub, client)
    }

    /// A replica's membership task with a supervisor that confirms every view at once.
    fn started(
        client: kube::Client,
        opts: MembershipOptions,
        stop: CancellationToken,
    ) -> ShardHandle {
        let h = spawn(
            &tokio::runtime::Handle::current(),
            client,
            opts,
            ShardMetrics::default(),
            stop,
        );
        confirm_every_view(&h);
        h
    }

    /// A supervisor that has nothing to stop: it confirms every view at once.
    fn confirm_every_view(h: &ShardHandle) {
        let (mut rx, tx) = (h.ownership.clone(), h.released.clone());
        tokio::spawn(async move {
            loop {
                let hash = rx.borrow_and_update().view_hash();
                if hash.is_some() {
                    tx.send_replace(hash);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    fn alone(o: &Ownership) -> bool {
        o.is_ready()
            && matches!(o, Ownership::Shard(s) if s.view.as_ref().is_some_and(|v| v.members().len() == 1))
    }

    /// A joining replica takes nothing until the other announced the joint view, and a
    /// replica stopping cleanly releases its Lease, so the other is alone at once.
    /// Virtual time: the in-process client keeps every wait on tokio's paused clock.
    #[tokio::test(start_paused = true)]
    async fn a_view_is_ready_only_once_every_member_announced_it() {
        let (_sim, _hub, client) = hub().await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kleym");
        let stop_a = CancellationToken::new();
        let a = started(client.clone(), opts("a"), stop_a.clone());
        let mut rx_a = a.ownership.clone();
        tokio::time::timeout(Duration::from_secs(60), rx_a.wait_for(|o| o.is_ready()))
            .await
            .expect("a alone is ready")
            .unwrap();
        let stop_b = CancellationToken::new();
        let b = started(client.clone(), opts("b"), stop_b.clone());
        let mut rx_b = b.ownership.clone();
        let joint = tokio::time::timeout(Duration::from_secs(60), rx_b.wait_for(|o| o.is_ready()))
            .await
            .expect("b ready")
            .unwrap()
            .clone();
        let hash = joint.view_hash().unwrap();
        let Ownership::Shard(shard) = &joint else {
            panic!("sharded")
        };
        let members: Vec<&str> = shard
            .view
            .as_ref()
            .unwrap()
            .members()
            .iter()
            .map(|m| m.identity.as_str())
            .collect();
        assert_eq!(members, ["a", "b"]);
        // When b is ready, a has announced the joint view already.
        let a_lease = leases.get(&lease_name("a")).await.unwrap();
        assert_eq!(view_of(&a_lease).as_deref(), Some(hash.as_str()));
        let b_lease = leases.get(&lease_name("b")).await.unwrap();
        assert_eq!(view_of(&b_lease).as_deref(), Some(hash.as_str()));
        assert_eq!(
            b_lease
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get(REPLICA_LABEL)
                .map(String::as_str),
            Some("true")
        );
        // b stops: it releases its Lease, then deletes it; a is alone again without waiting
        // for it to expire.
        let stopped_at = Instant::now();
        stop_b.cancel();
        b.task.await.unwrap();
        assert!(leases.get_opt(&lease_name("b")).await.unwrap().is_none());
        tokio::time::timeout(Duration::from_secs(60), rx_a.wait_for(alone))
            .await
            .expect("a alone again")
            .unwrap();
        assert!(
            stopped_at.elapsed() < Duration::from_secs(15),
            "a waited for b's Lease to expire: {:?}",
            stopped_at.elapsed()
        );
        stop_a.cancel();
        a.task.await.unwrap();
    }

    /// Replicas started together (b a moment after a, before a's second read) never
    /// engage alone: a's first ready view already holds b.
    #[tokio::test(start_paused = true)]
    async fn replicas_started_together_never_take_the_fleet_alone() {
        let (_sim, _hub, client) = hub().await;
        let stop = CancellationToken::new();
        let a = started(client.clone(), opts("a"), stop.clone());
        // Every ownership a publishes, in order (virtual time advances only when every
        // task waits, so none is skipped).
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Ownership>::new()));
        let (mut rx, log) = (a.ownership.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                log.lock().unwrap().push(rx.borrow_and_update().clone());
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        tokio::time::sleep(JOIN_SETTLE / 2).await;
        let b = started(client.clone(), opts("b"), stop.clone());
        let mut rx_a = a.ownership.clone();
        tokio::time::timeout(Duration::from_secs(60), rx_a.wait_for(|o| o.is_ready()))
            .await
            .expect("a ready")
            .unwrap();
        let seen = seen.lock().unwrap().clone();
        assert!(
            !seen.iter().any(alone),
            "a took the fleet alone before it saw b: {seen:?}"
        );
        let first_ready = seen.iter().find(|o| o.is_ready());
        assert!(
            matches!(first_ready, Some(Ownership::Shard(s)) if s.view.as_ref().is_some_and(|v| v.contains("b"))),
            "{seen:?}"
        );
        stop.cancel();
        a.task.await.unwrap();
        b.task.await.unwrap();
    }

    /// A replica whose hub cluster stops answering owns nothing any more no later than its
    /// renew deadline after its last successful renewal (so before the others, who wait
    /// the whole lease duration after they saw that renewal, take over).
    #[tokio::test(start_paused = true)]
    async fn a_replica_that_cannot_renew_owns_nothing_by_its_renew_deadline() {
        let (_sim, hub, client) = hub().await;
        let stop = CancellationToken::new();
        let o = opts("a");
        let a = started(client.clone(), o.clone(), stop.clone());
        let mut rx = a.ownership.clone();
        tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|o| o.is_ready()))
            .await
            .expect("ready")
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        hub.faults().set_blackhole(true);
        let path = format!("/leases/{}", lease_name("a"));
        let renewals: Vec<_> = hub
            .requests()
            .entries()
            .into_iter()
            .filter(|r| r.path.ends_with(&path) && r.method == "PUT")
            .collect();
        assert!(renewals.len() >= 2, "renewed: {renewals:?}");
        let last = renewals.last().unwrap().at;
        rx.wait_for(|o| !o.is_ready() && o.view_hash().is_none())
            .await
            .unwrap();
        let owned_for = Instant::now().duration_since(last);
        assert!(
            owned_for <= o.renew_deadline,
            "still owning {owned_for:?} after the last renewal (renew deadline {:?})",
            o.renew_deadline
        );
        // Once the hub cluster answers again, the replica comes back: a round after the
        // deadline gets a whole renew deadline, not what was left of the old one.
        hub.faults().set_blackhole(false);
        tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|o| o.is_ready()))
            .await
            .expect("ready again once the hub cluster answers")
            .unwrap();
        stop.cancel();
        a.task.await.unwrap();
    }

    /// A replica killed without a word (its Lease stays) is gone for the others a lease
    /// duration after its last renewal (the watch shows them each renewal as it is
    /// written), and the survivors' joint view passes its barrier within a few barrier
    /// polls, not rounds of the retry period: until then no spoke of the dead replica
    /// converges anything.
    #[tokio::test(start_paused = true)]
    async fn survivors_take_over_a_lease_duration_after_the_last_renewal() {
        let (_sim, hub, client) = hub().await;
        let mut handles = Vec::new();
        for id in ["a", "b", "c"] {
            let stop = CancellationToken::new();
            let h = started(client.clone(), opts(id), stop.clone());
            handles.push((h, stop));
            // Start the replicas out of phase, as real ones are.
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        let three = |o: &Ownership| {
            o.is_ready()
                && matches!(o, Ownership::Shard(s) if s.view.as_ref().is_some_and(|v| v.members().len() == 3))
        };
        for (h, _) in &handles {
            let mut rx = h.ownership.clone();
            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(three))
                .await
                .expect("three ready")
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1300)).await;
        // SIGKILL: the task ends without deleting its Lease.
        let (c, _stop_c) = handles.pop().unwrap();
        c.task.abort();
        let _ = c.task.await;
        let path = format!("/leases/{}", lease_name("c"));
        let last_renewal = hub
            .requests()
            .entries()
            .into_iter()
            .filter(|r| r.path.ends_with(&path) && r.method == "PUT")
            .map(|r| r.at)
            .max()
            .unwrap();
        let two = |o: &Ownership| {
            o.is_ready()
                && matches!(o, Ownership::Shard(s) if s.view.as_ref().is_some_and(|v| v.members().len() == 2))
        };
        for (h, _) in &handles {
            let mut rx = h.ownership.clone();
            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(two))
                .await
                .expect("the survivors' view is ready")
                .unwrap();
        }
        let took = Instant::now().duration_since(last_renewal);
        let o = opts("a");
        // The survivors see the last renewal as it is written (the watch), count the lease
        // duration from there, and see each other's announcement of the new view at once.
        // Seen only at their next read, up to a retry period later, it took up to 17.4 s.
        let bound = o.lease_duration + 2 * BARRIER_POLL;
        assert!(
            took <= bound,
            "the survivors' view was ready {took:?} after c's last renewal (bound {bound:?})"
        );
        for (h, stop) in handles {
            stop.cancel();
            h.task.await.unwrap();
        }
    }

    /// A replica cut from the hub cluster for longer than its renew deadline owns nothing,
    /// and joins again once the hub cluster answers: each round to rejoin gets a whole renew
    /// deadline. Bounded by the time left before the deadline (none) every round timed out
    /// at once, in a busy loop, and the replica never came back (a hub cluster answering
    /// within a millisecond hid it: this one answers in 20 ms).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_cut_past_its_renew_deadline_joins_again() {
        let (_sim, hub, _) = hub().await;
        hub.faults().set_latency(Duration::from_millis(20));
        let token = hub.admin_token();
        let client = hub.client_for_token(&token).await.unwrap();
        let o = MembershipOptions {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(400),
            ..opts("a")
        };
        let stop = CancellationToken::new();
        let a = started(client, o, stop.clone());
        let mut rx = a.ownership.clone();
        let limit = Duration::from_secs(60);
        tokio::time::timeout(limit, rx.wait_for(|o| o.is_ready()))
            .await
            .expect("ready")
            .unwrap();
        hub.faults().revoke_token(&token);
        tokio::time::timeout(
            limit,
            rx.wait_for(|o| !o.is_ready() && o.view_hash().is_none()),
        )
        .await
        .expect("owns nothing after its deadline")
        .unwrap();
        hub.faults().restore_token(&token);
        tokio::time::timeout(limit, rx.wait_for(|o| o.is_ready()))
            .await
            .expect("a replica whose hub cluster answers again joins again")
            .unwrap();
        stop.cancel();
        a.task.await.unwrap();
    }

    /// The members of a ready ownership (empty when not ready).
    fn ready_members(o: &Ownership) -> Vec<String> {
        match o {
            Ownership::Shard(s) if s.ready => s
                .view
                .iter()
                .flat_map(|v| v.members())
                .map(|m| m.identity.clone())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Someone else deletes a running replica's Lease: the others must not take its spokes
    /// (it still runs them, and writes its Lease again at its next renewal). Deleted Leases
    /// counted as gone at once (as after a clean stop) let the others pass a barrier without
    /// it and take its spokes while it ran them. Repeated at different moments of a's
    /// renewal period.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_lease_of_a_running_replica_is_not_a_departure() {
        let (_sim, _hub, client) = hub().await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kleym");
        let mut handles = Vec::new();
        let mut rxs = Vec::new();
        for id in ["a", "b"] {
            // Out of step with a's renewals, as replicas started apart are.
            tokio::time::sleep(Duration::from_millis(900)).await;
            let stop = CancellationToken::new();
            let h = started(client.clone(), opts(id), stop.clone());
            rxs.push(h.ownership.clone());
            handles.push((h, stop));
        }
        let limit = Duration::from_secs(60);
        for rx in &mut rxs {
            tokio::time::timeout(limit, rx.wait_for(|o| ready_members(o).len() == 2))
                .await
                .expect("both in one ready view")
                .unwrap();
        }
        // Every ownership b publishes from now on.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<String>>::new()));
        let mut rx_b = rxs[1].clone();
        let record = seen.clone();
        let recorder = tokio::spawn(async move {
            while rx_b.changed().await.is_ok() {
                let m = ready_members(&rx_b.borrow_and_update());
                record.lock().unwrap().push(m);
            }
        });
        for step in 0..8u64 {
            tokio::time::sleep(Duration::from_millis(250 * step + 100)).await;
            let _ = leases
                .delete(&lease_name("a"), &DeleteParams::default())
                .await;
            // a writes it again at its next renewal; then two of b's rounds.
            tokio::time::timeout(limit, async {
                while leases.get_opt(&lease_name("a")).await.unwrap().is_none() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .expect("a writes its Lease again");
            tokio::time::sleep(2 * opts("b").retry_period).await;
        }
        let alone: Vec<Vec<String>> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.as_slice() == ["b"])
            .cloned()
            .collect();
        assert!(
            alone.is_empty(),
            "b was ready in a view without a while a ran: {:?}",
            seen.lock().unwrap()
        );
        assert!(
            ready_members(&rxs[0].borrow()).len() == 2,
            "a still a member"
        );
        recorder.abort();
        for (h, stop) in handles {
            stop.cancel();
            h.task.await.unwrap();
        }
    }
}
