//! The hub's read-only view of one running reconciler for `kleym explain`: what an
//! explanation needs that the caches hold (a namespace's labels, its bindings, a binding's
//! target and pool, every ClusterSPIFFEID), so that explaining through the hub adds no read
//! of the spoke beyond what the caches cannot answer. No I/O, no writes, no effect on
//! reconciling (a compile the memo lacks is remembered there, as a reconcile would).
//!
//! ClusterSPIFFEIDs are cached as [`ObservedOutput`]s: a foreign object keeps the view the
//! overlap analysis reads, from which its spec is rebuilt; kleym's own keeps only a digest of
//! its spec. For those, the spec the compiler gives the owning binding is a candidate, used
//! only when the digest says it is the object's spec. Otherwise (the object was edited on the
//! spoke, a write is in flight, the binding is gone or refused) the object is listed in
//! [`ClusterSpiffeIds::to_read`] and the caller reads that one object from the spoke.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::{ClusterSPIFFEID, ClusterSPIFFEIDSpec};
use kube::ResourceExt;

use super::api_availability::ApiKind;
use super::compile::gather;
use super::context::Context;
use super::observed_output::ObservedOutput;
use super::queue::ObjectKey;
use super::reconcile::cluster_config;
use crate::compiler::{self, Lookup, PoolView, TargetView};
use crate::ownership;

/// The caches cannot answer now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAnswerable {
    /// A cache has not completed its first list (the spoke is still syncing, or a watch
    /// restarted after its API came back).
    #[error(
        "the hub's caches of this spoke have not synced (the spoke is not engaged yet, or a watch is restarting)"
    )]
    NotSynced,
}

/// Every ClusterSPIFFEID of the cluster, from the caches.
#[derive(Debug, Clone, Default)]
pub struct ClusterSpiffeIds {
    /// The objects whose spec the caches know, rebuilt (see the module documentation).
    pub known: Vec<ClusterSPIFFEID>,
    /// kleym's objects whose spec is not the one the compiler gives their binding: read
    /// each from the spoke (by name).
    pub to_read: Vec<ToRead>,
}

/// A ClusterSPIFFEID the caches cannot rebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToRead {
    /// Object name.
    pub name: String,
    /// Why: which binding it belongs to, and why its spec is unknown.
    pub why: String,
}

/// Whether the caches can answer: every active cache has completed its first list.
pub fn synced(ctx: &Context) -> Result<(), NotAnswerable> {
    require_synced(ctx)
}

fn require_synced(ctx: &Context) -> Result<(), NotAnswerable> {
    if ctx.state.all_synced() {
        Ok(())
    } else {
        Err(NotAnswerable::NotSynced)
    }
}

/// The namespace `name` as cached (labels included); `None` when the cache has none.
pub fn namespace(ctx: &Context, name: &str) -> Result<Option<Namespace>, NotAnswerable> {
    require_synced(ctx)?;
    Ok(ctx
        .state
        .caches
        .namespaces
        .get("", name)
        .map(|n| n.as_ref().clone()))
}

/// The bindings of `namespace`, in name order (as the API server lists them), each as last
/// known (the cache, or kleym's own newer write).
pub fn bindings(
    ctx: &Context,
    namespace: &str,
) -> Result<Vec<InferenceIdentityBinding>, NotAnswerable> {
    require_synced(ctx)?;
    let mut names: Vec<String> = ctx
        .state
        .caches
        .bindings
        .read_namespace(namespace, |m| m.map(|m| m.keys().cloned().collect()))
        .unwrap_or_default();
    names.sort();
    Ok(names
        .iter()
        .filter_map(|n| ctx.state.current_binding_named(namespace, n))
        .map(|b| b.as_ref().clone())
        .collect())
}

/// The binding `namespace/name` as last known.
pub fn binding(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<InferenceIdentityBinding>, NotAnswerable> {
    require_synced(ctx)?;
    Ok(ctx
        .state
        .current_binding_named(namespace, name)
        .map(|b| b.as_ref().clone()))
}

/// The binding's target and pool, looked up in the caches as a reconcile looks them up.
pub fn target_and_pool(
    ctx: &Context,
    binding: &InferenceIdentityBinding,
) -> Result<(Lookup<TargetView>, Lookup<PoolView>), NotAnswerable> {
    require_synced(ctx)?;
    let (input, _) = gather(&ctx.state, &ctx.state.served(), binding);
    Ok((input.target, input.pool))
}

/// Every ClusterSPIFFEID of the cluster (see the module documentation). Empty when the
/// cluster does not serve ClusterSPIFFEIDs.
pub fn cluster_spiffe_ids(ctx: &Context) -> Result<ClusterSpiffeIds, NotAnswerable> {
    require_synced(ctx)?;
    let state = &ctx.state;
    let mut out = ClusterSpiffeIds::default();
    if !state.served().serves(ApiKind::ClusterSpiffeIds) {
        return Ok(out);
    }
    let mut cached = state.caches.cluster_spiffe_ids.list();
    cached.sort_by_key(|o| o.name_any());
    for entry in cached {
        let name = entry.name_any();
        // Kleym's own newer write wins over the cache, as in a reconcile.
        let Some(observed) = state.current_cluster_spiffe_id(&name) else {
            continue;
        };
        if let Some(spec) = observed.foreign_spec() {
            out.known.push(observed.with_spec(spec));
            continue;
        }
        match own_spec(ctx, &observed) {
            Ok(spec) => out.known.push(observed.with_spec(spec)),
            Err(why) => out.to_read.push(ToRead { name, why }),
        }
    }
    Ok(out)
}

/// The spec of kleym's object `observed`: the one the compiler gives its binding, when the
/// object has exactly that spec; otherwise why not.
fn own_spec(ctx: &Context, observed: &ObservedOutput) -> Result<ClusterSPIFFEIDSpec, String> {
    let state = &ctx.state;
    let owner = ownership::proven_owner(observed, &ctx.config.field_manager)
        .map_err(|f| format!("its ownership proof no longer holds: {}", f.why))?;
    let binding = state
        .current_binding_named(&owner.namespace, &owner.name)
        .ok_or_else(|| format!("its binding {}/{} is gone", owner.namespace, owner.name))?;
    let (input, fp) = gather(state, &state.served(), &binding);
    let key = ObjectKey::new(owner.namespace.as_str(), owner.name.as_str());
    let cluster = cluster_config(&ctx.config);
    let compiled: Arc<_> = state
        .compile_memo
        .get_or_compile_shared(&key, fp, || compiler::compile(&input, &cluster));
    match compiled.as_ref() {
        Ok(id) if observed.has_spec(&id.output.spec) => Ok(id.output.spec.clone()),
        Ok(_) => Err(format!(
            "its spec is not the one kleym compiles for binding {}/{} (edited on the spoke, or kleym's write is in flight)",
            owner.namespace, owner.name
        )),
        Err(refusal) => Err(format!(
            "binding {}/{} is refused ({}), so kleym has no spec for it",
            owner.namespace, owner.name, refusal.reason
        )),
    }
}
