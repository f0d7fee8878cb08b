//! The operator docs' flags tables agree with the commands' `--help`, as the dashboard's
//! queries agree with the metrics the hub exports (`e2e/tests/deploy_chart.rs`).
//!
//! A flags table is a Markdown table in `docs/*.md` whose first header cell is `flag`. The line
//! right above it names the command it documents: `<!-- flags: kleym hub -->`. Then:
//! - every `--flag` in a table's first column is shown by that command's `--help`;
//! - every flag a checked command's `--help` shows is in some table marked for it, unless
//!   [`UNDOCUMENTED`] lists it;
//! - every flags table is marked, and names a command of [`COMMANDS`].
//!
//! `--help` is the real binary's output (`CARGO_BIN_EXE_kleym`), parsed as text: what the
//! operator reads is what is checked. The docs are parsed independently of clap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The commands whose flags the docs must list in full, as typed after `kleym`.
const COMMANDS: &[&str] = &[
    "hub",
    "spoke",
    "trust-config",
    "report",
    "issuer rotate",
    "issuer rotate-ca",
    "credential secret-reader",
    "credential token-request",
    "credential spiffe-jwt",
    "credential spiffe-x509",
    "explain pod",
    "explain binding",
];

/// Flags `--help` shows that no table needs to list, with the reason: `(command, flag, why)`;
/// `*` is every command.
const UNDOCUMENTED: &[(&str, &str, &str)] = &[
    ("*", "--help", "clap's own"),
    ("*", "--version", "clap's own"),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("hub/ has a parent")
        .to_path_buf()
}

/// The long flags `kleym <command> --help` shows.
fn help_flags(command: &str) -> BTreeSet<String> {
    let mut args: Vec<&str> = command.split(' ').collect();
    args.push("--help");
    let out = Command::new(env!("CARGO_BIN_EXE_kleym"))
        .args(&args)
        .output()
        .expect("run kleym");
    assert!(
        out.status.success(),
        "kleym {command} --help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// The long flags of a clap `--help` text: an option's line starts with two spaces and a short
/// flag (`  -o, --output <FORMAT>`) or six spaces (`      --kubeconfig <PATH>`); descriptions
/// are indented further, so a description that starts with a flag's name is not taken.
fn parse_help(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let rest = if let Some(r) = l.strip_prefix("      --") {
                r
            } else {
                let b = l.as_bytes();
                let short = b.len() > 8
                    && l.starts_with("  -")
                    && b[3].is_ascii_alphanumeric()
                    && &l[4..8] == ", --";
                if !short {
                    return None;
                }
                &l[8..]
            };
            let name = flag_name(rest);
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect()
}

/// The longest prefix of `s` that a long flag's name can be (`[a-z0-9-]`, starting with a
/// letter or digit).
fn flag_name(s: &str) -> &str {
    if !s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return "";
    }
    let end = s
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Every long flag (`--name`) written in `cell`.
fn flags_in(cell: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = cell;
    while let Some(at) = rest.find("--") {
        let after = &rest[at + 2..];
        let name = flag_name(after);
        if !name.is_empty() {
            out.push(format!("--{name}"));
        }
        rest = &after[name.len()..];
    }
    out
}

/// The command a `<!-- flags: kleym <command> -->` line names.
fn marker_command(line: &str) -> Option<String> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim();
    let command = inner
        .strip_prefix("flags:")?
        .trim()
        .strip_prefix("kleym ")?;
    let command = command.split_whitespace().collect::<Vec<_>>().join(" ");
    (!command.is_empty()).then_some(command)
}

/// One flags table of the docs.
#[derive(Debug)]
struct Table {
    /// `docs/<page>:<line of the header>`.
    place: String,
    /// The command of its marker, `None` when unmarked.
    command: Option<String>,
    /// The long flags of its first column, with the line of each.
    flags: Vec<(String, usize)>,
}

/// The flags tables of one Markdown page (`page` names it in messages).
fn parse_tables(page: &str, text: &str) -> Vec<Table> {
    let lines: Vec<&str> = text.lines().collect();
    let mut tables = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let starts_table = lines[i].trim_start().starts_with('|')
            && (i == 0 || !lines[i - 1].trim_start().starts_with('|'));
        if !starts_table {
            i += 1;
            continue;
        }
        let header_cell = lines[i]
            .trim()
            .trim_start_matches('|')
            .split('|')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let header_line = i;
        i += 1;
        let mut rows = Vec::new();
        while i < lines.len() && lines[i].trim_start().starts_with('|') {
            rows.push((i, lines[i]));
            i += 1;
        }
        if header_cell != "flag" {
            continue;
        }
        let command = header_line
            .checked_sub(1)
            .and_then(|above| marker_command(lines[above]));
        let mut flags = Vec::new();
        // The first row is the separator (`|---|---|`).
        for (n, row) in rows.iter().skip(1) {
            let first = row
                .trim()
                .trim_start_matches('|')
                .split('|')
                .next()
                .unwrap_or("");
            for f in flags_in(first) {
                flags.push((f, n + 1));
            }
        }
        tables.push(Table {
            place: format!("{page}:{}", header_line + 1),
            command,
            flags,
        });
    }
    tables
}

/// Every disagreement between `tables` and the commands' flags (`help`), as messages that
/// say which flag is missing from where and what to do.
fn disagreements(tables: &[Table], help: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut documented: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut pages: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in tables {
        let Some(command) = &t.command else {
            problems.push(format!(
                "{}: a flags table without a `<!-- flags: kleym <command> -->` line right above it",
                t.place
            ));
            continue;
        };
        let Some(known) = help.get(command) else {
            problems.push(format!(
                "{}: the table is marked for `kleym {command}`, which is not one of the checked \
                 commands (COMMANDS in hub/tests/docs_flags.rs)",
                t.place
            ));
            continue;
        };
        let page = t.place.split(':').next().unwrap_or("");
        pages.entry(command.as_str()).or_default().insert(page);
        for (f, line) in &t.flags {
            if !known.contains(f) {
                problems.push(format!(
                    "{page}:{line}: the `kleym {command}` flags table lists {f}, which \
                     `kleym {command} --help` does not show (renamed or removed? fix the row)"
                ));
            }
            documented
                .entry(command.as_str())
                .or_default()
                .insert(f.as_str());
        }
    }
    for (command, flags) in help {
        let tables_of = pages
            .get(command.as_str())
            .map(|p| p.iter().copied().collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        for f in flags {
            let excused = UNDOCUMENTED
                .iter()
                .any(|(c, u, _)| (*c == "*" || *c == command.as_str()) && *u == f.as_str());
            let listed = documented
                .get(command.as_str())
                .is_some_and(|d| d.contains(f.as_str()));
            if excused || listed {
                continue;
            }
            if tables_of.is_empty() {
                problems.push(format!(
                    "`kleym {command} --help` shows {f}, but no docs table is marked \
                     `<!-- flags: kleym {command} -->`: add one"
                ));
            } else {
                problems.push(format!(
                    "`kleym {command} --help` shows {f}, which is in no `kleym {command}` flags \
                     table ({tables_of}): add a row for it"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_docs_flags_tables_match_every_commands_help() {
    let mut help = BTreeMap::new();
    for command in COMMANDS {
        let flags = help_flags(command);
        assert!(
            !flags.is_empty(),
            "kleym {command} --help shows no flag: the parser is wrong"
        );
        help.insert(command.to_string(), flags);
    }
    assert!(help["hub"].len() > 40, "hub flags: {:?}", help["hub"]);
    let docs = repo_root().join("docs");
    let mut tables = Vec::new();
    let mut pages: Vec<_> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    for p in pages {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        tables.extend(parse_tables(&name, &std::fs::read_to_string(&p).unwrap()));
    }
    let problems = disagreements(&tables, &help);
    assert!(
        problems.is_empty(),
        "the docs' flags tables and --help disagree ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself: a planted page with a stale row, a missing flag and an unmarked table
/// gets exactly those messages, naming page, line, command and flag.
#[test]
fn the_checker_names_each_stale_missing_and_unmarked_flag() {
    let page = "\
intro

<!-- flags: kleym hub -->
| flag | default |
|---|---|
| `--kubeconfig`, `--context` | none |
| `--gone-flag` | 1 |

| flag | default |
|---|---|
| `--x` | |

| metric | type |
|---|---|
| `--not-a-flag-table` | |
";
    let tables = parse_tables("docs/t.md", page);
    assert_eq!(tables.len(), 2, "{tables:#?}");
    assert_eq!(tables[0].command.as_deref(), Some("hub"));
    assert_eq!(
        tables[0].flags,
        [
            ("--kubeconfig".to_string(), 6),
            ("--context".to_string(), 6),
            ("--gone-flag".to_string(), 7)
        ]
    );
    let help = BTreeMap::from([(
        "hub".to_string(),
        BTreeSet::from(["--kubeconfig", "--context", "--new-flag", "--help"].map(String::from)),
    )]);
    let problems = disagreements(&tables, &help);
    assert_eq!(
        problems,
        [
            "docs/t.md:7: the `kleym hub` flags table lists --gone-flag, which `kleym hub --help` does not show (renamed or removed? fix the row)",
            "docs/t.md:9: a flags table without a `<!-- flags: kleym <command> -->` line right above it",
            "`kleym hub --help` shows --new-flag, which is in no `kleym hub` flags table (docs/t.md): add a row for it",
        ]
    );
}

#[test]
fn help_parser_takes_option_lines_not_descriptions() {
    let help = "\
Usage: kleym report [OPTIONS]

Options:
      --kubeconfig <PATH>
          Kubeconfig of the hub cluster.

          --not-this is a wrapped description line
  -o, --output <FORMAT>
          Output format
  -h, --help
          Print help
";
    assert_eq!(
        parse_help(help),
        BTreeSet::from(["--kubeconfig", "--output", "--help"].map(String::from))
    );
}
