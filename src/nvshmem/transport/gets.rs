//! Staged gets that share messages. At the initiator, gets of up to [`COALESCE_MAX`] bytes to one
//! peer are records of one open request ([`AM_GET_MULTI`]), each with its own waiting context
//! (quiet counts every get); the request closes when full, after [`OPEN_FOR`], at a quiet, or
//! before a put to the same peer, and leaves through the outbox's queue in order with the puts.
//! At the target, the request's data is copied out together (one copy kernel launch, or copies
//! marked once) into one send slot and answered with one [`AM_GET_DATA_MULTI`]; the initiator
//! lands the records' data together and completes each get. Before, every get was a request of its
//! own: on tcp between two hosts, posting one took 12.6 us, so 200 gets in flight ran at 0.048 M/s
//! (results/gpu-2026-11-29c).
use std::ffi::c_void;
use std::time::Instant;

use super::endpoints::EpState;
use super::memory::{copy_any, copy_many, is_device};
use super::rma::Transfer;
use super::wire::{
    get_answer_bytes, get_answer_fits, parse_get_answers, parse_get_requests, write_get_answer,
    write_get_request, AmMsg, GetPrep, Pending, AM_BYTES, AM_GET_DATA_MULTI, AM_GET_MULTI,
    AM_MAGIC, AM_TRACED, COALESCE_MAX, GET_ANSWER, GET_REQUEST, STAGE_MAX,
};
use super::{abi, Connected, TResult, Transport};
use crate::fabric::FiAddr;
use crate::mover::stats::Stage;

pub(super) use super::outbox::OPEN_FOR;

/// Scratch word of a get's waiting context that holds its length (checked against its answer).
const SCRATCH_LEN: usize = 3;

/// Per endpoint: the open get request of each peer.
pub(super) type GetBox = super::outbox::PerPeer<OpenGets>;

/// A get request being filled.
pub(super) struct OpenGets {
    slot: usize,
    /// Payload bytes written (records).
    used: usize,
    /// Payload bytes its answer will take.
    answer: usize,
    count: u32,
    /// The first get's token (the message's waiting context for the lanes and the counters).
    first: u64,
    since: Instant,
    traced: bool,
}

/// One copy of get data into an answer's send slot (`prepare_get_data`).
struct Take {
    /// Index of the answer in the pending queue.
    k: usize,
    dst: u64,
    src: u64,
    len: usize,
    status: i32,
    device: bool,
    /// The answer record's header in the slot and its token (coalesced gets).
    hdr: Option<(u64, u64)>,
}

impl Transport {
    /// A staged get of at most [`COALESCE_MAX`] bytes outside a blocking call: a record of its
    /// peer's open request (opened with a send slot when there is none or it is full). Its waiting
    /// context is taken first: the answer completes it, quiet waits for it.
    pub(super) fn stage_get(&self, c: &Connected, t: &Transfer) -> TResult<()> {
        let (pe, ep, len) = (t.pe as usize, t.ep, t.len as u32);
        debug_assert!(len as usize <= COALESCE_MAX);
        let e = &c.eps[ep];
        let stats = self.mover.stats();
        let traced = stats.sample(t.len);
        // scratch[1..3]: the post time and the trace flag for the answer; [3] the length.
        let scratch = [0, stats.stamp(), traced as u64, len as u64];
        let (_, wait) = self.alloc_wait(c, ep, pe, t.local, &scratch)?;
        loop {
            // Written into the open request when it has room; else the full one is taken (or
            // there is none) and a new one opened below.
            let placed = e.getbox.with(pe, |open| {
                if let Some(o) = open.as_mut() {
                    if get_answer_fits(o.used, o.answer, len as usize) {
                        // SAFETY: the record lies inside the slot's payload area (checked above);
                        // the slot is this open request's until it is posted.
                        let buf = unsafe {
                            std::slice::from_raw_parts_mut(
                                e.send_slot_ptr(o.slot).add(AM_BYTES + o.used),
                                GET_REQUEST,
                            )
                        };
                        write_get_request(buf, wait, t.remote, len);
                        o.used += GET_REQUEST;
                        o.answer += get_answer_bytes(len as usize);
                        o.count += 1;
                        o.traced |= traced;
                        return Ok(());
                    }
                }
                Err(open.take())
            });
            match placed {
                Ok(()) => return Ok(()),
                Err(Some(full)) => self.close_gets(c, ep, pe, full),
                Err(None) => {}
            }
            // Earlier puts to this peer leave first (a get after a fence then sees them).
            self.close_peer(c, ep, pe);
            let slot = match self.alloc_slot(c, ep, pe) {
                Ok(slot) => slot,
                Err(err) => {
                    e.uncount(wait);
                    return Err(err);
                }
            };
            let fresh = OpenGets {
                slot,
                used: 0,
                answer: 0,
                count: 0,
                first: wait,
                since: Instant::now(),
                traced: false,
            };
            // Another thread on this endpoint may have opened one meanwhile: it goes first.
            if let Some(o) = e.getbox.with(pe, |open| open.replace(fresh)) {
                self.close_gets(c, ep, pe, o);
            }
        }
    }

    /// Queues peer `pe`'s open get request (if any) for posting.
    pub(super) fn close_peer_gets(&self, c: &Connected, ep: usize, pe: usize) {
        if let Some(o) = c.eps[ep].getbox.take(pe) {
            self.close_gets(c, ep, pe, o);
        }
    }

    /// Queues every open get request of endpoint `ep` for posting (`stale_only`: those open
    /// longer than [`OPEN_FOR`]).
    pub(super) fn close_all_gets(&self, c: &Connected, ep: usize, stale_only: bool) {
        let taken = c.eps[ep]
            .getbox
            .take_where(|_, o| !stale_only || o.since.elapsed() >= OPEN_FOR);
        for (pe, o) in taken {
            self.close_gets(c, ep, pe, o);
        }
    }

    fn close_gets(&self, c: &Connected, ep: usize, pe: usize, o: OpenGets) {
        let hdr = AmMsg {
            magic: AM_MAGIC,
            kind: AM_GET_MULTI,
            op: o.count as i32,
            size: o.used as u32,
            val: c.my_pe as u64,
            reserved: if o.traced { AM_TRACED } else { 0 },
            ..Default::default()
        };
        self.queue_placed(c, ep, pe, o.slot, hdr, o.first, o.traced);
    }

    /// Fails the operations a staged message in send slot `slot` (header `hdr`) carries, which
    /// will not be answered: every get of a get request, else the waiting context `wait`.
    pub(super) fn fail_staged(
        &self,
        e: &EpState,
        slot: usize,
        hdr: &AmMsg,
        wait: u64,
        msg: String,
    ) {
        if hdr.kind != AM_GET_MULTI {
            self.fail_am_wait(e, wait, msg);
            return;
        }
        let payload = unsafe {
            // SAFETY: the slot is reserved for this message until the caller frees it; its
            // payload area holds STAGE_MAX bytes.
            std::slice::from_raw_parts(
                e.send_slot_ptr(slot).add(AM_BYTES),
                (hdr.size as usize).min(STAGE_MAX),
            )
        };
        match parse_get_requests(payload, hdr.op as u32) {
            Ok(gets) => {
                for (token, _, _) in gets {
                    e.finish_wait(token, Some(msg.clone()), "a get request not sent");
                }
            }
            Err(err) => {
                tracing::error!("a get request not sent and not readable ({err}): {msg}");
                self.fail_am_wait(e, wait, msg);
            }
        }
    }

    /// The target's side of an [`AM_GET_MULTI`] (payload `payload`) from the PE at `dest`: its
    /// answer is queued (data copied in by [`Transport::prepare_get_data`]). A request that cannot
    /// be read is dropped (the initiator's quiet reports the loss at its bound).
    pub(super) fn queue_get_multi(
        &self,
        e: &EpState,
        i: usize,
        dest: FiAddr,
        m: &AmMsg,
        payload: &[u8],
    ) {
        match parse_get_requests(payload, m.op as u32) {
            Ok(gets) => e.am_pending.lock().push_back(Pending::GetMulti {
                dest,
                gets,
                prep: None,
            }),
            Err(err) => tracing::error!(
                "endpoint {i}: coalesced gets from PE {} dropped: {err}",
                m.val
            ),
        }
    }
}

impl Transport {
    /// Whether `[addr, addr+len)` may be read for a get (registered here) and whether it is GPU
    /// memory; the status to answer with.
    fn get_source(&self, addr: u64, len: u32) -> (i32, bool) {
        match self.find_registration(addr, len as u64) {
            Some(r) => (0, r.device),
            None => {
                tracing::error!("staged get: {addr:#x}+{len} is not registered here");
                (abi::status::INVALID_VALUE, false)
            }
        }
    }

    /// Takes send slots for the staged get answers endpoint `i` owes (as many as are free) and
    /// copies their data in: host memory at once, GPU memory in one launch of the copy kernel
    /// (small ones) or enqueued on the copy stream without a wait and marked by one event for the
    /// batch (`GetPrep::copied`); `flush_am_pending` sends an answer once its mark is done. The
    /// queue stays locked meanwhile (taken once per batch). A coalesced answer's record headers
    /// are written here, with each record's status.
    pub(super) fn prepare_get_data(&self, c: &Connected, i: usize) {
        let e = &c.eps[i];
        let mut q = e.am_pending.lock();
        let mut takes: Vec<Take> = Vec::new();
        // (queue index, slot, answer payload bytes)
        let mut slots: Vec<(usize, usize, u32)> = Vec::new();
        for (k, p) in q.iter().enumerate() {
            match p {
                Pending::GetData {
                    addr,
                    len,
                    prep: None,
                    ..
                } => {
                    let Some(slot) = e.send_free.lock().pop() else {
                        break;
                    };
                    let (status, device) = self.get_source(*addr, *len);
                    // SAFETY: the payload area of the slot has STAGE_MAX >= len bytes.
                    let payload = unsafe { e.send_slot_ptr(slot).add(AM_BYTES) } as u64;
                    takes.push(Take {
                        k,
                        dst: payload,
                        src: *addr,
                        len: *len as usize,
                        status,
                        device,
                        hdr: None,
                    });
                    slots.push((k, slot, *len));
                }
                Pending::GetMulti {
                    gets, prep: None, ..
                } => {
                    let Some(slot) = e.send_free.lock().pop() else {
                        break;
                    };
                    // SAFETY: the payload area of the slot has STAGE_MAX bytes.
                    let payload = unsafe { e.send_slot_ptr(slot).add(AM_BYTES) };
                    let mut off = 0usize;
                    for (n, &(token, addr, len)) in gets.iter().enumerate() {
                        let (mut status, device) = self.get_source(addr, len);
                        // The initiator bounds a request by its answer (get_answer_fits); a
                        // record whose data does not fit, with room kept for the headers of the
                        // records after it, is refused without data. (A request holds at most
                        // STAGE_MAX / GET_REQUEST records: their headers alone always fit.)
                        let later = (gets.len() - n - 1) * GET_ANSWER;
                        let fits = off + get_answer_bytes(len as usize) + later <= STAGE_MAX;
                        if !fits {
                            tracing::error!(
                                "endpoint {i}: a coalesced get of {len} bytes does not fit its \
                                 answer ({off} bytes taken): refused"
                            );
                            status = abi::status::INVALID_VALUE;
                        }
                        let space = if fits { len } else { 0 };
                        // SAFETY: the record (GET_ANSWER bytes, and `space` data bytes) lies
                        // inside the slot's payload area: off + get_answer_bytes(space) <=
                        // STAGE_MAX (above).
                        let h = unsafe { payload.add(off) };
                        write_get_answer(
                            // SAFETY: as above.
                            unsafe { std::slice::from_raw_parts_mut(h, GET_ANSWER) },
                            token,
                            space,
                            status,
                        );
                        if status == 0 {
                            takes.push(Take {
                                k,
                                dst: h as u64 + GET_ANSWER as u64,
                                src: addr,
                                len: len as usize,
                                status,
                                device,
                                hdr: Some((h as u64, token)),
                            });
                        }
                        off += get_answer_bytes(space as usize);
                    }
                    slots.push((k, slot, off as u32));
                }
                _ => {}
            }
        }
        if slots.is_empty() {
            return;
        }
        let stats = self.mover.stats();
        let t = stats.start();
        let mut mark = None;
        for device in [true, false] {
            let copies: Vec<(u64, u64, usize)> = takes
                .iter()
                .filter(|x| x.status == 0 && x.device == device)
                .map(|x| (x.dst, x.src, x.len))
                .collect();
            if copies.is_empty() {
                continue;
            }
            if !device {
                if let Err(err) = copy_many(&copies, false) {
                    tracing::error!("endpoint {i}: staged get data not copied: {}", err.message);
                    for x in takes.iter_mut().filter(|x| x.status == 0 && !x.device) {
                        x.status = err.status;
                    }
                }
                continue;
            }
            // Small ones out of GPU memory: one launch of the copy kernel, waited for (about the
            // time one copy-engine copy costs in driver calls alone); `mark` stays `None`: the
            // data is in place.
            if super::kstage::KStage::fits(&copies) {
                if let Some(ks) = e.kstage.lock().as_mut() {
                    // SAFETY: the slots are a mapped slab reserved for these answers, the
                    // sources registered GPU memory of this PE; copy_now returns once the launch
                    // is decided (a taken-over one never touches them).
                    if unsafe { ks.copy_now(&copies) } {
                        continue;
                    }
                }
            }
            // Out of GPU memory: enqueued without a wait and marked once; the answers leave when
            // the mark is done (flush_am_pending), so this thread never waits for the copies.
            for x in takes.iter_mut().filter(|x| x.status == 0 && x.device) {
                // SAFETY: the slot stays reserved until its answer completes, after the mark; the
                // source lies in a registration of this PE.
                let r = unsafe {
                    crate::cuda::memcpy_async(x.dst as *mut c_void, x.src as *const c_void, x.len)
                };
                if let Err(err) = r {
                    tracing::error!("endpoint {i}: staged get data not copied: {err}");
                    x.status = abi::status::INTERNAL;
                }
            }
            match crate::cuda::copy_mark(0) {
                Ok(ev) => mark = Some(std::sync::Arc::new(ev)),
                Err(err) => {
                    tracing::error!("endpoint {i}: staged get data not marked: {err}");
                    for x in takes.iter_mut().filter(|x| x.status == 0 && x.device) {
                        x.status = abi::status::INTERNAL;
                    }
                }
            }
        }
        let bytes = takes.iter().map(|x| x.len as u64).sum();
        stats.record(Stage::TargetCopy, t, bytes);
        // A coalesced record whose copy failed says so in its header.
        for x in takes.iter().filter(|x| x.status != 0) {
            if let Some((h, token)) = x.hdr {
                // SAFETY: the record's header in the slot, written above.
                let buf = unsafe { std::slice::from_raw_parts_mut(h as *mut u8, GET_ANSWER) };
                write_get_answer(buf, token, x.len as u32, x.status);
            }
        }
        for (k, slot, size) in slots {
            let of_k = || takes.iter().filter(move |x| x.k == k);
            // A single get's status is its copy's; a coalesced answer's records carry theirs.
            let status = match q.get(k) {
                Some(Pending::GetData { .. }) => of_k().next().map_or(0, |x| x.status),
                _ => 0,
            };
            let copied = if of_k().any(|x| x.device && x.status == 0) {
                mark.clone()
            } else {
                None
            };
            if let Some(prep) = q.get_mut(k).and_then(Pending::prep_mut) {
                *prep = Some(GetPrep {
                    slot,
                    status,
                    size,
                    copied,
                });
            }
        }
    }

    /// The header of the answer a prepared get answer is sent with.
    pub(super) fn get_answer_header(p: &Pending, prep: &GetPrep) -> AmMsg {
        match p {
            Pending::GetMulti { gets, .. } => AmMsg {
                magic: AM_MAGIC,
                kind: AM_GET_DATA_MULTI,
                op: gets.len() as i32,
                size: prep.size,
                status: prep.status,
                ..Default::default()
            },
            Pending::GetData { token, .. } => AmMsg {
                magic: AM_MAGIC,
                kind: super::wire::AM_GET_DATA,
                token: *token,
                size: if prep.status == 0 { prep.size } else { 0 },
                status: prep.status,
                ..Default::default()
            },
            Pending::Msg(_, m) => *m,
        }
    }

    /// The initiator's side of an [`AM_GET_DATA_MULTI`] (payload at `payload`): each record's data
    /// goes to its get's buffer (copies into GPU memory together: one launch of the copy kernel
    /// where they are registered and small) and its get completes. Records whose get ended already
    /// (its peer declared gone) are dropped.
    pub(super) fn land_get_multi(&self, e: &EpState, i: usize, m: &AmMsg, payload: *const u8) {
        // SAFETY: `m.size` payload bytes follow the header in the receive slot (checked by the
        // caller).
        let bytes = unsafe { std::slice::from_raw_parts(payload, m.size as usize) };
        let records = match parse_get_answers(bytes, m.op as u32) {
            Ok(r) => r,
            Err(err) => {
                // Its gets are not known: the initiator's quiet reports them at its bound.
                tracing::error!("endpoint {i}: a coalesced get answer dropped: {err}");
                return;
            }
        };
        let stats = self.mover.stats();
        let mut copies: Vec<(u64, u64, usize)> = Vec::new();
        let mut copied: Vec<super::endpoints::Claim> = Vec::new();
        let mut registered = true;
        let t = stats.start();
        for (token, status, off, len) in records {
            let Some(w) = e.claim_wait(token, "coalesced get data") else {
                continue;
            };
            // SAFETY: own waiting context; scratch[1] holds the post time, [3] the length.
            let (stamp, want) = e
                .ctxs
                .scratch(w.ctx)
                .map_or((0, 0), |s| unsafe { (*s.add(1), *s.add(SCRATCH_LEN)) });
            stats.record_since(Stage::ResponseRecv, stamp, len as u64);
            let error = if m.status != 0 || status != 0 {
                Some(format!(
                    "remote get failed with status {}",
                    if status != 0 { status } else { m.status }
                ))
            } else if len as u64 != want {
                Some(format!(
                    "remote get answered {len} bytes where {want} were asked"
                ))
            } else {
                None
            };
            if error.is_some() {
                e.finish_claimed(w, error);
                continue;
            }
            // SAFETY: the record's data lies inside the payload (parse_get_answers).
            let src = unsafe { payload.add(off) };
            if is_device(w.data as *const c_void) {
                registered &= self
                    .find_registration(w.data, len as u64)
                    .is_some_and(|r| r.device);
                copies.push((w.data, src as u64, len));
                copied.push(w);
            } else {
                let r = copy_any(w.data as *mut u8, src, len);
                e.finish_claimed(w, r.err().map(|err| err.message));
            }
        }
        let error = if copies.is_empty() {
            None
        } else {
            self.copy_in_now(e, &copies, registered)
                .err()
                .map(|err| err.message)
        };
        let landed: u64 = copies.iter().map(|c| c.2 as u64).sum();
        stats.record(Stage::CopyIn, t, landed);
        for w in copied {
            e.finish_claimed(w, error.clone());
        }
    }
}
