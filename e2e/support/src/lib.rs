//! Test helpers for one kubesim cluster, shared by `kleym-spoke`'s tests (`spoke/tests/`) and
//! `kleym-e2e`: polling, creating objects and manifests, reading repository manifests and a
//! binding's conditions ([`single`]), who a cluster says a token belongs to ([`authn`]), a generated inference environment written straight into
//! a cluster's store ([`env`]), a request-recording authenticator ([`recording`]) and the
//! vendored CRDs parsed ([`upstream_crds`], [`all_crds`]).
//!
//! It depends on kubesim and `kleym-api` only, never on `kleym-spoke` or `kleym-hub` (which
//! dev-depend on it).

pub mod authn;
pub mod env;
pub mod recording;
pub mod single;

use kubesim::parse_crds;
use serde_json::Value;

/// The vendored upstream CRDs (ClusterProfile v1alpha1, inference, SPIRE), parsed from the
/// texts embedded in the `upstream-crds` crate (so this works from any working directory and
/// from an installed binary).
pub fn upstream_crds() -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for file in upstream_crds::UPSTREAM {
        out.extend(parse_crds(file.name, file.yaml).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The upstream CRDs (ClusterProfile, inference, SPIRE) plus kleym's own.
pub fn all_crds() -> Result<Vec<Value>, String> {
    let mut out = upstream_crds()?;
    for crd in kleym_api::crds::all() {
        out.push(serde_json::to_value(crd).map_err(|e| e.to_string())?);
    }
    Ok(out)
}
