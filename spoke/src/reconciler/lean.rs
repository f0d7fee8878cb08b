//! Decoding objects without building the `managedFields` the reconciler never reads.
//!
//! The caches drop `metadata.managedFields` on arrival ([`super::trim`]), but decoding it
//! first cost about a tenth of the hub's CPU: every field manager's `FieldsV1` became a
//! tree of `serde_json` maps, only to be freed again. [`Lean<K>`] decodes a `K` whose
//! `managedFields` the parser reduced, while reading them, to what the ownership proof
//! reads ([`crate::ownership::prune_managed_fields`]): per entry the manager, the
//! operation and the subresource, and of its field set only the keys under
//! `f:metadata` → `f:annotations`. Everything else in the field sets is skipped by the
//! parser without being built, and entries that name no annotation are left out (the
//! proof never accepts them).
//!
//! Pruning the lean record gives the same record as pruning the whole one (tested below),
//! so the caches hold exactly what they held before. Only what the reconciler decodes
//! from the API server goes through here: its watches and the objects its writes return.
//!
//! How: `K`'s own `Deserialize` runs against a deserializer that passes everything through
//! but the value of the object's `metadata` key, and inside it the value of
//! `managedFields`, which is read with the lean entry type below and handed to `K`'s
//! visitor as a small JSON value.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// `K`, decoded with its `managedFields` reduced to the ownership proof's record (see the
/// module documentation). Use `Api<Lean<K>>` where the reconciler reads `K`, and `.0`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lean<K>(pub K);

impl<K: kube::Resource> kube::Resource for Lean<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Intercepting {
            inner: deserializer,
            level: Level::Object,
        })
        .map(Lean)
    }
}

/// Which key's value is intercepted: `metadata` in the object, `managedFields` in it.
#[derive(Debug, Clone, Copy)]
enum Level {
    Object,
    Metadata,
}

impl Level {
    fn key(self) -> &'static str {
        match self {
            Level::Object => "metadata",
            Level::Metadata => "managedFields",
        }
    }
}

/// A deserializer that passes everything through, but hands a map's visitor an
/// [`InterceptingMap`].
struct Intercepting<D> {
    inner: D,
    level: Level,
}

/// Methods passed through with the caller's visitor untouched.
macro_rules! pass_through {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

/// Methods whose visitor is wrapped in an [`InterceptingVisitor`] (a map may come).
macro_rules! intercepted {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                let Intercepting { inner, level } = self;
                inner.$method($($arg,)* InterceptingVisitor { inner: visitor, level })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Intercepting<D> {
    type Error = D::Error;

    intercepted! {
        deserialize_any(); deserialize_map();
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
    }

    pass_through! {
        deserialize_bool(); deserialize_i8(); deserialize_i16(); deserialize_i32();
        deserialize_i64(); deserialize_i128(); deserialize_u8(); deserialize_u16();
        deserialize_u32(); deserialize_u64(); deserialize_u128(); deserialize_f32();
        deserialize_f64(); deserialize_char(); deserialize_str(); deserialize_string();
        deserialize_bytes(); deserialize_byte_buf(); deserialize_option(); deserialize_unit();
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_seq(); deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_identifier(); deserialize_ignored_any();
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Wraps the caller's visitor: a map is visited through [`InterceptingMap`]; anything else
/// goes to the caller's visitor as it is (which reports its own type errors).
struct InterceptingVisitor<V> {
    inner: V,
    level: Level,
}

/// `visit_*` methods passed through to the wrapped visitor.
macro_rules! visit_through {
    ($($method:ident($ty:ty);)*) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for InterceptingVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(InterceptingMap {
            inner: map,
            level: self.level,
            matched: false,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_seq(seq)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_newtype_struct(d)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_enum(data)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    visit_through! {
        visit_bool(bool); visit_i64(i64); visit_i128(i128); visit_u64(u64); visit_u128(u128);
        visit_f64(f64); visit_str(&str); visit_borrowed_str(&'de str); visit_string(String);
        visit_bytes(&[u8]); visit_borrowed_bytes(&'de [u8]); visit_byte_buf(Vec<u8>);
    }
}

/// A map whose value under the level's key is intercepted; every other entry passes.
struct InterceptingMap<A> {
    inner: A,
    level: Level,
    // Whether the key just read is the level's key.
    matched: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for InterceptingMap<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        let mut matched = false;
        let key = self.inner.next_key_seed(KeySeed {
            inner: seed,
            target: self.level.key(),
            matched: &mut matched,
        })?;
        self.matched = matched;
        Ok(key)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if !std::mem::take(&mut self.matched) {
            return self.inner.next_value_seed(seed);
        }
        match self.level {
            Level::Object => self.inner.next_value_seed(MetadataSeed(seed)),
            Level::Metadata => {
                let entries: Option<Vec<LeanEntry>> = self.inner.next_value()?;
                let record = lean_record(entries.unwrap_or_default());
                seed.deserialize(record).map_err(de::Error::custom)
            }
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// The `metadata` value, decoded by the caller's seed with `managedFields` intercepted.
struct MetadataSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Intercepting {
            inner: deserializer,
            level: Level::Metadata,
        })
    }
}

/// A map key, decoded by the caller's seed, noting whether it is `target`.
struct KeySeed<'a, S> {
    inner: S,
    target: &'static str,
    matched: &'a mut bool,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Key {
            inner: deserializer,
            target: self.target,
            matched: self.matched,
        })
    }
}

/// The key deserializer: string-like requests see the key through [`KeyVisitor`].
struct Key<'a, D> {
    inner: D,
    target: &'static str,
    matched: &'a mut bool,
}

/// Methods whose visitor is wrapped in a [`KeyVisitor`] (a string key may come).
macro_rules! key_watched {
    ($($method:ident();)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                let Key { inner, target, matched } = self;
                inner.$method(KeyVisitor { inner: visitor, target, matched })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Key<'_, D> {
    type Error = D::Error;

    key_watched! {
        deserialize_any(); deserialize_identifier(); deserialize_str(); deserialize_string();
    }

    pass_through! {
        deserialize_bool(); deserialize_i8(); deserialize_i16(); deserialize_i32();
        deserialize_i64(); deserialize_i128(); deserialize_u8(); deserialize_u16();
        deserialize_u32(); deserialize_u64(); deserialize_u128(); deserialize_f32();
        deserialize_f64(); deserialize_char(); deserialize_bytes(); deserialize_byte_buf();
        deserialize_option(); deserialize_unit(); deserialize_map();
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_seq(); deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_ignored_any();
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Notes whether a string key equals the target, then hands it on.
struct KeyVisitor<'a, V> {
    inner: V,
    target: &'static str,
    matched: &'a mut bool,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for KeyVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        *self.matched = v == self.target;
        self.inner.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        *self.matched = v == self.target;
        self.inner.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        *self.matched = v == self.target;
        self.inner.visit_string(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        *self.matched = v == self.target.as_bytes();
        self.inner.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        *self.matched = v == self.target.as_bytes();
        self.inner.visit_borrowed_bytes(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
        *self.matched = v == self.target.as_bytes();
        self.inner.visit_byte_buf(v)
    }

    visit_through! {
        visit_bool(bool); visit_i64(i64); visit_i128(i128); visit_u64(u64); visit_u128(u128);
        visit_f64(f64);
    }
}

/// One `managedFields` entry, as far as the ownership proof reads it.
#[derive(Debug, Deserialize)]
struct LeanEntry {
    #[serde(default)]
    manager: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default, rename = "fieldsV1")]
    fields_v1: Option<AnnotationKeys>,
}

/// The keys under `f:metadata` → `f:annotations` of a field set (`f:<annotation>`); any
/// other shape is read as none.
#[derive(Debug, Default)]
struct AnnotationKeys(Vec<String>);

/// The path to the annotation keys in a field set.
const ANNOTATIONS_PATH: [&str; 2] = ["f:metadata", "f:annotations"];

impl<'de> Deserialize<'de> for AnnotationKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(FieldSetVisitor { depth: 0 })
            .map(AnnotationKeys)
    }
}

/// Walks `f:metadata` → `f:annotations` and collects the keys there; skips the rest.
struct FieldSetVisitor {
    depth: usize,
}

impl FieldSetVisitor {
    fn none<E>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
}

impl<'de> Visitor<'de> for FieldSetVisitor {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a managedFields field set")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
        let mut keys = Vec::new();
        let Some(step) = ANNOTATIONS_PATH.get(self.depth) else {
            // Under f:annotations: its keys are what we want.
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                keys.push(key);
            }
            return Ok(keys);
        };
        while let Some(key) = map.next_key::<KeyIs>()? {
            if key.is(step) {
                let inner = map.next_value_seed(FieldSetSeed {
                    depth: self.depth + 1,
                })?;
                keys.extend(inner);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(keys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Vec::new())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Vec<String>, E> {
        self.none()
    }

    fn visit_none<E: de::Error>(self) -> Result<Vec<String>, E> {
        self.none()
    }
}

/// A nested field set, one step further down [`ANNOTATIONS_PATH`].
struct FieldSetSeed {
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for FieldSetSeed {
    type Value = Vec<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<String>, D::Error> {
        deserializer.deserialize_any(FieldSetVisitor { depth: self.depth })
    }
}

/// A field-set key, as far as the walk needs it: which step of [`ANNOTATIONS_PATH`] it
/// is, if any (nothing is allocated for the others).
struct KeyIs(Option<&'static str>);

impl KeyIs {
    fn is(&self, step: &str) -> bool {
        self.0 == Some(step)
    }
}

impl<'de> Deserialize<'de> for KeyIs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StepVisitor;
        impl Visitor<'_> for StepVisitor {
            type Value = KeyIs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field-set key")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyIs, E> {
                Ok(KeyIs(ANNOTATIONS_PATH.iter().copied().find(|s| *s == v)))
            }
        }
        deserializer.deserialize_str(StepVisitor)
    }
}

/// The reduced `managedFields` as JSON, for `K`'s own decoder: per entry that names an
/// annotation, its manager, operation, subresource and `f:metadata.f:annotations` keys.
fn lean_record(entries: Vec<LeanEntry>) -> serde_json::Value {
    #[derive(Serialize)]
    struct Entry {
        #[serde(skip_serializing_if = "Option::is_none")]
        manager: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        operation: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        subresource: Option<String>,
        #[serde(rename = "fieldsV1")]
        fields_v1: serde_json::Value,
    }
    let kept: Vec<serde_json::Value> = entries
        .into_iter()
        .filter_map(|e| {
            let keys = e.fields_v1?.0;
            if keys.is_empty() {
                return None;
            }
            let annotations: serde_json::Map<String, serde_json::Value> = keys
                .into_iter()
                .map(|k| (k, serde_json::Value::Object(serde_json::Map::new())))
                .collect();
            let fields_v1 = serde_json::json!({ "f:metadata": { "f:annotations": annotations } });
            serde_json::to_value(Entry {
                manager: e.manager,
                operation: e.operation,
                subresource: e.subresource,
                fields_v1,
            })
            .ok()
        })
        .collect();
    serde_json::Value::Array(kept)
}

/// Decodes a response body or a watch line. Its UTF-8 is checked once, over the whole text:
/// decoding the bytes directly checks every string again as it is read, and those checks
/// were about 2 % of the hub's CPU (docs/benchmarks.md, "What moved the numbers"). Bytes that
/// are not UTF-8 are decoded directly, so the result and its errors are what
/// [`serde_json::from_slice`] gives (it skips unread values without checking them).
pub(crate) fn from_json<T: de::DeserializeOwned>(json: &[u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(json) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::OWNER_ANNOTATION;
    use crate::reconciler::trim::strip_unread_metadata;
    use k8s_openapi::api::core::v1::Namespace;
    use kleym_api::InferenceIdentityBinding;
    use kleym_api::external::spiffeid::ClusterSPIFFEID;
    use kube::Resource;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// The field set kleym's apply owns: labels, the proof annotation and a whole spec.
    fn kleym_fields() -> serde_json::Value {
        json!({
            "f:metadata": {
                "f:annotations": { "f:kleym.io/owner": {} },
                "f:labels": { "f:kleym.io/managed-by": {}, "f:kleym.io/binding-name": {} }
            },
            "f:spec": {
                "f:spiffeIDTemplate": {},
                "f:podSelector": { "f:matchLabels": { "f:app": {}, "f:pool": {} } },
                "f:namespaceSelector": { "f:matchLabels": { "f:kubernetes.io/metadata.name": {} } }
            }
        })
    }

    /// Every kind of entry an API server returns, and some it never does.
    fn managed_fields() -> serde_json::Value {
        json!([
            { "manager": "kleym", "operation": "Apply", "apiVersion": "spire.spiffe.io/v1alpha1",
              "time": "2026-11-26T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": kleym_fields() },
            { "manager": "spire-controller-manager", "operation": "Update", "subresource": "status",
              "fieldsType": "FieldsV1", "fieldsV1": { "f:status": { "f:stats": { ".": {} } } } },
            { "manager": "kubectl-client-side-apply", "operation": "Update",
              "fieldsV1": { "f:metadata": { "f:annotations": {
                  "f:kubectl.kubernetes.io/last-applied-configuration": {} } } } },
            // A status apply naming the proof annotation: never a proof (subresource).
            { "manager": "kleym", "operation": "Apply", "subresource": "status",
              "fieldsV1": { "f:metadata": { "f:annotations": { "f:kleym.io/owner": {} } } } },
            // Another manager claiming the annotation.
            { "manager": "mallory", "operation": "Apply",
              "fieldsV1": { "f:metadata": { "f:annotations": { "f:kleym.io/owner": {},
                  "f:kleym.io/binding-uid": {} }, "f:labels": {} } } },
            // Shapes no API server writes: read as naming nothing.
            { "manager": "odd", "operation": "Apply", "fieldsV1": { "f:metadata": { "f:annotations": "x" } } },
            { "manager": "odd", "operation": "Apply", "fieldsV1": { "f:metadata": [1, 2] } },
            { "manager": "odd", "operation": "Apply", "fieldsV1": null },
            { "manager": "odd", "operation": "Apply" }
        ])
    }

    fn csid(managed_fields: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "spire.spiffe.io/v1alpha1",
            "kind": "ClusterSPIFFEID",
            "metadata": {
                "name": "kleym-team-a-chat-0123456789",
                "uid": "u-1",
                "resourceVersion": "42",
                "labels": { "kleym.io/managed-by": "kleym", "kleym.io/binding-name": "chat" },
                "annotations": { "kleym.io/owner": "team-a/chat",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}" },
                "managedFields": managed_fields
            },
            "spec": {
                "spiffeIDTemplate": "spiffe://td/ns/team-a/sa/chat",
                "podSelector": { "matchLabels": { "app": "chat", "pool": "p" } },
                "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "team-a" } }
            },
            "status": { "stats": { "namespacesSelected": 1, "entriesMasked": 0 } }
        })
    }

    /// Decodes `text` both ways and checks that the caches would hold the same object.
    fn same_as_full<K>(text: &str) -> K
    where
        K: Resource + DeserializeOwned + PartialEq + fmt::Debug,
    {
        let mut full: K = serde_json::from_str(text).expect("full decode");
        let Lean(mut lean) = serde_json::from_str::<Lean<K>>(text).expect("lean decode");
        strip_unread_metadata(&mut full);
        strip_unread_metadata(&mut lean);
        assert_eq!(lean, full);
        lean
    }

    #[test]
    fn caches_hold_the_same_object_as_a_full_decode_and_prune() {
        let text = csid(managed_fields()).to_string();
        let cached: ClusterSPIFFEID = same_as_full(&text);
        // Only kleym's spec apply proves ownership; the status apply and mallory's claim do
        // not change that.
        let managers: Vec<_> = cached
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|e| e.manager.as_deref())
            .collect();
        assert_eq!(managers, ["kleym", "mallory", "mallory"]);
        let kleym = serde_json::to_value(&cached.metadata.managed_fields.unwrap()[0]).unwrap();
        assert_eq!(
            kleym,
            json!({ "manager": "kleym", "operation": "Apply",
                    "fieldsV1": format!("f:{OWNER_ANNOTATION}") })
        );
    }

    #[test]
    fn only_annotation_keys_are_built() {
        let text = csid(managed_fields()).to_string();
        let Lean(lean) = serde_json::from_str::<Lean<ClusterSPIFFEID>>(&text).unwrap();
        let record = serde_json::to_value(&lean.metadata.managed_fields).unwrap();
        // Entries naming no annotation are gone, and of kleym's field set only the
        // annotation is left (no labels, no spec).
        assert_eq!(
            record,
            json!([
                { "manager": "kleym", "operation": "Apply",
                  "fieldsV1": { "f:metadata": { "f:annotations": { "f:kleym.io/owner": {} } } } },
                { "manager": "kubectl-client-side-apply", "operation": "Update",
                  "fieldsV1": { "f:metadata": { "f:annotations": {
                      "f:kubectl.kubernetes.io/last-applied-configuration": {} } } } },
                { "manager": "kleym", "operation": "Apply", "subresource": "status",
                  "fieldsV1": { "f:metadata": { "f:annotations": { "f:kleym.io/owner": {} } } } },
                { "manager": "mallory", "operation": "Apply",
                  "fieldsV1": { "f:metadata": { "f:annotations": { "f:kleym.io/owner": {},
                      "f:kleym.io/binding-uid": {} } } } }
            ])
        );
        // Everything outside managedFields is decoded as usual.
        assert_eq!(
            lean.spec.spiffe_id_template,
            "spiffe://td/ns/team-a/sa/chat"
        );
        assert_eq!(lean.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            lean.status
                .and_then(|s| s.stats)
                .map(|s| s.namespaces_selected),
            Some(1)
        );
    }

    #[test]
    fn escaped_keys_are_recognised() {
        // `metadata` and `managedFields` written with JSON escapes: still intercepted.
        let text = csid(managed_fields())
            .to_string()
            .replacen("\"metadata\"", "\"metad\\u0061ta\"", 1)
            .replacen("\"managedFields\"", "\"managed\\u0046ields\"", 1);
        let Lean(lean) = serde_json::from_str::<Lean<ClusterSPIFFEID>>(&text).unwrap();
        let record = serde_json::to_string(&lean.metadata.managed_fields).unwrap();
        assert!(!record.contains("f:spec"), "{record}");
        assert!(record.contains("f:kleym.io/owner"), "{record}");
        let _: ClusterSPIFFEID = same_as_full(&text);
    }

    #[test]
    fn absent_empty_and_null_managed_fields_decode() {
        for mf in [json!(null), json!([])] {
            let _: ClusterSPIFFEID = same_as_full(&csid(mf).to_string());
        }
        let mut no_mf = csid(json!([]));
        no_mf["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        let _: ClusterSPIFFEID = same_as_full(&no_mf.to_string());
    }

    #[test]
    fn bindings_namespaces_and_watch_events_decode_lean() {
        let binding = json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "InferenceIdentityBinding",
            "metadata": { "name": "chat", "namespace": "team-a", "resourceVersion": "7",
                "finalizers": ["kleym.io/cleanup"], "managedFields": managed_fields() },
            "spec": { "targetRef": { "kind": "InferenceObjective", "name": "chat" },
                      "workloadSelectorTemplates": ["k8s:ns:team-a", "k8s:sa:chat"] }
        });
        let _: InferenceIdentityBinding = same_as_full(&binding.to_string());
        let namespace = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": "team-a", "labels": { "kubernetes.io/metadata.name": "team-a" },
                "managedFields": managed_fields() }
        });
        let _: Namespace = same_as_full(&namespace.to_string());

        let event = json!({ "type": "MODIFIED", "object": csid(managed_fields()) }).to_string();
        let kube::core::WatchEvent::Modified(Lean(obj)) =
            serde_json::from_str::<kube::core::WatchEvent<Lean<ClusterSPIFFEID>>>(&event).unwrap()
        else {
            panic!("not a MODIFIED event");
        };
        assert!(
            !serde_json::to_string(&obj.metadata)
                .unwrap()
                .contains("f:spec")
        );
    }

    #[test]
    fn type_errors_are_still_errors() {
        let mut bad = csid(managed_fields());
        bad["spec"]["spiffeIDTemplate"] = json!(3);
        assert!(serde_json::from_str::<Lean<ClusterSPIFFEID>>(&bad.to_string()).is_err());
        let mut bad = csid(managed_fields());
        bad["metadata"]["resourceVersion"] = json!([]);
        assert!(serde_json::from_str::<Lean<ClusterSPIFFEID>>(&bad.to_string()).is_err());
        let bad = csid(json!([{ "manager": 5, "operation": "Apply" }]));
        assert!(serde_json::from_str::<Lean<ClusterSPIFFEID>>(&bad.to_string()).is_err());
        assert!(serde_json::from_str::<Lean<ClusterSPIFFEID>>("[]").is_err());
    }

    #[test]
    fn from_json_reads_text_and_bytes_that_are_not_utf8_alike() {
        let text = r#"{"name":"caf\u00e9","skipped":"x"}"#;
        let decoded: serde_json::Value = from_json(text.as_bytes()).unwrap();
        assert_eq!(decoded["name"], "café");
        // Invalid UTF-8 in a value nobody reads: decoded as from_slice decodes it.
        let mut bytes = br#"{"name":"a","skipped":""#.to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        bytes.extend_from_slice(br#""}"#);
        #[derive(Deserialize)]
        struct Named {
            name: String,
        }
        let named: Named = from_json(&bytes).unwrap();
        assert_eq!(named.name, "a");
        // ... and in a value that is read: the same error as from_slice.
        let mut bytes = br#"{"name":""#.to_vec();
        bytes.extend_from_slice(&[0xff]);
        bytes.extend_from_slice(br#""}"#);
        let ours = from_json::<Named>(&bytes).err().map(|e| e.to_string());
        let theirs = serde_json::from_slice::<Named>(&bytes)
            .err()
            .map(|e| e.to_string());
        assert!(ours.is_some());
        assert_eq!(ours, theirs);
    }
}
