//! A SPIFFE Workload API client (`--workload-api-socket` of `kleym credential spiffe-jwt` and
//! `spiffe-x509`): the hub's SVIDs come from a SPIRE agent instead of keys the hub holds.
//!
//! The Workload API is gRPC over a unix socket (SPIFFE Workload Endpoint): every call carries
//! the metadata `workload.spiffe.io: true`, which agents require as a guard against
//! server-side request forgery. `FetchJWTSVID` is unary; `FetchX509SVID` is a server stream
//! whose first message is the current identity. The message types below are written from the
//! specification's `workload.proto` (only the fields kleym reads), so no protoc is needed;
//! `encodes_the_specification_wire_format` pins their field numbers.
//!
//! Nothing fetched here is ever logged: the SVID structs print redacted.

use std::path::PathBuf;
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;
use tonic_prost::ProstCodec;

use super::PluginError;

/// The Workload API's message types, from the SPIFFE specification's `workload.proto`.
pub mod proto {
    use std::collections::HashMap;

    /// `X509SVIDRequest` (empty).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct X509SvidRequest {}

    /// `X509SVIDResponse`: the workload's X.509-SVIDs, the default one first.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct X509SvidResponse {
        /// The SVIDs.
        #[prost(message, repeated, tag = "1")]
        pub svids: Vec<X509Svid>,
        /// CRLs (DER).
        #[prost(bytes = "vec", repeated, tag = "2")]
        pub crl: Vec<Vec<u8>>,
        /// Bundles of federated trust domains (DER certificates, concatenated).
        #[prost(map = "string, bytes", tag = "3")]
        pub federated_bundles: HashMap<String, Vec<u8>>,
    }

    /// `X509SVID`: one identity with its key. Its `Debug` is redacted.
    #[derive(Clone, PartialEq, prost::Message)]
    #[prost(skip_debug)]
    pub struct X509Svid {
        /// The SPIFFE ID.
        #[prost(string, tag = "1")]
        pub spiffe_id: String,
        /// The certificate chain, leaf first: DER certificates, concatenated.
        #[prost(bytes = "vec", tag = "2")]
        pub x509_svid: Vec<u8>,
        /// The private key, PKCS#8 DER.
        #[prost(bytes = "vec", tag = "3")]
        pub x509_svid_key: Vec<u8>,
        /// The trust domain's bundle (DER certificates, concatenated).
        #[prost(bytes = "vec", tag = "4")]
        pub bundle: Vec<u8>,
        /// An operator-set hint telling SVIDs of one workload apart.
        #[prost(string, tag = "5")]
        pub hint: String,
    }

    impl std::fmt::Debug for X509Svid {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("X509Svid")
                .field("spiffe_id", &self.spiffe_id)
                .field("hint", &self.hint)
                .finish_non_exhaustive()
        }
    }

    /// `JWTSVIDRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct JwtSvidRequest {
        /// The audiences the token is for.
        #[prost(string, repeated, tag = "1")]
        pub audience: Vec<String>,
        /// The SPIFFE ID wanted, or empty for every identity of the workload.
        #[prost(string, tag = "2")]
        pub spiffe_id: String,
    }

    /// `JWTSVIDResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct JwtSvidResponse {
        /// The JWT-SVIDs, the default one first.
        #[prost(message, repeated, tag = "1")]
        pub svids: Vec<JwtSvid>,
    }

    /// `JWTSVID`. Its `Debug` is redacted.
    #[derive(Clone, PartialEq, prost::Message)]
    #[prost(skip_debug)]
    pub struct JwtSvid {
        /// The SPIFFE ID (the token's `sub`).
        #[prost(string, tag = "1")]
        pub spiffe_id: String,
        /// The token.
        #[prost(string, tag = "2")]
        pub svid: String,
        /// An operator-set hint.
        #[prost(string, tag = "3")]
        pub hint: String,
    }

    impl std::fmt::Debug for JwtSvid {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("JwtSvid")
                .field("spiffe_id", &self.spiffe_id)
                .field("hint", &self.hint)
                .finish_non_exhaustive()
        }
    }
}

/// The gRPC path of `FetchJWTSVID` (the service has no package).
pub const FETCH_JWT_SVID: &str = "/SpiffeWorkloadAPI/FetchJWTSVID";
/// The gRPC path of `FetchX509SVID`.
pub const FETCH_X509_SVID: &str = "/SpiffeWorkloadAPI/FetchX509SVID";
/// The metadata key every Workload API call carries (value `true`).
pub const SECURITY_HEADER: &str = "workload.spiffe.io";
/// Default for `--workload-api-timeout-seconds`: under the hub's default exec timeout (30 s), so
/// the plugin reports why instead of being killed.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// Where the agent listens: the path of a unix socket, from a `unix:` URI as the SPIFFE
/// Workload Endpoint specification writes it (`unix:///run/spire/agent.sock` or
/// `unix:/run/spire/agent.sock`; also the form of `SPIFFE_ENDPOINT_SOCKET`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadApiSocket {
    /// The URI as given (for messages).
    pub uri: String,
    /// The socket's path.
    pub path: PathBuf,
}

impl std::fmt::Display for WorkloadApiSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.uri)
    }
}

/// Parses `--workload-api-socket`: an absolute `unix:` URI without host, query or fragment.
/// `tcp://` endpoints, which the specification also allows, are refused: SPIRE agents serve
/// the Workload API on a unix socket, and a TCP endpoint carries no peer attestation.
pub fn parse_socket(uri: &str) -> Result<WorkloadApiSocket, String> {
    let refuse = |why: &str| {
        Err(format!(
            "--workload-api-socket {uri:?}: {why} (expected unix:///path/to/agent.sock)"
        ))
    };
    if uri.starts_with("tcp:") {
        return refuse("tcp endpoints are not supported, use the agent's unix socket");
    }
    let Some(rest) = uri.strip_prefix("unix:") else {
        return refuse("not a unix: URI");
    };
    if rest.contains(['?', '#']) {
        return refuse("a query or fragment is not allowed");
    }
    let path = match rest.strip_prefix("//") {
        // `unix://host/path` names a host, which a unix socket cannot have.
        Some(after) if after.starts_with('/') => after,
        Some(_) => return refuse("a unix: URI has no host part"),
        None => rest,
    };
    if !path.starts_with('/') || path.len() < 2 {
        return refuse("the path must be absolute");
    }
    Ok(WorkloadApiSocket {
        uri: uri.to_string(),
        path: PathBuf::from(path),
    })
}

/// Where `--workload-api-socket` takes an SVID from, and what it must be (both plugins).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadApiOptions {
    /// The agent's socket.
    pub socket: WorkloadApiSocket,
    /// `--hub-spiffe-id`: the SVID to use [default: the agent's default SVID].
    pub hub_spiffe_id: Option<String>,
    /// `--trust-domain`: the SVID's SPIFFE ID must be inside it.
    pub trust_domain: Option<String>,
    /// How long the agent may take (`--workload-api-timeout-seconds`).
    pub timeout: Duration,
}

/// Connects to the agent. The channel is lazy: the connection is made by the first call.
fn channel(socket: &WorkloadApiSocket) -> Result<tonic::transport::Channel, PluginError> {
    let path = socket.path.clone();
    // The URI is required by tonic but unused: the connector below always dials the socket.
    let endpoint = Endpoint::try_from("http://workload-api.invalid")
        .map_err(|e| PluginError::WorkloadApi(format!("{socket}: {e}")))?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        })),
    )
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert(SECURITY_HEADER, MetadataValue::from_static("true"));
    req
}

/// Describes a failed call without echoing anything the agent sent beyond its status.
fn status_error(socket: &WorkloadApiSocket, call: &str, status: &tonic::Status) -> PluginError {
    let hint = match status.code() {
        tonic::Code::PermissionDenied => {
            ": the agent has no registration entry for this process (check the entry's selectors)"
        }
        tonic::Code::Unavailable => ": is the SPIRE agent running and the socket mounted?",
        _ => "",
    };
    PluginError::WorkloadApi(format!(
        "{call} at {socket}: {:?}: {}{hint}",
        status.code(),
        status.message()
    ))
}

async fn bounded<T>(
    socket: &WorkloadApiSocket,
    call: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, PluginError>>,
) -> Result<T, PluginError> {
    tokio::time::timeout(timeout, fut).await.map_err(|_| {
        PluginError::WorkloadApi(format!(
            "{call} at {socket}: no answer within {} s (--workload-api-timeout-seconds)",
            timeout.as_secs()
        ))
    })?
}

/// `FetchJWTSVID` for `audience`, asking for `spiffe_id` when given. Returns the SVIDs as the
/// agent sent them (the default one first); an empty answer is an error.
pub async fn fetch_jwt_svids(
    socket: &WorkloadApiSocket,
    audience: &str,
    spiffe_id: Option<&str>,
    timeout: Duration,
) -> Result<Vec<proto::JwtSvid>, PluginError> {
    let call = "FetchJWTSVID";
    bounded(socket, call, timeout, async {
        let mut grpc = tonic::client::Grpc::new(channel(socket)?);
        grpc.ready()
            .await
            .map_err(|e| PluginError::WorkloadApi(format!("{call} at {socket}: {e}")))?;
        let message = proto::JwtSvidRequest {
            audience: vec![audience.to_string()],
            spiffe_id: spiffe_id.unwrap_or_default().to_string(),
        };
        let answer: tonic::Response<proto::JwtSvidResponse> = grpc
            .unary(
                request(message),
                PathAndQuery::from_static(FETCH_JWT_SVID),
                ProstCodec::default(),
            )
            .await
            .map_err(|s| status_error(socket, call, &s))?;
        let svids = answer.into_inner().svids;
        if svids.is_empty() {
            return Err(PluginError::WorkloadApi(format!(
                "{call} at {socket}: the agent returned no JWT-SVID"
            )));
        }
        Ok(svids)
    })
    .await
}

/// The first message of `FetchX509SVID`: the workload's current X.509-SVIDs (the default one
/// first); an empty answer is an error.
pub async fn fetch_x509_svids(
    socket: &WorkloadApiSocket,
    timeout: Duration,
) -> Result<Vec<proto::X509Svid>, PluginError> {
    let call = "FetchX509SVID";
    bounded(socket, call, timeout, async {
        let mut grpc = tonic::client::Grpc::new(channel(socket)?);
        grpc.ready()
            .await
            .map_err(|e| PluginError::WorkloadApi(format!("{call} at {socket}: {e}")))?;
        let answer: tonic::Response<tonic::Streaming<proto::X509SvidResponse>> = grpc
            .server_streaming(
                request(proto::X509SvidRequest {}),
                PathAndQuery::from_static(FETCH_X509_SVID),
                ProstCodec::default(),
            )
            .await
            .map_err(|s| status_error(socket, call, &s))?;
        let first = answer
            .into_inner()
            .message()
            .await
            .map_err(|s| status_error(socket, call, &s))?
            .ok_or_else(|| {
                PluginError::WorkloadApi(format!(
                    "{call} at {socket}: the stream ended before the first X.509-SVID"
                ))
            })?;
        if first.svids.is_empty() {
            return Err(PluginError::WorkloadApi(format!(
                "{call} at {socket}: the agent returned no X.509-SVID"
            )));
        }
        Ok(first.svids)
    })
    .await
}

/// The SVID to use: the one whose SPIFFE ID is `wanted` when given, else the first (the
/// specification's default SVID). Its SPIFFE ID must be valid and, when a trust domain is
/// given, inside it.
pub fn choose<'a, T>(
    svids: &'a [T],
    id_of: impl Fn(&T) -> &str,
    wanted: Option<&str>,
    trust_domain: Option<&str>,
) -> Result<&'a T, PluginError> {
    let chosen = match wanted {
        Some(w) => svids.iter().find(|s| id_of(s) == w).ok_or_else(|| {
            let offered: Vec<&str> = svids.iter().map(&id_of).collect();
            PluginError::WorkloadApi(format!(
                "the agent offers no SVID for --hub-spiffe-id {w:?} (it offers {offered:?})"
            ))
        })?,
        None => svids
            .first()
            .ok_or_else(|| PluginError::WorkloadApi("the agent returned no SVID".into()))?,
    };
    // The same rules as a configured --hub-spiffe-id: a valid ID, inside the trust domain.
    super::spiffe_id::resolve_hub_spiffe_id(Some(id_of(chosen)), trust_domain).map_err(|e| {
        PluginError::WorkloadApi(format!("SVID from the Workload API refused: {e}"))
    })?;
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn parses_unix_uris_and_refuses_the_rest() {
        for (uri, path) in [
            ("unix:///run/spire/agent.sock", "/run/spire/agent.sock"),
            ("unix:/run/spire/agent.sock", "/run/spire/agent.sock"),
        ] {
            assert_eq!(parse_socket(uri).unwrap().path, PathBuf::from(path));
        }
        for bad in [
            "tcp://127.0.0.1:8081",
            "/run/spire/agent.sock",
            "unix://host/run/agent.sock",
            "unix:relative.sock",
            "unix:///run/agent.sock?x=1",
            "unix:/",
            "http://x",
        ] {
            let err = parse_socket(bad).unwrap_err();
            assert!(err.contains("--workload-api-socket"), "{bad}: {err}");
        }
    }

    /// Field numbers and wire types as `workload.proto` has them, byte for byte.
    #[test]
    fn encodes_the_specification_wire_format() {
        let req = proto::JwtSvidRequest {
            audience: vec!["a".into()],
            spiffe_id: "s".into(),
        };
        // field 1, length-delimited ("a"); field 2, length-delimited ("s")
        assert_eq!(req.encode_to_vec(), [0x0a, 1, b'a', 0x12, 1, b's']);
        let svid = proto::JwtSvid {
            spiffe_id: "i".into(),
            svid: "t".into(),
            hint: "h".into(),
        };
        assert_eq!(
            svid.encode_to_vec(),
            [0x0a, 1, b'i', 0x12, 1, b't', 0x1a, 1, b'h']
        );
        let x = proto::X509Svid {
            spiffe_id: "i".into(),
            x509_svid: vec![1],
            x509_svid_key: vec![2],
            bundle: vec![3],
            hint: "h".into(),
        };
        assert_eq!(
            x.encode_to_vec(),
            [
                0x0a, 1, b'i', 0x12, 1, 1, 0x1a, 1, 2, 0x22, 1, 3, 0x2a, 1, b'h'
            ]
        );
        let resp = proto::X509SvidResponse {
            svids: vec![],
            crl: vec![vec![9]],
            federated_bundles: [("td".to_string(), vec![7])].into(),
        };
        // crl: field 2; the map entry: field 3 holding key (1) and value (2)
        assert_eq!(
            resp.encode_to_vec(),
            [0x12, 1, 9, 0x1a, 7, 0x0a, 2, b't', b'd', 0x12, 1, 7]
        );
    }

    #[test]
    fn svid_debug_output_holds_no_secret() {
        let x = proto::X509Svid {
            spiffe_id: "spiffe://example.org/hub".into(),
            x509_svid: b"CERTBYTES".to_vec(),
            x509_svid_key: b"KEYBYTES".to_vec(),
            bundle: vec![],
            hint: String::new(),
        };
        let j = proto::JwtSvid {
            spiffe_id: "spiffe://example.org/hub".into(),
            svid: "eyJTOKEN".into(),
            hint: String::new(),
        };
        let text = format!("{x:?} {j:?}");
        assert!(text.contains("spiffe://example.org/hub"));
        for secret in ["75, 69, 89", "KEYBYTES", "eyJTOKEN"] {
            assert!(!text.contains(secret), "{text}");
        }
    }

    #[test]
    fn chooses_the_wanted_or_default_svid_inside_the_trust_domain() {
        let ids = [
            "spiffe://example.org/kleym/hub",
            "spiffe://example.org/other",
        ];
        fn id<'a>(s: &'a &str) -> &'a str {
            s
        }
        assert_eq!(
            *choose(&ids, id, None, Some("example.org")).unwrap(),
            ids[0]
        );
        assert_eq!(
            *choose(&ids, id, Some(ids[1]), Some("example.org")).unwrap(),
            ids[1]
        );
        let err = choose(&ids, id, Some("spiffe://example.org/x"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("offers no SVID"), "{err}");
        let err = choose(&ids, id, None, Some("other.org"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the trust domain"), "{err}");
        let empty: [&str; 0] = [];
        assert!(choose(&empty, id, None, None).is_err());
    }
}
