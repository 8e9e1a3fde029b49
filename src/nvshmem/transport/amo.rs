//! Atomics: provider atomics and target-applied AMOs (requests applied in the target's progress path).
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::abi::{self, amo, AmoMemdesc, MemHandle, RmaMemdesc};
use super::endpoints::TAG_AM_RECV;
use super::endpoints::{EpState, OpRoute, TAG_AM_SEND};
use super::fence::Via;
use super::memory::is_device;
use super::provider_ops::{provider_op, ProviderAmo};
use super::rails::RailAmo;
use super::wire::{AmMsg, AM_MAGIC, AM_REQ};
use super::{internal, invalid, Connected, TResult, Transport};
use crate::config::AtomicsPath;
use crate::cuda;
use crate::cuda::kernel::AmoOp;
use crate::fabric::CqEntry;
use crate::mover::amo::{AmoRequest, Launch};
use crate::mover::handle::IpcDesc;
use crate::mover::Kind;

impl Transport {
    /// `amo`: every NVSHMEM atomic, 4 and 8 bytes. Fetch results land in `retptr` by quiet.
    ///
    /// # Safety
    /// `target` must be null or a valid descriptor; `retptr` must stay valid until quiet.
    pub unsafe fn amo(
        &self,
        pe: i32,
        verb: abi::AmoVerb,
        target: *mut AmoMemdesc,
        elembytes: i32,
        ep: usize,
    ) -> TResult<()> {
        if target.is_null() {
            return Err(invalid("amo: null descriptor"));
        }
        // SAFETY: non-null descriptor from NVSHMEM.
        let t = unsafe { *target };
        self.amo_desc(pe, verb.op, &t, elembytes, ep, true)
    }

    /// [`Transport::amo`] on a descriptor read already. `fast`: same-host GPU memory may take the
    /// copy queue (signals) or the atomic kernel; without, the atomic goes the provider's or the
    /// target's way (an atomic the host took over from a kernel that did not start).
    fn amo_desc(
        &self,
        pe: i32,
        opc: i32,
        t: &AmoMemdesc,
        elembytes: i32,
        ep: usize,
        fast: bool,
    ) -> TResult<()> {
        let c = self.conn()?;
        self.check_pe(c, pe)?;
        if elembytes != 4 && elembytes != 8 {
            return Err(invalid(format!("amo: size {elembytes} (4 or 8)")));
        }
        let size = elembytes as u64;
        if t.remote.ptr as u64 % size != 0 {
            return Err(invalid(format!(
                "amo: remote address {:p} is not aligned to the {size}-byte operand",
                t.remote.ptr
            )));
        }
        let fetch = opc > amo::END_OF_NONFETCH;
        let known = matches!(opc, amo::INC..=amo::SIGNAL_ADD | amo::FETCH..=amo::COMPARE_SWAP);
        if !known {
            return Err(invalid(format!("amo: unsupported op {}", opc)));
        }
        if fetch && t.retptr.is_null() {
            return Err(invalid(format!("amo: fetching op {} without retptr", opc)));
        }
        if fetch && (t.retptr as u64).checked_add(size).is_none() {
            return Err(invalid(format!(
                "amo: retptr {:p} + {size} bytes wraps around the address space",
                t.retptr
            )));
        }
        let b = self.remote_blob(&t.remote, size, "amo")?;
        let (raddr, key) = self.provider_target(&t.remote, &b, ep);
        tracing::trace!(
            "amo: pe {pe} op {} {size} bytes at {:p}, endpoint {ep}",
            opc,
            t.remote.ptr
        );
        let val = match opc {
            amo::INC | amo::FETCH_INC => 1,
            _ => t.val,
        };
        if fast {
            // A signal to same-host GPU memory goes behind the same-host puts on the copy queue;
            // another atomic to it (with kernel atomics on) is a kernel ordered after them. A
            // signal does not take the copy queue while kernel atomics are pending: it would pass
            // them.
            let by_copy = matches!(opc, amo::SIGNAL | amo::SIGNAL_SET)
                && self.cfg.signal_copy
                && self.mover.policy().ipc
                && self.mover.amos().in_flight(ep) == 0;
            if by_copy || self.mover.amos().on() {
                // One read of the handle's IPC section serves both routes.
                if let Some(desc) = self.remote_ipc(&t.remote, &b, "amo")? {
                    if by_copy && self.signal_by_copy(c, pe, t, &desc, size, ep)? {
                        return Ok(());
                    }
                    if self.amo_by_kernel(c, pe, opc, t, &desc, val, size, ep)? {
                        return Ok(());
                    }
                }
            }
        }
        // Atomics stay in the order they were issued on an endpoint: kernel atomics still
        // pending are decided (and those taken over posted) before this one goes another way.
        if self.mover.amos().in_flight(ep) > 0 {
            self.settle_kernel_amos(ep, Some(Instant::now() + self.cfg.quiet_timeout))?;
        }
        // Puts carried by same-host copies on this endpoint land before an AMO that may signal them
        // (put-with-signal, barriers, flags): the AMO travels another way, so it follows them. A
        // non-fetching AMO on the staged path rides a message that leaves once they are complete
        // (the outbox waits, not this thread); any other way waits for them here.
        let staged = !fetch
            && super::group::current().is_none()
            && !self.rails.active()
            && !self.route.provider_atomics;
        let after_copies = self.mover.outstanding(ep) > 0;
        if after_copies && !staged {
            self.wait_copies(ep, "amo: earlier puts")?;
        }
        // With rails, one rail at a time carries a peer's atomics (rail 0 until it fails towards
        // the peer): posted there already, or the transport's ways below under the peer's gate.
        let _gate = match self.rails_amo(c, pe as usize, opc, t, val, size, ep)? {
            RailAmo::Done => return Ok(()),
            RailAmo::Primary(g) => g,
        };
        if self.route.provider_atomics {
            if let Some(pop) = provider_op(opc, elembytes) {
                let (a, f, cmp) = c.eps[ep].ep.atomic_valid(pop.datatype, pop.op);
                let ok = if opc == amo::COMPARE_SWAP {
                    cmp
                } else if fetch || self.route.caps.nonfetch_atomics_as_fetch {
                    f
                } else {
                    a
                };
                if ok {
                    return self.amo_provider(c, pe, opc, pop, t, val, raddr, key, size, ep);
                }
                if self.cfg.atomics == AtomicsPath::Provider {
                    return Err(invalid(format!(
                        "amo: provider {} cannot do op {} on {size}-byte values",
                        self.provider, opc
                    )));
                }
            }
        }
        // A non-fetching AMO outside a blocking call shares its peer's open staged message.
        if !fetch && super::group::current().is_none() {
            let raddr = t.remote.ptr as u64;
            let follow = after_copies && staged;
            return self.stage_amo(c, pe as usize, ep, opc, raddr, val, size as u32, follow);
        }
        self.amo_target(c, pe, opc, t, val, size, ep)
    }

    /// An atomic to same-host GPU memory open here through CUDA IPC, as one launch of the mover's
    /// atomic kernel ([`crate::mover::amo`]) ordered after the endpoint's copies; a fetched value
    /// lands at `retptr` by the quiet that settles it. Complete at the endpoint's next quiet, which
    /// first settles it: applied by the kernel, or taken over by the host (the kernel did not start
    /// within `NVSHMEM_EFA_AMO_KERNEL_STUCK_US`) and carried the provider's way then. Provider
    /// operations to `pe` still outstanding on `ep` are waited for first (the kernel must not
    /// pass them). `desc` is the peer's export from the handle. `Ok(false)` when another means
    /// must carry it: kernel atomics off, not such memory, no native atomics to it, a result
    /// buffer the kernel cannot reach, or the lane in host mode after a take-over.
    #[allow(clippy::too_many_arguments)]
    fn amo_by_kernel(
        &self,
        c: &Connected,
        pe: i32,
        opc: i32,
        t: &AmoMemdesc,
        desc: &IpcDesc,
        val: u64,
        size: u64,
        ep: usize,
    ) -> TResult<bool> {
        if !self.mover.amos().on() {
            return Ok(false);
        }
        let (op, operand) = match opc {
            amo::INC | amo::ADD | amo::SIGNAL_ADD | amo::FETCH_INC | amo::FETCH_ADD => {
                (AmoOp::Add, val)
            }
            amo::AND | amo::FETCH_AND => (AmoOp::And, val),
            amo::OR | amo::FETCH_OR => (AmoOp::Or, val),
            amo::XOR | amo::FETCH_XOR => (AmoOp::Xor, val),
            amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => (AmoOp::Set, val),
            amo::FETCH => (AmoOp::Or, 0),
            amo::COMPARE_SWAP => (AmoOp::Cas, val),
            _ => return Ok(false),
        };
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        let a = &c.eps[ep].peer[pe as usize];
        let earlier = a.submitted.load(Ordering::Acquire);
        if a.completed.load(Ordering::Acquire) < earlier {
            let completed = || a.completed.load(Ordering::Acquire);
            self.drive_until(
                c,
                ep,
                earlier,
                completed,
                deadline,
                || {},
                |n| {
                    format!(
                    "amo to PE {pe}: {n} earlier operation(s) to it on endpoint {ep} not complete \
                     after {:?}",
                    self.cfg.quiet_timeout
                )
                },
            )?;
        }
        let fetch = opc > amo::END_OF_NONFETCH;
        let req = AmoRequest {
            pe,
            op: opc,
            elembytes: size as i32,
            val: t.val,
            cmp: t.cmp,
            retptr: if fetch { t.retptr as u64 } else { 0 },
            ret_handle: t.ret_handle as u64,
            ret_by_host: false,
            remote: (t.remote.ptr as u64, t.remote.offset, t.remote.handle as u64),
            ep,
        };
        for _ in 0..3 {
            let launch = self
                .mover
                .kernel_amo(
                    ep,
                    pe,
                    desc,
                    t.remote.ptr as u64,
                    op,
                    size as u32,
                    operand,
                    req,
                )
                .map_err(|e| internal(format!("amo to PE {pe} by kernel: {e}")))?;
            match launch {
                Launch::Launched => {
                    // A fence owed is kept: the launch waited for every earlier operation to the
                    // PE (above) and follows the copy queue.
                    self.fence_gate(c, ep, pe as usize, Via::KernelAmo)?;
                    tracing::trace!("amo op {opc} of {size} bytes to PE {pe}: kernel on lane {ep}");
                    return Ok(true);
                }
                // Every slot pending: decide them (frees their slots), then try again.
                Launch::NoSlot => self.settle_kernel_amos(ep, Some(deadline))?,
                Launch::HostMode | Launch::NotHere => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Settles endpoint `ep`'s kernel atomics ([`crate::mover::amo_lanes::AmoLanes::settle`]):
    /// with `until`, waits until each is applied or taken over (quiet); without, one look that
    /// never blocks (progress). Atomics the host took over go the provider's or the target's way
    /// now, so a quiet that settles first waits for them too.
    pub(super) fn settle_kernel_amos(&self, ep: usize, until: Option<Instant>) -> TResult<()> {
        // Progress looks only when something is pending; with kernel atomics on, a quiet always
        // takes the guard, so that it waits for a take-over another thread is still handing on.
        if !self.cfg.amo_kernel || (until.is_none() && self.mover.amos().in_flight(ep) == 0) {
            return Ok(());
        }
        // Held until the taken-over atomics are posted: a quiet in another thread waits here for
        // them, and then counts them among the operations it waits for.
        let Some(_carry) = self.mover.amos().carry(ep, until.is_some()) else {
            return Ok(());
        };
        let settled = self
            .mover
            .amos()
            .settle(ep, until)
            .map_err(|e| internal(format!("kernel atomics on endpoint {ep}: {e}")))?;
        for (r, v) in settled.results {
            // SAFETY: a fetch's result buffer in host memory, valid until quiet (NVSHMEM's
            // contract for retptr), `elembytes` long; written unaligned-safe.
            unsafe {
                if r.elembytes == 4 {
                    std::ptr::write_unaligned(r.retptr as *mut u32, v as u32);
                } else {
                    std::ptr::write_unaligned(r.retptr as *mut u64, v);
                }
            }
        }
        // Every taken-over atomic is posted even when one of them fails; the first error is
        // returned after the rest are on their way.
        let mut first_err = None;
        for r in settled.take_over {
            let t = AmoMemdesc {
                remote: RmaMemdesc {
                    ptr: r.remote.0 as *mut c_void,
                    offset: r.remote.1,
                    handle: r.remote.2 as *mut MemHandle,
                },
                retflag: 0,
                retptr: r.retptr as *mut c_void,
                valptr: std::ptr::null_mut(),
                cmpptr: std::ptr::null_mut(),
                val: r.val,
                cmp: r.cmp,
                ret_handle: r.ret_handle as *mut MemHandle,
            };
            tracing::debug!(
                "amo op {} to PE {}: taken over from its kernel, carried another way",
                r.op,
                r.pe
            );
            if let Err(e) = self.amo_desc(r.pe, r.op, &t, r.elembytes, r.ep, false) {
                tracing::error!(
                    "amo op {} to PE {}, taken over from its kernel: {}",
                    r.op,
                    r.pe,
                    e.message
                );
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A signal (`SIGNAL`, `SIGNAL_SET`) to same-host GPU memory that this process has open
    /// through CUDA IPC: one 4- or 8-byte write enqueued on endpoint `ep`'s copy queue, behind the
    /// copies enqueued before it. Stream order lands this endpoint's earlier same-host puts first,
    /// so neither a wait for them nor the provider's atomic is needed. The write is aligned (checked
    /// by `amo`) and done in one transaction. The GPU's own atomics on the word stay atomic
    /// against it. A provider ADD from another PE at the same moment may not, because the
    /// provider applies it as a read-modify-write from the host; that is already so for the
    /// GPU's own atomics. Complete at the endpoint's next quiet, like the provider's AMO.
    /// `desc` is the peer's export from the handle; `amo` calls this only with
    /// `NVSHMEM_EFA_SIGNAL_COPY` and IPC on. `Ok(false)` when another means must carry it: not
    /// such memory, or provider operations to `pe` still outstanding on `ep`, which the signal
    /// must not overtake.
    fn signal_by_copy(
        &self,
        c: &Connected,
        pe: i32,
        t: &AmoMemdesc,
        desc: &IpcDesc,
        size: u64,
        ep: usize,
    ) -> TResult<bool> {
        let a = &c.eps[ep].peer[pe as usize];
        if a.completed.load(Ordering::Acquire) < a.submitted.load(Ordering::Acquire) {
            return Ok(false);
        }
        // The puts held back for one submission go first: the signal is stream-ordered after them
        // (copies of one submission are not ordered among themselves).
        self.mover
            .flush(ep)
            .map_err(|e| internal(format!("signal to PE {pe}: earlier puts: {e}")))?;
        let bytes = t.val.to_le_bytes();
        // SAFETY: `bytes` lives through the call and an unregistered host source of at most
        // INLINE_BYTES is taken at once (the inline ring); the remote range was checked against
        // the peer's registration by `remote_blob` (in `amo`).
        let done = unsafe {
            self.mover.transfer(
                ep,
                pe,
                true,
                bytes.as_ptr() as u64,
                Kind::Host,
                false,
                desc,
                t.remote.ptr as u64,
                size,
            )
        }
        .map_err(|e| internal(format!("signal to PE {pe} through CUDA IPC: {e}")))?;
        if done {
            // A fence owed is kept: nothing to the PE was outstanding but the copy queue, which
            // orders the signal after its copies.
            self.fence_gate(c, ep, pe as usize, Via::CopyQueue)?;
            tracing::trace!("signal of {size} bytes to PE {pe}: enqueued on copy queue {ep}");
        }
        Ok(done)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn amo_provider(
        &self,
        c: &Connected,
        pe: i32,
        opc: i32,
        pop: ProviderAmo,
        t: &AmoMemdesc,
        val: u64,
        raddr: u64,
        key: u64,
        size: u64,
        ep: usize,
    ) -> TResult<()> {
        self.fence_gate(c, ep, pe as usize, Via::Other)?;
        let dest = c.addr(pe, ep);
        let e = &c.eps[ep];
        let fetch = opc > amo::END_OF_NONFETCH;
        let (res_ptr, res_desc) = if fetch {
            let rp = t.retptr as u64;
            match self.local_desc(t.ret_handle, rp, size, ep) {
                Some((_r, d)) => (rp as *mut u8, d),
                None if !self.info.mr_local() && !is_device(t.retptr) => {
                    (rp as *mut u8, std::ptr::null_mut())
                }
                None => {
                    return Err(invalid(format!(
                        "amo: result buffer {:p} is not registered",
                        t.retptr
                    )))
                }
            }
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let (fop, dt) = (pop.op, pop.datatype);
        let shm_fetch_workaround = self.route.caps.nonfetch_atomics_as_fetch && !fetch;
        // Plain values only: the operation may wait in the peer's backlog (operands live in the
        // context's scratch, the result buffer stays valid until quiet).
        let ep_addr = e as *const EpState as usize;
        let (res_ptr, res_desc) = (res_ptr as usize, res_desc as usize);
        let cmpv = t.cmp;
        self.post_deferrable(c, OpRoute::op(ep, pe as usize), move |ctx| {
            // SAFETY: the endpoint state owns the backlog this closure may wait in, so it
            // outlives every call.
            let e = unsafe { &*(ep_addr as *const EpState) };
            let cdesc = e.ctx_desc();
            let (res_ptr, res_desc) = (res_ptr as *mut u8, res_desc as *mut c_void);
            let s = e.ctxs.scratch(ctx).expect("own context");
            // SAFETY: operands live in the context's scratch until completion; the result buffer is
            // registered (or plain host memory where the provider allows) and kept by NVSHMEM.
            unsafe {
                *s = val;
                *s.add(1) = cmpv;
            }
            let opnd = s as *const u8;
            // SAFETY: as above (operands in the scratch, result buffer kept by NVSHMEM).
            e.transmit(pe as usize, ctx, |ep| unsafe {
                if opc == amo::COMPARE_SWAP {
                    ep.compare_atomic(
                        opnd,
                        cdesc,
                        s.add(1) as *const u8,
                        cdesc,
                        res_ptr,
                        res_desc,
                        dest,
                        raddr,
                        key,
                        dt,
                        ctx,
                    )
                } else if fetch {
                    ep.fetch_atomic(
                        opnd, cdesc, res_ptr, res_desc, dest, raddr, key, dt, fop, ctx,
                    )
                } else if shm_fetch_workaround {
                    // libfabric 2.1's shm releases the inject buffer of a non-fetching atomic sent
                    // with FI_DELIVERY_COMPLETE twice (target and sender), so two later atomics share
                    // one buffer. A fetching atomic into the context's scratch space avoids that path.
                    ep.fetch_atomic(
                        opnd,
                        cdesc,
                        s.add(2) as *mut u8,
                        cdesc,
                        dest,
                        raddr,
                        key,
                        dt,
                        fop,
                        ctx,
                    )
                } else {
                    ep.atomic(opnd, cdesc, dest, raddr, key, dt, fop, ctx)
                }
            })
        })?;
        Ok(())
    }

    /// Target-applied AMO: a request message to the target's endpoint of the same index; the waiting
    /// context completes when the response (old value, status) arrives.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn amo_target(
        &self,
        c: &Connected,
        pe: i32,
        opc: i32,
        t: &AmoMemdesc,
        val: u64,
        size: u64,
        ep: usize,
    ) -> TResult<()> {
        // An AMO request is posted at once, past staged messages still in the outbox.
        self.fence_gate(c, ep, pe as usize, Via::Other)?;
        let e = &c.eps[ep];
        let retptr = if opc > amo::END_OF_NONFETCH {
            t.retptr as u64
        } else {
            0
        };
        // scratch[0] keeps the operand size for the response handler.
        let (_, wait) = self.alloc_wait(c, ep, pe as usize, retptr, &[size])?;
        let msg = AmMsg {
            magic: AM_MAGIC,
            kind: AM_REQ,
            token: wait,
            op: opc,
            size: size as u32,
            addr: t.remote.ptr as u64,
            val,
            cmp: t.cmp,
            result: c.my_pe as u64,
            status: 0,
            reserved: 0,
        };
        let dest = c.addr(pe, ep);
        let ep_addr = e as *const EpState as usize;
        let r = self.post_deferrable(
            c,
            OpRoute::new(ep, pe as usize, TAG_AM_SEND, wait),
            move |ctx| {
                // SAFETY: the endpoint state owns the backlog this closure may wait in.
                let e = unsafe { &*(ep_addr as *const EpState) };
                e.send_from_scratch(ctx, pe as usize, dest, msg)
            },
        );
        if let Err(err) = r {
            e.uncount(wait);
            return Err(err);
        }
        Ok(())
    }

    /// Applies an AMO to this PE's memory, serialised with every other target-applied AMO.
    pub(super) fn apply_local_amo(
        &self,
        opc: i32,
        size: u32,
        addr: u64,
        val: u64,
        cmp: u64,
        batch: Option<&mut AmoBatch>,
    ) -> TResult<u64> {
        if size != 4 && size != 8 {
            return Err(invalid(format!("AMO size {size} (4 or 8)")));
        }
        if addr % size as u64 != 0 {
            return Err(invalid(format!(
                "AMO address {addr:#x} not aligned to {size}"
            )));
        }
        let reg = self.find_registration(addr, size as u64).ok_or_else(|| {
            invalid(format!(
                "AMO target {addr:#x}+{size} is not in a registered region"
            ))
        })?;
        let _g = match batch {
            // The batch holds the lock from its reads to its writes.
            Some(b) => {
                if let Some(w) = b.words.iter_mut().find(|w| w.0 == addr && w.1 == size) {
                    let mask = if size == 4 { 0xffff_ffff } else { u64::MAX };
                    let old = w.2 & mask;
                    let new = compute_amo(opc, old, val & mask, cmp & mask)? & mask;
                    if new != old {
                        w.2 = new;
                        w.3 = true;
                    }
                    return Ok(old);
                }
                None
            }
            None => Some(self.am_lock.lock()),
        };
        let mut cur = [0u8; 8];
        if reg.device {
            // SAFETY: the range lies in a registration of this process.
            unsafe {
                cuda::memcpy(
                    cur.as_mut_ptr() as *mut c_void,
                    addr as *const c_void,
                    size as usize,
                )
            }
            .map_err(|e| internal(e.to_string()))?;
        } else {
            // SAFETY: as above; host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, cur.as_mut_ptr(), size as usize)
            };
        }
        let old = u64::from_le_bytes(cur);
        let mask = if size == 4 { 0xffff_ffff } else { u64::MAX };
        let new = compute_amo(opc, old & mask, val & mask, cmp & mask)? & mask;
        if new != old & mask {
            let bytes = new.to_le_bytes();
            if reg.device {
                // SAFETY: as above.
                unsafe {
                    cuda::memcpy(
                        addr as *mut c_void,
                        bytes.as_ptr() as *const c_void,
                        size as usize,
                    )
                }
                .map_err(|e| internal(e.to_string()))?;
            } else {
                // Host words are written atomically so concurrent CPU readers never see a torn value.
                // SAFETY: aligned (checked) word inside a registration.
                unsafe {
                    if size == 4 {
                        (*(addr as *const std::sync::atomic::AtomicU32))
                            .store(new as u32, Ordering::SeqCst)
                    } else {
                        (*(addr as *const AtomicU64)).store(new, Ordering::SeqCst)
                    }
                }
            }
        }
        Ok(old & mask)
    }
}

/// The target-applied AMOs among one CQ read ([`Transport::amo_batch`]): their words, those in
/// GPU memory read with one batch of copies (host words with atomic loads), with the AMO lock held
/// until [`Transport::amo_batch_end`] wrote back those that changed (GPU words: one batch again;
/// host words: atomic stores) and queued the answers. Before, each AMO into GPU memory cost two
/// synchronous driver copies (read, write) on the progress thread. Host words take the same way,
/// so that the logic runs wherever the transport's tests run.
pub(super) struct AmoBatch<'a> {
    _lock: parking_lot::MutexGuard<'a, ()>,
    /// (address, size, current value, changed, GPU memory)
    words: Vec<(u64, u32, u64, bool, bool)>,
    /// Answers held until the words are written: (destination, token, old value, status).
    pub(super) answers: Vec<(crate::fabric::FiAddr, u64, u64, i32)>,
}

impl AmoBatch<'_> {
    /// Whether the batch holds the `size`-byte word at `addr`.
    pub(super) fn holds(&self, addr: u64, size: u32) -> bool {
        self.words.iter().any(|w| w.0 == addr && w.1 == size)
    }
}

impl Transport {
    /// Reads the words that the AMO requests among the completions `ents` of endpoint `i` target
    /// (GPU words with one batch of copies); `None` when there is no AMO request among them, or the
    /// batch read failed (logged; each AMO is applied alone then).
    pub(super) fn amo_batch(
        &self,
        c: &Connected,
        i: usize,
        ents: &[CqEntry],
    ) -> Option<AmoBatch<'_>> {
        let e = &c.eps[i];
        let mut words: Vec<(u64, u32, u64, bool, bool)> = Vec::new();
        for ent in ents {
            let Some((TAG_AM_RECV, slot)) = e.ctxs.get(ent.op_context) else {
                continue;
            };
            let Some(base) = e.am_buf(slot as usize) else {
                continue;
            };
            // SAFETY: the receive completed, so the provider is done writing the slot.
            let m: AmMsg = unsafe { std::ptr::read_unaligned(base as *const AmMsg) };
            if m.magic != AM_MAGIC
                || m.kind != AM_REQ
                || !(m.size == 4 || m.size == 8)
                || m.addr % m.size as u64 != 0
                || ent.len < std::mem::size_of::<AmMsg>()
            {
                continue;
            }
            if words.iter().any(|w| w.0 == m.addr && w.1 == m.size) {
                continue;
            }
            if let Some(r) = self.find_registration(m.addr, m.size as u64) {
                words.push((m.addr, m.size, 0, false, r.device));
            }
        }
        if words.is_empty() {
            return None;
        }
        let lock = self.am_lock.lock();
        let mut vals = vec![0u64; words.len()];
        let copies: Vec<(u64, u64, usize)> = words
            .iter()
            .zip(vals.iter_mut())
            .filter(|(w, _)| w.4)
            .map(|(w, v)| (v as *mut u64 as u64, w.0, w.1 as usize))
            .collect();
        if !copies.is_empty() {
            if let Err(err) = super::memory::copy_many(&copies, true) {
                tracing::warn!(
                    "endpoint {i}: AMO words not read in one batch ({}); each alone",
                    err.message
                );
                return None;
            }
        }
        for (w, v) in words.iter_mut().zip(vals) {
            // Little-endian: a 4-byte word read into a u64 lands in its low half.
            w.2 = if w.4 { v } else { load_host_word(w.0, w.1) };
        }
        Some(AmoBatch {
            _lock: lock,
            words,
            answers: Vec::new(),
        })
    }

    /// Writes back the words of batch `b` that changed (GPU words: one batch of copies, waited
    /// for) and marks them written; the batch stays open (a fence inside a message needs what came
    /// before it in place).
    pub(super) fn amo_batch_write_back(&self, b: &mut AmoBatch<'_>) -> TResult<()> {
        for w in b.words.iter_mut().filter(|w| w.3 && !w.4) {
            store_host_word(w.0, w.1, w.2);
            w.3 = false;
        }
        let copies: Vec<(u64, u64, usize)> = b
            .words
            .iter()
            .filter(|w| w.3 && w.4)
            .map(|w| (w.0, &w.2 as *const u64 as u64, w.1 as usize))
            .collect();
        if copies.is_empty() {
            return Ok(());
        }
        let written = super::memory::copy_many(&copies, true);
        b.words.iter_mut().for_each(|w| w.3 = false);
        written
    }

    /// Writes back the words of batch `b` that changed (one batch of copies), then queues its
    /// answers on endpoint `i`; a failed write fails the answers of the AMOs it carried.
    pub(super) fn amo_batch_end(&self, c: &Connected, i: usize, mut b: AmoBatch<'_>) {
        let e = &c.eps[i];
        let mut status = 0;
        if let Err(err) = self.amo_batch_write_back(&mut b) {
            tracing::error!("endpoint {i}: AMO results not written: {}", err.message);
            status = err.status;
        }
        let AmoBatch { _lock, answers, .. } = b;
        drop(_lock);
        for (dest, token, old, st) in answers {
            e.push_response(dest, token, old, if st == 0 { status } else { st });
        }
    }
}

/// Reads an aligned host word (4 or 8 bytes) of a registration atomically.
pub(super) fn load_host_word(addr: u64, size: u32) -> u64 {
    // SAFETY: an aligned word inside a registration of this process (checked by the caller).
    unsafe {
        if size == 4 {
            (*(addr as *const std::sync::atomic::AtomicU32)).load(Ordering::SeqCst) as u64
        } else {
            (*(addr as *const AtomicU64)).load(Ordering::SeqCst)
        }
    }
}

/// Writes an aligned host word (4 or 8 bytes) of a registration atomically, so that concurrent CPU
/// readers never see a torn value.
pub(super) fn store_host_word(addr: u64, size: u32, v: u64) {
    // SAFETY: as for load_host_word.
    unsafe {
        if size == 4 {
            (*(addr as *const std::sync::atomic::AtomicU32)).store(v as u32, Ordering::SeqCst)
        } else {
            (*(addr as *const AtomicU64)).store(v, Ordering::SeqCst)
        }
    }
}

/// The new value of a target-applied AMO.
pub(crate) fn compute_amo(opc: i32, old: u64, val: u64, cmp: u64) -> TResult<u64> {
    Ok(match opc {
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => val,
        amo::INC | amo::FETCH_INC => old.wrapping_add(1),
        amo::ADD | amo::SIGNAL_ADD | amo::FETCH_ADD => old.wrapping_add(val),
        amo::AND | amo::FETCH_AND => old & val,
        amo::OR | amo::FETCH_OR => old | val,
        amo::XOR | amo::FETCH_XOR => old ^ val,
        amo::FETCH => old,
        amo::COMPARE_SWAP => {
            if old == cmp {
                val
            } else {
                old
            }
        }
        other => return Err(invalid(format!("AMO op {other} cannot be applied"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amo_arithmetic() {
        assert_eq!(compute_amo(amo::FETCH_ADD, 5, 3, 0).unwrap(), 8);
        assert_eq!(compute_amo(amo::INC, u64::MAX, 0, 0).unwrap(), 0);
        assert_eq!(compute_amo(amo::COMPARE_SWAP, 5, 9, 5).unwrap(), 9);
        assert_eq!(compute_amo(amo::COMPARE_SWAP, 5, 9, 4).unwrap(), 5);
        assert_eq!(
            compute_amo(amo::FETCH_XOR, 0b1100, 0b1010, 0).unwrap(),
            0b0110
        );
        assert_eq!(compute_amo(amo::FETCH, 7, 1, 1).unwrap(), 7);
        assert!(compute_amo(amo::ACK, 0, 0, 0).is_err());
    }
}
