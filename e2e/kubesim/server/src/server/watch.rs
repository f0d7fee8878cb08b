//! Watch responses: a chunked stream of JSON lines (`{"type": ..., "object": ...}`), ended by
//! the store (timeout, closed watches), by fault injection (`dropWatches`) or by shutdown.

use super::response::Body;
use super::table::{IncludeObject, Representation, to_partial, to_table};
use crate::faults::{EndlessCounters, FaultState};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use kubesim_store::{ApiError, ResourceInfo, WatchEvent, WatchStream};
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One watch event on the wire, `type` first as kube-apiserver writes it (`json!` sorts
/// the keys, putting `object` first): a client that reads the tag before the object
/// (serde's adjacently tagged enums, kube-rs's `WatchEvent`) decodes the object in one pass
/// instead of buffering it, so a benchmark's client pays what it pays against a real
/// apiserver.
#[derive(serde::Serialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    object: &'a Value,
}

fn line(event_type: &str, object: Value) -> Bytes {
    let mut v = serde_json::to_vec(&Line {
        type_: event_type,
        object: &object,
    })
    .unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// A watch response streaming `events`, in the client's representation.
pub fn stream_response(
    events: WatchStream,
    res: ResourceInfo,
    repr: Representation,
    include: IncludeObject,
    mut faults: watch::Receiver<FaultState>,
    shutdown: CancellationToken,
) -> Response<Body> {
    let start_epoch = faults.borrow().watch_drop_epoch;
    let dropped = async move {
        let _ = faults.wait_for(|s| s.watch_drop_epoch != start_epoch).await;
    };
    let stop = async move {
        tokio::select! {
            () = dropped => {}
            () = shutdown.cancelled_owned() => {}
        }
    };
    let mut first = true;
    let body = events
        .take_until(Box::pin(stop))
        .map(move |ev: WatchEvent| {
            let object = match (repr, ev.event_type) {
                (_, "ERROR" | "BOOKMARK") | (Representation::Object, _) => ev.object,
                (Representation::Table, _) => {
                    let t = to_table(&res, &ev.object, include, first);
                    first = false;
                    t
                }
                (Representation::PartialMetadata, _) => to_partial(&ev.object),
            };
            Ok::<_, Infallible>(Frame::data(line(ev.event_type, object)))
        });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

/// The body of an `endlessBodies` fault: `bytes` bytes that open a watch event and one
/// JSON string, never closed, without a newline; sent in 64 KiB pieces as the client reads
/// them (a client that stops reading stops the sending), counted in `counters`.
pub fn endless_response(bytes: u64, counters: Arc<EndlessCounters>) -> Response<Body> {
    const PIECE: usize = 64 * 1024;
    /// Counts the body's end however it ends (sent in full, or dropped with the stream).
    struct Ends(Arc<EndlessCounters>);
    impl Drop for Ends {
        fn drop(&mut self) {
            self.0.end();
        }
    }
    counters.start();
    let head = br#"{"type":"ADDED","object":{"kind":"Hostile","metadata":{"name":""#;
    let mut first = head.to_vec();
    first.resize(PIECE, b'x');
    let first = Bytes::from(first);
    let filler = Bytes::from(vec![b'x'; PIECE]);
    let ends = Ends(counters);
    let pieces = futures::stream::unfold((0u64, ends), move |(sent, ends)| {
        let piece = if sent == 0 {
            first.clone()
        } else {
            filler.clone()
        };
        async move {
            let left = bytes.saturating_sub(sent);
            if left == 0 {
                return None;
            }
            let n = usize::try_from(left).unwrap_or(PIECE).min(PIECE);
            ends.0.sent(n as u64);
            Some((
                Ok::<_, Infallible>(Frame::data(piece.slice(..n))),
                (sent + n as u64, ends),
            ))
        }
    });
    let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(pieces)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The response kube-apiserver streams for a watch from an expired resourceVersion: one
/// `ERROR` event with a `410 Expired` Status, then the end of the stream.
pub fn gone_response(resource_version: Option<&str>, current: u64) -> Response<Body> {
    let rv = resource_version.unwrap_or("0");
    let err = ApiError::new(
        410,
        "Expired",
        format!("too old resource version: {rv} ({current})"),
    );
    let bytes = line("ERROR", err.to_status());
    let mut resp = Response::new(super::response::full(bytes));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn event_lines_carry_the_type_before_the_object() {
        let l = line("ADDED", json!({"kind": "ConfigMap"}));
        assert_eq!(
            std::str::from_utf8(&l).unwrap(),
            "{\"type\":\"ADDED\",\"object\":{\"kind\":\"ConfigMap\"}}\n"
        );
    }
}
