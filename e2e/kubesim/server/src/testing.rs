//! Support for tests that drive kubesim with the real `kubectl`.

use crate::ClusterHandle;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A failed kubectl run.
#[derive(Debug, thiserror::Error)]
#[error("kubectl {args} failed ({status}):\nstdout: {stdout}\nstderr: {stderr}")]
pub struct KubectlError {
    /// The arguments.
    pub args: String,
    /// Exit status.
    pub status: String,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

/// Locate kubectl as every test does (`test_tools`: PATH first, then the project's tool
/// cache); the error names the command that installs it.
pub fn find_kubectl() -> Result<PathBuf, String> {
    test_tools::find(test_tools::Tool::Kubectl).map_err(|e| e.to_string())
}

/// kubectl bound to one kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache_dir: PathBuf,
}

impl Kubectl {
    /// Write `cluster`'s admin kubeconfig into `dir` and use it.
    pub fn admin(cluster: &ClusterHandle, dir: &Path) -> Result<Self, String> {
        Self::with_kubeconfig(&cluster.kubeconfig_yaml(), dir, cluster.name())
    }

    /// Write `kubeconfig` into `dir/<name>.kubeconfig` and use it.
    pub fn with_kubeconfig(kubeconfig: &str, dir: &Path, name: &str) -> Result<Self, String> {
        let bin = find_kubectl()?;
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig).map_err(|e| e.to_string())?;
        Ok(Self {
            bin,
            kubeconfig: path,
            cache_dir: dir.join("kubectl-cache"),
        })
    }

    /// The kubeconfig path.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A `Command` for kubectl with this kubeconfig (and a private discovery cache).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .args(args)
            .env_remove("KUBECONFIG");
        c
    }

    /// Run kubectl with `args` (and optional stdin); `Ok(stdout)` on success.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, KubectlError> {
        let mut cmd = self.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let err = |status: String, stdout: String, stderr: String| KubectlError {
            args: args.join(" "),
            status,
            stdout,
            stderr,
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| err("spawn failed".into(), String::new(), e.to_string()))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(input.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|e| err("wait failed".into(), String::new(), e.to_string()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(err(out.status.to_string(), stdout, stderr))
        }
    }

    /// [`Kubectl::run`] without blocking the async runtime.
    pub async fn run_async(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, KubectlError> {
        let this = self.clone();
        let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
        let stdin = stdin.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            this.run(&a, stdin.as_deref())
        })
        .await
        .unwrap_or_else(|e| {
            Err(KubectlError {
                args: String::new(),
                status: "task failed".into(),
                stdout: String::new(),
                stderr: e.to_string(),
            })
        })
    }

    /// Start kubectl in the background (e.g. `get -w`) with stdout piped.
    pub fn spawn(&self, args: &[&str]) -> std::io::Result<tokio::process::Child> {
        let mut cmd = tokio::process::Command::from(self.command(args));
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd.spawn()
    }
}

/// HTTP version for [`raw_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/1.1 (ALPN `http/1.1`).
    Http1,
    /// HTTP/2 (ALPN `h2`).
    Http2,
}

/// A raw HTTPS response.
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
    /// The ALPN protocol the server agreed to.
    pub alpn: Option<Vec<u8>>,
}

impl RawResponse {
    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One request to `cluster` over a fresh TLS connection trusting its CA, with an optional
/// bearer token and JSON body — for tests of paths no typed client covers.
pub async fn raw_request(
    cluster: &ClusterHandle,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
    version: HttpVersion,
) -> Result<RawResponse, String> {
    raw(cluster, method, path, token, body, version, &[]).await
}

/// [`raw_request`] over HTTP/1.1 without a body but with extra headers (e.g. `Accept`).
pub async fn raw_request_with_headers(
    cluster: &ClusterHandle,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    raw(
        cluster,
        method,
        path,
        token,
        None,
        HttpVersion::Http1,
        headers,
    )
    .await
}

async fn raw(
    cluster: &ClusterHandle,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
    version: HttpVersion,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    let mut config = (*kubesim_auth::pki::client_config(&cluster.ca_pem(), None)
        .map_err(|e| e.to_string())?)
    .clone();
    config.alpn_protocols = vec![match version {
        HttpVersion::Http1 => b"http/1.1".to_vec(),
        HttpVersion::Http2 => b"h2".to_vec(),
    }];
    let addr = cluster.server().addr;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", cluster.url()));
    if let Some(t) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let payload = match body {
        Some(b) => {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(serde_json::to_vec(b).map_err(|e| e.to_string())?)
        }
        None => Bytes::new(),
    };
    let req = builder
        .body(Full::new(payload))
        .map_err(|e| e.to_string())?;
    let io = TokioIo::new(tls);
    let resp = match version {
        HttpVersion::Http1 => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            send.send_request(req).await.map_err(|e| e.to_string())?
        }
        HttpVersion::Http2 => {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            send.send_request(req).await.map_err(|e| e.to_string())?
        }
    };
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(RawResponse {
        status,
        headers,
        body,
        alpn,
    })
}
