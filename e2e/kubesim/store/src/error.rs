//! API errors rendered as `metav1.Status`, with kube-apiserver's reasons and message shapes.

use serde_json::{Value, json};

/// An error the API returns as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `metav1.StatusReason` (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Gone` …).
    pub reason: String,
    /// Human-readable message in kube-apiserver's wording.
    pub message: String,
    /// `details` (`name`, `group`, `kind`, `causes`), when kube-apiserver sets them.
    pub details: Option<Value>,
}

impl ApiError {
    /// Build an error without details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// `404 NotFound`: `<resource>.<group> "<name>" not found`.
    pub fn not_found(resource_group: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{resource_group} \"{name}\" not found"),
        )
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}
