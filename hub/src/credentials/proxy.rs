//! Which proxy a connection to a Kubernetes API server uses (a spoke, or the hub's own
//! cluster): the profile's `proxy-url`, else the environment like Go's
//! `http.ProxyFromEnvironment`, which client-go uses (`HTTPS_PROXY`/`https_proxy` for https
//! servers, `HTTP_PROXY`/`http_proxy` for http ones), and never for:
//!
//! - loopback: `localhost` and loopback addresses (`127.0.0.0/8`, `::1`), whatever `NO_PROXY`
//!   says, as Go's `golang.org/x/net/http/httpproxy` never proxies them;
//! - the hub's own cluster: the in-cluster API server (`KUBERNETES_SERVICE_HOST`, and the
//!   `kubernetes`, `kubernetes.default`, `kubernetes.default.svc[.<cluster domain>]` names);
//! - a server `NO_PROXY`/`no_proxy` matches, with Go's rules: `*` matches every host; an
//!   IP address or CIDR (`10.0.0.0/8`, `fd00::/8`) matches addresses in it; `example.com`
//!   matches that host and its subdomains, `.example.com` and `*.example.com` only its
//!   subdomains; `host:port` and `[v6]:port` only on that port.
//!
//! Unlike client-go, which sends everything to a kubeconfig's `proxy-url`, these exceptions
//! also apply to the profile's `proxy-url`: that value comes from whoever writes the
//! ClusterProfile, while `NO_PROXY` and the hub's own network come from the operator, and a
//! profile writer must not be able to route the hub's loopback or in-cluster traffic (with its
//! credentials) through a host of their choice.
//!
//! kube-rs's own fallback matches `NO_PROXY` against the proxy URL rather than the target and
//! uses `HTTPS_PROXY` for http servers too, so the hub computes the proxy itself and sets it
//! explicitly ([`apply_to_config`]).

use std::net::IpAddr;

/// The proxy URL for `server`, or `None` for a direct connection. `explicit` is the
/// profile's (or kubeconfig's) `proxy-url`; `env` looks up environment variables (injected
/// for tests). See the module doc for the rules.
pub fn proxy_for(
    server: &str,
    explicit: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let explicit = explicit.filter(|p| !p.trim().is_empty());
    let Ok(uri) = server.parse::<http::Uri>() else {
        // Not a URL: the connection fails anyway; keep what was asked for.
        return explicit.map(str::to_string);
    };
    let https = uri.scheme_str() == Some("https");
    let get = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|n| env(n).filter(|v| !v.trim().is_empty()))
    };
    let proxy = match explicit {
        Some(p) => p.to_string(),
        None if https => get(["HTTPS_PROXY", "https_proxy"])?,
        None => get(["HTTP_PROXY", "http_proxy"])?,
    };
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    if is_loopback(&host) || is_own_cluster(&host, &env) {
        return None;
    }
    match get(["NO_PROXY", "no_proxy"]) {
        Some(no_proxy) if no_proxy_matches(&no_proxy, &host, port) => None,
        _ => Some(proxy),
    }
}

/// Sets `config.proxy_url` by [`proxy_for`] with the process environment, for a config built
/// from a kubeconfig (whose `proxy-url` for the chosen cluster is `explicit`) or in cluster.
pub fn apply_to_config(
    config: &mut kube::Config,
    explicit: Option<&str>,
) -> Result<(), http::uri::InvalidUri> {
    let server = config.cluster_url.to_string();
    config.proxy_url = proxy_for(&server, explicit, |k| std::env::var(k).ok())
        .map(|p| p.parse())
        .transpose()?;
    Ok(())
}

/// The `proxy-url` of the cluster the kubeconfig's context (`context`, else its current
/// context) points at.
pub fn kubeconfig_proxy_url(
    kubeconfig: &kube::config::Kubeconfig,
    context: Option<&str>,
) -> Option<String> {
    let context = context
        .map(str::to_string)
        .or_else(|| kubeconfig.current_context.clone())?;
    let cluster = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .clone();
    kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()?
        .proxy_url
        .clone()
}

/// The `proxy-url` of the default kubeconfig's (`KUBECONFIG`, `~/.kube/config`) cluster for
/// `context`; `None` without a kubeconfig (in cluster).
pub fn default_kubeconfig_proxy(context: Option<&str>) -> Option<String> {
    kube::config::Kubeconfig::read()
        .ok()
        .and_then(|kc| kubeconfig_proxy_url(&kc, context))
}

/// `localhost` or a loopback address: never proxied (Go's rule).
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The hub's own cluster's API server, as a pod reaches it.
fn is_own_cluster(host: &str, env: &impl Fn(&str) -> Option<String>) -> bool {
    let service_host = env("KUBERNETES_SERVICE_HOST")
        .map(|h| {
            h.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase()
        })
        .filter(|h| !h.is_empty());
    service_host.as_deref() == Some(host)
        || matches!(
            host,
            "kubernetes" | "kubernetes.default" | "kubernetes.default.svc"
        )
        || host.starts_with("kubernetes.default.svc.")
}

/// Whether a `NO_PROXY` list matches `host:port`, with the rules of Go's
/// `golang.org/x/net/http/httpproxy` (see the module doc). `host` is lower case, without
/// brackets.
pub fn no_proxy_matches(list: &str, host: &str, port: u16) -> bool {
    let host_ip: Option<IpAddr> = host.parse().ok();
    list.split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            // IPv4/CIDR, IPv6/CIDR: any port.
            if let Some((net, bits)) = entry.split_once('/') {
                return match (host_ip, net.parse::<IpAddr>(), bits.parse::<u8>()) {
                    (Some(ip), Ok(net), Ok(bits)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            let (name, entry_port) = split_port(&entry);
            if name.is_empty() {
                return false;
            }
            let port_ok = entry_port.is_none_or(|p| p == port);
            if let Ok(entry_ip) = name.parse::<IpAddr>() {
                return host_ip == Some(entry_ip) && port_ok;
            }
            // `*.example.com` is `.example.com`; a name without a leading dot also matches
            // itself.
            let name = name
                .strip_prefix('*')
                .filter(|n| n.starts_with('.'))
                .unwrap_or(name);
            let (suffix, match_host) = match name.strip_prefix('.') {
                Some(_) => (name.to_string(), false),
                None => (format!(".{name}"), true),
            };
            (host.ends_with(&suffix) || (match_host && host == &suffix[1..])) && port_ok
        })
}

/// `host:port`, `[v6]:port` or a bare name or address (a bare IPv6 address has several
/// colons and no port). A port that is not a number leaves the entry unmatched.
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[')
        && let Some((addr, tail)) = rest.split_once(']')
    {
        return match tail.strip_prefix(':') {
            Some(p) => (addr, Some(p.parse().unwrap_or(0))),
            None => (addr, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, Some(port.parse().unwrap_or(0))),
        _ => (entry, None),
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits))
            };
            (u32::from(a) & mask) == (u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            (u128::from(a) & mask) == (u128::from(n) & mask)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_profile_proxy_wins_over_the_environment_but_not_over_no_proxy() {
        let e = env(&[("HTTPS_PROXY", "http://envproxy:3128")]);
        assert_eq!(
            proxy_for("https://a:6443", Some("http://p:1"), &e).as_deref(),
            Some("http://p:1")
        );
        assert_eq!(
            proxy_for("http://a:6443", Some("http://p:1"), &e).as_deref(),
            Some("http://p:1")
        );
        let e = env(&[("HTTPS_PROXY", "http://envproxy:3128"), ("NO_PROXY", "*")]);
        assert_eq!(proxy_for("https://a:6443", Some("http://p:1"), &e), None);
        let e = env(&[("no_proxy", "a")]);
        assert_eq!(proxy_for("https://a:6443", Some("http://p:1"), &e), None);
        assert!(proxy_for("https://b:6443", Some("http://p:1"), &e).is_some());
    }

    #[test]
    fn loopback_is_never_proxied_whatever_no_proxy_says() {
        let e = env(&[
            ("HTTPS_PROXY", "http://envproxy:3128"),
            ("HTTP_PROXY", "http://p:1"),
        ]);
        for server in [
            "https://127.0.0.1:6443",
            "https://127.1.2.3",
            "https://localhost:6443",
            "https://LOCALHOST",
            "https://[::1]:6443",
            "http://127.0.0.1:8080",
        ] {
            assert_eq!(proxy_for(server, None, &e), None, "{server}");
            assert_eq!(proxy_for(server, Some("http://p:1"), &e), None, "{server}");
        }
        // Only loopback: a name that merely starts like it is proxied.
        assert!(proxy_for("https://localhost.example.org", None, &e).is_some());
        assert!(proxy_for("https://128.0.0.1", None, &e).is_some());
    }

    #[test]
    fn the_hubs_own_cluster_is_never_proxied() {
        let e = env(&[
            ("HTTPS_PROXY", "http://envproxy:3128"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ]);
        for server in [
            "https://10.96.0.1:443",
            "https://10.96.0.1",
            "https://kubernetes.default.svc",
            "https://kubernetes.default.svc.cluster.local:443",
            "https://kubernetes.default",
            "https://kubernetes",
        ] {
            assert_eq!(proxy_for(server, None, &e), None, "{server}");
            assert_eq!(proxy_for(server, Some("http://p:1"), &e), None, "{server}");
        }
        assert!(proxy_for("https://10.96.0.2", None, &e).is_some());
        assert!(proxy_for("https://kubernetes.example.org", None, &e).is_some());
        let v6 = env(&[
            ("HTTPS_PROXY", "http://envproxy:3128"),
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
        ]);
        assert_eq!(proxy_for("https://[fd00::1]:443", None, &v6), None);
    }

    #[test]
    fn no_proxy_follows_gos_rules() {
        // A name matches itself and its subdomains; a leading dot or `*.` only subdomains.
        assert!(no_proxy_matches("example.com", "example.com", 443));
        assert!(no_proxy_matches("example.com", "a.example.com", 443));
        assert!(!no_proxy_matches("example.com", "notexample.com", 443));
        assert!(!no_proxy_matches(".example.com", "example.com", 443));
        assert!(no_proxy_matches(".example.com", "a.b.example.com", 443));
        assert!(!no_proxy_matches("*.example.com", "example.com", 443));
        assert!(no_proxy_matches("*.example.com", "a.example.com", 443));
        // Ports.
        assert!(no_proxy_matches("example.com:6443", "a.example.com", 6443));
        assert!(!no_proxy_matches("example.com:6443", "a.example.com", 443));
        assert!(!no_proxy_matches("example.com:x", "example.com", 443));
        assert!(no_proxy_matches("10.1.2.3:6443", "10.1.2.3", 6443));
        assert!(!no_proxy_matches("10.1.2.3:6443", "10.1.2.3", 443));
        // CIDRs, any port; IPv4-mapped IPv6 addresses too.
        assert!(no_proxy_matches("10.0.0.0/8", "10.200.0.1", 1));
        assert!(!no_proxy_matches("10.0.0.0/8", "11.0.0.1", 1));
        assert!(no_proxy_matches("10.0.0.0/8", "::ffff:10.0.0.1", 1));
        assert!(!no_proxy_matches("10.0.0.0/8", "example.com", 1));
        // `*` alone; blanks and junk ignored; case-insensitive.
        assert!(no_proxy_matches(" , *", "anything", 1));
        assert!(!no_proxy_matches(" , :443, /8", "anything", 443));
        assert!(no_proxy_matches("EXAMPLE.com", "example.com", 443));
    }

    #[test]
    fn environment_fallback_by_scheme_and_no_proxy_on_the_target() {
        let e = env(&[
            ("HTTPS_PROXY", "http://envproxy:3128"),
            ("http_proxy", "http://plain:3128"),
            (
                "NO_PROXY",
                "internal.example, .corp, 10.0.0.0/8, 192.168.1.7, api.other:8443",
            ),
        ]);
        assert_eq!(
            proxy_for("https://spoke.cloud:6443", None, &e).as_deref(),
            Some("http://envproxy:3128")
        );
        assert_eq!(
            proxy_for("http://spoke.cloud", None, &e).as_deref(),
            Some("http://plain:3128")
        );
        for direct in [
            "https://internal.example",
            "https://x.internal.example:6443",
            "https://a.corp",
            "https://10.2.3.4:6443",
            "https://192.168.1.7",
            "https://api.other:8443",
        ] {
            assert_eq!(proxy_for(direct, None, &e), None, "{direct}");
        }
        assert!(proxy_for("https://api.other:6443", None, &e).is_some());
        assert!(proxy_for("https://notinternal.example", None, &e).is_some());
        assert!(proxy_for("https://11.0.0.1", None, &e).is_some());
        assert_eq!(proxy_for("https://a", None, env(&[])), None);
    }

    #[test]
    fn ipv6_entries() {
        assert!(no_proxy_matches("fd00::/8", "fd00::1", 443));
        assert!(no_proxy_matches("[::1]:6443", "::1", 6443));
        assert!(!no_proxy_matches("[::1]:6443", "::1", 443));
        assert!(no_proxy_matches("::1", "::1", 443));
    }
}
