//! selfheal's integration tests, built once as one binary: a module per
//! area. Tests of one area run beside each other, never beside another
//! area's ([`tests::area`]): they share this process. Run one area with a
//! libtest filter: `cargo test -p tests --test it -- ebpf::`.

mod actions;
mod alerting;
mod architecture_map;
mod bounds;
mod check;
mod cli_errors;
mod compat;
mod config;
mod config_cli;
mod container_incident;
mod container_socket_rung;
mod containers;
mod core_crate;
mod demo;
mod deployment;
mod ebpf;
mod ebpf_limits;
mod evidence;
mod faults;
mod fd_reuse;
mod foreign_memory;
mod helper;
mod helper_attacks;
mod helper_owners;
mod identity;
mod image;
mod incident;
mod inspect_cli;
mod install;
mod kubernetes;
mod metrics_endpoint;
mod outputs;
mod privilege;
mod probe;
mod product_binary;
mod store;
mod watch_capabilities;
