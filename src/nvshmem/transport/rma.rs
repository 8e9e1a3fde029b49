//! RMA: contiguous, strided, staged and unregistered puts and gets, and put-with-signal.
//!
//! The means per contiguous piece: same-host GPU memory through the mover's CUDA IPC copies
//! (`ipc_rma`; complete at quiet, which waits for the copy queue of the endpoint), else GPU memory
//! staged on software providers, else the provider.
use std::ffi::c_void;

use super::abi::{self, amo, op, AmoMemdesc, RmaMemdesc};
use super::endpoints::{host_slab, EpState, OpRoute};
use super::error::broken_connection;
use super::memory::{copy_any, is_device, HandleBlob, HANDLE_FLAG_DEVICE};
use super::rails::{rail_failed, RailRma};
use crate::route::Staging;
use std::sync::Arc;
use std::time::Instant;

use super::fence::Via;
use super::group::{Group, GroupScope};
use super::{internal, invalid, Connected, TResult, Transport};
use crate::mover::Kind;
use std::sync::atomic::Ordering;

pub(super) const BOUNCE_BYTES: usize = 4 << 20;

/// One contiguous piece of an RMA with PE `pe` through endpoint `ep`: `len` bytes between `local`
/// and `remote` (a put writes the remote side, a get reads it), named by NVSHMEM's descriptors
/// ([`Contig`]) or, once resolved, by addresses ([`Transfer`]).
#[derive(Clone, Copy)]
pub(super) struct Piece<A> {
    pub(super) pe: i32,
    pub(super) ep: usize,
    pub(super) is_put: bool,
    pub(super) local: A,
    pub(super) remote: A,
    pub(super) len: u64,
}

pub(super) type Contig = Piece<RmaMemdesc>;
pub(super) type Transfer = Piece<u64>;

impl Contig {
    /// The piece with its addresses resolved.
    fn resolved(&self, local: u64, remote: u64) -> Transfer {
        Piece {
            pe: self.pe,
            ep: self.ep,
            is_put: self.is_put,
            local,
            remote,
            len: self.len,
        }
    }
}

impl Transport {
    /// `rma`: put, get, P, G (strided by element), blocking or not.
    ///
    /// # Safety
    /// `remote` and `local` must be null or valid descriptors whose handles are null or 512-byte
    /// handles; the local memory must stay valid until the operation completes (quiet).
    pub unsafe fn rma(
        &self,
        pe: i32,
        verb: abi::RmaVerb,
        remote: *mut RmaMemdesc,
        local: *mut RmaMemdesc,
        bytes: abi::RmaBytesdesc,
        ep: usize,
    ) -> TResult<()> {
        let c = self.conn()?;
        if remote.is_null() || local.is_null() {
            return Err(invalid("rma: null memory descriptor"));
        }
        // SAFETY: non-null descriptors from NVSHMEM, valid for the call.
        let (rd, ld) = unsafe { (*remote, *local) };
        let plan = self.rma_check(c, pe, verb, &rd, &ld, bytes)?;
        if verb.is_nbi != 0 {
            return self.rma_exec(c, pe, &plan, ep);
        }
        // Blocking: wait for this call's operations only, report only their errors. A blocking
        // put or get is idempotent: when it met a connection that had just broken (and was rebuilt
        // while its error was handled), it runs again on the new one (a few times: both ends may
        // rebuild at once, which breaks the first new connection too); when a rail failed under it,
        // it runs again on the rails left.
        let mut retries = 0;
        loop {
            let g = Arc::new(Group::default());
            let posted = {
                let _scope = GroupScope::enter(&g);
                self.rma_exec(c, pe, &plan, ep)
            };
            let what = if plan.is_put { "put" } else { "get" };
            let waited = self.wait_group(c, ep, &g, what);
            // Same-host copies are not part of the group: a blocking put or get also waits for the
            // endpoint's copy queue (its data is in place, or read out, on return).
            let waited = waited.and_then(|()| self.wait_copies(ep, what));
            match posted.and(waited) {
                // A rail that failed under this call: its pieces run again on the rails left.
                Err(e)
                    if retries < BROKEN_RETRIES
                        && rail_failed(&e.message)
                        && self.check_pe(c, pe).is_ok() =>
                {
                    retries += 1;
                    tracing::info!(
                        "rma to PE {pe}: {}; retry {retries} on the rails left",
                        e.message
                    );
                }
                Err(e)
                    if retries < BROKEN_RETRIES
                        && broken_connection(&e.message)
                        && self.check_pe(c, pe).is_ok() =>
                {
                    retries += 1;
                    tracing::warn!(
                        "rma to PE {pe} met a broken connection ({}); retry {retries}",
                        e.message
                    );
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_millis(20 * retries as u64) {
                        self.progress_ep(c, ep);
                        std::thread::yield_now();
                    }
                }
                r => return r,
            }
        }
    }

    /// Waits, up to the quiet timeout, for the same-host copies enqueued on endpoint `ep`.
    pub(super) fn wait_copies(&self, ep: usize, what: &str) -> TResult<()> {
        if self.mover.outstanding(ep) == 0 {
            return Ok(());
        }
        self.mover
            .quiet(ep, Instant::now() + self.cfg.quiet_timeout)
            .map_err(|e| internal(format!("{what}: same-host copies on endpoint {ep}: {e}")))
    }

    /// Every check of an RMA request, before anything is posted: PE, op, lengths, strides, and the
    /// whole extent of both sides (no address wraps; the remote extent lies inside the peer's
    /// registration).
    fn rma_check(
        &self,
        c: &Connected,
        pe: i32,
        verb: abi::RmaVerb,
        rd: &RmaMemdesc,
        ld: &RmaMemdesc,
        bytes: abi::RmaBytesdesc,
    ) -> TResult<RmaPlan> {
        self.check_pe(c, pe)?;
        let is_put = match verb.op {
            op::PUT | op::P => true,
            op::GET | op::G => false,
            other => return Err(invalid(format!("rma: unsupported op {other}"))),
        };
        let what = if is_put { "put" } else { "get" };
        if bytes.elembytes <= 0 || bytes.nelems == 0 {
            return Err(invalid(format!(
                "rma: zero length ({} x {} bytes)",
                bytes.nelems, bytes.elembytes
            )));
        }
        let elem = bytes.elembytes as u64;
        let nelems = bytes.nelems as u64;
        let total = nelems.checked_mul(elem).ok_or_else(|| {
            invalid(format!(
                "{what}: nelems {nelems} x elembytes {elem} overflows"
            ))
        })?;
        if ld.ptr.is_null() || rd.ptr.is_null() {
            return Err(invalid("rma: null address"));
        }
        // `verb.is_stream` / `verb.cstrm` are not read: NVSHMEM orders on-stream operations itself
        // (it launches a kernel that goes through its proxy) and never hands a transport a stream,
        // and its proxy leaves both fields uninitialised in inline (P) requests.
        // A single element has no stride: NVSHMEM leaves the strides of its one-element requests (P,
        // G, inline proxy requests) uninitialised.
        // Put: srcstride is local, deststride remote; get: the other way round.
        let (lname, rname) = if is_put {
            ("srcstride", "deststride")
        } else {
            ("deststride", "srcstride")
        };
        let (lstride, rstride) = if bytes.nelems == 1 {
            (1, 1)
        } else if is_put {
            (bytes.srcstride, bytes.deststride)
        } else {
            (bytes.deststride, bytes.srcstride)
        };
        if lstride <= 0 || rstride <= 0 {
            return Err(invalid(format!(
                "{what}: strides must be positive ({lname} {lstride}, {rname} {rstride})"
            )));
        }
        // Bytes from the first element's start to the last element's end.
        let extent = |stride: isize, name: &str| -> TResult<u64> {
            (nelems - 1)
                .checked_mul(stride as u64)
                .and_then(|x| x.checked_mul(elem))
                .and_then(|x| x.checked_add(elem))
                .ok_or_else(|| {
                    invalid(format!(
                        "{what}: {name} {stride} x {nelems} elements of {elem} bytes overflows"
                    ))
                })
        };
        let lext = extent(lstride, lname)?;
        let rext = extent(rstride, rname)?;
        if (ld.ptr as u64).checked_add(lext).is_none() {
            return Err(invalid(format!(
                "{what}: local address {:p} + {lext} bytes wraps around the address space",
                ld.ptr
            )));
        }
        if (rd.ptr as u64).checked_add(rext).is_none() {
            return Err(invalid(format!(
                "{what}: remote address {:p} + {rext} bytes wraps around the address space",
                rd.ptr
            )));
        }
        self.remote_blob(rd, rext, what)?;
        tracing::trace!(
            "rma: pe {pe} op {} nbi {} {total} bytes, local {:p}, remote {:p}",
            verb.op,
            verb.is_nbi,
            ld.ptr,
            rd.ptr
        );
        Ok(RmaPlan {
            is_put,
            nelems,
            elem,
            total,
            lstride: lstride as u64,
            rstride: rstride as u64,
            rd: *rd,
            ld: *ld,
        })
    }

    /// Posts a checked request (offsets cannot overflow: `rma_check` bounded the extents).
    fn rma_exec(&self, c: &Connected, pe: i32, p: &RmaPlan, ep: usize) -> TResult<()> {
        let whole = Contig {
            pe,
            ep,
            is_put: p.is_put,
            remote: p.rd,
            local: p.ld,
            len: p.total,
        };
        if p.lstride == 1 && p.rstride == 1 {
            return self.rma_contig(c, &whole);
        }
        for i in 0..p.nelems {
            self.rma_contig(
                c,
                &Contig {
                    remote: shifted(&p.rd, i * p.rstride * p.elem),
                    local: shifted(&p.ld, i * p.lstride * p.elem),
                    len: p.elem,
                    ..whole
                },
            )?;
        }
        Ok(())
    }

    pub(super) fn rma_contig(&self, c: &Connected, x: &Contig) -> TResult<()> {
        let (pe, ep, is_put, len) = (x.pe, x.ep, x.is_put, x.len);
        let (rd, ld) = (&x.remote, &x.local);
        let what = if is_put { "put" } else { "get" };
        // The remote handle's blob, read once for every route below.
        let b = self.remote_blob(rd, len, what)?;
        if self.ipc_rma(x, &b, what)? {
            tracing::trace!("{what} of {len} bytes with PE {pe}: enqueued on copy queue {ep}");
            return Ok(());
        }
        if self.route.staging != Staging::Off
            && self
                .route
                .stages(is_device(ld.ptr), b.flags & HANDLE_FLAG_DEVICE != 0)
        {
            let (laddr, raddr) = (ld.ptr as u64, rd.ptr as u64);
            tracing::trace!("{what} of {len} bytes with PE {pe}: staged");
            return self.staged(c, &x.resolved(laddr, raddr));
        }
        // The provider's way: a fence owed to the PE waits for everything before it.
        if is_put {
            self.fence_gate(c, ep, pe as usize, Via::Other)?;
        }
        if len as usize > self.info.max_msg_size() {
            // Split into provider-sized pieces.
            let chunk = self.info.max_msg_size() as u64;
            let mut off = 0;
            while off < len {
                let n = chunk.min(len - off);
                let piece = Contig {
                    remote: shifted(rd, off),
                    local: shifted(ld, off),
                    len: n,
                    ..*x
                };
                self.rma_contig(c, &piece)?;
                off += n;
            }
            return Ok(());
        }
        let (raddr, key) = self.provider_target(rd, &b, ep);
        let dest = c.addr(pe, ep);
        let laddr = ld.ptr as u64;
        let ep_addr = &c.eps[ep] as *const EpState as usize;
        match self.local_desc(ld.handle, laddr, len, ep) {
            Some((_reg, desc)) => {
                tracing::trace!("{what} of {len} bytes with PE {pe}: provider");
                let desc = desc as usize;
                // Rail 0's post of `len` bytes from `laddr` to `raddr` (a piece of this range).
                let primary = |laddr: u64, raddr: u64, len: u64| -> TResult<()> {
                    self.post_deferrable(c, OpRoute::op(ep, pe as usize), move |ctx| {
                        // SAFETY: the endpoint state owns the backlog this closure may wait in, so it
                        // outlives every call.
                        let e = unsafe { &*(ep_addr as *const EpState) };
                        let desc = desc as *mut c_void;
                        // SAFETY: the local range lies in a live registration; NVSHMEM keeps buffers valid
                        // until quiet (nbi) or until we return (blocking: we wait for the operation).
                        e.transmit(pe as usize, ctx, |ep| unsafe {
                            if is_put {
                                ep.write(
                                    laddr as *const u8,
                                    len as usize,
                                    desc,
                                    dest,
                                    raddr,
                                    key,
                                    ctx,
                                )
                            } else {
                                ep.read(laddr as *mut u8, len as usize, desc, dest, raddr, key, ctx)
                            }
                        })
                    })?;
                    Ok(())
                };
                if self.rails.active() {
                    let x = RailRma {
                        pe: pe as usize,
                        ep,
                        is_put,
                        laddr,
                        raddr,
                        len,
                        handle: rd.handle,
                    };
                    return self.rails_rma(c, x, &primary);
                }
                primary(laddr, raddr, len)
            }
            None => {
                tracing::trace!("{what} of {len} bytes with PE {pe}: unregistered local memory");
                self.rma_unregistered(c, &x.resolved(laddr, raddr), key)
            }
        }
    }

    /// Same-host GPU memory: the copy engine moves the bytes through the peer's IPC-opened heap.
    /// `true` when done that way (complete at the endpoint's next quiet), `false` when another
    /// means must carry it (peer elsewhere, no export, the export does not open here, NVSHMEM_EFA_IPC=0,
    /// or an unregistered local source too large to take at once).
    fn ipc_rma(&self, x: &Contig, b: &HandleBlob, what: &str) -> TResult<bool> {
        let (pe, ep, is_put, len) = (x.pe, x.ep, x.is_put, x.len);
        let (rd, ld) = (&x.remote, &x.local);
        if !self.mover.policy().ipc {
            return Ok(false);
        }
        let Some(desc) = self.remote_ipc(rd, b, what)? else {
            return Ok(false);
        };
        let laddr = ld.ptr as u64;
        // The kind of registered memory was decided at registration; other local memory (NVSHMEM's
        // inline values, host buffers of the host API) is asked once here.
        let (kind, registered) = match self.local_desc(ld.handle, laddr, len, ep) {
            Some((r, _)) if r.device => (Kind::Device, true),
            Some(_) => (Kind::Host, true),
            None if is_device(ld.ptr) => (Kind::Device, false),
            None => (Kind::Host, false),
        };
        // A fence owed to the PE: the messages before it are applied first (a put only: a fence
        // does not order gets). Put back if the copy queue does not take the put after all.
        let owed = if is_put {
            let c = self.conn()?;
            let owed = c.eps[ep].peer[pe as usize].fence.load(Ordering::Acquire);
            self.fence_gate(c, ep, pe as usize, Via::CopyQueue)?;
            owed
        } else {
            0
        };
        // SAFETY: NVSHMEM keeps registered local buffers valid until quiet (nbi) or until rma
        // returns (blocking: rma quiets first); unregistered ones are taken before this returns.
        let done = unsafe {
            self.mover.transfer(
                ep,
                pe,
                is_put,
                laddr,
                kind,
                registered,
                &desc,
                rd.ptr as u64,
                len,
            )
        }
        .map_err(|e| internal(format!("{what} to PE {pe} through CUDA IPC: {e}")))?;
        if !done && owed != 0 {
            let c = self.conn()?;
            c.eps[ep].peer[pe as usize]
                .fence
                .fetch_or(owed, Ordering::AcqRel);
        }
        Ok(done)
    }

    /// Local memory that no registration covers (a P's stack value, a host buffer of the host API):
    /// small puts are injected; the rest goes through the endpoint's registered bounce buffer.
    pub(super) fn rma_unregistered(&self, c: &Connected, t: &Transfer, key: u64) -> TResult<()> {
        let (pe, ep, is_put, len) = (t.pe, t.ep, t.is_put, t.len);
        let (laddr, raddr) = (t.local, t.remote);
        let dest = c.addr(pe, ep);
        let e = &c.eps[ep];
        let device = is_device(laddr as *const c_void);
        if is_put && !device && (len as usize) <= self.info.inject_size() {
            self.post(c, OpRoute::op(ep, pe as usize), |ctx| {
                // SAFETY: FI_INJECT: the provider copies the source before returning.
                e.transmit(pe as usize, ctx, |ep| unsafe {
                    ep.write_msg(
                        laddr as *const u8,
                        len as usize,
                        std::ptr::null_mut(),
                        dest,
                        raddr,
                        key,
                        ctx,
                        self.inject_flags(),
                    )
                })
            })?;
            return Ok(());
        }
        // Bounce buffer: serialised per endpoint, each chunk completed before the next.
        let mut guard = e.bounce.lock();
        if guard.is_none() {
            *guard = Some(host_slab(&self.domain, &e.ep, BOUNCE_BYTES)?);
        }
        let (buf, mr) = guard.as_mut().expect("bounce buffer just created");
        let mut off = 0u64;
        while off < len {
            let n = (BOUNCE_BYTES as u64).min(len - off);
            let bp = buf.as_mut_ptr();
            if is_put {
                copy_any(bp, (laddr + off) as *const u8, n as usize)?;
            }
            // Each chunk completes before the buffer is reused: it has a group of its own.
            let g = Arc::new(Group::default());
            let posted = {
                let _scope = GroupScope::enter(&g);
                self.post(c, OpRoute::op(ep, pe as usize), |ctx| {
                    // SAFETY: bounce buffer registered and held (locked) until the chunk completes.
                    e.transmit(pe as usize, ctx, |ep| unsafe {
                        if is_put {
                            ep.write(bp, n as usize, mr.desc(), dest, raddr + off, key, ctx)
                        } else {
                            ep.read(bp, n as usize, mr.desc(), dest, raddr + off, key, ctx)
                        }
                    })
                })
            };
            posted?;
            self.wait_group(c, ep, &g, "bounce-buffered transfer")?;
            if !is_put {
                copy_any((laddr + off) as *mut u8, bp, n as usize)?;
            }
            off += n;
        }
        Ok(())
    }

    /// `put_signal` (ABI v4): the puts, then — once they are complete at the target — the signal.
    ///
    /// # Safety
    /// As for `rma` and `amo`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal(
        &self,
        pe: i32,
        verb: abi::RmaVerb,
        remote: &[RmaMemdesc],
        local: &[RmaMemdesc],
        bytes: &[abi::RmaBytesdesc],
        sig_verb: abi::AmoVerb,
        sig: *mut AmoMemdesc,
        sig_bytes: i32,
        ep: usize,
    ) -> TResult<()> {
        if remote.len() != local.len() || remote.len() != bytes.len() {
            return Err(invalid(format!(
                "put_signal: {} remote, {} local, {} sizes",
                remote.len(),
                local.len(),
                bytes.len()
            )));
        }
        let nbi = abi::RmaVerb {
            op: op::PUT,
            is_nbi: 1,
            ..verb
        };
        match sig_verb.op {
            amo::SIGNAL | amo::SIGNAL_SET | amo::SIGNAL_ADD | amo::SET | amo::ADD => {}
            other => return Err(invalid(format!("put_signal: signal op {other}"))),
        }
        let c = self.conn()?;
        // Every chunk is checked before the first is posted.
        let plans = (0..remote.len())
            .map(|i| self.rma_check(c, pe, nbi, &remote[i], &local[i], bytes[i]))
            .collect::<TResult<Vec<_>>>()?;
        // The data is complete at the target before the signal is sent; only this call's errors.
        let g = Arc::new(Group::default());
        let posted = {
            let _scope = GroupScope::enter(&g);
            plans.iter().try_for_each(|p| self.rma_exec(c, pe, p, ep))
        };
        let waited = self.wait_group(c, ep, &g, "put_signal data");
        posted.and(waited)?;
        if verb.is_nbi != 0 {
            // SAFETY: the caller's signal descriptor.
            return unsafe { self.amo(pe, sig_verb, sig, sig_bytes, ep) };
        }
        let g = Arc::new(Group::default());
        let posted = {
            let _scope = GroupScope::enter(&g);
            // SAFETY: the caller's signal descriptor.
            unsafe { self.amo(pe, sig_verb, sig, sig_bytes, ep) }
        };
        let waited = self.wait_group(c, ep, &g, "put_signal signal");
        // A same-host signal (and the data before it) may be on the copy queue.
        posted.and(waited)?;
        self.wait_copies(ep, "put_signal")
    }
}

/// How often a blocking put or get runs again after meeting a broken connection.
const BROKEN_RETRIES: u32 = 4;

/// A checked RMA request (`Transport::rma_check`): its extents cannot overflow.
pub(super) struct RmaPlan {
    is_put: bool,
    nelems: u64,
    elem: u64,
    total: u64,
    lstride: u64,
    rstride: u64,
    rd: RmaMemdesc,
    ld: RmaMemdesc,
}

/// `d` moved on by `by` bytes (address and offset; the handle stays).
fn shifted(d: &RmaMemdesc, by: u64) -> RmaMemdesc {
    RmaMemdesc {
        ptr: (d.ptr as u64 + by) as *mut c_void,
        offset: d.offset.wrapping_add(by),
        handle: d.handle,
    }
}
