//! `kleym spoke`: the single-cluster operator. Runs one spoke reconciler against the
//! cluster of the current kubeconfig context (or the in-cluster ServiceAccount), with
//! `/healthz`, `/readyz` and `/metrics` on `--metrics-addr` (and the probes alone on
//! `--health-addr` when given), until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use kleym_hub::flags::{
    ResponseLimitFlags, RuntimeFlags, SvidPolicyFlags, non_blank, parse_instance, parse_log_filter,
    parse_required_trust_domain, parse_spire_class_name,
};
use kleym_hub::observe::health::{HealthListeners, ReadyCheck};
use kleym_hub::observe::logging::{self, LogFormat};
use kleym_spoke::reconciler::{CachesSynced, CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use prometheus_client::registry::Registry;

/// Arguments of `kleym spoke`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// SPIFFE trust domain of this cluster's SPIRE server (e.g. `prod.example.org`).
    /// Every generated SPIFFE ID is `spiffe://<trust-domain>/ns/<namespace>/…`. Lowercase
    /// letters, digits, `.`, `-`, `_`, without `spiffe://`; checked at start-up, since an
    /// invalid one would refuse every binding and delete every ClusterSPIFFEID.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN", value_parser = parse_required_trust_domain)]
    pub trust_domain: String,

    /// `className` of the SPIRE Controller Manager that should pick up the generated
    /// ClusterSPIFFEIDs (unset or blank: any manager without a class filter). Surrounding
    /// whitespace is dropped; control characters are refused.
    #[arg(long, env = "KLEYM_SPIRE_CLASS_NAME", value_parser = parse_spire_class_name)]
    pub spire_class_name: Option<String>,

    /// What bindings may ask for in their SVIDs, and the hub identities none may be
    /// issued.
    #[command(flatten)]
    pub svid: SvidPolicyFlags,

    /// Kubeconfig file. Default: `KUBECONFIG`, then `~/.kube/config`, then the in-cluster
    /// ServiceAccount.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// Address serving `/healthz`, `/readyz` (caches synced) and `/metrics` (Prometheus).
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub metrics_addr: SocketAddr,

    /// Address serving only `/healthz` and `/readyz`, so that kubelet probes use a port of
    /// their own, apart from `/metrics`. Unset, or equal to `--metrics-addr`: no extra
    /// listener. The probes stay on `--metrics-addr` either way.
    #[arg(long, value_name = "ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// Once every listener is bound, write the address each one got to this file, as one
    /// JSON object (`{"metrics": "127.0.0.1:41234", "health": ...}`,
    /// the listeners started only): for a supervisor or test that passes port 0 (e.g.
    /// `--metrics-addr 127.0.0.1:0`) and needs the port the system chose. Written whole
    /// (beside the file, then renamed over it).
    #[arg(long, value_name = "PATH")]
    pub listen_addrs_file: Option<std::path::PathBuf>,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, or a tracing directive such as `kleym_spoke=debug`).
    #[arg(long, default_value = "info", env = "KLEYM_LOG", value_parser = parse_log_filter)]
    pub log_level: String,

    /// Bindings reconciled concurrently.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,

    /// `--worker-threads`.
    #[command(flatten)]
    pub runtime: RuntimeFlags,

    /// `--max-response-mib`.
    #[command(flatten)]
    pub limits: ResponseLimitFlags,

    /// Seconds between discovery polls for CRDs installed or removed while running.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub discovery_interval_seconds: u64,

    /// `reportingInstance` of published events (defaults to `POD_NAME` when set); at most
    /// 128 characters, blank means unset.
    #[arg(long, env = "POD_NAME", value_parser = parse_instance)]
    pub instance: Option<String>,
}

impl Args {
    /// The reconciler configuration these arguments describe; an SVID policy that does not
    /// hold together (a suffix reaching into other namespaces' names) is refused.
    pub fn spoke_config(&self) -> Result<SpokeConfig, clap::Error> {
        let policy = self
            .svid
            .policy()
            .map_err(|e| super::usage_error("spoke", format!("invalid SVID policy: {e}")))?;
        let mut c = SpokeConfig::new(self.trust_domain.trim());
        c.class_name = non_blank(self.spire_class_name.as_ref());
        c.svid_policy = Arc::new(policy);
        c.concurrency = usize::from(self.concurrency);
        c.discovery_interval = Duration::from_secs(self.discovery_interval_seconds);
        c.event_instance = non_blank(self.instance.as_ref());
        Ok(c)
    }
}

/// Runs the operator until SIGTERM/SIGINT.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = args.spoke_config()?;
    logging::init(args.log_format, &args.log_level)?;
    let rt = super::runtime(args.runtime.worker_threads)?;
    rt.block_on(run_async(args, config))
}

/// The spoke's `/readyz`: ready once the reconciler's caches synced.
fn ready_check(readiness: CachesSynced) -> Arc<dyn ReadyCheck> {
    Arc::new(move || {
        if readiness.is_ready() {
            None
        } else {
            Some((StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response())
        }
    })
}

async fn run_async(args: &Args, config: SpokeConfig) -> anyhow::Result<()> {
    let client = kleym_hub::kubeconfig::client_with_limit(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
        args.limits.max_response_bytes(),
    )
    .await?;
    let mut registry = Registry::default();
    let metrics = Arc::new(SpokeMetrics::register(&mut registry));
    let spoke = Spoke::new(client, config, metrics)?;
    let readiness = spoke.readiness();
    let shutdown = CancellationToken::new();

    let health = HealthListeners::bind(args.metrics_addr, args.health_addr).await?;
    let bound = health.bound().context("reading the listeners' addresses")?;
    if let Some(path) = &args.listen_addrs_file {
        kleym_hub::observe::listen_addrs::write(path, &bound)?;
    }
    tracing::info!(
        addr = %args.metrics_addr,
        health_addr = ?health.health_addr(),
        listening = ?bound,
        trust_domain = %args.trust_domain,
        "kleym spoke starting"
    );
    let health = health.serve(ready_check(readiness), Arc::new(registry), shutdown.clone());
    super::signal::cancel_on_signal(shutdown.clone());

    let result = spoke.run(shutdown.clone()).await;
    shutdown.cancel();
    health.join().await;
    result.context("spoke reconciler failed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use clap::Parser;
    use kleym_hub::observe::health::{metrics_router, probe_router};

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn parses_flags_into_config() {
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--spire-class-name",
            "spire-a",
            "--concurrency",
            "8",
            "--log-format",
            "json",
        ])
        .unwrap();
        let c = w.args.spoke_config().unwrap();
        assert_eq!(c.trust_domain, "td.example");
        assert_eq!(c.class_name.as_deref(), Some("spire-a"));
        assert_eq!(c.concurrency, 8);
        assert_eq!(w.args.log_format, LogFormat::Json);
        assert_eq!(w.args.metrics_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(w.args.health_addr, None);
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--health-addr",
            "0.0.0.0:8081",
        ])
        .unwrap();
        assert_eq!(w.args.health_addr, Some("0.0.0.0:8081".parse().unwrap()));
    }

    #[test]
    fn trust_domain_is_checked_and_blank_options_are_unset() {
        for bad in ["Fleet.Example", "", " ", "spiffe://td.example"] {
            let e = Wrapper::try_parse_from(["kleym", "--trust-domain", bad])
                .expect_err(bad)
                .to_string();
            assert!(e.contains("--trust-domain"), "{bad:?}: {e}");
        }
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            " td.example ",
            "--spire-class-name",
            " ",
            "--instance",
            "",
        ])
        .unwrap();
        let c = w.args.spoke_config().unwrap();
        assert_eq!(c.trust_domain, "td.example");
        assert_eq!(c.class_name, None);
        assert_eq!(c.event_instance, None);
    }

    #[test]
    fn the_svid_policy_reaches_the_config_and_a_bad_one_stops_start_up() {
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--hub-x509-username",
            "kleym-hub.example.org",
            "--svid-max-ttl",
            "2h",
        ])
        .unwrap();
        let c = w.args.spoke_config().unwrap();
        assert_eq!(c.svid_policy.max_ttl(), Duration::from_secs(7200));
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--svid-dns-suffix",
            "svc.cluster.local",
        ])
        .unwrap();
        let e = w.args.spoke_config().unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(e.to_string().contains("svc.cluster.local"), "{e}");
    }

    #[test]
    fn rejects_zero_concurrency() {
        assert!(
            Wrapper::try_parse_from(["kleym", "--trust-domain", "t", "--concurrency", "0"])
                .is_err()
        );
    }

    /// Serves `app` on a loopback port and returns its address.
    async fn serve(app: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// GETs `path` from `addr`, returning the whole response.
    async fn http_get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn probe_router_follows_readiness_and_serves_no_metrics() {
        let readiness = CachesSynced::default();
        let addr = serve(probe_router(ready_check(readiness.clone()))).await;
        assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        readiness.set(true);
        assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(http_get(addr, "/metrics").await.starts_with("HTTP/1.1 404"));
    }

    #[tokio::test]
    async fn readyz_follows_readiness_and_metrics_are_served() {
        let readiness = CachesSynced::default();
        let mut registry = Registry::default();
        let m = SpokeMetrics::register(&mut registry);
        m.count_write("status_apply");
        let app = metrics_router(ready_check(readiness.clone()), Arc::new(registry));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        readiness.set(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get("/metrics")
                .await
                .contains("kleym_spoke_api_writes_total{write=\"status_apply\"} 1")
        );
    }
}
