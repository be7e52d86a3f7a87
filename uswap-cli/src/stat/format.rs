//! The three outputs of `uswap stat`: a table, JSON lines, and the Prometheus text
//! exposition format (version 0.0.4).
//!
//! Prometheus rules kept here: every name starts `uswap_`; counters (values that only grow)
//! end in `_total` and are typed `counter`, page counts and sizes in use are `gauge`s; each
//! family has one `# HELP` and one `# TYPE` line and all its samples together, so several
//! pagers appear as label sets of one family (`pid`, `pager`; per device also `device`, its
//! index, and `device_name`). Fault latency is a `summary` in seconds.
//!
//! The fields come from `Stats`' serialized form, so a counter added to the library shows up
//! in every output; `help` must know it (a test checks).

use std::fmt::Write;
use std::time::Duration;

use serde_json::{Map, Value};
use uswap::Stats;

use super::{Format, PagerStats};

/// Top-level fields of `Stats` that are levels, not running counts.
/// resident_peak_pages only rises, but it is a level (a high-water mark), not a count of events.
const GAUGES: [&str; 8] = [
    "resident_pages",
    "swapcache_pages",
    "clean_pages",
    "limit_pages",
    "resident_peak_pages",
    "unmanaged_bytes",
    "unmanaged_peak_bytes",
    "pool_peak_bytes",
];

/// Fields of a device (and of its backend) that are levels; the rest count events.
const DEVICE_GAUGES: [&str; 14] = [
    "priority",
    "nr_slots",
    "slots_used",
    "slots_held_for_children",
    "clusters_free",
    "clusters_nonfull",
    "clusters_full",
    "pool_bytes",
    "pool_peak_bytes",
    "stored_pages",
    "same_filled_pages",
    "incompressible_pages",
    "compressed_bytes",
    "object_bytes",
];

/// The `# HELP` text of a field of `Stats`, `DeviceStats` or `BackendStats`.
fn help(field: &str) -> Option<&'static str> {
    Some(match field {
        "pgfault" => "Faults served, all kinds.",
        "pgfault_zero" => "Zero-fill faults (page never touched, or known to be zero).",
        "zero_fill_around" => "Never-touched pages mapped ahead by zero-fill faults (fault-around).",
        "pgfault_swapcache" => "Faults served from the swap cache (page staged in RAM).",
        "pgmajfault" => "Faults that read a swap device.",
        "pgfault_wp" => "First writes to clean pages (write-protect faults).",
        "pswpin" => "Pages read from swap devices.",
        "pswpout" => "Pages written to swap devices.",
        "swpout_clean" => "Clean pages dropped by reclaim without a write (their slots still hold them), the aging scan's staged clean pages among them.",
        "swpout_zero" => "Pages found all zero at swap-out (no slot kept).",
        "pgsteal_background" => "Pages reclaimed by the background reclaimer.",
        "pgsteal_direct" => "Pages reclaimed directly by faulting threads.",
        "pgactivate" => "Reclaim victims given a second chance.",
        "workingset_activate" => "Pages read back soon enough after they left to count as the working set (spared once by reclaim; a clean one once written).",
        "pgdeactivate" => "Resident pages the aging scan moved to the swap cache to see whether they are still used.",
        "pswpout_background" => "Pages the background reclaimer sent out for the faults that moved them out (a zstd pool first: the faults move victims, the background thread compresses them): written (also in pswpout), or, staged clean by the aging scan, dropped (also in swpout_clean).",
        "swpout_idle" => "Staged pages sent out because they were idle for the idle age: written, or, staged clean, dropped unwritten (in swpout_clean too).",
        "pgfault_aged" => "Swap-cache hits on pages the aging scan staged: pages found still in use (not stalls).",
        "writeback_idle" => "Pages moved down a tier because they were idle there for the idle age.",
        "device_reads" => "Device read calls (swap-ins and tier writeback; a call reads one or more runs of pages).",
        "device_read_us" => "Time device reads took, in microseconds (per major fault: the device's share of its latency).",
        "device_writes" => "Device write calls (swap-outs and tier writeback).",
        "device_write_us" => "Time device writes took, in microseconds.",
        "allocstall" => "Allocations that reclaimed directly at the limit.",
        "swap_alloc_fail" => "Swap-outs that found no free slot (page stayed resident).",
        "limit_overrun" => "Charges that went above the resident limit.",
        "limit_overrun_busy" => "Of limit_overrun, charges over the limit although the devices had room (every page reclaim found stayed busy).",
        "bounce_wait_timeout" => "Faults or take-outs that gave up waiting for a bounce buffer (should stay 0).",
        "remap_copied" => "Pages a partial mremap moved out of a region, copied into place.",
        "swap_ra" => "Pages read ahead.",
        "swap_ra_hit" => "Read-ahead pages the application used.",
        "swap_ra_unused" => "Read-ahead pages evicted unused.",
        "swap_ra_async_started" => "Pages whose asynchronous readahead was started.",
        "swap_ra_async" => "Pages mapped from an asynchronous readahead.",
        "swap_ra_async_dropped" => "Asynchronously read pages never mapped.",
        "swap_ra_async_wait" => "Faults that waited for an asynchronous readahead in flight.",
        "uffd_unmap" => "Application munmaps over regions.",
        "uffd_remap" => "Application mremaps of regions.",
        "uffd_remove" => "Application MADV_DONTNEED/MADV_REMOVE over regions.",
        "pgfault_swapcache_copy" => "Swap-cache hits on read-only memory, served by a copy.",
        "gone_scan_pages" => "Page-table words read to find a region's own pages once some were unmapped.",
        "fault_raced" => "Faults already resolved by a racing thread or racing an event (retried).",
        "fault_lock_free" => "Signal-mode faults served on the lock-free route.",
        "fault_busy_timeout" => "Faults that gave up waiting for a busy page.",
        "fault_event_wait_timeout" => "Waits that gave up on read events being applied: signal-mode faults, unmaps, new mappings (should be 0).",
        "fault_error" => "Fault-service attempts that failed (read error or bad checksum).",
        "lru_overflow" => "Resident pages the reclaim queue had no room for.",
        "move_refused" => "Pages UFFDIO_MOVE refused to move out.",
        "reclaim_pinned" => "Signal mode: victims left resident because a system call had pinned them.",
        "cow_broken" => "Pages a fork child shared, made exclusive again so they could move out.",
        "shared_adopted" => "Pages a fork child inherited and came to map alone, charged to it.",
        "swpout_neighbours" => "Dirty resident pages that left with a victim next to them, in one move.",
        "handler_retire" => "Thread mode: fault handlers that went dormant.",
        "handler_backlog" => "Thread mode: dormant handlers woken for a backlog of faults.",
        "handler_help" => "Thread mode: handlers woken to help while a stream's window was served.",
        "handler_steer" => "Thread mode: hand-overs to the handler on the faulting thread's CPU.",
        "handler_spin_off" => "Thread mode: times a handler stopped spinning for its next fault.",
        "swpout_error" => "Device writes that failed (pages kept in RAM, retried).",
        "swpout_spilled" => "Pages a device declined that another device took.",
        "writeback" => "Pages moved from a device to the next tier.",
        "checksum_errors" => "Device reads whose checksum did not match.",
        "slots_leaked" => "Slots that could not be freed (should stay 0).",
        "uffd_move_misreports" => "UFFDIO_MOVE calls that moved a page but reported failure.",
        "staging_foreign_drops" => "Times a move into the staging area dropped pages the program read there.",
        "resident_pages" => "Application pages in RAM counted against the limit.",
        "resident_peak_pages" => "The most application pages resident at once since the pager started.",
        "swapcache_pages" => "Resident pages staged in the swap cache.",
        "clean_pages" => "Resident pages whose slot still holds them.",
        "limit_pages" => "The resident limit, in pages.",
        "unmanaged_bytes" => "The process's anonymous memory no pager manages, last measured.",
        "unmanaged_peak_bytes" => "The most anonymous memory no pager managed at once.",
        "pool_peak_bytes" => "The most memory the compressed pools held at once.",
        "syscall_prepared" => "Signal mode: system calls whose managed memory was brought in before the call.",
        "syscall_efault_retried" => "Signal mode: of those, calls that met EFAULT anyway and were made again.",
        "syscall_continued" => "Signal mode: transfers cut short by reclaim during the call (or on the process's own memory file, /proc/self/mem), continued for the rest.",
        "syscall_async_kernel_access" => "Signal mode: io_uring/AIO/KVM set up over managed memory (use thread mode).",
        "syscall_unpinned" => "Signal mode: calls brought in unpinned (every pin slot was taken).",
        "mlock_unhonoured" => "Locks of managed memory (mlock) not recorded: those pages may be swapped (should be 0).",
        "syscall_efault" => "Signal mode: calls on managed memory whose EFAULT reached the program (should be 0).",
        "priority" => "Device priority (higher is used first).",
        "nr_slots" => "Slots (pages) the device can hold.",
        "slots_used" => "Slots allocated.",
        "slots_held_for_children" => "Slots freed here that a fork child may still read.",
        "clusters_free" => "Clusters entirely free.",
        "clusters_nonfull" => "Clusters partly used.",
        "clusters_full" => "Clusters full.",
        "clusters_discarded" => "Clusters discarded before reuse.",
        "degraded" => "Its writes fail now: it takes no pages until a probe write succeeds.",
        "degraded_episodes" => "Times its writes began to fail.",
        "charges_refused_tree_full" => "Slots refused (16, 64 KiB, at a time): the tree's processes held the device's whole size.",
        "pool_bytes" => "Bytes of memory the device holds.",
        "stored_pages" => "Pages stored in the device's pool.",
        "same_filled_pages" => "Stored pages of one repeated word (no pool memory).",
        "same_filled_stores" => "Pages stored as one repeated word.",
        "incompressible_pages" => "Stored pages that did not compress.",
        "compressed_bytes" => "Bytes of compressed data.",
        "object_bytes" => "Bytes of the pool's objects (compressed data, headers, size-class rounding).",
        "compacted_chunks" => "Pool chunks (64 KiB) compaction emptied and freed.",
        "units" => "Units stored: pages compressed together as one object (unit=SIZE).",
        "unit_pages" => "Stored pages held in units.",
        "unit_fallbacks" => "Groups of pages meant for a unit stored page by page (too large, or no row free).",
        "dictionary_bytes" => "Memory of the pool's zstd dictionary (dict), counted in pool_bytes.",
        "codec_bytes" => "Memory of the pool's compression workspaces and zstd contexts, not in pool_bytes.",
        "dictionary_in_use" => "Pools compressing new pages with their dictionary now (off while it costs bytes).",
        "dictionary_turned_off" => "Times a pool turned its dictionary off for costing bytes.",
        "dictionary_failures" => "Pools whose zstd dictionary could not be trained (they compress without).",
        "compression_ratio" => "Stored pages per byte of pool, times the page size.",
        "reject_pool_full" => "Writes refused: pool full.",
        "reject_incompressible" => "Writes refused: incompressible.",
        "reject_alloc_fail" => "Writes refused: no memory for the object.",
        "discard_errors" => "Discards that failed.",
        "failovers" => "Times a remote device followed a new primary.",
        "redirects" => "Commands a cluster node sent to another node (MOVED, ASK), followed.",
        "remote_read_errors" => "Pages a remote device could not find or authenticate.",
        "queries" => "Queries the stats socket answered.",
        "peers_refused" => "Stats socket connections refused (peer neither the user nor root).",
        "send_errors" => "Stats socket answers not delivered.",
        _ => return None,
    })
}

/// What `pid` is to the reader: a process with pagers, or a `uswap run` serving its tree's counters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Process,
    RunTree,
}

/// Renders one report: every pager of `pid`, or their sum.
pub fn render(
    pid: u32,
    subject: Subject,
    pagers: &[PagerStats],
    sum: bool,
    format: Format,
    elapsed: Option<Duration>,
) -> String {
    let summed;
    let blocks: Vec<(Option<&PagerStats>, &Stats)> = if sum {
        let mut total = Stats::default();
        for p in pagers {
            total.add(&p.stats);
        }
        summed = total;
        vec![(None, &summed)]
    } else {
        pagers.iter().map(|p| (Some(p), &p.stats)).collect()
    };
    match format {
        Format::Json => json(pid, pagers, &blocks),
        Format::Prometheus => prometheus(pid, &blocks),
        Format::Table => table(pid, subject, pagers, &blocks, elapsed),
    }
}

fn to_map(s: &Stats) -> Map<String, Value> {
    match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn json(pid: u32, pagers: &[PagerStats], blocks: &[(Option<&PagerStats>, &Stats)]) -> String {
    let doc = match blocks {
        [(None, total)] => serde_json::json!({
            "pid": pid,
            "sockets": pagers.iter().map(|p| p.socket.as_str()).collect::<Vec<_>>(),
            "stats": total,
        }),
        _ => serde_json::json!({
            "pid": pid,
            "pagers": blocks.iter().filter_map(|(p, _)| *p).map(|p| serde_json::json!({
                "socket": p.socket,
                "pager": p.pager,
                "stats": p.stats,
            })).collect::<Vec<_>>(),
        }),
    };
    format!("{doc}\n")
}

// ---------------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------------

/// A label value, escaped as the text format wants (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// A metric family under construction: its samples, in order.
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(String, String, f64)>,
}

#[derive(Default)]
struct Families(Vec<Family>);

impl Families {
    /// Adds a sample of family `name` (created on first use) with `labels` (already
    /// formatted, without braces) and `suffix` after the name (`_sum`, `_count` or nothing).
    fn add(&mut self, name: String, kind: &'static str, help: &str, suffix: &str, labels: String, value: f64) {
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family { name, kind, help: help.to_string(), samples: Vec::new() });
                self.0.len() - 1
            }
        };
        self.0[i].samples.push((suffix.to_string(), labels, value));
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.0 {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help.replace('\\', r"\\").replace('\n', r"\n"));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (suffix, labels, v) in &f.samples {
                let _ = writeln!(out, "{}{suffix}{{{labels}}} {}", f.name, number(*v));
            }
        }
        out
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Adds every numeric field of `fields` as a family `uswap_<prefix><field>`.
fn add_fields(fam: &mut Families, fields: &Map<String, Value>, prefix: &str, gauges: &[&str], labels: &str) {
    for (k, v) in fields {
        let Some(x) = v.as_f64() else { continue };
        let gauge = gauges.contains(&k.as_str()) || !v.is_u64();
        let (name, kind) = if gauge {
            (format!("uswap_{prefix}{k}"), "gauge")
        } else {
            (format!("uswap_{prefix}{k}_total"), "counter")
        };
        let help = help(k).unwrap_or("See uswap's Stats documentation.");
        fam.add(name, kind, help, "", labels.to_string(), x);
    }
}

fn prometheus(pid: u32, blocks: &[(Option<&PagerStats>, &Stats)]) -> String {
    let mut fam = Families::default();
    for (pager, stats) in blocks {
        let labels = match pager {
            Some(p) => format!("pid=\"{pid}\",pager=\"{}\"", p.pager),
            None => format!("pid=\"{pid}\""),
        };
        let map = to_map(stats);
        add_fields(&mut fam, &map, "", &GAUGES, &labels);
        for (i, d) in stats.devices.iter().enumerate() {
            let dl = format!("{labels},device=\"{i}\",device_name=\"{}\"", escape(&d.name));
            let Ok(Value::Object(mut fields)) = serde_json::to_value(d) else { continue };
            let backend = fields.remove("backend");
            add_fields(&mut fam, &fields, "device_", &DEVICE_GAUGES, &dl);
            if let Some(Value::Object(b)) = backend {
                add_fields(&mut fam, &b, "device_", &DEVICE_GAUGES, &dl);
            }
        }
        let l = &stats.fault_latency_us;
        let lat = "uswap_fault_latency_seconds".to_string();
        let lat_help = "Fault service time, from entering the engine to the page being mapped.";
        for (q, v) in [("0.5", l.p50), ("0.9", l.p90), ("0.99", l.p99), ("0.999", l.p999)] {
            fam.add(lat.clone(), "summary", lat_help, "", format!("{labels},quantile=\"{q}\""), v / 1e6);
        }
        fam.add(lat.clone(), "summary", lat_help, "_sum", labels.clone(), l.mean * l.count as f64 / 1e6);
        fam.add(lat, "summary", lat_help, "_count", labels.clone(), l.count as f64);
        let st = &stats.stall;
        let stall_help = "Time during which some thread of the application stalled on memory (a swap-in, a page on \
                          its way out, room under the limit): PSI's some total.";
        fam.add("uswap_stall_seconds_total".into(), "counter", stall_help, "", labels.clone(), st.seconds_total);
        for (w, v) in [("10", st.avg10), ("60", st.avg60), ("300", st.avg300)] {
            let help =
                "Share of wall time some thread stalled on memory, running average (PSI's avg10, avg60, avg300).";
            fam.add(format!("uswap_stall_avg{w}_percent"), "gauge", help, "", labels.clone(), v);
        }
        let idle_help = "Managed memory untouched for at least age_seconds (pages out of their regions since then; \
                         with idle aging, every page is tested once in 10 to 40 s).";
        for (age, v) in stats.idle.buckets() {
            let l = format!("{labels},age_seconds=\"{age}\"");
            fam.add("uswap_idle_bytes".into(), "gauge", idle_help, "", l, v as f64);
        }
        fam.add(
            "uswap_fault_latency_max_seconds".into(),
            "gauge",
            "Longest fault service time since the pager started.",
            "",
            labels.clone(),
            l.max / 1e6,
        );
        let p = &stats.publish;
        for (k, v) in [("queries", p.queries), ("peers_refused", p.peers_refused), ("send_errors", p.send_errors)] {
            let help = help(k).unwrap_or_default();
            fam.add(format!("uswap_stats_{k}_total"), "counter", help, "", labels.clone(), v as f64);
        }
    }
    fam.render()
}

// ---------------------------------------------------------------------------------------
// Table
// ---------------------------------------------------------------------------------------

fn mib(pages: u64) -> String {
    format!("{:.1} MiB", pages as f64 * uswap::PAGE_SIZE as f64 / (1 << 20) as f64)
}

fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else {
        format!("{v:.1} us")
    }
}

fn table(
    pid: u32,
    subject: Subject,
    pagers: &[PagerStats],
    blocks: &[(Option<&PagerStats>, &Stats)],
    elapsed: Option<Duration>,
) -> String {
    let mut out = String::new();
    if let Some(t) = elapsed {
        let _ = writeln!(out, "--- {:.1} s", t.as_secs_f64());
    }
    for (pager, s) in blocks {
        match pager {
            // `uswap run` serves the sum of its tree's pagers, not a pager of its own.
            Some(p) if subject == Subject::RunTree => {
                let _ = writeln!(out, "pid {pid} (uswap run): its tree's processes together (@{})", p.socket);
            }
            Some(p) => {
                let _ = writeln!(out, "pid {pid} pager {} (@{})", p.pager, p.socket);
            }
            None => {
                let _ = writeln!(out, "pid {pid}: sum of {} pagers", pagers.len());
            }
        }
        let _ = writeln!(
            out,
            "  resident  {} of {} limit ({} of {} pages; swap cache {}, clean {})",
            mib(s.resident_pages),
            mib(s.limit_pages),
            s.resident_pages,
            s.limit_pages,
            s.swapcache_pages,
            s.clean_pages
        );
        let page = uswap::PAGE_SIZE as u64;
        let _ = writeln!(
            out,
            "  unmanaged {} now, {} at peak (the process's anonymous memory no pager manages)",
            mib(s.unmanaged_bytes / page),
            mib(s.unmanaged_peak_bytes / page)
        );
        let l = &s.fault_latency_us;
        let _ = writeln!(
            out,
            "  faults    {} served; latency mean {}, p50 {}, p99 {}, max {}",
            l.count,
            us(l.mean),
            us(l.p50),
            us(l.p99),
            us(l.max)
        );
        if s.device_reads + s.device_writes > 0 {
            let _ = writeln!(out, "  devices   {}", device_io_line(s));
        }
        let st = &s.stall;
        let _ = writeln!(
            out,
            "  stalls    {:.2} s in all; some thread stalled on memory {:.2} % of the last 10 s, {:.2} % of 60 s, \
             {:.2} % of 300 s",
            st.seconds_total, st.avg10, st.avg60, st.avg300
        );
        let [a, b, c, d] = s.idle.buckets().map(|(_, bytes)| mib(bytes / uswap::PAGE_SIZE as u64));
        let _ = writeln!(out, "  idle      untouched for 1 s {a}, 10 s {b}, 1 min {c}, 10 min {d}");
        if !s.devices.is_empty() {
            let _ = writeln!(
                out,
                "  {:>3}  {:<24} {:>4} {:>10} {:>10} {:>10} {:>7}",
                "dev", "name", "prio", "slots", "used", "pool", "ratio"
            );
            for (i, d) in s.devices.iter().enumerate() {
                let (pool, ratio) = match &d.backend {
                    Some(b) => (mib(b.pool_bytes / uswap::PAGE_SIZE as u64), format!("{:.2}", b.compression_ratio)),
                    None => ("-".into(), "-".into()),
                };
                let _ = writeln!(
                    out,
                    "  {i:>3}  {:<24} {:>4} {:>10} {:>10} {pool:>10} {ratio:>7}",
                    d.name, d.priority, d.nr_slots, d.slots_used
                );
            }
        }
        let counters: Vec<(String, u64)> = to_map(s)
            .into_iter()
            .filter(|(k, _)| !GAUGES.contains(&k.as_str()))
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .collect();
        for row in counters.chunks(3) {
            let mut line = String::from(" ");
            for (k, v) in row {
                let _ = write!(line, " {k:<22} {v:>12}");
            }
            let _ = writeln!(out, "{line}");
        }
        if s.publish.peers_refused > 0 {
            let _ = writeln!(out, "  stats socket refused {} connections from other users", s.publish.peers_refused);
        }
    }
    out
}

/// The devices' reads and writes: calls, time, and a read's share of a major fault.
pub(crate) fn device_io_line(s: &Stats) -> String {
    let each = |us: u64, n: u64| if n == 0 { 0.0 } else { us as f64 / n as f64 };
    format!(
        "{} reads, {:.1} us each, {:.1} us per major fault; {} writes, {:.1} us each",
        s.device_reads,
        each(s.device_read_us, s.device_reads),
        each(s.device_read_us, s.pgmajfault),
        s.device_writes,
        each(s.device_write_us, s.device_writes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_field_name(v: &Value, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, v) in m {
                if v.is_number() {
                    out.push(k.clone());
                }
                every_field_name(v, out);
            }
        }
    }

    #[test]
    fn every_counter_has_help() {
        let mut s = Stats::default();
        s.devices.push(uswap::DeviceStats { backend: Some(Default::default()), ..Default::default() });
        let mut names = Vec::new();
        every_field_name(&serde_json::to_value(&s).unwrap(), &mut names);
        let mut devices = Vec::new();
        every_field_name(&serde_json::to_value(&s.devices[0]).unwrap(), &mut devices);
        // Latency (a summary) and stalls (`uswap_stall_*`) are rendered by hand; the rest by name.
        let by_hand = [
            "count",
            "mean",
            "p50",
            "p90",
            "p99",
            "p999",
            "max",
            "seconds_total",
            "avg10",
            "avg60",
            "avg300",
            "idle_1s_bytes",
            "idle_10s_bytes",
            "idle_60s_bytes",
            "idle_600s_bytes",
        ];
        for n in names.iter().chain(&devices).filter(|n| !by_hand.contains(&n.as_str())) {
            assert!(help(n).is_some(), "no help for {n}");
        }
    }

    /// The table splits a major fault's time: the devices' line appears once they did I/O,
    /// with each call's time and the reads' share of a major fault; the sum over pagers adds
    /// the counters up.
    #[test]
    fn the_table_shows_the_devices_time_per_call_and_per_major_fault() {
        let quiet = Stats::default();
        let busy = Stats {
            pgmajfault: 400,
            device_reads: 200,
            device_read_us: 30_000,
            device_writes: 10,
            device_write_us: 7_000,
            ..Default::default()
        };
        let pager = |stats: Stats| PagerStats { socket: "uswap.9.0".into(), pager: 0, stats };
        let text = render(9, Subject::Process, &[pager(quiet)], false, Format::Table, None);
        assert!(!text.contains("  devices   "), "{text}");
        let text = render(9, Subject::Process, &[pager(busy.clone()), pager(busy)], true, Format::Table, None);
        assert!(
            text.contains("  devices   400 reads, 150.0 us each, 75.0 us per major fault; 20 writes, 700.0 us each"),
            "{text}"
        );
    }

    #[test]
    fn prometheus_groups_each_family_and_types_counters() {
        let mut a = Stats { pswpout: 7, resident_pages: 3, ..Default::default() };
        a.devices.push(uswap::DeviceStats { name: "file:/a \"b\"".into(), nr_slots: 10, ..Default::default() });
        let b = Stats { pswpout: 5, ..Default::default() };
        let pagers = vec![
            PagerStats { socket: "uswap.9.0".into(), pager: 0, stats: a },
            PagerStats { socket: "uswap.9.1".into(), pager: 1, stats: b },
        ];
        let text = render(9, Subject::Process, &pagers, false, Format::Prometheus, None);
        assert!(text.contains("# TYPE uswap_pswpout_total counter\n"), "{text}");
        assert!(text
            .contains("uswap_pswpout_total{pid=\"9\",pager=\"0\"} 7\nuswap_pswpout_total{pid=\"9\",pager=\"1\"} 5\n"));
        assert!(text.contains("# TYPE uswap_resident_pages gauge\n"));
        assert!(text.contains(
            "uswap_device_nr_slots{pid=\"9\",pager=\"0\",device=\"0\",device_name=\"file:/a \\\"b\\\"\"} 10\n"
        ));
        assert_eq!(text.matches("# HELP uswap_pswpout_total ").count(), 1);
        let summed = render(9, Subject::Process, &pagers, true, Format::Prometheus, None);
        assert!(summed.contains("uswap_pswpout_total{pid=\"9\"} 12\n"), "{summed}");
    }
}
