//! What compressing neighbouring pages together would give: a program's anonymous pages
//! (a dump by `bench/density/pages.py`: `NAME.bin`, its mappings' pages in address order,
//! and `NAME.idx`, the number of pages of each mapping) compressed in units of 1, 4 and 16
//! neighbouring pages (4, 16, 64 KiB) with the pool's codecs, lz4 (`lz4_flex`) and zstd
//! level 1 (`zstd-safe`). A unit never spans two mappings nor a same-filled page (the pool
//! stores those as their word); one that does not shrink below 7/8 of its size counts its
//! size (stored raw). Prints a Markdown row per codec and unit: bytes per page, ratio,
//! compression time per page, and the time to decompress a whole unit (what a fault on one
//! of its pages would wait for; every 7th unit timed), p50 and p99.
//!
//!     cargo run --release -p uswap --example page_units -- DIR/NAME

use std::time::Instant;

const PAGE: usize = 4096;
const UNITS_PAGES: [usize; 3] = [1, 4, 16];

#[path = "page_dump/mod.rs"]
mod page_dump;
use page_dump::{percentile, same_filled};

/// The runs of neighbouring pages that are not same-filled, within each mapping, as page
/// ranges; and how many pages are same-filled.
fn runs(data: &[u8], pages_per_mapping: &[usize]) -> (Vec<(usize, usize)>, usize) {
    let (mut runs, mut nr_same, mut at) = (Vec::new(), 0, 0);
    for &n in pages_per_mapping {
        let mut start = None;
        for i in at..at + n {
            if same_filled(&data[i * PAGE..(i + 1) * PAGE]) {
                nr_same += 1;
                if let Some(s) = start.take() {
                    runs.push((s, i));
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        if let Some(s) = start {
            runs.push((s, at + n));
        }
        at += n;
    }
    (runs, nr_same)
}

fn main() {
    let Some(base) = std::env::args().nth(1) else {
        eprintln!("usage: page_units DIR/NAME (NAME.bin and NAME.idx, from bench/density/pages.py)");
        std::process::exit(2);
    };
    let data = std::fs::read(format!("{base}.bin")).expect("read NAME.bin");
    let idx = std::fs::read_to_string(format!("{base}.idx")).expect("read NAME.idx");
    let pages_per_mapping: Vec<usize> = idx.split_whitespace().map(|s| s.parse().expect("a page count")).collect();
    assert_eq!(pages_per_mapping.iter().sum::<usize>() * PAGE, data.len(), "the index does not match the dump");
    let name = base.rsplit('/').next().unwrap_or(&base);
    let (runs, nr_same) = runs(&data, &pages_per_mapping);
    let nr_pages: usize = runs.iter().map(|(s, e)| e - s).sum();
    println!("{name}: {} pages, {nr_same} same-filled, {nr_pages} compressed", data.len() / PAGE);
    let mut cctx = zstd_safe::CCtx::create();
    let mut dctx = zstd_safe::DCtx::create();
    let mut packed = vec![0u8; 2 * UNITS_PAGES[2] * PAGE];
    let mut back = vec![0u8; UNITS_PAGES[2] * PAGE];
    for codec in ["lz4", "zstd-1"] {
        for unit_pages in UNITS_PAGES {
            let (mut bytes, mut nr_units, mut decompress_us) = (0, 0, Vec::new());
            let t0 = Instant::now();
            let units =
                runs.iter().flat_map(|&(s, e)| (s..e).step_by(unit_pages).map(move |i| (i, (i + unit_pages).min(e))));
            for (first, end) in units {
                let src = &data[first * PAGE..end * PAGE];
                let n = match codec {
                    "lz4" => lz4_flex::block::compress_into(src, &mut packed).expect("room for lz4's output"),
                    _ => cctx.compress(&mut packed[..], src, 1).expect("room for zstd's output"),
                };
                let stored_raw = n > src.len() * 7 / 8;
                bytes += if stored_raw { src.len() } else { n };
                nr_units += 1;
                if nr_units % 7 == 0 && !stored_raw {
                    let t = Instant::now();
                    let out = &mut back[..src.len()];
                    match codec {
                        "lz4" => lz4_flex::block::decompress_into(&packed[..n], out).map(drop).expect("lz4 decodes"),
                        _ => dctx.decompress(out, &packed[..n]).map(drop).expect("zstd decodes"),
                    }
                    decompress_us.push(t.elapsed().as_secs_f64() * 1e6);
                    assert_eq!(out, src, "a unit came back different");
                }
            }
            let compress_us_per_page = t0.elapsed().as_secs_f64() * 1e6 / nr_pages as f64;
            println!(
                "| {name} | {codec} | {} KiB | {:.0} | {:.2} | {compress_us_per_page:.1} | {:.2} | {:.2} |",
                unit_pages * 4,
                bytes as f64 / nr_pages as f64,
                (nr_pages * PAGE) as f64 / bytes as f64,
                percentile(&mut decompress_us, 0.5),
                percentile(&mut decompress_us, 0.99),
            );
        }
    }
}
