//! The list-then-watch loop behind each cache, reading watch responses without a buffer of
//! their own.
//!
//! It is kube-runtime's `watcher` with its default configuration: list in pages of 500, then
//! watch from the list's resourceVersion with bookmarks, resume from the last seen
//! resourceVersion when a watch ends or is cut, list again on `410 Gone`. Same events, same
//! errors ([`watcher::Error`]), used with the same backoff (`WatchStreamExt::default_backoff`),
//! so the caches and the failure reports do not change.
//!
//! Why not kube-runtime's own: kube-client reads each watch response through a `FramedRead`
//! whose buffer is allocated at 8 KiB when the watch starts and lives as long as the watch.
//! A spoke has up to eight watches, so at 1000 spokes those buffers were 65 MB of the hub's
//! heap, its largest fixed cost per spoke (heaptrack; docs/hub.md). Here an event is decoded
//! straight from the response chunk it arrived in; only an event split across chunks is
//! copied, into a buffer freed as soon as the event is complete.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::pin::Pin;
use std::time::Duration;

use futures::io::{AsyncBufRead, AsyncBufReadExt};
use futures::stream::{self, Stream};
use kube::api::{Api, ListParams, WatchParams};
use kube::core::{Request, Status, WatchEvent};
use kube::runtime::watcher::{Error, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Objects per list page (kube-runtime's and client-go's default).
const PAGE_SIZE: u32 = 500;
/// How long a watch may stay silent before it is treated as dead and resumed: the server
/// ends a watch after `timeoutSeconds` (290 by default), plus kube-runtime's 5 s margin.
const IDLE_TIMEOUT: Duration = Duration::from_secs(290 + 5);

/// Lists and watches what `api` addresses, forever: the events kube-runtime's
/// `watcher(api, Config::default())` yields, in the same order.
pub fn list_watch<K>(api: Api<K>) -> impl Stream<Item = Result<Event<K>, Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    stream::unfold((api, State::Empty), |(api, state)| async move {
        let (event, state) = step(&api, state).await;
        Some((event, (api, state)))
    })
}

enum State<K> {
    /// The next step starts a list.
    Empty,
    /// Handing out a list page, then fetching the next.
    Listing {
        continue_token: Option<String>,
        objects: VecDeque<K>,
        resource_version: Option<String>,
    },
    /// Listed (or a watch ended): the next step starts a watch from `resource_version`.
    Listed { resource_version: String },
    /// Reading a watch.
    Watching {
        resource_version: String,
        events: WatchEvents,
    },
}

/// Steps until there is something to report.
async fn step<K>(api: &Api<K>, mut state: State<K>) -> (Result<Event<K>, Error>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        match step_once(api, state).await {
            (Some(event), next) => return (event, next),
            (None, next) => state = next,
        }
    }
}

async fn step_once<K>(api: &Api<K>, state: State<K>) -> (Option<Result<Event<K>, Error>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match state {
        State::Empty => (
            Some(Ok(Event::Init)),
            State::Listing {
                continue_token: None,
                objects: VecDeque::new(),
                resource_version: None,
            },
        ),
        State::Listing {
            continue_token,
            mut objects,
            resource_version,
        } => {
            if let Some(next) = objects.pop_front() {
                return (
                    Some(Ok(Event::InitApply(next))),
                    State::Listing {
                        continue_token,
                        objects,
                        resource_version,
                    },
                );
            }
            if continue_token.is_none()
                && let Some(resource_version) = resource_version
            {
                return (
                    Some(Ok(Event::InitDone)),
                    State::Listed { resource_version },
                );
            }
            let params = ListParams {
                limit: Some(PAGE_SIZE),
                continue_token,
                ..ListParams::default()
            };
            // Boxed, as is starting a watch: a watch task waits in `Watching` nearly all
            // its life, and an unboxed await keeps room for its largest future all along.
            match Box::pin(api.list(&params)).await {
                Ok(list) => {
                    let resource_version = list.metadata.resource_version.filter(|s| !s.is_empty());
                    let continue_token = list.metadata.continue_.filter(|s| !s.is_empty());
                    if resource_version.is_none() && continue_token.is_none() {
                        return (Some(Err(Error::NoResourceVersion)), State::Empty);
                    }
                    (
                        None,
                        State::Listing {
                            continue_token,
                            objects: list.items.into(),
                            resource_version,
                        },
                    )
                }
                Err(err) => (Some(Err(Error::InitialListFailed(err))), State::Empty),
            }
        }
        State::Listed { resource_version } => {
            match Box::pin(start_watch(api, &resource_version)).await {
                Ok(events) => (
                    None,
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                Err(err) => (
                    Some(Err(Error::WatchStartFailed(err))),
                    State::Listed { resource_version },
                ),
            }
        }
        State::Watching {
            resource_version,
            mut events,
        } => {
            let next = tokio::time::timeout(IDLE_TIMEOUT, events.next::<K>())
                .await
                .unwrap_or_else(|_elapsed| {
                    tracing::debug!("watch stream idle for {IDLE_TIMEOUT:?}; resuming");
                    None
                });
            match next {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    changed(obj, Event::Apply, events)
                }
                Some(Ok(WatchEvent::Deleted(obj))) => changed(obj, Event::Delete, events),
                Some(Ok(WatchEvent::Bookmark(bookmark))) => (
                    None,
                    State::Watching {
                        resource_version: bookmark.metadata.resource_version,
                        events,
                    },
                ),
                Some(Ok(WatchEvent::Error(status))) => {
                    // 410 Gone: the resourceVersion left the server's window; list again.
                    let next = if status.code == 410 {
                        State::Empty
                    } else {
                        State::Watching {
                            resource_version,
                            events,
                        }
                    };
                    (Some(Err(Error::WatchError(status))), next)
                }
                Some(Err(err)) => (
                    Some(Err(Error::WatchFailed(err))),
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                None => (None, State::Listed { resource_version }),
            }
        }
    }
}

/// A watch event about `obj`: reported as `event`, and the watch goes on from `obj`'s
/// resourceVersion (without one, it cannot resume: list again).
fn changed<K: Resource>(
    obj: K,
    event: fn(K) -> Event<K>,
    events: WatchEvents,
) -> (Option<Result<Event<K>, Error>>, State<K>) {
    match obj.resource_version().filter(|rv| !rv.is_empty()) {
        Some(resource_version) => (
            Some(Ok(event(obj))),
            State::Watching {
                resource_version,
                events,
            },
        ),
        None => (Some(Err(Error::NoResourceVersion)), State::Empty),
    }
}

async fn start_watch<K: Resource + Clone>(
    api: &Api<K>,
    resource_version: &str,
) -> kube::Result<WatchEvents> {
    let mut request = Request::new(api.resource_url())
        .watch(&WatchParams::default(), resource_version)
        .map_err(kube::Error::BuildRequest)?;
    // As kube-client does for watches: a compressed watch could not be read per event.
    request
        .headers_mut()
        .entry(http::header::ACCEPT_ENCODING)
        .or_insert(http::HeaderValue::from_static("identity"));
    request.extensions_mut().insert("watch");
    let client = api.clone().into_client();
    Ok(WatchEvents::new(client.request_stream(request).await?))
}

/// The events of one watch response: one JSON object per line.
pub(crate) struct WatchEvents {
    body: Pin<Box<dyn AsyncBufRead + Send>>,
    /// The start of an event whose line has not ended in the chunks read so far.
    partial: Vec<u8>,
    ended: bool,
}

impl WatchEvents {
    fn new(body: impl AsyncBufRead + Send + 'static) -> Self {
        Self {
            body: Box::pin(body),
            partial: Vec::new(),
            ended: false,
        }
    }

    /// The next event; `None` once the response ended (the watch is then resumed).
    async fn next<K: DeserializeOwned>(&mut self) -> Option<kube::Result<WatchEvent<K>>> {
        while !self.ended {
            let chunk = match self.body.fill_buf().await {
                Ok(chunk) => chunk,
                Err(err) => {
                    self.ended = true;
                    return read_error(err);
                }
            };
            if chunk.is_empty() {
                // The response ended; a last line without its newline is still an event.
                self.ended = true;
                let rest = std::mem::take(&mut self.partial);
                return decode_line(&rest);
            }
            let read = chunk.len();
            match chunk.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    let event = if self.partial.is_empty() {
                        decode_line(&chunk[..end])
                    } else {
                        self.partial.extend_from_slice(&chunk[..end]);
                        // Taken, so the copy is freed with the line.
                        decode_line(&std::mem::take(&mut self.partial))
                    };
                    self.body.consume_unpin(end + 1);
                    if event.is_some() {
                        return event;
                    }
                }
                None => {
                    self.partial.extend_from_slice(chunk);
                    self.body.consume_unpin(read);
                }
            }
        }
        None
    }
}

/// One line of a watch response as kube-client reads it: an event, an error `Status`, or
/// nothing (a blank line, or a line cut short when the response ended).
fn decode_line<K: DeserializeOwned>(line: &[u8]) -> Option<kube::Result<WatchEvent<K>>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(event) => Some(Ok(event)),
        Err(err) if err.is_eof() => None,
        Err(err) => match serde_json::from_slice::<Status>(line) {
            Ok(status) => Some(Err(kube::Error::Api(Box::new(status)))),
            Err(_) => Some(Err(kube::Error::SerdeError(err))),
        },
    }
}

/// A failed read of a watch response, as kube-client reports it: a response cut short (the
/// server or a proxy closed it, or the connection's keepalive gave up) or timed out ends
/// the watch quietly, to be resumed from its resourceVersion; anything else is reported,
/// then the watch is resumed.
fn read_error<K>(err: std::io::Error) -> Option<kube::Result<WatchEvent<K>>> {
    match err.kind() {
        std::io::ErrorKind::TimedOut => {
            tracing::warn!(error = %err, "watch read timed out; resuming");
            None
        }
        std::io::ErrorKind::UnexpectedEof => None,
        _ if cut_short(&err) => None,
        _ => Some(Err(kube::Error::ReadEvents(err))),
    }
}

/// Whether the read failed because the response ended early: an `UnexpectedEof` anywhere in
/// the error's chain (TLS stacks nest it), or hyper's chunked decoder saying so.
fn cut_short(err: &std::io::Error) -> bool {
    // Bounded: a `source` chain that cycles must not stall the watch.
    const MAX_DEPTH: usize = 16;
    if err.to_string().contains("unexpected EOF during chunk") {
        return true;
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = err
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    for _ in 0..MAX_DEPTH {
        let Some(e) = current else {
            return false;
        };
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::UnexpectedEof
        {
            return true;
        }
        if e.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt as _;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn event(name: &str, rv: &str) -> String {
        serde_json::json!({
            "type": "ADDED",
            "object": {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "resourceVersion": rv},
                       "data": {"k": "v".repeat(40)}}
        })
        .to_string()
    }

    fn reader(chunks: Vec<std::io::Result<Vec<u8>>>) -> WatchEvents {
        WatchEvents::new(stream::iter(chunks).into_async_read())
    }

    async fn names(events: &mut WatchEvents) -> Vec<Result<String, String>> {
        let mut out = Vec::new();
        while let Some(next) = events.next::<ConfigMap>().await {
            out.push(match next {
                Ok(WatchEvent::Added(cm)) => Ok(cm.name_any()),
                Ok(other) => Err(format!("unexpected {other:?}")),
                Err(e) => Err(e.to_string()),
            });
        }
        out
    }

    #[tokio::test]
    async fn events_split_anywhere_across_chunks_decode_the_same() {
        let text = format!(
            "{}\n{}\n\n{}\n",
            event("a", "1"),
            event("b", "2"),
            event("c", "3")
        );
        let bytes = text.as_bytes();
        let want: Vec<Result<String, String>> =
            vec![Ok("a".into()), Ok("b".into()), Ok("c".into())];
        assert_eq!(names(&mut reader(vec![Ok(bytes.to_vec())])).await, want);
        for cut in 1..bytes.len() {
            let chunks = vec![Ok(bytes[..cut].to_vec()), Ok(bytes[cut..].to_vec())];
            let mut events = reader(chunks);
            assert_eq!(names(&mut events).await, want, "cut at {cut}");
            // The copy of a split event is freed with it.
            assert_eq!(events.partial.capacity(), 0, "cut at {cut}");
        }
        let bytewise = bytes.iter().map(|b| Ok(vec![*b])).collect();
        assert_eq!(names(&mut reader(bytewise)).await, want);
    }

    #[tokio::test]
    async fn last_line_without_newline_counts_and_a_truncated_one_does_not() {
        let whole = format!("{}\n{}", event("a", "1"), event("b", "2"));
        assert_eq!(
            names(&mut reader(vec![Ok(whole.into_bytes())])).await,
            vec![Ok("a".to_string()), Ok("b".to_string())]
        );
        let cut = event("b", "2");
        let truncated = format!("{}\n{}", event("a", "1"), &cut[..cut.len() / 2]);
        assert_eq!(
            names(&mut reader(vec![Ok(truncated.into_bytes())])).await,
            vec![Ok("a".to_string())]
        );
    }

    #[tokio::test]
    async fn error_status_and_garbage_lines_are_errors_like_kube_clients() {
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}"#;
        // As in kube-client, a line that is no event is read as a Status if it can be.
        let text = format!("{status}\n[1, 2]\n{}\n", event("a", "1"));
        let got = names(&mut reader(vec![Ok(text.into_bytes())])).await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0].as_ref().is_err_and(|e| e.contains("too old")),
            "{got:?}"
        );
        assert!(
            got[1]
                .as_ref()
                .is_err_and(|e| e.contains("Error deserializing")),
            "{got:?}"
        );
        assert_eq!(got[2], Ok("a".to_string()));
        // A watch ERROR event is an event, not a read error.
        let error_event = format!(r#"{{"type":"ERROR","object":{status}}}"#);
        let mut events = reader(vec![Ok(format!("{error_event}\n").into_bytes())]);
        match events.next::<ConfigMap>().await {
            Some(Ok(WatchEvent::Error(s))) => assert_eq!(s.code, 410),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_response_cut_short_ends_quietly_and_other_read_errors_are_reported() {
        let nested_eof = std::io::Error::other(kube::Error::ReadEvents(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "tls close_notify missing",
        )));
        for cut in [
            nested_eof,
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof"),
            std::io::Error::other("unexpected EOF during chunk size line"),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"),
        ] {
            let what = cut.to_string();
            let chunks = vec![Ok(format!("{}\n", event("a", "1")).into_bytes()), Err(cut)];
            assert_eq!(
                names(&mut reader(chunks)).await,
                vec![Ok("a".to_string())],
                "{what}"
            );
        }
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "stream reset");
        let mut events = reader(vec![Ok(b"{\"type\":".to_vec()), Err(reset)]);
        let got = names(&mut events).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].as_ref().is_err_and(|e| e.contains("stream reset")),
            "{got:?}"
        );
        // Then the watch has ended: it is resumed, not read again.
        assert!(events.next::<ConfigMap>().await.is_none());
    }
}
