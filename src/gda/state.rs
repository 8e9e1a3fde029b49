//! The device state: the one layout shared between the host library and CUDA kernels.
//!
//! Everything here is `#[repr(C)]`, exported through cbindgen into `include/nvshmem_efa_gda.h`, and
//! included by `cuda/`. Pointers are DEVICE addresses (what a kernel dereferences).
//!
//! Posting protocol (identical for the hardware queue and the software queue; only the doorbell target
//! differs):
//! 1. A poster reserves `k` consecutive WQE slots: `base = atomicAdd(&ctrl->resv, k)` (device memory).
//! 2. It waits until the slots are free: `base + k - ctrl->done <= sq_entries`, polling completions
//!    (step 5) while it waits. `done` only advances once the WQE in a slot has completed, so a slot is
//!    never overwritten while the queue may still read it. It also waits until the slots lie in the
//!    doorbell window: `base + k - rung <= B` (`B = min(max_batch, sq_entries)`, `rung` the last
//!    doorbell value, `ctrl->rung`), so at most `max_batch` WQEs of all posters together stand written
//!    but not rung; while it waits it rings committed WQEs itself (step 4b).
//! 3. It writes each 64-byte WQE at slot `pc & (sq_entries - 1)` with phase `(pc / sq_entries) & 1`,
//!    request id `pc` (low 16 bits in `req_id`), then `__threadfence_system()`.
//! 4. Ordered commit: it waits until `ctrl->ready == base` and sets `ctrl->ready = base + k` (release,
//!    GPU scope: the commit chain stays in device memory and needs no system fence).
//!    Doorbell (4b): after its commit every poster rings, and so does every wait for the window or for
//!    completions. Ringing: if `ctrl->ready` is past `ctrl->rung` and `ctrl->db_lock` is free (CAS
//!    0→1), fence system-wide, store `(u32)ready` into `*sq_doorbell`, fence again, set `ctrl->rung`,
//!    release the lock and look again; a busy lock is left to its holder, who looks at `ready` again
//!    after releasing it (the committer stores `ready`, fences (sequentially consistent), reads the
//!    lock; the holder releases the lock, fences, reads `ready`: one sees the other's store).
//!    Doorbell values are therefore increasing, each covers only committed (written and fenced)
//!    WQEs, and announces at most `B` new ones (every committed WQE was reserved inside the window).
//! 5. Completions: whoever holds `ctrl->cq_lock` (atomicCAS 0→1) reads CQEs at `ctrl->cq_ci` while the
//!    CQE phase equals `((cq_ci / cq_entries) & 1) ^ 1` (expected phase starts at 1), marks
//!    `slot_status[req_id & (sq_entries-1)]` (status + 1; the CUDA header advances `done` directly for
//!    a CQE of slot `done` while it marked nothing earlier in the poll), counts errors in
//!    `ctrl->errors`, then advances `ctrl->done` over consecutive marked slots (clearing them),
//!    mirrors the new `done` into
//!    `host_ctrl->done` (software queue) and releases the lock.
//! 6. quiet: wait until `ctrl->done >= ctrl->ready` as read at entry (ringing what is committed but
//!    not rung); report `ctrl->errors`.
//!
//! Liveness of the doorbell: a commit is rung by its poster or by the lock holder of that moment
//! (the handshake above); quiet and every wait ring too.

/// Queue is backed by the provider's hardware queues (efa-direct GDA ops).
pub const NVSHMEM_EFA_GDA_MODE_HW: u32 = 1;
/// Queue is the library's software EFA queue (host thread consumes the ring).
pub const NVSHMEM_EFA_GDA_MODE_SOFT: u32 = 2;

/// Peer flag: entry is valid.
pub const NVSHMEM_EFA_GDA_PEER_VALID: u32 = 1;
/// Peer flag: the peer's heap is reachable by plain GPU stores (`nvshmem_ptr` non-null).
pub const NVSHMEM_EFA_GDA_PEER_P2P: u32 = 2;

/// How kernels address one PE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvshmemEfaGdaPeer {
    /// Address handle number for WQE `ah` (software queue: the peer's index in the consumer's table).
    pub ahn: u16,
    /// Remote QP number for WQE `dest_qp_num`.
    pub qpn: u16,
    /// Remote qkey.
    pub qkey: u32,
    /// Base virtual address of the peer's symmetric heap.
    pub heap_base: u64,
    /// Size of the peer's symmetric heap in bytes.
    pub heap_size: u64,
    /// rkey of the peer's heap registration (software queue: an index the consumer translates).
    pub heap_rkey: u32,
    /// `NVSHMEM_EFA_GDA_PEER_*` bits.
    pub flags: u32,
}

/// Device-memory control block of one queue (GPU atomics).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvshmemEfaGdaQueueCtrl {
    /// WQE slots handed out (producer reservations).
    pub resv: u64,
    /// WQEs committed (written, fenced, in order); the doorbell may lag (`rung`).
    pub ready: u64,
    /// WQEs completed, in order (slot reuse bound).
    pub done: u64,
    /// CQ consumer index.
    pub cq_ci: u64,
    /// Completions with a non-zero status.
    pub errors: u64,
    /// Status of the first failed completion (0 if none).
    pub first_error: u32,
    /// CQ polling lock (0 free, 1 held).
    pub cq_lock: u32,
    /// RX completions consumed (immediates), for the receive side.
    pub rx_ci: u64,
    /// Low 32 bits of the last value stored into the doorbell (`rung <= ready`).
    pub rung: u32,
    /// Doorbell lock (0 free, 1 held): doorbell stores are serialised so they land in order.
    pub db_lock: u32,
}

/// Host-written, device-read words of a software queue (mapped host memory), and one word the
/// device writes for the host (`done`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvshmemEfaGdaHostCtrl {
    /// WQEs the consumer has read out of the ring (published consumer index).
    pub consumed: u64,
    /// WQEs the consumer rejected as malformed.
    pub rejected: u64,
    /// Immediates / inline messages delivered into the RX ring.
    pub rx_produced: u64,
    /// Heartbeat of the consumer thread (increments while it runs).
    pub heartbeat: u64,
    /// Non-zero once the consumer stopped (fini or fatal error).
    pub stopped: u64,
    /// Written by the device: a recent value of `ctrl.done` (never ahead of it; stores from
    /// different pollers may land out of order, so readers keep the largest value seen). Lets the
    /// consumer learn which slots are free without copying from device memory.
    pub done: u64,
    /// Padding to 64 bytes.
    pub pad: [u64; 2],
}

/// One send queue with its completion queue, as kernels see it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvshmemEfaGdaQueue {
    /// SQ ring (`sq_entries` WQEs of `sq_entry_size` bytes).
    pub sq: u64,
    /// Doorbell: the MMIO register (hardware) or the doorbell record (software), a `uint32_t *`.
    pub sq_doorbell: u64,
    /// CQ ring (`cq_entries` CQEs of `cq_entry_size` bytes).
    pub cq: u64,
    /// RX completion ring (write-with-immediate / inline SEND delivered to this PE), or 0.
    pub rx_cq: u64,
    /// Control block in device memory (`NvshmemEfaGdaQueueCtrl *`).
    pub ctrl: u64,
    /// Per-slot completion status (`uint32_t[sq_entries]`, device memory).
    pub slot_status: u64,
    /// Host-written words (`NvshmemEfaGdaHostCtrl *`, mapped host memory), 0 for hardware queues.
    pub host_ctrl: u64,
    /// SQ depth (power of two).
    pub sq_entries: u32,
    /// SQ entry size (64 or 128).
    pub sq_entry_size: u32,
    /// CQ depth (power of two, >= sq_entries).
    pub cq_entries: u32,
    /// CQ entry size (16 or 32).
    pub cq_entry_size: u32,
    /// RX ring depth (power of two), 0 if none.
    pub rx_entries: u32,
    /// Doorbell batch limit.
    pub max_batch: u32,
    /// Local QP number (written in CQEs).
    pub qpn: u16,
    /// Reserved.
    pub reserved: u16,
    /// `NVSHMEM_EFA_GDA_MODE_*`.
    pub mode: u32,
}

/// Everything a kernel needs: the queue, the local heap registration and the peer table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvshmemEfaGdaDeviceState {
    /// Layout version (`NVSHMEM_EFA_GDA_STATE_VERSION`).
    pub version: u32,
    /// Non-zero once the state is complete (queue, heaps and peers set).
    pub ready: u32,
    /// This PE.
    pub my_pe: i32,
    /// Number of PEs.
    pub n_pes: i32,
    /// The send queue.
    pub queue: NvshmemEfaGdaQueue,
    /// Local heap base (virtual address).
    pub heap_base: u64,
    /// Local heap size.
    pub heap_size: u64,
    /// lkey of the local heap (24 bits used).
    pub heap_lkey: u32,
    /// Reserved.
    pub reserved: u32,
    /// Peer table (`NvshmemEfaGdaPeer[n_pes]`, device memory).
    pub peers: u64,
    /// Registration table (`NvshmemEfaGdaHeapKey[(n_pes + 1) * key_stride]`, device memory): entry
    /// `[row * key_stride + (heap_offset >> log2_granularity)]` describes the registration holding that
    /// heap offset (row = a PE for its rkeys, row `n_pes` for this PE's lkeys). 0 until a chunk is
    /// known.
    pub heap_keys: u64,
    /// log2 of the heap granularity (NVSHMEM's `log2_cumem_granularity`).
    pub log2_granularity: u32,
    /// Entries per row of `heap_keys` (granule capacity).
    pub key_stride: u32,
    /// Granules published: offsets below `n_granules << log2_granularity` are looked up.
    pub n_granules: u32,
    /// Reserved, zero.
    pub reserved2: u32,
    /// Queue table (state version 3): `NvshmemEfaGdaQueue[n_queues]`, device memory. The queue of
    /// `(dst_pe, qp_id)` is entry `dst_pe * queues_per_pe + qp_id % queues_per_pe`. Entries may
    /// name the same queue (the same `ctrl`): such pairs share its ring and its commit order. Entry
    /// 0 equals `queue`. 0 in a state that is not ready.
    pub queues: u64,
    /// Entries of `queues` (`n_pes * queues_per_pe`).
    pub n_queues: u32,
    /// Queues per destination PE the table was built for (`NVSHMEM_IBGDA_NUM_RC_PER_PE`, capped at
    /// `NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE`).
    pub queues_per_pe: u32,
}

/// Heap key flag: the entry describes a registration.
pub const NVSHMEM_EFA_GDA_KEY_VALID: u32 = 1;

/// One granule's entry of the registration table: the registration (heap chunk) holding it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvshmemEfaGdaHeapKey {
    /// Virtual address of heap offset `start` on the PE owning the registration.
    pub addr: u64,
    /// Heap offset where the registration begins (a multiple of the granularity).
    pub start: u64,
    /// Heap offset where it ends, exclusive.
    pub end: u64,
    /// rkey (rows of PEs; software queue: its soft rkey of that chunk) or lkey (row `n_pes`).
    pub key: u32,
    /// `NVSHMEM_EFA_GDA_KEY_*` bits; 0: no registration covers this granule.
    pub flags: u32,
}

/// Magic of an AMO message (`"EAMO"` little-endian).
pub const NVSHMEM_EFA_GDA_AMO_MAGIC: u32 = 0x4f4d_4145;
/// AMO message op: add `value` (4 or 8 bytes, wrapping).
pub const NVSHMEM_EFA_GDA_AMO_ADD: u32 = 1;
/// AMO message op: store `value`.
pub const NVSHMEM_EFA_GDA_AMO_SET: u32 = 2;
/// AMO message flag: the AMO announces data. The target applies it only after every WQE that the
/// sending queue took before it and that is aimed at the same PE has completed at the target
/// (docs/ordering.md). Without the flag an AMO is unordered, like every EFA operation.
pub const NVSHMEM_EFA_GDA_AMO_AFTER_DATA: u32 = 1;
/// Every AMO message flag the library knows; a message with another bit set is refused.
pub const NVSHMEM_EFA_GDA_AMO_FLAGS_KNOWN: u32 = NVSHMEM_EFA_GDA_AMO_AFTER_DATA;

/// Payload of an inline SEND (exactly 32 bytes, the WQE's inline room) that asks the target to apply
/// an atomic to its own heap. EFA has no RDMA atomics, so the target applies it: the software queue's
/// consumer thread, one per PE, applies every AMO message it receives in arrival order, which makes
/// concurrent adds from all PEs exact.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvshmemEfaGdaAmoMsg {
    /// `NVSHMEM_EFA_GDA_AMO_MAGIC`.
    pub magic: u32,
    /// `NVSHMEM_EFA_GDA_AMO_*`.
    pub op: u32,
    /// Operand size in bytes: 4 or 8.
    pub size: u32,
    /// `NVSHMEM_EFA_GDA_AMO_AFTER_DATA` or 0 (other bits: refused).
    pub flags: u32,
    /// Byte offset of the target word in the target's heap (aligned to `size`).
    pub offset: u64,
    /// Operand (low `size` bytes used).
    pub value: u64,
}

/// Current layout version of `NvshmemEfaGdaDeviceState`. Version 3 appends the queue table
/// (`queues`, `n_queues`, `queues_per_pe`) to version 2's 160 bytes; `queue` stays queue 0.
pub const NVSHMEM_EFA_GDA_STATE_VERSION: u32 = 3;

/// Most queues per destination PE a device state describes; a larger `NVSHMEM_IBGDA_NUM_RC_PER_PE`
/// is capped (logged), and `qp_id`s then wrap onto the table (`qp_id % queues_per_pe`).
pub const NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE: u32 = 1024;
/// Most entries of a queue table (`n_pes * queues_per_pe`).
pub const NVSHMEM_EFA_GDA_MAX_QUEUES: u32 = 65536;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<NvshmemEfaGdaPeer>() == 32);
    assert!(offset_of!(NvshmemEfaGdaPeer, heap_base) == 8);
    assert!(offset_of!(NvshmemEfaGdaPeer, heap_rkey) == 24);
    assert!(size_of::<NvshmemEfaGdaQueueCtrl>() == 64);
    assert!(offset_of!(NvshmemEfaGdaQueueCtrl, first_error) == 40);
    assert!(offset_of!(NvshmemEfaGdaQueueCtrl, cq_lock) == 44);
    assert!(size_of::<NvshmemEfaGdaHostCtrl>() == 64);
    assert!(size_of::<NvshmemEfaGdaQueue>() == 88);
    assert!(offset_of!(NvshmemEfaGdaQueue, sq_entries) == 56);
    assert!(offset_of!(NvshmemEfaGdaQueue, qpn) == 80);
    assert!(offset_of!(NvshmemEfaGdaQueue, mode) == 84);
    assert!(size_of::<NvshmemEfaGdaDeviceState>() == 176);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, queues) == 160);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, n_queues) == 168);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, queues_per_pe) == 172);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, heap_keys) == 136);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, log2_granularity) == 144);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, key_stride) == 148);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, n_granules) == 152);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, reserved2) == 156);
    assert!(size_of::<NvshmemEfaGdaHeapKey>() == 32);
    assert!(offset_of!(NvshmemEfaGdaHeapKey, start) == 8);
    assert!(offset_of!(NvshmemEfaGdaHeapKey, end) == 16);
    assert!(offset_of!(NvshmemEfaGdaHeapKey, key) == 24);
    assert!(offset_of!(NvshmemEfaGdaHeapKey, flags) == 28);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, queue) == 16);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, heap_base) == 104);
    assert!(offset_of!(NvshmemEfaGdaDeviceState, peers) == 128);
    assert!(size_of::<NvshmemEfaGdaAmoMsg>() == 32);
    assert!(offset_of!(NvshmemEfaGdaAmoMsg, flags) == 12);
    assert!(offset_of!(NvshmemEfaGdaAmoMsg, offset) == 16);
};
