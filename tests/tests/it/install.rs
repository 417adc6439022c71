//! `selfheal install` writes units that run this binary and that systemd
//! accepts (`systemd-analyze verify`), with the helper hardened.

use std::process::Command;

use tests::{selfheal_bin, skip};

#[test]
fn installed_units_pass_systemd_analyze_verify() {
    let _area = tests::area(module_path!());
    let dir = std::env::temp_dir().join(format!("selfheal-units-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for scope in [&["--user"][..], &["--user", "--watch"], &["--system"]] {
        let out = tests::output_ok(
            Command::new(selfheal_bin())
                .arg("install")
                .args(scope)
                .arg("--dir")
                .arg(&dir),
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("wrote") && said.contains("next: systemctl"),
            "{said}"
        );
    }
    let bin = selfheal_bin().canonicalize().unwrap();
    let service = std::fs::read_to_string(dir.join("selfheal-helper.service")).unwrap();
    assert!(
        service.contains(&format!("ExecStart={} helper", bin.display())),
        "{service}"
    );
    for line in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "RestrictAddressFamilies=AF_UNIX AF_NETLINK",
        "SystemCallArchitectures=native",
        "CapabilityBoundingSet=CAP_BPF",
    ] {
        assert!(service.contains(line), "helper unit lacks {line}");
    }
    let timer = std::fs::read_to_string(dir.join("selfheal.service")).unwrap();
    assert!(timer.contains(&format!("ExecStart={} check", bin.display())));
    let watch = std::fs::read_to_string(dir.join("selfheal-watch.service")).unwrap();
    assert!(
        watch.contains(&format!("ExecStart={} watch --interval 5s", bin.display())),
        "{watch}"
    );
    // `--watch` is the user's alternative to the timer, nothing else.
    let out = Command::new(selfheal_bin())
        .args(["install", "--system", "--watch", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot be used with"),
        "install --system --watch: {err}"
    );

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        skip(
            "systemd_analyze",
            "systemd-analyze is not installed (cargo xtask setup installs it)",
        );
    } else {
        let units: Vec<_> = [
            "selfheal.service",
            "selfheal.timer",
            "selfheal-watch.service",
            "selfheal-helper.socket",
            "selfheal-helper.service",
        ]
        .iter()
        .map(|u| dir.join(u))
        .collect();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .args(&units)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && !text.contains("Unknown"),
            "systemd-analyze verify: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn install_refuses_a_missing_binary() {
    let _area = tests::area(module_path!());
    let out = Command::new(selfheal_bin())
        .args([
            "install",
            "--user",
            "--bin",
            "/nonexistent/selfheal",
            "--dir",
            "/tmp",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/selfheal"));
}

/// `install --system` writes a root unit only for a binary that
/// only root can change (trust.rs's rule): one writable by others, or in a
/// directory another user owns, is refused, saying what to do.
#[test]
fn install_system_refuses_a_binary_others_could_write() {
    let _area = tests::area(module_path!());
    use std::os::unix::fs::PermissionsExt as _;
    if !tests::need_root("install_untrusted_bin") {
        return;
    }
    let scratch = tests::Scratch::new("install-bin");
    let units = scratch.join("units");
    let install = |bin: &std::path::Path| {
        Command::new(selfheal_bin())
            .args(["install", "--system", "--bin"])
            .arg(bin)
            .arg("--dir")
            .arg(&units)
            .output()
            .unwrap()
    };
    let bin = scratch.join("selfheal");
    std::fs::copy(selfheal_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = install(&bin);
    let err = String::from_utf8_lossy(&out.stderr);
    println!("world-writable binary: {err}");
    assert!(!out.status.success(), "a world-writable binary: {err}");
    assert!(
        err.contains("writable by group or others") && err.contains("install -o root"),
        "{err}"
    );
    assert!(!units.join("selfheal-helper.service").exists());

    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobodys = scratch.join("nobodys");
    std::fs::create_dir(&nobodys).unwrap();
    let theirs = nobodys.join("selfheal");
    std::fs::copy(&bin, &theirs).unwrap();
    std::os::unix::fs::chown(&nobodys, Some(65534), Some(65534)).unwrap();
    let out = install(&theirs);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "in nobody's directory: {err}");
    assert!(err.contains("owned by uid 65534"), "{err}");

    let out = install(&bin);
    assert!(
        out.status.success(),
        "root's, 0755: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(units.join("selfheal-helper.service").exists());
}

/// The exposure score `systemd-analyze security --offline=yes` gives the
/// shipped helper unit, 2.8 (an unhardened unit scores 5.6).
const HELPER_UNIT_EXPOSURE: f64 = 2.8;

/// The helper unit's hardening does not regress: its exposure
/// score stays at or below [`HELPER_UNIT_EXPOSURE`], and the settings the
/// audit found missing are there.
#[test]
fn the_helper_unit_exposure_does_not_regress() {
    let _area = tests::area(module_path!());
    let service = include_str!("../../../dist/systemd/selfheal-helper.service");
    for line in [
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "PrivateDevices=yes",
        "RestrictNamespaces=net",
        "SystemCallFilter=@system-service",
    ] {
        assert!(service.contains(line), "helper unit lacks {line}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        skip(
            "helper_unit_exposure",
            "systemd-analyze is not installed (cargo xtask setup installs it: package systemd)",
        );
        return;
    }
    let scratch = tests::Scratch::new("unit-exposure");
    let unit = scratch.join("selfheal-helper.service");
    std::fs::write(&unit, service.replace("@BIN@", "/usr/local/bin/selfheal")).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let score: f64 = text
        .lines()
        .find_map(|l| {
            l.split_once("Overall exposure level for")?
                .1
                .split_once(':')
        })
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in: {text}"));
    println!("systemd-analyze security --offline=yes selfheal-helper.service: {score}");
    assert!(
        score <= HELPER_UNIT_EXPOSURE,
        "exposure {score} regressed above {HELPER_UNIT_EXPOSURE}: {text}"
    );
}
