//! The Helm chart (`charts/kleym/`), rendered by a tiny renderer of the template subset it
//! uses (`deploy_support`): every template parses as YAML under several value sets, every
//! key of values.yaml is documented, the hub Deployment is hardened and its arguments are
//! flags `kleym hub` accepts, the hub RBAC follows the plugin switches, and the single-cluster
//! ClusterRole equals `deploy/spoke/clusterrole.yaml`.

mod deploy_support;

use deploy_support::{Release, documents, merge, render, repo_root};
use serde_json::{Value, json};

fn chart() -> std::path::PathBuf {
    repo_root().join("charts/kleym")
}

fn values(overrides: Value) -> Value {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let mut v: Value = serde_yaml_ng::from_str(&text).unwrap();
    merge(&mut v, &overrides);
    v
}

fn render_chart(overrides: Value) -> Vec<Value> {
    let values = values(overrides);
    let release = Release {
        name: "kleym".into(),
        namespace: "kleym-system".into(),
    };
    let mut docs = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(chart().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for path in paths {
        let src = std::fs::read_to_string(&path).unwrap();
        let out =
            render(&src, &values, &release).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        docs.extend(documents(&out).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    }
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn rules_mention(docs: &[Value], resource: &str) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == resource))
        })
        .collect()
}

#[test]
fn chart_metadata_and_every_value_is_documented() {
    let chart_yaml: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "kleym");
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let key = regex::Regex::new(r"^\s*[A-Za-z][A-Za-z0-9]*:").unwrap();
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
    assert!(checked > 20, "only {checked} keys found");
}

#[test]
fn fleet_mode_hub_is_hardened_and_its_args_parse() {
    let docs = render_chart(json!({}));
    let dep = find(&docs, "Deployment", "kleym-hub").expect("hub Deployment");
    assert!(find(&docs, "Deployment", "kleym-spoke").is_none());
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(args[0], "hub");
    assert!(args.contains(&"--leader-elect=true".to_string()));
    // The flags are those of `kleym hub` (same parser, in-process).
    let parsed = kleym_e2e::fleet::harness::parse_hub_args(&args[1..]).unwrap();
    assert!(parsed.leader_elect);
    assert_eq!(parsed.trust_domain.as_deref(), Some("example.org"));
    assert_eq!(parsed.removal_timeout_seconds, 600);

    // The provider ConfigMap is a provider file the hub loads.
    let cm = find(&docs, "ConfigMap", "kleym-hub-providers").expect("provider ConfigMap");
    let file: Value =
        serde_yaml_ng::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        file["providers"][0]["execConfig"]["args"][3],
        "kleym-system/kleym-hub"
    );
    let dir = tempfile::tempdir().unwrap();
    let pf = dir.path().join("providers.yaml");
    std::fs::write(&pf, cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    let with_file = kleym_e2e::fleet::harness::parse_hub_args(&[
        "--clusterprofile-provider-file".into(),
        pf.to_string_lossy().into(),
    ])
    .unwrap();
    with_file
        .access
        .provider_set()
        .expect("provider file loads");

    let svc = find(&docs, "Service", "kleym").expect("Service");
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    assert!(find(&docs, "ServiceMonitor", "kleym").is_none());
}

#[test]
fn hub_rbac_is_minimal_and_follows_the_plugin_switches() {
    let default = render_chart(json!({}));
    // token-request on (default): tokens for its own ServiceAccount only; no Secrets.
    let token = rules_mention(&default, "serviceaccounts/token");
    assert_eq!(token.len(), 1);
    assert_eq!(token[0]["resourceNames"], json!(["kleym-hub"]));
    assert_eq!(token[0]["verbs"], json!(["create"]));
    assert!(rules_mention(&default, "secrets").is_empty());
    for r in [
        "clusterprofiles",
        "tokenreviews",
        "subjectaccessreviews",
        "leases",
        "events",
    ] {
        assert!(!rules_mention(&default, r).is_empty(), "no rule for {r}");
    }
    let profiles = rules_mention(&default, "clusterprofiles");
    // get/patch: kleym's finalizer on the profiles it engages (removal on deletion).
    assert_eq!(
        profiles[0]["verbs"],
        json!(["get", "list", "watch", "patch"])
    );
    // No wildcard anywhere.
    for d in &default {
        for r in d["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !r[field].as_array().unwrap().iter().any(|x| x == "*"),
                    "wildcard in {r}"
                );
            }
        }
    }

    let flipped = render_chart(json!({"credentialPlugins": {
        "tokenRequest": false, "secretReader": true, "secretNamespace": "spoke-tokens"}}));
    assert!(rules_mention(&flipped, "serviceaccounts/token").is_empty());
    let secrets = rules_mention(&flipped, "secrets");
    assert_eq!(secrets.len(), 1);
    assert_eq!(secrets[0]["verbs"], json!(["get"]));
    let role = find(&flipped, "Role", "kleym-hub-secret-reader").unwrap();
    assert_eq!(role["metadata"]["namespace"], "spoke-tokens");
}

#[test]
fn optional_parts_render_as_valid_yaml() {
    let docs = render_chart(json!({
        "serviceMonitor": {"enabled": true},
        "api": {"enabled": true},
        "spireClassName": "spire-system",
        "hub": {"clusterProfileNamespace": "fleet", "clusterProfileSelector": "env=prod",
                "providerFile": "providers:\n  - name: eks\n    execConfig:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: aws\n      args: [eks, get-token]\n"}
    }));
    let sm = find(&docs, "ServiceMonitor", "kleym").expect("ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    let svc = find(&docs, "Service", "kleym").unwrap();
    assert_eq!(svc["spec"]["ports"][1]["name"], "api");
    let cm = find(&docs, "ConfigMap", "kleym-hub-providers").unwrap();
    let file: Value =
        serde_yaml_ng::from_str(cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(file["providers"][0]["name"], "eks");
    let dep = find(&docs, "Deployment", "kleym-hub").unwrap();
    let args = dep["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--spire-class-name=spire-system"), "{args}");
    assert!(
        args.contains("--clusterprofile-selector=env=prod"),
        "{args}"
    );
    // With the API on, the flags are still those of `kleym hub`.
    let argv: Vec<String> = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let parsed = kleym_e2e::fleet::harness::parse_hub_args(&argv).unwrap();
    assert_eq!(parsed.api.api_addr.port(), 8443);
}

#[test]
fn single_cluster_mode_runs_the_spoke_with_the_deploy_spoke_rules() {
    let docs = render_chart(json!({"mode": "single-cluster"}));
    assert!(find(&docs, "Deployment", "kleym-hub").is_none());
    assert!(rules_mention(&docs, "clusterprofiles").is_empty());
    let dep = find(&docs, "Deployment", "kleym-spoke").expect("spoke Deployment");
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][0], "spoke");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let role = find(&docs, "ClusterRole", "kleym-spoke").unwrap();
    let deploy: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/spoke/clusterrole.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        role["rules"], deploy["rules"],
        "chart and deploy/spoke differ"
    );
    let svc = find(&docs, "Service", "kleym").unwrap();
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/component"],
        "spoke"
    );
}

#[test]
fn renderer_rejects_what_it_does_not_understand() {
    let v = json!({"a": {"b": "x"}});
    let r = Release {
        name: "n".into(),
        namespace: "ns".into(),
    };
    assert_eq!(render("{{ .Values.a.b }}", &v, &r).unwrap(), "x");
    assert_eq!(
        render(
            "a\n{{- if eq .Values.a.b \"y\" }}\nyes\n{{- else }}\nno\n{{- end }}",
            &v,
            &r
        )
        .unwrap(),
        "a\nno"
    );
    assert!(render("{{ include \"x\" . }}", &v, &r).is_err());
    assert!(render("{{ .Values.missing }}", &v, &r).is_err());
    assert!(render("{{ if .Values.a.b }}", &v, &r).is_err());
}
