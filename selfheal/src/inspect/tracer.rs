//! The receive tracer: attached for the collection's pids, or why not.

use super::*;

pub(super) fn attach(pids: &[u32], opts: &CollectOptions) -> (Option<Tracer>, EbpfEvidence) {
    let mut ev = EbpfEvidence {
        built_in: ebpf::BUILT_IN,
        attempts: Vec::new(),
        error: None,
        watched_since_ns: None,
        snapshot: None,
    };
    if opts.no_ebpf {
        ev.error = Some(
            opts.no_ebpf_why
                .clone()
                .unwrap_or_else(|| "disabled by --no-ebpf".into()),
        );
        return (None, ev);
    }
    let strategies = if opts.strategies.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        opts.strategies.clone()
    };
    match Tracer::attach(&TracerOptions {
        strategies,
        ..TracerOptions::default()
    }) {
        Ok(mut t) => {
            let owners = crate::helper::access::owner::Owners::new(
                crate::helper::access::owner::DEFAULT_SUBUID.into(),
            );
            for &pid in pids {
                if let Err(e) = t.watch(pid, owners.of_process(pid).owner) {
                    ev.error = Some(ebpf::chain(&e));
                    return (None, ev);
                }
            }
            (Some(t), ev)
        }
        Err(e) => {
            if let ebpf::TracerError::NoStrategy { attempts } = &e {
                ev.attempts = attempts.clone();
            }
            ev.error = Some(ebpf::chain(&e));
            (None, ev)
        }
    }
}
