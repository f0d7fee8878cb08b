//! A kubesim external authenticator that accepts one fixed (unsigned) JWT and counts the
//! requests it authenticates: the number of API requests a spoke received from the hub.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use kubesim_auth::UserInfo;

use kubesim::ClusterHandle;
use kubesim::authn::ExternalAuthenticator;

/// Issuer of the counting tokens.
pub const COUNTING_ISSUER: &str = "https://kleym-counting.invalid";

/// The token the counting authenticator accepts (a JWT whose `iss` routes it there).
pub fn counting_token() -> String {
    let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    format!(
        "{}.{}.{}",
        b64(r#"{"alg":"RS256","typ":"JWT"}"#),
        b64(&format!(
            r#"{{"iss":"{COUNTING_ISSUER}","sub":"kleym-hub"}}"#
        )),
        b64("unsigned")
    )
}

/// Authenticates [`counting_token`] as `kleym-hub` in `system:masters`, counting requests.
#[derive(Debug, Default)]
pub struct CountingAuthenticator {
    count: AtomicU64,
}

impl CountingAuthenticator {
    /// Installs a counter on `cluster` and returns it.
    pub fn install(cluster: &ClusterHandle) -> Arc<Self> {
        let c = Arc::new(Self::default());
        cluster.add_external_authenticator(c.clone());
        c
    }

    /// Requests authenticated so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl ExternalAuthenticator for CountingAuthenticator {
    fn issuer(&self) -> &str {
        COUNTING_ISSUER
    }

    fn verify<'a>(
        &'a self,
        token: &'a str,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<UserInfo, String>> {
        Box::pin(async move {
            if token != counting_token() {
                return Err("not the counting token".into());
            }
            self.count.fetch_add(1, Ordering::Relaxed);
            Ok(UserInfo {
                username: "kleym-hub".into(),
                groups: vec!["system:masters".into()],
                ..UserInfo::default()
            })
        })
    }
}
