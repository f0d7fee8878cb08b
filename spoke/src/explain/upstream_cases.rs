//! Runs `testdata/upstream_cases.json`: SPIRE Controller Manager's own test cases (and the
//! rules of the functions they exercise), each citing the upstream file and commit it
//! restates, against kleym's model. Expected values are written in the data by hand.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ManagerConfig, PodInputs, Precedence, StaticEntry, Verdict, explain_pod_with_static};

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    upstream: Upstream,
    #[serde(default)]
    config: Value,
    #[serde(default)]
    pod: PodDesc,
    node_uid: Option<String>,
    objects: Vec<ObjectDesc>,
    #[serde(default)]
    static_entries: Vec<StaticDesc>,
    expect: Expect,
}

/// A ClusterStaticEntry: its spec's fields as upstream spells them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StaticDesc {
    name: String,
    #[serde(rename = "spiffeID")]
    spiffe_id: String,
    #[serde(rename = "parentID")]
    parent_id: String,
    selectors: Vec<String>,
    class_name: Option<String>,
    created: Option<String>,
}

#[derive(Deserialize)]
struct Upstream {
    file: String,
    commit: String,
    test: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodDesc {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    service_account_name: Option<String>,
    node_name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    namespace_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectDesc {
    name: String,
    uid: Option<String>,
    template: String,
    created: Option<String>,
    deleted: Option<String>,
    class_name: Option<String>,
    #[serde(default)]
    fallback: bool,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    selectors: Option<Vec<String>>,
    dns: Option<Vec<String>>,
    ttl: Option<String>,
    namespace_selector: Option<Value>,
    pod_selector: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Expect {
    svids: Option<Vec<String>>,
    entry_count: Option<usize>,
    entries: Option<Vec<Value>>,
    #[serde(default)]
    verdicts: BTreeMap<String, String>,
    #[serde(default)]
    masked_by: BTreeMap<String, String>,
    /// `spiffeId` → the ClusterStaticEntry (`ClusterStaticEntry <name>`) that declares it
    /// for another entry.
    #[serde(default)]
    shared_with_static: BTreeMap<String, String>,
}

fn object(d: &ObjectDesc) -> ClusterSPIFFEID {
    let mut meta = json!({
        "name": d.name,
        "uid": d.uid.clone().unwrap_or_else(|| format!("uid-{}", d.name)),
        "creationTimestamp": d.created.clone().unwrap_or_else(|| "2026-01-01T00:00:00Z".into()),
        "annotations": d.annotations,
    });
    if let Some(t) = &d.deleted {
        meta["deletionTimestamp"] = json!(t);
    }
    let mut spec = json!({"spiffeIDTemplate": d.template, "fallback": d.fallback});
    let optional = [
        ("className", d.class_name.as_ref().map(|v| json!(v))),
        (
            "workloadSelectorTemplates",
            d.selectors.as_ref().map(|v| json!(v)),
        ),
        ("dnsNameTemplates", d.dns.as_ref().map(|v| json!(v))),
        ("ttl", d.ttl.as_ref().map(|v| json!(v))),
        ("namespaceSelector", d.namespace_selector.clone()),
        ("podSelector", d.pod_selector.clone()),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            spec[k] = v;
        }
    }
    let obj = json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": meta, "spec": spec});
    match serde_json::from_value(obj) {
        Ok(o) => o,
        Err(e) => panic!("object {}: {e}", d.name),
    }
}

fn verdict_tag(v: &Verdict) -> String {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m
            .get("verdict")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        other => panic!("verdict serializes as {other:?}"),
    }
}

#[test]
fn upstream_cases_hold() {
    let cases: Cases = match serde_json::from_str(include_str!("testdata/upstream_cases.json")) {
        Ok(c) => c,
        Err(e) => panic!("testdata/upstream_cases.json: {e}"),
    };
    assert!(cases.cases.len() >= 20, "the table lost cases");
    for case in &cases.cases {
        let u = &case.upstream;
        let at = format!(
            "{} ({} @ {}: {})",
            case.name,
            u.file,
            &u.commit[..12],
            u.test
        );
        assert_eq!(u.commit.len(), 40, "{at}: cite a full commit");
        let mut config = json!({"trustDomain": "example.org", "clusterName": "cluster",
            "clusterDomain": "cluster.local", "className": "", "watchClassless": true,
            "ignoreNamespaces": []});
        if let Value::Object(over) = &case.config {
            for (k, v) in over {
                config[k] = v.clone();
            }
        }
        let config: ManagerConfig = match serde_json::from_value(config) {
            Ok(c) => c,
            Err(e) => panic!("{at}: config: {e}"),
        };
        let p = &case.pod;
        let namespace = p.namespace.clone().unwrap_or_else(|| "default".into());
        let pod: Pod = match serde_json::from_value(json!({
            "metadata": {"name": p.name.clone().unwrap_or_else(|| "pod".into()),
                "namespace": namespace, "uid": p.uid.clone().unwrap_or_else(|| "pod-uid".into()),
                "labels": p.labels},
            "spec": {"nodeName": p.node_name.clone().unwrap_or_else(|| "node-a".into()),
                "serviceAccountName": p.service_account_name,
                "containers": [{"name": "main", "image": "img"}]}
        })) {
            Ok(p) => p,
            Err(e) => panic!("{at}: pod: {e}"),
        };
        let ns: Namespace = match serde_json::from_value(
            json!({"metadata": {"name": namespace, "labels": p.namespace_labels}}),
        ) {
            Ok(n) => n,
            Err(e) => panic!("{at}: namespace: {e}"),
        };
        let node: Node = match serde_json::from_value(json!({"metadata": {"name": "node-a",
            "uid": case.node_uid.clone().unwrap_or_else(|| "node-uid".into())}}))
        {
            Ok(n) => n,
            Err(e) => panic!("{at}: node: {e}"),
        };
        let objects: Vec<ClusterSPIFFEID> = case.objects.iter().map(object).collect();
        let inputs = PodInputs {
            pod: &pod,
            namespace: &ns,
            node: Some(&node),
        };
        let statics: Vec<StaticEntry> = case
            .static_entries
            .iter()
            .map(|d| {
                let created = d
                    .created
                    .clone()
                    .unwrap_or_else(|| "2026-01-01T00:00:00Z".into());
                let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
                    match serde_json::from_value(
                        json!({"uid": format!("uid-{}", d.name), "creationTimestamp": created}),
                    ) {
                        Ok(m) => m,
                        Err(e) => panic!("{at}: static entry {}: {e}", d.name),
                    };
                StaticEntry {
                    name: d.name.clone(),
                    class_name: d.class_name.clone().unwrap_or_default(),
                    spiffe_id: d.spiffe_id.clone(),
                    parent_id: d.parent_id.clone(),
                    selectors: d.selectors.clone(),
                    dns_names: Vec::new(),
                    precedence: Precedence::of_meta(&meta),
                }
            })
            .collect();
        let model = match explain_pod_with_static(inputs, &objects, &statics, &config, "kleym") {
            Ok(m) => m,
            Err(e) => panic!("{at}: {e}"),
        };
        let e = &case.expect;
        if let Some(want) = &e.svids {
            assert_eq!(&model.spiffe_ids(), want, "{at}: SVIDs");
        }
        if let Some(n) = e.entry_count {
            assert_eq!(model.entries.len(), n, "{at}: entry count");
        }
        if let Some(want) = &e.entries {
            assert_eq!(model.entries.len(), want.len(), "{at}: entries");
            let got = match serde_json::to_value(&model.entries) {
                Ok(Value::Array(a)) => a,
                other => panic!("{at}: entries serialize as {other:?}"),
            };
            for (got, want) in got.iter().zip(want) {
                let Value::Object(want) = want else {
                    panic!("{at}: an expected entry is not an object")
                };
                for (k, v) in want {
                    let g = got
                        .get("entry")
                        .and_then(|e| e.get(k))
                        .or_else(|| got.get(k));
                    assert_eq!(g, Some(v), "{at}: entry field {k}");
                }
            }
        }
        for (name, want) in &e.verdicts {
            let Some(c) = model.candidates.iter().find(|c| &c.name == name) else {
                panic!("{at}: no candidate {name}")
            };
            assert_eq!(
                &verdict_tag(&c.verdict),
                want,
                "{at}: verdict of {name}: {c:?}"
            );
        }
        let shared: BTreeMap<String, String> = model
            .shared_with_static
            .iter()
            .map(|s| (s.spiffe_id.clone(), s.declared_by.clone()))
            .collect();
        assert_eq!(
            shared, e.shared_with_static,
            "{at}: shared with static entries"
        );
        for (name, by) in &e.masked_by {
            let Some(c) = model.candidates.iter().find(|c| &c.name == name) else {
                panic!("{at}: no candidate {name}")
            };
            assert_eq!(
                c.verdict,
                Verdict::Masked { by: by.clone() },
                "{at}: {name} masked by"
            );
        }
    }
}

/// The table's header: the one upstream commit every case restates.
#[derive(Deserialize)]
struct Pinned {
    repository: String,
    commit: String,
}

#[derive(Deserialize)]
struct Citations {
    about: String,
    upstream: Option<Pinned>,
    cases: Vec<CitedCase>,
}

#[derive(Deserialize)]
struct CitedCase {
    name: String,
    upstream: Upstream,
}

/// Checks, without the network, that every case cites the commit pinned in the header, a
/// Go file and a function or test by its bare name (`TestName` or `TestName/subtest`): a
/// citation that cannot be looked up in the upstream tree as written is a wrong one.
fn check_citations(table: &str) -> Result<(), String> {
    let t: Citations = serde_json::from_str(table).map_err(|e| format!("table: {e}"))?;
    let Some(pinned) = &t.upstream else {
        return Err("the table's header pins no upstream commit".into());
    };
    let full_hex = |c: &str| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit());
    if !full_hex(&pinned.commit) || pinned.commit.to_lowercase() != pinned.commit {
        return Err(format!(
            "pinned commit {:?} is not a full commit",
            pinned.commit
        ));
    }
    if pinned.repository.is_empty() {
        return Err("the header names no repository".into());
    }
    if !t.about.contains(&pinned.commit) {
        return Err("\"about\" does not state the pinned commit".into());
    }
    let ident = |s: &str| {
        let mut b = s.bytes();
        b.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
    };
    for c in &t.cases {
        let u = &c.upstream;
        if u.commit != pinned.commit {
            return Err(format!(
                "{}: cites {:?}, not the pinned {}",
                c.name, u.commit, pinned.commit
            ));
        }
        let file_ok = u.file.ends_with(".go")
            && !u.file.starts_with('/')
            && !u.file.contains(char::is_whitespace);
        if !file_ok {
            return Err(format!("{}: {:?} is not a Go file path", c.name, u.file));
        }
        let (func, subtest) = match u.test.split_once('/') {
            Some((f, s)) => (f, Some(s)),
            None => (u.test.as_str(), None),
        };
        if !ident(func) || subtest.is_some_and(str::is_empty) {
            return Err(format!(
                "{}: {:?} is not a function or test name",
                c.name, u.test
            ));
        }
    }
    Ok(())
}

#[test]
fn upstream_cases_cite_one_pinned_commit() {
    if let Err(e) = check_citations(include_str!("testdata/upstream_cases.json")) {
        panic!("testdata/upstream_cases.json: {e}");
    }
}

#[test]
fn citation_check_rejects_bad_citations() {
    let pinned = "430567cc024fb0a2c07d2a1972128e68d1c1f54d";
    let table = |commit: &str, file: &str, test: &str| {
        json!({"about": format!("at {pinned}"),
            "upstream": {"repository": "github.com/spiffe/spire-controller-manager", "commit": pinned},
            "cases": [{"name": "c", "upstream": {"file": file, "commit": commit, "test": test}}]})
        .to_string()
    };
    let good = table(
        pinned,
        "pkg/spireentry/entries_test.go",
        "TestRenderPodEntry",
    );
    assert_eq!(check_citations(&good), Ok(()));
    let bad = [
        table(
            "f1e2588ca924756fff65967c55e5bc97d1c396d0",
            "pkg/spireentry/reconciler.go",
            "objectCmp",
        ),
        table(pinned, "", "objectCmp"),
        table(pinned, "pkg/spireentry/reconciler.go", ""),
        table(pinned, "pkg/spireentry/reconciler.go", "objectCmp (UID)"),
        table(
            pinned,
            "pkg/spireentry/reconciler_test.go",
            "TestMakeEntryKey/",
        ),
        json!({"about": "", "cases": []}).to_string(),
    ];
    for t in bad {
        assert!(check_citations(&t).is_err(), "accepted {t}");
    }
}
