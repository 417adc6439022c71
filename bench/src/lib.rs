//! What the benchmarks and the soak share: where the programs they run
//! are, and the open-file limit their agents need.

use std::path::PathBuf;

/// The programs a benchmark runs: `selfheal` (`SELFHEAL_BIN`, or the one
/// beside the benchmark's binary) and the testbed's `recv-peer`.
pub struct Bins {
    pub selfheal: PathBuf,
    pub peer: PathBuf,
}

impl Bins {
    pub fn find() -> Bins {
        let dir = std::env::current_exe()
            .expect("current_exe")
            .parent()
            .expect("dir")
            .to_path_buf();
        Bins {
            selfheal: std::env::var("SELFHEAL_BIN")
                .map_or_else(|_| dir.join("selfheal"), Into::into),
            peer: dir.join("recv-peer"),
        }
    }
}

/// Sets this process's open-file limit (soft and hard) to `n`, for the
/// agents it spawns; needs root to raise the hard limit.
pub fn set_nofile(n: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
