// SPDX-License-Identifier: BSD-3-Clause
//
// Compile test of the calls DeepEP's V1 kernels make (tests/deepep/ci_compile.sh). DeepEP's own
// sources are not available to CI (the PyPI sdist deep-ep 1.0.0 has no headers and an older kernel
// API), so these kernels, written for this project, make the same calls in the same shapes and
// namespaces as DeepEP v1.2.1's csrc/kernels/internode_ll.cu / internode.cu and main's
// csrc/kernels/legacy/internode_ll.cu:
//   * unqualified calls from a nested namespace of the application (deep_ep::internode_ll), the names
//     brought in by NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS (as the kit's ibgda_device.cuh does);
//   * nvshmemi_ibgda_put_nbi_warp with and without <true>, the AMO with and without is_local_copy,
//     rma_p, quiet over num_rc_per_pe * num_devices_initialized QPs, nvshmemi_get_p2p_ptr, the
//     num_rc_per_pe assertion, nvshmemx_barrier_all_block in the clean kernel;
//   * the host set-up call the kit's alloc() makes.
#include <stdint.h>
#include <stdio.h>

#define NVSHMEM_EFA_GDA_IBGDA_FALLBACK 0
#include "nvshmem_efa_gda_ibgda.cuh"

namespace deep_ep_calls {
NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS
}  // namespace deep_ep_calls

namespace deep_ep_calls {
namespace internode_ll {

__device__ __forceinline__ int ld_acquire_sys(const int *p) {
    int v;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

template <int kNumThreads>
__global__ void __launch_bounds__(kNumThreads, 1)
    clean_buffer(int *clean_0, int n0, int *clean_1, int n1) {
    nvshmemx_barrier_all_block();
    for (int i = threadIdx.x; i < n0; i += kNumThreads) clean_0[i] = 0;
    for (int i = threadIdx.x; i < n1; i += kNumThreads) clean_1[i] = 0;
    nvshmemx_barrier_all_block();
}

// Send phase of a dispatch: every warp sends one message per token to an expert's rank, the last
// thread of each expert sends the count (after the puts it announces).
__global__ void dispatch_like(uint8_t *rdma_recv_x, int *rdma_recv_count, const uint8_t *rdma_x,
                              int num_tokens, int num_bytes_per_msg, int num_experts, int rank,
                              int num_ranks) {
    const int lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32;
    const int num_local_experts = num_experts / num_ranks;
    if (blockIdx.x == 0 && threadIdx.x == 0 && ibgda_get_state()->num_rc_per_pe < num_local_experts)
        __trap();
    for (int t = warp_id + blockIdx.x * (blockDim.x / 32); t < num_tokens;
         t += gridDim.x * (blockDim.x / 32)) {
        const int dst_expert = t % num_experts;
        const int dst_rank = dst_expert / num_local_experts;
        const int dst_expert_local = dst_expert % num_local_experts;
        const uint64_t src_ptr = reinterpret_cast<uint64_t>(rdma_x + (size_t)t * num_bytes_per_msg);
        const uint64_t dst_ptr = reinterpret_cast<uint64_t>(rdma_recv_x) +
                                 ((size_t)dst_expert_local * num_ranks + rank) * num_tokens *
                                     num_bytes_per_msg +
                                 (size_t)t * num_bytes_per_msg;
        const uint64_t dst_p2p_ptr = nvshmemi_get_p2p_ptr(dst_ptr, rank, dst_rank);
        if (dst_p2p_ptr == 0) {
            nvshmemi_ibgda_put_nbi_warp(dst_ptr, src_ptr, num_bytes_per_msg, dst_rank,
                                        dst_expert_local, lane_id, t);
        } else {
            for (int i = lane_id; i < num_bytes_per_msg; i += 32)
                reinterpret_cast<uint8_t *>(dst_p2p_ptr)[i] = reinterpret_cast<const uint8_t *>(src_ptr)[i];
        }
        __syncwarp();
    }
    __syncthreads();
    if (threadIdx.x < num_experts && blockIdx.x == 0) {
        const int dst_rank = threadIdx.x / num_local_experts;
        const int dst_expert_local = threadIdx.x % num_local_experts;
        const uint64_t dst_ptr =
            reinterpret_cast<uint64_t>(rdma_recv_count + dst_expert_local * num_ranks + rank);
        const uint64_t dst_p2p_ptr = nvshmemi_get_p2p_ptr(dst_ptr, rank, dst_rank);
        if (dst_p2p_ptr == 0)
            nvshmemi_ibgda_amo_nonfetch_add(reinterpret_cast<int *>(dst_ptr), -num_tokens - 1,
                                            dst_rank, dst_expert_local);
        else
            atomicExch(reinterpret_cast<int *>(dst_p2p_ptr), -num_tokens - 1);
    }
    // Receive phase: wait for every source rank's count.
    if (blockIdx.x == 0 && threadIdx.x < num_local_experts * num_ranks)
        while (ld_acquire_sys(rdma_recv_count + threadIdx.x) == 0) {
        }
}

// main's legacy barrier: quiet every QP, then a counter by rma_p.
__global__ void legacy_barrier_like(int *sync_buffer, int rank, int num_ranks) {
    const int qps_per_rank =
        ibgda_get_state()->num_rc_per_pe * ibgda_get_state()->num_devices_initialized;
    for (int i = threadIdx.x; i < qps_per_rank * (num_ranks - 1); i += blockDim.x)
        nvshmemi_ibgda_quiet((rank + 1 + i / qps_per_rank) % num_ranks, i % qps_per_rank);
    __syncthreads();
    if (threadIdx.x < num_ranks && threadIdx.x != rank) {
        const uint64_t dst_ptr = reinterpret_cast<uint64_t>(sync_buffer + rank);
        if (nvshmemi_get_p2p_ptr(dst_ptr, rank, threadIdx.x) == 0)
            nvshmemi_ibgda_rma_p(sync_buffer + rank, 7, threadIdx.x, 0);
    }
}

}  // namespace internode_ll

namespace internode {

// Normal-mode shapes: <true> puts, tail AMOs with is_local_copy, a quiet of one QP.
__global__ void notify_like(int *tail, uint64_t *local_tail, uint8_t *buf, int channel, int rdma_rank,
                            int dst_rdma_rank) {
    const int lane_id = threadIdx.x % 32;
    nvshmemi_ibgda_put_nbi_warp<true>(reinterpret_cast<uint64_t>(buf),
                                      reinterpret_cast<uint64_t>(buf + 4096), 4096, dst_rdma_rank,
                                      channel, lane_id, 0);
    if (lane_id == 0) {
        nvshmemi_ibgda_amo_nonfetch_add(tail, 3, dst_rdma_rank, channel, false);
        nvshmemi_ibgda_amo_nonfetch_add(local_tail, 3, rdma_rank, channel, dst_rdma_rank == rdma_rank);
        nvshmemi_ibgda_quiet(dst_rdma_rank, channel);
    }
}

}  // namespace internode
}  // namespace deep_ep_calls

// The kit's alloc(): NVSHMEM allocation, then the one set-up call that fails loudly.
extern "C" void *deep_ep_calls_alloc(size_t size, size_t alignment) {
    void *ptr = nvshmem_align(alignment, size);
    if (ptr == nullptr || nvshmem_efa_gda_ibgda_setup(ptr, size, nullptr) != 0) {
        fprintf(stderr, "deep_ep_calls_alloc: set-up failed\n");
        return nullptr;
    }
    return ptr;
}

extern "C" void deep_ep_calls_launch(uint8_t *x, int *cnt, int rank, cudaStream_t s) {
    deep_ep_calls::internode_ll::clean_buffer<256><<<1, 256, 0, s>>>(cnt, 16, cnt + 16, 16);
    deep_ep_calls::internode_ll::dispatch_like<<<4, 1024, 0, s>>>(x, cnt, x + (64 << 20), 128, 14352,
                                                                   288, rank, 2);
    deep_ep_calls::internode_ll::legacy_barrier_like<<<1, 256, 0, s>>>(cnt, rank, 2);
    deep_ep_calls::internode::notify_like<<<1, 32, 0, s>>>(cnt, reinterpret_cast<uint64_t *>(cnt + 64),
                                                           x, 0, rank, 1 - rank);
}
