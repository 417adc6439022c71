//! What `check` reads of the process table (`agents::for_check`: only what
//! its rules need), seen from outside: a check run by an unprivileged user.

use std::time::Duration;

use tests::{Scratch, as_uid, fixtures::Places, need_root, run_check_at};

const NOBODY: u32 = 65534;

/// A unit rule checked by an unprivileged user, whose unit's cgroup lists
/// root's process: the check finds it (in the unit's `cgroup.procs`) and,
/// as a check that reads every process does, is refused its fds and says
/// so as a gap naming it; nothing else is said of it.
#[test]
fn a_users_unit_check_finds_roots_process_and_is_refused_its_fds() {
    let _area = tests::area(module_path!());
    if !need_root("check_walk_unit_as_user") {
        return;
    }
    // Root's sleeper, in a unit's cgroup made for it.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let unit = format!("selfheal-walk-user-{}.service", std::process::id());
    let v2 = tests::runtimes::cgroup2_root().expect("a cgroup v2 hierarchy");
    let cgroup = v2.join(&unit);
    let moved = std::fs::create_dir(&cgroup)
        .and_then(|()| std::fs::write(cgroup.join("cgroup.procs"), sleeper.id().to_string()));
    let dir = Scratch::new("check-walk-unit");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!("[[agent]]\nname = \"u\"\nmatch = {{ unit = \"{unit}\" }}\n"),
    )
    .expect("config");
    for d in ["state", "snaps"] {
        std::fs::create_dir_all(dir.join(d)).expect("dir");
        std::os::unix::fs::chown(dir.join(d), Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    // Built (by cargo, as root) before the user runs it.
    tests::selfheal_bin();
    let run = moved.is_ok().then(|| {
        as_uid(NOBODY, || {
            run_check_at(&config, &Places::without_helper(&dir.0), &[])
        })
    });
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // Empty once the sleeper is reaped.
    let removed = tests::wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        std::fs::remove_dir(&cgroup).ok()
    });
    moved.expect("move the sleeper into the unit");
    let run = run.expect("the check ran");
    let u = run.agent("u");
    let refused = format!("pid {}: cannot list fds: EACCES", sleeper.id());
    assert!(
        u["gaps"].as_array().is_some_and(|g| g
            .iter()
            .any(|g| g.as_str().is_some_and(|g| g.starts_with(&refused)))),
        "{refused} in the gaps: {}",
        run.stdout
    );
    assert_eq!(u["verdict"], "healthy", "{}", run.stdout);
    assert!(removed.is_some(), "{} left behind", cgroup.display());
}
