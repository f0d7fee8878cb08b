//! No import circles between the modules of kleym's library crates: a module (one `.rs`
//! file; `mod.rs`/`lib.rs` stand for their folder) that imports another, directly or through
//! others, must not be imported back. Circles make a module impossible to read, test or move
//! alone; they are how "one change touches nine files" starts.
//!
//! The graph is read from the source text: `use crate::…`, `use super::…` and `use self::…`
//! items outside `#[cfg(test)]` code, each resolved to the deepest module file its path names
//! (`use crate::fleet::state::Phase` is an edge to `fleet/state.rs`, `use crate::fleet::X` to
//! `fleet/mod.rs`). A parent's `pub use child::…` re-exports are its public face, not a
//! dependency, and are not edges. Paths written inline without `use` are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked, as their `src/` directories relative to the repository root.
const CRATES: &[&str] = &["api/src", "spoke/src", "hub/src"];

/// Circles that exist today and are being removed; each entry is one circle's sorted module
/// list. A circle not listed here fails the test; a listed one that is gone fails it too, so
/// the list only ever shrinks.
const KNOWN_CIRCLES: &[&[&str]] = &[];

type Module = Vec<String>;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Every module file under `src`, keyed by its module path (`["fleet", "state"]`).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The source without its test code: everything from the first `#[cfg(test)]` on (test
/// modules sit at the end of a file by this repository's convention).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// `(is_pub, path)` of every `use` item.
fn use_items(text: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("use ") {
        let before = &rest[..i];
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        let prefix = before[line_start..].trim();
        let at_item_start = prefix.is_empty() || prefix.starts_with("pub");
        let after = &rest[i + 4..];
        let Some(end) = after.find(';') else { break };
        if at_item_start && (prefix.is_empty() || prefix == "pub" || prefix.starts_with("pub(")) {
            let path: String = after[..end].split_whitespace().collect();
            out.push((!prefix.is_empty(), path));
        }
        rest = &after[end..];
    }
    out
}

/// The module files `path` (a `use` path seen in module `from`) refers to.
fn targets(from: &Module, path: &str, known: &BTreeMap<Module, PathBuf>) -> Vec<Module> {
    let (head, group) = match path.find('{') {
        Some(i) => (
            &path[..i],
            Some(path[i + 1..path.rfind('}').unwrap_or(path.len())].to_string()),
        ),
        None => (path, None),
    };
    let mut segs: Vec<&str> = head.split("::").filter(|s| !s.is_empty()).collect();
    let mut cur: Module = match segs.first().copied() {
        Some("crate") => {
            segs.remove(0);
            Vec::new()
        }
        Some("super") => {
            let mut m = from.clone();
            while segs.first() == Some(&"super") {
                m.pop();
                segs.remove(0);
            }
            m
        }
        Some("self") => {
            segs.remove(0);
            from.clone()
        }
        // A bare path names a child module of `from` (2018+ uniform paths) or another crate.
        Some(first) if known.contains_key(&[from.clone(), vec![first.to_string()]].concat()) => {
            from.clone()
        }
        _ => return Vec::new(),
    };
    for s in segs {
        let mut next = cur.clone();
        next.push(s.to_string());
        if known.contains_key(&next) {
            cur = next;
        } else {
            break;
        }
    }
    let mut out = vec![cur.clone()];
    if let Some(group) = group {
        for item in group.split(',') {
            let first = item.split("::").next().unwrap_or("").trim();
            let mut next = cur.clone();
            next.push(first.to_string());
            if known.contains_key(&next) {
                out.push(next);
            }
        }
    }
    out
}

fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let known = modules(src);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &known {
        let text = std::fs::read_to_string(file).unwrap();
        for (is_pub, path) in use_items(without_tests(&text)) {
            for target in targets(module, &path, &known) {
                let own_child = target.len() > module.len() && target.starts_with(module);
                if target == *module || (is_pub && own_child) {
                    continue;
                }
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
        edges.entry(module.clone()).or_default();
    }
    edges
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            let Some((w, _)) = edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(if w.is_empty() {
                    "lib".to_string()
                } else {
                    w.join("/")
                });
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

#[test]
fn no_module_imports_back_into_its_importers() {
    let root = repo_root();
    let mut found = Vec::new();
    for krate in CRATES {
        let edges = graph(&root.join(krate));
        assert!(edges.len() > 3, "{krate}: read too few modules: {edges:?}");
        for c in circles(&edges) {
            found.push(
                c.into_iter()
                    .map(|m| format!("{krate}/{m}"))
                    .collect::<Vec<_>>(),
            );
        }
    }
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    let new: Vec<_> = found.iter().filter(|c| !known.contains(c)).collect();
    let gone: Vec<_> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(new.is_empty(), "import circles between modules: {new:#?}");
    assert!(
        gone.is_empty(),
        "circles in KNOWN_CIRCLES are gone; remove them: {gone:#?}"
    );
}

#[test]
fn the_check_sees_a_circle_and_ignores_a_parents_face() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    // a/mod.rs re-exports its child (its face, no edge) and uses b; b uses c; c uses a::x.
    std::fs::write(
        src.join("a/mod.rs"),
        "pub mod x;\npub use x::X;\nuse crate::b::B;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/x.rs"),
        "use super::super::c::C;\npub struct X;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "use crate::{c, lib_item};\npub struct B;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub struct C;\n#[cfg(test)]\nmod tests { use crate::a::X; }\n",
    )
    .unwrap();
    assert_eq!(circles(&graph(src)), Vec::<Vec<String>>::new());
    // Now c imports a (outside tests): a -> b -> c -> a.
    std::fs::write(src.join("c.rs"), "use crate::a::X;\npub struct C;\n").unwrap();
    assert_eq!(
        circles(&graph(src)),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
    // A parent's face plus a child's `super` import form no circle; a private `use` does.
    std::fs::write(src.join("c.rs"), "pub struct C;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "pub mod x;\nuse x::X;\n").unwrap();
    std::fs::write(src.join("a/x.rs"), "use super::helper;\npub struct X;\n").unwrap();
    assert_eq!(
        circles(&graph(src)),
        vec![vec!["a".to_string(), "a/x".to_string()]]
    );
}
