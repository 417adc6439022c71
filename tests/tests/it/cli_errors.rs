//! Every subcommand's bad input ends the same way: the
//! documented exit code (3 for usage and config errors, 1 for a failure)
//! and the error said once, on one line of stderr that starts
//! `selfheal: `, with control characters escaped. Nothing on stdout.

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStrExt as _,
    process::Command,
};

use tests::{Scratch, selfheal_bin};

/// `selfheal ARGS`: exit code, stdout, stderr.
fn run(args: &[OsString]) -> (i32, String, String) {
    let out = Command::new(selfheal_bin())
        .args(args)
        // Errors only: no log lines from a level set elsewhere.
        .env("RUST_LOG", "error")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .output()
        .expect("run selfheal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn args(list: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
    list.iter().map(|a| a.as_ref().to_os_string()).collect()
}

/// A control character stands in a path and an id below: it must reach
/// stderr escaped.
const ESC: &str = "\u{1b}[31m";

/// Each subcommand's bad input: the code, one line, `selfheal: `, and the
/// words that say what is wrong.
#[test]
fn each_subcommands_bad_input_is_its_documented_code_and_one_line() {
    let _area = tests::area(module_path!());
    let s = Scratch::new("cli-errors");
    let good = s.join("good.toml");
    std::fs::write(&good, "[[agent]]\nname = \"sol\"\nmatch = { pid = 1 }\n").unwrap();
    let bad = s.join("bad.toml");
    std::fs::write(&bad, "[[agent]]\nname = \"sol\"\nmatch = { pdi = 1 }\n").unwrap();
    let missing = s.join(&format!("missing{ESC}.toml"));
    let snaps = s.join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    let sock = s.join("h.sock");
    let policy = s.join(&format!("no{ESC}policy.toml"));
    let units = s.join("units");

    let cases: Vec<(Vec<OsString>, i32, &str)> = vec![
        (
            args(&[&"check", &"--config", &missing]),
            3,
            "cannot read config",
        ),
        (args(&[&"check", &"--config", &bad]), 3, ":3: agent \"sol\""),
        (
            args(&[&"check", &"--config", &good, &"--agent", &"luna"]),
            3,
            "no agent named \"luna\"",
        ),
        (
            args(&[&"watch", &"--config", &missing, &"--count", &"1"]),
            3,
            "cannot read config",
        ),
        (
            args(&[&"watch", &"--config", &good, &"--agent", &"luna"]),
            3,
            "configured: sol",
        ),
        (
            args(&[&"inspect", &"luna", &"--config", &good]),
            3,
            "no agent named \"luna\"",
        ),
        (
            args(&[&"inspect", &"sol", &"--config", &missing]),
            3,
            "cannot read config",
        ),
        (
            args(&[&"inspect", &"--pid", &"4194303", &"--no-ebpf"]),
            1,
            "pid 4194303",
        ),
        (
            args(&[&"config", &"check", &"--config", &bad]),
            3,
            "key `pdi`",
        ),
        (
            args(&[&"config", &"check", &"--config", &missing]),
            3,
            "cannot read config",
        ),
        (
            args(&[&"snapshots", &"show", &format!("x{ESC}y"), &"--dir", &snaps]),
            1,
            // The id quoted once, its escape shown once (not `\\u{1b}`).
            "no snapshot \"x\\u{1b}[31my\"",
        ),
        (
            args(&[
                &"install",
                &"--user",
                &"--bin",
                &"/nonexistent/selfheal",
                &"--dir",
                &units,
            ]),
            1,
            "/nonexistent/selfheal",
        ),
        (
            args(&[
                &"helper",
                &"--no-ebpf",
                &"--socket",
                &sock,
                &"--policy",
                &policy,
            ]),
            3,
            "cannot read policy",
        ),
    ];
    // Every case is run, and every way it is wrong listed.
    let mut wrong = Vec::new();
    for (argv, code, says) in &cases {
        let (got, out, err) = run(argv);
        let shown = format!("{argv:?}: exit {got}, stderr {err:?}");
        let controls = err.trim_end_matches('\n').chars().any(char::is_control);
        for (bad, what) in [
            (got != *code, format!("not exit {code}")),
            (!out.is_empty(), format!("stdout {out:?}")),
            (err.lines().count() != 1, "not one line".to_string()),
            (!err.starts_with("selfheal: "), "not `selfheal: `".into()),
            (!err.contains(says), format!("does not say {says:?}")),
            (controls, "a raw control character".into()),
        ] {
            if bad {
                wrong.push(format!("{what}: {shown}"));
            }
        }
        println!("exit {got}: {}", err.trim_end());
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(!sock.exists(), "the refused helper made no socket");
    assert!(!units.exists(), "the refused install wrote nothing");
}

/// A command-line error is a usage error (3) said the same way: its first
/// line `selfheal: …`, clap's usage hint after it, every control character
/// escaped (clap itself prints a `\r` in a bad value as it is).
#[test]
fn command_line_errors_are_exit_3_and_said_the_same_way() {
    let _area = tests::area(module_path!());
    let cases: [&[&str]; 5] = [
        &["bogus"],
        &["check", "--bogus"],
        &["inspect", "--pid", "1\rX"],
        &["snapshots", "list", "--since", "yester\u{7}day"],
        &["watch", "--interval", "soon"],
    ];
    let mut wrong = Vec::new();
    for argv in cases {
        let (code, out, err) = run(&argv.iter().map(OsString::from).collect::<Vec<_>>());
        let shown = format!("{argv:?}: exit {code}, stderr {err:?}");
        for (bad, what) in [
            (code != 3, "not exit 3"),
            (!out.is_empty(), "stdout"),
            (!err.starts_with("selfheal: "), "not `selfheal: `"),
            (
                err.chars().any(|c| c.is_control() && c != '\n'),
                "a raw control character",
            ),
            (!err.contains("--help"), "no usage hint"),
        ] {
            if bad {
                wrong.push(format!("{what}: {shown}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let (code, out, _) = run(&[OsString::from("--help")]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit codes:\n  0  "), "{out}");
}

/// A file name is bytes: one that is not UTF-8 is shown, not a panic.
#[test]
fn a_path_that_is_not_utf8_is_said_not_a_panic() {
    let _area = tests::area(module_path!());
    let s = Scratch::new("cli-errors-bytes");
    let path = s.0.join(OsStr::from_bytes(b"bad\xff\x1b.toml"));
    let (code, _, err) = run(&args(&[&"config", &"check", &"--config", &path]));
    assert_eq!(code, 3, "{err}");
    assert!(err.starts_with("selfheal: cannot read config"), "{err}");
    assert!(
        !err.contains('\u{1b}') && !err.contains("panicked"),
        "{err}"
    );
}

/// A closed stdout (`selfheal install --user | head -0`) is not an error
/// and no panic: every unit is still written, and the exit is 0 with
/// nothing said.
#[test]
fn a_closed_stdout_is_exit_0_and_every_unit_is_written() {
    let _area = tests::area(module_path!());
    let s = Scratch::new("cli-errors-pipe");
    let units = s.join("units");
    let (read, write) = std::io::pipe().expect("a pipe");
    drop(read);
    let out = Command::new(selfheal_bin())
        .args(["install", "--user", "--dir"])
        .arg(&units)
        .stdout(write)
        .output()
        .expect("run selfheal");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
    for unit in ["selfheal.service", "selfheal.timer"] {
        assert!(units.join(unit).exists(), "{unit} not written");
    }
}
