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
//! [`Codecs`] owns the compressor choice and both pools; the pool (`mod.rs`) holds one and
//! calls it with a workspace it took. It imports only the configuration (`config.rs`).
//!
//! Invariants: a zstd context is warmed at start-up for every input size it will be given
//! (a compression sizes its workspace by its input's size), single pages and units on
//! contexts of their own, so using one never allocates (`warmed_zstd`); a scratch buffer
//! holds lz4's worst case for a page; an operation takes one [`Workspace`], never two
//! buffers one after the other.

use crossbeam_queue::ArrayQueue;

use super::config::{Compressor, ZpoolError};
use crate::mapping::nr_cpus_configured;
use crate::sync::{pop_spinning, POP_WAIT_LIMIT_NS};
use crate::uffd::PAGE_SIZE;

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
/// Single pages and units have compression contexts of their own: a context is sized by
/// its input's size and resized, a `malloc`, when an input needs more, or after 128 inputs
/// needing under a third of it (`warmed_zstd`).
struct ZstdCtx {
    /// Compresses single pages only.
    page: zstd_safe::CCtx<'static>,
    /// Compresses a unit's pages (two pages or more; None in a pool without units).
    units: Option<zstd_safe::CCtx<'static>>,
    d: zstd_safe::DCtx<'static>,
}

impl ZstdCtx {
    /// The compression context for an input of `len` bytes.
    fn for_input(&mut self, len: usize) -> &mut zstd_safe::CCtx<'static> {
        match &mut self.units {
            Some(units) if len > PAGE_SIZE => units,
            _ => &mut self.page,
        }
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
}

/// Workspaces and zstd contexts, taken and returned without locks.
struct Pools {
    /// Workspaces, one per operation.
    scratch: ArrayQueue<Box<Workspace>>,
    /// zstd's contexts (empty with lz4).
    zstd: ArrayQueue<Box<ZstdCtx>>,
}

impl Codecs {
    /// Checks the compressor and fills the pools (see [`Pools::new`]).
    pub(super) fn new(compressor: Compressor, unit_pages: usize) -> Result<Codecs, ZpoolError> {
        if let Compressor::Zstd { level } = compressor {
            if !super::config::ZSTD_LEVELS.contains(&level) {
                return Err(ZpoolError::ZstdLevel { level });
            }
        }
        let nr_cpus = nr_cpus_configured().max(1);
        let pools = Pools::new(compressor, unit_pages, 4 * nr_cpus.max(4))?;
        Ok(Codecs { compressor, unit_pages, pools, fork_child_pools: std::sync::OnceLock::new() })
    }

    /// In a fork child, before its first read of its copy of the parent's pool (see
    /// `Backend::enter_fork_child`): fresh pools from now on, small (the child only reads
    /// back what it inherited, and most children exec at once). Allocates; not on a fault
    /// path. Failing (zstd's contexts cannot be made), the parent's copies stay in use.
    pub(super) fn enter_fork_child(&self) {
        if let Ok(pools) = Pools::new(self.compressor, self.unit_pages, FORK_CHILD_POOL_SIZE) {
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

impl Pools {
    /// `nr_ctx` workspaces (a pager's own: `4 * max(CPUs, 4)`), each with room for a unit of
    /// `unit_pages` (none for 1), and as many zstd contexts (warmed up) when the compressor
    /// is zstd (its level checked by the caller).
    fn new(compressor: Compressor, unit_pages: usize, nr_ctx: usize) -> Result<Pools, ZpoolError> {
        let zstd = ArrayQueue::new(nr_ctx);
        if let Compressor::Zstd { level } = compressor {
            for _ in 0..nr_ctx {
                let _ = zstd.push(Box::new(warmed_zstd(level, unit_pages)?));
            }
        }
        let scratch = ArrayQueue::new(nr_ctx);
        for _ in 0..nr_ctx {
            let _ = scratch.push(Box::new(Workspace {
                out: Scratch([0; SCRATCH_BYTES]),
                // Small: 16-bit entries, enough for inputs under 64 KiB (a page).
                lz4: lz4_flex::block::CompressTable::small(),
                unit: vec![0u8; if unit_pages > 1 { unit_pages * PAGE_SIZE } else { 0 }].into_boxed_slice(),
            }));
        }
        Ok(Pools { scratch, zstd })
    }
}

/// zstd's contexts warmed for every input the pool compresses (a page; a unit's pages, and
/// every size down to two pages), so that no later compression allocates: zstd sizes a
/// context by its input's size (a context warmed on a page grew from 74 KB to 218 KB at its
/// first 16 KiB unit: a `malloc` inside a SIGBUS handler, which ended programs paging into
/// `zpool:zstd-1:unit=16KiB` in signal mode), and shrinks it again after 128 inputs that
/// need under a third of it (single pages after units did at level 2). With pages and
/// units apart, neither happens at any level (`zstd_contexts_never_resize`).
fn warmed_zstd(level: i32, unit_pages: usize) -> Result<ZstdCtx, ZpoolError> {
    let zstd_error = |e| ZpoolError::Zstd { what: zstd_safe::get_error_name(e).to_string() };
    let units = (unit_pages > 1).then(zstd_safe::CCtx::create);
    let mut ctx = ZstdCtx { page: zstd_safe::CCtx::create(), units, d: zstd_safe::DCtx::create() };
    let largest = unit_pages.max(1) * PAGE_SIZE;
    // The workspace depends on the input's size, not on its bytes, and not monotonically
    // (zstd's parameters for inputs up to 16 KiB need more than those for 32 KiB): every
    // size a write can give, a unit cut short at the end of a run included.
    let src = vec![0x5au8; largest];
    let mut out = vec![0u8; zstd_safe::compress_bound(largest)];
    let mut back = vec![0u8; largest];
    for len in (PAGE_SIZE..=largest).step_by(PAGE_SIZE) {
        let n = ctx.for_input(len).compress(&mut out[..], &src[..len], level).map_err(zstd_error)?;
        ctx.d.decompress(&mut back[..len], &out[..n]).map_err(zstd_error)?;
    }
    Ok(ctx)
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
                // (None cannot happen, see `take_zstd`; were it to, the page is stored as it
                // is, or passed on, like an incompressible one.)
                let mut ctx = self.take_zstd()?;
                let r = ctx.for_input(src.len()).compress(dst, src, level).ok();
                let _ = self.pools().zstd.push(ctx);
                r
            }
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
                let r = ctx.d.decompress(dst, src);
                let _ = self.pools().zstd.push(ctx);
                r.ok()
            }
        }
    }

    /// Takes a workspace, waiting while every one is in use; None past
    /// `sync::POP_WAIT_LIMIT_NS`. The pools (workspaces, zstd contexts) hold
    /// `4 * max(CPUs, 4)` objects, each held for one call's (de)compression with no lock and
    /// no system call, so a wait ends when another thread finishes; the bound is for a
    /// holder that never runs again.
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
    /// shrinks a workspace left over three times too large), at every level a pool takes:
    /// its size stays what warming made it, so no compression or decompression allocates.
    #[test]
    fn zstd_contexts_never_resize() {
        let data: Vec<u8> =
            (0..9 * PAGE_SIZE as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i as u8)).collect();
        for level in super::super::config::ZSTD_LEVELS {
            for unit_pages in [1, 2, 4, 8] {
                let mut ctx = warmed_zstd(level, unit_pages).expect("a zstd context");
                let sizes_of =
                    |ctx: &ZstdCtx| (ctx.page.sizeof(), ctx.units.as_ref().map(|u| u.sizeof()), ctx.d.sizeof());
                let warmed = sizes_of(&ctx);
                let mut out = vec![0u8; zstd_safe::compress_bound(8 * PAGE_SIZE)];
                let mut back = vec![0u8; 8 * PAGE_SIZE];
                // Long runs of each size a write can give (a unit, one cut short, a page),
                // then units again.
                let sizes = (1..=unit_pages).rev().chain(1..=unit_pages).map(|n| n * PAGE_SIZE);
                for len in sizes {
                    for k in 0..130 {
                        let src = &data[(k % 4) * 64..][..len];
                        let n = ctx.for_input(len).compress(&mut out[..], src, level).expect("compresses");
                        let got = ctx.d.decompress(&mut back[..len], &out[..n]).expect("decompresses");
                        assert_eq!(&back[..got], src);
                        let now = sizes_of(&ctx);
                        assert_eq!(
                            now, warmed,
                            "level {level}, units of {unit_pages} pages: resized at {len} bytes (call {k})"
                        );
                    }
                }
            }
        }
    }
}
