//! `selfheal install` writes units that run this binary and that systemd
//! accepts (`systemd-analyze verify`), with the helper hardened.

use std::process::Command;

use tests::{selfheal_bin, skip};

#[test]
fn installed_units_pass_systemd_analyze_verify() {
    let dir = std::env::temp_dir().join(format!("selfheal-units-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for scope in ["--user", "--system"] {
        let out = Command::new(selfheal_bin())
            .args(["install", scope, "--dir"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
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
