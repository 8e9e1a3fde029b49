//! [`GdaQueue`]: what a GDA context asks of its queue, implemented by the hardware queue
//! ([`HwQueue`]) and the software queue ([`SoftQueue`]). The context holds one
//! `Option<Box<dyn GdaQueue>>` (none when GDA is off) and dispatches every call through it.
use std::ffi::c_void;

use crate::fabric::{CqHandle, Endpoint, MemKind, MrHandle};

use super::error::{GdaError, Result};
use super::hw::HwQueue;
use super::softq::{SoftQueue, Staging};
use super::state::{NvshmemEfaGdaPeer, NvshmemEfaGdaQueue, NVSHMEM_EFA_GDA_PEER_VALID};
use super::wire;
use super::{MODE_HW, MODE_SOFT};

/// One registration of a local range as the queues use it.
#[derive(Clone, Copy, Debug)]
pub struct Registration {
    /// Key peers use for the range.
    pub key: u64,
    /// Local descriptor for data-transfer calls (null where the range is staged).
    pub desc: *mut c_void,
    /// The registration; `None` where the software queue stages the memory (not registered).
    pub handle: Option<MrHandle>,
    /// Where the memory lives.
    pub kind: MemKind,
}

impl Registration {
    fn mr(&self) -> Result<MrHandle> {
        self.handle
            .ok_or_else(|| GdaError::invalid("the range is staged, not registered"))
    }
}

/// Whom a queue connects to: PE `my_pe` of `n_pes`, named by `names` (every PE's endpoint name
/// back to back) or by `fi_addrs` of the caller's AV.
#[derive(Clone, Copy, Debug)]
pub struct Roster<'a> {
    pub my_pe: i32,
    pub n_pes: i32,
    pub names: &'a [u8],
    pub fi_addrs: Option<&'a [u64]>,
}

/// A local heap chunk: heap offsets `[start, end)` at address `base`, granularity `2^log2`.
#[derive(Clone, Copy, Debug)]
pub struct LocalChunk {
    pub start: u64,
    pub end: u64,
    pub base: u64,
    pub log2: u32,
}

/// Chunk `ordinal` of PE `pe`'s heap: heap offsets `[start, start+size)` at `base`, libfabric
/// key `key`.
#[derive(Clone, Copy, Debug)]
pub struct PeerChunk {
    pub pe: i32,
    pub ordinal: u32,
    pub start: u64,
    pub base: u64,
    pub size: u64,
    pub key: u64,
}

/// A valid peer-table entry.
fn valid_peer(ahn: u16, qpn: u16, qkey: u32) -> NvshmemEfaGdaPeer {
    NvshmemEfaGdaPeer {
        ahn,
        qpn,
        qkey,
        flags: NVSHMEM_EFA_GDA_PEER_VALID,
        ..Default::default()
    }
}

/// A GDA queue, hardware or software: its endpoint, its peer table, how WQEs name local and remote
/// memory, and the queue description kernels read.
pub trait GdaQueue: Send + Sync {
    /// `MODE_HW` or `MODE_SOFT`.
    fn mode(&self) -> u32;

    /// Raw name of the queue's endpoint, to exchange with every PE.
    fn name(&self) -> Result<Vec<u8>>;

    /// The endpoint this library opened for the queue (registrations bind to it), if any.
    fn endpoint(&self) -> Option<&Endpoint>;

    /// Connects to the PEs of `roster` and returns the peer table kernels read.
    fn connect(&mut self, roster: &Roster) -> Result<Vec<NvshmemEfaGdaPeer>>;

    /// Whether the queue moves memory of `kind` itself (then it is not registered).
    fn stages(&self, _kind: MemKind) -> bool {
        false
    }

    /// Whether a registration the caller made can serve the queue's endpoint (`mr_endpoint`: the
    /// provider binds registrations to one endpoint).
    fn takes_caller_registration(&self, _mr_endpoint: bool) -> bool {
        true
    }

    /// Makes a registered local range addressable by WQEs and returns its lkey.
    ///
    /// # Safety
    /// `reg` must describe `[base, base+size)` and stay registered, and the memory allocated, while
    /// the queue lives.
    unsafe fn add_local(&self, base: u64, size: u64, reg: &Registration) -> Result<u32>;

    /// Checks a peer's heap key before it is recorded.
    fn check_remote_key(&self, _pe: i32, _key: u64) -> Result<()> {
        Ok(())
    }

    /// Makes the registered local range `[base, base + (end - start))` the heap's chunk
    /// `[start, end)` (granularity `2^log2`) and returns its lkey and what to pass to
    /// [`GdaQueue::remove_heap_chunk`].
    ///
    /// # Safety
    /// As for [`GdaQueue::add_local`].
    unsafe fn add_heap_chunk(
        &self,
        chunk: &LocalChunk,
        reg: &Registration,
    ) -> Result<(u32, Option<u32>)> {
        // SAFETY: forwarded contract.
        Ok((unsafe { self.add_chunk_local(chunk, reg)? }, None))
    }

    /// [`GdaQueue::add_local`] for the range of a heap chunk.
    ///
    /// # Safety
    /// As for [`GdaQueue::add_local`].
    unsafe fn add_chunk_local(&self, chunk: &LocalChunk, reg: &Registration) -> Result<u32> {
        // SAFETY: forwarded contract.
        unsafe { self.add_local(chunk.base, chunk.end - chunk.start, reg) }
    }

    /// Forgets the local heap chunk starting at `start` (`token`: what [`GdaQueue::add_heap_chunk`]
    /// returned).
    fn remove_heap_chunk(&self, _start: u64, _token: Option<u32>) -> Result<()> {
        Ok(())
    }

    /// Records a chunk of a peer's heap; returns the rkey kernels put into WQEs for it.
    fn add_remote_chunk(&self, chunk: &PeerChunk) -> Result<u32>;

    /// Forgets chunk `ordinal` of PE `pe`'s heap.
    fn remove_remote_chunk(&self, _pe: i32, _ordinal: u32) -> Result<()> {
        Ok(())
    }

    /// Names the transmit CQ of the caller's endpoint.
    ///
    /// # Safety
    /// As for [`HwQueue::set_cq`].
    unsafe fn set_cq(&mut self, _cq: CqHandle) -> Result<()> {
        Err(GdaError::invalid(
            "set_cq: only for hardware GDA on the caller's endpoint",
        ))
    }

    /// The queue as kernels see it (queue 0 of the table).
    fn queue_desc(&self) -> NvshmemEfaGdaQueue;

    /// The queue table of `n_pes` PEs with `queues_per_pe` queues each (state version 3,
    /// [`super::queues`]): by default every entry names [`GdaQueue::queue_desc`], so every
    /// `(dst_pe, qp_id)` shares the one queue.
    fn queue_table(&self, n_pes: i32, queues_per_pe: u32) -> Result<Vec<NvshmemEfaGdaQueue>> {
        super::queues::build(n_pes, queues_per_pe, &[self.queue_desc()])
    }

    /// Stops the queue's work (before the context's registrations go).
    fn stop(&self) {}

    /// The software queue, if this is one.
    fn as_soft(&self) -> Option<&SoftQueue> {
        None
    }
}

impl GdaQueue for SoftQueue {
    fn mode(&self) -> u32 {
        MODE_SOFT
    }

    fn name(&self) -> Result<Vec<u8>> {
        SoftQueue::name(self)
    }

    fn endpoint(&self) -> Option<&Endpoint> {
        Some(SoftQueue::endpoint(self))
    }

    fn connect(&mut self, roster: &Roster) -> Result<Vec<NvshmemEfaGdaPeer>> {
        let Roster {
            my_pe,
            n_pes,
            names,
            ..
        } = *roster;
        if names.is_empty() {
            return Err(GdaError::invalid(
                "connect: the software queue needs every PE's GDA endpoint name",
            ));
        }
        if n_pes > wire::SOFT_MAX_PES {
            return Err(GdaError::invalid(format!(
                "connect: the software queue addresses at most {} PEs",
                wire::SOFT_MAX_PES
            )));
        }
        let addrs = self.insert_names(names, n_pes as usize)?;
        let qkey = wire::soft_qkey(n_pes, names);
        self.set_peers(my_pe, qkey, &addrs)?;
        Ok((0..n_pes)
            .map(|pe| valid_peer(pe as u16, wire::soft_qpn(pe), qkey))
            .collect())
    }

    fn stages(&self, kind: MemKind) -> bool {
        // A staging software queue moves GPU memory itself (non-blocking-stream copies): the
        // provider never sees it.
        self.staging() != Staging::Off && kind.is_device()
    }

    fn takes_caller_registration(&self, mr_endpoint: bool) -> bool {
        // On FI_MR_ENDPOINT providers the caller's registration is bound to its own endpoint.
        !mr_endpoint
    }

    unsafe fn add_local(&self, base: u64, size: u64, reg: &Registration) -> Result<u32> {
        // SAFETY: forwarded contract.
        unsafe { SoftQueue::add_local(self, base, base, size, reg.desc, reg.kind.is_device()) }
    }

    unsafe fn add_heap_chunk(
        &self,
        chunk: &LocalChunk,
        reg: &Registration,
    ) -> Result<(u32, Option<u32>)> {
        let LocalChunk {
            start, end, log2, ..
        } = *chunk;
        // SAFETY: forwarded contract.
        let l = unsafe { self.add_chunk_local(chunk, reg)? };
        if let Err(e) = SoftQueue::add_heap_chunk(self, start, end, l, log2) {
            let _ = self.remove_local(l);
            return Err(e);
        }
        Ok((l, Some(l)))
    }

    fn remove_heap_chunk(&self, start: u64, token: Option<u32>) -> Result<()> {
        SoftQueue::remove_heap_chunk(self, start)?;
        match token {
            Some(l) => self.remove_local(l),
            None => Ok(()),
        }
    }

    fn add_remote_chunk(&self, c: &PeerChunk) -> Result<u32> {
        SoftQueue::add_remote_chunk(self, c.pe, c.ordinal, c.start, c.base, c.size, c.key)?;
        Ok(wire::SOFT_RKEY_HEAP + c.ordinal)
    }

    fn remove_remote_chunk(&self, pe: i32, ordinal: u32) -> Result<()> {
        SoftQueue::remove_remote_chunk(self, pe, ordinal)
    }

    fn queue_desc(&self) -> NvshmemEfaGdaQueue {
        SoftQueue::queue_desc(self)
    }

    /// A ring of its own per entry (up to the queue's `max_rings`; beyond, entry `i` on ring
    /// `i % rings`).
    fn queue_table(&self, n_pes: i32, queues_per_pe: u32) -> Result<Vec<NvshmemEfaGdaQueue>> {
        let n = n_pes.max(0) as usize * queues_per_pe as usize;
        let rings = self.add_rings(n)?;
        let descs: Vec<NvshmemEfaGdaQueue> = (0..rings).filter_map(|i| self.ring_desc(i)).collect();
        super::queues::build(n_pes, queues_per_pe, &descs)
    }

    fn stop(&self) {
        SoftQueue::stop(self)
    }

    fn as_soft(&self) -> Option<&SoftQueue> {
        Some(self)
    }
}

impl GdaQueue for HwQueue {
    fn mode(&self) -> u32 {
        MODE_HW
    }

    fn name(&self) -> Result<Vec<u8>> {
        HwQueue::name(self)
    }

    fn endpoint(&self) -> Option<&Endpoint> {
        HwQueue::endpoint(self)
    }

    fn connect(&mut self, roster: &Roster) -> Result<Vec<NvshmemEfaGdaPeer>> {
        let addrs = match (roster.fi_addrs, roster.names.is_empty()) {
            (Some(a), _) => a.to_vec(),
            (None, false) => self.insert_names(roster.names, roster.n_pes as usize)?,
            (None, true) => {
                return Err(GdaError::invalid(
                    "connect: neither endpoint names nor fi_addr values",
                ))
            }
        };
        Ok(self
            .query_peers(&addrs, roster.my_pe as usize)?
            .into_iter()
            .map(|(ahn, qpn, qkey)| valid_peer(ahn, qpn, qkey))
            .collect())
    }

    unsafe fn add_local(&self, _base: u64, _size: u64, reg: &Registration) -> Result<u32> {
        // SAFETY: an open registration of the queue's domain, per the contract.
        unsafe { self.lkey(reg.mr()?) }
    }

    unsafe fn add_heap_chunk(
        &self,
        chunk: &LocalChunk,
        reg: &Registration,
    ) -> Result<(u32, Option<u32>)> {
        // SAFETY: forwarded contract.
        let lkey = unsafe { self.add_chunk_local(chunk, reg)? };
        // AMO messages to this chunk are applied by the receive path.
        if let Some(rx) = self.receive_path() {
            let LocalChunk {
                start, end, base, ..
            } = *chunk;
            rx.add_heap_chunk(start, end, base, reg.kind.is_device())?;
        }
        Ok((lkey, None))
    }

    fn remove_heap_chunk(&self, start: u64, _token: Option<u32>) -> Result<()> {
        match self.receive_path() {
            Some(rx) => rx.remove_heap_chunk(start),
            None => Ok(()),
        }
    }

    fn check_remote_key(&self, pe: i32, key: u64) -> Result<()> {
        if key > u64::from(u32::MAX) {
            return Err(GdaError::invalid(format!(
                "heap key {key:#x} of PE {pe} does not fit an EFA rkey"
            )));
        }
        Ok(())
    }

    fn add_remote_chunk(&self, c: &PeerChunk) -> Result<u32> {
        self.check_remote_key(c.pe, c.key)?;
        Ok(c.key as u32)
    }

    unsafe fn set_cq(&mut self, cq: CqHandle) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { HwQueue::set_cq(self, cq) }
    }

    fn queue_desc(&self) -> NvshmemEfaGdaQueue {
        HwQueue::queue_desc(self)
    }

    /// Every entry on the queue's one QP (logged once with the device's limit).
    fn queue_table(&self, n_pes: i32, queues_per_pe: u32) -> Result<Vec<NvshmemEfaGdaQueue>> {
        let t = super::queues::build(n_pes, queues_per_pe, &[self.queue_desc()])?;
        self.log_plan(t.len());
        Ok(t)
    }

    fn stop(&self) {
        HwQueue::stop(self)
    }
}
