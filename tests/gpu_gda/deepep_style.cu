// SPDX-License-Identifier: BSD-3-Clause
//
// A DeepEP-style translation unit: it includes NVSHMEM's own headers (which define the global
// ibgda_get_state() and nvshmemi_ibgda_quiet() of NVSHMEM's IBGDA transport) and then uses the five
// IBGDA calls exactly as DeepEP's kernels spell them, inside an application namespace, through
// nvshmem_efa_gda_ibgda.cuh. It is compiled into gda_tests (case ibgda_compat) so the compatibility
// layer is exercised at run time, not only compiled.
#include <nvshmem.h>
#include <nvshmemx.h>

#include "nvshmem_efa_gda_ibgda.cuh"
#include "gda_shared.h"

namespace deep_ep_like::legacy {

NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS

// Senders: every warp of blocks [0, senders) puts one region to `peer` with
// nvshmemi_ibgda_put_nbi_warp and then bumps the peer's counter with
// nvshmemi_ibgda_amo_nonfetch_add (the counter reaching its final value proves that every region
// is in place: EFA has no ordering; the AMO is a signal the target applies only after the puts
// posted before it landed, docs/ordering.md).
// nvshmemi_ibgda_rma_p stores a flag at the peer with an immediate (the flag must be in place when
// the immediate arrives). Receiver: the last block polls this PE's counter, flag and RX ring and
// then checks every region.
__global__ void ibgda_compat_kernel(IbgdaCompatArgs a) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int nwarps = blockDim.x / 32;
    if ((int)blockIdx.x < a.sender_blocks) {
        const int w = blockIdx.x * nwarps + warp;
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            auto state = ibgda_get_state();
            a.out->num_rc_per_pe = state->num_rc_per_pe;
            a.out->num_devices = state->num_devices_initialized;
            const uint64_t probe = reinterpret_cast<uint64_t>(a.dst);
            a.out->p2p_peer = nvshmemi_get_p2p_ptr(probe, a.me, a.peer);
            a.out->p2p_self_ok = nvshmemi_get_p2p_ptr(probe, a.me, a.me) == probe ? 1 : 0;
        }
        if (w < a.nregions) {
            const gg_region r = a.regions[w];
            const int qp_id = w % 4;
            nvshmemi_ibgda_put_nbi_warp<true>(reinterpret_cast<uint64_t>(a.dst + r.dst_off),
                                              reinterpret_cast<uint64_t>(a.src + r.src_off), r.len,
                                              a.peer, qp_id, lane, w);
            if (lane == 0) nvshmemi_ibgda_amo_nonfetch_add(a.counter, 1, a.peer, qp_id);
            __syncwarp();
        }
        if (blockIdx.x == 0 && threadIdx.x == 0)
            nvshmemi_ibgda_rma_p(a.flag, a.flag_value, a.peer, 0, a.flag_imm);
        __syncthreads();
        // A quiet per queue used (qp ids 0-3: one queue each when NVSHMEM_IBGDA_NUM_RC_PER_PE >=
        // 4), as DeepEP's barrier quiets every QP.
        if (threadIdx.x < 4) nvshmemi_ibgda_quiet(a.peer, (int)threadIdx.x);
        return;
    }
    // Receiver block.
    __shared__ int s_ok;
    if (threadIdx.x == 0) {
        const uint64_t t0 = gg::dev_now_ns();
        int ok = 0, got_imm = 0;
        while (gg::dev_now_ns() - t0 < a.timeout_ns) {
            if (!got_imm) {
                uint32_t imm = 0;
                // RX entries of the counter's AMO messages carry no immediate and are skipped.
                if (nvshmem_efa_gda::poll_imm(&imm, 1000ull) == 1) {
                    got_imm = 1;
                    a.out->imm_seen = 1;
                    a.out->imm_value = imm;
                    a.out->flag_at_imm = *reinterpret_cast<volatile int *>(a.flag);
                }
            }
            const int c = *reinterpret_cast<volatile int *>(a.counter);
            const int f = *reinterpret_cast<volatile int *>(a.flag);
            a.out->counter_seen = c;
            a.out->flag_seen = f;
            if (c == a.nregions && f == a.expect_flag && got_imm) {
                ok = 1;
                break;
            }
            __nanosleep(1000);
        }
        a.out->waited_ok = ok;
        s_ok = ok;
    }
    __syncthreads();
    if (!s_ok) return;
    // Every byte of every region must be there once the counter is complete.
    for (int k = 0; k < a.nregions; ++k) {
        const gg_region r = a.regions[k];
        const volatile uint8_t *d = a.dst + r.dst_off;
        for (uint64_t j = threadIdx.x; j < r.len; j += blockDim.x)
            if (d[j] != gg::pat_byte(a.peer_seed, r.src_off + j)) atomicAdd(&a.out->bad_bytes, 1ull);
    }
}

}  // namespace deep_ep_like::legacy

void ibgda_compat_launch(const IbgdaCompatArgs &a, int threads) {
    deep_ep_like::legacy::ibgda_compat_kernel<<<a.sender_blocks + 1, threads>>>(a);
}
