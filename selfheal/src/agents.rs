//! Agent discovery (being written).
