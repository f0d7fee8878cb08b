//! The invariants a settled fleet must hold, each counted in violations against the
//! [`super::oracle`] (never against what kleym says of itself).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kleym_api::conditions::READY;
use kleym_api::external::spiffeid::ClusterSPIFFEIDSpec;
use kleym_api::hub_status::FLEET_REPORT_NAME;
use kleym_api::hub_status::{ClusterIdentityStatusStatus, FleetIdentityReportStatus};
use kleym_spoke::ownership::{self, Owner};
use kleym_spoke::reconciler::context::DEFAULT_FIELD_MANAGER;
use kleym_spoke::reconciler::finalizer::FINALIZER;
use kube::ResourceExt;
use kubesim_store::Cluster;
use serde_json::Value;

use super::churn::FOREIGN_MANAGER;
use super::oracle::{SpokeOracle, spoke_oracle, summarize};
use crate::fixtures::profiles::PROFILE_NS;
use crate::report_oracle::{
    Aspect, Limits, PolicyAspect, SpokeInput, collision_verdicts, compare_cluster, compare_report,
    expected_cluster, expected_report,
};

/// The invariants, in report order.
pub const NAMES: [&str; 14] = [
    "binding_conditions",
    "binding_status_fields",
    "binding_status_current",
    "binding_finalizer",
    "csid_missing_or_wrong",
    "csid_orphan",
    "csid_of_refused_binding",
    "collision_verdicts",
    "foreign_untouched",
    "cluster_identity_status",
    "fleet_identity_report",
    "quiet_writes",
    "double_writers",
    "replica_membership",
];

/// One spoke as the check sees it.
pub struct SpokeView<'a> {
    /// The spoke's profile name.
    pub name: &'a str,
    /// Its store.
    pub store: &'a Cluster,
    /// The foreign ClusterSPIFFEIDs the churn created and did not delete, with the
    /// resourceVersion the create returned.
    pub foreign: &'a BTreeMap<String, String>,
}

/// Violations per invariant, with the first few described.
#[derive(Debug, Default, Clone)]
pub struct Violations {
    counts: BTreeMap<&'static str, usize>,
    examples: BTreeMap<&'static str, Vec<String>>,
}

const EXAMPLES: usize = 5;

impl Violations {
    /// Records one violation of `invariant`.
    pub fn add(&mut self, invariant: &'static str, what: impl FnOnce() -> String) {
        let n = self.counts.entry(invariant).or_insert(0);
        *n += 1;
        let ex = self.examples.entry(invariant).or_default();
        if ex.len() < EXAMPLES {
            ex.push(what());
        }
    }

    /// Violations of one invariant.
    pub fn count(&self, invariant: &str) -> usize {
        self.counts.get(invariant).copied().unwrap_or(0)
    }

    /// Violations in total.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// Adds `n` violations of `invariant` described by `what` (`n == 0`: only an example,
    /// if `invariant` has violations).
    pub fn add_n(&mut self, invariant: &'static str, n: usize, what: String) {
        if n == 0 && self.count(invariant) == 0 {
            return;
        }
        *self.counts.entry(invariant).or_insert(0) += n;
        let ex = self.examples.entry(invariant).or_default();
        if ex.len() < EXAMPLES {
            ex.push(what);
        }
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invariant                      violations")?;
        for name in NAMES {
            writeln!(f, "  {name:<28} {}", self.count(name))?;
            for e in self.examples.get(name).into_iter().flatten() {
                writeln!(f, "      {e}")?;
            }
        }
        write!(f, "  {:<28} {}", "total", self.total())
    }
}

fn csid_spec(obj: &kleym_api::external::spiffeid::ClusterSPIFFEID) -> &ClusterSPIFFEIDSpec {
    &obj.spec
}

fn managers(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> BTreeSet<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

/// Checks one spoke against its oracle; returns it (for the hub-side counts).
pub fn check_spoke(v: &mut Violations, spoke: &SpokeView<'_>, trust_domain: &str) -> SpokeOracle {
    let o = spoke_oracle(spoke.store, trust_domain);
    let name = spoke.name;
    for u in &o.unreadable {
        v.add("binding_conditions", || {
            format!("{name}: unreadable binding {u}")
        });
    }
    for d in &o.deleting {
        v.add("binding_finalizer", || {
            format!("{name}: binding {d} is still being deleted (finalizer left)")
        });
    }
    // Which CSIDs a live, non-refused binding should own.
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for (bname, e) in &o.expected {
        let b = &e.binding;
        let status = b.status.as_ref();
        let got = status.map(|s| summarize(&s.conditions)).unwrap_or_default();
        if got != e.conditions {
            v.add("binding_conditions", || {
                format!(
                    "{name}: binding {bname}: conditions {got:?}, the oracle wants {:?}",
                    e.conditions
                )
            });
        }
        let shown = status.map(super::oracle::Shown::of);
        if shown.as_ref() != Some(&e.shown) {
            v.add("binding_status_fields", || {
                format!(
                    "{name}: binding {bname}: status shows {shown:?}, the oracle wants {:?}",
                    e.shown
                )
            });
        }
        let gen_ = b.metadata.generation;
        let stale = status.is_none_or(|s| {
            s.observed_generation != gen_
                || s.conditions.iter().any(|c| c.observed_generation != gen_)
        });
        if stale {
            v.add("binding_status_current", || {
                format!(
                    "{name}: binding {bname}: status observedGeneration {:?} for generation {gen_:?}",
                    status.map(|s| s.observed_generation)
                )
            });
        }
        // The finalizer is there exactly while the binding owns output.
        let has = b.finalizers().iter().any(|f| f == FINALIZER);
        if has != e.output.is_some() {
            v.add("binding_finalizer", || {
                format!(
                    "{name}: binding {bname} {} {FINALIZER} (it {} own a ClusterSPIFFEID)",
                    if has { "carries" } else { "lacks" },
                    if e.output.is_some() {
                        "should"
                    } else {
                        "should not"
                    }
                )
            });
        }
        let owner = Owner {
            namespace: b.namespace().unwrap_or_default(),
            name: bname.clone(),
            uid: b.uid().unwrap_or_default(),
        };
        match &e.output {
            Some((csid, spec, labels)) => {
                wanted.insert(csid.as_str(), bname.as_str());
                let ok = match o.csids.get(csid) {
                    None => Err("missing".to_string()),
                    Some(obj) => {
                        if ownership::verify(obj, DEFAULT_FIELD_MANAGER, &owner).is_err() {
                            Err("not proven to be the binding's".into())
                        } else if csid_spec(obj) != spec {
                            Err(format!(
                                "spec {:?}, the oracle wants {:?}",
                                serde_json::to_string(csid_spec(obj)).unwrap_or_default(),
                                serde_json::to_string(spec).unwrap_or_default()
                            ))
                        } else if labels
                            .iter()
                            .any(|(k, val)| obj.labels().get(k) != Some(val))
                        {
                            Err(format!("labels {:?}", obj.labels()))
                        } else {
                            Ok(())
                        }
                    }
                };
                if let Err(why) = ok {
                    v.add("csid_missing_or_wrong", || {
                        format!("{name}: binding {bname}: ClusterSPIFFEID {csid} {why}")
                    });
                }
            }
            None => {
                for (cname, obj) in &o.csids {
                    if ownership::verify(obj, DEFAULT_FIELD_MANAGER, &owner).is_ok() {
                        v.add("csid_of_refused_binding", || {
                            format!(
                                "{name}: refused binding {bname} still owns ClusterSPIFFEID {cname}"
                            )
                        });
                    }
                }
            }
        }
    }
    // The collision verdicts the bindings show against the rule, pair by pair, from the
    // objects (the report lifts these verdicts; the report oracle trusts them).
    let objectives =
        super::oracle::list_values(spoke.store, ("llm-d.ai", "v1alpha2", "inferenceobjectives"));
    let pools = super::oracle::list_values(
        spoke.store,
        ("inference.networking.k8s.io", "v1", "inferencepools"),
    );
    for wrong in collision_verdicts(&o.listed, &objectives, &pools) {
        v.add("collision_verdicts", || format!("{name}: {wrong}"));
    }
    // Orphans: proven kleym's (by the object alone), and no live binding wants it.
    for (cname, obj) in &o.csids {
        if let Ok(owner) = ownership::proven_owner(obj, DEFAULT_FIELD_MANAGER) {
            let live = o
                .expected
                .get(&owner.name)
                .is_some_and(|e| e.binding.uid().unwrap_or_default() == owner.uid);
            if !live || wanted.get(cname.as_str()) != Some(&owner.name.as_str()) {
                v.add("csid_orphan", || {
                    format!(
                        "{name}: ClusterSPIFFEID {cname} of {}/{} (live: {live})",
                        owner.namespace, owner.name
                    )
                });
            }
        } else if managers(&obj.metadata).contains(DEFAULT_FIELD_MANAGER) {
            v.add("foreign_untouched", || {
                format!("{name}: kleym wrote fields of the foreign ClusterSPIFFEID {cname}")
            });
        }
    }
    // Foreign objects: still there, same resourceVersion, only their manager.
    for (fname, rv) in spoke.foreign {
        match o.csids.get(fname) {
            None => v.add("foreign_untouched", || {
                format!("{name}: foreign ClusterSPIFFEID {fname} was deleted")
            }),
            Some(obj) => {
                let now = obj.resource_version().unwrap_or_default();
                let by = managers(&obj.metadata);
                if &now != rv || by.iter().any(|m| m != FOREIGN_MANAGER) {
                    v.add("foreign_untouched", || {
                        format!(
                            "{name}: foreign ClusterSPIFFEID {fname}: resourceVersion {rv} -> {now}, managers {by:?}"
                        )
                    });
                }
            }
        }
    }
    o
}

fn hub_get(hub: &Cluster, plural: &str, ns: Option<&str>, name: &str) -> Option<Value> {
    let res = hub.resolve("kleym.io", "v1alpha1", plural)?;
    hub.get(&res, ns, name).ok()
}

/// Checks the hub's `ClusterIdentityStatus` of each spoke and the `FleetIdentityReport`:
/// binding counts and readiness against the spoke oracles (the compiler's verdict on the
/// final objects), and every count, list, cap and condition against the report oracle
/// ([`crate::report_oracle`], which shares no code with the hub's report) applied to the
/// spokes' final bindings and the hub's view of their health: after settling every spoke
/// is healthy (the faults are over). A stale or lost report write shows here. Times and
/// message texts are left out (messages are checked for what they must say and their cap).
pub fn check_hub(v: &mut Violations, hub: &Cluster, spokes: &[(&str, &SpokeOracle)]) {
    let limits = Limits::DOCUMENTED;
    let inputs: Vec<SpokeInput> = spokes
        .iter()
        .map(|(name, o)| SpokeInput {
            cluster: format!("{PROFILE_NS}/{name}"),
            credentials: Aspect::Up,
            reachable: Aspect::Up,
            synced: Aspect::Up,
            error_message: None,
            duplicate_of: None,
            bindings: o.listed.clone(),
            // Every chaos spoke has kleym's admission policy from the start.
            admission_policy: PolicyAspect::Installed,
        })
        .collect();
    let mut total = 0i64;
    for ((name, o), input) in spokes.iter().zip(&inputs) {
        let want_total = o.expected.len() as i64;
        let want_ready = o.expected.values().filter(|e| e.ready).count() as i64;
        total += want_total;
        let Some(cis) = hub_get(hub, "clusteridentitystatuses", Some(PROFILE_NS), name) else {
            v.add("cluster_identity_status", || {
                format!("{PROFILE_NS}/{name}: no ClusterIdentityStatus")
            });
            continue;
        };
        let s = &cis["status"];
        let got = (
            s["bindings"]["total"].as_i64().unwrap_or(-1),
            s["bindings"]["ready"].as_i64().unwrap_or(-1),
        );
        if got != (want_total, want_ready) {
            v.add("cluster_identity_status", || {
                format!(
                    "{PROFILE_NS}/{name}: bindings total/ready {}/{}, the oracle wants {want_total}/{want_ready}",
                    got.0, got.1
                )
            });
        }
        // Every count by category, the non-ready list and the conditions, as the report
        // oracle reads the final bindings.
        match serde_json::from_value::<ClusterIdentityStatusStatus>(s.clone()) {
            Err(e) => v.add("cluster_identity_status", || {
                format!("{PROFILE_NS}/{name}: status does not parse: {e}")
            }),
            Ok(status) => {
                let d = compare_cluster(&status, &expected_cluster(input, &limits));
                if !d.is_empty() {
                    v.add("cluster_identity_status", || {
                        format!(
                            "{PROFILE_NS}/{name}: differs from the report oracle: {}",
                            d.join("; ")
                        )
                    });
                }
            }
        }
        let ready = s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == READY)
            .and_then(|c| c["status"].as_str())
            .unwrap_or("absent")
            .to_string();
        let want = if want_ready == want_total {
            "True"
        } else {
            "False"
        };
        if ready != want {
            v.add("cluster_identity_status", || {
                format!("{PROFILE_NS}/{name}: Ready={ready}, the oracle wants {want}")
            });
        }
    }
    match hub_get(hub, "fleetidentityreports", None, FLEET_REPORT_NAME) {
        None => v.add("fleet_identity_report", || "no FleetIdentityReport".into()),
        Some(r) => {
            let s = &r["status"];
            let clusters = s["clusters"]["total"].as_i64().unwrap_or(-1);
            let bindings = s["bindings"].as_i64().unwrap_or(-1);
            if clusters != spokes.len() as i64 || bindings != total {
                v.add("fleet_identity_report", || {
                    format!(
                        "clusters {clusters}, bindings {bindings}; the oracle wants {} and {total}",
                        spokes.len()
                    )
                });
            }
            // Cluster counts, findings (collisions, duplicates, drift, warnings), their
            // counts and the caps, as the report oracle computes them.
            match serde_json::from_value::<FleetIdentityReportStatus>(s.clone()) {
                Err(e) => v.add("fleet_identity_report", || {
                    format!("the report does not parse: {e}")
                }),
                Ok(status) => {
                    let d = compare_report(&status, &expected_report(&inputs, &limits), &limits);
                    if !d.is_empty() {
                        v.add("fleet_identity_report", || {
                            format!(
                                "the report differs from the report oracle: {}",
                                d.join("; ")
                            )
                        });
                    }
                }
            }
        }
    }
}

/// At most one writer per spoke, from the spoke's own request log (the replica each
/// request's `User-Agent` names; see [`crate::fixtures::writers`]): a replica writing to
/// `spoke` again within `window` of its own last write, after another replica wrote there
/// in between, is a violation (two replicas serving the spoke at once). A clean hand-over
/// (the old writer stops, the new one starts) and a restarted replica (a new identity) are
/// not. `log` is the spoke's request log over the run.
pub fn check_double_writers(
    v: &mut Violations,
    spoke: &str,
    log: &[kubesim::LoggedRequest],
    window: std::time::Duration,
) {
    let writes = crate::fixtures::writers::replica_writes(log);
    for d in crate::fixtures::writers::double_writes(&writes, window) {
        v.add("double_writers", || {
            format!(
                "{spoke}: {} wrote, then {} ({:.1?} later), then {} again ({:.1?} after its first)",
                d.replica,
                d.other,
                d.other_at.saturating_duration_since(d.first),
                d.replica,
                d.again.saturating_duration_since(d.first)
            )
        });
    }
}

/// The sharded replicas' own Leases in `namespace` of the hub cluster: holder identity →
/// resourceVersion (a renewal changes it).
pub fn replica_leases(hub: &Cluster, namespace: &str) -> BTreeMap<String, String> {
    kleym_test_support::env::list(hub, "coordination.k8s.io", "v1", "leases")
        .into_iter()
        .filter(|l| {
            l["metadata"]["namespace"] == namespace
                && l["metadata"]["labels"][super::faults::REPLICA_LEASE_LABEL] == "true"
        })
        .filter_map(|l| {
            Some((
                l["spec"]["holderIdentity"].as_str()?.to_string(),
                l["metadata"]["resourceVersion"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Every running sharded replica is a member: a Lease held by one of its processes
/// (`<instance>_<suffix>`) was renewed between `before` and `after` ([`replica_leases`] at
/// the start and the end of the quiet window, in which nothing stops a replica). A replica
/// that runs without renewing serves no spoke (its share waits for nobody, or for it).
pub fn check_replica_membership(
    v: &mut Violations,
    running: &[&str],
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    for instance in running {
        let renewed = after.iter().any(|(holder, rv)| {
            holder
                .strip_prefix(instance)
                .is_some_and(|rest| rest.starts_with('_'))
                && before.get(holder) != Some(rv)
        });
        if !renewed {
            v.add("replica_membership", || {
                format!("{instance} runs, but no Lease of it was renewed in the quiet window")
            });
        }
    }
}

/// Stored writes per resource type of `store`, without the types in `except`.
pub fn writes(store: &Cluster, except: &[&str]) -> BTreeMap<String, u64> {
    store
        .write_counts()
        .into_iter()
        .filter(|(k, _)| !except.contains(&k.as_str()))
        .collect()
}

/// Each binding's resourceVersion, finalizers and status fields, by name.
pub fn binding_snapshot(store: &Cluster) -> BTreeMap<String, Value> {
    super::oracle::list_values(store, ("kleym.io", "v1alpha1", "inferenceidentitybindings"))
        .into_iter()
        .filter_map(|b| {
            let name = b["metadata"]["name"].as_str()?.to_string();
            Some((
                name,
                serde_json::json!({
                    "rv": b["metadata"]["resourceVersion"],
                    "finalizers": b["metadata"]["finalizers"],
                    "status": b["status"],
                }),
            ))
        })
        .collect()
}

/// What changed between two [`binding_snapshot`]s: `binding <name>: <fields>`.
pub fn binding_changes(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, a) in after {
        let Some(b) = before.get(name) else {
            out.push(format!("binding {name} appeared"));
            continue;
        };
        if a["rv"] == b["rv"] {
            continue;
        }
        let mut fields: Vec<String> = Vec::new();
        if a["finalizers"] != b["finalizers"] {
            fields.push("finalizers".into());
        }
        let keys: BTreeSet<&String> = a["status"]
            .as_object()
            .into_iter()
            .chain(b["status"].as_object())
            .flat_map(|m| m.keys())
            .collect();
        for k in keys {
            if a["status"][k] != b["status"][k] {
                fields.push(format!("status.{k}"));
            }
        }
        if fields.is_empty() {
            fields.push("nothing it shows (written and written back)".into());
        }
        out.push(format!("binding {name} changed: {}", fields.join(", ")));
    }
    out
}

/// Writes between two [`writes`] readings, by type.
pub fn writes_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::churn::{Applied, Change, apply_store};
    use crate::fixtures::env;
    use crate::fixtures::hub_status::put_status_object;
    use kleym_hub::report::{
        BindingSnapshot, Caps, FullReport, Health, SpokeObservation, bound_report, cluster_status,
        shared,
    };
    use serde_json::json;

    /// A spoke no kleym ever reconciled, and a foreign object recorded at another
    /// resourceVersion: every binding and the foreign object are violations (the checks
    /// can fail).
    #[test]
    fn an_unreconciled_spoke_and_a_changed_foreign_object_are_violations() {
        let store = Cluster::new("spoke");
        for crd in crate::fixtures::all_crds().unwrap() {
            kubesim::install_crd(&store, crd).unwrap();
        }
        env::seed_environment(&store, 2).unwrap();
        env::create_bindings(&store, 0..2).unwrap();
        let created = apply_store(
            &store,
            &Change::Create {
                gvp: crate::chaos::churn::CSIDS,
                namespace: None,
                object: json!({
                    "apiVersion": "spire.spiffe.io/v1alpha1",
                    "kind": "ClusterSPIFFEID",
                    "metadata": {"name": "foreign-1"},
                    "spec": {"spiffeIDTemplate": "spiffe://other.example/x"}
                }),
                manager: FOREIGN_MANAGER,
            },
        )
        .unwrap();
        let Applied::Done(Some((name, rv))) = created else {
            panic!("foreign object not created: {created:?}");
        };
        let mut v = Violations::default();
        let mut recorded = BTreeMap::from([(name.clone(), rv.clone())]);
        let o = check_spoke(
            &mut v,
            &SpokeView {
                name: "spoke",
                store: &store,
                foreign: &recorded,
            },
            "chaos.example",
        );
        assert_eq!(o.expected.len(), 2);
        assert!(o.expected.values().all(|e| e.ready), "{o:?}");
        assert_eq!(v.count("binding_conditions"), 2, "{v}");
        assert_eq!(v.count("binding_status_current"), 2, "{v}");
        assert_eq!(v.count("binding_status_fields"), 2, "{v}");
        assert_eq!(v.count("binding_finalizer"), 2, "{v}");
        assert_eq!(v.count("csid_missing_or_wrong"), 2, "{v}");
        assert_eq!(v.count("foreign_untouched"), 0, "{v}");

        recorded.insert(name, format!("{rv}0"));
        let mut v = Violations::default();
        check_spoke(
            &mut v,
            &SpokeView {
                name: "spoke",
                store: &store,
                foreign: &recorded,
            },
            "chaos.example",
        );
        assert_eq!(v.count("foreign_untouched"), 1, "{v}");
        assert_eq!(v.total(), 11, "{v}");
    }

    /// Two replicas' writes interleaved on one spoke are violations; one replica's writes,
    /// reads of another and a clean hand-over are not.
    #[test]
    fn interleaved_replica_writes_are_double_writer_violations() {
        let t = tokio::time::Instant::now();
        let at = |ms: u64| t + std::time::Duration::from_millis(ms);
        let req = |ms: u64, method: &str, id: &str| kubesim::LoggedRequest {
            method: method.into(),
            path: "/apis/x".into(),
            status: 200,
            at: at(ms),
            user_agent: Some(format!("kleym-hub/0.1.0 (replica {id})")),
        };
        let window = std::time::Duration::from_secs(4);
        let clean = [
            req(0, "PATCH", "hub-a_1"),
            req(10, "GET", "hub-b_1"),
            req(20, "PATCH", "hub-a_1"),
            req(5000, "PATCH", "hub-b_1"),
            req(5100, "POST", "hub-b_1"),
        ];
        let mut v = Violations::default();
        check_double_writers(&mut v, "spoke-1", &clean, window);
        assert_eq!(v.total(), 0, "{v}");
        let interleaved = [
            req(0, "PATCH", "hub-a_1"),
            req(100, "PATCH", "hub-b_1"),
            req(200, "DELETE", "hub-a_1"),
        ];
        check_double_writers(&mut v, "spoke-2", &interleaved, window);
        assert_eq!(v.count("double_writers"), 1, "{v}");
        assert!(
            v.to_string()
                .contains("spoke-2: hub-a_1 wrote, then hub-b_1"),
            "{v}"
        );
    }

    /// A running replica whose Lease did not change in the quiet window (or that has
    /// none, or only a dead process's) is a violation; one renewed, or a new process's
    /// Lease, is not.
    #[test]
    fn a_running_replica_must_renew_its_lease() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(h, rv)| (h.to_string(), rv.to_string()))
                .collect()
        };
        let before = m(&[("hub-a_1", "10"), ("hub-b_1", "11"), ("hub-c_1", "12")]);
        let after = m(&[
            ("hub-a_1", "20"),
            ("hub-b_1", "11"),
            ("hub-c_1", "12"),
            ("hub-c_2", "30"),
            ("hub-ab_1", "40"),
        ]);
        let mut v = Violations::default();
        check_replica_membership(&mut v, &["hub-a", "hub-c"], &before, &after);
        assert_eq!(v.total(), 0, "{v}");
        check_replica_membership(&mut v, &["hub-b", "hub-d"], &before, &after);
        assert_eq!(v.count("replica_membership"), 2, "{v}");
        assert!(v.to_string().contains("hub-b runs"), "{v}");
    }

    /// Three sharded replicas: a spoke handed from a to b to c (each stopping before the
    /// next starts) is clean; one written by a, then c, then a again within the lease
    /// duration (the window), or by b in the middle of c's writes, is not, whichever
    /// replica is in between. A hand-back to a after more than the window (a's partition
    /// outlasted the lease, c served meanwhile) is clean.
    #[test]
    fn double_writers_are_checked_across_three_replicas() {
        let t = tokio::time::Instant::now();
        let req = |ms: u64, id: &str| kubesim::LoggedRequest {
            method: "PATCH".into(),
            path: "/apis/kleym.io/v1alpha1/x".into(),
            status: 200,
            at: t + std::time::Duration::from_millis(ms),
            user_agent: Some(format!("kleym-hub/0.1.0 (replica {id})")),
        };
        let window = std::time::Duration::from_secs(4);
        let check = |log: &[kubesim::LoggedRequest]| {
            let mut v = Violations::default();
            check_double_writers(&mut v, "spoke-3", log, window);
            v
        };
        let chain = [
            req(0, "a_1"),
            req(500, "a_1"),
            req(5_000, "b_1"),
            req(5_200, "b_1"),
            req(10_000, "c_1"),
        ];
        assert_eq!(check(&chain).total(), 0);
        let back_too_soon = [req(0, "a_1"), req(1_000, "c_1"), req(3_900, "a_1")];
        let v = check(&back_too_soon);
        assert_eq!(v.count("double_writers"), 1, "{v}");
        assert!(v.to_string().contains("a_1 wrote, then c_1"), "{v}");
        let overlap = [
            req(0, "c_1"),
            req(100, "b_1"),
            req(200, "c_1"),
            req(300, "b_1"),
            req(400, "a_1"),
        ];
        assert_eq!(check(&overlap).count("double_writers"), 2);
        let hand_back = [req(0, "a_1"), req(5_000, "c_1"), req(12_000, "a_1")];
        assert_eq!(check(&hand_back).total(), 0);
    }

    /// The report objects are compared with the report oracle's reading of the final
    /// bindings: the hub's own report of them passes, and one changed entry of a list is one
    /// violation.
    #[test]
    fn report_objects_must_equal_the_report_of_the_final_bindings() {
        let spoke = Cluster::new("spoke");
        let hub = Cluster::new("hub");
        for store in [&spoke, &hub] {
            for crd in crate::fixtures::all_crds().unwrap() {
                kubesim::install_crd(store, crd).unwrap();
            }
        }
        env::seed_environment(&spoke, 2).unwrap();
        env::create_bindings(&spoke, 0..2).unwrap();
        hub.create(
            &hub.resolve("", "v1", "namespaces").unwrap(),
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROFILE_NS}}),
            &kubesim_store::WriteOptions::default(),
        )
        .unwrap();
        let o = spoke_oracle(&spoke, "chaos.example");
        // What a hub writes of these bindings (the product's report, written by hand here).
        let observed = SpokeObservation {
            cluster: format!("{PROFILE_NS}/spoke"),
            credentials: Health::Ok,
            reachable: Health::Ok,
            synced: Health::Ok,
            bindings: shared(o.listed.iter().map(BindingSnapshot::of)),
            admission_policy: Some(kleym_hub::fleet::AdmissionPolicyCheck::Installed {
                policy: "kleym-hub-bounds".into(),
            }),
            ..SpokeObservation::default()
        };
        let caps = Caps::default();
        let now = chrono::Utc::now();
        let mut cis = cluster_status(&observed, now, Some(&caps));
        let fir = bound_report(
            &FullReport::build(std::slice::from_ref(&observed), now).summary,
            &caps,
        );
        let put_cis = |cis: &ClusterIdentityStatusStatus| {
            put_status_object(
                &hub,
                "clusteridentitystatuses",
                Some(PROFILE_NS),
                "spoke",
                "ClusterIdentityStatus",
                json!({"clusterProfile": "spoke"}),
                serde_json::to_value(cis).unwrap(),
            )
            .unwrap()
        };
        let put_fir = |fir: &FleetIdentityReportStatus| {
            put_status_object(
                &hub,
                "fleetidentityreports",
                None,
                FLEET_REPORT_NAME,
                "FleetIdentityReport",
                json!({}),
                serde_json::to_value(fir).unwrap(),
            )
            .unwrap()
        };
        put_cis(&cis);
        put_fir(&fir);
        let check = || {
            let mut v = Violations::default();
            check_hub(&mut v, &hub, &[("spoke", &o)]);
            v
        };
        // Never reconciled: the spoke oracle wants both Ready, the final bindings are not
        // (count and Ready condition), but the lists are the report of those bindings.
        let v = check();
        assert_eq!(v.count("cluster_identity_status"), 2, "{v}");
        assert_eq!(v.count("fleet_identity_report"), 0, "{v}");
        assert_eq!(cis.non_ready_bindings.len(), 2);

        cis.non_ready_bindings[1].reason = "Compiled".into();
        put_cis(&cis);
        let mut fir = fir;
        fir.finding_counts.total += 1;
        put_fir(&fir);
        let v = check();
        assert_eq!(v.count("cluster_identity_status"), 3, "{v}");
        assert_eq!(v.count("fleet_identity_report"), 1, "{v}");
        assert!(v.to_string().contains("reason: \"Compiled\""), "{v}");
    }
}
