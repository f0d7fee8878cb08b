//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! client-go's generated clients for built-in kinds always send protobuf (kubectl's
//! `create configmap|secret|serviceaccount|namespace|role|rolebinding|clusterrole|
//! clusterrolebinding`, `create token`, `auth can-i` do), and they do not fall back to JSON
//! on `415`. kubesim therefore decodes protobuf bodies of those kinds into the JSON the store
//! understands. Decoding is table-driven from the field numbers of the upstream
//! `generated.proto` files, for exactly the kinds listed in [`schema_for`]; any other kind
//! gets `415` naming it. Responses are always JSON (every client-go client accepts JSON).
//!
//! Like Go's JSON encoding with `omitempty`, empty strings, zero numbers, `false` and empty
//! lists/maps are left out, and a zero `metav1.Time` becomes absent.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

/// The 4-byte prefix of every Kubernetes protobuf message.
pub const MAGIC: &[u8] = b"k8s\0";

/// Field types in the tables below.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bool,
    Int,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
    MapStrList,
    Time,
}

#[derive(Clone, Copy)]
struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
    repeated: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
    }
}

const fn r(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: true,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "controller", Ty::Bool),
    f(7, "blockOwnerDeletion", Ty::Bool),
];

const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(5, "uid", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "generation", Ty::Int),
    f(8, "creationTimestamp", Ty::Time),
    f(9, "deletionTimestamp", Ty::Time),
    f(10, "deletionGracePeriodSeconds", Ty::Int),
    f(11, "labels", Ty::MapStr),
    f(12, "annotations", Ty::MapStr),
    r(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    r(14, "finalizers", Ty::Str),
];

const OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "namespace", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "fieldPath", Ty::Str),
];

const LOCAL_OBJECT_REFERENCE: &[Field] = &[f(1, "name", Ty::Str)];

const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapStr),
    f(3, "binaryData", Ty::MapBytes),
    f(4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapBytes),
    f(3, "type", Ty::Str),
    f(4, "stringData", Ty::MapStr),
    f(5, "immutable", Ty::Bool),
];

const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "secrets", Ty::Msg(OBJECT_REFERENCE)),
    r(3, "imagePullSecrets", Ty::Msg(LOCAL_OBJECT_REFERENCE)),
    f(4, "automountServiceAccountToken", Ty::Bool),
];

const NAMESPACE_SPEC: &[Field] = &[r(1, "finalizers", Ty::Str)];

const NAMESPACE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(NAMESPACE_SPEC)),
];

const POLICY_RULE: &[Field] = &[
    r(1, "verbs", Ty::Str),
    r(2, "apiGroups", Ty::Str),
    r(3, "resources", Ty::Str),
    r(4, "resourceNames", Ty::Str),
    r(5, "nonResourceURLs", Ty::Str),
];

const LABEL_SELECTOR_REQUIREMENT: &[Field] = &[
    f(1, "key", Ty::Str),
    f(2, "operator", Ty::Str),
    r(3, "values", Ty::Str),
];

const LABEL_SELECTOR: &[Field] = &[
    f(1, "matchLabels", Ty::MapStr),
    r(2, "matchExpressions", Ty::Msg(LABEL_SELECTOR_REQUIREMENT)),
];

const AGGREGATION_RULE: &[Field] = &[r(1, "clusterRoleSelectors", Ty::Msg(LABEL_SELECTOR))];

const ROLE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "rules", Ty::Msg(POLICY_RULE)),
];

const CLUSTER_ROLE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "rules", Ty::Msg(POLICY_RULE)),
    f(3, "aggregationRule", Ty::Msg(AGGREGATION_RULE)),
];

const SUBJECT: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "apiGroup", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "namespace", Ty::Str),
];

const ROLE_REF: &[Field] = &[
    f(1, "apiGroup", Ty::Str),
    f(2, "kind", Ty::Str),
    f(3, "name", Ty::Str),
];

const BINDING: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "subjects", Ty::Msg(SUBJECT)),
    f(3, "roleRef", Ty::Msg(ROLE_REF)),
];

const BOUND_OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "apiVersion", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
];

const TOKEN_REQUEST_SPEC: &[Field] = &[
    r(1, "audiences", Ty::Str),
    f(3, "boundObjectRef", Ty::Msg(BOUND_OBJECT_REFERENCE)),
    f(4, "expirationSeconds", Ty::Int),
];

const TOKEN_REQUEST: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(TOKEN_REQUEST_SPEC)),
];

const TOKEN_REVIEW_SPEC: &[Field] = &[f(1, "token", Ty::Str), r(2, "audiences", Ty::Str)];

const TOKEN_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(TOKEN_REVIEW_SPEC)),
];

const RESOURCE_ATTRIBUTES: &[Field] = &[
    f(1, "namespace", Ty::Str),
    f(2, "verb", Ty::Str),
    f(3, "group", Ty::Str),
    f(4, "version", Ty::Str),
    f(5, "resource", Ty::Str),
    f(6, "subresource", Ty::Str),
    f(7, "name", Ty::Str),
];

const NON_RESOURCE_ATTRIBUTES: &[Field] = &[f(1, "path", Ty::Str), f(2, "verb", Ty::Str)];

const SELF_SAR_SPEC: &[Field] = &[
    f(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
    f(2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
];

const SAR_SPEC: &[Field] = &[
    f(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
    f(2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
    f(3, "user", Ty::Str),
    r(4, "groups", Ty::Str),
    f(5, "extra", Ty::MapStrList),
    f(6, "uid", Ty::Str),
];

const SELF_SAR: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(SELF_SAR_SPEC)),
];

const SAR: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(SAR_SPEC)),
];

/// The table for a top-level kind, if kubesim decodes it.
fn schema_for(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Namespace") => NAMESPACE,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => BINDING,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("authentication.k8s.io/v1", "TokenReview") => TOKEN_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SAR,
        ("authorization.k8s.io/v1", "SubjectAccessReview" | "LocalSubjectAccessReview") => SAR,
        _ => return None,
    })
}

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    /// Not a Kubernetes protobuf envelope.
    #[error("not a Kubernetes protobuf message (missing the k8s\\0 prefix)")]
    NoMagic,
    /// Malformed wire data.
    #[error("malformed protobuf: {0}")]
    Malformed(&'static str),
    /// A kind kubesim does not decode from protobuf.
    #[error("kubesim does not decode protobuf bodies of {0}; send JSON")]
    UnsupportedKind(String),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or(ProtobufError::Malformed("truncated varint"))?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(ProtobufError::Malformed("varint too long"))
    }
    fn bytes(&mut self) -> Result<&'a [u8], ProtobufError> {
        let len = usize::try_from(self.varint()?)
            .map_err(|_| ProtobufError::Malformed("length overflow"))?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|e| *e <= self.buf.len())
            .ok_or(ProtobufError::Malformed("truncated field"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn skip(&mut self, wire: u64) -> Result<(), ProtobufError> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.advance(8),
            2 => self.bytes().map(|_| ()),
            5 => self.advance(4),
            _ => Err(ProtobufError::Malformed("unsupported wire type")),
        }
    }
    fn advance(&mut self, n: usize) -> Result<(), ProtobufError> {
        if self.pos + n > self.buf.len() {
            return Err(ProtobufError::Malformed("truncated fixed field"));
        }
        self.pos += n;
        Ok(())
    }
}

fn utf8(b: &[u8]) -> Result<String, ProtobufError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtobufError::Malformed("invalid UTF-8"))
}

/// Decode a map entry message (key = 1, value = 2).
fn map_entry(b: &[u8]) -> Result<(String, &[u8]), ProtobufError> {
    let mut rd = Reader::new(b);
    let (mut key, mut value): (String, &[u8]) = (String::new(), &[]);
    while !rd.done() {
        let tag = rd.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => key = utf8(rd.bytes()?)?,
            (2, 2) => value = rd.bytes()?,
            (_, w) => rd.skip(w)?,
        }
    }
    Ok((key, value))
}

fn time(b: &[u8]) -> Result<Value, ProtobufError> {
    let mut rd = Reader::new(b);
    let (mut secs, mut nanos) = (0i64, 0u32);
    while !rd.done() {
        let tag = rd.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 0) => secs = rd.varint()? as i64,
            (2, 0) => nanos = u32::try_from(rd.varint()?).unwrap_or(0),
            (_, w) => rd.skip(w)?,
        }
    }
    // Go's zero time (year 1) and an empty message both mean "unset".
    if secs == 0 && nanos == 0 || secs == -62_135_596_800 {
        return Ok(Value::Null);
    }
    Ok(chrono::DateTime::from_timestamp(secs, nanos)
        .map(|t| json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
        .unwrap_or(Value::Null))
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_i64() == Some(0),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn message(b: &[u8], schema: &[Field]) -> Result<Value, ProtobufError> {
    let mut rd = Reader::new(b);
    let mut out = Map::new();
    while !rd.done() {
        let tag = rd.varint()?;
        let (num, wire) = (tag >> 3, tag & 7);
        let Some(field) = schema.iter().find(|fl| fl.num == num) else {
            rd.skip(wire)?;
            continue;
        };
        let value = match (field.ty, wire) {
            (Ty::Bool, 0) => json!(rd.varint()? != 0),
            (Ty::Int, 0) => json!(rd.varint()? as i64),
            (Ty::Str, 2) => json!(utf8(rd.bytes()?)?),
            (Ty::Msg(s), 2) => message(rd.bytes()?, s)?,
            (Ty::Time, 2) => time(rd.bytes()?)?,
            (Ty::MapStr | Ty::MapBytes | Ty::MapStrList, 2) => {
                let (k, v) = map_entry(rd.bytes()?)?;
                let v = match field.ty {
                    Ty::MapStr => json!(utf8(v)?),
                    Ty::MapBytes => json!(STANDARD.encode(v)),
                    _ => message(v, &[r(1, "items", Ty::Str)])?
                        .get("items")
                        .cloned()
                        .unwrap_or(json!([])),
                };
                let entry = out
                    .entry(field.name)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(m) = entry.as_object_mut() {
                    m.insert(k, v);
                }
                continue;
            }
            _ => {
                rd.skip(wire)?;
                continue;
            }
        };
        if field.repeated {
            let entry = out.entry(field.name).or_insert_with(|| json!([]));
            if let Some(a) = entry.as_array_mut() {
                a.push(value);
            }
        } else if is_empty(&value) && !matches!(field.ty, Ty::Msg(_)) {
            out.remove(field.name);
        } else {
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}

/// Decode a Kubernetes protobuf body (`k8s\0` + `runtime.Unknown`) into JSON with
/// `apiVersion` and `kind`.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let mut rd = Reader::new(rest);
    let (mut api_version, mut kind, mut raw): (String, String, &[u8]) =
        (String::new(), String::new(), &[]);
    while !rd.done() {
        let tag = rd.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => {
                let tm = message(
                    rd.bytes()?,
                    &[f(1, "apiVersion", Ty::Str), f(2, "kind", Ty::Str)],
                )?;
                api_version = tm["apiVersion"].as_str().unwrap_or("").to_string();
                kind = tm["kind"].as_str().unwrap_or("").to_string();
            }
            (2, 2) => raw = rd.bytes()?,
            (_, w) => rd.skip(w)?,
        }
    }
    let schema = schema_for(&api_version, &kind)
        .ok_or_else(|| ProtobufError::UnsupportedKind(format!("{api_version} {kind}")))?;
    let mut v = message(raw, schema)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(kind));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn bytes_field(num: u64, data: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | 2, out);
        varint(data.len() as u64, out);
        out.extend_from_slice(data);
    }
    fn varint_field(num: u64, v: u64, out: &mut Vec<u8>) {
        varint(num << 3, out);
        varint(v, out);
    }
    fn entry(k: &str, v: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        bytes_field(1, k.as_bytes(), &mut e);
        bytes_field(2, v, &mut e);
        e
    }
    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        bytes_field(1, api_version.as_bytes(), &mut tm);
        bytes_field(2, kind.as_bytes(), &mut tm);
        let mut out = MAGIC.to_vec();
        bytes_field(1, &tm, &mut out);
        bytes_field(2, raw, &mut out);
        out
    }

    #[test]
    fn config_map_as_go_encodes_it() {
        let mut meta = Vec::new();
        bytes_field(1, b"settings", &mut meta);
        bytes_field(2, b"", &mut meta); // Go writes empty strings
        bytes_field(3, b"default", &mut meta);
        bytes_field(8, b"", &mut meta); // zero creationTimestamp
        bytes_field(11, &entry("app", b"web"), &mut meta);
        let mut cm = Vec::new();
        bytes_field(1, &meta, &mut cm);
        bytes_field(2, &entry("a", b"1"), &mut cm);
        bytes_field(2, &entry("b", b""), &mut cm);
        bytes_field(3, &entry("bin", &[0, 1, 2]), &mut cm);
        let v = decode(&envelope("v1", "ConfigMap", &cm)).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": "default", "labels": {"app": "web"}},
                "data": {"a": "1", "b": ""},
                "binaryData": {"bin": "AAEC"},
            })
        );
    }

    #[test]
    fn token_request_and_access_review() {
        let mut spec = Vec::new();
        bytes_field(1, b"https://hub", &mut spec);
        varint_field(4, 600, &mut spec);
        let mut tr = Vec::new();
        bytes_field(1, &[], &mut tr);
        bytes_field(2, &spec, &mut tr);
        let v = decode(&envelope("authentication.k8s.io/v1", "TokenRequest", &tr)).unwrap();
        assert_eq!(v["spec"]["audiences"], json!(["https://hub"]));
        assert_eq!(v["spec"]["expirationSeconds"], 600);

        let mut ra = Vec::new();
        bytes_field(1, b"default", &mut ra);
        bytes_field(2, b"list", &mut ra);
        bytes_field(5, b"configmaps", &mut ra);
        let mut s = Vec::new();
        bytes_field(1, &ra, &mut s);
        let mut ssar = Vec::new();
        bytes_field(2, &s, &mut ssar);
        let v = decode(&envelope(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            &ssar,
        ))
        .unwrap();
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "default", "verb": "list", "resource": "configmaps"})
        );
    }

    #[test]
    fn rejects_unknown_kinds_and_garbage() {
        assert_eq!(decode(b"{}"), Err(ProtobufError::NoMagic));
        assert!(matches!(
            decode(&envelope("v1", "Pod", &[])),
            Err(ProtobufError::UnsupportedKind(_))
        ));
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&[0x0a, 0x10, 0x01]);
        assert!(matches!(decode(&bad), Err(ProtobufError::Malformed(_))));
    }
}
