//! A kernel that cannot run the task iterators: the collector falls back
//! to procfs, says why in its collection, and the evidence and the
//! judgement are those of procfs read on purpose.
//!
//! `cargo xtask vm-test` runs this last in its VM, after hiding the
//! kernel's BTF (an empty file bound over `/sys/kernel/btf/vmlinux`, as a
//! kernel built without `CONFIG_DEBUG_INFO_BTF` has none: the programs'
//! offsets cannot be read, so they are not loaded) and removing the pins
//! earlier cases left. On a host whose BTF is there, the test is skipped
//! as VM-only (this process's iterators may already be open):
//! `cargo xtask test --no-vm` lists it as dropped.
//!
//! Needs root and the eBPF object.

use std::time::Duration;

use tests::{Peer, listener, need_ebpf};

/// Whether the kernel's BTF reads as empty here (hidden, or never built).
fn no_btf() -> bool {
    use std::io::Read as _;
    let mut byte = [0u8; 1];
    std::fs::File::open(selfheal::ebpf::layout::VMLINUX_BTF)
        .and_then(|mut f| f.read(&mut byte))
        .map_or(true, |n| n == 0)
}

#[test]
fn a_kernel_that_cannot_run_the_iterators_is_read_by_procfs() {
    let _area = tests::area(module_path!());
    use selfheal_core::judge::Verdict;
    use tests::fixtures::ProviderAgent;
    let name = "fallback::a_kernel_that_cannot_run_the_iterators_is_read_by_procfs";
    if !need_ebpf(name) {
        return;
    }
    let hidden = no_btf();
    if std::env::var("SELFHEAL_EXPECT_NO_BTF").is_ok() {
        assert!(hidden, "the VM's BTF is not hidden");
    } else if !hidden {
        tests::skip_as(
            tests::Skip::Vm,
            name,
            "this kernel has its BTF and runs the iterators; `cargo xtask vm-test` runs this \
             in a VM that hides it",
        );
        return;
    }
    let refused = match selfheal::ebpf::iter::load() {
        Ok(_) => panic!("the task iterators loaded without the kernel's BTF"),
        Err(e) => selfheal::ebpf::chain(&e),
    };
    eprintln!("{name}: loading the iterators: {refused}");

    let l = listener();
    let provider = l.local_addr().unwrap();
    let addr = provider.to_string();
    let fat = Peer::recv_peer(&["fat", &addr, "4", "3"]);
    fat.expect("ready ", Duration::from_secs(10));
    let pids = vec![fat.pid()];
    let agent = ProviderAgent::new("locked", fat.pid(), provider, pids.clone(), pids.clone());
    // Every thread asleep in its receive, and silent past suspect_after.
    agent.settle();
    let fallen = agent.collect(None);
    let on_purpose = agent.collect(Some("the procfs side of the comparison"));

    let c = &fallen.collection;
    assert_eq!((c.iterators, c.procfs), (0, 1), "{c:?}");
    assert!(
        c.why_procfs
            .iter()
            .any(|w| w.contains("the kernel's task iterators") && w.contains(&refused)),
        "the collection does not say the kernel refused the iterators: {c:?}"
    );
    assert_eq!(fallen.gone, on_purpose.gone);
    assert_eq!(fallen.processes.len(), 1);
    assert_eq!(
        tests::steady(&fallen.processes[0]),
        tests::steady(&on_purpose.processes[0]),
        "fallen back (left) against procfs on purpose (right)"
    );
    let receiving = fallen.processes[0]
        .threads
        .iter()
        .filter(|t| t.recv.is_some())
        .count();
    assert!(receiving >= 4, "{receiving} threads seen in a receive");

    let (v, codes) = agent.verdict(&fallen);
    assert_ne!(v, Verdict::Healthy, "{codes:?}");
    assert_eq!((v, codes), agent.verdict(&on_purpose));
}
