//! The HTTP surface: public paths, 401 for anonymous, HTTP/1.1 and HTTP/2, OIDC discovery
//! and key rotation, Table output, `Warning` headers, Status errors.

use http::Method;
use kubesim::testing::{HttpVersion, raw_request};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use serde_json::json;

async fn start() -> (Kubesim, ClusterHandle) {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let c = sim.cluster("hub").unwrap();
    (sim, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_paths_and_anonymous_401_over_both_http_versions() {
    let (_sim, c) = start().await;
    for version in [HttpVersion::Http1, HttpVersion::Http2] {
        let want_alpn: &[u8] = match version {
            HttpVersion::Http1 => b"http/1.1",
            HttpVersion::Http2 => b"h2",
        };
        for path in ["/healthz", "/livez", "/readyz", "/version"] {
            let r = raw_request(&c, Method::GET, path, None, None, version)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(r.alpn.as_deref(), Some(want_alpn));
        }
        for path in ["/api", "/apis", "/api/v1/namespaces", "/openapi/v3"] {
            let r = raw_request(&c, Method::GET, path, None, None, version)
                .await
                .unwrap();
            assert_eq!(r.status, 401, "{path}");
            assert_eq!(r.json()["kind"], "Status");
            assert_eq!(r.json()["reason"], "Unauthorized");
        }
    }
    let admin = c.admin_token();
    let r = raw_request(
        &c,
        Method::GET,
        "/apis/nope.example.com/v1/things",
        Some(&admin),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["reason"], "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_discovery_and_signing_key_rotation() {
    let (_sim, c) = start().await;
    let conf = raw_request(
        &c,
        Method::GET,
        "/.well-known/openid-configuration",
        None,
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(conf.status, 200);
    assert_eq!(conf.json()["issuer"], c.url());
    assert_eq!(
        conf.json()["jwks_uri"],
        format!("{}/openid/v1/jwks", c.url())
    );
    let kids = |v: serde_json::Value| -> Vec<String> {
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_string())
            .collect()
    };
    let before = kids(
        raw_request(
            &c,
            Method::GET,
            "/openid/v1/jwks",
            None,
            None,
            HttpVersion::Http1,
        )
        .await
        .unwrap()
        .json(),
    );
    assert_eq!(before.len(), 1);
    c.rotate_sa_signing_key().await.unwrap();
    let after = kids(
        raw_request(
            &c,
            Method::GET,
            "/openid/v1/jwks",
            None,
            None,
            HttpVersion::Http1,
        )
        .await
        .unwrap()
        .json(),
    );
    assert_eq!(after.len(), 2);
    assert_eq!(after[1], before[0], "the previous key stays published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_documents_have_kube_shapes() {
    let (_sim, c) = start().await;
    let admin = c.admin_token();
    let get = |p: &'static str| {
        let c = c.clone();
        let admin = admin.clone();
        async move {
            raw_request(&c, Method::GET, p, Some(&admin), None, HttpVersion::Http1)
                .await
                .unwrap()
                .json()
        }
    };
    let api = get("/api").await;
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let v1 = get("/api/v1").await;
    assert_eq!(v1["kind"], "APIResourceList");
    let names: Vec<&str> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for want in [
        "pods",
        "pods/status",
        "namespaces",
        "serviceaccounts",
        "serviceaccounts/token",
        "secrets",
        "configmaps",
        "events",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let apis = get("/apis").await;
    assert_eq!(apis["kind"], "APIGroupList");
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for want in [
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
        "coordination.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "events.k8s.io",
    ] {
        assert!(groups.contains(&want), "{want} missing from {groups:?}");
    }
    let index = get("/openapi/v3").await;
    let url = index["paths"]["api/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(url.starts_with("/openapi/v3/api/v1?hash="));
    let doc = get("/openapi/v3/api/v1").await;
    let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"]["kind"],
        "ConfigMap"
    );
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation")
    );
    let v2 = raw_request(
        &c,
        Method::GET,
        "/openapi/v2",
        Some(&admin),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(v2.status, 404, "OpenAPI v2 is deliberately not served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_output_and_warnings() {
    let (_sim, c) = start().await;
    let admin = c.admin_token();
    let crd = kubesim::parse_crds(
        "spire.spiffe.io_clusterspiffeids.yaml",
        upstream_crds::upstream_yaml("spire.spiffe.io_clusterspiffeids.yaml"),
    )
    .unwrap();
    kubesim::install_crd(&c.store(), crd[0].clone()).unwrap();
    let body = json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID", "metadata": {"name": "w"}, "spec": {"spiffeIDTemplate": "spiffe://x/y", "bogus": 1}});
    let created = raw_request(
        &c,
        Method::POST,
        "/apis/spire.spiffe.io/v1alpha1/clusterspiffeids?fieldValidation=Warn",
        Some(&admin),
        Some(&body),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(created.status, 201, "{:?}", created.body);
    let warning = created
        .headers
        .get("warning")
        .map(|w| w.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(
        warning.starts_with("299 - ") && warning.contains("bogus"),
        "warning header: {warning:?}"
    );

    assert!(
        created.json()["spec"].get("bogus").is_none(),
        "unknown fields are pruned"
    );
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t", "namespace": "default"}});
    let r = raw_request(
        &c,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        Some(&admin),
        Some(&cm),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 201);

    // Table: ask the way kubectl does.
    let table = {
        let r = kubesim::testing::raw_request_with_headers(
            &c,
            Method::GET,
            "/api/v1/namespaces/default/configmaps",
            Some(&admin),
            &[(
                "accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            )],
        )
        .await
        .unwrap();
        r.json()
    };
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["columnDefinitions"][0]["name"], "Name");
    let rows = table["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["cells"][0] == "t"));
    assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_discovery_when_asked_first() {
    let (_sim, c) = start().await;
    let admin = c.admin_token();
    let accept =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let r = kubesim::testing::raw_request_with_headers(
        &c,
        Method::GET,
        "/apis",
        Some(&admin),
        &[("accept", accept)],
    )
    .await
    .unwrap();
    assert_eq!(
        r.headers.get("content-type").unwrap(),
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let doc = r.json();
    assert_eq!(doc["kind"], "APIGroupDiscoveryList");
    let rbac = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["metadata"]["name"] == "rbac.authorization.k8s.io")
        .expect("rbac group");
    assert!(
        rbac["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resource"] == "clusterroles" && r["scope"] == "Cluster")
    );
    let core = kubesim::testing::raw_request_with_headers(
        &c,
        Method::GET,
        "/api",
        Some(&admin),
        &[("accept", accept)],
    )
    .await
    .unwrap()
    .json();
    let pods = core["items"][0]["versions"][0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resource"] == "pods")
        .cloned()
        .unwrap();
    assert_eq!(pods["subresources"][0]["subresource"], "status");
    // Without the v2 media type first, the legacy document.
    let legacy = raw_request(
        &c,
        Method::GET,
        "/api",
        Some(&admin),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(legacy.json()["kind"], "APIVersions");
}
