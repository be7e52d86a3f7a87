//! Drives the real `uswap` binary.

use std::process::Command;

fn uswap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uswap"))
}

#[test]
fn bench_writes_the_json_keys_and_verifies_every_access() {
    for mode in ["thread", "signal"] {
        let dir = std::env::temp_dir().join(format!("uswap-cli-{}-{mode}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("out.json");
        let out = uswap()
            .args(["bench", "--wss", "32MiB", "--limit", "8MiB", "--accesses", "20000", "--threads", "2"])
            .args(["--fault-mode", mode, "--verify", "full", "--json"])
            .arg(&json)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("acc/s"), "{stdout}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        for key in
            ["accesses", "seconds", "accesses_per_sec", "fill_mb_per_sec", "verify_errors", "stats", "latency_us"]
        {
            assert!(v.get(key).is_some(), "missing {key}: {v}");
        }
        for p in ["p50", "p90", "p99", "p999"] {
            assert!(v["latency_us"][p].as_f64().unwrap() > 0.0, "{v}");
        }
        assert_eq!(v["accesses"], 20000);
        assert_eq!(v["verify_errors"], 0);
        let stats = &v["stats"];
        for key in [
            "pswpin",
            "pswpout",
            "pgfault_zero",
            "pgfault_swapcache",
            "pgmajfault",
            "resident_pages",
            "swapcache_pages",
        ] {
            assert!(stats.get(key).is_some(), "missing stats.{key}: {stats}");
        }
        assert!(stats["pswpout"].as_u64().unwrap() > 0, "{stats}");
        assert!(stats["devices"][0]["slots_used"].as_u64().is_some(), "{stats}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let cases: [(&[&str], &str); 4] = [
        (&["bench", "--wss", "8MiB", "--limit", "16MiB"], "larger than --wss"),
        (&["bench", "--wss", "12XB"], "unknown size unit"),
        (&["bench", "--wss", "8MiB", "--limit", "4KiB"], "below the minimum"),
        (&["bench", "--read-pct", "150"], "150"),
    ];
    for (args, needle) in cases {
        let out = uswap().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
