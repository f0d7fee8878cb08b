//! The flags of `kleym hub` ([`HubArgs`]) and the settings of each subsystem they describe
//! ([`HubArgs::fleet_options`], [`HubArgs::cache_options`], [`HubArgs::watch_options`],
//! [`HubArgs::leader_options`]), plus the hub cluster's client ([`hub_client`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::access::{AccessFlags, SelectOptions};
use crate::backoff::BackoffOptions;
use crate::credentials::{CacheOptions, ClientOptions, ExecOptions, Keepalive};
use crate::flags::{
    SvidPolicyFlags, non_blank, parse_engage_condition, parse_instance, parse_label_selector,
    parse_lease_name, parse_log_filter, parse_namespace, parse_spire_class_name,
    parse_trust_domain,
};
use crate::fleet::{FleetOptions, RemovalPolicy};
use crate::http::ApiArgs;
use crate::inventory::{InventoryOptions, VersionPolicy, WatchOptions};
use crate::leader::{self, LeaderOptions};
use crate::observe::logging::LogFormat;
use crate::shard::MembershipOptions;

/// How hub replicas share the fleet (`--shard-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ShardMode {
    /// One replica (the leader Lease holder) engages every spoke.
    #[default]
    Leader,
    /// Every replica engages its share of the spokes.
    Sharded,
}

/// Arguments of `kleym hub`.
#[derive(Debug, Clone, clap::Args)]
pub struct HubArgs {
    /// Kubeconfig of the hub cluster. Default: `KUBECONFIG`, then `~/.kube/config`, then the
    /// in-cluster ServiceAccount.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context of the hub cluster (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// Access providers (KEP-4322, into which KEP-5339 was folded).
    #[command(flatten)]
    pub access: AccessFlags,

    /// Watch ClusterProfiles in this namespace only (default: all namespaces); checked at
    /// start-up.
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_namespace)]
    pub clusterprofile_namespace: Option<String>,

    /// Label selector of the ClusterProfiles to engage (e.g. `env=prod`), in
    /// kube-apiserver's syntax; checked at start-up.
    #[arg(long, value_name = "SELECTOR", value_parser = parse_label_selector)]
    pub clusterprofile_selector: Option<String>,

    /// ClusterProfile API version to read: `auto` reads v1alpha2 when the hub cluster serves
    /// it (then only `status.accessProviders` counts), else v1alpha1 (`accessProviders`, then
    /// the deprecated `credentialProviders`); `v1alpha1` or `v1alpha2` pins one (the hub is
    /// not ready while it is not served). The choice and its reason are logged and shown by
    /// `/readyz?verbose`.
    #[arg(long, default_value = "auto", value_name = "auto|v1alpha1|v1alpha2")]
    pub clusterprofile_version: VersionPolicy,

    /// How often the hub cluster's discovery is asked which ClusterProfile versions it serves,
    /// in seconds (a CRD upgraded while the hub runs is picked up within this time).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub clusterprofile_discovery_interval_seconds: u64,

    /// The most access providers one ClusterProfile may offer (in `accessProviders`, and in
    /// v1alpha1's `credentialProviders`); a profile offering more is Refused, naming the
    /// field. The CRD allows up to 64.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub clusterprofile_max_providers: u16,

    /// ClusterProfile condition type that must be `True` to engage a spoke; `none` engages
    /// every usable profile regardless of its conditions. Checked at start-up (a condition
    /// type, `[prefix/]Name`).
    #[arg(long, default_value = "ControlPlaneHealthy", value_name = "TYPE", value_parser = parse_engage_condition)]
    pub engage_condition: String,

    /// Default SPIFFE trust domain (a profile's `kleym.io/trust-domain` property wins):
    /// lowercase letters, digits, `.`, `-`, `_`, without `spiffe://`; checked at start-up.
    /// Empty means none.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN", value_parser = parse_trust_domain)]
    pub trust_domain: Option<String>,

    /// Default SPIRE class name (a profile's `kleym.io/spire-class-name` property wins);
    /// surrounding whitespace is dropped, blank means none, control characters are refused.
    #[arg(long, env = "KLEYM_SPIRE_CLASS_NAME", value_parser = parse_spire_class_name)]
    pub spire_class_name: Option<String>,

    /// What bindings may ask for in their SVIDs, and the hub identities none may be
    /// issued, in every spoke.
    #[command(flatten)]
    pub svid: SvidPolicyFlags,

    /// What to do with a spoke's objects when its ClusterProfile is deleted.
    #[arg(long, value_enum, default_value = "orphan")]
    pub removal_policy: RemovalPolicy,

    /// Seconds after a ClusterProfile's deletion during which failed removal attempts are
    /// retried (jittered backoff); then the hub gives up, logs what was left and releases
    /// the profile.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub removal_timeout_seconds: u64,

    /// Run Lease-based leader election (only the leader engages spokes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,

    /// Name of the leader Lease (a DNS-1123 subdomain; checked at start-up).
    #[arg(long, default_value = "kleym-hub", value_parser = parse_lease_name)]
    pub lease_name: String,

    /// Namespace of the leader Lease (default: the pod's namespace in-cluster, else
    /// `default`); checked at start-up.
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_namespace)]
    pub namespace: Option<String>,

    /// Lease duration in seconds (renew deadline is 2/3 of it, retry period 2/15).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_duration_seconds: u64,

    /// How replicas share the fleet. `leader`: the replica holding the leader Lease engages
    /// every spoke, the others stand by (the default; right for small fleets). `sharded`:
    /// every replica holds a Lease of its own (`kleym-hub-replica-*`, in the leader Lease's
    /// namespace) and engages the share of the spokes that weighted rendezvous hashing over
    /// the live replicas gives it; a spoke changes hands only after its old owner stopped
    /// it. Implies `--leader-elect` (the leader still writes the fleet report, rotates
    /// issuer keys and removes orphaned status objects). The Lease timings are
    /// `--lease-duration-seconds`'.
    #[arg(
        long,
        value_enum,
        default_value = "leader",
        value_name = "leader|sharded"
    )]
    pub shard_mode: ShardMode,

    /// This replica's weight in `--shard-mode sharded` (1..=100): its expected share of the
    /// spokes is its weight over the sum of the live replicas' weights. Ignored in leader
    /// mode.
    #[arg(long, default_value_t = 10, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub shard_weight: u32,

    /// Address serving `/healthz`, `/readyz` and `/metrics` over plain HTTP (for probes and
    /// scrapers; no `/v1`). The same three paths and the authenticated `/v1/*` are also
    /// served on `--api-addr`.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub metrics_addr: SocketAddr,

    /// Address serving only `/healthz` and `/readyz` over plain HTTP, so that kubelet probes
    /// use a port of their own, apart from `/metrics`. Unset, or equal to `--metrics-addr`:
    /// no extra listener. The probes stay on `--metrics-addr` either way.
    #[arg(long, value_name = "ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// Once every listener is bound, write the address each one got to this file, as one
    /// JSON object (`{"metrics": "127.0.0.1:41234", "health": ..., "api": ..., "issuer": ...}`,
    /// the listeners started only): for a supervisor or test that passes port 0 (e.g.
    /// `--metrics-addr 127.0.0.1:0`) and needs the port the system chose. Written whole
    /// (beside the file, then renamed over it).
    #[arg(long, value_name = "PATH")]
    pub listen_addrs_file: Option<std::path::PathBuf>,

    /// The hub API (`--api-addr`, TLS, auth). Without `--tls-cert-file`/`--tls-key-file`
    /// or `--api-insecure-http` the API listener is not started (a warning is logged).
    #[command(flatten)]
    pub api: ApiArgs,

    /// The hub as a JWT issuer (`--issuer-*`).
    #[command(flatten)]
    pub issuer: crate::issuer::IssuerArgs,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, or a tracing directive such as `kleym_hub=debug`).
    #[arg(long, default_value = "info", env = "KLEYM_LOG", value_parser = parse_log_filter)]
    pub log_level: String,

    /// `--worker-threads`.
    #[command(flatten)]
    pub runtime: crate::flags::RuntimeFlags,

    /// `--max-response-mib`: every spoke's responses, and the hub cluster's.
    #[command(flatten)]
    pub limits: crate::flags::ResponseLimitFlags,

    /// Spokes doing their initial cache sync at once on this replica (the leader's whole
    /// fleet, or a sharded replica's share: each replica has its own). Connecting (credential
    /// plugin, client) and the preflight requests are not limited by it, so a blackholed or
    /// failing spoke never holds a slot; a spoke whose initial lists fail gives its slot
    /// back at the first failure.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Bindings reconciled concurrently within one spoke.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub spoke_concurrency: u16,

    /// Credential plugin timeout in seconds (the plugin is killed on expiry).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub exec_timeout_seconds: u64,

    /// Also log a bounded (4 KiB), pattern-redacted excerpt of a failing credential
    /// plugin's stderr. Off by default: plugin output can hold secrets that no pattern
    /// recognises, so by default logs, like status, carry only stderr's size and sha256.
    /// Turn it on briefly to debug a plugin, and treat the log as sensitive while it is on.
    #[arg(long)]
    pub log_plugin_stderr: bool,

    /// TCP+TLS connect timeout of spoke clients, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub connect_timeout_seconds: u64,

    /// Send an HTTP/2 PING on a spoke's connection after this many seconds without a frame
    /// from it (client-go's ReadIdleTimeout): how soon a spoke that went silent (a
    /// blackholed route, a dead load balancer) is suspected, for every watch at once.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub spoke_ping_interval_seconds: u64,

    /// Close a spoke's connection when a PING is not answered within this many seconds
    /// (client-go's PingTimeout); its watches resume on a new connection.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub spoke_ping_timeout_seconds: u64,

    /// Bound of the hub's own requests to a spoke (probes, removal) and of building a spoke
    /// client, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub request_timeout_seconds: u64,

    /// Deadline for a spoke's caches to sync, in seconds (a failing list ends the sync at
    /// once; this bounds lists that hang or crawl).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub initial_sync_timeout_seconds: u64,

    /// Maximum retry delay of a failing spoke, in seconds (jittered exponential from 1 s).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub max_backoff_seconds: u64,

    /// Seconds between discovery polls in each spoke.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub discovery_interval_seconds: u64,

    /// Seconds between checks that each engaged spoke enforces kleym's admission policy (a
    /// server-side dry run, as the hub's user, of a ClusterSPIFFEID the policy forbids;
    /// nothing is written). Also checked on every engagement. A missing policy is a warning
    /// in the spoke's ClusterIdentityStatus, cleared by the first check after it is installed.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub admission_policy_check_interval_seconds: u64,

    /// `reportingInstance` of events and the leader identity prefix (default `POD_NAME`);
    /// at most 128 characters, blank means unset.
    #[arg(long, env = "POD_NAME", value_parser = parse_instance)]
    pub instance: Option<String>,
}

impl HubArgs {
    /// The supervisor settings these flags describe.
    pub fn fleet_options(&self) -> FleetOptions {
        let engage = self.engage_condition.trim();
        FleetOptions {
            inventory: InventoryOptions {
                engage_condition: (!engage.is_empty() && !engage.eq_ignore_ascii_case("none"))
                    .then(|| engage.to_string()),
                trust_domain: non_blank(self.trust_domain.as_ref()),
                spire_class_name: non_blank(self.spire_class_name.as_ref()),
                select: SelectOptions {
                    allow_plain_http: false,
                    ..self.access.select_options()
                },
                max_offered_providers: usize::from(self.clusterprofile_max_providers),
            },
            removal_policy: self.removal_policy,
            removal_timeout: Duration::from_secs(self.removal_timeout_seconds),
            max_concurrent_syncs: usize::from(self.concurrency),
            initial_sync_timeout: Duration::from_secs(self.initial_sync_timeout_seconds),
            request_timeout: Duration::from_secs(self.request_timeout_seconds),
            client: ClientOptions {
                connect_timeout: Some(Duration::from_secs(self.connect_timeout_seconds)),
                keepalive: Keepalive {
                    interval: Duration::from_secs(self.spoke_ping_interval_seconds),
                    timeout: Duration::from_secs(self.spoke_ping_timeout_seconds),
                },
                max_response_bytes: self.limits.max_response_bytes(),
                ..ClientOptions::default()
            },
            backoff: BackoffOptions {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(self.max_backoff_seconds),
            },
            spoke_concurrency: usize::from(self.spoke_concurrency),
            discovery_interval: Duration::from_secs(self.discovery_interval_seconds),
            admission_policy_interval: Duration::from_secs(
                self.admission_policy_check_interval_seconds,
            ),
            event_instance: non_blank(self.instance.as_ref()),
            ..FleetOptions::default()
        }
    }

    /// The credential cache settings these flags describe.
    pub fn cache_options(&self) -> CacheOptions {
        CacheOptions {
            exec: ExecOptions {
                timeout: Duration::from_secs(self.exec_timeout_seconds),
                log_stderr_excerpt: self.log_plugin_stderr,
                ..ExecOptions::default()
            },
            ..CacheOptions::default()
        }
    }

    /// Which ClusterProfiles to watch.
    pub fn watch_options(&self) -> WatchOptions {
        WatchOptions {
            namespace: self.clusterprofile_namespace.clone(),
            label_selector: self.clusterprofile_selector.clone(),
            version_policy: self.clusterprofile_version,
            discovery_interval: Duration::from_secs(self.clusterprofile_discovery_interval_seconds),
        }
    }

    /// The leader-election settings these flags describe.
    pub fn leader_options(&self) -> LeaderOptions {
        let mut o = LeaderOptions::new(self.lease_name.clone());
        if let Some(ns) = &self.namespace {
            o.namespace = ns.clone();
        }
        // `--instance` (`POD_NAME` when unset) prefixes the identity.
        o.identity = leader::identity(self.instance.as_deref());
        o.lease_duration = Duration::from_secs(self.lease_duration_seconds);
        o.renew_deadline = o.lease_duration * 2 / 3;
        o.retry_period = (o.lease_duration * 2 / 15).max(Duration::from_millis(200));
        o
    }
}

impl HubArgs {
    /// Whether leader election runs: `--leader-elect`, always in sharded mode (the
    /// singleton work needs exactly one leader among replicas that all run).
    pub fn leader_elect(&self) -> bool {
        self.leader_elect || self.shard_mode == ShardMode::Sharded
    }

    /// In sharded mode, the membership settings for a replica of identity `identity` (the
    /// leader election's, so one name shows in both Leases); `None` in leader mode.
    pub fn shard_options(&self, leader: &LeaderOptions) -> Option<MembershipOptions> {
        (self.shard_mode == ShardMode::Sharded).then(|| MembershipOptions {
            namespace: leader.namespace.clone(),
            identity: leader.identity.clone(),
            weight: self.shard_weight,
            lease_duration: leader.lease_duration,
            renew_deadline: leader.renew_deadline,
            retry_period: leader.retry_period,
        })
    }
}

/// The hub cluster's client from `--kubeconfig`/`--context`, else the usual inference.
pub async fn hub_client(args: &HubArgs) -> anyhow::Result<kube::Client> {
    crate::kubeconfig::client_with_limit(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
        args.limits.max_response_bytes(),
    )
    .await
    .context("building the hub client")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: HubArgs,
    }
    #[test]
    fn parses_flags_into_options() {
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--clusterprofile-namespace",
            "fleet",
            "--clusterprofile-selector",
            "env=prod",
            "--engage-condition",
            "none",
            "--removal-policy",
            "cleanup",
            "--removal-timeout-seconds",
            "90",
            "--leader-elect=false",
            "--namespace",
            "kleym-system",
            "--concurrency",
            "3",
            "--clusterprofile-access-provider",
            "tok=/bin/true",
            "--spoke-ping-interval-seconds",
            "12",
            "--spoke-ping-timeout-seconds",
            "4",
        ])
        .unwrap();
        let o = w.args.fleet_options();
        assert_eq!(
            o.client.keepalive,
            Keepalive {
                interval: Duration::from_secs(12),
                timeout: Duration::from_secs(4),
            }
        );
        assert_eq!(o.inventory.engage_condition, None);
        assert_eq!(o.inventory.trust_domain.as_deref(), Some("td.example"));
        assert_eq!(o.removal_policy, RemovalPolicy::Cleanup);
        assert_eq!(o.removal_timeout, Duration::from_secs(90));
        assert_eq!(o.max_concurrent_syncs, 3);
        assert!(!w.args.leader_elect);
        assert_eq!(w.args.leader_options().namespace, "kleym-system");
        assert_eq!(
            w.args.watch_options(),
            WatchOptions {
                namespace: Some("fleet".into()),
                label_selector: Some("env=prod".into()),
                ..WatchOptions::default()
            }
        );
        assert_eq!(w.args.access.provider_set().unwrap().providers().len(), 1);
    }

    #[test]
    fn shard_mode_defaults_to_leader_and_sharded_implies_leader_election() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(w.args.shard_mode, ShardMode::Leader);
        assert_eq!(w.args.shard_weight, 10);
        let lo = w.args.leader_options();
        assert_eq!(w.args.shard_options(&lo), None);
        let w = Wrapper::try_parse_from([
            "kleym",
            "--shard-mode",
            "sharded",
            "--shard-weight",
            "30",
            "--leader-elect=false",
            "--namespace",
            "kleym-system",
        ])
        .unwrap();
        assert!(w.args.leader_elect(), "sharded mode elects a leader");
        let lo = w.args.leader_options();
        let so = w.args.shard_options(&lo).unwrap();
        assert_eq!(
            (so.weight, so.namespace.as_str(), so.identity == lo.identity),
            (30, "kleym-system", true)
        );
        assert_eq!(so.renew_deadline, lo.renew_deadline);
        for bad in ["0", "101", "x"] {
            let e = Wrapper::try_parse_from(["kleym", "--shard-weight", bad])
                .expect_err(bad)
                .to_string();
            assert!(e.contains("--shard-weight"), "{e}");
        }
        let e = Wrapper::try_parse_from(["kleym", "--shard-mode", "both"])
            .expect_err("unknown mode")
            .to_string();
        assert!(e.contains("--shard-mode"), "{e}");
    }

    #[test]
    fn bad_trust_domain_and_selector_fail_parsing_naming_the_flag() {
        for (flag, value, needle) in [
            ("--trust-domain", "Example.ORG", "not a SPIFFE trust domain"),
            (
                "--trust-domain",
                "spiffe://example.org",
                "without spiffe://",
            ),
            ("--trust-domain", "a b", "not a SPIFFE trust domain"),
            (
                "--clusterprofile-selector",
                "env=prod,",
                "not a label selector: found ''",
            ),
            ("--clusterprofile-selector", "env in prod", "expected: '('"),
            ("--clusterprofile-selector", "Bad_Prefix/x=y", "prefix part"),
        ] {
            let e = Wrapper::try_parse_from(["kleym", flag, value])
                .expect_err(value)
                .to_string();
            assert!(
                e.contains(flag) && e.contains(needle),
                "{flag} {value}: {e}"
            );
        }
        // Valid values and an empty trust domain (none) still parse.
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "",
            "--clusterprofile-selector",
            "env in (prod,staging),!legacy",
        ])
        .unwrap();
        assert_eq!(w.args.fleet_options().inventory.trust_domain, None);
        let w = Wrapper::try_parse_from(["kleym", "--trust-domain", "td_1.example-x"]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.trust_domain.as_deref(),
            Some("td_1.example-x")
        );
    }

    /// Every flag whose value could parse as a string but break every reconcile, watch or
    /// request is checked when parsed, naming the flag.
    #[test]
    fn values_that_would_break_every_reconcile_fail_parsing() {
        for (flag, value, needle) in [
            (
                "--clusterprofile-namespace",
                "Fleet",
                "not a namespace name",
            ),
            ("--namespace", "", "not a namespace name"),
            ("--lease-name", "Kleym-Hub", "not a Lease name"),
            ("--engage-condition", "Ready=True", "not a condition type"),
            ("--spire-class-name", "a\tb", "control characters"),
            ("--instance", &"i".repeat(129), "at most 128"),
            ("--log-level", "kleym_hub=loud", "not a log filter"),
            ("--api-audience", "", "an audience is required"),
            (
                "--api-negative-cache-ttl-seconds",
                "86401",
                "not in 0..=86400",
            ),
        ] {
            let e = Wrapper::try_parse_from(["kleym", flag, value])
                .expect_err(flag)
                .to_string();
            assert!(
                e.contains(flag) && e.contains(needle),
                "{flag} {value}: {e}"
            );
        }
        // Blank optional values mean unset; surrounding whitespace is dropped.
        let w = Wrapper::try_parse_from([
            "kleym",
            "--spire-class-name",
            " ",
            "--instance",
            " ",
            "--trust-domain",
            " td.example ",
            "--engage-condition",
            " example.com/Ready ",
        ])
        .unwrap();
        let o = w.args.fleet_options();
        assert_eq!(o.inventory.spire_class_name, None);
        assert_eq!(o.event_instance, None);
        assert_eq!(o.inventory.trust_domain.as_deref(), Some("td.example"));
        assert_eq!(
            o.inventory.engage_condition.as_deref(),
            Some("example.com/Ready")
        );
        let w = Wrapper::try_parse_from(["kleym", "--spire-class-name", " spire-a "]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.spire_class_name.as_deref(),
            Some("spire-a")
        );
    }

    #[test]
    fn defaults_engage_on_control_plane_healthy_with_election() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.engage_condition.as_deref(),
            Some("ControlPlaneHealthy")
        );
        assert!(w.args.leader_elect);
        assert_eq!(w.args.removal_policy, RemovalPolicy::Orphan);
        assert_eq!(
            w.args.fleet_options().removal_timeout,
            Duration::from_secs(600)
        );
        let l = w.args.leader_options();
        assert!(l.renew_deadline < l.lease_duration && l.retry_period < l.renew_deadline);
    }

    #[test]
    fn instance_prefixes_the_leader_identity() {
        let w = Wrapper::try_parse_from(["kleym", "--instance", "hub-7"]).unwrap();
        let id = w.args.leader_options().identity;
        let suffix = id.strip_prefix("hub-7_").unwrap_or_else(|| panic!("{id}"));
        assert!(!suffix.is_empty(), "{id}");
        assert_eq!(
            w.args.fleet_options().event_instance.as_deref(),
            Some("hub-7")
        );
    }

    #[test]
    fn health_addr_is_optional_and_separate_only_when_it_differs() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(w.args.health_addr, None);
        assert_eq!(
            crate::observe::health::separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            None
        );
        let w = Wrapper::try_parse_from(["kleym", "--health-addr", "0.0.0.0:8081"]).unwrap();
        assert_eq!(
            crate::observe::health::separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            Some("0.0.0.0:8081".parse().unwrap())
        );
        // The same address as --metrics-addr: served there already, nothing more to bind.
        let w = Wrapper::try_parse_from(["kleym", "--health-addr", "0.0.0.0:8080"]).unwrap();
        assert_eq!(
            crate::observe::health::separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            None
        );
        assert!(Wrapper::try_parse_from(["kleym", "--health-addr", "8081"]).is_err());
    }

    #[test]
    fn the_provider_limit_defaults_to_the_inventory_default_and_is_bounded() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.max_offered_providers,
            crate::inventory::DEFAULT_MAX_OFFERED_PROVIDERS
        );
        let w = Wrapper::try_parse_from(["kleym", "--clusterprofile-max-providers", "3"]).unwrap();
        assert_eq!(w.args.fleet_options().inventory.max_offered_providers, 3);
        for bad in ["0", "65", "x"] {
            assert!(
                Wrapper::try_parse_from(["kleym", "--clusterprofile-max-providers", bad]).is_err(),
                "{bad}"
            );
        }
    }
}
