//! The repository stands alone: no tracked file refers to a directory beside the clone (the
//! `shared` folder where the project's source documents live on developers' machines) or to
//! an absolute path of a development machine. A fresh clone with nothing beside it must build,
//! test and run the demo.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Tracked files (git), or every file under the root but `target/` and `.git/` when this is
/// not a git checkout (a source tarball).
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let git = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output();
    if let Ok(out) = git
        && out.status.success()
    {
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .collect();
    }
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// The patterns, assembled so this file does not contain them literally.
fn forbidden() -> Vec<(String, &'static str)> {
    let dotdot = "..";
    vec![
        (
            format!("{dotdot}/shared"),
            "a directory beside the clone: vendor what you need (e.g. e2e/crds/)",
        ),
        (
            format!("/{}/", "work"),
            "an absolute path of a development machine",
        ),
        (
            format!("/{}/", "root"),
            "an absolute path of a development machine",
        ),
        (
            format!("/{}/", "home"),
            "an absolute path of a development machine",
        ),
        (
            format!("/{}/", "Users"),
            "an absolute path of a development machine",
        ),
    ]
}

/// Every `(file:line, pattern, why)` in `files` that matches a forbidden pattern.
fn offences(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let patterns = forbidden();
    let mut found = Vec::new();
    for file in files {
        // Cargo.lock holds no paths of ours; binary files are not text.
        if file.file_name().is_some_and(|n| n == "Cargo.lock") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (pattern, why) in &patterns {
                if line.contains(pattern.as_str()) {
                    let shown = file.strip_prefix(root).unwrap_or(file);
                    found.push(format!(
                        "{}:{}: {pattern:?} ({why}): {}",
                        shown.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn no_tracked_file_refers_outside_the_repository() {
    let root = repo_root();
    let files = tracked_files(&root);
    assert!(
        files.iter().any(|f| f.ends_with("Cargo.toml")),
        "found no files under {root:?}"
    );
    let found = offences(&root, &files);
    assert!(
        found.is_empty(),
        "files refer outside the repository:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_catches_each_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, (pattern, _)) in forbidden().iter().enumerate() {
        let f = dir.path().join(format!("f{i}.md"));
        std::fs::write(&f, format!("fine\nsee {pattern}crds/upstream here\n")).unwrap();
        files.push(f);
    }
    let clean = dir.path().join("clean.rs");
    std::fs::write(&clean, "let p = \"e2e/crds/upstream\";\n").unwrap();
    files.push(clean);
    let found = offences(dir.path(), &files);
    assert_eq!(found.len(), forbidden().len(), "{found:#?}");
    assert!(found.iter().all(|f| f.contains(":2:")), "{found:#?}");
}
