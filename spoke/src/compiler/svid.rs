//! What a tenant may ask for in its SVIDs (`spec.svid`), confined like its SPIFFE ID.
//!
//! An X.509-SVID's DNS names are trusted by every TLS client that trusts the SPIRE bundle,
//! and SPIRE puts the first one into the certificate's subject CN, which kube-apiserver
//! maps to a user when it trusts that bundle for client certificates. So a DNS name is a
//! claim on a host *and* possibly on a Kubernetes user; the rules, applied after the
//! syntax check, are:
//!
//! - **Namespace confinement.** A name is `<service>.<ns>.svc` or
//!   `<service>.<ns>.svc.<cluster domain>` for the binding's own namespace `<ns>`
//!   (`<service>` a Service name: an RFC 1035 label), or ends, at a dot, with a suffix the
//!   operator allows for every namespace or for that namespace. A name equal to a suffix
//!   is not under it. A suffix may not cover other namespaces' cluster names (see
//!   [`SvidPolicy::new`]).
//! - **No IDNA labels** in the part the tenant chooses: labels with `--` as third and
//!   fourth characters (`xn--…`, RFC 5890's reserved LDH labels) are refused, so nothing
//!   decodes to a look-alike of another host. Wildcards, uppercase, empty labels and a
//!   trailing dot already fail the syntax check.
//! - **The hub's identities are reserved.** No DNS name may equal a configured hub X.509
//!   user name, and no SPIFFE ID a configured hub SPIFFE ID.
//! - **Operator bounds.** `ttl` and `jwtTtl` above the operator's maxima are refused (not
//!   clamped: the binding then says what it would not get), and every `federatesWith`
//!   trust domain must be on the operator's allow-list (empty by default: no federation).
//!
//! A binding without `svid` pays for none of this.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::refusal::{Reason, Refusal};
use super::selectors;
use super::spiffe_id::{SpiffeId, TrustDomain};
use super::template::{self, Variables};

/// The cluster domain when none is configured.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// The longest X.509-SVID TTL a binding may ask for when none is configured (24 hours).
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest JWT-SVID TTL a binding may ask for when none is configured (1 hour).
pub const DEFAULT_MAX_JWT_TTL: Duration = Duration::from_secs(3600);

/// The operator's settings, before they are checked ([`SvidPolicy::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvidPolicySettings {
    /// The cluster's DNS domain (`cluster.local`).
    pub cluster_domain: String,
    /// DNS suffixes every namespace may use.
    pub dns_suffixes: Vec<String>,
    /// DNS suffixes one namespace may use: `(namespace, suffix)`.
    pub namespace_dns_suffixes: Vec<(String, String)>,
    /// The longest `ttl` a binding may ask for.
    pub max_ttl: Duration,
    /// The longest `jwtTtl` a binding may ask for.
    pub max_jwt_ttl: Duration,
    /// Trust domains a binding may federate with.
    pub federates_with: Vec<String>,
    /// The hub's SPIFFE IDs: no binding may be issued one.
    pub hub_spiffe_ids: Vec<String>,
    /// The hub's X.509 user names (the CN spokes map to the hub): no DNS name may be one.
    pub hub_x509_usernames: Vec<String>,
}

impl Default for SvidPolicySettings {
    fn default() -> Self {
        SvidPolicySettings {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_string(),
            dns_suffixes: Vec::new(),
            namespace_dns_suffixes: Vec::new(),
            max_ttl: DEFAULT_MAX_TTL,
            max_jwt_ttl: DEFAULT_MAX_JWT_TTL,
            federates_with: Vec::new(),
            hub_spiffe_ids: Vec::new(),
            hub_x509_usernames: Vec::new(),
        }
    }
}

/// Why the operator's settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SvidPolicyError {
    /// The cluster domain is not a DNS name.
    #[error("cluster domain {0:?} is not a lower-case DNS name")]
    ClusterDomain(String),
    /// A suffix is not a DNS name.
    #[error(
        "DNS suffix {0:?} is not a lower-case DNS name (no leading or trailing dot, no wildcard)"
    )]
    Suffix(String),
    /// A namespace of a per-namespace suffix is not a namespace name.
    #[error("{0:?} is not a namespace name")]
    Namespace(String),
    /// A suffix would give a tenant the cluster names of namespaces it does not own.
    #[error("DNS suffix {suffix:?}{}: {why}", for_namespace(.namespace))]
    SuffixCoversNamespaces {
        /// The suffix.
        suffix: String,
        /// The namespace it was allowed for (`None`: every namespace).
        namespace: Option<String>,
        /// What it would cover.
        why: String,
    },
    /// A maximum TTL of zero.
    #[error("{0} must be more than zero")]
    ZeroMaximum(&'static str),
    /// A federated trust domain is not a trust domain.
    #[error("federated trust domain {0:?} is not a SPIFFE trust domain")]
    TrustDomain(String),
    /// A hub SPIFFE ID is not a SPIFFE ID.
    #[error("hub SPIFFE ID {0:?} is not a SPIFFE ID")]
    HubSpiffeId(String),
    /// An empty hub user name.
    #[error("a hub X.509 user name must not be empty")]
    HubUsername,
}

fn for_namespace(ns: &Option<String>) -> String {
    ns.as_ref()
        .map(|n| format!(" (for namespace {n})"))
        .unwrap_or_default()
}

/// The checked operator settings the compiler applies to `spec.svid` and the SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SvidPolicy {
    cluster_domain: String,
    dns_suffixes: Vec<String>,
    namespace_dns_suffixes: BTreeMap<String, Vec<String>>,
    max_ttl: Duration,
    max_jwt_ttl: Duration,
    federates_with: BTreeSet<String>,
    hub_spiffe_ids: BTreeSet<String>,
    hub_x509_usernames: BTreeSet<String>,
}

impl Default for SvidPolicy {
    fn default() -> Self {
        SvidPolicy {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_string(),
            dns_suffixes: Vec::new(),
            namespace_dns_suffixes: BTreeMap::new(),
            max_ttl: DEFAULT_MAX_TTL,
            max_jwt_ttl: DEFAULT_MAX_JWT_TTL,
            federates_with: BTreeSet::new(),
            hub_spiffe_ids: BTreeSet::new(),
            hub_x509_usernames: BTreeSet::new(),
        }
    }
}

impl SvidPolicy {
    /// Checks `settings`. A suffix is refused when it would reach into the cluster's own
    /// names of namespaces it was not given for: when it is `svc`, the cluster domain,
    /// `svc.<cluster domain>` or a parent of one of them (it would cover every namespace),
    /// or when it lies under `svc` or the cluster domain other than under
    /// `<ns>.svc[.<cluster domain>]` of the one namespace it is allowed for (a global suffix
    /// may not lie under them at all).
    pub fn new(settings: SvidPolicySettings) -> Result<Self, SvidPolicyError> {
        let cd = settings.cluster_domain.trim().to_string();
        if !selectors::is_dns_name(&cd) {
            return Err(SvidPolicyError::ClusterDomain(cd));
        }
        let mut dns_suffixes = Vec::new();
        for s in &settings.dns_suffixes {
            dns_suffixes.push(check_suffix(s, None, &cd)?);
        }
        dns_suffixes.sort();
        dns_suffixes.dedup();
        let mut namespace_dns_suffixes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (ns, s) in &settings.namespace_dns_suffixes {
            if !selectors::is_dns1123_label(ns) {
                return Err(SvidPolicyError::Namespace(ns.clone()));
            }
            let s = check_suffix(s, Some(ns), &cd)?;
            let list = namespace_dns_suffixes.entry(ns.clone()).or_default();
            if !list.contains(&s) {
                list.push(s);
                list.sort();
            }
        }
        if settings.max_ttl.is_zero() {
            return Err(SvidPolicyError::ZeroMaximum("the maximum ttl"));
        }
        if settings.max_jwt_ttl.is_zero() {
            return Err(SvidPolicyError::ZeroMaximum("the maximum jwtTtl"));
        }
        let mut federates_with = BTreeSet::new();
        for td in &settings.federates_with {
            TrustDomain::parse(td).map_err(|_| SvidPolicyError::TrustDomain(td.clone()))?;
            federates_with.insert(td.clone());
        }
        let mut hub_spiffe_ids = BTreeSet::new();
        for id in &settings.hub_spiffe_ids {
            let parsed =
                SpiffeId::parse(id).map_err(|_| SvidPolicyError::HubSpiffeId(id.clone()))?;
            hub_spiffe_ids.insert(parsed.to_string());
        }
        let mut hub_x509_usernames = BTreeSet::new();
        for u in &settings.hub_x509_usernames {
            if u.is_empty() {
                return Err(SvidPolicyError::HubUsername);
            }
            // DNS names are lower-case by their syntax check; a user name differing only in
            // case is reserved as well.
            hub_x509_usernames.insert(u.to_ascii_lowercase());
        }
        Ok(SvidPolicy {
            cluster_domain: cd,
            dns_suffixes,
            namespace_dns_suffixes,
            max_ttl: settings.max_ttl,
            max_jwt_ttl: settings.max_jwt_ttl,
            federates_with,
            hub_spiffe_ids,
            hub_x509_usernames,
        })
    }

    /// The cluster domain.
    pub fn cluster_domain(&self) -> &str {
        &self.cluster_domain
    }

    /// The longest `ttl` a binding may ask for.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The longest `jwtTtl` a binding may ask for.
    pub fn max_jwt_ttl(&self) -> Duration {
        self.max_jwt_ttl
    }

    /// The DNS suffixes every namespace may use (sorted, de-duplicated).
    pub fn dns_suffixes(&self) -> &[String] {
        &self.dns_suffixes
    }

    /// The DNS suffixes per namespace (each list sorted, de-duplicated).
    pub fn namespace_dns_suffixes(&self) -> &BTreeMap<String, Vec<String>> {
        &self.namespace_dns_suffixes
    }

    /// The trust domains a binding may federate with.
    pub fn federates_with(&self) -> &BTreeSet<String> {
        &self.federates_with
    }

    /// The hub's X.509 user names (lower-cased): no DNS name may be one.
    pub fn hub_x509_usernames(&self) -> &BTreeSet<String> {
        &self.hub_x509_usernames
    }

    /// Would the compiler write `name` into `svid.dnsNameTemplates` of a binding in
    /// namespace `ns` (its syntax check and the rules above)? The spoke admission policy
    /// must agree (its tests compare the two).
    pub fn allows_dns_name(&self, ns: &str, name: &str) -> bool {
        selectors::is_dns_name(name) && self.dns_name_refusal(ns, name).is_none()
    }

    /// Is `id` (a parsed, canonical SPIFFE ID) one of the hub's?
    pub fn is_hub_spiffe_id(&self, id: &str) -> bool {
        !self.hub_spiffe_ids.is_empty() && self.hub_spiffe_ids.contains(id)
    }

    /// The suffixes namespace `ns` may use (global ones first).
    fn suffixes_for<'a>(&'a self, ns: &str) -> impl Iterator<Item = &'a String> {
        self.dns_suffixes
            .iter()
            .chain(self.namespace_dns_suffixes.get(ns).into_iter().flatten())
    }

    /// Why `name` (a valid DNS name) is not allowed for namespace `ns`, or `None`.
    fn dns_name_refusal(&self, ns: &str, name: &str) -> Option<(Reason, String)> {
        if self.hub_x509_usernames.contains(name) {
            return Some((
                Reason::ReservedHubIdentity,
                "it is the hub's X.509 user name: SPIRE puts the first DNS name into the certificate's CN, which spokes map to the hub's user".to_string(),
            ));
        }
        if let Some((service, rest)) = name.split_once('.')
            && is_service_domain(rest, ns, &self.cluster_domain)
        {
            return (!is_service_label(service)).then(|| {
                (
                    Reason::DNSNameOutsideNamespace,
                    format!(
                        "{service:?} is not a Service name (a lower-case RFC 1035 label, not an IDNA \"xn--\" label)"
                    ),
                )
            });
        }
        for suffix in self.suffixes_for(ns) {
            if let Some(prefix) = name
                .strip_suffix(suffix.as_str())
                .and_then(|p| p.strip_suffix('.'))
                && !prefix.is_empty()
            {
                return prefix.split('.').find(|l| is_reserved_ldh(l)).map(|l| {
                    (
                        Reason::DNSNameOutsideNamespace,
                        format!("its label {l:?} is an IDNA (\"xn--\") or reserved label"),
                    )
                });
            }
        }
        let mut rule = format!(
            "a binding in namespace {ns} may only name <service>.{ns}.svc or <service>.{ns}.svc.{}",
            self.cluster_domain
        );
        let mut suffixes = self.suffixes_for(ns).peekable();
        if suffixes.peek().is_some() {
            rule.push_str(", or a name under");
            for (i, s) in suffixes.enumerate() {
                let _ = write!(rule, "{} .{s}", if i == 0 { "" } else { "," });
            }
        }
        Some((Reason::DNSNameOutsideNamespace, rule))
    }
}

/// Checks one suffix (see [`SvidPolicy::new`]).
fn check_suffix(raw: &str, ns: Option<&String>, cd: &str) -> Result<String, SvidPolicyError> {
    let s = raw.trim();
    if !selectors::is_dns_name(s) {
        return Err(SvidPolicyError::Suffix(raw.to_string()));
    }
    let covers = |why: String| SvidPolicyError::SuffixCoversNamespaces {
        suffix: s.to_string(),
        namespace: ns.cloned(),
        why,
    };
    let svc_cd = format!("svc.{cd}");
    for root in ["svc", cd, svc_cd.as_str()] {
        if root == s || is_under(root, s) {
            return Err(covers(format!(
                "it covers {root}, the cluster names of every namespace"
            )));
        }
    }
    for root in [svc_cd.as_str(), "svc", cd] {
        let Some(inner) = s.strip_suffix(root).and_then(|p| p.strip_suffix('.')) else {
            continue;
        };
        // `inner` is what comes before `svc[.<cd>]` (or before `<cd>`): its last label is
        // the namespace whose names the suffix lies in.
        let owner = inner.rsplit('.').next().unwrap_or(inner);
        let own = root != cd && ns.is_some_and(|n| n == owner);
        if !own {
            return Err(covers(match ns {
                None => format!(
                    "a suffix for every namespace may not lie under {root}, the cluster's own names"
                ),
                Some(n) => format!(
                    "it lies under {root} outside {n}.svc[.{cd}], in names that are not namespace {n}'s"
                ),
            }));
        }
        return Ok(s.to_string());
    }
    Ok(s.to_string())
}

/// Is `name` strictly under `parent` (ends with `.<parent>`)?
fn is_under(name: &str, parent: &str) -> bool {
    name.strip_suffix(parent)
        .is_some_and(|p| p.len() > 1 && p.ends_with('.'))
}

/// Is `rest` `<ns>.svc` or `<ns>.svc.<cd>`?
fn is_service_domain(rest: &str, ns: &str, cd: &str) -> bool {
    match rest.strip_prefix(ns).and_then(|r| r.strip_prefix(".svc")) {
        Some("") => true,
        Some(r) => r.strip_prefix('.') == Some(cd),
        None => false,
    }
}

/// A Service name: an RFC 1035 label (starts with a letter), and not an IDNA label.
fn is_service_label(label: &str) -> bool {
    selectors::is_dns1123_label(label)
        && label.starts_with(|c: char| c.is_ascii_lowercase())
        && !is_reserved_ldh(label)
}

/// RFC 5890's reserved LDH labels: `--` as third and fourth characters (`xn--` A-labels
/// decode to Unicode look-alikes).
fn is_reserved_ldh(label: &str) -> bool {
    label.get(2..4) == Some("--")
}

/// The `svid` part of the output.
pub(super) struct CompiledSvid {
    pub dns_names: Vec<String>,
    pub ttl: Option<String>,
    pub jwt_ttl: Option<String>,
    pub federates_with: Vec<String>,
}

impl CompiledSvid {
    const NONE: CompiledSvid = CompiledSvid {
        dns_names: Vec::new(),
        ttl: None,
        jwt_ttl: None,
        federates_with: Vec::new(),
    };
}

fn template_refusal(binding_desc: &str, field: &str, e: &template::TemplateError) -> Refusal {
    Refusal::new(
        Reason::TemplateError,
        format!("{binding_desc}: {field}: {e}"),
    )
}

/// Go-like text of a maximum (`24h`, `90m`, `45s`, `1.5s`), which Go's
/// `time.ParseDuration` reads back.
pub(crate) fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    let whole = s > 0 && d.subsec_nanos() == 0;
    if whole && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if whole && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// Compiles `spec.svid` of a binding in namespace `ns` under `policy`.
pub(super) fn compile_svid(
    binding_desc: &str,
    ns: &str,
    svid: Option<&kleym_api::SvidOptions>,
    vars: &Variables<'_>,
    policy: &SvidPolicy,
) -> Result<CompiledSvid, Refusal> {
    let Some(svid) = svid else {
        return Ok(CompiledSvid::NONE);
    };
    let mut dns_names = BTreeSet::new();
    for (i, t) in svid.dns_name_templates.iter().enumerate() {
        let field = format!("spec.svid.dnsNameTemplates[{i}]");
        let name =
            template::render(t, vars).map_err(|e| template_refusal(binding_desc, &field, &e))?;
        if !selectors::is_dns_name(&name) {
            return Err(Refusal::new(
                Reason::InvalidSvidOption,
                format!(
                    "{binding_desc}: {field} renders to {name:?}, which is not a DNS name (lower-case labels of a-z, 0-9 and '-', no wildcard, no trailing dot)"
                ),
            ));
        }
        if let Some((reason, why)) = policy.dns_name_refusal(ns, &name) {
            return Err(Refusal::new(
                reason,
                format!("{binding_desc}: {field} renders to {name:?}, which is not allowed: {why}"),
            ));
        }
        dns_names.insert(name);
    }
    let mut federates_with = BTreeSet::new();
    for (i, td) in svid.federates_with.iter().enumerate() {
        let field = format!("spec.svid.federatesWith[{i}]");
        TrustDomain::parse(td).map_err(|e| {
            Refusal::new(
                Reason::InvalidSvidOption,
                format!("{binding_desc}: {field} {td:?} is not a trust domain: {e}"),
            )
        })?;
        if !policy.federates_with.contains(td) {
            let allowed = if policy.federates_with.is_empty() {
                "this cluster allows no federation".to_string()
            } else {
                let list: Vec<&str> = policy.federates_with.iter().map(String::as_str).collect();
                format!("allowed are {}", list.join(", "))
            };
            return Err(Refusal::new(
                Reason::SvidOptionOutOfBounds,
                format!(
                    "{binding_desc}: {field} {td:?} is not on the operator's federation allow-list: {allowed}"
                ),
            ));
        }
        federates_with.insert(td.clone());
    }
    let duration =
        |field: &str, value: Option<&String>, max: Duration| -> Result<Option<String>, Refusal> {
            let Some(v) = value else { return Ok(None) };
            let parsed: kube::core::Duration = v.parse().map_err(|e| {
                Refusal::new(
                    Reason::InvalidSvidOption,
                    format!("{binding_desc}: {field} {v:?} is not a duration: {e}"),
                )
            })?;
            if parsed.is_negative() {
                return Err(Refusal::new(
                    Reason::InvalidSvidOption,
                    format!("{binding_desc}: {field} {v:?} is negative"),
                ));
            }
            let d = Duration::from(parsed);
            if d > max {
                return Err(Refusal::new(
                    Reason::SvidOptionOutOfBounds,
                    format!(
                        "{binding_desc}: {field} {v:?} is longer than the operator's maximum {}",
                        duration_text(max)
                    ),
                ));
            }
            // Zero means "SPIRE's default", the same as unset.
            Ok((!d.is_zero()).then(|| v.clone()))
        };
    Ok(CompiledSvid {
        dns_names: dns_names.into_iter().collect(),
        ttl: duration("spec.svid.ttl", svid.ttl.as_ref(), policy.max_ttl)?,
        jwt_ttl: duration(
            "spec.svid.jwtTtl",
            svid.jwt_ttl.as_ref(),
            policy.max_jwt_ttl,
        )?,
        federates_with: federates_with.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(f: impl FnOnce(&mut SvidPolicySettings)) -> Result<SvidPolicy, SvidPolicyError> {
        let mut s = SvidPolicySettings::default();
        f(&mut s);
        SvidPolicy::new(s)
    }

    #[test]
    fn suffixes_that_reach_other_namespaces_are_refused() {
        for global in [
            "svc",
            "local",
            "cluster.local",
            "svc.cluster.local",
            "t2.svc.cluster.local",
            "t2.svc",
            "x.t1.svc",
            "pod.cluster.local",
        ] {
            let e = policy(|s| s.dns_suffixes = vec![global.into()]).unwrap_err();
            assert!(
                matches!(e, SvidPolicyError::SuffixCoversNamespaces { .. }),
                "{global}: {e}"
            );
        }
        for (ns, s) in [("t1", "t2.svc.cluster.local"), ("t1", "cluster.local")] {
            assert!(
                policy(|p| p.namespace_dns_suffixes = vec![(ns.into(), s.into())]).is_err(),
                "{ns}={s}"
            );
        }
        for (ns, s) in [
            ("t1", "t1.svc.cluster.local"),
            ("t1", "web.t1.svc.cluster.local"),
            ("t1", "web.t1.svc"),
            ("t1", "apps.example.org"),
        ] {
            assert!(
                policy(|p| p.namespace_dns_suffixes = vec![(ns.into(), s.into())]).is_ok(),
                "{ns}={s}"
            );
        }
        for bad in [
            "*.example.org",
            "example.org.",
            ".example.org",
            "Example.org",
        ] {
            assert_eq!(
                policy(|s| s.dns_suffixes = vec![bad.into()]).unwrap_err(),
                SvidPolicyError::Suffix(bad.into())
            );
        }
        assert!(policy(|s| s.dns_suffixes = vec!["apps.example.org".into()]).is_ok());
        assert!(policy(|s| s.cluster_domain = "Cluster.Local".into()).is_err());
        assert!(policy(|s| s.max_ttl = Duration::ZERO).is_err());
        assert!(policy(|s| s.federates_with = vec!["spiffe://x".into()]).is_err());
        assert!(policy(|s| s.hub_spiffe_ids = vec!["spiffe://x/a/".into()]).is_err());
        assert!(policy(|s| s.hub_x509_usernames = vec![String::new()]).is_err());
    }

    #[test]
    fn names_in_the_namespace_and_under_allowed_suffixes() {
        let p = policy(|s| {
            s.cluster_domain = "corp.internal".into();
            s.dns_suffixes = vec!["apps.example.org".into()];
            s.namespace_dns_suffixes = vec![("t1".into(), "t1.example.net".into())];
        })
        .unwrap();
        for ok in [
            "chat.t1.svc",
            "chat.t1.svc.corp.internal",
            "a.apps.example.org",
            "a.b.apps.example.org",
            "x.t1.example.net",
        ] {
            assert_eq!(p.dns_name_refusal("t1", ok), None, "{ok}");
        }
        for bad in [
            "chat.t1.svc.cluster.local",
            "chat.t2.svc",
            "a.b.t1.svc",
            "t1.svc",
            "apps.example.org",
            "evilapps.example.org",
            "x.t1.example.net.evil",
            "1chat.t1.svc",
            "xn--80ak6aa92e.t1.svc",
            "xn--80ak6aa92e.apps.example.org",
        ] {
            assert!(p.dns_name_refusal("t1", bad).is_some(), "{bad}");
        }
        assert!(p.dns_name_refusal("t2", "x.t1.example.net").is_some());
    }
}
