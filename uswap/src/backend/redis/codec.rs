//! How a page is stored as a Redis value: a header, then the page sealed with
//! XChaCha20-Poly1305 (or, with `encrypt=off`, in clear followed by a crc32c).
//!
//! # Job
//!
//! [`Sealer::seal`] turns a page into a value, [`Sealer::open`] checks a value and writes the
//! page back. Both bind the value to where it belongs: the pager's key prefix, the slot and
//! the write generation are authenticated (the AEAD's associated data, or inside the crc), so
//! a value copied from another key, an older version of the same slot (a replica that missed
//! a later write) or bytes written from outside all fail as checksum errors.
//!
//! # Locking rules
//!
//! None: a [`Sealer`] is immutable after construction and used from the device threads only
//! (never from a signal handler: values are built and checked off the fault path).
//!
//! # Invariants
//!
//! * Every value is [`VALUE_BYTES`] long (encrypted) or [`CLEAR_VALUE_BYTES`] (clear).
//! * A nonce is never reused under one key: 192 random bits per write.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};

use crate::uffd::PAGE_SIZE;

const MAGIC: &[u8; 4] = b"USW1";
const FLAG_ENCRYPTED: u8 = 1;
const HEADER_BYTES: usize = 8;
const NONCE_BYTES: usize = 24;
const TAG_BYTES: usize = 16;
/// An encrypted value: header, nonce, ciphertext, tag.
pub const VALUE_BYTES: usize = HEADER_BYTES + NONCE_BYTES + PAGE_SIZE + TAG_BYTES;
/// A clear value: header, page, crc32c.
pub const CLEAR_VALUE_BYTES: usize = HEADER_BYTES + PAGE_SIZE + 4;

/// Why a value was refused (all reported to the engine as a checksum error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Wrong length or header: not a page value of this format.
    Malformed,
    /// Authentication tag or crc32c mismatch.
    Mismatch,
}

/// Seals and opens page values for one pager.
pub struct Sealer {
    cipher: Option<XChaCha20Poly1305>,
    prefix: Vec<u8>,
}

impl Sealer {
    /// `key`: `None` for `encrypt=off`.
    pub fn new(key: Option<[u8; 32]>, prefix: &[u8]) -> Sealer {
        Sealer { cipher: key.map(|k| XChaCha20Poly1305::new(Key::from_slice(&k))), prefix: prefix.to_vec() }
    }

    pub fn encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// Bytes a value takes (before Redis's own overhead).
    pub fn value_bytes(&self) -> usize {
        if self.encrypted() {
            VALUE_BYTES
        } else {
            CLEAR_VALUE_BYTES
        }
    }

    /// What the value of (slot, generation) is bound to.
    fn binding(&self, slot: u64, generation: u64, header: &[u8]) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&slot.to_le_bytes());
        b[8..16].copy_from_slice(&generation.to_le_bytes());
        b[16..24].copy_from_slice(&header[..HEADER_BYTES]);
        b
    }

    fn clear_crc(&self, binding: &[u8], page: &[u8]) -> u32 {
        let c = crc32c::crc32c_append(0, &self.prefix);
        let c = crc32c::crc32c_append(c, binding);
        crc32c::crc32c_append(c, page)
    }

    /// Appends the value for `page` (one page) at (`slot`, `generation`) to `out`. `nonce`
    /// must be fresh random bytes (ignored when not encrypting).
    pub fn seal(&self, slot: u64, generation: u64, page: &[u8], nonce: &[u8; NONCE_BYTES], out: &mut Vec<u8>) {
        debug_assert_eq!(page.len(), PAGE_SIZE);
        let start = out.len();
        let flags = if self.encrypted() { FLAG_ENCRYPTED } else { 0 };
        let header = [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], flags, 0, 0, 0];
        out.extend_from_slice(&header);
        let binding = self.binding(slot, generation, &header);
        match &self.cipher {
            Some(cipher) => {
                out.extend_from_slice(nonce);
                let body = out.len();
                out.extend_from_slice(page);
                let mut aad = self.prefix.clone();
                aad.extend_from_slice(&binding);
                // Encryption of a 4 KiB buffer cannot fail (only messages past 256 GiB do);
                // should it, the tag stays zero and the read reports a checksum error.
                let tag = cipher
                    .encrypt_in_place_detached(XNonce::from_slice(nonce), &aad, &mut out[body..])
                    .unwrap_or_default();
                out.extend_from_slice(&tag);
            }
            None => {
                out.extend_from_slice(page);
                let crc = self.clear_crc(&binding, page);
                out.extend_from_slice(&crc.to_le_bytes());
            }
        }
        debug_assert_eq!(out.len() - start, self.value_bytes());
    }

    /// Checks `value` as the value of (`slot`, `generation`) and writes its page to `page`.
    /// On error `page` holds garbage (the engine never maps a page whose read failed).
    pub fn open(&self, slot: u64, generation: u64, value: &[u8], page: &mut [u8]) -> Result<(), OpenError> {
        if value.len() != self.value_bytes() || &value[..4] != MAGIC {
            return Err(OpenError::Malformed);
        }
        let header = &value[..HEADER_BYTES];
        let binding = self.binding(slot, generation, header);
        match &self.cipher {
            Some(cipher) => {
                if header[4] != FLAG_ENCRYPTED {
                    return Err(OpenError::Malformed);
                }
                let nonce = &value[HEADER_BYTES..HEADER_BYTES + NONCE_BYTES];
                let body = &value[HEADER_BYTES + NONCE_BYTES..HEADER_BYTES + NONCE_BYTES + PAGE_SIZE];
                let tag = &value[HEADER_BYTES + NONCE_BYTES + PAGE_SIZE..];
                page.copy_from_slice(body);
                let mut aad = self.prefix.clone();
                aad.extend_from_slice(&binding);
                cipher
                    .decrypt_in_place_detached(XNonce::from_slice(nonce), &aad, page, Tag::from_slice(tag))
                    .map_err(|_| OpenError::Mismatch)
            }
            None => {
                if header[4] != 0 {
                    return Err(OpenError::Malformed);
                }
                let body = &value[HEADER_BYTES..HEADER_BYTES + PAGE_SIZE];
                let crc = u32::from_le_bytes([
                    value[HEADER_BYTES + PAGE_SIZE],
                    value[HEADER_BYTES + PAGE_SIZE + 1],
                    value[HEADER_BYTES + PAGE_SIZE + 2],
                    value[HEADER_BYTES + PAGE_SIZE + 3],
                ]);
                if self.clear_crc(&binding, body) != crc {
                    return Err(OpenError::Mismatch);
                }
                page.copy_from_slice(body);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u8) -> Vec<u8> {
        (0..PAGE_SIZE).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn values_open_only_where_they_were_sealed() {
        for key in [Some([7u8; 32]), None] {
            let s = Sealer::new(key, b"uswap:{ab}:");
            let mut v = Vec::new();
            s.seal(5, 9, &page(1), &[3; 24], &mut v);
            assert_eq!(v.len(), s.value_bytes());
            let mut out = vec![0u8; PAGE_SIZE];
            s.open(5, 9, &v, &mut out).unwrap();
            assert_eq!(out, page(1));
            // Another slot, another generation, another pager, a flipped bit: all refused.
            assert_eq!(s.open(6, 9, &v, &mut out), Err(OpenError::Mismatch));
            assert_eq!(s.open(5, 8, &v, &mut out), Err(OpenError::Mismatch));
            let other = Sealer::new(key, b"uswap:{cd}:");
            assert_eq!(other.open(5, 9, &v, &mut out), Err(OpenError::Mismatch));
            let mut flipped = v.clone();
            flipped[100] ^= 1;
            assert_eq!(s.open(5, 9, &flipped, &mut out), Err(OpenError::Mismatch));
            assert_eq!(s.open(5, 9, b"hello", &mut out), Err(OpenError::Malformed));
        }
        // Encrypted values do not hold the page in clear.
        let s = Sealer::new(Some([7u8; 32]), b"p");
        let mut v = Vec::new();
        s.seal(0, 1, &page(2), &[4; 24], &mut v);
        assert!(!v.windows(64).any(|w| w == &page(2)[..64]));
    }
}
