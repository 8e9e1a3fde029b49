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

/// One chunk of a peer's heap: `size` bytes at `base` on the peer (heap offset `start`), libfabric
/// key `key`.
#[derive(Clone, Copy, Debug)]
pub(super) struct RemoteHeap {
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) key: u64,
    pub(super) start: u64,
}

#[derive(Clone, Debug)]
pub(super) struct Peer {
    pub(super) fi_addr: FiAddr,
    pub(super) qpn: u16,
    /// The peer's heap chunks by soft rkey: `chunks[rkey - SOFT_RKEY_HEAP]`.
    pub(super) chunks: Vec<Option<RemoteHeap>>,
}

impl Peer {
    /// The chunk a soft rkey names (O(1)).
    pub(super) fn chunk(&self, rkey: u32) -> Option<&RemoteHeap> {
        let i = rkey.checked_sub(wire::SOFT_RKEY_HEAP)? as usize;
        self.chunks.get(i)?.as_ref()
    }

    /// Whether one chunk of the peer's heap holds heap offsets `[off, off+len)` (a scan of the
    /// peer's few chunks; AMO messages only).
    pub(super) fn holds(&self, off: u64, len: u64) -> bool {
        self.chunks
            .iter()
            .flatten()
            .any(|c| off >= c.start && len <= c.size && off - c.start <= c.size - len)
    }

    /// Highest heap offset any chunk of the peer reaches (0: no heap known).
    pub(super) fn heap_extent(&self) -> u64 {
        self.chunks
            .iter()
            .flatten()
            .map(|c| c.start + c.size)
            .max()
            .unwrap_or(0)
    }
}

/// One chunk of the local heap: heap offsets `[start, end)`, registered under `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LocalChunk {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) lkey: u32,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Tables {
    pub(super) my_pe: i32,
    pub(super) qkey: u32,
    pub(super) peers: Vec<Peer>,
    pub(super) locals: Vec<Option<LocalReg>>,
    /// The local heap's chunks, by start.
    pub(super) heap_chunks: Vec<LocalChunk>,
    /// Per granule of the local heap: index + 1 into `heap_chunks`, 0 for none.
    pub(super) granules: Vec<u32>,
    /// log2 of the granularity `granules` is indexed with.
    pub(super) log2: u32,
    /// Where peers' heaps are mapped in this process (the copy route).
    pub(super) peer_memory: Option<PeerMap>,
    /// The rings after ring 0 (`rings.rs`).
    pub(super) rings: super::rings::ExtraRings,
}

impl Tables {
    pub(super) fn local(&self, lkey: u32) -> Option<&LocalReg> {
        let i = (lkey as usize).checked_sub(wire::SOFT_LKEY_FIRST as usize)?;
        self.locals.get(i)?.as_ref()
    }

    /// The local heap chunk holding `[off, off+len)` (O(1): one granule lookup), as a registration
    /// view rebased to heap offset 0: `dev_base + off` / `host_base + off` are the bytes at heap
    /// offset `off`, for offsets inside the chunk only. `None` when no chunk holds the whole range.
    pub(super) fn heap_at(&self, off: u64, len: u64) -> Option<LocalReg> {
        let g = usize::try_from(off >> self.log2).ok()?;
        let c = self
            .heap_chunks
            .get((*self.granules.get(g)?).checked_sub(1)? as usize)?;
        if off < c.start || len > c.end - c.start || off - c.start > c.end - c.start - len {
            return None;
        }
        let r = self.local(c.lkey)?;
        if r.len < c.end - c.start {
            return None;
        }
        Some(LocalReg {
            dev_base: r.dev_base.checked_sub(c.start)?,
            host_base: r.host_base.checked_sub(c.start)?,
            len: c.end,
            desc: r.desc,
            device: r.device,
        })
    }

    /// Highest heap offset the local chunks reach.
    pub(super) fn heap_extent(&self) -> u64 {
        self.heap_chunks.last().map_or(0, |c| c.end)
    }

    /// Whether any local heap chunk is GPU memory.
    pub(super) fn heap_device(&self) -> bool {
        self.heap_chunks
            .iter()
            .any(|c| self.local(c.lkey).is_some_and(|r| r.device))
    }

    /// Rebuilds the granule index after `heap_chunks` or `log2` changed.
    pub(super) fn index_heap(&mut self) {
        let g = 1u64 << self.log2;
        let n = self.heap_extent().div_ceil(g) as usize;
        self.granules = vec![0; n];
        for (i, c) in self.heap_chunks.iter().enumerate() {
            for s in (c.start / g) as usize..(c.end.div_ceil(g) as usize).min(n) {
                self.granules[s] = i as u32 + 1;
            }
        }
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
