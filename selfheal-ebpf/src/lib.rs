//! Empty on purpose: `selfheal` build-depends on this crate so that cargo
//! rebuilds the eBPF object when it changes. The programs are in `main.rs`.
#![no_std]
