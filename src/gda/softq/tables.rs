//! What the consumer looks WQEs up in: local registrations, peers and their heaps, and the
//! registered host buffer pools.
use super::*;

/// One local registration the queue knows (lkey = index + 1).
#[derive(Clone, Copy, Debug)]
pub(super) struct LocalReg {
    /// Address kernels put into WQEs.
    pub(super) dev_base: u64,
    /// Address libfabric and the host use.
    pub(super) host_base: u64,
    pub(super) len: u64,
    pub(super) desc: usize,
    pub(super) device: bool,
}

impl LocalReg {
    /// Host address of `[addr, addr+len)` if it lies inside the registration.
    pub(super) fn translate(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.dev_base)?;
        if off > self.len || len > self.len - off {
            return None;
        }
        Some(self.host_base + off)
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct RemoteHeap {
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) key: u64,
}

#[derive(Clone, Debug)]
pub(super) struct Peer {
    pub(super) fi_addr: FiAddr,
    pub(super) qpn: u16,
    pub(super) heap: Option<RemoteHeap>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Tables {
    pub(super) my_pe: i32,
    pub(super) qkey: u32,
    pub(super) peers: Vec<Peer>,
    pub(super) locals: Vec<Option<LocalReg>>,
    pub(super) heap_lkey: Option<u32>,
}

impl Tables {
    pub(super) fn local(&self, lkey: u32) -> Option<&LocalReg> {
        let i = (lkey as usize).checked_sub(wire::SOFT_LKEY_FIRST as usize)?;
        self.locals.get(i)?.as_ref()
    }

    pub(super) fn heap(&self) -> Option<&LocalReg> {
        self.local(self.heap_lkey?)
    }

    pub(super) fn my_qpn(&self) -> u16 {
        if self.peers.is_empty() {
            0
        } else {
            wire::soft_qpn(self.my_pe)
        }
    }
}

/// Registered host buffers: `count` slots of `slot` bytes.
pub(super) struct BufPool {
    pub(super) mem: SharedMem,
    pub(super) mr: Option<MemoryRegion>,
    pub(super) slot: usize,
    pub(super) count: usize,
}

impl BufPool {
    pub(super) fn new(
        domain: &Arc<Domain>,
        ep: &Endpoint,
        slot: usize,
        count: usize,
    ) -> Result<BufPool> {
        // Pinned (CUDA-mapped) when CUDA is usable: staged GPU data is copied in and out of these
        // buffers, and pinned memory makes those copies DMA.
        let mem = SharedMem::new(slot * count, mem::cuda_usable())?;
        // SAFETY: the memory is owned by the pool, which keeps the registration and drops it first
        // (field order); the endpoint belongs to `domain`.
        let mr = unsafe {
            MemoryRegion::register_reserved(
                domain,
                mem.host(),
                slot * count,
                MemKind::Host,
                Some(ep),
            )?
        };
        Ok(BufPool {
            mem,
            mr: Some(mr),
            slot,
            count,
        })
    }

    pub(super) fn ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.count);
        // SAFETY: in bounds of the allocation.
        unsafe { self.mem.host().add(i * self.slot) }
    }

    pub(super) fn desc(&self) -> *mut c_void {
        self.mr.as_ref().map_or(ptr::null_mut(), |m| m.desc())
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        // The registration goes before the memory.
        self.mr.take();
    }
}
