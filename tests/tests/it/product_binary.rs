//! The privileged binary carries no test servers: `selfheal`,
//! which runs as root in the helper, has neither the demo nor the testbed's
//! programs (dispatch server, provider, runners, proxy). They live in
//! `selfheal-testbed`, the testbed crate's binary.

use std::process::Command;

use tests::{selfheal_bin, testbed_bin};

/// The subcommand names `--help` lists (the first word of each line under
/// `Commands:`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn selfheal_help_lists_no_demo_and_no_testbed() {
    let _area = tests::area(module_path!());
    let out = Command::new(selfheal_bin())
        .arg("--help")
        .output()
        .expect("selfheal --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let listed = commands(&help);
    assert!(listed.contains(&"check".to_string()), "{help}");
    for gone in ["demo", "testbed"] {
        assert!(!listed.iter().any(|c| c == gone), "{gone} in {listed:?}");
    }
}

#[test]
fn selfheal_refuses_the_demo_and_the_testbeds_programs_as_unknown_subcommands() {
    let _area = tests::area(module_path!());
    for args in [
        &["demo", "--help"][..],
        &["testbed", "provider", "--help"],
        &["testbed", "dispatch", "--help"],
        &["testbed", "runner", "--help"],
    ] {
        let out = Command::new(selfheal_bin())
            .args(args)
            .output()
            .expect("run selfheal");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains(&format!("unrecognized subcommand '{}'", args[0])),
            "{args:?}: {err}"
        );
    }
}

/// Text that only the testbed's servers and runner hold (the provider's
/// OpenAI and Anthropic event names, the dispatch server's and runner's
/// flags, the namespaces' prefix) is in `selfheal-testbed`, not in
/// `selfheal`.
#[test]
fn the_testbeds_servers_are_compiled_into_selfheal_testbed_not_into_selfheal() {
    let _area = tests::area(module_path!());
    const MARKS: &[&str] = &[
        "chat.completion.chunk",
        "content_block_delta",
        "work-every",
        "provider-path",
        "leak-every",
        "selfheal-tb",
    ];
    let read = |path: std::path::PathBuf| {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let product = read(selfheal_bin());
    let testbed = read(testbed_bin());
    for mark in MARKS {
        assert!(testbed.contains(mark), "selfheal-testbed lacks {mark:?}");
        assert!(!product.contains(mark), "selfheal holds {mark:?}");
    }
}

/// The testbed's HTTP query parser left the product's dependencies
/// (`httparse` stays: the Docker API client reads response heads with it).
#[test]
fn selfheal_no_longer_depends_on_form_urlencoded() {
    let _area = tests::area(module_path!());
    let out = tests::output_ok(tests::cargo().args([
        "metadata",
        "--no-deps",
        "--offline",
        "--format-version",
        "1",
    ]));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let deps = |package: &str| -> Vec<String> {
        meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == package)
            .unwrap_or_else(|| panic!("no package {package}"))["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect()
    };
    let product = deps("selfheal");
    assert!(
        !product.iter().any(|d| d == "form_urlencoded"),
        "{product:?}"
    );
    assert!(
        deps("selfheal-testbed")
            .iter()
            .any(|d| d == "form_urlencoded")
    );
}
