//! Set-ups that many areas share: where a test's `selfheal` commands keep
//! their state, snapshots, metrics file and helper socket ([`Places`]), and
//! the `selfheal check --json` command on them ([`check_cmd`]).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

/// Where one test's `selfheal` commands keep what they write, and which
/// helper socket they ask: the `--state-dir`, `--snapshot-dir`,
/// `--metrics-file` and `--helper` arguments, in that order.
#[derive(Clone, Debug)]
pub struct Places {
    pub state: PathBuf,
    pub snapshots: PathBuf,
    pub metrics: Option<PathBuf>,
    pub helper: Option<PathBuf>,
}

impl Places {
    /// `DIR/state` and `DIR/snapshots`; no metrics file, no helper named.
    pub fn under(dir: impl AsRef<Path>) -> Places {
        let dir = dir.as_ref();
        Places {
            state: dir.join("state"),
            snapshots: dir.join("snapshots"),
            metrics: None,
            helper: None,
        }
    }

    /// `DIR/state`, `DIR/snaps` and the helper socket `DIR/no-helper.sock`,
    /// where no helper listens: a check on its own, never whatever helper
    /// runs on the machine.
    pub fn without_helper(dir: impl AsRef<Path>) -> Places {
        let dir = dir.as_ref();
        Places::under(dir)
            .snapshots(dir.join("snaps"))
            .helper(dir.join("no-helper.sock"))
    }

    /// The snapshot directory `dir` instead.
    #[must_use]
    pub fn snapshots(mut self, dir: impl Into<PathBuf>) -> Places {
        self.snapshots = dir.into();
        self
    }

    /// The metrics file `file` (`--metrics-file`).
    #[must_use]
    pub fn metrics(mut self, file: impl Into<PathBuf>) -> Places {
        self.metrics = Some(file.into());
        self
    }

    /// The helper socket `socket` (`--helper`).
    #[must_use]
    pub fn helper(mut self, socket: impl Into<PathBuf>) -> Places {
        self.helper = Some(socket.into());
        self
    }

    /// `--state-dir S --snapshot-dir P [--metrics-file M] [--helper H]`.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--state-dir".into(),
            self.state.clone().into(),
            "--snapshot-dir".into(),
            self.snapshots.clone().into(),
        ];
        if let Some(m) = &self.metrics {
            a.extend(["--metrics-file".into(), m.clone().into()]);
        }
        if let Some(h) = &self.helper {
            a.extend(["--helper".into(), h.clone().into()]);
        }
        a
    }
}

/// `selfheal check --json --config CONFIG` with `places`' arguments.
pub fn check_cmd(config: &Path, places: &Places) -> Command {
    let mut cmd = Command::new(crate::selfheal_bin());
    cmd.args(["check", "--json", "--config"])
        .arg(config)
        .args(places.args());
    cmd
}
