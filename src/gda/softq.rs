//! The software EFA queue: the rings of an EFA send queue, its completion queue and a receive
//! completion ring, in memory the GPU maps, consumed by a host thread that executes every WQE through
//! libfabric on an endpoint of its own.
//!
//! Kernels post exactly as they would to the hardware (the protocol in [`super::state`]); only the
//! doorbell differs: here it is a `u32` record in mapped host memory that the consumer thread polls.
//!
//! # What the consumer does with each WQE
//! 1. Reads the doorbell record (a free-running `u32` producer count) and, for each new slot, copies
//!    the 64-byte WQE out and publishes `host_ctrl.consumed` (the slot may then be rewritten as soon
//!    as the poster's `done` allows; the consumer never reads it again).
//! 2. Validates everything (the WQE is untrusted input): the request id equals the producer count's
//!    low 16 bits, the phase is the one expected for that count, the format decodes
//!    ([`crate::efa::wqe::decode`]), the address handle names a connected PE, `dest_qp_num` and `qkey`
//!    equal the peer table's, lkeys name local registrations of this queue and the local range lies
//!    inside one, the rkey is the soft heap key and the remote range lies inside the peer's heap.
//!    A WQE that fails gets an error completion right away and the queue goes on:
//!
//!    | check | status |
//!    |---|---|
//!    | request id, phase, meta/first/last bits, reserved bits | `LOCAL_QP_INTERNAL_ERROR` (2) |
//!    | op type, immediate on a read, unknown AMO op | `LOCAL_UNSUPPORTED_OP` (3) |
//!    | address handle | `LOCAL_INVALID_AH` (4) |
//!    | lkey, local range | `LOCAL_INVALID_LKEY` (5) |
//!    | lengths, descriptor counts, SEND above 4 KiB, AMO size | `LOCAL_BAD_LENGTH` (6) |
//!    | rkey, remote range, AMO offset | `REMOTE_BAD_ADDRESS` (7) |
//!    | `dest_qp_num` | `REMOTE_BAD_DEST_QPN` (9) |
//!    | `qkey` (a receiver drops such packets) | `LOCAL_UNREACH_REMOTE` (15) |
//!
//! 3. Executes it on the private endpoint: RDMA write → `fi_writemsg` (with `FI_DELIVERY_COMPLETE`
//!    where the provider takes it, so a completion means the data is at the target), RDMA write with
//!    immediate → the same with `FI_REMOTE_CQ_DATA`, RDMA read → `fi_read`, SEND → `fi_sendmsg` of
//!    [`wire`](super::wire)'s header and the payload (copied into a registered bounce buffer).
//!    Staged RDMA (see below) instead when the queue's [`Staging`] covers the transfer.
//! 4. Writes one TX completion per WQE, in completion order, into the next CQ slot: status 0 or the
//!    EFA status of the failure, request id = the WQE's, phase 1 on the first pass over the ring and
//!    flipping per wrap; the 15 other bytes first, a release fence, then the flags byte.
//!
//! Every WQE yields exactly one completion. The `comp_req` bit is not needed (the posting protocol
//! retires slots through completions, so each WQE is completed).
//!
//! # Receive side
//! The same thread polls the endpoint's CQ for remote CQ data (RDMA write with immediate arriving)
//! and for received SENDs (receive buffers stay posted). Each becomes a 32-byte RX completion
//! (extended EFA receive format) in the RX ring, with the phase convention of the CQ, and
//! `host_ctrl.rx_produced` advances. A SEND carrying an AMO message is applied to the local heap
//! first. The RX ring is never overrun: when `rx_produced - ctrl.rx_ci` reaches the ring size, new
//! entries wait in host memory until the GPU consumes.
//!
//! # Staged RDMA (GPU memory on software providers)
//! libfabric's software providers (shm, tcp) copy GPU memory with `cudaMemcpy` on the legacy default
//! stream, which waits for every kernel running in blocking streams, including the kernel that waits
//! (quiet, RX polling) for this very copy: a deadlock. So where [`Staging`] says so (auto: GPU memory
//! on every provider but efa-direct, verbs and cxi; `NVSHMEM_EFA_GPU_STAGING=1`: every transfer) the
//! provider never sees GPU memory: the consumers move the bytes themselves with
//! [`cuda::memcpy`] (a non-blocking stream) into and out of registered host buffers, and exchange
//! staged messages ([`wire::StageHdr`]):
//! * RDMA write (with immediate): the initiator sends the local range in chunks of at most
//!   [`wire::STAGE_CHUNK`] bytes, each with the target heap offset and the initiator's token; the
//!   target checks the range against its heap, copies the chunk into place and acknowledges it with
//!   a status. The chunk carrying the immediate (the last) leaves only once every earlier chunk is
//!   acknowledged, and the target produces the RX completion after copying it, so the immediate
//!   never precedes the data. The TX completion is written when every chunk is acknowledged, with
//!   the first error status any ack (or send) reported.
//! * RDMA read: the initiator sends a request (offset, length); the target checks it, copies out and
//!   replies with data chunks (or one error reply); the initiator copies them into the local range
//!   and completes when all bytes are in.
//!
//! Copies are batched: before sending, the consumer copies the next chunk of up to
//! [`PREFETCH_MAX`] outbox items out of GPU memory with one stream synchronisation, and the write
//! chunks received in one CQ poll are copied into place as one batch, their acks and immediates
//! following the wait in arrival order (any other message first flushes the batch). The staging
//! buffers are pinned, so the copies are DMA.
//!
//! Messages wait in an outbox for send buffers (replies first) and are retried from the consumer
//! loop when the provider says `-FI_EAGAIN`; nothing blocks the thread. A stopping queue flushes
//! what is in flight; replies for flushed WQEs are ignored (the token names the WQE's count and
//! slot). SEND and AMO messages are unchanged (their payloads already go through bounce buffers, and
//! AMOs on GPU memory use [`cuda::memcpy`]).
//!
//! # Flow control and robustness
//! The consumer never takes WQE `n` before `ctrl.done > n - sq_entries` (so the CQ cannot overflow even
//! with a misbehaving poster), ignores a doorbell value that announces more than `sq_entries` new
//! WQEs (logged), polls without blocking (yielding the CPU between polls once connected, see
//! `backoff`), and stops when asked (in-flight operations get a
//! bounded time to complete; what is left gets `FLUSHED` completions).
use std::collections::VecDeque;
use std::ffi::c_void;
use std::mem::offset_of;
use std::ptr;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cuda;
use crate::efa::cqe::{self, CqStatus, RxCqe, TxCqe, AH_UNKNOWN, RX_CQE_EX_SIZE, TX_CQE_SIZE};
use crate::efa::wqe::{self, OpType, SendPayload, WqeDesc, WqeError, WqeOp, WQE_SIZE};
use crate::fabric::{
    sys as fi, AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, FiAddr, OpContexts,
};

use super::error::{GdaError, Result};
use super::mem::{self, CtrlMem, CtrlPlacement, SharedMem};
use super::mr::OwnedMr;
use super::state::{
    NvshmemEfaGdaHostCtrl, NvshmemEfaGdaQueue, NvshmemEfaGdaQueueCtrl, NVSHMEM_EFA_GDA_MODE_SOFT,
};
use super::wire::{
    self, AmoError, AmoMsg, SendHdr, StageHdr, SEND_HDR_SIZE, SOFT_RKEY_HEAP, SOFT_SEND_MAX,
    STAGE_CHUNK, STAGE_HDR_SIZE, STAGE_READ_DATA, STAGE_READ_REQ, STAGE_SLOT, STAGE_WRITE,
    STAGE_WRITE_ACK,
};

/// Size of one RX completion of the software queue (the extended EFA receive form).
pub const SOFT_RX_CQE_SIZE: u32 = RX_CQE_EX_SIZE as u32;
/// Size of one TX completion.
pub const SOFT_TX_CQE_SIZE: u32 = TX_CQE_SIZE as u32;

const TAG_TX: u64 = 1;
const TAG_RX: u64 = 2;
/// A staged-transfer message leaving a send buffer (value: the buffer index).
const TAG_STX: u64 = 3;
/// WQEs taken per loop turn before the CQ is polled again.
const BURST: usize = 64;
/// Most staged chunks copied out of GPU memory in one batch.
const PREFETCH_MAX: usize = 64;
/// How long a stopping consumer waits for in-flight operations.
const STOP_DRAIN: Duration = Duration::from_secs(5);
/// Minimum interval between reads of device-memory control words while blocked on them.
const CTRL_REFRESH: Duration = Duration::from_micros(50);
/// A consumer with work outstanding that makes no progress for this long logs its state (and
/// again after each further period while the stall lasts).
const STALL_REPORT: Duration = Duration::from_secs(5);
/// Rejections logged at warn level per queue before switching to debug.
const WARN_REJECTS: u64 = 16;

/// Geometry and placement of a software queue.
#[derive(Clone, Debug)]
pub struct SoftQueueConfig {
    /// SQ depth (power of two, 2 to 32768); the CQ has as many entries.
    pub sq_depth: u32,
    /// Doorbell batch limit published to posters.
    pub max_batch: u32,
    /// RX ring depth (power of two).
    pub rx_entries: u32,
    /// Receive buffers kept posted.
    pub rx_buffers: usize,
    /// Bounce buffers for SENDs.
    pub send_buffers: usize,
    /// Where the control block lives.
    pub ctrl: CtrlPlacement,
    /// Which RDMA transfers move by staged messages.
    pub staging: Staging,
}

/// Which RDMA transfers the queue moves by staged messages (host buffers, copies on a non-blocking
/// CUDA stream) instead of handing the memory to the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Staging {
    /// Never: the provider moves every buffer (FI_HMEM for GPU memory).
    #[default]
    Off,
    /// Transfers that touch GPU memory (the local buffer, or this PE's heap, taken as the kind of
    /// every PE's symmetric heap).
    Device,
    /// Every RDMA transfer, host memory included (exercises the path without a GPU).
    All,
}

impl Staging {
    /// The policy `NVSHMEM_EFA_GPU_STAGING` asks for on a provider (`prov_name`, `fabric_name`):
    /// auto stages GPU memory on every provider but efa-direct, verbs and cxi (whose NICs write GPU
    /// memory themselves); the software providers copy it with `cudaMemcpy` on the legacy default
    /// stream, which waits for the very kernel that waits for the copy.
    pub fn for_provider(gpu_staging: Option<bool>, prov_name: &str, fabric_name: &str) -> Staging {
        match gpu_staging {
            Some(true) => Staging::All,
            Some(false) => Staging::Off,
            None => {
                let nic = (prov_name.starts_with("efa") && fabric_name == "efa-direct")
                    || prov_name.contains("verbs")
                    || prov_name.contains("cxi");
                if nic {
                    Staging::Off
                } else {
                    Staging::Device
                }
            }
        }
    }
}

impl SoftQueueConfig {
    /// The geometry the configuration asks for, with defaults for the rest.
    pub fn new(sq_depth: u32, max_batch: u32, ctrl: CtrlPlacement) -> SoftQueueConfig {
        SoftQueueConfig {
            sq_depth,
            max_batch,
            rx_entries: sq_depth.clamp(256, 65536),
            rx_buffers: 128,
            send_buffers: (sq_depth as usize).clamp(16, 256),
            ctrl,
            staging: Staging::Off,
        }
    }

    fn check(&self) -> Result<()> {
        if !self.sq_depth.is_power_of_two() || !(2..=32768).contains(&self.sq_depth) {
            return Err(GdaError::invalid(format!(
                "SQ depth {} is not a power of two from 2 to 32768",
                self.sq_depth
            )));
        }
        if !self.rx_entries.is_power_of_two() || !(2..=(1 << 20)).contains(&self.rx_entries) {
            return Err(GdaError::invalid(format!(
                "RX ring depth {} is not a power of two",
                self.rx_entries
            )));
        }
        if self.max_batch == 0 {
            return Err(GdaError::invalid("max_batch must be at least 1"));
        }
        if self.rx_buffers == 0 || self.send_buffers == 0 {
            return Err(GdaError::invalid(
                "the software queue needs receive and send buffers",
            ));
        }
        Ok(())
    }
}

/// Counters of a software queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftQueueStats {
    /// WQEs read out of the ring.
    pub consumed: u64,
    /// WQEs answered with an error completion without being executed.
    pub rejected: u64,
    /// TX completions written (all statuses).
    pub completed: u64,
    /// RX completions written into the RX ring.
    pub rx_produced: u64,
    /// RX completions waiting for room in the RX ring.
    pub rx_pending: u64,
    /// AMO messages applied to the local heap.
    pub amos_applied: u64,
}

/// Host pointers of a software queue whose control block is in host memory: what a CPU thread
/// needs to play the GPU's part.
#[derive(Clone, Copy, Debug)]
pub struct HostView {
    /// SQ ring.
    pub sq: *mut u8,
    /// Doorbell record.
    pub doorbell: *mut u32,
    /// CQ ring.
    pub cq: *mut u8,
    /// RX ring.
    pub rx: *mut u8,
    /// Control block (`NvshmemEfaGdaQueueCtrl`).
    pub ctrl: *mut u8,
    /// Per-slot status words.
    pub slot_status: *mut u32,
    /// Host control words (`NvshmemEfaGdaHostCtrl`).
    pub host_ctrl: *mut u8,
    /// SQ depth.
    pub sq_entries: u32,
    /// CQ depth.
    pub cq_entries: u32,
    /// RX ring depth.
    pub rx_entries: u32,
    /// Doorbell batch limit.
    pub max_batch: u32,
}

// SAFETY: plain addresses of memory owned by the queue; users access it atomically/volatilely.
unsafe impl Send for HostView {}
// SAFETY: as above.
unsafe impl Sync for HostView {}

#[derive(Clone, Copy, Debug)]
struct RingLayout {
    sq: usize,
    cq: usize,
    rx: usize,
    doorbell: usize,
    host_ctrl: usize,
    total: usize,
}

fn align64(x: usize) -> usize {
    (x + 63) & !63
}

impl RingLayout {
    fn new(sq_entries: u32, cq_entries: u32, rx_entries: u32) -> RingLayout {
        let sq = 0;
        let cq = align64(sq + sq_entries as usize * WQE_SIZE);
        let rx = align64(cq + cq_entries as usize * TX_CQE_SIZE);
        let doorbell = align64(rx + rx_entries as usize * RX_CQE_EX_SIZE);
        let host_ctrl = doorbell + 64;
        let total = host_ctrl + std::mem::size_of::<NvshmemEfaGdaHostCtrl>();
        RingLayout {
            sq,
            cq,
            rx,
            doorbell,
            host_ctrl,
            total,
        }
    }
}

const CTRL_SIZE: usize = std::mem::size_of::<NvshmemEfaGdaQueueCtrl>();
const OFF_DONE: usize = offset_of!(NvshmemEfaGdaQueueCtrl, done);
const OFF_RESV: usize = offset_of!(NvshmemEfaGdaQueueCtrl, resv);
const OFF_READY: usize = offset_of!(NvshmemEfaGdaQueueCtrl, ready);
const OFF_CQ_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, cq_ci);
/// `first_error` (low 32 bits) and `cq_lock` (high 32 bits) as one little-endian word.
const OFF_FIRST_ERROR: usize = offset_of!(NvshmemEfaGdaQueueCtrl, first_error);
const OFF_RX_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, rx_ci);
const HC_CONSUMED: usize = offset_of!(NvshmemEfaGdaHostCtrl, consumed);
const HC_REJECTED: usize = offset_of!(NvshmemEfaGdaHostCtrl, rejected);
const HC_RX_PRODUCED: usize = offset_of!(NvshmemEfaGdaHostCtrl, rx_produced);
const HC_HEARTBEAT: usize = offset_of!(NvshmemEfaGdaHostCtrl, heartbeat);
const HC_STOPPED: usize = offset_of!(NvshmemEfaGdaHostCtrl, stopped);

/// One local registration the queue knows (lkey = index + 1).
#[derive(Clone, Copy, Debug)]
struct LocalReg {
    /// Address kernels put into WQEs.
    dev_base: u64,
    /// Address libfabric and the host use.
    host_base: u64,
    len: u64,
    desc: usize,
    device: bool,
}

impl LocalReg {
    /// Host address of `[addr, addr+len)` if it lies inside the registration.
    fn translate(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.dev_base)?;
        if off > self.len || len > self.len - off {
            return None;
        }
        Some(self.host_base + off)
    }
}

#[derive(Clone, Copy, Debug)]
struct RemoteHeap {
    base: u64,
    size: u64,
    key: u64,
}

#[derive(Clone, Debug)]
struct Peer {
    fi_addr: FiAddr,
    qpn: u16,
    heap: Option<RemoteHeap>,
}

#[derive(Clone, Debug, Default)]
struct Tables {
    my_pe: i32,
    qkey: u32,
    peers: Vec<Peer>,
    locals: Vec<Option<LocalReg>>,
    heap_lkey: Option<u32>,
}

impl Tables {
    fn local(&self, lkey: u32) -> Option<&LocalReg> {
        let i = (lkey as usize).checked_sub(wire::SOFT_LKEY_FIRST as usize)?;
        self.locals.get(i)?.as_ref()
    }

    fn heap(&self) -> Option<&LocalReg> {
        self.local(self.heap_lkey?)
    }

    fn my_qpn(&self) -> u16 {
        if self.peers.is_empty() {
            0
        } else {
            wire::soft_qpn(self.my_pe)
        }
    }
}

/// Registered host buffers: `count` slots of `slot` bytes.
struct BufPool {
    mem: SharedMem,
    mr: Option<OwnedMr>,
    slot: usize,
    count: usize,
}

impl BufPool {
    fn new(domain: &Arc<Domain>, ep: &Endpoint, slot: usize, count: usize) -> Result<BufPool> {
        // Pinned (CUDA-mapped) when CUDA is usable: staged GPU data is copied in and out of these
        // buffers, and pinned memory makes those copies DMA.
        let mem = SharedMem::new(slot * count, mem::cuda_usable())?;
        // SAFETY: the memory is owned by the pool, which keeps the registration and drops it first
        // (field order); the endpoint belongs to `domain`.
        let mr = unsafe {
            OwnedMr::register(
                domain,
                mem.host() as u64,
                (slot * count) as u64,
                Some(ep.as_ptr()),
            )?
        };
        Ok(BufPool {
            mem,
            mr: Some(mr),
            slot,
            count,
        })
    }

    fn ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.count);
        // SAFETY: in bounds of the allocation.
        unsafe { self.mem.host().add(i * self.slot) }
    }

    fn desc(&self) -> *mut c_void {
        self.mr.as_ref().map_or(ptr::null_mut(), |m| m.desc())
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        // The registration goes before the memory.
        self.mr.take();
    }
}

/// State shared between the queue handle and its consumer thread. Field order is drop order: the
/// endpoint closes (cancelling what is in flight) before the contexts, buffers and rings it used.
struct Inner {
    ep: Endpoint,
    ctxs: OpContexts,
    rx_bufs: BufPool,
    send_bufs: BufPool,
    rings: SharedMem,
    ctrl: CtrlMem,
    layout: RingLayout,
    sq_entries: u32,
    cq_entries: u32,
    rx_entries: u32,
    max_batch: u32,
    tables: Mutex<Arc<Tables>>,
    generation: AtomicU64,
    stop: AtomicBool,
    cq_data_wide: bool,
    virt_addr: bool,
    completed: AtomicU64,
    rx_pending: AtomicU64,
    amos_applied: AtomicU64,
    cuda_ctx: usize,
    staging: Staging,
}

impl Inner {
    fn ring(&self, off: usize) -> *mut u8 {
        // SAFETY: offsets come from the layout the ring memory was sized with.
        unsafe { self.rings.host().add(off) }
    }

    fn host_ctrl_word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-byte aligned word inside the host control block, which lives as long as self.
        unsafe { mem::atomic_u64(self.ring(self.layout.host_ctrl + off)) }
    }
}

/// A software EFA queue with its consumer thread.
pub struct SoftQueue {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl SoftQueue {
    /// Creates the queue on a dedicated endpoint of `domain` (own AV and CQ) and starts its consumer.
    pub fn new(domain: &Arc<Domain>, cfg: &SoftQueueConfig) -> Result<SoftQueue> {
        cfg.check()?;
        let sq_entries = cfg.sq_depth;
        let cq_entries = cfg.sq_depth;
        let rx_entries = cfg.rx_entries;
        let info = domain.info();
        let cq_size = (2 * sq_entries as usize + cfg.rx_buffers + 1024).max(4096);
        let av = AddressVector::open(domain, 64)?;
        let cq = CompletionQueue::open(domain, cq_size)?;
        let ep = Endpoint::open(domain, &av, &cq, None)?;
        // A queue that stages receives and sends whole staged chunks; the others SENDs only.
        let buf_size = if cfg.staging == Staging::Off {
            SEND_HDR_SIZE + SOFT_SEND_MAX
        } else {
            STAGE_SLOT
        };
        let rx_bufs = BufPool::new(domain, &ep, buf_size, cfg.rx_buffers)?;
        let send_bufs = BufPool::new(domain, &ep, buf_size, cfg.send_buffers)?;
        let layout = RingLayout::new(sq_entries, cq_entries, rx_entries);
        let cuda = mem::cuda_usable();
        let rings = SharedMem::new(layout.total, cuda)?;
        let ctrl = CtrlMem::new(CTRL_SIZE + 4 * sq_entries as usize, cfg.ctrl)?;
        let inner = Arc::new(Inner {
            ep,
            ctxs: OpContexts::new(sq_entries as usize + cfg.rx_buffers + cfg.send_buffers + 8),
            rx_bufs,
            send_bufs,
            rings,
            ctrl,
            layout,
            sq_entries,
            cq_entries,
            rx_entries,
            max_batch: cfg.max_batch,
            tables: Mutex::new(Arc::new(Tables::default())),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            cq_data_wide: info.cq_data_size() >= 8,
            virt_addr: info.virt_addr(),
            completed: AtomicU64::new(0),
            rx_pending: AtomicU64::new(0),
            amos_applied: AtomicU64::new(0),
            cuda_ctx: cuda::current_context(),
            staging: cfg.staging,
        });
        let mut consumer = Consumer::new(inner.clone());
        consumer.post_all_receives()?;
        let thread = std::thread::Builder::new()
            .name("nvshmem-efa-softq".into())
            .spawn(move || consumer.run())
            .map_err(|e| GdaError::io(format!("cannot start the software queue thread: {e}")))?;
        tracing::info!(
            "software EFA queue: {sq_entries} x 64 B WQEs, CQ {cq_entries} x 16 B, RX {rx_entries} x 32 B, \
             rings in {} memory, control block in {} memory, provider {}, staging {:?}",
            if inner.rings.is_mapped() { "CUDA-mapped host" } else { "plain host" },
            if inner.ctrl.host().is_some() { "host" } else { "device" },
            info.provider_name(),
            cfg.staging
        );
        Ok(SoftQueue {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Raw name of the queue's endpoint.
    pub fn name(&self) -> Result<Vec<u8>> {
        Ok(self.inner.ep.name()?)
    }

    /// The queue's endpoint (to bind registrations on `FI_MR_ENDPOINT` providers).
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.ep
    }

    /// Inserts `count` names (stored back to back) into the endpoint's AV.
    pub fn insert_names(&self, names: &[u8], count: usize) -> Result<Vec<FiAddr>> {
        Ok(self.inner.ep.av().insert(names, count)?)
    }

    fn update(&self, f: impl FnOnce(&mut Tables) -> Result<()>) -> Result<()> {
        let mut g = self.inner.tables.lock();
        let mut t = (**g).clone();
        f(&mut t)?;
        *g = Arc::new(t);
        self.inner.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Sets the peer table: this PE, the per-job qkey and every PE's address in the AV.
    pub fn set_peers(&self, my_pe: i32, qkey: u32, fi_addrs: &[FiAddr]) -> Result<()> {
        let n = fi_addrs.len() as i32;
        if n == 0 || n > wire::SOFT_MAX_PES || my_pe < 0 || my_pe >= n {
            return Err(GdaError::invalid(format!(
                "PE {my_pe} of {n}: bad peer table for the software queue"
            )));
        }
        self.update(|t| {
            let old: Vec<Option<RemoteHeap>> = t.peers.iter().map(|p| p.heap).collect();
            t.my_pe = my_pe;
            t.qkey = qkey;
            t.peers = fi_addrs
                .iter()
                .enumerate()
                .map(|(i, &a)| Peer {
                    fi_addr: a,
                    qpn: wire::soft_qpn(i as i32),
                    heap: old.get(i).copied().flatten(),
                })
                .collect();
            Ok(())
        })
    }

    /// Records PE `pe`'s heap (base address kernels use, size, libfabric key).
    pub fn set_remote_heap(&self, pe: i32, base: u64, size: u64, key: u64) -> Result<()> {
        self.update(|t| {
            let p = usize::try_from(pe)
                .ok()
                .and_then(|i| t.peers.get_mut(i))
                .ok_or_else(|| GdaError::invalid(format!("PE {pe} is not connected")))?;
            p.heap = Some(RemoteHeap { base, size, key });
            Ok(())
        })
    }

    /// Adds a local registration and returns its soft lkey.
    ///
    /// # Safety
    /// `desc` must be the descriptor of a registration of `[host_base, host_base+len)` on this
    /// queue's domain that stays open, and the memory stay allocated, until the queue is dropped or
    /// the registration removed with [`SoftQueue::remove_local`].
    pub unsafe fn add_local(
        &self,
        dev_base: u64,
        host_base: u64,
        len: u64,
        desc: *mut c_void,
        device: bool,
    ) -> Result<u32> {
        let mut lkey = 0;
        self.update(|t| {
            let reg = LocalReg {
                dev_base,
                host_base,
                len,
                desc: desc as usize,
                device,
            };
            let idx = match t.locals.iter().position(|r| r.is_none()) {
                Some(i) => {
                    t.locals[i] = Some(reg);
                    i
                }
                None => {
                    t.locals.push(Some(reg));
                    t.locals.len() - 1
                }
            };
            lkey = idx as u32 + wire::SOFT_LKEY_FIRST;
            if lkey > wqe::LKEY_MASK {
                t.locals[idx] = None;
                return Err(GdaError::nomem("no soft lkey left (24 bits)"));
            }
            Ok(())
        })?;
        Ok(lkey)
    }

    /// Forgets a local registration. In-flight operations that use it finish first only if the caller
    /// waited for them (quiet).
    pub fn remove_local(&self, lkey: u32) -> Result<()> {
        self.update(|t| {
            let i = (lkey as usize).wrapping_sub(wire::SOFT_LKEY_FIRST as usize);
            match t.locals.get_mut(i) {
                Some(r @ Some(_)) => {
                    *r = None;
                    if t.heap_lkey == Some(lkey) {
                        t.heap_lkey = None;
                    }
                    Ok(())
                }
                _ => Err(GdaError::invalid(format!("lkey {lkey} is not registered"))),
            }
        })
    }

    /// Names the local registration that is the symmetric heap (target of AMO messages).
    pub fn set_heap(&self, lkey: u32) -> Result<()> {
        self.update(|t| {
            if t.local(lkey).is_none() {
                return Err(GdaError::invalid(format!("lkey {lkey} is not registered")));
            }
            t.heap_lkey = Some(lkey);
            Ok(())
        })
    }

    /// The queue as kernels see it.
    pub fn queue_desc(&self) -> NvshmemEfaGdaQueue {
        let i = &self.inner;
        let base = i.rings.device();
        NvshmemEfaGdaQueue {
            sq: base + i.layout.sq as u64,
            sq_doorbell: base + i.layout.doorbell as u64,
            cq: base + i.layout.cq as u64,
            rx_cq: base + i.layout.rx as u64,
            ctrl: i.ctrl.device(),
            slot_status: i.ctrl.device() + CTRL_SIZE as u64,
            host_ctrl: base + i.layout.host_ctrl as u64,
            sq_entries: i.sq_entries,
            sq_entry_size: WQE_SIZE as u32,
            cq_entries: i.cq_entries,
            cq_entry_size: SOFT_TX_CQE_SIZE,
            rx_entries: i.rx_entries,
            max_batch: i.max_batch,
            qpn: i.tables.lock().my_qpn(),
            reserved: 0,
            mode: NVSHMEM_EFA_GDA_MODE_SOFT,
        }
    }

    /// Host pointers of the queue, when its control block is in host memory.
    pub fn host_view(&self) -> Option<HostView> {
        let i = &self.inner;
        let ctrl = i.ctrl.host()?;
        Some(HostView {
            sq: i.ring(i.layout.sq),
            doorbell: i.ring(i.layout.doorbell) as *mut u32,
            cq: i.ring(i.layout.cq),
            rx: i.ring(i.layout.rx),
            ctrl,
            // SAFETY: the status words follow the control block inside the same allocation.
            slot_status: unsafe { ctrl.add(CTRL_SIZE) } as *mut u32,
            host_ctrl: i.ring(i.layout.host_ctrl),
            sq_entries: i.sq_entries,
            cq_entries: i.cq_entries,
            rx_entries: i.rx_entries,
            max_batch: i.max_batch,
        })
    }

    /// Counters.
    pub fn stats(&self) -> SoftQueueStats {
        let i = &self.inner;
        SoftQueueStats {
            consumed: i.host_ctrl_word(HC_CONSUMED).load(Ordering::Acquire),
            rejected: i.host_ctrl_word(HC_REJECTED).load(Ordering::Acquire),
            completed: i.completed.load(Ordering::Acquire),
            rx_produced: i.host_ctrl_word(HC_RX_PRODUCED).load(Ordering::Acquire),
            rx_pending: i.rx_pending.load(Ordering::Acquire),
            amos_applied: i.amos_applied.load(Ordering::Acquire),
        }
    }

    /// Which transfers the queue stages.
    pub fn staging(&self) -> Staging {
        self.inner.staging
    }

    /// Whether the consumer thread has stopped.
    pub fn stopped(&self) -> bool {
        self.inner
            .host_ctrl_word(HC_STOPPED)
            .load(Ordering::Acquire)
            != 0
    }

    /// Stops the consumer (bounded wait for in-flight operations) and joins it. Idempotent.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.lock().take() {
            if h.join().is_err() {
                tracing::error!("software queue thread panicked");
            }
        }
    }
}

impl Drop for SoftQueue {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A validated WQE, ready to post.
#[derive(Clone, Copy, Debug)]
enum Action {
    Write {
        local: u64,
        len: usize,
        desc: usize,
        dest: FiAddr,
        raddr: u64,
        key: u64,
        data: Option<u64>,
    },
    Read {
        local: u64,
        len: usize,
        desc: usize,
        dest: FiAddr,
        raddr: u64,
        key: u64,
    },
    Send {
        dest: FiAddr,
        hdr: SendHdr,
        payload: Payload,
    },
    /// RDMA write (with immediate) by staged messages: `off` is the offset in the target's heap.
    StagedWrite {
        local: u64,
        len: usize,
        device: bool,
        dest: FiAddr,
        off: u64,
        imm: Option<u32>,
    },
    /// RDMA read by staged messages.
    StagedRead {
        local: u64,
        len: usize,
        device: bool,
        dest: FiAddr,
        off: u64,
    },
}

#[derive(Clone, Copy, Debug)]
enum Payload {
    Inline([u8; wqe::INLINE_MAX], usize),
    Sgl([Option<(u64, usize, bool)>; 2]),
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    pc: u64,
    req_id: u16,
    op: OpType,
    action: Action,
    slot: Option<u32>,
    bounce: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    req_id: u16,
    op: OpType,
    bounce: Option<u32>,
    stage: Option<Stage>,
}

/// Progress of a staged WQE. Its completion is written once nothing of it is queued or deferred
/// and no reply is awaited.
#[derive(Clone, Copy, Debug)]
struct Stage {
    token: u64,
    /// Messages sent whose reply has not come (write chunks; the read request until its data is in).
    awaiting: u32,
    /// Part of it still sits in the outbox.
    queued: bool,
    /// The last chunk of a write with immediate, held until every earlier chunk is acknowledged
    /// (so the immediate never arrives before the data).
    deferred: Option<OutItem>,
    /// Worst status so far.
    status: CqStatus,
    /// Read: local destination (host address), whether it is GPU memory, bytes still to come.
    read_dst: u64,
    read_device: bool,
    read_len: u64,
    read_left: u64,
}

/// A staged message (or a run of chunks) waiting for a send buffer.
#[derive(Clone, Copy, Debug)]
struct OutItem {
    dest: FiAddr,
    kind: u8,
    token: u64,
    status: CqStatus,
    imm: Option<u32>,
    /// Host address of the bytes to carry (0: none).
    src: u64,
    device: bool,
    /// Offset field of the first chunk (heap offset, or offset into the read).
    off: u64,
    /// Bytes of the whole range.
    len: u64,
    /// Bytes already sent.
    sent: u64,
    /// Messages already sent.
    msgs: u32,
    /// Slot of this queue's own WQE the item belongs to (replies to peers have none).
    owner: Option<u32>,
    /// Send buffer that already holds the next chunk's payload (copied out of GPU memory in a
    /// batch, see `Consumer::prefetch_outbox`), and that chunk's length.
    prepared: Option<(u32, u64)>,
}

/// Token of a staged WQE: its producer count's low 32 bits and its slot.
fn stage_token(pc: u64, slot: u32) -> u64 {
    (pc << 32) | u64::from(slot)
}

/// A rejection: the completion status and the reason for the log.
type Reject = (CqStatus, String);

fn wqe_error_status(e: &WqeError) -> CqStatus {
    match e {
        WqeError::UnknownOpType(_) | WqeError::ImmediateWithRead => CqStatus::LocalUnsupportedOp,
        WqeError::InlineTooLong { .. }
        | WqeError::BadDescriptorCount { .. }
        | WqeError::ZeroLength { .. }
        | WqeError::LengthMismatch { .. } => CqStatus::LocalBadLength,
        WqeError::LkeyTooWide { .. } => CqStatus::LocalInvalidLkey,
        _ => CqStatus::LocalQpInternalError,
    }
}

/// Maps a libfabric error code (negative or positive errno) to the EFA status closest in meaning.
pub fn fabric_error_status(code: i32) -> CqStatus {
    let e = code.unsigned_abs();
    match e {
        x if x == fi::FI_ECANCELED => CqStatus::Flushed,
        x if x == fi::FI_EINVAL
            || x == fi::FI_EACCES
            || x == fi::FI_EKEYREJECTED
            || x == fi::FI_ENOKEY =>
        {
            CqStatus::RemoteBadAddress
        }
        x if x == fi::FI_EMSGSIZE || x == fi::FI_ETRUNC || x == fi::FI_ETOOSMALL => {
            CqStatus::RemoteBadLength
        }
        x if x == fi::FI_ECONNRESET || x == fi::FI_ECONNABORTED => CqStatus::RemoteAbort,
        x if x == fi::FI_ENOTCONN
            || x == fi::FI_ECONNREFUSED
            || x == fi::FI_EHOSTUNREACH
            || x == fi::FI_ENETUNREACH
            || x == fi::FI_EADDRNOTAVAIL =>
        {
            CqStatus::LocalUnreachableRemote
        }
        x if x == fi::FI_ETIMEDOUT => CqStatus::LocalUnresponsiveRemote,
        x if x == fi::FI_EOPNOTSUPP || x == fi::FI_ENOSYS => CqStatus::LocalUnsupportedOp,
        x if x == fi::FI_ENOMEM => CqStatus::LocalQpInternalError,
        _ => CqStatus::RemoteBadStatus,
    }
}

fn amo_error_status(e: &AmoError) -> CqStatus {
    match e {
        AmoError::BadOp(_) => CqStatus::LocalUnsupportedOp,
        AmoError::BadSize(_) | AmoError::Reserved => CqStatus::LocalBadLength,
        AmoError::Misaligned(_) | AmoError::OutOfRange(_) => CqStatus::RemoteBadAddress,
    }
}

/// The consumer thread's state.
struct Consumer {
    inner: Arc<Inner>,
    tables: Arc<Tables>,
    generation: u64,
    ci: u64,
    cached_done: u64,
    done_checked: Option<Instant>,
    cq_pc: u64,
    rx_pc: u64,
    cached_rx_ci: u64,
    rx_ci_checked: Option<Instant>,
    rx_seq: u64,
    pending_rx: VecDeque<RxCqe>,
    rx_pending_warned: bool,
    stalled: Option<Pending>,
    slots: Vec<Option<InFlight>>,
    free_slots: Vec<u32>,
    free_bounce: Vec<u32>,
    in_flight: usize,
    rejected: u64,
    completed: u64,
    delivery_flags: u64,
    bad_doorbell: Option<u32>,
    heartbeat: u64,
    /// Staged messages waiting for a send buffer (replies first).
    outbox: VecDeque<OutItem>,
    /// Token of the WQE each send buffer's staged message awaits a reply for.
    buf_owner: Vec<Option<u64>>,
    /// Copies between GPU memory and the staging buffers, waited for together (None: no CUDA).
    copies: Option<cuda::CopyBatch>,
    /// Staged write chunks received whose copy into GPU memory is enqueued in `copies`: their
    /// acknowledgement (and immediate) waits for `flush_rx_batch`; (header, receive buffer).
    rx_batch: Vec<(StageHdr, usize)>,
}

impl Consumer {
    fn new(inner: Arc<Inner>) -> Consumer {
        let sq = inner.sq_entries;
        let bounce = inner.send_bufs.count as u32;
        let tables = inner.tables.lock().clone();
        Consumer {
            tables,
            generation: inner.generation.load(Ordering::Acquire),
            ci: 0,
            cached_done: 0,
            done_checked: None,
            cq_pc: 0,
            rx_pc: 0,
            cached_rx_ci: 0,
            rx_ci_checked: None,
            rx_seq: 0,
            pending_rx: VecDeque::new(),
            rx_pending_warned: false,
            stalled: None,
            slots: vec![None; sq as usize],
            free_slots: (0..sq).rev().collect(),
            free_bounce: (0..bounce).rev().collect(),
            in_flight: 0,
            rejected: 0,
            completed: 0,
            delivery_flags: u64::from(fi::FI_DELIVERY_COMPLETE),
            bad_doorbell: None,
            heartbeat: 0,
            outbox: VecDeque::new(),
            buf_owner: vec![None; bounce as usize],
            copies: None,
            rx_batch: Vec::new(),
            inner,
        }
    }

    fn run(mut self) {
        if let Err(e) = cuda::set_current_context(self.inner.cuda_ctx) {
            tracing::warn!("software queue thread: {e}");
        }
        let mut idle = 0u32;
        let mut stop_deadline: Option<Instant> = None;
        let mut last_work = Instant::now();
        let mut last_report = last_work;
        let mut taken_at_report = 0u64;
        loop {
            self.heartbeat += 1;
            self.inner
                .host_ctrl_word(HC_HEARTBEAT)
                .store(self.heartbeat, Ordering::Relaxed);
            self.refresh_tables();
            let mut work = self.poll_cq();
            work += self.flush_rx();
            work += self.pump_outbox();
            if self.inner.stop.load(Ordering::Acquire) {
                let deadline = *stop_deadline.get_or_insert_with(|| Instant::now() + STOP_DRAIN);
                if self.in_flight == 0 && self.stalled.is_none() && self.outbox.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    self.flush_in_flight();
                    break;
                }
                if self.stalled.is_some() {
                    work += self.retry_stalled();
                }
            } else {
                work += self.consume();
            }
            if work > 0 {
                idle = 0;
                last_work = Instant::now();
            } else {
                idle = idle.saturating_add(1);
                backoff(idle, !self.tables.peers.is_empty());
            }
            if self.heartbeat % 1024 == 0 {
                let now = Instant::now();
                if now - last_report >= STALL_REPORT {
                    self.report(now - last_work, now - last_report, taken_at_report);
                    last_report = now;
                    taken_at_report = self.ci;
                }
            }
        }
        if !self.pending_rx.is_empty() {
            tracing::warn!(
                "software queue stopped with {} receive completions the GPU never had room for",
                self.pending_rx.len()
            );
        }
        self.inner
            .host_ctrl_word(HC_STOPPED)
            .store(1, Ordering::Release);
        tracing::debug!(
            "software queue consumer stopped after {} WQEs ({} rejected)",
            self.ci,
            self.rejected
        );
    }

    /// Every `STALL_REPORT` while work is outstanding (in the consumer, or reserved by GPU posters
    /// and not yet taken): the queue's state, at debug level while it moves and as a warning once
    /// nothing moved for `STALL_REPORT` (`quiet`: time since the consumer last did anything). An
    /// idle queue is not reported.
    fn report(&mut self, quiet: Duration, period: Duration, taken_before: u64) {
        let db = self.doorbell();
        let pending_wqes = db.wrapping_sub(self.ci as u32);
        let word = |off: usize| self.inner.ctrl.read_u64(off).unwrap_or(u64::MAX);
        let resv = word(OFF_RESV);
        let ready = word(OFF_READY);
        let done = word(OFF_DONE);
        let cq_ci = word(OFF_CQ_CI);
        let err_lock = word(OFF_FIRST_ERROR);
        if self.in_flight == 0
            && self.outbox.is_empty()
            && self.stalled.is_none()
            && pending_wqes == 0
            && self.pending_rx.is_empty()
            && resv <= self.ci
        {
            return;
        }
        let stalled = quiet >= STALL_REPORT;
        if !stalled && !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let state = format!(
            "GPU side: {resv} slots reserved, {ready} committed, {done} done, CQ consumer {cq_ci}, \
             first error {:#x}, CQ lock {}. Consumer: doorbell {db}, {} WQEs taken ({pending_wqes} \
             announced but not taken), {} in flight, {} staged messages waiting for a send buffer \
             ({} free), {} WQE waiting for the provider, {} TX completions written, {} receive \
             completions waiting for ring space",
            err_lock & 0xffff_ffff,
            err_lock >> 32,
            self.ci,
            self.in_flight,
            self.outbox.len(),
            self.free_bounce.len(),
            usize::from(self.stalled.is_some()),
            self.cq_pc,
            self.pending_rx.len()
        );
        if stalled {
            tracing::warn!(
                "software queue: no progress for {:.1} s. {state}",
                quiet.as_secs_f64()
            );
        } else {
            tracing::debug!(
                "software queue: {} WQEs taken in the last {:.1} s. {state}",
                self.ci - taken_before,
                period.as_secs_f64()
            );
        }
    }

    fn refresh_tables(&mut self) {
        let g = self.inner.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.tables = self.inner.tables.lock().clone();
            self.generation = g;
        }
    }

    fn post_all_receives(&mut self) -> Result<()> {
        for i in 0..self.inner.rx_bufs.count {
            self.post_receive(i)?;
        }
        Ok(())
    }

    fn post_receive(&mut self, i: usize) -> Result<()> {
        let inner = self.inner.clone();
        let ctx = inner.ctxs.alloc(TAG_RX, i as u64).ok_or_else(|| {
            GdaError::io("software queue: out of operation contexts for receives")
        })?;
        let mut tries = 0u32;
        loop {
            // SAFETY: the buffer and the context belong to the queue and stay valid until the
            // completion is reaped or the endpoint is closed (which happens before they are freed).
            let r = unsafe {
                inner.ep.recv(
                    inner.rx_bufs.ptr(i),
                    inner.rx_bufs.slot,
                    inner.rx_bufs.desc(),
                    ctx,
                )
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) if e.is_again() && tries < 100_000 => {
                    tries += 1;
                    let _ = self.poll_cq();
                }
                Err(e) => {
                    inner.ctxs.free(ctx);
                    return Err(e.into());
                }
            }
        }
    }

    // ---- SQ side ----

    fn doorbell(&self) -> u32 {
        // SAFETY: the doorbell word lives in the ring memory for the life of the queue.
        let v = unsafe { mem::atomic_u32(self.inner.ring(self.inner.layout.doorbell)) }
            .load(Ordering::Acquire);
        fence(Ordering::Acquire);
        v
    }

    fn refresh_done(&mut self) -> bool {
        if let Some(t) = self.done_checked {
            if self.inner.ctrl.host().is_none() && t.elapsed() < CTRL_REFRESH {
                return false;
            }
        }
        self.done_checked = Some(Instant::now());
        match self.inner.ctrl.read_u64(OFF_DONE) {
            Ok(d) if d > self.cached_done => {
                self.cached_done = d.min(self.ci);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!("software queue: {e}");
                false
            }
        }
    }

    fn consume(&mut self) -> usize {
        let mut work = 0;
        if self.stalled.is_some() {
            work += self.retry_stalled();
            if self.stalled.is_some() {
                return work;
            }
        }
        let db = self.doorbell();
        let avail = db.wrapping_sub(self.ci as u32);
        if avail == 0 {
            return work;
        }
        if avail > self.inner.sq_entries {
            if self.bad_doorbell != Some(db) {
                tracing::error!(
                    "software queue: doorbell {db} announces {avail} WQEs past the {} consumed, more than \
                     the ring holds ({}): ignored until it makes sense",
                    self.ci,
                    self.inner.sq_entries
                );
                self.bad_doorbell = Some(db);
            }
            return work;
        }
        for _ in 0..(avail as usize).min(BURST) {
            if self.ci >= self.cached_done + u64::from(self.inner.sq_entries)
                && !self.refresh_done()
            {
                break;
            }
            if self.ci >= self.cached_done + u64::from(self.inner.sq_entries) {
                break;
            }
            let pc = self.ci;
            let slot = (pc & u64::from(self.inner.sq_entries - 1)) as usize;
            // SAFETY: the slot lies inside the SQ ring; 64-byte aligned.
            let bytes: [u8; WQE_SIZE] = unsafe {
                mem::read_shared(self.inner.ring(self.inner.layout.sq + slot * WQE_SIZE))
            };
            self.ci += 1;
            self.inner
                .host_ctrl_word(HC_CONSUMED)
                .store(self.ci, Ordering::Release);
            work += 1;
            match self.validate(pc, &bytes) {
                Ok(p) => {
                    if let Err(p) = self.post(p) {
                        self.stalled = Some(p);
                        break;
                    }
                }
                Err((req_id, op, (status, why))) => self.reject(pc, req_id, op, status, &why),
            }
        }
        work
    }

    fn reject(&mut self, pc: u64, req_id: u16, op: OpType, status: CqStatus, why: &str) {
        self.rejected += 1;
        self.inner
            .host_ctrl_word(HC_REJECTED)
            .store(self.rejected, Ordering::Release);
        if self.rejected <= WARN_REJECTS {
            tracing::warn!("software queue: WQE {pc} rejected with status {status}: {why}");
            if self.rejected == WARN_REJECTS {
                tracing::warn!("software queue: further rejected WQEs are logged at debug level");
            }
        } else {
            tracing::debug!("software queue: WQE {pc} rejected with status {status}: {why}");
        }
        self.push_tx_cqe(req_id, status, op);
    }

    fn validate(
        &mut self,
        pc: u64,
        bytes: &[u8; WQE_SIZE],
    ) -> std::result::Result<Pending, (u16, OpType, Reject)> {
        let expected_id = pc as u16;
        let raw_op = OpType::from_raw(bytes[2] & wqe::CTRL1_OP_TYPE_MASK).unwrap_or(OpType::Send);
        let fail = |status: CqStatus, why: String| (expected_id, raw_op, (status, why));
        let req_id = u16::from_le_bytes([bytes[0], bytes[1]]);
        if req_id != expected_id {
            return Err(fail(
                CqStatus::LocalQpInternalError,
                format!("request id {req_id:#06x} is not the producer count's low 16 bits {expected_id:#06x}"),
            ));
        }
        let desc = wqe::decode(bytes)
            .map_err(|e| fail(wqe_error_status(&e), format!("malformed WQE: {e}")))?;
        let want_phase = wqe::phase_for(pc, self.inner.sq_entries);
        if desc.phase != want_phase {
            return Err(fail(
                CqStatus::LocalQpInternalError,
                format!(
                    "phase {} where {want_phase} was expected (stale or misplaced WQE)",
                    desc.phase
                ),
            ));
        }
        let op = desc.op.op_type();
        let action = self
            .check_semantics(&desc)
            .map_err(|(s, w)| (expected_id, op, (s, w)))?;
        Ok(Pending {
            pc,
            req_id: expected_id,
            op,
            action,
            slot: None,
            bounce: None,
        })
    }

    fn check_semantics(&self, d: &WqeDesc) -> std::result::Result<Action, Reject> {
        let t = &self.tables;
        let peer = t.peers.get(usize::from(d.ah)).ok_or_else(|| {
            (
                CqStatus::LocalInvalidAh,
                format!("address handle {} (connected PEs: {})", d.ah, t.peers.len()),
            )
        })?;
        if d.dest_qpn != peer.qpn {
            return Err((
                CqStatus::RemoteBadDestQpn,
                format!(
                    "dest_qp_num {} where PE {} has {}",
                    d.dest_qpn, d.ah, peer.qpn
                ),
            ));
        }
        if d.qkey != t.qkey {
            return Err((
                CqStatus::LocalUnreachableRemote,
                format!("qkey {:#x} where the job's is {:#x}", d.qkey, t.qkey),
            ));
        }
        let local =
            |addr: u64, lkey: u32, len: u64| -> std::result::Result<(LocalReg, u64), Reject> {
                let reg = t.local(lkey).ok_or_else(|| {
                    (
                        CqStatus::LocalInvalidLkey,
                        format!("lkey {lkey} is not registered"),
                    )
                })?;
                let host = reg.translate(addr, len).ok_or_else(|| {
                    (
                        CqStatus::LocalInvalidLkey,
                        format!(
                            "local range {addr:#x}+{len} outside lkey {lkey} ({:#x}+{})",
                            reg.dev_base, reg.len
                        ),
                    )
                })?;
                Ok((*reg, host))
            };
        let remote =
            |raddr: u64, rkey: u32, len: u64| -> std::result::Result<(u64, u64, u64), Reject> {
                let h = peer.heap.ok_or_else(|| {
                    (
                        CqStatus::RemoteBadAddress,
                        format!("PE {}'s heap is not known", d.ah),
                    )
                })?;
                if rkey != SOFT_RKEY_HEAP {
                    return Err((
                        CqStatus::RemoteBadAddress,
                        format!("rkey {rkey} (the heap's is {SOFT_RKEY_HEAP})"),
                    ));
                }
                let off = raddr
                    .checked_sub(h.base)
                    .filter(|&o| o <= h.size && len <= h.size - o)
                    .ok_or_else(|| {
                        (
                            CqStatus::RemoteBadAddress,
                            format!(
                                "remote range {raddr:#x}+{len} outside PE {}'s heap ({:#x}+{})",
                                d.ah, h.base, h.size
                            ),
                        )
                    })?;
                Ok((if self.inner.virt_addr { raddr } else { off }, h.key, off))
            };
        match d.op {
            WqeOp::RdmaWrite {
                remote: r,
                local: l,
            }
            | WqeOp::RdmaWriteImm {
                remote: r,
                local: l,
                ..
            } => {
                let len = u64::from(l.len);
                let (reg, host) = if len == 0 {
                    let reg = t.local(l.lkey).ok_or_else(|| {
                        (
                            CqStatus::LocalInvalidLkey,
                            format!("lkey {} is not registered", l.lkey),
                        )
                    })?;
                    (*reg, reg.host_base)
                } else {
                    local(l.addr, l.lkey, len)?
                };
                let (raddr, key, off) = remote(r.addr, r.rkey, len)?;
                if self.stages(&reg) {
                    return Ok(Action::StagedWrite {
                        local: host,
                        len: len as usize,
                        device: reg.device,
                        dest: peer.fi_addr,
                        off,
                        imm: d.op.imm(),
                    });
                }
                let data =
                    d.op.imm()
                        .map(|imm| wire::write_imm_data(imm, t.my_pe, self.inner.cq_data_wide));
                Ok(Action::Write {
                    local: host,
                    len: len as usize,
                    desc: reg.desc,
                    dest: peer.fi_addr,
                    raddr,
                    key,
                    data,
                })
            }
            WqeOp::RdmaRead {
                remote: r,
                local: l,
            } => {
                let len = u64::from(l.len);
                let (reg, host) = local(l.addr, l.lkey, len)?;
                let (raddr, key, off) = remote(r.addr, r.rkey, len)?;
                if self.stages(&reg) {
                    return Ok(Action::StagedRead {
                        local: host,
                        len: len as usize,
                        device: reg.device,
                        dest: peer.fi_addr,
                        off,
                    });
                }
                Ok(Action::Read {
                    local: host,
                    len: len as usize,
                    desc: reg.desc,
                    dest: peer.fi_addr,
                    raddr,
                    key,
                })
            }
            WqeOp::Send { payload, imm } => {
                let (payload, len) = match payload {
                    SendPayload::Inline { len, data } => {
                        let n = usize::from(len).min(wqe::INLINE_MAX);
                        (Payload::Inline(data, n), n)
                    }
                    SendPayload::Sgl { first, second } => {
                        let mut parts = [None, None];
                        let mut total = 0usize;
                        for (i, b) in std::iter::once(first).chain(second).enumerate() {
                            let (reg, host) = local(b.addr, b.lkey, u64::from(b.len))?;
                            total += b.len as usize;
                            parts[i] = Some((host, b.len as usize, reg.device));
                        }
                        (Payload::Sgl(parts), total)
                    }
                };
                if len > SOFT_SEND_MAX {
                    return Err((
                        CqStatus::LocalBadLength,
                        format!("SEND of {len} bytes (the software queue carries {SOFT_SEND_MAX})"),
                    ));
                }
                if let Payload::Inline(data, n) = payload {
                    let heap = peer.heap.map_or(0, |h| h.size);
                    if let Some(Err(e)) = AmoMsg::parse(&data[..n], heap) {
                        return Err((
                            amo_error_status(&e),
                            format!("AMO message to PE {}: {e}", d.ah),
                        ));
                    }
                }
                let hdr = SendHdr {
                    src_pe: t.my_pe as u32,
                    imm,
                    len: len as u16,
                };
                Ok(Action::Send {
                    dest: peer.fi_addr,
                    hdr,
                    payload,
                })
            }
        }
    }

    /// Whether an RDMA transfer from or to `reg` is staged.
    fn stages(&self, reg: &LocalReg) -> bool {
        match self.inner.staging {
            Staging::Off => false,
            Staging::All => true,
            Staging::Device => reg.device || self.tables.heap().is_some_and(|h| h.device),
        }
    }

    fn retry_stalled(&mut self) -> usize {
        match self.stalled.take() {
            Some(p) => match self.post(p) {
                Ok(()) => 1,
                Err(p) => {
                    self.stalled = Some(p);
                    0
                }
            },
            None => 0,
        }
    }

    /// Posts a validated WQE. `Err` hands it back when the provider (or the bounce pool) asks to try
    /// again later; any other failure completes it with an error status.
    fn post(&mut self, mut p: Pending) -> std::result::Result<(), Pending> {
        if p.slot.is_none() {
            match self.free_slots.pop() {
                Some(s) => p.slot = Some(s),
                None => return Err(p),
            }
        }
        if let Some(item) = self.staged_item(&p) {
            self.start_staged(p, item);
            return Ok(());
        }
        if let Action::Send { hdr, payload, .. } = &p.action {
            if p.bounce.is_none() {
                let Some(b) = self.free_bounce.pop() else {
                    return Err(p);
                };
                p.bounce = Some(b);
                if let Err(why) = self.fill_bounce(b, hdr, payload) {
                    self.finish_failed(p, CqStatus::LocalQpInternalError, &why);
                    return Ok(());
                }
            }
        }
        let slot = p.slot.expect("slot set above");
        let inner = self.inner.clone();
        let Some(ctx) = inner.ctxs.alloc(TAG_TX, u64::from(slot)) else {
            return Err(p);
        };
        let r = loop {
            // SAFETY: every buffer was validated to lie inside a registration the queue keeps open
            // (or is one of the queue's bounce buffers); the context stays valid until the completion
            // is reaped or the endpoint is closed.
            let r = unsafe { self.issue(&inner, &p, ctx) };
            match r {
                Err(e)
                    if self.delivery_flags != 0
                        && (e.code == -(fi::FI_EBADFLAGS as i32)
                            || e.code == -(fi::FI_EOPNOTSUPP as i32)
                            || e.code == -(fi::FI_ENOSYS as i32)) =>
                {
                    tracing::info!("software queue: provider refuses FI_DELIVERY_COMPLETE ({e}); using its default completion");
                    self.delivery_flags = 0;
                }
                other => break other,
            }
        };
        match r {
            Ok(()) => {
                self.slots[slot as usize] = Some(InFlight {
                    req_id: p.req_id,
                    op: p.op,
                    bounce: p.bounce,
                    stage: None,
                });
                self.in_flight += 1;
                Ok(())
            }
            Err(e) if e.is_again() => {
                inner.ctxs.free(ctx);
                Err(p)
            }
            Err(e) => {
                inner.ctxs.free(ctx);
                let status = fabric_error_status(e.code);
                self.finish_failed(p, status, &e.to_string());
                Ok(())
            }
        }
    }

    /// # Safety
    /// `ctx` must be a context of the queue's pool; the buffers of `p` must be valid (see `post`).
    unsafe fn issue(
        &self,
        inner: &Inner,
        p: &Pending,
        ctx: *mut c_void,
    ) -> crate::fabric::Result<()> {
        let ep = inner.ep.as_ptr();
        match p.action {
            Action::Write {
                local,
                len,
                desc,
                dest,
                raddr,
                key,
                data,
            } => {
                let mut flags = self.delivery_flags;
                if data.is_some() {
                    flags |= u64::from(fi::FI_REMOTE_CQ_DATA);
                }
                // SAFETY: forwarded contract.
                unsafe {
                    rma_msg(
                        ep,
                        true,
                        local as *mut u8,
                        len,
                        desc as *mut c_void,
                        dest,
                        raddr,
                        key,
                        ctx,
                        data.unwrap_or(0),
                        flags,
                    )
                }
            }
            Action::Read {
                local,
                len,
                desc,
                dest,
                raddr,
                key,
            } => {
                // SAFETY: forwarded contract.
                unsafe {
                    rma_msg(
                        ep,
                        false,
                        local as *mut u8,
                        len,
                        desc as *mut c_void,
                        dest,
                        raddr,
                        key,
                        ctx,
                        0,
                        0,
                    )
                }
            }
            Action::StagedWrite { .. } | Action::StagedRead { .. } => {
                unreachable!("staged WQEs go through the outbox")
            }
            Action::Send { dest, hdr, .. } => {
                let b = p.bounce.expect("bounce buffer taken before issue") as usize;
                let len = SEND_HDR_SIZE + usize::from(hdr.len);
                // SAFETY: forwarded contract; the bounce buffer holds header and payload.
                unsafe {
                    send_msg(
                        ep,
                        inner.send_bufs.ptr(b),
                        len,
                        inner.send_bufs.desc(),
                        dest,
                        ctx,
                        self.delivery_flags,
                    )
                }
            }
        }
    }

    fn fill_bounce(
        &self,
        b: u32,
        hdr: &SendHdr,
        payload: &Payload,
    ) -> std::result::Result<(), String> {
        let dst = self.inner.send_bufs.ptr(b as usize);
        let h = hdr.encode();
        // SAFETY: the bounce slot holds SEND_HDR_SIZE + SOFT_SEND_MAX bytes, and the payload length
        // was checked against SOFT_SEND_MAX.
        unsafe {
            ptr::copy_nonoverlapping(h.as_ptr(), dst, SEND_HDR_SIZE);
            let mut at = dst.add(SEND_HDR_SIZE);
            match payload {
                Payload::Inline(data, n) => ptr::copy_nonoverlapping(data.as_ptr(), at, *n),
                Payload::Sgl(parts) => {
                    for (src, len, device) in parts.iter().flatten() {
                        if *device {
                            cuda::memcpy(at as *mut c_void, *src as *const c_void, *len).map_err(
                                |e| format!("copying a SEND payload from GPU memory: {e}"),
                            )?;
                        } else {
                            ptr::copy_nonoverlapping(*src as *const u8, at, *len);
                        }
                        at = at.add(*len);
                    }
                }
            }
        }
        Ok(())
    }

    fn finish_failed(&mut self, p: Pending, status: CqStatus, why: &str) {
        tracing::warn!(
            "software queue: WQE with request id {} failed at post ({status}): {why}",
            p.req_id
        );
        if let Some(s) = p.slot {
            self.free_slots.push(s);
        }
        if let Some(b) = p.bounce {
            self.free_bounce.push(b);
        }
        self.push_tx_cqe(p.req_id, status, p.op);
    }

    fn push_tx_cqe(&mut self, req_id: u16, status: CqStatus, op: OpType) {
        let n = self.inner.cq_entries;
        let slot = (self.cq_pc & u64::from(n - 1)) as usize;
        let c = TxCqe {
            req_id: u64::from(req_id),
            req_id_64: false,
            status,
            phase: cqe::cq_expected_phase(self.cq_pc, n),
            op,
            qp_num: self.tables.my_qpn(),
        };
        let bytes = cqe::encode_tx(&c);
        // SAFETY: the slot lies inside the CQ ring.
        unsafe {
            mem::publish_cqe(
                self.inner.ring(self.inner.layout.cq + slot * TX_CQE_SIZE),
                &bytes,
            )
        };
        self.cq_pc += 1;
        self.completed += 1;
        self.inner
            .completed
            .store(self.completed, Ordering::Release);
    }

    fn complete_tx(&mut self, slot: u64, status: CqStatus) {
        let Some(f) = self.slots.get_mut(slot as usize).and_then(|s| s.take()) else {
            tracing::error!("software queue: completion for unknown slot {slot}");
            return;
        };
        self.free_slots.push(slot as u32);
        if let Some(b) = f.bounce {
            self.free_bounce.push(b);
        }
        self.in_flight -= 1;
        self.push_tx_cqe(f.req_id, status, f.op);
    }

    fn flush_in_flight(&mut self) {
        let mut n = 0;
        for s in 0..self.slots.len() {
            if self.slots[s].is_some() {
                self.complete_tx(s as u64, CqStatus::Flushed);
                n += 1;
            }
        }
        if let Some(p) = self.stalled.take() {
            self.finish_failed(p, CqStatus::Flushed, "queue stopped");
            n += 1;
        }
        if n > 0 {
            tracing::warn!(
                "software queue stopped with {n} operations in flight: completed as flushed"
            );
        }
    }

    // ---- completions from libfabric ----

    fn poll_cq(&mut self) -> usize {
        let inner = self.inner.clone();
        let mut total = 0;
        for _ in 0..4 {
            // SAFETY: an all-zero CQ entry is valid plain data.
            let mut entries: [CqEntry; 32] = unsafe { std::mem::zeroed() };
            match inner.ep.cq().read(&mut entries) {
                Ok(0) => break,
                Ok(n) => {
                    for e in &entries[..n] {
                        self.on_completion(e);
                    }
                    total += n;
                    if n < entries.len() {
                        break;
                    }
                }
                Err(err) => {
                    total += 1;
                    self.on_error(
                        err.context,
                        err.flags,
                        err.error.code,
                        &err.error.to_string(),
                    );
                }
            }
        }
        self.flush_rx_batch();
        total
    }

    fn on_completion(&mut self, e: &CqEntry) {
        let remote_data = u64::from(fi::FI_REMOTE_CQ_DATA);
        if e.flags & remote_data != 0 && e.flags & u64::from(fi::FI_RECV) == 0 {
            self.on_write_imm(e.data, e.len);
            return;
        }
        match self.inner.ctxs.get(e.op_context) {
            Some((TAG_TX, slot)) => {
                self.inner.ctxs.free(e.op_context);
                self.complete_tx(slot, CqStatus::Ok);
            }
            Some((TAG_RX, idx)) => {
                self.inner.ctxs.free(e.op_context);
                self.on_recv(idx as usize, e.len);
            }
            Some((TAG_STX, b)) => {
                self.inner.ctxs.free(e.op_context);
                self.on_stage_sent(b as usize, 0, "");
            }
            _ => tracing::warn!(
                "software queue: completion with unknown context {:p} (flags {:#x})",
                e.op_context,
                e.flags
            ),
        }
    }

    fn on_error(&mut self, ctx: *mut c_void, flags: u64, code: i32, text: &str) {
        match self.inner.ctxs.get(ctx) {
            Some((TAG_TX, slot)) => {
                self.inner.ctxs.free(ctx);
                let status = fabric_error_status(code);
                tracing::warn!("software queue: operation failed ({status}): {text}");
                self.complete_tx(slot, status);
            }
            Some((TAG_STX, b)) => {
                self.inner.ctxs.free(ctx);
                self.on_stage_sent(b as usize, if code == 0 { -(fi::FI_EIO as i32) } else { code }, text);
            }
            Some((TAG_RX, idx)) => {
                self.inner.ctxs.free(ctx);
                if code.unsigned_abs() == fi::FI_ECANCELED {
                    return;
                }
                tracing::warn!("software queue: receive failed: {text}");
                let status = fabric_error_status(code);
                let t = self.tables.clone();
                self.push_rx(RxCqe {
                    req_id: self.rx_seq as u16,
                    status,
                    phase: 0,
                    op: OpType::Send,
                    has_imm: false,
                    unsolicited: false,
                    qp_num: t.my_qpn(),
                    length: 0,
                    ah: AH_UNKNOWN,
                    src_qp: 0,
                    imm: 0,
                    src_addr: None,
                });
                self.rx_seq += 1;
                if !self.inner.stop.load(Ordering::Acquire) {
                    if let Err(e) = self.post_receive(idx as usize) {
                        tracing::error!("software queue: cannot repost a receive buffer: {e}");
                    }
                }
            }
            _ => tracing::warn!("software queue: error completion without a known context (flags {flags:#x}): {text}"),
        }
    }

    fn source(&self, pe: Option<u32>) -> (u16, u16) {
        match pe {
            Some(p) if (p as usize) < self.tables.peers.len() => {
                (p as u16, self.tables.peers[p as usize].qpn)
            }
            _ => (AH_UNKNOWN, 0),
        }
    }

    fn on_write_imm(&mut self, data: u64, len: usize) {
        let (imm, pe) = wire::split_imm_data(data, self.inner.cq_data_wide);
        self.push_write_imm_rx(imm, pe, len as u32);
    }

    /// The receive completion of an RDMA write with immediate from `pe` that has landed here.
    fn push_write_imm_rx(&mut self, imm: u32, pe: Option<u32>, len: u32) {
        let (ah, src_qp) = self.source(pe);
        self.push_rx(RxCqe {
            req_id: 0,
            status: CqStatus::Ok,
            phase: 0,
            op: OpType::RdmaWrite,
            has_imm: true,
            unsolicited: true,
            qp_num: self.tables.my_qpn(),
            length: len,
            ah,
            src_qp,
            imm,
            src_addr: None,
        });
    }

    fn on_recv(&mut self, idx: usize, len: usize) {
        let inner = self.inner.clone();
        let len = len.min(inner.rx_bufs.slot);
        // SAFETY: the provider wrote `len` bytes into this receive buffer, which nobody else touches
        // until it is reposted below.
        let msg = unsafe { std::slice::from_raw_parts(inner.rx_bufs.ptr(idx), len) };
        if let Some(h) = StageHdr::decode(msg) {
            if h.kind == STAGE_WRITE && self.batch_write(&h, &msg[STAGE_HDR_SIZE..]) {
                self.rx_batch.push((h, idx));
                return;
            }
            // Everything else is handled in arrival order, after the writes before it.
            self.flush_rx_batch();
            self.on_stage_msg(&h, &msg[STAGE_HDR_SIZE..]);
            if !inner.stop.load(Ordering::Acquire) {
                if let Err(e) = self.post_receive(idx) {
                    tracing::error!("software queue: cannot repost a receive buffer: {e}");
                }
            }
            return;
        }
        self.flush_rx_batch();
        match SendHdr::decode(msg) {
            None => tracing::warn!(
                "software queue: dropped a {len}-byte message that is not a software-queue SEND"
            ),
            Some(h) => {
                let payload = &msg[SEND_HDR_SIZE..];
                let mut status = CqStatus::Ok;
                let mut is_amo = false;
                let heap = self.tables.heap().copied();
                if let Some(r) = AmoMsg::parse(payload, heap.map_or(0, |h| h.len)) {
                    is_amo = true;
                    status = match r
                        .map_err(|e| (amo_error_status(&e), e.to_string()))
                        .and_then(|m| {
                            // The heap exists: parse() found the offset inside it.
                            apply_amo(&m, heap.as_ref().expect("heap checked by parse"))
                                .map_err(|e| (CqStatus::LocalQpInternalError, e))
                        }) {
                        Ok(()) => {
                            inner.amos_applied.fetch_add(1, Ordering::AcqRel);
                            CqStatus::Ok
                        }
                        Err((s, why)) => {
                            tracing::warn!(
                                "software queue: AMO from PE {} not applied ({s}): {why}",
                                h.src_pe
                            );
                            s
                        }
                    };
                }
                // An AMO applied without error and without an immediate needs no receive
                // completion: nothing waits for one (DeepEP-style code never polls the RX ring), and
                // producing one per AMO would pile up entries for a ring nobody drains.
                if is_amo && status == CqStatus::Ok && h.imm.is_none() {
                    if !inner.stop.load(Ordering::Acquire) {
                        if let Err(e) = self.post_receive(idx) {
                            tracing::error!("software queue: cannot repost a receive buffer: {e}");
                        }
                    }
                    return;
                }
                let (ah, src_qp) = self.source(Some(h.src_pe));
                self.push_rx(RxCqe {
                    req_id: self.rx_seq as u16,
                    status,
                    phase: 0,
                    op: OpType::Send,
                    has_imm: h.imm.is_some(),
                    unsolicited: false,
                    qp_num: self.tables.my_qpn(),
                    length: u32::from(h.len),
                    ah,
                    src_qp,
                    imm: h.imm.unwrap_or(0),
                    src_addr: None,
                });
                self.rx_seq += 1;
            }
        }
        if !inner.stop.load(Ordering::Acquire) {
            if let Err(e) = self.post_receive(idx) {
                tracing::error!("software queue: cannot repost a receive buffer: {e}");
            }
        }
    }

    // ---- RX ring ----

    fn rx_room(&mut self) -> bool {
        let n = u64::from(self.inner.rx_entries);
        if self.rx_pc - self.cached_rx_ci < n {
            return true;
        }
        if let Some(t) = self.rx_ci_checked {
            if self.inner.ctrl.host().is_none() && t.elapsed() < CTRL_REFRESH {
                return false;
            }
        }
        self.rx_ci_checked = Some(Instant::now());
        match self.inner.ctrl.read_u64(OFF_RX_CI) {
            Ok(ci) => self.cached_rx_ci = ci.min(self.rx_pc),
            Err(e) => tracing::warn!("software queue: {e}"),
        }
        self.rx_pc - self.cached_rx_ci < n
    }

    fn push_rx(&mut self, c: RxCqe) {
        if self.pending_rx.is_empty() && self.rx_room() {
            self.write_rx(c);
            return;
        }
        self.pending_rx.push_back(c);
        self.inner
            .rx_pending
            .store(self.pending_rx.len() as u64, Ordering::Release);
        if !self.rx_pending_warned && self.pending_rx.len() > self.inner.rx_entries as usize {
            self.rx_pending_warned = true;
            tracing::warn!(
                "software queue: the GPU is not consuming receive completions; {} are waiting in host memory",
                self.pending_rx.len()
            );
        }
    }

    fn flush_rx(&mut self) -> usize {
        let mut n = 0;
        while !self.pending_rx.is_empty() && self.rx_room() {
            let c = self.pending_rx.pop_front().expect("non-empty");
            self.write_rx(c);
            n += 1;
        }
        if n > 0 {
            self.inner
                .rx_pending
                .store(self.pending_rx.len() as u64, Ordering::Release);
        }
        n
    }

    fn write_rx(&mut self, mut c: RxCqe) {
        let n = self.inner.rx_entries;
        let slot = (self.rx_pc & u64::from(n - 1)) as usize;
        c.phase = cqe::cq_expected_phase(self.rx_pc, n);
        let bytes = cqe::encode_rx_ex(&c);
        // SAFETY: the slot lies inside the RX ring.
        unsafe {
            mem::publish_cqe(
                self.inner
                    .ring(self.inner.layout.rx + slot * RX_CQE_EX_SIZE),
                &bytes,
            )
        };
        self.rx_pc += 1;
        self.inner
            .host_ctrl_word(HC_RX_PRODUCED)
            .store(self.rx_pc, Ordering::Release);
    }
}

// ---- staged transfers ----

impl Consumer {
    /// The outbox item that starts a staged WQE (`None` for the other actions).
    fn staged_item(&self, p: &Pending) -> Option<OutItem> {
        let slot = p.slot?;
        let token = stage_token(p.pc, slot);
        let item = |dest, kind, src, device, off, len: usize, imm| OutItem {
            dest,
            kind,
            token,
            status: CqStatus::Ok,
            imm,
            src,
            device,
            off,
            len: len as u64,
            sent: 0,
            msgs: 0,
            owner: Some(slot),
            prepared: None,
        };
        match p.action {
            Action::StagedWrite {
                local,
                len,
                device,
                dest,
                off,
                imm,
            } => Some(item(dest, STAGE_WRITE, local, device, off, len, imm)),
            Action::StagedRead { len, dest, off, .. } => {
                Some(item(dest, STAGE_READ_REQ, 0, false, off, len, None))
            }
            _ => None,
        }
    }

    /// Records a staged WQE as in flight and queues its first messages.
    fn start_staged(&mut self, p: Pending, item: OutItem) {
        let slot = p.slot.expect("slot taken before staging");
        let (read_dst, read_device, read_left) = match p.action {
            Action::StagedRead {
                local, len, device, ..
            } => (local, device, len as u64),
            _ => (0, false, 0),
        };
        self.slots[slot as usize] = Some(InFlight {
            req_id: p.req_id,
            op: p.op,
            bounce: None,
            stage: Some(Stage {
                token: item.token,
                awaiting: 0,
                queued: true,
                deferred: None,
                status: CqStatus::Ok,
                read_dst,
                read_device,
                read_len: read_left,
                read_left,
            }),
        });
        self.in_flight += 1;
        self.outbox.push_back(item);
    }

    /// The stage of the in-flight WQE `token` names, if it is still in flight.
    fn stage_mut(&mut self, token: u64) -> Option<&mut Stage> {
        let slot = token as u32 as usize;
        self.slots
            .get_mut(slot)?
            .as_mut()?
            .stage
            .as_mut()
            .filter(|s| s.token == token)
    }

    /// Writes the completion of staged WQE `token` once nothing of it is pending.
    fn stage_settle(&mut self, token: u64) {
        let Some(st) = self.stage_mut(token) else {
            return;
        };
        if st.awaiting == 0 && st.deferred.is_some() {
            // Every earlier chunk landed: the chunk with the immediate may go.
            let item = st.deferred.take().expect("checked");
            st.queued = true;
            self.outbox.push_front(item);
            return;
        }
        if st.awaiting == 0 && !st.queued && st.deferred.is_none() {
            let status = st.status;
            self.complete_tx(token as u32 as u64, status);
        }
    }

    /// Records a failure of part of staged WQE `token` (the worst status wins; the first is kept).
    fn stage_fail(&mut self, token: u64, status: CqStatus) {
        if let Some(st) = self.stage_mut(token) {
            if st.status == CqStatus::Ok {
                st.status = status;
            }
        }
    }

    /// Sends what the outbox holds while send buffers last. Returns the messages sent.
    /// Copies the next chunk of the outbox's GPU-memory items into send buffers, all in one batch
    /// (one stream synchronisation instead of one per message): `send_one` then only sends.
    fn prefetch_outbox(&mut self) {
        let slot_room = self.chunk_room();
        // A quarter of the buffers stays free for acknowledgements and read requests.
        let reserve = self.inner.send_bufs.count / 4 + 1;
        let mut taken: Vec<usize> = Vec::new();
        for (i, item) in self.outbox.iter().enumerate() {
            if taken.len() >= PREFETCH_MAX || self.free_bounce.len() <= taken.len() + reserve {
                break;
            }
            let carries =
                matches!(item.kind, STAGE_WRITE | STAGE_READ_DATA) && item.status == CqStatus::Ok;
            if item.device && carries && item.prepared.is_none() && item.sent < item.len {
                taken.push(i);
            }
        }
        if taken.len() < 2 {
            return; // one copy gains nothing from a batch: send_one copies it
        }
        if self.copy_batch().is_none() {
            return;
        }
        let batch = self.copies.as_mut().expect("created above");
        let inner = self.inner.clone();
        let mut prepared = Vec::with_capacity(taken.len());
        for i in taken {
            let item = &mut self.outbox[i];
            let chunk = (item.len - item.sent).min(slot_room);
            let b = self.free_bounce.pop().expect("counted above");
            let buf = inner.send_bufs.ptr(b as usize);
            // SAFETY: the send buffer holds header + chunk bytes; the source range was validated
            // against the heap (or a registration) that stays allocated.
            let r = unsafe {
                batch.copy(
                    buf.add(STAGE_HDR_SIZE) as *mut c_void,
                    (item.src + item.sent) as *const c_void,
                    chunk as usize,
                )
            };
            if r.is_err() {
                self.free_bounce.push(b);
                break;
            }
            item.prepared = Some((b, chunk));
            prepared.push(i);
        }
        if let Err(why) = batch.wait() {
            // send_one copies them one by one (and reports what fails).
            tracing::debug!(
                "software queue: batched staging copy failed ({why}): copying one by one"
            );
            for i in prepared {
                if let Some((b, _)) = self.outbox[i].prepared.take() {
                    self.free_bounce.push(b);
                }
            }
        }
    }

    /// Most payload bytes one staged message carries (what a send buffer holds after the header).
    fn chunk_room(&self) -> u64 {
        STAGE_CHUNK.min(self.inner.send_bufs.slot - STAGE_HDR_SIZE) as u64
    }

    /// The batch for staging copies, created on first use (None: CUDA cannot take copies here).
    fn copy_batch(&mut self) -> Option<&mut cuda::CopyBatch> {
        if self.copies.is_none() {
            self.copies = cuda::CopyBatch::new().ok();
        }
        self.copies.as_mut()
    }

    /// Gives a dropped item's prepared send buffer back.
    fn drop_item(&mut self, item: &mut OutItem) {
        if let Some((b, _)) = item.prepared.take() {
            self.free_bounce.push(b);
        }
    }

    fn pump_outbox(&mut self) -> usize {
        let mut sent = 0;
        self.prefetch_outbox();
        while let Some(mut item) = self.outbox.pop_front() {
            if let Some(slot) = item.owner {
                let token = item.token;
                let Some(st) = self.stage_mut(token) else {
                    self.drop_item(&mut item);
                    continue; // its WQE was flushed
                };
                let chunk = (item.len - item.sent).min(STAGE_CHUNK as u64);
                let last = item.sent + chunk >= item.len;
                if item.kind == STAGE_WRITE
                    && item.imm.is_some()
                    && last
                    && item.msgs > 0
                    && st.awaiting > 0
                {
                    st.deferred = Some(item);
                    st.queued = false;
                    continue;
                }
                debug_assert_eq!(slot, token as u32);
            }
            match self.send_one(&mut item) {
                Ok(true) => {
                    sent += 1;
                    let more = match item.kind {
                        STAGE_WRITE | STAGE_READ_DATA if item.status == CqStatus::Ok => {
                            item.sent < item.len
                        }
                        _ => false,
                    };
                    if more {
                        self.outbox.push_front(item);
                    } else if item.owner.is_some() {
                        if let Some(st) = self.stage_mut(item.token) {
                            st.queued = false;
                        }
                        self.stage_settle(item.token);
                    }
                }
                Ok(false) => {
                    // No buffer, or the provider asks to try later: keep the order.
                    self.outbox.push_front(item);
                    break;
                }
                Err(status) => {
                    self.drop_item(&mut item);
                    if item.owner.is_some() {
                        self.stage_fail(item.token, status);
                        if let Some(st) = self.stage_mut(item.token) {
                            st.queued = false;
                        }
                        self.stage_settle(item.token);
                    }
                }
            }
        }
        sent
    }

    /// Sends the next message of `item`. `Ok(true)`: sent (the item advanced); `Ok(false)`: try
    /// again later; `Err`: the item failed (dropped by the caller).
    fn send_one(&mut self, item: &mut OutItem) -> std::result::Result<bool, CqStatus> {
        let (b, prepared) = match item.prepared.take() {
            Some((b, chunk)) => (b, Some(chunk)),
            None => match self.free_bounce.pop() {
                Some(b) => (b, None),
                None => return Ok(false),
            },
        };
        // A buffer that goes back unused keeps its prepared payload for the next try.
        let give_back = |c: &mut Consumer, item: &mut OutItem| match prepared {
            Some(chunk) => item.prepared = Some((b, chunk)),
            None => c.free_bounce.push(b),
        };
        let inner = self.inner.clone();
        let buf = inner.send_bufs.ptr(b as usize);
        let carries =
            matches!(item.kind, STAGE_WRITE | STAGE_READ_DATA) && item.status == CqStatus::Ok;
        let chunk = if carries {
            (item.len - item.sent).min(self.chunk_room())
        } else {
            0
        };
        let last = item.sent + chunk >= item.len;
        let hdr = StageHdr {
            kind: item.kind,
            imm: if item.kind == STAGE_WRITE && last {
                item.imm
            } else {
                None
            },
            status: item.status as u8,
            src_pe: self.tables.my_pe as u32,
            token: item.token,
            offset: item.off + item.sent,
            len: if carries {
                chunk as u32
            } else {
                item.len as u32
            },
            total: item.len as u32,
        };
        let h = hdr.encode();
        debug_assert!(prepared.is_none_or(|c| c == chunk));
        // SAFETY: the send buffer holds STAGE_SLOT >= header + chunk bytes; the source range was
        // validated against a registration (or the heap) that stays allocated.
        let copied = unsafe {
            ptr::copy_nonoverlapping(h.as_ptr(), buf, STAGE_HDR_SIZE);
            if prepared.is_some() {
                Ok(())
            } else {
                copy_any(
                    buf.add(STAGE_HDR_SIZE),
                    (item.src + item.sent) as *const u8,
                    chunk as usize,
                    item.device,
                )
            }
        };
        if let Err(why) = copied {
            self.free_bounce.push(b);
            tracing::warn!("software queue: staging {chunk} bytes failed: {why}");
            if item.owner.is_some() {
                return Err(CqStatus::LocalQpInternalError);
            }
            // A read reply: tell the initiator instead.
            item.status = CqStatus::RemoteBadStatus;
            return Ok(false);
        }
        let Some(ctx) = inner.ctxs.alloc(TAG_STX, u64::from(b)) else {
            give_back(self, item);
            return Ok(false);
        };
        // SAFETY: the buffer and the context belong to the queue and stay valid until the completion
        // is reaped or the endpoint is closed.
        let r = unsafe {
            send_msg(
                inner.ep.as_ptr(),
                buf,
                STAGE_HDR_SIZE + chunk as usize,
                inner.send_bufs.desc(),
                item.dest,
                ctx,
                0,
            )
        };
        match r {
            Ok(()) => {
                item.sent += chunk;
                item.msgs += 1;
                let awaits =
                    matches!(item.kind, STAGE_WRITE | STAGE_READ_REQ) && item.owner.is_some();
                if awaits {
                    if let Some(st) = self.stage_mut(item.token) {
                        st.awaiting += 1;
                    }
                    self.buf_owner[b as usize] = Some(item.token);
                }
                Ok(true)
            }
            Err(e) => {
                inner.ctxs.free(ctx);
                if e.is_again() {
                    give_back(self, item);
                    return Ok(false);
                }
                self.free_bounce.push(b);
                tracing::warn!("software queue: staged message failed: {e}");
                Err(fabric_error_status(e.code))
            }
        }
    }

    /// A staged message's send buffer came back (`code` 0: sent).
    fn on_stage_sent(&mut self, b: usize, code: i32, text: &str) {
        let owner = self.buf_owner.get_mut(b).and_then(|o| o.take());
        if b < self.inner.send_bufs.count {
            self.free_bounce.push(b as u32);
        }
        if code != 0 {
            if code.unsigned_abs() != fi::FI_ECANCELED {
                tracing::warn!("software queue: staged message failed: {text}");
            }
            if let Some(token) = owner {
                // Its reply will not come.
                self.stage_fail(token, fabric_error_status(code));
                if let Some(st) = self.stage_mut(token) {
                    st.awaiting = st.awaiting.saturating_sub(1);
                    if st.read_left > 0 {
                        st.read_left = 0;
                    }
                }
                self.stage_settle(token);
            }
        }
    }

    /// A staged message arrived.
    fn on_stage_msg(&mut self, h: &StageHdr, payload: &[u8]) {
        match h.kind {
            STAGE_WRITE => {
                let status = self.stage_write_here(h, payload);
                if status == CqStatus::Ok {
                    if let Some(imm) = h.imm {
                        self.push_write_imm_rx(imm, Some(h.src_pe), h.total);
                    }
                }
                self.reply(h, STAGE_WRITE_ACK, status, 0, false, 0);
            }
            STAGE_READ_REQ => {
                let heap = self.tables.heap().copied();
                match heap.and_then(|r| {
                    r.translate(r.dev_base.wrapping_add(h.offset), u64::from(h.len))
                        .map(|a| (a, r.device))
                }) {
                    Some((src, device)) => {
                        self.reply(h, STAGE_READ_DATA, CqStatus::Ok, src, device, h.len)
                    }
                    None => {
                        tracing::warn!(
                            "software queue: staged read of {:#x}+{} from PE {} outside the heap",
                            h.offset,
                            h.len,
                            h.src_pe
                        );
                        self.reply(
                            h,
                            STAGE_READ_DATA,
                            CqStatus::RemoteBadAddress,
                            0,
                            false,
                            h.len,
                        )
                    }
                }
            }
            STAGE_WRITE_ACK => {
                let status = CqStatus::from_raw(h.status).unwrap_or(CqStatus::RemoteBadStatus);
                if status != CqStatus::Ok {
                    self.stage_fail(h.token, status);
                }
                if let Some(st) = self.stage_mut(h.token) {
                    st.awaiting = st.awaiting.saturating_sub(1);
                    self.stage_settle(h.token);
                }
            }
            STAGE_READ_DATA => {
                let mut status = CqStatus::from_raw(h.status).unwrap_or(CqStatus::RemoteBadStatus);
                let Some(st) = self.stage_mut(h.token) else {
                    return; // flushed, or a stale reply
                };
                let (dst, device, total) = (st.read_dst, st.read_device, st.read_len);
                if status == CqStatus::Ok {
                    let fits = h
                        .offset
                        .checked_add(u64::from(h.len))
                        .is_some_and(|end| end <= total && u64::from(h.len) <= st.read_left);
                    status = if !fits {
                        CqStatus::RemoteBadLength
                    } else {
                        // SAFETY: dst + [offset, offset+len) lies inside the validated local range.
                        match unsafe {
                            copy_any(
                                (dst + h.offset) as *mut u8,
                                payload.as_ptr(),
                                payload.len(),
                                device,
                            )
                        } {
                            Ok(()) => CqStatus::Ok,
                            Err(why) => {
                                tracing::warn!("software queue: read data not copied: {why}");
                                CqStatus::LocalQpInternalError
                            }
                        }
                    };
                }
                if status != CqStatus::Ok {
                    self.stage_fail(h.token, status);
                }
                let st = self.stage_mut(h.token).expect("checked above");
                st.read_left = st.read_left.saturating_sub(u64::from(h.len));
                if st.read_left == 0 || status != CqStatus::Ok {
                    st.read_left = 0;
                    if st.awaiting > 0 {
                        st.awaiting -= 1;
                    }
                    self.stage_settle(h.token);
                }
            }
            _ => {}
        }
    }

    /// Enqueues the copy of a staged write chunk into GPU memory on the batch (true), when the
    /// heap is GPU memory, the range is valid and CUDA takes the copy; false: handle it at once.
    fn batch_write(&mut self, h: &StageHdr, payload: &[u8]) -> bool {
        let Ok((dst, true)) = self.stage_write_dst(h, payload.len()) else {
            return false;
        };
        let Some(b) = self.copy_batch() else {
            return false;
        };
        // SAFETY: the range lies inside the heap registration; the receive buffer is not reposted
        // before flush_rx_batch waited for the copy.
        unsafe {
            b.copy(
                dst as *mut c_void,
                payload.as_ptr() as *const c_void,
                payload.len(),
            )
        }
        .is_ok()
    }

    /// Waits for the batched copies of received write chunks, then acknowledges them (and delivers
    /// their immediates) in arrival order and reposts their receive buffers.
    fn flush_rx_batch(&mut self) {
        if self.rx_batch.is_empty() {
            return;
        }
        let status = match self.copies.as_mut().map_or(Ok(()), |b| b.wait()) {
            Ok(()) => CqStatus::Ok,
            Err(why) => {
                tracing::warn!("software queue: staged writes not applied: {why}");
                CqStatus::LocalQpInternalError
            }
        };
        let batch = std::mem::take(&mut self.rx_batch);
        let stopping = self.inner.stop.load(Ordering::Acquire);
        for (h, idx) in &batch {
            if status == CqStatus::Ok {
                if let Some(imm) = h.imm {
                    self.push_write_imm_rx(imm, Some(h.src_pe), h.total);
                }
            }
            self.reply(h, STAGE_WRITE_ACK, status, 0, false, 0);
            if !stopping {
                if let Err(e) = self.post_receive(*idx) {
                    tracing::error!("software queue: cannot repost a receive buffer: {e}");
                }
            }
        }
        // Keep the allocation, unless a nested poll (post_receive retries poll the CQ) queued more.
        if self.rx_batch.is_empty() {
            let mut batch = batch;
            batch.clear();
            self.rx_batch = batch;
        }
    }

    /// Where a staged write chunk of `len` bytes lands: (host-or-device address, is GPU memory),
    /// or the status that goes back in the ack.
    fn stage_write_dst(
        &self,
        h: &StageHdr,
        len: usize,
    ) -> std::result::Result<(u64, bool), CqStatus> {
        let Some(heap) = self.tables.heap() else {
            tracing::warn!(
                "software queue: staged write from PE {} before the heap is set",
                h.src_pe
            );
            return Err(CqStatus::RemoteBadAddress);
        };
        if len != h.len as usize {
            tracing::warn!(
                "software queue: staged write from PE {} carries {len} bytes, its header says {}",
                h.src_pe,
                h.len
            );
            return Err(CqStatus::RemoteBadLength);
        }
        let Some(dst) = heap.translate(heap.dev_base.wrapping_add(h.offset), u64::from(h.len))
        else {
            tracing::warn!(
                "software queue: staged write of {:#x}+{} from PE {} outside the heap",
                h.offset,
                h.len,
                h.src_pe
            );
            return Err(CqStatus::RemoteBadAddress);
        };
        Ok((dst, heap.device))
    }

    /// Applies a staged write chunk to the local heap; the status goes back in the ack.
    fn stage_write_here(&self, h: &StageHdr, payload: &[u8]) -> CqStatus {
        let (dst, device) = match self.stage_write_dst(h, payload.len()) {
            Ok(d) => d,
            Err(status) => return status,
        };
        // SAFETY: the range lies inside the heap registration, which stays allocated.
        match unsafe { copy_any(dst as *mut u8, payload.as_ptr(), payload.len(), device) } {
            Ok(()) => CqStatus::Ok,
            Err(why) => {
                tracing::warn!("software queue: staged write not applied: {why}");
                CqStatus::LocalQpInternalError
            }
        }
    }

    /// Queues a reply to the sender of `h` (replies go before new work).
    fn reply(
        &mut self,
        h: &StageHdr,
        kind: u8,
        status: CqStatus,
        src: u64,
        device: bool,
        len: u32,
    ) {
        let Some(dest) = self.tables.peers.get(h.src_pe as usize).map(|p| p.fi_addr) else {
            tracing::warn!(
                "software queue: staged message from unknown PE {}: no reply",
                h.src_pe
            );
            return;
        };
        let item = OutItem {
            dest,
            kind,
            token: h.token,
            status,
            imm: None,
            src,
            device,
            off: 0,
            len: u64::from(len),
            sent: 0,
            msgs: 0,
            owner: None,
            prepared: None,
        };
        if kind == STAGE_WRITE_ACK {
            self.outbox.push_front(item);
        } else {
            self.outbox.push_back(item);
        }
    }
}

/// Copies `len` bytes between host memory and `host`-or-GPU memory: `cuda::memcpy` (a non-blocking
/// stream: never waits for running kernels) when `device`, a plain copy otherwise.
///
/// # Safety
/// Both ranges must be valid for `len` bytes and not overlap.
unsafe fn copy_any(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    device: bool,
) -> std::result::Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    if device {
        // SAFETY: forwarded contract.
        unsafe { cuda::memcpy(dst as *mut c_void, src as *const c_void, len) }
            .map_err(|e| e.to_string())
    } else {
        // SAFETY: forwarded contract.
        unsafe { ptr::copy_nonoverlapping(src, dst, len) };
        Ok(())
    }
}

/// Applies an AMO to the local heap. Host memory: a host atomic. GPU memory: read-modify-write with
/// `cuda::memcpy`, on a non-blocking stream, so it never waits for the running kernels (exact because
/// one thread applies every AMO of this PE).
fn apply_amo(m: &AmoMsg, heap: &LocalReg) -> std::result::Result<(), String> {
    let addr = heap.host_base + m.offset;
    if heap.device {
        let mut cur = [0u8; 8];
        let n = m.size as usize;
        // SAFETY: the range was checked to lie inside the heap registration, which stays allocated.
        unsafe { cuda::memcpy(cur.as_mut_ptr() as *mut c_void, addr as *const c_void, n) }
            .map_err(|e| e.to_string())?;
        let old = u64::from_le_bytes(cur);
        let new = if m.op == wire::AMO_OP_ADD {
            old.wrapping_add(m.value)
        } else {
            m.value
        };
        let out = new.to_le_bytes();
        // SAFETY: as above.
        unsafe { cuda::memcpy(addr as *mut c_void, out.as_ptr() as *const c_void, n) }
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    // SAFETY: the range lies inside the registered heap and is aligned to the operand size (checked
    // by `AmoMsg::parse`); other agents access these words atomically or not at all while AMOs fly.
    unsafe {
        if m.size == 8 {
            let a = mem::atomic_u64(addr as *mut u8);
            if m.op == wire::AMO_OP_ADD {
                a.fetch_add(m.value, Ordering::AcqRel);
            } else {
                a.store(m.value, Ordering::Release);
            }
        } else {
            let a = mem::atomic_u32(addr as *mut u8);
            if m.op == wire::AMO_OP_ADD {
                a.fetch_add(m.value as u32, Ordering::AcqRel);
            } else {
                a.store(m.value as u32, Ordering::Release);
            }
        }
    }
    Ok(())
}

/// Idle policy of the consumer. Once peers exist it never sleeps: it is the progress engine of its
/// endpoint, and software providers move one-sided traffic aimed at this PE only while it polls
/// (traffic it cannot see, so "idle" is no evidence that nothing is arriving). Sleeping 50 us between
/// polls cut the write rate of a peer to this PE about fifty-fold. It yields the CPU instead, like
/// NVSHMEM's proxy thread. Before connect nothing can arrive, and it sleeps.
fn backoff(idle: u32, connected: bool) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if connected || idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `fi_writemsg` / `fi_readmsg` with one local and one remote segment, optional CQ data and flags.
///
/// # Safety
/// `ep` must be an open endpoint; `buf` (described by `desc`) and `ctx` must stay valid until the
/// completion is reaped or the endpoint is closed.
#[allow(clippy::too_many_arguments)]
unsafe fn rma_msg(
    ep: *mut fi::fid_ep,
    write: bool,
    buf: *mut u8,
    len: usize,
    desc: *mut c_void,
    dest: FiAddr,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
    data: u64,
    flags: u64,
) -> crate::fabric::Result<()> {
    let iov = libc::iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    };
    let mut d = desc;
    let riov = fi::fi_rma_iov { addr, len, key };
    // SAFETY: an all-zero fi_msg_rma is valid; every pointer set below outlives the call.
    let mut msg: fi::fi_msg_rma = unsafe { std::mem::zeroed() };
    msg.msg_iov = &iov as *const libc::iovec as *const _;
    msg.desc = &mut d;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &riov;
    msg.rma_iov_count = 1;
    msg.context = ctx;
    msg.data = data;
    // SAFETY: forwarded contract.
    let ret = unsafe {
        if write {
            fi::fi_writemsg(ep, &msg, flags)
        } else {
            fi::fi_readmsg(ep, &msg, flags)
        }
    };
    if ret == 0 {
        Ok(())
    } else {
        let what = if write { "fi_writemsg" } else { "fi_readmsg" };
        Err(crate::fabric::Error::from_ret(
            ret as i64,
            format!("{what}({len} bytes, {dest}:{addr:#x}, flags {flags:#x})"),
        ))
    }
}

/// `fi_sendmsg` of one registered buffer with flags.
///
/// # Safety
/// As for [`rma_msg`].
unsafe fn send_msg(
    ep: *mut fi::fid_ep,
    buf: *mut u8,
    len: usize,
    desc: *mut c_void,
    dest: FiAddr,
    ctx: *mut c_void,
    flags: u64,
) -> crate::fabric::Result<()> {
    let iov = libc::iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    };
    let mut d = desc;
    // SAFETY: an all-zero fi_msg is valid; every pointer set below outlives the call.
    let mut msg: fi::fi_msg = unsafe { std::mem::zeroed() };
    msg.msg_iov = &iov as *const libc::iovec as *const _;
    msg.desc = &mut d;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.context = ctx;
    // SAFETY: forwarded contract.
    let ret = unsafe { fi::fi_sendmsg(ep, &msg, flags) };
    if ret == 0 {
        Ok(())
    } else {
        Err(crate::fabric::Error::from_ret(
            ret as i64,
            format!("fi_sendmsg({len} bytes to {dest}, flags {flags:#x})"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_layout_is_aligned_and_disjoint() {
        let l = RingLayout::new(64, 64, 256);
        assert_eq!(l.sq, 0);
        assert_eq!(l.cq, 64 * 64);
        assert_eq!(l.rx, l.cq + 64 * 16);
        assert_eq!(l.doorbell, l.rx + 256 * 32);
        assert_eq!(l.host_ctrl % 64, 0);
        assert_eq!(l.total, l.host_ctrl + 64);
    }

    #[test]
    fn local_translation_checks_bounds() {
        let r = LocalReg {
            dev_base: 0x1000,
            host_base: 0x9000,
            len: 0x100,
            desc: 0,
            device: false,
        };
        assert_eq!(r.translate(0x1000, 0x100), Some(0x9000));
        assert_eq!(r.translate(0x10ff, 1), Some(0x90ff));
        assert_eq!(r.translate(0x10ff, 2), None);
        assert_eq!(r.translate(0xfff, 1), None);
        assert_eq!(r.translate(0x1100, 0), Some(0x9100));
        assert_eq!(r.translate(u64::MAX, 2), None);
    }

    #[test]
    fn staging_policy() {
        assert_eq!(Staging::for_provider(None, "shm", "shm"), Staging::Device);
        assert_eq!(
            Staging::for_provider(None, "tcp;ofi_rxm", "127.0.0.0/8"),
            Staging::Device
        );
        assert_eq!(Staging::for_provider(None, "efa", "efa"), Staging::Device);
        assert_eq!(
            Staging::for_provider(None, "efa", "efa-direct"),
            Staging::Off
        );
        assert_eq!(
            Staging::for_provider(None, "verbs;ofi_rxm", "IB-0x"),
            Staging::Off
        );
        assert_eq!(Staging::for_provider(None, "cxi", "cxi"), Staging::Off);
        assert_eq!(
            Staging::for_provider(Some(true), "cxi", "cxi"),
            Staging::All
        );
        assert_eq!(
            Staging::for_provider(Some(false), "shm", "shm"),
            Staging::Off
        );
    }

    #[test]
    fn status_mapping() {
        assert_eq!(
            fabric_error_status(-(fi::FI_ECANCELED as i32)),
            CqStatus::Flushed
        );
        assert_eq!(
            fabric_error_status(-(fi::FI_EINVAL as i32)),
            CqStatus::RemoteBadAddress
        );
        assert_eq!(
            fabric_error_status(fi::FI_ETRUNC as i32),
            CqStatus::RemoteBadLength
        );
        assert_eq!(
            fabric_error_status(-(fi::FI_ENOTCONN as i32)),
            CqStatus::LocalUnreachableRemote
        );
        assert_eq!(
            fabric_error_status(-(fi::FI_EIO as i32)),
            CqStatus::RemoteBadStatus
        );
        assert_eq!(
            wqe_error_status(&WqeError::MissingMetaDesc),
            CqStatus::LocalQpInternalError
        );
        assert_eq!(
            wqe_error_status(&WqeError::UnknownOpType(7)),
            CqStatus::LocalUnsupportedOp
        );
        assert_eq!(
            wqe_error_status(&WqeError::ZeroLength { index: 0 }),
            CqStatus::LocalBadLength
        );
    }
}
