//! The library's layers, checked: each top-level module has a rank, and a
//! module's code may name (`crate::x`) only modules of a lower rank. So the
//! modules form layers with no import cycle, and a newcomer can tell from
//! the table below what a module may lean on. Comments, `#[cfg(test)]`
//! code and a module's `tests.rs` (declared `#[cfg(test)] mod tests;`)
//! are not counted; the command line (`src/cli`, in the binary) sits
//! above all of them. The lowest layer, `sys`, is the one seam to the
//! system: no other file has an `unsafe` block or a `/proc` path.

use std::{collections::BTreeMap, path::Path};

/// Every top-level module of the library and its rank, lowest first.
const LAYERS: &[(&str, u8)] = &[
    // The one seam to the system: it names nothing else of the crate.
    ("sys", 0),
    // The things every layer uses.
    ("trust", 1),
    ("metrics_endpoint", 1),
    // The config's I/O, the files selfheal keeps, and the collectors'
    // first readers.
    ("config", 2),
    ("fs", 2),
    ("proc", 2),
    // Probes, the tracer, the privileged acts, the state file.
    ("probe", 3),
    ("ebpf", 3),
    ("actions", 3),
    ("store", 3),
    // What needs the acts: runtimes (their restart rung), the proof's
    // keepalive, the snapshot log, the helper (its server, its client, and
    // who may do what through it: `helper::access`).
    ("runtime", 4),
    ("prove", 4),
    ("snapshots", 4),
    ("helper", 4),
    // Discovery and collection (`inspect`: the collector, its per-process
    // readers, its sockets and its tracer, each a room of its own).
    ("agents", 5),
    ("inspect", 5),
    // The census, who carries out an act, and the check pipeline.
    ("scan", 6),
    // Who carries out an act: this process, or the helper for it.
    ("heal", 6),
    ("check", 7),
];

/// The modules `code` names as `crate::x`, in `use crate::{x, y::z}`
/// groups too.
fn named_modules(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: depth-1 segments before `::`,
            // `,` or `}`.
            let mut depth = 1;
            let mut word = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => at_start = true,
                    c if depth == 1 && at_start && (c.is_alphanumeric() || c == '_') => {
                        word.push(c)
                    }
                    _ => {
                        if !word.is_empty() {
                            found.push(std::mem::take(&mut word));
                            at_start = false;
                        }
                    }
                }
            }
            if !word.is_empty() {
                found.push(word);
            }
        } else {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !word.is_empty() {
                found.push(word);
            }
        }
    }
    found
}

/// Whether `file` is a test module's own file (`tests.rs`, which its
/// parent declares `#[cfg(test)] mod tests;`): all of it is test code.
fn is_test_file(file: &Path) -> bool {
    file.file_name().is_some_and(|n| n == "tests.rs")
}

/// A file's code without comments and without its `#[cfg(test)]` part.
fn code_of(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every edge from a module to one of equal or higher rank, as
/// `from -> to (file)`; and every module missing from [`LAYERS`].
fn upward_edges(src: &Path) -> Vec<String> {
    let rank: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut bad = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file);
        let first = rel
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .unwrap_or_default();
        if matches!(first.as_str(), "cli" | "main" | "lib" | "layers") || is_test_file(rel) {
            continue;
        }
        let Some(&from) = rank.get(first.as_str()) else {
            bad.push(format!("{first}: not in LAYERS (give it a rank)"));
            continue;
        };
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for to in named_modules(&code_of(&text)) {
            if to == first {
                continue;
            }
            match rank.get(to.as_str()) {
                Some(&r) if r < from => {}
                Some(&r) => bad.push(format!(
                    "{first} (rank {from}) -> {to} (rank {r}) in {}",
                    rel.display()
                )),
                None => {} // a macro or an item at the crate root
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// Raw system access a file's code may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Raw {
    /// The `unsafe` keyword.
    Unsafe,
    /// A string literal starting with `/proc`.
    ProcPath,
}

/// What raw system access `code` has.
fn raw_access(code: &str) -> Vec<Raw> {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let has_unsafe = code.match_indices("unsafe").any(|(i, _)| {
        !code[..i].chars().next_back().is_some_and(word)
            && !code[i + "unsafe".len()..].chars().next().is_some_and(word)
    });
    let mut found = Vec::new();
    if has_unsafe {
        found.push(Raw::Unsafe);
    }
    if code.contains("\"/proc") {
        found.push(Raw::ProcPath);
    }
    found
}

/// Every `(file, raw access)` of `src` outside `sys/`, files relative to
/// `src`.
fn raw_outside_sys(src: &Path) -> Vec<(String, Raw)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file);
        if rel.starts_with("sys") || is_test_file(rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for raw in raw_access(&code_of(&text)) {
            out.push((rel.to_string_lossy().into_owned(), raw));
        }
    }
    out
}

/// The seam holds: no file outside `sys/` has an `unsafe` block or a
/// `/proc` path (comments and `#[cfg(test)]` code not counted), with no
/// exception.
#[test]
fn raw_system_access_is_in_sys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad: Vec<String> = raw_outside_sys(&src)
        .iter()
        .map(|(f, r)| format!("{f}: {r:?}"))
        .collect();
    assert!(
        bad.is_empty(),
        "raw system access outside sys (move it into selfheal::sys):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn raw_access_outside_sys_is_found() {
    let dir = std::env::temp_dir().join(format!("selfheal-raw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sys")).expect("temp dir");
    std::fs::write(dir.join("sys/pidfd.rs"), "let r = unsafe { f() };\n").expect("write");
    std::fs::write(dir.join("proc.rs"), "let p = \"/proc/self/stat\";\n").expect("write");
    let found = raw_outside_sys(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found, [("proc.rs".to_string(), Raw::ProcPath)]);
}

#[test]
fn raw_access_is_found_in_code_only() {
    assert_eq!(
        raw_access("let n = unsafe { f() };\nlet p = \"/proc/1/stat\";"),
        [Raw::Unsafe, Raw::ProcPath]
    );
    assert_eq!(
        raw_access("#[deny(unsafe_code)]\nlet p = \"/sys/proc\";"),
        []
    );
    assert_eq!(
        raw_access(&code_of("// unsafe \"/proc\n#[cfg(test)]\nunsafe {}")),
        []
    );
}

#[test]
fn no_module_names_one_of_its_rank_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = upward_edges(&src);
    assert!(
        bad.is_empty(),
        "upward or sideways imports (each is a possible cycle):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn every_module_of_the_library_has_a_rank_and_every_rank_a_module() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read lib.rs");
    let rank: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|line| {
            line.strip_prefix("pub mod ")
                .and_then(|l| l.strip_suffix(';'))
        })
        .collect();
    for name in &modules {
        assert!(
            rank.contains_key(name),
            "module {name} has no rank in LAYERS"
        );
    }
    for (name, _) in LAYERS {
        assert!(
            modules.contains(name),
            "LAYERS ranks {name}, which lib.rs does not declare"
        );
    }
}

#[test]
fn the_reader_finds_plain_and_grouped_paths() {
    let code = "use crate::{\n    fs::{self, x::Y},\n    trust::euid,\n    proc,\n};\nlet a = crate::clock::now();";
    assert_eq!(named_modules(code), ["fs", "trust", "proc", "clock"]);
    assert_eq!(code_of("a\n// crate::x\n#[cfg(test)]\ncrate::y"), "a");
}

#[test]
fn an_upward_edge_is_found() {
    let dir = std::env::temp_dir().join(format!("selfheal-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("trust.rs"), "use crate::check::Outcome;\n").expect("write");
    std::fs::write(dir.join("store.rs"), "use crate::{fs::x, trust};\n").expect("write");
    // A test module's own file is test code.
    std::fs::create_dir_all(dir.join("fs")).expect("temp dir");
    std::fs::write(dir.join("fs/tests.rs"), "use crate::check::Outcome;\n").expect("write");
    let bad = upward_edges(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(bad, ["trust (rank 1) -> check (rank 7) in trust.rs"]);
}
