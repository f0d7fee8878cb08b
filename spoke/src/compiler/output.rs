//! The generated ClusterSPIFFEID: deterministic name, labels and spec.
//!
//! **Name** (stable across kleym versions; changing it would orphan objects):
//! `kleym-<namespace>-<binding>-<hash>`, where `<hash>` is the first 10 hex digits of
//! SHA-256 over `<namespace>/<binding>`. The `kleym-<namespace>-<binding>` part is
//! sanitised to DNS-1123 and truncated so the whole name is at most 253 characters; the
//! hash keeps names unique when `-` joins are ambiguous (`a-b`/`c` vs `a`/`b-c`) or when
//! truncation applies. The name depends only on the binding's identity, so editing the
//! binding's spec updates the object in place instead of replacing it.

use kleym_api::external::spiffeid::{ClusterSPIFFEIDSpec, LabelSelector};
use kleym_api::label_map::LabelMap;
use kleym_api::labels;
use sha2::{Digest, Sha256};

/// Maximum length of a cluster-scoped object name (DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;
/// Maximum length of a label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;
/// Hex digits of the name hash.
const HASH_HEX: usize = 10;
/// Namespace label every namespace carries (set by the apiserver).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What to apply for one binding: the spec. Its name ([`cluster_spiffe_id_name`]) and
/// labels ([`output_labels`]) are functions of the binding's namespace and name, so they
/// are derived when applied (`CompiledIdentity::output_name`, `output_labels`), not
/// stored: a hub keeps one compiled identity per binding of every spoke, and the two held
/// about 370 bytes of heap each, more than the rest of the output's strings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpiffeIdOutput {
    /// The spec.
    pub spec: ClusterSPIFFEIDSpec,
}

fn short_hash(input: &str) -> String {
    hash_hex(&Sha256::digest(input.as_bytes()))
}

/// The first [`HASH_HEX`] hex digits of `digest`.
fn hash_hex(digest: &[u8]) -> String {
    let mut hex = hex::encode(&digest[..HASH_HEX.div_ceil(2)]);
    hex.truncate(HASH_HEX);
    hex
}

/// Lowercase, map characters outside `[a-z0-9.-]` to `-`, and trim each dot-separated
/// label to start and end alphanumeric (dropping empty labels).
fn sanitize_subdomain(s: &str) -> String {
    if is_sanitized(s) {
        return s.to_string();
    }
    map_to_subdomain(s)
}

/// The mapping [`sanitize_subdomain`] describes, done in full.
fn map_to_subdomain(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped
        .split('.')
        .map(|l| l.trim_matches('-'))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

/// Would [`sanitize_subdomain`] return `s` unchanged? True for every name made of a
/// namespace and a binding name the API server accepted (DNS labels and subdomains), so
/// the reconciler, which derives each output's name several times per reconcile, mostly
/// skips the mapping and its three allocations.
fn is_sanitized(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    s.bytes().all(|b| alnum(b) || b == b'.' || b == b'-')
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            matches!((bytes.first(), bytes.last()), (Some(&a), Some(&z)) if alnum(a) && alnum(z))
        })
}

/// The deterministic ClusterSPIFFEID name of binding `namespace/binding` (see the module
/// documentation). Always a valid DNS-1123 subdomain of at most 253 characters.
pub fn cluster_spiffe_id_name(namespace: &str, binding: &str) -> String {
    // SHA-256 over `<namespace>/<binding>`, fed in parts rather than formatted first.
    let digest = Sha256::new()
        .chain_update(namespace.as_bytes())
        .chain_update(b"/")
        .chain_update(binding.as_bytes())
        .finalize();
    let hash = hash_hex(&digest);
    let max_base = MAX_NAME_LEN - 1 - HASH_HEX;
    let mut base = sanitize_subdomain(&format!("kleym-{namespace}-{binding}"));
    if base.len() > max_base {
        base.truncate(max_base);
        base = sanitize_subdomain(&base);
    }
    base.reserve_exact(1 + HASH_HEX);
    base.push('-');
    base.push_str(&hash);
    base
}

/// A label value for `value`: itself when valid, else a truncated prefix plus a hash.
pub fn label_value(value: &str) -> String {
    let valid = value.len() <= MAX_LABEL_VALUE_LEN && super::selectors::is_label_value(value);
    if valid {
        return value.to_string();
    }
    let hash = short_hash(value);
    let keep = MAX_LABEL_VALUE_LEN - 1 - HASH_HEX;
    let prefix: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(keep)
        .collect();
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The labels kleym puts on a binding's ClusterSPIFFEID. They are for finding objects,
/// not for ownership (ownership is the UID recorded in the binding's status).
pub fn output_labels(namespace: &str, binding: &str) -> LabelMap {
    LabelMap::from([
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (
            labels::BINDING_NAMESPACE.to_string(),
            label_value(namespace),
        ),
        (labels::BINDING_NAME.to_string(), label_value(binding)),
    ])
}

/// The parts of the spec that vary per binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecParts {
    /// The literal SPIFFE ID.
    pub spiffe_id: String,
    /// The binding's namespace.
    pub namespace: String,
    /// The pool's `matchLabels`.
    pub pool_labels: LabelMap,
    /// Sorted, de-duplicated workload selectors.
    pub selectors: Vec<String>,
    /// Rendered DNS names (sorted, de-duplicated).
    pub dns_names: Vec<String>,
    /// X.509-SVID TTL.
    pub ttl: Option<String>,
    /// JWT-SVID TTL.
    pub jwt_ttl: Option<String>,
    /// Federated trust domains (sorted, de-duplicated).
    pub federates_with: Vec<String>,
    /// SPIRE Controller Manager class.
    pub class_name: Option<String>,
    /// Entry hint (the objective or pool name).
    pub hint: String,
}

/// Build the ClusterSPIFFEID spec. Selection is confined twice: `namespaceSelector` pins
/// the namespace by its immutable name label, and `k8s:ns:` is among the selectors.
pub fn cluster_spiffe_id_spec(parts: SpecParts) -> ClusterSPIFFEIDSpec {
    let non_empty = |v: Vec<String>| (!v.is_empty()).then_some(v);
    ClusterSPIFFEIDSpec {
        spiffe_id_template: parts.spiffe_id,
        namespace_selector: Some(LabelSelector {
            match_labels: Some(LabelMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                parts.namespace,
            )])),
            match_expressions: None,
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(parts.pool_labels),
            match_expressions: None,
        }),
        workload_selector_templates: Some(parts.selectors),
        dns_name_templates: non_empty(parts.dns_names),
        ttl: parts.ttl,
        jwt_ttl: parts.jwt_ttl,
        federates_with: non_empty(parts.federates_with),
        admin: None,
        downstream: None,
        auto_populate_dns_names: None,
        class_name: parts.class_name,
        fallback: Some(false),
        hint: Some(parts.hint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::selectors::{is_dns1123_subdomain, is_label_value};

    #[test]
    fn name_is_readable_stable_and_valid() {
        let n = cluster_spiffe_id_name("team-a", "chat");
        assert!(n.starts_with("kleym-team-a-chat-"), "{n}");
        assert_eq!(n.len(), "kleym-team-a-chat-".len() + HASH_HEX);
        assert!(is_dns1123_subdomain(&n));
        // Stability across versions: this exact value must never change.
        assert_eq!(
            n,
            format!("kleym-team-a-chat-{}", short_hash("team-a/chat"))
        );
        assert_eq!(short_hash("team-a/chat").len(), HASH_HEX);
    }

    #[test]
    fn skipping_the_mapping_changes_no_name() {
        // Every string over an alphabet with each kind of character the mapping treats
        // differently, up to length 5: the shortcut is taken only where the mapping is the
        // identity, and names are what they were.
        let alphabet = ['a', 'Z', '0', '-', '.', '_', 'é'];
        let mut words = vec![String::new()];
        for _ in 0..5 {
            let longer: Vec<String> = words
                .iter()
                .filter(|w| w.chars().count() == words.last().map_or(0, |l| l.chars().count()))
                .flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}")))
                .collect();
            words.extend(longer);
        }
        let mut shortcut = 0;
        for w in &words {
            assert_eq!(sanitize_subdomain(w), map_to_subdomain(w), "{w:?}");
            shortcut += usize::from(is_sanitized(w));
        }
        assert!(shortcut > 100, "the shortcut was taken {shortcut} times");
        for (ns, b) in [
            ("team-a", "chat"),
            ("a", "b.c-d"),
            ("x", "Upper_case"),
            ("n", "-.-"),
        ] {
            let old = format!(
                "{}-{}",
                map_to_subdomain(&format!("kleym-{ns}-{b}")),
                short_hash(&format!("{ns}/{b}"))
            );
            assert_eq!(cluster_spiffe_id_name(ns, b), old, "{ns}/{b}");
        }
    }

    #[test]
    fn ambiguous_joins_get_different_names() {
        assert_ne!(
            cluster_spiffe_id_name("a-b", "c"),
            cluster_spiffe_id_name("a", "b-c")
        );
    }

    #[test]
    fn long_names_are_truncated_to_a_valid_subdomain() {
        let ns = "n".repeat(63);
        for binding in [
            "b".repeat(253),
            format!("{}.{}", "x".repeat(180), "y".repeat(60)),
            format!("{}-.{}", "x".repeat(185), "y".repeat(60)),
        ] {
            let n = cluster_spiffe_id_name(&ns, &binding);
            assert!(n.len() <= MAX_NAME_LEN, "{}", n.len());
            assert!(is_dns1123_subdomain(&n), "{n}");
        }
        let a = cluster_spiffe_id_name(&ns, &format!("{}1", "b".repeat(252)));
        let b = cluster_spiffe_id_name(&ns, &format!("{}2", "b".repeat(252)));
        assert_ne!(a, b, "truncated names stay unique through the hash");
    }

    #[test]
    fn label_values_fit() {
        assert_eq!(label_value("chat"), "chat");
        let long = "a.".repeat(100) + "z";
        let v = label_value(&long);
        assert!(v.len() <= MAX_LABEL_VALUE_LEN && is_label_value(&v), "{v}");
        assert_ne!(label_value(&long), label_value(&(long.clone() + "q")));
    }
}
