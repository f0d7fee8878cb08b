//! CRD lifecycle with the real upstream CRDs, custom-resource validation, versions,
//! generation and status rules.

mod common;

use common::*;
use futures::StreamExt;
use kubesim_store::{
    DeleteOptions, FieldValidation, ListOptions, PatchType, Subresource, WatchOptions, WriteOptions,
};
use serde_json::{Value, json};

const CSID: &str = "spire.spiffe.io_clusterspiffeids.yaml";

fn csid(name: &str, template: Option<&str>) -> Value {
    let mut spec = json!({"podSelector": {"matchLabels": {"app": "x"}}});
    if let Some(t) = template {
        spec["spiffeIDTemplate"] = json!(t);
    }
    json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {"name": name},
        "spec": spec,
    })
}

#[tokio::test]
async fn clusterspiffeid_crd_lifecycle() {
    let c = cluster();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    assert!(
        c.resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
            .is_none()
    );
    install_crd(&c, CSID);
    let crd = c
        .get(&crds, None, "clusterspiffeids.spire.spiffe.io")
        .unwrap();
    assert_eq!(crd["metadata"]["generation"], 1);
    let conds = crd["status"]["conditions"].as_array().unwrap();
    for t in ["NamesAccepted", "Established"] {
        let cnd = conds.iter().find(|c| c["type"] == t).unwrap();
        assert_eq!(cnd["status"], "True");
    }
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "ClusterSPIFFEID");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1alpha1"]));

    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    assert!(!r.namespaced && r.has_status && r.custom);
    assert_eq!(r.kind, "ClusterSPIFFEID");
    assert!(
        c.openapi_v3_schema("spire.spiffe.io", "v1alpha1", "ClusterSPIFFEID")
            .is_some()
    );
    assert!(c.resources().iter().any(|x| x.plural == "clusterspiffeids"));

    let ok = c
        .create(
            &r,
            None,
            csid("ok", Some("spiffe://td/ns/{{ .PodMeta.Namespace }}")),
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(ok["metadata"]["generation"], 1);
    assert_eq!(ok["apiVersion"], "spire.spiffe.io/v1alpha1");

    let e = c
        .create(&r, None, csid("bad", None), &opts("t"))
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("ClusterSPIFFEID.spire.spiffe.io \"bad\" is invalid: "),
        "{}",
        e.message
    );
    assert!(e.message.contains("spec.spiffeIDTemplate"), "{}", e.message);
    assert!(e.message.contains("Required value"), "{}", e.message);
    let causes = e.details.as_ref().unwrap()["causes"]
        .as_array()
        .unwrap()
        .clone();
    assert!(causes.iter().any(|c| c["field"] == "spec.spiffeIDTemplate"));

    let e = c
        .create(
            &r,
            None,
            csid("Bad.Name", Some("spiffe://td/x")),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("metadata.name: Invalid value: \"Bad.Name\""),
        "{}",
        e.message
    );

    let mut wrong_type = csid("typed", Some("spiffe://td/x"));
    wrong_type["spec"]["admin"] = json!("yes");
    let e = c.create(&r, None, wrong_type, &opts("t")).unwrap_err();
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.admin"), "{}", e.message);

    // strategic merge patch is not accepted for custom resources
    let e = c
        .patch(
            &r,
            None,
            "ok",
            PatchType::Strategic,
            &json!({}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));

    // deleting the CRD stops serving it, deletes its objects and ends its watches
    let mut w = c.watch(&r, None, &WatchOptions::default()).unwrap();
    assert_eq!(next(&mut w).await.unwrap().event_type, "ADDED");
    let before = c.object_count();
    c.delete(
        &crds,
        None,
        "clusterspiffeids.spire.spiffe.io",
        &DeleteOptions::default(),
    )
    .unwrap();
    let ev = next(&mut w).await.unwrap();
    assert_eq!((ev.event_type, name_of(&ev).as_str()), ("DELETED", "ok"));
    assert!(next(&mut w).await.is_none());
    assert!(
        c.resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
            .is_none()
    );
    assert_eq!(c.object_count(), before - 2);
    assert_eq!(
        c.list(&r, None, &ListOptions::default()).unwrap_err().code,
        404
    );
    // and it can be installed again, empty
    install_crd(&c, CSID);
    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    let l = c.list(&r, None, &ListOptions::default()).unwrap();
    assert_eq!(l["items"].as_array().unwrap().len(), 0);
}

#[test]
fn unknown_fields_follow_field_validation() {
    let c = cluster();
    install_crd(&c, CSID);
    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    let mut o = csid("u", Some("spiffe://td/x"));
    o["spec"]["bogus"] = json!(1);
    let strict = WriteOptions {
        field_validation: FieldValidation::Strict,
        ..opts("t")
    };
    let e = c.create(&r, None, o.clone(), &strict).unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        e.message,
        "ClusterSPIFFEID in version \"v1alpha1\" cannot be handled as a ClusterSPIFFEID: strict decoding error: unknown field \"spec.bogus\""
    );
    let warn = c.create(&r, None, o.clone(), &opts("t")).unwrap();
    assert_eq!(
        warn.warnings,
        vec!["unknown field \"spec.bogus\"".to_string()]
    );
    assert!(warn.object["spec"].get("bogus").is_none(), "pruned");
}

#[test]
fn custom_resource_generation_and_status_rules() {
    let c = cluster();
    install_crd(&c, CSID);
    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    let mut o = csid("g", Some("spiffe://td/a"));
    o["status"] = json!({"stats": {"podsSelected": 3}});
    let created = c.create(&r, None, o, &opts("t")).unwrap().object;
    assert!(
        created.get("status").is_none(),
        "status is dropped on create"
    );
    let gen_of = |v: &Value| v["metadata"]["generation"].as_i64().unwrap();

    // metadata-only change: no generation bump
    let l = c
        .patch(
            &r,
            None,
            "g",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"a": "b"}}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(gen_of(&l), 1);
    assert!(rv(&l) > rv(&created));
    // status write: status only, no generation bump
    let s = c
        .patch(
            &r,
            None,
            "g",
            PatchType::Merge,
            &json!({"spec": {"spiffeIDTemplate": "spiffe://td/ignored"}, "status": {"stats": {"podsSelected": 2}}}),
            Subresource::Status,
            &opts("ctrl"),
        )
        .unwrap()
        .object;
    assert_eq!(gen_of(&s), 1);
    assert_eq!(s["status"]["stats"]["podsSelected"], 2);
    assert_eq!(s["spec"]["spiffeIDTemplate"], "spiffe://td/a");
    // spec change: bump; status sent on the main resource is ignored
    let mut m = s.clone();
    m["spec"]["spiffeIDTemplate"] = json!("spiffe://td/b");
    m["status"]["stats"]["podsSelected"] = json!(99);
    let u = c
        .update(&r, None, "g", m, Subresource::Main, &opts("t"))
        .unwrap()
        .object;
    assert_eq!(gen_of(&u), 2);
    assert_eq!(u["status"]["stats"]["podsSelected"], 2);
    // no-op update: nothing changes
    let same = c
        .update(&r, None, "g", u.clone(), Subresource::Main, &opts("t"))
        .unwrap()
        .object;
    assert_eq!(rv(&same), rv(&u));
    assert_eq!(gen_of(&same), 2);
    // deletion with a finalizer bumps generation
    c.patch(
        &r,
        None,
        "g",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": ["x/y"]}}),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    let d = c.delete(&r, None, "g", &DeleteOptions::default()).unwrap();
    assert_eq!(gen_of(&d), 3);
}

#[test]
fn every_upstream_crd_installs() {
    let c = cluster();
    let mut files: Vec<String> = std::fs::read_dir(upstream_crds_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8);
    for f in &files {
        let crd = install_crd(&c, f);
        let group = crd["spec"]["group"].as_str().unwrap();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
        for v in crd["spec"]["versions"].as_array().unwrap() {
            let served = v["served"].as_bool().unwrap();
            let name = v["name"].as_str().unwrap();
            assert_eq!(
                c.resolve(group, name, plural).is_some(),
                served,
                "{f} {name}"
            );
        }
    }
}

#[test]
fn invalid_crds_are_rejected() {
    let c = cluster();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let base = |versions: Value| {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "kind": "Widget"},
                "scope": "Namespaced",
                "versions": versions,
            },
        })
    };
    let schema = json!({"openAPIV3Schema": {"type": "object"}});
    let two_storage = base(json!([
        {"name": "v1", "served": true, "storage": true, "schema": schema},
        {"name": "v2", "served": true, "storage": true, "schema": schema},
    ]));
    let e = c.create(&crds, None, two_storage, &opts("t")).unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("must have exactly one version marked as storage version"),
        "{}",
        e.message
    );
    let no_schema = base(json!([{"name": "v1", "served": true, "storage": true}]));
    assert_eq!(
        c.create(&crds, None, no_schema, &opts("t"))
            .unwrap_err()
            .code,
        422
    );
    let mut wrong_name =
        base(json!([{"name": "v1", "served": true, "storage": true, "schema": schema}]));
    wrong_name["metadata"]["name"] = json!("gadgets.example.com");
    let e = c.create(&crds, None, wrong_name, &opts("t")).unwrap_err();
    assert!(
        e.message
            .contains("must be spec.names.plural+\".\"+spec.group"),
        "{}",
        e.message
    );
    let mut bad_scope =
        base(json!([{"name": "v1", "served": true, "storage": true, "schema": schema}]));
    bad_scope["spec"]["scope"] = json!("Galaxy");
    assert_eq!(
        c.create(&crds, None, bad_scope, &opts("t"))
            .unwrap_err()
            .code,
        422
    );
    assert!(c.resolve("example.com", "v1", "widgets").is_none());
}

#[tokio::test]
async fn multi_version_crd_rewrites_api_version_and_watch() {
    let c = cluster();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 1}}},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    }}});
    let crd = json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1", "served": true, "storage": true, "schema": schema, "subresources": {"status": {}},
                 "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]},
                {"name": "v2", "served": true, "storage": false, "schema": schema},
                {"name": "v0", "served": false, "storage": false, "schema": schema},
            ],
        },
    });
    c.create(&crds, None, crd, &opts("t")).unwrap();
    assert!(c.resolve("example.com", "v0", "widgets").is_none());
    let v1 = res(&c, "example.com", "v1", "widgets");
    let v2 = res(&c, "example.com", "v2", "widgets");
    assert_eq!(v1.short_names, vec!["wd"]);
    assert_eq!(v1.categories, vec!["all"]);
    assert_eq!(v1.printer_columns.len(), 1);
    assert!(v1.has_status && !v2.has_status);
    let mut w2 = c
        .watch(&v2, Some("default"), &WatchOptions::default())
        .unwrap();
    let created = c
        .create(&v2, Some("default"), json!({"apiVersion": "example.com/v2", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}), &opts("t"))
        .unwrap()
        .object;
    assert_eq!(created["apiVersion"], "example.com/v2");
    assert_eq!(created["spec"]["size"], 1, "defaulted");
    let got = c.get(&v1, Some("default"), "w").unwrap();
    assert_eq!(got["apiVersion"], "example.com/v1");
    let ev = w2.next().await.unwrap();
    assert_eq!(ev.object["apiVersion"], "example.com/v2");
    let l = c.list(&v1, None, &ListOptions::default()).unwrap();
    assert_eq!(l["apiVersion"], "example.com/v1");
    assert_eq!(l["kind"], "WidgetList");
    assert_eq!(l["items"][0]["apiVersion"], "example.com/v1");

    // group and scope are immutable
    let mut crd_now = c.get(&crds, None, "widgets.example.com").unwrap();
    crd_now["spec"]["scope"] = json!("Cluster");
    let e = c
        .update(
            &crds,
            None,
            "widgets.example.com",
            crd_now,
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    // serving v2 can be switched off by an update
    let mut crd_now = c.get(&crds, None, "widgets.example.com").unwrap();
    crd_now["spec"]["versions"][1]["served"] = json!(false);
    let upd = c
        .update(
            &crds,
            None,
            "widgets.example.com",
            crd_now,
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(upd["metadata"]["generation"], 2);
    assert!(c.resolve("example.com", "v2", "widgets").is_none());
    assert!(c.get(&v1, Some("default"), "w").is_ok());
}

#[test]
fn crd_selectable_fields_work_in_field_selectors() {
    let c = cluster();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"color": {"type": "string"}}},
    }}});
    c.create(
        &crds,
        None,
        json!({
            "metadata": {"name": "gadgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "gadgets", "kind": "Gadget"},
                "scope": "Cluster",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": schema,
                              "selectableFields": [{"jsonPath": ".spec.color"}]}],
            },
        }),
        &opts("t"),
    )
    .unwrap();
    let r = res(&c, "example.com", "v1", "gadgets");
    assert!(!r.namespaced);
    for (n, color) in [("a", "red"), ("b", "blue")] {
        c.create(
            &r,
            None,
            json!({"metadata": {"name": n}, "spec": {"color": color}}),
            &opts("t"),
        )
        .unwrap();
    }
    let l = c
        .list(
            &r,
            None,
            &ListOptions {
                field_selector: Some("spec.color=blue".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    assert_eq!(l["items"][0]["metadata"]["name"], "b");
    let e = c
        .list(
            &r,
            None,
            &ListOptions {
                field_selector: Some("spec.size=1".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.message, "field label not supported: spec.size");
    assert!(c.openapi_v3_schema("", "v1", "ConfigMap").is_none());
}

/// Compiled CRDs are shared between clusters (a process-wide memo keyed by the CRD's name
/// and spec): a schema update still takes effect at once, and only in the cluster updated.
#[test]
fn crd_schema_updates_take_effect_at_once_with_shared_compilation() {
    let crd = |max: u64| {
        json!({
            "metadata": {"name": "gadgets.memo.example.com"},
            "spec": {
                "group": "memo.example.com",
                "names": {"plural": "gadgets", "kind": "Gadget"},
                "scope": "Cluster",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {
                    "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                        "type": "object",
                        "properties": {"size": {"type": "integer", "maximum": max}}
                    }}}
                }}],
            },
        })
    };
    let gadget = |name: &str, size: u64| {
        json!({"apiVersion": "memo.example.com/v1", "kind": "Gadget",
               "metadata": {"name": name}, "spec": {"size": size}})
    };
    let (a, b) = (cluster(), cluster());
    for c in [&a, &b] {
        let crds = res(c, "apiextensions.k8s.io", "v1", "customresourcedefinitions");
        c.create(&crds, None, crd(10), &opts("t")).unwrap();
        let g = res(c, "memo.example.com", "v1", "gadgets");
        c.create(&g, None, gadget("small", 5), &opts("t")).unwrap();
        assert_eq!(
            c.create(&g, None, gadget("big", 50), &opts("t"))
                .unwrap_err()
                .code,
            422
        );
    }
    // raise the maximum in cluster a only
    let crds = res(
        &a,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let mut now = a.get(&crds, None, "gadgets.memo.example.com").unwrap();
    now["spec"] = crd(100)["spec"].clone();
    a.update(
        &crds,
        None,
        "gadgets.memo.example.com",
        now,
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    let ga = res(&a, "memo.example.com", "v1", "gadgets");
    a.create(&ga, None, gadget("big", 50), &opts("t")).unwrap();
    let gb = res(&b, "memo.example.com", "v1", "gadgets");
    assert_eq!(
        b.create(&gb, None, gadget("big", 50), &opts("t"))
            .unwrap_err()
            .code,
        422
    );
    // and back down: the earlier compilation is found again, and applies at once
    let mut now = a.get(&crds, None, "gadgets.memo.example.com").unwrap();
    now["spec"] = crd(10)["spec"].clone();
    a.update(
        &crds,
        None,
        "gadgets.memo.example.com",
        now,
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert_eq!(
        a.create(&ga, None, gadget("bigger", 60), &opts("t"))
            .unwrap_err()
            .code,
        422
    );
}

/// A write hands back the stored JSON only where it is byte for byte the served object
/// (the HTTP layer then sends it as is).
#[test]
fn write_results_carry_the_stored_json_only_when_it_is_the_served_form() {
    let c = cluster();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
    }}});
    c.create(
        &crds,
        None,
        json!({
            "metadata": {"name": "sprockets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "sprockets", "kind": "Sprocket"},
                "scope": "Cluster",
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "schema": schema},
                    {"name": "v2", "served": true, "storage": false, "schema": schema},
                ],
            },
        }),
        &opts("t"),
    )
    .unwrap();
    let same = |r: &kubesim_store::WriteResult| {
        let json = r.json.as_deref().expect("stored JSON");
        assert_eq!(json, serde_json::to_string(&r.object).unwrap());
    };
    let v1 = res(&c, "example.com", "v1", "sprockets");
    let body = |v: &str, size: i64| json!({"apiVersion": format!("example.com/{v}"), "kind": "Sprocket", "metadata": {"name": "p"}, "spec": {"size": size}});
    let mut created = body("v1", 1);
    created["metadata"]["name"] = json!("s");
    same(&c.create(&v1, None, created, &opts("t")).unwrap());
    let applied = c
        .patch(
            &v1,
            None,
            "p",
            PatchType::Apply,
            &body("v1", 2),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap();
    same(&applied);
    // a no-op write stores nothing, so there is nothing to reuse
    let noop = c
        .patch(
            &v1,
            None,
            "p",
            PatchType::Apply,
            &body("v1", 2),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap();
    assert!(noop.json.is_none());
    // served in another version than stored: the response must be serialised afresh
    let v2 = res(&c, "example.com", "v2", "sprockets");
    let r = c
        .patch(
            &v2,
            None,
            "s",
            PatchType::Merge,
            &json!({"spec": {"size": 3}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap();
    assert!(r.json.is_none());
    assert_eq!(r.object["apiVersion"], "example.com/v2");
    // built-in kinds
    let cms = res(&c, "", "v1", "configmaps");
    let cm = json!({"metadata": {"name": "c"}, "data": {"k": "v"}});
    same(&c.create(&cms, Some("default"), cm, &opts("t")).unwrap());
}
