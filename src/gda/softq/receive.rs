//! Receive path: receive buffers, remote CQ data and received SENDs become RX completions; AMO
//! messages are applied to the local heap.
use super::*;
use crate::gda::apply;

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
            if h.kind == STAGE_WRITE && self.batch_write(&h, &msg[STAGE_HDR_SIZE..]) {
                self.stats.received += 1;
                self.rx_batch.push((h, idx));
                return;
            }
            // Everything else is handled in arrival order, after the writes before it.
            self.flush_rx_batch();
            self.on_stage_msg(&h, &msg[STAGE_HDR_SIZE..]);
            if !inner.stop.load(Ordering::Acquire) {
                if let Err(e) = self.post_receive(idx) {
                    tracing::error!("software queue: cannot repost a receive buffer: {e}");
                }
            }
            return;
        }
        self.flush_rx_batch();
        match SendHdr::decode(msg) {
            None => tracing::warn!(
                "software queue: dropped a {len}-byte message that is not a software-queue SEND"
            ),
            Some(h) => {
                let payload = &msg[SEND_HDR_SIZE..];
                let mut status = CqStatus::Ok;
                let mut is_amo = false;
                match apply::apply_message(payload, &*self.tables) {
                    apply::Outcome::NotAmo => {}
                    apply::Outcome::Applied(_) => {
                        is_amo = true;
                        inner.amos_applied.fetch_add(1, Ordering::AcqRel);
                    }
                    apply::Outcome::Rejected { status: s, why } => {
                        is_amo = true;
                        status = s;
                        tracing::warn!(
                            "software queue: AMO from PE {} not applied ({s}): {why}",
                            h.src_pe
                        );
                    }
                }
                // An AMO applied without error and without an immediate needs no receive
                // completion: nothing waits for one (DeepEP-style code never polls the RX ring), and
                // producing one per AMO would pile up entries for a ring nobody drains.
                if is_amo && status == CqStatus::Ok && h.imm.is_none() {
                    if !inner.stop.load(Ordering::Acquire) {
                        if let Err(e) = self.post_receive(idx) {
                            tracing::error!("software queue: cannot repost a receive buffer: {e}");
                        }
                    }
                    return;
                }
                let (ah, src_qp) = self.source(Some(h.src_pe));
                let hold = inner.rx_credits.then_some(idx);
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
        }
        if !inner.stop.load(Ordering::Acquire) {
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
