//! The RAM device: uncompressed pages in an anonymous mapping, slot `n` at `n * PAGE_SIZE`
//! (the "ramdisk" of the frontswap benchmark, without the block layer).
//!
//! Reads are served in place: [`Backend::page_ptr`] gives the fault path the slot's address,
//! which `UFFDIO_COPY` reads directly, so a swap-in costs one copy, inside the kernel.
//! Discarded clusters are returned to the system with `MADV_DONTNEED`.
//!
//! Locking: none. Slots are owned by the engine (see the backend contract); the mapping is
//! never remapped.

#[cfg(test)]
use super::AlignedPage;
use super::{Backend, BackendError, ReadReq, WriteReq};
use crate::mapping::{MapOptions, Mapping};
use crate::uffd::PAGE_SIZE;

pub struct RamBackend {
    storage: Mapping,
    nr_slots: u64,
}

impl RamBackend {
    pub fn new(nr_slots: u64) -> std::io::Result<RamBackend> {
        let storage =
            Mapping::anonymous(nr_slots as usize * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: true })?;
        Ok(RamBackend { storage, nr_slots })
    }

    fn check(&self, slot: u64, nr: u64) -> Result<usize, BackendError> {
        if slot + nr > self.nr_slots {
            return Err(BackendError::OutOfRange { slot: slot + nr - 1, nr_slots: self.nr_slots });
        }
        Ok(slot as usize * PAGE_SIZE)
    }
}

impl Backend for RamBackend {
    fn name(&self) -> String {
        "ram".into()
    }

    fn nr_slots(&self) -> u64 {
        self.nr_slots
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        for r in reqs {
            r.result = self.check(r.slot, r.nr_pages()).map(|off| r.data.copy_to_mapping(&self.storage, off));
        }
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        for r in reqs {
            r.result = self.check(r.slot, r.nr_pages()).map(|off| {
                for (i, page) in r.buf.iter_mut().enumerate() {
                    self.storage.read(off + i * PAGE_SIZE, &mut page.0);
                }
            });
        }
    }

    fn discard(&self, slot: u64, nr: u64) {
        if let Ok(off) = self.check(slot, nr) {
            // Best effort: failing to return memory loses nothing.
            let _ = self.storage.discard(off, nr as usize * PAGE_SIZE);
        }
    }

    /// Pages live in the process's memory and reads take no lock (see the trait).
    fn inheritable(&self) -> bool {
        true
    }

    fn set_inherited(&self, inherit: bool) {
        self.storage.set_inherited(inherit);
    }

    fn page_ptr(&self, slot: u64) -> Option<*const u8> {
        (slot < self.nr_slots).then(|| (self.storage.addr() + slot as usize * PAGE_SIZE) as *const u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_discard_zeroes() {
        let b = RamBackend::new(1024).unwrap();
        let data: Vec<u8> = (0..2 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        let src = Mapping::anonymous(4 * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: false }).unwrap();
        src.write(PAGE_SIZE, &data);
        let mut w = [WriteReq::new(10, src.pages(PAGE_SIZE, 2))];
        b.write(&mut w);
        assert!(w[0].result.is_ok());
        let mut buf = vec![AlignedPage([0; PAGE_SIZE]); 2];
        let mut r = [ReadReq::new(10, &mut buf)];
        b.read(&mut r);
        assert!(r[0].result.is_ok());
        assert_eq!(buf[0].0[..], data[..PAGE_SIZE]);
        assert_eq!(buf[1].0[..], data[PAGE_SIZE..]);
        b.discard(10, 2);
        let mut r = [ReadReq::new(10, &mut buf)];
        b.read(&mut r);
        assert!(buf.iter().all(|p| p.0.iter().all(|&x| x == 0)));
        let mut r = [ReadReq::new(1023, &mut buf)];
        b.read(&mut r);
        assert!(matches!(r[0].result, Err(BackendError::OutOfRange { slot: 1024, .. })));
    }
}
