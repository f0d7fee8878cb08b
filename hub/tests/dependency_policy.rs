//! What the `kleym` binary links: no crate the workspace's `deny.toml` denies (the test-only
//! `rsa` advisory, unmaintained `rustls-pemfile`, a second YAML crate) is in the normal and
//! build dependency closure of `kleym-hub`, as `cargo build -p kleym-hub --bin kleym` (and the
//! image) resolves it. Runs `cargo tree`, offline, against the committed `Cargo.lock`. And the
//! image ships the stripped `dist` build of it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Crates that must never be linked into `kleym`, with why. Each must also be denied in
/// `deny.toml` (checked below), so the two lists cannot drift apart.
const DENIED: &[(&str, &str)] = &[
    (
        "rsa",
        "RUSTSEC-2023-0071 (no fix): accepted in test crates (kubesim-auth) only",
    ),
    ("jsonwebtoken", "pulls in rsa: test crates only"),
    ("rustls-pemfile", "unmaintained (RUSTSEC-2025-0134)"),
    ("serde_yaml", "one YAML crate: serde-saphyr"),
    ("serde_yaml_ng", "one YAML crate: serde-saphyr"),
    ("unsafe-libyaml", "one YAML crate: serde-saphyr"),
    ("yaml-rust", "one YAML crate: serde-saphyr"),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("hub/ has a parent")
        .to_path_buf()
}

/// Names of every package in the normal + build dependency closure of `package` (itself
/// included), for the host platform.
fn closure(package: &str) -> BTreeSet<String> {
    let root = workspace_root();
    let out = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["tree", "--offline", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .args(["-p", package, "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn denied_in(closure: &BTreeSet<String>) -> Vec<String> {
    DENIED
        .iter()
        .filter(|(name, _)| closure.contains(*name))
        .map(|(name, why)| format!("{name} ({why})"))
        .collect()
}

#[test]
fn kleym_links_no_denied_crate() {
    let kleym = closure("kleym-hub");
    // The listing is real: the binary's own crates and its YAML and TLS stacks are in it.
    for expected in [
        "kleym-hub",
        "kleym-api",
        "kube",
        "serde-saphyr",
        "rustls-pki-types",
    ] {
        assert!(
            kleym.contains(expected),
            "{expected} missing from {kleym:?}"
        );
    }
    let found = denied_in(&kleym);
    assert!(
        found.is_empty(),
        "the kleym binary (kleym-hub) links denied crates: {found:?}; see deny.toml"
    );
}

#[test]
fn the_check_finds_a_denied_crate_where_there_is_one() {
    // kubesim-auth (test-only) is where rsa is accepted: the same check must see it there.
    let found = denied_in(&closure("kubesim-auth"));
    assert!(
        found.iter().any(|f| f.starts_with("rsa ")),
        "rsa not found in kubesim-auth's closure: {found:?}"
    );
    assert!(
        found.iter().any(|f| f.starts_with("jsonwebtoken ")),
        "{found:?}"
    );
}

#[test]
fn deny_toml_lists_every_denied_crate_and_the_accepted_advisory() {
    let path = workspace_root().join("deny.toml");
    let text = std::fs::read_to_string(&path).expect("reading deny.toml");
    for (name, _) in DENIED {
        assert!(
            text.contains(&format!("name = \"{name}\"")),
            "deny.toml does not deny {name}"
        );
    }
    assert!(text.contains("RUSTSEC-2023-0071"), "{}", path.display());
}

#[test]
fn the_image_ships_the_stripped_dist_build() {
    // `--release` keeps line tables for backtraces; what ships is `--profile dist`, the
    // release build without debug info and symbols (Cargo.toml, Dockerfile, docs/install.md).
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let dist = manifest
        .split("\n[profile.dist]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("Cargo.toml has a [profile.dist] section");
    // Whole-program optimisation: what the footprint figures of docs/benchmarks.md were taken with.
    for line in [
        "inherits = \"release\"",
        "strip = true",
        "debug = false",
        "lto = \"fat\"",
        "codegen-units = 1",
    ] {
        assert!(
            dist.lines().any(|l| l.trim() == line),
            "[profile.dist] lacks `{line}`:\n{dist}"
        );
    }
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains("cargo build --profile dist ")
            && dockerfile.contains("target/dist/kleym /out/kleym"),
        "the Dockerfile must build and copy the dist profile's kleym"
    );
    assert!(!dockerfile.contains("target/release/"), "{dockerfile}");
    // jemalloc (the binary's allocator, BSD-2-Clause) asks binary copies to carry its notice.
    assert!(
        dockerfile.contains("tikv-jemalloc-sys-*/jemalloc/COPYING")
            && dockerfile.contains("\"$jemalloc_copying\" /out/licenses/jemalloc/COPYING")
            && dockerfile.contains("COPY --from=build /out/licenses/ /usr/share/licenses/"),
        "the image must ship jemalloc's licence notice"
    );
}
