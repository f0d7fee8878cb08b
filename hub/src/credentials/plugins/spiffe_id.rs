//! The hub's SPIFFE ID, checked: shared by both SPIFFE plugins, the Workload API source
//! (which checks the IDs an agent hands out by the same rules) and `kleym trust-config`.

use super::PluginError;

/// The hub's SPIFFE ID from the two flags (`--hub-spiffe-id`, `--trust-domain`): the explicit
/// ID, else `spiffe://<trust domain>/kleym/hub`. An ID that is not a valid SPIFFE ID, or is
/// outside the trust domain when one is given, is refused.
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
    if let Some(td) = td
        && domain != td
    {
        return Err(PluginError::Input(format!(
            "--hub-spiffe-id {id:?} is outside the trust domain {td:?}"
        )));
    }
    Ok(id)
}
