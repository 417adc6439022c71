//! selfheal's integration tests, built once as one binary: a module per
//! area. Tests of one area run beside each other, never beside another
//! area's ([`tests::area`]): they share this process. Run one area with a
//! libtest filter: `cargo test -p tests --test it -- ebpf::`.

mod actions;
mod alerting;
mod architecture_map;
mod auto;
mod bounds;
mod check;
mod check_walk;
mod cli_errors;
mod compat;
mod config;
mod config_cli;
mod container_incident;
mod container_socket_rung;
mod containers;
mod core_crate;
mod demo;
mod deployment;
mod ebpf;
mod ebpf_limits;
mod evidence;
mod fallback;
mod faults;
mod fd_reuse;
mod foreign_memory;
mod helper;
mod helper_attacks;
mod helper_owners;
mod hooks;
mod identity;
mod image;
mod incident;
mod inspect_cli;
mod install;
mod iter;
mod kubernetes;
mod metrics_endpoint;
mod outputs;
mod privilege;
mod probe;
mod product_binary;
mod reliability_map;
mod scan;
mod scan_sdk;
mod stall;
mod store;
mod watch_capabilities;

/// The roles some tests' child processes play: this binary run again with
/// one of these variables set plays that role and exits. A role is not a
/// test (it is no entry in the test count, and passes nothing in a normal
/// run): it runs before libtest's `main`, from [`PLAY_A_ROLE`].
const ROLES: &[(&str, fn())] = &[
    (helper::PIDNS_CLIENT, helper::pid_namespace_client_mode),
    (
        helper_attacks::NS_ROLE,
        helper_attacks::pid_namespace_attack_roles,
    ),
    (
        helper_attacks::MASTER_ROLE,
        helper_attacks::master_worker_roles,
    ),
    (helper_owners::ROLE, helper_owners::owners_roles),
    (iter::HEADS_ROLE, iter::heads_role),
    (store::CHILD_ENV, store::child_process_entry),
];

/// Runs at start-up, before `main` (an `.init_array` entry, as C
/// constructors are): plays the role whose variable is set, exiting 0, or
/// 101 when the role panicked (as a failed test exits); returns at once
/// when none is.
#[used]
#[unsafe(link_section = ".init_array")]
static PLAY_A_ROLE: extern "C" fn() = play_a_role;

extern "C" fn play_a_role() {
    let Some(&(_, role)) = ROLES
        .iter()
        .find(|(var, _)| std::env::var_os(var).is_some())
    else {
        return;
    };
    let played = std::panic::catch_unwind(role);
    std::process::exit(if played.is_ok() { 0 } else { 101 });
}

/// The tests in `source` whose body does not begin with their area's turn
/// (`let _area = tests::area(module_path!());`).
fn tests_without_a_turn(source: &str) -> Vec<String> {
    let mut missing = Vec::new();
    // An attribute on a line of its own, as rustfmt writes it: the words
    // `#[test]` in a comment or a string are not a test.
    let marks = source.match_indices('\n').map(|(at, _)| at + 1);
    for start in std::iter::once(0).chain(marks) {
        let line = source[start..].lines().next().unwrap_or_default().trim();
        if line != "#[test]" && !line.starts_with("#[tokio::test") {
            continue;
        }
        let rest = &source[start + source[start..].find(']').unwrap_or(0)..];
        let Some(fn_at) = rest.find("fn ") else {
            continue;
        };
        let name: String = rest[fn_at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest[fn_at..].find('{') else {
            continue;
        };
        let body = rest[fn_at + open + 1..].trim_start();
        if !body.starts_with("let _area = tests::area(module_path!());") {
            missing.push(name);
        }
    }
    missing
}

/// Every test of this binary takes its area's turn first, so that no test
/// runs beside another area's (a test without it would).
#[test]
fn every_test_takes_its_areas_turn() {
    let _area = tests::area(module_path!());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("list tests/it").flatten() {
        let path = entry.path();
        // This file's own strings hold `#[test]`; its tests are the ones here.
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("main.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read an area");
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        missing.extend(
            tests_without_a_turn(&text)
                .into_iter()
                .map(|t| format!("{file}: {t}")),
        );
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "tests without their area's turn:\n  {}",
        missing.join("\n  ")
    );
}

/// The network namespaces the tests name literally (`Netns::new("N")`,
/// and a pair's `NetnsPair::new("T")`: `Ta` and `Tb`), each named by one
/// call only: tests of one area run beside each other in one process, and
/// two of the same name collide ("File exists").
fn netns_names(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (call, suffixes) in [
        ("NetnsPair::new(\"", &["a", "b"][..]),
        ("Netns::new(\"", &[""][..]),
    ] {
        for (at, _) in source.match_indices(call) {
            let rest = &source[at + call.len()..];
            let Some(end) = rest.find('"') else {
                continue;
            };
            // `NetnsPair::new(` also ends in `Netns::new(`: count it once.
            if call.starts_with("Netns::") && source[..at].ends_with("Pair") {
                continue;
            }
            out.extend(suffixes.iter().map(|s| format!("{}{s}", &rest[..end])));
        }
    }
    out
}

#[test]
fn every_network_namespace_is_named_by_one_test() {
    let _area = tests::area(module_path!());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("list tests/it").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("main.rs") {
            continue;
        }
        names.extend(netns_names(
            &std::fs::read_to_string(&path).expect("read an area"),
        ));
    }
    assert!(names.len() > 20, "{names:?}");
    names.sort();
    let twice: Vec<&String> = names
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| &w[0])
        .collect();
    assert!(
        twice.is_empty(),
        "network namespaces named twice: {twice:?}"
    );
    assert_eq!(
        netns_names("NetnsPair::new(\"x\"); Netns::new(\"y\"); Netns::new(&format!(\"z\"))"),
        ["xa", "xb", "y"]
    );
}

#[test]
fn a_test_without_its_turn_is_found() {
    let _area = tests::area(module_path!());
    let src = "#[test]\nfn a() {\n    let _area = tests::area(module_path!());\n}\n\
               #[test]\n#[allow(x)]\nfn b() -> Result<(), ()> {\n    let x = 1;\n}\n\
               // a #[test] in a comment\nlet s = \"#[test] fn c() {}\";\n";
    assert_eq!(tests_without_a_turn(src), ["b"]);
}
