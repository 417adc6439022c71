//! "The core does no I/O" is a fact of Cargo's dependency graph.
//! `selfheal-core`'s whole normal dependency tree (transitive) holds none of
//! the crates that reach the kernel or the network; `selfheal`'s does (so
//! the check itself can fail).

/// Crates that do I/O the core must never reach.
const IO_CRATES: &[&str] = &[
    "aya",
    "netlink-sys",
    "netlink-packet-core",
    "netlink-packet-sock-diag",
    "nix",
    "procfs",
    "reqwest",
    "tokio",
    "libc",
];

/// The names of every crate in `package`'s normal dependency tree.
fn tree(package: &str) -> Vec<String> {
    let out = tests::output_ok(tests::cargo().args([
        "tree",
        "--offline",
        "-p",
        package,
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_core_depends_on_no_crate_that_does_io() {
    let _area = tests::area(module_path!());
    let core = tree("selfheal-core");
    assert!(core.iter().any(|c| c == "selfheal-core"), "{core:?}");
    let found: Vec<&String> = core
        .iter()
        .filter(|c| IO_CRATES.contains(&c.as_str()))
        .collect();
    assert!(found.is_empty(), "selfheal-core reaches {found:?}");
    // The edge does depend on them: the check sees what it looks for.
    let edge = tree("selfheal");
    for c in ["aya", "procfs", "nix", "netlink-sys", "reqwest", "tokio"] {
        assert!(edge.iter().any(|e| e == c), "selfheal lacks {c}: {edge:?}");
    }
    println!(
        "selfheal-core: {} crates in its tree; selfheal: {}",
        core.len(),
        edge.len()
    );
}
