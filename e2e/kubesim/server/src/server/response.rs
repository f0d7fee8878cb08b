//! Response helpers: JSON bodies, `Status` errors, `Warning` headers.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use kubesim_store::ApiError;
use serde_json::Value;
use std::convert::Infallible;

/// The response body type of every handler (full bodies and watch streams).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A full body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response.
pub fn json(code: u16, value: &Value) -> Response<Body> {
    json_bytes(code, serde_json::to_vec(value).unwrap_or_default())
}

/// A JSON response from a document serialised already (exactly what [`json`] sends for
/// the value it was serialised from).
pub fn json_text(code: u16, text: &str) -> Response<Body> {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    json_bytes(code, bytes)
}

fn json_bytes(code: u16, mut bytes: Vec<u8>) -> Response<Body> {
    bytes.push(b'\n');
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A plain-text response (health endpoints).
pub fn text(code: u16, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// An error as a `Status` response.
pub fn error(err: &ApiError) -> Response<Body> {
    let mut resp = json(err.code, &err.to_status());
    if err.code == 429 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// `401 Unauthorized` exactly as kube-apiserver answers it.
pub fn unauthorized() -> Response<Body> {
    error(&ApiError::new(401, "Unauthorized", "Unauthorized"))
}

/// `404` for paths nothing serves.
pub fn not_found_path() -> Response<Body> {
    let mut e = ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    e.details = Some(serde_json::json!({}));
    error(&e)
}

/// `400 BadRequest`.
pub fn bad_request(msg: impl Into<String>) -> ApiError {
    ApiError::new(400, "BadRequest", msg)
}

/// Add one `Warning: 299 - "<text>"` header per warning (as kube-apiserver does).
pub fn add_warnings(resp: &mut Response<Body>, warnings: &[String]) {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
}
