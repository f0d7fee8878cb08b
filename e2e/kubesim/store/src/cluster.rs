//! [`Cluster`]: one simulated cluster's API machinery.

use crate::convert::Conversion;
use crate::delete::Deleted;
use crate::kinds::CRDS;
use crate::registry::{builtins, extra_selectable_fields};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{Inner, ParsedEvent, WatchFilter, Watcher};
use crate::watch::{StreamParts, WatchStream, bookmark_event, make_stream};
use crate::write::{Mode, TypeCtx, bad_request, not_found};
use crate::{
    ApiError, DEFAULT_HISTORY_LIMIT, DeleteOptions, ListOptions, PatchType, ResourceInfo,
    Subresource, WatchEvent, WatchOptions, WriteOptions, WriteResult,
};
use base64::Engine;
use kubesim_apply::{ApplyError, ApplyRequest, PatchError, TypeInfo};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// Default period of watch bookmarks (kube-apiserver sends one about every minute).
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// Namespaces every cluster starts with.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// One simulated cluster: registry, objects, resourceVersions, watch history and verbs.
///
/// `Send + Sync`; share it as `Arc<Cluster>`. All methods are synchronous and never block on
/// I/O; one std `RwLock` per cluster is held only for the duration of one call (never across
/// `.await`), so clusters never contend with each other. Objects are indexed per resource
/// type, and an event is fanned out only to the watchers of its type.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    state: Arc<RwLock<Inner>>,
    bookmark_ms: AtomicU64,
}

fn method_not_allowed(verb: &str, res: &ResourceInfo) -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        format!(
            "{verb} is not supported on resources of kind \"{}\"",
            res.resource_group()
        ),
    )
}

fn unknown_resource() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn patch_error(e: PatchError) -> ApiError {
    match e {
        PatchError::BadRequest(m) => bad_request(m),
        PatchError::Invalid(m) => ApiError::new(422, "Invalid", m),
    }
}

fn apply_error(e: ApplyError) -> ApiError {
    match e {
        ApplyError::Conflict { message, conflicts } => {
            let mut err = ApiError::new(409, "Conflict", message);
            err.details = Some(json!({
                "causes": conflicts.iter().map(|(m, f)| json!({
                    "reason": "FieldManagerConflict",
                    "message": format!("conflict with \"{m}\""),
                    "field": f,
                })).collect::<Vec<_>>(),
            }));
            err
        }
        ApplyError::Invalid(m) => ApiError::new(422, "Invalid", m),
    }
}

/// Continue tokens: opaque base64 of the last key returned.
fn encode_continue(ns: &str, name: &str, rv: u64) -> String {
    let raw = json!({"rv": rv, "ns": ns, "name": name}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let invalid = |why: &str| bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(&e.to_string()))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| invalid(&e.to_string()))?;
    match (
        v.get("ns").and_then(Value::as_str),
        v.get("name").and_then(Value::as_str),
    ) {
        (Some(ns), Some(name)) => Ok((ns.to_string(), name.to_string())),
        _ => Err(invalid("malformed")),
    }
}

impl Inner {
    /// Resolve the caller's ResourceInfo against what is served now (cached until the
    /// served types change).
    fn ctx(&self, res: &ResourceInfo) -> Result<Arc<TypeCtx>, ApiError> {
        let key = (res.group.clone(), res.version.clone(), res.plural.clone());
        let cache = |c: &mut std::collections::HashMap<_, Arc<TypeCtx>>| c.get(&key).cloned();
        if let Some(ctx) = cache(
            &mut self
                .ctx_cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        ) {
            return Ok(ctx);
        }
        let ctx = Arc::new(self.build_ctx(res)?);
        self.ctx_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Arc::clone(&ctx));
        Ok(ctx)
    }

    fn build_ctx(&self, res: &ResourceInfo) -> Result<TypeCtx, ApiError> {
        let Some(r) =
            self.resources
                .get(&(res.group.clone(), res.version.clone(), res.plural.clone()))
        else {
            return Err(unknown_resource());
        };
        let key = crate::convert::storage_key(r);
        let mut selectable = vec![
            "metadata.name".to_string(),
            "metadata.namespace".to_string(),
        ];
        selectable.extend(
            extra_selectable_fields(&r.group, &r.plural)
                .iter()
                .map(|s| s.to_string()),
        );
        let mut ctx = TypeCtx {
            res: ResourceInfo::clone(r),
            key: key.clone(),
            schema: None,
            type_info: self
                .builtin_types
                .get(&(r.group.clone(), r.version.clone(), r.plural.clone()))
                .cloned()
                .unwrap_or_else(|| Arc::new(TypeInfo::deduced())),
            conversion: if crate::convert::is_events_v1(r) {
                Conversion::EventsV1
            } else {
                Conversion::Identity
            },
            selectable,
        };
        if r.custom
            && let Some(def) = self.crds.get(&key)
        {
            ctx.conversion = Conversion::ApiVersion {
                served: r.api_version(),
                storage: format!("{}/{}", def.group, def.storage_version),
            };
            if let Some(v) = def.versions.get(&r.version) {
                ctx.schema = Some(Arc::clone(&v.schema));
                ctx.type_info = Arc::clone(&v.type_info);
                ctx.selectable.extend(v.selectable_fields.iter().cloned());
            }
        }
        Ok(ctx)
    }
}

fn parse_selectors(
    ctx: &TypeCtx,
    label: Option<&str>,
    field: Option<&str>,
) -> Result<(Option<LabelSelector>, Option<FieldSelector>), ApiError> {
    let label = match label.filter(|s| !s.trim().is_empty()) {
        Some(s) => Some(LabelSelector::parse(s).map_err(bad_request)?),
        None => None,
    };
    let field = match field.filter(|s| !s.trim().is_empty()) {
        Some(s) => Some(
            FieldSelector::parse(s, &ctx.selectable)
                .map_err(bad_request)?
                .map_fields(|f| ctx.conversion.storage_field(f)),
        ),
        None => None,
    };
    Ok((label, field))
}

impl Cluster {
    /// A cluster with the built-in resources registered and the namespaces `default`,
    /// `kube-system`, `kube-public`, `kube-node-lease` (each with its `default`
    /// ServiceAccount). Default RBAC is not preloaded; callers `create()` what they need.
    pub fn new(name: &str) -> Arc<Self> {
        let mut inner = Inner::new(DEFAULT_HISTORY_LIMIT);
        for r in builtins() {
            inner.register(r);
        }
        let cluster = Self {
            name: name.to_string(),
            state: Arc::new(RwLock::new(inner)),
            bookmark_ms: AtomicU64::new(DEFAULT_BOOKMARK_INTERVAL.as_millis() as u64),
        };
        if let Some(ns_res) = cluster.resolve("", "v1", "namespaces") {
            for ns in INITIAL_NAMESPACES {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                let opts = WriteOptions {
                    field_manager: "kube-apiserver".to_string(),
                    ..WriteOptions::default()
                };
                if let Err(e) = cluster.create(&ns_res, None, obj, &opts) {
                    tracing::error!(cluster = name, namespace = ns, error = %e, "creating initial namespace");
                }
            }
        }
        Arc::new(cluster)
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every served resource (built-ins, virtual resources and served CRD versions), for
    /// discovery, ordered by group, version, plural.
    pub fn resources(&self) -> Vec<ResourceInfo> {
        self.read()
            .resources
            .values()
            .map(|r| ResourceInfo::clone(r))
            .collect()
    }

    /// The served resource at `group`/`version`/`plural`, if any.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<ResourceInfo> {
        self.resolve_shared(group, version, plural)
            .map(Arc::unwrap_or_clone)
    }

    /// As [`Cluster::resolve`], without copying the description (what the HTTP layer
    /// uses on every request).
    pub fn resolve_shared(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.read()
            .resources
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// The `openAPIV3Schema` of a served CRD version (for `/openapi/v3`); `None` for
    /// built-ins and unknown kinds.
    pub fn openapi_v3_schema(&self, group: &str, version: &str, kind: &str) -> Option<Value> {
        let inner = self.read();
        inner
            .crds
            .values()
            .find(|d| d.group == group && d.kind == kind)
            .and_then(|d| d.versions.get(version))
            .filter(|v| v.served)
            .map(|v| v.raw_schema.clone())
    }

    /// `get`.
    pub fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let inner = self.read();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only {
            return Err(method_not_allowed("get", &ctx.res));
        }
        let ns = if ctx.res.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        inner
            .get(&ctx.key, ns, name)
            .map(|o| ctx.out_owned(o))
            .ok_or_else(|| not_found(&ctx.res, name))
    }

    /// `list`: a `<Kind>List` with `metadata.resourceVersion` (current cluster RV) and
    /// `metadata.continue` when paginated. Items are ordered by namespace, then name.
    pub fn list(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<Value, ApiError> {
        let inner = self.read();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only {
            return Err(method_not_allowed("list", &ctx.res));
        }
        let (label, field) = parse_selectors(
            &ctx,
            opts.label_selector.as_deref(),
            opts.field_selector.as_deref(),
        )?;
        let filter = WatchFilter {
            ns: None,
            label,
            field,
        };
        let ns = ns.filter(|n| ctx.res.namespaced && !n.is_empty());
        let after = match opts.continue_token.as_deref().filter(|t| !t.is_empty()) {
            Some(t) => Some(decode_continue(t)?),
            None => None,
        };
        let limit = opts.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut cont = None;
        if let Some(ts) = inner.types.get(&ctx.key) {
            let mut iter = ts
                .range_after(ns, after.as_ref())
                .map(|(k, o)| (k, o.value()))
                .filter(|(_, o)| filter.matches(o));
            for (k, o) in iter.by_ref() {
                items.push(ctx.served(o));
                if limit.is_some_and(|l| items.len() >= l) {
                    cont = Some(k.clone());
                    break;
                }
            }
            if cont.is_some() && iter.next().is_none() {
                cont = None;
            }
        }
        let mut meta = json!({"resourceVersion": inner.rv.to_string()});
        if let Some((cns, cname)) = cont {
            meta["continue"] = Value::from(encode_continue(&cns, &cname, inner.rv));
        }
        // `items` is moved in, not passed through `json!` (which would deep-copy it)
        let mut list = json!({
            "apiVersion": ctx.res.api_version(),
            "kind": ctx.res.list_kind,
            "metadata": meta,
        });
        list["items"] = Value::Array(items);
        Ok(list)
    }

    /// `watch`. Errors that kube-apiserver returns before streaming (bad selector, bad
    /// resourceVersion) are `Err`; a resourceVersion older than the kept history yields a
    /// stream with one `ERROR` event (410 `Expired`), as kube-apiserver's watch cache does.
    pub fn watch(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        opts: &WatchOptions,
    ) -> Result<WatchStream, ApiError> {
        let mut inner = self.write();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only {
            return Err(method_not_allowed("watch", &ctx.res));
        }
        let (label, field) = parse_selectors(
            &ctx,
            opts.label_selector.as_deref(),
            opts.field_selector.as_deref(),
        )?;
        let filter = WatchFilter {
            ns: ns
                .filter(|n| ctx.res.namespaced && !n.is_empty())
                .map(str::to_string),
            label,
            field,
        };
        let from = match opts
            .resource_version
            .as_deref()
            .filter(|s| !s.is_empty() && *s != "0")
        {
            None => None,
            Some(s) => Some(
                s.parse::<u64>()
                    .map_err(|_| bad_request(format!("invalid resource version: {s}")))?,
            ),
        };
        let current = inner.rv;
        let Some(ts) = inner.types.get_mut(&ctx.key) else {
            return Err(unknown_resource());
        };
        let mut pending = VecDeque::new();
        let out = |v: &Value| ctx.out(v);
        match from {
            Some(n) if !opts.send_initial_events => {
                if n < ts.floor {
                    let err = ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {n} ({})", ts.floor),
                    );
                    pending.push_back(WatchEvent {
                        event_type: "ERROR",
                        object: err.to_status(),
                    });
                    return Ok(make_stream(StreamParts {
                        pending,
                        rx: None,
                        api_version: ctx.res.api_version(),
                        kind: ctx.res.kind.clone(),
                        ctx: ctx.clone(),
                        deadline: None,
                        bookmark_every: None,
                        state: Arc::downgrade(&self.state),
                    }));
                }
                for ev in ts.history.iter().filter(|e| e.rv > n) {
                    if let Some(m) = filter.translate(&ParsedEvent::parse(ev)) {
                        pending.push_back(WatchEvent {
                            event_type: m.event_type,
                            object: out(&m.object),
                        });
                    }
                }
            }
            _ => {
                for (_, o) in ts.range(filter.ns.as_deref()) {
                    let o = o.value();
                    if filter.matches(&o) {
                        pending.push_back(WatchEvent {
                            event_type: "ADDED",
                            object: out(&o),
                        });
                    }
                }
                if opts.send_initial_events && opts.allow_bookmarks {
                    pending.push_back(bookmark_event(
                        &ctx.res.api_version(),
                        &ctx.res.kind,
                        current,
                        true,
                    ));
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        ts.watchers.push(Watcher {
            filter,
            tx,
            version: ctx.res.version.clone(),
        });
        drop(inner);
        let bookmark_every = opts
            .allow_bookmarks
            .then(|| Duration::from_millis(self.bookmark_ms.load(Ordering::Relaxed).max(1)));
        Ok(make_stream(StreamParts {
            pending,
            rx: Some(rx),
            api_version: ctx.res.api_version(),
            kind: ctx.res.kind.clone(),
            ctx: ctx.clone(),
            deadline: opts
                .timeout_seconds
                .map(|s| tokio::time::Instant::now() + Duration::from_secs(s)),
            bookmark_every,
            state: Arc::downgrade(&self.state),
        }))
    }

    /// `create` (`POST`). `ns` is the namespace from the URL for namespaced resources.
    /// The field manager defaults to `unknown` when `opts.field_manager` is empty (the
    /// HTTP layer derives it from the user agent, as kube-apiserver does).
    pub fn create(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        let mut inner = self.write();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only {
            return Err(method_not_allowed("create", &ctx.res));
        }
        inner.create_obj(&ctx, ns, obj, opts, Mode::Update(manager(opts)), None)
    }

    /// `update` (`PUT`) of the main resource or `/status`.
    pub fn update(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        let mut inner = self.write();
        let ctx = writable(&inner, res, sub)?;
        inner.update_obj(
            &ctx,
            ns,
            name,
            obj,
            sub,
            opts,
            Mode::Update(manager(opts)),
            None,
        )
    }

    /// `patch` (`PATCH`) of the main resource or `/status`; `PatchType::Apply` is
    /// server-side apply and creates a missing object. Strategic merge patch on a custom
    /// resource is a 415, as in kube-apiserver.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        pt: PatchType,
        body: &Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<WriteResult, ApiError> {
        let mut inner = self.write();
        let ctx = writable(&inner, res, sub)?;
        let store_ns = if ctx.res.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        let live = inner
            .get(&ctx.key, store_ns, name)
            .map(|o| ctx.out_owned(o));
        if pt == PatchType::Strategic && ctx.res.custom {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if pt == PatchType::Apply {
            if opts.field_manager.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            if live.is_none() && sub == Subresource::Status {
                return Err(not_found(&ctx.res, name));
            }
            let now = crate::meta::now_rfc3339();
            let req = ApplyRequest {
                manager: &opts.field_manager,
                force: opts.force,
                subresource: (sub == Subresource::Status).then_some("status"),
                now: &now,
            };
            let merged =
                kubesim_apply::server_side_apply(live.as_ref(), body, &ctx.type_info, &req)
                    .map_err(apply_error)?;
            return inner.update_obj(&ctx, ns, name, merged, sub, opts, Mode::Apply, live);
        }
        let Some(live) = live else {
            return Err(not_found(&ctx.res, name));
        };
        let patched = match pt {
            PatchType::Merge => kubesim_apply::merge_patch(&live, body),
            PatchType::Json => kubesim_apply::json_patch(&live, body).map_err(patch_error)?,
            PatchType::Strategic => kubesim_apply::strategic_merge_patch(
                &live,
                body,
                &ctx.res.api_version(),
                &ctx.res.kind,
            )
            .map_err(patch_error)?,
            PatchType::Apply => live.clone(),
        };
        inner.update_obj(
            &ctx,
            ns,
            name,
            patched,
            sub,
            opts,
            Mode::Update(manager(opts)),
            Some(live),
        )
    }

    /// `delete`: returns the deleted object (kinds with `ReturnDeletedObject`: pods,
    /// namespaces, CRDs, custom resources) or a `Status` `Success`; with finalizers (or a
    /// namespace still holding content), the object with its `deletionTimestamp` set.
    /// Dependents are garbage-collected synchronously per `propagationPolicy`.
    pub fn delete(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut inner = self.write();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only {
            return Err(method_not_allowed("delete", &ctx.res));
        }
        let ns = if ctx.res.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        let outcome = inner.delete_key(&ctx.res, &ctx.key, ns, name, opts)?;
        Ok(deleted_body(&ctx, outcome))
    }

    /// `deletecollection`: deletes every object matching the selectors (all pages) and
    /// returns a `<Kind>List` of what was deleted (or marked for deletion).
    pub fn delete_collection(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        list_opts: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut inner = self.write();
        let ctx = inner.ctx(res)?;
        if ctx.res.virtual_only || !ctx.res.verbs.iter().any(|v| v == "deletecollection") {
            return Err(method_not_allowed("deletecollection", &ctx.res));
        }
        let (label, field) = parse_selectors(
            &ctx,
            list_opts.label_selector.as_deref(),
            list_opts.field_selector.as_deref(),
        )?;
        let filter = WatchFilter {
            ns: None,
            label,
            field,
        };
        let ns = ns.filter(|n| ctx.res.namespaced && !n.is_empty());
        let targets: Vec<(String, String)> = inner
            .types
            .get(&ctx.key)
            .map(|ts| {
                ts.range(ns)
                    .filter(|(_, o)| filter.matches(&o.value()))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut items = Vec::new();
        for (ons, oname) in targets {
            match inner.delete_key(&ctx.res, &ctx.key, &ons, &oname, opts) {
                Ok(Deleted::Gone(o)) | Ok(Deleted::Pending(o)) => items.push(ctx.out(&o)),
                // GC of an earlier item may have removed this one already
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let mut list = json!({
            "apiVersion": ctx.res.api_version(),
            "kind": ctx.res.list_kind,
            "metadata": {"resourceVersion": inner.rv.to_string()},
        });
        list["items"] = Value::Array(items);
        Ok(list)
    }

    /// The latest resourceVersion handed out in this cluster.
    pub fn current_resource_version(&self) -> u64 {
        self.read().rv
    }

    /// Keep at most `n` events of watch history in this cluster, over all resource types
    /// (default [`crate::DEFAULT_HISTORY_LIMIT`]); older history is dropped at once.
    pub fn set_history_limit(&self, n: usize) {
        let mut inner = self.write();
        inner.history_limit = n;
        inner.trim_history();
    }

    /// Drop all watch history: the next watch from any earlier resourceVersion gets 410.
    pub fn expire_history(&self) {
        self.write().clear_history();
    }

    /// End every open watch stream (fault injection: dropped watches). Events already
    /// queued on a stream are still delivered before it ends.
    pub fn close_watches(&self) {
        let mut inner = self.write();
        for t in inner.types.values_mut() {
            t.watchers.clear();
        }
    }

    /// Period of BOOKMARK events on watches with `allowWatchBookmarks` (default
    /// [`DEFAULT_BOOKMARK_INTERVAL`]); applies to watches opened afterwards.
    pub fn set_bookmark_interval(&self, every: Duration) {
        self.bookmark_ms
            .store(every.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// Number of open watch streams (all resource types).
    pub fn watcher_count(&self) -> usize {
        let mut inner = self.write();
        inner
            .types
            .values_mut()
            .map(|t| {
                t.watchers.retain(|w| !w.tx.is_closed());
                t.watchers.len()
            })
            .sum()
    }

    /// Open watch streams per resource type (`plural` or `plural.group`, as
    /// [`Cluster::write_counts`]); types without an open watch are left out.
    pub fn watcher_counts(&self) -> std::collections::BTreeMap<String, usize> {
        let mut inner = self.write();
        inner
            .types
            .iter_mut()
            .filter_map(|(k, t)| {
                t.watchers.retain(|w| !w.tx.is_closed());
                (!t.watchers.is_empty()).then(|| (k.clone(), t.watchers.len()))
            })
            .collect()
    }

    /// Stored writes per resource type (`plural` or `plural.group`): every create, update,
    /// patch or delete that changed something, including the store's own (namespace
    /// termination, garbage collection, CRD status). No-op writes are not counted. A CRD's
    /// counter restarts when the CRD is deleted.
    pub fn write_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.read()
            .types
            .iter()
            .map(|(k, t)| (k.clone(), t.writes))
            .collect()
    }

    /// Number of stored objects (all resource types).
    pub fn object_count(&self) -> usize {
        self.read().types.values().map(|t| t.objects.len()).sum()
    }
}

fn manager(opts: &WriteOptions) -> &str {
    if opts.field_manager.is_empty() {
        "unknown"
    } else {
        &opts.field_manager
    }
}

fn writable(inner: &Inner, res: &ResourceInfo, sub: Subresource) -> Result<Arc<TypeCtx>, ApiError> {
    let ctx = inner.ctx(res)?;
    if ctx.res.virtual_only {
        return Err(method_not_allowed("update", &ctx.res));
    }
    if sub == Subresource::Status && !ctx.res.has_status {
        return Err(unknown_resource());
    }
    Ok(ctx)
}

fn deleted_body(ctx: &TypeCtx, outcome: Deleted) -> Value {
    match outcome {
        Deleted::Pending(o) => ctx.out(&o),
        Deleted::Gone(o) => {
            if crate::registry::returns_deleted_object(
                &ctx.res.group,
                &ctx.res.plural,
                ctx.res.custom,
            ) || ctx.key == CRDS
            {
                ctx.out(&o)
            } else {
                json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {
                        "name": crate::meta::meta_str(&o, "name").unwrap_or_default(),
                        "group": ctx.res.group,
                        "kind": ctx.res.plural,
                        "uid": crate::meta::meta_str(&o, "uid").unwrap_or_default(),
                    },
                })
            }
        }
    }
}
