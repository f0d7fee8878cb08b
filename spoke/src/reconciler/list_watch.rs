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
//! heap, its largest fixed cost per spoke (heaptrack; docs/benchmarks.md). Here an event is decoded
//! straight from the response chunk it arrived in; only an event split across chunks is
//! copied, into a buffer freed as soon as the event is complete.
//!
//! [`list_watch_known`] also skips decoding the watch echoes of the caller's own writes.
//! Most watch events a spoke reconciler reads are those echoes (its finalizer, status and
//! ClusterSPIFFEID writes come back), and the write's response already gave the same
//! object at the same resourceVersion. So before an `ADDED` or `MODIFIED` event is
//! decoded, the head of its line is read ([`peek_head`]: the event type and the object's
//! name, namespace and resourceVersion, nothing after the object's `metadata`); when the
//! caller already holds that object at that version it is handed on as
//! [`Fed::Known`] instead of being decoded again. A resourceVersion names one state of one
//! object, so the two are the same.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::io::{AsyncBufRead, AsyncBufReadExt};
use futures::stream::{self, Stream, StreamExt};
use kube::api::{Api, ListParams, WatchParams};
use kube::core::{Request, Status, WatchEvent};
use kube::runtime::watcher::{Error, Event};
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::lean::from_json;
use super::limits::{MAX_WATCH_EVENT_BYTES, Oversized, TooLarge};

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
    list_watch_known::<K, Infallible>(api, None).map(|item| item.map(decoded))
}

/// [`list_watch`], handing on as [`Fed::Known`] the watched objects `known` already holds
/// at the event's resourceVersion (see the module documentation).
pub fn list_watch_known<K, C>(
    api: Api<K>,
    known: Option<Known<C>>,
) -> impl Stream<Item = Result<FedEvent<K, C>, Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    C: Send + Sync + 'static,
{
    stream::unfold(
        (api, known, State::Empty),
        |(api, known, state)| async move {
            let (event, state) = step(&api, known.as_ref(), state).await;
            Some((event, (api, known, state)))
        },
    )
}

/// Looks up the object an `ADDED` or `MODIFIED` event is about, by its head: `Some` when
/// the caller holds that object at exactly that resourceVersion.
pub type Known<C> = Arc<dyn Fn(&EventHead) -> Option<Arc<C>> + Send + Sync>;

/// A watched object: decoded from its event, or the caller's own copy of the same version.
pub enum Fed<K, C> {
    /// Decoded from the list or the watch event.
    Decoded(K),
    /// The event's object, as the caller's [`Known`] already held it.
    Known(Arc<C>),
}

impl<K: Debug, C> Debug for Fed<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decoded(obj) => f.debug_tuple("Decoded").field(obj).finish(),
            Self::Known(_) => f.write_str("Known"),
        }
    }
}

/// An event of [`list_watch_known`].
pub type FedEvent<K, C> = Event<Fed<K, C>>;

/// What one step of the loop reports (if anything), and the state it leaves.
type Step<K, C> = (Option<Result<FedEvent<K, C>, Error>>, State<K>);

/// The event of [`list_watch`], whose `known` is `None`: every object is decoded.
fn decoded<K>(event: FedEvent<K, Infallible>) -> Event<K> {
    map_event(event, |fed| match fed {
        Fed::Decoded(obj) => obj,
        Fed::Known(never) => match *never {},
    })
}

/// `event` with `f` applied to its object, if it has one.
pub fn map_event<A, B>(event: Event<A>, mut f: impl FnMut(A) -> B) -> Event<B> {
    match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(obj) => Event::InitApply(f(obj)),
        Event::Apply(obj) => Event::Apply(f(obj)),
        Event::Delete(obj) => Event::Delete(f(obj)),
    }
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
async fn step<K, C>(
    api: &Api<K>,
    known: Option<&Known<C>>,
    mut state: State<K>,
) -> (Result<FedEvent<K, C>, Error>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        match step_once(api, known, state).await {
            (Some(event), next) => return (event, next),
            (None, next) => state = next,
        }
    }
}

async fn step_once<K, C>(api: &Api<K>, known: Option<&Known<C>>, state: State<K>) -> Step<K, C>
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
                    Some(Ok(Event::InitApply(Fed::Decoded(next)))),
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
            let next = tokio::time::timeout(IDLE_TIMEOUT, events.next::<K, C>(known))
                .await
                .unwrap_or_else(|_elapsed| {
                    tracing::debug!("watch stream idle for {IDLE_TIMEOUT:?}; resuming");
                    None
                });
            match next {
                Some(Ok(WatchEvent::Added(fed) | WatchEvent::Modified(fed))) => {
                    changed(fed, Event::Apply, events)
                }
                Some(Ok(WatchEvent::Deleted(fed))) => changed(fed, Event::Delete, events),
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

/// A watch event about an object, with its resourceVersion: reported as `event`, and the
/// watch goes on from that resourceVersion (without one, it cannot resume: list again).
fn changed<K, C>(
    (obj, resource_version): (Fed<K, C>, Option<String>),
    event: fn(Fed<K, C>) -> FedEvent<K, C>,
    events: WatchEvents,
) -> Step<K, C> {
    match resource_version.filter(|rv| !rv.is_empty()) {
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
    /// The longest line read ([`MAX_WATCH_EVENT_BYTES`] but in tests).
    max_line: usize,
}

impl WatchEvents {
    fn new(body: impl AsyncBufRead + Send + 'static) -> Self {
        Self::with_max_line(body, MAX_WATCH_EVENT_BYTES)
    }

    fn with_max_line(body: impl AsyncBufRead + Send + 'static, max_line: usize) -> Self {
        Self {
            body: Box::pin(body),
            partial: Vec::new(),
            ended: false,
            max_line,
        }
    }

    /// Ends the watch on a line longer than [`WatchEvents::max_line`]: what was read of it
    /// is freed, and the error is reported (the watcher resumes the watch with backoff; a
    /// server that keeps streaming one endless line costs at most the limit each time).
    fn too_long<T>(&mut self) -> Option<kube::Result<T>> {
        self.ended = true;
        self.partial = Vec::new();
        let err = TooLarge {
            what: Oversized::WatchEvent,
            limit: self.max_line as u64,
        };
        Some(Err(kube::Error::ReadEvents(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            err,
        ))))
    }

    /// The next event; `None` once the response ended (the watch is then resumed).
    async fn next<K: DeserializeOwned + Resource, C>(
        &mut self,
        known: Option<&Known<C>>,
    ) -> Option<kube::Result<WatchEvent<Watched<K, C>>>> {
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
                // It may be cut short, so it is decoded whole.
                let rest = std::mem::take(&mut self.partial);
                return decode_line::<K, C>(&rest, None);
            }
            let read = chunk.len();
            match memchr::memchr(b'\n', chunk) {
                Some(end) => {
                    if self.partial.len() + end > self.max_line {
                        return self.too_long();
                    }
                    let event = if self.partial.is_empty() {
                        decode_line(&chunk[..end], known)
                    } else {
                        keep_partial(&mut self.partial, &chunk[..end], self.max_line);
                        // Taken, so the copy is freed with the line.
                        decode_line(&std::mem::take(&mut self.partial), known)
                    };
                    self.body.consume_unpin(end + 1);
                    if event.is_some() {
                        return event;
                    }
                }
                None => {
                    if self.partial.len() + read > self.max_line {
                        return self.too_long();
                    }
                    keep_partial(&mut self.partial, chunk, self.max_line);
                    self.body.consume_unpin(read);
                }
            }
        }
        None
    }
}

/// Appends the start of a split line to `partial`, its room never grown past `max_line`
/// (the caller checked that the line fits): doubling alone would keep up to twice the
/// limit for a line just under it.
fn keep_partial(partial: &mut Vec<u8>, bytes: &[u8], max_line: usize) {
    let needed = partial.len() + bytes.len();
    if needed > partial.capacity() {
        let room = needed
            .max(partial.capacity().saturating_mul(2))
            .min(max_line)
            .max(needed);
        partial.reserve_exact(room - partial.len());
    }
    partial.extend_from_slice(bytes);
}

/// A watch event's object and its resourceVersion.
type Watched<K, C> = (Fed<K, C>, Option<String>);

/// One line of a watch response as kube-client reads it: an event, an error `Status`, or
/// nothing (a blank line, or a line cut short when the response ended). An `ADDED` or
/// `MODIFIED` event whose object `known` holds is not decoded.
fn decode_line<K: DeserializeOwned + Resource, C>(
    line: &[u8],
    known: Option<&Known<C>>,
) -> Option<kube::Result<WatchEvent<Watched<K, C>>>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    if let Some(known) = known
        && let Some(head) = peek_head(line)
        && let Some(obj) = known(&head)
    {
        return Some(Ok(WatchEvent::Modified((
            Fed::Known(obj),
            Some(head.resource_version),
        ))));
    }
    match from_json::<WatchEvent<K>>(line) {
        Ok(event) => Some(Ok(with_version(event))),
        Err(err) if err.is_eof() => None,
        Err(err) => match serde_json::from_slice::<Status>(line) {
            Ok(status) => Some(Err(kube::Error::Api(Box::new(status)))),
            Err(_) => Some(Err(kube::Error::SerdeError(err))),
        },
    }
}

/// `event`, its object paired with its resourceVersion.
fn with_version<K: Resource, C>(event: WatchEvent<K>) -> WatchEvent<Watched<K, C>> {
    let pair = |obj: K| {
        let rv = obj.resource_version();
        (Fed::Decoded(obj), rv)
    };
    match event {
        WatchEvent::Added(obj) => WatchEvent::Added(pair(obj)),
        WatchEvent::Modified(obj) => WatchEvent::Modified(pair(obj)),
        WatchEvent::Deleted(obj) => WatchEvent::Deleted(pair(obj)),
        WatchEvent::Bookmark(bookmark) => WatchEvent::Bookmark(bookmark),
        WatchEvent::Error(status) => WatchEvent::Error(status),
    }
}

/// What an `ADDED` or `MODIFIED` event line says of its object before it is decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventHead {
    /// `metadata.namespace`; empty for a cluster-scoped object.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// The head of an `ADDED` or `MODIFIED` event line: `None` for other events, and for a
/// line that does not read as one (it is then decoded whole, and its error reported).
///
/// Reads the event's `type`, then the object up to the end of its `metadata` (kube-apiserver
/// writes `type` before `object` and `metadata` before `spec` and `status`), skipping the
/// values it does not need without building them. It stops there on purpose, with an
/// error that carries nothing: the rest of the object is most of the line.
pub(crate) fn peek_head(line: &[u8]) -> Option<EventHead> {
    read_head(line, false)
}

/// The head of one object (a write's response): its namespace, name and resourceVersion,
/// read as [`peek_head`] reads an event's object. `None` when the bytes do not read as one.
pub(crate) fn peek_object_head(object: &[u8]) -> Option<EventHead> {
    read_head(object, true)
}

/// [`peek_head`] of an event (`in_object` false) or of an object.
fn read_head(json: &[u8], in_object: bool) -> Option<EventHead> {
    let mut head = None;
    let mut de = serde_json::Deserializer::from_slice(json);
    // Always an error (`HEAD_READ` once the head is read): see `peek_head`.
    let _stopped = HeadSeed {
        head: &mut head,
        in_object,
    }
    .deserialize(&mut de);
    head
}

/// The message of the error that ends [`peek_head`]'s read. Never shown: the error is
/// dropped.
const HEAD_READ: &str = "event head read";

/// A key of the event or of its object, as [`peek_head`] tells them apart.
enum HeadKey {
    Type,
    Object,
    Metadata,
    Other,
}

impl<'de> Deserialize<'de> for HeadKey {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let key = |key: &str| match key {
            "type" => HeadKey::Type,
            "object" => HeadKey::Object,
            "metadata" => HeadKey::Metadata,
            _ => HeadKey::Other,
        };
        deserializer.deserialize_identifier(ReadStr(key, "a key"))
    }
}

/// Whether an event's `type` is `ADDED` or `MODIFIED`.
struct IsApply(bool);

impl<'de> Deserialize<'de> for IsApply {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let is_apply = |ty: &str| IsApply(matches!(ty, "ADDED" | "MODIFIED"));
        deserializer.deserialize_str(ReadStr(is_apply, "an event type"))
    }
}

/// Reads a string (borrowed from the line when it has no escapes) into what `.0` makes of
/// it, without keeping it; `.1` says what was expected.
struct ReadStr<T>(fn(&str) -> T, &'static str);

impl<T> Visitor<'_> for ReadStr<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        Ok((self.0)(s))
    }
}

/// The metadata fields of [`EventHead`]; the others are skipped.
#[derive(Deserialize)]
struct MetadataHead {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// Reads the event's map (its `type`, then the head of its `object`) or, one level down,
/// the object's map up to the end of its `metadata`.
struct HeadSeed<'h> {
    head: &'h mut Option<EventHead>,
    /// True for the object's map, false for the event's.
    in_object: bool,
}

impl<'de> DeserializeSeed<'de> for HeadSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeadSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.in_object {
            "an object"
        } else {
            "a watch event"
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut apply = false;
        while let Some(key) = map.next_key::<HeadKey>()? {
            match key {
                HeadKey::Metadata if self.in_object => {
                    let meta = map.next_value::<MetadataHead>()?;
                    *self.head = Some(EventHead {
                        namespace: meta.namespace.unwrap_or_default(),
                        name: meta.name,
                        resource_version: meta.resource_version,
                    });
                    break;
                }
                HeadKey::Type if !self.in_object => apply = map.next_value::<IsApply>()?.0,
                // Only an apply's object is looked for, and its type must come first.
                HeadKey::Object if !self.in_object && apply => {
                    return map.next_value_seed(HeadSeed {
                        head: self.head,
                        in_object: true,
                    });
                }
                HeadKey::Object if !self.in_object => break,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Err(de::Error::custom(HEAD_READ))
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
        while let Some(next) = events.next::<ConfigMap, Infallible>(None).await {
            out.push(match next {
                Ok(WatchEvent::Added((Fed::Decoded(cm), _))) => Ok(cm.name_any()),
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
        match events.next::<ConfigMap, Infallible>(None).await {
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
        assert!(events.next::<ConfigMap, Infallible>(None).await.is_none());
    }

    /// A line longer than the limit ends the watch with an error naming the limit, having
    /// kept no more than the limit of it, whether it arrives whole, in pieces, or never
    /// ends; a line of exactly the limit is still an event.
    #[tokio::test]
    async fn a_watch_line_longer_than_the_limit_ends_the_watch_and_keeps_at_most_the_limit() {
        let first = event("a", "1");
        let limit = first.len();
        let at_limit = format!("{first}\n");
        let mut events = WatchEvents::with_max_line(
            stream::iter(vec![Ok::<_, std::io::Error>(at_limit.into_bytes())]).into_async_read(),
            limit,
        );
        assert_eq!(names(&mut events).await, vec![Ok("a".to_string())]);

        // An endless line, in 64 KiB chunks: far more than the limit is offered.
        let endless = || {
            let mut head = br#"{"type":"ADDED","object":{"metadata":{"name":""#.to_vec();
            head.resize(64 * 1024, b'x');
            let rest = std::iter::repeat_with(|| Ok::<_, std::io::Error>(vec![b'x'; 64 * 1024]))
                .take(1000);
            stream::iter(std::iter::once(Ok(head)).chain(rest))
        };
        let whole_line = format!("{}\n", "x".repeat(limit + 1));
        let cases: Vec<(&str, WatchEvents)> = vec![
            (
                "endless",
                WatchEvents::with_max_line(endless().into_async_read(), 200_000),
            ),
            (
                "one chunk",
                WatchEvents::with_max_line(
                    stream::iter(vec![Ok::<_, std::io::Error>(
                        whole_line.clone().into_bytes(),
                    )])
                    .into_async_read(),
                    limit,
                ),
            ),
            (
                "split",
                WatchEvents::with_max_line(
                    stream::iter(
                        whole_line
                            .as_bytes()
                            .chunks(7)
                            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
                            .collect::<Vec<_>>(),
                    )
                    .into_async_read(),
                    limit,
                ),
            ),
        ];
        for (case, mut events) in cases {
            let mut got = Vec::new();
            while let Some(next) = events.next::<ConfigMap, Infallible>(None).await {
                got.push(next);
            }
            assert_eq!(got.len(), 1, "{case}: {got:?}");
            let Err(err) = &got[0] else {
                panic!("{case}: {got:?}")
            };
            let too_large = crate::reconciler::limits::too_large_in(err)
                .unwrap_or_else(|| panic!("{case}: {err}"));
            assert_eq!(too_large.what, Oversized::WatchEvent, "{case}");
            assert_eq!(too_large.limit, events.max_line as u64, "{case}");
            assert_eq!(events.partial.capacity(), 0, "{case}: freed");
            assert_eq!(
                crate::reconciler::error::categorize_kube(err),
                kleym_api::ErrorCategory::ServerError
            );
        }
    }

    #[test]
    fn the_start_of_a_split_line_is_never_given_more_room_than_the_limit() {
        let limit = 1_000_000;
        let mut partial = Vec::new();
        let mut kept = 0;
        for piece in std::iter::repeat_n(16 * 1024 + 3, 61) {
            keep_partial(&mut partial, &vec![b'x'; piece], limit);
            kept += piece;
            assert_eq!(partial.len(), kept);
            assert!(
                partial.capacity() <= limit,
                "{} for {kept}",
                partial.capacity()
            );
        }
    }

    fn binding_event(ty: &str, namespace: Option<&str>, name: &str, rv: &str) -> String {
        // kube-apiserver's order: type, then the object's kind, apiVersion, metadata (name
        // first, managedFields after the resourceVersion), spec, status.
        let mut meta = serde_json::Map::new();
        meta.insert("name".into(), name.into());
        if let Some(ns) = namespace {
            meta.insert("namespace".into(), ns.into());
        }
        meta.insert("uid".into(), "u-1".into());
        meta.insert("resourceVersion".into(), rv.into());
        meta.insert(
            "managedFields".into(),
            serde_json::json!([{"manager": "m", "fieldsV1": {"f:spec": {}}}]),
        );
        format!(
            r#"{{"type":"{ty}","object":{{"kind":"ConfigMap","apiVersion":"v1","metadata":{},"data":{{"k":"v"}}}}}}"#,
            serde_json::Value::Object(meta)
        )
    }

    fn head(namespace: &str, name: &str, rv: &str) -> Option<EventHead> {
        Some(EventHead {
            namespace: namespace.into(),
            name: name.into(),
            resource_version: rv.into(),
        })
    }

    #[test]
    fn the_head_of_an_apply_event_is_read_in_either_key_order() {
        let line = binding_event("MODIFIED", Some("ns"), "b", "42");
        assert_eq!(peek_head(line.as_bytes()), head("ns", "b", "42"));
        let line = binding_event("ADDED", None, "csid", "7");
        assert_eq!(peek_head(line.as_bytes()), head("", "csid", "7"));
        // kubesim writes keys sorted: managedFields before name; an escaped name.
        let sorted = r#"{"object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"managedFields":[{"f":{"g":[1,{"h":null}]}}],"name":"a\"b","namespace":"ns","resourceVersion":"9"},"spec":{}},"type":"ADDED"}"#;
        // `object` before `type`: not read (decoded whole instead).
        assert_eq!(peek_head(sorted.as_bytes()), None);
        let type_first = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"managedFields":[{"f":{"g":[1,{"h":null}]}}],"name":"a\"b","namespace":"ns","resourceVersion":"9"},"spec":{}}}"#;
        assert_eq!(peek_head(type_first.as_bytes()), head("ns", "a\"b", "9"));
    }

    #[test]
    fn no_head_for_other_events_or_lines_that_are_not_events() {
        for line in [
            binding_event("DELETED", Some("ns"), "b", "1"),
            binding_event("BOOKMARK", None, "", "5"),
            r#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#.to_string(),
            r#"{"kind":"Status","apiVersion":"v1","code":500}"#.to_string(),
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"b"}}}"#.to_string(),
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVersion":7}}}"#
                .to_string(),
            "[1, 2]".to_string(),
            String::new(),
        ] {
            assert_eq!(peek_head(line.as_bytes()), None, "{line}");
        }
    }

    #[tokio::test]
    async fn an_object_the_caller_holds_at_that_version_is_not_decoded() {
        let mut mine = ConfigMap::default();
        mine.metadata.name = Some("b".into());
        mine.metadata.namespace = Some("ns".into());
        mine.metadata.resource_version = Some("42".into());
        let mine = Arc::new(mine);
        let held = Arc::clone(&mine);
        let known: Known<ConfigMap> = Arc::new(move |h: &EventHead| {
            (h.namespace == "ns" && h.name == "b" && h.resource_version == "42")
                .then(|| Arc::clone(&held))
        });
        let text = [
            binding_event("MODIFIED", Some("ns"), "b", "41"),
            binding_event("MODIFIED", Some("ns"), "b", "42"),
            binding_event("DELETED", Some("ns"), "b", "42"),
            binding_event("ADDED", Some("other"), "b", "42"),
        ]
        .join("\n")
            + "\n";
        let mut events = reader(vec![Ok(text.into_bytes())]);
        let mut got = Vec::new();
        while let Some(next) = events.next::<ConfigMap, ConfigMap>(Some(&known)).await {
            got.push(match next {
                Ok(WatchEvent::Modified((Fed::Known(obj), rv))) => {
                    assert!(Arc::ptr_eq(&obj, &mine), "the caller's own copy");
                    format!("known {}", rv.unwrap_or_default())
                }
                Ok(
                    WatchEvent::Added((Fed::Decoded(o), rv))
                    | WatchEvent::Modified((Fed::Decoded(o), rv)),
                ) => {
                    format!(
                        "decoded {} {}",
                        o.namespace().unwrap_or_default(),
                        rv.unwrap_or_default()
                    )
                }
                Ok(WatchEvent::Deleted((Fed::Decoded(o), rv))) => {
                    format!("deleted {} {}", o.name_any(), rv.unwrap_or_default())
                }
                other => panic!("{other:?}"),
            });
        }
        assert_eq!(
            got,
            [
                "decoded ns 41",
                "known 42",
                "deleted b 42",
                "decoded other 42"
            ]
        );
        // A last line cut short when the response ends is never taken from its head.
        let cut = binding_event("MODIFIED", Some("ns"), "b", "42");
        let cut = &cut[..cut.len() - 10];
        let mut events = reader(vec![Ok(cut.as_bytes().to_vec())]);
        assert!(
            events
                .next::<ConfigMap, ConfigMap>(Some(&known))
                .await
                .is_none()
        );
    }
}
