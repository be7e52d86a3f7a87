//! The compressed pool's codecs: a page compressed with lz4 (`lz4_flex`) or zstd into a
//! scratch buffer, and back.
//!
//! Locking: compression contexts and scratch buffers come from lock-free pools filled at
//! start-up; taking one spins until one is free ([`pop_spinning`]). So nothing allocates and
//! no lock is taken, and every path is safe in a SIGBUS handler.
//!
//! Invariants: a zstd context is warmed at start-up (the first compression sizes its
//! workspace), so using it never allocates; a scratch buffer holds lz4's worst case for a
//! page.

use super::{Compressor, ZpoolBackend};
use crate::sync::pop_spinning;
use crate::uffd::PAGE_SIZE;

/// Scratch per operation: lz4 wants room for its worst case (a little over a page).
pub(super) const SCRATCH_BYTES: usize = 2 * PAGE_SIZE;

/// A page-aligned scratch buffer for one compression or decompression.
#[repr(C, align(4096))]
pub(super) struct Scratch(pub(super) [u8; SCRATCH_BYTES]);

/// A compression context for zstd, warmed at start-up so using it never allocates.
pub(super) struct ZstdCtx {
    pub(super) c: zstd_safe::CCtx<'static>,
    pub(super) d: zstd_safe::DCtx<'static>,
}

impl ZpoolBackend {
    /// Compresses `src` into `dst`; returns the compressed length, or None if it did not
    /// fit (which counts as incompressible).
    pub(super) fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match self.cfg.compressor {
            Compressor::Lz4 => lz4_flex::block::compress_into(src, dst).ok(),
            Compressor::Zstd { level } => {
                let mut ctx = self.take_zstd();
                let r = ctx.c.compress(dst, src, level).ok();
                let _ = self.zstd.push(ctx);
                r
            }
        }
    }

    pub(super) fn decompress(&self, src: &[u8], dst: &mut [u8]) -> bool {
        match self.cfg.compressor {
            Compressor::Lz4 => matches!(lz4_flex::block::decompress_into(src, dst), Ok(PAGE_SIZE)),
            Compressor::Zstd { .. } => {
                let mut ctx = self.take_zstd();
                let r = ctx.d.decompress(dst, src);
                let _ = self.zstd.push(ctx);
                r == Ok(PAGE_SIZE)
            }
        }
    }

    pub(super) fn take_scratch(&self) -> Box<Scratch> {
        pop_spinning(&self.scratch)
    }

    fn take_zstd(&self) -> Box<ZstdCtx> {
        pop_spinning(&self.zstd)
    }
}
