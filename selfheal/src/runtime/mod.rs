//! Containers and pods: which container a process is in (its cgroup path,
//! [`selfheal_core::cgroup`]), and what its runtime calls it (names, images, labels, pod
//! and namespace, read from the runtimes, [`Inventory::read`]).
//!
//! Sources, each read-only and bounded in time:
//!
//! - Docker's Engine API on its unix socket (`DOCKER_HOST=unix://…`, else
//!   `/var/run/docker.sock`) and Podman's compatible API
//!   (`CONTAINER_HOST=unix://…`, else `/run/podman/podman.sock`, or for a
//!   user other than root `$XDG_RUNTIME_DIR/podman/podman.sock`): one
//!   `GET /containers/json` each ([`docker`]);
//! - containerd: the OCI bundle of each task (`config.json` under
//!   `SELFHEAL_CONTAINERD_STATE`, else `/run/containerd`), whose annotations
//!   carry the CRI's `io.kubernetes.cri.*` identity ([`bundle`]).
//!
//! A pod is only what the runtime itself wrote, and only where its uid is
//! the pod of the container's own cgroup ([`Inventory::identity`]).
//!
//! Architecture invariant: a runtime that is absent, hangs, refuses or
//! answers garbage is a gap in words, never an error or a wait past
//! [`Sources::timeout`]; the cgroup alone still gives the container id.
//!
//! Its rooms: [`sources`] (where the runtimes are), [`inventory`] (what
//! they said, and the identities and gaps made of it), [`docker`] and
//! [`bundle`] (the two kinds of source), [`restart`] (the runtime restart
//! rung).

pub mod bundle;
pub mod docker;
pub mod inventory;
pub mod restart;
pub mod sources;

pub use self::{
    inventory::{Inventory, SourceError},
    sources::{DEFAULT_TIMEOUT, Sources},
};

#[cfg(test)]
mod tests;
