//! Endpoints: their state and completion bookkeeping, connecting them (address exchange, GDA on its
//! own endpoint), and taking contexts and posting operations with bounded retry.
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::group::{self, Group, SCRATCH_GROUP};
use super::lanes::{Lanes, LANE_NBI, LANE_WAIT};
use super::peers::{Deferred, PeerAcct, PeerState, ProcId, PROC_ID_BYTES};
use super::provider_ops::again;
use super::wire::{
    staging_window, AmMsg, Pending, AM_MAGIC, AM_RESP, AM_TRACED, RESP_PUT, STAGE_BYTES,
};
use super::{internal, invalid, Allgather, Connected, TResult, Transport, TransportError, NUM_EPS};
use crate::cuda;
use crate::fabric::{
    flags, AddressVector, CompletionQueue, Domain, Endpoint, FiAddr, MemKind, MemoryRegion,
    OpContexts,
};
use crate::mover::handle::HostId;

// Context tags.
pub(super) const TAG_OP: u64 = 1;

/// Where an operation goes and how its completion is recognised: endpoint `ep` of PE `pe`, the
/// context's tag and its data.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpRoute {
    pub ep: usize,
    pub pe: usize,
    pub tag: u64,
    pub data: u64,
}

impl OpRoute {
    /// An operation tagged `tag` with `data`, on endpoint `ep` to PE `pe`.
    pub(super) fn new(ep: usize, pe: usize, tag: u64, data: u64) -> OpRoute {
        OpRoute { ep, pe, tag, data }
    }

    /// A plain operation (`TAG_OP`, no data) on endpoint `ep` to PE `pe`.
    pub(super) fn op(ep: usize, pe: usize) -> OpRoute {
        OpRoute::new(ep, pe, TAG_OP, 0)
    }
}
/// A waiting context taken by one caller alone ([`EpState::claim_wait`]): its address, its token,
/// its peer and its data.
#[derive(Clone, Copy, Debug)]
pub(super) struct Claim {
    pub ctx: *mut c_void,
    pub token: u64,
    pub pe: usize,
    pub data: u64,
}

pub(super) const TAG_AM_SEND: u64 = 2;
pub(super) const TAG_AM_RECV: u64 = 3;
pub(super) const TAG_AM_WAIT: u64 = 4;
pub(super) const TAG_SLOT_SEND: u64 = 5;
/// A lane probe, sent from the receiving endpoint itself (see `lanes`).
pub(super) const TAG_PROBE: u64 = 6;

/// What contexts of tag `tag` are, for the transport's description.
pub(super) fn tag_name(tag: u64) -> &'static str {
    match tag {
        TAG_OP => "operation",
        TAG_AM_SEND => "message send",
        TAG_AM_RECV => "message receive",
        TAG_AM_WAIT => "waiting for an answer",
        TAG_SLOT_SEND => "staged send",
        TAG_PROBE => "lane probe",
        _ => "unknown",
    }
}

/// Whether an operation of context tag `tag` is one quiet waits for (counted as submitted from
/// the moment its context is taken): an RMA or AMO, or the waiting side of an active message.
pub(super) fn counted(tag: u64) -> bool {
    tag == TAG_OP || tag == TAG_AM_WAIT
}

/// One endpoint with its completion bookkeeping.
pub(super) struct EpState {
    /// The staged path's copy kernel launches (created at connect; `None`: the copy engine).
    /// First: dropped (every launch decided, none left to touch the slabs) before the slabs'
    /// page-locks and the slabs themselves.
    pub(super) kstage: Mutex<Option<super::kstage::KStage>>,
    /// Page-locks of the host slabs below for the driver's copies (dropped before them): mapped
    /// for the GPU at their own addresses where the driver allows ([`super::kstage::SlabPin::Mapped`]).
    pub(super) _pins: Vec<super::kstage::SlabPin>,
    /// Both slabs are mapped for the GPU at their own addresses: the copy kernel may read and
    /// write them ([`super::kstage`]).
    pub(super) slabs_mapped: bool,
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
    /// Answers to lane probes that the endpoint could not send yet (EAGAIN), one per prober:
    /// retried at every progress round (see `flush_pongs`).
    pub(super) pongs: Mutex<Vec<(FiAddr, AmMsg)>>,
    /// Registered send slots for staged payloads, and the free ones.
    pub(super) send_slab: (Box<[u8]>, MemoryRegion),
    /// Send slots and AM receive buffers of this endpoint ([`staging_window`]).
    pub(super) send_slots: usize,
    pub(super) recv_bufs: usize,
    pub(super) send_free: Mutex<Vec<usize>>,
    /// Staged put messages being filled or copied in, waiting to be posted (`outbox`).
    pub(super) outbox: super::outbox::Outbox,
    /// Staged get requests being filled (`gets`).
    pub(super) getbox: super::gets::GetBox,
    /// Per-peer accounting and backlogs (index: PE).
    pub(super) peer: Vec<PeerAcct>,
    /// Operations waiting in any peer's backlog.
    pub(super) backlogged: std::sync::atomic::AtomicUsize,
    /// Transmit endpoints per peer (shm; see `lanes`); `None`: everything leaves through `ep`.
    pub(super) lanes: Option<Lanes>,
}

/// Flags of every active-message send (requests, responses, staged chunks, probes): complete once
/// the buffer may be reused, never FI_DELIVERY_COMPLETE. The protocol answers every message that
/// needs an answer itself, so delivery completion would only add a wait: on shm it forces every
/// message, 72 bytes or 64 KiB, onto the segmented (SAR) protocol, of which a sender has one
/// transfer in flight per peer, each waiting for both processes' progress; on tcp;ofi_rxm it adds
/// an acknowledgement per message.
pub(super) const AM_SEND_FLAGS: u64 = flags::COMPLETION | flags::TRANSMIT_COMPLETE;

/// `fi_sendmsg` of one active message with [`AM_SEND_FLAGS`].
///
/// # Safety
/// As for [`Endpoint::send_msg`]: `buf` (described by `desc`) and `ctx` stay valid until the
/// completion is reaped or the endpoint is closed.
pub(super) unsafe fn send_am(
    ep: &Endpoint,
    buf: *const u8,
    len: usize,
    desc: *mut c_void,
    dest: FiAddr,
    ctx: *mut c_void,
) -> crate::fabric::Result<()> {
    // SAFETY: forwarded contract.
    unsafe { ep.send_msg(buf as *mut u8, len, desc, dest, ctx, AM_SEND_FLAGS) }
}

/// Bytes of one shm endpoint name in the address exchange (names are shorter, NUL-padded).
const SHM_NAME_SLOT: usize = 64;

/// Scratch word of a counted context holding its target PE + 1 (0: none).
const SCRATCH_PEER: usize = 6;

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
    /// Posts with `f` on the endpoint that carries operations to `pe`: its lane where there are
    /// lanes (the waiting lane when the caller waits for the operation), else the endpoint itself.
    pub(super) fn transmit(
        &self,
        pe: usize,
        ctx: *mut c_void,
        f: impl FnOnce(&Endpoint) -> crate::fabric::Result<()>,
    ) -> crate::fabric::Result<()> {
        match &self.lanes {
            None => f(&self.ep),
            Some(l) => l.post(pe, self.lane_kind(ctx), ctx, f),
        }
    }

    /// Whether the operation of `ctx` (or the one it carries a message for) is waited for inside
    /// its call: it then takes the waiting lane, so it never queues behind an unanswered nbi one.
    fn lane_kind(&self, ctx: *mut c_void) -> usize {
        let waited = |c: *mut c_void| {
            // SAFETY: own context's scratch word (0 or a group reference, see attach).
            self.ctxs
                .scratch(c)
                .is_some_and(|s| unsafe { *s.add(SCRATCH_GROUP) } != 0)
        };
        // A message names its waiting context by token: one released meanwhile (its peer was
        // declared gone) is no longer waited for.
        let w = match self.ctxs.get(ctx) {
            Some((TAG_OP, _)) => Some(ctx),
            Some((TAG_AM_SEND, token)) => self.ctxs.by_token(token),
            // SAFETY: own context; send_slot wrote the waiting context's token to scratch[0]
            // before posting.
            Some((TAG_SLOT_SEND, _)) => self
                .ctxs
                .scratch(ctx)
                .and_then(|s| self.ctxs.by_token(unsafe { *s })),
            _ => None,
        };
        if w.is_some_and(waited) {
            LANE_WAIT
        } else {
            LANE_NBI
        }
    }

    /// Gives back the counted context (see [`counted`]) of `token`, whose operation was not
    /// posted: uncounted, unless its peer was declared gone meanwhile (it was accounted as failed
    /// then, and a waiting context released); freed in either case, once.
    pub(super) fn uncount(&self, token: u64) {
        let Some(ctx) = self.ctxs.by_token(token) else {
            return;
        };
        let pe = self.peer_of(ctx);
        let mine = match pe.and_then(|p| self.peer.get(p)) {
            Some(a) => a.outstanding.lock().remove(&token),
            None => true,
        };
        if mine {
            if let Some(g) = self.take_group(ctx) {
                g.pending.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(a) = pe.and_then(|p| self.peer.get(p)) {
                a.submitted.fetch_sub(1, Ordering::AcqRel);
                if self.is_op(ctx) {
                    a.raw_out.fetch_sub(1, Ordering::AcqRel);
                }
            }
            self.submitted.fetch_sub(1, Ordering::AcqRel);
        }
        self.ctxs.free_token(token);
    }

    /// Gives back a context taken with `Transport::alloc_for_peer` for an operation tagged `tag`
    /// that was not posted.
    pub(super) fn release_unposted(&self, ctx: *mut c_void, tag: u64) {
        match self.ctxs.token(ctx) {
            Some(token) if counted(tag) => self.uncount(token),
            _ => {
                self.ctxs.free(ctx);
            }
        }
    }

    /// Whether `ctx` is a provider operation (`TAG_OP`: RMA or atomic), which a peer's `raw_out`
    /// counts.
    fn is_op(&self, ctx: *mut c_void) -> bool {
        self.ctxs.get(ctx).map(|(t, _)| t) == Some(TAG_OP)
    }

    /// The target PE of a counted context.
    pub(super) fn peer_of(&self, ctx: *mut c_void) -> Option<usize> {
        let s = self.ctxs.scratch(ctx)?;
        // SAFETY: own context's scratch word.
        let v = unsafe { *s.add(SCRATCH_PEER) };
        (v != 0 && (v as usize) <= self.peer.len()).then(|| v as usize - 1)
    }

    /// Counts a freshly taken counted context for its peer and joins it to this thread's group;
    /// returns its token. Its peer's `outstanding` set receives the token last: from then on a
    /// peer declared gone accounts it (and releases a waiting context), so everything it reads
    /// is in place before.
    fn attach(&self, ctx: *mut c_void, pe: usize) -> u64 {
        let token = self.ctxs.token(ctx).expect("a context just taken");
        let Some(s) = self.ctxs.scratch(ctx) else {
            return token;
        };
        if let Some(g) = group::current() {
            g.pending.fetch_add(1, Ordering::AcqRel);
            // SAFETY: own context's scratch word; the reference is taken back by take_group.
            unsafe { *s.add(SCRATCH_GROUP) = Arc::into_raw(g) as u64 };
        }
        self.submitted.fetch_add(1, Ordering::AcqRel);
        if let Some(a) = self.peer.get(pe) {
            // SAFETY: own context's scratch word.
            unsafe { *s.add(SCRATCH_PEER) = pe as u64 + 1 };
            a.submitted.fetch_add(1, Ordering::AcqRel);
            if self.is_op(ctx) {
                a.raw_out.fetch_add(1, Ordering::AcqRel);
            }
            a.outstanding.lock().insert(token);
        }
        token
    }

    /// The group of a counted context, detached from it.
    fn take_group(&self, ctx: *mut c_void) -> Option<Arc<Group>> {
        let s = self.ctxs.scratch(ctx)?;
        // SAFETY: own context's scratch word, written by attach (or 0).
        let raw = unsafe { std::mem::replace(&mut *s.add(SCRATCH_GROUP), 0) };
        // SAFETY: raw came from Arc::into_raw in attach and is taken back once.
        (raw != 0).then(|| unsafe { Arc::from_raw(raw as *const Group) })
    }

    /// Ends every operation of peer `pe` still outstanding on this endpoint (endpoint `i`) with
    /// error `msg`, accounted with the set locked: a provider completion of one of them (on another
    /// thread) frees its context only once it finds the token gone from the set, i.e. after it was
    /// accounted here; a context whose token is in the set is never free. A context waiting for the
    /// peer's answer is released here. Returns how many operations ended and how many waiting
    /// contexts were released.
    pub(super) fn end_outstanding(&self, i: usize, pe: usize, msg: &str) -> (usize, usize) {
        let (mut ended, mut released) = (0, 0);
        let mut left = self.peer[pe].outstanding.lock();
        for token in left.drain() {
            ended += 1;
            let Some(ctx) = self.ctxs.by_token(token) else {
                tracing::error!("endpoint {i}: outstanding token {token:#x} names no context");
                continue;
            };
            let waiting = self.ctxs.get(ctx).map(|(t, _)| t) == Some(TAG_AM_WAIT);
            self.account(ctx, Some(pe), Some(msg.to_string()));
            if waiting && self.ctxs.free_token(token) {
                released += 1;
            }
        }
        (ended, released)
    }

    /// Accounts a counted operation as finished (once): its error goes to its group (blocking
    /// call), else to its peer (or the endpoint) for quiet; the counters advance. The context is
    /// not freed here.
    pub(super) fn account(&self, ctx: *mut c_void, pe: Option<usize>, error: Option<String>) {
        match self.take_group(ctx) {
            Some(g) => {
                if let Some(m) = error {
                    g.error.lock().get_or_insert(m);
                }
                g.pending.fetch_sub(1, Ordering::AcqRel);
            }
            None => match (error, pe.and_then(|p| self.peer.get(p))) {
                (Some(m), Some(a)) => a.record_error(m),
                (Some(m), None) => self.record_error(m),
                (None, _) => {}
            },
        }
        if let Some(a) = pe.and_then(|p| self.peer.get(p)) {
            if self.is_op(ctx) {
                a.raw_out.fetch_sub(1, Ordering::AcqRel);
            }
            a.completed.fetch_add(1, Ordering::AcqRel);
        }
        self.completed.fetch_add(1, Ordering::AcqRel);
    }

    /// Start of AM receive buffer `slot` (< `recv_bufs`); `None` on an endpoint without them.
    pub(super) fn am_buf(&self, slot: usize) -> Option<*mut u8> {
        debug_assert!(slot < self.recv_bufs);
        // SAFETY: slot < recv_bufs, so the offset lies inside the slab.
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

    /// Start of send slot `slot` (< `send_slots`).
    pub(super) fn send_slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < self.send_slots);
        // SAFETY: slot < send_slots, so the offset lies inside the send slab.
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
    /// trace flag echoed for the initiator's timeline (marked [`RESP_PUT`]: answers that succeeded
    /// may leave merged, `wire::AM_RESP_MULTI`).
    pub(super) fn push_put_response(&self, dest: FiAddr, m: &AmMsg, status: i32) {
        let resp = AmMsg {
            magic: AM_MAGIC,
            kind: AM_RESP,
            op: RESP_PUT,
            token: m.token,
            status,
            addr: m.addr,
            reserved: m.reserved & AM_TRACED,
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

    /// Takes the waiting context of `token` for the caller alone (its answer came, or its message
    /// failed): removed from its peer's outstanding set, so nobody else accounts or frees it.
    /// `None` when the token names no waiting context any more: its peer was declared gone and
    /// the context released (a late answer), or another party finished it; such an answer is
    /// dropped (`what` says which, in a debug line).
    pub(super) fn claim_wait(&self, token: u64, what: &str) -> Option<Claim> {
        // What is read before the removal may belong to a later hand-out of the context; the
        // removal of this token from the set succeeds only for this one, and after it the context
        // is the caller's (read again).
        let claimed = self.ctxs.by_token(token).and_then(|ctx| {
            if self.ctxs.get(ctx)?.0 != TAG_AM_WAIT {
                return None;
            }
            let pe = self.peer_of(ctx)?;
            if !self.peer.get(pe)?.outstanding.lock().remove(&token) {
                return None;
            }
            let (_, data) = self.ctxs.get(ctx)?;
            Some(Claim {
                ctx,
                token,
                pe,
                data,
            })
        });
        if claimed.is_none() {
            tracing::debug!(
                "{what} for token {token:#x}, which names no waiting context (released when its \
                 peer was declared gone, or finished already): dropped"
            );
        }
        claimed
    }

    /// Accounts a claimed waiting context with its outcome and frees it.
    pub(super) fn finish_claimed(&self, w: Claim, error: Option<String>) {
        self.account(w.ctx, Some(w.pe), error);
        self.ctxs.free_token(w.token);
    }

    /// Finishes the waiting context of `token` with `error` unless it was released or finished
    /// already; true when this call finished it.
    pub(super) fn finish_wait(&self, token: u64, error: Option<String>, what: &str) -> bool {
        match self.claim_wait(token, what) {
            Some(w) => {
                self.finish_claimed(w, error);
                true
            }
            None => false,
        }
    }

    /// Completes the context of an operation the provider returned (an RMA or AMO, counted for
    /// quiet) with its outcome. A context of a peer that was declared gone has been accounted
    /// already: it is only freed.
    pub(super) fn finish_op(&self, ctx: *mut c_void, error: Option<String>) {
        let pe = self.peer_of(ctx);
        let first = match (pe.and_then(|p| self.peer.get(p)), self.ctxs.token(ctx)) {
            (Some(a), Some(token)) => a.outstanding.lock().remove(&token),
            _ => true,
        };
        if first {
            self.account(ctx, pe, error);
        }
        self.ctxs.free(ctx);
    }

    /// Sends a lane probe (or the answer to one) from this endpoint itself, not from the probed
    /// lane: shm takes no new message on a lane whose oldest operation was dropped (its segmented
    /// transfer to that peer never finishes).
    ///
    /// The send completes once its buffer may be reused (FI_INJECT_COMPLETE), not once delivered:
    /// the answer to a probe is what tells, and a probe to a peer that dies before it reads it
    /// would otherwise never complete and hold its context (and, shm completing an endpoint's
    /// sends in order, the completions of this endpoint's later sends) for good.
    pub(super) fn send_probe(&self, dest: FiAddr, msg: AmMsg) -> crate::fabric::Result<()> {
        self.send_with_ctx(TAG_PROBE, 0, "no context for a probe", |ctx| {
            let s = self.ctxs.scratch(ctx).expect("own context");
            // SAFETY: scratch is 64 bytes owned by the context until its completion.
            unsafe {
                std::ptr::write_unaligned(s as *mut AmMsg, msg);
                self.ep.send_msg(
                    s as *mut u8,
                    std::mem::size_of::<AmMsg>(),
                    self.ctx_desc(),
                    dest,
                    ctx,
                    flags::INJECT_COMPLETE,
                )
            }
        })
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
        pe: usize,
        dest: FiAddr,
        msg: AmMsg,
    ) -> crate::fabric::Result<()> {
        let s = self.ctxs.scratch(ctx).expect("own context");
        // SAFETY: scratch is 64 bytes owned by the context until its completion.
        unsafe { std::ptr::write_unaligned(s as *mut AmMsg, msg) };
        self.transmit(pe, ctx, |ep| {
            // SAFETY: as above; the message stays in the scratch space until the completion.
            unsafe {
                send_am(
                    ep,
                    s as *const u8,
                    std::mem::size_of::<AmMsg>(),
                    self.ctx_desc(),
                    dest,
                    ctx,
                )
            }
        })
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
        let caps = &self.route.caps;
        for i in 0..NUM_EPS {
            let cq = CompletionQueue::open(&self.domain, self.cfg.max_inflight.max(1024))?;
            // shm names its region after the endpoint (`/dev/shm/<name>`): by default
            // `<pid>:<uid>:<n>`, which a killed process leaves behind for the next process with its
            // PID. This process's cookie makes the name its own (`<pid>:<cookie>:<n>`; the PID
            // stays first, where cleanup scripts look for it).
            let prefix = format!("fi_shm://{}:{:016x}:{i}", std::process::id(), self.cookie);
            let ep = if caps.named_endpoints {
                Endpoint::open_named(&self.domain, &av, &cq, format!("{prefix}\0").as_bytes())?
            } else {
                Endpoint::open(&self.domain, &av, &cq, None)?
            };
            let lanes = caps
                .per_peer_lanes
                .then(|| Lanes::new(&self.domain, &av, &cq, prefix, n));
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
            let (send_slots, recv_bufs) = staging_window(
                self.cfg.stage_slots,
                self.info.tx_size(),
                self.info.rx_size(),
            );
            let mut send_slab = host_slab(&self.domain, &ep, send_slots * STAGE_BYTES)?;
            let mut am_bufs = host_slab(&self.domain, &ep, recv_bufs * STAGE_BYTES)?;
            // Staged GPU data is copied out of the send slots and into place from the receive
            // buffers: pinned memory makes those copies DMA, and mapped memory lets the copy
            // kernel make small ones.
            let pins: Vec<super::kstage::SlabPin> = [&mut send_slab.0, &mut am_bufs.0]
                .into_iter()
                .filter_map(|b| super::kstage::SlabPin::new(b.as_mut_ptr(), b.len()))
                .collect();
            let slabs_mapped = pins.len() == 2 && pins.iter().all(super::kstage::SlabPin::mapped);
            let am_bufs = Some(am_bufs);
            eps.push(EpState {
                kstage: Mutex::new(None),
                _pins: pins,
                slabs_mapped,
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
                pongs: Mutex::new(Vec::new()),
                send_slab,
                send_free: Mutex::new((0..send_slots).rev().collect()),
                outbox: Default::default(),
                getbox: Default::default(),
                send_slots,
                recv_bufs,
                peer: (0..n).map(|_| PeerAcct::default()).collect(),
                backlogged: std::sync::atomic::AtomicUsize::new(0),
                lanes,
            });
        }
        // Exchange names: fixed-size slots so every PE's allgather has the same byte count.
        // Record: name slot size (u32 LE), PE (u32 LE), host id (u64 LE: equal on one host, see
        // mover::handle::HostId), one name slot per endpoint, then the process identity (liveness
        // checks of peers on one host, see peers.rs).
        let names: Vec<Vec<u8>> = eps.iter().map(|e| e.ep.name()).collect::<Result<_, _>>()?;
        // shm names are C strings whose length varies with the PID: every PE uses the same fixed
        // slot (NUL-padded) and the names are inserted one by one.
        let longest = names.iter().map(|v| v.len()).max().unwrap_or(0);
        let slot = if caps.named_endpoints {
            SHM_NAME_SLOT.max(longest)
        } else {
            longest
        };
        // [name size][PE][host id][names][process identity (liveness checks on one host)]
        const HDR: usize = 16;
        let me = ProcId::me();
        let mut mine = vec![0u8; HDR + NUM_EPS * slot + PROC_ID_BYTES];
        mine[0..4].copy_from_slice(&(slot as u32).to_le_bytes());
        mine[4..8].copy_from_slice(&(my_pe as u32).to_le_bytes());
        mine[8..16].copy_from_slice(&HostId::local().to_bytes());
        for (i, nm) in names.iter().enumerate() {
            mine[HDR + i * slot..HDR + i * slot + nm.len()].copy_from_slice(nm);
        }
        mine[HDR + NUM_EPS * slot..].copy_from_slice(&me.to_bytes());
        let mut all = vec![0u8; mine.len() * n];
        allgather(&mine, &mut all)?;
        let mut flat = Vec::with_capacity(n * NUM_EPS * slot);
        let mut hosts = Vec::with_capacity(n);
        let mut peers = Vec::with_capacity(n);
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
            flat.extend_from_slice(&rec[HDR..HDR + NUM_EPS * slot]);
            let p = ProcId::from_bytes(&rec[HDR + NUM_EPS * slot..]);
            peers.push(PeerState::new(p, pe != my_pe as usize && me.same_host(&p)));
        }
        let addrs = if caps.named_endpoints {
            let mut v = Vec::with_capacity(n * NUM_EPS);
            for name in flat.chunks(slot) {
                v.extend(av.insert(name, 1)?);
            }
            v
        } else {
            av.insert(&flat, n * NUM_EPS)?
        };
        // The extra rails' names (a collective of its own, where the rail variables ask for it).
        self.rails_connect(my_pe as usize, n, &hosts, allgather)?;
        let conn = Connected {
            my_pe,
            n_pes,
            av,
            eps,
            addrs: addrs.into_iter().map(AtomicU64::new).collect(),
            names: flat,
            name_len: slot,
            peers,
            last_check: Mutex::new(Instant::now()),
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
        let peers_here = (0..n_pes)
            .filter(|&p| p != my_pe && self.mover.same_host(p))
            .count();
        // Before any kernel of the application runs (the copy kernel's module loads here).
        self.prepare_copy_kernels(my_pe, n_pes, peers_here);
        if self.cfg.amo_kernel && self.mover.policy().ipc && peers_here > 0 {
            if let Err(e) = self.mover.prepare_kernel_amos(self.cfg.amo_kernel_stuck) {
                tracing::warn!(
                    "kernel atomics: {e}; atomics to same-host GPU memory take the provider's path"
                );
            }
        }
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

    /// Takes a context for an operation to `pe` tagged `tag` on rail 0; refused when `pe` is gone
    /// or rail 0 failed towards it (see `rails`). One that
    /// quiet waits for (see [`counted`]) is counted as submitted; an operation that is not posted
    /// gives its context back with [`EpState::release_unposted`].
    pub(super) fn alloc_for_peer(&self, c: &Connected, r: OpRoute) -> TResult<*mut c_void> {
        self.alloc_counted(c, r, &[]).map(|(ctx, _)| ctx)
    }

    /// Takes a context waiting for an answer from `pe` on endpoint `ep` (`data`: the tag's data,
    /// `scratch`: its first scratch words, written before anyone else can see it); returns it and
    /// the token its messages carry. Refused when `pe` is gone.
    pub(super) fn alloc_wait(
        &self,
        c: &Connected,
        ep: usize,
        pe: usize,
        data: u64,
        scratch: &[u64],
    ) -> TResult<(*mut c_void, u64)> {
        self.alloc_counted(c, OpRoute::new(ep, pe, TAG_AM_WAIT, data), scratch)
    }

    /// [`Transport::alloc_for_peer`] with the first scratch words written before the context is
    /// counted; also returns its token.
    fn alloc_counted(
        &self,
        c: &Connected,
        r: OpRoute,
        scratch: &[u64],
    ) -> TResult<(*mut c_void, u64)> {
        let OpRoute { ep, pe, tag, data } = r;
        self.check_peer(c, pe)?;
        self.check_primary(pe)?;
        let e = &c.eps[ep];
        let ctx = self.alloc_ctx(c, ep, tag, data)?;
        if let Some(s) = e.ctxs.scratch(ctx) {
            for (k, &v) in scratch
                .iter()
                .enumerate()
                .take(SCRATCH_PEER.min(SCRATCH_GROUP))
            {
                // SAFETY: own context's scratch words, below the ones attach uses.
                unsafe { *s.add(k) = v };
            }
        }
        if !counted(tag) {
            let token = e.ctxs.token(ctx).expect("a context just taken");
            return Ok((ctx, token));
        }
        let token = e.attach(ctx, pe);
        // A peer declared gone between the check above and attach did not see this context: it
        // goes back here (a declaration after attach accounted it; uncount then only frees it).
        if c.peers[pe].is_gone() {
            e.uncount(token);
            return Err(self.gone_error(c, pe));
        }
        Ok((ctx, token))
    }

    /// Posts an operation whose arguments stay valid until it completes. When the provider cannot
    /// take it now (EAGAIN), or earlier operations to the same peer wait, it joins the peer's
    /// backlog, which progress drains in order: a slow or stopped peer never holds up the caller
    /// (nor, through it, traffic to other peers).
    pub(super) fn post_deferrable(
        &self,
        c: &Connected,
        r: OpRoute,
        f: impl Fn(*mut c_void) -> crate::fabric::Result<()> + 'static,
    ) -> TResult<*mut c_void> {
        let OpRoute { ep, pe, tag, .. } = r;
        let e = &c.eps[ep];
        let ctx = self.alloc_for_peer(c, r)?;
        let a = &e.peer[pe];
        let mut q = a.backlog.lock();
        let r = if q.is_empty() {
            f(ctx)
        } else {
            Err(again("backlog"))
        };
        match r {
            Ok(()) => Ok(ctx),
            Err(err) if err.is_again() => {
                q.push_back(Deferred {
                    ctx: ctx as usize,
                    f: Box::new(f),
                });
                a.backlogged.fetch_add(1, Ordering::AcqRel);
                e.backlogged.fetch_add(1, Ordering::AcqRel);
                Ok(ctx)
            }
            Err(err) => {
                drop(q);
                e.release_unposted(ctx, tag);
                Err(err.into())
            }
        }
    }

    /// The error of an operation to a PE that is gone.
    pub(super) fn gone_error(&self, c: &Connected, pe: usize) -> TransportError {
        internal(format!(
            "PE {pe} is gone ({}): operation refused",
            c.peers[pe].why()
        ))
    }

    /// An error for an operation to a PE that is gone.
    pub(super) fn check_peer(&self, c: &Connected, pe: usize) -> TResult<()> {
        match c.peers.get(pe) {
            Some(p) if p.is_gone() => Err(self.gone_error(c, pe)),
            _ => Ok(()),
        }
    }

    /// Posts one operation whose arguments must be used before returning (an injected stack
    /// value, a bounce-buffer chunk) with retry on EAGAIN, after the peer's backlog (order), until
    /// the peer is gone or the quiet timeout; a `TAG_OP` operation counts as submitted.
    pub(super) fn post(
        &self,
        c: &Connected,
        r: OpRoute,
        f: impl Fn(*mut c_void) -> crate::fabric::Result<()>,
    ) -> TResult<*mut c_void> {
        let OpRoute { ep, pe, tag, .. } = r;
        let e = &c.eps[ep];
        let ctx = self.alloc_for_peer(c, r)?;
        let a = &e.peer[pe];
        let attempt = || {
            if c.peers[pe].is_gone() {
                return Err(crate::fabric::Error::from_ret(
                    -(libc::ECONNABORTED as i64),
                    "the peer is gone",
                ));
            }
            if a.backlogged.load(Ordering::Acquire) > 0 {
                return Err(again("waiting for the peer's backlog"));
            }
            f(ctx)
        };
        match self.retry_again(c, ep, attempt).map_err(|err| {
            if c.peers[pe].is_gone() {
                self.gone_error(c, pe)
            } else {
                err
            }
        }) {
            Ok(()) => Ok(ctx),
            Err(err) => {
                e.release_unposted(ctx, tag);
                Err(err)
            }
        }
    }
}
