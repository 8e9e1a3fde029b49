//! Active messages: receive buffers, request and response handling, and the send slots that carry
//! staged payloads (the message format and the window: [`super::wire`]).
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::endpoints::{Claim, EpState, TAG_AM_RECV, TAG_AM_SEND, TAG_SLOT_SEND};
use super::memory::{copy_any, is_device, write_any};
use super::rma::Transfer;
use super::wire::{
    mergeable_answer, resp_multi, resp_tokens, AM_GET_DATA_MULTI, AM_GET_MULTI, AM_PUT_MULTI,
    AM_RESP_MULTI, COALESCE_MAX, RESP_TOKENS,
};
use super::wire::{
    AmMsg, GetPrep, Pending, AM_BYTES, AM_GET, AM_GET_DATA, AM_GOODBYE, AM_MAGIC, AM_PING, AM_PONG,
    AM_PUT, AM_REQ, AM_RESP, AM_TRACED, STAGE_MAX,
};
use super::{abi, internal, Connected, TResult, Transport};
use crate::fabric::{CqEntry, FiAddr};
use crate::mover::stats::Stage;

/// What [`Transport::copy_in_batch`] did for one received message before it is handled: its
/// payload is in place already (`copied`), and the waiting context a get answer completes, taken
/// for it (`claim`; the context's data is where the payload goes).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Landed {
    pub copied: bool,
    pub claim: Option<Claim>,
}

impl Transport {
    /// The copies of received staged payloads into GPU memory among the completions `ents` of
    /// endpoint `i` (put chunks into this PE's registered memory, get data into the initiator's
    /// buffer), enqueued together and waited for once; at the index of each completion, whether
    /// its payload is in place and the waiting context of a get answer (claimed here, before its
    /// buffer is written). Messages that fail a check, host memory, and a batch the driver
    /// refused are left to [`Transport::handle_am`], which copies (or refuses) each itself.
    pub(super) fn copy_in_batch(&self, c: &Connected, i: usize, ents: &[CqEntry]) -> [Landed; 16] {
        let mut done = [Landed::default(); 16];
        let e = &c.eps[i];
        let mut copies: Vec<(u64, u64, usize)> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        // Every destination is GPU memory registered here (the copy kernel may take them).
        let mut registered = true;
        for (k, ent) in ents.iter().enumerate().take(16) {
            let Some((TAG_AM_RECV, slot)) = e.ctxs.get(ent.op_context) else {
                continue;
            };
            let Some(base) = e.am_buf(slot as usize) else {
                continue;
            };
            // SAFETY: the receive completed, so the provider is done writing the slot.
            let m: AmMsg = unsafe { std::ptr::read_unaligned(base as *const AmMsg) };
            if m.magic != AM_MAGIC
                || m.size == 0
                || m.size as usize > STAGE_MAX
                || ent.len < AM_BYTES + m.size as usize
            {
                continue;
            }
            // A put's destination is registered here (its kind known); a get answer's is the
            // initiator's buffer, registered or not.
            let mut reg_device = None;
            let dst = match m.kind {
                AM_PUT => match self.find_registration(m.addr, m.size as u64) {
                    Some(r) => {
                        reg_device = Some(r.device);
                        m.addr
                    }
                    None => continue,
                },
                AM_GET_DATA if m.status == 0 => match e.claim_wait(m.token, "staged get data") {
                    Some(w) => {
                        done[k].claim = Some(w);
                        w.data
                    }
                    None => continue,
                },
                _ => continue,
            };
            // The registration answers for a put without a driver query.
            if !reg_device.unwrap_or_else(|| is_device(dst as *const c_void)) {
                continue;
            }
            registered &= reg_device.is_some()
                || self
                    .find_registration(dst, m.size as u64)
                    .is_some_and(|r| r.device);
            // SAFETY: the payload follows the header inside the slot (length checked above).
            let payload = unsafe { base.add(AM_BYTES) } as u64;
            copies.push((dst, payload, m.size as usize));
            at.push(k);
        }
        if copies.is_empty() {
            return done;
        }
        let stats = self.mover.stats();
        let t = stats.start();
        // One launch of the copy kernel where the endpoint has it and they are small.
        match self.copy_in_now(e, &copies, registered) {
            Ok(()) => {
                let bytes = copies.iter().map(|c| c.2 as u64).sum();
                stats.record(Stage::TargetCopy, t, bytes);
                for k in at {
                    done[k].copied = true;
                }
            }
            Err(err) => tracing::warn!(
                "endpoint {i}: {} staged copies in one batch failed ({}); copying each alone",
                copies.len(),
                err.message
            ),
        }
        done
    }

    /// Applies an AM request, or completes a waiting AMO with a response. `landed`: the payload of
    /// a staged put or get answer is in place already, and the waiting context of a get answer
    /// claimed ([`Transport::copy_in_batch`]); `amos`: the batch of AMO words of this CQ read
    /// ([`Transport::amo_batch`]), which also holds the answers.
    pub(super) fn handle_am(
        &self,
        c: &Connected,
        i: usize,
        slot: usize,
        len: usize,
        landed: Landed,
        amos: Option<&mut super::amo::AmoBatch<'_>>,
    ) {
        let e = &c.eps[i];
        let copied = landed.copied;
        let Some(base) = e.am_buf(slot) else { return };
        // SAFETY: slot < recv_bufs (am_buf); the receive completed, so the provider is done writing it.
        let m: AmMsg = unsafe { std::ptr::read_unaligned(base as *const AmMsg) };
        if m.magic != AM_MAGIC || len < std::mem::size_of::<AmMsg>() {
            let msg = format!("endpoint {i}: dropped a {len}-byte message without the AM header");
            tracing::error!("{msg}");
            if let Some(w) = landed.claim {
                e.finish_claimed(w, Some(msg));
            }
            return;
        }
        let carries_payload = matches!(
            m.kind,
            AM_PUT | AM_GET_DATA | AM_PUT_MULTI | AM_GET_MULTI | AM_GET_DATA_MULTI
        );
        if carries_payload && (m.size as usize > STAGE_MAX || len < AM_BYTES + m.size as usize) {
            let msg = format!(
                "endpoint {i}: staged message of {len} bytes announces {} payload bytes",
                m.size
            );
            tracing::error!("{msg}");
            if let Some(w) = landed.claim {
                e.finish_claimed(w, Some(msg));
            } else if m.kind == AM_GET_DATA {
                self.fail_am_wait(e, m.token, msg);
            }
            // A truncated put is not answered: its initiator's quiet reports the loss at its bound.
            return;
        }
        // SAFETY: a payload follows the header inside this receive slot (length checked above).
        let payload = unsafe { base.add(AM_BYTES) } as *const u8;
        match m.kind {
            AM_REQ => {
                let src_pe = m.result as i64;
                let mut amos = amos;
                let applied =
                    self.apply_local_amo(m.op, m.size, m.addr, m.val, m.cmp, amos.as_deref_mut());
                let (status, old) = match applied {
                    Ok(old) => (0, old),
                    Err(err) => {
                        tracing::error!("AMO from PE {src_pe}: {}", err.message);
                        (err.status, 0)
                    }
                };
                let Some(dest) = c.peer_addr(src_pe, i) else {
                    tracing::error!("AM request from out-of-range PE {src_pe}");
                    return;
                };
                match amos {
                    // Answered once the batch's words are written back.
                    Some(b) => b.answers.push((dest, m.token, old, status)),
                    None => e.push_response(dest, m.token, old, status),
                }
            }
            AM_RESP => {
                let Some(w) = e.claim_wait(m.token, "AM response") else {
                    return;
                };
                let (wait, retptr) = (w.ctx, w.data);
                // SAFETY: own waiting context; scratch[1..3] hold a staged chunk's post time and
                // trace flag (both 0 for AMOs, whose scratch[0] is the operand size).
                let (stamp, traced) = e
                    .ctxs
                    .scratch(wait)
                    .map(|s| unsafe { (*s.add(1), *s.add(2) != 0) })
                    .unwrap_or_default();
                let stats = self.mover.stats();
                stats.record_since(Stage::ResponseRecv, stamp, 0);
                if traced {
                    stats.timeline(Stage::ResponseRecv, "", m.token, m.addr, 0);
                }
                // SAFETY: own waiting context; scratch[0] holds the operand size (amo_target).
                let size = e
                    .ctxs
                    .scratch(wait)
                    .map(|s| unsafe { *s } as usize)
                    .unwrap_or(8)
                    .min(8);
                let mut error = None;
                if m.status != 0 {
                    error = Some(format!("remote AMO failed with status {}", m.status));
                } else if retptr != 0 {
                    // (An AMO ended already, by its peer's death or its rail's failure, has its
                    // error and its token left the outstanding set: its late answer is not
                    // claimed above and writes nothing.)
                    let bytes = m.result.to_le_bytes();
                    if let Err(err) = write_any(retptr as *mut u8, &bytes[..size]) {
                        error = Some(err.message);
                    }
                }
                e.finish_claimed(w, error);
            }
            AM_RESP_MULTI => {
                let stats = self.mover.stats();
                for token in resp_tokens(&m) {
                    let Some(w) = e.claim_wait(token, "merged put answer") else {
                        continue;
                    };
                    // SAFETY: own waiting context; scratch[1] holds the message's post time.
                    let stamp = e.ctxs.scratch(w.ctx).map_or(0, |s| unsafe { *s.add(1) });
                    stats.record_since(Stage::ResponseRecv, stamp, 0);
                    e.finish_claimed(w, None);
                }
            }
            AM_PUT => {
                let src_pe = m.val as i64;
                let Some(dest) = c.peer_addr(src_pe, i) else {
                    tracing::error!("staged put from PE {src_pe} with {} bytes dropped", m.size);
                    return;
                };
                let stats = self.mover.stats();
                let traced = m.reserved & AM_TRACED != 0;
                if traced {
                    stats.timeline(Stage::TargetCopy, "start", m.token, m.addr, m.size as u64);
                }
                let status = if copied {
                    0
                } else {
                    let t = stats.start();
                    let status = self.copy_registered(
                        m.addr as *mut u8,
                        payload,
                        m.addr,
                        m.size,
                        &format!("staged put from PE {src_pe}"),
                    );
                    stats.record(Stage::TargetCopy, t, m.size as u64);
                    status
                };
                stats.record(Stage::Response, None, 0);
                if traced {
                    stats.timeline(Stage::TargetCopy, "end", m.token, m.addr, 0);
                    stats.timeline(Stage::Response, "queued", m.token, m.addr, 0);
                }
                e.push_put_response(dest, &m, status);
            }
            AM_PUT_MULTI => {
                let src_pe = m.val as i64;
                let Some(dest) = c.peer_addr(src_pe, i) else {
                    tracing::error!("coalesced puts from PE {src_pe} dropped");
                    return;
                };
                // SAFETY: the payload lies inside the receive slot (length checked above), which is
                // this handler's until it is posted again (AMO records' data is rewritten in it).
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(payload as *mut u8, m.size as usize) };
                let stats = self.mover.stats();
                let t = stats.start();
                let mut amos = amos;
                let status = self.apply_records(e, bytes, m.op as u32, src_pe, amos.as_deref_mut());
                stats.record(Stage::TargetCopy, t, m.size as u64);
                stats.record(Stage::Response, None, 0);
                match amos {
                    // The batch holds the AMO lock (its records' AMOs ran under it) and writes
                    // its words back before any of its answers leave: this one waits with them.
                    Some(b) => b.answers.push((dest, m.token, 0, status)),
                    None => e.push_put_response(dest, &m, status),
                }
            }
            AM_GET => {
                let src_pe = m.val as i64;
                let Some(dest) = c
                    .peer_addr(src_pe, i)
                    .filter(|_| m.size as usize <= STAGE_MAX)
                else {
                    tracing::error!("staged get from PE {src_pe} with {} bytes dropped", m.size);
                    return;
                };
                e.am_pending.lock().push_back(Pending::GetData {
                    dest,
                    token: m.token,
                    addr: m.addr,
                    len: m.size,
                    prep: None,
                });
            }
            AM_GET_DATA => {
                let claimed = landed
                    .claim
                    .or_else(|| e.claim_wait(m.token, "staged get data"));
                let Some(w) = claimed else {
                    return;
                };
                let (wait, dst) = (w.ctx, w.data);
                let stats = self.mover.stats();
                // SAFETY: own waiting context; scratch[1] holds the request's post time.
                let stamp = e.ctxs.scratch(wait).map_or(0, |s| unsafe { *s.add(1) });
                stats.record_since(Stage::ResponseRecv, stamp, m.size as u64);
                let t = stats.start();
                let mut error = None;
                if m.status != 0 {
                    error = Some(format!("remote get failed with status {}", m.status));
                } else if copied {
                    // In place already.
                } else if let Err(err) = copy_any(dst as *mut u8, payload, m.size as usize) {
                    error = Some(err.message);
                }
                stats.record(Stage::CopyIn, t, m.size as u64);
                e.finish_claimed(w, error);
            }
            AM_GET_MULTI => {
                let src_pe = m.val as i64;
                let Some(dest) = c.peer_addr(src_pe, i) else {
                    tracing::error!("coalesced gets from out-of-range PE {src_pe} dropped");
                    return;
                };
                // SAFETY: the payload lies inside the receive slot (length checked above).
                let bytes = unsafe { std::slice::from_raw_parts(payload, m.size as usize) };
                self.queue_get_multi(e, i, dest, &m, bytes);
            }
            AM_GET_DATA_MULTI => self.land_get_multi(e, i, &m, payload),
            AM_PING => {
                let Some(dest) = c.peer_addr(m.val as i64, i) else {
                    tracing::error!("probe from out-of-range PE {}", m.val);
                    return;
                };
                let pong = AmMsg {
                    magic: AM_MAGIC,
                    kind: AM_PONG,
                    token: m.token,
                    val: c.my_pe as u64,
                    ..Default::default()
                };
                // From this endpoint itself, like the probe: this PE's own lane to the prober may
                // be the stuck one (it takes no new message then). A pong that cannot leave now is
                // retried at every progress round (the newest per prober), not left for the
                // prober's next probe a second later.
                match e.send_probe(dest, pong) {
                    Ok(()) => {}
                    Err(err) if err.is_again() => {
                        let mut q = e.pongs.lock();
                        q.retain(|(d, _)| *d != dest);
                        q.push((dest, pong));
                    }
                    Err(err) => {
                        tracing::debug!("endpoint {i}: answer to a probe not sent: {err}")
                    }
                }
            }
            AM_PONG => {
                if let Some(l) = &e.lanes {
                    l.probe_answered(m.val as usize, m.token);
                }
            }
            AM_GOODBYE => {
                let pe = m.val as usize;
                if pe < c.peers.len() && pe != c.my_pe as usize {
                    self.declare_gone(c, pe, super::peers::DEPARTED);
                }
            }
            k => tracing::error!("endpoint {i}: unknown AM kind {k}"),
        }
    }

    /// Copies `len` bytes to `dst` from `src` when `[addr, addr+len)` (the side in this PE's
    /// memory) lies in a registration; the status to answer with.
    fn copy_registered(
        &self,
        dst: *mut u8,
        src: *const u8,
        addr: u64,
        len: u32,
        what: &str,
    ) -> i32 {
        if self.find_registration(addr, len as u64).is_none() {
            tracing::error!("{what}: {addr:#x}+{len} is not registered here");
            return abi::status::INVALID_VALUE;
        }
        match copy_any(dst, src, len as usize) {
            Ok(()) => 0,
            Err(err) => err.status,
        }
    }

    /// Posts every AM receive buffer of endpoint `i` (at connect).
    pub(super) fn post_am_recvs(&self, e: &EpState, i: usize) -> TResult<()> {
        if e.am_bufs.is_none() {
            return Ok(());
        }
        for slot in 0..e.recv_bufs {
            let ctx = e.ctxs.alloc(TAG_AM_RECV, slot as u64).ok_or_else(|| {
                internal(format!("endpoint {i}: no context for AM receive buffers"))
            })?;
            e.post_am_recv(slot, ctx)?;
        }
        Ok(())
    }

    ///
    /// A peer that cannot take a message now (EAGAIN) keeps its messages, in order, for the next
    /// round while the others' go out (a stopped peer must not hold up answers to the living);
    /// messages to a peer that is gone are dropped.
    pub(super) fn flush_am_pending(&self, c: &Connected, i: usize) {
        self.flush_pongs(c, i);
        self.prepare_get_data(c, i);
        let e = &c.eps[i];
        let mut kept: VecDeque<Pending> = VecDeque::new();
        let mut blocked: Vec<FiAddr> = Vec::new();
        loop {
            let Some(mut p) = e.am_pending.lock().pop_front() else {
                break;
            };
            let dest = p.dest();
            // A dropped answer gives its slot back.
            let drop_it = |mut p: Pending| {
                if let Some(Some(GetPrep { slot, .. })) = p.prep_mut().map(|x| x.take()) {
                    e.send_free.lock().push(slot);
                }
            };
            let Some(pe) = c.pe_of(dest) else {
                tracing::error!("endpoint {i}: a message to unknown address {dest} dropped");
                drop_it(p);
                continue;
            };
            if c.peers[pe].is_gone() {
                drop_it(p);
                continue;
            }
            // A get answer without a send slot yet waits for the next round's
            // `prepare_get_data` (answers to one peer need no order among themselves).
            if blocked.contains(&dest) || p.prep_mut().is_some_and(|x| x.is_none()) {
                kept.push_back(p);
                continue;
            }
            // An answer whose data is still being copied out of GPU memory waits (and so do the
            // later messages to its peer); a failed copy is answered with its status.
            if let Some(Some(prep)) = p.prep_mut() {
                if let Some(ev) = &prep.copied {
                    match ev.done() {
                        Ok(false) => {
                            blocked.push(dest);
                            kept.push_back(p);
                            continue;
                        }
                        Ok(true) => {}
                        Err(err) => {
                            tracing::error!("endpoint {i}: staged get data not copied: {err}");
                            prep.status = abi::status::INTERNAL;
                        }
                    }
                    prep.copied = None;
                }
            }
            // Put answers to the same peer next in the queue leave as one message.
            if let Pending::Msg(dest, msg) = &mut p {
                if mergeable_answer(msg) {
                    let mut tokens = vec![msg.token];
                    let mut q = e.am_pending.lock();
                    while tokens.len() < RESP_TOKENS {
                        match q.front() {
                            Some(Pending::Msg(d, m)) if d == dest && mergeable_answer(m) => {
                                tokens.push(m.token);
                                q.pop_front();
                            }
                            _ => break,
                        }
                    }
                    drop(q);
                    if tokens.len() > 1 {
                        *msg = resp_multi(&tokens);
                    }
                }
            }
            let r = match &p {
                Pending::Msg(dest, msg) => self.send_small(e, pe, *dest, *msg).inspect(|()| {
                    if msg.kind == AM_RESP {
                        let stats = self.mover.stats();
                        stats.record(Stage::ResponseSent, None, 0);
                        if msg.reserved & AM_TRACED != 0 {
                            stats.timeline(Stage::ResponseSent, "", msg.token, msg.addr, 0);
                        }
                    }
                }),
                // A get answer with its slot (those without were kept above).
                _ => {
                    let Some(prep) = p.prep_mut().and_then(|x| x.clone()) else {
                        kept.push_back(p);
                        continue;
                    };
                    let hdr = Self::get_answer_header(&p, &prep);
                    let r = self.send_slot(e, pe, dest, prep.slot, hdr, 0, 0, false);
                    // Kept with its data in the slot for the next round (EAGAIN), else done
                    // with it.
                    if r.as_ref().is_err_and(|err| !err.is_again()) {
                        e.send_free.lock().push(prep.slot);
                    }
                    r
                }
            };
            match r {
                Ok(()) => {}
                Err(err) if err.is_again() => {
                    blocked.push(dest);
                    kept.push_back(p);
                }
                Err(err) => tracing::error!("endpoint {i}: active message lost: {err}"),
            }
        }
        if !kept.is_empty() {
            let mut q = e.am_pending.lock();
            while let Some(p) = kept.pop_back() {
                q.push_front(p);
            }
        }
    }

    /// Sends the probe answers endpoint `i` could not send yet; those still refused (EAGAIN) stay,
    /// answers to peers that are gone and other failures are dropped (the prober probes again).
    fn flush_pongs(&self, c: &Connected, i: usize) {
        let e = &c.eps[i];
        let mut q = e.pongs.lock();
        q.retain(|(dest, pong)| {
            if c.pe_of(*dest).is_none_or(|pe| c.peers[pe].is_gone()) {
                return false;
            }
            match e.send_probe(*dest, *pong) {
                Ok(()) => false,
                Err(err) if err.is_again() => true,
                Err(err) => {
                    tracing::debug!("endpoint {i}: answer to a probe not sent: {err}");
                    false
                }
            }
        });
    }

    /// Sends a header-only message from a context's scratch space (no wait; EAGAIN is returned).
    pub(super) fn send_small(
        &self,
        e: &EpState,
        pe: usize,
        dest: FiAddr,
        msg: AmMsg,
    ) -> crate::fabric::Result<()> {
        e.send_with_ctx(TAG_AM_SEND, 0, "no context for an active message", |ctx| {
            e.send_from_scratch(ctx, pe, dest, msg)
        })
    }

    /// Sends send slot `slot` (header written here, payload already in place). `wait` is the token
    /// of the initiator's waiting context to fail if the send fails (0: none); `stamp` and `traced` feed
    /// the stage counters and the timeline at its completion.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_slot(
        &self,
        e: &EpState,
        pe: usize,
        dest: FiAddr,
        slot: usize,
        hdr: AmMsg,
        wait: u64,
        stamp: u64,
        traced: bool,
    ) -> crate::fabric::Result<()> {
        e.send_with_ctx(
            TAG_SLOT_SEND,
            slot as u64,
            "no context for a staged send",
            |ctx| {
                // SAFETY: own context; scratch[0] remembers the waiting context's token, [1] the post time,
                // [2] the trace flag, [3] the remote address (read back at the send completion).
                unsafe {
                    let sc = e.ctxs.scratch(ctx).expect("own context");
                    *sc = wait;
                    *sc.add(1) = stamp;
                    *sc.add(2) = traced as u64;
                    *sc.add(3) = hdr.addr;
                }
                let sp = e.send_slot_ptr(slot);
                // SAFETY: the slot lies in the registered send slab and stays reserved until completion.
                unsafe { std::ptr::write_unaligned(sp as *mut AmMsg, hdr) };
                e.transmit(pe, ctx, |ep| {
                    // SAFETY: as above.
                    unsafe {
                        super::endpoints::send_am(
                            ep,
                            sp,
                            AM_BYTES + hdr.size as usize,
                            e.send_slab.1.desc(),
                            dest,
                            ctx,
                        )
                    }
                })
            },
        )
    }

    /// Staged put or get of `len` bytes: GPU memory never reaches the provider. Each chunk is a
    /// message the target applies with a copy (puts) or answers with data (gets); the waiting
    /// context completes on the answer, so quiet covers it. Puts go through the outbox
    /// ([`super::outbox`]): their copies into send slots are issued without a wait and progress
    /// posts each message once its copy is done; small puts to one peer share a message unless a
    /// blocking call (a group) waits for this one.
    pub(super) fn staged(&self, c: &Connected, t: &Transfer) -> TResult<()> {
        let (pe, ep, is_put, len) = (t.pe, t.ep, t.is_put, t.len);
        if is_put {
            // Whether the source is GPU memory: asked once for the whole put, of its registration
            // where it has one (registered GPU memory is this PE's, which the copy kernel may read).
            let reg_device = self.find_registration(t.local, len).map(|r| r.device);
            let device = reg_device.unwrap_or_else(|| is_device(t.local as *const c_void));
            if len as usize <= COALESCE_MAX && super::group::current().is_none() {
                return self.stage_small(c, t, device, reg_device == Some(true));
            }
            return self.stage_chunks(c, t, device);
        }
        // Small gets share a request (not those a blocking call waits for: it waits for each).
        if len as usize <= COALESCE_MAX && super::group::current().is_none() {
            return self.stage_get(c, t);
        }
        // Earlier puts and gets to this peer leave first (a get after a fence then sees them).
        self.close_peer(c, ep, pe as usize);
        self.post_staged(c, ep);
        let traced = self.mover.stats().sample(len);
        let mut off = 0u64;
        while off < len {
            // A get of up to 64 KiB is one request and one answer; longer ones in even chunks.
            let n = super::wire::get_chunk(len, off);
            self.get_window(c, ep, pe as usize)?;
            self.post_get_chunk(c, t, off, n, traced)?;
            off += n;
        }
        Ok(())
    }

    /// Waits, driving progress, until fewer operations to `pe` on endpoint `ep` are outstanding
    /// than the get window (`NVSHMEM_EFA_GET_WINDOW`; default: the endpoint's receive buffers,
    /// which the answers land in), so that a long get's chunk requests go out as its answers come
    /// back. Posted all at once, 16 gets of 1 MiB (256 requests, 16 MiB of answers against 32 send
    /// slots at the target and 64 receive buffers here) ran at 0.27-0.39 GB/s in 5 of 20 runs
    /// between two hosts with host memory on tcp; with a window of 32 or 64, none of 30 did
    /// (docs/staged-path.md, 19). A peer declared gone ends the wait (its request then fails at
    /// once); so does the quiet timeout, with an error.
    fn get_window(&self, c: &Connected, ep: usize, pe: usize) -> TResult<()> {
        let e = &c.eps[ep];
        let a = &e.peer[pe];
        let window = self.cfg.get_window.unwrap_or(e.recv_bufs) as u64;
        if window == 0 {
            return Ok(());
        }
        self.wait_for(
            c,
            ep,
            || {
                let out = a
                    .submitted
                    .load(Ordering::Acquire)
                    .saturating_sub(a.completed.load(Ordering::Acquire));
                (out < window || c.peers[pe].is_gone()).then_some(())
            },
            || {
                internal(format!(
                    "endpoint {ep}: {window} or more operations to PE {pe} outstanding for {:?}; \
                     a staged get waited for one to complete",
                    self.cfg.quiet_timeout
                ))
            },
        )
    }

    /// Posts the request for one staged get chunk of `t` at `off` (`n` bytes). Takes the waiting
    /// context the answer completes (given back on failure).
    fn post_get_chunk(
        &self,
        c: &Connected,
        t: &Transfer,
        off: u64,
        n: u64,
        traced: bool,
    ) -> TResult<()> {
        let (pe, ep) = (t.pe, t.ep);
        let e = &c.eps[ep];
        let dest = c.addr(pe, ep);
        let stats = self.mover.stats();
        let wait_data = t.local + off;
        // scratch[1..3] keep the post time and the trace flag for the answer (scratch[0] stays 0:
        // no AMO operand size).
        let stamp = stats.stamp();
        let (_, wait) =
            self.alloc_wait(c, ep, pe as usize, wait_data, &[0, stamp, traced as u64])?;
        let hdr = AmMsg {
            magic: AM_MAGIC,
            kind: AM_GET,
            token: wait,
            size: n as u32,
            addr: t.remote + off,
            val: c.my_pe as u64,
            reserved: if traced { AM_TRACED } else { 0 },
            ..Default::default()
        };
        let t0 = stats.start();
        let r = self.retry_again(c, ep, || {
            self.check_peer(c, pe as usize).map_err(|_| gone())?;
            self.send_small(e, pe as usize, dest, hdr)
        });
        stats.record(Stage::ChunkPost, t0, 0);
        if let Err(err) = r {
            e.uncount(wait);
            return Err(err);
        }
        if traced {
            stats.timeline(Stage::ChunkPost, "", wait, t.remote + off, n);
        }
        Ok(())
    }

    /// Takes a free send slot, driving progress while none is free (bounded).
    pub(super) fn alloc_slot(&self, c: &Connected, ep: usize, pe: usize) -> TResult<usize> {
        let e = &c.eps[ep];
        self.check_peer(c, pe)?;
        let slot = self.wait_for(
            c,
            ep,
            || {
                e.send_free
                    .lock()
                    .pop()
                    .or_else(|| c.peers[pe].is_gone().then_some(usize::MAX))
            },
            || {
                internal(format!(
                    "endpoint {ep}: no staging slot freed within {:?}",
                    self.cfg.quiet_timeout
                ))
            },
        )?;
        if slot == usize::MAX {
            return Err(self.gone_error(c, pe));
        }
        Ok(slot)
    }
}

/// The error a retried send gets once its peer is gone (not EAGAIN: the retry stops).
fn gone() -> crate::fabric::Error {
    crate::fabric::Error::from_ret(-(libc::ECONNABORTED as i64), "the peer is gone")
}
