//! What a dictionary trained on a program's own pages would give the pool, page by page: a
//! program's anonymous pages (a dump by `bench/density/pages.py`: `NAME.bin` and `NAME.idx`,
//! as for `page_units`), same-filled pages left out (the pool stores those as their word).
//! Every 16th page (at most 4,096 of them) trains a zstd dictionary of 64 KiB
//! (`ZDICT_trainFromBuffer`); the other pages, which the training never saw, are then
//! compressed one at a time: lz4 (lz4's C compressor, as the pool's `lz4_flex` within 1 %)
//! and zstd at levels 1 and 3, each without and with the dictionary (lz4's with its last 64
//! KiB, attached to the stream page after page as zram's would be; zstd's as a prepared
//! `CDict`/`DDict`). A page that does not shrink under 3,584 bytes counts 4,096 (stored
//! raw). Prints a Markdown row per codec: bytes per page, ratio, compression time per page,
//! decompression time p50 and p99 (every 7th page timed, and checked).
//!
//!     cargo run --release -p uswap --example page_dict -- DIR/NAME

// Links the lz4 that lz4-sys builds, whose functions are declared below.
use lz4_sys as _;
use std::os::raw::{c_char, c_int, c_void};
use std::time::Instant;

const PAGE: usize = 4096;
const RAW_FROM: usize = 3584;
const DICT_BYTES: usize = 64 << 10;

// lz4's streaming API with an attached dictionary, from the lz4 that lz4-sys builds (1.10:
// `LZ4_attach_dictionary` and `LZ4_resetStream_fast` are part of its stable API).
extern "C" {
    fn LZ4_createStream() -> *mut c_void;
    fn LZ4_loadDict(stream: *mut c_void, dict: *const c_char, dict_size: c_int) -> c_int;
    fn LZ4_resetStream_fast(stream: *mut c_void);
    fn LZ4_attach_dictionary(working: *mut c_void, dict: *const c_void);
    fn LZ4_compress_fast_continue(
        stream: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_compress_default(src: *const c_char, dst: *mut c_char, src_size: c_int, dst_capacity: c_int) -> c_int;
    fn LZ4_decompress_safe(src: *const c_char, dst: *mut c_char, compressed: c_int, dst_capacity: c_int) -> c_int;
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        compressed: c_int,
        dst_capacity: c_int,
        dict: *const c_char,
        dict_size: c_int,
    ) -> c_int;
}

#[path = "page_dump/mod.rs"]
mod page_dump;
use page_dump::{percentile, same_filled};

/// One codec: compresses `src` into `dst` (returns the size), and decompresses it back.
enum Codec<'d> {
    Lz4,
    Lz4Dict { dict: &'d [u8], dict_stream: *mut c_void, work: *mut c_void },
    Zstd { level: i32 },
    ZstdDict { cdict: zstd_safe::CDict<'static>, ddict: zstd_safe::DDict<'static> },
}

impl Codec<'_> {
    fn compress(&mut self, cctx: &mut zstd_safe::CCtx, src: &[u8], dst: &mut [u8]) -> usize {
        let (s, d, cap) = (src.as_ptr().cast(), dst.as_mut_ptr().cast(), dst.len() as c_int);
        match self {
            // SAFETY: lz4 reads `src.len()` bytes and writes at most `cap` into `dst`.
            Codec::Lz4 => unsafe { LZ4_compress_default(s, d, src.len() as c_int, cap) as usize },
            Codec::Lz4Dict { dict_stream, work, .. } => {
                // SAFETY: the working stream is reset and given the loaded dictionary's
                // tables (the dictionary's bytes outlive both streams); then as above.
                unsafe {
                    LZ4_resetStream_fast(*work);
                    LZ4_attach_dictionary(*work, *dict_stream);
                    LZ4_compress_fast_continue(*work, s, d, src.len() as c_int, cap, 1) as usize
                }
            }
            Codec::Zstd { level } => cctx.compress(dst, src, *level).expect("room for zstd's output"),
            Codec::ZstdDict { cdict, .. } => {
                cctx.compress_using_cdict(dst, src, cdict).expect("room for zstd's output")
            }
        }
    }

    fn decompress(&self, dctx: &mut zstd_safe::DCtx, src: &[u8], dst: &mut [u8]) -> usize {
        let (s, d, cap) = (src.as_ptr().cast(), dst.as_mut_ptr().cast(), dst.len() as c_int);
        match self {
            // SAFETY: lz4 reads `src.len()` bytes and writes at most `cap` into `dst`.
            Codec::Lz4 => unsafe { LZ4_decompress_safe(s, d, src.len() as c_int, cap) as usize },
            // SAFETY: as above, the dictionary's bytes read in place.
            Codec::Lz4Dict { dict, .. } => unsafe {
                LZ4_decompress_safe_usingDict(s, d, src.len() as c_int, cap, dict.as_ptr().cast(), dict.len() as c_int)
                    as usize
            },
            Codec::Zstd { .. } => dctx.decompress(dst, src).expect("zstd decodes"),
            Codec::ZstdDict { ddict, .. } => dctx.decompress_using_ddict(dst, src, ddict).expect("zstd decodes"),
        }
    }
}

fn main() {
    let Some(base) = std::env::args().nth(1) else {
        eprintln!("usage: page_dict DIR/NAME (NAME.bin and NAME.idx, from bench/density/pages.py)");
        std::process::exit(2);
    };
    let data = std::fs::read(format!("{base}.bin")).expect("read NAME.bin");
    let name = base.rsplit('/').next().unwrap_or(&base).to_string();
    let pages: Vec<&[u8]> = data.chunks_exact(PAGE).filter(|p| !same_filled(p)).collect();
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (i, p) in pages.iter().enumerate() {
        if i % 16 == 0 && train.len() < 4096 {
            train.push(*p);
        } else {
            test.push(*p);
        }
    }
    let samples: Vec<u8> = train.concat();
    let sizes = vec![PAGE; train.len()];
    let mut dict = vec![0u8; DICT_BYTES];
    let t = Instant::now();
    let n = zstd_safe::train_from_buffer(&mut dict[..], &samples, &sizes).expect("a dictionary trains");
    dict.truncate(n);
    println!(
        "{name}: {} pages, {} not same-filled; trained on {} in {:.1} s ({} bytes); {} compressed",
        data.len() / PAGE,
        pages.len(),
        train.len(),
        t.elapsed().as_secs_f64(),
        dict.len(),
        test.len()
    );
    // SAFETY: a new stream, loaded with the dictionary (whose bytes outlive it), and a
    // working stream for the pages; neither is freed (the program ends).
    let (dict_stream, work) = unsafe {
        let ds = LZ4_createStream();
        LZ4_loadDict(ds, dict.as_ptr().cast(), dict.len() as c_int);
        (ds, LZ4_createStream())
    };
    let codecs: Vec<(&str, Codec)> = vec![
        ("lz4", Codec::Lz4),
        ("lz4 + dictionary", Codec::Lz4Dict { dict: &dict, dict_stream, work }),
        ("zstd-1", Codec::Zstd { level: 1 }),
        (
            "zstd-1 + dictionary",
            Codec::ZstdDict { cdict: zstd_safe::create_cdict(&dict, 1), ddict: zstd_safe::create_ddict(&dict) },
        ),
        ("zstd-3", Codec::Zstd { level: 3 }),
        (
            "zstd-3 + dictionary",
            Codec::ZstdDict { cdict: zstd_safe::create_cdict(&dict, 3), ddict: zstd_safe::create_ddict(&dict) },
        ),
    ];
    let mut cctx = zstd_safe::CCtx::create();
    let mut dctx = zstd_safe::DCtx::create();
    let (mut packed, mut back) = (vec![0u8; 2 * PAGE], vec![0u8; PAGE]);
    for (label, mut codec) in codecs {
        let (mut bytes, mut decompress_us) = (0usize, Vec::<f64>::new());
        let t0 = Instant::now();
        for (i, src) in test.iter().enumerate() {
            let n = codec.compress(&mut cctx, src, &mut packed);
            assert!(n > 0, "{label}: a page did not compress");
            bytes += if n >= RAW_FROM { PAGE } else { n };
            if i % 7 == 0 && n < RAW_FROM {
                let t = Instant::now();
                let got = codec.decompress(&mut dctx, &packed[..n], &mut back);
                decompress_us.push(t.elapsed().as_secs_f64() * 1e6);
                assert!(got == PAGE && back[..] == src[..], "{label}: a page came back different");
            }
        }
        // The decompressions timed inside the loop are not compression's.
        let decompress_total_us: f64 = decompress_us.iter().sum();
        let compress_us = (t0.elapsed().as_secs_f64() * 1e6 - decompress_total_us) / test.len() as f64;
        println!(
            "| {name} | {label} | {:.0} | {:.2} | {compress_us:.1} | {:.2} | {:.2} |",
            bytes as f64 / test.len() as f64,
            (test.len() * PAGE) as f64 / bytes as f64,
            percentile(&mut decompress_us, 0.5),
            percentile(&mut decompress_us, 0.99),
        );
    }
}
