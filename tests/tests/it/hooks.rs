//! The helper as it ships attaches no hook that runs while nobody asks:
//! it holds the pinned task iterators alone, and the receive tracer's
//! programs only when started with `--tracer`. A check through it says in
//! its gaps why no receive was timed, and counts the helper up.
//!
//! Needs root, the eBPF object and the selfheal binary (so it is not among
//! the `iter::` tests `cargo xtask vm-test` runs in a VM).

use tests::need_ebpf;

/// `selfheal helper` started as it ships holds no BPF program but the
/// pinned task iterators, which run only when a check reads them: no hook
/// runs on the host's context switches or socket reads and writes. Its
/// `hello` says the tracer is off and how to attach it; started with
/// `--tracer` it does hold the tracer's programs (what this test would see
/// if the default attached them). A check through the shipped helper
/// counts it up in the metrics and says in its gaps why no receive was
/// timed by the tracer.
#[test]
fn the_shipped_helper_attaches_no_hook() {
    let _area = tests::area(module_path!());
    use tests::fixtures::{Places, Procs, wait_answering};
    if !need_ebpf("hooks::the_shipped_helper_attaches_no_hook") {
        return;
    }
    let dir = tests::Scratch::new("hooks-shipped-helper");
    let mut procs = Procs::default();
    let mut start = |name: &str, extra: &[&str]| {
        let sock = dir.join(name);
        let mut cmd = std::process::Command::new(tests::selfheal_bin());
        cmd.arg("helper")
            .args(extra)
            .arg("--socket")
            .arg(&sock)
            .stderr(std::process::Stdio::null());
        let pid = procs.spawn_as(0, cmd);
        wait_answering(&sock);
        (sock, pid)
    };
    let hooks_of = |pid: u32| {
        let pinned = tests::pinned_iterator_ids();
        let (progs, _maps) = tests::bpf_ids_held_by(pid);
        progs.difference(&pinned).copied().collect::<Vec<u32>>()
    };
    let (shipped, shipped_pid) = start("shipped.sock", &[]);
    let (traced, traced_pid) = start("traced.sock", &["--tracer"]);

    let hello = |sock: &std::path::Path| {
        selfheal::helper::HelperClient::connect(sock)
            .expect("connect")
            .hello()
            .expect("hello")
    };
    let h = hello(&shipped);
    assert_eq!(h.ebpf.strategy, None, "{:?}", h.ebpf);
    let why = h.ebpf.error.clone().unwrap_or_default();
    assert!(why.contains("--tracer"), "{why}");
    assert_eq!(
        hooks_of(shipped_pid),
        Vec::<u32>::new(),
        "the shipped helper holds BPF programs beyond the pinned iterators"
    );
    let t = hello(&traced);
    assert!(t.ebpf.strategy.is_some(), "{:?}", t.ebpf);
    assert!(
        !hooks_of(traced_pid).is_empty(),
        "a helper with --tracer holds the tracer's programs"
    );

    let config = dir.join("config.toml");
    tests::own_agent_config(&config);
    let metrics = dir.join("selfheal.prom");
    let places = Places::under(dir.join("check"))
        .metrics(&metrics)
        .helper(&shipped);
    let out = tests::fixtures::check_cmd(&config, &places)
        .output()
        .expect("run check");
    let line: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(line["verdict"], "healthy", "{line:#}");
    let gaps = line["gaps"].to_string();
    assert!(gaps.contains("the receive tracer is off"), "{gaps}");
    let text = std::fs::read_to_string(&metrics).expect("metrics written");
    assert!(text.contains("selfheal_helper_up 1\n"), "{text}");
    // The task iterators read it (root links the pins): eBPF evidence,
    // so the fleet's evidence alert does not fire for the shipped helper.
    assert!(text.contains("selfheal_ebpf_up 1\n"), "{text}");
    assert!(
        text.contains("selfheal_ebpf_strategy_info{strategy=\"iterators\""),
        "{text}"
    );
}
