//! The hardware queue's receive path: AMO messages and immediates arriving at a hardware-mode PE.
//!
//! EFA has no RDMA atomics. Kernels post an AMO (`amo_nonfetch_add`, `amo_set`, `amo_set_imm`, and
//! IBGDA's `rma_p`, built on `amo_set`) as an inline SEND of [`super::wire::AmoMsg`] on the GDA send
//! queue, on either queue kind. Here the target's host posts receive buffers on the GDA endpoint,
//! polls the endpoint's receive CQ, and hands each message to the applier the software queue runs
//! too ([`super::apply::apply_message`]). Receive completions the GPU must see (an RDMA write with
//! immediate; an AMO with immediate; a refused AMO) are written into an RX ring in GPU-mapped host
//! memory in the extended EFA receive format, which the device code polls with `poll_rx` exactly
//! as it polls the software queue's ring.
//!
//! # Why this shape holds on efa-direct (libfabric v2.6.0)
//! * A GDA endpoint may bind a host CQ for `FI_RECV` next to a device CQ for `FI_TRANSMIT`: the
//!   endpoint binds each direction on its own (`prov/efa/src/efa_ep.c:244-256`, a CQ for either
//!   flag), fabtests' GDA test binds two different CQs (`fabtests/prov/efa/src/efa_gda.c:474-493`),
//!   and a plain CQ and an external-memory CQ are both created by `efa_cq_open_ibv_cq`
//!   (`prov/efa/src/efa_cq.c:1017-1104`; `efa_domain.c:688-695` only turns polling off for a dmabuf
//!   CQ without a CPU address), so the QP's checks that both CQs agree on the direct data path and on
//!   unsolicited write-receive hold (`prov/efa/src/efa_base_ep.c:407,428`).
//! * Receives the host posts never touch the device-written send queue: `fi_recv` goes to
//!   `efa_post_recv` (`prov/efa/src/efa_msg.c:48-170`) and, on the direct data path, to
//!   `efa_data_path_direct_post_recv`, which writes only the RQ ring and rings only the RQ doorbell
//!   (`prov/efa/src/efa_data_path_direct_entry.h:61-121`). Polling the host CQ reads RX completions
//!   only (`prov/efa/src/efa_cq.c:397-417`); the TX CQ is the GPU's and the host never polls it.
//! * The endpoint is opened with `FI_RX_CQ_DATA` in its mode: efa-direct then creates the QP
//!   without unsolicited write-receive (`prov/efa/src/efa_base_ep.c:409-413`; `efa_user_info.c:512-521`),
//!   so every RDMA write with immediate consumes a posted receive and completes with that receive's
//!   context (`prov/efa/src/efa_cq.c:66-74`).
//! * A SEND that finds no posted receive is retried by the NIC, not dropped: an SRD QP's RNR retry
//!   count is infinite by default (`prov/efa/src/efa_base_ep.c:614`).
//!
//! # Credits: why neither CQ nor ring can be overrun (issue: the NIC does not see the consumer index)
//! Let `R` be the receives this path posts. Every entry of the receive CQ is the completion of one
//! posted receive (a SEND, or, with `FI_RX_CQ_DATA`, an RDMA write with immediate). A receive is
//! posted again only after its completion has been read from the CQ and, where the GPU must see it,
//! its entry has been written into the RX ring. So at every instant
//! `receives posted + completions not yet read + entries waiting for the ring <= R`, and:
//! * the receive CQ never holds more than `R` entries: it needs `cq_entries >= R` (checked against
//!   the CQ the provider reports, [`RxCredits::check`], where the queue is created);
//! * `R <= rq_entries`, the receive queue's depth (beyond it `fi_recv` answers `-FI_EAGAIN`);
//! * the RX ring is written only while `produced - ctrl.rx_ci < ring entries` (the host sees the GPU's
//!   consumer index; the NIC does not), and what waits for room holds its receive, so at most `R`
//!   entries wait in host memory and further messages wait at the sender (RNR retry).
//!   Unsolicited write-receive (write-with-immediate completions that consume no receive) would
//!   leave the CQ unbounded, so it is refused.
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::mem::offset_of;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::efa::cqe::{self, CqStatus, RxCqe, AH_UNKNOWN, RX_CQE_EX_SIZE};
use crate::efa::wqe::OpType;
use crate::fabric::{flags, CqEntry, CqError, Endpoint, FiAddr, MemKind, MemoryRegion, OpContexts};

use super::apply::{self, HeapChunks, Outcome};
use super::error::{GdaError, Result};
use super::mem::{self, ConsumerIndex, CtrlMem, SharedMem};
use super::state::NvshmemEfaGdaQueueCtrl;

const OFF_RX_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, rx_ci);
const TAG_RX: u64 = 2;
/// Completions read per poll.
const POLL_BATCH: usize = 32;
/// Refusals logged at warn level before switching to debug.
const WARN_REJECTS: u64 = 16;

/// How RDMA writes with immediate arrive at the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteImmRx {
    /// Each consumes a posted receive (`FI_RX_CQ_DATA`; efa-direct without unsolicited write-receive).
    ConsumesReceive,
    /// They consume no receive (unsolicited write-receive): nothing the receiver does bounds them.
    Unsolicited,
}

/// What the credit arithmetic (module doc) needs of a receive path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxCredits {
    /// Receives posted (`R`).
    pub receives: u32,
    /// Depth of the endpoint's receive queue.
    pub rq_entries: u32,
    /// Entries of the receive CQ as the provider reports them.
    pub cq_entries: u32,
    /// How RDMA writes with immediate complete.
    pub write_imm: WriteImmRx,
}

impl RxCredits {
    /// Refuses a configuration in which the receive CQ could be overrun (logged).
    pub fn check(&self) -> Result<()> {
        let refuse = |m: String| {
            tracing::error!("GDA receive path: {m}");
            Err(GdaError::invalid(format!("GDA receive path: {m}")))
        };
        if self.receives == 0 {
            return refuse("no receives to post".into());
        }
        if self.receives > self.rq_entries {
            return refuse(format!(
                "{} receives do not fit a receive queue of {} entries",
                self.receives, self.rq_entries
            ));
        }
        if self.write_imm == WriteImmRx::Unsolicited {
            return refuse(
                "RDMA writes with immediate would complete without consuming a receive (unsolicited \
                 write-receive): nothing bounds them, so the receive CQ could be overrun; open the \
                 endpoint with FI_RX_CQ_DATA"
                    .into(),
            );
        }
        if self.cq_entries < self.receives {
            return refuse(format!(
                "a receive CQ of {} entries can be overrun by {} posted receives (each completion \
                 takes one entry until the host reads it: needs at least as many entries as receives)",
                self.cq_entries, self.receives
            ));
        }
        Ok(())
    }
}

/// Geometry of a receive path.
#[derive(Clone, Copy, Debug)]
pub struct RxConfig {
    /// Receives kept posted (`R`).
    pub receives: u32,
    /// Bytes per receive buffer (an inline SEND carries at most 80).
    pub slot: usize,
    /// Entries of the RX ring the GPU polls (a power of two).
    pub ring_entries: u32,
}

impl Default for RxConfig {
    fn default() -> RxConfig {
        RxConfig {
            receives: 256,
            slot: 256,
            ring_entries: 1024,
        }
    }
}

/// Counters of a receive path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxStats {
    /// AMO messages applied.
    pub applied: u64,
    /// Messages refused (malformed AMO, outside the heap, not an AMO message).
    pub rejected: u64,
    /// Entries written into the RX ring.
    pub produced: u64,
    /// Error completions of receives.
    pub errors: u64,
}

/// One peer as RX entries name it.
#[derive(Clone, Copy, Debug)]
struct Source {
    ahn: u16,
    qpn: u16,
}

/// The registered receive buffers.
struct RecvPool {
    mr: Option<MemoryRegion>,
    mem: SharedMem,
    slot: usize,
    count: usize,
}

impl RecvPool {
    fn ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.count);
        // SAFETY: in bounds of the allocation.
        unsafe { self.mem.host().add(i * self.slot) }
    }

    fn desc(&self) -> *mut c_void {
        self.mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc())
    }
}

impl Drop for RecvPool {
    fn drop(&mut self) {
        // The registration goes before the memory.
        self.mr.take();
    }
}

/// State shared by the owner and the thread. Field order is drop order: the endpoint (if this holds
/// its last reference) closes before the receive buffers go.
struct Inner {
    ep: Arc<Endpoint>,
    pool: RecvPool,
    ctxs: OpContexts,
    ring: SharedMem,
    ring_entries: u32,
    ctrl: Arc<CtrlMem>,
    heap: RwLock<HeapChunks>,
    sources: RwLock<(u16, HashMap<FiAddr, Source>)>,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
    applied: AtomicU64,
    rejected: AtomicU64,
    produced: AtomicU64,
    errors: AtomicU64,
}

/// The receive path of a hardware queue: its thread, its receive buffers and the GPU's RX ring.
pub struct HwRx {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl HwRx {
    /// Checks the credits (`cq_entries`, `rq_entries`: what the provider reports for `ep`'s receive
    /// CQ and receive queue), posts `cfg.receives` receives on `ep` and starts the thread that reads
    /// `ep`'s receive CQ. The RX ring is GPU-mapped host memory when `gpu_ring`; `ctrl` is the queue's
    /// control block, whose `rx_ci` the ring's consumers advance.
    ///
    /// The receive buffers are freed when this value goes: the endpoint must close before then, or
    /// with it (hold no other reference to `ep` past this value's drop).
    pub fn start(
        ep: Arc<Endpoint>,
        credits: RxCredits,
        cfg: &RxConfig,
        ctrl: Arc<CtrlMem>,
        gpu_ring: bool,
    ) -> Result<HwRx> {
        if credits.receives != cfg.receives {
            return Err(GdaError::invalid(format!(
                "GDA receive path: credits for {} receives, {} configured",
                credits.receives, cfg.receives
            )));
        }
        credits.check()?;
        if !cfg.ring_entries.is_power_of_two() || cfg.ring_entries < 2 {
            return Err(GdaError::invalid(format!(
                "GDA receive path: RX ring of {} entries (needs a power of two)",
                cfg.ring_entries
            )));
        }
        if cfg.slot < super::wire::AMO_MSG_SIZE {
            return Err(GdaError::invalid(format!(
                "GDA receive path: {}-byte receive buffers cannot hold an AMO message",
                cfg.slot
            )));
        }
        let count = cfg.receives as usize;
        let mem = SharedMem::new(cfg.slot * count, false)?;
        // SAFETY: the pool owns the memory and drops the registration first; the endpoint belongs
        // to the domain.
        let mr = unsafe {
            MemoryRegion::register_reserved(
                ep.domain(),
                mem.host(),
                cfg.slot * count,
                MemKind::Host,
                Some(&ep),
            )?
        };
        let ring = SharedMem::new(cfg.ring_entries as usize * RX_CQE_EX_SIZE, gpu_ring)?;
        let inner = Arc::new(Inner {
            ep,
            pool: RecvPool {
                mr: Some(mr),
                mem,
                slot: cfg.slot,
                count,
            },
            ctxs: OpContexts::new(count),
            ring,
            ring_entries: cfg.ring_entries,
            ctrl,
            heap: RwLock::new(HeapChunks::default()),
            sources: RwLock::new((0, HashMap::new())),
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            applied: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            produced: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        });
        let mut t = Thread::new(inner.clone());
        for i in 0..count {
            t.repost(i);
        }
        if !t.retry.is_empty() {
            return Err(GdaError::io(format!(
                "GDA receive path: the endpoint took {} of {count} receives",
                count - t.retry.len()
            )));
        }
        let inner2 = inner.clone();
        let thread = std::thread::Builder::new()
            .name("gda-hw-rx".into())
            .spawn(move || {
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| t.run())) {
                    let m = crate::log::panic_message(&*p);
                    tracing::error!("GDA receive path: thread panicked: {m}; AMOs and immediates no longer arrive");
                    *inner2.failure.lock() = Some(m);
                }
            })
            .map_err(|e| GdaError::io(format!("GDA receive path: cannot start its thread: {e}")))?;
        tracing::info!(
            "GDA receive path: {} receives of {} bytes posted, receive CQ of {} entries, RX ring of {} entries",
            credits.receives,
            cfg.slot,
            credits.cq_entries,
            cfg.ring_entries
        );
        Ok(HwRx {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Address kernels read the RX ring at.
    pub fn ring_device(&self) -> u64 {
        self.inner.ring.device()
    }

    /// Host address of the RX ring (tests read it as the GPU would).
    pub fn ring_host(&self) -> *const u8 {
        self.inner.ring.host()
    }

    /// Entries of the RX ring.
    pub fn ring_entries(&self) -> u32 {
        self.inner.ring_entries
    }

    /// Names the peers: this PE's QP number and, per peer, its address in the endpoint's AV with
    /// the address handle and QP number RX entries carry for it.
    pub fn set_peers(&self, my_qpn: u16, peers: &[(FiAddr, u16, u16)]) {
        let map = peers
            .iter()
            .map(|&(a, ahn, qpn)| (a, Source { ahn, qpn }))
            .collect();
        *self.inner.sources.write() = (my_qpn, map);
    }

    /// Makes heap offsets `[start, end)` at host-usable address `addr` a local heap chunk AMOs apply to.
    pub fn add_heap_chunk(&self, start: u64, end: u64, addr: u64, device: bool) -> Result<()> {
        self.inner
            .heap
            .write()
            .add(start, end, addr, device)
            .map_err(GdaError::invalid)
    }

    /// Forgets the local heap chunk starting at `start`.
    pub fn remove_heap_chunk(&self, start: u64) -> Result<()> {
        if self.inner.heap.write().remove(start) {
            Ok(())
        } else {
            Err(GdaError::invalid(format!(
                "no local heap chunk starts at offset {start:#x}"
            )))
        }
    }

    /// The counters.
    pub fn stats(&self) -> RxStats {
        let i = &self.inner;
        RxStats {
            applied: i.applied.load(Ordering::Acquire),
            rejected: i.rejected.load(Ordering::Acquire),
            produced: i.produced.load(Ordering::Acquire),
            errors: i.errors.load(Ordering::Acquire),
        }
    }

    /// Why the thread stopped on its own (a panic), if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    /// Stops the thread (idempotent). Receives stay posted until the endpoint closes.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        let t = self.thread.lock().take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for HwRx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An RX entry waiting for room in the ring, with the receive it holds.
struct Waiting {
    cqe: RxCqe,
    buf: Option<usize>,
}

/// The thread's own state.
struct Thread {
    inner: Arc<Inner>,
    rx_pc: u64,
    /// The GPU's consumer index of the RX ring, as last read.
    ci: ConsumerIndex,
    waiting: VecDeque<Waiting>,
    retry: Vec<usize>,
    rx_seq: u16,
    /// AMO messages of the current CQ read, applied together at its end (`amo_batch.rs`); each
    /// with its receive buffer, source address and length.
    amos: crate::gda::amo_batch::AmoBatch<(usize, FiAddr, usize)>,
    /// What applies the batches (copies and page-locked room for GPU words).
    applier: crate::gda::amo_batch::Applier,
}

impl Thread {
    fn new(inner: Arc<Inner>) -> Thread {
        Thread {
            inner,
            rx_pc: 0,
            ci: Default::default(),
            waiting: VecDeque::new(),
            retry: Vec::new(),
            rx_seq: 0,
            amos: Default::default(),
            applier: Default::default(),
        }
    }

    fn run(&mut self) {
        let mut entries: [CqEntry; POLL_BATCH] =
            // SAFETY: fi_cq_data_entry is plain data; all-zero is a valid value.
            unsafe { std::mem::zeroed() };
        let mut src = [0 as FiAddr; POLL_BATCH];
        let mut idle = 0u32;
        while !self.inner.stop.load(Ordering::Acquire) {
            let mut busy = self.flush() > 0;
            if !self.retry.is_empty() {
                for i in std::mem::take(&mut self.retry) {
                    self.repost(i);
                }
            }
            match self.inner.ep.rx_cq().read_from(&mut entries, &mut src) {
                Ok(0) => {}
                Ok(n) => {
                    busy = true;
                    for k in 0..n {
                        self.on_completion(&entries[k], src[k]);
                    }
                    self.flush_amos();
                }
                Err(e) => {
                    busy = true;
                    self.flush_amos();
                    self.on_error(e);
                }
            }
            if busy {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle > 4096 {
                    std::thread::sleep(Duration::from_micros(20));
                } else if idle > 64 {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Posts receive buffer `i` (kept for a later try when the endpoint has no room now).
    fn repost(&mut self, i: usize) {
        let inner = &self.inner;
        let Some(ctx) = inner.ctxs.alloc(TAG_RX, i as u64) else {
            tracing::error!("GDA receive path: out of receive contexts (buffer {i})");
            self.retry.push(i);
            return;
        };
        // SAFETY: the buffer and the context belong to this path and stay valid until the
        // completion is read or the endpoint closes (which happens before they are freed).
        let r = unsafe {
            inner
                .ep
                .recv(inner.pool.ptr(i), inner.pool.slot, inner.pool.desc(), ctx)
        };
        if let Err(e) = r {
            inner.ctxs.free(ctx);
            if !e.is_again() {
                tracing::error!("GDA receive path: cannot post receive buffer {i}: {e}");
            }
            self.retry.push(i);
        }
    }

    /// The receive buffer a completion names (its context freed), if any.
    fn take_buf(&self, ctx: *mut c_void) -> Option<usize> {
        if ctx.is_null() {
            return None;
        }
        match self.inner.ctxs.get(ctx) {
            Some((TAG_RX, i)) if (i as usize) < self.inner.pool.count => {
                self.inner.ctxs.free(ctx);
                Some(i as usize)
            }
            _ => {
                tracing::error!("GDA receive path: a completion names an unknown context {ctx:p}");
                None
            }
        }
    }

    fn source(&self, from: FiAddr) -> (u16, u16, u16) {
        let s = self.inner.sources.read();
        match s.1.get(&from) {
            Some(p) => (s.0, p.ahn, p.qpn),
            None => (s.0, AH_UNKNOWN, 0),
        }
    }

    fn reject(&self, what: std::fmt::Arguments<'_>) {
        let k = self.inner.rejected.fetch_add(1, Ordering::AcqRel) + 1;
        if k <= WARN_REJECTS {
            tracing::warn!("GDA receive path: {what}");
        } else {
            tracing::debug!("GDA receive path: {what}");
        }
    }

    fn on_completion(&mut self, e: &CqEntry, from: FiAddr) {
        let buf = self.take_buf(e.op_context);
        let cq_data = e.flags & flags::REMOTE_CQ_DATA != 0;
        let base = self.send_entry(from, e.len as u32, cq_data.then_some(e.data as u32));
        // A SEND completes with FI_RECV; a write with immediate without it, with FI_REMOTE_CQ_DATA
        // (efa: with FI_RMA | FI_REMOTE_WRITE too, prov/efa/src/efa_cq.c:26-27, whether or not it
        // consumed a receive; tcp: with FI_REMOTE_WRITE; shm: alone).
        let write_imm = e.flags & (flags::RMA | flags::REMOTE_WRITE) != 0;
        if !write_imm && e.flags & flags::RECV != 0 {
            let Some(i) = buf else {
                self.reject(format_args!(
                    "a received message names no receive buffer of this path: dropped"
                ));
                return;
            };
            let len = e.len.min(self.inner.pool.slot);
            // SAFETY: the provider wrote `len` bytes into this buffer, which nobody else touches
            // until it is posted again.
            let payload = unsafe { std::slice::from_raw_parts(self.inner.pool.ptr(i), len) };
            let checked = apply::check_message(payload, &*self.inner.heap.read());
            // A plain AMO joins the CQ read's batch (its word read and written back with the
            // others': two waits per CQ read for GPU words instead of two per AMO). Heap chunks are
            // removed only once AMOs to them have stopped (deregistration, finalize), so the
            // checked address stays valid until the batch is applied at the end of this read.
            if let apply::Checked::Ready(m, addr, device) = &checked {
                if !cq_data {
                    self.amos.push(*m, *addr, *device, (i, from, len));
                    return;
                }
            }
            // Everything else after the AMOs before it.
            self.flush_amos();
            let outcome = match checked {
                apply::Checked::NotAmo => Outcome::NotAmo,
                apply::Checked::Rejected { status, why } => Outcome::Rejected { status, why },
                apply::Checked::Ready(m, addr, device) => apply::apply_checked(m, addr, device),
            };
            let status = match outcome {
                Outcome::NotAmo => {
                    self.reject(format_args!(
                        "dropped a {len}-byte message from address {from:#x} that is not an AMO message"
                    ));
                    self.repost(i);
                    return;
                }
                Outcome::Applied(_) => {
                    self.inner.applied.fetch_add(1, Ordering::AcqRel);
                    if !cq_data {
                        // Nothing waits for an RX entry of a plain AMO (the software queue does the same).
                        self.repost(i);
                        return;
                    }
                    CqStatus::Ok
                }
                Outcome::Rejected { status, why } => {
                    self.reject(format_args!(
                        "AMO from address {from:#x} not applied ({status}): {why}"
                    ));
                    status
                }
            };
            self.forward_send(
                RxCqe {
                    status,
                    length: len as u32,
                    ..base
                },
                i,
            );
        } else if cq_data {
            self.flush_amos();
            // An RDMA write with immediate: it consumed a receive where FI_RX_CQ_DATA holds.
            self.forward(
                RxCqe {
                    op: OpType::RdmaWrite,
                    unsolicited: buf.is_none(),
                    ..base
                },
                buf,
            );
        } else {
            self.reject(format_args!(
                "unexpected receive completion (flags {:#x}) ignored",
                e.flags
            ));
            if let Some(i) = buf {
                self.repost(i);
            }
        }
    }

    /// The RX entry of a SEND of `len` bytes from `from` (with its immediate, if any); status Ok.
    fn send_entry(&self, from: FiAddr, len: u32, imm: Option<u32>) -> RxCqe {
        let (my_qpn, ah, src_qp) = self.source(from);
        RxCqe {
            req_id: 0,
            status: CqStatus::Ok,
            phase: 0,
            op: OpType::Send,
            has_imm: imm.is_some(),
            unsolicited: false,
            qp_num: my_qpn,
            length: len,
            ah,
            src_qp,
            imm: imm.unwrap_or(0),
            src_addr: None,
        }
    }

    /// Forwards a received SEND's entry `c` with the next receive sequence number as its request
    /// id; `buf` is the receive buffer it came in.
    fn forward_send(&mut self, c: RxCqe, buf: usize) {
        let req_id = self.rx_seq;
        self.rx_seq = self.rx_seq.wrapping_add(1);
        self.forward(RxCqe { req_id, ..c }, Some(buf));
    }

    /// Applies the AMOs the current CQ read gathered, then gives their receive buffers back; one
    /// that could not be applied gets an RX completion with an error status (logged), as alone.
    fn flush_amos(&mut self) {
        if self.amos.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.amos);
        let done = self.applier.apply(&mut batch, "GDA receive path");
        for (_, (i, from, len), r) in done {
            match r {
                Ok(()) => {
                    self.inner.applied.fetch_add(1, Ordering::AcqRel);
                    // Nothing waits for an RX entry of a plain AMO (the software queue does the same).
                    self.repost(i);
                }
                Err(why) => {
                    let status = CqStatus::LocalQpInternalError;
                    self.reject(format_args!(
                        "AMO from address {from:#x} not applied ({status}): {why}"
                    ));
                    let entry = RxCqe {
                        status,
                        ..self.send_entry(from, len as u32, None)
                    };
                    self.forward_send(entry, i);
                }
            }
        }
        if self.amos.is_empty() {
            self.amos = batch;
        }
    }

    fn on_error(&mut self, e: CqError) {
        let buf = self.take_buf(e.context);
        if self.inner.stop.load(Ordering::Acquire) {
            return;
        }
        let k = self.inner.errors.fetch_add(1, Ordering::AcqRel) + 1;
        if k <= WARN_REJECTS {
            tracing::error!("GDA receive path: receive failed: {}", e.error);
        }
        if let Some(i) = buf {
            self.repost(i);
        }
    }

    /// Writes `c` into the RX ring now if there is room and nothing waits before it, else keeps it
    /// (and the receive it holds) until the GPU consumes.
    fn forward(&mut self, c: RxCqe, buf: Option<usize>) {
        if self.waiting.is_empty() && self.room() {
            self.write(c);
            if let Some(i) = buf {
                self.repost(i);
            }
            return;
        }
        self.waiting.push_back(Waiting { cqe: c, buf });
    }

    fn flush(&mut self) -> usize {
        let mut n = 0;
        while !self.waiting.is_empty() && self.room() {
            let w = self.waiting.pop_front().expect("non-empty");
            self.write(w.cqe);
            if let Some(i) = w.buf {
                self.repost(i);
            }
            n += 1;
        }
        n
    }

    fn room(&mut self) -> bool {
        let entries = u64::from(self.inner.ring_entries);
        self.ci.room(
            &self.inner.ctrl,
            OFF_RX_CI,
            self.rx_pc,
            entries,
            "GDA receive path",
        )
    }

    fn write(&mut self, mut c: RxCqe) {
        let n = self.inner.ring_entries;
        let slot = (self.rx_pc & u64::from(n - 1)) as usize;
        c.phase = cqe::cq_expected_phase(self.rx_pc, n);
        let bytes = cqe::encode_rx_ex(&c);
        // SAFETY: the slot lies inside the ring, which the GPU only reads.
        unsafe { mem::publish_cqe(self.inner.ring.host().add(slot * RX_CQE_EX_SIZE), &bytes) };
        self.rx_pc += 1;
        self.inner.produced.store(self.rx_pc, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credits() -> RxCredits {
        RxCredits {
            receives: 256,
            rq_entries: 256,
            cq_entries: 256,
            write_imm: WriteImmRx::ConsumesReceive,
        }
    }

    #[test]
    fn credit_arithmetic() {
        assert!(credits().check().is_ok());
        let refused = |c: RxCredits, why: &str| {
            let e = c.check().unwrap_err();
            assert!(e.message.contains(why), "{e}");
        };
        refused(
            RxCredits {
                cq_entries: 255,
                ..credits()
            },
            "overrun",
        );
        refused(
            RxCredits {
                write_imm: WriteImmRx::Unsolicited,
                cq_entries: 1 << 20,
                ..credits()
            },
            "FI_RX_CQ_DATA",
        );
        refused(
            RxCredits {
                rq_entries: 128,
                ..credits()
            },
            "receive queue",
        );
        assert!(RxCredits {
            receives: 0,
            ..credits()
        }
        .check()
        .is_err());
    }
}
