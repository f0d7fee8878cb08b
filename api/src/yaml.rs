//! How kleym reads and writes YAML: with `serde-saphyr`, the YAML crate `kube` itself links
//! (kubeconfigs, exec-plugin output), so the binary carries one YAML implementation.
//!
//! Every YAML kleym reads goes through [`from_str`], [`from_slice`] or [`documents`], which
//! keep the YAML 1.2 reading kleym has always had (and that JSON users expect):
//!
//! - only `true`/`false` (any case) are booleans; `yes`, `no`, `on`, `off`, `y`, `n` are
//!   strings;
//! - `0755` and `1_000` are strings, not numbers;
//! - a key given twice in one mapping is an error, never a silent overwrite;
//! - `<<` merge keys are expanded, as Kubernetes' own YAML reading does;
//! - errors name the line and column only, never a snippet of the input (plugin output and
//!   provider files can hold credentials).
//!
//! [`to_string`] writes YAML in one stable style (that of the chart's CRD files): two-space
//! indentation, sequences not indented under their key, multi-line strings as `|` blocks,
//! long single-line strings never folded, strings that read as another type double-quoted.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A YAML reading error (line and column, no input excerpt).
pub type ParseError = serde_saphyr::Error;
/// A YAML writing error.
pub type EmitError = serde_saphyr::SerializeError;

/// The options every read uses (see the module documentation).
pub fn parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
    }
}

/// The options every write uses (see the module documentation).
pub fn emit_options() -> serde_saphyr::SerializerOptions {
    serde_saphyr::ser_options! {
        // Multi-line strings as `|` blocks, but never fold a long line into a `>` block.
        prefer_block_scalars: true,
        folded_wrap_chars: usize::MAX,
    }
}

/// Reads one YAML document. More than one document is an error.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    serde_saphyr::from_str_with_options(text, parse_options())
}

/// [`from_str`] on bytes, which must be UTF-8.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ParseError> {
    serde_saphyr::from_slice_with_options(bytes, parse_options())
}

/// Reads a stream of YAML documents (separated by `---`), in order. Empty documents (and
/// documents that are just `null`) are skipped.
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, ParseError> {
    serde_saphyr::from_multiple_with_options(text, parse_options())
}

/// Writes one value as a YAML document (no leading `---`, ending in a newline).
pub fn to_string<T: Serialize>(value: &T) -> Result<String, EmitError> {
    serde_saphyr::to_string_with_options(value, emit_options())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn read(text: &str) -> Value {
        from_str(text).unwrap()
    }

    #[test]
    fn yaml_1_1_spellings_stay_strings() {
        assert_eq!(
            read("a: yes\nb: on\nc: n\nd: Off\ne: 0755\nf: 1_000\ng: 2001-12-14\n"),
            json!({"a": "yes", "b": "on", "c": "n", "d": "Off", "e": "0755", "f": "1_000",
                   "g": "2001-12-14"})
        );
        assert_eq!(
            read("a: true\nb: False\nc: 0x1F\nd: 0o17\ne: 1.5\nf: ~\n"),
            json!({"a": true, "b": false, "c": 31, "d": 15, "e": 1.5, "f": null})
        );
        #[derive(Debug, serde::Deserialize)]
        struct Flag {
            #[allow(dead_code)]
            on: bool,
        }
        assert!(from_str::<Flag>("on: yes").is_err());
        assert!(from_str::<Flag>("on: true").is_ok());
    }

    #[test]
    fn duplicate_keys_are_an_error() {
        let err = from_str::<Value>("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        assert_eq!(
            read("base: &b {x: 1}\nlist: &l [1, 2]\nd:\n  <<: *b\n  y: 2\ne: *l\n"),
            json!({"base": {"x": 1}, "list": [1, 2], "d": {"x": 1, "y": 2}, "e": [1, 2]})
        );
    }

    #[test]
    fn numbers_outside_json_and_i64_range() {
        // u64 is kept exactly; beyond it, integers become (lossy) floats, as Go's YAML-to-JSON
        // reading does; non-finite floats have no JSON form and are refused.
        assert_eq!(
            read("a: 18446744073709551615"),
            json!({"a": 18446744073709551615u64})
        );
        assert!(read("a: 18446744073709551616")["a"].is_f64());
        for text in ["a: .inf", "a: .nan", "a: 1e400"] {
            assert!(from_str::<Value>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn errors_hold_no_input_excerpt() {
        let secret = "swordfishcorrecthorse";
        for text in [
            format!("token: {secret}\n  bad: indent\n"),
            format!("token: {secret}\ntoken: {secret}\n"),
            format!("[{secret}"),
        ] {
            let err = from_str::<Value>(&text).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("swordfish"), "{text:?}: {shown}");
            assert!(shown.contains("line"), "{text:?}: {shown}");
        }
    }

    #[test]
    fn one_document_or_a_stream() {
        assert!(from_str::<Value>("a: 1\n---\nb: 2\n").is_err());
        assert_eq!(read("---\na: 1\n"), json!({"a": 1}));
        assert_eq!(read(""), Value::Null);
        let docs: Vec<Value> =
            documents("# head\n---\na: 1\n---\n---\nnull\n...\n---\nb: [x]\n--- \n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": ["x"]})]);
        assert!(documents::<Value>("a: 1\n---\nb: [\n").is_err());
        assert!(from_slice::<Value>(b"a: \xff").is_err());
    }

    #[test]
    fn writes_the_chart_style_and_reads_it_back() {
        let v = json!({
            "list": ["a", "b"],
            "multi": "first line\n\nsecond line",
            "long": "x ".repeat(100).trim_end(),
            "quoted": ["yes", "on", "0755", "true", "1.5", "", "a: b", "- x", "#c", "~", "null"],
            "empty": {"m": {}, "s": []},
            "n": 3,
        });
        let text = to_string(&v).unwrap();
        assert!(text.contains("list:\n- a\n- b\n"), "{text}");
        assert!(
            text.contains("multi: |-\n  first line\n\n  second line\n"),
            "{text}"
        );
        assert!(text.contains(&format!("long: {}\n", "x ".repeat(100).trim_end())));
        assert!(
            text.contains("- \"yes\"\n- \"on\"\n- \"0755\"\n- \"true\"\n"),
            "{text}"
        );
        assert!(!text.starts_with("---"), "{text}");
        assert_eq!(read(&text), v);
        // Go's YAML 1.1 readers (kubectl, helm) get the same strings too.
        assert_eq!(serde_saphyr::from_str::<Value>(&text).unwrap(), v, "{text}");
    }
}
