//! Watch streams: initial or replayed events, then live events from the type's fan-out,
//! periodic bookmarks, and the end of the stream on timeout or [`crate::Cluster::close_watches`].

use crate::WatchEvent;
use crate::state::{Inner, WatchMsg};
use crate::write::TypeCtx;
use futures::Stream;
use serde_json::json;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A watch stream: events in resourceVersion order until the watch times out, is closed by
/// [`crate::Cluster::close_watches`], or the resource stops being served.
pub type WatchStream = Pin<Box<dyn Stream<Item = WatchEvent> + Send + 'static>>;

/// Everything a watch stream needs once it is registered.
pub(crate) struct StreamParts {
    /// Events to deliver before live ones (initial state, history replay, or one ERROR).
    pub pending: VecDeque<WatchEvent>,
    /// Live events; `None` for a stream that only delivers `pending`.
    pub rx: Option<mpsc::UnboundedReceiver<WatchMsg>>,
    /// `apiVersion` of the watched resource.
    pub api_version: String,
    /// Kind of the watched resource (for bookmarks).
    pub kind: String,
    /// Stored form → served form of each object (conversion, and for a custom resource
    /// watched through a non-storage version, that version's pruning and defaults).
    pub ctx: Arc<TypeCtx>,
    /// `timeoutSeconds`.
    pub deadline: Option<Instant>,
    /// Bookmark period when `allowWatchBookmarks`.
    pub bookmark_every: Option<Duration>,
    /// The cluster state, to read the current resourceVersion for bookmarks.
    pub state: Weak<RwLock<Inner>>,
}

impl StreamParts {
    fn convert(&self, m: WatchMsg) -> WatchEvent {
        let object = self.ctx.served(Arc::unwrap_or_clone(m.object));
        WatchEvent {
            event_type: m.event_type,
            object,
        }
    }

    /// Queue everything already sent, then a BOOKMARK at the current resourceVersion.
    /// Holding the read lock guarantees no event at or below that version is still in
    /// flight (writers send while holding the write lock). `false` when the cluster is gone.
    fn bookmark(&mut self) -> bool {
        let Some(state) = self.state.upgrade() else {
            return false;
        };
        let Ok(inner) = state.read() else {
            return false;
        };
        let mut drained = Vec::new();
        if let Some(rx) = self.rx.as_mut() {
            while let Ok(m) = rx.try_recv() {
                drained.push(m);
            }
        }
        let rv = inner.rv;
        drop(inner);
        for m in drained {
            let ev = self.convert(m);
            self.pending.push_back(ev);
        }
        self.pending
            .push_back(bookmark_event(&self.api_version, &self.kind, rv, false));
        true
    }
}

/// A BOOKMARK event; `initial_end` adds the `k8s.io/initial-events-end` annotation.
pub(crate) fn bookmark_event(
    api_version: &str,
    kind: &str,
    rv: u64,
    initial_end: bool,
) -> WatchEvent {
    let mut object = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if initial_end {
        object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    WatchEvent {
        event_type: "BOOKMARK",
        object,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending::<()>().await,
    }
}

/// Turn registered parts into the boxed stream.
pub(crate) fn make_stream(parts: StreamParts) -> WatchStream {
    let next_bookmark = parts.bookmark_every.map(|d| Instant::now() + d);
    Box::pin(futures::stream::unfold(
        (parts, next_bookmark),
        |(mut p, mut next_bookmark)| async move {
            loop {
                if let Some(ev) = p.pending.pop_front() {
                    return Some((ev, (p, next_bookmark)));
                }
                let deadline = p.deadline;
                let rx = p.rx.as_mut()?;
                tokio::select! {
                    biased;
                    m = rx.recv() => {
                        let m = m?;
                        let ev = p.convert(m);
                        return Some((ev, (p, next_bookmark)));
                    }
                    _ = sleep_until_opt(deadline) => return None,
                    _ = sleep_until_opt(next_bookmark) => {
                        next_bookmark = p.bookmark_every.map(|d| Instant::now() + d);
                        if !p.bookmark() {
                            return None;
                        }
                    }
                }
            }
        },
    ))
}
