//! Watch responses: a chunked stream of JSON lines (`{"type": ..., "object": ...}`), ended by
//! the store (timeout, closed watches), by fault injection (`dropWatches`) or by shutdown.

use super::response::Body;
use super::table::{IncludeObject, Representation, to_partial, to_table};
use crate::faults::FaultState;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use kubesim_store::{ApiError, ResourceInfo, WatchEvent, WatchStream};
use serde_json::{Value, json};
use std::convert::Infallible;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn line(event_type: &str, object: Value) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
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
