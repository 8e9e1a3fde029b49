//! Endpoints: their state and completion bookkeeping, connecting them (address exchange, GDA on its
//! own endpoint), and taking contexts and posting operations with bounded retry.
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::am::{AmMsg, Pending, AM_RECV_BUFS, SEND_SLOTS, STAGE_BYTES};
use super::{internal, invalid, Allgather, Connected, TResult, Transport, NUM_EPS};
use crate::config::GdaMode;
use crate::cuda;
use crate::fabric::{
    AddressVector, CompletionQueue, Endpoint, FiAddr, MemKind, MemoryRegion, OpContexts,
};

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

impl EpState {
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

    /// Completes a waiting context (counted for quiet).
    pub(super) fn finish_wait(&self, wait: *mut c_void) {
        self.ctxs.free(wait);
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
            let slab = |bytes: usize| -> TResult<(Box<[u8]>, MemoryRegion)> {
                let buf = vec![0u8; bytes].into_boxed_slice();
                // SAFETY: the slab moves into EpState with its registration and outlives it.
                let mr = unsafe {
                    MemoryRegion::register(
                        &self.domain,
                        buf.as_ptr(),
                        buf.len(),
                        MemKind::Host,
                        false,
                        Some(&ep),
                    )?
                };
                Ok((buf, mr))
            };
            let mut send_slab = slab(SEND_SLOTS * STAGE_BYTES)?;
            let mut am_bufs = slab(AM_RECV_BUFS * STAGE_BYTES)?;
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
        let names: Vec<Vec<u8>> = eps.iter().map(|e| e.ep.name()).collect::<Result<_, _>>()?;
        let slot = names.iter().map(|v| v.len()).max().unwrap_or(0);
        let mut mine = vec![0u8; 8 + NUM_EPS * slot];
        mine[0..4].copy_from_slice(&(slot as u32).to_le_bytes());
        mine[4..8].copy_from_slice(&(my_pe as u32).to_le_bytes());
        for (i, nm) in names.iter().enumerate() {
            mine[8 + i * slot..8 + i * slot + nm.len()].copy_from_slice(nm);
        }
        let mut all = vec![0u8; mine.len() * n];
        allgather(&mine, &mut all)?;
        let mut flat = Vec::with_capacity(n * NUM_EPS * slot);
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
            flat.extend_from_slice(&rec[8..]);
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
        let max = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .max()
            .unwrap_or(0) as usize;
        let min = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .min()
            .unwrap_or(0) as usize;
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

    pub(super) fn alloc_ctx(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
    ) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            if let Some(x) = e.ctxs.alloc(tag, data) {
                return Ok(x);
            }
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "endpoint {ep}: {} operations in flight and none completes within {:?}",
                    e.ctxs.in_flight(),
                    self.cfg.quiet_timeout
                )));
            }
            std::hint::spin_loop();
        }
    }

    /// Posts one operation with retry on EAGAIN, counting it as submitted.
    pub(super) fn post(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
        f: impl Fn(*mut c_void) -> crate::fabric::Result<()>,
    ) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        let ctx = self.alloc_ctx(c, ep, tag, data)?;
        if tag == TAG_OP {
            e.submitted.fetch_add(1, Ordering::AcqRel);
        }
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            match f(ctx) {
                Ok(()) => return Ok(ctx),
                Err(err) if err.is_again() && Instant::now() < deadline => {
                    self.progress_ep(c, ep);
                }
                Err(err) => {
                    e.ctxs.free(ctx);
                    if tag == TAG_OP {
                        e.submitted.fetch_sub(1, Ordering::AcqRel);
                    }
                    return Err(err.into());
                }
            }
        }
    }
}
