//! The sanitizer runtimes that `uswap run` put before this library in `LD_PRELOAD` for the
//! program it started (a program built with `-fsanitize=address` aborts unless its runtime
//! is first; `uswap-cli`'s `run::sanitizer`), taken out of this process's environment again
//! at start-up: they were that program's own, and its children (a shell, `ls`) would
//! otherwise load a sanitizer's runtime they never linked, and run outside the budget.
//!
//! From the constructor only (it allocates and changes the environment, before the program
//! has threads). Locking: none.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// Names the entries `uswap run` added (`:`-separated), as `uswap-cli` sets it.
const ENV_ADDED: &str = "USWAP_SANITIZER_PRELOAD";

/// Takes the added entries (the first occurrence of each) out of `LD_PRELOAD`, and the
/// variable that names them.
pub fn restore() {
    let Some(added) = crate::first_stage::var_os(ENV_ADDED) else { return };
    std::env::remove_var(ENV_ADDED);
    let Some(preload) = std::env::var_os("LD_PRELOAD") else { return };
    let mut entries: Vec<&[u8]> = crate::escape::preload_entries(preload.as_bytes()).collect();
    for a in crate::escape::preload_entries(added.as_bytes()) {
        if let Some(i) = entries.iter().position(|e| *e == a) {
            entries.remove(i);
        }
    }
    std::env::set_var("LD_PRELOAD", OsString::from_vec(entries.join(&b':')));
}
