//! A kernel that refuses the task iterators: the collector falls back to
//! procfs, says why in its collection, and the evidence and the judgement
//! are those of procfs read on purpose.
//!
//! `cargo xtask vm-test` runs this last in its VM, after locking the kernel
//! down (`lockdown=confidentiality`, as Secure Boot machines may run: no
//! program may read kernel memory, so the iterators do not load) and
//! removing the pins earlier cases left. A kernel that is not locked down
//! cannot be made to refuse them and let go again, so there it is skipped
//! as VM-only: `cargo xtask test --no-vm` lists it as dropped.
//!
//! Needs root and the eBPF object.

use std::time::Duration;

use tests::{Peer, listener, need_ebpf};

/// What the lockdown LSM says is in force (`[confidentiality]`), if any.
fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let on = text.split_once('[')?.1.split_once(']')?.0;
    Some(on.to_owned())
}

#[test]
fn a_kernel_that_refuses_the_iterators_is_read_by_procfs() {
    let _area = tests::area(module_path!());
    use selfheal_core::judge::Verdict;
    use tests::fixtures::ProviderAgent;
    let name = "fallback::a_kernel_that_refuses_the_iterators_is_read_by_procfs";
    if !need_ebpf(name) {
        return;
    }
    let expected = std::env::var("SELFHEAL_EXPECT_LOCKDOWN").ok();
    let level = lockdown();
    if let Some(want) = &expected {
        assert_eq!(level.as_deref(), Some(want.as_str()), "the VM's lockdown");
    } else if level.as_deref() != Some("confidentiality") {
        tests::skip_as(
            tests::Skip::Vm,
            name,
            "this kernel is not locked down and runs the iterators; `cargo xtask vm-test` \
             runs this in a VM it locks down",
        );
        return;
    }
    let refused = match selfheal::ebpf::iter::load() {
        Ok(_) => panic!("the task iterators loaded under lockdown={level:?}"),
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
