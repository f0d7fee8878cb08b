//! Finds the third-party command-line tools the tests drive, the same way in every test:
//!
//! 1. the first one on `PATH` that is new enough (kubectl ≥ 1.24, helm ≥ 3.8, any aws CLI);
//! 2. else the project's tool cache, where `scripts/ensure-tools` installs them:
//!    `$KLEYM_TOOLS_DIR` (default `$HOME/.cache/kleym-tools`), `v1.32.3/kubectl/kubectl`,
//!    `v1.32.3/helm/helm`, `awscli/bin/aws`.
//!
//! When neither has it, [`find`] returns an error naming the command that installs it; tests
//! fail with that message (they never skip).
//!
//! [`test_targets`] finds the files of a crate's `tests/` that would never be compiled.

pub mod test_targets;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A tool the tests drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// The real `kubectl` (≥ 1.24: the conformance tests use `kubectl create token`).
    Kubectl,
    /// The real `helm` (≥ 3.8: OCI-era chart handling, `values.schema.json` enforcement).
    Helm,
    /// The AWS CLI (`aws eks get-token`, a third-party exec credential plugin).
    Aws,
}

impl Tool {
    /// The command's name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Kubectl => "kubectl",
            Tool::Helm => "helm",
            Tool::Aws => "aws",
        }
    }

    /// Where the tool cache keeps it, relative to the cache root.
    fn cached_path(self) -> &'static str {
        match self {
            Tool::Kubectl => "v1.32.3/kubectl/kubectl",
            Tool::Helm => "v1.32.3/helm/helm",
            Tool::Aws => "awscli/bin/aws",
        }
    }

    /// The minimum version as (major, minor), if any.
    fn minimum(self) -> Option<(u32, u32)> {
        match self {
            Tool::Kubectl => Some((1, 24)),
            Tool::Helm => Some((3, 8)),
            Tool::Aws => None,
        }
    }

    /// The arguments that make it print its version.
    fn version_args(self) -> &'static [&'static str] {
        match self {
            Tool::Kubectl => &["version", "--client"],
            Tool::Helm => &["version", "--short"],
            Tool::Aws => &["--version"],
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The command that installs every tool into the cache (named in errors).
pub const INSTALL_COMMAND: &str = "scripts/ensure-tools";

/// Why a tool was not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// The tool.
    pub tool: Tool,
    /// What was tried, in order.
    pub tried: Vec<String>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} not found (tried: {}); run `{INSTALL_COMMAND}` from the repository root to install \
             it into the tool cache, or put {} on PATH",
            self.tool,
            self.tried.join("; "),
            match self.tool.minimum() {
                Some((a, b)) => format!("{} >= {a}.{b}", self.tool),
                None => self.tool.to_string(),
            }
        )
    }
}

impl std::error::Error for NotFound {}

/// The tool cache root: `$KLEYM_TOOLS_DIR`, else `$HOME/.cache/kleym-tools`.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("KLEYM_TOOLS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kleym-tools")))
}

/// The first `major.minor` in `text` after a `v` or at a word start (`v1.32.3`,
/// `Client Version: v1.32.3`, `v3.17.2+gcc0d`, `aws-cli/1.40.0`).
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let bytes = text.as_bytes();
    for (i, c) in bytes.iter().enumerate() {
        if !c.is_ascii_digit() || (i > 0 && bytes[i - 1].is_ascii_digit()) {
            continue;
        }
        let rest = &text[i..];
        let mut parts = rest.splitn(3, '.');
        let major = parts.next()?;
        let minor: String = parts
            .next()
            .unwrap_or("")
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let (Ok(a), Ok(b)) = (major.parse::<u32>(), minor.parse::<u32>()) {
            return Some((a, b));
        }
    }
    None
}

/// Whether the binary at `path` runs and (for tools with a minimum) is new enough.
fn usable(tool: Tool, path: &Path) -> Result<(), String> {
    if !path.is_file() {
        return Err(format!("{}: no such file", path.display()));
    }
    let out = Command::new(path)
        .args(tool.version_args())
        .output()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !out.status.success() {
        return Err(format!("{}: version check failed", path.display()));
    }
    let Some(min) = tool.minimum() else {
        return Ok(());
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match parse_version(&text) {
        Some(v) if v >= min => Ok(()),
        Some((a, b)) => Err(format!(
            "{}: version {a}.{b} is older than {}.{}",
            path.display(),
            min.0,
            min.1
        )),
        None => Err(format!("{}: no version in its output", path.display())),
    }
}

/// Locate `tool` (see the crate docs) without caching the answer.
pub fn locate(
    tool: Tool,
    path_var: Option<&std::ffi::OsStr>,
    cache: Option<&Path>,
) -> Result<PathBuf, NotFound> {
    let mut tried = Vec::new();
    if let Some(path_var) = path_var {
        for dir in std::env::split_paths(path_var) {
            let candidate = dir.join(tool.name());
            if !candidate.is_file() {
                continue;
            }
            match usable(tool, &candidate) {
                Ok(()) => return Ok(candidate),
                Err(why) => tried.push(format!("PATH: {why}")),
            }
        }
        if tried.is_empty() {
            tried.push("PATH: none".into());
        }
    }
    match cache {
        Some(root) => {
            let candidate = root.join(tool.cached_path());
            match usable(tool, &candidate) {
                Ok(()) => return Ok(candidate),
                Err(why) => tried.push(format!("tool cache: {why}")),
            }
        }
        None => tried.push("tool cache: neither KLEYM_TOOLS_DIR nor HOME is set".into()),
    }
    Err(NotFound { tool, tried })
}

/// Locate `tool`: the first usable one on `PATH`, else the tool cache. The answer is
/// remembered for the life of the process.
pub fn find(tool: Tool) -> Result<PathBuf, NotFound> {
    static KUBECTL: OnceLock<Result<PathBuf, NotFound>> = OnceLock::new();
    static HELM: OnceLock<Result<PathBuf, NotFound>> = OnceLock::new();
    static AWS: OnceLock<Result<PathBuf, NotFound>> = OnceLock::new();
    let cell = match tool {
        Tool::Kubectl => &KUBECTL,
        Tool::Helm => &HELM,
        Tool::Aws => &AWS,
    };
    cell.get_or_init(|| {
        locate(
            tool,
            std::env::var_os("PATH").as_deref(),
            cache_dir().as_deref(),
        )
    })
    .clone()
}

/// [`find`], panicking with the install hint: for tests, which must fail, never skip, when
/// a tool is missing.
pub fn require(tool: Tool) -> PathBuf {
    match find(tool) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn versions_parse_from_each_tools_output() {
        assert_eq!(
            parse_version("Client Version: v1.32.3\nKustomize Version: v5.5.0"),
            Some((1, 32))
        );
        assert_eq!(parse_version("v3.17.2+gcc0d"), Some((3, 17)));
        assert_eq!(parse_version("aws-cli/1.40.2 Python/3.12.3"), Some((1, 40)));
        assert_eq!(parse_version("no digits"), None);
    }

    fn fake(dir: &Path, rel: &str, version_line: &str) -> PathBuf {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("#!/bin/sh\necho '{version_line}'\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn path_first_then_cache_and_too_old_is_skipped() {
        let d = tempfile_dir("order");
        let old = fake(&d.join("old"), "kubectl", "Client Version: v1.20.0");
        let new = fake(&d.join("new"), "kubectl", "Client Version: v1.31.0");
        let cached = fake(
            &d.join("cache"),
            "v1.32.3/kubectl/kubectl",
            "Client Version: v1.32.3",
        );
        let path = std::env::join_paths([old.parent().unwrap(), new.parent().unwrap()]).unwrap();
        assert_eq!(
            locate(Tool::Kubectl, Some(&path), Some(&d.join("cache"))).unwrap(),
            new
        );
        let only_old = std::env::join_paths([old.parent().unwrap()]).unwrap();
        assert_eq!(
            locate(Tool::Kubectl, Some(&only_old), Some(&d.join("cache"))).unwrap(),
            cached
        );
        let err = locate(Tool::Kubectl, Some(&only_old), Some(&d.join("empty"))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("older than 1.24"), "{msg}");
        assert!(msg.contains(INSTALL_COMMAND), "{msg}");
        assert!(msg.contains("kubectl >= 1.24"), "{msg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn aws_needs_no_minimum() {
        let d = tempfile_dir("aws");
        let aws = fake(&d.join("bin"), "aws", "aws-cli/1.0.0");
        let path = std::env::join_paths([aws.parent().unwrap()]).unwrap();
        assert_eq!(locate(Tool::Aws, Some(&path), None).unwrap(), aws);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("test-tools-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
