//! Where `kleym report` reads the report from: the hub cluster's `FleetIdentityReport`, the
//! hub's HTTP API (`GET /v1/report`, the full form), or a file.

use kleym_api::hub_status::{FleetIdentityReport, FleetIdentityReportStatus};
use kube::api::Api;

/// A report as read: the document to print for `-o json|yaml`, and its parsed form.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportDocument {
    /// The document as received (the object's `status`, or the API's full report).
    pub raw: serde_json::Value,
    /// Parsed counts and findings.
    pub report: FleetIdentityReportStatus,
    /// Per-spoke status, present in the full report of the hub API only.
    pub spokes: Vec<super::full::SpokeReport>,
}

/// Errors reading a report.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The hub cluster has no such `FleetIdentityReport`.
    #[error(
        "FleetIdentityReport {0:?} not found in the hub cluster (is the kleym hub running and leading, with its CRDs installed?)"
    )]
    NotFound(String),
    /// A request failed.
    #[error("{what}: {source}")]
    Request {
        /// What was requested.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The hub API refused or could not be reached (`--server`).
    #[error(transparent)]
    Api(#[from] crate::api_client::HubApiError),
    /// The document is not a report.
    #[error("not a kleym fleet report: {0}")]
    Parse(String),
}

impl ReportDocument {
    /// Parse a report document: a `FleetIdentityReport` object, its `status`, or the full
    /// report of `/v1/report`; JSON or YAML.
    pub fn parse(bytes: &[u8]) -> Result<Self, SourceError> {
        let value: serde_json::Value = match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(_) => {
                kleym_api::yaml::from_slice(bytes).map_err(|e| SourceError::Parse(e.to_string()))?
            }
        };
        let raw = if value.get("kind").and_then(|k| k.as_str()) == Some("FleetIdentityReport") {
            value
                .get("status")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}))
        } else {
            value
        };
        if !raw.is_object() {
            return Err(SourceError::Parse("expected a JSON/YAML object".into()));
        }
        let report =
            serde_json::from_value(raw.clone()).map_err(|e| SourceError::Parse(e.to_string()))?;
        let spokes = match raw.get("spokes") {
            Some(v) => {
                serde_json::from_value(v.clone()).map_err(|e| SourceError::Parse(e.to_string()))?
            }
            None => Vec::new(),
        };
        Ok(ReportDocument {
            raw,
            report,
            spokes,
        })
    }
}

/// Read the `FleetIdentityReport` `name` from the hub cluster.
pub async fn from_cluster(client: kube::Client, name: &str) -> Result<ReportDocument, SourceError> {
    let api: Api<FleetIdentityReport> = Api::all(client);
    let obj = api
        .get_opt(name)
        .await
        .map_err(|source| SourceError::Request {
            what: format!("reading FleetIdentityReport {name}"),
            source,
        })?
        .ok_or_else(|| SourceError::NotFound(name.to_string()))?;
    // Status read back (audit): rendered for the `kleym report` reader, never acted on.
    let report = obj.status.unwrap_or_default();
    let raw = serde_json::to_value(&report).map_err(|e| SourceError::Parse(e.to_string()))?;
    Ok(ReportDocument {
        raw,
        report,
        spokes: Vec::new(),
    })
}

/// Read the full report from the hub API: `GET <server>/v1/report` with `token` as bearer
/// token and `ca_pem` (PEM) as the only trusted CA when given. Any answer is final (a `503`
/// says why at once); only a request that got no answer is retried, a few times
/// ([`crate::api_client`]).
pub async fn from_api(
    server: &str,
    token: Option<&str>,
    ca_pem: Option<&[u8]>,
) -> Result<ReportDocument, SourceError> {
    let body = crate::api_client::get(server, "/v1/report", token, ca_pem).await?;
    ReportDocument::parse(body.as_bytes())
}
