//! Value checks of the flags of `kleym spoke` and `kleym hub`, shared by both commands.
//!
//! Each is a clap `value_parser` (environment variables go through it too), so a value
//! that would parse as a string but make every reconcile, watch or request fail — or
//! quietly withdraw identities — stops the command at start-up with clap's usage error:
//! exit code 2 and a message naming the flag. The rules are the ones the consumer of the
//! value applies later (the identity compiler, kube-apiserver, the SPIRE controller
//! manager), so a value accepted here is never refused there for its form.
//!
//! What was audited, flag by flag, is listed in `docs/spoke.md` and `docs/hub.md`
//! ("Start-up checks").

use kleym_spoke::compiler::selectors::{is_dns1123_label, is_dns1123_subdomain};
use kleym_spoke::compiler::spiffe_id::TrustDomain;
use kleym_spoke::compiler::{SvidPolicy, SvidPolicyError, SvidPolicySettings};

use crate::inventory::validate_label_selector;

/// Longest `reportingInstance` kube-apiserver accepts on an `events.k8s.io/v1` Event
/// (`ReportingInstanceLengthLimit`).
pub const MAX_INSTANCE_LEN: usize = 128;

/// Longest condition `type` of a `metav1.Condition` (the ClusterProfile CRD's `maxLength`).
pub const MAX_CONDITION_TYPE_LEN: usize = 316;

/// Why a trust domain is not one: the compiler's own rule ([`TrustDomain::parse`]), so
/// that a value accepted here is never refused per binding as `InvalidTrustDomain`.
pub fn trust_domain_error(value: &str) -> Option<String> {
    let e = TrustDomain::parse(value).err()?;
    let hint = if value.starts_with("spiffe://") {
        " (give the trust domain without spiffe://)"
    } else {
        ""
    };
    Some(format!("not a SPIFFE trust domain: {e}{hint}"))
}

/// `--trust-domain` of `kleym hub`: a SPIFFE trust domain, or empty (none: profiles must
/// name theirs). Surrounding whitespace is dropped.
pub fn parse_trust_domain(value: &str) -> Result<String, String> {
    let value = value.trim();
    match value.is_empty() {
        true => Ok(String::new()),
        false => trust_domain_error(value).map_or_else(|| Ok(value.to_string()), Err),
    }
}

/// `--trust-domain` of `kleym spoke`: a SPIFFE trust domain, required. An invalid or empty
/// one would refuse every binding (`InvalidTrustDomain`) and so withdraw every
/// ClusterSPIFFEID kleym owns.
pub fn parse_required_trust_domain(value: &str) -> Result<String, String> {
    match parse_trust_domain(value)? {
        td if td.is_empty() => Err(
            "a SPIFFE trust domain is required (e.g. prod.example.org); \
             without one every binding would be refused and its ClusterSPIFFEID deleted"
                .into(),
        ),
        td => Ok(td),
    }
}

/// `--clusterprofile-selector`: kube-apiserver's label-selector syntax. Without this check a
/// typo would make every ClusterProfile watch request fail, retried and logged forever.
pub fn parse_label_selector(value: &str) -> Result<String, String> {
    validate_label_selector(value)
        .map(|()| value.to_string())
        .map_err(|e| format!("not a label selector: {e}"))
}

/// A namespace flag (`--clusterprofile-namespace`, `--namespace`): a DNS-1123 label, as
/// kube-apiserver requires of namespace names. Anything else names no namespace, so every
/// request to it would fail or find nothing.
pub fn parse_namespace(value: &str) -> Result<String, String> {
    if is_dns1123_label(value) {
        Ok(value.to_string())
    } else {
        Err(
            "not a namespace name: at most 63 lowercase letters, digits and '-', starting \
             and ending with a letter or digit (RFC 1123 label)"
                .into(),
        )
    }
}

/// `--lease-name`: a Lease's `metadata.name`, a DNS-1123 subdomain. Anything else makes
/// every Lease create fail, so no replica ever leads and no spoke is ever engaged.
pub fn parse_lease_name(value: &str) -> Result<String, String> {
    if is_dns1123_subdomain(value) {
        Ok(value.to_string())
    } else {
        Err(
            "not a Lease name: at most 253 lowercase letters, digits, '-' and '.', starting \
             and ending with a letter or digit (RFC 1123 subdomain)"
                .into(),
        )
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`: the name part of a condition type.
fn is_condition_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `--engage-condition`: `none` (or empty) to ignore conditions, else a condition type as
/// the ClusterProfile CRD allows it (`[prefix/]Name`, at most 316 characters). Any other
/// type can never be reported, so every profile would wait forever.
pub fn parse_engage_condition(value: &str) -> Result<String, String> {
    let t = value.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("none") {
        return Ok(t.to_string());
    }
    let valid = t.len() <= MAX_CONDITION_TYPE_LEN
        && match t.split_once('/') {
            Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_condition_name(name),
            None => is_condition_name(t),
        };
    if valid {
        Ok(t.to_string())
    } else {
        Err(format!(
            "not a condition type: `none`, or `Name` or `example.com/Name` (letters, digits, \
             '-', '_', '.'; starting and ending with a letter or digit), at most \
             {MAX_CONDITION_TYPE_LEN} characters"
        ))
    }
}

/// `--spire-class-name`: surrounding whitespace dropped (blank means none, as for the
/// profile property); control characters refused. A stray space or newline (a templated
/// value) would give every ClusterSPIFFEID a class no SPIRE controller manager serves, and
/// so withdraw every identity from SPIRE.
pub fn parse_spire_class_name(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.chars().any(char::is_control) {
        return Err("a SPIRE class name may not contain control characters".into());
    }
    Ok(v.to_string())
}

/// `--instance`: events' `reportingInstance` (and the hub's leader identity prefix);
/// surrounding whitespace dropped, blank means unset. kube-apiserver refuses events whose
/// `reportingInstance` is longer than 128 characters, so every event would be lost.
pub fn parse_instance(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.len() > MAX_INSTANCE_LEN {
        return Err(format!(
            "at most {MAX_INSTANCE_LEN} characters (events.k8s.io/v1 reportingInstance)"
        ));
    }
    if v.chars().any(char::is_control) {
        return Err("may not contain control characters".into());
    }
    Ok(v.to_string())
}

/// `--log-level`: a tracing filter directive, checked when the flags are parsed.
pub fn parse_log_filter(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map(|_| value.to_string())
        .map_err(|e| format!("not a log filter: {e}"))
}

/// `--api-audience`: not blank. No token is issued for an empty audience, so every
/// authenticated request would be refused.
pub fn parse_audience(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("an audience is required (e.g. kleym-hub)".into())
    } else {
        Ok(value.to_string())
    }
}

/// `Some(value)` unless it is blank: optional flags whose parser keeps an empty value as
/// "unset" (an empty environment variable).
pub fn non_blank(value: Option<&String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty()).cloned()
}

/// `--worker-threads`, shared by `kleym hub` and `kleym spoke` (flattened into both).
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeFlags {
    /// Threads of the async runtime. The process waits on API servers far more than it
    /// computes, and one thread does that work with the least overhead: on 2 cores the hub
    /// used about 15 % less CPU with one thread than with two, converging as fast in the
    /// median from 100 to 5000 spokes, though its slowest cold starts took a little longer
    /// (docs/benchmarks.md, "What moved the numbers"). Raise it when the process's own CPU is the
    /// bottleneck (its CPU use stays at N cores), up to its CPU limit.
    #[arg(
        long,
        default_value_t = 1,
        env = "KLEYM_WORKER_THREADS",
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    pub worker_threads: u16,
}

/// `--max-response-mib`, shared by `kleym hub` and `kleym spoke` (flattened into both).
#[derive(Debug, Clone, clap::Args)]
pub struct ResponseLimitFlags {
    /// The largest response body read from an API server, in MiB (lists, gets, the objects
    /// writes return; a watch is read an event at a time, each at most 8 MiB). A larger
    /// body fails its request (the error says so; it is retried with backoff). kleym lists
    /// in pages of 500 objects, a few MiB for the largest real pages: the limit keeps a
    /// compromised or broken API server, or whatever a ClusterProfile points at, from
    /// growing the process without bound.
    #[arg(
        long,
        default_value_t = 256,
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=65536)
    )]
    pub max_response_mib: u64,
}

impl ResponseLimitFlags {
    /// The limit in bytes.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_mib.saturating_mul(1024 * 1024)
    }
}

/// What a binding may ask for in its SVIDs, and the hub identities none may be issued:
/// shared by `kleym hub` (passed into every spoke's reconciler) and `kleym spoke`
/// (flattened into both). The compiler applies them (`kleym_spoke::compiler::svid`).
#[derive(Debug, Clone, clap::Args)]
pub struct SvidPolicyFlags {
    /// The DNS, TTL and federation bounds (also the admission policy's parameters).
    #[command(flatten)]
    pub bounds: SvidBoundsFlags,

    /// A SPIFFE ID of the hub (repeatable; the `--hub-spiffe-id` of its SPIFFE credential
    /// plugins and `kleym trust-config`): a binding whose SPIFFE ID is one of them is
    /// refused (`ReservedHubIdentity`). The plugins' default `spiffe://<td>/kleym/hub` lies
    /// outside every `/ns/<namespace>/`, where binding IDs must be.
    #[arg(long = "hub-spiffe-id", value_name = "SPIFFE_ID")]
    pub hub_spiffe_ids: Vec<String>,

    /// The hub's X.509 user name on the spokes (repeatable; the `--x509-username` of
    /// `kleym trust-config --credential spiffe-x509`, the CN of the hub's SPIRE SVID): a
    /// binding naming it in `svid.dnsNameTemplates` is refused (`ReservedHubIdentity`),
    /// since SPIRE puts the first DNS name into the certificate's CN.
    #[arg(long = "hub-x509-username", value_name = "NAME")]
    pub hub_x509_usernames: Vec<String>,
}

/// The DNS names, TTLs and federation a binding may ask for: part of [`SvidPolicyFlags`]
/// (`kleym spoke`, `kleym hub`), and the parameters of the spoke admission policy `kleym
/// trust-config` prints, under the same names.
#[derive(Debug, Clone, clap::Args)]
pub struct SvidBoundsFlags {
    /// The cluster's DNS domain. A binding in namespace N may put `<service>.N.svc` and
    /// `<service>.N.svc.<domain>` into `svid.dnsNameTemplates`, and nothing else unless
    /// `--svid-dns-suffix` or `--svid-namespace-dns-suffix` allows it.
    #[arg(
        long,
        default_value = "cluster.local",
        value_name = "DOMAIN",
        env = "KLEYM_CLUSTER_DOMAIN"
    )]
    pub cluster_domain: String,

    /// A DNS suffix every namespace may use in `svid.dnsNameTemplates` (repeatable): a
    /// name ending in `.<suffix>` is allowed. It may not be, cover or lie under `svc` or the
    /// cluster domain (that would give tenants other namespaces' names).
    #[arg(long = "svid-dns-suffix", value_name = "SUFFIX")]
    pub svid_dns_suffixes: Vec<String>,

    /// `NAMESPACE=SUFFIX`: a DNS suffix one namespace may use in `svid.dnsNameTemplates`
    /// (repeatable). It may lie under that namespace's own `N.svc[.<cluster domain>]` (e.g.
    /// `web.N.svc.cluster.local` for a headless Service's pods), not another's.
    #[arg(long = "svid-namespace-dns-suffix", value_name = "NAMESPACE=SUFFIX", value_parser = parse_namespace_suffix)]
    pub svid_namespace_dns_suffixes: Vec<(String, String)>,

    /// The longest X.509-SVID `svid.ttl` a binding may ask for (Go duration); a binding
    /// asking for more is refused (`SvidOptionOutOfBounds`), not clamped.
    #[arg(long, default_value = "24h", value_name = "DURATION", value_parser = parse_max_duration)]
    pub svid_max_ttl: std::time::Duration,

    /// The longest JWT-SVID `svid.jwtTtl` a binding may ask for (Go duration); a binding
    /// asking for more is refused (`SvidOptionOutOfBounds`), not clamped.
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = parse_max_duration)]
    pub svid_max_jwt_ttl: std::time::Duration,

    /// A trust domain bindings may list in `svid.federatesWith` (repeatable). None by
    /// default: a binding asking for federation is refused.
    #[arg(long = "svid-federates-with", value_name = "TRUST_DOMAIN", value_parser = parse_required_trust_domain)]
    pub svid_federates_with: Vec<String>,
}

impl SvidBoundsFlags {
    /// The settings these flags describe, with the hub identities given.
    pub fn settings(
        &self,
        hub_spiffe_ids: Vec<String>,
        hub_x509_usernames: Vec<String>,
    ) -> SvidPolicySettings {
        SvidPolicySettings {
            cluster_domain: self.cluster_domain.clone(),
            dns_suffixes: self.svid_dns_suffixes.clone(),
            namespace_dns_suffixes: self.svid_namespace_dns_suffixes.clone(),
            max_ttl: self.svid_max_ttl,
            max_jwt_ttl: self.svid_max_jwt_ttl,
            federates_with: self.svid_federates_with.clone(),
            hub_spiffe_ids,
            hub_x509_usernames,
        }
    }
}

impl SvidPolicyFlags {
    /// The checked policy these flags describe.
    pub fn policy(&self) -> Result<SvidPolicy, SvidPolicyError> {
        SvidPolicy::new(
            self.bounds
                .settings(self.hub_spiffe_ids.clone(), self.hub_x509_usernames.clone()),
        )
    }
}

/// `NAMESPACE=SUFFIX` of `--svid-namespace-dns-suffix`.
pub fn parse_namespace_suffix(value: &str) -> Result<(String, String), String> {
    let Some((ns, suffix)) = value.split_once('=') else {
        return Err(format!("{value:?} is not NAMESPACE=SUFFIX"));
    };
    let ns = parse_namespace(ns.trim())?;
    Ok((ns, suffix.trim().to_string()))
}

/// A positive Go duration (`24h`, `90m`) of `--svid-max-ttl` and `--svid-max-jwt-ttl`.
pub fn parse_max_duration(value: &str) -> Result<std::time::Duration, String> {
    let d: kube::core::Duration = value
        .trim()
        .parse()
        .map_err(|e| format!("{value:?} is not a duration (e.g. 24h, 90m): {e}"))?;
    if d.is_negative() || std::time::Duration::from(d).is_zero() {
        return Err(format!("{value:?}: must be more than zero"));
    }
    Ok(std::time::Duration::from(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_domains_follow_the_compiler() {
        for ok in ["example.org", "td_1.example-x", " prod.example.org "] {
            let td = parse_required_trust_domain(ok).unwrap();
            assert_eq!(td, ok.trim());
            assert!(TrustDomain::parse(&td).is_ok());
        }
        for bad in ["Fleet.Example", "spiffe://example.org", "a b", "td:8443"] {
            let e = parse_required_trust_domain(bad).unwrap_err();
            assert!(e.contains("not a SPIFFE trust domain"), "{bad}: {e}");
            assert!(TrustDomain::parse(bad).is_err());
        }
        assert!(
            parse_required_trust_domain("spiffe://x")
                .unwrap_err()
                .contains("without spiffe://")
        );
        assert!(
            parse_required_trust_domain(&"a".repeat(256))
                .unwrap_err()
                .contains("longer than 255")
        );
        assert!(
            parse_required_trust_domain(" ")
                .unwrap_err()
                .contains("required")
        );
        assert_eq!(parse_trust_domain(" ").unwrap(), "");
    }

    #[test]
    fn names() {
        assert!(parse_namespace("kleym-system").is_ok());
        assert!(parse_namespace(&"n".repeat(63)).is_ok());
        for bad in ["", "Kleym", "a.b", "-a", &"n".repeat(64)] {
            assert!(parse_namespace(bad).is_err(), "{bad}");
        }
        assert!(parse_lease_name("kleym-hub").is_ok());
        assert!(parse_lease_name(&format!("{}.x", "l".repeat(100))).is_ok());
        for bad in ["", "Kleym-Hub", "a_b", &"l".repeat(254)] {
            assert!(parse_lease_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn engage_conditions() {
        for ok in [
            "ControlPlaneHealthy",
            "none",
            "None",
            "",
            "example.com/Ready",
            "a.b_c-D",
        ] {
            assert!(parse_engage_condition(ok).is_ok(), "{ok}");
        }
        for bad in [
            "Control Plane Healthy",
            "Ready=True",
            "Example.com/Ready",
            "/Ready",
            "x/",
            "-Ready",
            &"R".repeat(317),
        ] {
            assert!(parse_engage_condition(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn class_names_instances_filters_and_audiences() {
        assert_eq!(parse_spire_class_name(" spire-a\n").unwrap(), "spire-a");
        assert_eq!(parse_spire_class_name(" ").unwrap(), "");
        assert!(parse_spire_class_name("a\nb").is_err());
        assert_eq!(parse_instance(" kleym-0 ").unwrap(), "kleym-0");
        assert!(parse_instance(&"i".repeat(128)).is_ok());
        assert!(parse_instance(&"i".repeat(129)).is_err());
        assert!(parse_log_filter("info,kleym_hub=debug").is_ok());
        assert!(parse_log_filter("info,kleym_hub=loud").is_err());
        assert!(parse_audience("kleym-hub").is_ok());
        assert!(parse_audience(" ").is_err());
        assert_eq!(non_blank(Some(&" ".to_string())), None);
        assert_eq!(non_blank(Some(&"x".to_string())).as_deref(), Some("x"));
    }

    #[test]
    fn svid_policy_flags_parse_and_hold_together() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Wrapper {
            #[command(flatten)]
            svid: SvidPolicyFlags,
        }
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(w.svid.policy().unwrap(), SvidPolicy::default());
        let w = Wrapper::try_parse_from([
            "kleym",
            "--cluster-domain",
            "corp.internal",
            "--svid-dns-suffix",
            "apps.example.org",
            "--svid-namespace-dns-suffix",
            "t1=web.t1.svc.corp.internal",
            "--svid-max-ttl",
            "90m",
            "--svid-max-jwt-ttl",
            "5m",
            "--svid-federates-with",
            "partner.example",
            "--hub-spiffe-id",
            "spiffe://example.org/kleym/hub",
            "--hub-x509-username",
            "kleym-hub.example.org",
        ])
        .unwrap();
        let p = w.svid.policy().unwrap();
        assert_eq!(p.cluster_domain(), "corp.internal");
        assert_eq!(p.max_ttl(), std::time::Duration::from_secs(5400));
        assert_eq!(p.max_jwt_ttl(), std::time::Duration::from_secs(300));
        assert!(p.is_hub_spiffe_id("spiffe://example.org/kleym/hub"));
        // A suffix is checked against the cluster domain given with it.
        let w = Wrapper::try_parse_from([
            "kleym",
            "--cluster-domain",
            "corp.internal",
            "--svid-dns-suffix",
            "corp.internal",
        ])
        .unwrap();
        assert!(
            w.svid
                .policy()
                .unwrap_err()
                .to_string()
                .contains("corp.internal")
        );
        for bad in [
            ["--svid-max-ttl", "0s"],
            ["--svid-max-ttl", "-1h"],
            ["--svid-max-jwt-ttl", "soon"],
            ["--svid-namespace-dns-suffix", "apps.example.org"],
            ["--svid-namespace-dns-suffix", "T1=apps.example.org"],
            ["--svid-federates-with", "spiffe://partner.example"],
        ] {
            assert!(
                Wrapper::try_parse_from(["kleym", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_namespace_suffix(" t1 = apps.example.org ").unwrap(),
            ("t1".to_string(), "apps.example.org".to_string())
        );
    }
}
