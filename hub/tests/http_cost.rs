//! Cost of the hub API's fleet-wide responses at 1000 spokes x 100 bindings: `/v1/report`,
//! `/v1/clusters` and `/metrics`, served by the real router over a `FleetState` built in
//! memory (no network, no spoke). Prints time per request and body size; asserts nothing
//! about time (the machine may be shared).
//!
//! `cargo test -p kleym-hub --release --test hub http_cost:: -- --ignored --nocapture`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use futures::future::BoxFuture;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kleym_api::{ConflictPeer, IdentityMode};
use kleym_hub::fleet::{FleetState, Phase, SpokeMetricsCollector};
use kleym_hub::http::HubView;
use kleym_hub::http::auth::{
    AccessCheck, AccessDecision, ApiAuth, AuthConfig, AuthMode, Caller, ReviewError, Reviewer,
    TokenReviewStatus,
};
use kleym_hub::http::{ApiMetrics, ApiState, router};
use kleym_hub::inventory::InventorySynced;
use kleym_hub::report::FullReport;
use kleym_hub::runtime::view::{FleetCollector, FleetHubView, LeaderInfo};
use kleym_spoke::reconciler::queue::ObjectKey;
use kleym_spoke::reconciler::snapshot::BindingSnapshot;
use prometheus_client::registry::Registry;
use tower::ServiceExt;

const SPOKES: usize = 1000;
const BINDINGS: usize = 100;
const ROUNDS: usize = 5;

/// Never asked: the API runs with auth mode `off`.
#[derive(Debug)]
struct NoReviews;

impl Reviewer for NoReviews {
    fn review_token<'a>(
        &'a self,
        _token: &'a str,
        _audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>> {
        Box::pin(async { Err(ReviewError::Timeout("TokenReview")) })
    }

    fn review_access<'a>(
        &'a self,
        _caller: &'a Caller,
        _check: &'a AccessCheck,
    ) -> BoxFuture<'a, Result<AccessDecision, ReviewError>> {
        Box::pin(async { Err(ReviewError::Timeout("SubjectAccessReview")) })
    }
}

/// Binding `i` of spoke `c`: the same objective IDs in every spoke (one workload fleet-wide),
/// with findings: every 100th spoke compiles binding 0 from another service account
/// (cross-cluster drift) and bindings 98/99 of every spoke collide.
fn binding(c: usize, i: usize) -> BindingSnapshot {
    let ns = format!("team-{}", i % 10);
    let colliding = i >= BINDINGS - 2;
    let sa = if i == 0 && c.is_multiple_of(100) {
        "other-sa".to_string()
    } else {
        format!("sa-{i}")
    };
    BindingSnapshot {
        namespace: ns.clone(),
        name: format!("binding-{i}"),
        mode: IdentityMode::PerObjective,
        spiffe_ids: vec![format!(
            "spiffe://fleet.example/ns/{ns}/objective/objective-{i}"
        )],
        service_account: Some(sa),
        container_discriminator: Some("k8s:container-name:vllm".into()),
        pool_selector: vec![("app".to_string(), format!("pool-{i}"))],
        ready: !colliding,
        reason: Some(if colliding {
            "IdentityCollision".into()
        } else {
            "Compiled".into()
        }),
        message: colliding.then(|| "collides with another binding".into()),
        conflict_peers: if colliding {
            let peer = if i == BINDINGS - 1 { i - 1 } else { i + 1 };
            vec![ConflictPeer {
                name: format!("binding-{peer}"),
                reason: "IdentityCollision".into(),
            }]
        } else {
            Vec::new()
        },
        warnings: Vec::new(),
    }
}

fn fleet() -> FleetState {
    let state = FleetState::new();
    state.set_leader(true);
    for c in 0..SPOKES {
        let name = format!("fleet/spoke-{c:04}");
        let bindings: Vec<Arc<BindingSnapshot>> =
            (0..BINDINGS).map(|i| Arc::new(binding(c, i))).collect();
        state.update(&name, |s| {
            s.phase = Phase::Engaged;
            s.trust_domain = Some("fleet.example".into());
            s.version = Some("v1.33.0".into());
            s.last_sync = chrono::DateTime::from_timestamp(1_800_000_000, 0);
            s.bindings = Arc::new(bindings);
        });
        // What a running reconciler leaves in its metrics.
        let metrics = state.spoke_metrics().attach(&name);
        let m = metrics.metrics();
        for i in 0..BINDINGS {
            m.observe_reconcile(Duration::from_millis(3), None);
            m.observe_outcome(
                &ObjectKey::new(format!("team-{}", i % 10), format!("binding-{i}")),
                "Ready",
                "Compiled",
            );
            m.count_write("status_apply");
        }
        // Keep the spoke listed for the whole run.
        std::mem::forget(metrics);
    }
    state
}

fn app(state: &FleetState) -> Router {
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    registry.register_collector(Box::new(FleetCollector::new(state.clone())));
    registry.register_collector(Box::new(SpokeMetricsCollector::new(
        state.spoke_metrics().clone(),
    )));
    let auth = ApiAuth::new(
        AuthConfig::new(AuthMode::Off, "kleym-hub"),
        Arc::new(NoReviews),
        metrics.clone(),
    );
    let view = Arc::new(FleetHubView::new(
        state.clone(),
        InventorySynced::default(),
        LeaderInfo::always_leader(),
    ));
    router(ApiState {
        view,
        registry: Arc::new(registry),
        auth,
        metrics,
    })
}

async fn get(app: &Router, path: &str) -> (Duration, usize) {
    let started = Instant::now();
    let resp = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (started.elapsed(), body.len())
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
async fn fleet_wide_responses_at_1000_spokes() {
    let built = Instant::now();
    let state = fleet();
    println!(
        "fleet state: {SPOKES} spokes x {BINDINGS} bindings built in {:?}",
        built.elapsed()
    );
    let app = app(&state);
    for path in ["/v1/report", "/v1/clusters", "/metrics"] {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..ROUNDS {
            let (t, n) = get(&app, path).await;
            times.push(t);
            bytes = n;
        }
        let first = times[0];
        let rest = &times[1..];
        let mean_rest = rest.iter().sum::<Duration>() / rest.len() as u32;
        println!(
            "{path:<13} {bytes:>11} bytes  first {first:>12.3?}  then mean {mean_rest:>12.3?} (unchanged state, {} requests)",
            rest.len()
        );
        // One change, then the next request.
        state.update("fleet/spoke-0000", |s| s.consecutive_failures += 1);
        let (t, _) = get(&app, path).await;
        println!("{path:<13} after one change {t:>12.3?}");
    }
    uncached_builds(&state);
}

/// What every request cost before the bodies were kept: the build alone, each time.
fn uncached_builds(state: &FleetState) {
    let view = FleetHubView::new(
        state.clone(),
        InventorySynced::default(),
        LeaderInfo::always_leader(),
    );
    let timed = |what: &str, f: &dyn Fn() -> usize| {
        let started = Instant::now();
        let mut bytes = 0;
        for _ in 0..ROUNDS {
            bytes = f();
        }
        println!(
            "build only: {what:<40} {bytes:>11} bytes  mean {:>12.3?}",
            started.elapsed() / ROUNDS as u32
        );
    };
    timed("report (FullReport::from_fleet + JSON)", &|| {
        let report = FullReport::from_fleet(state, chrono::Utc::now());
        serde_json::to_vec(&report).unwrap().len()
    });
    timed("report analysis only (FullReport::from_fleet)", &|| {
        FullReport::from_fleet(state, chrono::Utc::now())
            .spokes
            .len()
    });
    timed("clusters (HubView::clusters + JSON)", &|| {
        let items = view.clusters();
        serde_json::to_vec(&items).unwrap().len()
    });
    timed("fleet series (a fresh FleetCollector)", &|| {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(FleetCollector::new(state.clone())));
        encode(&registry)
    });
    timed("spoke reconcile series (1000 spokes)", &|| {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SpokeMetricsCollector::new(
            state.spoke_metrics().clone(),
        )));
        encode(&registry)
    });
}

fn encode(registry: &Registry) -> usize {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out.len()
}
