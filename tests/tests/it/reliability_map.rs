//! RELIABILITY.md's tests exist: every `cargo test` command it writes in
//! backticks selects at least one test, as many as it says passed where it
//! says so (`| N passed` in its row, `(N tests` after it), and every test
//! path it writes (`area::…::name`, a test function's name last) is part of
//! a test's full path, as libtest's filter reads it. A plain test: it reads
//! the sources only, needs no root and starts no process.
//!
//! The tests are found in the sources: each `#[test]` function, under the
//! module path of its file (`src/a/b.rs` → `a::b`, `mod.rs` its directory's,
//! the `it` binary's areas under `tests/tests/it/`) and the inline modules
//! around it (rustfmt's indentation says which). Commands with a
//! placeholder (`NAME`, `…`) are examples, not checked.

use std::path::{Path, PathBuf};

/// The packages whose tests RELIABILITY.md runs: name and source roots
/// (the directory whose `lib.rs`/`main.rs` is the crate root).
const PACKAGES: [(&str, &str); 4] = [
    ("selfheal", "selfheal/src"),
    ("selfheal-core", "selfheal/core/src"),
    ("selfheal-testbed", "testbed/src"),
    ("tests", "tests/tests/it"),
];

/// The crates' names as a path starts with them (`selfheal_core::…`).
const CRATES: [&str; 3] = ["selfheal_core::", "selfheal_testbed::", "selfheal::"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The module path of the file at `rel` (relative to its crate's root).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// The full paths (`module::…::name`) of the `#[test]` functions in
/// `source`, a file of module `module`.
fn tests_in(source: &str, module: &[String]) -> Vec<String> {
    // Inline modules open so far: (indentation of the `mod` line, name).
    let mut open: Vec<(usize, String)> = Vec::new();
    let mut found = Vec::new();
    let mut attribute = false;
    for line in source.lines() {
        let indent = line.len() - line.trim_start().len();
        let code = line.trim();
        if code.is_empty() || code.starts_with("//") {
            continue;
        }
        // A line at or left of a module's indentation (its closing brace
        // or a later item) ends it.
        open.retain(|(at, _)| indent > *at);
        let name = |rest: &str| -> String {
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        let item = code.strip_prefix("pub ").unwrap_or(code);
        let item = item.strip_prefix("pub(crate) ").unwrap_or(item);
        if let Some(rest) = item.strip_prefix("mod ")
            && code.ends_with('{')
        {
            open.push((indent, name(rest)));
        }
        if code == "#[test]" || code.starts_with("#[tokio::test") {
            attribute = true;
            continue;
        }
        if attribute && !code.starts_with("#[") {
            attribute = false;
            let item = item.strip_prefix("async ").unwrap_or(item);
            if let Some(rest) = item.strip_prefix("fn ") {
                let mut path = module.to_vec();
                path.extend(open.iter().map(|(_, m)| m.clone()));
                path.push(name(rest));
                found.push(path.join("::"));
            }
        }
    }
    found
}

/// Every test of `package` (see [`PACKAGES`]), by full path.
fn tests_of(root: &Path, package: &str) -> Vec<String> {
    let Some((_, dir)) = PACKAGES.iter().find(|(p, _)| *p == package) else {
        return Vec::new();
    };
    let base = root.join(dir);
    let mut tests = Vec::new();
    let mut dirs = vec![base.clone()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                // Binaries' sources are crates of their own, not modules.
                if !path.ends_with("bin") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(&base).unwrap_or(&path);
                let source = std::fs::read_to_string(&path).unwrap_or_default();
                tests.extend(tests_in(&source, &module_of(rel)));
            }
        }
    }
    tests
}

/// A `cargo test` command as written: its package, its name filters
/// (any one selects a test) and `--skip`s.
#[derive(Debug, PartialEq)]
struct Command {
    package: String,
    filters: Vec<String>,
    skips: Vec<String>,
}

/// The command in `span`, when it is a checkable `cargo test` (not an
/// example with a placeholder).
fn command(span: &str) -> Option<Command> {
    let rest = span.strip_prefix("cargo test ")?;
    if rest.contains("NAME") || rest.contains('…') {
        return None;
    }
    let mut words = rest.split_whitespace();
    let mut cmd = Command {
        package: String::new(),
        filters: Vec::new(),
        skips: Vec::new(),
    };
    while let Some(w) = words.next() {
        match w {
            "-p" => cmd.package = words.next()?.to_owned(),
            "--skip" => cmd.skips.push(words.next()?.to_owned()),
            "--test" | "--test-threads" => {
                words.next();
            }
            "--no-run" => return None,
            w if w.starts_with('-') => {}
            w => cmd.filters.push(w.to_owned()),
        }
    }
    (!cmd.package.is_empty()).then_some(cmd)
}

/// The tests of `all` that `cmd` runs.
fn selected<'a>(cmd: &Command, all: &'a [String]) -> Vec<&'a String> {
    all.iter()
        .filter(|t| cmd.filters.is_empty() || cmd.filters.iter().any(|f| t.contains(f.as_str())))
        .filter(|t| !cmd.skips.iter().any(|s| t.contains(s.as_str())))
        .collect()
}

/// The count `line` says right after `span`: `| N passed` (a table row)
/// or `(N tests`.
fn said_count(line: &str, span: &str) -> Option<usize> {
    let after = line.split_once(&format!("`{span}`"))?.1.trim_start();
    let (number, word) = if let Some(cell) = after.strip_prefix('|') {
        let mut w = cell.split_whitespace();
        let number = w.next()?;
        let word = w.next()?.trim_end_matches([',', ';', ')']);
        (number, word == "passed" || word == "tests")
    } else {
        let mut w = after.strip_prefix('(')?.split_whitespace();
        (
            w.next()?,
            w.next()?.trim_end_matches([',', ';', ')']) == "tests",
        )
    };
    word.then(|| number.parse().ok())?
}

/// What is wrong with `markdown`'s tests: one line each.
fn problems(root: &Path, markdown: &str) -> Vec<String> {
    let all: Vec<(&str, Vec<String>)> = PACKAGES
        .iter()
        .map(|(p, _)| (*p, tests_of(root, p)))
        .collect();
    let names: Vec<&str> = all
        .iter()
        .flat_map(|(_, t)| t.iter())
        .filter_map(|t| t.rsplit("::").next())
        .collect();
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            if let Some(cmd) = command(span) {
                let Some((_, tests)) = all.iter().find(|(p, _)| *p == cmd.package) else {
                    out.push(format!("`{span}`: no package {} here", cmd.package));
                    continue;
                };
                let n = selected(&cmd, tests).len();
                if n == 0 {
                    out.push(format!("`{span}`: selects no test"));
                } else if let Some(said) = said_count(line, span)
                    && said != n
                {
                    out.push(format!("`{span}`: says {said}, selects {n}"));
                }
                continue;
            }
            // A test path: identifiers joined by `::`, a test's name last
            // (after the crate's name, which libtest's paths leave out).
            let path = CRATES
                .iter()
                .find_map(|c| span.strip_prefix(c))
                .unwrap_or(span);
            let segments: Vec<&str> = path.split("::").collect();
            let is_ident = |s: &&str| {
                !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if segments.len() >= 2
                && segments.iter().all(is_ident)
                && names.contains(segments.last().unwrap_or(&""))
                && !all.iter().any(|(_, t)| t.iter().any(|t| t.contains(path)))
            {
                out.push(format!("`{span}`: no test has this path"));
            }
        }
    }
    out
}

#[test]
fn every_test_reliability_names_runs() {
    let _area = tests::area(module_path!());
    let root = workspace_root();
    let doc = std::fs::read_to_string(root.join("RELIABILITY.md")).expect("RELIABILITY.md");
    // The finder sees the `it` binary's tests as libtest lists them.
    let mut found = tests_of(&root, "tests");
    found.sort();
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--list", "--format", "terse"])
        .output()
        .expect("list this binary's tests");
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect();
    listed.sort();
    assert!(listed.len() >= 250, "{listed:?}");
    assert_eq!(
        found, listed,
        "the sources' tests (left), libtest's (right)"
    );
    let wrong = problems(&root, &doc);
    assert!(
        wrong.is_empty(),
        "RELIABILITY.md names {} test(s) that do not run as written:\n  {}",
        wrong.len(),
        wrong.join("\n  ")
    );
}

#[test]
fn a_renamed_test_a_wrong_count_and_an_empty_filter_are_found() {
    let _area = tests::area(module_path!());
    let root = workspace_root();
    let doc = "\
| `cargo test -p tests --test it -- reliability_map::` | 3 passed |\n\
| `cargo test -p tests --test it -- reliability_map::` | 2 passed |\n\
`cargo test -p tests --test it -- no_such_area::` and `cargo test -p tests --test it -- NAME`\n\
`reliability_map::every_test_reliability_names_runs` and \
`tests::every_test_reliability_names_runs` (moved) and `selfheal_core::judge` (code) and \
`selfheal_core::judge::tests::a_slow_but_live_control_link_is_never_dead_and_the_limit_is_pinned`\n\
`cargo test -p selfheal-core --lib judge::tests::` (`cargo test -p nope`)\n\
```\n`cargo test -p tests --test it -- fenced_away::`\n```\n";
    assert_eq!(
        problems(&root, doc),
        [
            "`cargo test -p tests --test it -- reliability_map::`: says 2, selects 3",
            "`cargo test -p tests --test it -- no_such_area::`: selects no test",
            "`tests::every_test_reliability_names_runs`: no test has this path",
            "`cargo test -p nope`: no package nope here",
        ]
    );
}

#[test]
fn module_paths_follow_files_and_inline_modules() {
    let _area = tests::area(module_path!());
    assert_eq!(
        module_of(Path::new("actions/keepalive.rs")),
        ["actions", "keepalive"]
    );
    assert_eq!(module_of(Path::new("judge/mod.rs")), ["judge"]);
    assert_eq!(module_of(Path::new("lib.rs")), Vec::<String>::new());
    let source = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    \
                  fn one() {}\n\n    mod deeper {\n        #[test]\n        #[expect(x)]\n        \
                  fn two() {}\n    }\n\n    #[tokio::test]\n    async fn three() {}\n}\n\n\
                  #[test]\nfn top() {}\n";
    assert_eq!(
        tests_in(source, &["m".to_owned()]),
        [
            "m::tests::one",
            "m::tests::deeper::two",
            "m::tests::three",
            "m::top"
        ]
    );
}
