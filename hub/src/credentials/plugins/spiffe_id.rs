//! The hub's SPIFFE ID, checked: shared by both SPIFFE plugins, the Workload API source
//! (which checks the IDs an agent hands out by the same rules) and `kleym trust-config`.

use super::PluginError;

/// The hub's SPIFFE ID from the two flags (`--hub-spiffe-id`, `--trust-domain`): the explicit
/// ID, else `spiffe://<trust domain>/kleym/hub`. An ID that is not a valid SPIFFE ID, is
/// outside the trust domain when one is given, or whose path starts with `/ns/` is refused:
/// `/ns/<namespace>/...` is the tenants' space (every binding's SPIFFE ID lives there), so a
/// tenant owning that namespace on any cluster of the trust domain could be issued the hub's
/// identity.
pub fn resolve_hub_spiffe_id(
    explicit: Option<&str>,
    trust_domain: Option<&str>,
) -> Result<String, PluginError> {
    let td = trust_domain.filter(|t| !t.is_empty());
    let id = match (explicit, td) {
        (Some(id), _) => id.to_string(),
        (None, Some(td)) => format!("spiffe://{td}/kleym/hub"),
        (None, None) => {
            return Err(PluginError::Input(
                "no SPIFFE ID: pass --hub-spiffe-id or --trust-domain (KLEYM_TRUST_DOMAIN)".into(),
            ));
        }
    };
    let rest = id.strip_prefix("spiffe://").ok_or_else(|| {
        PluginError::Input(format!("--hub-spiffe-id {id:?}: must start with spiffe://"))
    })?;
    let (domain, path) = rest.split_once('/').unwrap_or((rest, ""));
    let domain_ok = !domain.is_empty()
        && domain
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._".contains(c));
    let path_ok = !path.is_empty()
        && path.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        });
    if !domain_ok || !path_ok {
        return Err(PluginError::Input(format!(
            "--hub-spiffe-id {id:?}: not a SPIFFE ID (spiffe://<trust domain>/<path>, lower-case trust domain, path segments of [A-Za-z0-9-._])"
        )));
    }
    if path.split('/').next() == Some("ns") {
        return Err(PluginError::Input(format!(
            "--hub-spiffe-id {id:?}: a path under /ns/ belongs to the tenants of a namespace \
             (their bindings' SPIFFE IDs live there); choose one outside /ns/, such as \
             spiffe://<trust domain>/kleym/hub"
        )));
    }
    if let Some(td) = td
        && domain != td
    {
        return Err(PluginError::Input(format!(
            "--hub-spiffe-id {id:?} is outside the trust domain {td:?}"
        )));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_id_in_the_tenants_space_is_refused() {
        for tenant in [
            "spiffe://example.org/ns/kleym/sa/hub",
            "spiffe://example.org/ns/default",
            "spiffe://example.org/ns",
        ] {
            let err = resolve_hub_spiffe_id(Some(tenant), Some("example.org"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("/ns/"), "{tenant}: {err}");
        }
        // Only the first segment counts: `ns` deeper down, or a longer first segment, is fine.
        for ok in [
            "spiffe://example.org/kleym/ns/hub",
            "spiffe://example.org/nsx/hub",
            "spiffe://example.org/kleym/hub",
        ] {
            assert_eq!(
                resolve_hub_spiffe_id(Some(ok), Some("example.org")).unwrap(),
                ok
            );
        }
    }
}
