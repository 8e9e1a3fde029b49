//! Same-host RDMA as copy-engine copies (the peer's heap mapped into this process), the null
//! consumer, and TX completions written in bulk.
use super::*;
use crate::mover::queue::{CopyEngine, CopyQueue, CudaEngine, HostEngine};
use crate::mover::MResult;

/// Where a peer's memory is reachable in this process (the transport's CUDA IPC mappings of
/// same-host peers' heaps).
pub trait PeerMemory: Send + Sync {
    /// The address in this process of PE `pe`'s `[addr, addr + len)` (`addr` in the peer's address
    /// space), when the whole range is mapped here; `None` otherwise.
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64>;
}

/// A shared [`PeerMemory`] as the queue's tables hold it.
#[derive(Clone)]
pub struct PeerMap(pub Arc<dyn PeerMemory>);

impl std::fmt::Debug for PeerMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerMap")
    }
}

/// The copy route of an RDMA write or read: the address in this process of the peer's range, when
/// the route is on (`enabled`: `NVSHMEM_EFA_SOFT_IPC` and a copy queue), the WQE carries no
/// immediate (an immediate needs the peer's consumer: it stays on the message path) and `pm` maps
/// the whole range of PE `pe` at `addr`.
pub fn ipc_route(
    enabled: bool,
    pm: Option<&dyn PeerMemory>,
    pe: i32,
    addr: u64,
    len: u64,
    has_imm: bool,
) -> Option<u64> {
    if !enabled || has_imm {
        return None;
    }
    pm?.local_addr(pe, addr, len)
}

/// The copy engine of a queue's own copy queue: CUDA's copy engine on a non-blocking stream in the
/// queue's context, or `memcpy` where CUDA is not usable (host memory only).
pub(super) enum Engine {
    Cuda(CudaEngine),
    Host(HostEngine),
}

impl CopyEngine for Engine {
    unsafe fn submit(&mut self, dst: u64, src: u64, len: usize) -> MResult<()> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Engine::Cuda(e) => e.submit(dst, src, len),
                Engine::Host(e) => e.submit(dst, src, len),
            }
        }
    }
    fn mark(&mut self) -> MResult<()> {
        match self {
            Engine::Cuda(e) => e.mark(),
            Engine::Host(e) => e.mark(),
        }
    }
    fn oldest_done(&mut self) -> MResult<bool> {
        match self {
            Engine::Cuda(e) => e.oldest_done(),
            Engine::Host(e) => e.oldest_done(),
        }
    }
    fn inline_ring(&mut self) -> MResult<u64> {
        match self {
            Engine::Cuda(e) => e.inline_ring(),
            Engine::Host(e) => e.inline_ring(),
        }
    }
}

/// A WQE executed as a copy, waiting for its copy: the queue's submission count once it was
/// enqueued, its slot, and whether enqueueing reported an error (its completion then says so).
#[derive(Clone, Copy, Debug)]
pub(super) struct CopyWait {
    pub(super) seq: u64,
    pub(super) slot: u32,
    pub(super) failed: bool,
}

impl Consumer {
    /// Whether WQEs may take the copy route now (creates the copy queue at first need).
    pub(super) fn copy_route_ready(&mut self) -> bool {
        if !self.inner.ipc || self.tables.peer_memory.is_none() {
            return false;
        }
        if self.copyq.is_none() && !self.copyq_failed {
            let engine = if mem::cuda_usable() {
                CudaEngine::new(self.inner.cuda_ctx).map(Engine::Cuda)
            } else {
                Ok(Engine::Host(HostEngine::default()))
            };
            match engine {
                Ok(e) => {
                    tracing::info!(
                        "software queue: RDMA to same-host peers whose heap is mapped here runs as \
                         {} copies (NVSHMEM_EFA_SOFT_IPC=0 turns this off)",
                        if matches!(e, Engine::Cuda(_)) { "copy-engine" } else { "host" }
                    );
                    self.copyq = Some(CopyQueue::new(e));
                }
                Err(e) => {
                    tracing::warn!(
                        "software queue: no copy queue ({e}): RDMA to mapped peers takes the \
                         message path"
                    );
                    self.copyq_failed = true;
                }
            }
        }
        self.copyq.is_some()
    }

    /// Enqueues the copy of a validated copy WQE (its slot taken); the completion follows once the
    /// copy is done ([`Consumer::poll_copies`]).
    pub(super) fn post_copy(&mut self, p: Pending, dst: u64, src: u64, len: usize) {
        let slot = p.slot.expect("slot taken before the copy");
        let Some(q) = self.copyq.as_mut() else {
            self.finish_failed(p, CqStatus::LocalQpInternalError, "no copy queue");
            return;
        };
        let before = q.counts().0;
        // SAFETY: the local range lies in a registration the queue keeps, the remote one in a peer
        // region the transport keeps mapped until GDA is shut down (before its mappings close).
        let r = unsafe { q.submit(dst, src, len) };
        let seq = q.counts().0;
        match r {
            Err(e) if seq == before => {
                self.finish_failed(p, CqStatus::LocalQpInternalError, &format!("copy: {e}"));
                return;
            }
            Err(ref e) => tracing::warn!(
                "software queue: copy of WQE {} enqueued, mark failed: {e}",
                p.pc
            ),
            Ok(()) => {}
        }
        self.slots[slot as usize] = Some(InFlight {
            req_id: p.req_id,
            op: p.op,
            bounce: None,
            stage: None,
        });
        self.in_flight += 1;
        self.ipc_copies += 1;
        self.copy_waits.push_back(CopyWait {
            seq,
            slot,
            failed: r.is_err(),
        });
    }

    /// Marks what was enqueued since the last call (one event for the batch), retires finished
    /// copies and completes their WQEs in order. Returns the WQEs completed.
    pub(super) fn poll_copies(&mut self) -> usize {
        let Some(q) = self.copyq.as_mut() else {
            return 0;
        };
        if self.copy_waits.is_empty() {
            return 0;
        }
        q.poll();
        let (_, completed, _) = q.counts();
        // A failed query counts every copy complete and keeps the error for quiet: the WQEs retired
        // with it get an error status.
        let error = if q.outstanding() == 0 {
            q.quiet(Instant::now()).err()
        } else {
            None
        };
        if let Some(e) = &error {
            tracing::warn!("software queue: copy failed: {e}");
        }
        let mut n = 0;
        while let Some(w) = self.copy_waits.front().copied() {
            if w.seq > completed {
                break;
            }
            self.copy_waits.pop_front();
            let status = if w.failed || error.is_some() {
                CqStatus::LocalQpInternalError
            } else {
                CqStatus::Ok
            };
            self.complete_tx(u64::from(w.slot), status);
            n += 1;
        }
        self.inner
            .ipc_copies
            .store(self.ipc_copies, Ordering::Release);
        n
    }

    /// Forgets the copy waits of flushed WQEs (their slots were completed as flushed), after a
    /// bounded wait for the copies themselves (they write into memory the caller frees next).
    pub(super) fn drop_copy_waits(&mut self) {
        if let Some(q) = self.copyq.as_mut() {
            if let Err(e) = q.quiet_for(Duration::from_secs(1)) {
                tracing::warn!("software queue stopping: {e}");
            }
        }
        self.copy_waits.clear();
    }

    /// The null consumer (`NVSHMEM_EFA_SOFT_NULL=1`, benchmarks only): takes every announced WQE the
    /// flow control allows, checks its request id and phase, and completes it with success without
    /// reading the rest or moving data; the completions of the batch are written together.
    pub(super) fn consume_null(&mut self) -> usize {
        let db = self.doorbell();
        let avail = db.wrapping_sub(self.ci as u32);
        if avail == 0 {
            return 0;
        }
        if avail > self.inner.sq_entries {
            if self.bad_doorbell != Some(db) {
                tracing::error!(
                    "software queue (null consumer): doorbell {db} announces {avail} WQEs past the {} \
                     consumed: ignored until it makes sense",
                    self.ci
                );
                self.bad_doorbell = Some(db);
            }
            return 0;
        }
        let sq = u64::from(self.inner.sq_entries);
        let mut room = (self.cached_done + sq).saturating_sub(self.ci);
        if room < u64::from(avail) && self.refresh_done() {
            room = (self.cached_done + sq).saturating_sub(self.ci);
        }
        let take = room.min(u64::from(avail));
        if take == 0 {
            return 0;
        }
        let es = self.inner.sq_entry_size as usize;
        let mut batch = std::mem::take(&mut self.null_batch);
        batch.clear();
        for pc in self.ci..self.ci + take {
            let slot = (pc & (sq - 1)) as usize;
            // SAFETY: the first 8 bytes of a slot inside the SQ ring (8-byte aligned).
            let head: [u8; 8] =
                unsafe { mem::read_shared(self.inner.ring(self.inner.layout.sq + slot * es)) };
            let op = OpType::from_raw(head[2] & wqe::CTRL1_OP_TYPE_MASK).unwrap_or(OpType::Send);
            let req_id = u16::from_le_bytes([head[0], head[1]]);
            let phase = head[3] & wqe::CTRL2_PHASE;
            let status = if req_id != pc as u16
                || phase != wqe::phase_for(pc, self.inner.sq_entries)
            {
                self.rejected += 1;
                if self.rejected <= WARN_REJECTS {
                    tracing::warn!(
                        "software queue (null consumer): WQE {pc} rejected: request id {req_id:#06x}, \
                         phase {phase} (expected {:#06x}, {})",
                        pc as u16,
                        wqe::phase_for(pc, self.inner.sq_entries)
                    );
                }
                CqStatus::LocalQpInternalError
            } else {
                CqStatus::Ok
            };
            batch.push((pc as u16, status, op));
        }
        self.ci += take;
        self.inner
            .host_ctrl_word(HC_CONSUMED)
            .store(self.ci, Ordering::Release);
        self.inner
            .host_ctrl_word(HC_REJECTED)
            .store(self.rejected, Ordering::Release);
        self.push_tx_cqes(&batch);
        self.null_batch = batch;
        take as usize
    }

    /// Writes the TX completions of a batch, in order: every entry's other bytes first, one release
    /// fence, then the flags bytes (what a poller polls), so the batch costs one fence.
    pub(super) fn push_tx_cqes(&mut self, batch: &[(u16, CqStatus, OpType)]) {
        let mut flags = Vec::with_capacity(batch.len());
        for (i, &(req_id, status, op)) in batch.iter().enumerate() {
            let pc = self.cq_pc + i as u64;
            let bytes = self.tx_cqe_bytes(pc, req_id, status, op);
            let p = self.cq_slot(pc);
            // SAFETY: the slot lies inside the CQ ring; the flags byte (3) is written below.
            unsafe {
                mem::write_shared(p, &bytes[..3]);
                mem::write_shared(p.add(4), &bytes[4..]);
            }
            flags.push((p, bytes[3]));
        }
        fence(Ordering::Release);
        for (p, f) in flags {
            // SAFETY: the flags byte of a slot inside the CQ ring.
            unsafe { mem::atomic_u8(p.add(3)) }.store(f, Ordering::Relaxed);
        }
        self.advance_cq(batch.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl PeerMemory for Fake {
        fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
            (pe == 1 && addr >= 0x1000 && addr + len <= 0x2000).then_some(addr + 0x10_0000)
        }
    }

    #[test]
    fn route_needs_switch_mapping_and_no_immediate() {
        let f = Fake;
        let pm: Option<&dyn PeerMemory> = Some(&f);
        assert_eq!(ipc_route(true, pm, 1, 0x1000, 8, false), Some(0x10_1000));
        assert_eq!(ipc_route(true, pm, 1, 0x1ff8, 8, false), Some(0x10_1ff8));
        assert_eq!(
            ipc_route(true, pm, 1, 0x1ff9, 8, false),
            None,
            "range leaves the map"
        );
        assert_eq!(
            ipc_route(true, pm, 0, 0x1000, 8, false),
            None,
            "PE not mapped"
        );
        assert_eq!(ipc_route(true, pm, 1, 0x1000, 8, true), None, "immediate");
        assert_eq!(
            ipc_route(false, pm, 1, 0x1000, 8, false),
            None,
            "switched off"
        );
        assert_eq!(ipc_route(true, None, 1, 0x1000, 8, false), None, "no map");
    }
}
