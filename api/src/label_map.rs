//! [`LabelMap`]: a small label map for what kleym holds per binding.
//!
//! Why not `BTreeMap<String, String>` (k8s-openapi's choice): std's B-tree allocates a
//! node for 11 entries on the first insert, about 560 bytes however few labels it holds.
//! Selectors and output labels hold one to three, and kleym keeps several of them per
//! binding (the compiled output, the cached ClusterSPIFFEID), so at 10,000 bindings the
//! empty node slots alone were tens of megabytes. A sorted vector holds exactly its
//! entries, reads in the same order and serialises the same JSON object.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Labels (`key → value`), sorted by key, each key once; serialised as a JSON object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelMap(Vec<(String, String)>);

impl LabelMap {
    /// An empty map.
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).ok().map(|i| self.0[i].1.as_str())
    }

    /// Sets `key` to `value`, returning the value it replaced.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is no label.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A `BTreeMap` with the same entries (for k8s-openapi's `ObjectMeta`).
    pub fn to_btree_map(&self) -> BTreeMap<String, String> {
        self.0.iter().cloned().collect()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

/// Later entries win over earlier ones with the same key, as in a JSON object read into a
/// `BTreeMap`.
impl FromIterator<(String, String)> for LabelMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut entries: Vec<(String, String)> = iter.into_iter().collect();
        // Stable: equal keys keep their input order, so the last of them is the later one.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduped: Vec<(String, String)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match deduped.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => deduped.push(entry),
            }
        }
        deduped.shrink_to_fit();
        Self(deduped)
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for LabelMap {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(iter: I) -> Self {
        iter.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl From<&BTreeMap<String, String>> for LabelMap {
    fn from(map: &BTreeMap<String, String>) -> Self {
        // Already sorted and unique.
        Self(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

impl From<BTreeMap<String, String>> for LabelMap {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map.into_iter().collect())
    }
}

impl<const N: usize> From<[(String, String); N]> for LabelMap {
    fn from(entries: [(String, String); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a LabelMap {
    type Item = (&'a str, &'a str);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, String)>,
        fn(&'a (String, String)) -> (&'a str, &'a str),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl Serialize for LabelMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for LabelMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelMapVisitor;

        impl<'de> Visitor<'de> for LabelMapVisitor {
            type Value = LabelMap;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of label keys to string values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<LabelMap, A::Error> {
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
                while let Some(entry) = access.next_entry::<String, String>()? {
                    entries.push(entry);
                }
                Ok(entries.into_iter().collect())
            }
        }

        deserializer.deserialize_map(LabelMapVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn btree(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_and_writes_the_same_json_as_a_btree_map() {
        for text in [
            r#"{}"#,
            r#"{"app":"model"}"#,
            r#"{"z":"1","a":"2","m":"3"}"#,
            r#"{"a":"first","b":"x","a":"second"}"#,
        ] {
            let compact: LabelMap = serde_json::from_str(text).unwrap();
            let tree: BTreeMap<String, String> = serde_json::from_str(text).unwrap();
            assert_eq!(compact, LabelMap::from(&tree), "{text}");
            assert_eq!(compact.to_btree_map(), tree, "{text}");
            assert_eq!(
                serde_json::to_string(&compact).unwrap(),
                serde_json::to_string(&tree).unwrap(),
                "{text}"
            );
        }
        assert!(serde_json::from_str::<LabelMap>(r#"{"a":1}"#).is_err());
        assert!(serde_json::from_str::<LabelMap>(r#"["a"]"#).is_err());
    }

    #[test]
    fn lookups_inserts_and_order_match_a_btree_map() {
        let pairs = [("b", "2"), ("a", "1"), ("c", "3"), ("a", "4")];
        let mut compact = LabelMap::new();
        let mut tree = BTreeMap::new();
        for (k, v) in pairs {
            assert_eq!(
                compact.insert(k.into(), v.into()),
                tree.insert(k.to_string(), v.to_string())
            );
        }
        assert_eq!(compact.to_btree_map(), tree);
        assert_eq!(compact.get("a"), Some("4"));
        assert_eq!(compact.get("x"), None);
        assert_eq!(compact.len(), 3);
        let keys: Vec<&str> = compact.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        // Built in any order, equal maps compare and hash equal.
        let reversed: LabelMap = pairs.iter().rev().skip(1).copied().collect();
        assert_eq!(
            reversed,
            LabelMap::from(btree(&[("a", "1"), ("b", "2"), ("c", "3")]))
        );
        assert!(LabelMap::new().is_empty());
    }
}
