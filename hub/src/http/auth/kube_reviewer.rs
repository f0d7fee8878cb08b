//! [`Reviewer`] backed by the hub cluster's kube-apiserver.

use super::reviewer::{
    AccessCheck, AccessDecision, Caller, ReviewError, Reviewer, TokenReviewStatus,
};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1 as authn;
use k8s_openapi::api::authorization::v1 as authz;
use kube::api::{Api, PostParams};

/// Creates `TokenReview`s and `SubjectAccessReview`s with a `kube::Client` (the hub's own
/// identity needs `create` on `tokenreviews` and `subjectaccessreviews`).
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl std::fmt::Debug for KubeReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer").finish_non_exhaustive()
    }
}

impl KubeReviewer {
    /// A reviewer using `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

fn classify(kind: &'static str, e: kube::Error) -> ReviewError {
    match e {
        kube::Error::Api(status) => ReviewError::Api {
            kind,
            code: status.code,
            message: status.message.clone(),
        },
        // The display of other kube errors never contains the request body (the token).
        other => ReviewError::Transport {
            kind,
            message: other.to_string(),
        },
    }
}

impl Reviewer for KubeReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>> {
        Box::pin(async move {
            let review = authn::TokenReview {
                spec: authn::TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: Some(vec![audience.to_string()]),
                },
                ..Default::default()
            };
            let api: Api<authn::TokenReview> = Api::all(self.client.clone());
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| classify("TokenReview", e))?;
            let status = out.status.unwrap_or_default();
            let user = status.user.unwrap_or_default();
            Ok(TokenReviewStatus {
                authenticated: status.authenticated.unwrap_or(false),
                user: Caller {
                    username: user.username.unwrap_or_default(),
                    uid: user.uid.unwrap_or_default(),
                    groups: user.groups.unwrap_or_default(),
                    extra: user.extra.unwrap_or_default(),
                },
                audiences: status.audiences.unwrap_or_default(),
                error: status.error.unwrap_or_default(),
            })
        })
    }

    fn review_access<'a>(
        &'a self,
        caller: &'a Caller,
        check: &'a AccessCheck,
    ) -> BoxFuture<'a, Result<AccessDecision, ReviewError>> {
        Box::pin(async move {
            let review = authz::SubjectAccessReview {
                spec: authz::SubjectAccessReviewSpec {
                    user: Some(caller.username.clone()),
                    uid: (!caller.uid.is_empty()).then(|| caller.uid.clone()),
                    groups: Some(caller.groups.clone()),
                    extra: (!caller.extra.is_empty()).then(|| caller.extra.clone()),
                    resource_attributes: Some(authz::ResourceAttributes {
                        verb: Some(check.verb.clone()),
                        group: Some(check.group.clone()),
                        resource: Some(check.resource.clone()),
                        namespace: check.namespace.clone(),
                        name: check.name.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<authz::SubjectAccessReview> = Api::all(self.client.clone());
            let out = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| classify("SubjectAccessReview", e))?;
            let status = out.status.unwrap_or_default();
            if status.allowed && status.denied != Some(true) {
                Ok(AccessDecision::Allowed)
            } else {
                let mut reason = status.reason.unwrap_or_default();
                if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty()) {
                    if !reason.is_empty() {
                        reason.push_str("; ");
                    }
                    reason.push_str(&e);
                }
                Ok(AccessDecision::Denied(reason))
            }
        })
    }
}

/// The token the start-up check sends: not a token any issuer signs, so the review answers
/// "not authenticated" when the hub may send reviews at all.
const PROBE_TOKEN: &str = "kleym-start-up-check.not-a-token";

/// Checks at start-up that `--api-auth-mode enforce` can work: the hub must be able to create
/// a `TokenReview` in the hub cluster (credentials the API server accepts, and RBAC for
/// `tokenreviews` create). A `401` or `403` is an error naming the flag; a transport failure
/// is not (the API server may come up later; requests are refused with `503` meanwhile) and
/// is returned as `Ok(Some(reason))` for the caller to log.
pub async fn check_enforce_can_work(
    reviewer: &dyn Reviewer,
    audience: &str,
) -> Result<Option<String>, String> {
    match reviewer.review_token(PROBE_TOKEN, audience).await {
        Ok(_) => Ok(None),
        Err(ReviewError::Api { code, message, .. }) if code == 401 || code == 403 => Err(format!(
            "--api-auth-mode enforce (the default whenever the hub API listens) cannot work: the hub cannot create TokenReviews in the hub cluster (HTTP {code}: {message}). Give the hub credentials for its cluster and RBAC to create tokenreviews.authentication.k8s.io and subjectaccessreviews.authorization.k8s.io, or pass --api-auth-mode permissive or off explicitly"
        )),
        Err(e) => Ok(Some(e.to_string())),
    }
}
