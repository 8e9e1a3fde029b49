//! Staged RDMA: GPU memory moved by the consumers themselves through registered host buffers
//! (see the module documentation of `softq`).
use super::*;

/// Progress of a staged WQE. Its completion is written once nothing of it is queued or deferred
/// and no reply is awaited.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stage {
    pub(super) token: u64,
    /// Messages sent whose reply has not come (write chunks; the read request until its data is in).
    pub(super) awaiting: u32,
    /// Part of it still sits in the outbox.
    pub(super) queued: bool,
    /// The last chunk of a write with immediate, held until every earlier chunk is acknowledged
    /// (so the immediate never arrives before the data).
    pub(super) deferred: Option<OutItem>,
    /// Worst status so far.
    pub(super) status: CqStatus,
    /// Read: local destination (host address), whether it is GPU memory, bytes still to come.
    pub(super) read_dst: u64,
    pub(super) read_device: bool,
    pub(super) read_len: u64,
    pub(super) read_left: u64,
}

impl Stage {
    /// A WQE `token` that has a part still to go out (`queued`), nothing awaited or failed yet,
    /// and no read.
    pub(super) fn new(token: u64) -> Stage {
        Stage {
            token,
            awaiting: 0,
            queued: true,
            deferred: None,
            status: CqStatus::Ok,
            read_dst: 0,
            read_device: false,
            read_len: 0,
            read_left: 0,
        }
    }
}

/// A staged message (or a run of chunks) waiting for a send buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct OutItem {
    pub(super) dest: FiAddr,
    pub(super) kind: u8,
    pub(super) token: u64,
    pub(super) status: CqStatus,
    pub(super) imm: Option<u32>,
    /// Host address of the bytes to carry (0: none).
    pub(super) src: u64,
    pub(super) device: bool,
    /// Offset field of the first chunk (heap offset, or offset into the read).
    pub(super) off: u64,
    /// Bytes of the whole range.
    pub(super) len: u64,
    /// Bytes already sent.
    pub(super) sent: u64,
    /// Messages already sent.
    pub(super) msgs: u32,
    /// Slot of this queue's own WQE the item belongs to (replies to peers have none).
    pub(super) owner: Option<u32>,
    /// Send buffer that already holds the next chunk's payload (copied out of GPU memory in a
    /// batch, see `Consumer::prefetch_outbox`), and that chunk's length.
    pub(super) prepared: Option<(u32, u64)>,
}

/// Token of a staged WQE: its producer count's low 32 bits and its slot.
pub(super) fn stage_token(pc: u64, slot: u32) -> u64 {
    (pc << 32) | u64::from(slot)
}

impl Consumer {
    /// The outbox item that starts a staged WQE (`None` for the other actions).
    pub(super) fn staged_item(&self, p: &Pending) -> Option<OutItem> {
        let slot = p.slot?;
        let token = stage_token(p.pc, slot);
        let item = |dest, kind, src, device, off, len: usize, imm| OutItem {
            dest,
            kind,
            token,
            status: CqStatus::Ok,
            imm,
            src,
            device,
            off,
            len: len as u64,
            sent: 0,
            msgs: 0,
            owner: Some(slot),
            prepared: None,
        };
        match p.action {
            Action::Staged {
                write: true,
                local,
                len,
                device,
                dest,
                off,
                imm,
            } => Some(item(dest, STAGE_WRITE, local, device, off, len, imm)),
            Action::Staged {
                write: false,
                len,
                dest,
                off,
                ..
            } => Some(item(dest, STAGE_READ_REQ, 0, false, off, len, None)),
            _ => None,
        }
    }

    /// Records a staged WQE as in flight and queues its first messages.
    pub(super) fn start_staged(&mut self, p: Pending, item: OutItem) {
        let slot = p.slot.expect("slot taken before staging");
        let (read_dst, read_device, read_left) = match p.action {
            Action::Staged {
                write: false,
                local,
                len,
                device,
                ..
            } => (local, device, len as u64),
            _ => (0, false, 0),
        };
        self.occupy(
            slot,
            InFlight::of(
                &p,
                None,
                Some(Stage {
                    read_dst,
                    read_device,
                    read_len: read_left,
                    read_left,
                    ..Stage::new(item.token)
                }),
            ),
        );
        self.outbox.push_back(item);
    }

    /// The stage of the in-flight WQE `token` names, if it is still in flight.
    pub(super) fn stage_mut(&mut self, token: u64) -> Option<&mut Stage> {
        let slot = token as u32 as usize;
        self.slots
            .get_mut(slot)?
            .as_mut()?
            .stage
            .as_mut()
            .filter(|s| s.token == token)
    }

    /// Writes the completion of staged WQE `token` once nothing of it is pending.
    pub(super) fn stage_settle(&mut self, token: u64) {
        let Some(st) = self.stage_mut(token) else {
            return;
        };
        if st.awaiting == 0 && st.deferred.is_some() {
            // Every earlier chunk landed: the chunk with the immediate may go.
            let item = st.deferred.take().expect("checked");
            st.queued = true;
            self.outbox.push_front(item);
            return;
        }
        if st.awaiting == 0 && !st.queued && st.deferred.is_none() {
            let status = st.status;
            self.complete_tx(token as u32 as u64, status);
        }
    }

    /// Records a failure of part of staged WQE `token` (the worst status wins; the first is kept).
    pub(super) fn stage_fail(&mut self, token: u64, status: CqStatus) {
        if let Some(st) = self.stage_mut(token) {
            if st.status == CqStatus::Ok {
                st.status = status;
            }
        }
    }

    /// Sends what the outbox holds while send buffers last. Returns the messages sent.
    /// Copies the next chunk of the outbox's GPU-memory items into send buffers, all in one batch
    /// (one stream synchronisation instead of one per message): `send_one` then only sends.
    pub(super) fn prefetch_outbox(&mut self) {
        let slot_room = self.chunk_room();
        // A quarter of the buffers stays free for acknowledgements and read requests.
        let reserve = self.inner.send_bufs.count / 4 + 1;
        let mut taken: Vec<usize> = Vec::new();
        for (i, item) in self.outbox.iter().enumerate() {
            if taken.len() >= PREFETCH_MAX || self.free_bounce.len() <= taken.len() + reserve {
                break;
            }
            let carries =
                matches!(item.kind, STAGE_WRITE | STAGE_READ_DATA) && item.status == CqStatus::Ok;
            if item.device && carries && item.prepared.is_none() && item.sent < item.len {
                taken.push(i);
            }
        }
        if taken.len() < 2 {
            return; // one copy gains nothing from a batch: send_one copies it
        }
        if self.copy_batch().is_none() {
            return;
        }
        let batch = self.copies.as_mut().expect("created above");
        let inner = self.inner.clone();
        let mut prepared = Vec::with_capacity(taken.len());
        for i in taken {
            let item = &mut self.outbox[i];
            let chunk = (item.len - item.sent).min(slot_room);
            let b = self.free_bounce.pop().expect("counted above");
            let buf = inner.send_bufs.ptr(b as usize);
            // SAFETY: the send buffer holds header + chunk bytes; the source range was validated
            // against the heap (or a registration) that stays allocated.
            let r = unsafe {
                batch.copy(
                    buf.add(STAGE_HDR_SIZE) as *mut c_void,
                    (item.src + item.sent) as *const c_void,
                    chunk as usize,
                )
            };
            if r.is_err() {
                self.free_bounce.push(b);
                break;
            }
            item.prepared = Some((b, chunk));
            prepared.push(i);
        }
        if let Err(why) = batch.wait() {
            // send_one copies them one by one (and reports what fails).
            tracing::debug!(
                "software queue: batched staging copy failed ({why}): copying one by one"
            );
            for i in prepared {
                if let Some((b, _)) = self.outbox[i].prepared.take() {
                    self.free_bounce.push(b);
                }
            }
        }
    }

    /// Most payload bytes one staged message carries (what a send buffer holds after the header).
    pub(super) fn chunk_room(&self) -> u64 {
        STAGE_CHUNK.min(self.inner.send_bufs.slot - STAGE_HDR_SIZE) as u64
    }

    /// The batch for staging copies, created on first use (None: CUDA cannot take copies here).
    pub(super) fn copy_batch(&mut self) -> Option<&mut cuda::CopyBatch> {
        if self.copies.is_none() {
            self.copies = cuda::CopyBatch::new().ok();
        }
        self.copies.as_mut()
    }

    /// Gives a dropped item's prepared send buffer back.
    pub(super) fn drop_item(&mut self, item: &mut OutItem) {
        if let Some((b, _)) = item.prepared.take() {
            self.free_bounce.push(b);
        }
    }

    pub(super) fn pump_outbox(&mut self) -> usize {
        let mut sent = 0;
        self.prefetch_outbox();
        while let Some(mut item) = self.outbox.pop_front() {
            if let Some(slot) = item.owner {
                let token = item.token;
                let Some(st) = self.stage_mut(token) else {
                    self.drop_item(&mut item);
                    continue; // its WQE was flushed
                };
                let chunk = (item.len - item.sent).min(STAGE_CHUNK as u64);
                let last = item.sent + chunk >= item.len;
                if item.kind == STAGE_WRITE
                    && item.imm.is_some()
                    && last
                    && item.msgs > 0
                    && st.awaiting > 0
                {
                    st.deferred = Some(item);
                    st.queued = false;
                    continue;
                }
                debug_assert_eq!(slot, token as u32);
            }
            match self.send_one(&mut item) {
                Ok(true) => {
                    sent += 1;
                    let more = match item.kind {
                        STAGE_WRITE | STAGE_READ_DATA if item.status == CqStatus::Ok => {
                            item.sent < item.len
                        }
                        _ => false,
                    };
                    if more {
                        self.outbox.push_front(item);
                    } else if item.owner.is_some() {
                        if let Some(st) = self.stage_mut(item.token) {
                            st.queued = false;
                        }
                        self.stage_settle(item.token);
                    }
                }
                Ok(false) => {
                    // No buffer, or the provider asks to try later: keep the order.
                    self.outbox.push_front(item);
                    break;
                }
                Err(status) => {
                    self.drop_item(&mut item);
                    if item.owner.is_some() {
                        self.stage_fail(item.token, status);
                        if let Some(st) = self.stage_mut(item.token) {
                            st.queued = false;
                        }
                        self.stage_settle(item.token);
                    }
                }
            }
        }
        sent
    }

    /// Sends the next message of `item`. `Ok(true)`: sent (the item advanced); `Ok(false)`: try
    /// again later; `Err`: the item failed (dropped by the caller).
    pub(super) fn send_one(&mut self, item: &mut OutItem) -> std::result::Result<bool, CqStatus> {
        let (b, prepared) = match item.prepared.take() {
            Some((b, chunk)) => (b, Some(chunk)),
            None => match self.free_bounce.pop() {
                Some(b) => (b, None),
                None => return Ok(false),
            },
        };
        // A buffer that goes back unused keeps its prepared payload for the next try.
        let give_back = |c: &mut Consumer, item: &mut OutItem| match prepared {
            Some(chunk) => item.prepared = Some((b, chunk)),
            None => c.free_bounce.push(b),
        };
        let inner = self.inner.clone();
        let buf = inner.send_bufs.ptr(b as usize);
        let carries = (matches!(item.kind, STAGE_WRITE | STAGE_READ_DATA)
            && item.status == CqStatus::Ok)
            || item.kind == STAGE_ACKS;
        let chunk = if carries {
            (item.len - item.sent).min(self.chunk_room())
        } else {
            0
        };
        let last = item.sent + chunk >= item.len;
        let hdr = StageHdr {
            kind: item.kind,
            imm: if item.kind == STAGE_WRITE && last {
                item.imm
            } else {
                None
            },
            status: item.status as u8,
            src_pe: self.tables.my_pe as u32,
            token: item.token,
            offset: item.off + item.sent,
            len: if carries {
                chunk as u32
            } else {
                item.len as u32
            },
            // Answers: the count of tokens.
            total: if item.kind == STAGE_ACKS {
                (item.len / 8) as u32
            } else {
                item.len as u32
            },
        };
        let h = hdr.encode();
        debug_assert!(prepared.is_none_or(|c| c == chunk));
        // SAFETY: the send buffer holds STAGE_SLOT >= header + chunk bytes; the source range was
        // validated against a registration (or the heap) that stays allocated.
        let copied = unsafe {
            ptr::copy_nonoverlapping(h.as_ptr(), buf, STAGE_HDR_SIZE);
            if prepared.is_some() {
                Ok(())
            } else {
                copy_any(
                    buf.add(STAGE_HDR_SIZE),
                    (item.src + item.sent) as *const u8,
                    chunk as usize,
                    item.device,
                )
            }
        };
        if let Err(why) = copied {
            self.free_bounce.push(b);
            tracing::warn!("software queue: staging {chunk} bytes failed: {why}");
            if item.owner.is_some() {
                return Err(CqStatus::LocalQpInternalError);
            }
            // A read reply: tell the initiator instead.
            item.status = CqStatus::RemoteBadStatus;
            return Ok(false);
        }
        let Some(ctx) = inner.ctxs.alloc(TAG_STX, u64::from(b)) else {
            self.stats.no_ctx += 1;
            give_back(self, item);
            return Ok(false);
        };
        // SAFETY: the buffer and the context belong to the queue and stay valid until the completion
        // is reaped or the endpoint is closed.
        let r = unsafe {
            inner.ep.send_msg(
                buf,
                STAGE_HDR_SIZE + chunk as usize,
                inner.send_bufs.desc(),
                item.dest,
                ctx,
                0,
            )
        };
        match r {
            Ok(()) => {
                self.stats.sent += 1;
                self.stats.refused_since = None;
                item.sent += chunk;
                item.msgs += 1;
                let awaits =
                    matches!(item.kind, STAGE_WRITE | STAGE_READ_REQ) && item.owner.is_some();
                if awaits {
                    if let Some(st) = self.stage_mut(item.token) {
                        st.awaiting += 1;
                    }
                    self.buf_owner[b as usize] = Some(item.token);
                }
                Ok(true)
            }
            Err(e) => {
                inner.ctxs.free(ctx);
                if e.is_again() {
                    self.stats.refused += 1;
                    self.stats.refused_since.get_or_insert_with(Instant::now);
                    give_back(self, item);
                    return Ok(false);
                }
                self.free_bounce.push(b);
                tracing::warn!("software queue: staged message failed: {e}");
                Err(fabric_error_status(e.code))
            }
        }
    }

    /// A staged message's send buffer came back (`code` 0: sent).
    pub(super) fn on_stage_sent(&mut self, b: usize, code: i32, text: &str) {
        let owner = self.buf_owner.get_mut(b).and_then(|o| o.take());
        let packed = self
            .packed_owners
            .get_mut(b)
            .map(std::mem::take)
            .unwrap_or_default();
        if b < self.inner.send_bufs.count {
            self.free_bounce.push(b as u32);
        }
        if !packed.is_empty() {
            // A packed SEND of AMOs (`Consumer::flush_packed`): sent, each waits for its answer;
            // failed, none will come.
            if code != 0 {
                let status = fabric_error_status(code);
                if code.unsigned_abs() != errno::ECANCELED {
                    tracing::warn!(
                        "software queue: a SEND of {} AMOs failed ({status}): {text}",
                        packed.len()
                    );
                }
                for t in packed {
                    self.unanswered(t, status);
                }
            }
            return;
        }
        self.stats.send_done += 1;
        if code != 0 {
            if code.unsigned_abs() != errno::ECANCELED {
                tracing::warn!("software queue: staged message failed: {text}");
            }
            if let Some(token) = owner {
                // Its reply will not come.
                self.stage_fail(token, fabric_error_status(code));
                if let Some(st) = self.stage_mut(token) {
                    st.awaiting = st.awaiting.saturating_sub(1);
                    if st.read_left > 0 {
                        st.read_left = 0;
                    }
                }
                self.stage_settle(token);
            }
        }
    }

    /// An acknowledgement (of a write chunk, or the answer to an answered SEND) of WQE `token`
    /// came, with the target's status.
    fn acked(&mut self, token: u64, status: CqStatus) {
        if status != CqStatus::Ok {
            self.stage_fail(token, status);
        }
        if let Some(st) = self.stage_mut(token) {
            st.awaiting = st.awaiting.saturating_sub(1);
            self.stage_settle(token);
        }
    }

    /// A staged message arrived.
    pub(super) fn on_stage_msg(&mut self, h: &StageHdr, payload: &[u8]) {
        self.stats.received += 1;
        self.stats.acks += match h.kind {
            STAGE_WRITE_ACK => 1,
            STAGE_ACKS => u64::from(h.total),
            _ => 0,
        };
        match h.kind {
            STAGE_ACKS => {
                let status = CqStatus::from_raw(h.status).unwrap_or(CqStatus::RemoteBadStatus);
                for token in StageHdr::ack_tokens(payload) {
                    self.acked(token, status);
                }
            }
            STAGE_WRITE => {
                let status = self.stage_write_here(h, payload);
                if status == CqStatus::Ok {
                    if let Some(imm) = h.imm {
                        self.push_write_imm_rx(imm, Some(h.src_pe), h.total);
                    }
                }
                self.reply(h.src_pe, h.token, STAGE_WRITE_ACK, status, 0, false, 0);
            }
            STAGE_READ_REQ => {
                let heap = self.tables.heap_at(h.offset, u64::from(h.len));
                match heap.and_then(|r| {
                    r.translate(r.dev_base.wrapping_add(h.offset), u64::from(h.len))
                        .map(|a| (a, r.device))
                }) {
                    Some((src, device)) => self.reply(
                        h.src_pe,
                        h.token,
                        STAGE_READ_DATA,
                        CqStatus::Ok,
                        src,
                        device,
                        h.len,
                    ),
                    None => {
                        tracing::warn!(
                            "software queue: staged read of {:#x}+{} from PE {} outside the heap",
                            h.offset,
                            h.len,
                            h.src_pe
                        );
                        self.reply(
                            h.src_pe,
                            h.token,
                            STAGE_READ_DATA,
                            CqStatus::RemoteBadAddress,
                            0,
                            false,
                            h.len,
                        )
                    }
                }
            }
            STAGE_WRITE_ACK => {
                let status = CqStatus::from_raw(h.status).unwrap_or(CqStatus::RemoteBadStatus);
                self.acked(h.token, status);
            }
            STAGE_READ_DATA => {
                let mut status = CqStatus::from_raw(h.status).unwrap_or(CqStatus::RemoteBadStatus);
                let Some(st) = self.stage_mut(h.token) else {
                    return; // flushed, or a stale reply
                };
                let (dst, device, total) = (st.read_dst, st.read_device, st.read_len);
                if status == CqStatus::Ok {
                    let fits = h
                        .offset
                        .checked_add(u64::from(h.len))
                        .is_some_and(|end| end <= total && u64::from(h.len) <= st.read_left);
                    status = if !fits {
                        CqStatus::RemoteBadLength
                    } else {
                        // SAFETY: dst + [offset, offset+len) lies inside the validated local range.
                        match unsafe {
                            copy_any(
                                (dst + h.offset) as *mut u8,
                                payload.as_ptr(),
                                payload.len(),
                                device,
                            )
                        } {
                            Ok(()) => CqStatus::Ok,
                            Err(why) => {
                                tracing::warn!("software queue: read data not copied: {why}");
                                CqStatus::LocalQpInternalError
                            }
                        }
                    };
                }
                if status != CqStatus::Ok {
                    self.stage_fail(h.token, status);
                }
                let st = self.stage_mut(h.token).expect("checked above");
                st.read_left = st.read_left.saturating_sub(u64::from(h.len));
                if st.read_left == 0 || status != CqStatus::Ok {
                    st.read_left = 0;
                    if st.awaiting > 0 {
                        st.awaiting -= 1;
                    }
                    self.stage_settle(h.token);
                }
            }
            _ => {}
        }
    }

    /// Enqueues the copy of a staged write chunk into GPU memory on the batch (true), when the
    /// heap is GPU memory, the range is valid and CUDA takes the copy; false: handle it at once.
    pub(super) fn batch_write(&mut self, h: &StageHdr, payload: &[u8]) -> bool {
        let Ok((dst, true)) = self.stage_write_dst(h, payload.len()) else {
            return false;
        };
        let Some(b) = self.copy_batch() else {
            return false;
        };
        // SAFETY: the range lies inside the heap registration; the receive buffer is not reposted
        // before flush_rx_batch waited for the copy.
        unsafe {
            b.copy(
                dst as *mut c_void,
                payload.as_ptr() as *const c_void,
                payload.len(),
            )
        }
        .is_ok()
    }

    /// Waits for the batched copies of received write chunks, then acknowledges them (and delivers
    /// their immediates) in arrival order and reposts their receive buffers.
    pub(super) fn flush_rx_batch(&mut self) {
        if self.rx_batch.is_empty() {
            return;
        }
        let status = match self.copies.as_mut().map_or(Ok(()), |b| b.wait()) {
            Ok(()) => CqStatus::Ok,
            Err(why) => {
                tracing::warn!("software queue: staged writes not applied: {why}");
                CqStatus::LocalQpInternalError
            }
        };
        let batch = std::mem::take(&mut self.rx_batch);
        let stopping = self.inner.stop.load(Ordering::Acquire);
        for (h, idx) in &batch {
            if status == CqStatus::Ok {
                if let Some(imm) = h.imm {
                    self.push_write_imm_rx(imm, Some(h.src_pe), h.total);
                }
            }
            self.reply(h.src_pe, h.token, STAGE_WRITE_ACK, status, 0, false, 0);
            if !stopping {
                if let Err(e) = self.post_receive(*idx) {
                    tracing::error!("software queue: cannot repost a receive buffer: {e}");
                }
            }
        }
        // Keep the allocation, unless a nested poll (post_receive retries poll the CQ) queued more.
        if self.rx_batch.is_empty() {
            let mut batch = batch;
            batch.clear();
            self.rx_batch = batch;
        }
    }

    /// Where a staged write chunk of `len` bytes lands: (host-or-device address, is GPU memory),
    /// or the status that goes back in the ack.
    pub(super) fn stage_write_dst(
        &self,
        h: &StageHdr,
        len: usize,
    ) -> std::result::Result<(u64, bool), CqStatus> {
        if self.tables.heap_chunks.is_empty() {
            tracing::warn!(
                "software queue: staged write from PE {} before the heap is set",
                h.src_pe
            );
            return Err(CqStatus::RemoteBadAddress);
        }
        if len != h.len as usize {
            tracing::warn!(
                "software queue: staged write from PE {} carries {len} bytes, its header says {}",
                h.src_pe,
                h.len
            );
            return Err(CqStatus::RemoteBadLength);
        }
        let Some((dst, device)) =
            self.tables
                .heap_at(h.offset, u64::from(h.len))
                .and_then(|heap| {
                    heap.translate(heap.dev_base.wrapping_add(h.offset), u64::from(h.len))
                        .map(|d| (d, heap.device))
                })
        else {
            tracing::warn!(
                "software queue: staged write of {:#x}+{} from PE {} outside the heap",
                h.offset,
                h.len,
                h.src_pe
            );
            return Err(CqStatus::RemoteBadAddress);
        };
        Ok((dst, device))
    }

    /// Applies a staged write chunk to the local heap; the status goes back in the ack.
    pub(super) fn stage_write_here(&self, h: &StageHdr, payload: &[u8]) -> CqStatus {
        let (dst, device) = match self.stage_write_dst(h, payload.len()) {
            Ok(d) => d,
            Err(status) => return status,
        };
        // SAFETY: the range lies inside the heap registration, which stays allocated.
        match unsafe { copy_any(dst as *mut u8, payload.as_ptr(), payload.len(), device) } {
            Ok(()) => CqStatus::Ok,
            Err(why) => {
                tracing::warn!("software queue: staged write not applied: {why}");
                CqStatus::LocalQpInternalError
            }
        }
    }

    /// Queues a reply to the sender of `h` (replies go before new work).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reply(
        &mut self,
        src_pe: u32,
        token: u64,
        kind: u8,
        status: CqStatus,
        src: u64,
        device: bool,
        len: u32,
    ) {
        let Some(dest) = self.tables.peers.get(src_pe as usize).map(|p| p.fi_addr) else {
            tracing::warn!("software queue: staged message from unknown PE {src_pe}: no reply");
            return;
        };
        let item = OutItem {
            dest,
            kind,
            token,
            status,
            imm: None,
            src,
            device,
            off: 0,
            len: u64::from(len),
            sent: 0,
            msgs: 0,
            owner: None,
            prepared: None,
        };
        if kind == STAGE_WRITE_ACK {
            self.outbox.push_front(item);
        } else {
            self.outbox.push_back(item);
        }
    }
}

/// [`crate::mover::copy_bytes`] with the error as text.
///
/// # Safety
/// As there.
pub(super) unsafe fn copy_any(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    device: bool,
) -> std::result::Result<(), String> {
    // SAFETY: forwarded contract.
    unsafe { crate::mover::copy_bytes(dst, src, len, device) }.map_err(|e| e.to_string())
}
