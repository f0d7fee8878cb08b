//! The Helm chart (`charts/kleym/`) without helm: every key of values.yaml is documented and
//! described by values.schema.json (and nothing else is), the schema's enums are the values
//! the binary accepts, and the Grafana dashboard queries only metrics the hub exports. The
//! rendered chart is checked through the real helm in `deploy_helm.rs`.

use crate::deploy_support;

use std::collections::BTreeSet;

use clap::ValueEnum;
use deploy_support::{
    chart, dashboard_queries, default_values, exposition_sample_names, promql_metric_names,
};
use serde_json::Value;

fn schema() -> Value {
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(chart().join("dashboards/kleym-hub.json")).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

#[test]
fn chart_metadata_and_every_value_is_documented() {
    let chart_yaml: Value =
        kleym_api::yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "kleym");
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let key = regex::Regex::new(r"^\s*[A-Za-z][A-Za-z0-9_]*:").unwrap();
    let mut checked = 0;
    for (i, line) in lines.iter().enumerate() {
        if !key.is_match(line) {
            continue;
        }
        let prev = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or(&"");
        assert!(
            prev.trim_start().starts_with('#'),
            "values.yaml line {}: {line:?} has no comment above it",
            i + 1
        );
        checked += 1;
    }
    assert!(checked > 40, "only {checked} keys found");
    for file in [
        ".helmignore",
        "templates/NOTES.txt",
        "templates/_helpers.tpl",
    ] {
        assert!(chart().join(file).is_file(), "charts/kleym/{file} missing");
    }
}

/// Walks values.yaml and the schema together: where the schema closes an object
/// (`additionalProperties: false`), its properties and the values' keys must be the same.
fn compare(values: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    let closed = schema["additionalProperties"] == Value::Bool(false);
    let props = schema["properties"].as_object();
    let (Some(values), true, Some(props)) = (values.as_object(), closed, props) else {
        return;
    };
    for (k, v) in values {
        match props.get(k) {
            Some(s) => compare(v, s, &format!("{path}.{k}"), problems),
            None => problems.push(format!("{path}.{k}: in values.yaml, not in the schema")),
        }
    }
    for k in props.keys() {
        // `global` is helm's own (parent charts), never in values.yaml.
        let helm_global = path.is_empty() && k == "global";
        if !values.contains_key(k) && !helm_global {
            problems.push(format!("{path}.{k}: in the schema, not in values.yaml"));
        }
    }
}

#[test]
fn values_schema_describes_exactly_the_values() {
    let schema = schema();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let mut problems = Vec::new();
    compare(&default_values(), &schema, "", &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The comparison sees a difference (so it can fail).
    let mut extra = default_values();
    extra["hub"]["typo"] = Value::Bool(true);
    let mut problems = Vec::new();
    compare(&extra, &schema, "", &mut problems);
    assert_eq!(problems, [".hub.typo: in values.yaml, not in the schema"]);
}

/// The names clap accepts for a value enum.
fn clap_values<E: ValueEnum>() -> Vec<String> {
    E::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value())
        .map(|p| p.get_name().to_string())
        .collect()
}

#[test]
fn schema_enums_are_the_values_the_binary_accepts() {
    let schema = schema();
    let props = &schema["properties"];
    for (what, enumerated, accepted) in [
        (
            "hub.removalPolicy",
            &props["hub"]["properties"]["removalPolicy"]["enum"],
            clap_values::<kleym_hub::fleet::RemovalPolicy>(),
        ),
        (
            "logFormat",
            &props["logFormat"]["enum"],
            clap_values::<kleym_hub::observe::logging::LogFormat>(),
        ),
        (
            "api.authMode",
            &props["api"]["properties"]["authMode"]["enum"],
            clap_values::<kleym_hub::http::auth::AuthMode>(),
        ),
        (
            "issuer.keyAlgorithm",
            &props["issuer"]["properties"]["keyAlgorithm"]["enum"],
            clap_values::<kleym_hub::issuer::keys::Algorithm>(),
        ),
    ] {
        let mut enumerated: Vec<String> = enumerated
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no enum in the schema"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let mut accepted = accepted;
        enumerated.sort();
        accepted.sort();
        assert_eq!(enumerated, accepted, "{what}");
    }
    assert_eq!(
        props["mode"]["enum"],
        serde_json::json!(["fleet", "single-cluster"])
    );
}

/// The `/metrics` exposition of `hub`, as the hub serves it.
async fn scrape(hub: &kleym_hub::runtime::HubHandle) -> String {
    let response = kleym_hub::http::metrics::metrics_response(&hub.registry);
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The sample names a `kleym hub` process exposes on `/metrics`: the registry a hub builds
/// (as `kleym hub` does, via `start_hub`), encoded by the `/metrics` handler. Its cluster is
/// unreachable; the registry does not depend on it. A labelled family is encoded only once
/// it has a series, so each gets one, through the hub's own handles.
async fn hub_exported_names() -> BTreeSet<String> {
    use kleym_hub::http::metrics::{CacheLabels, OutcomeLabels, RequestLabels, ReviewLabels};

    let args = kleym_e2e::fixtures::harness::parse_hub_args(&[
        "--leader-elect=false".into(),
        "--clusterprofile-access-provider".into(),
        "tok=/bin/true".into(),
    ])
    .unwrap();
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let stop = kleym_spoke::reconciler::CancellationToken::new();
    let hub = kleym_hub::runtime::start_hub(&args, client, stop.clone()).unwrap();
    hub.credentials
        .metrics()
        .observe("tok", "success", std::time::Duration::from_millis(3));
    let api = &hub.api_metrics;
    let outcome = |o: &str| OutcomeLabels { outcome: o.into() };
    api.requests
        .get_or_create(&RequestLabels {
            route: "/v1/report".into(),
            code: 200,
        })
        .inc();
    api.authn.get_or_create(&outcome("authenticated")).inc();
    api.authz.get_or_create(&outcome("allowed")).inc();
    api.cache_hits
        .get_or_create(&CacheLabels {
            cache: "access".into(),
        })
        .inc();
    api.reviews
        .get_or_create(&ReviewLabels {
            kind: "token".into(),
            result: "ok".into(),
        })
        .inc();
    // `kleym_hub_spokes` is set by the hub's metrics task on its first run.
    let mut exposition = scrape(&hub).await;
    for _ in 0..1000 {
        if exposition.contains("# TYPE kleym_hub_spokes ") {
            break;
        }
        tokio::task::yield_now().await;
        exposition = scrape(&hub).await;
    }
    stop.cancel();
    let names = exposition_sample_names(&exposition);
    // Families of every part of the hub are there (fleet, per spoke, credentials, API).
    for family in [
        "kleym_hub_spokes",
        "kleym_hub_leader",
        "kleym_hub_findings",
        "kleym_hub_spoke_phase",
        "kleym_spoke_api_writes_total",
        "kleym_spoke_reconcile_duration_seconds_bucket",
        "kleym_credential_exec_total",
        "kleym_credential_exec_duration_seconds_bucket",
        "kleym_hub_api_requests_total",
        "kleym_hub_api_authn_total",
        "kleym_hub_api_authz_total",
        "kleym_hub_api_auth_cache_hits_total",
        "kleym_hub_api_auth_reviews_total",
        "kleym_hub_api_auth_permissive_allowed_total",
    ] {
        assert!(names.contains(family), "{family} not in {names:?}");
    }
    names
}

#[tokio::test]
async fn dashboard_queries_only_metrics_the_hub_exports() {
    let exported = hub_exported_names().await;
    let queries = dashboard_queries(&dashboard());
    assert!(queries.len() > 20, "only {} queries found", queries.len());
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (place, expr) in &queries {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr:?}");
        for name in names {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name} (in {expr:?})"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the hub does not export:\n{}",
        unknown.join("\n")
    );
    // What the dashboard is for: spokes by phase, engage/converge latency, credential execs,
    // API writes, findings by kind.
    for name in [
        "kleym_hub_spokes",
        "kleym_hub_spoke_phase",
        "kleym_credential_exec_duration_seconds_bucket",
        "kleym_spoke_reconcile_duration_seconds_bucket",
        "kleym_credential_exec_total",
        "kleym_spoke_api_writes_total",
        "kleym_hub_findings",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn promql_metric_names_are_every_selected_series() {
    let names = |e: &str| promql_metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.95, sum by (le, provider) (rate(kleym_nope_bucket{job=~"$job", x="a b"}[$__rate_interval])))"#
        ),
        ["kleym_nope_bucket"]
    );
    assert_eq!(
        names(
            r#"sum(a_total{phase="Engaged"} and on (instance) (leader == 1)) / ignoring (x) group_left () b offset 5m"#
        ),
        ["a_total", "b", "leader"]
    );
    assert_eq!(names("time() - (ts_seconds > 0)"), ["ts_seconds"]);
    assert_eq!(
        names(r#"label_values(kleym_hub_spoke_phase{job=~"$job"}, cluster)"#),
        ["kleym_hub_spoke_phase"]
    );
    assert_eq!(
        names("sum(rate(c_sum[5m])) / sum(rate(c_count[1h30m]))"),
        ["c_count", "c_sum"]
    );
}

#[test]
fn exposition_names_carry_the_type_suffixes() {
    let names = exposition_sample_names(
        "# HELP a x\n# TYPE a counter\na_total 1\n# TYPE h histogram\n# TYPE g gauge\n# EOF\n",
    );
    for n in ["a_total", "h_bucket", "h_sum", "h_count", "g"] {
        assert!(names.contains(n), "{n}: {names:?}");
    }
    assert!(!names.contains("a") && !names.contains("h") && !names.contains("g_total"));
}

#[test]
fn dashboard_is_a_grafana_dashboard_on_its_datasource_variable() {
    let d = dashboard();
    assert_eq!(d["uid"], "kleym-hub");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vars.contains(&"datasource"), "{vars:?}");
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let grid = &p["gridPos"];
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{}: wider than the grid",
            p["title"]
        );
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{}: a target not on the datasource variable",
                p["title"]
            );
        }
    }
}
