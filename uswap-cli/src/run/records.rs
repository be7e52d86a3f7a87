//! The records every process of a `uswap run` tree writes in its directory (`<pid>.json`,
//! rewritten every 200 ms and at exit), and the tree's figures made from them: served live to
//! `uswap stat <uswap run's pid>`, and summed into the summary at the end.

use std::path::{Path, PathBuf};

use crate::size::format_amount;
use crate::tree_files::{read_note, read_tree_file};

/// Serves the tree's counters for `uswap stat <this pid>`. Under another `uswap run` this
/// process is managed too, and its own pager's socket may hold the first names: the next
/// ones are tried.
pub(super) fn serve_tree_stats(
    dir: &Path,
    tree: &'static uswap::shared_charge::SharedCharge,
) -> Option<uswap::stats_server::StatsServer> {
    let mut last_error = None;
    for _ in 0..8 {
        let tree_dir = dir.to_path_buf();
        match uswap::stats_server::serve(&uswap::stats_server::next_socket_name(), move || tree_stats(&tree_dir, tree))
        {
            Ok(s) => return Some(s),
            Err(e) => last_error = Some(e),
        }
    }
    if let Some(e) = last_error {
        say!("uswap run: the tree's counters will not be served to `uswap stat`: {e}");
    }
    None
}

/// The largest resident set of any process of the tree that has been waited for (the
/// program, and what it waited for in turn), as the kernel measured it: `getrusage`'s
/// `ru_maxrss` of the children, in bytes. Measured from outside the engine: it includes
/// what uswap does not manage (program text, file mappings, the compressed pool).
pub(super) fn children_rss_peak_bytes() -> u64 {
    // SAFETY: rusage is plain data; getrusage writes one.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_maxrss.max(0) as u64 * 1024
}

/// The records the processes of the tree write in `dir` (`<pid>.json`; `.<pid>.json.tmp`,
/// a record being rewritten, is left out).
pub(super) fn record_paths(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        !name.starts_with('.') && name.ends_with(".json")
    })
}

/// What the processes of the tree that could not be managed said, each once (their
/// `refused-<pid>.txt`, see `uswap::shared_charge::REFUSAL_PREFIX`), by pid.
pub(super) fn refusals(dir: &Path) -> Vec<(u32, String)> {
    notes(dir, uswap::shared_charge::REFUSAL_PREFIX)
}

/// The processes of the tree that left the budget at an exec, each with the image and why
/// (their `escaped-<pid>.txt`, see `uswap::shared_charge::ESCAPE_PREFIX`), by pid.
pub(super) fn escapes(dir: &Path) -> Vec<(u32, String)> {
    notes(dir, uswap::shared_charge::ESCAPE_PREFIX)
}

/// The processes of the tree that asked to load a library with `RTLD_DEEPBIND`, which the
/// preload library loaded without it (their `deep-bind-<pid>.txt`: the program and the
/// library), by pid.
pub(super) fn deep_binds(dir: &Path) -> Vec<(u32, String)> {
    notes(dir, uswap::shared_charge::DEEP_BIND_PREFIX)
}

/// A note's text for the terminal: paths as the program gave them, with no control
/// character reaching it.
fn printable(note: &str) -> String {
    note.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// What to say of the processes that loaded libraries without the `RTLD_DEEPBIND` they
/// asked for: a change the program did not ask for, so said once, with the first.
pub(super) fn deep_bind_message(noted: &[(u32, String)]) -> Option<String> {
    let (pid, first) = noted.first()?;
    let first = printable(first);
    Some(format!(
        "{} process(es) loaded libraries without the RTLD_DEEPBIND they asked for (process {pid}: {first}): \
         it would have bound their malloc and free to the C library's, past uswap's (docs/cli.md)",
        noted.len()
    ))
}

/// The notes `<prefix><pid>[.<n>].txt` in `dir`, each's text without its trailing newline,
/// by pid.
fn notes(dir: &Path, prefix: &str) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // `<prefix><pid>.txt`, or `<prefix><pid>.<n>.txt` for a pid's later notes.
            let rest = name.strip_prefix(prefix)?.strip_suffix(".txt")?;
            let pid = rest.split('.').next()?.parse().ok()?;
            let msg = read_note(&e.path()).unwrap_or_default();
            Some((pid, msg.trim_end().to_string()))
        })
        .collect();
    out.sort();
    out
}

/// What to say when some processes were refused: how many, and what the first ones said.
pub(super) fn refusal_message(refused: &[(u32, String)]) -> String {
    let mut msg = format!(
        "{} process(es) of the program could not get a pager, so the run fails (each stopped before its main \
         with status 2, or, a fork child, ran without the budget):",
        refused.len()
    );
    for (_, said) in refused.iter().take(4) {
        msg.push_str(&format!("\n  {}", said.strip_prefix("uswap: ").unwrap_or(said)));
    }
    if refused.len() > 4 {
        msg.push_str(&format!("\n  and {} more", refused.len() - 4));
    }
    msg
}

/// What to say when some processes left the budget: how many, and the first ones' images,
/// one line per image and reason (a script that re-execs its interpreter, a build running
/// one compiler a thousand times, filled the list with the same line).
pub(super) fn escape_message(escaped: &[(u32, String)]) -> String {
    let mut msg = format!(
        "{} process(es) of the program ran outside the budget, their memory neither limited nor counted \
         (uswap follows a program through its preloaded library, which these images do not load, or in \
         which it stands aside):",
        escaped.len()
    );
    // (what was said, the first process that said it, how many did), in the order of the
    // first processes; indexed by what was said (a build may leave thousands of notes).
    let mut lines: Vec<(&str, u32, usize)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (pid, said) in escaped {
        match index.get(said.as_str()) {
            Some(&i) => lines[i].2 += 1,
            None => {
                index.insert(said, lines.len());
                lines.push((said, *pid, 1));
            }
        }
    }
    for &(said, pid, n) in lines.iter().take(4) {
        let more = if n > 1 { format!(" and {} more like it", n - 1) } else { String::new() };
        msg.push_str(&format!("\n  process {pid}{more}: {}", printable(said)));
    }
    if lines.len() > 4 {
        let rest: usize = lines[4..].iter().map(|&(_, _, n)| n).sum();
        msg.push_str(&format!("\n  and {rest} more process(es), of {} other image(s) or reason(s)", lines.len() - 4));
    }
    msg
}

/// The process a record is of (`<pid>.json`).
pub(super) fn record_pid(path: &Path) -> Option<libc::pid_t> {
    path.file_stem().and_then(|n| n.to_str()).and_then(|n| n.parse().ok())
}

/// The tree's counters now: every process's last record (rewritten every 200 ms) added up,
/// an ended process's (a zombie's too) without what it held (a build's compilers, one after
/// another, had the tree's resident pages pass its limit many times over in `uswap stat`).
fn tree_stats(dir: &Path, tree: &uswap::shared_charge::SharedCharge) -> uswap::Stats {
    use std::sync::atomic::Ordering;
    let mut sum = uswap::Stats::default();
    // Each process's device at one of the first TREE_DEVICES places of the list has the
    // tree's size (docs/devices.md, "A device's size is the tree's"): the tree's device is
    // that size, not the sum (`uswap stat` showed twice the slots with two processes).
    let mut tree_slots = std::collections::HashMap::<String, u64>::new();
    for path in record_paths(dir) {
        if let Some(s) = read_tree_file(&path).ok().and_then(|t| serde_json::from_str::<uswap::Stats>(&t).ok()) {
            let live = record_pid(&path).is_some_and(|pid| crate::stat::process_exists(pid as u32));
            let s = if live { s } else { s.ended() };
            for d in s.devices.iter().take(uswap::shared_charge::TREE_DEVICES) {
                let most = tree_slots.entry(d.name.clone()).or_default();
                *most = (*most).max(d.nr_slots);
            }
            sum.add(&s);
        }
    }
    // (Devices are merged by name in the sum.)
    for d in &mut sum.devices {
        if let Some(&nr_slots) = tree_slots.get(&d.name) {
            d.nr_slots = nr_slots;
        }
    }
    // The tree's own figures where it keeps them: its limit (which `--auto` moves), and its
    // stall time (the union over the processes; the sum of theirs bounds it from above).
    sum.limit_pages = tree.limit_pages.load(Ordering::Acquire) as u64;
    sum.stall.seconds_total = tree.stall.total_us(uswap::pressure::now_us()) as f64 / 1e6;
    sum
}

/// Counters whose sum over processes means nothing (gauges of the last state, limits).
const NOT_SUMMED: &[&str] = &["limit_pages", "pid"];

/// Sums the per-process records into the tree's counters.
pub(super) fn summarize(
    dir: &Path,
    limit_bytes: u64,
    segment: &uswap::shared_charge::ChargeSegment,
) -> serde_json::Value {
    let mut sum = serde_json::Map::new();
    let mut processes = 0u64;
    let mut managed_peak_pages = 0u64;
    for path in record_paths(dir) {
        let rec = read_tree_file(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string()));
        let rec = match rec {
            Ok(serde_json::Value::Object(rec)) => rec,
            Ok(_) => {
                say!("uswap run: {} is not a record of counters; its process is left out", path.display());
                continue;
            }
            Err(e) => {
                say!("uswap run: the record {} could not be read ({e}); its process is left out", path.display());
                continue;
            }
        };
        processes += 1;
        for (k, v) in rec {
            if NOT_SUMMED.contains(&k.as_str()) {
                continue;
            }
            if let Some(n) = v.as_u64() {
                let cur = sum.get(&k).and_then(|c| c.as_u64()).unwrap_or(0);
                sum.insert(k.clone(), (cur + n).into());
                if k == "managed_peak_pages" {
                    managed_peak_pages += n;
                }
            }
        }
    }
    let page = uswap::PAGE_SIZE as u64;
    sum.insert("processes".into(), processes.into());
    sum.insert("limit_bytes".into(), limit_bytes.into());
    // The tree's peak: the most pages resident at once over all processes together (the
    // per-process resident_peak_pages summed above is an upper bound of it).
    sum.insert("resident_peak_bytes".into(), (segment.resident_peak_pages() as u64 * page).into());
    // Likewise the pools: the tree's sum at its peak.
    sum.insert("pool_peak_bytes".into(), segment.pool_peak_bytes().into());
    // And the unmanaged memory: the tree's at one moment, as its processes measured it (the
    // sum of each process's own peak counted processes that never lived at once), where every
    // process had a slot to keep its share in.
    if segment.unmanaged_peak_bytes() > 0 {
        sum.insert("unmanaged_peak_bytes".into(), segment.unmanaged_peak_bytes().into());
    }
    // And the storage of the devices whose size is the tree's (the first ones of the list):
    // what they held together at their peak, in the order of the device list.
    sum.insert("device_peak_bytes".into(), segment.device_peak_bytes().to_vec().into());
    // And the stalls: the union over the processes, kept in the segment.
    sum.insert("stall_seconds_total".into(), segment.stall_seconds().into());
    sum.insert("managed_peak_bytes".into(), (managed_peak_pages * page).into());
    serde_json::Value::Object(sum)
}

pub(super) fn summary_line(s: &serde_json::Value) -> String {
    let g = |k: &str| s.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let auto = match s.get("auto_limit_bytes").and_then(|v| v.as_u64()) {
        Some(b) => format!(" (--auto: {} at the end)", format_amount(b)),
        None => String::new(),
    };
    format!(
        "uswap run: {} process(es) with a pager, limit {}{auto}, resident peak {}, pool peak {}, managed peak {}, unmanaged peak {}, \
         stalled {:.2} s, pswpin {}, pswpout {}, major faults {}",
        g("processes"),
        // A measured amount's form: `--auto` with no `--limit` has the machine's RAM as its
        // ceiling, which read "24683784KiB".
        format_amount(g("limit_bytes")),
        format_amount(g("resident_peak_bytes")),
        format_amount(g("pool_peak_bytes")),
        format_amount(g("managed_peak_bytes")),
        format_amount(g("unmanaged_peak_bytes")),
        s.get("stall_seconds_total").and_then(|v| v.as_f64()).unwrap_or(0.0),
        g("pswpin"),
        g("pswpout"),
        g("pgmajfault"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same image and reason, noted by many execs, is one line with its count; the
    /// others keep a line each, and what is not listed is counted.
    #[test]
    fn processes_outside_the_budget_are_listed_once_per_image_and_reason() {
        let bash = "/usr/bin/bash: its malloc is not uswap's".to_string();
        let mut notes: Vec<(u32, String)> = (0..38).map(|i| (2155 + i, bash.clone())).collect();
        notes.push((3000, "/usr/bin/ping: set-user-ID".into()));
        let msg = escape_message(&notes);
        let lines: Vec<&str> = msg.lines().collect();
        assert!(lines[0].starts_with("39 process(es)"), "{msg}");
        assert_eq!(lines[1], format!("  process 2155 and 37 more like it: {bash}"), "{msg}");
        assert_eq!(lines[2], "  process 3000: /usr/bin/ping: set-user-ID", "{msg}");
        assert_eq!(lines.len(), 3, "{msg}");
        let many: Vec<(u32, String)> = (0..6).map(|i| (i, format!("/bin/p{i}: static"))).collect();
        let msg = escape_message(&many);
        assert_eq!(msg.lines().count(), 6, "{msg}");
        assert!(msg.ends_with("\n  and 2 more process(es), of 2 other image(s) or reason(s)"), "{msg}");
    }

    /// A refusal left as a link (its process was out of descriptors) counts, with the link's
    /// target as its text; a link to a file gives the file's name, never what it holds.
    #[test]
    fn notes_left_as_links_are_read_by_their_target() {
        let dir = std::env::temp_dir().join(format!("uswap-link-notes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let said = "uswap: process 7 runs unmanaged: Too many open files (os error 24)";
        std::os::unix::fs::symlink(said, dir.join("refused-7.txt")).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "not to be read").unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("refused-8.txt")).unwrap();
        std::fs::write(dir.join("refused-9.txt"), "uswap: process 9 refused\n").unwrap();
        let notes = refusals(&dir);
        let expected =
            [(7, said.to_string()), (8, secret.display().to_string()), (9, "uswap: process 9 refused".into())];
        assert_eq!(notes, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
