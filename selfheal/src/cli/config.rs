//! `selfheal config` (being written).
