//! A kubesim external authenticator that accepts one (unsigned) token of its own, records
//! when each request carrying it arrived, and can hold each such request for a while before
//! letting it through (a slow client path: reconciles stay in flight), recording when it did.
//! It tells whether a client still sent anything after a given instant, and whether any of
//! its requests was still handled after it (a stopped reconciler, a deposed leader; a
//! request whose client gave up while it was held is dropped by the server, never let
//! through).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use kubesim_auth::UserInfo;

use kubesim::ClusterHandle;
use kubesim::authn::ExternalAuthenticator;

/// Authenticates its token as `name` in `system:masters`, recording arrival times.
#[derive(Debug)]
pub struct RecordingAuthenticator {
    name: String,
    issuer: String,
    token: String,
    delay_ms: AtomicU64,
    arrivals: Mutex<Vec<DateTime<Utc>>>,
    passed: Mutex<Vec<DateTime<Utc>>>,
}

impl RecordingAuthenticator {
    /// Installs a recorder for the client `name` on `cluster` and returns it.
    pub fn install(cluster: &ClusterHandle, name: &str) -> Arc<Self> {
        let issuer = format!("https://{name}.recording.invalid");
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = format!(
            "{}.{}.{}",
            b64(r#"{"alg":"RS256","typ":"JWT"}"#),
            b64(&format!(r#"{{"iss":"{issuer}","sub":"{name}"}}"#)),
            b64("unsigned")
        );
        let r = Arc::new(Self {
            name: name.to_string(),
            issuer,
            token,
            delay_ms: AtomicU64::new(0),
            arrivals: Mutex::new(Vec::new()),
            passed: Mutex::new(Vec::new()),
        });
        cluster.add_external_authenticator(r.clone());
        r
    }

    /// The bearer token this recorder accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Holds every later request this long before it is handled (recorded on arrival).
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Arrival time of every request so far.
    pub fn arrivals(&self) -> Vec<DateTime<Utc>> {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Requests so far.
    pub fn count(&self) -> usize {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Requests that arrived after `t`.
    pub fn arrived_after(&self, t: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        self.arrivals().into_iter().filter(|a| *a > t).collect()
    }

    /// Requests let through (authenticated, on to be handled) after `t`.
    pub fn passed_after(&self, t: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        self.passed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .filter(|a| *a > t)
            .collect()
    }
}

impl ExternalAuthenticator for RecordingAuthenticator {
    fn issuer(&self) -> &str {
        &self.issuer
    }

    fn verify<'a>(
        &'a self,
        token: &'a str,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<UserInfo, String>> {
        Box::pin(async move {
            if token != self.token {
                return Err("not the recording token".into());
            }
            self.arrivals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Utc::now());
            let delay = self.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            self.passed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Utc::now());
            Ok(UserInfo {
                username: self.name.clone(),
                groups: vec!["system:masters".into()],
                ..UserInfo::default()
            })
        })
    }
}
