//! Field paths and field sets, in structured-merge-diff's `FieldsV1` vocabulary.
//!
//! A path element is kept in its `FieldsV1` spelling (`f:spec`, `k:{"name":"c"}`, `v:"x"`,
//! `i:0`), canonicalised so that equal elements have equal strings; a path is a list of them
//! and a set is a sorted set of paths. Sets are small (one object), so a flat `BTreeSet` with
//! prefix ranges is simpler than a trie and fast enough.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// One field path, e.g. `["f:spec", "f:containers", "k:{\"name\":\"c\"}", "f:image"]`.
pub(crate) type Path = Vec<String>;

/// A path element for a struct field or map key.
pub(crate) fn field(name: &str) -> String {
    format!("f:{name}")
}

/// A path element for a set-list item (the item's JSON).
pub(crate) fn value(v: &Value) -> String {
    format!("v:{}", canonical_json(v))
}

/// A path element for a map-list item: its key fields, sorted by name.
pub(crate) fn key(fields: &Map<String, Value>) -> String {
    // serde_json's Map is a BTreeMap here, so the keys serialise sorted, as upstream sorts them.
    format!("k:{}", canonical_json(&Value::Object(fields.clone())))
}

fn canonical_json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A set of field paths; a path is a member when the field it names is owned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    /// The empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Add a path.
    pub(crate) fn insert(&mut self, p: Path) {
        self.0.insert(p);
    }

    /// Whether `p` is a member.
    pub(crate) fn contains(&self, p: &[String]) -> bool {
        self.0.contains(p)
    }

    /// Whether the set holds no path.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The members, sorted.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    /// Whether some member is `p` or lies below `p`.
    pub(crate) fn has_prefix(&self, p: &[String]) -> bool {
        use std::ops::Bound::{Included, Unbounded};
        self.0
            .range::<[String], _>((Included(p), Unbounded))
            .next()
            .is_some_and(|m| m.starts_with(p))
    }

    /// Whether `p` is a member or an ancestor of one: membership in
    /// `self.with_ancestors()` without building it (the empty path is never an ancestor).
    pub(crate) fn covers(&self, p: &[String]) -> bool {
        if p.is_empty() {
            self.contains(p)
        } else {
            self.has_prefix(p)
        }
    }

    /// Keep only members for which `keep` holds, in place.
    pub(crate) fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.0.retain(|p| keep(p));
    }

    /// Remove every member of `other` (`self − other`, in place).
    pub(crate) fn remove_all(&mut self, other: &FieldSet) {
        if other.0.is_empty() {
            return;
        }
        self.0.retain(|p| !other.0.contains(p));
    }

    /// Whether `self ∩ other` is non-empty.
    pub(crate) fn intersects(&self, other: &FieldSet) -> bool {
        let (small, large) = if self.0.len() <= other.0.len() {
            (self, other)
        } else {
            (other, self)
        };
        small.0.iter().any(|p| large.0.contains(p))
    }

    /// `self ∪ other`.
    pub(crate) fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }

    /// `self − other`.
    pub(crate) fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }

    /// `self ∩ other`.
    pub(crate) fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }

    /// Members that are neither in `other` nor below one of its members.
    #[cfg(test)]
    pub(crate) fn recursive_difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(
            self.0
                .iter()
                .filter(|p| !(0..=p.len()).any(|n| other.0.contains(&p[..n])))
                .cloned()
                .collect(),
        )
    }

    /// The set plus every ancestor of its members (the containers of owned fields), the
    /// analogue of upstream's `EnsureNamedFieldsAreMembers` used when pruning.
    pub(crate) fn with_ancestors(&self) -> FieldSet {
        let mut out = self.0.clone();
        for p in &self.0 {
            for n in 1..p.len() {
                out.insert(p[..n].to_vec());
            }
        }
        FieldSet(out)
    }

    /// Encode as `FieldsV1` JSON.
    pub(crate) fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for p in self.0.iter().filter(|p| !p.is_empty()) {
            insert_path(&mut root, p);
        }
        drop_lone_dots(&mut root);
        Value::Object(root)
    }

    /// Decode `FieldsV1` JSON.
    pub(crate) fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let mut set = FieldSet::new();
        let obj = v
            .as_object()
            .ok_or_else(|| "fieldsV1 must be an object".to_string())?;
        decode_into(obj, &mut Vec::new(), &mut set)?;
        Ok(set)
    }
}

fn insert_path(node: &mut Map<String, Value>, p: &[String]) {
    let Some((first, rest)) = p.split_first() else {
        node.insert(".".into(), Value::Object(Map::new()));
        return;
    };
    if let Value::Object(child) = node
        .entry(first.clone())
        .or_insert_with(|| Value::Object(Map::new()))
    {
        insert_path(child, rest);
    }
}

/// A member without children is spelled `{}`, with children `{".": {}, …}`.
fn drop_lone_dots(node: &mut Map<String, Value>) {
    for (k, child) in node.iter_mut() {
        if k == "." {
            continue;
        }
        if let Value::Object(m) = child {
            if m.len() == 1 && m.contains_key(".") {
                m.clear();
            } else {
                drop_lone_dots(m);
            }
        }
    }
}

fn decode_into(
    obj: &Map<String, Value>,
    path: &mut Path,
    set: &mut FieldSet,
) -> Result<(), String> {
    for (k, child) in obj {
        if k == "." {
            continue;
        }
        let el = canonical_element(k)?;
        let child = child
            .as_object()
            .ok_or_else(|| format!("fieldsV1 entry {k:?} must be an object"))?;
        path.push(el);
        if child.is_empty() || child.contains_key(".") {
            set.insert(path.clone());
        }
        decode_into(child, path, set)?;
        path.pop();
    }
    Ok(())
}

/// Re-spell a `FieldsV1` key so equal elements compare equal.
fn canonical_element(k: &str) -> Result<String, String> {
    let bad = || format!("invalid fieldsV1 path element {k:?}");
    match k.split_at_checked(2) {
        Some(("f:", _)) => Ok(k.to_string()),
        Some(("i:", n)) => n
            .parse::<u64>()
            .map(|n| format!("i:{n}"))
            .map_err(|_| bad()),
        Some(("v:", j)) => serde_json::from_str::<Value>(j)
            .map(|v| value(&v))
            .map_err(|_| bad()),
        Some(("k:", j)) => match serde_json::from_str::<Value>(j) {
            Ok(Value::Object(m)) => Ok(key(&m)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// A path as kube-apiserver prints it in conflicts: `.spec.containers[name="c"].image`.
pub(crate) fn display(p: &[String]) -> String {
    let mut out = String::new();
    for el in p {
        let (kind, rest) = el.split_at_checked(2).unwrap_or(("", el.as_str()));
        match kind {
            "f:" => {
                out.push('.');
                out.push_str(rest);
            }
            "i:" => {
                out.push('[');
                out.push_str(rest);
                out.push(']');
            }
            "v:" => {
                out.push_str("[=");
                out.push_str(rest);
                out.push(']');
            }
            "k:" => {
                let parts: Vec<String> = match serde_json::from_str::<Value>(rest) {
                    Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    _ => vec![rest.to_string()],
                };
                out.push('[');
                out.push_str(&parts.join(","));
                out.push(']');
            }
            _ => out.push_str(el),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(els: &[&str]) -> Path {
        els.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn encode_marks_members_with_children_by_dot() {
        let mut s = FieldSet::new();
        s.insert(p(&["f:metadata", "f:labels"]));
        s.insert(p(&["f:metadata", "f:labels", "f:app"]));
        s.insert(p(&["f:spec", "f:replicas"]));
        assert_eq!(
            s.to_fields_v1(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:replicas": {}}})
        );
    }

    #[test]
    fn decode_inverts_encode() {
        let v = json!({"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:name": {}, "f:image": {}}}},
                       "f:metadata": {"f:finalizers": {".": {}, "v:\"a\"": {}}}});
        let s = FieldSet::from_fields_v1(&v).unwrap();
        assert!(s.contains(&p(&["f:spec", "f:containers", "k:{\"name\":\"c\"}"])));
        assert!(!s.contains(&p(&["f:spec", "f:containers"])));
        assert!(s.contains(&p(&["f:metadata", "f:finalizers", "v:\"a\""])));
        assert_eq!(s.to_fields_v1(), v);
    }

    #[test]
    fn decode_canonicalises_key_order_and_spacing() {
        let v = json!({"k:{\"protocol\": \"TCP\", \"containerPort\": 80}": {}});
        let s = FieldSet::from_fields_v1(&v).unwrap();
        assert!(s.contains(&p(&["k:{\"containerPort\":80,\"protocol\":\"TCP\"}"])));
    }

    #[test]
    fn decode_rejects_unknown_prefixes() {
        assert!(FieldSet::from_fields_v1(&json!({"x:y": {}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"f:y": 1})).is_err());
    }

    #[test]
    fn display_matches_upstream_spelling() {
        assert_eq!(display(&p(&["f:spec", "f:replicas"])), ".spec.replicas");
        assert_eq!(
            display(&p(&[
                "f:spec",
                "f:containers",
                "k:{\"name\":\"c\"}",
                "f:image"
            ])),
            ".spec.containers[name=\"c\"].image"
        );
        assert_eq!(
            display(&p(&[
                "f:ports",
                "k:{\"containerPort\":80,\"protocol\":\"TCP\"}"
            ])),
            ".ports[containerPort=80,protocol=\"TCP\"]"
        );
        assert_eq!(
            display(&p(&["f:metadata", "f:finalizers", "v:\"a\""])),
            ".metadata.finalizers[=\"a\"]"
        );
    }

    #[test]
    fn set_algebra() {
        let mut a = FieldSet::new();
        a.insert(p(&["f:a"]));
        a.insert(p(&["f:b", "f:c"]));
        let mut b = FieldSet::new();
        b.insert(p(&["f:b"]));
        assert!(a.recursive_difference(&b).contains(&p(&["f:a"])));
        assert!(!a.recursive_difference(&b).contains(&p(&["f:b", "f:c"])));
        assert!(a.has_prefix(&p(&["f:b"])));
        assert!(!a.has_prefix(&p(&["f:z"])));
        assert!(a.with_ancestors().contains(&p(&["f:b"])));
        assert_eq!(a.union(&b).difference(&b), a);
        assert!(a.intersection(&b).is_empty());
    }

    #[test]
    fn in_place_operations_match_the_copying_ones() {
        let paths = [
            p(&[]),
            p(&["f:a"]),
            p(&["f:b"]),
            p(&["f:b", "f:c"]),
            p(&["f:b", "f:c", "f:d"]),
            p(&["f:bb"]),
            p(&["f:b", "k:{\"name\":\"x\"}"]),
        ];
        // every subset of the paths, as bit masks
        let set = |mask: u32| {
            let mut s = FieldSet::new();
            for (i, q) in paths.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    s.insert(q.clone());
                }
            }
            s
        };
        let all = 1u32 << paths.len();
        for ma in (0..all).step_by(3) {
            let a = set(ma);
            for q in &paths {
                assert_eq!(
                    a.covers(q),
                    a.with_ancestors().contains(q),
                    "{a:?} covers {q:?}"
                );
            }
            for mb in (0..all).step_by(5) {
                let b = set(mb);
                let mut d = a.clone();
                d.remove_all(&b);
                assert_eq!(d, a.difference(&b));
                assert_eq!(a.intersects(&b), !a.intersection(&b).is_empty());
            }
        }
        let mut a = set(all - 1);
        a.retain(|q| q.len() == 1);
        assert_eq!(a.iter().count(), 3);
    }
}
