//! The kernel's task iterator from user space: loads the `iter/task`
//! program of the object built from `selfheal-ebpf` once ([`TaskIter::load`]),
//! then each pass ([`TaskIter::threads`]) fills `ITER_TGIDS` with the pids
//! asked for, links the program, reads the iterator's file to its end and
//! parses the records into [`IterThread`]s. No aya type leaves this module.
//!
//! One pass walks every task of the host in the kernel and reports only
//! the threads of the pids asked for. A pid that is gone by then has no
//! threads to report: it yields nothing, and no error.

use std::path::Path;

pub use selfheal_core::ebpf::iter::{IterParseError, IterThread};

use super::layout::LayoutError;

/// Why the task iterator cannot run.
#[derive(Debug, thiserror::Error)]
pub enum IterError {
    /// The binary was built without the eBPF toolchain.
    #[error(
        "eBPF was not built into this binary (build with the eBPF toolchain: `cargo xtask setup`)"
    )]
    NotBuiltIn,
    /// The kernel layout could not be read.
    #[error("cannot read the kernel's struct layout")]
    Layout(#[from] LayoutError),
    /// The kernel's BTF lacks a `task_struct` field the program reads.
    #[error("the task iterator cannot run on this kernel: {reason}")]
    TaskLayout { reason: String },
    /// The object or the program could not be loaded (no iterator support,
    /// refused by the verifier, no permission).
    #[error("cannot load the task iterator: {reason}")]
    Load { reason: String },
    /// `ITER_TGIDS` could not be filled.
    #[error("eBPF map ITER_TGIDS: {reason}")]
    Map { reason: String },
    /// Linking the program or reading the iterator's file failed.
    #[error("cannot run the task iterator: {reason}")]
    Run { reason: String },
    /// The iterator's output is not whole records.
    #[error(transparent)]
    Parse(#[from] IterParseError),
}

#[cfg(selfheal_ebpf)]
pub use self::kernel::TaskIter;

#[cfg(selfheal_ebpf)]
mod kernel {
    use std::{collections::BTreeSet, io::Read as _, path::Path};

    use aya::{
        Btf, Ebpf, EbpfLoader,
        maps::{HashMap, MapData},
        programs::Iter,
    };
    use selfheal_common::MAX_ITER_TGIDS;
    use selfheal_core::ebpf::iter::parse_task_records;

    use super::{IterError, IterThread};
    use crate::ebpf::{
        chain,
        layout::{KernelLayout, LayoutError},
        loader::{OBJECT, condense},
    };

    /// The program in the object.
    const PROGRAM: &str = "iter_task";

    /// The tracer's maps, which the object declares and the iterator never
    /// uses: made as small as the kernel allows.
    const UNUSED_MAPS: [&str; 7] = [
        "WATCHED",
        "IN_RECV",
        "SOCKS",
        "OWNER_OF",
        "OWNER_SOCKS",
        "IN_SEND",
        "COUNTERS",
    ];

    /// The loaded task iterator. Dropping it unloads the program and frees
    /// its map.
    pub struct TaskIter {
        ebpf: Ebpf,
        /// What `ITER_TGIDS` holds now.
        tgids: BTreeSet<u32>,
        /// The last pass's output, kept for its capacity.
        buf: Vec<u8>,
    }

    impl TaskIter {
        /// Loads the object and its `iter/task` program, with the struct
        /// offsets of the kernel whose BTF is at `btf_path`.
        pub fn load(btf_path: &Path) -> Result<Self, IterError> {
            let bytes = std::fs::read(btf_path).map_err(|e| LayoutError::NoBtf {
                path: btf_path.display().to_string(),
                reason: e.to_string(),
            })?;
            let layout = KernelLayout::from_btf_file(btf_path)?;
            let task = layout
                .task
                .clone()
                .map_err(|reason| IterError::TaskLayout { reason })?;
            let btf =
                Btf::parse(&bytes, aya::Endianness::default()).map_err(|e| IterError::Load {
                    reason: format!(
                        "cannot parse kernel BTF {}: {}",
                        btf_path.display(),
                        chain(&e)
                    ),
                })?;
            let mut loader = EbpfLoader::new();
            loader.btf(Some(&btf));
            for map in UNUSED_MAPS {
                loader.map_max_entries(map, 1);
            }
            loader
                .override_global("OFF_TASK_TGID", &task.tgid, true)
                .override_global("OFF_TASK_PID", &task.pid, true)
                .override_global("OFF_TASK_STATE", &task.state, true)
                .override_global("OFF_TASK_EXIT_STATE", &task.exit_state, true)
                .override_global("OFF_TASK_UTIME", &task.utime, true)
                .override_global("OFF_TASK_STIME", &task.stime, true)
                .override_global("OFF_TASK_LAST_ARRIVAL", &task.last_arrival, true)
                .override_global("OFF_REGS_SYSCALL", &layout.regs_syscall, true)
                .override_global("OFF_REGS_ARG0", &layout.regs_arg0, true);
            let mut ebpf = loader
                .load(OBJECT)
                .map_err(|e| IterError::Load { reason: chain(&e) })?;
            let load = |reason: String| IterError::Load { reason };
            let prog: &mut Iter = ebpf
                .program_mut(PROGRAM)
                .ok_or_else(|| load(format!("program {PROGRAM} missing from the object")))?
                .try_into()
                .map_err(|e| load(chain(&e)))?;
            prog.load("task", &btf)
                .map_err(|e| load(condense(&chain(&e))))?;
            Ok(Self {
                ebpf,
                tgids: BTreeSet::new(),
                buf: Vec::new(),
            })
        }

        /// The threads of `tgids`, read in one pass of the iterator, in
        /// the order the kernel walks its tasks. Pids that are gone have
        /// none.
        pub fn threads(&mut self, tgids: &[u32]) -> Result<Vec<IterThread>, IterError> {
            self.ask_for(tgids)?;
            let run = |reason: String| IterError::Run { reason };
            let prog: &mut Iter = self
                .ebpf
                .program_mut(PROGRAM)
                .ok_or_else(|| run(format!("program {PROGRAM} missing from the object")))?
                .try_into()
                .map_err(|e| run(chain(&e)))?;
            let link = prog.attach().map_err(|e| run(chain(&e)))?;
            let link = prog.take_link(link).map_err(|e| run(chain(&e)))?;
            let mut file = link.into_file().map_err(|e| run(chain(&e)))?;
            self.buf.clear();
            file.read_to_end(&mut self.buf)
                .map_err(|e| run(format!("read: {e}")))?;
            let mut threads = parse_task_records(&self.buf)?;
            // A pid whose removal from the map failed is not reported.
            threads.retain(|t| self.tgids.contains(&t.tgid));
            Ok(threads)
        }

        /// Makes `ITER_TGIDS` hold exactly `tgids`.
        fn ask_for(&mut self, tgids: &[u32]) -> Result<(), IterError> {
            let want: BTreeSet<u32> = tgids.iter().copied().collect();
            if want.len() > MAX_ITER_TGIDS as usize {
                return Err(IterError::Map {
                    reason: format!(
                        "{} pids asked for, at most {MAX_ITER_TGIDS} fit",
                        want.len()
                    ),
                });
            }
            let map_err = |e: &dyn std::error::Error| IterError::Map { reason: chain(e) };
            let map = self.ebpf.map_mut("ITER_TGIDS").ok_or(IterError::Map {
                reason: "missing from the object".into(),
            })?;
            let mut map: HashMap<&mut MapData, u32, u8> =
                HashMap::try_from(map).map_err(|e| map_err(&e))?;
            for gone in self.tgids.difference(&want) {
                let _ = map.remove(gone);
            }
            self.tgids.retain(|t| want.contains(t));
            let new: Vec<u32> = want.difference(&self.tgids).copied().collect();
            for tgid in new {
                map.insert(tgid, 1, 0).map_err(|e| map_err(&e))?;
                self.tgids.insert(tgid);
            }
            Ok(())
        }
    }
}

/// Stand-in when eBPF is not built in: loading always fails with
/// [`IterError::NotBuiltIn`].
#[cfg(not(selfheal_ebpf))]
pub struct TaskIter(std::convert::Infallible);

#[cfg(not(selfheal_ebpf))]
impl TaskIter {
    pub fn load(_btf_path: &Path) -> Result<Self, IterError> {
        Err(IterError::NotBuiltIn)
    }
    pub fn threads(&mut self, _tgids: &[u32]) -> Result<Vec<IterThread>, IterError> {
        match self.0 {}
    }
}

/// Loads the task iterator for the running kernel
/// ([`super::layout::VMLINUX_BTF`]).
pub fn load() -> Result<TaskIter, IterError> {
    TaskIter::load(Path::new(super::layout::VMLINUX_BTF))
}
