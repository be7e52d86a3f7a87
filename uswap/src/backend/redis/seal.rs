//! How a page is stored as a Redis value: a header, then the page sealed with AES-256-GCM
//! (or, with `encrypt=off`, in clear followed by a crc32c).
//!
//! # Job
//!
//! [`Sealer::seal`] turns a page into a value, [`Sealer::open`] checks a value and writes the
//! page back. Both bind the value to where it belongs: the pager's key prefix, the slot and
//! the write generation are authenticated (the AEAD's associated data, or inside the crc), so
//! a value copied from another key, an older version of the same slot (a replica that missed
//! a later write) or bytes written from outside all fail as checksum errors.
//!
//! Why AES-256-GCM from `ring`: sealing and opening a page cost 2.7 µs together with it on
//! this project's machines (AES-NI and carry-less multiply), against 10.2 µs for the
//! XChaCha20-Poly1305 of RustCrypto's crate it replaced; on a sequential re-read through the
//! Redis tier that was 40 % of the time (BENCHMARKS.md, "The Redis tier").
//!
//! # Keys and nonces
//!
//! Each sealer encrypts under a key of its own: HKDF-SHA256 of the master key (generated per
//! pager, or read from a file and then shared by every pager using that file) with a salt of
//! 256 random bits drawn per sealer. The nonce of a value is its write generation, which the
//! device draws from one counter per sealer and never reuses ([`super::shared::Shared`]'s
//! `next_gen`), so a (key, nonce) pair never seals two values; it is not stored, since the
//! reader knows the generation from the key name.
//!
//! # Locking rules
//!
//! None: a [`Sealer`] is immutable after construction and used from the device threads only
//! (never from a signal handler: values are built and checked off the fault path).
//!
//! # Invariants
//!
//! * Every value is [`VALUE_BYTES`] long (encrypted) or [`CLEAR_VALUE_BYTES`] (clear).
//! * A nonce is never reused under one key: the generation, unique per sealer, under a key
//!   unique per sealer.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::hkdf;

use crate::uffd::PAGE_SIZE;

const MAGIC: &[u8; 4] = b"USW2";
const FLAG_ENCRYPTED: u8 = 1;
const HEADER_BYTES: usize = 8;
const TAG_BYTES: usize = 16;
/// An encrypted value: header, ciphertext, tag.
pub const VALUE_BYTES: usize = HEADER_BYTES + PAGE_SIZE + TAG_BYTES;
/// A clear value: header, page, crc32c.
pub const CLEAR_VALUE_BYTES: usize = HEADER_BYTES + PAGE_SIZE + 4;
/// Bytes of the per-sealer salt of the key derivation.
pub const SALT_BYTES: usize = 32;
/// HKDF's `info`: names what the derived key is for (and this format's version).
const KEY_INFO: &[u8] = b"uswap redis page value v2, AES-256-GCM";
/// The associated data's room: the key prefix (`uswap:SESSION.ID:`, short) and the binding.
const MAX_AAD_BYTES: usize = 192;

/// Why a value was refused (all reported to the engine as a checksum error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Wrong length or header: not a page value of this format.
    Malformed,
    /// Authentication tag or crc32c mismatch.
    Mismatch,
}

/// Why a sealer could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealerError {
    #[error("the key prefix is {0} bytes; at most {max} fit in the associated data", max = MAX_AAD_BYTES - 24)]
    PrefixTooLong(usize),
    #[error("the key derivation failed")]
    Derive,
}

/// Seals and opens page values for one pager.
pub struct Sealer {
    key: Option<LessSafeKey>,
    prefix: Vec<u8>,
}

impl Sealer {
    /// `master`: `None` for `encrypt=off`; `salt`: fresh random bytes (see the module's
    /// "Keys and nonces").
    pub fn new(master: Option<[u8; 32]>, salt: &[u8; SALT_BYTES], prefix: &[u8]) -> Result<Sealer, SealerError> {
        if prefix.len() + 24 > MAX_AAD_BYTES {
            return Err(SealerError::PrefixTooLong(prefix.len()));
        }
        let key = match master {
            None => None,
            Some(master) => {
                let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(&master);
                let okm = prk.expand(&[KEY_INFO], &AES_256_GCM).map_err(|_| SealerError::Derive)?;
                Some(LessSafeKey::new(UnboundKey::from(okm)))
            }
        };
        Ok(Sealer { key, prefix: prefix.to_vec() })
    }

    pub fn encrypted(&self) -> bool {
        self.key.is_some()
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

    /// The associated data: prefix and binding, on the stack (no allocation per page).
    fn aad(&self, binding: &[u8; 24]) -> ([u8; MAX_AAD_BYTES], usize) {
        let mut aad = [0u8; MAX_AAD_BYTES];
        let n = self.prefix.len();
        aad[..n].copy_from_slice(&self.prefix);
        aad[n..n + 24].copy_from_slice(binding);
        (aad, n + 24)
    }

    fn nonce(generation: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&generation.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn clear_crc(&self, binding: &[u8], page: &[u8]) -> u32 {
        let c = crc32c::crc32c_append(0, &self.prefix);
        let c = crc32c::crc32c_append(c, binding);
        crc32c::crc32c_append(c, page)
    }

    /// Appends the value for `page` (one page) at (`slot`, `generation`) to `out`. A
    /// generation must be sealed at most once per sealer (it is the nonce).
    pub fn seal(&self, slot: u64, generation: u64, page: &[u8], out: &mut Vec<u8>) {
        debug_assert_eq!(page.len(), PAGE_SIZE);
        let start = out.len();
        let flags = if self.encrypted() { FLAG_ENCRYPTED } else { 0 };
        let header = [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], flags, 0, 0, 0];
        out.extend_from_slice(&header);
        let binding = self.binding(slot, generation, &header);
        match &self.key {
            Some(key) => {
                let body = out.len();
                out.extend_from_slice(page);
                let (aad, n) = self.aad(&binding);
                // Sealing fails only for messages beyond GCM's 64 GiB; should it, the tag
                // stays zero and the read reports a checksum error.
                let tag = key
                    .seal_in_place_separate_tag(Self::nonce(generation), Aad::from(&aad[..n]), &mut out[body..])
                    .map(|t| {
                        let mut b = [0u8; TAG_BYTES];
                        b.copy_from_slice(t.as_ref());
                        b
                    })
                    .unwrap_or([0; TAG_BYTES]);
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
        match &self.key {
            Some(key) => {
                if header[4] != FLAG_ENCRYPTED {
                    return Err(OpenError::Malformed);
                }
                let body = &value[HEADER_BYTES..HEADER_BYTES + PAGE_SIZE];
                let tag: [u8; TAG_BYTES] =
                    value[HEADER_BYTES + PAGE_SIZE..].try_into().map_err(|_| OpenError::Malformed)?;
                page.copy_from_slice(body);
                let (aad, n) = self.aad(&binding);
                key.open_in_place_separate_tag(Self::nonce(generation), Aad::from(&aad[..n]), Tag::from(tag), page, 0..)
                    .map(|_| ())
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
            let s = Sealer::new(key, &[1; SALT_BYTES], b"uswap:{ab}:").unwrap();
            let mut v = Vec::new();
            s.seal(5, 9, &page(1), &mut v);
            assert_eq!(v.len(), s.value_bytes());
            let mut out = vec![0u8; PAGE_SIZE];
            s.open(5, 9, &v, &mut out).unwrap();
            assert_eq!(out, page(1));
            // Another slot, another generation, another pager, a flipped bit: all refused.
            assert_eq!(s.open(6, 9, &v, &mut out), Err(OpenError::Mismatch));
            assert_eq!(s.open(5, 8, &v, &mut out), Err(OpenError::Mismatch));
            let other = Sealer::new(key, &[1; SALT_BYTES], b"uswap:{cd}:").unwrap();
            assert_eq!(other.open(5, 9, &v, &mut out), Err(OpenError::Mismatch));
            if key.is_some() {
                // Same master key and prefix, another salt: another key.
                let salted = Sealer::new(key, &[2; SALT_BYTES], b"uswap:{ab}:").unwrap();
                assert_eq!(salted.open(5, 9, &v, &mut out), Err(OpenError::Mismatch));
            }
            let mut flipped = v.clone();
            flipped[100] ^= 1;
            assert_eq!(s.open(5, 9, &flipped, &mut out), Err(OpenError::Mismatch));
            assert_eq!(s.open(5, 9, b"hello", &mut out), Err(OpenError::Malformed));
        }
        // Encrypted values do not hold the page in clear.
        let s = Sealer::new(Some([7u8; 32]), &[3; SALT_BYTES], b"p").unwrap();
        let mut v = Vec::new();
        s.seal(0, 1, &page(2), &mut v);
        assert!(!v.windows(64).any(|w| w == &page(2)[..64]));
        // Two generations of the same page: two different ciphertexts (two nonces).
        let mut w = Vec::new();
        s.seal(0, 2, &page(2), &mut w);
        assert_ne!(v[HEADER_BYTES..], w[HEADER_BYTES..]);
        assert!(Sealer::new(None, &[0; SALT_BYTES], &[b'x'; 200]).is_err());
    }
}
