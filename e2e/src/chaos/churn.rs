//! Churn: what people (and a few hostile or careless ones) do to a fleet while kleym runs.
//!
//! A [`Model`] of each spoke's user objects (bindings, objectives, pools, foreign
//! ClusterSPIFFEIDs, whether its ClusterProfile exists) lets the schedule pick only
//! operations that make sense next (edit a binding that exists, delete a pool that does),
//! without reading the clusters: the schedule is a pure function of the seed. Each
//! [`ChurnOp`] is then applied straight to the spoke's store (in process, field manager
//! [`USER_MANAGER`] or [`FOREIGN_MANAGER`]), so churn is never slowed or lost by the
//! faults it runs beside. An op the API refuses (a 409 or a 422 for an invalid object) is
//! counted as rejected, which is what an invalid object is for.

use std::collections::{BTreeMap, BTreeSet};

use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kubesim_store::{Cluster, PatchType, Subresource, WriteOptions};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::fixtures::env::{self, NS, POOL, SA};

/// Field manager of the churn's own writes (users editing bindings and their inputs).
pub const USER_MANAGER: &str = "chaos-user";
/// Field manager of the foreign ClusterSPIFFEIDs (another controller or a person).
pub const FOREIGN_MANAGER: &str = "someone-else";

/// One user object kind, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// A binding created (valid or hostile).
    BindingCreate,
    /// A binding's spec edited (mode, discriminator, selectors, ID template, target).
    BindingEdit,
    /// A binding deleted.
    BindingDelete,
    /// An invalid binding (the API must reject it).
    InvalidBinding,
    /// An objective created.
    ObjectiveCreate,
    /// An objective deleted.
    ObjectiveDelete,
    /// An objective's labels or pool reference changed.
    ObjectiveRelabel,
    /// A pool created.
    PoolCreate,
    /// A pool deleted.
    PoolDelete,
    /// A pool's selector and labels changed.
    PoolRelabel,
    /// A foreign ClusterSPIFFEID created.
    ForeignCreate,
    /// A foreign ClusterSPIFFEID deleted.
    ForeignDelete,
    /// A ClusterProfile's labels changed.
    ProfileRelabel,
    /// A ClusterProfile deleted.
    ProfileDelete,
    /// A deleted ClusterProfile added back.
    ProfileAdd,
}

impl OpKind {
    /// Its name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::BindingCreate => "binding_create",
            OpKind::BindingEdit => "binding_edit",
            OpKind::BindingDelete => "binding_delete",
            OpKind::InvalidBinding => "binding_invalid",
            OpKind::ObjectiveCreate => "objective_create",
            OpKind::ObjectiveDelete => "objective_delete",
            OpKind::ObjectiveRelabel => "objective_relabel",
            OpKind::PoolCreate => "pool_create",
            OpKind::PoolDelete => "pool_delete",
            OpKind::PoolRelabel => "pool_relabel",
            OpKind::ForeignCreate => "foreign_create",
            OpKind::ForeignDelete => "foreign_delete",
            OpKind::ProfileRelabel => "profile_relabel",
            OpKind::ProfileDelete => "profile_delete",
            OpKind::ProfileAdd => "profile_add",
        }
    }
}

/// One churn operation on spoke `spoke` (an index into the fleet).
#[derive(Clone, Debug, PartialEq)]
pub struct ChurnOp {
    /// The spoke.
    pub spoke: usize,
    /// What kind of change.
    pub kind: OpKind,
    /// The change itself.
    pub change: Change,
}

/// A store write (or a profile change, applied on the hub cluster).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Create `object` of `(group, version, plural)` in `namespace`.
    Create {
        /// API group, version and plural.
        gvp: (&'static str, &'static str, &'static str),
        /// Namespace (`None`: cluster-scoped).
        namespace: Option<&'static str>,
        /// The object.
        object: Value,
        /// Field manager.
        manager: &'static str,
    },
    /// Merge-patch `name` with `patch`.
    Patch {
        /// API group, version and plural.
        gvp: (&'static str, &'static str, &'static str),
        /// Namespace.
        namespace: Option<&'static str>,
        /// Object name.
        name: String,
        /// Merge patch.
        patch: Value,
    },
    /// Delete `name`.
    Delete {
        /// API group, version and plural.
        gvp: (&'static str, &'static str, &'static str),
        /// Namespace.
        namespace: Option<&'static str>,
        /// Object name.
        name: String,
    },
    /// Set the spoke's ClusterProfile labels to `labels`.
    ProfileLabels(BTreeMap<String, String>),
    /// Delete the spoke's ClusterProfile.
    ProfileDelete,
    /// Create the spoke's ClusterProfile again.
    ProfileAdd,
}

const BINDINGS: (&str, &str, &str) = ("kleym.io", "v1alpha1", "inferenceidentitybindings");
const OBJECTIVES: (&str, &str, &str) = ("llm-d.ai", "v1alpha2", "inferenceobjectives");
const POOLS: (&str, &str, &str) = ("inference.networking.k8s.io", "v1", "inferencepools");
/// ClusterSPIFFEIDs: `(group, version, plural)`.
pub const CSIDS: (&str, &str, &str) = ("spire.spiffe.io", "v1alpha1", "clusterspiffeids");

/// What the schedule knows of one spoke's user objects.
#[derive(Clone, Debug, Default)]
pub struct SpokeModel {
    /// Bindings by name.
    pub bindings: BTreeSet<String>,
    /// Objectives by name, with their pool.
    pub objectives: BTreeMap<String, String>,
    /// Pools by name.
    pub pools: BTreeSet<String>,
    /// Foreign ClusterSPIFFEIDs the churn created (some may have been refused with 409).
    pub foreign: BTreeSet<String>,
    /// Whether the spoke's ClusterProfile exists.
    pub profile: bool,
    next: usize,
}

/// The whole fleet's model.
#[derive(Clone, Debug)]
pub struct Model {
    /// One per spoke.
    pub spokes: Vec<SpokeModel>,
}

impl Model {
    /// The fleet as set up: `m` bindings `b-i` on objectives `obj-i`, all on [`POOL`], and
    /// every profile present.
    pub fn initial(n: usize, m: usize) -> Self {
        let spoke = SpokeModel {
            bindings: (0..m).map(env::binding_name).collect(),
            objectives: (0..m)
                .map(|i| (env::objective_name(i), POOL.to_string()))
                .collect(),
            pools: BTreeSet::from([POOL.to_string()]),
            foreign: BTreeSet::new(),
            profile: true,
            next: 0,
        };
        Self {
            spokes: vec![spoke; n],
        }
    }

    /// Picks and records the next operation on a random spoke.
    pub fn next_op(&mut self, rng: &mut StdRng) -> ChurnOp {
        let spoke = rng.gen_range(0..self.spokes.len());
        let s = &mut self.spokes[spoke];
        s.next += 1;
        let k = s.next;
        let roll = rng.gen_range(0..100u32);
        let (kind, change) = match roll {
            0..=19 => create_binding(s, rng, k),
            20..=44 => edit_binding(s, rng),
            45..=54 => delete_binding(s, rng),
            55..=57 => invalid_binding(rng, k),
            58..=61 => create_objective(s, rng, k),
            62..=64 => delete_objective(s, rng),
            65..=69 => relabel_objective(s, rng),
            70..=71 => create_pool(s, k),
            72 => delete_pool(s, rng),
            73..=77 => relabel_pool(s, rng),
            78..=84 => create_foreign(s, rng, k),
            85..=88 => delete_foreign(s, rng),
            89..=95 => relabel_profile(rng),
            _ if s.profile => {
                s.profile = false;
                (OpKind::ProfileDelete, Change::ProfileDelete)
            }
            _ => {
                s.profile = true;
                (OpKind::ProfileAdd, Change::ProfileAdd)
            }
        };
        ChurnOp {
            spoke,
            kind,
            change,
        }
    }

    /// The ops that add every deleted profile back (run when churn stops, so every spoke
    /// is managed and checked at the end).
    pub fn restore_profiles(&mut self) -> Vec<ChurnOp> {
        let mut out = Vec::new();
        for (spoke, s) in self.spokes.iter_mut().enumerate() {
            if !s.profile {
                s.profile = true;
                out.push(ChurnOp {
                    spoke,
                    kind: OpKind::ProfileAdd,
                    change: Change::ProfileAdd,
                });
            }
        }
        out
    }
}

fn pick<'a, T>(rng: &mut StdRng, items: impl ExactSizeIterator<Item = &'a T>) -> Option<&'a T> {
    let len = items.len();
    if len == 0 {
        return None;
    }
    let i = rng.gen_range(0..len);
    let mut items = items;
    items.nth(i)
}

/// A binding spec: a random objective (sometimes a missing one), mode, discriminator,
/// selectors and ID template; now and then a hostile one (selectors escaping the
/// namespace, a foreign trust domain in the ID template).
fn binding_spec(s: &SpokeModel, rng: &mut StdRng) -> Value {
    let target = if rng.gen_bool(0.05) || s.objectives.is_empty() {
        "ghost-objective".to_string()
    } else {
        pick(rng, s.objectives.keys()).cloned().unwrap_or_default()
    };
    let mut spec = json!({"targetRef": {"name": target}});
    spec_fields(&mut spec, rng);
    spec
}

/// Mode + discriminator, selectors and ID template (as set on create or in an edit).
fn spec_fields(spec: &mut Value, rng: &mut StdRng) {
    if rng.gen_bool(0.2) {
        spec["mode"] = json!("PoolOnly");
        spec["containerDiscriminator"] = Value::Null;
    } else {
        spec["mode"] = json!("PerObjective");
        spec["containerDiscriminator"] = discriminator(rng);
    }
    spec["workloadSelectorTemplates"] = selectors(rng);
    spec["spiffeIDTemplate"] = id_template(rng);
}

fn discriminator(rng: &mut StdRng) -> Value {
    if rng.gen_bool(0.7) {
        json!({"type": "ContainerName", "value": format!("c-{}", rng.gen_range(0..6))})
    } else {
        json!({"type": "ContainerImage", "value": format!("registry.example/vllm:v{}", rng.gen_range(0..3))})
    }
}

fn selectors(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..10) {
        0..=5 => json!(["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{SA}")]),
        6..=7 => json!([
            format!("k8s:sa:{SA}"),
            "k8s:ns:{{ .Namespace }}",
            "k8s:pod-label:tier:gold"
        ]),
        // Hostile: selectors that leave the binding's namespace.
        8 => json!(["k8s:ns:kube-system", format!("k8s:sa:{SA}")]),
        _ => json!(["k8s:ns:{{ .Namespace }}"]),
    }
}

fn id_template(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..10) {
        0..=5 => Value::Null,
        6..=7 => json!("spiffe://{{ .TrustDomain }}/ns/{{ .Namespace }}/team/{{ .BindingName }}"),
        8 => json!(format!(
            "spiffe://{{{{ .TrustDomain }}}}/shared/{}",
            rng.gen_range(0..3)
        )),
        // Hostile: another trust domain.
        _ => json!("spiffe://evil.example/ns/{{ .Namespace }}/stolen"),
    }
}

/// A spec without the nulls a merge patch needs (a create must not carry them).
fn without_nulls(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, x| !x.is_null());
    }
    v
}

fn create_binding(s: &mut SpokeModel, rng: &mut StdRng, k: usize) -> (OpKind, Change) {
    let name = format!("c-{k}");
    let spec = without_nulls(binding_spec(s, rng));
    s.bindings.insert(name.clone());
    (
        OpKind::BindingCreate,
        Change::Create {
            gvp: BINDINGS,
            namespace: Some(NS),
            object: json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "InferenceIdentityBinding",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            }),
            manager: USER_MANAGER,
        },
    )
}

fn edit_binding(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let Some(name) = pick(rng, s.bindings.iter()).cloned() else {
        return create_binding(s, rng, s.next);
    };
    let mut spec = json!({});
    match rng.gen_range(0..5) {
        0 => spec_fields(&mut spec, rng),
        1 => {
            // Mode and discriminator change together (CEL requires it).
            if rng.gen_bool(0.5) {
                spec["mode"] = json!("PoolOnly");
                spec["containerDiscriminator"] = Value::Null;
            } else {
                spec["mode"] = json!("PerObjective");
                spec["containerDiscriminator"] = discriminator(rng);
            }
        }
        2 => spec["workloadSelectorTemplates"] = selectors(rng),
        3 => spec["spiffeIDTemplate"] = id_template(rng),
        _ => {
            let target = pick(rng, s.objectives.keys())
                .cloned()
                .unwrap_or_else(|| "ghost-objective".into());
            spec["targetRef"] = json!({"name": target});
        }
    }
    (
        OpKind::BindingEdit,
        Change::Patch {
            gvp: BINDINGS,
            namespace: Some(NS),
            name,
            patch: json!({"spec": spec}),
        },
    )
}

fn delete_binding(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let Some(name) = pick(rng, s.bindings.iter()).cloned() else {
        return create_binding(s, rng, s.next);
    };
    s.bindings.remove(&name);
    (
        OpKind::BindingDelete,
        Change::Delete {
            gvp: BINDINGS,
            namespace: Some(NS),
            name,
        },
    )
}

/// A binding the API must reject (CEL or schema): never stored, never seen by kleym.
fn invalid_binding(rng: &mut StdRng, k: usize) -> (OpKind, Change) {
    let spec = match rng.gen_range(0..3) {
        // PoolOnly with a discriminator.
        0 => json!({"targetRef": {"name": "obj-0"}, "mode": "PoolOnly",
                    "containerDiscriminator": {"type": "ContainerName", "value": "x"},
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}"]}),
        // PerObjective without one.
        1 => json!({"targetRef": {"name": "obj-0"}, "mode": "PerObjective",
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}"]}),
        // An unknown mode.
        _ => json!({"targetRef": {"name": "obj-0"}, "mode": "Everything",
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}"]}),
    };
    (
        OpKind::InvalidBinding,
        Change::Create {
            gvp: BINDINGS,
            namespace: Some(NS),
            object: json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "InferenceIdentityBinding",
                "metadata": {"name": format!("invalid-{k}"), "namespace": NS},
                "spec": spec,
            }),
            manager: USER_MANAGER,
        },
    )
}

fn objective(name: &str, pool: &str) -> Value {
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"priority": 1, "poolRef": {"name": pool}}
    })
}

fn create_objective(s: &mut SpokeModel, rng: &mut StdRng, k: usize) -> (OpKind, Change) {
    let name = format!("cobj-{k}");
    let pool = if rng.gen_bool(0.1) {
        "ghost-pool".to_string()
    } else {
        pick(rng, s.pools.iter())
            .cloned()
            .unwrap_or_else(|| POOL.into())
    };
    s.objectives.insert(name.clone(), pool.clone());
    (
        OpKind::ObjectiveCreate,
        Change::Create {
            gvp: OBJECTIVES,
            namespace: Some(NS),
            object: objective(&name, &pool),
            manager: USER_MANAGER,
        },
    )
}

fn delete_objective(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let Some(name) = pick(rng, s.objectives.keys()).cloned() else {
        return create_objective(s, rng, s.next);
    };
    s.objectives.remove(&name);
    (
        OpKind::ObjectiveDelete,
        Change::Delete {
            gvp: OBJECTIVES,
            namespace: Some(NS),
            name,
        },
    )
}

fn relabel_objective(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let Some(name) = pick(rng, s.objectives.keys()).cloned() else {
        return create_objective(s, rng, s.next);
    };
    let mut patch = json!({"metadata": {"labels": {"team": format!("t{}", rng.gen_range(0..4))}}});
    if rng.gen_bool(0.5)
        && let Some(pool) = pick(rng, s.pools.iter()).cloned()
    {
        patch["spec"] = json!({"poolRef": {"name": pool}});
        s.objectives.insert(name.clone(), pool);
    }
    (
        OpKind::ObjectiveRelabel,
        Change::Patch {
            gvp: OBJECTIVES,
            namespace: Some(NS),
            name,
            patch,
        },
    )
}

fn create_pool(s: &mut SpokeModel, k: usize) -> (OpKind, Change) {
    let name = format!("cpool-{k}");
    s.pools.insert(name.clone());
    (
        OpKind::PoolCreate,
        Change::Create {
            gvp: POOLS,
            namespace: Some(NS),
            object: json!({
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "selector": {"matchLabels": {"app": format!("vllm-{k}")}},
                    "targetPorts": [{"number": 8000}],
                    "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}
                }
            }),
            manager: USER_MANAGER,
        },
    )
}

fn delete_pool(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    // The original pool stays, so most bindings keep a chance to be Ready.
    let Some(name) = pick(
        rng,
        s.pools
            .iter()
            .filter(|p| *p != POOL)
            .collect::<Vec<_>>()
            .into_iter(),
    )
    .map(|p| (*p).clone()) else {
        return create_pool(s, s.next);
    };
    s.pools.remove(&name);
    (
        OpKind::PoolDelete,
        Change::Delete {
            gvp: POOLS,
            namespace: Some(NS),
            name,
        },
    )
}

fn relabel_pool(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let name = pick(rng, s.pools.iter())
        .cloned()
        .unwrap_or_else(|| POOL.into());
    let app = match rng.gen_range(0..3) {
        0 => "vllm-qwen".to_string(),
        n => format!("vllm-qwen-{n}"),
    };
    (
        OpKind::PoolRelabel,
        Change::Patch {
            gvp: POOLS,
            namespace: Some(NS),
            name,
            patch: json!({"metadata": {"labels": {"rev": app.clone()}},
                          "spec": {"selector": {"matchLabels": {"app": app}}}}),
        },
    )
}

/// A foreign ClusterSPIFFEID: one overlapping the pools' pods, one at a name kleym would
/// use for a binding, or one wearing kleym's labels without being kleym's.
fn create_foreign(s: &mut SpokeModel, rng: &mut StdRng, k: usize) -> (OpKind, Change) {
    let (name, labels) = match rng.gen_range(0..3) {
        0 => (format!("foreign-{k}"), json!({})),
        1 => {
            let binding = pick(rng, s.bindings.iter())
                .cloned()
                .unwrap_or_else(|| format!("c-{}", k + 1));
            (cluster_spiffe_id_name(NS, &binding), json!({}))
        }
        _ => (
            format!("lookalike-{k}"),
            json!({"kleym.io/managed-by": "kleym", "kleym.io/binding-namespace": NS,
                   "kleym.io/binding-name": "b-0"}),
        ),
    };
    s.foreign.insert(name.clone());
    (
        OpKind::ForeignCreate,
        Change::Create {
            gvp: CSIDS,
            namespace: None,
            object: json!({
                "apiVersion": "spire.spiffe.io/v1alpha1",
                "kind": "ClusterSPIFFEID",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "spiffeIDTemplate": format!("spiffe://other.example/foreign/{k}"),
                    "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                }
            }),
            manager: FOREIGN_MANAGER,
        },
    )
}

fn delete_foreign(s: &mut SpokeModel, rng: &mut StdRng) -> (OpKind, Change) {
    let Some(name) = pick(rng, s.foreign.iter()).cloned() else {
        return create_foreign(s, rng, s.next);
    };
    s.foreign.remove(&name);
    (
        OpKind::ForeignDelete,
        Change::Delete {
            gvp: CSIDS,
            namespace: None,
            name,
        },
    )
}

fn relabel_profile(rng: &mut StdRng) -> (OpKind, Change) {
    let mut labels = BTreeMap::new();
    labels.insert("region".to_string(), format!("r{}", rng.gen_range(0..3)));
    if rng.gen_bool(0.5) {
        labels.insert("tier".to_string(), "gold".to_string());
    }
    (OpKind::ProfileRelabel, Change::ProfileLabels(labels))
}

/// What happened to one applied op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The store took it; for a foreign object, its name and resourceVersion.
    Done(Option<(String, String)>),
    /// The API refused it (code), e.g. 409 (a name taken) or 422 (invalid).
    Rejected(u16),
}

/// Applies a store change to `store` (profile changes are the caller's).
pub fn apply_store(store: &Cluster, change: &Change) -> Result<Applied, String> {
    let resolve = |(g, v, p): (&str, &str, &str)| {
        store
            .resolve(g, v, p)
            .ok_or_else(|| format!("{}: {g}/{v} {p} is not served", store.name()))
    };
    let user = WriteOptions {
        field_manager: USER_MANAGER.into(),
        ..WriteOptions::default()
    };
    let r = match change {
        Change::Create {
            gvp,
            namespace,
            object,
            manager,
        } => {
            let opts = WriteOptions {
                field_manager: (*manager).into(),
                ..WriteOptions::default()
            };
            store
                .create(&resolve(*gvp)?, *namespace, object.clone(), &opts)
                .map(|w| {
                    (*manager == FOREIGN_MANAGER).then(|| {
                        let meta = &w.object["metadata"];
                        (
                            meta["name"].as_str().unwrap_or_default().to_string(),
                            meta["resourceVersion"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        )
                    })
                })
        }
        Change::Patch {
            gvp,
            namespace,
            name,
            patch,
        } => store
            .patch(
                &resolve(*gvp)?,
                *namespace,
                name,
                PatchType::Merge,
                patch,
                Subresource::Main,
                &user,
            )
            .map(|_| None),
        Change::Delete {
            gvp,
            namespace,
            name,
        } => store
            .delete(&resolve(*gvp)?, *namespace, name, &Default::default())
            .map(|_| None),
        Change::ProfileLabels(_) | Change::ProfileDelete | Change::ProfileAdd => {
            return Err("a profile change is applied on the hub cluster".into());
        }
    };
    Ok(match r {
        Ok(foreign) => Applied::Done(foreign),
        Err(e) => Applied::Rejected(e.code),
    })
}
