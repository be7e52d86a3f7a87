//! Swap entries: (device, offset) packed in 48 bits so that a page-table word can hold one.

/// Bits of the slot offset within a device.
pub const OFFSET_BITS: u32 = 42;
/// Bits of the device index ("type" in the kernel's `swp_entry_t`).
pub const DEVICE_BITS: u32 = 6;
/// At most this many swap devices per pager.
pub const MAX_DEVICES: usize = 1 << DEVICE_BITS;
/// Total bits of an entry.
pub const ENTRY_BITS: u32 = OFFSET_BITS + DEVICE_BITS;

/// A slot on a swap device, as the kernel's `swp_entry_t`: device index and page offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SwapEntry(u64);

impl SwapEntry {
    pub fn new(device: usize, offset: u64) -> SwapEntry {
        debug_assert!(device < MAX_DEVICES && offset < (1 << OFFSET_BITS));
        SwapEntry(((device as u64) << OFFSET_BITS) | offset)
    }

    pub fn from_bits(bits: u64) -> SwapEntry {
        SwapEntry(bits & ((1 << ENTRY_BITS) - 1))
    }

    pub fn bits(self) -> u64 {
        self.0
    }

    pub fn device(self) -> usize {
        (self.0 >> OFFSET_BITS) as usize
    }

    pub fn offset(self) -> u64 {
        self.0 & ((1 << OFFSET_BITS) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let e = SwapEntry::new(5, (1 << 40) + 3);
        assert_eq!(e.device(), 5);
        assert_eq!(e.offset(), (1 << 40) + 3);
        assert_eq!(SwapEntry::from_bits(e.bits()), e);
        assert!(e.bits() < 1 << ENTRY_BITS);
    }
}
