//! Execution: posting validated WQEs on the private endpoint, bounce buffers, retries on `-FI_EAGAIN`.
use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) struct InFlight {
    /// Producer count and target PE (the ordering rule's bookkeeping).
    pub(super) pc: u64,
    pub(super) peer: u16,
    /// The ring the WQE came from (its completion goes to that ring's CQ).
    pub(super) q: u16,
    pub(super) req_id: u16,
    pub(super) op: OpType,
    pub(super) bounce: Option<u32>,
    pub(super) stage: Option<Stage>,
    /// Handed over by another thread (`threads.rs`): its completion goes back there.
    pub(super) from: Option<super::threads::Origin>,
    /// When it was posted (debug level only: the post-to-completion times of the stop summary).
    pub(super) since: Option<Instant>,
}

impl InFlight {
    /// The in-flight record of pending WQE `p`, with its bounce range and staging state.
    pub(super) fn of(p: &Pending, bounce: Option<u32>, stage: Option<Stage>) -> InFlight {
        InFlight {
            pc: p.pc,
            peer: p.peer,
            q: p.q,
            req_id: p.req_id,
            op: p.op,
            bounce,
            stage,
            from: p.from,
            since: None,
        }
    }
}

/// Maps a libfabric error code (negative or positive errno) to the EFA status closest in meaning.
pub fn fabric_error_status(code: i32) -> CqStatus {
    let e = code.unsigned_abs();
    match e {
        x if x == errno::ECANCELED => CqStatus::Flushed,
        x if x == errno::EINVAL
            || x == errno::EACCES
            || x == errno::EKEYREJECTED
            || x == errno::ENOKEY =>
        {
            CqStatus::RemoteBadAddress
        }
        x if x == errno::EMSGSIZE || x == errno::ETRUNC || x == errno::ETOOSMALL => {
            CqStatus::RemoteBadLength
        }
        x if x == errno::ECONNRESET || x == errno::ECONNABORTED => CqStatus::RemoteAbort,
        x if x == errno::ENOTCONN
            || x == errno::ECONNREFUSED
            || x == errno::EHOSTUNREACH
            || x == errno::ENETUNREACH
            || x == errno::EADDRNOTAVAIL =>
        {
            CqStatus::LocalUnreachableRemote
        }
        x if x == errno::ETIMEDOUT => CqStatus::LocalUnresponsiveRemote,
        x if x == errno::EOPNOTSUPP || x == errno::ENOSYS => CqStatus::LocalUnsupportedOp,
        x if x == errno::ENOMEM => CqStatus::LocalQpInternalError,
        _ => CqStatus::RemoteBadStatus,
    }
}

impl Consumer {
    /// Whether an RDMA transfer from or to `reg` is staged.
    pub(super) fn stages(&self, reg: &LocalReg) -> bool {
        match self.inner.staging {
            Staging::Off => false,
            Staging::All => true,
            Staging::Device => reg.device || self.tables.heap_device(),
        }
    }

    /// Records WQE `f` in flight in consumer slot `slot`.
    pub(super) fn occupy(&mut self, slot: u32, mut f: InFlight) {
        f.since = self.rounds.timing.then(Instant::now);
        self.slots[slot as usize] = Some(f);
        self.in_flight += 1;
    }

    /// Posts the held AMOs whose covered WQEs have completed (the ordering rule, `order.rs`), and
    /// the writes of the unordered fabric model whose time has come.
    pub(super) fn release_held(&mut self) -> usize {
        let mut n = 0;
        while self.late.front().is_some_and(|(t, _)| *t <= Instant::now()) {
            let (t, p) = self.late.pop_front().expect("front checked");
            match self.post(p) {
                Ok(()) => n += 1,
                Err(p) => {
                    self.late.push_front((t, p));
                    break;
                }
            }
        }
        while let Some(p) = self.order.next_ready() {
            match self.post(p) {
                Ok(()) => {
                    self.order.released();
                    n += 1;
                }
                Err(p) => {
                    self.order.put_back(p);
                    break;
                }
            }
        }
        n
    }

    /// Posts again every ring's refused WQE that the provider now takes.
    pub(super) fn retry_stalled(&mut self) -> usize {
        let rings: Vec<usize> = self.stalled.keys().copied().collect();
        let n = rings.into_iter().map(|q| self.retry_one(q)).sum();
        self.flush_copies();
        n
    }

    /// Posts again the refused WQE of the ring at position `q`, if the provider now takes it.
    pub(super) fn retry_stalled_at(&mut self, q: usize) -> usize {
        let n = self.retry_one(q);
        self.flush_copies();
        n
    }

    fn retry_one(&mut self, q: usize) -> usize {
        match self.stalled.remove(&q) {
            Some(p) => match self.post(p) {
                Ok(()) => 1,
                Err(p) => {
                    self.stalled.insert(q, p);
                    0
                }
            },
            None => 0,
        }
    }

    /// Posts a validated WQE. `Err` hands it back when the provider (or the bounce pool) asks to try
    /// again later; any other failure completes it with an error status.
    // The WQE comes back by value to wait for a retry: no allocation on the hot path.
    #[allow(clippy::result_large_err)]
    pub(super) fn post(&mut self, mut p: Pending) -> std::result::Result<(), Pending> {
        if p.slot.is_none() {
            match self.free_slots.pop() {
                Some(s) => p.slot = Some(s),
                None => return Err(p),
            }
        }
        if !self.owns_endpoint() && !matches!(p.action, Action::Copy { .. }) {
            // Only thread 0 uses the endpoint (`threads.rs`).
            self.hand_over(p);
            return Ok(());
        }
        if let Some(item) = self.staged_item(&p) {
            self.start_staged(p, item);
            return Ok(());
        }
        if let Action::Copy {
            dst,
            src,
            len,
            device,
        } = p.action
        {
            return self.post_copy(p, dst, src, len, device);
        }
        // An answered SEND (`wire.rs`): its token names the slot, and the WQE completes when the
        // target's answer comes (`tx_done`, the staged acknowledgement's handler).
        let answer = (self.inner.answered_sends && matches!(p.action, Action::Send { .. }))
            .then(|| super::staging::stage_token(p.pc, p.slot.expect("slot taken above")));
        // An answered AMO travels packed with the others of this pass to its PE (`answers.rs`).
        if let Some(token) = answer {
            if self.pack(&mut p, token) {
                return Ok(());
            }
        }
        if let Action::Send { hdr, payload, .. } = &p.action {
            if p.bounce.is_none() {
                let Some(b) = self.free_bounce.pop() else {
                    return Err(p);
                };
                p.bounce = Some(b);
                let hdr = SendHdr { answer, ..*hdr };
                if let Err(why) = self.fill_bounce(b, &hdr, payload) {
                    self.finish_failed(p, CqStatus::LocalQpInternalError, &why);
                    return Ok(());
                }
            }
        }
        let slot = p.slot.expect("slot set above");
        let inner = self.inner.clone();
        let Some(ctx) = inner.ctxs.alloc(TAG_TX, u64::from(slot)) else {
            return Err(p);
        };
        let r = loop {
            // SAFETY: every buffer was validated to lie inside a registration the queue keeps open
            // (or is one of the queue's bounce buffers); the context stays valid until the completion
            // is reaped or the endpoint is closed.
            let r = unsafe { self.issue(&inner, &p, ctx) };
            match r {
                Err(e)
                    if self.delivery_flags != 0
                        && (e.code == -(errno::EBADFLAGS as i32)
                            || e.code == -(errno::EOPNOTSUPP as i32)
                            || e.code == -(errno::ENOSYS as i32)) =>
                {
                    tracing::warn!(
                        "software queue: provider refuses FI_DELIVERY_COMPLETE ({e}); using its \
                         default completion. An AMO that announces data then waits only for the \
                         transmit completions of the writes before it: the order at the target \
                         is the provider's (docs/ordering.md)"
                    );
                    self.delivery_flags = 0;
                }
                other => break other,
            }
        };
        if matches!(p.action, Action::Send { .. }) {
            let e = if r.as_ref().is_err_and(|e| e.is_again()) {
                super::trace::Event::SendRefused
            } else {
                super::trace::Event::Send
            };
            self.note(e, u32::from(p.q), u32::from(p.peer));
        }
        match r {
            Ok(()) => {
                // An answered SEND waits for its send completion (`queued`) and for the answer
                // (`awaiting`).
                let stage = answer.map(|token| Stage {
                    awaiting: 1,
                    ..Stage::new(token)
                });
                self.occupy(slot, InFlight::of(&p, p.bounce, stage));
                Ok(())
            }
            Err(e) if e.is_again() => {
                inner.ctxs.free(ctx);
                Err(p)
            }
            Err(e) => {
                inner.ctxs.free(ctx);
                let status = fabric_error_status(e.code);
                self.finish_failed(p, status, &e.to_string());
                Ok(())
            }
        }
    }

    /// # Safety
    /// `ctx` must be a context of the queue's pool; the buffers of `p` must be valid (see `post`).
    pub(super) unsafe fn issue(
        &self,
        inner: &Inner,
        p: &Pending,
        ctx: *mut c_void,
    ) -> crate::fabric::Result<()> {
        let ep = &inner.ep;
        match p.action {
            Action::Rdma {
                write,
                local,
                len,
                desc,
                dest,
                raddr,
                key,
                data,
            } => {
                // Reads take the provider's default completion (their data is here when it comes).
                let mut flags = if write { self.delivery_flags } else { 0 };
                if data.is_some() {
                    flags |= flags::REMOTE_CQ_DATA;
                }
                // SAFETY: forwarded contract.
                unsafe {
                    ep.rma_msg(
                        write,
                        local as *mut u8,
                        len,
                        desc as *mut c_void,
                        dest,
                        raddr,
                        key,
                        ctx,
                        data.unwrap_or(0),
                        flags,
                    )
                }
            }
            Action::Staged { .. } | Action::Copy { .. } => {
                unreachable!("staged WQEs go through the outbox, copies through the copy queue")
            }
            Action::Send { dest, hdr, .. } => {
                let b = p.bounce.expect("bounce buffer taken before issue") as usize;
                let len = SEND_HDR_SIZE + usize::from(hdr.len);
                // An answered SEND needs no delivery completion: the answer says more.
                let flags = if inner.answered_sends {
                    flags::COMPLETION | flags::TRANSMIT_COMPLETE
                } else {
                    self.delivery_flags
                };
                // SAFETY: forwarded contract; the bounce buffer holds header and payload.
                unsafe {
                    ep.send_msg(
                        inner.send_bufs.ptr(b),
                        len,
                        inner.send_bufs.desc(),
                        dest,
                        ctx,
                        flags,
                    )
                }
            }
        }
    }

    pub(super) fn fill_bounce(
        &self,
        b: u32,
        hdr: &SendHdr,
        payload: &Payload,
    ) -> std::result::Result<(), String> {
        let dst = self.inner.send_bufs.ptr(b as usize);
        let h = hdr.encode();
        // SAFETY: the bounce slot holds SEND_HDR_SIZE + SOFT_SEND_MAX bytes, and the payload length
        // was checked against SOFT_SEND_MAX.
        unsafe {
            ptr::copy_nonoverlapping(h.as_ptr(), dst, SEND_HDR_SIZE);
            let mut at = dst.add(SEND_HDR_SIZE);
            match payload {
                Payload::Inline(data, n) => ptr::copy_nonoverlapping(data.as_ptr(), at, *n),
                Payload::Sgl(parts) => {
                    for (src, len, device) in parts.iter().flatten() {
                        if *device {
                            cuda::memcpy(at as *mut c_void, *src as *const c_void, *len).map_err(
                                |e| format!("copying a SEND payload from GPU memory: {e}"),
                            )?;
                        } else {
                            ptr::copy_nonoverlapping(*src as *const u8, at, *len);
                        }
                        at = at.add(*len);
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn finish_failed(&mut self, p: Pending, status: CqStatus, why: &str) {
        tracing::warn!(
            "software queue: WQE with request id {} failed at post ({status}): {why}",
            p.req_id
        );
        if let Some(s) = p.slot {
            self.free_slots.push(s);
        }
        if let Some(b) = p.bounce {
            self.free_bounce.push(b);
        }
        if let Some(o) = p.from {
            // Another thread's WQE: its owner closes it and writes its completion.
            self.hand_back(o, status);
            return;
        }
        self.order.closed(p.stream(), p.pc);
        self.push_tx_cqe(usize::from(p.q), p.req_id, status, p.op);
    }
}
