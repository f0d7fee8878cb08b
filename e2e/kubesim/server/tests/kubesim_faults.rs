//! Fault injection: one test per fault kind, through the Rust API and the HTTP endpoint.

use futures::TryStreamExt;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kubesim::testing::{HttpVersion, raw_request};
use kubesim::{ClusterHandle, ErrorRule, Kubesim, KubesimOptions};
use serde_json::json;
use std::time::{Duration, Instant};

async fn start() -> (Kubesim, ClusterHandle, Api<ConfigMap>) {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .expect("kubesim starts");
    let c = sim.cluster("hub").unwrap();
    let api = Api::namespaced(c.kube_client().await.unwrap(), "default");
    (sim, c, api)
}

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_delays_every_request() {
    let (_sim, c, api) = start().await;
    api.list(&ListParams::default()).await.unwrap(); // warm the connection
    c.faults().set_latency(Duration::from_millis(300));
    let t = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    c.faults().set_latency(Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_rules_fail_matching_requests_only() {
    // kube-rs retries 429/503/504 with backoff (up to 15 times), so those codes are checked
    // over raw HTTP; 500 surfaces at once through the client.
    let (_sim, c, api) = start().await;
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    let rule = |verb: Option<&str>, code| ErrorRule {
        verb: verb.map(str::to_string),
        resource: Some("configmaps".into()),
        rate: 1.0,
        code,
    };
    c.faults().add_error_rule(rule(Some("list"), 500)).unwrap();
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 500);
            assert_eq!(s.reason, "InternalError");
        }
        other => panic!("expected 500, got {other:?}"),
    }
    api.get("x").await.expect("get is not matched by the rule");
    c.faults().clear_error_rules();

    let admin = c.admin_token();
    let path = "/api/v1/namespaces/default/configmaps/x";
    for (code, reason) in [(503, "ServiceUnavailable"), (429, "TooManyRequests")] {
        c.faults().add_error_rule(rule(Some("get"), code)).unwrap();
        let r = raw_request(
            &c,
            Method::GET,
            path,
            Some(&admin),
            None,
            HttpVersion::Http1,
        )
        .await
        .unwrap();
        assert_eq!(r.status, code);
        assert_eq!(r.json()["reason"], reason);
        if code == 429 {
            assert_eq!(r.headers.get("retry-after").unwrap(), "1");
        }
        c.faults().clear_error_rules();
    }
    // A rule with rate 0 never fires.
    c.faults()
        .add_error_rule(ErrorRule {
            verb: None,
            resource: None,
            rate: 0.0,
            code: 500,
        })
        .unwrap();
    api.list(&ListParams::default()).await.unwrap();
    c.faults().clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_watches_ends_open_streams() {
    let (_sim, c, api) = start().await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.faults().drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.try_next().await.unwrap() {
            assert!(
                matches!(ev, WatchEvent::Bookmark(_)),
                "no events expected: {ev:?}"
            );
        }
    })
    .await;
    assert!(end.is_ok(), "the watch stream must end after dropWatches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_gone_answers_the_next_watches_with_410() {
    let (_sim, c, api) = start().await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    c.faults().force_gone_on_next_watches(1);
    let stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // Only one was forced: the next watch works.
    let stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    api.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ev, Some(WatchEvent::Added(_))), "{ev:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_accepts_but_never_answers_until_lifted() {
    let (_sim, c, _api) = start().await;
    c.faults().set_blackhole(true);
    let before = c.server().connections.snapshot();
    // A fresh connection: TCP is accepted, but not even the TLS handshake is answered.
    let tcp = tokio::net::TcpStream::connect(c.server().addr).await;
    assert!(tcp.is_ok(), "blackhole accepts TCP");
    let c2 = c.clone();
    let pending = tokio::spawn(async move {
        raw_request(&c2, Method::GET, "/version", None, None, HttpVersion::Http1).await
    });
    // Seen, not waited for: kubesim holds both connections (the bare one and the request's).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.server().connections.snapshot().blackholed < before.blackholed + 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubesim never held the connections: {:?}",
            c.server().connections.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Held before its TLS handshake: the request cannot have been answered.
    assert!(!pending.is_finished(), "no answer while blackholed");
    assert_eq!(
        c.server().connections.snapshot().accepted,
        before.accepted,
        "no handshake completed while blackholed"
    );
    c.faults().set_blackhole(false);
    let r = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        r.status, 200,
        "the held connection proceeds once the blackhole is lifted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_until_lifted() {
    let (_sim, c, api) = start().await;
    api.list(&ListParams::default()).await.unwrap();
    c.faults().set_refuse_connections(true);
    let mut refused = false;
    for _ in 0..100 {
        match tokio::net::TcpStream::connect(c.server().addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(refused, "the port must refuse connections");
    assert!(
        api.list(&ListParams::default()).await.is_err(),
        "pooled connections are dropped too"
    );
    c.faults().set_refuse_connections(false);
    let mut ok = false;
    for _ in 0..100 {
        if api.list(&ListParams::default()).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the cluster serves again on the same port");
}

/// While connections are refused the port stays the cluster's: no other socket of the
/// machine can take it (one that did, e.g. a client's connection given it as its ephemeral
/// port, would keep the cluster from listening there again), and it listens there again
/// once the refusal is lifted. No connection was ever made to it, so no closed connection
/// lingering on the port holds it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_cluster_keeps_its_port() {
    let (_sim, c, api) = start().await;
    let addr = c.server().addr;
    c.faults().set_refuse_connections(true);
    let mut refused = false;
    for _ in 0..100 {
        match tokio::net::TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(refused, "the port must refuse connections");
    let taken = tokio::net::TcpSocket::new_v4()
        .unwrap()
        .bind(addr)
        .map(drop);
    let e = taken.expect_err("another socket took the refused port");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    c.faults().set_refuse_connections(false);
    let mut ok = false;
    for _ in 0..100 {
        if api.list(&ListParams::default()).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the cluster serves again on the same port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoint_is_admin_only_and_drives_faults() {
    let (_sim, c, api) = start().await;
    let admin = c.admin_token();
    let get = raw_request(
        &c,
        Method::GET,
        "/kubesim/faults",
        Some(&admin),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(get.status, 200);
    assert_eq!(get.json()["latencyMs"], 0);

    let body = json!({"errors": [{"verb": "create", "resource": "configmaps", "rate": 1.0, "code": 500}], "latencyMs": 1});
    let post = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&body),
        HttpVersion::Http2,
    )
    .await
    .unwrap();
    assert_eq!(post.status, 200, "{:?}", post.body);
    assert_eq!(post.json()["errors"][0]["code"], 500);
    assert!(api.create(&PostParams::default(), &cm("y")).await.is_err());

    let bad = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&json!({"errors": [{"rate": 1.0, "code": 404}]})),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(bad.status, 400);
    let unknown = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&json!({"latency": 5})),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(unknown.status, 400, "unknown fields are rejected");

    // Revoke a token over HTTP: the response never echoes it.
    let victim = "victim-token-value";
    c.add_static_token(victim, kubesim::clusters::user("victim", &[]));
    let revoke = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&json!({"revokeTokens": [victim]})),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert!(!String::from_utf8_lossy(&revoke.body).contains(victim));
    let r = raw_request(
        &c,
        Method::GET,
        "/api",
        Some(victim),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);

    // Non-admins get 403, anonymous 401.
    c.add_static_token("dev-token", kubesim::clusters::user("dev", &["devs"]));
    let r = raw_request(
        &c,
        Method::DELETE,
        "/kubesim/faults",
        Some("dev-token"),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    let r = raw_request(
        &c,
        Method::DELETE,
        "/kubesim/faults",
        None,
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);

    let del = raw_request(
        &c,
        Method::DELETE,
        "/kubesim/faults",
        Some(&admin),
        None,
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert_eq!(del.status, 200);
    assert!(del.json()["errors"].as_array().unwrap().is_empty());
    api.create(&PostParams::default(), &cm("y")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_after_lifts_a_blackhole() {
    let (_sim, c, _api) = start().await;
    let admin = c.admin_token();
    let body = json!({"blackhole": true, "clearAfterSeconds": 1});
    let r = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&body),
        HttpVersion::Http1,
    )
    .await
    .unwrap();
    assert!(r.json()["blackhole"].as_bool().unwrap());
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw_request(&c, Method::GET, "/version", None, None, HttpVersion::Http1),
    )
    .await
    .expect("answered after clearAfterSeconds")
    .unwrap();
    assert_eq!(r.status, 200);
    assert!(!c.faults().snapshot().blackhole);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_only_refuses_http2_until_lifted() {
    let (_sim, c, _api) = start().await;
    let admin = c.admin_token();
    let post = |body: serde_json::Value| {
        let c = c.clone();
        let admin = admin.clone();
        async move {
            raw_request(
                &c,
                Method::POST,
                "/kubesim/faults",
                Some(&admin),
                Some(&body),
                HttpVersion::Http1,
            )
            .await
            .unwrap()
        }
    };
    let version = |v| {
        let c = c.clone();
        async move { raw_request(&c, Method::GET, "/version", None, None, v).await }
    };
    assert_eq!(version(HttpVersion::Http2).await.unwrap().status, 200);
    let on = post(json!({"h1Only": true})).await;
    assert_eq!(on.json()["h1Only"], true, "{:?}", on.body);
    assert!(
        version(HttpVersion::Http2).await.is_err(),
        "a client that offers only h2 finds no common protocol"
    );
    assert_eq!(version(HttpVersion::Http1).await.unwrap().status, 200);
    post(json!({"h1Only": false})).await;
    let h2 = version(HttpVersion::Http2).await.unwrap();
    assert_eq!((h2.status, h2.alpn.as_deref()), (200, Some(&b"h2"[..])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_and_silent_connection_over_http() {
    let (_sim, c, api) = start().await;
    let admin = c.admin_token();
    // The kube client's connection is open; it takes the GOAWAY (and so does the POST's
    // own connection if it is served first: 2 are asked).
    api.list(&ListParams::default()).await.unwrap();
    let post = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&json!({"goaway": 2})),
        HttpVersion::Http2,
    )
    .await
    .unwrap();
    assert_eq!(post.status, 200, "{:?}", post.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.server().connections.snapshot().goaway_sent < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.server().connections.snapshot().goaway_sent, 2);
    // The client reconnects.
    api.list(&ListParams::default()).await.unwrap();

    // Silence: answered first, then the open connections stop answering.
    let post = raw_request(
        &c,
        Method::POST,
        "/kubesim/faults",
        Some(&admin),
        Some(&json!({"silentConnection": true})),
        HttpVersion::Http2,
    )
    .await
    .unwrap();
    assert_eq!(post.status, 200, "{:?}", post.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.faults().snapshot().silent_connections && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hung =
        tokio::time::timeout(Duration::from_millis(500), api.list(&ListParams::default())).await;
    assert!(hung.is_err(), "the silenced connection answered");
    // A new connection is served.
    let fresh = raw_request(&c, Method::GET, "/version", None, None, HttpVersion::Http1)
        .await
        .unwrap();
    assert_eq!(fresh.status, 200);
    c.faults().set_silent_connections(false);
    api.list(&ListParams::default()).await.unwrap();
}
