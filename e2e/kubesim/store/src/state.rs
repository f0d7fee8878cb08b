//! The cluster's state behind its lock: objects indexed per resource type, the
//! resourceVersion counter, per-type watch history and watchers, and the ownership indexes
//! garbage collection uses.

use crate::ResourceInfo;
use crate::crd::CrdDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::write::TypeCtx;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::mpsc;

/// `(type key, namespace or "", name)`.
pub(crate) type ObjKey = (String, String, String);

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// A stored object as compact JSON: a parsed `serde_json::Value` costs about ten times
/// more memory (every small map is a full B-tree node), and the store holds 100k+ objects
/// plus watch history.
#[derive(Debug)]
pub(crate) struct Stored {
    /// Shared so that a write's response can reuse it instead of serialising again.
    json: Arc<str>,
}

impl Stored {
    pub fn new(v: &Value) -> Self {
        // serialising a `Value` cannot fail (its map keys are strings)
        Self {
            json: Arc::from(serde_json::to_string(v).unwrap_or_default()),
        }
    }

    /// The object's compact JSON.
    pub fn json(&self) -> &Arc<str> {
        &self.json
    }

    pub fn value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap_or(Value::Null)
    }
}

/// One entry of a type's watch history.
#[derive(Debug, Clone)]
pub(crate) struct HistEvent {
    pub rv: u64,
    pub kind: EventKind,
    /// The object after the event (for `Deleted`: its last state, with the deletion's RV).
    pub obj: Arc<Stored>,
    /// The object before the event (`Modified`), for selector transitions.
    pub prev: Option<Arc<Stored>>,
}

/// A message to one watch stream.
#[derive(Debug, Clone)]
pub(crate) struct WatchMsg {
    pub event_type: &'static str,
    pub object: Arc<Value>,
}

/// What a watch filters on.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub ns: Option<String>,
    pub label: Option<LabelSelector>,
    pub field: Option<FieldSelector>,
}

impl WatchFilter {
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = obj.get("metadata");
        if let Some(ns) = &self.ns
            && meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                != Some(ns)
        {
            return false;
        }
        if let Some(l) = &self.label
            && !l.matches(meta.and_then(|m| m.get("labels")))
        {
            return false;
        }
        if let Some(f) = &self.field
            && !f.matches(obj)
        {
            return false;
        }
        true
    }

    /// The event a watcher with this filter sees, as kube-apiserver's cacher computes it:
    /// an object that starts matching is `ADDED`, one that stops matching is `DELETED`
    /// (its previous state at the event's resourceVersion).
    pub fn translate(&self, ev: &ParsedEvent) -> Option<WatchMsg> {
        let now = self.matches(&ev.obj);
        match ev.kind {
            EventKind::Added => now.then(|| msg("ADDED", &ev.obj)),
            EventKind::Deleted => now.then(|| msg("DELETED", &ev.obj)),
            EventKind::Modified => {
                // without selectors, matching depends only on the namespace, which an
                // object never changes
                let before = if self.label.is_none() && self.field.is_none() {
                    now
                } else {
                    ev.prev.as_ref().is_some_and(|p| self.matches(p))
                };
                match (before, now) {
                    (true, true) => Some(msg("MODIFIED", &ev.obj)),
                    (false, true) => Some(msg("ADDED", &ev.obj)),
                    (true, false) => {
                        let mut old = ev.prev.clone().unwrap_or(Value::Null);
                        if old.get("metadata").is_some_and(Value::is_object) {
                            old["metadata"]["resourceVersion"] = Value::from(ev.rv.to_string());
                        }
                        Some(WatchMsg {
                            event_type: "DELETED",
                            object: Arc::new(old),
                        })
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

/// A history event with its objects parsed (once per event, shared by all watchers).
#[derive(Debug)]
pub(crate) struct ParsedEvent {
    pub rv: u64,
    pub kind: EventKind,
    pub obj: Arc<Value>,
    pub prev: Option<Value>,
}

impl ParsedEvent {
    pub fn parse(ev: &HistEvent) -> Self {
        Self {
            rv: ev.rv,
            kind: ev.kind,
            obj: Arc::new(ev.obj.value()),
            prev: ev.prev.as_ref().map(|p| p.value()),
        }
    }
}

fn msg(event_type: &'static str, obj: &Arc<Value>) -> WatchMsg {
    WatchMsg {
        event_type,
        object: Arc::clone(obj),
    }
}

/// An open watch of one type.
#[derive(Debug)]
pub(crate) struct Watcher {
    pub filter: WatchFilter,
    pub tx: mpsc::UnboundedSender<WatchMsg>,
    /// The version watched through (a CRD update that stops serving it ends the watch).
    pub version: String,
}

/// One stored object: its `(namespace, name)` key and value.
pub(crate) type Entry<'a> = (&'a (String, String), &'a Arc<Stored>);

/// All objects of one resource type (a group + plural), plus its history and watchers.
#[derive(Debug, Default)]
pub(crate) struct TypeStore {
    pub objects: BTreeMap<(String, String), Arc<Stored>>,
    pub history: VecDeque<HistEvent>,
    /// Every event with a resourceVersion above `floor` is in `history`.
    pub floor: u64,
    pub watchers: Vec<Watcher>,
    /// Stored writes (ADDED, MODIFIED, DELETED events) since the type was registered.
    pub writes: u64,
}

impl TypeStore {
    pub fn new(floor: u64) -> Self {
        Self {
            floor,
            ..Self::default()
        }
    }

    /// Fan the event out to this type's watchers (dropping closed ones) and keep it in the
    /// history. `obj` is the event's object already parsed (the writer has it in hand).
    fn record(&mut self, ev: HistEvent, obj: Arc<Value>) {
        self.writes += 1;
        if !self.watchers.is_empty() {
            // the previous state matters only to watchers with selectors
            let need_prev = self
                .watchers
                .iter()
                .any(|w| w.filter.label.is_some() || w.filter.field.is_some());
            let parsed = ParsedEvent {
                rv: ev.rv,
                kind: ev.kind,
                obj,
                prev: if need_prev {
                    ev.prev.as_ref().map(|p| p.value())
                } else {
                    None
                },
            };
            self.watchers.retain(|w| match w.filter.translate(&parsed) {
                Some(m) => w.tx.send(m).is_ok(),
                None => !w.tx.is_closed(),
            });
        }
        self.history.push_back(ev);
    }

    /// Objects of namespace `ns` (all when `None`), in namespace/name order.
    pub fn range<'a>(&'a self, ns: Option<&str>) -> Box<dyn Iterator<Item = Entry<'a>> + 'a> {
        self.range_after(ns, None)
    }

    /// As [`TypeStore::range`], starting after the key `after` (a continue token) without
    /// walking the keys before it.
    pub fn range_after<'a>(
        &'a self,
        ns: Option<&str>,
        after: Option<&(String, String)>,
    ) -> Box<dyn Iterator<Item = Entry<'a>> + 'a> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let start = match (after, ns) {
            (Some(a), Some(ns)) if a.0.as_str() < ns => Included((ns.to_string(), String::new())),
            (Some(a), _) => Excluded(a.clone()),
            (None, Some(ns)) => Included((ns.to_string(), String::new())),
            (None, None) => Unbounded,
        };
        let iter = self.objects.range((start, Unbounded));
        match ns {
            None => Box::new(iter),
            Some(ns) => {
                let ns = ns.to_string();
                Box::new(iter.take_while(move |((n, _), _)| *n == ns))
            }
        }
    }
}

/// Everything behind the cluster's lock.
#[derive(Debug)]
pub(crate) struct Inner {
    pub rv: u64,
    /// Served resources by `(group, version, plural)`.
    pub resources: BTreeMap<(String, String, String), Arc<ResourceInfo>>,
    /// Objects per type key (`plural` or `plural.group`).
    pub types: HashMap<String, TypeStore>,
    /// Established CRDs by type key.
    pub crds: HashMap<String, CrdDef>,
    /// Where each live object's UID is stored.
    pub uids: HashMap<String, ObjKey>,
    /// Owner UID → objects whose ownerReferences name it.
    pub dependents: HashMap<String, BTreeSet<ObjKey>>,
    /// Merge semantics of built-in resources for apply, by `(group, version, plural)`.
    pub builtin_types: HashMap<(String, String, String), Arc<kubesim_apply::TypeInfo>>,
    /// Most watch events kept, over all types of the cluster.
    pub history_limit: usize,
    /// `(rv, type key)` of every event in the types' histories, oldest first.
    pub history_order: VecDeque<(u64, String)>,
    /// Resolved request contexts by `(group, version, plural)`: building one copies the
    /// resource's description and looks up its schema, on every request otherwise.
    /// Emptied by [`Inner::types_changed`] whenever what they are built from changes.
    pub ctx_cache: Mutex<HashMap<(String, String, String), Arc<TypeCtx>>>,
}

/// The owner UIDs in `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

impl Inner {
    pub fn new(history_limit: usize) -> Self {
        Self {
            rv: 0,
            resources: BTreeMap::new(),
            types: HashMap::new(),
            crds: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            builtin_types: HashMap::new(),
            history_limit,
            history_order: VecDeque::new(),
            ctx_cache: Mutex::new(HashMap::new()),
        }
    }

    /// Forget resolved request contexts: call after any change to `resources`, `crds` or
    /// `builtin_types`.
    pub fn types_changed(&mut self) {
        self.ctx_cache
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Drop the oldest events until at most `history_limit` remain; each dropped event
    /// raises its type's floor (watches from before it get 410).
    pub fn trim_history(&mut self) {
        while self.history_order.len() > self.history_limit {
            let Some((rv, key)) = self.history_order.pop_front() else {
                break;
            };
            if let Some(t) = self.types.get_mut(&key)
                && t.history.front().is_some_and(|e| e.rv == rv)
            {
                t.history.pop_front();
                t.floor = rv;
            }
        }
    }

    /// Forget all history: every type's floor becomes the current resourceVersion.
    pub fn clear_history(&mut self) {
        self.history_order.clear();
        let rv = self.rv;
        for t in self.types.values_mut() {
            t.history.clear();
            t.floor = rv;
        }
    }

    fn record(&mut self, key: &str, ev: HistEvent, obj: Arc<Value>) {
        let rv = ev.rv;
        if let Some(t) = self.types.get_mut(key) {
            t.record(ev, obj);
            self.history_order.push_back((rv, key.to_string()));
            self.trim_history();
        }
    }

    pub fn register(&mut self, r: ResourceInfo) {
        let key = crate::convert::storage_key(&r);
        if !r.virtual_only && !r.custom {
            let ti = kubesim_apply::TypeInfo::builtin(&r.api_version(), &r.kind)
                .with_status_subresource(r.has_status);
            self.builtin_types.insert(
                (r.group.clone(), r.version.clone(), r.plural.clone()),
                Arc::new(ti),
            );
        }
        if !r.virtual_only {
            let floor = self.rv;
            self.types
                .entry(key)
                .or_insert_with(|| TypeStore::new(floor));
        }
        self.resources.insert(
            (r.group.clone(), r.version.clone(), r.plural.clone()),
            Arc::new(r),
        );
        self.types_changed();
    }

    pub fn get(&self, key: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.types
            .get(key)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .map(|s| Arc::new(s.value()))
    }

    /// Whether an object is stored under this key (without parsing it).
    pub fn exists(&self, key: &str, ns: &str, name: &str) -> bool {
        self.types
            .get(key)
            .is_some_and(|t| t.objects.contains_key(&(ns.to_string(), name.to_string())))
    }

    fn index(&mut self, key: &ObjKey, prev: Option<&Value>, obj: Option<&Value>) {
        if let Some(p) = prev {
            for o in owner_uids(p) {
                if let Some(set) = self.dependents.get_mut(&o) {
                    set.remove(key);
                    if set.is_empty() {
                        self.dependents.remove(&o);
                    }
                }
            }
            if let Some(uid) = crate::meta::meta_str(p, "uid") {
                self.uids.remove(uid);
            }
        }
        if let Some(n) = obj {
            for o in owner_uids(n) {
                self.dependents.entry(o).or_default().insert(key.clone());
            }
            if let Some(uid) = crate::meta::meta_str(n, "uid") {
                self.uids.insert(uid.to_string(), key.clone());
            }
        }
    }

    /// Store `obj` under a new resourceVersion and emit ADDED/MODIFIED.
    pub fn put(&mut self, key: &str, ns: &str, name: &str, obj: Value) -> Arc<Value> {
        self.put_over(key, ns, name, obj, None).0
    }

    /// As [`Inner::put`]; `known_prev` is the object being replaced when the caller has
    /// it parsed already (any served form: only its `uid` and `ownerReferences` are read,
    /// for the indexes), which saves parsing the stored copy again. Also returns the
    /// stored JSON.
    pub fn put_over(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        mut obj: Value,
        known_prev: Option<&Value>,
    ) -> (Arc<Value>, Arc<str>) {
        self.rv += 1;
        let rv = self.rv;
        if obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        }
        let stored = Arc::new(Stored::new(&obj));
        let json = Arc::clone(stored.json());
        let obj = Arc::new(obj);
        let okey: ObjKey = (key.to_string(), ns.to_string(), name.to_string());
        let prev = self.types.get_mut(key).and_then(|t| {
            t.objects
                .insert((ns.to_string(), name.to_string()), Arc::clone(&stored))
        });
        match (&prev, known_prev) {
            (Some(_), Some(known)) => self.index(&okey, Some(known), Some(&obj)),
            _ => {
                let prev_value = prev.as_ref().map(|p| p.value());
                self.index(&okey, prev_value.as_ref(), Some(&obj));
            }
        }
        let ev = HistEvent {
            rv,
            kind: if prev.is_some() {
                EventKind::Modified
            } else {
                EventKind::Added
            },
            obj: stored,
            prev,
        };
        self.record(key, ev, Arc::clone(&obj));
        (obj, json)
    }

    /// Remove an object under a new resourceVersion and emit DELETED; returns its last state
    /// (carrying the deletion's resourceVersion, as watch events do).
    pub fn remove(&mut self, key: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        let t = self.types.get_mut(key)?;
        let old = t.objects.remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let rv = self.rv;
        let old = old.value();
        let mut last = old.clone();
        if last.get("metadata").is_some_and(Value::is_object) {
            last["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        }
        let last = Arc::new(last);
        let ev = HistEvent {
            rv,
            kind: EventKind::Deleted,
            obj: Arc::new(Stored::new(&last)),
            prev: None,
        };
        self.record(key, ev, Arc::clone(&last));
        let okey: ObjKey = (key.to_string(), ns.to_string(), name.to_string());
        self.index(&okey, Some(&old), None);
        Some(last)
    }
}
