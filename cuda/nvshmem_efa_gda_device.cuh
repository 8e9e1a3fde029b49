// SPDX-License-Identifier: BSD-3-Clause
//
// nvshmem_efa_gda_device.cuh: GPU-initiated one-sided communication over an EFA send queue.
//
// Kernels build genuine 64-byte EFA TX WQEs in the send ring, ring the doorbell and poll the
// completion queue themselves. The queue is either the provider's hardware queue (efa-direct GDA
// ops) or the library's software EFA queue (same ring format in device-mapped host memory, consumed
// by a host thread); this code is the same for both, only the doorbell target differs.
//
// Requirements
//   * CUDA C++, sm_70 or newer (independent thread scheduling, acquire/release PTX, __nanosleep),
//     relocatable device code (-rdc=true).
//   * include/nvshmem_efa_gda.h (generated from src/gda/state.rs) and cuda/efa_wqe.cuh on the include
//     path (-I<repo>/include -I<repo>/cuda).
//   * cuda/nvshmem_efa_gda_state.cu compiled exactly once into the application: it holds the one
//     definition of the device state below and the host loader nvshmem_efa_gda_load_device_state(),
//     which must run after the library published its GDA state (after nvshmem_init) and before the
//     first kernel that posts.
//
// Posting protocol (src/gda/state.rs is the reference; the CPU poster in src/gda/host_poster.rs
// follows the same steps):
//   1. reserve k slots: base = atomicAdd(&ctrl->resv, k)     (1 <= k <= B = min(max_batch, sq_entries))
//   2. wait until base + k - ctrl->done <= sq_entries (the slots are free) and
//      base + k - rung <= B (doorbell window: at most max_batch WQEs of all posters together stand
//      written but not rung; rung = ctrl->rung, the last doorbell value), polling completions and
//      ringing committed WQEs meanwhile
//   3. write each WQE at slot pc & (n-1), phase (pc / n) & 1, req_id = pc, the whole 64- or
//      128-byte entry; __threadfence_system()
//   4. wait until ctrl->ready == base (ordered commit, GPU scope), ctrl->ready = base+k
//   4b. ring (after every commit, and in every wait): if ctrl->ready is past rung and ctrl->db_lock
//      is free, take it, __threadfence_system(), store (u32)ready into *sq_doorbell,
//      __threadfence_system(), ctrl->rung = ready, release the lock and look again; a busy lock
//      means its holder looks again after releasing it (fence.sc handshake, see ring())
//   5. completions: the holder of ctrl->cq_lock reads CQEs by phase (expected phase starts at 1 and
//      flips per CQ wrap; NVSHMEM_EFA_GDA_CQ_POLL_BATCH phase bytes per round trip), marks
//      slot_status[req_id & (n-1)] = status + 1, counts errors, advances ctrl->done over consecutive
//      marked slots (clearing them) and mirrors it into host_ctrl->done (software queue)
//   6. quiet: wait until ctrl->done >= ctrl->ready as read at entry (ringing); report errors.
//
// Memory ordering
//   * WQE stores -> __threadfence_system() (each writing thread) -> ordered-commit turn (acquire load
//     of ctrl->ready) -> release store of ctrl->ready. A ringer acquires ctrl->ready under db_lock,
//     then __threadfence_system() -> doorbell store -> __threadfence_system() -> ctrl->rung -> unlock.
//     A doorbell value therefore covers only WQEs that are visible system-wide, and doorbell values
//     are stored in increasing order (db_lock serialises them, the second fence makes each store
//     performed before the next ringer's).
//   * CQE / RX entry: flags byte read volatile, phase compared, __threadfence_system(), then the rest.
//   * ctrl counters: atomics or acquire/release accesses at GPU scope; host_ctrl words: volatile.
//
// Deadlock freedom
//   * Reservations are totally ordered by base. The slots and the doorbell window a poster waits for
//     depend on posters with lower bases, which never wait on it; the lowest outstanding reservation
//     (base == ready; it rings what is committed, which opens its window) can always proceed, so
//     every poster eventually commits (induction over base).
//   * Every wait for slots, the window or completions polls completions (non-blocking try-lock;
//     the commit turn needs none: it waits for posters that poll themselves), so progress never depends on one
//     particular thread polling. Nobody spins on cq_lock: a thread that does not get it goes on
//     waiting and retries. The commit turn is one release store.
//   * Independent thread scheduling (sm_70+) lets lanes of one warp that posted separately wait for
//     each other's commit turn safely.
//   * Doorbell: every commit is followed by ring(), which either rings it or leaves it to the
//     lock holder, who looks at ctrl->ready again after releasing the lock (one of the two sees the
//     other's store), so no committed WQE stays unannounced.
//   * Every wait is bounded: NVSHMEM_EFA_GDA_TIMEOUT_CYCLES of clock64() without progress marks the
//     queue failed (ERR_TIMEOUT) and returns. After a fatal error every operation fails fast; the
//     queue stays failed until the library re-initialises it and the state is reloaded.
//
// Addresses: local buffers (sources of puts, destinations of gets) must lie in this PE's symmetric
// heap [state.heap_base, state.heap_base + state.heap_size) (registered with lkey heap_lkey). Remote
// locations are given either as symmetric addresses of this PE's heap (same offset on every PE, as
// nvshmem_malloc returns them) or as heap offsets (the *_offset variants).
#pragma once

#if !defined(__CUDACC__)
#error "nvshmem_efa_gda_device.cuh is CUDA C++: compile with nvcc"
#endif

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "nvshmem_efa_gda.h"
#include "efa_wqe.cuh"

// ---------------------------------------------------------------------------------------------
// Configuration (override with -D before including)
// ---------------------------------------------------------------------------------------------

// Cycles (clock64) a wait may go without progress before the queue is marked failed.
// Default about 10 s at 2 GHz.
#ifndef NVSHMEM_EFA_GDA_TIMEOUT_CYCLES
#define NVSHMEM_EFA_GDA_TIMEOUT_CYCLES (20000000000ULL)
#endif

// Largest payload of one WQE; larger messages are split into chunks of this size.
#ifndef NVSHMEM_EFA_GDA_MAX_WQE_BYTES
#define NVSHMEM_EFA_GDA_MAX_WQE_BYTES (1ULL << 20)
#endif

// Most WQEs one thread reserves and commits at once (thread-scope chunking).
#ifndef NVSHMEM_EFA_GDA_MAX_WQES_PER_POST
#define NVSHMEM_EFA_GDA_MAX_WQES_PER_POST 32u
#endif

// CQ entries whose phase bytes one poll loads together (one round trip for all of them when the
// CQ lies in host memory).
#ifndef NVSHMEM_EFA_GDA_CQ_POLL_BATCH
#define NVSHMEM_EFA_GDA_CQ_POLL_BATCH 16u
#endif

// Upper bound of the back-off sleep in wait loops (nanoseconds).
#ifndef NVSHMEM_EFA_GDA_MAX_BACKOFF_NS
#define NVSHMEM_EFA_GDA_MAX_BACKOFF_NS 1024u
#endif

// Upper bound of the back-off sleep of a poster whose turn is far away (more than
// NVSHMEM_EFA_GDA_FAR_WQES WQEs must complete or commit before it): thousands of threads waiting
// on one queue would otherwise keep its control words and L2 busy for the few that can progress.
#ifndef NVSHMEM_EFA_GDA_MAX_FAR_BACKOFF_NS
#define NVSHMEM_EFA_GDA_MAX_FAR_BACKOFF_NS 8192u
#endif
#ifndef NVSHMEM_EFA_GDA_FAR_WQES
#define NVSHMEM_EFA_GDA_FAR_WQES 64u
#endif

// Idle cycles after which a wait checks whether the software queue's consumer stopped, and the
// interval of the further checks while it stays idle. The flag lives in host memory: each check is
// a read across PCIe, so thousands of waiting threads must not issue it on every back-off step
// (that saturates the link and starves the queue's own DMA).
#ifndef NVSHMEM_EFA_GDA_STOP_CHECK_CYCLES
#define NVSHMEM_EFA_GDA_STOP_CHECK_CYCLES (1ULL << 24)
#endif

// ---------------------------------------------------------------------------------------------
// Status codes. Values below 0x100 are EFA completion statuses (FACTS.md section 3: 1 flushed,
// 2-6 local errors, 7 remote bad address, ...); the library's own codes start at 0x1000.
// ---------------------------------------------------------------------------------------------
#define NVSHMEM_EFA_GDA_OK 0
#define NVSHMEM_EFA_GDA_ERR_TIMEOUT 0x1001   /* a wait made no progress for TIMEOUT_CYCLES */
#define NVSHMEM_EFA_GDA_ERR_STOPPED 0x1002   /* the software queue's consumer thread stopped */
#define NVSHMEM_EFA_GDA_ERR_NOT_READY 0x1003 /* device state not loaded / not ready */
#define NVSHMEM_EFA_GDA_ERR_INVALID 0x1004   /* bad PE, address outside a heap, bad size */
#define NVSHMEM_EFA_GDA_ERR_FAILED 0x1005    /* the queue failed earlier (see first_error) */
#define NVSHMEM_EFA_GDA_ERR_UNSUPPORTED 0x1006 /* not available on this queue (AMOs on a hardware queue without receive path) */

// Per-application device word next to the state (defined in nvshmem_efa_gda_state.cu): the
// fail-fast flag of the queue and the two numbers DeepEP-style code reads through
// ibgda_get_state() (see nvshmem_efa_gda_ibgda.cuh).
typedef struct NvshmemEfaGdaDeviceLocal {
    int num_rc_per_pe;            // reported to IBGDA-style code; the queue ignores qp ids
    int num_devices_initialized;  // reported to IBGDA-style code (1)
    unsigned int fatal;           // 0, or the code that made the queue unusable
    unsigned int reserved;
} NvshmemEfaGdaDeviceLocal;

// Host side (defined in nvshmem_efa_gda_state.cu).
// Loads the library's device state into this application's nvshmem_efa_gda_state_d (and resets the
// fail-fast flag). Returns NVSHMEM_EFA_GDA_LOAD_OK when kernels may post on the GDA queue. These
// NVSHMEM_EFA_GDA_LOAD_* codes (like NVSHMEM_EFA_GDA_ERR_* above) belong to the device API of these
// headers; the library's host C API returns the NVSHMEM_EFA_ERROR_* codes of nvshmem_efa_gda.h.
#define NVSHMEM_EFA_GDA_LOAD_OK 0
#define NVSHMEM_EFA_GDA_LOAD_NOT_READY 1   /* copied, but the library has no usable GDA queue */
#define NVSHMEM_EFA_GDA_LOAD_EGET (-1)     /* nvshmemt_efa_gda_get_device_state failed */
#define NVSHMEM_EFA_GDA_LOAD_EVERSION (-2) /* state layout version differs from this header */
#define NVSHMEM_EFA_GDA_LOAD_EGEOMETRY (-3) /* queue geometry the device code cannot drive */
#define NVSHMEM_EFA_GDA_LOAD_ECUDA (-4)    /* a CUDA copy failed */
extern "C" int nvshmem_efa_gda_load_device_state(cudaStream_t stream);
// Overrides the numbers ibgda_get_state() reports (default: NVSHMEM_IBGDA_NUM_RC_PER_PE or 1, and 1).
extern "C" int nvshmem_efa_gda_set_ibgda_compat(int num_rc_per_pe, int num_devices_initialized,
                                                cudaStream_t stream);

// The device state (declaration only: the one definition is in nvshmem_efa_gda_state.cu).
extern __device__ NvshmemEfaGdaDeviceState nvshmem_efa_gda_state_d;
extern __device__ NvshmemEfaGdaDeviceLocal nvshmem_efa_gda_local_d;

// ---------------------------------------------------------------------------------------------
// Optional profile (compile with -DNVSHMEM_EFA_GDA_PROFILE): clock64() cycles and counts of each
// step of the posting protocol, summed over the threads that ran it, in a per-translation-unit
// device variable the host reads with cudaMemcpyFromSymbol (tests/gpu_gda/gda_bench.cu prints it).
// Off by default: the accounting costs two atomics per step.
// ---------------------------------------------------------------------------------------------
#define NVSHMEM_EFA_GDA_PROF_RESERVE 0   /* reserve(): the whole step (slots + window) */
#define NVSHMEM_EFA_GDA_PROF_SLOTS 1     /* waiting for free slots (completions) */
#define NVSHMEM_EFA_GDA_PROF_WINDOW 2    /* waiting for the doorbell window */
#define NVSHMEM_EFA_GDA_PROF_WRITE 3     /* writing the WQEs and the system fence */
#define NVSHMEM_EFA_GDA_PROF_TURN 4      /* waiting for the ordered-commit turn */
#define NVSHMEM_EFA_GDA_PROF_RING 5      /* ring(): a doorbell store (lock taken, ready past rung) */
#define NVSHMEM_EFA_GDA_PROF_POLL 6      /* poll_cq() with the lock and at least one CQE; count = CQEs */
#define NVSHMEM_EFA_GDA_PROF_QUIET 7     /* quiet() */
#define NVSHMEM_EFA_GDA_PROF_POLLS 8     /* the same polls as POLL, counted once each */
#define NVSHMEM_EFA_GDA_PROF_N 9
#if defined(NVSHMEM_EFA_GDA_PROFILE)
static __device__ unsigned long long nvshmem_efa_gda_prof_cycles[NVSHMEM_EFA_GDA_PROF_N];
static __device__ unsigned long long nvshmem_efa_gda_prof_count[NVSHMEM_EFA_GDA_PROF_N];
#define NVSHMEM_EFA_GDA_PROF_T0(name) const long long name = clock64()
#define NVSHMEM_EFA_GDA_PROF_ADD(k, t0, n)                                                       \
    do {                                                                                         \
        atomicAdd(&nvshmem_efa_gda_prof_cycles[k], (unsigned long long)(clock64() - (t0)));     \
        atomicAdd(&nvshmem_efa_gda_prof_count[k], (unsigned long long)(n));                     \
    } while (0)
#else
#define NVSHMEM_EFA_GDA_PROF_T0(name) (void)0
#define NVSHMEM_EFA_GDA_PROF_ADD(k, t0, n) (void)0
#endif

namespace nvshmem_efa_gda {

// One immediate (or other RX completion) taken from this PE's RX ring.
struct RxEvent {
    uint32_t imm;      // immediate data (valid when has_imm)
    uint32_t length;   // bytes written / received
    uint16_t ah;       // sender's address handle as the queue reports it
    uint16_t src_qp;   // sender's QP number
    uint8_t status;    // EFA completion status (0 = success)
    uint8_t op;        // EFA op type (0 SEND, 2 RDMA_WRITE)
    uint8_t has_imm;   // 1 when imm is valid
    uint8_t reserved;
};

namespace detail {

#define NVSHMEM_EFA_GDA_DEV __device__ __forceinline__

// An AMO operand of 4 or 8 bytes as the 64-bit field of the WQE (4-byte values zero-extended).
template <typename T>
NVSHMEM_EFA_GDA_DEV uint64_t amo_operand(T value) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "AMO operands are 4 or 8 bytes");
    return sizeof(T) == 4 ? (uint64_t)(uint32_t)value : (uint64_t)value;
}

// ---- small PTX helpers ------------------------------------------------------------------------
NVSHMEM_EFA_GDA_DEV uint64_t ld_acquire_u64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
NVSHMEM_EFA_GDA_DEV void st_release_u64(uint64_t *p, uint64_t v) {
    asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
NVSHMEM_EFA_GDA_DEV uint32_t ld_acquire_u32(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
NVSHMEM_EFA_GDA_DEV uint8_t ld_volatile_u8(const void *p) {
    return *reinterpret_cast<const volatile uint8_t *>(p);
}
NVSHMEM_EFA_GDA_DEV uint16_t ld_volatile_u16(const void *p) {
    return *reinterpret_cast<const volatile uint16_t *>(p);
}
NVSHMEM_EFA_GDA_DEV uint32_t ld_volatile_u32(const void *p) {
    return *reinterpret_cast<const volatile uint32_t *>(p);
}
NVSHMEM_EFA_GDA_DEV uint64_t ld_volatile_u64(const void *p) {
    return *reinterpret_cast<const volatile uint64_t *>(p);
}
NVSHMEM_EFA_GDA_DEV unsigned long long *ull(uint64_t *p) {
    return reinterpret_cast<unsigned long long *>(p);
}

NVSHMEM_EFA_GDA_DEV void backoff(unsigned &ns, unsigned cap = NVSHMEM_EFA_GDA_MAX_BACKOFF_NS) {
    __nanosleep(ns);
    ns = ns < cap ? ns * 2u : cap;
}

// ---- the state, loaded once per operation through the read-only path ---------------------------
// The state only changes between kernels (nvshmem_efa_gda_load_device_state), so non-coherent
// loads are safe and let the compiler drop the fields an operation does not use.
struct View {
    uint32_t ready;
    int32_t my_pe;
    int32_t n_pes;
    uint64_t sq;
    uint32_t *sq_doorbell;
    const uint8_t *cq;
    const uint8_t *rx_cq;
    NvshmemEfaGdaQueueCtrl *ctrl;
    uint32_t *slot_status;
    const NvshmemEfaGdaHostCtrl *host_ctrl;
    uint32_t sq_entries;
    uint32_t sq_entry_size;
    uint32_t cq_entries;
    uint32_t cq_entry_size;
    uint32_t rx_entries;
    uint32_t max_batch;
    uint32_t mode;
    uint64_t heap_base;
    uint64_t heap_size;
    uint32_t heap_lkey;
    const NvshmemEfaGdaPeer *peers;
    // Granule-indexed registration table (state version 2; 0 with a version-1 state, whose single
    // registration per PE is heap_base/heap_size/heap_lkey and the peer's heap_* fields).
    const unsigned long long *keys;
    uint32_t log2_granularity;
    uint32_t key_stride;
    uint32_t n_granules;
};

// The queue of table entry `qi` (state version 3; entry 0, `state.queue`, when the state has no
// table or `qi` lies outside it).
NVSHMEM_EFA_GDA_DEV const NvshmemEfaGdaQueue *queue_entry(uint32_t qi) {
    const NvshmemEfaGdaDeviceState *s = &nvshmem_efa_gda_state_d;
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 3
    const NvshmemEfaGdaQueue *t = reinterpret_cast<const NvshmemEfaGdaQueue *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&s->queues)));
    if (t != nullptr && qi < __ldg(&s->n_queues)) return t + qi;
#else
    (void)qi;
#endif
    return &s->queue;
}

// Entries of the queue table (1 without one).
NVSHMEM_EFA_GDA_DEV uint32_t queue_count() {
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 3
    const NvshmemEfaGdaDeviceState *s = &nvshmem_efa_gda_state_d;
    if (__ldg(reinterpret_cast<const unsigned long long *>(&s->queues)) != 0ull) {
        const uint32_t n = __ldg(&s->n_queues);
        return n != 0u ? n : 1u;
    }
#endif
    return 1u;
}

// Table entry of (dst_pe, qp_id): dst_pe * queues_per_pe + qp_id % queues_per_pe (IBGDA's
// ibgda_get_rc). A PE or qp id outside the table gives an index queue_entry() maps to entry 0; the
// operation's own checks reject a bad PE.
NVSHMEM_EFA_GDA_DEV uint32_t queue_index(int pe, int qp) {
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 3
    const uint32_t per = __ldg(&nvshmem_efa_gda_state_d.queues_per_pe);
    if (per == 0u || pe < 0) return 0u;
    return (uint32_t)pe * per + (uint32_t)qp % per;
#else
    (void)pe;
    (void)qp;
    return 0u;
#endif
}

// `qi`: the queue table entry the operation posts to (queue_index()); 0: the first queue.
NVSHMEM_EFA_GDA_DEV View view(uint32_t qi = 0u) {
    const NvshmemEfaGdaDeviceState *s = &nvshmem_efa_gda_state_d;
    const NvshmemEfaGdaQueue *q = queue_entry(qi);
    View v;
    v.ready = __ldg(&s->ready);
    v.my_pe = __ldg(&s->my_pe);
    v.n_pes = __ldg(&s->n_pes);
    v.sq = __ldg(reinterpret_cast<const unsigned long long *>(&q->sq));
    v.sq_doorbell = reinterpret_cast<uint32_t *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->sq_doorbell)));
    v.cq = reinterpret_cast<const uint8_t *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->cq)));
    v.rx_cq = reinterpret_cast<const uint8_t *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->rx_cq)));
    v.ctrl = reinterpret_cast<NvshmemEfaGdaQueueCtrl *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->ctrl)));
    v.slot_status = reinterpret_cast<uint32_t *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->slot_status)));
    v.host_ctrl = reinterpret_cast<const NvshmemEfaGdaHostCtrl *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&q->host_ctrl)));
    v.sq_entries = __ldg(&q->sq_entries);
    v.sq_entry_size = __ldg(&q->sq_entry_size);
    v.cq_entries = __ldg(&q->cq_entries);
    v.cq_entry_size = __ldg(&q->cq_entry_size);
    v.rx_entries = __ldg(&q->rx_entries);
    v.max_batch = __ldg(&q->max_batch);
    v.mode = __ldg(&q->mode);
    v.heap_base = __ldg(reinterpret_cast<const unsigned long long *>(&s->heap_base));
    v.heap_size = __ldg(reinterpret_cast<const unsigned long long *>(&s->heap_size));
    v.heap_lkey = __ldg(&s->heap_lkey);
    v.peers = reinterpret_cast<const NvshmemEfaGdaPeer *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&s->peers)));
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 2
    v.keys = reinterpret_cast<const unsigned long long *>(
        __ldg(reinterpret_cast<const unsigned long long *>(&s->heap_keys)));
    v.log2_granularity = __ldg(&s->log2_granularity);
    v.key_stride = __ldg(&s->key_stride);
    v.n_granules = __ldg(&s->n_granules);
#else
    v.keys = nullptr;
    v.log2_granularity = 0;
    v.key_stride = 0;
    v.n_granules = 0;
#endif
    return v;
}

struct PeerView {
    uint16_t ahn;
    uint16_t qpn;
    uint32_t qkey;
    uint64_t heap_base;
    uint64_t heap_size;
    uint32_t rkey;
    uint32_t flags;
};

NVSHMEM_EFA_GDA_DEV PeerView peer(const View &v, int pe) {
    const unsigned long long *w = reinterpret_cast<const unsigned long long *>(v.peers + pe);
    unsigned long long w0 = __ldg(w + 0), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
    PeerView p;
    p.ahn = (uint16_t)(w0 & 0xffffu);
    p.qpn = (uint16_t)((w0 >> 16) & 0xffffu);
    p.qkey = (uint32_t)(w0 >> 32);
    p.heap_base = w1;
    p.heap_size = w2;
    p.rkey = (uint32_t)(w3 & 0xffffffffu);
    p.flags = (uint32_t)(w3 >> 32);
    return p;
}

// ---- errors --------------------------------------------------------------------------------------
NVSHMEM_EFA_GDA_DEV unsigned fatal_code() {
    return *reinterpret_cast<volatile unsigned *>(&nvshmem_efa_gda_local_d.fatal);
}

// Counts an error in the queue's control block and remembers the first one.
NVSHMEM_EFA_GDA_DEV void record_error(const View &v, uint32_t code) {
    atomicAdd(ull(&v.ctrl->errors), 1ull);
    atomicCAS(&v.ctrl->first_error, 0u, code);
}

// Marks the queue failed (first fatal code wins) and records the error once.
NVSHMEM_EFA_GDA_DEV void set_fatal(const View &v, uint32_t code) {
    if (atomicCAS(&nvshmem_efa_gda_local_d.fatal, 0u, code) == 0u) record_error(v, code);
}

// Bounded-wait bookkeeping: timeout measured from the last observed progress.
struct Waiter {
    long long last;
    long long checked;  // last look at host_ctrl->stopped (or the start of the idle period)
    uint64_t seen;
    unsigned ns;
    NVSHMEM_EFA_GDA_DEV void start(uint64_t first) {
        last = clock64();
        checked = last;
        seen = first;
        ns = 32u;
    }
    // Returns 0 to keep waiting, or the code to give up with. `far`: the caller's turn is more
    // than NVSHMEM_EFA_GDA_FAR_WQES away (sleeps up to NVSHMEM_EFA_GDA_MAX_FAR_BACKOFF_NS).
    NVSHMEM_EFA_GDA_DEV unsigned step(const View &v, uint64_t observed, bool far = false,
                                      unsigned near_cap = NVSHMEM_EFA_GDA_MAX_BACKOFF_NS) {
        long long now = clock64();
        if (observed != seen) {
            seen = observed;
            last = now;
            checked = now;
            ns = 32u;
            return 0u;
        }
        unsigned f = fatal_code();
        if (f != 0u) return NVSHMEM_EFA_GDA_ERR_FAILED;
        unsigned long long idle = (unsigned long long)(now - last);
        if ((unsigned long long)(now - checked) > NVSHMEM_EFA_GDA_STOP_CHECK_CYCLES &&
            v.host_ctrl != nullptr) {
            checked = now;
            if (ld_volatile_u64(&v.host_ctrl->stopped) != 0ull) {
                set_fatal(v, NVSHMEM_EFA_GDA_ERR_STOPPED);
                return NVSHMEM_EFA_GDA_ERR_STOPPED;
            }
        }
        if (idle > NVSHMEM_EFA_GDA_TIMEOUT_CYCLES) {
            set_fatal(v, NVSHMEM_EFA_GDA_ERR_TIMEOUT);
            return NVSHMEM_EFA_GDA_ERR_TIMEOUT;
        }
        backoff(ns, far ? NVSHMEM_EFA_GDA_MAX_FAR_BACKOFF_NS : near_cap);
        return 0u;
    }
};

// Copies a completion entry (16-byte aligned, size a multiple of 8) with volatile loads.
template <typename E>
NVSHMEM_EFA_GDA_DEV E read_entry(const void *src) {
    static_assert(sizeof(E) % 8 == 0, "entries are read in 8-byte words");
    E e;
    uint64_t w[sizeof(E) / 8];
#pragma unroll
    for (unsigned i = 0; i < sizeof(E) / 8; ++i) w[i] = ld_volatile_u64(static_cast<const uint64_t *>(src) + i);
    memcpy(&e, w, sizeof(E));
    return e;
}

// Loads of CQ entries (the CQ may be host memory, a round trip across PCIe per load). Default:
// ld.global.cv (fetch again, no cached copy), weak loads the GPU keeps in flight together; with
// NVSHMEM_EFA_GDA_CQ_VOLATILE volatile loads (ld.volatile), one after the other.
NVSHMEM_EFA_GDA_DEV uint8_t cq_flags(const uint8_t *cqe) {
#if defined(NVSHMEM_EFA_GDA_CQ_VOLATILE)
    return nvshmem_efa_cqe_flags(cqe);
#else
    return __ldcv(cqe + 3);
#endif
}
NVSHMEM_EFA_GDA_DEV nvshmem_efa_tx_cdesc cq_entry(const uint8_t *cqe) {
#if defined(NVSHMEM_EFA_GDA_CQ_VOLATILE)
    return read_entry<nvshmem_efa_tx_cdesc>(cqe);
#else
    static_assert(sizeof(nvshmem_efa_tx_cdesc) == 16, "TX CQE is 16 bytes");
    const ulonglong2 w = __ldcv(reinterpret_cast<const ulonglong2 *>(cqe));
    nvshmem_efa_tx_cdesc e;
    memcpy(&e, &w, sizeof e);
    return e;
#endif
}

// End of a poll by the holder of cq_lock: publishes the CQ consumer index `ci`, advances done from
// `d` (what the poll retired in order) over slots marked in this or an earlier poll (read 8 at a
// time; only the lock holder touches slot_status, so plain L2 accesses suffice), releases done,
// mirrors it for the software consumer (a posted store across PCIe, never ahead of ctrl->done),
// and releases the lock. Returns done.
NVSHMEM_EFA_GDA_DEV uint64_t finish_poll(const View &v, uint64_t ci, uint64_t d, uint64_t d0,
                                         long long prof_t0) {
    (void)prof_t0;
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    const uint64_t mask = (uint64_t)(v.sq_entries - 1);
    *reinterpret_cast<volatile uint64_t *>(&c->cq_ci) = ci;
    for (uint32_t i = 0; i < v.sq_entries; i += 8) {
        uint32_t m[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j) m[j] = __ldcg(&v.slot_status[(d + j) & mask]);
        uint32_t run = 0;
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j)
            if (run == j && m[j] != 0u) run = j + 1;
        for (uint32_t j = 0; j < run; ++j) __stcg(&v.slot_status[(d + j) & mask], 0u);
        d += run;
        if (run < 8) break;
    }
    if (d != d0) {
        st_release_u64(&c->done, d);
        if (v.host_ctrl != nullptr)
            *reinterpret_cast<volatile uint64_t *>(const_cast<uint64_t *>(&v.host_ctrl->done)) = d;
    }
    __threadfence();
    atomicExch(&c->cq_lock, 0u);
#if defined(NVSHMEM_EFA_GDA_PROFILE)
    if (d != d0) {
        NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_POLL, prof_t0, d - d0);
        NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_POLLS, prof_t0, 1);
    }
#endif
    return d;
}

// ---- completions ---------------------------------------------------------------------------------
// Consumes the CQEs that are there and advances ctrl->done. Non-blocking: returns at once when
// another thread holds cq_lock (that thread does the same work). Returns ctrl->done.
// The CQ may lie in host memory (software queue), where every load is a round trip across PCIe:
// the phase bytes of NVSHMEM_EFA_GDA_CQ_POLL_BATCH entries are loaded together (independent loads,
// one round trip), then, after a system fence, the bodies of the ready ones (a second round trip),
// instead of two dependent round trips per entry.
NVSHMEM_EFA_GDA_DEV uint64_t poll_cq(const View &v) {
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    if (ld_volatile_u32(&c->cq_lock) != 0u || atomicCAS(&c->cq_lock, 0u, 1u) != 0u)
        return ld_acquire_u64(&c->done);
    const long long prof_t0 = clock64();
    __threadfence();  // acquire side of the lock
    const uint32_t ncq = v.cq_entries;
    const uint32_t nsq = v.sq_entries;
    constexpr uint32_t P = NVSHMEM_EFA_GDA_CQ_POLL_BATCH;
    uint64_t ci = ld_volatile_u64(&c->cq_ci);
    uint64_t d = ld_volatile_u64(&c->done);
    const uint64_t d0 = d;
    // Completions arrive mostly in order: a CQE for slot `d` with no later slot marked advances
    // done directly; any other is marked in slot_status (read back below).
    bool marked = false;
    for (uint32_t budget = 0; budget < ncq; budget += P) {
        nvshmem_efa_tx_cdesc t[P];
        uint32_t n = 0;
#if defined(NVSHMEM_EFA_GDA_CQ_ONE_LOAD)
        // Experiment: each CQE in one 16-byte load, phase and body together (relies on the
        // writer's body-then-flags order being kept within the 16-byte read; not the default).
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            t[j] = cq_entry(v.cq + (size_t)nvshmem_efa_sq_slot(ci + j, ncq) * v.cq_entry_size);
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            if (n == j && (t[j].common.flags & NVSHMEM_EFA_CQE_PHASE) ==
                              nvshmem_efa_cq_expected_phase(ci + j, ncq))
                n = j + 1;
        if (n == 0) break;
#else
        uint8_t flags[P];
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            flags[j] = cq_flags(v.cq + (size_t)nvshmem_efa_sq_slot(ci + j, ncq) * v.cq_entry_size);
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            if (n == j && (flags[j] & NVSHMEM_EFA_CQE_PHASE) ==
                              nvshmem_efa_cq_expected_phase(ci + j, ncq))
                n = j + 1;
        if (n == 0) break;
        __threadfence_system();  // the rest of each CQE is read after its phase
#pragma unroll
        for (uint32_t j = 0; j < P; ++j)
            if (j < n)
                t[j] = cq_entry(v.cq + (size_t)nvshmem_efa_sq_slot(ci + j, ncq) * v.cq_entry_size);
#endif
#pragma unroll
        for (uint32_t j = 0; j < P; ++j) {
            if (j >= n) break;
            const uint16_t req_id = nvshmem_efa_cqe_req_id(&t[j].common);
            const uint8_t status = nvshmem_efa_cqe_status(&t[j].common);
            if (status != 0) record_error(v, status);
            if (!marked && req_id == (uint16_t)d) {
                ++d;
            } else {
                marked = true;
                __stcg(&v.slot_status[req_id & (nsq - 1)], (uint32_t)status + 1u);
            }
        }
        ci += n;
        if (n < P) break;
    }
    return finish_poll(v, ci, d, d0, prof_t0);
}

// ---- doorbell ------------------------------------------------------------------------------------
// ctrl->rung holds the low 32 bits of the last doorbell value. rung <= ready at every moment (it is
// set to a value read from ready, which only grows) and they stay within 2^31 of each other, so
// reading rung and then ready recovers the full count.
NVSHMEM_EFA_GDA_DEV uint64_t full_count(uint64_t later, uint32_t low) {
    return later - (uint64_t)(uint32_t)((uint32_t)later - low);
}
NVSHMEM_EFA_GDA_DEV uint64_t rung_count(const View &v) {
    const uint32_t low = ld_acquire_u32(&v.ctrl->rung);
    return full_count(ld_acquire_u64(&v.ctrl->ready), low);
}

// Step 4b: rings what is committed (stores ctrl->ready into the doorbell when it is past rung).
// Non-blocking: when another thread holds db_lock it returns at once, and the holder looks at
// ctrl->ready again after releasing the lock. The caller's commit (release store of ready),
// __threadfence(), its look at db_lock, against the holder's release of db_lock, __threadfence(),
// its look at ready (fence.sc on both sides): one of them sees the other's store, so nothing
// committed before the call stays unrung. The holder keeps ringing while commits keep coming,
// each doorbell store covering every commit since the last.
NVSHMEM_EFA_GDA_DEV void ring(const View &v) {
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    __threadfence();
    for (;;) {
        if (rung_count(v) >= ld_acquire_u64(&c->ready)) return;
        if (ld_volatile_u32(&c->db_lock) != 0u || atomicCAS(&c->db_lock, 0u, 1u) != 0u) return;
        NVSHMEM_EFA_GDA_PROF_T0(prof_t0);
        __threadfence();  // acquire side of the lock
        const uint64_t r = ld_acquire_u64(&c->ready);
        const uint64_t rung = full_count(r, ld_volatile_u32(&c->rung));
        if (r > rung) {
            // Every WQE below r was fenced system-wide by its writer before its commit.
            __threadfence_system();
            *reinterpret_cast<volatile uint32_t *>(v.sq_doorbell) = (uint32_t)r;
            // The store is performed before the lock passes on: doorbell values land in order.
            __threadfence_system();
            *reinterpret_cast<volatile uint32_t *>(&c->rung) = (uint32_t)r;
            NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_RING, prof_t0, 1);
        }
        __threadfence();
        atomicExch(&c->db_lock, 0u);
        __threadfence();  // then look at ready again (top of the loop)
    }
}

// Waits until ctrl->done >= target, ringing what is committed but not rung. Returns 0 or an error
// code.
NVSHMEM_EFA_GDA_DEV unsigned wait_done(const View &v, uint64_t target) {
    uint64_t d = ld_acquire_u64(&v.ctrl->done);
    if (d >= target) return 0u;
    Waiter w;
    w.start(d);
    for (;;) {
        ring(v);
        d = poll_cq(v);
        if (d >= target) return 0u;
        unsigned e = w.step(v, d, target - d > NVSHMEM_EFA_GDA_FAR_WQES);
        if (e) return e;
    }
}

// ---- posting -------------------------------------------------------------------------------------
// Most WQEs that may stand written but not yet announced by the doorbell, across every poster of
// the queue: the device's max_batch (its staging limit; rdma-core rings at least every max_batch
// WQEs, NCCL's EFA GDA device code keeps un-doorbelled WQEs of all concurrent posters within it),
// never more than the ring. Every reservation is at most this many WQEs.
NVSHMEM_EFA_GDA_DEV uint32_t batch_limit(const View &v) {
    return (v.max_batch != 0u && v.max_batch < v.sq_entries) ? v.max_batch : v.sq_entries;
}

// Step 1 + 2: reserves k (1 <= k <= batch_limit) consecutive slots and waits until
//   * they are free: done >= base + k - sq_entries (their previous WQEs completed), and
//   * they lie in the doorbell window: base + k - rung <= batch_limit (rung: the last value stored
//     into the doorbell), so the WQEs written but not yet rung, over all posters together, never
//     exceed max_batch.
// While it waits for the window it rings what lower posters committed. Returns 0 and the base in
// *base, or an error code (nothing reserved that anyone waits for: the queue is failed then).
// The doorbell-window half of step 2 for the reservation [b, b + k); prof_t0: when the
// reservation started (profile only).
NVSHMEM_EFA_GDA_DEV unsigned wait_window(const View &v, uint64_t b, uint32_t k, long long prof_t0) {
    (void)prof_t0;
    const uint64_t lim = batch_limit(v);
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    uint64_t r = rung_count(v);
    if (b + k - r <= lim) {
        NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_RESERVE, prof_t0, 1);
        return 0u;
    }
    NVSHMEM_EFA_GDA_PROF_T0(prof_window);
    Waiter w;
    w.start(r + ld_acquire_u64(&c->done));
    for (;;) {
        // Progress is the lower reservations' commits and the rings of them (done here too).
        ring(v);
        r = rung_count(v);
        if (b + k - r <= lim) {
            NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_WINDOW, prof_window, 1);
            NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_RESERVE, prof_t0, 1);
            return 0u;
        }
        const uint64_t d = poll_cq(v);
        const unsigned e = w.step(v, r + d, b - r > NVSHMEM_EFA_GDA_FAR_WQES);
        if (e) return e;
    }
}

NVSHMEM_EFA_GDA_DEV unsigned reserve(const View &v, uint32_t k, uint64_t *base) {
    if (fatal_code() != 0u) return NVSHMEM_EFA_GDA_ERR_FAILED;
    const long long prof_t0 = clock64();
    const uint64_t b = atomicAdd(ull(&v.ctrl->resv), (unsigned long long)k);
    *base = b;
    if (b + k > v.sq_entries) {
        NVSHMEM_EFA_GDA_PROF_T0(prof_slots);
        const unsigned e = wait_done(v, b + k - v.sq_entries);
        NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_SLOTS, prof_slots, 1);
        if (e) return e;
    }
    return wait_window(v, b, k, prof_t0);
}

// The lane id, and the lowest lane of `mask`.
NVSHMEM_EFA_GDA_DEV unsigned laneid() {
    unsigned l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}

// Number of lanes of `mask` below the lowest lane of `mask` that is not in `set` (all of `mask`
// when every lane is in `set`): the length of the leading run of `set` in rank order.
NVSHMEM_EFA_GDA_DEV unsigned leading_run(unsigned mask, unsigned set) {
    const unsigned out = mask & ~set;
    return out == 0u ? (unsigned)__popc(mask)
                     : (unsigned)__popc(mask & ((1u << (__ffs((int)out) - 1)) - 1u));
}

// poll_cq() done by the converged lanes of `mask` together (all of them call): lane of rank r
// loads CQ entry cq_ci + r, so one pass reads as many entries as there are lanes, their loads
// issued together (a single thread's loads of a host-memory CQ take about one PCIe round trip
// each). Same result as poll_cq(); returns ctrl->done in every lane.
NVSHMEM_EFA_GDA_DEV uint64_t poll_cq_group(const View &v, unsigned mask) {
    const unsigned me = laneid();
    const int leader = __ffs((int)mask) - 1;
    const unsigned cnt = (unsigned)__popc(mask);
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    if (cnt == 1u) return poll_cq(v);
    int got = 0;
    if ((int)me == leader)
        got = ld_volatile_u32(&c->cq_lock) == 0u && atomicCAS(&c->cq_lock, 0u, 1u) == 0u;
    got = __shfl_sync(mask, got, leader);
    if (!got) {
        uint64_t d = 0;
        if ((int)me == leader) d = ld_acquire_u64(&c->done);
        return __shfl_sync(mask, d, leader);
    }
    const long long prof_t0 = clock64();
    __threadfence();  // acquire side of the lock (every lane reads under it)
    const unsigned rank = (unsigned)__popc(mask & ((1u << me) - 1u));
    const uint32_t ncq = v.cq_entries;
    const uint32_t nsq = v.sq_entries;
    uint64_t ci = ld_volatile_u64(&c->cq_ci);
    uint64_t d = ld_volatile_u64(&c->done);
    const uint64_t d0 = d;
    bool marked = false;  // uniform across the lanes
    for (uint32_t budget = 0; budget < ncq; budget += cnt) {
        const uint64_t e = ci + rank;
        const uint8_t *p = v.cq + (size_t)nvshmem_efa_sq_slot(e, ncq) * v.cq_entry_size;
        const bool rdy = (cq_flags(p) & NVSHMEM_EFA_CQE_PHASE) == nvshmem_efa_cq_expected_phase(e, ncq);
        const unsigned n = leading_run(mask, __ballot_sync(mask, rdy));
        if (n == 0u) break;
        __threadfence_system();  // the rest of each CQE is read after its phase
        uint16_t req_id = 0;
        uint8_t status = 0;
        if (rank < n) {
            const nvshmem_efa_tx_cdesc t = cq_entry(p);
            req_id = nvshmem_efa_cqe_req_id(&t.common);
            status = nvshmem_efa_cqe_status(&t.common);
            if (status != 0) record_error(v, status);
        }
        // In order: the leading run of lanes whose CQE is for slot d + rank (none once a slot was
        // marked in this poll); the others mark their slot.
        const bool in_order = rank < n && !marked && req_id == (uint16_t)(d + rank);
        const unsigned k = leading_run(mask, __ballot_sync(mask, in_order));
        if (rank < n && rank >= k) __stcg(&v.slot_status[req_id & (nsq - 1)], (uint32_t)status + 1u);
        marked = marked || n > k;
        d += k;
        ci += n;
        if (n < cnt) break;
    }
    __syncwarp(mask);  // the marks are visible to the leader
    if ((int)me == leader) d = finish_poll(v, ci, d, d0, prof_t0);
    return __shfl_sync(mask, d, leader);
}

// reserve() made by the converged lanes of `mask` together (all of them call, with the same k):
// the lowest lane reserves, and the wait for free slots polls completions with every lane
// (poll_cq_group). Returns the same status and *base in every lane.
NVSHMEM_EFA_GDA_DEV unsigned reserve_group(const View &v, unsigned mask, uint32_t k, uint64_t *base) {
    const unsigned me = laneid();
    const int leader = __ffs((int)mask) - 1;
    const long long prof_t0 = clock64();
    unsigned st = 0u;
    uint64_t b = 0;
    if ((int)me == leader) {
        if (fatal_code() != 0u)
            st = NVSHMEM_EFA_GDA_ERR_FAILED;
        else
            b = atomicAdd(ull(&v.ctrl->resv), (unsigned long long)k);
    }
    st = __shfl_sync(mask, st, leader);
    if (st) return st;
    b = __shfl_sync(mask, b, leader);
    *base = b;
    if (b + k > v.sq_entries) {
        const uint64_t target = b + k - v.sq_entries;
        uint64_t d = 0;
        if ((int)me == leader) d = ld_acquire_u64(&v.ctrl->done);
        d = __shfl_sync(mask, d, leader);
        if (d < target) {
            NVSHMEM_EFA_GDA_PROF_T0(prof_slots);
            Waiter w;
            w.start(d);
            for (;;) {
                if ((int)me == leader) ring(v);
                d = poll_cq_group(v, mask);
                if (d >= target) break;
                unsigned e = 0u;
                if ((int)me == leader) e = w.step(v, d, target - d > NVSHMEM_EFA_GDA_FAR_WQES);
                e = __shfl_sync(mask, e, leader);
                if (e) return e;
            }
            if ((int)me == leader) NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_SLOTS, prof_slots, 1);
        }
    }
    if ((int)me == leader) st = wait_window(v, b, k, prof_t0);
    return __shfl_sync(mask, st, leader);
}

// Step 3 helper: writes one WQE into slot pc, the whole entry (bytes past the 64-byte WQE of a
// 128-byte entry are zeroed). The caller fences afterwards.
NVSHMEM_EFA_GDA_DEV void store_wqe(const View &v, uint64_t pc, const nvshmem_efa_tx_wqe &w) {
    void *slot = reinterpret_cast<void *>(
        v.sq + (uint64_t)nvshmem_efa_sq_slot(pc, v.sq_entries) * (uint64_t)v.sq_entry_size);
    nvshmem_efa_wqe_store_entry(slot, &w, v.sq_entry_size);
}

// Request id, phase and completion request of the WQE at producer count pc.
NVSHMEM_EFA_GDA_DEV void stamp_wqe(const View &v, uint64_t pc, nvshmem_efa_tx_wqe *w) {
    nvshmem_efa_wqe_set_req_id(w, (uint16_t)pc);
    nvshmem_efa_wqe_set_phase(w, nvshmem_efa_sq_phase(pc, v.sq_entries));
    nvshmem_efa_wqe_set_comp_req(w, 1);
}

// Step 4: ordered commit of [base, base + k) (k <= batch_limit, as reserved), then the doorbell
// (step 4b). Every thread that wrote one of the WQEs has fenced (__threadfence_system()) before.
// The commit chain is GPU-scope only: each poster waits for ready == base and moves it to
// base + k; the system fences and the doorbell store happen in ring(), once for many commits.
// Returns 0 or an error code.
NVSHMEM_EFA_GDA_DEV unsigned commit(const View &v, uint64_t base, uint32_t k) {
    NvshmemEfaGdaQueueCtrl *c = v.ctrl;
    NVSHMEM_EFA_GDA_PROF_T0(prof_t0);
    uint64_t r = ld_acquire_u64(&c->ready);
    if (r != base) {
        // The predecessors are between their reservation and their commit: spin briefly first.
        for (int i = 0; i < 64 && r != base; ++i) r = ld_acquire_u64(&c->ready);
        if (r != base) {
            Waiter w;
            w.start(r);
            for (;;) {
                r = ld_acquire_u64(&c->ready);
                if (r == base) break;
                unsigned e = w.step(v, r, base - r > NVSHMEM_EFA_GDA_FAR_WQES, 128u);
                if (e) return e;
            }
        }
    }
    NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_TURN, prof_t0, 1);
    st_release_u64(&c->ready, base + k);
    ring(v);
    return 0u;
}

// Posts one WQE per calling thread (`w` without request id and phase: stamped here). The lanes of
// a warp that arrive together (the converged set, as cooperative_groups::coalesced_threads() sees
// it) share one reservation and one ordered commit: the lowest lane reserves for the group, every
// lane stores its WQE at base + its rank among the group, the lowest lane commits after
// __syncwarp. Divergent callers form smaller groups, down to one thread; a converged set larger
// than batch_limit is split by rank into groups of at most batch_limit lanes, each with its own
// reservation. *pc_end gets the producer count after the caller's own WQE.
NVSHMEM_EFA_GDA_DEV unsigned post_one(const View &v, nvshmem_efa_tx_wqe w, uint64_t *pc_end) {
    const unsigned active = __activemask();
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    const uint32_t lim = batch_limit(v);
    unsigned grp = active;
    if ((uint32_t)__popc(active) > lim) {
        const unsigned sub = (unsigned)__popc(active & ((1u << lane) - 1u)) / lim;
        grp = __match_any_sync(active, sub);
    }
    const unsigned cnt = (unsigned)__popc(grp);
    const int leader = __ffs((int)grp) - 1;
    const unsigned rank = (unsigned)__popc(grp & ((1u << lane) - 1u));
    uint64_t base = 0;
    unsigned st = reserve_group(v, grp, cnt, &base);
    if (st) return st;
    NVSHMEM_EFA_GDA_PROF_T0(prof_t0);
    stamp_wqe(v, base + rank, &w);
    store_wqe(v, base + rank, w);
    __threadfence_system();
    __syncwarp(grp);
    if ((int)lane == leader) NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_WRITE, prof_t0, 1);
    if ((int)lane == leader) st = commit(v, base, cnt);
    st = __shfl_sync(grp, st, leader);
    *pc_end = base + rank + 1;
    return st;
}

// Builds the WQE of one RDMA chunk at producer count pc.
enum RdmaKind : uint8_t { kWrite = 0, kWriteImm = 1, kRead = 2 };

NVSHMEM_EFA_GDA_DEV nvshmem_efa_tx_wqe rdma_wqe(const View &v, const PeerView &p, RdmaKind kind,
                                                uint64_t pc, uint64_t laddr, uint32_t lkey,
                                                uint64_t raddr, uint32_t rkey, uint32_t len,
                                                uint32_t imm) {
    nvshmem_efa_route r;
    r.ah = p.ahn;
    r.dest_qpn = p.qpn;
    r.qkey = p.qkey;
    nvshmem_efa_tx_wqe w;
    if (kind == kRead)
        nvshmem_efa_write_rdma_read(&w, &r, raddr, rkey, laddr, lkey, len);
    else if (kind == kWriteImm)
        nvshmem_efa_write_rdma_write_imm(&w, &r, raddr, rkey, laddr, lkey, len, imm);
    else
        nvshmem_efa_write_rdma_write(&w, &r, raddr, rkey, laddr, lkey, len);
    stamp_wqe(v, pc, &w);
    return w;
}

// ---- heap registrations ----------------------------------------------------------------------------
// NVSHMEM registers its symmetric heap in pieces (one get_mem_handle per VMM chunk of up to 2 GiB,
// each starting and ending on a multiple of its cumem granularity), so one PE's heap carries several
// keys. A version-2 state publishes them in a table indexed by granule: entry
// keys[row * key_stride + (heap_offset >> log2_granularity)] describes the registration holding that
// offset (row = PE for remote keys, row n_pes for this PE's lkeys) as four 64-bit words
// {addr of `start` on the owning PE, start offset, end offset, key | flags << 32}. The lookup is
// O(1): one index computation and one 32-byte read-only load. A version-1 state has one
// registration per PE (heap_base/heap_size/heap_lkey and the peer's heap_* fields).
struct Reg {
    uint64_t addr;  // virtual address of the looked-up offset on the owning PE
    uint64_t room;  // bytes from there to the end of the registration
    uint32_t key;   // lkey (local) or rkey (remote)
};

#define NVSHMEM_EFA_GDA_KEY_FLAG_VALID 1u

// Registration holding heap offset `off` on PE `pe` (local: this PE's own registrations, lkeys).
// `bytes == 0` accepts the end of a version-1 heap (a zero-length write names no byte).
NVSHMEM_EFA_GDA_DEV bool lookup_reg(const View &v, const PeerView &p, bool local, int pe,
                                    uint64_t off, uint64_t bytes, Reg *r) {
    if (v.keys == nullptr) {
        const uint64_t size = local ? v.heap_size : p.heap_size;
        if (bytes == 0 ? off > size : off >= size) return false;
        r->addr = (local ? v.heap_base : p.heap_base) + off;
        r->room = size - off;
        r->key = local ? v.heap_lkey : p.rkey;
        return true;
    }
    const uint64_t g = off >> v.log2_granularity;
    if (g >= (uint64_t)v.n_granules) return false;
    const uint64_t row = local ? (uint64_t)v.n_pes : (uint64_t)pe;
    const unsigned long long *w = v.keys + 4u * (row * (uint64_t)v.key_stride + g);
    const unsigned long long w3 = __ldg(w + 3);
    if (!((uint32_t)(w3 >> 32) & NVSHMEM_EFA_GDA_KEY_FLAG_VALID)) return false;
    const uint64_t start = __ldg(w + 1), end = __ldg(w + 2);
    if (off < start || off >= end) return false;
    r->addr = __ldg(w + 0) + (off - start);
    r->room = end - off;
    r->key = (uint32_t)(w3 & 0xffffffffu);
    return true;
}

// One piece of an RDMA operation that lies in one local and one remote registration.
struct Seg {
    uint64_t laddr;
    uint64_t raddr;
    uint64_t len;
    uint32_t lkey;
    uint32_t rkey;
};

// The first piece of `bytes` from local address laddr / remote heap offset roff on pe: as long as
// both registrations allow (at most `bytes`). False when either end lies in no registration.
NVSHMEM_EFA_GDA_DEV bool first_seg(const View &v, const PeerView &p, int pe, uint64_t laddr,
                                   uint64_t roff, uint64_t bytes, Seg *s) {
    Reg l, r;
    if (laddr < v.heap_base) return false;
    if (!lookup_reg(v, p, true, pe, laddr - v.heap_base, bytes, &l)) return false;
    if (!lookup_reg(v, p, false, pe, roff, bytes, &r)) return false;
    uint64_t n = bytes < l.room ? bytes : l.room;
    n = n < r.room ? n : r.room;
    s->laddr = laddr;
    s->raddr = r.addr;
    s->len = n;
    s->lkey = l.key;
    s->rkey = r.key;
    return true;
}

// Argument checks shared by every RDMA operation: the PE, and every byte of both ranges lies in a
// registration (checked before anything is posted, so an operation is posted whole or not at all).
NVSHMEM_EFA_GDA_DEV unsigned check_rdma(const View &v, int pe, uint64_t laddr, uint64_t roff,
                                        uint64_t bytes, PeerView *p) {
    if (!v.ready) return NVSHMEM_EFA_GDA_ERR_NOT_READY;
    if (pe < 0 || pe >= v.n_pes) return NVSHMEM_EFA_GDA_ERR_INVALID;
    *p = peer(v, pe);
    if (!(p->flags & NVSHMEM_EFA_GDA_PEER_VALID)) return NVSHMEM_EFA_GDA_ERR_INVALID;
    if (laddr + bytes < laddr || roff + bytes < roff) return NVSHMEM_EFA_GDA_ERR_INVALID;
    uint64_t done = 0;
    do {
        Seg s;
        if (!first_seg(v, *p, pe, laddr + done, roff + done, bytes - done, &s))
            return NVSHMEM_EFA_GDA_ERR_INVALID;
        done += s.len;
    } while (done < bytes);
    return 0u;
}

NVSHMEM_EFA_GDA_DEV uint64_t chunk_count(uint64_t bytes) {
    return (bytes + NVSHMEM_EFA_GDA_MAX_WQE_BYTES - 1) / NVSHMEM_EFA_GDA_MAX_WQE_BYTES;
}

NVSHMEM_EFA_GDA_DEV uint32_t chunk_len(uint64_t bytes, uint64_t chunk) {
    const uint64_t off = chunk * NVSHMEM_EFA_GDA_MAX_WQE_BYTES;
    const uint64_t rest = bytes - off;
    return (uint32_t)(rest < NVSHMEM_EFA_GDA_MAX_WQE_BYTES ? rest : NVSHMEM_EFA_GDA_MAX_WQE_BYTES);
}

// One thread posts chunks [c0, c1) of segment s, up to min(MAX_WQES_PER_POST, batch_limit) per
// commit; with kind == kWriteImm only chunk c1 - 1 carries the immediate. Returns 0 or an error
// code; *end_pc gets the producer count after the last posted WQE.
NVSHMEM_EFA_GDA_DEV unsigned post_rdma_thread(const View &v, const PeerView &p, RdmaKind kind,
                                              const Seg &s, uint64_t c0, uint64_t c1,
                                              uint32_t imm, uint64_t *end_pc) {
    const uint32_t lim = batch_limit(v);
    const uint32_t group_max = lim < NVSHMEM_EFA_GDA_MAX_WQES_PER_POST
                                   ? lim
                                   : NVSHMEM_EFA_GDA_MAX_WQES_PER_POST;
    if (c1 - c0 == 1) {  // one WQE: posted together with the warp's other single-WQE callers
        const uint64_t off = c0 * NVSHMEM_EFA_GDA_MAX_WQE_BYTES;
        const RdmaKind kk = (kind == kWriteImm && c0 + 1 != c1) ? kWrite : kind;
        nvshmem_efa_tx_wqe w = rdma_wqe(v, p, kk, 0, s.laddr + off, s.lkey, s.raddr + off, s.rkey,
                                        s.len == 0 ? 0u : chunk_len(s.len, c0), imm);
        return post_one(v, w, end_pc);
    }
    for (uint64_t c = c0; c < c1;) {
        const uint32_t k = (uint32_t)((c1 - c) < group_max ? (c1 - c) : group_max);
        uint64_t base = 0;
        unsigned e = reserve(v, k, &base);
        if (e) return e;
        for (uint32_t i = 0; i < k; ++i) {
            const uint64_t ch = c + i;
            const uint64_t off = ch * NVSHMEM_EFA_GDA_MAX_WQE_BYTES;
            const RdmaKind kk = (kind == kWriteImm && ch + 1 != c1) ? kWrite : kind;
            store_wqe(v, base + i,
                      rdma_wqe(v, p, kk, base + i, s.laddr + off, s.lkey, s.raddr + off, s.rkey,
                               chunk_len(s.len, ch), imm));
        }
        __threadfence_system();
        e = commit(v, base, k);
        if (e) return e;
        *end_pc = base + k;
        c += k;
    }
    return 0u;
}

// One thread posts a whole checked operation (check_rdma passed): every segment, every chunk. With
// kind == kWriteImm the immediate rides on the operation's last WQE, which is posted only after
// every earlier WQE of the operation completed (EFA does not order WQEs).
NVSHMEM_EFA_GDA_DEV unsigned post_rdma_range(const View &v, const PeerView &p, int pe,
                                             RdmaKind kind, uint64_t laddr, uint64_t roff,
                                             uint64_t bytes, uint32_t imm) {
    uint64_t done = 0, end_pc = 0;
    bool posted = false;
    do {
        Seg s;
        if (!first_seg(v, p, pe, laddr + done, roff + done, bytes - done, &s))
            return NVSHMEM_EFA_GDA_ERR_INVALID;  // the table changed under a running kernel
        const bool last = done + s.len == bytes;
        const uint64_t nch = s.len == 0 ? 1 : chunk_count(s.len);
        unsigned e;
        if (kind == kWriteImm && last) {
            if (nch > 1) {
                e = post_rdma_thread(v, p, kWrite, s, 0, nch - 1, 0u, &end_pc);
                if (e) return e;
                posted = true;
            }
            if (posted) {
                e = wait_done(v, end_pc);
                if (e) return e;
            }
            e = post_rdma_thread(v, p, kWriteImm, s, nch - 1, nch, imm, &end_pc);
        } else {
            e = post_rdma_thread(v, p, kind == kWriteImm ? kWrite : kind, s, 0, nch, 0u, &end_pc);
            posted = true;
        }
        if (e) return e;
        done += s.len;
    } while (done < bytes);
    return 0u;
}

// A group of `nlanes` lanes (mask `mask`, lane indices 0..nlanes-1) posts an RDMA operation
// together: the leader (lane 0) reserves up to min(nlanes, batch_limit) slots at a time, every
// lane writes one WQE, the leader commits. All lanes must call with the same arguments; all return
// the same status. (The segment walk reads the same table entries in every lane, so all lanes agree
// on it.)
NVSHMEM_EFA_GDA_DEV unsigned post_rdma_lanes(unsigned mask, int lane, int nlanes, RdmaKind kind,
                                             uint64_t laddr, uint64_t roff, uint64_t bytes,
                                             int pe, uint32_t imm, int qp = 0) {
    const View v = view(queue_index(pe, qp));
    PeerView p;
    unsigned e = check_rdma(v, pe, laddr, roff, bytes, &p);
    if (e) {
        if (lane == 0 && e != NVSHMEM_EFA_GDA_ERR_NOT_READY) record_error(v, e);
        return e;
    }
    if (bytes == 0 && kind != kWriteImm) return 0u;
    const uint32_t lim = batch_limit(v);
    const uint32_t group_max = (uint32_t)nlanes < lim ? (uint32_t)nlanes : lim;
    uint64_t done = 0;
    do {
        Seg s;
        if (!first_seg(v, p, pe, laddr + done, roff + done, bytes - done, &s))
            return NVSHMEM_EFA_GDA_ERR_INVALID;
        const bool last = done + s.len == bytes;
        const uint64_t nch = s.len == 0 ? 1 : chunk_count(s.len);
        for (uint64_t c = 0; c < nch;) {
            const uint32_t k = (uint32_t)((nch - c) < group_max ? (nch - c) : group_max);
            uint64_t base = 0;
            unsigned st = reserve_group(v, mask, k, &base);
            if (st) return st;
            if ((uint32_t)lane < k) {
                const uint64_t ch = c + (uint64_t)lane;
                const uint64_t off = ch * NVSHMEM_EFA_GDA_MAX_WQE_BYTES;
                const RdmaKind kk = (kind == kWriteImm && !(last && ch + 1 == nch)) ? kWrite : kind;
                const uint32_t len = s.len == 0 ? 0u : chunk_len(s.len, ch);
                store_wqe(v, base + (uint64_t)lane,
                          rdma_wqe(v, p, kk, base + (uint64_t)lane, s.laddr + off, s.lkey,
                                   s.raddr + off, s.rkey, len, imm));
                __threadfence_system();
            }
            __syncwarp(mask);
            if (lane == 0) st = commit(v, base, k);
            st = __shfl_sync(mask, st, 0);
            if (st) return st;
            c += k;
        }
        done += s.len;
    } while (done < bytes);
    return 0u;
}

// Posts one inline SEND carrying an AMO message. Returns 0 or an error code.
// With has_imm the SEND also carries `imm`: the target applies the AMO first, then delivers the
// immediate in its RX ring. `flags`: 0 or NVSHMEM_EFA_GDA_AMO_AFTER_DATA (docs/ordering.md).
NVSHMEM_EFA_GDA_DEV unsigned post_amo(uint32_t op, uint64_t roff, uint32_t size, uint64_t value,
                                      int pe, bool has_imm = false, uint32_t imm = 0u,
                                      uint32_t flags = 0u, int qp = 0) {
    const View v = view(queue_index(pe, qp));
    if (!v.ready) return NVSHMEM_EFA_GDA_ERR_NOT_READY;
    // EFA has no RDMA atomics: on a hardware queue the target's receive path (host-posted
    // receives, a host thread applying the message; src/gda/hw_rx.rs) applies these SENDs. A
    // hardware queue without one (the caller's endpoint) publishes no RX ring: nothing would
    // receive or apply the message there, so refuse instead of losing it.
    if (v.mode == NVSHMEM_EFA_GDA_MODE_HW && (v.rx_cq == nullptr || v.rx_entries == 0u)) {
        record_error(v, NVSHMEM_EFA_GDA_ERR_UNSUPPORTED);
        return NVSHMEM_EFA_GDA_ERR_UNSUPPORTED;
    }
    if (pe < 0 || pe >= v.n_pes || (roff & (uint64_t)(size - 1)) != 0) {
        record_error(v, NVSHMEM_EFA_GDA_ERR_INVALID);
        return NVSHMEM_EFA_GDA_ERR_INVALID;
    }
    const PeerView p = peer(v, pe);
    Reg reg;
    if (!(p.flags & NVSHMEM_EFA_GDA_PEER_VALID) || !lookup_reg(v, p, false, pe, roff, size, &reg) ||
        reg.room < size) {
        record_error(v, NVSHMEM_EFA_GDA_ERR_INVALID);
        return NVSHMEM_EFA_GDA_ERR_INVALID;
    }
    NvshmemEfaGdaAmoMsg m;
    m.magic = NVSHMEM_EFA_GDA_AMO_MAGIC;
    m.op = op;
    m.size = size;
    m.flags = flags;
    m.offset = roff;
    m.value = value;
    nvshmem_efa_route r;
    r.ah = p.ahn;
    r.dest_qpn = p.qpn;
    r.qkey = p.qkey;
    nvshmem_efa_tx_wqe w;
    (void)nvshmem_efa_write_send_inline(&w, &r, &m, (uint32_t)sizeof(m));  // 32 <= INLINE_MAX
    if (has_imm) nvshmem_efa_wqe_set_imm(&w, imm);
    uint64_t end_pc = 0;
    return post_one(v, w, &end_pc);
}

// Group helpers: lane index and size of the calling warp / block.
NVSHMEM_EFA_GDA_DEV int lane_id() {
    unsigned l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return (int)l;
}
NVSHMEM_EFA_GDA_DEV unsigned block_thread() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
NVSHMEM_EFA_GDA_DEV unsigned block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

static_assert(sizeof(NvshmemEfaGdaAmoMsg) == 32, "AMO message must fill the 32-byte inline room");
static_assert(sizeof(NvshmemEfaGdaDeviceState) ==
                  (NVSHMEM_EFA_GDA_STATE_VERSION >= 3 ? 176
                   : NVSHMEM_EFA_GDA_STATE_VERSION >= 2 ? 160 : 136),
              "device state layout changed");
static_assert(sizeof(NvshmemEfaGdaQueue) == 88, "queue layout changed");
static_assert(offsetof(NvshmemEfaGdaDeviceState, queue) == 16, "device state layout changed");
static_assert(offsetof(NvshmemEfaGdaDeviceState, peers) == 128, "device state layout changed");
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 3
static_assert(offsetof(NvshmemEfaGdaDeviceState, queues) == 160, "device state layout changed");
static_assert(offsetof(NvshmemEfaGdaDeviceState, n_queues) == 168, "device state layout changed");
static_assert(offsetof(NvshmemEfaGdaDeviceState, queues_per_pe) == 172,
              "device state layout changed");
#endif
static_assert(sizeof(NvshmemEfaGdaPeer) == 32, "peer layout changed");
static_assert(sizeof(NvshmemEfaGdaQueueCtrl) == 64, "queue control layout changed");

}  // namespace detail

// =================================================================================================
// Public device API (namespace nvshmem_efa_gda). Status: 0 or an EFA / NVSHMEM_EFA_GDA_ERR_* code.
// =================================================================================================

// True when the loaded state is complete (kernels may post).
NVSHMEM_EFA_GDA_DEV bool ready() { return __ldg(&nvshmem_efa_gda_state_d.ready) != 0u; }
NVSHMEM_EFA_GDA_DEV int my_pe() { return __ldg(&nvshmem_efa_gda_state_d.my_pe); }
NVSHMEM_EFA_GDA_DEV int n_pes() { return __ldg(&nvshmem_efa_gda_state_d.n_pes); }

// Heap offset of a symmetric address of this PE's heap.
NVSHMEM_EFA_GDA_DEV uint64_t heap_offset(const void *sym) {
    return (uint64_t)(uintptr_t)sym -
           __ldg(reinterpret_cast<const unsigned long long *>(&nvshmem_efa_gda_state_d.heap_base));
}

// Queues: every (dst_pe, qp_id) pair has a queue of the table (state version 3, docs/gda-queues.md);
// calls without a qp id use qp 0 of their PE, the *_qp variants take one. Queues never wait for
// each other; quiet() covers all of them, quiet_qp() one.

// Completions with an error status, plus the library's own errors, since the queues were set up
// (summed over the table's entries; entries that share a queue count it once).
NVSHMEM_EFA_GDA_DEV unsigned long long error_count() {
    const detail::View v0 = detail::view(0u);
    if (!v0.ready) return 0ull;
    unsigned long long n = detail::ld_volatile_u64(&v0.ctrl->errors);
    const uint32_t nq = detail::queue_count();
    for (uint32_t i = 1u; i < nq; ++i) {
        const detail::View v = detail::view(i);
        if (v.ctrl != v0.ctrl) n += detail::ld_volatile_u64(&v.ctrl->errors);
    }
    return n;
}

// First error status recorded on a queue (0 if none); the lowest table entry with one.
NVSHMEM_EFA_GDA_DEV unsigned first_error() {
    if (!detail::view(0u).ready) return 0u;
    const uint32_t nq = detail::queue_count();
    for (uint32_t i = 0u; i < nq; ++i) {
        const unsigned f = detail::ld_volatile_u32(&detail::view(i).ctrl->first_error);
        if (f != 0u) return f;
    }
    return 0u;
}

// Consumes available completions of every queue (non-blocking). Any thread may call it at any time.
NVSHMEM_EFA_GDA_DEV void progress() {
    const detail::View v0 = detail::view(0u);
    if (!v0.ready) return;
    (void)detail::poll_cq(v0);
    const uint32_t nq = detail::queue_count();
    for (uint32_t i = 1u; i < nq; ++i) {
        const detail::View v = detail::view(i);
        if (v.ctrl != v0.ctrl) (void)detail::poll_cq(v);
    }
}

namespace detail {
// Waits until every WQE committed to the queue of `v` before the call has completed (no fence);
// returns 0, the wait's error, or the queue's first recorded error.
NVSHMEM_EFA_GDA_DEV unsigned quiet_wait(const View &v) {
    const uint64_t target = ld_acquire_u64(&v.ctrl->ready);
    const unsigned e = wait_done(v, target);
    if (e) return e;
    if (ld_volatile_u64(&v.ctrl->errors) != 0ull) {
        unsigned f = ld_volatile_u32(&v.ctrl->first_error);
        return f != 0u ? f : NVSHMEM_EFA_GDA_ERR_FAILED;
    }
    return 0u;
}

// quiet of one queue: quiet_wait, then a system fence (what the completions cover is visible).
NVSHMEM_EFA_GDA_DEV unsigned quiet_view(const View &v) {
    if (!v.ready) return NVSHMEM_EFA_GDA_ERR_NOT_READY;
    NVSHMEM_EFA_GDA_PROF_T0(prof_t0);
    const unsigned e = quiet_wait(v);
    NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_QUIET, prof_t0, 1);
    __threadfence_system();
    return e;
}
}  // namespace detail

// Waits until every WQE committed before the call, to any queue, has completed. Returns 0 when no
// error was ever recorded on a queue, else the first error status (EFA status or
// NVSHMEM_EFA_GDA_ERR_*). Thread scope; any number of threads may call it concurrently. Walks the
// queue table (entries that name queue 0 again are skipped); quiet_qp() waits for one queue.
NVSHMEM_EFA_GDA_DEV unsigned quiet() {
    const detail::View v0 = detail::view(0u);
    if (!v0.ready) return NVSHMEM_EFA_GDA_ERR_NOT_READY;
    NVSHMEM_EFA_GDA_PROF_T0(prof_t0);
    unsigned first = detail::quiet_wait(v0);
    const uint32_t nq = detail::queue_count();
    for (uint32_t i = 1u; i < nq; ++i) {
        const detail::View v = detail::view(i);
        if (v.ctrl == v0.ctrl) continue;
        const unsigned e = detail::quiet_wait(v);
        if (first == 0u) first = e;
    }
    NVSHMEM_EFA_GDA_PROF_ADD(NVSHMEM_EFA_GDA_PROF_QUIET, prof_t0, 1);
    // One system fence for every queue waited for.
    __threadfence_system();
    return first;
}

// Waits until every WQE committed before the call to the queue of (pe, qp) has completed (as
// IBGDA's quiet of one RC QP); other queues are not waited for. Returns as quiet().
NVSHMEM_EFA_GDA_DEV unsigned quiet_qp(int pe, int qp) {
    return detail::quiet_view(detail::view(detail::queue_index(pe, qp)));
}

// EFA has no ordering between operations: fence is quiet.
NVSHMEM_EFA_GDA_DEV unsigned fence() { return quiet(); }

// ---- put (RDMA write) ----------------------------------------------------------------------------
// dst: symmetric address of this PE's heap naming the same offset on `pe`; src: local buffer in this
// PE's heap. Non-blocking: src may be reused and dst is complete at the target after quiet().

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_offset_qp(uint64_t dst_offset, const void *src,
                                               size_t bytes, int pe, int qp) {
    const detail::View v = detail::view(detail::queue_index(pe, qp));
    detail::PeerView p;
    const uint64_t laddr = (uint64_t)(uintptr_t)src;
    unsigned e = detail::check_rdma(v, pe, laddr, dst_offset, bytes, &p);
    if (e) {
        if (e != NVSHMEM_EFA_GDA_ERR_NOT_READY) detail::record_error(v, e);
        return e;
    }
    if (bytes == 0) return 0u;
    return detail::post_rdma_range(v, p, pe, detail::kWrite, laddr, dst_offset, bytes, 0u);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_offset(uint64_t dst_offset, const void *src, size_t bytes,
                                            int pe) {
    return put_nbi_offset_qp(dst_offset, src, bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi(void *dst, const void *src, size_t bytes, int pe) {
    return put_nbi_offset_qp(heap_offset(dst), src, bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_qp(void *dst, const void *src, size_t bytes, int pe, int qp) {
    return put_nbi_offset_qp(heap_offset(dst), src, bytes, pe, qp);
}

// Warp scope: all 32 lanes of a converged warp call with the same arguments; lanes write the
// chunks' WQEs in parallel and lane 0 commits them with one doorbell.
NVSHMEM_EFA_GDA_DEV unsigned put_nbi_warp_offset_qp(uint64_t dst_offset, const void *src,
                                                    size_t bytes, int pe, int qp) {
    return detail::post_rdma_lanes(0xffffffffu, detail::lane_id(), 32, detail::kWrite,
                                   (uint64_t)(uintptr_t)src, dst_offset, bytes, pe, 0u, qp);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_warp_offset(uint64_t dst_offset, const void *src,
                                                 size_t bytes, int pe) {
    return put_nbi_warp_offset_qp(dst_offset, src, bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_warp(void *dst, const void *src, size_t bytes, int pe) {
    return put_nbi_warp_offset_qp(heap_offset(dst), src, bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_warp_qp(void *dst, const void *src, size_t bytes, int pe,
                                             int qp) {
    return put_nbi_warp_offset_qp(heap_offset(dst), src, bytes, pe, qp);
}

// Block scope: every thread of the block calls with the same arguments (it contains
// __syncthreads()); the first warp posts, all threads return the same status.
NVSHMEM_EFA_GDA_DEV unsigned put_nbi_block_offset(uint64_t dst_offset, const void *src,
                                                  size_t bytes, int pe) {
    __shared__ unsigned s_status;
    const unsigned t = detail::block_thread();
    const unsigned nt = detail::block_threads();
    __syncthreads();
    if (t < 32u) {
        const int nl = nt < 32u ? (int)nt : 32;
        const unsigned mask = nl == 32 ? 0xffffffffu : ((1u << nl) - 1u);
        unsigned st = detail::post_rdma_lanes(mask, (int)t, nl, detail::kWrite,
                                              (uint64_t)(uintptr_t)src, dst_offset, bytes, pe, 0u);
        if (t == 0u) s_status = st;
    }
    __syncthreads();
    const unsigned st = s_status;
    __syncthreads();
    return st;
}

NVSHMEM_EFA_GDA_DEV unsigned put_nbi_block(void *dst, const void *src, size_t bytes, int pe) {
    return put_nbi_block_offset(heap_offset(dst), src, bytes, pe);
}

// ---- put with immediate ---------------------------------------------------------------------------
// RDMA write with 4 bytes of immediate data: after the payload is placed, the target's RX ring gets
// exactly one completion carrying `imm` (poll_imm on the target). bytes may be 0. A payload larger
// than one WQE is written first; the immediate rides on the last chunk, posted only after the
// earlier chunks completed (EFA does not order WQEs), so the target never sees the immediate before
// all bytes. Thread scope.
NVSHMEM_EFA_GDA_DEV unsigned put_imm_offset_qp(uint64_t dst_offset, const void *src,
                                               size_t bytes, uint32_t imm, int pe, int qp) {
    const detail::View v = detail::view(detail::queue_index(pe, qp));
    detail::PeerView p;
    const uint64_t laddr = (uint64_t)(uintptr_t)src;
    unsigned e = detail::check_rdma(v, pe, laddr, dst_offset, bytes, &p);
    if (e) {
        if (e != NVSHMEM_EFA_GDA_ERR_NOT_READY) detail::record_error(v, e);
        return e;
    }
    return detail::post_rdma_range(v, p, pe, detail::kWriteImm, laddr, dst_offset, bytes, imm);
}

NVSHMEM_EFA_GDA_DEV unsigned put_imm_offset(uint64_t dst_offset, const void *src, size_t bytes,
                                            uint32_t imm, int pe) {
    return put_imm_offset_qp(dst_offset, src, bytes, imm, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_imm(void *dst, const void *src, size_t bytes, uint32_t imm,
                                     int pe) {
    return put_imm_offset_qp(heap_offset(dst), src, bytes, imm, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned put_imm_qp(void *dst, const void *src, size_t bytes, uint32_t imm,
                                        int pe, int qp) {
    return put_imm_offset_qp(heap_offset(dst), src, bytes, imm, pe, qp);
}

// ---- get (RDMA read) -----------------------------------------------------------------------------
// dst: local buffer in this PE's heap; src: symmetric address naming the offset on `pe`. The data is
// in dst after quiet().
NVSHMEM_EFA_GDA_DEV unsigned get_nbi_offset_qp(void *dst, uint64_t src_offset, size_t bytes,
                                               int pe, int qp) {
    const detail::View v = detail::view(detail::queue_index(pe, qp));
    detail::PeerView p;
    const uint64_t laddr = (uint64_t)(uintptr_t)dst;
    unsigned e = detail::check_rdma(v, pe, laddr, src_offset, bytes, &p);
    if (e) {
        if (e != NVSHMEM_EFA_GDA_ERR_NOT_READY) detail::record_error(v, e);
        return e;
    }
    if (bytes == 0) return 0u;
    return detail::post_rdma_range(v, p, pe, detail::kRead, laddr, src_offset, bytes, 0u);
}

NVSHMEM_EFA_GDA_DEV unsigned get_nbi_offset(void *dst, uint64_t src_offset, size_t bytes, int pe) {
    return get_nbi_offset_qp(dst, src_offset, bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned get_nbi(void *dst, const void *src, size_t bytes, int pe) {
    return get_nbi_offset_qp(dst, heap_offset(src), bytes, pe, 0);
}

NVSHMEM_EFA_GDA_DEV unsigned get_nbi_qp(void *dst, const void *src, size_t bytes, int pe, int qp) {
    return get_nbi_offset_qp(dst, heap_offset(src), bytes, pe, qp);
}

NVSHMEM_EFA_GDA_DEV unsigned get_nbi_warp_qp(void *dst, const void *src, size_t bytes, int pe,
                                             int qp) {
    return detail::post_rdma_lanes(0xffffffffu, detail::lane_id(), 32, detail::kRead,
                                   (uint64_t)(uintptr_t)dst, heap_offset(src), bytes, pe, 0u, qp);
}

NVSHMEM_EFA_GDA_DEV unsigned get_nbi_warp(void *dst, const void *src, size_t bytes, int pe) {
    return get_nbi_warp_qp(dst, src, bytes, pe, 0);
}

// ---- non-fetching atomics (applied by the target) --------------------------------------------------
// EFA has no RDMA atomics: an inline SEND carries NvshmemEfaGdaAmoMsg and the target applies it to
// its heap; all AMO messages a PE receives are applied in arrival order by one agent, so concurrent
// adds from every PE are exact. Complete (applied) at the target after quiet() as the queue defines
// SEND completion; use them only together with other AMOs of this API on the same word.
// The agent that applies them is the software queue's consumer thread, or on a hardware queue the
// host thread of its receive path (the same applier). A hardware queue on the caller's endpoint has
// no receive path (no RX ring): there they return NVSHMEM_EFA_GDA_ERR_UNSUPPORTED (recorded on the
// queue).
template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_nonfetch_add_offset_qp(uint64_t offset, T value, int pe, int qp) {
    const uint64_t raw = detail::amo_operand<T>(value);
    return detail::post_amo(NVSHMEM_EFA_GDA_AMO_ADD, offset, (uint32_t)sizeof(T), raw, pe, false,
                            0u, 0u, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_nonfetch_add_offset(uint64_t offset, T value, int pe) {
    return amo_nonfetch_add_offset_qp<T>(offset, value, pe, 0);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_nonfetch_add(T *heap_ptr, T value, int pe) {
    return amo_nonfetch_add_offset_qp<T>(heap_offset(heap_ptr), value, pe, 0);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_nonfetch_add_qp(T *heap_ptr, T value, int pe, int qp) {
    return amo_nonfetch_add_offset_qp<T>(heap_offset(heap_ptr), value, pe, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set_offset_qp(uint64_t offset, T value, int pe, int qp) {
    const uint64_t raw = detail::amo_operand<T>(value);
    return detail::post_amo(NVSHMEM_EFA_GDA_AMO_SET, offset, (uint32_t)sizeof(T), raw, pe, false,
                            0u, 0u, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set_offset(uint64_t offset, T value, int pe) {
    return amo_set_offset_qp<T>(offset, value, pe, 0);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set(T *heap_ptr, T value, int pe) {
    return amo_set_offset_qp<T>(heap_offset(heap_ptr), value, pe, 0);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set_qp(T *heap_ptr, T value, int pe, int qp) {
    return amo_set_offset_qp<T>(heap_offset(heap_ptr), value, pe, qp);
}

// ---- signals: an AMO that announces data (docs/ordering.md) -----------------------------------------
// signal_add / signal_set: the AMO is applied at the target only after every WQE its queue (the
// queue of (pe, qp), qp 0 without a qp id) took before it for the same PE has completed there (its puts have landed), like an RC atomic after
// writes on one QP, without a quiet: the caller does not wait. On the software queue the consumer
// enforces it (the message carries NVSHMEM_EFA_GDA_AMO_AFTER_DATA). A hardware queue has no agent
// between the GPU and the NIC to hold the SEND back, so there these calls first wait for the
// queue's completions (quiet of that one queue), then post the AMO: the same guarantee, paid with a
// wait.
namespace detail {
NVSHMEM_EFA_GDA_DEV unsigned post_signal(uint32_t op, uint64_t offset, uint32_t size,
                                         uint64_t raw, int pe, int qp) {
    const View v = view(queue_index(pe, qp));
    if (v.ready && v.mode == NVSHMEM_EFA_GDA_MODE_HW) {
        const unsigned q = quiet_view(v);
        if (q != 0u) return q;
        return post_amo(op, offset, size, raw, pe, false, 0u, 0u, qp);
    }
    return post_amo(op, offset, size, raw, pe, false, 0u, NVSHMEM_EFA_GDA_AMO_AFTER_DATA, qp);
}
}  // namespace detail

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned signal_add_qp(T *heap_ptr, T value, int pe, int qp) {
    const uint64_t raw = detail::amo_operand<T>(value);
    return detail::post_signal(NVSHMEM_EFA_GDA_AMO_ADD, heap_offset(heap_ptr), (uint32_t)sizeof(T),
                               raw, pe, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned signal_add(T *heap_ptr, T value, int pe) {
    return signal_add_qp<T>(heap_ptr, value, pe, 0);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned signal_set_qp(T *heap_ptr, T value, int pe, int qp) {
    const uint64_t raw = detail::amo_operand<T>(value);
    return detail::post_signal(NVSHMEM_EFA_GDA_AMO_SET, heap_offset(heap_ptr), (uint32_t)sizeof(T),
                               raw, pe, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned signal_set(T *heap_ptr, T value, int pe) {
    return signal_set_qp<T>(heap_ptr, value, pe, 0);
}

// amo_set that also delivers `imm` to the target's RX ring once the value is stored there (one
// SEND: the target applies the AMO before it produces the RX entry). Thread scope.
template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set_imm_qp(T *heap_ptr, T value, uint32_t imm, int pe, int qp) {
    const uint64_t raw = detail::amo_operand<T>(value);
    return detail::post_amo(NVSHMEM_EFA_GDA_AMO_SET, heap_offset(heap_ptr), (uint32_t)sizeof(T), raw,
                            pe, true, imm, 0u, qp);
}

template <typename T>
NVSHMEM_EFA_GDA_DEV unsigned amo_set_imm(T *heap_ptr, T value, uint32_t imm, int pe) {
    return amo_set_imm_qp<T>(heap_ptr, value, imm, pe, 0);
}

// ---- RX ring: immediates delivered to this PE -------------------------------------------------------
namespace detail {
NVSHMEM_EFA_GDA_DEV RxEvent rx_event(const nvshmem_efa_rx_cdesc &c) {
    RxEvent r;
    r.imm = nvshmem_efa_rx_cqe_imm(&c);
    r.length = nvshmem_efa_rx_cqe_length(&c);
    r.ah = nvshmem_efa_rx_cqe_ah(&c);
    r.src_qp = nvshmem_efa_rx_cqe_src_qp(&c);
    r.status = nvshmem_efa_cqe_status(&c.common);
    r.op = nvshmem_efa_cqe_op_type(&c.common);
    r.has_imm = nvshmem_efa_cqe_has_imm(&c.common) ? 1 : 0;
    r.reserved = 0;
    return r;
}
}  // namespace detail

// Takes the next entry of this PE's RX ring if one is there. Returns 1 and fills *ev when it took
// one, 0 when the ring is empty, or a negative value: -(NVSHMEM_EFA_GDA_ERR_*) when the state is not
// ready or has no RX ring. Any number of threads may poll concurrently: each entry is taken by
// exactly one caller (claimed with a compare-and-swap on ctrl->rx_ci after it was read). The ring
// holds one entry per RDMA write with immediate (op RDMA_WRITE, has_imm) and one per SEND received,
// i.e. per AMO message applied here (op SEND, has_imm only for amo_set_imm). Entries are the 32-byte
// extended receive form; the producer never overwrites an entry before ctrl->rx_ci passes it.
NVSHMEM_EFA_GDA_DEV int poll_rx(RxEvent *ev) {
    // The RX ring and its consumer index belong to this PE: queue 0.
    const detail::View v = detail::view(0u);
    if (!v.ready) return -(int)NVSHMEM_EFA_GDA_ERR_NOT_READY;
    if (v.rx_cq == nullptr || v.rx_entries == 0u) return -(int)NVSHMEM_EFA_GDA_ERR_INVALID;
    uint64_t *rx_ci = &v.ctrl->rx_ci;
    for (;;) {
        const uint64_t ci = detail::ld_acquire_u64(rx_ci);
        // RX ring entries are the 32-byte extended receive form (both queue kinds).
        const uint8_t *e =
            v.rx_cq + (size_t)nvshmem_efa_sq_slot(ci, v.rx_entries) * NVSHMEM_EFA_RX_CQE_EX_SIZE;
        if (!nvshmem_efa_cqe_ready(e, ci, v.rx_entries)) return 0;
        __threadfence_system();
        const nvshmem_efa_rx_cdesc_ex x = detail::read_entry<nvshmem_efa_rx_cdesc_ex>(e);
        RxEvent r = detail::rx_event(x.base);
        r.length = nvshmem_efa_rx_cqe_ex_length(&x);
        // The entry's content was read before the claim: a successful CAS proves nobody consumed
        // it (and the producer cannot reuse the slot before rx_ci passes it).
        if (atomicCAS(detail::ull(rx_ci), (unsigned long long)ci, (unsigned long long)(ci + 1)) ==
            (unsigned long long)ci) {
            __threadfence_system();  // payload reads after the claim see the placed data
            *ev = r;
            return 1;
        }
    }
}

// Takes the next immediate from this PE's RX ring, waiting at most `timeout_cycles` (clock64).
// Returns 1 and the immediate in *imm, 0 on timeout, or a negative error as poll_rx. RX entries
// without immediate data (none are expected on this ring) are skipped. Thread scope.
NVSHMEM_EFA_GDA_DEV int poll_imm(uint32_t *imm, unsigned long long timeout_cycles,
                                 RxEvent *ev_out = nullptr) {
    const long long start = clock64();
    unsigned ns = 32u;
    for (;;) {
        RxEvent ev;
        int r = poll_rx(&ev);
        if (r < 0) return r;
        if (r == 1) {
            if (ev.has_imm) {
                *imm = ev.imm;
                if (ev_out) *ev_out = ev;
                return 1;
            }
            ns = 32u;
            continue;
        }
        if ((unsigned long long)(clock64() - start) > timeout_cycles) return 0;
        detail::backoff(ns);
    }
}

}  // namespace nvshmem_efa_gda
