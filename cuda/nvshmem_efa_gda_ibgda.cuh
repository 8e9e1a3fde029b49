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
// qp_id, kAlwaysDoPostSend and message_idx are accepted and ignored: there is one queue, and every
// post rings the doorbell (never fewer doorbells than DeepEP's batching asks for).
//
// Semantics that differ from mlx5 RC and what this layer does about them
//   * EFA does not order operations, even on one queue. DeepEP relies on RC ordering between its
//     data puts and the tail-counter AMO that follows them. nvshmemi_ibgda_amo_nonfetch_add therefore
//     completes every WQE committed before it (quiet) before it posts the AMO, unless
//     NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO is defined to 0.
//   * EFA has no RDMA atomics: the AMO is an inline SEND that the target applies (see
//     nvshmem_efa_gda_device.cuh). Like IBGDA's masked fetch-add, the remote add is 32 bits wide.
//   * nvshmemi_ibgda_rma_p stores its 4 bytes with an AMO SET message (a 64-byte WQE has no inline
//     room for RDMA writes). With an immediate, the same SEND carries it: the target stores the
//     value before it delivers the immediate to its RX ring (poll_imm).
//   * nvshmemi_ibgda_quiet(dst_pe, qp_id) waits for the whole queue (all PEs, all qp ids).
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

#include <nvshmem.h>
#include <nvshmemx.h>

#include "nvshmem_efa_gda_device.cuh"

#ifndef NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO
#define NVSHMEM_EFA_GDA_IBGDA_ORDERED_AMO 1
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

}  // namespace detail

// ibgda_get_state(): DeepEP reads num_rc_per_pe and num_devices_initialized.
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
    (void)qp_id;
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
            dst_pe, 0u);
        if (lane == 0) detail::report(st, "nvshmemi_ibgda_put_nbi_warp");
        return;
    }
    nvshmemx_putmem_nbi_warp(reinterpret_cast<void *>(req_rptr),
                             reinterpret_cast<const void *>(req_lptr), bytes, dst_pe);
}

// Waits for the operations posted so far (the whole queue; dst_pe and qp_id are not needed).
__device__ __forceinline__ void nvshmemi_ibgda_quiet(int dst_pe, int qp_id) {
    (void)dst_pe;
    (void)qp_id;
    if (::nvshmem_efa_gda::ready()) {
        detail::report(::nvshmem_efa_gda::quiet(), "nvshmemi_ibgda_quiet");
        return;
    }
    nvshmem_quiet();
}

// 32-bit add of `value` to the int at rptr (symmetric address) on pe. With is_local_copy, rptr is a
// local address and the add is DeepEP's local 64-bit atomicAdd.
__device__ __forceinline__ void nvshmemi_ibgda_amo_nonfetch_add(void *rptr, const int &value,
                                                               int pe, int qp_id,
                                                               bool is_local_copy = false) {
    (void)qp_id;
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
        // EFA does not order WQEs: the puts this AMO announces must be complete first.
        const unsigned q = ::nvshmem_efa_gda::quiet();
        if (q != 0u) {
            detail::report(q, "nvshmemi_ibgda_amo_nonfetch_add (ordering quiet)");
            return;
        }
#endif
        detail::report(::nvshmem_efa_gda::amo_nonfetch_add<int>(static_cast<int *>(rptr), value, pe),
                       "nvshmemi_ibgda_amo_nonfetch_add");
        return;
    }
    nvshmem_int_atomic_add(static_cast<int *>(rptr), value, pe);
}

// 4-byte put of `value` to rptr (symmetric address) on dst_pe; with imm != UINT32_MAX the target's
// RX ring also gets `imm`, after the value is in place.
__device__ __forceinline__ void nvshmemi_ibgda_rma_p(int *rptr, const int value, int dst_pe,
                                                     int qp_id, uint32_t imm = 0xffffffffu) {
    (void)qp_id;
    void *p2p = nvshmem_ptr(rptr, dst_pe);
    if (p2p != nullptr && imm == 0xffffffffu) {
        *static_cast<volatile int *>(p2p) = value;
        __threadfence_system();
        return;
    }
    if (::nvshmem_efa_gda::ready()) {
        const unsigned st = imm == 0xffffffffu
                                ? ::nvshmem_efa_gda::amo_set<int>(rptr, value, dst_pe)
                                : ::nvshmem_efa_gda::amo_set_imm<int>(rptr, value, imm, dst_pe);
        detail::report(st, "nvshmemi_ibgda_rma_p");
        return;
    }
    nvshmem_int_p(rptr, value, dst_pe);
}

}  // namespace ibgda
}  // namespace nvshmem_efa_gda

// Put the IBGDA names into the enclosing namespace (use inside the application's namespace, e.g.
// `namespace deep_ep::legacy { NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS }`).
#define NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS                         \
    using ::nvshmem_efa_gda::ibgda::ibgda_get_state;                     \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_get_p2p_ptr;                \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_put_nbi_warp;         \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_quiet;                \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_amo_nonfetch_add;     \
    using ::nvshmem_efa_gda::ibgda::nvshmemi_ibgda_rma_p;
