//! The documented install (`./install.sh PREFIX`, README "Install"), into an empty prefix:
//! the `uswap` it installs finds its preload library by itself and pages a program; a
//! relative prefix is the caller's; `--uninstall` removes it all again.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

// Each test binary uses some of the helpers.
#[allow(dead_code)]
mod common;
use common::{compile, run_timed, tmpdir};

#[test]
fn the_documented_install_gives_a_uswap_run_that_pages_a_program() {
    let dir = tmpdir("install");
    let prefix = dir.join("prefix");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The debug build the tests already made: the script's build step has nothing to do.
    let o =
        run_timed(Command::new(repo.join("install.sh")).arg(&prefix).env("PROFILE", "dev"), Duration::from_secs(600));
    assert!(o.status.success(), "install.sh failed:\n{}", String::from_utf8_lossy(&o.stderr));
    for f in [
        "bin/uswap",
        "lib/uswap/libuswap_shim.so",
        "lib/uswap/libuswap_preload.so",
        "lib/libuswap.so",
        "include/uswap.h",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    let prog = compile("grow", &dir, &[]);
    let stats = dir.join("stats.json");
    let mut cmd = Command::new(prefix.join("bin/uswap"));
    cmd.env_remove("USWAP_PRELOAD_LIB")
        .args(["run", "--limit", "16MiB", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .arg("64");
    let o = run_timed(&mut cmd, Duration::from_secs(120));
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("grew to 67108864 bytes"), "{o:?}");
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(v["pswpout"].as_u64().unwrap_or(0) > 0, "nothing paged: {v}");
    // A USWAP_PRELOAD_LIB naming nothing is said as such, not as a missing install.
    let missing = dir.join("nothing.so");
    let mut cmd = Command::new(prefix.join("bin/uswap"));
    cmd.env("USWAP_PRELOAD_LIB", &missing).args(["run", "--", "true"]);
    let o = run_timed(&mut cmd, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("$USWAP_PRELOAD_LIB names"), "{o:?}");
    // A relative prefix is the caller's, and --uninstall removes what was installed.
    let o = run_timed(
        Command::new(repo.join("install.sh")).arg("rel").current_dir(&dir).env("PROFILE", "dev"),
        Duration::from_secs(600),
    );
    assert!(o.status.success() && dir.join("rel/bin/uswap").is_file(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{}/rel/bin", dir.display())), "{o:?}");
    for p in [&prefix, &dir.join("rel")] {
        let o = run_timed(Command::new(repo.join("install.sh")).arg("--uninstall").arg(p), Duration::from_secs(60));
        assert!(o.status.success(), "{o:?}");
        for f in ["bin/uswap", "lib/uswap", "lib/libuswap.so", "include/uswap.h"] {
            assert!(!p.join(f).exists(), "{f} left in {}", p.display());
        }
    }
}
