//! The software EFA queue: the rings of an EFA send queue, its completion queue and a receive
//! completion ring, in memory the GPU maps, consumed by host threads (`NVSHMEM_EFA_SOFT_THREADS`,
//! `threads`: ring `r` on thread `r % T`) that execute every WQE through libfabric on an endpoint
//! of the queue's own (thread 0's) or as same-host copies.
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
//! # Copy route (same-host peers)
//! Where the transport lends the queue a [`PeerMemory`] ([`SoftQueue::set_peer_memory`]: its data
//! mover's CUDA IPC mappings of same-host peers' heaps) and `NVSHMEM_EFA_SOFT_IPC` is not `0`, an
//! RDMA write without immediate or an RDMA read whose peer range is mapped in this process runs as
//! copies on the queue's own non-blocking stream in its context (`memcpy` where CUDA is not usable)
//! instead of going through the provider or staging ([`CopyRoute`]):
//! * `kernel` (default): a round's copies of up to 64 KiB each (at most 128, 1 MiB together, GPU
//!   memory on the local side) go in one hop, as one launch of the library's copy kernel
//!   ([`crate::mover::kcopy`]); a launch that has not started within
//!   `NVSHMEM_EFA_SOFT_KERNEL_STUCK_US` (a kernel of the application holds every SM) is taken over
//!   by the host, exactly once, and its copies go the `host` way, as do larger rounds and, for
//!   100 ms after a take-over, every round. Each copy still reserves its bounce ring range, for a
//!   take-over. On the GPU node it moved 1.2-2.2x the `host` route's messages up to 16 KiB
//!   (results/gpu-2026-11-28).
//! * `host`: two hops through a pinned host bounce ring (32 MiB,
//!   `NVSHMEM_EFA_SOFT_IPC_BOUNCE`, allocated with the copy stream at first need): source to the
//!   ring, then ring to destination, on the same stream (stream order chains them); the WQE
//!   completes when the second hop is done. Each WQE reserves its length, contiguous (wrapping to
//!   the ring's start when the tail is too short); ranges are released in completion order (copies
//!   complete in submission order). A WQE that finds no room waits as its ring's stalled WQE and is
//!   retried on the next loop turn, after completions released space (that ring waits, the other
//!   rings go on); the thread never blocks. A WQE larger
//!   than the ring takes the message path. Where copies are `memcpy` the two hops are two
//!   `memcpy`s through a plain ring, so host tests exercise the ring.
//!
//! There is no one-hop device-to-device route of the copy engine: on the H100 node (2 PEs under
//! MPS) it deadlocked: a persistent grid of 132 x 256 threads, each posting and waiting for its
//! completions, left 256 copies in flight for good (with and without the overlap-with-compute
//! hint). Device-to-device copies evidently run as copy kernels, which cannot start while a kernel
//! holds every SM of the process; host<->device copies always run on the copy engines (the staged
//! path uses only those and works). Hence the copy kernel's take-over; the former
//! `NVSHMEM_EFA_SOFT_IPC=direct` is refused at configuration.
//!
//! The copies of one doorbell batch share one event (a mark every 32 copies and at the end of the
//! batch); the consumer polls the events without blocking and writes each WQE's completion once its
//! copy is done (an error of the copy engine completes the WQEs it covers with
//! `LOCAL_QP_INTERNAL_ERROR`). A write with immediate keeps the message path: the immediate must
//! reach the peer's RX ring, which only the peer's consumer writes, and after the data. No ordering
//! between WQEs is implied (as on SRD).
//!
//! # Null consumer (benchmarks)
//! `NVSHMEM_EFA_SOFT_NULL=1` (logged as a warning at creation): the consumer takes every WQE the
//! doorbell and the flow control allow, checks only the request id and the phase (a mismatch gets
//! `LOCAL_QP_INTERNAL_ERROR`, as above) and completes each with success without reading the rest or
//! moving data; the completions of a batch are written together (one release fence, then the flags
//! bytes). This measures the GPU's WQE post rate, the upper bound of hardware GDA.
//!
//! # Receive side
//! Thread 0 polls the endpoint's CQ for remote CQ data (RDMA write with immediate arriving)
//! and for received SENDs (receive buffers stay posted). Each becomes a 32-byte RX completion
//! (extended EFA receive format) in the RX ring, with the phase convention of the CQ, and
//! `host_ctrl.rx_produced` advances. A SEND carrying an AMO message is applied to the local heap
//! first. The RX ring is never overrun: when `rx_produced - ctrl.rx_ci` reaches the ring size, new
//! entries wait in host memory until the GPU consumes. Two stricter models of the device:
//! `rx_overwrite` writes over unconsumed entries as the NIC's RX CQ does; `rx_credits` keeps a
//! receive unposted while its entry waits, as the hardware receive path does (at most
//! `rx_buffers` entries wait; further messages wait in the provider, where on the device they wait
//! at the sender).
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
//!
//! # Where things are
//! * this file: [`SoftQueue`], its configuration, the state shared with the consumer thread;
//! * `layout`: ring layout, control word offsets, [`HostView`];
//! * `tables`: local registrations, peers, heaps, registered buffer pools;
//! * `consumer`: the consumer thread's state, loop and idle policy;
//! * `intake`: doorbell, flow control, request id/phase and semantic checks of each WQE;
//! * `exec`: posting on the private endpoint; `completion`: TX completions and the CQ;
//! * `order`: the ordering rule (an AMO that announces data waits for the WQEs before it to its
//!   PE, docs/ordering.md);
//! * `receive`: RX completions, received SENDs and AMOs; `staging`: staged RDMA;
//! * `ipc`: the copy route ([`PeerMemory`]), the null consumer, TX completions in bulk;
//! * `threads`: consumer threads, ring ownership, hand-overs to thread 0 (docs/softq-threads.md).

mod answers;
mod completion;
mod consumer;
mod exec;
mod intake;
mod ipc;
mod layout;
mod order;
mod receive;
mod rings;
mod staging;
mod tables;
mod threads;
mod trace;
mod watchdog;

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
use crate::efa::wqe::{
    self, OpType, SendPayload, WqeDesc, WqeError, WqeOp, WQE_SIZE, WQE_SIZE_128,
};
use crate::fabric::{
    errno, flags, AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, FiAddr, MemKind,
    MemoryRegion, OpContexts,
};

use super::error::{GdaError, Result};
use super::mem::{self, CtrlMem, CtrlPlacement, SharedMem};
use super::state::{
    NvshmemEfaGdaHostCtrl, NvshmemEfaGdaQueue, NvshmemEfaGdaQueueCtrl, NVSHMEM_EFA_GDA_MODE_SOFT,
};
use super::wire::{
    self, AmoMsg, SendHdr, StageHdr, SEND_HDR_SIZE, SOFT_SEND_MAX, STAGE_ACKS, STAGE_ACKS_MAX,
    STAGE_CHUNK, STAGE_HDR_SIZE, STAGE_READ_DATA, STAGE_READ_REQ, STAGE_SLOT, STAGE_WRITE,
    STAGE_WRITE_ACK,
};

use self::consumer::Consumer;
use self::exec::*;
use self::intake::*;
use self::ipc::*;
pub use self::ipc::{
    ipc_route, CopyRoute, PeerMap, PeerMemory, DEFAULT_BOUNCE_BYTES, MIN_BOUNCE_BYTES,
};
pub use self::layout::HostView;
use self::layout::*;
use self::staging::*;
use self::tables::*;
use self::threads::*;
pub use self::threads::{ConsumerSummary, MAX_SOFT_THREADS};

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
/// Rings (and changed AMO words) the debug report names one by one; the rest are counted.
const ODD_RINGS_NAMED: usize = 16;
/// Rejections logged at warn level per queue before switching to debug.
const WARN_REJECTS: u64 = 16;

/// Geometry and placement of a software queue.
#[derive(Clone, Debug)]
pub struct SoftQueueConfig {
    /// SQ depth (power of two, 2 to 32768); the CQ has as many entries.
    pub sq_depth: u32,
    /// Doorbell batch limit published to posters: at most this many WQEs may stand written ahead
    /// of the doorbell, over all posters together (the device's staging limit).
    pub max_batch: u32,
    /// Size of one SQ entry: 64, or 128 (efa-direct's wide entries: the WQE in bytes 0-63, zeros
    /// after it).
    pub sq_entry_size: u32,
    /// RX ring depth (power of two).
    pub rx_entries: u32,
    /// The RX ring behaves as the NIC's RX CQ: an entry the GPU has not consumed is overwritten
    /// (counted, logged) instead of new entries waiting in host memory.
    pub rx_overwrite: bool,
    /// Receive credits as on the device (the hardware path's receive thread): the `rx_buffers`
    /// receives are the only ones posted, and a receive whose completion waits for room in the RX
    /// ring is not posted again until its entry is written, so a receiver that does not drain holds
    /// at most `rx_buffers` entries in host memory and further SENDs wait at their sender (an SRD
    /// QP retries a SEND that finds no receive without limit). Off: receives are reposted at once
    /// and waiting entries are unbounded. Not applied to a queue that stages RDMA (staged messages
    /// share the receive buffers, and RDMA on the device needs none).
    pub rx_credits: bool,
    /// Receive buffers kept posted.
    pub rx_buffers: usize,
    /// Bounce buffers for SENDs.
    pub send_buffers: usize,
    /// Where the control block lives.
    pub ctrl: CtrlPlacement,
    /// Which RDMA transfers move by staged messages.
    pub staging: Staging,
    /// RDMA writes (without immediate) and reads whose peer range is mapped in this process (see
    /// [`SoftQueue::set_peer_memory`]) run as copies on the queue's copy queue, and how
    /// (`NVSHMEM_EFA_SOFT_IPC`, default [`CopyRoute::Kernel`]).
    pub ipc: CopyRoute,
    /// Bytes of the bounce ring of [`CopyRoute::Host`] and [`CopyRoute::Kernel`]
    /// (`NVSHMEM_EFA_SOFT_IPC_BOUNCE`); a copy WQE
    /// larger than the ring takes the message path.
    pub ipc_bounce: usize,
    /// Copies through the batch API with the overlap hint where the driver has it
    /// (`NVSHMEM_EFA_COPY_OVERLAP`).
    pub copy_overlap: bool,
    /// How long a launch of [`CopyRoute::Kernel`] may stay unstarted before the host takes its
    /// copies over (`NVSHMEM_EFA_SOFT_KERNEL_STUCK_US`).
    pub kernel_stuck: Duration,
    /// Where CUDA is not usable, [`CopyRoute::Kernel`]'s launches run on a host thread
    /// ([`crate::mover::kcopy::HostLauncher`]), each starting this long after it was made: a
    /// kernel slow to start, for the tests.
    pub kernel_host_delay: Duration,
    /// Launches of [`CopyRoute::Kernel`] undecided at once before the next round waits and
    /// gathers more copies (`NVSHMEM_EFA_SOFT_KERNEL_AHEAD`).
    pub kernel_ahead: usize,
    /// A consumer thread that has not finished a loop pass for this long is reported
    /// (`NVSHMEM_EFA_SOFT_WATCHDOG_MS`, `watchdog.rs`). Zero: no watchdog.
    pub watchdog: Duration,
    /// Benchmark mode (`NVSHMEM_EFA_SOFT_NULL`): WQEs are completed with success after the request
    /// id and phase checks, nothing else is validated or executed.
    pub null_consumer: bool,
    /// Model of an unordered fabric (`NVSHMEM_EFA_SOFT_UNORDERED_US`, tests): every RDMA write is
    /// issued this long after it was taken while later WQEs go on. Zero: off.
    pub unordered: Duration,
    /// Most rings the queue makes ([`SoftQueue::add_rings`]: one per entry of the device state's
    /// queue table); more queues share rings, queue `i` on ring `i % max_rings` (logged).
    pub max_rings: usize,
    /// Consumer threads (`NVSHMEM_EFA_SOFT_THREADS`, 1 to [`MAX_SOFT_THREADS`]): ring `r` is
    /// served by thread `r % threads`; thread 0 alone uses the endpoint (docs/softq-threads.md).
    pub threads: usize,
}

/// Default [`SoftQueueConfig::max_rings`].
pub const DEFAULT_MAX_RINGS: usize = 512;

/// Which RDMA transfers the queue moves by staged messages (host buffers, copies on a non-blocking
/// CUDA stream) instead of handing the memory to the provider: the route's one staging decision
/// ([`crate::route::Staging::decide`]). For the queue, [`Staging::Device`] covers transfers whose
/// local buffer is GPU memory or whose remote side is the symmetric heap when this PE's heap is
/// (taken as the kind of every PE's heap).
pub use crate::route::Staging;

impl SoftQueueConfig {
    /// The geometry the configuration asks for, with defaults for the rest.
    pub fn new(sq_depth: u32, max_batch: u32, ctrl: CtrlPlacement) -> SoftQueueConfig {
        SoftQueueConfig {
            sq_depth,
            max_batch,
            sq_entry_size: WQE_SIZE as u32,
            rx_entries: sq_depth.clamp(256, 65536),
            rx_overwrite: false,
            rx_credits: false,
            rx_buffers: 128,
            send_buffers: (sq_depth as usize).clamp(16, 256),
            ctrl,
            staging: Staging::Off,
            ipc: CopyRoute::Kernel,
            ipc_bounce: DEFAULT_BOUNCE_BYTES,
            copy_overlap: true,
            kernel_stuck: Duration::from_millis(2),
            kernel_host_delay: Duration::ZERO,
            kernel_ahead: 1,
            watchdog: Duration::from_secs(5),
            null_consumer: false,
            unordered: Duration::ZERO,
            max_rings: DEFAULT_MAX_RINGS,
            threads: 1,
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
        if self.ipc.bounces() && self.ipc_bounce < MIN_BOUNCE_BYTES {
            return Err(GdaError::invalid(format!(
                "bounce ring of {} bytes (at least {MIN_BOUNCE_BYTES})",
                self.ipc_bounce
            )));
        }
        if !(1..=MAX_SOFT_THREADS).contains(&self.threads) {
            return Err(GdaError::invalid(format!(
                "NVSHMEM_EFA_SOFT_THREADS: {} consumer threads (1 to {MAX_SOFT_THREADS})",
                self.threads
            )));
        }
        if self.max_batch == 0 {
            return Err(GdaError::invalid("max_batch must be at least 1"));
        }
        if self.sq_entry_size as usize != WQE_SIZE && self.sq_entry_size as usize != WQE_SIZE_128 {
            return Err(GdaError::invalid(format!(
                "SQ entry size {} is not 64 or 128",
                self.sq_entry_size
            )));
        }
        if self.rx_credits && self.rx_overwrite {
            return Err(GdaError::invalid(
                "the RX ring cannot both overwrite (the NIC's CQ) and hold receives (credits)",
            ));
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
    /// WQEs seen written more than `max_batch` ahead of the doorbell (each is also rejected when
    /// its turn comes).
    pub ahead_of_doorbell: u64,
    /// RX entries written over entries the GPU had not consumed (`rx_overwrite` only).
    pub rx_overruns: u64,
    /// TX completions written (all statuses).
    pub completed: u64,
    /// RX completions written into the RX ring.
    pub rx_produced: u64,
    /// RX completions waiting for room in the RX ring.
    pub rx_pending: u64,
    /// Receive buffers held with their waiting completion (`rx_credits` only): not posted.
    pub rx_receives_held: u64,
    /// AMO messages applied to the local heap.
    pub amos_applied: u64,
    /// RDMA WQEs executed as copies into or out of a mapped peer heap.
    pub ipc_copies: u64,
    /// Copy WQEs that waited for room in the bounce ring ([`CopyRoute::Host`]).
    pub ipc_ring_waits: u64,
    /// Copy kernel launches ([`CopyRoute::Kernel`]): made, applied by the kernel, taken over by
    /// the host.
    pub kernel_launches: u64,
    pub kernel_applied: u64,
    pub kernel_taken_over: u64,
    /// AMO messages that announce data ([`super::wire::AMO_AFTER_DATA`]) taken, and how many of
    /// them waited for earlier WQEs to their PE (the ordering rule, docs/ordering.md).
    pub amos_announcing: u64,
    pub amos_waited: u64,
    /// Batches the received AMO messages were applied in (`amo_batch.rs`: one per CQ read).
    pub amo_batches: u64,
    /// WQEs the provider refused for now (`-FI_EAGAIN`; each counted once, however often retried).
    pub wqes_refused: u64,
    /// SENDs answered by the target (answered SENDs, `wire.rs`), and the answers received.
    pub sends_answered: u64,
    /// Messages those answers went in (several answers to one sender share one, `STAGE_ACKS`).
    pub answer_msgs: u64,
    /// SENDs that carried packed AMOs (several answered AMOs to one PE share one).
    pub sends_packed: u64,
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
    sq_entry_size: u32,
    cq_entries: u32,
    rx_entries: u32,
    max_batch: u32,
    tables: Mutex<Arc<Tables>>,
    generation: AtomicU64,
    stop: AtomicBool,
    /// Set (after `failure`) when the consumer thread died of a panic.
    failed: AtomicBool,
    /// The panic message of a failed consumer.
    failure: Mutex<Option<String>>,
    /// Test support: the producer count at which the consumer panics (`u64::MAX`: never).
    #[cfg(feature = "test-support")]
    panic_at: AtomicU64,
    /// Test support: the producer count at which the consumer sleeps `stall_ms` inside its pass
    /// (`u64::MAX`: never): a thread blocked inside a call, for the watchdog.
    #[cfg(feature = "test-support")]
    stall_at: AtomicU64,
    #[cfg(feature = "test-support")]
    stall_ms: AtomicU64,
    cq_data_wide: bool,
    virt_addr: bool,
    completed: AtomicU64,
    rx_pending: AtomicU64,
    amos_applied: AtomicU64,
    amo_batches: AtomicU64,
    wqes_refused: AtomicU64,
    sends_answered: AtomicU64,
    answer_msgs: AtomicU64,
    sends_packed: AtomicU64,
    ahead_of_doorbell: AtomicU64,
    rx_overwrite: bool,
    rx_overruns: AtomicU64,
    rx_credits: bool,
    rx_receives_held: AtomicU64,
    cuda_ctx: usize,
    staging: Staging,
    ipc: CopyRoute,
    ipc_bounce: usize,
    copy_overlap: bool,
    /// [`SoftQueueConfig::kernel_stuck`] (for the log).
    kernel_stuck: Duration,
    /// [`SoftQueueConfig::kernel_ahead`].
    kernel_ahead: usize,
    null_consumer: bool,
    /// SENDs are answered SENDs (`wire.rs`): posted with transmit completion, completed when the
    /// target's answer comes, because this provider takes delivery-complete SENDs one per peer at
    /// a time ([`crate::fabric::Caps::dc_sends_serialise`]; docs/gda-amo-path.md).
    answered_sends: bool,
    /// [`SoftQueueConfig::unordered`].
    unordered: Duration,
    /// [`SoftQueueConfig::max_rings`].
    max_rings: usize,
    /// Where the rings' control blocks live.
    ctrl_placement: CtrlPlacement,
    ipc_copies: AtomicU64,
    ipc_ring_waits: AtomicU64,
    /// [`SoftQueueStats::amos_announcing`], `amos_waited`.
    order_counts: [AtomicU64; 2],
    /// [`SoftQueueStats::kernel_launches`], `kernel_applied`, `kernel_taken_over`.
    kernel_counts: [AtomicU64; 3],
    /// One mailbox per consumer thread (`threads.rs`); their number is the thread count.
    mail: Vec<Mailbox>,
    /// Consumer threads other than thread 0 still running (thread 0 serves them until none is).
    helpers_live: AtomicU64,
    /// The accounts of the threads that stopped.
    summaries: Mutex<Vec<ConsumerSummary>>,
    /// Ring 0's owner.
    ring0_claim: RingClaim,
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
    /// The consumer threads, thread 0 first.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl SoftQueue {
    /// Creates the queue on a dedicated endpoint of `domain` (own AV and CQ) and starts its consumer.
    pub fn new(domain: &Arc<Domain>, cfg: &SoftQueueConfig) -> Result<SoftQueue> {
        cfg.check()?;
        let sq_entries = cfg.sq_depth;
        let cq_entries = cfg.sq_depth;
        let rx_entries = cfg.rx_entries;
        let info = domain.info();
        let n_threads = thread_count(cfg);
        // Thread 0 posts its own WQEs and those the other threads hand it: slots for all.
        let slots0 = sq_entries as usize * n_threads;
        let cq_size = (2 * slots0 + cfg.rx_buffers + 1024).max(4096);
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
        let layout = RingLayout::new(sq_entries, cfg.sq_entry_size, cq_entries, rx_entries);
        let cuda = mem::cuda_usable();
        let rings = SharedMem::new(layout.total, cuda)?;
        let ctrl = CtrlMem::new(CTRL_SIZE + 4 * sq_entries as usize, cfg.ctrl)?;
        let inner = Arc::new(Inner {
            ep,
            ctxs: OpContexts::new(slots0 + cfg.rx_buffers + cfg.send_buffers + 8),
            rx_bufs,
            send_bufs,
            rings,
            ctrl,
            layout,
            sq_entries,
            sq_entry_size: cfg.sq_entry_size,
            cq_entries,
            rx_entries,
            max_batch: cfg.max_batch,
            tables: Mutex::new(Arc::new(Tables::default())),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            #[cfg(feature = "test-support")]
            panic_at: AtomicU64::new(u64::MAX),
            #[cfg(feature = "test-support")]
            stall_at: AtomicU64::new(u64::MAX),
            #[cfg(feature = "test-support")]
            stall_ms: AtomicU64::new(0),
            cq_data_wide: info.cq_data_size() >= 8,
            virt_addr: info.virt_addr(),
            completed: AtomicU64::new(0),
            rx_pending: AtomicU64::new(0),
            amos_applied: AtomicU64::new(0),
            amo_batches: AtomicU64::new(0),
            wqes_refused: AtomicU64::new(0),
            sends_answered: AtomicU64::new(0),
            answer_msgs: AtomicU64::new(0),
            sends_packed: AtomicU64::new(0),
            ahead_of_doorbell: AtomicU64::new(0),
            rx_overwrite: cfg.rx_overwrite,
            rx_overruns: AtomicU64::new(0),
            rx_credits: cfg.rx_credits && cfg.staging == Staging::Off,
            rx_receives_held: AtomicU64::new(0),
            cuda_ctx: cuda::current_context(),
            staging: cfg.staging,
            ipc: cfg.ipc,
            ipc_bounce: cfg.ipc_bounce,
            copy_overlap: cfg.copy_overlap,
            kernel_stuck: cfg.kernel_stuck,
            kernel_ahead: cfg.kernel_ahead.max(1),
            null_consumer: cfg.null_consumer,
            answered_sends: crate::fabric::Caps::of(info).dc_sends_serialise,
            unordered: cfg.unordered,
            max_rings: cfg.max_rings,
            ctrl_placement: cfg.ctrl,
            ipc_copies: AtomicU64::new(0),
            ipc_ring_waits: AtomicU64::new(0),
            order_counts: Default::default(),
            kernel_counts: Default::default(),
            mail: (0..n_threads).map(|_| Mailbox::default()).collect(),
            helpers_live: AtomicU64::new(n_threads as u64 - 1),
            summaries: Mutex::new(Vec::new()),
            ring0_claim: RingClaim::default(),
        });
        if cfg.null_consumer {
            tracing::warn!(
                "software queue: NULL CONSUMER (NVSHMEM_EFA_SOFT_NULL=1, benchmarks only): WQEs are                  completed with success after the request id and phase checks; NO DATA MOVES and                  nothing else is validated"
            );
        }
        if !cfg.unordered.is_zero() {
            tracing::warn!(
                "software queue: unordered fabric model (NVSHMEM_EFA_SOFT_UNORDERED_US, tests): \
                 every RDMA write is issued {} us after it was taken, later WQEs overtake it",
                cfg.unordered.as_micros()
            );
        }
        if cfg.rx_credits && cfg.staging != Staging::Off {
            tracing::warn!(
                "software queue: receive credits not modelled: this queue stages RDMA ({:?}), whose \
                 messages share the receive buffers (on the device RDMA needs no receive)",
                cfg.staging
            );
        }
        let mut threads = start_consumers(&inner, cfg, slots0)?;
        threads.extend(watchdog::start(&inner, cfg.watchdog));
        tracing::info!(
            "software EFA queue: {sq_entries} x {} B WQE entries, max batch {}, CQ {cq_entries} x 16 B, RX \
             {rx_entries} x 32 B, rings in {} memory, control block in {} memory, provider {}, staging {:?}, \
             SENDs complete on {}",
            cfg.sq_entry_size,
            cfg.max_batch,
            if inner.rings.is_mapped() { "CUDA-mapped host" } else { "plain host" },
            if inner.ctrl.host().is_some() { "host" } else { "device" },
            info.provider_name(),
            cfg.staging,
            if inner.answered_sends {
                "the target's answer (delivery completion would take one SEND per peer at a time \
                 on this provider)"
            } else {
                "delivery"
            }
        );
        Ok(SoftQueue {
            inner,
            threads: Mutex::new(threads),
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
            let old: Vec<Vec<Option<RemoteHeap>>> =
                t.peers.iter().map(|p| p.chunks.clone()).collect();
            t.my_pe = my_pe;
            t.qkey = qkey;
            t.peers = fi_addrs
                .iter()
                .enumerate()
                .map(|(i, &a)| Peer {
                    fi_addr: a,
                    qpn: wire::soft_qpn(i as i32),
                    chunks: old.get(i).cloned().unwrap_or_default(),
                })
                .collect();
            Ok(())
        })
    }

    /// Records a chunk of PE `pe`'s heap: heap offsets `[start, start+size)` at `base` on the peer,
    /// libfabric key `key`, named by soft rkey `SOFT_RKEY_HEAP + ordinal` in WQEs.
    pub fn add_remote_chunk(
        &self,
        pe: i32,
        ordinal: u32,
        start: u64,
        base: u64,
        size: u64,
        key: u64,
    ) -> Result<()> {
        if ordinal > wqe::LKEY_MASK - wire::SOFT_RKEY_HEAP {
            return Err(GdaError::invalid(format!(
                "heap chunk ordinal {ordinal} does not fit a soft rkey"
            )));
        }
        self.update(|t| {
            let p = peer_mut(t, pe)?;
            let i = ordinal as usize;
            if p.chunks.len() <= i {
                p.chunks.resize(i + 1, None);
            }
            p.chunks[i] = Some(RemoteHeap {
                base,
                size,
                key,
                start,
            });
            Ok(())
        })
    }

    /// Names where peers' heaps are mapped in this process (the transport's same-host mappings);
    /// RDMA WQEs whose peer range it maps then run as copies (unless the queue was created with
    /// `ipc` off). `None` forgets it.
    pub fn set_peer_memory(&self, pm: Option<Arc<dyn PeerMemory>>) -> Result<()> {
        self.update(|t| {
            t.peer_memory = pm.map(PeerMap);
            Ok(())
        })
    }

    /// Forgets the chunk `ordinal` of PE `pe`'s heap.
    pub fn remove_remote_chunk(&self, pe: i32, ordinal: u32) -> Result<()> {
        self.update(|t| {
            let p = peer_mut(t, pe)?;
            if let Some(c) = p.chunks.get_mut(ordinal as usize) {
                *c = None;
            }
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
                    let n = t.heap_chunks.len();
                    t.heap_chunks.retain(|c| c.lkey != lkey);
                    if t.heap_chunks.len() != n {
                        t.index_heap();
                    }
                    Ok(())
                }
                _ => Err(GdaError::invalid(format!("lkey {lkey} is not registered"))),
            }
        })
    }

    /// Adds the local registration `lkey` as the heap's chunk `[start, end)` (granularity `2^log2`,
    /// the same for every chunk). A chunk with the same start is replaced.
    pub fn add_heap_chunk(&self, start: u64, end: u64, lkey: u32, log2: u32) -> Result<()> {
        self.update(|t| {
            let r = t
                .local(lkey)
                .ok_or_else(|| GdaError::invalid(format!("lkey {lkey} is not registered")))?;
            if end <= start || r.len < end - start || log2 > 63 || start % (1u64 << log2) != 0 {
                return Err(GdaError::invalid(format!(
                    "heap chunk [{start:#x}, {end:#x}) on lkey {lkey} ({} bytes), granularity 2^{log2}",
                    r.len
                )));
            }
            t.heap_chunks.retain(|c| c.start != start);
            if let Some(o) = t.heap_chunks.iter().find(|c| c.start < end && start < c.end) {
                return Err(GdaError::invalid(format!(
                    "heap chunk [{start:#x}, {end:#x}) overlaps [{:#x}, {:#x})",
                    o.start, o.end
                )));
            }
            let at = t.heap_chunks.partition_point(|c| c.start < start);
            t.heap_chunks.insert(at, LocalChunk { start, end, lkey });
            t.log2 = log2;
            t.index_heap();
            Ok(())
        })
    }

    /// Forgets the local heap chunk starting at `start` (the registration stays until
    /// [`SoftQueue::remove_local`]).
    pub fn remove_heap_chunk(&self, start: u64) -> Result<()> {
        self.update(|t| {
            t.heap_chunks.retain(|c| c.start != start);
            t.index_heap();
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
            sq_entry_size: i.sq_entry_size,
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
            sq_entry_size: i.sq_entry_size,
            cq_entries: i.cq_entries,
            rx_entries: i.rx_entries,
            max_batch: i.max_batch,
        })
    }

    /// Counters.
    pub fn stats(&self) -> SoftQueueStats {
        let i = &self.inner;
        // Consumed and rejected: summed over the rings.
        let extra = i.tables.lock().rings.clone();
        let sum = |off: usize| {
            i.host_ctrl_word(off).load(Ordering::Acquire)
                + extra
                    .0
                    .iter()
                    .map(|m| {
                        // SAFETY: 8-byte aligned word inside the ring's host control block.
                        unsafe { mem::atomic_u64(m.mem.host().add(m.layout.host_ctrl + off)) }
                            .load(Ordering::Acquire)
                    })
                    .sum::<u64>()
        };
        SoftQueueStats {
            consumed: sum(HC_CONSUMED),
            rejected: sum(HC_REJECTED),
            ahead_of_doorbell: i.ahead_of_doorbell.load(Ordering::Acquire),
            rx_overruns: i.rx_overruns.load(Ordering::Acquire),
            completed: i.completed.load(Ordering::Acquire),
            rx_produced: i.host_ctrl_word(HC_RX_PRODUCED).load(Ordering::Acquire),
            rx_pending: i.rx_pending.load(Ordering::Acquire),
            rx_receives_held: i.rx_receives_held.load(Ordering::Acquire),
            amos_applied: i.amos_applied.load(Ordering::Acquire),
            ipc_copies: i.ipc_copies.load(Ordering::Acquire),
            ipc_ring_waits: i.ipc_ring_waits.load(Ordering::Acquire),
            kernel_launches: i.kernel_counts[0].load(Ordering::Acquire),
            kernel_applied: i.kernel_counts[1].load(Ordering::Acquire),
            kernel_taken_over: i.kernel_counts[2].load(Ordering::Acquire),
            amos_announcing: i.order_counts[0].load(Ordering::Acquire),
            amos_waited: i.order_counts[1].load(Ordering::Acquire),
            amo_batches: i.amo_batches.load(Ordering::Acquire),
            wqes_refused: i.wqes_refused.load(Ordering::Acquire),
            sends_answered: i.sends_answered.load(Ordering::Acquire),
            answer_msgs: i.answer_msgs.load(Ordering::Acquire),
            sends_packed: i.sends_packed.load(Ordering::Acquire),
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

    /// Why the consumer thread failed (its panic message), if it did. A failed queue is also
    /// [`SoftQueue::stopped`], which is what kernels see.
    pub fn failure(&self) -> Option<String> {
        if !self.inner.failed.load(Ordering::Acquire) {
            return None;
        }
        self.inner.failure.lock().clone()
    }

    /// Test support (fault injection): makes the consumer thread panic when it takes the WQE of
    /// producer count `pc`.
    #[cfg(feature = "test-support")]
    pub fn inject_panic_at(&self, pc: u64) {
        self.inner.panic_at.store(pc, Ordering::Release);
    }

    /// Test support (fault injection): makes the consumer thread sleep `ms` milliseconds inside
    /// its loop pass when it takes the WQE of producer count `pc` (a thread blocked inside a call).
    #[cfg(feature = "test-support")]
    pub fn inject_stall_at(&self, pc: u64, ms: u64) {
        self.inner.stall_ms.store(ms, Ordering::Release);
        self.inner.stall_at.store(pc, Ordering::Release);
    }

    /// Stops the consumer threads (bounded wait for in-flight operations) and joins them, thread 0
    /// last (it serves the others until they left). Idempotent.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock());
        for h in threads.into_iter().rev() {
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

fn peer_mut(t: &mut Tables, pe: i32) -> Result<&mut Peer> {
    usize::try_from(pe)
        .ok()
        .and_then(|i| t.peers.get_mut(i))
        .ok_or_else(|| GdaError::invalid(format!("PE {pe} is not connected")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_layout_is_aligned_and_disjoint() {
        let l = RingLayout::new(64, 64, 64, 256);
        assert_eq!(l.sq, 0);
        assert_eq!(l.cq, 64 * 64);
        assert_eq!(l.rx, l.cq + 64 * 16);
        assert_eq!(l.doorbell, l.rx + 256 * 32);
        assert_eq!(l.host_ctrl % 64, 0);
        assert_eq!(l.total, l.host_ctrl + 64);
        let w = RingLayout::new(64, 128, 64, 256);
        assert_eq!(w.cq, 64 * 128);
        assert_eq!(w.rx, w.cq + 64 * 16);
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
    fn status_mapping() {
        let fabric = [
            (-(errno::ECANCELED as i32), CqStatus::Flushed),
            (-(errno::EINVAL as i32), CqStatus::RemoteBadAddress),
            (errno::ETRUNC as i32, CqStatus::RemoteBadLength),
            (-(errno::ENOTCONN as i32), CqStatus::LocalUnreachableRemote),
            (-(errno::EIO as i32), CqStatus::RemoteBadStatus),
        ];
        for (code, status) in fabric {
            assert_eq!(fabric_error_status(code), status, "errno {code}");
        }
        let wqe = [
            (WqeError::MissingMetaDesc, CqStatus::LocalQpInternalError),
            (WqeError::UnknownOpType(7), CqStatus::LocalUnsupportedOp),
            (WqeError::ZeroLength { index: 0 }, CqStatus::LocalBadLength),
        ];
        for (e, status) in wqe {
            assert_eq!(wqe_error_status(&e), status, "{e}");
        }
    }
}
