//! How kubesim reads and writes YAML: `serde-saphyr` (the YAML crate `kube` links) with the
//! YAML 1.2 reading Kubernetes clients expect: only `true`/`false` are booleans, `0755` and
//! `1_000` are strings, a duplicate key is an error, errors name line and column only (never
//! an input excerpt). Writes use one stable style: multi-line strings as `|` blocks, long
//! lines never folded.

use serde::Serialize;
use serde::de::DeserializeOwned;

fn parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
    }
}

fn emit_options() -> serde_saphyr::SerializerOptions {
    serde_saphyr::ser_options! {
        prefer_block_scalars: true,
        folded_wrap_chars: usize::MAX,
    }
}

/// Reads one YAML document. More than one document is an error.
pub(crate) fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, parse_options())
}

/// Reads a stream of YAML documents (separated by `---`); empty documents are skipped.
pub(crate) fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, serde_saphyr::Error> {
    serde_saphyr::from_multiple_with_options(text, parse_options())
}

/// Writes one value as a YAML document (no leading `---`, ending in a newline).
pub(crate) fn to_string<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string_with_options(value, emit_options())
}
