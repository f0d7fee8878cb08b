//! The upstream CustomResourceDefinitions kleym reads or writes, vendored unchanged in
//! `e2e/crds/upstream/` (see `e2e/crds/README.md` for where each file comes from) and embedded
//! in this crate, so every test, benchmark, example and the demo find the same files the same
//! way from any working directory, and an installed binary needs no checkout beside it.
//!
//! This crate parses nothing: callers get the YAML text (and the on-disk path for tools that
//! take a directory, such as `kubesim --crds`).

use std::path::PathBuf;

/// One vendored CRD file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrdFile {
    /// The file name, e.g. `spire.spiffe.io_clusterspiffeids.yaml`.
    pub name: &'static str,
    /// The file's text, exactly as vendored (one or more YAML documents).
    pub yaml: &'static str,
}

macro_rules! vendored {
    ($dir:literal, $($file:literal),+ $(,)?) => {
        &[$(CrdFile { name: $file, yaml: include_str!(concat!("../", $dir, "/", $file)) }),+]
    };
}

/// The default set: every file of `upstream/`, sorted by name. ClusterProfile here serves
/// `v1alpha1` only, as cluster-inventory-api v0.1.x does.
pub const UPSTREAM: &[CrdFile] = vendored!(
    "upstream",
    "inference.networking.k8s.io_inferencepools.yaml",
    "inference.networking.x-k8s.io_inferencemodels.yaml",
    "inference.networking.x-k8s.io_inferenceobjectives.yaml",
    "inference.networking.x-k8s.io_inferencepools.yaml",
    "llm-d.ai_inferenceobjectives.yaml",
    "multicluster.x-k8s.io_clusterprofiles.yaml",
    "spire.spiffe.io_clusterspiffeids.yaml",
    "spire.spiffe.io_clusterstaticentries.yaml",
);

/// The ClusterProfile CRD as cluster-inventory-api v0.2.0 serves it: `v1alpha1` (storage)
/// and `v1alpha2`. Not part of [`UPSTREAM`], which keeps the v1alpha1-only CRD, so a test can
/// install either one, or upgrade from the first to the second while a hub runs.
pub const CLUSTERPROFILE_V1ALPHA2: CrdFile = vendored!(
    "cluster-inventory-api-v0.2.0",
    "multicluster.x-k8s.io_clusterprofiles.yaml"
)[0];

/// The file of [`UPSTREAM`] with this name.
pub fn upstream(name: &str) -> Option<&'static CrdFile> {
    UPSTREAM.iter().find(|f| f.name == name)
}

/// The text of the file of [`UPSTREAM`] with this name; panics with the known names when
/// there is none (for tests and fixtures, which name files from this list).
pub fn upstream_yaml(name: &str) -> &'static str {
    match upstream(name) {
        Some(f) => f.yaml,
        None => panic!(
            "no vendored upstream CRD named {name:?}; known: {:?}",
            UPSTREAM.iter().map(|f| f.name).collect::<Vec<_>>()
        ),
    }
}

/// The directory holding [`UPSTREAM`] in the source tree, for tools that read a directory
/// (`kubesim --crds DIR`). Only meaningful where the source tree exists (tests, benchmarks);
/// an installed binary uses the embedded texts instead.
pub fn upstream_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("upstream")
}

/// The directory holding [`CLUSTERPROFILE_V1ALPHA2`] in the source tree.
pub fn clusterprofile_v1alpha2_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cluster-inventory-api-v0.2.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_list_matches_the_directory() {
        let mut on_disk: Vec<String> = std::fs::read_dir(upstream_dir())
            .expect("upstream/ is readable")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        on_disk.sort();
        let embedded: Vec<&str> = UPSTREAM.iter().map(|f| f.name).collect();
        assert_eq!(
            on_disk, embedded,
            "UPSTREAM must list every file of upstream/"
        );
        for f in UPSTREAM {
            let text = std::fs::read_to_string(upstream_dir().join(f.name)).expect("readable");
            assert_eq!(text, f.yaml, "{} embedded differs from the file", f.name);
            assert!(
                f.yaml.contains("kind: CustomResourceDefinition"),
                "{}",
                f.name
            );
        }
    }

    #[test]
    fn two_version_clusterprofile_keeps_v1alpha1_and_adds_v1alpha2() {
        let v1 = upstream_yaml("multicluster.x-k8s.io_clusterprofiles.yaml");
        let both = CLUSTERPROFILE_V1ALPHA2.yaml;
        assert!(
            both.starts_with(v1),
            "the v1alpha1 block must be kept byte for byte"
        );
        assert!(both[v1.len()..].contains("name: v1alpha2"));
        assert!(!both[v1.len()..].contains("credentialProviders"));
        assert_eq!(
            CLUSTERPROFILE_V1ALPHA2.name,
            "multicluster.x-k8s.io_clusterprofiles.yaml"
        );
        assert!(
            clusterprofile_v1alpha2_dir()
                .join(CLUSTERPROFILE_V1ALPHA2.name)
                .is_file()
        );
    }

    #[test]
    #[should_panic(expected = "known:")]
    fn unknown_name_names_the_known_ones() {
        upstream_yaml("nope.yaml");
    }
}
