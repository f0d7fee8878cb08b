//! The demo: a hub and N spokes on kubesim, a realistic inference environment with planted
//! mistakes, the kleym hub engaging every spoke through bundled credential plugins, and the
//! fleet report once everything converged.

pub mod plugin;
pub mod scenario;
pub mod setup;
pub mod table;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::fixtures::harness::{FleetHarness, RunningHub};
use kleym_hub::fleet::state::Phase;
use kleym_hub::report::FullReport;
use kleym_hub::runtime::api_router;
use kleym_hub::status::{StatusLoopOptions, WriterOptions, run_status_loop};
use serde_json::Value;

/// What the demo does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where kubeconfigs, the provider file and the report go.
    pub state_dir: PathBuf,
    /// Number of spokes.
    pub spokes: usize,
    /// Exit once converged (tests, CI) instead of running until Ctrl-C.
    pub exit_when_converged: bool,
    /// Bound of the convergence wait.
    pub timeout: Duration,
    /// SPIFFE trust domain of the whole fleet.
    pub trust_domain: String,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Setting up the simulated fleet failed.
    #[error("setup: {0}")]
    Setup(String),
    /// The fleet did not converge in time.
    #[error(
        "not converged after {0:?} (see the progress above; rerun with RUST_LOG=kleym_hub=debug)"
    )]
    Timeout(Duration),
    /// The report does not show exactly the planted findings.
    #[error("the report differs from the planted findings:\n{0}")]
    UnexpectedFindings(String),
    /// Writing into the state directory failed.
    #[error("state dir: {0}")]
    Io(#[from] std::io::Error),
}

/// Per-spoke progress: bindings settled at their generation, ready, refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Progress {
    total: usize,
    settled: usize,
    ready: usize,
}

fn progress_of(bindings: &[Value]) -> Progress {
    let mut p = Progress {
        total: bindings.len(),
        ..Progress::default()
    };
    for b in bindings {
        let generation = b["metadata"]["generation"].as_i64();
        let ready = b["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        if let Some(c) = ready
            && c["observedGeneration"].as_i64() == generation
        {
            p.settled += 1;
            if c["status"] == "True" {
                p.ready += 1;
            }
        }
    }
    p
}

/// Runs the demo; `plugin` is the command (and leading arguments) that runs the bundled
/// credential plugins.
pub async fn run(opts: &Options, plugin: &setup::PluginCommand) -> Result<(), DemoError> {
    std::fs::create_dir_all(&opts.state_dir)?;
    let state_dir = opts.state_dir.canonicalize()?;
    println!(
        "kleym demo: starting kubesim with a hub and {} spokes ...",
        opts.spokes
    );
    let names: Vec<String> = (1..=opts.spokes).map(scenario::spoke_name).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let fleet = FleetHarness::start(&name_refs, &state_dir)
        .await
        .map_err(DemoError::Setup)?;
    setup::write_state_dir(&fleet, &state_dir)?;
    for i in 1..=opts.spokes {
        setup::prepare_spoke(&fleet, i, &state_dir).await?;
    }
    let providers = setup::write_provider_file(&state_dir, plugin)?;
    setup::register_profiles(&fleet, opts.spokes).await?;
    println!(
        "  {} spokes registered as ClusterProfiles in hub namespace {} (credentials: {})",
        opts.spokes,
        crate::fixtures::profiles::PROFILE_NS,
        setup::provider_summary(opts.spokes)
    );
    println!("  credential plugins run as: {}", plugin.display());

    let flags: Vec<String> = [
        "--clusterprofile-provider-file",
        &providers.to_string_lossy(),
        "--clusterprofile-namespace",
        crate::fixtures::profiles::PROFILE_NS,
        "--trust-domain",
        &opts.trust_domain,
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let hub = fleet.start_hub(&flags).await.map_err(DemoError::Setup)?;
    // The hub API (/healthz, /readyz, /metrics, /v1/report, /v1/clusters) on loopback, plain
    // HTTP, authentication off: a local demo only (docs/http-api.md has the real setup).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hub_addr = listener.local_addr()?;
    let api_args = crate::fixtures::harness::parse_hub_args(&[
        "--api-insecure-http".to_string(),
        "--api-auth-mode=off".to_string(),
    ])
    .map_err(DemoError::Setup)?;
    let review_client = fleet
        .hub
        .kube_client()
        .await
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    let app = api_router(&hub.handle, &api_args.api, review_client);
    let api_shutdown = hub.shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { api_shutdown.cancelled().await })
            .await
    });
    // The hub's status writers: ClusterIdentityStatus per spoke, FleetIdentityReport `fleet`.
    let status_client = fleet
        .hub
        .kube_client()
        .await
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    tokio::spawn(run_status_loop(
        status_client,
        hub.handle.state.clone(),
        StatusLoopOptions {
            writer: WriterOptions {
                min_interval: Duration::from_millis(500),
                ..WriterOptions::default()
            },
            min_rebuild: Duration::from_millis(200),
            tick: Duration::from_secs(2),
            ..StatusLoopOptions::default()
        },
        hub.shutdown.clone(),
    ));
    println!("  kleym hub running (API, health and metrics on http://{hub_addr})\n");

    let result = converge(&fleet, &hub, opts).await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = hub.stop().await;
            return Err(e);
        }
    };
    let text = table::render(&report);
    println!("\n{text}");
    std::fs::write(state_dir.join("report.txt"), &text)?;
    std::fs::write(
        state_dir.join("report.json"),
        serde_json::to_string_pretty(&report).map_err(|e| DemoError::Setup(e.to_string()))?,
    )?;
    let check = compare_planted(&report, opts);
    match &check {
        Ok(()) => println!(
            "The report shows exactly the planted findings (one collision in spoke-1{}).",
            if opts.spokes >= 2 {
                ", one cross-cluster drift"
            } else {
                ""
            }
        ),
        Err(e) => eprintln!("{e}"),
    }
    // The planted mistakes from a pod's side: what SPIRE Controller Manager makes of the
    // spokes' ClusterSPIFFEIDs for one model-server pod.
    if check.is_ok() {
        for i in (1..=opts.spokes.min(2)).rev() {
            let text = explain_demo_pod(&fleet, i, opts).await?;
            if i == 1 {
                println!(
                    "\nFrom a pod's side (kleym explain pod {}/{} in spoke-1):\n\n{text}",
                    scenario::NS,
                    scenario::EXPLAINED_POD
                );
            }
            std::fs::write(
                state_dir.join(format!("explain-{}.txt", scenario::spoke_name(i))),
                &text,
            )?;
        }
    }
    print_next_steps(&state_dir, hub_addr, opts);
    if !opts.exit_when_converged && check.is_ok() {
        println!("\nRunning until Ctrl-C ...");
        let _ = tokio::signal::ctrl_c().await;
        println!("stopping");
    }
    hub.stop().await.map_err(DemoError::Setup)?;
    fleet.sim.shutdown();
    check
}

async fn converge(
    fleet: &FleetHarness,
    hub: &RunningHub,
    opts: &Options,
) -> Result<FullReport, DemoError> {
    let deadline = Instant::now() + opts.timeout;
    let mut shown: BTreeMap<String, (String, Progress)> = BTreeMap::new();
    let mut last_findings: Option<(Vec<scenario::Planted>, Instant)> = None;
    let expected_bindings = scenario::binding_count(opts.spokes);
    loop {
        let mut all_settled = true;
        for i in 1..=opts.spokes {
            let name = scenario::spoke_name(i);
            let store = fleet.spoke(&name).store();
            let p = progress_of(&crate::fixtures::env::bindings(&store));
            let spoke_state = hub.handle.state.get(&scenario::cluster_name(i));
            let phase = spoke_state
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or(Phase::Pending);
            // The hub's view trails the store by up to its snapshot interval: the report is
            // only meaningful once it has seen every binding settle as the store has.
            let hub_caught_up = spoke_state.as_ref().is_some_and(|s| {
                s.bindings.len() == p.total
                    && s.bindings.iter().filter(|b| b.reason.is_some()).count() == p.total
                    && s.bindings.iter().filter(|b| b.ready).count() == p.ready
            });
            let line = (phase.as_str().to_string(), p);
            if shown.get(&name) != Some(&line) {
                println!(
                    "  {name}: hub {:<10} bindings {}/{} settled, {} ready, {} refused",
                    line.0,
                    p.settled,
                    p.total,
                    p.ready,
                    p.settled - p.ready
                );
                shown.insert(name, line);
            }
            all_settled &= phase == Phase::Engaged && p.settled == p.total && hub_caught_up;
        }
        if all_settled {
            let report = FullReport::from_fleet(&hub.handle.state, chrono::Utc::now());
            let mut found: Vec<_> = report
                .summary
                .findings
                .iter()
                .map(table::as_planted)
                .collect();
            found.sort();
            if report.summary.bindings as usize == expected_bindings {
                // Settled: the same findings for half a second (the hub's view trails the stores).
                match &last_findings {
                    Some((prev, since))
                        if *prev == found && since.elapsed() >= Duration::from_millis(500) =>
                    {
                        return Ok(report);
                    }
                    Some((prev, _)) if *prev == found => {}
                    _ => last_findings = Some((found, Instant::now())),
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(DemoError::Timeout(opts.timeout));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn compare_planted(report: &FullReport, opts: &Options) -> Result<(), DemoError> {
    let mut found: Vec<_> = report
        .summary
        .findings
        .iter()
        .map(table::as_planted)
        .collect();
    found.sort();
    let planted = scenario::planted_findings(opts.spokes, &opts.trust_domain);
    if found == planted {
        Ok(())
    } else {
        Err(DemoError::UnexpectedFindings(format!(
            "expected {planted:#?}\nfound {found:#?}"
        )))
    }
}

/// `kleym explain pod` of the demo's model-server pod in spoke `i`, as text.
async fn explain_demo_pod(
    fleet: &FleetHarness,
    i: usize,
    opts: &Options,
) -> Result<String, DemoError> {
    let spoke = scenario::spoke_name(i);
    let client = fleet
        .spoke(&spoke)
        .kube_client()
        .await
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    let manager = kleym_spoke::explain::ManagerConfig {
        trust_domain: opts.trust_domain.clone(),
        cluster_name: spoke.clone(),
        cluster_domain: "cluster.local".into(),
        class_name: String::new(),
        watch_classless: false,
        ignore_namespaces: Vec::new(),
        parent_id_template: String::new(),
    };
    let explained = kleym_hub::explain::explain_pod(
        &client,
        scenario::NS,
        scenario::EXPLAINED_POD,
        &manager,
        kleym_spoke::reconciler::config::DEFAULT_FIELD_MANAGER,
        kleym_hub::explain::Scope::Cluster,
    )
    .await
    .map_err(|e| DemoError::Setup(format!("explain in {spoke}: {e}")))?;
    let mut out = Vec::new();
    kleym_hub::explain::render_text(&explained, &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn print_next_steps(dir: &std::path::Path, hub_addr: std::net::SocketAddr, opts: &Options) {
    let d = dir.display();
    println!("\nWhere to look next:");
    println!("  report (also as JSON):  {d}/report.txt, {d}/report.json");
    println!("  kubeconfigs:            {d}/<cluster>/kubeconfig, all contexts in {d}/kubeconfig");
    println!(
        "  a spoke's identities:   kubectl --kubeconfig {d}/spoke-1/kubeconfig get clusterspiffeids"
    );
    println!(
        "  a spoke's bindings:     kubectl --kubeconfig {d}/spoke-1/kubeconfig -n llm get inferenceidentitybindings -o yaml"
    );
    println!(
        "  the inventory:          kubectl --kubeconfig {d}/hub/kubeconfig -n fleet get clusterprofiles"
    );
    println!(
        "  a pod's identities:     kleym explain pod {}/{} --kubeconfig {d}/spoke-1/kubeconfig --trust-domain {} --cluster-name spoke-1",
        scenario::NS,
        scenario::EXPLAINED_POD,
        opts.trust_domain
    );
    println!(
        "                          (saved for spoke-1 and spoke-2 in {d}/explain-<spoke>.txt)"
    );
    println!("  the provider file:      {d}/providers.json");
    println!(
        "  hub health and metrics: curl http://{hub_addr}/readyz ; curl http://{hub_addr}/metrics"
    );
    if !opts.exit_when_converged {
        println!(
            "  stop:                   Ctrl-C (the clusters live in this process and vanish with it)"
        );
    }
}
