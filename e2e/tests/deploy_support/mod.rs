//! Helpers of the deploy tests (`deploy_chart.rs`, `deploy_helm.rs`, `deploy_examples.rs`):
//! running `kleym` on rendered arguments, values merging, YAML
//! document splitting, and the metric names a PromQL expression (the Grafana dashboard's)
//! refers to.

#![allow(dead_code)]

use std::collections::BTreeSet;

use serde_json::Value;

/// Deep-merges `over` into `base` (maps merge, everything else replaces).
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Parses a multi-document YAML string; empty documents are dropped.
pub fn documents(yaml: &str) -> Result<Vec<Value>, String> {
    kleym_api::yaml::documents(yaml).map_err(|e| format!("{e}\n{yaml}"))
}

/// Repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The chart's directory.
pub fn chart() -> std::path::PathBuf {
    repo_root().join("charts/kleym")
}

/// The chart's values.yaml, parsed.
pub fn default_values() -> Value {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    kleym_api::yaml::from_str(&text).unwrap()
}

/// PromQL words that are not metric names: operators, modifiers and literals.
const PROMQL_KEYWORDS: [&str; 14] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: every identifier outside strings, label
/// matchers (`{…}`), ranges (`[…]`) and grouping clauses (`by (…)`, `on (…)`, …) that is
/// neither a function call nor a keyword. Grafana variables (`$job`, `$__rate_interval`)
/// are dropped. A Grafana `label_values(metric{…}, label)` query yields its metric.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"#).unwrap();
    let braces = regex::Regex::new(r"\{[^{}]*\}|\[[^\[\]]*\]").unwrap();
    let grouping =
        regex::Regex::new(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
            .unwrap();
    let variables = regex::Regex::new(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?").unwrap();
    let label_values =
        regex::Regex::new(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)").unwrap();
    if expr.trim_start().starts_with("label_values(") {
        return label_values
            .captures(expr)
            .map(|c| BTreeSet::from([c[1].to_string()]))
            .unwrap_or_default();
    }
    let s = strings.replace_all(expr, " ");
    let s = braces.replace_all(&s, " ");
    let s = grouping.replace_all(&s, " ");
    let s = variables.replace_all(&s, " ");
    // Identifiers, and numbers/durations (skipped) so that `5m` is not read as `m`.
    let token = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*|[0-9][A-Za-z0-9_.]*").unwrap();
    let mut out = BTreeSet::new();
    for m in token.find_iter(&s) {
        let word = m.as_str();
        if word.starts_with(|c: char| c.is_ascii_digit()) || PROMQL_KEYWORDS.contains(&word) {
            continue;
        }
        if s[m.end()..].trim_start().starts_with('(') {
            continue; // a function
        }
        out.insert(word.to_string());
    }
    out
}

/// Every PromQL query of a Grafana dashboard: panel targets' `expr` (rows' nested panels
/// included) and query variables' `query`, each with where it is.
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    let refid = t["refId"].as_str().unwrap_or("?");
                    out.push((format!("panel {title:?} target {refid}"), expr.to_string()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        if let Some(q) = query {
            let name = v["name"].as_str().unwrap_or("?");
            out.push((format!("variable {name}"), q.to_string()));
        }
    }
    out
}

/// The sample names an OpenMetrics exposition can hold: each `# TYPE` family with the
/// suffixes its type adds (counter `_total`, histogram `_bucket`/`_sum`/`_count`, …).
pub fn exposition_sample_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        for suffix in suffixes {
            out.insert(format!("{name}{suffix}"));
        }
    }
    out
}

/// Runs the `kleym` binary with `args` and a kubeconfig that does not exist; returns its exit
/// code and stderr.
pub fn run_kleym_without_cluster(args: &[String]) -> (Option<i32>, String) {
    let kleym = kleym_e2e::fixtures::plugins::kleym_binary().expect("kleym binary");
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(kleym)
        .args(args)
        .arg("--kubeconfig")
        .arg(dir.path().join("missing"))
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the `kleym` binary with `args` and a kubeconfig that does not exist: the command
/// line parses (else clap exits 2 with a usage error) and the run stops at the kubeconfig.
pub fn assert_kleym_accepts(args: &[String]) {
    let (code, stderr) = run_kleym_without_cluster(args);
    assert_eq!(code, Some(1), "{args:?}: {stderr}");
    assert!(stderr.contains("kubeconfig"), "{args:?}: {stderr}");
}
