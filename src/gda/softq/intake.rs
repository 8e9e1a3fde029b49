//! Intake and validation: the doorbell, flow control against `ctrl.done`, the request id and phase
//! checks, and the semantic checks of each WQE against the queue's tables.
use super::*;

/// A validated WQE, ready to post.
#[derive(Clone, Copy, Debug)]
pub(super) enum Action {
    /// RDMA write (`write`, with remote CQ data `data`) or read through the provider.
    Rdma {
        write: bool,
        local: u64,
        len: usize,
        desc: usize,
        dest: FiAddr,
        raddr: u64,
        key: u64,
        data: Option<u64>,
    },
    /// SEND; `after_data`: an AMO message that announces data (the ordering rule, `order.rs`).
    Send {
        dest: FiAddr,
        hdr: SendHdr,
        payload: Payload,
        after_data: bool,
        /// The payload is one AMO message (inline, checked): it may travel packed with others.
        amo: bool,
    },
    /// RDMA write (with immediate) or read by staged messages: `off` is the offset in the target's
    /// heap.
    Staged {
        write: bool,
        local: u64,
        len: usize,
        device: bool,
        dest: FiAddr,
        off: u64,
        imm: Option<u32>,
    },
    /// RDMA write or read as a copy between the local range and the peer's range mapped in this
    /// process (the copy route); `device`: the local range is GPU memory.
    Copy {
        dst: u64,
        src: u64,
        len: usize,
        device: bool,
    },
}

/// Where a WQE's remote range is: the address (or offset) the provider takes, the provider key,
/// the offset in the peer's heap and the address in the peer's address space.
#[derive(Clone, Copy, Debug)]
pub(super) struct RemoteRange {
    pub(super) raddr: u64,
    pub(super) key: u64,
    pub(super) off: u64,
    pub(super) peer_addr: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Payload {
    Inline([u8; wqe::INLINE_MAX], usize),
    Sgl([Option<(u64, usize, bool)>; 2]),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) pc: u64,
    pub(super) req_id: u16,
    pub(super) op: OpType,
    pub(super) action: Action,
    pub(super) slot: Option<u32>,
    pub(super) bounce: Option<u32>,
    /// The PE it is aimed at (the WQE's address handle).
    pub(super) peer: u16,
    /// The ring it was taken from (`pc` counts in that ring): the index among the rings of the
    /// thread that took it.
    pub(super) q: u16,
    /// Handed to thread 0 by the thread that took it (`threads.rs`): that thread and its slot.
    pub(super) from: Option<super::threads::Origin>,
}

/// A rejection: the completion status and the reason for the log.
pub(super) type Reject = (CqStatus, String);

pub(super) fn wqe_error_status(e: &WqeError) -> CqStatus {
    match e {
        WqeError::UnknownOpType(_) | WqeError::ImmediateWithRead => CqStatus::LocalUnsupportedOp,
        WqeError::InlineTooLong { .. }
        | WqeError::BadDescriptorCount { .. }
        | WqeError::ZeroLength { .. }
        | WqeError::LengthMismatch { .. } => CqStatus::LocalBadLength,
        WqeError::LkeyTooWide { .. } => CqStatus::LocalInvalidLkey,
        _ => CqStatus::LocalQpInternalError,
    }
}

impl Consumer {
    // ---- SQ side ----

    /// The doorbell record of the ring being consumed.
    pub(super) fn doorbell(&self) -> u32 {
        // SAFETY: the doorbell word lives in the ring memory for the life of the ring.
        let v = unsafe { mem::atomic_u32(self.rings[self.cur].doorbell) }.load(Ordering::Acquire);
        fence(Ordering::Acquire);
        v
    }

    pub(super) fn refresh_done(&mut self) -> bool {
        // The device's copy in host memory (free to read). The device writes it whenever it moves
        // `done`, so once it has been seen moving, reading the control block in device memory (a
        // copy and a stream synchronisation, tens of microseconds) cannot tell more. Device
        // headers older than the copy never write it: for them the control block is read.
        let inner = self.inner.clone();
        let r = &mut self.rings[self.cur];
        let raw = r.host_word(HC_DONE).load(Ordering::Acquire);
        r.done_mirrored |= raw != 0;
        let mirror = raw.min(r.ci);
        if mirror > r.cached_done {
            r.cached_done = mirror;
            return true;
        }
        if r.done_mirrored {
            return false;
        }
        if let Some(t) = r.done_checked {
            if r.ctrl(&inner).host().is_none() && t.elapsed() < CTRL_REFRESH {
                return false;
            }
        }
        r.done_checked = Some(Instant::now());
        match r.ctrl(&inner).read_u64(OFF_DONE) {
            Ok(d) if d > r.cached_done => {
                r.cached_done = d.min(r.ci);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!("software queue: {e}");
                false
            }
        }
    }

    /// The device's staging limit: a poster may write a WQE only once the doorbell is within
    /// `max_batch` of it, so at most `max_batch` WQEs of all posters together stand written but not
    /// rung (rdma-core rings at least every `max_batch` WQEs; NCCL's EFA GDA device code keeps
    /// un-doorbelled WQEs of all concurrent posters within it). Looks at the slots of producer counts
    /// `[db + B, db + 2B)` (B = min(max_batch, sq_entries)), `db` the doorbell: a slot there that
    /// already holds its WQE for this pass (meta_desc set, request id and phase of that count) was
    /// written too early if the doorbell, read again AFTER the slots, is still at least B below it
    /// (a poster that obeys the rule stored the doorbell it waited for before writing). Such WQEs
    /// are logged and remembered, and rejected when the consumer reaches them. Rate-limited (each
    /// ring every 50 us times the number of rings): the look costs up to B reads of ring memory.
    pub(super) fn check_written_ahead(&mut self) {
        const EVERY_NS: u64 = 50_000;
        // Each ring every EVERY_NS x rings: the look costs the same over all rings as for one.
        // The pass's clock: one read per consumer pass, not one per ring (with hundreds of rings
        // the reads were most of an idle pass), and a u64 compare per ring.
        let now = self.pass_ns;
        if now < self.r().ahead_due {
            return;
        }
        let every = EVERY_NS * self.rings.len() as u64;
        self.r().ahead_due = now + every;
        let n = u64::from(self.inner.sq_entries);
        let b = u64::from(self.inner.max_batch).min(n);
        if b >= n {
            return;
        }
        let es = self.inner.sq_entry_size as usize;
        let ci = self.rings[self.cur].ci;
        let sq = self.rings[self.cur].sq;
        let db1 = ci + u64::from(self.doorbell().wrapping_sub(ci as u32));
        let first = db1 + b;
        let count = b.min(n - b);
        let mut seen = Vec::new();
        for pc in first..first + count {
            let slot = (pc & (n - 1)) as usize;
            // SAFETY: the slot lies inside the SQ ring; its first 8 bytes are read.
            let head: [u8; 8] = unsafe { mem::read_shared(sq.add(slot * es)) };
            let req_id = u16::from_le_bytes([head[0], head[1]]);
            if head[2] & wqe::CTRL1_META_DESC != 0
                && req_id == pc as u16
                && head[3] & wqe::CTRL2_PHASE == wqe::phase_for(pc, self.inner.sq_entries)
            {
                seen.push(pc);
            }
        }
        if seen.is_empty() {
            return;
        }
        fence(Ordering::SeqCst);
        let db2 = ci + u64::from(self.doorbell().wrapping_sub(ci as u32));
        let q = self.cur;
        for pc in seen {
            if pc >= db2 + b && pc >= ci && self.rings[q].ahead.insert(pc) {
                let k = self.inner.ahead_of_doorbell.fetch_add(1, Ordering::AcqRel) + 1;
                if k <= WARN_REJECTS {
                    tracing::error!(
                        "software queue: rule violated: WQE {pc} of ring {q} was written while the \
                         doorbell stood at {db2}, more than max_batch ({b}) WQEs ahead of it (the \
                         device stages at most max_batch un-doorbelled WQEs); it will be rejected"
                    );
                }
            }
        }
    }

    pub(super) fn consume(&mut self) -> usize {
        let mut work = 0;
        // A ring whose WQE the provider refused waits for it; the other rings go on.
        let cur = self.cur;
        if self.stalled.contains_key(&cur) {
            work += self.retry_stalled_at(cur);
            if self.stalled.contains_key(&cur) {
                return work;
            }
        }
        self.check_written_ahead();
        let db = self.doorbell();
        let avail = db.wrapping_sub(self.r().ci as u32);
        if avail == 0 {
            return work;
        }
        // Tables changed before the doorbell (a heap chunk recorded, then a WQE into it) must be
        // seen by these WQEs: the doorbell was read after the generation the loop last checked.
        self.refresh_tables();
        self.copy_route_ready();
        let q = self.cur;
        if avail > self.inner.sq_entries {
            if self.rings[q].bad_doorbell != Some(db) {
                tracing::error!(
                    "software queue: doorbell {db} of ring {q} announces {avail} WQEs past the {} \
                     consumed, more than the ring holds ({}): ignored until it makes sense",
                    self.rings[q].ci,
                    self.inner.sq_entries
                );
                self.rings[q].bad_doorbell = Some(db);
            }
            return work;
        }
        let sq_entries = u64::from(self.inner.sq_entries);
        for _ in 0..(avail as usize).min(BURST) {
            if self.rings[q].ci >= self.rings[q].cached_done + sq_entries && !self.refresh_done() {
                break;
            }
            if self.rings[q].ci >= self.rings[q].cached_done + sq_entries {
                break;
            }
            let pc = self.rings[q].ci;
            #[cfg(feature = "test-support")]
            if pc == self.inner.panic_at.load(Ordering::Acquire) {
                panic!("injected fault: consumer panic at WQE {pc}");
            }
            #[cfg(feature = "test-support")]
            if pc == self.inner.stall_at.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(
                    self.inner.stall_ms.load(Ordering::Acquire),
                ));
            }
            let slot = (pc & u64::from(self.inner.sq_entries - 1)) as usize;
            let es = self.inner.sq_entry_size as usize;
            // SAFETY: the slot lies inside the ring's SQ.
            let at = unsafe { self.rings[q].sq.add(slot * es) };
            let mut entry = [0u8; WQE_SIZE_128];
            if es == WQE_SIZE_128 {
                // SAFETY: the 128-byte slot lies inside the SQ ring; 64-byte aligned.
                entry = unsafe { mem::read_shared(at) };
            } else {
                // SAFETY: the 64-byte slot lies inside the SQ ring; 64-byte aligned.
                let b: [u8; WQE_SIZE] = unsafe { mem::read_shared(at) };
                entry[..WQE_SIZE].copy_from_slice(&b);
            }
            let r = &mut self.rings[q];
            r.ci += 1;
            r.host_word(HC_CONSUMED).store(r.ci, Ordering::Release);
            work += 1;
            let t_check = self.rounds.timing.then(Instant::now);
            let verdict = if self.rings[q].ahead.remove(&pc) {
                let raw_op =
                    OpType::from_raw(entry[2] & wqe::CTRL1_OP_TYPE_MASK).unwrap_or(OpType::Send);
                Err((
                    pc as u16,
                    raw_op,
                    (
                        CqStatus::LocalQpInternalError,
                        format!(
                            "rule violated: written more than max_batch ({}) WQEs ahead of the doorbell",
                            self.inner.max_batch
                        ),
                    ),
                ))
            } else {
                self.validate(pc, &entry[..es])
            };
            let t_post = self.rounds.timing.then(Instant::now);
            if let (Some(a), Some(b)) = (t_check, t_post) {
                self.rounds.check += b - a;
            }
            match verdict {
                Ok(p) => {
                    // The ordering rule: an AMO announcing data waits for the WQEs before it.
                    self.order.taken(p.stream(), p.pc);
                    let announcing = p.announces();
                    let held = self.order.hold_if_needed(p);
                    if announcing {
                        self.publish_counts();
                    }
                    let Some(p) = held else {
                        continue;
                    };
                    if !self.inner.unordered.is_zero() && p.writes() {
                        // The unordered fabric model: this write goes later, what follows goes on.
                        self.late
                            .push_back((Instant::now() + self.inner.unordered, p));
                        continue;
                    }
                    if let Err(p) = self.post(p) {
                        self.stats.wqe_refused += 1;
                        self.inner.wqes_refused.fetch_add(1, Ordering::Relaxed);
                        self.stalled.insert(q, p);
                        break;
                    }
                }
                Err((req_id, op, (status, why))) => self.reject(pc, req_id, op, status, &why),
            }
            if let Some(b) = t_post {
                self.rounds.post += b.elapsed();
            }
        }
        // The round's copies go once every ring was read (the consumer loop flushes them).
        work
    }

    /// Rejects WQE `pc` of the ring being consumed.
    pub(super) fn reject(&mut self, pc: u64, req_id: u16, op: OpType, status: CqStatus, why: &str) {
        let q = self.cur;
        self.rejected += 1;
        let r = &mut self.rings[q];
        r.rejected += 1;
        r.host_word(HC_REJECTED)
            .store(r.rejected, Ordering::Release);
        if self.rejected <= WARN_REJECTS {
            tracing::warn!(
                "software queue: WQE {pc} of ring {q} rejected with status {status}: {why}"
            );
            if self.rejected == WARN_REJECTS {
                tracing::warn!("software queue: further rejected WQEs are logged at debug level");
            }
        } else {
            tracing::debug!(
                "software queue: WQE {pc} of ring {q} rejected with status {status}: {why}"
            );
        }
        self.push_tx_cqe(q, req_id, status, op);
    }

    /// Checks the ring entry (64 or 128 bytes) of producer count `pc`.
    pub(super) fn validate(
        &mut self,
        pc: u64,
        bytes: &[u8],
    ) -> std::result::Result<Pending, (u16, OpType, Reject)> {
        let expected_id = pc as u16;
        let raw_op = OpType::from_raw(bytes[2] & wqe::CTRL1_OP_TYPE_MASK).unwrap_or(OpType::Send);
        let fail = |status: CqStatus, why: String| (expected_id, raw_op, (status, why));
        let req_id = u16::from_le_bytes([bytes[0], bytes[1]]);
        if req_id != expected_id {
            return Err(fail(
                CqStatus::LocalQpInternalError,
                format!("request id {req_id:#06x} is not the producer count's low 16 bits {expected_id:#06x}"),
            ));
        }
        let desc = wqe::decode_entry(bytes, false).map_err(|e| match e {
            WqeError::ReservedNonZero { offset } if usize::from(offset) >= WQE_SIZE => fail(
                CqStatus::LocalQpInternalError,
                format!(
                    "rule violated: byte {offset} of a {}-byte SQ entry is not zero (a 128-byte entry \
                     is written whole; stale bytes of an earlier WQE remain)",
                    bytes.len()
                ),
            ),
            e => fail(wqe_error_status(&e), format!("malformed WQE: {e}")),
        })?;
        let want_phase = wqe::phase_for(pc, self.inner.sq_entries);
        if desc.phase != want_phase {
            return Err(fail(
                CqStatus::LocalQpInternalError,
                format!(
                    "phase {} where {want_phase} was expected (stale or misplaced WQE)",
                    desc.phase
                ),
            ));
        }
        let op = desc.op.op_type();
        let action = self
            .check_semantics(&desc)
            .map_err(|(s, w)| (expected_id, op, (s, w)))?;
        Ok(Pending {
            pc,
            req_id: expected_id,
            op,
            action,
            slot: None,
            bounce: None,
            peer: desc.ah,
            q: self.cur as u16,
            from: None,
        })
    }

    pub(super) fn check_semantics(&self, d: &WqeDesc) -> std::result::Result<Action, Reject> {
        let t = &self.tables;
        let peer = t.peers.get(usize::from(d.ah)).ok_or_else(|| {
            (
                CqStatus::LocalInvalidAh,
                format!("address handle {} (connected PEs: {})", d.ah, t.peers.len()),
            )
        })?;
        if d.dest_qpn != peer.qpn {
            return Err((
                CqStatus::RemoteBadDestQpn,
                format!(
                    "dest_qp_num {} where PE {} has {}",
                    d.dest_qpn, d.ah, peer.qpn
                ),
            ));
        }
        if d.qkey != t.qkey {
            return Err((
                CqStatus::LocalUnreachableRemote,
                format!("qkey {:#x} where the job's is {:#x}", d.qkey, t.qkey),
            ));
        }
        let lkey_reg = |lkey: u32| -> std::result::Result<&LocalReg, Reject> {
            t.local(lkey).ok_or_else(|| {
                (
                    CqStatus::LocalInvalidLkey,
                    format!("lkey {lkey} is not registered"),
                )
            })
        };
        let local =
            |addr: u64, lkey: u32, len: u64| -> std::result::Result<(LocalReg, u64), Reject> {
                let reg = lkey_reg(lkey)?;
                let host = reg.translate(addr, len).ok_or_else(|| {
                    (
                        CqStatus::LocalInvalidLkey,
                        format!(
                            "local range {addr:#x}+{len} outside lkey {lkey} ({:#x}+{})",
                            reg.dev_base, reg.len
                        ),
                    )
                })?;
                Ok((*reg, host))
            };
        let remote = |raddr: u64,
                      rkey: u32,
                      len: u64|
         -> std::result::Result<RemoteRange, Reject> {
            // The rkey names one chunk of the peer's heap (O(1)); the range must lie in it.
            let h = peer.chunk(rkey).ok_or_else(|| {
                (
                    CqStatus::RemoteBadAddress,
                    format!("rkey {rkey} names no known heap chunk of PE {}", d.ah),
                )
            })?;
            let in_chunk = raddr
                    .checked_sub(h.base)
                    .filter(|&o| o <= h.size && len <= h.size - o)
                    .ok_or_else(|| {
                        (
                            CqStatus::RemoteBadAddress,
                            format!(
                                "remote range {raddr:#x}+{len} outside PE {}'s heap chunk {rkey} ({:#x}+{})",
                                d.ah, h.base, h.size
                            ),
                        )
                    })?;
            Ok(RemoteRange {
                raddr: if self.inner.virt_addr {
                    raddr
                } else {
                    in_chunk
                },
                key: h.key,
                off: h.start + in_chunk,
                peer_addr: h.base + in_chunk,
            })
        };
        match d.op {
            WqeOp::RdmaWrite {
                remote: r,
                local: l,
            }
            | WqeOp::RdmaWriteImm {
                remote: r,
                local: l,
                ..
            } => {
                let len = u64::from(l.len);
                let (reg, host) = if len == 0 {
                    let reg = lkey_reg(l.lkey)?;
                    (*reg, reg.host_base)
                } else {
                    local(l.addr, l.lkey, len)?
                };
                let rr = remote(r.addr, r.rkey, len)?;
                Ok(self.rdma_action(true, &reg, host, len, d.ah, peer, rr, d.op.imm()))
            }
            WqeOp::RdmaRead {
                remote: r,
                local: l,
            } => {
                let len = u64::from(l.len);
                let (reg, host) = local(l.addr, l.lkey, len)?;
                let rr = remote(r.addr, r.rkey, len)?;
                Ok(self.rdma_action(false, &reg, host, len, d.ah, peer, rr, None))
            }
            WqeOp::Send { payload, imm } => {
                let (payload, len) = match payload {
                    SendPayload::Inline { len, data } => {
                        let n = usize::from(len).min(wqe::INLINE_MAX);
                        (Payload::Inline(data, n), n)
                    }
                    SendPayload::Sgl { first, second } => {
                        let mut parts = [None, None];
                        let mut total = 0usize;
                        for (i, b) in std::iter::once(first).chain(second).enumerate() {
                            let (reg, host) = local(b.addr, b.lkey, u64::from(b.len))?;
                            total += b.len as usize;
                            parts[i] = Some((host, b.len as usize, reg.device));
                        }
                        (Payload::Sgl(parts), total)
                    }
                };
                if len > SOFT_SEND_MAX {
                    return Err((
                        CqStatus::LocalBadLength,
                        format!("SEND of {len} bytes (the software queue carries {SOFT_SEND_MAX})"),
                    ));
                }
                let mut after_data = false;
                let mut amo = false;
                if let Payload::Inline(data, n) = payload {
                    match AmoMsg::parse(&data[..n], peer.heap_extent()) {
                        Some(Err(e)) => {
                            return Err((
                                crate::gda::apply::amo_status(&e),
                                format!("AMO message to PE {}: {e}", d.ah),
                            ))
                        }
                        Some(Ok(m)) if !peer.holds(m.offset, u64::from(m.size)) => {
                            return Err((
                                CqStatus::RemoteBadAddress,
                                format!(
                                    "AMO message to PE {}: offset {:#x} lies in no heap chunk",
                                    d.ah, m.offset
                                ),
                            ))
                        }
                        Some(Ok(m)) => {
                            after_data = m.flags & wire::AMO_AFTER_DATA != 0;
                            amo = n == wire::AMO_MSG_SIZE;
                        }
                        None => {}
                    }
                }
                let hdr = SendHdr {
                    src_pe: t.my_pe as u32,
                    imm,
                    len: len as u16,
                    // Set when the SEND is posted (the token names its slot): `post`.
                    answer: None,
                    packed: false,
                };
                Ok(Action::Send {
                    dest: peer.fi_addr,
                    hdr,
                    payload,
                    after_data,
                    amo,
                })
            }
        }
    }

    /// How an RDMA write (`write`) or read of `len` bytes at local `host` (in `reg`) with PE `pe`'s
    /// range `rr` executes: as a copy when the peer's range is mapped here (and no immediate rides
    /// along, and it fits the bounce ring where copies go through one), by staged messages when the queue stages the memory, else through the provider.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rdma_action(
        &self,
        write: bool,
        reg: &LocalReg,
        host: u64,
        len: u64,
        pe: u16,
        peer: &Peer,
        rr: RemoteRange,
        imm: Option<u32>,
    ) -> Action {
        let pm = self.tables.peer_memory.as_ref().map(|m| &*m.0);
        let route = ipc_route(
            self.copyq.is_some(),
            pm,
            i32::from(pe),
            rr.peer_addr,
            len,
            imm.is_some(),
        );
        if let Some(mapped) = route.filter(|_| self.copy_fits(len)) {
            let (dst, src) = if write {
                (mapped, host)
            } else {
                (host, mapped)
            };
            return Action::Copy {
                dst,
                src,
                len: len as usize,
                device: reg.device,
            };
        }
        if self.stages(reg) {
            return Action::Staged {
                write,
                local: host,
                len: len as usize,
                device: reg.device,
                dest: peer.fi_addr,
                off: rr.off,
                imm,
            };
        }
        Action::Rdma {
            write,
            local: host,
            len: len as usize,
            desc: reg.desc,
            dest: peer.fi_addr,
            raddr: rr.raddr,
            key: rr.key,
            data: imm
                .map(|imm| wire::write_imm_data(imm, self.tables.my_pe, self.inner.cq_data_wide)),
        }
    }
}
