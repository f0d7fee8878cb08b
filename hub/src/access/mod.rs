//! Access providers (KEP-4322, formerly KEP-5339): the hub's provider configuration, the ClusterProfile view it
//! is matched against, and the pure selection that yields one spoke's [`EffectiveAccess`].

pub mod audience;
pub mod extensions;
pub mod flags;
pub mod profile;
pub mod provider_config;
pub mod select;
pub mod shell_words;

pub use flags::AccessFlags;
pub use profile::{AccessProfile, ProfileProvider};
pub use provider_config::{
    AudiencePolicy, CliArgsPolicy, EnvVar, EnvVarsPolicy, ExecApiVersion, ExecConfig,
    ProviderConfig, ProviderConfigError, ProviderSet,
};
pub use select::{ClusterAccess, EffectiveAccess, SelectError, SelectOptions, select};
