//! `uswap report`: runs the standard suite ([`suite::SUITE`]) in one sitting and rewrites
//! the generated parts of BENCHMARKS.md: the machine description, and for every entry its
//! command line, table and plots. Everything outside the `BEGIN GENERATED` / `END
//! GENERATED` markers is hand-written and kept as it is; an entry without a section yet gets
//! one appended at the end.

pub mod machine;
pub mod suite;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser};

use crate::bench::error::BenchError;
use crate::bench::{self, interrupt, plot, table, BenchArgs, Sitting};
use crate::size::{format_size, parse_size};
use suite::{Entry, SUITE};

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The Markdown file to update.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Where the plots go; a relative path is relative to the directory of --out.
    #[arg(long, default_value = "docs/bench")]
    pub plots_dir: PathBuf,
    /// Interleaved runs of every engine per entry (figures are medians).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub runs: u64,
    /// Only these entries (comma-separated ids; see --list).
    #[arg(long)]
    pub only: Option<String>,
    /// Run every entry on these engines instead of the suite's (e.g. without root:
    /// uswap-signal,uswap-thread,ram).
    #[arg(long)]
    pub engines: Option<String>,
    /// Divide every entry's --wss, --limit and --accesses by N: a quick check that the suite
    /// runs. Such figures are not comparable with the real ones; do not commit them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub shrink: u64,
    /// Print the suite's commands and exit.
    #[arg(long)]
    pub list: bool,
    /// Wait for another uswap bench using the kernel engines instead of refusing to run.
    #[arg(long)]
    pub wait_lock: bool,
    /// Passed to every entry's `uswap bench`: times a kernel engine's run that the kernel's
    /// OOM killer ends is run again (bench's default otherwise). Shown in the commands
    /// BENCHMARKS.md records.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub oom_retries: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("unknown suite entry {id:?}; the entries are: {known}")]
    UnknownEntry { id: String, known: String },
    #[error("suite entry {id}: {message}")]
    BadEntry { id: String, message: String },
    #[error("suite entry {id}: {source}")]
    Bench { id: String, source: BenchError },
    #[error("{path}: {source}; give --out a writable Markdown file")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "entries that failed kept their earlier figures: {ids}; rerun them with --only {ids} (each failure is above)"
    )]
    Failed { ids: String },
}

/// Parses `uswap bench` flags the way the command line does.
#[derive(Debug, Parser)]
#[command(name = "uswap bench", no_binary_name = true)]
struct BenchLine {
    #[command(flatten)]
    args: BenchArgs,
}

/// The flags of an entry after the report's overrides, as tokens.
pub fn entry_tokens(entry: &Entry, r: &ReportArgs) -> Vec<String> {
    let mut t: Vec<String> = entry.bench_args().split_whitespace().map(str::to_string).collect();
    let mut i = 0;
    while i + 1 < t.len() {
        let v = &t[i + 1];
        let new = match t[i].as_str() {
            "--engines" => r.engines.clone(),
            "--wss" | "--limit" if r.shrink > 1 => parse_size(v).ok().map(|b| {
                let min =
                    if t[i] == "--limit" { bench::KERNEL_MIN_LIMIT_BYTES } else { 2 * bench::KERNEL_MIN_LIMIT_BYTES };
                format_size((b / r.shrink).max(min) / 4096 * 4096)
            }),
            "--accesses" if r.shrink > 1 => v.parse::<u64>().ok().map(|n| (n / r.shrink).max(1000).to_string()),
            _ => None,
        };
        if let Some(new) = new {
            t[i + 1] = new;
        }
        i += 1;
    }
    t.extend(["--runs".to_string(), r.runs.to_string()]);
    if let Some(n) = r.oom_retries {
        t.extend(["--oom-retries".to_string(), n.to_string()]);
    }
    t
}

fn selected(r: &ReportArgs) -> Result<Vec<&'static Entry>, ReportError> {
    let Some(only) = &r.only else { return Ok(SUITE.iter().collect()) };
    only.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|id| {
            SUITE.iter().find(|e| e.id == id).ok_or_else(|| ReportError::UnknownEntry {
                id: id.to_string(),
                known: SUITE.iter().map(|e| e.id).collect::<Vec<_>>().join(", "),
            })
        })
        .collect()
}

pub fn begin_marker(id: &str) -> String {
    format!("<!-- BEGIN GENERATED {id}: written by `uswap report`, edit outside the markers -->")
}

pub fn end_marker(id: &str) -> String {
    format!("<!-- END GENERATED {id} -->")
}

/// Replaces the generated block `id` of `doc` with `content`; a missing block is added
/// (the machine block after the title, others as a new section at the end).
pub fn replace_block(doc: &str, id: &str, title: &str, content: &str) -> String {
    let begin_prefix = format!("<!-- BEGIN GENERATED {id}:");
    let end = end_marker(id);
    let block = format!("{}\n{}{}", begin_marker(id), content.trim_end().to_string() + "\n", end);
    if let Some(b) = doc.find(&begin_prefix) {
        if let Some(e_rel) = doc[b..].find(&end) {
            let e = b + e_rel + end.len();
            return format!("{}{}{}", &doc[..b], block, &doc[e..]);
        }
    }
    if id == "machine" {
        if let Some(pos) = doc.find("\n# ").map(|p| p + 1).or_else(|| doc.starts_with("# ").then_some(0)) {
            let line_end = doc[pos..].find('\n').map_or(doc.len(), |n| pos + n + 1);
            return format!("{}\n{}\n{}", &doc[..line_end], block, &doc[line_end..]);
        }
        return format!("{block}\n\n{doc}");
    }
    let mut out = doc.trim_end().to_string();
    out.push_str(&format!("\n\n## {title}\n\n{block}\n\nReading: not written yet.\n"));
    out
}

/// Today's date (UTC), `YYYY-MM-DD`.
fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn relative(from_dir: &Path, path: &Path) -> String {
    path.strip_prefix(from_dir).unwrap_or(path).display().to_string()
}

/// The generated Markdown of one entry.
fn entry_block(
    shown: &str,
    results: &[bench::results::EngineResult],
    baseline: Option<&str>,
    plots: &[PathBuf],
    doc_dir: &Path,
    runs: u64,
    shrink: u64,
) -> String {
    let mut s = format!("```sh\nsudo uswap bench {shown}\n```\n\n");
    if shrink > 1 {
        s += &format!("**Shrunk {shrink}× (`uswap report --shrink {shrink}`): a check that the suite runs, not a measurement.**\n\n");
    }
    s += &table::build(results, baseline).to_markdown();
    s += "\n";
    let mut notes = vec![];
    if let Some(b) = baseline {
        notes.push(format!("×zram columns: engine / {b}, above 1 is faster"));
    }
    if runs > 1 {
        notes.push(format!("medians of {runs} interleaved runs"));
    }
    notes.push("latency per access (per page on sequential sides)".into());
    notes.push("errors: accesses that read wrong data, all runs".into());
    s += &format!("{}.", notes.join("; "));
    // TLB shootdowns (`/proc/interrupts`, the whole machine) per major fault, median run:
    // the cost of every `UFFDIO_MOVE` flush on a machine with more CPUs.
    // (A combined run has a row per side of one engine, with the same counters: named once.)
    let mut shootdowns: Vec<String> = vec![];
    for (i, r) in results.iter().enumerate() {
        if results[..i].iter().any(|o| o.engine == r.engine) {
            continue;
        }
        if let Some(x) = bench::kernel::interrupts::per_major_fault(&r.stats) {
            shootdowns.push(format!("{} {x:.2}", r.engine));
        }
    }
    if !shootdowns.is_empty() {
        s += &format!(" TLB shootdowns per major fault: {}.", shootdowns.join(", "));
    }
    for r in results.iter().filter(|r| r.oom_kills > 0 && r.side != bench::workload::Side::Random) {
        s += &format!(
            " The kernel's OOM killer ended {} attempt(s) of {}, which were run again.",
            r.oom_kills, r.engine
        );
    }
    s += &format!(" Measured {}.\n", today());
    // The charts side by side, on one line: the reference stays short (issue 44: 400 lines).
    let charts: Vec<String> = plots
        .iter()
        .map(|p| {
            let rel = relative(doc_dir, p);
            let alt = if rel.contains("latency") { "latency CDF" } else { "throughput" };
            format!("![{alt}]({rel})")
        })
        .collect();
    if !charts.is_empty() {
        s += &format!("\n{}\n", charts.join(" "));
    }
    s
}

fn write_doc(path: &Path, doc: &str) -> Result<(), ReportError> {
    std::fs::write(path, doc).map_err(|source| ReportError::Io { path: path.to_path_buf(), source })
}

fn run(r: &ReportArgs) -> Result<(), ReportError> {
    let entries = selected(r)?;
    let mut planned = vec![];
    for e in &entries {
        let mut tokens = entry_tokens(e, r);
        let shown = tokens.join(" ");
        if r.wait_lock {
            tokens.push("--wait-lock".into());
        }
        let args = BenchLine::try_parse_from(&tokens)
            .map_err(|err| ReportError::BadEntry { id: e.id.to_string(), message: err.to_string() })?
            .args;
        planned.push((*e, shown, args));
    }
    if r.list {
        for (e, shown, _) in &planned {
            println!("{}: uswap bench {shown}", e.id);
        }
        return Ok(());
    }
    let io = |source| ReportError::Io { path: r.out.clone(), source };
    let mut doc = match std::fs::read_to_string(&r.out) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_string(),
        Err(e) => return Err(io(e)),
    };
    let doc_dir = r.out.parent().map(Path::to_path_buf).unwrap_or_default();
    let plots_dir = if r.plots_dir.is_absolute() { r.plots_dir.clone() } else { doc_dir.join(&r.plots_dir) };
    let command: Vec<String> = std::env::args().collect();
    let mut machine = machine::describe();
    machine.push(format!(
        "**Regenerated** {} with `{}`; each section says when it was measured.",
        today(),
        command.join(" ").replace("./target/release/", "")
    ));
    doc = replace_block(&doc, "machine", "", &machine.join("\n\n"));
    write_doc(&r.out, &doc)?;
    let mut sitting = Sitting::default();
    let mut failed: Vec<&str> = vec![];
    for (e, shown, args) in &planned {
        println!("== {}: uswap bench {shown}", e.id);
        let results = match bench::run(args, &mut sitting) {
            Ok(results) => results,
            Err(BenchError::Interrupted) => {
                return Err(ReportError::Bench { id: e.id.to_string(), source: BenchError::Interrupted })
            }
            // One entry that fails (the kernel's OOM killer ending a kernel engine's workload
            // more often than --oom-retries allows, say) does not cost the rest of the suite.
            Err(source) => {
                eprintln!(
                    "uswap report: {}; its section keeps its earlier figures",
                    ReportError::Bench { id: e.id.to_string(), source }
                );
                failed.push(e.id);
                continue;
            }
        };
        let engines = bench::engines_of(args).map_err(|source| ReportError::Bench { id: e.id.to_string(), source })?;
        let baseline = bench::baseline_of(args, &engines).ok().flatten();
        print!("{}", table::build(&results, baseline.as_deref()).to_text());
        let plots = plot::write(&plots_dir, &format!("{}-", e.id), &results, &bench::title(args))
            .map_err(|source| ReportError::Bench { id: e.id.to_string(), source })?;
        let block = entry_block(shown, &results, baseline.as_deref(), &plots, &doc_dir, r.runs, r.shrink);
        doc = replace_block(&doc, e.id, e.title, &block);
        write_doc(&r.out, &doc)?;
    }
    println!("wrote {} and plots in {}", r.out.display(), plots_dir.display());
    if !failed.is_empty() {
        return Err(ReportError::Failed { ids: failed.join(",") });
    }
    Ok(())
}

/// `uswap report`.
pub fn main(r: &ReportArgs) -> ExitCode {
    if let Err(e) = interrupt::install() {
        eprintln!("uswap report: cannot catch Ctrl-C ({e}); an interrupted run may leave swap on");
    }
    match run(r) {
        Ok(()) => ExitCode::SUCCESS,
        Err(ReportError::Bench { source: BenchError::Interrupted, .. }) => {
            eprintln!(
                "uswap report: interrupted; the entries done so far are written, everything set up is cleaned up"
            );
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("uswap report: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_args(extra: &[&str]) -> ReportArgs {
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            r: ReportArgs,
        }
        P::parse_from(std::iter::once("report").chain(extra.iter().copied())).r
    }

    #[test]
    fn every_suite_entry_is_a_valid_bench_command() {
        let r = report_args(&[]);
        for e in SUITE {
            let t = entry_tokens(e, &r);
            let args = BenchLine::try_parse_from(&t).unwrap_or_else(|err| panic!("{}: {err}", e.id)).args;
            let engines = bench::engines_of(&args).unwrap();
            bench::validate(&args, &engines).unwrap_or_else(|err| panic!("{}: {err}", e.id));
            assert_eq!(args.runs, 3);
            let baseline = args.baseline.clone().unwrap_or_else(|| "kernel-zram".into());
            assert!(engines.iter().any(|x| x.name == baseline), "{}: ratios need their baseline {baseline}", e.id);
        }
        let ids: std::collections::HashSet<_> = SUITE.iter().map(|e| e.id).collect();
        assert_eq!(ids.len(), SUITE.len(), "ids are unique");
    }

    #[test]
    fn shrink_and_engine_overrides() {
        let r = report_args(&["--shrink", "64", "--engines", "ram", "--runs", "1"]);
        let t = entry_tokens(&SUITE[0], &r).join(" ");
        assert!(t.contains("--wss 16MiB --limit 8MiB --accesses 7812"), "{t}");
        assert!(t.ends_with("--engines ram --runs 1"), "{t}");
        let r = report_args(&["--oom-retries", "10"]);
        let t = entry_tokens(&SUITE[0], &r);
        assert!(t.join(" ").ends_with("--runs 3 --oom-retries 10"), "{t:?}");
        assert_eq!(BenchLine::try_parse_from(&t).unwrap().args.oom_retries, 10);
    }

    #[test]
    fn blocks_are_replaced_in_place_and_hand_text_is_kept() {
        let doc = format!(
            "# Benchmarks\n\nintro\n\n## A\n\n{}\nold table\n{}\n\nReading: mine.\n",
            begin_marker("a"),
            end_marker("a")
        );
        let d = replace_block(&doc, "a", "A", "new table\n");
        assert!(d.contains("new table") && !d.contains("old table"), "{d}");
        assert!(d.contains("intro") && d.ends_with("Reading: mine.\n"), "{d}");
        assert_eq!(replace_block(&d, "a", "A", "new table\n"), d, "idempotent");
        let d = replace_block(&d, "machine", "", "**Machine:** x");
        assert!(d.starts_with(&format!("# Benchmarks\n\n{}\n**Machine:** x\n", begin_marker("machine"))), "{d}");
        let d = replace_block(&d, "b", "Entry B", "b table");
        assert!(
            d.ends_with(&format!(
                "## Entry B\n\n{}\nb table\n{}\n\nReading: not written yet.\n",
                begin_marker("b"),
                end_marker("b")
            )),
            "{d}"
        );
    }

    #[test]
    fn dates_are_civil() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(t.starts_with("20"), "{t}");
    }
}
