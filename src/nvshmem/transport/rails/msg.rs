//! Atomics over an extra rail: target-applied AMO messages.
//!
//! A peer whose rail 0 failed has its atomics carried by an extra rail ([`super::primary`]). There
//! they go as messages, as target-applied AMOs go on rail 0: a request (op, size, address,
//! operands, the initiator's waiting context as token) sent to the peer's endpoint on that rail,
//! applied by the target's progress under the same lock as every other target-applied AMO
//! (`Transport::apply_local_amo`), answered on the same rail with the old value and a status. The
//! waiting context is one of the rail's operations (counted per endpoint and PE, in its
//! completion group), so quiet and blocking calls wait for it, and the rail's failure ends it
//! with an error like any operation in flight there. A request is never sent twice.
//!
//! Every extra rail keeps [`RECVS`] receives posted (64-byte buffers: their contexts' scratch).
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::abi::{amo, AmoMemdesc};
use super::super::group;
use super::super::memory::write_any;
use super::super::wire::{AmMsg, AM_REQ, AM_RESP};
use super::super::{internal, Connected, TResult, Transport};
use super::{Rail, RailLink, RailOp};
use crate::fabric::{Endpoint, FiAddr};

/// Magic of a rail AMO message ("RLAM").
const RAIL_AM_MAGIC: u32 = u32::from_le_bytes(*b"RLAM");
/// Receives each extra rail keeps posted.
pub(super) const RECVS: usize = 64;
/// Context tags of an extra rail: an RMA piece, an AMO waiting for its answer, a send (data: the
/// waiting context, 0 for an answer), a receive.
pub(super) const TAG_RMA: u64 = 0;
pub(super) const TAG_WAIT: u64 = 1;
pub(super) const TAG_SEND: u64 = 2;
pub(super) const TAG_RECV: u64 = 3;
const MSG_BYTES: usize = std::mem::size_of::<AmMsg>();
/// A probe (`val`: its send time, nanoseconds after the rails' epoch; `result`: the sender PE),
/// and its answer (the same `val`; `result`: the answering PE).
const RAIL_PING: u32 = 10;
const RAIL_PONG: u32 = 11;
const _: () = assert!(MSG_BYTES <= 64, "a message fits a context's scratch");

impl Transport {
    /// Posts the receives of extra rail `r` on its endpoint `ep` (at connect; `desc`: the
    /// contexts' registration, or null).
    pub(super) fn rail_post_recvs(
        &self,
        r: &Rail,
        ep: &Endpoint,
        desc: *mut c_void,
    ) -> TResult<()> {
        for _ in 0..RECVS {
            let ctx = r
                .ctxs
                .alloc(TAG_RECV, 0)
                .ok_or_else(|| internal("rail receives: no free context"))?;
            if let Err(e) = rail_recv(r, ep, desc, ctx) {
                r.ctxs.free(ctx);
                return Err(internal(format!(
                    "rail {} ({}): posting a receive: {e}",
                    r.index, r.name
                )));
            }
        }
        Ok(())
    }

    /// One AMO to `pe` over extra rail `k`: `false` when the rail has failed (nothing was sent).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rail_amo(
        &self,
        c: &Connected,
        k: usize,
        pe: usize,
        opc: i32,
        t: &AmoMemdesc,
        val: u64,
        size: u64,
        ep: usize,
    ) -> TResult<bool> {
        let r = &self.rails.extra[k - 1];
        let retptr = if opc > amo::END_OF_NONFETCH {
            t.retptr as u64
        } else {
            0
        };
        let failure = {
            let guard = r.link.read();
            let Some(link) = guard.as_ref() else {
                return Ok(false);
            };
            let Some(dest) = link.addrs.get(pe).copied().flatten() else {
                return Ok(false);
            };
            let Some(wait) = r.ctxs.alloc(TAG_WAIT, 0) else {
                return Err(internal(format!(
                    "amo to PE {pe} over rail {k}: no free context"
                )));
            };
            let group = group::current();
            if let Some(g) = &group {
                g.pending.fetch_add(1, Ordering::AcqRel);
            }
            let slot = ep * c.n_pes as usize + pe;
            r.ops.lock().insert(
                wait as usize,
                RailOp {
                    ep,
                    pe,
                    group,
                    posted: Instant::now(),
                    peer_done: self.peer_progress(c, pe, k),
                    amo: Some((retptr, size as u32)),
                },
            );
            let counts = r.counts.get().expect("counts set at connect");
            counts[slot].0.fetch_add(1, Ordering::AcqRel);
            let msg = AmMsg {
                magic: RAIL_AM_MAGIC,
                kind: AM_REQ,
                token: wait as u64,
                op: opc,
                size: size as u32,
                addr: t.remote.ptr as u64,
                val,
                cmp: t.cmp,
                result: c.my_pe as u64,
                status: 0,
                reserved: 0,
            };
            match self.rail_send(c, r, link, dest, msg, wait as u64) {
                Ok(()) => {
                    r.n_amos.fetch_add(1, Ordering::Relaxed);
                    return Ok(true);
                }
                Err(e) => {
                    // Never sent: taken back; the rail fails and the AMO waits for the move.
                    if let Some(op) = r.ops.lock().remove(&(wait as usize)) {
                        if let Some(g) = op.group {
                            g.pending.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    counts[slot].0.fetch_sub(1, Ordering::AcqRel);
                    r.ctxs.free(wait);
                    e
                }
            }
        };
        self.fail_rail(c, r, failure);
        Ok(false)
    }

    /// Sends `msg` to `dest` on rail `r` from a context of its own (its scratch holds the
    /// message); `wait` is the waiting context it serves (0: an answer). Waits for room up to the
    /// rail timeout, reading the rail's completions meanwhile. `Err`: why the rail fails.
    fn rail_send(
        &self,
        c: &Connected,
        r: &Rail,
        link: &RailLink,
        dest: FiAddr,
        msg: AmMsg,
        wait: u64,
    ) -> Result<(), String> {
        let ctx = r
            .ctxs
            .alloc(TAG_SEND, wait)
            .ok_or_else(|| "no free context for a message".to_string())?;
        let buf = r.ctxs.scratch(ctx).expect("own context") as *mut u8;
        // SAFETY: the scratch is 64 bytes of this context, which stays ours until its completion.
        unsafe { std::ptr::write_unaligned(buf as *mut AmMsg, msg) };
        let deadline = Instant::now() + self.rails.cfg.timeout;
        loop {
            // SAFETY: the buffer is the context's scratch (registered with the pool's region
            // where the provider needs local registration), valid until the completion.
            match unsafe { link.ep.send(buf, MSG_BYTES, link.ctx_desc(), dest, ctx) } {
                Ok(()) => return Ok(()),
                Err(e) if e.is_again() && Instant::now() < deadline => {
                    self.rail_reap(c, r, link);
                }
                Err(e) => {
                    r.ctxs.free(ctx);
                    return Err(format!("sending a message failed: {e}"));
                }
            }
        }
    }

    /// A receive on rail `r` completed with `len` bytes: a request is applied and answered, an
    /// answer completes its AMO; the receive is posted again.
    pub(super) fn rail_msg(
        &self,
        c: &Connected,
        r: &Rail,
        link: &RailLink,
        ctx: *mut c_void,
        len: usize,
    ) {
        let buf = r.ctxs.scratch(ctx).expect("own context") as *const AmMsg;
        // SAFETY: the receive completed: the provider is done writing the scratch.
        let m = unsafe { std::ptr::read_unaligned(buf) };
        if len < MSG_BYTES || m.magic != RAIL_AM_MAGIC {
            tracing::error!(
                "rail {} ({}): a message of {len} bytes that is no rail AMO (magic {:#x}) dropped",
                r.index,
                r.name,
                m.magic
            );
        } else if m.kind == AM_REQ {
            let src = m.result as usize;
            let (old, status) = match self.apply_local_amo(m.op, m.size, m.addr, m.val, m.cmp, None)
            {
                Ok(v) => (v, 0),
                Err(e) => (0, e.status),
            };
            match link.addrs.get(src).copied().flatten() {
                Some(dest) => {
                    let resp = AmMsg {
                        kind: AM_RESP,
                        token: m.token,
                        result: old,
                        status,
                        ..m
                    };
                    if let Err(why) = self.rail_send(c, r, link, dest, resp, 0) {
                        tracing::error!(
                            "rail {} ({}): the answer to PE {src}'s AMO not sent: {why}",
                            r.index,
                            r.name
                        );
                    }
                }
                None => tracing::error!(
                    "rail {} ({}): AMO request from PE {src}, which has no endpoint here, applied without answer",
                    r.index,
                    r.name
                ),
            }
        } else if m.kind == AM_RESP {
            self.rail_answer(c, r, &m);
        } else if m.kind == RAIL_PING {
            let src = m.result as usize;
            if let Some(dest) = link.addrs.get(src).copied().flatten() {
                let pong = AmMsg {
                    kind: RAIL_PONG,
                    result: c.my_pe as u64,
                    ..m
                };
                if let Err(why) = self.rail_send(c, r, link, dest, pong, 0) {
                    tracing::debug!(
                        "rail {} ({}): probe answer to PE {src} not sent: {why}",
                        r.index,
                        r.name
                    );
                }
            }
        } else if m.kind == RAIL_PONG {
            let sent = self.rails.epoch + std::time::Duration::from_nanos(m.val);
            self.pong(m.result as usize, sent);
        }
        if let Err(e) = rail_recv(r, &link.ep, link.ctx_desc(), ctx) {
            tracing::warn!(
                "rail {} ({}): a receive not posted again: {e}",
                r.index,
                r.name
            );
            r.ctxs.free(ctx);
        }
    }

    /// Sends a probe to `pe` over extra rail `k`, stamped `sent`; whether it went.
    pub(super) fn rail_ping(&self, c: &Connected, k: usize, pe: usize, sent: Instant) -> bool {
        let r = &self.rails.extra[k - 1];
        let guard = r.link.read();
        let Some(link) = guard.as_ref() else {
            return false;
        };
        let Some(dest) = link.addrs.get(pe).copied().flatten() else {
            return false;
        };
        let msg = AmMsg {
            magic: RAIL_AM_MAGIC,
            kind: RAIL_PING,
            val: sent.saturating_duration_since(self.rails.epoch).as_nanos() as u64,
            result: c.my_pe as u64,
            ..Default::default()
        };
        match self.rail_send(c, r, link, dest, msg, 0) {
            Ok(()) => true,
            Err(why) => {
                tracing::debug!("rail {k} ({}): probe to PE {pe} not sent: {why}", r.name);
                false
            }
        }
    }

    /// The answer `m` to one of this PE's AMOs on rail `r`.
    fn rail_answer(&self, c: &Connected, r: &Rail, m: &AmMsg) {
        let wait = m.token as *mut c_void;
        if r.ctxs.get(wait).map(|x| x.0) != Some(TAG_WAIT) {
            tracing::error!(
                "rail {} ({}): an AMO answer for a context that is not waiting",
                r.index,
                r.name
            );
            return;
        }
        let Some((retptr, size)) = r.ops.lock().get(&(wait as usize)).and_then(|o| o.amo) else {
            // Ended already (the rail failed): its caller has the error.
            return;
        };
        let mut error = None;
        if m.status != 0 {
            error = Some(format!(
                "rail {} ({}): remote AMO failed with status {}",
                r.index, r.name, m.status
            ));
        } else if retptr != 0 {
            let bytes = m.result.to_le_bytes();
            if let Err(e) = write_any(retptr as *mut u8, &bytes[..(size as usize).min(8)]) {
                error = Some(e.message);
            }
        }
        self.rail_finish(c, r, wait, error);
    }
}

/// Posts a receive into `ctx`'s scratch on rail `r`'s endpoint `ep`.
fn rail_recv(
    r: &Rail,
    ep: &Endpoint,
    desc: *mut c_void,
    ctx: *mut c_void,
) -> crate::fabric::Result<()> {
    let buf = r.ctxs.scratch(ctx).expect("own context") as *mut u8;
    // SAFETY: 64 bytes of scratch of a context of this rail (registered with `desc` where the
    // provider needs it), ours until the receive completes or the endpoint is closed.
    unsafe { ep.recv(buf, MSG_BYTES, desc, ctx) }
}
