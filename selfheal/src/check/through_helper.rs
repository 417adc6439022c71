//! The helper's reads as the check's: its tracer's evidence
//! ([`HelperTracer`]) and the reads a check may not make itself, on the
//! connection the check's [`crate::heal::helper::HelperExecutor`] uses.

use crate::heal::helper::SharedClient;
use crate::helper::ClientError;
use crate::inspect::HelperReadError;

/// The helper's tracer as `check`'s eBPF evidence, on the connection the
/// check's executor uses.
pub struct HelperTracer(pub SharedClient);

/// The helper's reads, for a check that may not make them itself: on the
/// check's connection (`iterate` once per check,
/// [`crate::inspect::Collector::passes_from`]; `collect` per agent and
/// `namespaces` per table, [`crate::inspect::Collector::reads_from`]).
struct ThroughHelper(SharedClient);

impl ThroughHelper {
    /// `f` on the connection; its error as the read `what` names it.
    fn call<T>(
        &self,
        what: fn(ClientError) -> HelperReadError,
        f: impl FnOnce(&mut crate::helper::client::HelperClient) -> Result<T, ClientError>,
    ) -> Result<T, HelperReadError> {
        let mut client = self.0.lock().map_err(|_| HelperReadError::Poisoned)?;
        f(&mut client).map_err(what)
    }
}

impl crate::inspect::HelperReads for ThroughHelper {
    fn iterate(
        &mut self,
        pids: &[u32],
    ) -> Result<selfheal_core::protocol::IterateResult, HelperReadError> {
        self.call(HelperReadError::Iterate, |c| c.iterate(pids))
    }

    fn collect(
        &mut self,
        req: &selfheal_core::protocol::CollectRequest,
    ) -> Result<selfheal_core::protocol::CollectResult, HelperReadError> {
        self.call(HelperReadError::Collect, |c| c.collect(req))
    }

    fn namespaces(
        &mut self,
        pids: &[u32],
    ) -> Result<selfheal_core::protocol::NamespacesResult, HelperReadError> {
        self.call(HelperReadError::Namespaces, |c| c.namespaces(pids))
    }
}

impl HelperTracer {
    /// Watches `pids` and reads the tracer's evidence of them, with the
    /// helper's error as it came (a refusal means the helper answered).
    pub fn read(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), ClientError> {
        let mut client = self.0.lock().map_err(|_| ClientError::Broken {
            path: std::path::PathBuf::new(),
            reason: "helper client poisoned".into(),
        })?;
        let watched = client.watch(pids)?;
        let since = watched.watched.iter().map(|w| w.since_ns).max();
        let got = client.ebpf_snapshot_with_gaps(pids)?;
        // The helper answers the pids this user may query; the others are
        // gaps in the evidence, not a reason to lose all of it.
        let mut refused = got.refused;
        refused.extend(watched.refused);
        refused.sort_unstable();
        refused.dedup();
        let mut snapshot = got.snapshot;
        // A gap in the report of the agent whose pid it is.
        snapshot.refused = refused;
        Ok((snapshot, since))
    }
}

impl crate::check::TracerSource for HelperTracer {
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), ClientError> {
        self.read(pids)
    }

    fn passes(&self) -> Option<Box<dyn crate::inspect::HelperReads>> {
        Some(Box::new(ThroughHelper(self.0.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read through the helper that got no answer names the read, then
    /// the client's error, and keeps it as the source.
    #[test]
    fn helper_reads_fail_by_kind_naming_the_read() {
        let timeout = || ClientError::Timeout {
            path: "/run/selfheal/helper.sock".into(),
            timeout: std::time::Duration::from_millis(5),
        };
        let answer = "helper at /run/selfheal/helper.sock did not answer within 5 ms";
        for (e, read) in [
            (
                HelperReadError::Iterate(timeout()),
                "the helper's task iterators",
            ),
            (
                HelperReadError::Collect(timeout()),
                "the helper's collection",
            ),
            (
                HelperReadError::Namespaces(timeout()),
                "the helper's namespace reads",
            ),
        ] {
            assert_eq!(e.to_string(), format!("{read}: {answer}"));
            let source = std::error::Error::source(&e).map(ToString::to_string);
            assert_eq!(source.as_deref(), Some(answer));
        }
        assert_eq!(
            HelperReadError::Poisoned.to_string(),
            "helper client poisoned"
        );
    }
}
