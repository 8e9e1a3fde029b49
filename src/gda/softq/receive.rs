//! Receive path: receive buffers, remote CQ data and received SENDs become RX completions; AMO
//! messages are applied to the local heap.
use super::*;
use crate::gda::apply;

/// The receive buffer of an AMO that came packed: its buffer went back when it was read.
pub(super) const NO_RX_BUF: usize = usize::MAX;

impl Consumer {
    pub(super) fn post_all_receives(&mut self) -> Result<()> {
        for i in 0..self.inner.rx_bufs.count {
            self.post_receive(i)?;
        }
        Ok(())
    }

    pub(super) fn post_receive(&mut self, i: usize) -> Result<()> {
        let inner = self.inner.clone();
        let ctx = inner.ctxs.alloc(TAG_RX, i as u64).ok_or_else(|| {
            GdaError::io("software queue: out of operation contexts for receives")
        })?;
        let mut tries = 0u32;
        loop {
            // SAFETY: the buffer and the context belong to the queue and stay valid until the
            // completion is reaped or the endpoint is closed (which happens before they are freed).
            let r = unsafe {
                inner.ep.recv(
                    inner.rx_bufs.ptr(i),
                    inner.rx_bufs.slot,
                    inner.rx_bufs.desc(),
                    ctx,
                )
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) if e.is_again() && tries < 100_000 => {
                    tries += 1;
                    let _ = self.poll_cq();
                }
                Err(e) => {
                    inner.ctxs.free(ctx);
                    return Err(e.into());
                }
            }
        }
    }

    pub(super) fn source(&self, pe: Option<u32>) -> (u16, u16) {
        match pe {
            Some(p) if (p as usize) < self.tables.peers.len() => {
                (p as u16, self.tables.peers[p as usize].qpn)
            }
            _ => (AH_UNKNOWN, 0),
        }
    }

    pub(super) fn on_write_imm(&mut self, data: u64, len: usize) {
        let (imm, pe) = wire::split_imm_data(data, self.inner.cq_data_wide);
        self.push_write_imm_rx(imm, pe, len as u32);
    }

    /// The receive completion of an RDMA write with immediate from `pe` that has landed here.
    pub(super) fn push_write_imm_rx(&mut self, imm: u32, pe: Option<u32>, len: u32) {
        let (ah, src_qp) = self.source(pe);
        let qpn = self.tables.my_qpn();
        self.push_rx(RxCqe::write_imm(qpn, len, ah, src_qp, imm));
    }

    pub(super) fn on_recv(&mut self, idx: usize, len: usize) {
        let inner = self.inner.clone();
        let len = len.min(inner.rx_bufs.slot);
        // SAFETY: the provider wrote `len` bytes into this receive buffer, which nobody else touches
        // until it is reposted below.
        let msg = unsafe { std::slice::from_raw_parts(inner.rx_bufs.ptr(idx), len) };
        if let Some(h) = StageHdr::decode(msg) {
            if matches!(h.kind, STAGE_WRITE_ACK | STAGE_ACKS) {
                // Acknowledgements complete this queue's own WQEs: nothing orders them with the
                // writes and AMOs other PEs sent here, so they do not cut the batches.
                self.on_stage_msg(&h, &msg[STAGE_HDR_SIZE..]);
                self.repost(idx);
                return;
            }
            if h.kind == STAGE_WRITE && self.batch_write(&h, &msg[STAGE_HDR_SIZE..]) {
                self.stats.received += 1;
                self.rx_batch.push((h, idx));
                return;
            }
            // Everything else is handled in arrival order, after the writes and AMOs before it.
            self.flush_rx_batch();
            self.flush_amo_batch();
            self.on_stage_msg(&h, &msg[STAGE_HDR_SIZE..]);
            if !inner.stop.load(Ordering::Acquire) {
                if let Err(e) = self.post_receive(idx) {
                    tracing::error!("software queue: cannot repost a receive buffer: {e}");
                }
            }
            return;
        }
        self.flush_rx_batch();
        let Some(h) = SendHdr::decode(msg) else {
            self.flush_amo_batch();
            tracing::warn!(
                "software queue: dropped a {len}-byte message that is not a software-queue SEND"
            );
            self.repost(idx);
            return;
        };
        let payload = &msg[SEND_HDR_SIZE..];
        if h.packed {
            self.on_packed(&h, payload);
            self.repost(idx);
            return;
        }
        let checked = apply::check_message(payload, &*self.tables);
        // An AMO without an immediate joins the CQ read's batch (amo_batch.rs): its word is read
        // and written back with the others', for GPU words two waits per CQ read instead of two
        // per AMO (host words: host atomics, as alone).
        if let apply::Checked::Ready(m, addr, device) = &checked {
            if h.imm.is_none() {
                self.amo_batch.push(*m, *addr, *device, (idx, h));
                return;
            }
        }
        // Everything else after the AMOs before it.
        self.flush_amo_batch();
        let outcome = match checked {
            apply::Checked::NotAmo => apply::Outcome::NotAmo,
            apply::Checked::Rejected { status, why } => apply::Outcome::Rejected { status, why },
            apply::Checked::Ready(m, addr, device) => apply::apply_checked(m, addr, device),
        };
        let (is_amo, status) = match outcome {
            apply::Outcome::NotAmo => (false, CqStatus::Ok),
            apply::Outcome::Applied(_) => {
                inner.amos_applied.fetch_add(1, Ordering::AcqRel);
                (true, CqStatus::Ok)
            }
            apply::Outcome::Rejected { status, why } => {
                tracing::warn!(
                    "software queue: AMO from PE {} not applied ({status}): {why}",
                    h.src_pe
                );
                (true, status)
            }
        };
        self.finish_send(&h, idx, is_amo, status);
    }

    /// Applies the AMOs the current CQ read gathered ([`crate::gda::amo_batch`]), then gives their
    /// receive buffers back (an error completes its SEND with an error status, logged).
    pub(super) fn flush_amo_batch(&mut self) {
        if self.amo_batch.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.amo_batch);
        let n = batch.len();
        let t = self.rounds.timing.then(Instant::now);
        let done = self.amo_applier.apply(&mut batch, "software queue");
        if let Some(t) = t {
            let d = t.elapsed();
            self.stats.amo_time += d;
            let us = d.as_micros().min(u128::from(u32::MAX)) as u32;
            self.note(super::trace::Event::AmoBatch, n as u32, us);
        }
        self.stats.amo_batches += 1;
        self.inner.amo_batches.fetch_add(1, Ordering::Relaxed);
        self.stats.amo_batched += n as u64;
        for (_, (idx, h), r) in done {
            let status = match r {
                Ok(()) => {
                    self.inner.amos_applied.fetch_add(1, Ordering::AcqRel);
                    CqStatus::Ok
                }
                Err(why) => {
                    tracing::warn!(
                        "software queue: AMO from PE {} not applied ({}): {why}",
                        h.src_pe,
                        CqStatus::LocalQpInternalError
                    );
                    CqStatus::LocalQpInternalError
                }
            };
            self.finish_send(&h, idx, true, status);
        }
        // Keep the allocation unless a nested poll (a repost retrying) gathered more meanwhile.
        if self.amo_batch.is_empty() {
            self.amo_batch = batch;
        }
    }

    /// What follows a received SEND once it was handled: an AMO applied without error and
    /// without an immediate needs no receive completion (nothing waits for one: DeepEP-style code
    /// never polls the RX ring, and one per AMO would pile up entries for a ring nobody drains);
    /// anything else gets its RX completion; then the receive buffer is posted again (unless it is
    /// held for ring room, with receive credits).
    pub(super) fn finish_send(&mut self, h: &SendHdr, idx: usize, is_amo: bool, status: CqStatus) {
        if let Some(token) = h.answer {
            self.answer_send(h.src_pe, token, status);
            self.inner.sends_answered.fetch_add(1, Ordering::Relaxed);
        }
        if !(is_amo && status == CqStatus::Ok && h.imm.is_none()) {
            let (ah, src_qp) = self.source(Some(h.src_pe));
            let hold = (self.inner.rx_credits && idx != NO_RX_BUF).then_some(idx);
            let held = self.push_rx_holding(
                RxCqe {
                    req_id: self.rx_seq as u16,
                    status,
                    phase: 0,
                    op: OpType::Send,
                    has_imm: h.imm.is_some(),
                    unsolicited: false,
                    qp_num: self.tables.my_qpn(),
                    length: u32::from(h.len),
                    ah,
                    src_qp,
                    imm: h.imm.unwrap_or(0),
                    src_addr: None,
                },
                hold,
            );
            self.rx_seq += 1;
            if held {
                // The receive stays unposted until the entry is in the ring (credits).
                return;
            }
        }
        if idx != NO_RX_BUF {
            self.repost(idx);
        }
    }

    /// Posts receive buffer `idx` again (not once the queue stops).
    fn repost(&mut self, idx: usize) {
        if !self.inner.stop.load(Ordering::Acquire) {
            if let Err(e) = self.post_receive(idx) {
                tracing::error!("software queue: cannot repost a receive buffer: {e}");
            }
        }
    }

    // ---- RX ring ----

    pub(super) fn rx_room(&mut self) -> bool {
        let entries = u64::from(self.inner.rx_entries);
        self.rx_ci.room(
            &self.inner.ctrl,
            OFF_RX_CI,
            self.rx_pc,
            entries,
            "software queue",
        )
    }

    pub(super) fn push_rx(&mut self, c: RxCqe) {
        self.push_rx_holding(c, None);
    }

    /// Pushes an RX completion; `hold` names the receive buffer the completion came in, which (with
    /// receive credits) stays unposted while the entry waits for ring room. Returns whether the
    /// buffer was held (the caller then must not repost it; [`Consumer::flush_rx`] does).
    pub(super) fn push_rx_holding(&mut self, c: RxCqe, hold: Option<usize>) -> bool {
        if self.inner.rx_overwrite {
            // As the NIC: it does not see the consumer index, so it writes the next entry whatever
            // the GPU has consumed. After two such wraps the phase check accepts stale entries.
            if !self.rx_room() {
                let k = self.inner.rx_overruns.fetch_add(1, Ordering::AcqRel) + 1;
                if k <= WARN_REJECTS {
                    tracing::error!(
                        "software queue: rule violated: RX completion {} overwrites entry {} that the GPU \
                         has not consumed (consumer index {}); the NIC's RX CQ does not see the consumer \
                         index, so receivers must drain it (or senders hold credits) before it wraps",
                        self.rx_pc,
                        self.rx_pc - u64::from(self.inner.rx_entries),
                        self.rx_ci.cached()
                    );
                }
            }
            self.write_rx(c);
            return false;
        }
        if self.pending_rx.is_empty() && self.rx_room() {
            self.write_rx(c);
            return false;
        }
        self.pending_rx.push_back((c, hold));
        self.inner
            .rx_pending
            .store(self.pending_rx.len() as u64, Ordering::Release);
        if hold.is_some() {
            let k = self.inner.rx_receives_held.fetch_add(1, Ordering::AcqRel) + 1;
            if k == self.inner.rx_bufs.count as u64 {
                tracing::warn!(
                    "software queue: rule hit: all {k} receives are held by completions waiting for \
                     RX ring room (the GPU is not draining); further SENDs wait at their senders, as \
                     on the device (a SEND that finds no posted receive is retried by the NIC)"
                );
            }
        }
        if !self.rx_pending_warned && self.pending_rx.len() > self.inner.rx_entries as usize {
            self.rx_pending_warned = true;
            tracing::warn!(
                "software queue: the GPU is not consuming receive completions; {} are waiting in host memory",
                self.pending_rx.len()
            );
        }
        hold.is_some()
    }

    pub(super) fn flush_rx(&mut self) -> usize {
        let mut n = 0;
        let mut freed = Vec::new();
        while !self.pending_rx.is_empty() && self.rx_room() {
            let (c, hold) = self.pending_rx.pop_front().expect("non-empty");
            self.write_rx(c);
            freed.extend(hold);
            n += 1;
        }
        if n > 0 {
            self.inner
                .rx_pending
                .store(self.pending_rx.len() as u64, Ordering::Release);
        }
        if !freed.is_empty() {
            self.inner
                .rx_receives_held
                .fetch_sub(freed.len() as u64, Ordering::AcqRel);
            // The entries are in the ring: their receives are posted again (credits return).
            if !self.inner.stop.load(Ordering::Acquire) {
                for idx in freed {
                    if let Err(e) = self.post_receive(idx) {
                        tracing::error!("software queue: cannot repost a receive buffer: {e}");
                    }
                }
            }
        }
        n
    }

    pub(super) fn write_rx(&mut self, mut c: RxCqe) {
        let n = self.inner.rx_entries;
        let slot = (self.rx_pc & u64::from(n - 1)) as usize;
        c.phase = cqe::cq_expected_phase(self.rx_pc, n);
        let bytes = cqe::encode_rx_ex(&c);
        // SAFETY: the slot lies inside the RX ring.
        unsafe {
            mem::publish_cqe(
                self.inner
                    .ring(self.inner.layout.rx + slot * RX_CQE_EX_SIZE),
                &bytes,
            )
        };
        self.rx_pc += 1;
        self.inner
            .host_ctrl_word(HC_RX_PRODUCED)
            .store(self.rx_pc, Ordering::Release);
    }
}

/// The local heap as the shared applier sees it: the granule-indexed chunk table.
impl apply::LocalHeap for Tables {
    fn extent(&self) -> u64 {
        self.heap_extent()
    }

    fn locate(&self, off: u64, len: u64) -> Option<(u64, bool)> {
        self.heap_at(off, len)
            .map(|r| (r.host_base + off, r.device))
    }
}
