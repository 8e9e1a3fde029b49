//! TX completions: writing CQEs in the EFA format, and reaping the endpoint's completion queue.
use super::*;

impl Consumer {
    /// The bytes of the TX completion for CQ producer count `pc`.
    pub(super) fn tx_cqe_bytes(
        &self,
        pc: u64,
        req_id: u16,
        status: CqStatus,
        op: OpType,
    ) -> [u8; TX_CQE_SIZE] {
        cqe::encode_tx(&TxCqe {
            req_id: u64::from(req_id),
            req_id_64: false,
            status,
            phase: cqe::cq_expected_phase(pc, self.inner.cq_entries),
            op,
            qp_num: self.tables.my_qpn(),
        })
    }

    /// The CQ slot of producer count `pc` of ring `q`.
    pub(super) fn cq_slot(&self, q: usize, pc: u64) -> *mut u8 {
        let slot = (pc & u64::from(self.inner.cq_entries - 1)) as usize;
        // SAFETY: the slot lies inside the ring's CQ.
        unsafe { self.rings[q].cq.add(slot * TX_CQE_SIZE) }
    }

    /// Counts `n` completions written into ring `q`'s CQ.
    pub(super) fn advance_cq(&mut self, q: usize, n: u64) {
        self.rings[q].cq_pc += n;
        self.completed += n;
        self.inner.completed.fetch_add(n, Ordering::AcqRel);
    }

    /// Writes a TX completion into ring `q`'s CQ.
    pub(super) fn push_tx_cqe(&mut self, q: usize, req_id: u16, status: CqStatus, op: OpType) {
        let pc = self.rings[q].cq_pc;
        let bytes = self.tx_cqe_bytes(pc, req_id, status, op);
        // SAFETY: the slot lies inside the CQ ring.
        unsafe { mem::publish_cqe(self.cq_slot(q, pc), &bytes) };
        self.advance_cq(q, 1);
    }

    /// The provider's completion of the operation in `slot`. An answered SEND (`wire.rs`) gives its
    /// bounce buffer back and completes once the answer is in too (at once when the send failed:
    /// no answer comes then); any other operation completes now.
    pub(super) fn tx_done(&mut self, slot: u64, status: CqStatus) {
        let answered = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.as_mut())
            .and_then(|f| f.stage.map(|st| (f.bounce.take(), st.token)));
        let Some((bounce, token)) = answered else {
            self.complete_tx(slot, status);
            return;
        };
        if let Some(b) = bounce {
            self.free_bounce.push(b);
        }
        if let Some(st) = self.stage_mut(token) {
            st.queued = false;
        }
        if status != CqStatus::Ok {
            // No answer comes for a send that failed.
            self.unanswered(token, status);
        } else {
            self.stage_settle(token);
        }
    }

    pub(super) fn complete_tx(&mut self, slot: u64, status: CqStatus) {
        let Some(f) = self.slots.get_mut(slot as usize).and_then(|s| s.take()) else {
            tracing::error!("software queue: completion for unknown slot {slot}");
            return;
        };
        self.free_slots.push(slot as u32);
        if let Some(t) = f.since {
            let d = t.elapsed();
            self.rounds.latency[f.op as usize % 3].add(d);
            if f.op == OpType::Send {
                let us = d.as_micros().min(u128::from(u32::MAX)) as u32;
                self.note(super::trace::Event::SendDone, u32::from(f.q), us);
            }
        }
        if let Some(b) = f.bounce {
            self.free_bounce.push(b);
        }
        self.in_flight -= 1;
        if let Some(o) = f.from {
            // Another thread's WQE: its owner closes it and writes its completion.
            self.hand_back(o, status);
            return;
        }
        self.order.closed(super::order::stream(f.q, f.peer), f.pc);
        self.push_tx_cqe(usize::from(f.q), f.req_id, status, f.op);
    }

    pub(super) fn flush_in_flight(&mut self) {
        self.drop_copy_waits();
        // Packed AMOs not sent yet: their WQEs are flushed below with the other slots.
        self.packing.clear();
        let mut n = 0;
        for s in 0..self.slots.len() {
            if self.slots[s].is_some() {
                self.complete_tx(s as u64, CqStatus::Flushed);
                n += 1;
            }
        }
        for (_, p) in std::mem::take(&mut self.stalled) {
            self.finish_failed(p, CqStatus::Flushed, "queue stopped");
            n += 1;
        }
        while let Some(p) = self.handed_in.pop_front() {
            self.finish_failed(p, CqStatus::Flushed, "queue stopped");
            n += 1;
        }
        while let Some((_, p)) = self.late.pop_front() {
            self.finish_failed(p, CqStatus::Flushed, "queue stopped");
            n += 1;
        }
        for p in self.order.drain() {
            self.finish_failed(
                p,
                CqStatus::Flushed,
                "queue stopped while the AMO waited for the data it announces",
            );
            n += 1;
        }
        if n > 0 {
            tracing::warn!(
                "software queue stopped with {n} operations in flight: completed as flushed"
            );
        }
    }

    // ---- completions from libfabric ----

    pub(super) fn poll_cq(&mut self) -> usize {
        let inner = self.inner.clone();
        let mut total = 0;
        // Up to 8 x 32 entries per call: the AMOs among them are applied as one batch.
        for _ in 0..8 {
            // SAFETY: an all-zero CQ entry is valid plain data.
            let mut entries: [CqEntry; 32] = unsafe { std::mem::zeroed() };
            match inner.ep.cq().read(&mut entries) {
                Ok(0) => break,
                Ok(n) => {
                    for e in &entries[..n] {
                        self.on_completion(e);
                    }
                    total += n;
                    if n < entries.len() {
                        break;
                    }
                }
                Err(err) => {
                    total += 1;
                    self.on_error(
                        err.context,
                        err.flags,
                        err.error.code,
                        &err.error.to_string(),
                    );
                }
            }
        }
        if total > 0 {
            self.note(super::trace::Event::Cq, total as u32, 0);
        }
        self.flush_rx_batch();
        self.flush_amo_batch();
        self.flush_answers();
        total
    }

    pub(super) fn on_completion(&mut self, e: &CqEntry) {
        let remote_data = flags::REMOTE_CQ_DATA;
        if e.flags & remote_data != 0 && e.flags & flags::RECV == 0 {
            self.on_write_imm(e.data, e.len);
            return;
        }
        match self.inner.ctxs.get(e.op_context) {
            Some((TAG_TX, slot)) => {
                self.inner.ctxs.free(e.op_context);
                self.tx_done(slot, CqStatus::Ok);
            }
            Some((TAG_RX, idx)) => {
                self.inner.ctxs.free(e.op_context);
                self.on_recv(idx as usize, e.len);
            }
            Some((TAG_STX, b)) => {
                self.inner.ctxs.free(e.op_context);
                self.on_stage_sent(b as usize, 0, "");
            }
            _ => tracing::warn!(
                "software queue: completion with unknown context {:p} (flags {:#x})",
                e.op_context,
                e.flags
            ),
        }
    }

    pub(super) fn on_error(&mut self, ctx: *mut c_void, flags: u64, code: i32, text: &str) {
        match self.inner.ctxs.get(ctx) {
            Some((TAG_TX, slot)) => {
                self.inner.ctxs.free(ctx);
                let status = fabric_error_status(code);
                tracing::warn!("software queue: operation failed ({status}): {text}");
                self.tx_done(slot, status);
            }
            Some((TAG_STX, b)) => {
                self.inner.ctxs.free(ctx);
                self.on_stage_sent(b as usize, if code == 0 { -(errno::EIO as i32) } else { code }, text);
            }
            Some((TAG_RX, idx)) => {
                self.inner.ctxs.free(ctx);
                if code.unsigned_abs() == errno::ECANCELED {
                    return;
                }
                tracing::warn!("software queue: receive failed: {text}");
                let status = fabric_error_status(code);
                let t = self.tables.clone();
                self.push_rx(RxCqe {
                    req_id: self.rx_seq as u16,
                    status,
                    phase: 0,
                    op: OpType::Send,
                    has_imm: false,
                    unsolicited: false,
                    qp_num: t.my_qpn(),
                    length: 0,
                    ah: AH_UNKNOWN,
                    src_qp: 0,
                    imm: 0,
                    src_addr: None,
                });
                self.rx_seq += 1;
                if !self.inner.stop.load(Ordering::Acquire) {
                    if let Err(e) = self.post_receive(idx as usize) {
                        tracing::error!("software queue: cannot repost a receive buffer: {e}");
                    }
                }
            }
            _ => tracing::warn!("software queue: error completion without a known context (flags {flags:#x}): {text}"),
        }
    }
}
