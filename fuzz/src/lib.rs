//! Evidence the fuzz targets hand to selfheal's pure cores (judge, ladder)
//! after parsing outside input: a live agent whose control connection the
//! judge has found dead, so the ladder's every rung is reachable. The
//! core's own test fixtures (`selfheal_core::fixture`).

pub use selfheal_core::fixture::{after_first_step, report, wedged};
