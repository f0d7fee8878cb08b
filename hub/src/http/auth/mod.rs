//! Authentication and authorization of `/v1/*`: bearer ServiceAccount tokens verified by
//! `TokenReview`, access decided by `SubjectAccessReview`, both cached (see [`ApiAuth`]).

mod authenticator;
mod cache;
mod clock;
mod kube_reviewer;
mod mode;
mod reviewer;
mod single_flight;
mod token;

pub use authenticator::{ApiAuth, AuthConfig, AuthDecision, AuthFailure, FailureKind};
pub use cache::TtlCache;
pub use clock::{Clock, ManualClock, SystemClock};
pub use kube_reviewer::{KubeReviewer, check_enforce_can_work};
pub use mode::AuthMode;
pub use reviewer::{AccessCheck, AccessDecision, Caller, ReviewError, Reviewer, TokenReviewStatus};
pub use token::{BearerError, TokenHash, bearer_token, jwt_expiry};
