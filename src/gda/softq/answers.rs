//! Answered SENDs (`wire.rs`): where the provider takes delivery-complete sends one per peer at a
//! time (shm), a SEND goes with transmit completion and its WQE completes when the target answers
//! after handling it (docs/gda-amo-path.md). Both directions travel in bulk: the answered AMOs a
//! consumer pass posts to one PE go in one packed SEND (sender, [`Consumer::flush_packed`]), and
//! the answers a CQ read owes one sender go in one `STAGE_ACKS` message (target,
//! [`Consumer::flush_answers`]); each WQE still completes on its own token.
use super::receive::NO_RX_BUF;
use super::*;
use crate::gda::apply;

impl Consumer {
    /// Takes answered SEND `p` (token `token`, its slot taken) into the packing for its PE when it
    /// is one AMO message without an immediate: its WQE is in flight from now on and completes on
    /// its answer alone; [`Consumer::flush_packed`] sends it. False: `p` goes as a SEND of its own.
    pub(super) fn pack(&mut self, p: &mut Pending, token: u64) -> bool {
        let Action::Send {
            dest,
            hdr,
            payload: Payload::Inline(data, n),
            amo: true,
            ..
        } = &p.action
        else {
            return false;
        };
        if hdr.imm.is_some() || *n != wire::AMO_MSG_SIZE {
            return false;
        }
        let mut entry = [0u8; wire::PACKED_ENTRY];
        entry[..8].copy_from_slice(&token.to_le_bytes());
        entry[8..].copy_from_slice(&data[..wire::AMO_MSG_SIZE]);
        let dest = *dest;
        match self.packing.iter_mut().find(|(d, _)| *d == dest) {
            Some((_, v)) => v.push(entry),
            None => self.packing.push((dest, vec![entry])),
        }
        if let Some(b) = p.bounce.take() {
            self.free_bounce.push(b);
        }
        let stage = Stage {
            awaiting: 1,
            queued: false,
            ..Stage::new(token)
        };
        let slot = p.slot.expect("slot taken before packing");
        self.occupy(slot, InFlight::of(p, None, Some(stage)));
        true
    }

    /// Sends the AMOs `post` packed since the last call: per PE, as few SENDs as hold them
    /// ([`wire::PACKED_MAX`] each), with transmit completion; each AMO's WQE completes when its own
    /// answer comes. What the provider refuses now waits for the next call, in order; a SEND that
    /// fails fails its AMOs' WQEs.
    pub(super) fn flush_packed(&mut self) -> usize {
        if self.packing.is_empty() {
            return 0;
        }
        let inner = self.inner.clone();
        let mut sent = 0;
        let mut packing = std::mem::take(&mut self.packing);
        for (dest, entries) in packing.iter_mut() {
            let mut done = 0;
            while done < entries.len() {
                let part = &entries[done..entries.len().min(done + wire::PACKED_MAX)];
                let Some(b) = self.free_bounce.pop() else {
                    break;
                };
                let Some(ctx) = inner.ctxs.alloc(TAG_STX, u64::from(b)) else {
                    self.free_bounce.push(b);
                    break;
                };
                let len = part.len() * wire::PACKED_ENTRY;
                let tokens: Vec<u64> = part
                    .iter()
                    .map(|e| u64::from_le_bytes(e[..8].try_into().expect("8 bytes")))
                    .collect();
                let hdr = SendHdr {
                    src_pe: self.tables.my_pe as u32,
                    imm: None,
                    len: len as u16,
                    answer: Some(tokens[0]),
                    packed: true,
                };
                let buf = inner.send_bufs.ptr(b as usize);
                // SAFETY: the send buffer holds SEND_HDR_SIZE + SOFT_SEND_MAX >= the header and
                // PACKED_MAX entries; this consumer owns it (taken from its free list).
                unsafe {
                    ptr::copy_nonoverlapping(hdr.encode().as_ptr(), buf, SEND_HDR_SIZE);
                    for (i, e) in part.iter().enumerate() {
                        ptr::copy_nonoverlapping(
                            e.as_ptr(),
                            buf.add(SEND_HDR_SIZE + i * wire::PACKED_ENTRY),
                            wire::PACKED_ENTRY,
                        );
                    }
                }
                // SAFETY: the buffer and the context belong to the queue and stay valid until the
                // completion is reaped or the endpoint is closed.
                let r = unsafe {
                    inner.ep.send_msg(
                        buf,
                        SEND_HDR_SIZE + len,
                        inner.send_bufs.desc(),
                        *dest,
                        ctx,
                        flags::COMPLETION | flags::TRANSMIT_COMPLETE,
                    )
                };
                match r {
                    Ok(()) => {
                        self.note(super::trace::Event::SendPacked, part.len() as u32, 0);
                        self.inner.sends_packed.fetch_add(1, Ordering::Relaxed);
                        self.packed_owners[b as usize] = tokens;
                        done += part.len();
                        sent += 1;
                    }
                    Err(e) if e.is_again() => {
                        inner.ctxs.free(ctx);
                        self.free_bounce.push(b);
                        self.note(super::trace::Event::SendRefused, part.len() as u32, 1 << 31);
                        break;
                    }
                    Err(e) => {
                        inner.ctxs.free(ctx);
                        self.free_bounce.push(b);
                        let status = fabric_error_status(e.code);
                        tracing::warn!(
                            "software queue: a SEND of {} AMOs failed ({status}): {e}",
                            part.len()
                        );
                        for t in tokens {
                            self.unanswered(t, status);
                        }
                        done += part.len();
                    }
                }
            }
            entries.drain(..done);
        }
        packing.retain(|(_, v)| !v.is_empty());
        // Whatever was packed meanwhile (nothing: no nested post here) goes after the rest.
        packing.append(&mut self.packing);
        self.packing = packing;
        sent
    }

    /// The answer of answered WQE `token` will not come (its SEND failed): it completes with
    /// `status`.
    pub(super) fn unanswered(&mut self, token: u64, status: CqStatus) {
        self.stage_fail(token, status);
        if let Some(st) = self.stage_mut(token) {
            st.awaiting = 0;
        }
        self.stage_settle(token);
    }

    /// A packed SEND (`wire.rs`): each AMO joins the CQ read's batch with its own token (its
    /// message is copied out, so the receive buffer goes back at once); one that does not check
    /// out is answered with its status now.
    pub(super) fn on_packed(&mut self, h: &SendHdr, payload: &[u8]) {
        for (token, amo) in SendHdr::packed_entries(payload) {
            let one = SendHdr {
                len: wire::AMO_MSG_SIZE as u16,
                answer: Some(token),
                packed: false,
                ..*h
            };
            match apply::check_message(amo, &*self.tables) {
                apply::Checked::Ready(m, addr, device) => {
                    self.amo_batch.push(m, addr, device, (NO_RX_BUF, one))
                }
                apply::Checked::Rejected { status, why } => {
                    tracing::warn!(
                        "software queue: AMO from PE {} not applied ({status}): {why}",
                        h.src_pe
                    );
                    self.finish_send(&one, NO_RX_BUF, true, status);
                }
                apply::Checked::NotAmo => {
                    tracing::warn!(
                        "software queue: a packed SEND from PE {} holds something that is not an \
                         AMO message: answered as failed",
                        h.src_pe
                    );
                    self.finish_send(&one, NO_RX_BUF, true, CqStatus::RemoteBadStatus);
                }
            }
        }
    }

    /// Answers an answered SEND (`wire.rs`) of PE `src_pe` once it was handled here: the answer
    /// waits in `answers` for the end of the CQ read, then goes with the others to that PE in one
    /// staged message (`Consumer::flush_answers`).
    pub(super) fn answer_send(&mut self, src_pe: u32, token: u64, status: CqStatus) {
        self.answers.push((src_pe, token, status));
        self.note(super::trace::Event::Answer, src_pe, 0);
    }

    /// Sends the answers of the answered SENDs handled since the last call (`answers`, see
    /// `Consumer::answer_send`): those of one sender with one status as one [`STAGE_ACKS`]
    /// message of their tokens, written into a send buffer now (up to [`STAGE_ACKS_MAX`] and the
    /// buffer's room each), ahead of other staged messages. Without a free send buffer, or with
    /// send buffers too small for two tokens, each answer goes alone as a [`STAGE_WRITE_ACK`].
    pub(super) fn flush_answers(&mut self) {
        if self.answers.is_empty() {
            return;
        }
        let mut answers = std::mem::take(&mut self.answers);
        // By sender and status; a stable sort keeps each group's order.
        answers.sort_by_key(|&(pe, _, status)| (pe, status as u8));
        let room = (self.chunk_room() as usize / 8).min(STAGE_ACKS_MAX);
        for group in answers.chunk_by(|a, b| a.0 == b.0 && a.2 == b.2) {
            for part in group.chunks(room.max(1)) {
                let (pe, first, status) = part[0];
                let dest = self.tables.peers.get(pe as usize).map(|p| p.fi_addr);
                let buf = if room >= 2 && part.len() > 1 {
                    dest.and_then(|_| self.free_bounce.pop())
                } else {
                    None
                };
                let (Some(dest), Some(b)) = (dest, buf) else {
                    for &(pe, token, status) in part {
                        self.reply(pe, token, STAGE_WRITE_ACK, status, 0, false, 0);
                    }
                    self.inner
                        .answer_msgs
                        .fetch_add(part.len() as u64, Ordering::Relaxed);
                    continue;
                };
                self.inner.answer_msgs.fetch_add(1, Ordering::Relaxed);
                let bytes = part.len() * 8;
                let p = self.inner.send_bufs.ptr(b as usize);
                for (i, &(_, token, _)) in part.iter().enumerate() {
                    // SAFETY: the send buffer holds STAGE_HDR_SIZE + chunk_room() >= the header
                    // and `bytes`; this consumer owns it (taken from its free list).
                    unsafe {
                        ptr::copy_nonoverlapping(
                            token.to_le_bytes().as_ptr(),
                            p.add(STAGE_HDR_SIZE + 8 * i),
                            8,
                        )
                    };
                }
                self.outbox.push_front(OutItem {
                    dest,
                    kind: STAGE_ACKS,
                    token: first,
                    status,
                    imm: None,
                    src: 0,
                    device: false,
                    off: 0,
                    len: bytes as u64,
                    sent: 0,
                    msgs: 0,
                    owner: None,
                    prepared: Some((b, bytes as u64)),
                });
            }
        }
        answers.clear();
        if self.answers.is_empty() {
            self.answers = answers;
        }
    }
}
