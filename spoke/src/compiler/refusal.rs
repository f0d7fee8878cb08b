//! Why a binding is refused: the condition type it sets, a stable reason string, and a
//! message that names the object and field at fault.

use std::fmt;

use kleym_api::conditions;

/// The condition a refusal sets to True (besides `Ready=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalKind {
    /// Target or pool cannot be resolved.
    InvalidRef,
    /// Selection cannot be proven confined to the namespace.
    UnsafeSelector,
    /// Templates, SPIFFE ID or output object fail.
    RenderFailure,
    /// The binding collides with another binding.
    Conflict,
}

impl RefusalKind {
    /// The condition type (`InvalidRef`, `UnsafeSelector`, `RenderFailure`, `Conflict`).
    pub fn condition_type(self) -> &'static str {
        match self {
            RefusalKind::InvalidRef => conditions::INVALID_REF,
            RefusalKind::UnsafeSelector => conditions::UNSAFE_SELECTOR,
            RefusalKind::RenderFailure => conditions::RENDER_FAILURE,
            RefusalKind::Conflict => conditions::CONFLICT,
        }
    }
}

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident => $kind:ident ),* $(,)?) => {
        /// Stable machine-readable refusal reasons. The string form ([`Reason::as_str`])
        /// is the variant name and never changes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            /// Every reason.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];

            /// The stable reason string.
            pub const fn as_str(self) -> &'static str {
                match self { $( Reason::$variant => stringify!($variant), )* }
            }

            /// The condition this reason belongs to.
            pub fn kind(self) -> RefusalKind {
                match self { $( Reason::$variant => RefusalKind::$kind, )* }
            }
        }
    };
}

reasons! {
    /// The target InferenceObjective / InferenceModel does not exist.
    TargetNotFound => InvalidRef,
    /// No served CRD for the target kind.
    TargetCRDNotServed => InvalidRef,
    /// The target's pool does not exist.
    PoolNotFound => InvalidRef,
    /// No served CRD for the pool's group.
    PoolCRDNotServed => InvalidRef,
    /// A reference leaves the binding's namespace.
    CrossNamespaceRef => InvalidRef,
    /// A reference names a group or kind kleym does not support.
    UnsupportedRef => InvalidRef,
    /// The rendered selectors lack `k8s:ns:<namespace>`.
    MissingNamespaceSelector => UnsafeSelector,
    /// A rendered `k8s:ns:` selector names another namespace.
    ForeignNamespaceSelector => UnsafeSelector,
    /// The rendered selectors lack a non-empty `k8s:sa:`.
    MissingServiceAccountSelector => UnsafeSelector,
    /// More than one distinct `k8s:sa:` selector.
    AmbiguousServiceAccountSelector => UnsafeSelector,
    /// A `k8s:sa:` value that is not a valid ServiceAccount name.
    InvalidServiceAccountSelector => UnsafeSelector,
    /// The pool selector is empty (would select every pod in the namespace).
    EmptyPoolSelector => UnsafeSelector,
    /// The pool selector has an invalid label key or value.
    InvalidPoolSelector => UnsafeSelector,
    /// A template selector contradicts the pool or the container discriminator, so the
    /// selection would not correspond to the referenced pool.
    UnprovableSelector => UnsafeSelector,
    /// The SPIFFE ID path is not under `/ns/<namespace>/`.
    SPIFFEIDOutsideNamespace => UnsafeSelector,
    /// An `svid.dnsNameTemplates` name is outside the binding's namespace's Service names
    /// and the operator's allowed suffixes.
    DNSNameOutsideNamespace => UnsafeSelector,
    /// The SPIFFE ID or a DNS name is one of the hub's own identities (its SPIFFE ID, its
    /// X.509 user name).
    ReservedHubIdentity => UnsafeSelector,
    /// A template does not follow the template grammar.
    TemplateError => RenderFailure,
    /// A rendered selector is not `type:value`.
    InvalidSelector => RenderFailure,
    /// The SPIFFE ID does not parse.
    InvalidSPIFFEID => RenderFailure,
    /// The SPIFFE ID is in another trust domain.
    ForeignTrustDomain => RenderFailure,
    /// The cluster's configured trust domain is invalid.
    InvalidTrustDomain => RenderFailure,
    /// PerObjective mode without a container discriminator.
    MissingContainerDiscriminator => RenderFailure,
    /// PoolOnly mode with a container discriminator, or an invalid discriminator value.
    InvalidContainerDiscriminator => RenderFailure,
    /// An `svid` option is invalid (DNS name, federated trust domain, TTL).
    InvalidSvidOption => RenderFailure,
    /// An `svid` option exceeds the operator's bounds (a TTL above the maximum, a
    /// federated trust domain not on the allow-list).
    SvidOptionOutOfBounds => RenderFailure,
    /// The ClusterSPIFFEID CRD is not served.
    ClusterSPIFFEIDCRDMissing => RenderFailure,
    /// An object kleym did not create holds the ClusterSPIFFEID name.
    ForeignObjectHoldsName => RenderFailure,
    /// Another PerObjective binding selects the same pods, service account and container.
    IdentityCollision => Conflict,
    /// Another binding computes the same SPIFFE ID with different selectors.
    DuplicateSPIFFEID => Conflict,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused binding: no output, one condition True, `Ready=False` with the same reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Refusal {
    /// Stable reason.
    pub reason: Reason,
    /// What is wrong, naming the object and field.
    pub message: String,
}

impl Refusal {
    /// A refusal with `reason` and `message`.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
        }
    }

    /// The condition this refusal sets.
    pub fn kind(&self) -> RefusalKind {
        self.reason.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_strings_are_unique_and_match_kind() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "duplicate {r}");
            assert!(!r.as_str().is_empty());
        }
        assert_eq!(Reason::IdentityCollision.as_str(), "IdentityCollision");
        assert_eq!(
            Reason::DuplicateSPIFFEID.kind().condition_type(),
            "Conflict"
        );
        assert_eq!(
            Reason::EmptyPoolSelector.kind(),
            RefusalKind::UnsafeSelector
        );
        assert_eq!(Reason::PoolNotFound.kind(), RefusalKind::InvalidRef);
        assert_eq!(Reason::TemplateError.kind(), RefusalKind::RenderFailure);
    }
}
