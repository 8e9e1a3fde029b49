// SPDX-License-Identifier: BSD-3-Clause
//
// nvshmem_efa_gda_ibgda.cuh: DeepEP's IBGDA device calls, served by the EFA GDA queue.
//
// DeepEP (csrc/kernels/legacy/ibgda_device.cuh) drives mlx5 queues directly through five calls:
//
//   ibgda_get_state()->num_rc_per_pe, ->num_devices_initialized
//   template <bool kAlwaysDoPostSend = false>
//   void nvshmemi_ibgda_put_nbi_warp(uint64_t req_rptr, uint64_t req_lptr, size_t bytes,
//                                    int dst_pe, int qp_id, int lane_id, int message_idx)
//   void nvshmemi_ibgda_amo_nonfetch_add(void *rptr, const int &value, int pe, int qp_id,
//                                        bool is_local_copy = false)
//   uint64_t nvshmemi_get_p2p_ptr(const uint64_t &ptr, const int &rank, const int &dst_rank)
//   void nvshmemi_ibgda_quiet(int dst_pe, int qp_id)
//   void nvshmemi_ibgda_rma_p(int *rptr, const int value, int dst_pe, int qp_id,
//                             uint32_t imm = UINT32_MAX)
//
// This header provides the same names and signatures in namespace nvshmem_efa_gda::ibgda. Each call
// takes, in this order:
//   1. NVLink / P2P when NVSHMEM maps the peer's heap (nvshmem_ptr() non-null): plain GPU stores or
//      system-scope atomics;
//   2. the EFA GDA queue when the loaded state is ready (nvshmem_efa_gda_load_device_state() == 0):
//      remote and local pointers are symmetric addresses of NVSHMEM's heap and are translated with
//      `ptr - state.heap_base`;
//   3. NVSHMEM's own device API otherwise (state not loaded or not ready).
// qp_id picks the queue: (dst_pe, qp_id) posts to entry dst_pe * queues_per_pe + qp_id %
// queues_per_pe of the state's queue table, as IBGDA's ibgda_get_rc picks an RC QP
// (docs/gda-queues.md). kAlwaysDoPostSend and message_idx are accepted and ignored: every post rings
// the doorbell (never fewer doorbells than DeepEP's batching asks for).
//
// Semantics that differ from mlx5 RC and what this layer does about them
//   * EFA does not order operations, even on one queue. DeepEP relies on RC ordering between its
//     data puts and the tail-counter AMO that follows them. nvshmemi_ibgda_amo_nonfetch_add is
//     therefore a signal (signal_add of nvshmem_efa_gda_device.cuh): the target applies it only
//     after every WQE posted before it for that PE has landed, with no wait on the GPU (software
//     queue: its consumer holds the AMO back; hardware queue: a quiet of that queue first). The
//     guarantee is per queue, i.e. per (dst_pe, qp_id), as RC's is per QP. docs/ordering.md.
//     NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO=0 posts a plain, unordered AMO instead.
//   * EFA has no RDMA atomics: the AMO is an inline SEND that the target applies (see
//     nvshmem_efa_gda_device.cuh). Like IBGDA's masked fetch-add, the remote add is 32 bits wide.
//   * nvshmemi_ibgda_rma_p stores its 4 bytes with an AMO SET message (a 64-byte WQE has no inline
//     room for RDMA writes). With an immediate, the same SEND carries it: the target stores the
//     value before it delivers the immediate to its RX ring (poll_imm).
//   * nvshmemi_ibgda_quiet(dst_pe, qp_id) waits for the queue of (dst_pe, qp_id) only, as IBGDA's
//     quiet of one RC QP.
//
// Porting DeepEP (what changes)
//   * csrc/kernels/legacy/ibgda_device.cuh: keep its includes of DeepEP's own headers
//     (exception.cuh, utils.cuh), drop <device_host_transport/nvshmem_common_ibgda.h>, and replace
//     the mlx5 code by
//         #include <nvshmem.h>
//         #include "nvshmem_efa_gda_ibgda.cuh"
//         namespace deep_ep::legacy { NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS }
//     The kernels (internode.cu, internode_ll.cu) stay as they are.
//     Using-declarations (not a using-directive) put the names into deep_ep::legacy, where they hide
//     NVSHMEM's global ibgda_get_state() / nvshmemi_ibgda_quiet<>() of
//     non_abi/device/pt-to-pt/ibgda_device.cuh (pulled in by nvshmem.h when
//     NVSHMEM_ENABLE_ALL_DEVICE_INLINING is defined); a using-directive would make the unqualified
//     ibgda_get_state() call ambiguous.
//   * add cuda/nvshmem_efa_gda_state.cu to the sources ONCE (it defines the device state), link
//     -lnvshmem_efa_gda, and call nvshmem_efa_gda_load_device_state(stream) after nvshmem_init
//     (e.g. in Buffer::sync / internode init). DeepEP's NVSHMEM_IBGDA_NUM_RC_PER_PE is reported by
//     ibgda_get_state()->num_rc_per_pe as before.
//   * run NVSHMEM with this library as its remote transport (LD_PRELOAD of
//     nvshmem_transport_libfabric.so.3, NVSHMEM_REMOTE_TRANSPORT=libfabric) instead of
//     NVSHMEM_IB_ENABLE_IBGDA=1.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <nvshmem.h>
#include <nvshmemx.h>

#include "nvshmem_efa_gda_device.cuh"

#ifndef NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO
#define NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO 1
#endif

// What a call does when a peer is not P2P-mapped and the GDA state is not ready: 1 (default) uses
// NVSHMEM's own device API (its proxy path); 0 prints the call and traps, so an application that
// must run on the GDA queue (patches/deepep/) can never fall back silently.
#ifndef NVSHMEM_EFA_GDA_IBGDA_FALLBACK
#define NVSHMEM_EFA_GDA_IBGDA_FALLBACK 1
#endif

namespace nvshmem_efa_gda {
namespace ibgda {

namespace detail {

// Reports the first failed quiet of this loaded state once (the IBGDA calls return void).
__device__ __forceinline__ void report(unsigned status, const char *what) {
    if (status != 0u && atomicCAS(&nvshmem_efa_gda_local_d.reserved, 0u, 1u) == 0u)
        printf("nvshmem_efa_gda: %s failed with status 0x%x (errors %llu)\n", what, status,
               ::nvshmem_efa_gda::error_count());
}

// Warp-cooperative copy for the P2P path: 16-byte vectors when both ends allow it.
__device__ __forceinline__ void warp_copy(uint64_t dst, uint64_t src, size_t bytes, int lane) {
    if (((dst | src) & 15u) == 0u) {
        const size_t nv = bytes / 16u;
        int4 *d = reinterpret_cast<int4 *>(dst);
        const int4 *s = reinterpret_cast<const int4 *>(src);
        for (size_t i = (size_t)lane; i < nv; i += 32u) d[i] = s[i];
        for (size_t i = nv * 16u + (size_t)lane; i < bytes; i += 32u)
            reinterpret_cast<uint8_t *>(dst)[i] = reinterpret_cast<const uint8_t *>(src)[i];
    } else {
        for (size_t i = (size_t)lane; i < bytes; i += 32u)
            reinterpret_cast<uint8_t *>(dst)[i] = reinterpret_cast<const uint8_t *>(src)[i];
    }
}

// The network path was needed but the GDA state is not ready.
__device__ __forceinline__ void not_ready(const char *what) {
#if !NVSHMEM_EFA_GDA_IBGDA_FALLBACK
    printf("nvshmem_efa_gda: %s needs the GDA queue but the device state is not loaded/ready "
           "(nvshmem_efa_gda_ibgda_setup() was not called or failed)\n",
           what);
    __trap();
#else
    (void)what;
#endif
}

}  // namespace detail

// ibgda_get_state(): DeepEP reads num_rc_per_pe and num_devices_initialized. num_rc_per_pe is
// NVSHMEM_IBGDA_NUM_RC_PER_PE (which DeepEP sets to its QPs per rank; or
// nvshmem_efa_gda_set_ibgda_compat), the number the library built its queue table for
// (state.queues_per_pe; above NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE the table is capped, logged, and qp
// ids wrap onto it). Each (dst_pe, qp_id) has its entry; entries may name a shared queue (the
// software queue and a hardware queue beyond the device's QP limit do, see docs/gda-queues.md).
__device__ __forceinline__ NvshmemEfaGdaDeviceLocal *ibgda_get_state() {
    return &nvshmem_efa_gda_local_d;
}

// P2P address of `ptr` (a symmetric address of this PE's heap) on dst_rank, or 0 when dst_rank is
// reached through the network.
__device__ __forceinline__ uint64_t nvshmemi_get_p2p_ptr(const uint64_t &ptr, const int &rank,
                                                         const int &dst_rank) {
    if (rank == dst_rank) return ptr;
    return reinterpret_cast<uint64_t>(nvshmem_ptr(reinterpret_cast<const void *>(ptr), dst_rank));
}

// Warp-scope put of `bytes` from req_lptr (this PE's heap) to req_rptr (symmetric address) on
// dst_pe. All 32 lanes call it with the same arguments; lane_id is the caller's lane.
template <bool kAlwaysDoPostSend = false>
__device__ __forceinline__ void nvshmemi_ibgda_put_nbi_warp(uint64_t req_rptr, uint64_t req_lptr,
                                                            size_t bytes, int dst_pe, int qp_id,
                                                            int lane_id, int message_idx) {
    (void)message_idx;
    (void)lane_id;  // the hardware lane is used (DeepEP passes the same value)
    const int lane = ::nvshmem_efa_gda::detail::lane_id();
    void *p2p = nvshmem_ptr(reinterpret_cast<const void *>(req_rptr), dst_pe);
    if (p2p != nullptr) {
        detail::warp_copy(reinterpret_cast<uint64_t>(p2p), req_lptr, bytes, lane);
        __syncwarp();
        return;
    }
    if (::nvshmem_efa_gda::ready()) {
        const unsigned st = ::nvshmem_efa_gda::detail::post_rdma_lanes(
            0xffffffffu, lane, 32, ::nvshmem_efa_gda::detail::kWrite, req_lptr,
            ::nvshmem_efa_gda::heap_offset(reinterpret_cast<const void *>(req_rptr)), bytes,
            dst_pe, 0u, qp_id);
        if (lane == 0) detail::report(st, "nvshmemi_ibgda_put_nbi_warp");
        return;
    }
    if (lane == 0) detail::not_ready("nvshmemi_ibgda_put_nbi_warp");
    nvshmemx_putmem_nbi_warp(reinterpret_cast<void *>(req_rptr),
                             reinterpret_cast<const void *>(req_lptr), bytes, dst_pe);
}

// Waits for the operations posted so far to the queue of (dst_pe, qp_id).
__device__ __forceinline__ void nvshmemi_ibgda_quiet(int dst_pe, int qp_id) {
    if (::nvshmem_efa_gda::ready()) {
        detail::report(::nvshmem_efa_gda::quiet_qp(dst_pe, qp_id), "nvshmemi_ibgda_quiet");
        return;
    }
    // Nothing can be on a queue that is not loaded: NVSHMEM's quiet covers what else was issued
    // (no trap here: DeepEP main's barrier quiets every QP even when all peers are P2P-mapped).
    nvshmem_quiet();
}

// 32-bit add of `value` to the int at rptr (symmetric address) on pe. With is_local_copy, rptr is a
// local address and the add is DeepEP's local 64-bit atomicAdd.
__device__ __forceinline__ void nvshmemi_ibgda_amo_nonfetch_add(void *rptr, const int &value,
                                                               int pe, int qp_id,
                                                               bool is_local_copy = false) {
    if (is_local_copy) {
        atomicAdd(static_cast<unsigned long long *>(rptr),
                  static_cast<unsigned long long>(static_cast<long long>(value)));
        return;
    }
    void *p2p = nvshmem_ptr(rptr, pe);
    if (p2p != nullptr) {
        atomicAdd_system(static_cast<int *>(p2p), value);
        return;
    }
    if (::nvshmem_efa_gda::ready()) {
#if NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO
        // EFA does not order WQEs: the AMO announces the puts before it (applied after them).
        detail::report(
            ::nvshmem_efa_gda::signal_add_qp<int>(static_cast<int *>(rptr), value, pe, qp_id),
            "nvshmemi_ibgda_amo_nonfetch_add");
#else
        detail::report(
            ::nvshmem_efa_gda::amo_nonfetch_add_qp<int>(static_cast<int *>(rptr), value, pe, qp_id),
            "nvshmemi_ibgda_amo_nonfetch_add");
#endif
        return;
    }
    detail::not_ready("nvshmemi_ibgda_amo_nonfetch_add");
    nvshmem_int_atomic_add(static_cast<int *>(rptr), value, pe);
}

// 4-byte put of `value` to rptr (symmetric address) on dst_pe; with imm != UINT32_MAX the target's
// RX ring also gets `imm`, after the value is in place.
__device__ __forceinline__ void nvshmemi_ibgda_rma_p(int *rptr, const int value, int dst_pe,
                                                     int qp_id, uint32_t imm = 0xffffffffu) {
    void *p2p = nvshmem_ptr(rptr, dst_pe);
    if (p2p != nullptr && imm == 0xffffffffu) {
        *static_cast<volatile int *>(p2p) = value;
        __threadfence_system();
        return;
    }
    if (::nvshmem_efa_gda::ready()) {
        // Without an immediate the store is a signal (after the puts before it, as on RC).
        const unsigned st = imm == 0xffffffffu
                                ? ::nvshmem_efa_gda::signal_set_qp<int>(rptr, value, dst_pe, qp_id)
                                : ::nvshmem_efa_gda::amo_set_imm_qp<int>(rptr, value, imm, dst_pe,
                                                                         qp_id);
        detail::report(st, "nvshmemi_ibgda_rma_p");
        return;
    }
    detail::not_ready("nvshmemi_ibgda_rma_p");
    nvshmem_int_p(rptr, value, dst_pe);
}

// NVSHMEM's block barrier preceded by a quiet of the GDA queue. NVSHMEM's barrier (and its quiet)
// know nothing of this queue: without the quiet, a GDA put or AMO issued before the barrier may still
// be in flight when every PE has left it. With it: when nvshmemx_barrier_all_block() returns on any
// PE, every GDA operation that any PE's block issued before entering it is complete at its target
// (each PE waited for its own completions before it arrived), and so is every NVSHMEM operation
// (NVSHMEM's barrier quiets its own). All threads of the block call it (as NVSHMEM's).
__device__ __forceinline__ void nvshmemx_barrier_all_block() {
    __syncthreads();
    if (::nvshmem_efa_gda::detail::block_thread() == 0u && ::nvshmem_efa_gda::ready())
        detail::report(::nvshmem_efa_gda::quiet(), "nvshmemx_barrier_all_block (GDA quiet)");
    __syncthreads();
    ::nvshmemx_barrier_all_block();
}

}  // namespace ibgda
}  // namespace nvshmem_efa_gda

// ---------------------------------------------------------------------------------------------------
// Host side: the one call an IBGDA-style application makes after NVSHMEM is initialised and its
// symmetric buffer `buf` (`bytes` long, the range its kernels put to / from) is allocated.
//
//   int rc = nvshmem_efa_gda_ibgda_setup(buf, bytes, stream);   // 0: kernels may run
//
// It loads the GDA device state (nvshmem_efa_gda_load_device_state), then decides:
//   * every other PE maps `buf` by P2P (nvshmem_ptr non-null): the GDA queue is never used; 0;
//   * else the state must be ready (NVSHMEM_EFA_GDA_LOAD_OK), and every byte of [buf, buf+bytes)
//     must lie in a registration the loaded state knows, here and on every PE reached through the
//     network; otherwise it prints why and returns a negative code (never a silent fallback to
//     NVSHMEM's proxy path, never a kernel that later finds the buffer unreachable).
// Call it again after the heap grew (another nvshmem_malloc / nvshmem_align that mapped new memory).
// ---------------------------------------------------------------------------------------------------
#define NVSHMEM_EFA_GDA_IBGDA_SETUP_OK 0
#define NVSHMEM_EFA_GDA_IBGDA_SETUP_ESTATE (-10)    /* state not loaded / not ready */
#define NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE (-11)    /* buffer outside the known registrations */
#define NVSHMEM_EFA_GDA_IBGDA_SETUP_ECUDA (-12)     /* reading the state's tables failed */
#define NVSHMEM_EFA_GDA_IBGDA_SETUP_EARG (-13)      /* null buffer or zero length */

namespace nvshmem_efa_gda {
namespace ibgda {
namespace host {

// Does [off, off + bytes) lie in registrations of row `row` (v2 table) or in the single
// registration [0, size) (v1)? Returns 0, or a SETUP_* code.
static inline int covered(const NvshmemEfaGdaDeviceState &s, int row, uint64_t off, uint64_t bytes,
                          uint64_t v1_size) {
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 2
    if (s.heap_keys != 0) {
        const uint64_t g0 = off >> s.log2_granularity;
        const uint64_t g1 = (off + bytes - 1) >> s.log2_granularity;
        if (g1 >= s.n_granules) return NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE;
        for (uint64_t g = g0; g <= g1; ++g) {
            NvshmemEfaGdaHeapKey k;
            const uint64_t at = s.heap_keys + sizeof(k) * ((uint64_t)row * s.key_stride + g);
            if (cudaMemcpy(&k, reinterpret_cast<const void *>(at), sizeof k,
                           cudaMemcpyDeviceToHost) != cudaSuccess)
                return NVSHMEM_EFA_GDA_IBGDA_SETUP_ECUDA;
            if (!(k.flags & NVSHMEM_EFA_GDA_KEY_VALID)) return NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE;
        }
        return 0;
    }
#endif
    (void)s;
    (void)row;
    return (off <= v1_size && bytes <= v1_size - off) ? 0 : NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE;
}

}  // namespace host
}  // namespace ibgda
}  // namespace nvshmem_efa_gda

static inline int nvshmem_efa_gda_ibgda_setup(const void *buf, size_t bytes, cudaStream_t stream) {
    if (buf == nullptr || bytes == 0) {
        fprintf(stderr, "nvshmem_efa_gda_ibgda_setup: null buffer or zero length\n");
        return NVSHMEM_EFA_GDA_IBGDA_SETUP_EARG;
    }
    const int rc = nvshmem_efa_gda_load_device_state(stream);
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    int remote = 0;
    for (int pe = 0; pe < n; ++pe)
        if (pe != me && nvshmem_ptr(buf, pe) == nullptr) ++remote;
    if (remote == 0) return NVSHMEM_EFA_GDA_IBGDA_SETUP_OK;  // P2P everywhere: the queue is not used
    if (rc != NVSHMEM_EFA_GDA_LOAD_OK) {
        fprintf(stderr,
                "nvshmem_efa_gda_ibgda_setup: PE %d reaches %d PE(s) through the network but the "
                "GDA device state is not usable (nvshmem_efa_gda_load_device_state -> %d). Is "
                "libnvshmem_efa_gda NVSHMEM's remote transport (LD_PRELOAD of "
                "nvshmem_transport_libfabric.so.3, NVSHMEM_REMOTE_TRANSPORT=libfabric) with "
                "NVSHMEM_EFA_GDA not 'off'?\n",
                me, remote, rc);
        return NVSHMEM_EFA_GDA_IBGDA_SETUP_ESTATE;
    }
    NvshmemEfaGdaDeviceState s;
    memset(&s, 0, sizeof s);
    if (nvshmemt_efa_gda_get_device_state_sized(&s, sizeof s) != 0) return NVSHMEM_EFA_GDA_IBGDA_SETUP_ESTATE;
    const uint64_t b = (uint64_t)(uintptr_t)buf;
    if (b < s.heap_base) {
        fprintf(stderr, "nvshmem_efa_gda_ibgda_setup: buffer %p below the heap base 0x%llx\n", buf,
                (unsigned long long)s.heap_base);
        return NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE;
    }
    const uint64_t off = b - s.heap_base;
    int e = ::nvshmem_efa_gda::ibgda::host::covered(s, s.n_pes, off, bytes, s.heap_size);
    if (e != 0) {
        fprintf(stderr,
                "nvshmem_efa_gda_ibgda_setup: local range heap+0x%llx..+0x%llx is not in the "
                "registered heap the GDA state knows (v1 state: first registration only, %llu "
                "bytes); code %d\n",
                (unsigned long long)off, (unsigned long long)(off + bytes),
                (unsigned long long)s.heap_size, e);
        return e;
    }
    for (int pe = 0; pe < n; ++pe) {
        if (pe == me || nvshmem_ptr(buf, pe) != nullptr) continue;
        NvshmemEfaGdaPeer p;
        memset(&p, 0, sizeof p);
        if (cudaMemcpy(&p, reinterpret_cast<const NvshmemEfaGdaPeer *>(s.peers) + pe, sizeof p,
                       cudaMemcpyDeviceToHost) != cudaSuccess)
            return NVSHMEM_EFA_GDA_IBGDA_SETUP_ECUDA;
        if (!(p.flags & NVSHMEM_EFA_GDA_PEER_VALID)) e = NVSHMEM_EFA_GDA_IBGDA_SETUP_ERANGE;
        if (e == 0) e = ::nvshmem_efa_gda::ibgda::host::covered(s, pe, off, bytes, p.heap_size);
        if (e != 0) {
            fprintf(stderr,
                    "nvshmem_efa_gda_ibgda_setup: range heap+0x%llx..+0x%llx of PE %d is not in a "
                    "registration the GDA state knows; code %d\n",
                    (unsigned long long)off, (unsigned long long)(off + bytes), pe, e);
            return e;
        }
    }
    return NVSHMEM_EFA_GDA_IBGDA_SETUP_OK;
}

// Put the IBGDA names into the enclosing namespace (use inside the application's namespace, e.g.
// `namespace deep_ep::legacy { NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS }`).
#define NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS                         \
    using ::nvshmem_efa_gda::ibgda::ibgda_get_state;                     \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_get_p2p_ptr;                \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_put_nbi_warp;         \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_quiet;                \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_amo_nonfetch_add;     \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_rma_p;             \
    using ::nvshmem_efa_gda::ibgda::nvshmemx_barrier_all_block;
