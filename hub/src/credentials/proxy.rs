//! Which proxy a spoke connection uses: the profile's `proxy-url`, else the environment like
//! Go's `http.ProxyFromEnvironment` (`HTTPS_PROXY`/`https_proxy` for https servers,
//! `HTTP_PROXY`/`http_proxy` for http ones) unless `NO_PROXY`/`no_proxy` matches the *server*.
//!
//! kube-rs's own fallback matches `NO_PROXY` against the proxy URL rather than the target, so
//! the hub computes the proxy itself and sets it explicitly.

use std::net::IpAddr;

/// The proxy URL for `server`, or `None` for a direct connection. `env` looks up environment
/// variables (injected for tests).
pub fn proxy_for(
    server: &str,
    explicit: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    if let Some(p) = explicit.filter(|p| !p.is_empty()) {
        return Some(p.to_string());
    }
    let uri: http::Uri = server.parse().ok()?;
    let https = uri.scheme_str() == Some("https");
    let get = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|n| env(n).filter(|v| !v.trim().is_empty()))
    };
    let proxy = if https {
        get(["HTTPS_PROXY", "https_proxy"])
    } else {
        get(["HTTP_PROXY", "http_proxy"])
    }?;
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    match get(["NO_PROXY", "no_proxy"]) {
        Some(no_proxy) if no_proxy_matches(&no_proxy, &host, port) => None,
        _ => Some(proxy),
    }
}

/// Whether a `NO_PROXY` list matches `host:port`. Entries: `*`; IPs; CIDRs; domain names
/// (`example.com` matches itself and subdomains, `.example.com` only subdomains and itself,
/// `*.example.com` like `.example.com`); each optionally with `:port`.
pub fn no_proxy_matches(list: &str, host: &str, port: u16) -> bool {
    let host_ip: Option<IpAddr> = host.parse().ok();
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            let entry = entry.to_ascii_lowercase();
            // CIDR
            if let (Some(ip), Some((net, bits))) = (host_ip, entry.split_once('/')) {
                return match (net.parse::<IpAddr>(), bits.parse::<u8>()) {
                    (Ok(net), Ok(bits)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            let (name, entry_port) = split_port(&entry);
            if entry_port.is_some_and(|p| p != port) {
                return false;
            }
            if let (Some(ip), Ok(entry_ip)) = (host_ip, name.parse::<IpAddr>()) {
                return ip == entry_ip;
            }
            let domain = name.trim_start_matches('*').trim_start_matches('.');
            !domain.is_empty() && (host == domain || host.ends_with(&format!(".{domain}")))
        })
}

fn split_port(entry: &str) -> (&str, Option<u16>) {
    // `[v6]:port`, `host:port`; a bare IPv6 address has several colons and no port.
    if let Some(rest) = entry.strip_prefix('[')
        && let Some((addr, tail)) = rest.split_once(']')
    {
        return (addr, tail.strip_prefix(':').and_then(|p| p.parse().ok()));
    }
    match entry.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(p) => (name, Some(p)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
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
    fn explicit_proxy_wins() {
        let e = env(&[("HTTPS_PROXY", "http://envproxy:3128"), ("NO_PROXY", "*")]);
        assert_eq!(
            proxy_for("https://a:6443", Some("http://p:1"), e).as_deref(),
            Some("http://p:1")
        );
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
