//! TLB shootdowns from `/proc/interrupts`: the `TLB` line counts, per CPU, the
//! flush requests other CPUs sent it. Every engine's run records the delta around it
//! (`tlb_shootdowns` in its counters), so uswap's `UFFDIO_MOVE`s and the kernel's own
//! reclaim are compared by the same measure. The count is machine-wide: other activity
//! during a run adds to it, so compare engines measured in the same sitting.

use serde_json::Value;

/// The machine's TLB shootdowns so far, summed over CPUs; `None` where `/proc/interrupts`
/// has no `TLB` line (not x86) or cannot be read.
pub fn tlb_shootdowns() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

fn parse(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.trim_start().starts_with("TLB:"))?;
    let counts = line.trim_start().trim_start_matches("TLB:");
    // Per-CPU counts, then the description ("TLB shootdowns").
    let mut total = 0u64;
    let mut any = false;
    for field in counts.split_whitespace() {
        match field.parse::<u64>() {
            Ok(n) => {
                total += n;
                any = true;
            }
            Err(_) => break,
        }
    }
    any.then_some(total)
}

/// Adds `tlb_shootdowns`, the count since `before`, to a run's counters (a JSON object);
/// nothing where either reading is missing.
pub fn record_since(stats: &mut Value, before: Option<u64>) {
    let (Some(b), Some(a)) = (before, tlb_shootdowns()) else { return };
    if let Value::Object(m) = stats {
        m.insert("tlb_shootdowns".into(), a.saturating_sub(b).into());
    }
}

/// Shootdowns per major fault, the figure the engines are compared by.
pub fn per_major_fault(stats: &Value) -> Option<f64> {
    let tlb = stats.get("tlb_shootdowns")?.as_u64()?;
    let majflt = stats.get("pgmajfault")?.as_u64()?;
    (majflt > 0).then(|| tlb as f64 / majflt as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_per_cpu_counts_of_the_tlb_line() {
        let text = "           CPU0       CPU1\n  0:         44          0   IO-APIC   2-edge      timer\n\
                    NMI:          0          0   Non-maskable interrupts\n\
                    TLB:   36034316   37646213   TLB shootdowns\n";
        assert_eq!(parse(text), Some(73_680_529));
        assert_eq!(parse("NMI: 0 0 Non-maskable interrupts\n"), None);
        assert_eq!(parse("TLB: TLB shootdowns\n"), None);
    }

    #[test]
    fn this_machine_counts_shootdowns_and_they_only_grow() {
        let Some(a) = tlb_shootdowns() else {
            eprintln!("SKIPPED: no TLB line in /proc/interrupts");
            return;
        };
        let b = tlb_shootdowns().expect("the line was there a moment ago");
        assert!(b >= a, "{b} < {a}");
    }

    #[test]
    fn per_major_fault_needs_both_counters() {
        let mut v = serde_json::json!({"pgmajfault": 4});
        assert_eq!(per_major_fault(&v), None);
        v["tlb_shootdowns"] = 6.into();
        assert_eq!(per_major_fault(&v), Some(1.5));
        v["pgmajfault"] = 0.into();
        assert_eq!(per_major_fault(&v), None);
    }
}
