//! List: selectors, pagination, list metadata.

mod common;

use common::*;
use kubesim_store::ListOptions;
use serde_json::{Value, json};

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or_default(),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn label_and_field_selectors() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    for (ns, n, labels) in [
        ("default", "a", json!({"app": "web", "tier": "front"})),
        ("default", "b", json!({"app": "db"})),
        ("kube-system", "c", json!({"app": "web"})),
        ("kube-system", "d", json!({})),
    ] {
        c.create(
            &cms,
            Some(ns),
            json!({"metadata": {"name": n, "labels": labels}}),
            &opts("t"),
        )
        .unwrap();
    }
    let list = |ns: Option<&str>, l: Option<&str>, f: Option<&str>| {
        c.list(
            &cms,
            ns,
            &ListOptions {
                label_selector: l.map(str::to_string),
                field_selector: f.map(str::to_string),
                ..Default::default()
            },
        )
    };
    assert_eq!(
        names(&list(None, Some("app=web"), None).unwrap()),
        ["default/a", "kube-system/c"]
    );
    assert_eq!(
        names(
            &list(
                Some("default"),
                Some("app in (web,db),tier notin (back)"),
                None
            )
            .unwrap()
        ),
        ["default/a", "default/b"]
    );
    assert_eq!(
        names(&list(None, Some("!app"), None).unwrap()),
        ["kube-system/d"]
    );
    assert_eq!(
        names(&list(None, Some("app,app!=db"), None).unwrap()),
        ["default/a", "kube-system/c"]
    );
    assert_eq!(
        names(
            &list(
                None,
                None,
                Some("metadata.namespace!=default,metadata.name==c")
            )
            .unwrap()
        ),
        ["kube-system/c"]
    );
    let e = list(None, Some("app in web"), None).unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        e.message,
        "unable to parse requirement: found 'web', expected: '('"
    );
    let e = list(None, None, Some("data.k=v")).unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (400, "field label not supported: data.k")
    );

    // kind-specific field selectors
    let secrets = res(&c, "", "v1", "secrets");
    c.create(
        &secrets,
        Some("default"),
        json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "data": {}}),
        &opts("t"),
    )
    .unwrap();
    c.create(
        &secrets,
        Some("default"),
        json!({"metadata": {"name": "plain"}}),
        &opts("t"),
    )
    .unwrap();
    let l = c
        .list(
            &secrets,
            None,
            &ListOptions {
                field_selector: Some("type=kubernetes.io/tls".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(names(&l), ["default/tls"]);
}

#[test]
fn pagination_is_stable_and_complete() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let mut expected = Vec::new();
    for ns in ["default", "kube-public"] {
        for i in 0..12 {
            let n = format!("cm-{i:02}");
            c.create(&cms, Some(ns), json!({"metadata": {"name": n}}), &opts("t"))
                .unwrap();
            expected.push(format!("{ns}/{n}"));
        }
    }
    expected.sort();
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let l = c
            .list(
                &cms,
                None,
                &ListOptions {
                    limit: Some(5),
                    continue_token: token.clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        pages += 1;
        assert_eq!(l["kind"], "ConfigMapList");
        assert_eq!(
            l["metadata"]["resourceVersion"],
            c.current_resource_version().to_string()
        );
        let page = names(&l);
        assert!(page.len() <= 5);
        seen.extend(page);
        match l["metadata"]["continue"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
        assert!(pages < 20, "pagination does not terminate");
    }
    assert_eq!(seen, expected);
    assert_eq!(pages, 5);

    // within one namespace
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let l = c
            .list(
                &cms,
                Some("kube-public"),
                &ListOptions {
                    limit: Some(5),
                    continue_token: token.clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        seen.extend(names(&l));
        token = l["metadata"]["continue"].as_str().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    let public: Vec<String> = expected
        .iter()
        .filter(|n| n.starts_with("kube-public/"))
        .cloned()
        .collect();
    assert_eq!(seen, public);
    let e = c
        .list(
            &cms,
            None,
            &ListOptions {
                continue_token: Some("!!notatoken".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 400);
}
