//! The progress thread, completion polling and dispatch by context tag.
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::am::Landed;
use super::endpoints::{
    EpState, TAG_AM_RECV, TAG_AM_SEND, TAG_AM_WAIT, TAG_OP, TAG_PROBE, TAG_SLOT_SEND,
};
use super::wire::{AmMsg, AM_FENCED, AM_MAGIC};
use super::{Connected, Transport};
use crate::cuda;
use crate::fabric::CqEntry;
use crate::log::panic_message;
use crate::mover::stats::Stage;

impl Transport {
    pub(super) fn start_progress_thread(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let ctx = self.cuda_ctx.load(Ordering::Relaxed) as usize;
        // A target sees no completion for the RMA aimed at it, so "nothing completed" does not mean
        // idle: with manual data progress (software providers) every incoming write waits for this
        // PE to poll, and a sleeping poller costs each of the initiator's operations a sleep (measured
        // on shm: ~130 us per 8-byte put). Such providers are polled continuously (yielding the CPU
        // between polls, like NVSHMEM's proxy thread); with automatic progress the thread backs off
        // (the route decides: `Route::progress_sleeps`).
        let may_sleep = self.route.progress_sleeps;
        let failed = self.failed.clone();
        #[cfg(any(test, feature = "test-support"))]
        let inject_panic = self.inject_panic.clone();
        let h = std::thread::Builder::new()
            .name("nvshmem-efa-progress".into())
            .spawn(move || {
                if let Err(e) = cuda::set_current_context(ctx) {
                    tracing::warn!("progress thread: {e}");
                }
                // The panic boundary: a panic ends the loop, never silently. The transport is
                // marked failed, so every waiter (quiet, blocking ops, staged waits) and every later
                // op returns an error at once instead of at the quiet timeout.
                let body = catch_unwind(AssertUnwindSafe(|| {
                    let mut idle = 0u32;
                    while !stop.load(Ordering::Acquire) {
                        let Some(t) = weak.upgrade() else { break };
                        #[cfg(any(test, feature = "test-support"))]
                        if inject_panic.swap(false, Ordering::AcqRel) {
                            panic!("panic injected into the progress thread (test support)");
                        }
                        let n = t.progress_all();
                        drop(t);
                        if n > 0 {
                            idle = 0;
                        } else {
                            idle = idle.saturating_add(1);
                            if may_sleep && idle > 2000 {
                                std::thread::sleep(Duration::from_micros(50));
                            } else {
                                std::thread::yield_now();
                            }
                        }
                    }
                }));
                if let Err(payload) = body {
                    let msg = panic_message(payload.as_ref());
                    tracing::error!(
                        "progress thread panicked: {msg}; the transport is marked failed and every \
                         operation on it now returns an error"
                    );
                    let _ = failed.set(format!("the progress thread panicked: {msg}"));
                }
            });
        match h {
            Ok(h) => *self.progress_thread.lock() = Some(h),
            Err(e) => tracing::warn!("could not start the progress thread: {e}"),
        }
    }

    /// Drives every endpoint once; returns how many completions were handled.
    pub fn progress_all(&self) -> usize {
        let Some(c) = self.conn.get() else { return 0 };
        (0..c.eps.len()).map(|i| self.progress_ep(c, i)).sum()
    }

    pub(super) fn progress_ep(&self, c: &Connected, i: usize) -> usize {
        let e = &c.eps[i];
        let mut handled = match &e.lanes {
            None => self.poll_cq(c, i),
            Some(l) => {
                let n = {
                    // Recursive: a writer waiting for the gate must not block a reader that
                    // already holds it further up this thread's stack.
                    let _gate = l.gate.read_recursive();
                    self.poll_cq(c, i)
                };
                if l.has_retired() {
                    self.close_retired(c, i);
                }
                n
            }
        };
        if self.rails.active() {
            handled += self.rails_progress(c);
        }
        // Kernel atomics whose kernel has not started in time are taken over here as well, so an
        // atomic that nobody quiets (a GPU waiting for it while its kernels hold every SM) lands.
        if let Err(err) = self.settle_kernel_amos(i, None) {
            tracing::error!("endpoint {i}: {err}");
            e.record_error(err.to_string());
        }
        // Same-host copies held back for one submission go once the oldest has waited a while.
        self.mover.flush_stale(i);
        // Staged puts: coalesced messages open too long close, and those copied in go out.
        self.close_all(c, i, true);
        self.flush_am_pending(c, i);
        handled += self.drain_backlogs(c, i);
        self.check_peers(c);
        handled
    }

    /// Reads endpoint `i`'s CQ until it is empty and handles every completion.
    fn poll_cq(&self, c: &Connected, i: usize) -> usize {
        let e = &c.eps[i];
        let mut handled = 0;
        // SAFETY: fi_cq_data_entry is plain data; all-zero is a valid value.
        let mut buf: [CqEntry; 16] = unsafe { std::mem::zeroed() };
        loop {
            match e.cq.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    // A message that carries a fence is applied after everything before it in
                    // full: it starts a segment of its own.
                    for (start, end) in fence_segments(n, |k| self.carries_fence(e, &buf[k])) {
                        self.complete_segment(c, i, &buf[start..end]);
                    }
                    handled += n;
                }
                Err(err) => {
                    handled += 1;
                    if err.context.is_null() {
                        // Not attributable to one operation: record it so quiet reports it.
                        e.record_error(err.error.to_string());
                        tracing::error!("endpoint {i}: {}", err.error);
                        break;
                    }
                    if self.claimed(e, err.context) {
                        self.complete(c, i, err.context, 0, Some(err.error.to_string()));
                    }
                }
            }
        }
        handled
    }

    /// Handles completions `ents` read from endpoint `i`'s CQ together. The copies into GPU memory
    /// that their staged messages carry go as one submission with one wait, before the messages
    /// are handled; likewise the AMOs into GPU memory: their words read once, written once.
    fn complete_segment(&self, c: &Connected, i: usize, ents: &[CqEntry]) {
        let e = &c.eps[i];
        let copied = self.copy_in_batch(c, i, ents);
        let mut amos = self.amo_batch(c, i, ents);
        for (k, ent) in ents.iter().enumerate() {
            if self.claimed(e, ent.op_context) {
                let (ctx, len) = (ent.op_context, ent.len);
                self.complete_copied(c, i, ctx, len, None, copied[k], amos.as_mut());
            }
        }
        if let Some(b) = amos {
            self.amo_batch_end(c, i, b);
        }
    }

    /// Whether completion `ent` is a received message that carries a fence (`AM_FENCED`).
    fn carries_fence(&self, e: &EpState, ent: &CqEntry) -> bool {
        let Some((TAG_AM_RECV, slot)) = e.ctxs.get(ent.op_context) else {
            return false;
        };
        let Some(base) = e.am_buf(slot as usize) else {
            return false;
        };
        if ent.len < std::mem::size_of::<AmMsg>() {
            return false;
        }
        // SAFETY: the receive completed, so the provider is done writing the slot.
        let m: AmMsg = unsafe { std::ptr::read_unaligned(base as *const AmMsg) };
        m.magic == AM_MAGIC && m.reserved & AM_FENCED != 0
    }

    /// Whether a completion read from the CQ is to be handled: with lanes, a transmit whose lane
    /// was closed has been reclaimed already (its context may belong to another operation now).
    fn claimed(&self, e: &EpState, ctx: *mut c_void) -> bool {
        let Some(l) = &e.lanes else { return true };
        match e.ctxs.get(ctx) {
            Some((TAG_OP | TAG_AM_SEND | TAG_SLOT_SEND, _)) => l.claim(ctx),
            _ => true,
        }
    }

    /// Closes the lanes of endpoint `i` that were taken out of service, handles the completions
    /// they wrote before, and then reclaims the operations still posted on them: a counted one
    /// fails with the reason; message contexts and send slots come back (their waiting operation
    /// is answered by the peer, or was failed when the peer was found gone).
    fn close_retired(&self, c: &Connected, i: usize) {
        let e = &c.eps[i];
        let Some(l) = &e.lanes else { return };
        let (retired, left) = {
            let _gate = l.gate.write();
            let mut retired = l.take_retired();
            for r in retired.iter_mut() {
                r.ep.take();
            }
            self.poll_cq(c, i);
            let left = l.reclaim(&retired);
            (retired, left)
        };
        for r in &retired {
            tracing::debug!("endpoint {i}: lane to PE {} closed: {}", r.pe, r.why);
        }
        for (ctx, k) in left {
            let why = &retired[k].why;
            match e.ctxs.get(ctx) {
                Some((TAG_OP, _)) => {
                    tracing::error!(
                        "endpoint {i}: operation to PE {} failed: {why}",
                        retired[k].pe
                    );
                    e.finish_op(ctx, Some(why.clone()));
                }
                Some((TAG_SLOT_SEND, slot)) => {
                    e.send_free.lock().push(slot as usize);
                    e.ctxs.free(ctx);
                }
                Some(_) => {
                    e.ctxs.free(ctx);
                }
                None => {}
            }
        }
    }

    /// Handles one completion; `len` is the received length for receives.
    pub(super) fn complete(
        &self,
        c: &Connected,
        i: usize,
        ctx: *mut c_void,
        len: usize,
        error: Option<String>,
    ) {
        self.complete_copied(c, i, ctx, len, error, Landed::default(), None)
    }

    /// [`Transport::complete`]; `landed`: what [`Transport::copy_in_batch`] did for a received
    /// staged message (payload in place, waiting context claimed); `amos`: this CQ read's batch of
    /// AMO words.
    #[allow(clippy::too_many_arguments)]
    fn complete_copied(
        &self,
        c: &Connected,
        i: usize,
        ctx: *mut c_void,
        len: usize,
        error: Option<String>,
        landed: Landed,
        amos: Option<&mut super::amo::AmoBatch<'_>>,
    ) {
        let e = &c.eps[i];
        let Some((tag, data)) = e.ctxs.get(ctx) else {
            tracing::warn!("endpoint {i}: completion with a foreign context {ctx:p}");
            return;
        };
        // A provider error names the peer of the operation: it may be gone.
        let peer = match tag {
            TAG_OP => e.peer_of(ctx),
            TAG_AM_SEND if data != 0 => e.ctxs.by_token(data).and_then(|w| e.peer_of(w)),
            _ => None,
        };
        if let (Some(pe), Some(msg)) = (peer, &error) {
            self.suspect(c, pe, msg);
        }
        match tag {
            TAG_OP => {
                if let Some(msg) = &error {
                    tracing::error!("endpoint {i}: operation failed: {msg}");
                }
                e.finish_op(ctx, error);
            }
            TAG_AM_SEND => {
                if let Some(msg) = error {
                    // A request that never left fails its waiting operation; a lost response
                    // leaves the initiator's quiet to time out and report.
                    tracing::error!("endpoint {i}: active message send failed: {msg}");
                    self.fail_am_wait(e, data, msg);
                }
                e.ctxs.free(ctx);
            }
            TAG_AM_RECV => {
                if let Some(msg) = error {
                    tracing::error!("endpoint {i}: active message receive failed: {msg}");
                } else {
                    self.handle_am(c, i, data as usize, len, landed, amos);
                }
                // Repost the same buffer with the same context.
                if let Err(err) = e.post_am_recv(data as usize, ctx) {
                    tracing::error!("endpoint {i}: could not repost an AM receive buffer: {err}");
                    e.ctxs.free(ctx);
                }
            }
            TAG_SLOT_SEND => {
                // SAFETY: own context; send_slot wrote scratch[0..4]: the waiting context's token
                // (or 0),
                // the post time, the trace flag, the remote address.
                let (wait, stamp, traced, addr) = e
                    .ctxs
                    .scratch(ctx)
                    .map(|s| unsafe { (*s, *s.add(1), *s.add(2) != 0, *s.add(3)) })
                    .unwrap_or_default();
                let stats = self.mover.stats();
                stats.record_since(Stage::SendDone, stamp, 0);
                if traced {
                    stats.timeline(Stage::SendDone, "", wait, addr, 0);
                }
                if let Some(msg) = error {
                    tracing::error!("endpoint {i}: staged send failed: {msg}");
                    // SAFETY: the slot stays reserved until it is freed below; send_slot wrote
                    // the header at its start.
                    let hdr = unsafe {
                        std::ptr::read_unaligned(e.send_slot_ptr(data as usize) as *const AmMsg)
                    };
                    self.fail_staged(e, data as usize, &hdr, wait, msg);
                }
                e.send_free.lock().push(data as usize);
                e.ctxs.free(ctx);
            }
            TAG_PROBE => {
                if let Some(msg) = error {
                    tracing::debug!("endpoint {i}: lane probe failed: {msg}");
                }
                e.ctxs.free(ctx);
            }
            TAG_AM_WAIT => {
                // Completed by a response (handle_am), never by the CQ.
                tracing::warn!("endpoint {i}: unexpected CQ completion for a waiting AMO");
            }
            _ => {
                tracing::warn!("endpoint {i}: completion with unknown tag {tag}");
                e.ctxs.free(ctx);
            }
        }
    }

    /// Fails the waiting context of token `wait` with `msg` (quiet reports it); a token of 0 (a
    /// send that had no waiter) or of a context no longer waiting (released when its peer was
    /// declared gone, or answered) is left alone.
    pub(super) fn fail_am_wait(&self, e: &EpState, wait: u64, msg: String) {
        if wait != 0 {
            e.finish_wait(wait, Some(msg), "a failed message");
        }
    }
}

/// The segments `[start, end)` of `n` completions that are handled together: a completion for
/// which `fenced` holds starts a segment (everything before it is applied in full first). An
/// iterator, so a CQ read allocates nothing for it.
fn fence_segments(
    n: usize,
    fenced: impl Fn(usize) -> bool,
) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= n {
            return None;
        }
        let end = (start + 1..n).find(|&k| fenced(k)).unwrap_or(n);
        let segment = (start, end);
        start = end;
        Some(segment)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_that_carries_a_fence_starts_a_segment() {
        let at = |f: &'static [usize]| move |k: usize| f.contains(&k);
        assert_eq!(fence_segments(6, at(&[])).collect::<Vec<_>>(), [(0, 6)]);
        assert_eq!(
            fence_segments(6, at(&[2, 3])).collect::<Vec<_>>(),
            [(0, 2), (2, 3), (3, 6)]
        );
        // The first one needs no split (the CQ reads before it were handled in full).
        assert_eq!(
            fence_segments(3, at(&[0, 2])).collect::<Vec<_>>(),
            [(0, 2), (2, 3)]
        );
        assert_eq!(fence_segments(0, at(&[0])).count(), 0);
    }

    #[test]
    fn panic_messages_are_read_from_both_payload_kinds() {
        let literal = catch_unwind(|| panic!("literal")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), "literal");
        let formatted = catch_unwind(|| panic!("formatted {}", 7)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), "formatted 7");
        let other = catch_unwind(|| std::panic::panic_any(7u32)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
