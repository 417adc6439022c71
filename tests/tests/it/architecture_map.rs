//! ARCHITECTURE.md's code map names files that exist: every repository
//! path it writes in backticks is looked up from the workspace root, and
//! the test fails naming each one that is not there. A plain test: it
//! reads files only, needs no root and starts no process.
//!
//! A span counts as a repository path when it is one token of path
//! characters (`A-Z a-z 0-9 _ . -` and `/`), does not start with `/` (an
//! absolute path is the host's, such as `/proc/PID/fd`), and either holds a
//! `/` or ends in `.rs`, `.md`, `.toml` or `.c`. A span with a `/` whose last
//! part is all digits is an address range (`10.253.N.0/24`), not a path.
//! Code blocks fenced with three backticks are skipped.

use std::path::{Path, PathBuf};

/// The file name endings that make a span without a `/` a path.
const PATH_ENDINGS: [&str; 4] = [".rs", ".md", ".toml", ".c"];

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// `text` without its fenced code blocks.
fn without_fences(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether a backticked span reads as a path inside the repository.
fn is_repo_path(span: &str) -> bool {
    let path_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
    if span.is_empty() || span.starts_with('/') || !span.chars().all(path_chars) {
        return false;
    }
    if span.contains('/') {
        let last = span.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        // An address range such as `10.253.N.0/24`.
        return !last.chars().all(|c| c.is_ascii_digit());
    }
    PATH_ENDINGS.iter().any(|end| span.ends_with(end))
}

/// Every repository path `markdown` writes in backticks, in order, each once.
fn repo_paths(markdown: &str) -> Vec<String> {
    let text = without_fences(markdown);
    let mut paths: Vec<String> = Vec::new();
    // Between the first and second backtick is code, then prose, and so on.
    for span in text.split('`').skip(1).step_by(2) {
        let span = span.trim();
        if is_repo_path(span) && !paths.iter().any(|p| p == span) {
            paths.push(span.to_string());
        }
    }
    paths
}

/// The paths of `markdown` that do not exist below `root`.
fn missing_paths(root: &Path, markdown: &str) -> Vec<String> {
    repo_paths(markdown)
        .into_iter()
        .filter(|p| !root.join(p).exists())
        .collect()
}

#[test]
fn every_path_in_the_code_map_exists() {
    let _area = tests::area(module_path!());
    let root = workspace_root();
    let doc_path = root.join("ARCHITECTURE.md");
    let doc = match std::fs::read_to_string(&doc_path) {
        Ok(doc) => doc,
        Err(e) => panic!("cannot read {}: {e}", doc_path.display()),
    };
    let paths = repo_paths(&doc);
    assert!(
        paths.len() >= 40,
        "ARCHITECTURE.md names only {} repository paths: is the code map there? {paths:?}",
        paths.len()
    );
    let missing = missing_paths(&root, &doc);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names {} path(s) that do not exist below {}:\n  {}",
        missing.len(),
        root.display(),
        missing.join("\n  ")
    );
}

#[test]
fn spans_are_paths_only_when_they_look_like_repository_paths() {
    let _area = tests::area(module_path!());
    let cases = [
        ("selfheal/src/main.rs", true),
        ("selfheal/src/cli/", true),
        ("dist/kubernetes/", true),
        ("Cargo.toml", true),
        ("README.md", true),
        ("tests/src/diag_floor.c", true),
        ("../shared/design.md", true),
        ("/proc/PID/cgroup", false),
        ("/etc/selfheal/config.toml", false),
        ("10.253.N.0/24", false),
        ("selfheal_core::cgroup", false),
        ("host:port", false),
        ("docker-<id>.scope", false),
        ("app.kubernetes.io/name: prometheus", false),
        ("io.kubernetes.*", false),
        ("config.json", false),
        ("user@UID.service/…", false),
        ("check --json", false),
        ("", false),
    ];
    for (span, expected) in cases {
        assert_eq!(is_repo_path(span), expected, "{span:?}");
    }
}

#[test]
fn a_moved_file_and_a_fenced_block_are_told_apart() {
    let _area = tests::area(module_path!());
    let root = workspace_root();
    let doc = "- `selfheal/src/main.rs` — the binary; `selfheal/src/no_such_room.rs` moved.\n\
               ```\n`selfheal/src/fenced_away.rs`\n```\n\
               A span over a line break: `selfheal/core/src/\nmissing.rs` is prose, \
               and `ARCHITECTURE.md` is here.\n";
    assert_eq!(
        repo_paths(doc),
        [
            "selfheal/src/main.rs",
            "selfheal/src/no_such_room.rs",
            "ARCHITECTURE.md"
        ]
    );
    assert_eq!(missing_paths(&root, doc), ["selfheal/src/no_such_room.rs"]);
}
