//! Atomics: provider atomics and target-applied AMOs (requests applied in the target's progress path).
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use super::abi::{self, amo, AmoMemdesc};
use super::am::{AmMsg, AM_MAGIC, AM_REQ};
use super::endpoints::{EpState, OpRoute, TAG_AM_SEND, TAG_AM_WAIT};
use super::memory::is_device;
use super::provider_ops::{provider_op, ProviderAmo};
use super::{internal, invalid, Connected, TResult, Transport};
use crate::config::AtomicsPath;
use crate::cuda;
use crate::fabric::Provider;
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
        let c = self.conn()?;
        self.check_pe(c, pe)?;
        if target.is_null() {
            return Err(invalid("amo: null descriptor"));
        }
        // SAFETY: non-null descriptor from NVSHMEM.
        let t = unsafe { *target };
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
        let fetch = verb.op > amo::END_OF_NONFETCH;
        let known = matches!(verb.op, amo::INC..=amo::SIGNAL_ADD | amo::FETCH..=amo::COMPARE_SWAP);
        if !known {
            return Err(invalid(format!("amo: unsupported op {}", verb.op)));
        }
        if fetch && t.retptr.is_null() {
            return Err(invalid(format!(
                "amo: fetching op {} without retptr",
                verb.op
            )));
        }
        if fetch && (t.retptr as u64).checked_add(size).is_none() {
            return Err(invalid(format!(
                "amo: retptr {:p} + {size} bytes wraps around the address space",
                t.retptr
            )));
        }
        let (raddr, key) = self.remote_target(&t.remote, size, ep, "amo")?;
        tracing::trace!(
            "amo: pe {pe} op {} {size} bytes at {:p}, endpoint {ep}",
            verb.op,
            t.remote.ptr
        );
        // A signal to same-host GPU memory goes behind the same-host puts on the copy queue.
        if matches!(verb.op, amo::SIGNAL | amo::SIGNAL_SET)
            && self.signal_by_copy(c, pe, &t, size, ep)?
        {
            return Ok(());
        }
        // Puts carried by same-host copies on this endpoint land before an AMO that may signal them
        // (put-with-signal, barriers, flags): the AMO travels another way, so it waits for them.
        self.wait_copies(ep, "amo: earlier puts")?;
        let val = match verb.op {
            amo::INC | amo::FETCH_INC => 1,
            _ => t.val,
        };
        if self.use_provider_atomics {
            if let Some(pop) = provider_op(verb.op, elembytes) {
                let (a, f, cmp) = c.eps[ep].ep.atomic_valid(pop.datatype, pop.op);
                let ok = if verb.op == amo::COMPARE_SWAP {
                    cmp
                } else if fetch || self.provider == Provider::Shm {
                    f
                } else {
                    a
                };
                if ok {
                    return self.amo_provider(c, pe, verb.op, pop, &t, val, raddr, key, size, ep);
                }
                if self.cfg.atomics == AtomicsPath::Provider {
                    return Err(invalid(format!(
                        "amo: provider {} cannot do op {} on {size}-byte values",
                        self.provider, verb.op
                    )));
                }
            }
        }
        self.amo_target(c, pe, verb.op, &t, val, size, ep)
    }

    /// A signal (`SIGNAL`, `SIGNAL_SET`) to same-host GPU memory that this process has open
    /// through CUDA IPC: one 4- or 8-byte write enqueued on endpoint `ep`'s copy queue, behind the
    /// copies enqueued before it. Stream order lands this endpoint's earlier same-host puts first,
    /// so neither a wait for them nor the provider's atomic is needed. The write is aligned (checked
    /// by `amo`) and done in one transaction. The GPU's own atomics on the word stay atomic
    /// against it. A provider ADD from another PE at the same moment may not, because the
    /// provider applies it as a read-modify-write from the host; that is already so for the
    /// GPU's own atomics. Complete at the endpoint's next quiet, like the provider's AMO.
    /// `Ok(false)` when another means must carry it: `NVSHMEM_EFA_SIGNAL_COPY=0`, IPC off, not
    /// such memory, or provider operations to `pe` still outstanding on `ep`, which the signal
    /// must not overtake.
    fn signal_by_copy(
        &self,
        c: &Connected,
        pe: i32,
        t: &AmoMemdesc,
        size: u64,
        ep: usize,
    ) -> TResult<bool> {
        if !self.cfg.signal_copy || !self.mover.policy().ipc {
            return Ok(false);
        }
        let a = &c.eps[ep].peer[pe as usize];
        if a.completed.load(Ordering::Acquire) < a.submitted.load(Ordering::Acquire) {
            return Ok(false);
        }
        let b = self.remote_blob(&t.remote, size, "signal")?;
        let Some(desc) = self.remote_ipc(&t.remote, &b, "signal")? else {
            return Ok(false);
        };
        let bytes = t.val.to_le_bytes();
        // SAFETY: `bytes` lives through the call and an unregistered host source of at most
        // INLINE_BYTES is taken at once (the inline ring); the remote range was checked against
        // the peer's registration by `remote_target`.
        let done = unsafe {
            self.mover.transfer(
                ep,
                pe,
                true,
                bytes.as_ptr() as u64,
                Kind::Host,
                false,
                &desc,
                t.remote.ptr as u64,
                size,
            )
        }
        .map_err(|e| internal(format!("signal to PE {pe} through CUDA IPC: {e}")))?;
        if done {
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
        let shm_fetch_workaround = self.provider == Provider::Shm && !fetch;
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
        let e = &c.eps[ep];
        let retptr = if opc > amo::END_OF_NONFETCH {
            t.retptr as u64
        } else {
            0
        };
        let wait = self.alloc_for_peer(c, OpRoute::new(ep, pe as usize, TAG_AM_WAIT, retptr))?;
        // SAFETY: own context; scratch[0] keeps the operand size for the response handler.
        unsafe { *e.ctxs.scratch(wait).expect("own context") = size };
        let msg = AmMsg {
            magic: AM_MAGIC,
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
        let dest = c.addr(pe, ep);
        let ep_addr = e as *const EpState as usize;
        let r = self.post_deferrable(
            c,
            OpRoute::new(ep, pe as usize, TAG_AM_SEND, wait as u64),
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
        let _g = self.am_lock.lock();
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
