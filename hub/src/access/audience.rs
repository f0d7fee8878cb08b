//! The audience of the tokens the hub obtains for one spoke, and how the hub tells a plugin
//! which spoke it runs for.
//!
//! The audience is the hub's decision, never the profile's: by default it is derived from
//! the ClusterProfile's namespace and name ([`derived_audience`]), which no status writer can
//! change and no two profiles share. A profile's `server` URL is not used: whoever writes a
//! profile's status could name another spoke's URL there (or keep that URL and route it
//! through a proxy of theirs), and receive a token that spoke accepts as the hub. Only where
//! the operator's provider entry says `profileSourcedAudiencePolicy: Allow` does the
//! `audience` of the profile's exec extension replace it.
//!
//! The plugin learns the audience, and the profile it serves, from two environment variables
//! the hub sets on every run after every other variable ([`AUDIENCE_ENV`], [`PROFILE_ENV`]);
//! no ClusterProfile can set a `KLEYM_` variable (the deny list of
//! [`FORBIDDEN_ENV`](super::extensions::FORBIDDEN_ENV)).

/// The audience the bundled plugins put in the tokens they obtain (`aud` of a JWT-SVID, the
/// TokenRequest's audience); set by the hub on every plugin run.
pub const AUDIENCE_ENV: &str = "KLEYM_CLUSTER_AUDIENCE";
/// The ClusterProfile (`namespace/name`) a plugin run is for; set by the hub on every run.
pub const PROFILE_ENV: &str = "KLEYM_CLUSTER_PROFILE";
/// Prefix of the derived audience.
pub const DERIVED_AUDIENCE_PREFIX: &str = "kleym.io/clusterprofile/";
/// The key of the exec extension a provider with `profileSourcedAudiencePolicy: Allow`
/// reads the audience from.
pub const AUDIENCE_KEY: &str = "audience";
/// The longest audience accepted from a profile.
pub const MAX_AUDIENCE_LEN: usize = 512;

/// The audience of the hub's tokens for the ClusterProfile `namespace/name`:
/// `kleym.io/clusterprofile/<namespace>/<name>`. Namespaces and names are DNS labels and
/// subdomains (no `/`), so two profiles never share it.
pub fn derived_audience(namespace: &str, name: &str) -> String {
    format!("{DERIVED_AUDIENCE_PREFIX}{namespace}/{name}")
}

/// Checks an audience taken from a profile: a non-empty string of at most
/// [`MAX_AUDIENCE_LEN`] bytes without whitespace or control characters.
pub fn validate_audience(audience: &str) -> Result<(), String> {
    if audience.is_empty() {
        return Err("is empty".into());
    }
    if audience.len() > MAX_AUDIENCE_LEN {
        return Err(format!("is longer than {MAX_AUDIENCE_LEN} bytes"));
    }
    if audience
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("contains whitespace or control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_audiences_name_the_profile_and_differ_per_profile() {
        assert_eq!(
            derived_audience("fleet", "spoke-a"),
            "kleym.io/clusterprofile/fleet/spoke-a"
        );
        // Namespace and name cannot trade characters: `/` is in neither.
        assert_ne!(derived_audience("a", "b-c"), derived_audience("a-b", "c"));
        assert_ne!(
            derived_audience("fleet", "a"),
            derived_audience("fleet", "b")
        );
    }

    #[test]
    fn profile_audiences_are_checked() {
        assert!(validate_audience("https://spoke-b:6443").is_ok());
        assert!(validate_audience("").is_err());
        assert!(validate_audience("a b").is_err());
        assert!(validate_audience("a\nb").is_err());
        assert!(validate_audience(&"a".repeat(MAX_AUDIENCE_LEN + 1)).is_err());
    }
}
