//! The namespace cache against the uncached path, driven through the real watch handlers
//! (no API server: objects go straight into the caches, as the watch loop would put them).
//!
//! - A peer's change (objective retargeted, pool selector changed, colliding binding
//!   created or deleted, our own write carrying a newer spec, foreign ClusterSPIFFEID,
//!   namespace labels) flips the verdict of a binding whose own inputs did not change.
//! - For random sequences of changes, the cached evaluation always equals a fresh one
//!   computed without the namespace cache and without the compile memo.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::objective::llmd;
use kleym_api::external::pool::v1;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::api_availability::{ApiKind, ServedApis};
use super::caches::{Cache, Change};
use super::compile;
use super::context::{Context, SpokeConfig};
use super::evaluation::{BindingDecision, NamespaceEvaluation};
use super::metrics::SpokeMetrics;
use super::queue::ObjectKey;
use super::reconcile::cluster_config;
use super::trim::{CacheEntry, CacheForm};
use super::watches::{self, ingest};
use crate::compiler::Reason;

/// Kinds the harness writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Binding,
    Objective,
    Pool,
    Namespace,
    Csid,
}

/// A fake API server: the latest version of every object, with resourceVersion,
/// generation and UID maintained like kube-apiserver does, delivered to the context's
/// caches through the watch handlers.
struct Cluster {
    ctx: Context,
    served: ServedApis,
    objects: BTreeMap<(Kind, String, String), Value>,
    rv: u64,
}

fn send<K: CacheForm + DeserializeOwned>(
    ctx: &Context,
    cache: &Cache<K::Cached>,
    handler: fn(&Context, Change<K::Cached>),
    obj: &Value,
    delete: bool,
) {
    let obj: K = serde_json::from_value(obj.clone()).unwrap();
    let event = if delete {
        Event::Delete(obj)
    } else {
        Event::Apply(obj)
    };
    ingest(ctx, cache, handler, event);
}

fn synced<K: CacheEntry>(ctx: &Context, cache: &Cache<K>, handler: fn(&Context, Change<K>)) {
    cache.activate();
    for event in [Event::Init, Event::InitDone] {
        for change in cache.apply(event) {
            handler(ctx, change);
        }
    }
}

impl Cluster {
    /// A context with every cache synced and empty. Needs a Tokio runtime (the client's
    /// request buffer); it never connects.
    fn new() -> Self {
        let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let ctx = Context::new(
            client,
            SpokeConfig::new("td.example"),
            Arc::new(SpokeMetrics::default()),
        );
        let c = &ctx.state.caches;
        synced(&ctx, &c.bindings, watches::on_binding);
        synced(&ctx, &c.objectives_llmd, watches::on_target);
        synced(&ctx, &c.objectives_gaie, watches::on_target);
        synced(&ctx, &c.models, watches::on_target);
        synced(&ctx, &c.pools_v1, watches::on_pool_v1);
        synced(&ctx, &c.pools_legacy, watches::on_pool_legacy);
        synced(&ctx, &c.cluster_spiffe_ids, watches::on_cluster_spiffe_id);
        synced(&ctx, &c.namespaces, watches::on_namespace);
        let served = ServedApis::all();
        *ctx.state.served.write().unwrap() = served.clone();
        Self {
            ctx,
            served,
            objects: BTreeMap::new(),
            rv: 0,
        }
    }

    /// Writes `obj` server-side (metadata maintained) and returns the stored version.
    fn write(&mut self, kind: Kind, mut obj: Value) -> Value {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let key = (kind, ns, name);
        self.rv += 1;
        let prev = self.objects.get(&key);
        let prev_meta = prev.map(|p| p["metadata"].clone());
        let spec_changed = prev.is_none_or(|p| p["spec"] != obj["spec"]);
        let generation = prev_meta
            .as_ref()
            .and_then(|m| m["generation"].as_i64())
            .map_or(1, |g| g + i64::from(spec_changed));
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        meta.insert("generation".into(), json!(generation));
        let uid = prev_meta
            .as_ref()
            .map_or_else(|| json!(format!("uid-{}", self.rv)), |m| m["uid"].clone());
        meta.insert("uid".into(), uid);
        if let Some(ts) = prev_meta.as_ref().map(|m| m["deletionTimestamp"].clone())
            && !ts.is_null()
        {
            meta.insert("deletionTimestamp".into(), ts);
        }
        self.objects.insert(key, obj.clone());
        obj
    }

    fn deliver(&self, kind: Kind, obj: &Value, delete: bool) {
        let ctx = &self.ctx;
        let c = &ctx.state.caches;
        match kind {
            Kind::Binding => {
                send::<InferenceIdentityBinding>(ctx, &c.bindings, watches::on_binding, obj, delete)
            }
            Kind::Objective => send::<llmd::InferenceObjective>(
                ctx,
                &c.objectives_llmd,
                watches::on_target,
                obj,
                delete,
            ),
            Kind::Pool => {
                send::<v1::InferencePool>(ctx, &c.pools_v1, watches::on_pool_v1, obj, delete)
            }
            Kind::Namespace => {
                send::<Namespace>(ctx, &c.namespaces, watches::on_namespace, obj, delete)
            }
            Kind::Csid => send::<ClusterSPIFFEID>(
                ctx,
                &c.cluster_spiffe_ids,
                watches::on_cluster_spiffe_id,
                obj,
                delete,
            ),
        }
    }

    /// Writes and delivers to the cache.
    fn put(&mut self, kind: Kind, obj: Value) {
        let stored = self.write(kind, obj);
        self.deliver(kind, &stored, false);
    }

    fn delete(&mut self, kind: Kind, ns: &str, name: &str) {
        if let Some(obj) = self.objects.remove(&(kind, ns.into(), name.into())) {
            self.deliver(kind, &obj, true);
        }
    }

    fn binding_value(ns: &str, name: &str, objective: &str, container: Option<&str>) -> Value {
        let mut spec = json!({
            "targetRef": {"name": objective},
            "mode": if container.is_some() { "PerObjective" } else { "PoolOnly" },
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model"]
        });
        if let Some(c) = container {
            spec["containerDiscriminator"] = json!({"type": "ContainerName", "value": c});
        }
        json!({
            "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec
        })
    }

    fn binding(&mut self, ns: &str, name: &str, objective: &str, container: Option<&str>) {
        self.put(
            Kind::Binding,
            Self::binding_value(ns, name, objective, container),
        );
    }

    /// Our own write (status or finalizer) returned this version; the watch has not
    /// delivered it yet.
    fn overlay_binding(&mut self, ns: &str, name: &str, spec_from: Option<Value>) {
        let Some(current) = self
            .objects
            .get(&(Kind::Binding, ns.into(), name.into()))
            .cloned()
        else {
            return;
        };
        let mut next = current;
        if let Some(v) = spec_from {
            next["spec"] = v["spec"].clone();
        }
        next["status"] = json!({"observedGeneration": self.rv});
        let stored = self.write(Kind::Binding, next);
        let obj = serde_json::from_value(stored).unwrap();
        self.ctx
            .state
            .record_binding_write(&ObjectKey::new(ns, name), obj);
    }

    /// The watch catches up with the server's version of a binding.
    fn deliver_binding(&mut self, ns: &str, name: &str) {
        if let Some(obj) = self
            .objects
            .get(&(Kind::Binding, ns.into(), name.into()))
            .cloned()
        {
            self.deliver(Kind::Binding, &obj, false);
        }
    }

    fn mark_deleting(&mut self, ns: &str, name: &str) {
        if let Some(mut obj) = self
            .objects
            .get(&(Kind::Binding, ns.into(), name.into()))
            .cloned()
        {
            obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            self.put(Kind::Binding, obj);
        }
    }

    fn objective(&mut self, ns: &str, name: &str, pool: &str, priority: i32) {
        self.put(
            Kind::Objective,
            json!({
                "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"poolRef": {"name": pool}, "priority": priority}
            }),
        );
    }

    fn pool(&mut self, ns: &str, name: &str, labels: Value) {
        self.put(
            Kind::Pool,
            json!({
                "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {"matchLabels": labels}, "targetPorts": [{"number": 8000}],
                         "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}
            }),
        );
    }

    fn namespace(&mut self, name: &str, labels: Value) {
        self.put(
            Kind::Namespace,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": labels}}),
        );
    }

    /// A non-kleym default identity selecting `app=m` pods in namespaces `env=prod`.
    fn foreign_default(&mut self, pod_app: &str) {
        self.put(
            Kind::Csid,
            json!({
                "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
                "metadata": {"name": "default-identity"},
                "spec": {
                    "spiffeIDTemplate": "spiffe://td.example/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}",
                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                    "podSelector": {"matchLabels": {"app": pod_app}}
                }
            }),
        );
    }

    fn set_served(&mut self, kind: ApiKind, served: bool) {
        self.served.set(kind, served);
        *self.ctx.state.served.write().unwrap() = self.served.clone();
    }

    fn evaluation(&self, ns: &str) -> Arc<NamespaceEvaluation> {
        compile::evaluate_namespace_shared(
            &self.ctx.state,
            &cluster_config(&self.ctx.config),
            ns,
            &self.served,
        )
        .unwrap()
    }

    /// The cached evaluation, checked against the reference (no cache, no memo).
    fn verdicts(&self, ns: &str) -> BTreeMap<String, BindingDecision> {
        let cached = self.evaluation(ns).verdicts();
        let reference = compile::evaluate_namespace_reference(
            &self.ctx.state,
            &cluster_config(&self.ctx.config),
            ns,
            &self.served,
        );
        assert_eq!(cached, reference, "namespace {ns}");
        cached
    }

    fn refusal(&self, ns: &str, name: &str) -> Option<Reason> {
        self.verdicts(ns)
            .get(name)
            .and_then(|v| v.refusal.as_ref().map(|r| r.reason))
    }

    fn warnings(&self, ns: &str, name: &str) -> Vec<String> {
        self.verdicts(ns)
            .get(name)
            .map(|v| v.warnings.iter().map(|w| w.reason.clone()).collect())
            .unwrap_or_default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Namespace `a`: pools p0 (app=m) and p1 (app=x), objectives o0→p0 and o1→p1, bindings
/// b0 (o0) and b1 (o1), both on container c0: no collision, different pod sets.
fn two_bindings_apart() -> Cluster {
    let mut c = Cluster::new();
    c.namespace("a", json!({}));
    c.pool("a", "p0", json!({"app": "m"}));
    c.pool("a", "p1", json!({"app": "x"}));
    c.objective("a", "o0", "p0", 0);
    c.objective("a", "o1", "p1", 0);
    c.binding("a", "b0", "o0", Some("c0"));
    c.binding("a", "b1", "o1", Some("c0"));
    c
}

#[test]
fn consecutive_reconciles_share_one_evaluation() {
    let rt = runtime();
    let _guard = rt.enter();
    let mut c = two_bindings_apart();
    let first = c.evaluation("a");
    assert!(Arc::ptr_eq(&first, &c.evaluation("a")), "cache hit");
    // Writes that change nothing an evaluation reads keep it: a status write of ours, a
    // priority change (not in the compiler's view), a label-less namespace update.
    c.overlay_binding("a", "b0", None);
    c.deliver_binding("a", "b0");
    c.objective("a", "o0", "p0", 7);
    c.namespace("a", json!({}));
    assert!(Arc::ptr_eq(&first, &c.evaluation("a")), "still shared");
    // A real change does not.
    c.binding("a", "b2", "o0", Some("c9"));
    assert!(!Arc::ptr_eq(&first, &c.evaluation("a")));
    assert_eq!(c.evaluation("a").len(), 3);
}

#[test]
fn peer_changes_flip_the_verdict_of_an_unchanged_binding() {
    let rt = runtime();
    let _guard = rt.enter();
    let mut c = two_bindings_apart();
    assert_eq!(c.refusal("a", "b0"), None);
    assert_eq!(c.refusal("a", "b0"), None, "served from the cache");

    // The peer's objective is retargeted to b0's pool: same pods, SA and container.
    c.objective("a", "o1", "p0", 0);
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));
    c.objective("a", "o1", "p1", 0);
    assert_eq!(c.refusal("a", "b0"), None);

    // The peer's pool selector changes to b0's pod set.
    c.pool("a", "p1", json!({"app": "m"}));
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));
    c.pool("a", "p1", json!({"app": "x"}));
    assert_eq!(c.refusal("a", "b0"), None);

    // A new colliding binding, then its deletion.
    c.binding("a", "b2", "o0", Some("c0"));
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));
    c.delete(Kind::Binding, "a", "b2");
    assert_eq!(c.refusal("a", "b0"), None);

    // A colliding binding being deleted no longer claims the identity.
    c.binding("a", "b2", "o0", Some("c0"));
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));
    c.mark_deleting("a", "b2");
    assert_eq!(c.refusal("a", "b0"), None);
    c.delete(Kind::Binding, "a", "b2");
    assert_eq!(c.refusal("a", "b0"), None);

    // Our own write returned the peer with a newer (colliding) spec before its watch
    // event: read-your-writes sees it at once, and so must the cached evaluation.
    let colliding = Cluster::binding_value("a", "b1", "o0", Some("c0"));
    c.overlay_binding("a", "b1", Some(colliding));
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));
    c.deliver_binding("a", "b1");
    assert_eq!(c.refusal("a", "b0"), Some(Reason::IdentityCollision));

    // The objective vanishes: the peer is refused on its own, the collision resolves.
    c.delete(Kind::Objective, "a", "o0");
    assert_eq!(c.refusal("a", "b0"), Some(Reason::TargetNotFound));
    assert_eq!(c.refusal("a", "b1"), Some(Reason::TargetNotFound));
}

#[test]
fn our_write_superseded_by_the_watch_is_noticed_even_if_generation_is_not_maintained() {
    let rt = runtime();
    let _guard = rt.enter();
    let mut c = two_bindings_apart();
    assert_eq!(c.refusal("a", "b1"), None);
    let original = c.objects[&(Kind::Binding, "a".into(), "b1".into())].clone();
    let version = |c: &mut Cluster, spec: &Value| {
        c.rv += 1;
        let mut v = original.clone();
        v["spec"] = spec["spec"].clone();
        v["metadata"]["resourceVersion"] = json!(c.rv.to_string());
        v
    };
    // Our write returns a colliding spec (same generation: a server that does not bump
    // it), then the watch delivers a later version with the original spec back.
    let colliding = Cluster::binding_value("a", "b1", "o0", Some("c0"));
    let written = version(&mut c, &colliding);
    c.ctx.state.record_binding_write(
        &ObjectKey::new("a", "b1"),
        serde_json::from_value(written).unwrap(),
    );
    assert_eq!(c.refusal("a", "b1"), Some(Reason::IdentityCollision));
    let restored = version(&mut c, &original);
    c.deliver(Kind::Binding, &restored, false);
    assert_eq!(c.refusal("a", "b1"), None);
}

#[test]
fn cluster_wide_inputs_flip_warnings_and_verdicts() {
    let rt = runtime();
    let _guard = rt.enter();
    let mut c = two_bindings_apart();
    assert!(c.warnings("a", "b0").is_empty());
    c.foreign_default("m");
    assert!(c.warnings("a", "b0").is_empty(), "namespace not env=prod");
    c.namespace("a", json!({"env": "prod"}));
    assert_eq!(c.warnings("a", "b0"), ["OverlappingDefaultIdentity"]);
    c.foreign_default("other");
    assert!(c.warnings("a", "b0").is_empty(), "foreign selector changed");
    c.foreign_default("m");
    assert_eq!(c.warnings("a", "b0"), ["OverlappingDefaultIdentity"]);
    c.delete(Kind::Csid, "", "default-identity");
    assert!(c.warnings("a", "b0").is_empty(), "foreign object deleted");

    // The objective CRDs stop being served.
    c.set_served(ApiKind::ObjectivesLlmd, false);
    c.set_served(ApiKind::ObjectivesGaie, false);
    assert_eq!(c.refusal("a", "b0"), Some(Reason::TargetCRDNotServed));
    c.set_served(ApiKind::ObjectivesLlmd, true);
    assert_eq!(c.refusal("a", "b0"), None);
}

#[test]
fn deleted_bindings_and_namespaces_release_their_evaluation() {
    let rt = runtime();
    let _guard = rt.enter();
    let mut c = two_bindings_apart();
    c.binding("b", "x", "o0", Some("c0"));
    c.evaluation("a");
    c.evaluation("b");
    assert_eq!(c.ctx.state.namespace_cache.len(), 2);
    c.delete(Kind::Binding, "b", "x");
    assert_eq!(
        c.ctx.state.namespace_cache.len(),
        1,
        "last binding of b gone"
    );
    c.evaluation("b");
    assert_eq!(
        c.ctx.state.namespace_cache.len(),
        1,
        "an empty namespace is not kept"
    );
    c.delete(Kind::Namespace, "", "a");
    assert!(c.ctx.state.namespace_cache.is_empty(), "namespace a gone");
}

/// One change to the fake cluster.
#[derive(Debug, Clone)]
enum Op {
    Binding {
        ns: usize,
        name: usize,
        objective: usize,
        container: Option<usize>,
    },
    OverlayBinding {
        ns: usize,
        name: usize,
        objective: usize,
        container: Option<usize>,
    },
    StatusWrite {
        ns: usize,
        name: usize,
    },
    DeliverBinding {
        ns: usize,
        name: usize,
    },
    MarkDeleting {
        ns: usize,
        name: usize,
    },
    DeleteBinding {
        ns: usize,
        name: usize,
    },
    Objective {
        ns: usize,
        name: usize,
        pool: usize,
        priority: i32,
    },
    DeleteObjective {
        ns: usize,
        name: usize,
    },
    Pool {
        ns: usize,
        name: usize,
        selector: usize,
    },
    DeletePool {
        ns: usize,
        name: usize,
    },
    Namespace {
        ns: usize,
        prod: bool,
    },
    Foreign {
        app: usize,
    },
    DeleteForeign,
    ToggleObjectivesServed,
}

const NAMESPACES: [&str; 2] = ["a", "b"];
const APPS: [&str; 3] = ["m", "x", "y"];

fn op() -> impl Strategy<Value = Op> {
    let ns = 0..NAMESPACES.len();
    prop_oneof![
        4 => (ns.clone(), 0..4usize, 0..3usize, proptest::option::of(0..2usize)).prop_map(
            |(ns, name, objective, container)| Op::Binding { ns, name, objective, container }
        ),
        2 => (ns.clone(), 0..4usize, 0..3usize, proptest::option::of(0..2usize)).prop_map(
            |(ns, name, objective, container)| Op::OverlayBinding { ns, name, objective, container }
        ),
        1 => (ns.clone(), 0..4usize).prop_map(|(ns, name)| Op::StatusWrite { ns, name }),
        2 => (ns.clone(), 0..4usize).prop_map(|(ns, name)| Op::DeliverBinding { ns, name }),
        1 => (ns.clone(), 0..4usize).prop_map(|(ns, name)| Op::MarkDeleting { ns, name }),
        1 => (ns.clone(), 0..4usize).prop_map(|(ns, name)| Op::DeleteBinding { ns, name }),
        3 => (ns.clone(), 0..3usize, 0..2usize, 0..2i32).prop_map(
            |(ns, name, pool, priority)| Op::Objective { ns, name, pool, priority }
        ),
        1 => (ns.clone(), 0..3usize).prop_map(|(ns, name)| Op::DeleteObjective { ns, name }),
        3 => (ns.clone(), 0..2usize, 0..2usize).prop_map(
            |(ns, name, selector)| Op::Pool { ns, name, selector }
        ),
        1 => (ns.clone(), 0..2usize).prop_map(|(ns, name)| Op::DeletePool { ns, name }),
        2 => (ns, any::<bool>()).prop_map(|(ns, prod)| Op::Namespace { ns, prod }),
        2 => (0..APPS.len()).prop_map(|app| Op::Foreign { app }),
        1 => Just(Op::DeleteForeign),
        1 => Just(Op::ToggleObjectivesServed),
    ]
}

fn container(c: Option<usize>) -> Option<String> {
    c.map(|c| format!("c{c}"))
}

fn apply(c: &mut Cluster, op: &Op) {
    match *op {
        Op::Binding {
            ns,
            name,
            objective,
            container: k,
        } => c.binding(
            NAMESPACES[ns],
            &format!("b{name}"),
            &format!("o{objective}"),
            container(k).as_deref(),
        ),
        Op::OverlayBinding {
            ns,
            name,
            objective,
            container: k,
        } => {
            let spec = Cluster::binding_value(
                NAMESPACES[ns],
                &format!("b{name}"),
                &format!("o{objective}"),
                container(k).as_deref(),
            );
            c.overlay_binding(NAMESPACES[ns], &format!("b{name}"), Some(spec));
        }
        Op::StatusWrite { ns, name } => {
            c.overlay_binding(NAMESPACES[ns], &format!("b{name}"), None)
        }
        Op::DeliverBinding { ns, name } => c.deliver_binding(NAMESPACES[ns], &format!("b{name}")),
        Op::MarkDeleting { ns, name } => c.mark_deleting(NAMESPACES[ns], &format!("b{name}")),
        Op::DeleteBinding { ns, name } => {
            c.delete(Kind::Binding, NAMESPACES[ns], &format!("b{name}"))
        }
        Op::Objective {
            ns,
            name,
            pool,
            priority,
        } => c.objective(
            NAMESPACES[ns],
            &format!("o{name}"),
            &format!("p{pool}"),
            priority,
        ),
        Op::DeleteObjective { ns, name } => {
            c.delete(Kind::Objective, NAMESPACES[ns], &format!("o{name}"))
        }
        Op::Pool { ns, name, selector } => c.pool(
            NAMESPACES[ns],
            &format!("p{name}"),
            json!({"app": APPS[selector]}),
        ),
        Op::DeletePool { ns, name } => c.delete(Kind::Pool, NAMESPACES[ns], &format!("p{name}")),
        Op::Namespace { ns, prod } => c.namespace(
            NAMESPACES[ns],
            if prod {
                json!({"env": "prod"})
            } else {
                json!({})
            },
        ),
        Op::Foreign { app } => c.foreign_default(APPS[app]),
        Op::DeleteForeign => c.delete(Kind::Csid, "", "default-identity"),
        Op::ToggleObjectivesServed => {
            let served = c.served.serves(ApiKind::ObjectivesLlmd);
            c.set_served(ApiKind::ObjectivesLlmd, !served);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// After every change, each namespace's cached evaluation equals a fresh evaluation
    /// without any cache; evaluating after every step keeps entries alive across changes,
    /// so a missed invalidation shows up as a difference.
    #[test]
    fn cached_evaluation_equals_uncached_for_any_change_sequence(
        ops in proptest::collection::vec(op(), 1..40),
        evaluate_mask in any::<u64>(),
    ) {
        let rt = runtime();
        let _guard = rt.enter();
        let mut c = Cluster::new();
        // Start where warnings are likely (prod namespace, foreign default identity on
        // app=m pods), so namespace-label and foreign changes flip them.
        c.namespace("a", json!({"env": "prod"}));
        c.foreign_default("m");
        // ... and where bindings resolve: each namespace starts with p0 (app=m), p1
        // (app=x) and objectives o0, o2 → p0, o1 → p1.
        for ns in NAMESPACES {
            c.pool(ns, "p0", json!({"app": "m"}));
            c.pool(ns, "p1", json!({"app": "x"}));
            for (o, p) in [("o0", "p0"), ("o1", "p1"), ("o2", "p0")] {
                c.objective(ns, o, p, 0);
            }
        }
        for (i, op) in ops.iter().enumerate() {
            apply(&mut c, op);
            // Sometimes skip evaluating, so stale entries would have to survive
            // several changes.
            if evaluate_mask & (1 << (i % 64)) != 0 {
                for ns in NAMESPACES {
                    c.verdicts(ns);
                }
            }
        }
        for ns in NAMESPACES {
            c.verdicts(ns);
        }
    }
}
