//! What every test of the uswap workspace shares, whichever crate it is in (the engine's
//! unit tests, and the integration tests of the engine, the command and the C library):
//! the one way a test says that it, or a part of it, could not run here.
//!
//! The Python package's tests (`uswap-py/tests`) follow the same rule in their own language
//! (`skip` in `test_uswap.py`): the same line on stderr, and the same variable.

/// The variable that turns a skip into a failure. `.ci/run` sets it: CI installs every
/// prerequisite, so a test that would skip there has found something missing.
pub const NO_SKIP_VAR: &str = "USWAP_TEST_NO_SKIP";

/// Says that a test, or part of one, could not run here and why:
/// `SKIPPED (test name): why` on the process's stderr itself, which `cargo test` does not
/// capture (it captures the print macros only), so a reader of a local run sees every skip.
/// With [`NO_SKIP_VAR`] set, a skip fails the test instead.
pub fn skipped(why: &str) {
    if std::env::var_os(NO_SKIP_VAR).is_some() {
        panic!("SKIPPED where no test may skip ({NO_SKIP_VAR}): {why}");
    }
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED ({name}): {why}");
}
