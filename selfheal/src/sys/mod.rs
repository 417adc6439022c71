//! The one seam to the system. Every raw system call (`unsafe` in this
//! library) and every `/proc` path is here, so a newcomer finds all raw
//! system access in one place, and a unit test holds it there
//! (`layers.rs`): process handles ([`pidfd`]), network namespaces
//! ([`netns`]), reading another process's memory ([`memread`]), the clock
//! ages are measured with ([`clock`]), and this process's credentials
//! ([`creds`]). This module names nothing else of the crate.

pub mod activation;
pub mod clock;
pub mod creds;
pub mod fs;
pub mod memread;
pub mod netns;
pub mod ns;
pub mod pidfd;
pub mod poll;
pub mod procfs;
pub mod signal;
pub mod socket;
