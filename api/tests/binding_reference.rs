//! `docs/binding-reference.md` documents every field of the InferenceIdentityBinding CRD's
//! schema (the one `kleym crds` prints), and its field tables name no field the schema lacks.
//!
//! A field is written as its path from the object's root, arrays as `[]`:
//! `spec.targetRef.name`, `status.conditions[].reason`.

use std::collections::BTreeSet;
use std::path::Path;

use kleym_api::crds;
use serde_json::Value;

/// Every property path of `schema` (an `openAPIV3Schema` node) under `prefix`.
fn schema_paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (name, child) in props {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            out.insert(path.clone());
            schema_paths(child, &path, out);
        }
    }
    if schema["items"].is_object() {
        schema_paths(&schema["items"], &format!("{prefix}[]"), out);
    }
}

/// Whether `s` is written like a field path: `spec` or `status`, then `.name` parts, each
/// optionally followed by `[]`.
fn is_field_path(s: &str) -> bool {
    let mut parts = s.split('.');
    if !matches!(parts.next(), Some("spec" | "status")) {
        return false;
    }
    parts.all(|p| {
        let name = p.strip_suffix("[]").unwrap_or(p);
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// The backquoted field paths of `text` (anywhere), and those in the first cell of a table
/// row (the fields a table documents), with their line numbers.
fn doc_paths(text: &str) -> (BTreeSet<String>, Vec<(String, usize)>) {
    let mut anywhere = BTreeSet::new();
    let mut first_cells = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for (j, piece) in line.split('`').enumerate() {
            if j % 2 == 1 && is_field_path(piece) {
                anywhere.insert(piece.to_string());
            }
        }
        if let Some(row) = line.trim().strip_prefix('|') {
            let first = row.split('|').next().unwrap_or("").trim();
            if let Some(path) = first.strip_prefix('`').and_then(|f| f.strip_suffix('`'))
                && is_field_path(path)
            {
                first_cells.push((path.to_string(), i + 1));
            }
        }
    }
    (anywhere, first_cells)
}

/// The disagreements between the schema's paths and the page's.
fn disagreements(schema: &BTreeSet<String>, page: &str) -> Vec<String> {
    let (anywhere, rows) = doc_paths(page);
    let mut out = Vec::new();
    for p in schema {
        if !anywhere.contains(p) {
            out.push(format!(
                "the CRD has `{p}`, which docs/binding-reference.md does not document: add a row"
            ));
        }
    }
    for (p, line) in rows {
        if !schema.contains(&p) {
            out.push(format!(
                "docs/binding-reference.md:{line}: `{p}` is not a field of the CRD (renamed or removed?)"
            ));
        }
    }
    out
}

#[test]
fn the_reference_documents_every_field_of_the_crd_and_no_other() {
    let crd = serde_json::to_value(crds::inference_identity_binding()).unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut paths = BTreeSet::new();
    schema_paths(root, "", &mut paths);
    assert!(
        paths.contains("spec.targetRef.name") && paths.contains("status.conditions[].reason"),
        "{paths:?}"
    );
    assert!(paths.len() > 40, "only {} paths: {paths:?}", paths.len());
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/binding-reference.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let problems = disagreements(&paths, &text);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_names_a_missing_and_an_unknown_field() {
    let schema =
        BTreeSet::from(["spec", "spec.mode", "spec.items", "spec.items[].name"].map(String::from));
    let page = "\
| field | meaning |
|---|---|
| `spec` | the spec |
| `spec.mode` | a mode |
| `spec.gone` | removed |

Prose naming `spec.items` and `status.other` is not a row.
";
    assert_eq!(
        disagreements(&schema, page),
        [
            "the CRD has `spec.items[].name`, which docs/binding-reference.md does not document: add a row",
            "docs/binding-reference.md:5: `spec.gone` is not a field of the CRD (renamed or removed?)",
        ]
    );
}
