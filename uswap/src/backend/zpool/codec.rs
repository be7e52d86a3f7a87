//! The compressed pool's codecs: a page compressed with lz4 (`lz4_flex`) or zstd into a
//! scratch buffer, and back (lz4 with lz4's C decoder, `LZ4_decompress_safe`: lz4_flex's
//! copies self-overlapping matches a byte at a time, 2.2 µs of a 5.8 µs sequential swap-in;
//! see BENCHMARKS.md, "Devices, tiers and readahead"). Neither C call allocates or locks.
//!
//! Locking: compression contexts and workspaces (scratch buffers and lz4's hash table) come
//! from lock-free pools filled at start-up; taking one spins until one is free
//! ([`pop_spinning`]), for at most `sync::POP_WAIT_LIMIT_NS`, after which the operation
//! fails (a write: pages stay staged, `swpout_error`; a read: a failed attempt,
//! `fault_error`). So nothing allocates and no lock is taken, and every path is safe in a
//! SIGBUS handler.
//!
//! [`Codecs`] owns the compressor choice, both pools and, with `dict`, the pool's zstd
//! dictionary: trained from samples (`dictionary.rs`) on the background thread, prepared and
//! given contexts of its own there, then published once (`OnceLock`); each frame names its
//! dictionary, so a read picks it by the frame. The pool (`mod.rs`) holds one `Codecs` and
//! calls it with a workspace it took. It imports only the configuration (`config.rs`) and
//! the samples (`dictionary.rs`).
//!
//! Invariants: a zstd context is warmed, before any fault path can use it, for every input
//! size it will be given, and given only sizes whose workspaces are within 2.5 times of
//! each other ([`ContextPlan`]), so using one never allocates; a scratch buffer holds lz4's
//! worst case for a page; an operation takes one [`Workspace`], never two buffers one after
//! the other.

use arrayvec::ArrayVec;
use crossbeam_queue::ArrayQueue;

use std::num::NonZeroU32;

use super::config::{Compressor, ZpoolError, MAX_UNIT_PAGES};
use super::dictionary::{Payoff, Sampler, NR_SAMPLES};
use crate::mapping::nr_cpus_configured;
use crate::sync::{pop_spinning, POP_WAIT_LIMIT_NS};
use crate::uffd::PAGE_SIZE;

/// The sample buffer of a pool with a dictionary.
const SAMPLE_BYTES: u64 = (NR_SAMPLES * PAGE_SIZE) as u64;

/// Scratch per operation: lz4 wants room for its worst case (a little over a page).
const SCRATCH_BYTES: usize = 2 * PAGE_SIZE;

/// A page-aligned scratch buffer for one compression or decompression.
#[repr(C, align(4096))]
pub(super) struct Scratch(pub(super) [u8; SCRATCH_BYTES]);

/// Everything one write or read needs, taken from the pool as one object: taking two
/// buffers one after the other could deadlock once every thread holds one and waits for a
/// second.
pub(super) struct Workspace {
    /// Compressed bytes, written or read.
    pub(super) out: Scratch,
    /// lz4's hash table (8 KiB): `compress_into` would allocate and free one per page,
    /// which a SIGBUS handler must not do.
    pub(super) lz4: lz4_flex::block::CompressTable,
    /// A unit's pages, gathered to be compressed or decompressed to be read (`unit_pages`
    /// pages; empty in a pool without units).
    pub(super) unit: Box<[u8]>,
}

/// zstd's contexts for one operation, warmed at start-up so using them never allocates.
struct ZstdCtx {
    c: ZstdCompress,
    d: zstd_safe::DCtx<'static>,
}

/// zstd's compression contexts for one operation, and which serves an input of each size
/// (see [`ContextPlan`]).
struct ZstdCompress {
    ctxs: ArrayVec<zstd_safe::CCtx<'static>, MAX_UNIT_PAGES>,
    plan: ContextPlan,
}

impl ZstdCompress {
    /// Memory of its contexts, as zstd sizes them (warmed: what they keep).
    fn bytes(&self) -> u64 {
        self.ctxs.iter().map(|c| c.sizeof() as u64).sum()
    }

    /// The compression context for an input of `len` bytes (whole pages, up to a unit).
    fn for_input(&mut self, len: usize) -> &mut zstd_safe::CCtx<'static> {
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        // A size no context was warmed on would allocate (in a SIGBUS handler).
        assert!(
            pages <= self.plan.unit_pages,
            "uswap invariant: an input of {len} bytes in a pool of {} pages",
            self.plan.unit_pages
        );
        &mut self.ctxs[usize::from(self.plan.by_pages[pages - 1])]
    }
}

/// Which context compresses an input of each size (in pages). zstd sizes a context's
/// workspace by its input's size (and, with a dictionary, by whether the input is small
/// enough to use the dictionary's tables in place or large enough to copy them), and
/// resizes it, a `malloc`, when an input needs more, or after 128 inputs needing under a
/// third of it. Every size is measured on a fresh context, and sizes go to one context
/// only while the largest need among them stays within `NEED_RATIO` of the smallest: a
/// context warmed on each of its sizes then never resizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ContextPlan {
    /// The context of an input of `n` pages: `by_pages[n - 1]`.
    by_pages: [u8; MAX_UNIT_PAGES],
    /// Contexts in use.
    nr_ctxs: usize,
    /// The largest input, in pages (the contexts are warmed on every size up to it).
    unit_pages: usize,
}

/// The most a context's largest need may be over its smallest (zstd shrinks a workspace
/// three times too large; the margin is for the context's own objects).
const NEED_RATIO: f64 = 2.5;

impl ContextPlan {
    /// Measures each size's need at `level` (with `dict` if given) and groups sizes.
    /// Allocates: at start-up or on the background thread.
    fn measure(level: i32, unit_pages: usize, dict: Option<&zstd_safe::CDict<'_>>) -> Result<ContextPlan, ZpoolError> {
        assert!((1..=MAX_UNIT_PAGES).contains(&unit_pages), "units of {unit_pages} pages");
        let src = vec![0x5au8; unit_pages * PAGE_SIZE];
        let mut out = vec![0u8; zstd_safe::compress_bound(src.len())];
        let mut needs: ArrayVec<(usize, usize), MAX_UNIT_PAGES> = ArrayVec::new();
        for pages in 1..=unit_pages {
            let mut fresh = zstd_safe::CCtx::create();
            compress_with(&mut fresh, &mut out, &src[..pages * PAGE_SIZE], level, dict)?;
            needs.push((fresh.sizeof(), pages));
        }
        needs.sort_unstable();
        let mut plan = ContextPlan { by_pages: [0; MAX_UNIT_PAGES], nr_ctxs: 1, unit_pages };
        let mut smallest = needs[0].0;
        for &(need, pages) in &needs {
            if need as f64 > smallest as f64 * NEED_RATIO {
                plan.nr_ctxs += 1;
                smallest = need;
            }
            plan.by_pages[pages - 1] = (plan.nr_ctxs - 1) as u8;
        }
        Ok(plan)
    }
}

/// One compression of `src` into `out` on `ctx`, with `dict` if given.
fn compress_with(
    ctx: &mut zstd_safe::CCtx<'static>,
    out: &mut [u8],
    src: &[u8],
    level: i32,
    dict: Option<&zstd_safe::CDict<'_>>,
) -> Result<usize, ZpoolError> {
    match dict {
        Some(dict) => ctx.compress_using_cdict(out, src, dict),
        None => ctx.compress(out, src, level),
    }
    .map_err(|e| ZpoolError::Zstd { what: zstd_safe::get_error_name(e).to_string() })
}

/// The pool's trained dictionary (`zpool:zstd-N:dict`), prepared for both directions, and
/// compression contexts of its own, warmed with it (a context first given a dictionary
/// sizes its workspace for it).
struct Dictionary {
    /// The id every frame compressed with it carries (zstd's frame header).
    id: NonZeroU32,
    cdict: zstd_safe::CDict<'static>,
    ddict: zstd_safe::DDict<'static>,
    /// As many as the pool's own contexts: taken only by a holder of a workspace.
    ctxs: ArrayQueue<Box<ZstdCompress>>,
    /// Memory of `cdict` and `ddict` (counted in the pool's bytes).
    bytes: u64,
    /// Memory of `ctxs` (the pool's `codec_bytes`).
    ctx_bytes: u64,
    /// Whether it pays, checked as pages are written.
    payoff: Payoff,
}

impl Dictionary {
    /// Prepares the dictionary `dict` (trained bytes) for a pool at zstd `level`. Allocates:
    /// on the background thread only.
    fn prepare(dict: &[u8], level: i32, unit_pages: usize, nr_ctx: usize) -> Result<Dictionary, String> {
        let id = zstd_safe::get_dict_id_from_dict(dict).ok_or("the trained dictionary has no id")?;
        let cdict = zstd_safe::CDict::try_create(dict, level).ok_or("zstd could not prepare it to compress")?;
        let ddict = zstd_safe::DDict::try_create(dict).ok_or("zstd could not prepare it to decompress")?;
        let ctxs = ArrayQueue::new(nr_ctx);
        let unit_pages = unit_pages.max(1);
        let plan = ContextPlan::measure(level, unit_pages, Some(&cdict)).map_err(|e| e.to_string())?;
        let mut ctx_bytes = 0;
        for _ in 0..nr_ctx {
            let c =
                warmed_compress(level, unit_pages, Some(&cdict), &plan, |_, _| Ok(())).map_err(|e| e.to_string())?;
            ctx_bytes += c.bytes();
            let _ = ctxs.push(Box::new(c));
        }
        let bytes = (cdict.sizeof() + ddict.sizeof()) as u64;
        Ok(Dictionary { id, cdict, ddict, ctxs, bytes, ctx_bytes, payoff: Payoff::new() })
    }
}

/// The pool's codec and its pre-allocated workspaces and contexts.
pub(super) struct Codecs {
    compressor: Compressor,
    /// Pages of a workspace's unit buffer.
    unit_pages: usize,
    pools: Pools,
    /// In a fork child reading its copy of the parent's pool: pools of its own. The parent's
    /// pools, as copied, can hold a push or pop that another thread of the parent was making
    /// at the fork (a queue slot claimed and never filled: the child's next pop spun for
    /// good, inside a SIGBUS handler), and miss what those threads held.
    fork_child_pools: std::sync::OnceLock<Pools>,
    /// zstd contexts in each pool, and of a dictionary (see [`Sizes`]).
    nr_zstd: usize,
    /// With `dict`: the samples a dictionary is trained from, then where training stands.
    sampler: Option<Sampler>,
    /// The trained dictionary, once the background thread has made it.
    dictionary: std::sync::OnceLock<Dictionary>,
    /// Why a dictionary could not be made, if it could not (the pool goes on without).
    dictionary_error: std::sync::OnceLock<String>,
}

/// Workspaces and zstd contexts, taken and returned without locks.
struct Pools {
    /// Workspaces, one per operation.
    scratch: ArrayQueue<Box<Workspace>>,
    /// zstd's contexts (empty with lz4).
    zstd: ArrayQueue<Box<ZstdCtx>>,
    /// Memory of both, counted when they were made.
    bytes: u64,
}

/// lz4_flex's small hash table (`CompressTable::small`): 4,096 entries of 16 bits, boxed.
const LZ4_TABLE_BYTES: u64 = 4096 * 2;

impl Codecs {
    /// Checks the compressor and fills the pools (see [`Pools::new`]); with `dictionary`
    /// (zstd only), maps the samples a dictionary will be trained from.
    pub(super) fn new(compressor: Compressor, unit_pages: usize, dictionary: bool) -> Result<Codecs, ZpoolError> {
        if let Compressor::Zstd { level } = compressor {
            if !super::config::ZSTD_LEVELS.contains(&level) {
                return Err(ZpoolError::ZstdLevel { level });
            }
        } else if dictionary {
            return Err(ZpoolError::DictionaryNeedsZstd);
        }
        let sampler = match dictionary {
            true => Some(Sampler::new().map_err(|source| ZpoolError::Map { bytes: SAMPLE_BYTES, source })?),
            false => None,
        };
        let sizes = Sizes::of_pager();
        Ok(Codecs {
            compressor,
            unit_pages,
            pools: Pools::new(compressor, unit_pages, sizes)?,
            fork_child_pools: std::sync::OnceLock::new(),
            nr_zstd: sizes.zstd,
            sampler,
            dictionary: std::sync::OnceLock::new(),
            dictionary_error: std::sync::OnceLock::new(),
        })
    }

    /// On the background thread: once the samples are in, trains the dictionary and puts
    /// it in use (see `dictionary.rs`).
    pub(super) fn train_dictionary(&self) {
        let (Some(sampler), Compressor::Zstd { level }) = (&self.sampler, self.compressor) else {
            return;
        };
        let Some(trained) = sampler.train_when_ready() else {
            return;
        };
        match trained.and_then(|dict| Dictionary::prepare(&dict, level, self.unit_pages, self.nr_zstd)) {
            Ok(d) => {
                let _ = self.dictionary.set(d);
            }
            Err(why) => {
                let _ = self.dictionary_error.set(why);
            }
        }
    }

    /// Memory of the dictionary in use (0 without one).
    pub(super) fn dictionary_bytes(&self) -> u64 {
        self.dictionary.get().map_or(0, |d| d.bytes)
    }

    /// Memory the codecs hold whatever the pool stores: the workspaces and zstd contexts
    /// of the pools in use (a fork child's own), the dictionary's contexts, and the
    /// samples taken so far while a dictionary waits for them. Fixed at start but for the
    /// last two; not in the pool's bytes, whose cap it does not count against.
    pub(super) fn codec_bytes(&self) -> u64 {
        let dictionary_ctxs = self.dictionary.get().map_or(0, |d| d.ctx_bytes);
        let samples = self.sampler.as_ref().map_or(0, Sampler::buffer_bytes);
        self.pools().bytes + dictionary_ctxs + samples
    }

    /// Whether new pages are compressed with a dictionary now, and how many times it was
    /// turned off for costing bytes.
    pub(super) fn dictionary_use(&self) -> (bool, u64) {
        self.dictionary.get().map_or((false, 0), |d| (d.payoff.in_use(), d.payoff.turned_off()))
    }

    /// Why the pool's dictionary could not be made, if it could not.
    pub(super) fn dictionary_error(&self) -> Option<&str> {
        self.dictionary_error.get().map(String::as_str)
    }

    /// The dictionary new pages are compressed with: none in a fork child (its pools are its
    /// own; the parent's dictionary contexts may have been held by its other threads).
    fn dictionary_for_writes(&self) -> Option<&Dictionary> {
        match self.fork_child_pools.get() {
            Some(_) => None,
            None => self.dictionary.get(),
        }
    }

    /// In a fork child, before its first read of its copy of the parent's pool (see
    /// `Backend::enter_fork_child`): fresh pools from now on, small (the child only reads
    /// back what it inherited, and most children exec at once). Allocates; not on a fault
    /// path. Failing (zstd's contexts cannot be made), the parent's copies stay in use.
    pub(super) fn enter_fork_child(&self) {
        if let Some(sampler) = &self.sampler {
            sampler.stop();
        }
        let sizes = Sizes { workspaces: FORK_CHILD_POOL_SIZE, zstd: FORK_CHILD_POOL_SIZE };
        if let Ok(pools) = Pools::new(self.compressor, self.unit_pages, sizes) {
            let _ = self.fork_child_pools.set(pools);
        }
    }

    fn pools(&self) -> &Pools {
        self.fork_child_pools.get().unwrap_or(&self.pools)
    }
}

/// Workspaces (and zstd contexts) of a fork child's pools: its reads of what it inherited
/// wait for one when more of its threads read at once.
const FORK_CHILD_POOL_SIZE: usize = 4;

/// How many of each a pool holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    /// Workspaces: a pager's `4 * max(CPUs, 4)`, so that threads rarely wait for one
    /// (16 KiB each).
    pub(super) workspaces: usize,
    /// zstd contexts (and as many of a dictionary's): a pager's `2 * max(CPUs, 2)`. A
    /// context is held for one page's compression or decompression (5-30 µs), by a thread
    /// that waits on nothing else meanwhile, so at most one per running CPU is in use but
    /// for a holder preempted; each costs about 170 KB (74 KB to compress at level 1, 96 KB
    /// to decompress); 16 of them, with a dictionary's, were 4.2 MB beside sqlite3's 19 MB
    /// pool under 128 MiB (BENCHMARKS.md, "Memory per swapped page").
    pub(super) zstd: usize,
}

impl Sizes {
    /// A pager's own pools (a fork child's are smaller).
    pub(super) fn of_pager() -> Sizes {
        let cpus = nr_cpus_configured();
        Sizes { workspaces: 4 * cpus.max(4), zstd: 2 * cpus.max(2) }
    }
}

impl Pools {
    /// `sizes.workspaces` workspaces, each with room for a unit of `unit_pages` (none for
    /// 1), and `sizes.zstd` zstd contexts (warmed up) when the compressor is zstd (its
    /// level checked by the caller). A holder of a workspace may wait for a zstd context,
    /// never the other way round.
    fn new(compressor: Compressor, unit_pages: usize, sizes: Sizes) -> Result<Pools, ZpoolError> {
        let zstd = ArrayQueue::new(sizes.zstd);
        let mut bytes = 0;
        if let Compressor::Zstd { level } = compressor {
            let plan = ContextPlan::measure(level, unit_pages.max(1), None)?;
            for _ in 0..sizes.zstd {
                let ctx = warmed_zstd(level, unit_pages.max(1), &plan)?;
                bytes += ctx.c.bytes() + ctx.d.sizeof() as u64;
                let _ = zstd.push(Box::new(ctx));
            }
        }
        let scratch = ArrayQueue::new(sizes.workspaces);
        for _ in 0..sizes.workspaces {
            let unit = vec![0u8; if unit_pages > 1 { unit_pages * PAGE_SIZE } else { 0 }].into_boxed_slice();
            bytes += (std::mem::size_of::<Workspace>() + unit.len()) as u64 + LZ4_TABLE_BYTES;
            let _ = scratch.push(Box::new(Workspace {
                out: Scratch([0; SCRATCH_BYTES]),
                // Small: 16-bit entries, enough for inputs under 64 KiB (a page).
                lz4: lz4_flex::block::CompressTable::small(),
                unit,
            }));
        }
        Ok(Pools { scratch, zstd, bytes })
    }
}

/// zstd's compression contexts warmed for every input the pool compresses (see
/// [`warmed_compress`]), and a decompression context.
fn warmed_zstd(level: i32, unit_pages: usize, plan: &ContextPlan) -> Result<ZstdCtx, ZpoolError> {
    let mut d = zstd_safe::DCtx::create();
    let mut back = vec![0u8; unit_pages * PAGE_SIZE];
    // Each frame the warming compresses is decompressed once too.
    let c = warmed_compress(level, unit_pages, None, plan, |src, frame| {
        d.decompress(&mut back[..src.len()], frame)
            .map(|_| ())
            .map_err(|e| ZpoolError::Zstd { what: zstd_safe::get_error_name(e).to_string() })
    })?;
    Ok(ZstdCtx { c, d })
}

/// Compression contexts as `plan` says (measured for `level`, `unit_pages` and `dict`), each
/// warmed on every input size it serves (a page; a unit's pages, and every size down to two
/// pages: a unit cut short at the end of a run), so that no later compression allocates. A
/// context warmed on a page once grew from 74 KB to 218 KB at its first 16 KiB unit, a
/// `malloc` inside a SIGBUS handler, which ended programs paging into
/// `zpool:zstd-1:unit=16KiB` in signal mode; with a dictionary at level 4, a context of
/// units grew to 1.2 MB copying the dictionary's tables for 20-32 KiB and shrank back to
/// 0.3 MB for 16 KiB, where it uses them in place. `zstd_contexts_never_resize` checks
/// every level. `each_frame(input, frame)` sees every compression the warming makes.
fn warmed_compress(
    level: i32,
    unit_pages: usize,
    dict: Option<&zstd_safe::CDict<'_>>,
    plan: &ContextPlan,
    mut each_frame: impl FnMut(&[u8], &[u8]) -> Result<(), ZpoolError>,
) -> Result<ZstdCompress, ZpoolError> {
    let mut c = ZstdCompress { ctxs: (0..plan.nr_ctxs).map(|_| zstd_safe::CCtx::create()).collect(), plan: *plan };
    let src = vec![0x5au8; unit_pages * PAGE_SIZE];
    let mut out = vec![0u8; zstd_safe::compress_bound(src.len())];
    for len in (PAGE_SIZE..=src.len()).step_by(PAGE_SIZE) {
        let n = compress_with(c.for_input(len), &mut out, &src[..len], level, dict)?;
        each_frame(&src[..len], &out[..n])?;
    }
    Ok(c)
}

impl Codecs {
    /// Compresses `src` into `dst`; returns the compressed length, or None if it did not
    /// fit (which counts as incompressible).
    pub(super) fn compress(
        &self,
        src: &[u8],
        dst: &mut [u8],
        lz4: &mut lz4_flex::block::CompressTable,
    ) -> Option<usize> {
        match self.compressor {
            Compressor::Lz4 => lz4_flex::block::compress_into_with_table(src, dst, lz4).ok(),
            Compressor::Zstd { level } => {
                if let Some(dict) = self.dictionary_for_writes() {
                    return self.compress_with_dictionary(dict, level, src, dst);
                }
                if let Some(sampler) = &self.sampler {
                    sampler.offer(src);
                }
                self.compress_zstd(level, src, dst)
            }
        }
    }

    /// zstd without a dictionary (None: it did not fit `dst`).
    fn compress_zstd(&self, level: i32, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        // (None cannot happen, see `take_zstd`; were it to, the page is stored as it is, or
        // passed on, like an incompressible one.)
        let mut ctx = self.take_zstd()?;
        let r = compress_with(ctx.c.for_input(src.len()), dst, src, level, None).ok();
        let _ = self.pools().zstd.push(ctx);
        r
    }

    /// zstd with the pool's dictionary while it pays, without it while not; now and then
    /// both ways, the kept one last (see `dictionary::Payoff`). Holds a dictionary context
    /// and a plain one one after the other, never both (so neither kind waits for the other).
    fn compress_with_dictionary(&self, dict: &Dictionary, level: i32, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let with = |dst: &mut [u8]| {
            let mut c = pop_spinning(&dict.ctxs, POP_WAIT_LIMIT_NS)?;
            let r = compress_with(c.for_input(src.len()), dst, src, 0, Some(&dict.cdict)).ok();
            let _ = dict.ctxs.push(c);
            r
        };
        let (in_use, check) = (dict.payoff.in_use(), dict.payoff.check_due());
        if !check {
            return if in_use { with(dst) } else { self.compress_zstd(level, src, dst) };
        }
        // Both ways into `dst`, the one kept last.
        let (with_dict, without) = if in_use {
            let without = self.compress_zstd(level, src, dst);
            (with(dst), without)
        } else {
            let with_dict = with(dst);
            (with_dict, self.compress_zstd(level, src, dst))
        };
        // A page that does not fit counts as stored whole.
        dict.payoff.note(with_dict.unwrap_or(src.len()), without.unwrap_or(src.len()));
        if in_use {
            with_dict
        } else {
            without
        }
    }

    /// Decompresses one page: whether `src` gave exactly a page into `dst`.
    pub(super) fn decompress(&self, src: &[u8], dst: &mut [u8]) -> bool {
        self.decompress_into(src, dst) == Some(PAGE_SIZE)
    }

    /// Decompresses `src` into `dst` (a page, or a unit's pages): the bytes it gave, or None
    /// if `src` is not compressed data that fits `dst`.
    pub(super) fn decompress_into(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match self.compressor {
            Compressor::Lz4 => {
                let (Ok(src_len), Ok(dst_len)) = (i32::try_from(src.len()), i32::try_from(dst.len())) else {
                    return None;
                };
                // SAFETY: LZ4_decompress_safe reads at most `src_len` bytes of `src` and writes
                // at most `dst_len` bytes into `dst` (both slices we hold for the call), whatever
                // the input: it is the decoder lz4 documents as safe on malformed data. It
                // allocates nothing and takes no lock (signal-mode swap-ins call it).
                let n = unsafe {
                    lz4_sys::LZ4_decompress_safe(src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len)
                };
                usize::try_from(n).ok()
            }
            Compressor::Zstd { .. } => {
                // None cannot happen, see `take_zstd`: a failed read, retried.
                let mut ctx = self.take_zstd()?;
                // A frame says which dictionary it needs: none (written before the pool had
                // one), or the pool's; another id is damage, read as a failed read.
                let r = match zstd_safe::get_dict_id_from_frame(src) {
                    None => ctx.d.decompress(dst, src).ok(),
                    Some(id) => match self.dictionary.get() {
                        Some(dict) if dict.id == id => ctx.d.decompress_using_ddict(dst, src, &dict.ddict).ok(),
                        _ => None,
                    },
                };
                let _ = self.pools().zstd.push(ctx);
                r
            }
        }
    }

    /// Takes a workspace, waiting while every one is in use; None past
    /// `sync::POP_WAIT_LIMIT_NS`. The pools hold `4 * max(CPUs, 4)` workspaces and
    /// `2 * max(CPUs, 2)` zstd contexts ([`Sizes`]), each held for one call's
    /// (de)compression with no lock and no system call, so a wait ends when another thread
    /// finishes; the bound is for a holder that never runs again.
    pub(super) fn take_workspace(&self) -> Option<Box<Workspace>> {
        pop_spinning(&self.pools().scratch, POP_WAIT_LIMIT_NS)
    }

    /// Gives back a workspace [`Codecs::take_workspace`] took.
    pub(super) fn put_workspace(&self, ws: Box<Workspace>) {
        let _ = self.pools().scratch.push(ws);
    }

    /// Takes a zstd context. Never waits in fact: there are as many contexts as workspaces
    /// and one is taken only by a holder of a workspace, one at a time.
    fn take_zstd(&self) -> Option<Box<ZstdCtx>> {
        pop_spinning(&self.pools().zstd, POP_WAIT_LIMIT_NS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A warmed context is never resized by the inputs a pool gives it (units, units cut
    /// short, single pages, in runs of one size longer than the 128 calls after which zstd
    /// shrinks a workspace left over three times too large), at every level a pool takes,
    /// without and with a dictionary: its size stays what warming made it, so no
    /// compression or decompression allocates. Levels run on threads of their own.
    #[test]
    fn zstd_contexts_never_resize() {
        let data: Vec<u8> =
            (0..9 * PAGE_SIZE as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i as u8)).collect();
        let samples = super::super::tests::text_pages(NR_SAMPLES, 7);
        let mut trained = vec![0u8; super::super::dictionary::DICT_BYTES];
        let n = zstd_safe::train_from_buffer(&mut trained[..], &samples, &vec![PAGE_SIZE; NR_SAMPLES]).expect("trains");
        trained.truncate(n);
        std::thread::scope(|s| {
            for level in super::super::config::ZSTD_LEVELS {
                let (data, trained) = (&data, &trained);
                s.spawn(move || {
                    let cdict = zstd_safe::CDict::create(trained, level);
                    let ddict = zstd_safe::DDict::create(trained);
                    for unit_pages in [1, 2, 4, 8] {
                        never_resizes(data, level, unit_pages, None);
                        never_resizes(data, level, unit_pages, Some((&cdict, &ddict)));
                    }
                });
            }
        });
    }

    fn never_resizes(
        data: &[u8],
        level: i32,
        unit_pages: usize,
        dict: Option<(&zstd_safe::CDict<'_>, &zstd_safe::DDict<'_>)>,
    ) {
        let plan = ContextPlan::measure(level, unit_pages, dict.map(|d| d.0)).expect("measured");
        let mut c =
            warmed_compress(level, unit_pages, dict.map(|d| d.0), &plan, |_, _| Ok(())).expect("a zstd context");
        let plain_plan = ContextPlan::measure(level, unit_pages, None).expect("measured");
        let mut d = warmed_zstd(level, unit_pages, &plain_plan).expect("a zstd context").d;
        let sizes_of =
            |c: &ZstdCompress, d: &zstd_safe::DCtx| (c.ctxs.iter().map(|c| c.sizeof()).collect::<Vec<_>>(), d.sizeof());
        let warmed = sizes_of(&c, &d);
        let mut out = vec![0u8; zstd_safe::compress_bound(8 * PAGE_SIZE)];
        let mut back = vec![0u8; 8 * PAGE_SIZE];
        // Long runs of each size a write can give (a unit, one cut short, a page), then
        // units again.
        let sizes = (1..=unit_pages).rev().chain(1..=unit_pages).map(|n| n * PAGE_SIZE);
        for len in sizes {
            for k in 0..130 {
                let src = &data[(k % 4) * 64..][..len];
                let n = compress_with(c.for_input(len), &mut out, src, level, dict.map(|d| d.0)).expect("compresses");
                let got = match dict {
                    None => d.decompress(&mut back[..len], &out[..n]),
                    Some((_, dd)) => d.decompress_using_ddict(&mut back[..len], &out[..n], dd),
                }
                .expect("decompresses");
                assert_eq!(&back[..got], src);
                assert_eq!(
                    sizes_of(&c, &d),
                    warmed,
                    "level {level}, units of {unit_pages} pages, dictionary {}: resized at {len} bytes (call {k})",
                    dict.is_some()
                );
            }
        }
    }
}
