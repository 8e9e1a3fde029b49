//! The staged path's outgoing put messages: their payloads are copied into send slots without a
//! wait (copies out of GPU memory are enqueued on the copy stream and marked by an event), and
//! progress posts each message once its copy is done, in the order they were queued. Small puts to
//! one peer share a message ([`AM_PUT_MULTI`]): one send, one answer, one copy mark for many.
//!
//! Order: an endpoint's messages leave in queue order per peer; a put that is not coalesced
//! closes its peer's open message first, and quiet closes every open message before it waits. A
//! fence owed to the peer (`fence`) is carried by the next record (`REC_FENCED`, and `AM_FENCED`
//! on its message) or put chunk (`AM_FENCED`), which the target applies after everything before.
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::abi::amo;
use super::fence::Via;
use super::kstage::{Copy3, Outcome};
use super::rma::Transfer;
use super::wire::{
    put_chunk, put_chunks, record_bytes, write_amo_record, write_record, AmMsg, AMO_RECORD,
    AM_BYTES, AM_FENCED, AM_MAGIC, AM_PUT, AM_PUT_MULTI, AM_TRACED, PUT_RECORD, STAGE_CHUNK,
};
use super::{internal, Connected, TResult, Transport};
use crate::cuda;
use crate::mover::stats::Stage;

/// How long an open coalesced message waits for more puts (or a get request for more gets) before
/// progress closes it (an operation that nobody quiets still leaves).
pub(super) const OPEN_FOR: Duration = Duration::from_micros(20);

/// Per endpoint: the open coalesced message of each peer and the messages waiting to be posted.
/// The counts let progress, which looks at the outbox every round, pass an empty one without
/// taking its locks (which the thread issuing puts takes for each message).
#[derive(Default)]
pub(super) struct Outbox {
    open: PerPeer<Open>,
    ready: Mutex<VecDeque<Ready>>,
    /// Entries of `ready` (changed under its lock).
    queued: AtomicUsize,
}

/// The message being filled for each peer (a coalesced put message, a get request), with the
/// count of open ones, so that progress passes an endpoint without any without taking the lock.
pub(super) struct PerPeer<T> {
    open: Mutex<Vec<Option<T>>>,
    /// Open messages (changed under `open`'s lock).
    opened: AtomicUsize,
}

impl<T> Default for PerPeer<T> {
    fn default() -> Self {
        PerPeer {
            open: Mutex::new(Vec::new()),
            opened: AtomicUsize::new(0),
        }
    }
}

impl<T> PerPeer<T> {
    /// Runs `f` on peer `pe`'s entry under the lock; the count follows what `f` leaves there.
    pub(super) fn with<R>(&self, pe: usize, f: impl FnOnce(&mut Option<T>) -> R) -> R {
        let mut open = self.open.lock();
        if open.len() <= pe {
            open.resize_with(pe + 1, || None);
        }
        let was = open[pe].is_some();
        let r = f(&mut open[pe]);
        match (was, open[pe].is_some()) {
            (true, false) => {
                self.opened.fetch_sub(1, Ordering::AcqRel);
            }
            (false, true) => {
                self.opened.fetch_add(1, Ordering::AcqRel);
            }
            _ => {}
        }
        r
    }

    /// Peer `pe`'s open message, taken (none without the lock when no message is open).
    pub(super) fn take(&self, pe: usize) -> Option<T> {
        if self.opened.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.with(pe, Option::take)
    }

    /// Every open message for which `pick` (peer, message) holds, taken.
    pub(super) fn take_where(&self, pick: impl Fn(usize, &T) -> bool) -> Vec<(usize, T)> {
        if self.opened.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut open = self.open.lock();
        let taken: Vec<(usize, T)> = open
            .iter_mut()
            .enumerate()
            .filter(|(pe, o)| o.as_ref().is_some_and(|o| pick(*pe, o)))
            .filter_map(|(pe, o)| o.take().map(|o| (pe, o)))
            .collect();
        self.opened.fetch_sub(taken.len(), Ordering::AcqRel);
        taken
    }
}

/// A coalesced message being filled.
struct Open {
    slot: usize,
    /// Payload bytes written (records).
    used: usize,
    count: u32,
    /// Token of the waiting context the answer completes.
    wait: u64,
    since: Instant,
    /// Some record's data is being copied out of GPU memory (a copy mark is needed).
    device: bool,
    /// Some record's copy was enqueued on the copy stream at once (not deferred).
    enqueued: bool,
    /// The records' copies out of GPU memory are made when the message closes, as one launch of
    /// the copy kernel (the endpoint has one: `kstage`); these are they.
    deferred: Option<Vec<Copy3>>,
    /// The CUDA context whose copy stream carries those copies.
    cuda_ctx: usize,
    traced: bool,
    /// Some record carries a fence (`REC_FENCED`): the header says so (`AM_FENCED`).
    fenced: bool,
    /// Some record is a signal: someone waits for it, so the message closes as soon as nothing
    /// else to the peer is outstanding ([`Transport::close_all`]), not after [`OPEN_FOR`].
    urgent: bool,
    /// Some record follows the endpoint's same-host copies (an AMO that may signal them, a
    /// fence after them): the message leaves once the first this many copies submitted on the
    /// endpoint are complete (0: no such record).
    after_copies: u64,
}

/// A message whose payload is (being) copied into its send slot.
struct Ready {
    pe: usize,
    slot: usize,
    hdr: AmMsg,
    /// Token of the waiting context the answer completes (released meanwhile when the peer
    /// was declared gone: the message is dropped then).
    wait: u64,
    traced: bool,
    /// Done once the payload is in the slot; `None`: it is already.
    copied: Option<Copied>,
    /// Posted once the first this many same-host copies of the endpoint are complete (0: at once).
    after_copies: u64,
    queued: Option<Instant>,
}

/// How a message's payload gets into its send slot.
#[derive(Clone)]
enum Copied {
    /// Copies on the copy stream, done by this mark.
    Mark(Arc<cuda::stream::Event>),
    /// One launch of the endpoint's copy kernel (`kstage`).
    Kernel(u64),
}

/// What writing a record did about its payload.
enum Rec {
    /// In the slot (host memory, or no payload).
    Placed,
    /// Copy out of GPU memory enqueued on the copy stream.
    Enqueued,
    /// Copy out of GPU memory to make when the message closes.
    Deferred(Copy3),
}

impl Transport {
    /// A staged put of at most [`super::wire::COALESCE_MAX`] bytes: appended to its peer's open
    /// message (opened with a send slot and a waiting context when there is none or it is full).
    /// `device`: the source is GPU memory (copied asynchronously).
    /// `kernel_ok`: the source is GPU memory registered here (its copy may be one of the message's
    /// copy kernel launch).
    pub(super) fn stage_small(
        &self,
        c: &Connected,
        t: &Transfer,
        device: bool,
        kernel_ok: bool,
    ) -> TResult<()> {
        let (pe, ep, len) = (t.pe as usize, t.ep, t.len as usize);
        let traced = self.mover.stats().sample(t.len);
        let fenced = self.fence_gate(c, ep, pe, Via::Message)?;
        self.append_record(
            c,
            ep,
            pe,
            record_bytes(len),
            (traced, 0),
            fenced,
            |buf, defer| {
                write_record(buf, t.remote, len as u32, fenced);
                let dst = buf[PUT_RECORD..].as_mut_ptr();
                // Deferred to one kernel launch when the source is GPU memory registered here (this
                // PE's GPU: the kernel addresses it; other device memory goes to the copy engine).
                if kernel_ok && defer {
                    return Ok(Rec::Deferred((dst as u64, t.local, len)));
                }
                self.copy_out(dst, t.local, len, device)?;
                Ok(if device { Rec::Enqueued } else { Rec::Placed })
            },
        )
    }

    /// A non-fetching AMO (`op` on the `size`-byte word at `addr` of PE `pe`, operand `val`)
    /// carried as a record of its peer's open message: applied by the target with the message,
    /// after every record before a fence it carries; answered with the message. A signal closes
    /// the message at once when nothing else to the peer is outstanding (someone waits for it);
    /// else the message fills until an answer comes back, as Nagle's rule has a TCP segment wait
    /// (a stream of signals then shares messages: one batch of AMO words at the target for many);
    /// other AMOs leave with the message. `follow_copies`: the AMO must land after the endpoint's
    /// same-host copies issued before it (puts it may signal), and so must one after a fence that
    /// found such copies outstanding: the message leaves once they are complete, and this thread
    /// does not wait for them (a put-with-signal on one host waited 17 us for its put here).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_amo(
        &self,
        c: &Connected,
        pe: usize,
        ep: usize,
        op: i32,
        addr: u64,
        val: u64,
        size: u32,
        follow_copies: bool,
    ) -> TResult<()> {
        let (fenced, fence_copies) = self.fence_gate_deferred(c, ep, pe)?;
        let after_copies = if follow_copies || fence_copies {
            self.mover.copies_submitted(ep)
        } else {
            0
        };
        self.append_record(
            c,
            ep,
            pe,
            record_bytes(AMO_RECORD),
            (false, after_copies),
            fenced,
            |buf, _| {
                write_amo_record(buf, addr, op, size, val, fenced);
                Ok(Rec::Placed)
            },
        )?;
        if matches!(op, amo::SIGNAL | amo::SIGNAL_SET | amo::SIGNAL_ADD) {
            if self.only_open_outstanding(c, ep, pe) {
                self.close_peer(c, ep, pe);
                self.post_staged(c, ep);
            } else {
                self.mark_urgent(c, ep, pe);
            }
        }
        Ok(())
    }

    /// Whether the only operation to `pe` outstanding on endpoint `ep` is its open message (whose
    /// waiting context counts as one).
    fn only_open_outstanding(&self, c: &Connected, ep: usize, pe: usize) -> bool {
        let a = &c.eps[ep].peer[pe];
        let completed = a.completed.load(Ordering::Acquire);
        let out = a
            .submitted
            .load(Ordering::Acquire)
            .saturating_sub(completed);
        out <= 1 && a.backlogged.load(Ordering::Acquire) == 0
    }

    /// Marks peer `pe`'s open message as holding a signal (see `Open::urgent`).
    fn mark_urgent(&self, c: &Connected, ep: usize, pe: usize) {
        c.eps[ep].outbox.open.with(pe, |o| {
            if let Some(o) = o {
                o.urgent = true;
            }
        });
    }

    /// Appends a record of `need` bytes to peer `pe`'s open message on endpoint `ep` (opened with
    /// a send slot and a waiting context when there is none or it is full); `fill` writes it
    /// (told whether a copy out of GPU memory is to be deferred to the message's close) and says
    /// what it did about the payload. `(traced, after_copies)`: the record is on the debug
    /// timeline; it follows the first `after_copies` same-host copies of the endpoint (0: none,
    /// `Open::after_copies`). `fenced`: the record carries a fence (so does the message); owed
    /// again when the record is not placed.
    #[allow(clippy::too_many_arguments)]
    fn append_record(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        need: usize,
        (traced, after_copies): (bool, u64),
        fenced: bool,
        fill: impl FnOnce(&mut [u8], bool) -> TResult<Rec>,
    ) -> TResult<()> {
        // Earlier gets to this peer leave first (the queue keeps the order they were issued in).
        self.close_peer_gets(c, ep, pe);
        let r = self.place_record(c, ep, pe, need, (traced, after_copies), fenced, fill);
        if r.is_err() && fenced {
            self.fence_owed_again(c, ep, pe);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn place_record(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        need: usize,
        (traced, after_copies): (bool, u64),
        fenced: bool,
        fill: impl FnOnce(&mut [u8], bool) -> TResult<Rec>,
    ) -> TResult<()> {
        let e = &c.eps[ep];
        let mut fill = Some(fill);
        loop {
            // Placed in the open message when it has room (or refused by `fill`); else the full
            // one is taken (or there is none) and a new one opened below.
            let placed = e.outbox.open.with(pe, |open| {
                if let Some(o) = open.as_mut() {
                    if o.used + need <= STAGE_CHUNK {
                        // SAFETY: the record lies inside the slot's payload area (checked above).
                        let rec = unsafe { e.send_slot_ptr(o.slot).add(AM_BYTES + o.used) };
                        // SAFETY: as above; the slot is this open message's until it is posted.
                        let buf = unsafe { std::slice::from_raw_parts_mut(rec, need) };
                        let defer = o.deferred.is_some();
                        let rec = match (fill.take().expect("filled once"))(buf, defer) {
                            Ok(rec) => rec,
                            Err(err) => return Ok(Err(err)),
                        };
                        o.used += need;
                        o.count += 1;
                        match rec {
                            Rec::Placed => {}
                            Rec::Enqueued => {
                                o.enqueued = true;
                                if !o.device {
                                    o.device = true;
                                    o.cuda_ctx = cuda::current_context();
                                }
                            }
                            Rec::Deferred(copy) => {
                                o.deferred.get_or_insert_with(Vec::new).push(copy);
                                if !o.device {
                                    o.device = true;
                                    o.cuda_ctx = cuda::current_context();
                                }
                            }
                        }
                        o.traced |= traced;
                        o.fenced |= fenced;
                        o.after_copies = o.after_copies.max(after_copies);
                        return Ok(Ok(()));
                    }
                }
                Err(open.take())
            });
            match placed {
                Ok(r) => return r,
                Err(Some(full)) => self.close_open(c, ep, pe, full),
                Err(None) => {}
            }
            let slot = self.alloc_slot(c, ep, pe)?;
            let wait = match self.alloc_wait(c, ep, pe, 0, &[]) {
                Ok((_, token)) => token,
                Err(err) => {
                    e.send_free.lock().push(slot);
                    return Err(err);
                }
            };
            let fresh = Open {
                slot,
                used: 0,
                count: 0,
                wait,
                since: Instant::now(),
                device: false,
                enqueued: false,
                deferred: e.kstage.lock().is_some().then(Vec::new),
                cuda_ctx: 0,
                traced: false,
                fenced: false,
                urgent: false,
                after_copies: 0,
            };
            // Another thread on this endpoint may have opened one meanwhile: it goes first.
            if let Some(o) = e.outbox.open.with(pe, |open| open.replace(fresh)) {
                self.close_open(c, ep, pe, o);
            }
        }
    }

    /// Copies `len` bytes of a put's source at `src` into a send slot at `dst`: enqueued on the copy
    /// stream for GPU memory (done by the next copy mark), at once for host memory.
    fn copy_out(&self, dst: *mut u8, src: u64, len: usize, device: bool) -> TResult<()> {
        if device {
            // SAFETY: the slot is reserved until its message completes, after the copy mark; the
            // source stays valid until quiet (NVSHMEM's rule for non-blocking puts), which waits
            // for the message's answer.
            unsafe { cuda::memcpy_async(dst as *mut c_void, src as *const c_void, len) }
                .map_err(|e| internal(e.to_string()))
        } else {
            // SAFETY: a slot of this endpoint and a source range of this process, not overlapping.
            unsafe { crate::mover::copy_bytes(dst, src as *const u8, len, false) }
                .map_err(|e| internal(e.to_string()))
        }
    }

    /// Enqueues `copies` out of GPU memory on the copy stream of context `ctx` (the way out of a
    /// copy kernel launch: not made, or taken over); the message to fail otherwise.
    fn copy_out_all(&self, copies: &[Copy3], ctx: usize) -> Result<(), String> {
        let _g = cuda::ContextGuard::enter(ctx);
        for &(dst, src, len) in copies {
            self.copy_out(dst as *mut u8, src, len, true)
                .map_err(|err| {
                    format!("staged put: copy out of GPU memory failed: {}", err.message)
                })?;
        }
        Ok(())
    }

    /// Moves peer `pe`'s open message (if any: a put message or a get request, never both, as
    /// each closes the other before it opens) to the queue of messages to post.
    pub(super) fn close_peer(&self, c: &Connected, ep: usize, pe: usize) {
        self.close_peer_gets(c, ep, pe);
        if let Some(o) = c.eps[ep].outbox.open.take(pe) {
            self.close_open(c, ep, pe, o);
        }
    }

    /// Closes every open message of endpoint `ep` (`stale_only`: only those open longer than
    /// [`OPEN_FOR`]) and posts what is ready.
    pub(super) fn close_all(&self, c: &Connected, ep: usize, stale_only: bool) {
        let taken = c.eps[ep].outbox.open.take_where(|pe, o| {
            !stale_only
                || o.since.elapsed() >= OPEN_FOR
                || (o.urgent && self.only_open_outstanding(c, ep, pe))
        });
        for (pe, o) in taken {
            self.close_open(c, ep, pe, o);
        }
        self.close_all_gets(c, ep, stale_only);
        self.post_staged(c, ep);
    }

    fn close_open(&self, c: &Connected, ep: usize, pe: usize, o: Open) {
        let hdr = AmMsg {
            magic: AM_MAGIC,
            kind: AM_PUT_MULTI,
            token: o.wait,
            op: o.count as i32,
            size: o.used as u32,
            addr: 0,
            val: c.my_pe as u64,
            reserved: if o.traced { AM_TRACED } else { 0 } | if o.fenced { AM_FENCED } else { 0 },
            ..Default::default()
        };
        let msgs = vec![(o.slot, hdr, o.wait)];
        let gate = (o.traced, o.after_copies);
        if let Some(copies) = o.deferred.filter(|d| !d.is_empty()) {
            // The records' copies out of GPU memory as one launch of the copy kernel, unless some
            // record's copy is on the copy stream already (the message then waits for one mark).
            let e = &c.eps[ep];
            let launched = if o.enqueued {
                None
            } else {
                // SAFETY: the sources are GPU memory valid until quiet (NVSHMEM's rule for
                // non-blocking puts), which waits for this message's answer, sent after the launch
                // is decided; the slot is a mapped slab, reserved for the message until then.
                e.kstage
                    .lock()
                    .as_mut()
                    .and_then(|ks| unsafe { ks.launch(&copies) })
            };
            if let Some(id) = launched {
                self.push_ready(c, ep, pe, msgs, Some(Copied::Kernel(id)), gate);
                return;
            }
            // Not launched (held after a take-over, no slot): the copy engine, on the copy stream
            // of the context the records were written in (the one the mark below is taken on).
            if let Err(msg) = self.copy_out_all(&copies, o.cuda_ctx) {
                tracing::error!("endpoint {ep}: {msg}");
                e.send_free.lock().push(o.slot);
                e.finish_wait(o.wait, Some(msg), "a staged put not copied");
                return;
            }
            self.enqueue_ready(c, ep, pe, msgs, Some(o.cuda_ctx), gate);
            return;
        }
        let device = o.device.then_some(o.cuda_ctx);
        self.enqueue_ready(c, ep, pe, msgs, device, gate);
    }

    /// Queues messages whose payload copies were issued (`device`: on the copy stream of that
    /// CUDA context, so they are marked by one event now; `None`: they are in place). `gate`:
    /// traced, and the same-host copies they follow ([`Ready::after_copies`]).
    fn enqueue_ready(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        msgs: Vec<(usize, AmMsg, u64)>,
        device: Option<usize>,
        gate: (bool, u64),
    ) {
        let e = &c.eps[ep];
        let copied = if let Some(ctx) = device {
            match cuda::copy_mark(ctx) {
                Ok(ev) => Some(Arc::new(ev)),
                Err(err) => {
                    let msg = format!("staged put: copy out of GPU memory not marked: {err}");
                    tracing::error!("endpoint {ep}: {msg}");
                    for (slot, _, wait) in msgs {
                        e.send_free.lock().push(slot);
                        e.finish_wait(wait, Some(msg.clone()), "an unmarked staged put");
                    }
                    return;
                }
            }
        } else {
            None
        };
        self.push_ready(c, ep, pe, msgs, copied.map(Copied::Mark), gate);
    }

    /// Queues messages whose payload gets into place by `copied` (`None`: it is); `gate` as for
    /// [`Transport::enqueue_ready`].
    fn push_ready(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        msgs: Vec<(usize, AmMsg, u64)>,
        copied: Option<Copied>,
        (traced, after_copies): (bool, u64),
    ) {
        let e = &c.eps[ep];
        let queued = self.mover.stats().start();
        let mut q = e.outbox.ready.lock();
        e.outbox.queued.fetch_add(msgs.len(), Ordering::AcqRel);
        for (slot, hdr, wait) in msgs {
            q.push_back(Ready {
                pe,
                slot,
                hdr,
                wait,
                traced,
                copied: copied.clone(),
                after_copies,
                queued,
            });
        }
    }

    /// Queues a message whose payload is in its send slot `slot` (a get request).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_placed(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        slot: usize,
        hdr: AmMsg,
        wait: u64,
        traced: bool,
    ) {
        self.push_ready(c, ep, pe, vec![(slot, hdr, wait)], None, (traced, 0));
    }

    /// Posts the queued messages of endpoint `ep` whose payload is in place, in order per peer; a
    /// peer that cannot take one now (EAGAIN) keeps the rest of its messages for the next round
    /// while other peers' go. Returns how many were posted.
    pub(super) fn post_staged(&self, c: &Connected, ep: usize) -> usize {
        let e = &c.eps[ep];
        if e.outbox.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        // Another thread posting now holds the queue briefly; waiting a little for it lets the
        // caller post its own message rather than leave it for the next progress round. Bounded:
        // a send that drives progress (no context free) may come back here on this thread.
        let Some(mut q) = e.outbox.ready.try_lock_for(Duration::from_micros(50)) else {
            return 0;
        };
        let stats = self.mover.stats();
        let mut blocked: Vec<usize> = Vec::new();
        // Copies complete in stream order: once one mark is not done, later ones are not either.
        let mut copying = false;
        let mut posted = 0;
        let mut k = 0;
        // Copy kernel launches are looked at once per call.
        let mut kstage = None;
        while k < q.len() {
            if blocked.contains(&q[k].pe) {
                k += 1;
                continue;
            }
            let mut failed = None;
            if let Some(Copied::Kernel(id)) = q[k].copied {
                let ks = kstage.get_or_insert_with(|| {
                    let mut g = e.kstage.lock();
                    if let Some(ks) = g.as_mut() {
                        ks.poll();
                    }
                    g
                });
                let outcome = ks.as_mut().map_or(Outcome::Applied, |ks| ks.take(id));
                match outcome {
                    Outcome::Pending => {
                        blocked.push(q[k].pe);
                        k += 1;
                        continue;
                    }
                    Outcome::Applied => q[k].copied = None,
                    Outcome::TakenOver(copies) => {
                        // The host owns the launch: its copies go on the copy stream now and
                        // the message waits for their mark like any other.
                        let r = &mut q[k];
                        r.copied = None;
                        // In the transport's context (progress may run on a thread of its own).
                        let ctx = self.cuda_ctx.load(Ordering::Relaxed) as usize;
                        failed = self.copy_out_all(&copies, ctx).err();
                        if failed.is_none() {
                            match cuda::copy_mark(ctx) {
                                Ok(ev) => r.copied = Some(Copied::Mark(Arc::new(ev))),
                                Err(err) => {
                                    failed = Some(format!(
                                        "staged put: copy out of GPU memory not marked: {err}"
                                    ))
                                }
                            }
                        }
                    }
                }
            }
            // A message that follows the endpoint's same-host copies (an AMO that may signal
            // them) leaves once they are complete; a failed one is not announced.
            if failed.is_none() && q[k].after_copies > 0 {
                match self.mover.copies_done(ep, q[k].after_copies) {
                    Ok(true) => q[k].after_copies = 0,
                    Ok(false) => {
                        blocked.push(q[k].pe);
                        k += 1;
                        continue;
                    }
                    Err(err) => {
                        failed = Some(format!(
                            "staged message not sent: the same-host copies before it failed: {err}"
                        ))
                    }
                }
            }
            let r = &q[k];
            if let (None, Some(Copied::Mark(ev))) = (&failed, &r.copied) {
                match if copying { Ok(false) } else { ev.done() } {
                    Ok(false) => {
                        copying = true;
                        blocked.push(r.pe);
                        k += 1;
                        continue;
                    }
                    Ok(true) => {}
                    Err(err) => {
                        failed = Some(format!("staged put: copy out of GPU memory failed: {err}"))
                    }
                }
            }
            if failed.is_none() && c.peers[r.pe].is_gone() {
                failed = Some(self.gone_error(c, r.pe).message);
            }
            if failed.is_none() {
                let t0 = stats.start();
                let bytes = r.hdr.size as u64;
                stats.record(Stage::CopyOut, r.queued, bytes);
                let stamp = stats.stamp();
                // Before the send: the answer may come (and free the context) at once. A context
                // released meanwhile (its peer declared gone) is not written; the peer check
                // below then drops the message.
                if let Some(sc) = e.ctxs.by_token(r.wait).and_then(|w| e.ctxs.scratch(w)) {
                    // SAFETY: the waiting context of this message; scratch[1..3] keep the post
                    // time and the trace flag for the answer (scratch[0] stays 0: no AMO operand
                    // size). Only the stage counters read them.
                    unsafe {
                        *sc.add(1) = stamp;
                        *sc.add(2) = r.traced as u64;
                    }
                }
                let dest = c.addr(r.pe as i32, ep);
                match self.send_slot(e, r.pe, dest, r.slot, r.hdr, r.wait, stamp, r.traced) {
                    Ok(()) => {
                        stats.record(Stage::ChunkPost, t0, bytes);
                        if r.traced {
                            stats.timeline(Stage::ChunkPost, "", r.wait, r.hdr.addr, bytes);
                        }
                        q.remove(k);
                        e.outbox.queued.fetch_sub(1, Ordering::AcqRel);
                        posted += 1;
                        continue;
                    }
                    Err(err) if err.is_again() => {
                        blocked.push(r.pe);
                        k += 1;
                        continue;
                    }
                    Err(err) => failed = Some(format!("staged put not sent: {err}")),
                }
            }
            let r = q.remove(k).expect("index in range");
            e.outbox.queued.fetch_sub(1, Ordering::AcqRel);
            let msg = failed.expect("set above");
            tracing::error!("endpoint {ep}: {msg}");
            self.fail_staged(e, r.slot, &r.hdr, r.wait, msg);
            e.send_free.lock().push(r.slot);
        }
        posted
    }

    /// A staged put too large to share a message: cut into chunks, each with a send slot and a
    /// waiting context, copied in without a wait (one copy mark for the chunks taken together) and
    /// posted by [`Transport::post_staged`] once in place. Takes as many free slots as it can use
    /// (at least one, waiting for it while progress frees some).
    pub(super) fn stage_chunks(&self, c: &Connected, t: &Transfer, device: bool) -> TResult<()> {
        let (pe, ep, len) = (t.pe as usize, t.ep, t.len);
        let e = &c.eps[ep];
        let stats = self.mover.stats();
        let traced = stats.sample(len);
        // Earlier small puts and gets to this peer leave first; the first chunk carries a fence
        // owed.
        self.close_peer(c, ep, pe);
        let mut fenced = self.fence_gate(c, ep, pe, Via::Message)?;
        let mut off = 0u64;
        let mut chunks = || -> TResult<()> {
            while off < len {
                let chunks_left = put_chunks(len - off);
                let t0 = stats.start();
                let mut slots = vec![self.alloc_slot(c, ep, pe)?];
                stats.record(Stage::SlotWait, t0, 0);
                {
                    let mut free = e.send_free.lock();
                    while slots.len() < chunks_left {
                        match free.pop() {
                            Some(s) => slots.push(s),
                            None => break,
                        }
                    }
                }
                let mut msgs: Vec<(usize, AmMsg, u64)> = Vec::with_capacity(slots.len());
                let mut result = Ok(());
                for (k, &slot) in slots.iter().enumerate() {
                    let n = put_chunk(len - off);
                    let wait = match self.alloc_wait(c, ep, pe, 0, &[]) {
                        Ok((_, token)) => token,
                        Err(err) => {
                            e.send_free.lock().extend(slots[k..].iter().copied());
                            result = Err(err);
                            break;
                        }
                    };
                    // SAFETY: the slot's payload area holds STAGE_MAX >= n bytes.
                    let sp = unsafe { e.send_slot_ptr(slot).add(AM_BYTES) };
                    if let Err(err) = self.copy_out(sp, t.local + off, n as usize, device) {
                        e.send_free.lock().extend(slots[k..].iter().copied());
                        e.uncount(wait);
                        result = Err(err);
                        break;
                    }
                    let hdr = AmMsg {
                        magic: AM_MAGIC,
                        kind: AM_PUT,
                        token: wait,
                        size: n as u32,
                        addr: t.remote + off,
                        val: c.my_pe as u64,
                        reserved: if traced { AM_TRACED } else { 0 }
                            | if std::mem::take(&mut fenced) {
                                AM_FENCED
                            } else {
                                0
                            },
                        ..Default::default()
                    };
                    msgs.push((slot, hdr, wait));
                    off += n;
                }
                // What was copied in goes (its copies are enqueued); an error stops the rest.
                if !msgs.is_empty() {
                    let ctx = device.then(cuda::current_context);
                    self.enqueue_ready(c, ep, pe, msgs, ctx, (traced, 0));
                }
                self.post_staged(c, ep);
                result?;
            }
            Ok(())
        };
        let r = chunks();
        if r.is_err() && fenced {
            // The first chunk, which was to carry the fence, was not queued.
            self.fence_owed_again(c, ep, pe);
        }
        r
    }
}
