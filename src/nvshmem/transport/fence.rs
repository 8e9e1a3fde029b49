//! fence: the puts and AMOs to a PE issued before it are delivered before those issued after it,
//! without waiting for them where the route keeps that order itself.
//!
//! NVSHMEM 3.4's device put-with-signal reaches the transport as `put; fence; amo`, and its
//! barriers and signals fence as well, so a fence that waits like a quiet costs each of them a
//! round trip to the target (86-117 us per put-with-signal between hosts on tcp, 29-42 us on one
//! host: results/gpu-2026-11-29b). Where the provider delivers one endpoint's sends to a peer in
//! posting order (FI_ORDER_SAS, [`crate::route::Route::ordered_fence`]) a fence is a mark instead
//! ([`Transport::fence`]): the next operation to the PE takes it ([`Transport::fence_gate`]) and
//! waits only for what its own way does not order behind the earlier ones:
//!
//! | the operation after the fence goes | it waits for | it carries |
//! |---|---|---|
//! | in a staged message (a record, a put chunk) | same-host copies of the endpoint | the fence: `REC_FENCED` / `AM_FENCED` |
//! | on the endpoint's copy queue (same-host put, signal) | the staged messages to the PE (their answers) | - |
//! | as a kernel atomic | nothing more (it waits for every earlier operation to the PE and follows the copy queue) | - |
//! | any other way (provider RMA or atomic, an AMO request, a blocking call) | everything before the fence (a quiet towards the PE) | - |
//!
//! A fence finds provider operations to the PE still outstanding (nothing orders them with
//! messages), or kernel atomics of the endpoint (the copy queue does not follow them): it waits for
//! those at once. The target applies a message that carries a fence only after every message
//! before it from that endpoint, and a fenced record only after the records before it
//! (`am::apply_records`, `progress::poll_cq`). With `NVSHMEM_EFA_FENCE=quiet`, or a provider
//! without FI_ORDER_SAS, or extra rails (which do not keep one order), a fence is a quiet towards
//! its PE, as before.
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{internal, Connected, TResult, Transport};

/// The next staged message to the PE carries the fence (messages to it were outstanding).
pub(super) const FENCE_MSG: u8 = 1;
/// Same-host copies of the endpoint were outstanding at the fence.
pub(super) const FENCE_COPY: u8 = 2;

/// The way the operation that takes a fence goes ([`Transport::fence_gate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// A staged message of the outbox (a record, a put chunk), outside a blocking call.
    Message,
    /// The endpoint's same-host copy queue.
    CopyQueue,
    /// A kernel atomic (ordered after every earlier operation by itself).
    KernelAmo,
    /// Anything else: waits for everything before the fence.
    Other,
}

impl Transport {
    /// `fence` towards PE `pe` on endpoint `ep` (`pe < 0`: every PE).
    pub fn fence(&self, ep: usize, pe: i32) -> TResult<()> {
        let Some(c) = self.conn.get() else {
            return Ok(());
        };
        if !self.route.ordered_fence || self.rails.active() {
            return self.quiet_pe(ep, pe);
        }
        self.check_alive()?;
        if pe < 0 {
            for p in 0..c.peers.len() {
                self.fence_one(c, ep, p)?;
            }
            return Ok(());
        }
        self.check_pe_range(c, pe)?;
        self.fence_one(c, ep, pe as usize)
    }

    fn fence_one(&self, c: &Connected, ep: usize, pe: usize) -> TResult<()> {
        let e = &c.eps[ep];
        let a = &e.peer[pe];
        // Provider operations to the PE: nothing orders them with what follows.
        if a.raw_out.load(Ordering::Acquire) > 0 {
            return self.quiet_pe(ep, pe as i32);
        }
        // Kernel atomics: the copy queue does not follow them (they follow it).
        if self.mover.amos().in_flight(ep) > 0 {
            self.settle_kernel_amos(ep, Some(Instant::now() + self.cfg.quiet_timeout))?;
        }
        let mut bits = 0;
        if a.busy() {
            bits |= FENCE_MSG;
        }
        if self.mover.outstanding(ep) > 0 {
            bits |= FENCE_COPY;
        }
        if bits != 0 {
            a.fence.fetch_or(bits, Ordering::AcqRel);
            tracing::trace!(
                "fence: pe {pe}, endpoint {ep}: owed by the next operation ({bits:#x})"
            );
        }
        Ok(())
    }

    /// Takes the fence owed to PE `pe` on endpoint `ep` (if any) for an operation that goes `via`:
    /// waits for what that way does not order behind the operations before the fence, and says
    /// whether the operation must carry the fence to the target (a staged message).
    pub(super) fn fence_gate(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        via: Via,
    ) -> TResult<bool> {
        let e = &c.eps[ep];
        let Some(a) = e.peer.get(pe) else {
            return Ok(false);
        };
        if a.fence.load(Ordering::Acquire) == 0 {
            return Ok(false);
        }
        let bits = a.fence.swap(0, Ordering::AcqRel);
        // A blocking call's messages may leave through another transmit lane (shm).
        let via = match via {
            Via::Message if super::group::current().is_some() => Via::Other,
            v => v,
        };
        match via {
            Via::Message => {
                if bits & FENCE_COPY != 0 {
                    self.wait_copies(ep, "fence: same-host puts before it")?;
                }
                Ok(bits & FENCE_MSG != 0)
            }
            Via::CopyQueue => {
                if bits & FENCE_MSG != 0 {
                    // The messages before the fence are answered once applied at the target.
                    self.close_peer(c, ep, pe);
                    self.post_staged(c, ep);
                    let target = a.submitted.load(Ordering::Acquire);
                    let deadline = Instant::now() + self.cfg.quiet_timeout;
                    let completed = || a.completed.load(Ordering::Acquire);
                    self.drive_until(
                        c,
                        ep,
                        target,
                        completed,
                        deadline,
                        || {},
                        |n| {
                            format!(
                            "fence: {n} operation(s) to PE {pe} on endpoint {ep} before it not \
                             complete after {:?}",
                            self.cfg.quiet_timeout
                        )
                        },
                    )?;
                }
                Ok(false)
            }
            Via::KernelAmo => Ok(false),
            Via::Other => {
                self.quiet_pe(ep, pe as i32)
                    .map_err(|err| internal(format!("fence: {}", err.message)))?;
                Ok(false)
            }
        }
    }

    /// [`Transport::fence_gate`] for a staged message that follows the endpoint's same-host copies
    /// by itself (the outbox posts it once they are complete: `Open::after_copies`): the fence to
    /// carry, and whether the message must follow the copies issued before the fence, instead of
    /// a wait here. Inside a blocking call, the wait of [`Via::Other`].
    pub(super) fn fence_gate_deferred(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
    ) -> TResult<(bool, bool)> {
        if super::group::current().is_some() {
            return self
                .fence_gate(c, ep, pe, Via::Message)
                .map(|carry| (carry, false));
        }
        let Some(a) = c.eps[ep].peer.get(pe) else {
            return Ok((false, false));
        };
        if a.fence.load(Ordering::Acquire) == 0 {
            return Ok((false, false));
        }
        let bits = a.fence.swap(0, Ordering::AcqRel);
        Ok((bits & FENCE_MSG != 0, bits & FENCE_COPY != 0))
    }

    /// Owes peer `pe` the fence again: the message that was to carry it was not queued (an error
    /// the caller returns), so the next one carries it.
    pub(super) fn fence_owed_again(&self, c: &Connected, ep: usize, pe: usize) {
        if let Some(a) = c.eps[ep].peer.get(pe) {
            a.fence.fetch_or(FENCE_MSG, Ordering::AcqRel);
        }
    }
}
