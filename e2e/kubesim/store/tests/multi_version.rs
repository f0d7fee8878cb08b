//! The vendored two-version ClusterProfile CRD (cluster-inventory-api v0.2.0: v1alpha1
//! storage, v1alpha2 served, `None` conversion): each version's schema prunes and validates
//! writes through it, reads through either version rewrite `apiVersion` and show the
//! object as that version's schema allows, watches work through either version, and
//! updating the CRD adds or removes a version while the cluster runs.

mod common;

use common::*;
use kubesim_store::{PatchType, Subresource, WatchOptions};
use serde_json::{Value, json};

fn crds(c: &kubesim_store::Cluster) -> kubesim_store::ResourceInfo {
    res(c, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

fn crd_doc(yaml: &str) -> Value {
    serde_saphyr::from_str(yaml).unwrap()
}

fn profile(version: &str, name: &str, manager: &str) -> Value {
    json!({
        "apiVersion": format!("multicluster.x-k8s.io/{version}"),
        "kind": "ClusterProfile",
        "metadata": {"name": name, "namespace": "fleet"},
        "spec": {"displayName": name, "clusterManager": {"name": manager}},
    })
}

fn status_patch(server: &str, with_credential_providers: bool) -> Value {
    let mut status = json!({
        "accessProviders": [{"name": "kubeconfig", "cluster": {"server": server}}],
    });
    if with_credential_providers {
        status["credentialProviders"] =
            json!([{"name": "secretreader", "cluster": {"server": server}}]);
    }
    json!({"status": status})
}

/// Install the v1alpha1-only CRD, then update it in place to the two-version one.
fn install_then_upgrade(c: &kubesim_store::Cluster) {
    let crd_res = crds(c);
    c.create(
        &crd_res,
        None,
        crd_doc(upstream_crds::upstream_yaml(
            "multicluster.x-k8s.io_clusterprofiles.yaml",
        )),
        &opts("t"),
    )
    .unwrap();
    assert!(
        c.resolve("multicluster.x-k8s.io", "v1alpha1", "clusterprofiles")
            .is_some()
    );
    assert!(
        c.resolve("multicluster.x-k8s.io", "v1alpha2", "clusterprofiles")
            .is_none()
    );
    let live = c
        .get(&crd_res, None, "clusterprofiles.multicluster.x-k8s.io")
        .unwrap();
    let mut two = crd_doc(upstream_crds::CLUSTERPROFILE_V1ALPHA2.yaml);
    two["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
    c.update(
        &crd_res,
        None,
        "clusterprofiles.multicluster.x-k8s.io",
        two,
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
}

fn ns(c: &kubesim_store::Cluster) {
    let nss = res(c, "", "v1", "namespaces");
    c.create(
        &nss,
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}),
        &opts("t"),
    )
    .unwrap();
}

#[tokio::test]
async fn a_crd_updated_to_two_versions_serves_both_without_restart() {
    let c = cluster();
    ns(&c);
    install_then_upgrade(&c);
    let v1 = res(&c, "multicluster.x-k8s.io", "v1alpha1", "clusterprofiles");
    let v2 = res(&c, "multicluster.x-k8s.io", "v1alpha2", "clusterprofiles");
    assert!(v1.storage && !v2.storage);
    assert!(v2.has_status);

    let mut w1 = c
        .watch(&v1, Some("fleet"), &WatchOptions::default())
        .unwrap();
    let mut w2 = c
        .watch(&v2, Some("fleet"), &WatchOptions::default())
        .unwrap();

    // Written as v1alpha2, read as v1alpha1 and back.
    let created = c
        .create(
            &v2,
            Some("fleet"),
            profile("v1alpha2", "a", "ocm"),
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(created["apiVersion"], "multicluster.x-k8s.io/v1alpha2");
    let as_v1 = c.get(&v1, Some("fleet"), "a").unwrap();
    assert_eq!(as_v1["apiVersion"], "multicluster.x-k8s.io/v1alpha1");
    assert_eq!(as_v1["spec"]["clusterManager"]["name"], "ocm");
    // Written as v1alpha1, read as v1alpha2.
    c.create(
        &v1,
        Some("fleet"),
        profile("v1alpha1", "b", "ocm"),
        &opts("t"),
    )
    .unwrap();
    assert_eq!(
        c.get(&v2, Some("fleet"), "b").unwrap()["apiVersion"],
        "multicluster.x-k8s.io/v1alpha2"
    );
    // Watches through either version see both writes, each in its own version.
    for w in [&mut w1, &mut w2] {
        let a = next(w).await.unwrap();
        let b = next(w).await.unwrap();
        assert_eq!(name_of(&a), "a");
        assert_eq!(name_of(&b), "b");
        assert_eq!(a.object["apiVersion"], b.object["apiVersion"]);
    }
    let l = c.list(&v2, Some("fleet"), &Default::default()).unwrap();
    assert_eq!(l["apiVersion"], "multicluster.x-k8s.io/v1alpha2");
    assert!(
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["apiVersion"] == "multicluster.x-k8s.io/v1alpha2")
    );

    // Removing v1alpha2 from the CRD stops serving it; the objects stay, watches through
    // v1alpha2 end, watches through v1alpha1 go on.
    let mut w1 = c
        .watch(&v1, Some("fleet"), &WatchOptions::default())
        .unwrap();
    let mut w2 = c
        .watch(&v2, Some("fleet"), &WatchOptions::default())
        .unwrap();
    for w in [&mut w1, &mut w2] {
        next(w).await.unwrap();
        next(w).await.unwrap();
    }
    let crd_res = crds(&c);
    let mut live = c
        .get(&crd_res, None, "clusterprofiles.multicluster.x-k8s.io")
        .unwrap();
    live["spec"]["versions"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] == "v1alpha1");
    c.update(
        &crd_res,
        None,
        "clusterprofiles.multicluster.x-k8s.io",
        live,
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert!(
        c.resolve("multicluster.x-k8s.io", "v1alpha2", "clusterprofiles")
            .is_none()
    );
    assert!(c.get(&v1, Some("fleet"), "a").is_ok());
    assert!(next(&mut w2).await.is_none(), "the v1alpha2 watch ends");
    assert!(idle(&mut w1).await, "the v1alpha1 watch stays open");
    c.delete(&v1, Some("fleet"), "b", &Default::default())
        .unwrap();
    assert_eq!(next(&mut w1).await.unwrap().event_type, "DELETED");
    let e = c.get(&v2, Some("fleet"), "a").unwrap_err();
    assert_eq!(e.code, 404, "{e:?}");
}

#[tokio::test]
async fn each_version_prunes_and_validates_writes_through_it() {
    let c = cluster();
    ns(&c);
    install_then_upgrade(&c);
    let v1 = res(&c, "multicluster.x-k8s.io", "v1alpha1", "clusterprofiles");
    let v2 = res(&c, "multicluster.x-k8s.io", "v1alpha2", "clusterprofiles");
    c.create(
        &v1,
        Some("fleet"),
        profile("v1alpha1", "p", "ocm"),
        &opts("t"),
    )
    .unwrap();
    let mut w2 = c
        .watch(&v2, Some("fleet"), &WatchOptions::default())
        .unwrap();
    let mut w1 = c
        .watch(&v1, Some("fleet"), &WatchOptions::default())
        .unwrap();
    assert_eq!(next(&mut w2).await.unwrap().event_type, "ADDED");
    assert_eq!(next(&mut w1).await.unwrap().event_type, "ADDED");

    // status.credentialProviders exists in v1alpha1 only: kept through v1alpha1 ...
    c.patch(
        &v1,
        Some("fleet"),
        "p",
        PatchType::Merge,
        &status_patch("https://a.example:6443", true),
        Subresource::Status,
        &opts("t"),
    )
    .unwrap();
    let got = c.get(&v1, Some("fleet"), "p").unwrap();
    assert_eq!(
        got["status"]["credentialProviders"][0]["name"],
        "secretreader"
    );
    // ... not shown through v1alpha2 (the served version's schema prunes on read, as
    // kube-apiserver's schema-coercing converter does) ...
    let got = c.get(&v2, Some("fleet"), "p").unwrap();
    assert!(got["status"].get("credentialProviders").is_none(), "{got}");
    assert_eq!(
        got["status"]["accessProviders"][0]["cluster"]["server"],
        "https://a.example:6443"
    );
    // ... the same for watch events: live ones through each version.
    let ev = next(&mut w2).await.unwrap();
    assert_eq!(ev.event_type, "MODIFIED");
    assert_eq!(ev.object["apiVersion"], "multicluster.x-k8s.io/v1alpha2");
    assert!(
        ev.object["status"].get("credentialProviders").is_none(),
        "{}",
        ev.object
    );
    let ev = next(&mut w1).await.unwrap();
    assert_eq!(
        ev.object["status"]["credentialProviders"][0]["name"],
        "secretreader"
    );
    // A watch through v1alpha2 started now sees the same in its initial events.
    let mut w2 = c
        .watch(&v2, Some("fleet"), &WatchOptions::default())
        .unwrap();
    let ev = next(&mut w2).await.unwrap();
    assert!(
        ev.object["status"].get("credentialProviders").is_none(),
        "{}",
        ev.object
    );
    // ... and pruned when written through v1alpha2.
    c.create(
        &v2,
        Some("fleet"),
        profile("v1alpha2", "q", "ocm"),
        &opts("t"),
    )
    .unwrap();
    let w = c
        .patch(
            &v2,
            Some("fleet"),
            "q",
            PatchType::Merge,
            &status_patch("https://b.example", true),
            Subresource::Status,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert!(w["status"].get("credentialProviders").is_none(), "{w}");
    let stored = c.get(&v1, Some("fleet"), "q").unwrap();
    assert!(
        stored["status"].get("credentialProviders").is_none(),
        "{stored}"
    );
    assert_eq!(
        stored["status"]["accessProviders"][0]["cluster"]["server"],
        "https://b.example"
    );

    // v1alpha2's CEL rules apply to status writes through v1alpha2, with the field path.
    let e = c
        .patch(
            &v2,
            Some("fleet"),
            "q",
            PatchType::Merge,
            &status_patch("not-a-url", false),
            Subresource::Status,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert_eq!(e.reason, "Invalid");
    assert_eq!(
        e.message,
        "ClusterProfile.multicluster.x-k8s.io \"q\" is invalid: status.accessProviders[0].cluster.server: Invalid value: \"string\": server must be a valid absolute URL with a host"
    );
    let e = c
        .patch(&v2, Some("fleet"), "q", PatchType::Merge, &json!({"status": {"accessProviders": [{"name": "kubeconfig", "cluster": {"server": "https://ok", "proxy-url": "ftp://proxy"}}]}}), Subresource::Status, &opts("t"))
        .unwrap_err();
    assert!(e.message.contains("status.accessProviders[0].cluster.proxy-url: Invalid value: \"string\": proxy-url must be a valid absolute URL with scheme http, https or socks5 and a host"), "{}", e.message);
    // v1alpha1 has no such rule: the same write through it is accepted.
    c.patch(
        &v1,
        Some("fleet"),
        "q",
        PatchType::Merge,
        &status_patch("not-a-url", false),
        Subresource::Status,
        &opts("t"),
    )
    .unwrap();

    // clusterManager.name must be a label value through v1alpha2 only.
    let e = c
        .create(
            &v2,
            Some("fleet"),
            profile("v1alpha2", "bad", "not a label"),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.clusterManager.name: Invalid value: \"string\": must be a valid Kubernetes label value"),
        "{}",
        e.message
    );
    c.create(
        &v1,
        Some("fleet"),
        profile("v1alpha1", "bad", "not a label"),
        &opts("t"),
    )
    .unwrap();
}

#[test]
fn a_crd_with_a_rule_kubesim_cannot_evaluate_is_refused() {
    let c = cluster();
    let crd = json!({
        "metadata": {"name": "things.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "things", "kind": "Thing"},
            "scope": "Cluster",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {"v": {"type": "string",
                    "x-kubernetes-validations": [{"rule": "sets.equivalent([self], [self])"}]}}}}
            }}}],
        },
    });
    let e = c.create(&crds(&c), None, crd, &opts("t")).unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.versions[0].schema.openAPIV3Schema: Invalid value: \"sets.equivalent([self], [self])\": kubesim cannot evaluate this rule: unsupported function(s): sets.equivalent"),
        "{}",
        e.message
    );
    assert!(c.resolve("example.com", "v1", "things").is_none());
}

/// Moving storage to v1alpha2 and dropping v1alpha1 is refused while v1alpha1 is still in
/// `status.storedVersions`, as kube-apiserver refuses it; once the storage migration is
/// recorded (storedVersions edited through /status), v1alpha1 can go.
#[test]
fn a_stored_version_cannot_leave_spec_versions() {
    let c = cluster();
    install_then_upgrade(&c);
    let crd_res = crds(&c);
    let name = "clusterprofiles.multicluster.x-k8s.io";
    let mut live = c.get(&crd_res, None, name).unwrap();
    // Storage moves to v1alpha2: both are now stored versions.
    for v in live["spec"]["versions"].as_array_mut().unwrap() {
        let is_v2 = v["name"] == "v1alpha2";
        v["storage"] = json!(is_v2);
    }
    let live = c
        .update(&crd_res, None, name, live, Subresource::Main, &opts("t"))
        .unwrap()
        .object;
    let live = c.get(&crd_res, None, name).unwrap_or(live);
    assert_eq!(
        live["status"]["storedVersions"],
        json!(["v1alpha1", "v1alpha2"])
    );
    let mut drop_v1 = live.clone();
    drop_v1["spec"]["versions"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] == "v1alpha2");
    let e = c
        .update(
            &crd_res,
            None,
            name,
            drop_v1.clone(),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "status.storedVersions[0]: Invalid value: \"v1alpha1\": must appear in spec.versions"
        ),
        "{}",
        e.message
    );
    // Record the migration, then v1alpha1 can be dropped.
    c.patch(
        &crd_res,
        None,
        name,
        PatchType::Merge,
        &json!({"status": {"storedVersions": ["v1alpha2"]}}),
        Subresource::Status,
        &opts("t"),
    )
    .unwrap();
    let mut drop_v1 = c.get(&crd_res, None, name).unwrap();
    drop_v1["spec"]["versions"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] == "v1alpha2");
    c.update(&crd_res, None, name, drop_v1, Subresource::Main, &opts("t"))
        .unwrap();
    assert!(
        c.resolve("multicluster.x-k8s.io", "v1alpha1", "clusterprofiles")
            .is_none()
    );
    assert!(
        c.resolve("multicluster.x-k8s.io", "v1alpha2", "clusterprofiles")
            .is_some()
    );
}
