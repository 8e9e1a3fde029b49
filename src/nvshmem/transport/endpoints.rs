//! Endpoints: their state and completion bookkeeping, connecting them (address exchange, GDA on its
//! own endpoint), and taking contexts and posting operations with bounded retry.
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::am::{AmMsg, Pending, AM_MAGIC, AM_RECV_BUFS, AM_RESP, SEND_SLOTS, STAGE_BYTES};
use super::provider_ops::again;
use super::{internal, invalid, Allgather, Connected, TResult, Transport, TransportError, NUM_EPS};
use crate::config::GdaMode;
use crate::cuda;
use crate::fabric::{
    AddressVector, CompletionQueue, Domain, Endpoint, FiAddr, MemKind, MemoryRegion, OpContexts,
};
use crate::mover::handle::HostId;

// Context tags.
pub(super) const TAG_OP: u64 = 1;
pub(super) const TAG_AM_SEND: u64 = 2;
pub(super) const TAG_AM_RECV: u64 = 3;
pub(super) const TAG_AM_WAIT: u64 = 4;
pub(super) const TAG_SLOT_SEND: u64 = 5;

/// One endpoint with its completion bookkeeping.
pub(super) struct EpState {
    /// Page-locks of the host slabs below for the driver's copies (dropped before them).
    pub(super) _pins: Vec<cuda::HostPin>,
    pub(super) ep: Endpoint,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) ctxs: OpContexts,
    /// Registration of the context slab (operands live there) for FI_MR_LOCAL providers.
    pub(super) ctx_mr: Option<MemoryRegion>,
    pub(super) submitted: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) last_error: Mutex<Option<String>>,
    /// Registered bounce buffer for unregistered local memory.
    pub(super) bounce: Mutex<Option<(Box<[u8]>, MemoryRegion)>>,
    /// AM receive buffers (registered) and responses waiting to be sent.
    pub(super) am_bufs: Option<(Box<[u8]>, MemoryRegion)>,
    pub(super) am_pending: Mutex<VecDeque<Pending>>,
    /// Registered send slots for staged payloads, and the free ones.
    pub(super) send_slab: (Box<[u8]>, MemoryRegion),
    pub(super) send_free: Mutex<Vec<usize>>,
}

/// A zeroed host buffer of `bytes` registered (local access) on `ep`. The buffer and its
/// registration travel together; the owner keeps the registration next to the buffer it covers.
pub(super) fn host_slab(
    domain: &Arc<Domain>,
    ep: &Endpoint,
    bytes: usize,
) -> TResult<(Box<[u8]>, MemoryRegion)> {
    let buf = vec![0u8; bytes].into_boxed_slice();
    // SAFETY: the boxed slice's memory does not move when the pair moves; the pair lives in the
    // endpoint state, which outlives every operation that uses the buffer.
    let mr = unsafe {
        MemoryRegion::register(
            domain,
            buf.as_ptr(),
            buf.len(),
            MemKind::Host,
            false,
            Some(ep),
        )?
    };
    Ok((buf, mr))
}

impl EpState {
    /// Gives back a context taken with `Transport::alloc_counted` whose operation was not posted.
    pub(super) fn uncount(&self, ctx: *mut c_void) {
        self.ctxs.free(ctx);
        self.submitted.fetch_sub(1, Ordering::AcqRel);
    }

    /// Start of AM receive buffer `slot` (< AM_RECV_BUFS); `None` on an endpoint without them.
    pub(super) fn am_buf(&self, slot: usize) -> Option<*mut u8> {
        debug_assert!(slot < AM_RECV_BUFS);
        // SAFETY: slot < AM_RECV_BUFS, so the offset lies inside the slab.
        self.am_bufs
            .as_ref()
            .map(|(buf, _)| unsafe { buf.as_ptr().add(slot * STAGE_BYTES) as *mut u8 })
    }

    /// Posts AM receive buffer `slot` with context `ctx` (a no-op without AM buffers).
    pub(super) fn post_am_recv(&self, slot: usize, ctx: *mut c_void) -> crate::fabric::Result<()> {
        let (Some(p), Some((_, mr))) = (self.am_buf(slot), &self.am_bufs) else {
            return Ok(());
        };
        // SAFETY: the buffer slot belongs to this endpoint's registered AM slab, which lives as
        // long as the endpoint.
        unsafe { self.ep.recv(p, STAGE_BYTES, mr.desc(), ctx) }
    }

    /// Start of send slot `slot` (< SEND_SLOTS).
    pub(super) fn send_slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < SEND_SLOTS);
        // SAFETY: slot < SEND_SLOTS, so the offset lies inside the send slab.
        unsafe { self.send_slab.0.as_ptr().add(slot * STAGE_BYTES) as *mut u8 }
    }

    /// Queues a response (old value or status) to a request with `token`.
    pub(super) fn push_response(&self, dest: FiAddr, token: u64, result: u64, status: i32) {
        let resp = AmMsg {
            magic: AM_MAGIC,
            kind: AM_RESP,
            token,
            result,
            status,
            ..Default::default()
        };
        self.am_pending.lock().push_back(Pending::Msg(dest, resp));
    }

    /// Queues the response to staged put chunk `m`: its status, and the chunk's remote address and
    /// trace flag echoed for the initiator's timeline.
    pub(super) fn push_put_response(&self, dest: FiAddr, m: &AmMsg, status: i32) {
        let resp = AmMsg {
            magic: AM_MAGIC,
            kind: AM_RESP,
            token: m.token,
            status,
            addr: m.addr,
            reserved: m.reserved & super::am::AM_TRACED,
            ..Default::default()
        };
        self.am_pending.lock().push_back(Pending::Msg(dest, resp));
    }

    /// Takes a context with `tag`/`data`, runs `send` with it and gives it back if `send` fails;
    /// no free context is EAGAIN (`what` says which send).
    pub(super) fn send_with_ctx(
        &self,
        tag: u64,
        data: u64,
        what: &str,
        send: impl FnOnce(*mut c_void) -> crate::fabric::Result<()>,
    ) -> crate::fabric::Result<()> {
        let Some(ctx) = self.ctxs.alloc(tag, data) else {
            return Err(again(what));
        };
        let r = send(ctx);
        if r.is_err() {
            self.ctxs.free(ctx);
        }
        r
    }

    /// Counts a failed operation; quiet reports it with this message.
    pub(super) fn record_error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::AcqRel);
        *self.last_error.lock() = Some(msg);
    }

    /// The context waiting for an answer with this token, and its data; `None` (logged) when the
    /// token names no waiting context.
    pub(super) fn waiting(&self, token: u64, what: &str) -> Option<(*mut c_void, u64)> {
        let wait = token as *mut c_void;
        match self.ctxs.get(wait) {
            Some((TAG_AM_WAIT, data)) => Some((wait, data)),
            Some(_) => {
                tracing::error!("{what} for a context that is not waiting");
                None
            }
            None => {
                tracing::error!("{what} for an unknown token {token:#x}");
                None
            }
        }
    }

    /// Completes a context counted for quiet (an operation's or a waiting one).
    pub(super) fn finish_counted(&self, ctx: *mut c_void) {
        self.ctxs.free(ctx);
        self.completed.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn ctx_desc(&self) -> *mut c_void {
        self.ctx_mr
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.desc())
    }

    /// Sends `msg` from the scratch space of `ctx` (a context of this endpoint that the send's
    /// completion gives back). The caller frees `ctx` when this fails.
    pub(super) fn send_from_scratch(
        &self,
        ctx: *mut c_void,
        dest: FiAddr,
        msg: AmMsg,
    ) -> crate::fabric::Result<()> {
        let s = self.ctxs.scratch(ctx).expect("own context");
        // SAFETY: scratch is 64 bytes owned by the context until its completion.
        unsafe {
            std::ptr::write_unaligned(s as *mut AmMsg, msg);
            self.ep.send(
                s as *const u8,
                std::mem::size_of::<AmMsg>(),
                self.ctx_desc(),
                dest,
                ctx,
            )
        }
    }
}

impl Transport {
    /// Creates both endpoints, exchanges addresses through `allgather`, fills the AV, posts AM
    /// receive buffers, starts the progress thread and sets up GDA on its own endpoint.
    pub fn connect(
        self: &Arc<Self>,
        my_pe: i32,
        n_pes: i32,
        allgather: &Allgather<'_>,
    ) -> TResult<()> {
        if self.conn.get().is_some() {
            return Err(internal("connect_endpoints called twice"));
        }
        if n_pes <= 0 || my_pe < 0 || my_pe >= n_pes {
            return Err(invalid(format!(
                "connect_endpoints: bad my_pe {my_pe} / n_pes {n_pes}"
            )));
        }
        let n = n_pes as usize;
        let av = AddressVector::open(&self.domain, n * NUM_EPS)?;
        let mut eps = Vec::with_capacity(NUM_EPS);
        for _ in 0..NUM_EPS {
            let cq = CompletionQueue::open(&self.domain, self.cfg.max_inflight.max(1024))?;
            let ep = Endpoint::open(&self.domain, &av, &cq, None)?;
            let ctxs = OpContexts::new(self.cfg.max_inflight);
            let ctx_mr = if self.info.mr_local() {
                let (p, len) = ctxs.region();
                // SAFETY: the slab lives in EpState next to its registration and outlives it (field order).
                Some(unsafe {
                    MemoryRegion::register(&self.domain, p, len, MemKind::Host, false, Some(&ep))?
                })
            } else {
                None
            };
            // Host slabs owned by EpState together with their registrations.
            let mut send_slab = host_slab(&self.domain, &ep, SEND_SLOTS * STAGE_BYTES)?;
            let mut am_bufs = host_slab(&self.domain, &ep, AM_RECV_BUFS * STAGE_BYTES)?;
            // Staged GPU data is copied out of the send slots and into place from the receive
            // buffers: pinned memory makes those copies DMA.
            let pins = [&mut send_slab.0, &mut am_bufs.0]
                .into_iter()
                .filter_map(|b| cuda::HostPin::new(b.as_mut_ptr(), b.len()))
                .collect();
            let am_bufs = Some(am_bufs);
            eps.push(EpState {
                _pins: pins,
                ep,
                cq,
                ctxs,
                ctx_mr,
                submitted: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                last_error: Mutex::new(None),
                bounce: Mutex::new(None),
                am_bufs,
                am_pending: Mutex::new(VecDeque::new()),
                send_slab,
                send_free: Mutex::new((0..SEND_SLOTS).rev().collect()),
            });
        }
        // Exchange names: fixed-size slots so every PE's allgather has the same byte count.
        // Record: name slot size (u32 LE), PE (u32 LE), host id (u64 LE: equal on one host, see
        // mover::handle::HostId), then one name slot per endpoint.
        let names: Vec<Vec<u8>> = eps.iter().map(|e| e.ep.name()).collect::<Result<_, _>>()?;
        let slot = names.iter().map(|v| v.len()).max().unwrap_or(0);
        const HDR: usize = 16;
        let mut mine = vec![0u8; HDR + NUM_EPS * slot];
        mine[0..4].copy_from_slice(&(slot as u32).to_le_bytes());
        mine[4..8].copy_from_slice(&(my_pe as u32).to_le_bytes());
        mine[8..16].copy_from_slice(&HostId::local().to_bytes());
        for (i, nm) in names.iter().enumerate() {
            mine[HDR + i * slot..HDR + i * slot + nm.len()].copy_from_slice(nm);
        }
        let mut all = vec![0u8; mine.len() * n];
        allgather(&mine, &mut all)?;
        let mut flat = Vec::with_capacity(n * NUM_EPS * slot);
        let mut hosts = Vec::with_capacity(n);
        for pe in 0..n {
            let rec = &all[pe * mine.len()..(pe + 1) * mine.len()];
            let their_slot = u32::from_le_bytes(rec[0..4].try_into().unwrap()) as usize;
            let their_pe = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
            if their_slot != slot || their_pe != pe {
                return Err(internal(format!(
                    "address exchange: PE {pe} sent name size {their_slot} / pe {their_pe} (expected {slot} / {pe}): \
                     mixed providers or a bootstrap that does not order by PE"
                )));
            }
            hosts.push(HostId::from_bytes(rec[8..16].try_into().unwrap()));
            flat.extend_from_slice(&rec[HDR..]);
        }
        let addrs = av.insert(&flat, n * NUM_EPS)?;
        let conn = Connected {
            my_pe,
            n_pes,
            _av: av,
            eps,
            addrs,
        };
        for (i, e) in conn.eps.iter().enumerate() {
            self.post_am_recvs(e, i)?;
        }
        if self.conn.set(conn).is_err() {
            return Err(internal("connect_endpoints raced with itself"));
        }
        self.cuda_ctx
            .store(cuda::current_context() as u64, Ordering::Relaxed);
        cuda::set_fallback_context(cuda::current_context());
        self.mover.set_context(cuda::current_context());
        self.mover.set_peers(my_pe, hosts);
        if self.cfg.progress_thread {
            self.start_progress_thread();
        }
        tracing::info!(
            "PE {my_pe}/{n_pes}: endpoints connected over {}",
            self.provider
        );
        self.setup_gda(my_pe, n_pes, allgather);
        Ok(())
    }

    pub(super) fn setup_gda(&self, my_pe: i32, n_pes: i32, allgather: &Allgather<'_>) {
        if self.cfg.gda == GdaMode::Off {
            return;
        }
        // Every PE takes part in the exchange even if its own GDA init failed (empty name), so the
        // collective never hangs; a PE then simply has no GDA.
        let local = match crate::gda::init_internal(&self.domain, &self.cfg) {
            Ok(mode) => {
                tracing::info!("GDA initialised on its own endpoint (mode {mode})");
                crate::gda::address().unwrap_or_default()
            }
            Err(e) => {
                if self.cfg.gda == GdaMode::Hw {
                    tracing::error!("NVSHMEM_EFA_GDA=hw: {e}");
                } else {
                    tracing::warn!("GDA unavailable: {e}");
                }
                Vec::new()
            }
        };
        let mut len = [0u8; 8];
        let mut lens = vec![0u8; 8 * n_pes as usize];
        len.copy_from_slice(&(local.len() as u64).to_le_bytes());
        if allgather(&len, &mut lens).is_err() {
            tracing::warn!("GDA address size exchange failed");
            return;
        }
        // n_pes > 0 (checked by connect), so both bounds come from real sizes.
        let (min, max) = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        if max == 0 {
            return;
        }
        let mut mine = local.clone();
        mine.resize(max, 0);
        let mut all = vec![0u8; max * n_pes as usize];
        if allgather(&mine, &mut all).is_err() || min != max {
            tracing::warn!("GDA address exchange failed or some PE has no GDA: GDA disabled");
            crate::gda::fini();
            return;
        }
        if let Err(e) = crate::gda::connect(my_pe, n_pes, &all, None) {
            tracing::warn!("GDA connect failed: {e}");
            crate::gda::fini();
        }
    }

    /// Runs `take` until it yields, driving progress on `ep` in between; `timeout()` is the error
    /// once the quiet timeout has passed.
    pub(super) fn wait_for<T>(
        &self,
        c: &Connected,
        ep: usize,
        mut take: impl FnMut() -> Option<T>,
        timeout: impl FnOnce() -> TransportError,
    ) -> TResult<T> {
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            if let Some(x) = take() {
                return Ok(x);
            }
            self.check_alive()?;
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(timeout());
            }
            std::hint::spin_loop();
        }
    }

    /// Runs `f` until it does not answer EAGAIN, driving progress on `ep` in between (bounded by
    /// the quiet timeout).
    pub(super) fn retry_again(
        &self,
        c: &Connected,
        ep: usize,
        f: impl Fn() -> crate::fabric::Result<()>,
    ) -> TResult<()> {
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            match f() {
                Ok(()) => return Ok(()),
                Err(err) if err.is_again() && Instant::now() < deadline => {
                    self.check_alive()?;
                    self.progress_ep(c, ep);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Takes a context of endpoint `ep`, driving progress while none is free (bounded).
    pub(super) fn alloc_ctx(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
    ) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        self.wait_for(
            c,
            ep,
            || e.ctxs.alloc(tag, data),
            || {
                internal(format!(
                    "endpoint {ep}: {} operations in flight and none completes within {:?}",
                    e.ctxs.in_flight(),
                    self.cfg.quiet_timeout
                ))
            },
        )
    }

    /// Takes a context for an operation that quiet waits for (counted as submitted; give it
    /// back with [`EpState::uncount`] if the operation is not posted).
    pub(super) fn alloc_counted(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
    ) -> TResult<*mut c_void> {
        let ctx = self.alloc_ctx(c, ep, tag, data)?;
        c.eps[ep].submitted.fetch_add(1, Ordering::AcqRel);
        Ok(ctx)
    }

    /// Posts one operation with retry on EAGAIN; a `TAG_OP` operation counts as submitted.
    pub(super) fn post(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
        f: impl Fn(*mut c_void) -> crate::fabric::Result<()>,
    ) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        let counted = tag == TAG_OP;
        let ctx = if counted {
            self.alloc_counted(c, ep, tag, data)?
        } else {
            self.alloc_ctx(c, ep, tag, data)?
        };
        match self.retry_again(c, ep, || f(ctx)) {
            Ok(()) => Ok(ctx),
            Err(err) => {
                if counted {
                    e.uncount(ctx);
                } else {
                    e.ctxs.free(ctx);
                }
                Err(err)
            }
        }
    }
}
