//! Serde helpers for Go `metav1.Duration` strings.
//!
//! Go clients that write a typed ClusterSPIFFEID always send `ttl: "0s"` (a struct field
//! is never omitted by `encoding/json`), and SPIRE treats zero as "server default". We read
//! any zero duration as unset so that such objects compare equal to ours.

use serde::{Deserialize, Deserializer};

/// Deserialize an optional Go duration string, mapping zero durations to `None`.
pub(crate) fn zero_as_none<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw: Option<String> = Option::deserialize(deserializer)?;
    Ok(raw.filter(|s| !is_zero(s)))
}

/// Whether a Go duration string denotes zero (`0`, `0s`, `0m0s`, `0h0m0.000s`, …).
pub(crate) fn is_zero(s: &str) -> bool {
    let t = s.trim();
    if t.is_empty() {
        return true;
    }
    match t.parse::<kube::core::Duration>() {
        Ok(d) => std::time::Duration::from(d).is_zero(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_zero;

    #[test]
    fn zero_forms() {
        for z in ["0", "0s", "0m0s", "0h0m0s", "0.000s", ""] {
            assert!(is_zero(z), "{z} should be zero");
        }
        for nz in ["1s", "1h", "90m", "1h0m0s", "bogus"] {
            assert!(!is_zero(nz), "{nz} should not be zero");
        }
    }
}
