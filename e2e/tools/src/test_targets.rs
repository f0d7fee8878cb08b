//! Which files of a crate's `tests/` folder are never compiled: with `autotests = false`,
//! a test file runs only if the crate's root test file declares it (`mod <name>;`) or its
//! `Cargo.toml` names it as a test target of its own (`path = "tests/<name>.rs"`).

use std::collections::BTreeSet;
use std::path::Path;

/// The files (`<name>.rs`) and folders with a `mod.rs` in `<crate_dir>/tests/` that neither
/// `tests/<root>.rs` declares as a module nor `<crate_dir>/Cargo.toml` names as a target, by
/// name. Folders without a `mod.rs` (fixtures included with `#[path]`) are not test files.
/// An error names the file that could not be read, or says that `tests/` holds no test file.
pub fn undeclared_test_files(crate_dir: &Path, root: &str) -> Result<Vec<String>, String> {
    let dir = crate_dir.join("tests");
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let root_text = read(&dir.join(format!("{root}.rs")))?;
    let manifest = read(&crate_dir.join("Cargo.toml"))?;
    let declared: BTreeSet<String> = root_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .chain(manifest.lines().filter_map(|l| {
            l.trim()
                .strip_prefix("path = \"tests/")?
                .strip_suffix(".rs\"")
        }))
        .map(str::to_owned)
        .collect();
    let mut files = BTreeSet::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".rs") {
            if stem != root {
                files.insert(stem.to_owned());
            }
        } else if path.join("mod.rs").is_file() {
            files.insert(name);
        }
    }
    if files.is_empty() {
        return Err(format!(
            "{} holds no test file besides {root}.rs",
            dir.display()
        ));
    }
    Ok(files.difference(&declared).cloned().collect())
}

/// Panics naming every file of [`undeclared_test_files`], or its error: for the one test of
/// each crate whose root test file declares the others (with autotests off, a file that is
/// not declared is never compiled, so its tests would silently never run).
pub fn assert_every_test_file_declared(crate_dir: &Path, root: &str) {
    match undeclared_test_files(crate_dir, root) {
        Ok(missing) if missing.is_empty() => {}
        Ok(missing) => panic!(
            "{}/tests/ holds files that neither tests/{root}.rs nor Cargo.toml declares, so they \
             never run: {missing:?}; add `mod <name>;` to {root}.rs for each",
            crate_dir.display()
        ),
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_file_neither_declared_nor_a_target() {
        let dir = tempfile::tempdir().unwrap();
        let tests = dir.path().join("tests");
        std::fs::create_dir_all(tests.join("fixtures")).unwrap();
        std::fs::create_dir_all(tests.join("nested")).unwrap();
        for f in [
            "all.rs",
            "a.rs",
            "b.rs",
            "own.rs",
            "fixtures/helper.rs",
            "nested/mod.rs",
        ] {
            std::fs::write(tests.join(f), "").unwrap();
        }
        std::fs::write(
            tests.join("all.rs"),
            "mod a;\n#[path = \"fixtures/helper.rs\"]\nmod helper;\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[[test]]\nname = \"own\"\npath = \"tests/own.rs\"\n",
        )
        .unwrap();
        assert_eq!(
            undeclared_test_files(dir.path(), "all").unwrap(),
            vec!["b".to_string(), "nested".to_string()]
        );
        std::fs::write(tests.join("all.rs"), "mod a;\nmod b;\nmod nested;\n").unwrap();
        assert!(undeclared_test_files(dir.path(), "all").unwrap().is_empty());
        assert!(undeclared_test_files(dir.path(), "missing").is_err());
    }

    #[test]
    #[should_panic(expected = "never run: [\"b\"]")]
    fn the_assertion_names_what_is_not_declared() {
        let dir = tempfile::tempdir().unwrap();
        let tests = dir.path().join("tests");
        std::fs::create_dir_all(&tests).unwrap();
        std::fs::write(tests.join("all.rs"), "mod a;\n").unwrap();
        std::fs::write(tests.join("a.rs"), "").unwrap();
        std::fs::write(tests.join("b.rs"), "").unwrap();
        std::fs::write(dir.path().join("Cargo.toml"), "").unwrap();
        assert_every_test_file_declared(dir.path(), "all");
    }
}
