// SPDX-License-Identifier: BSD-3-Clause
//
// Types and inline helpers shared by the translation units of gda_tests (no MPI, no NVSHMEM):
// byte patterns, the device clock, the region table and the ibgda_compat case's arguments.
#pragma once

#include <stdint.h>

#include <cuda_runtime.h>

namespace gg {

__device__ __forceinline__ uint64_t dev_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__host__ __device__ __forceinline__ uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Byte at offset i of a buffer whose content is identified by `seed`.
__host__ __device__ __forceinline__ uint8_t pat_byte(uint32_t seed, uint64_t i) {
    uint32_t w = mix32(seed ^ mix32((uint32_t)(i >> 2) * 0x9e3779b1U + (uint32_t)(i >> 34)));
    return (uint8_t)(w >> ((i & 3) * 8));
}

__host__ __device__ __forceinline__ uint32_t make_seed(uint32_t owner, uint32_t tag) {
    return mix32(owner * 0x01000193U + 0x5bd1e995U) ^ mix32(tag * 0x9e3779b9U + 0x85ebca6bU);
}

}  // namespace gg

// One transfer: `len` bytes from source offset src_off to destination offset dst_off. Tables are
// sorted by dst_off and regions do not overlap; bytes between regions must keep the sentinel.
struct gg_region {
    uint64_t dst_off;
    uint64_t src_off;
    uint64_t len;
};

struct IbgdaCompatOut {
    int num_rc_per_pe;
    int num_devices;
    uint64_t p2p_peer;    // nvshmemi_get_p2p_ptr(ptr, me, peer)
    int p2p_self_ok;      // nvshmemi_get_p2p_ptr(ptr, me, me) == ptr
    int waited_ok;        // counter and flag reached their values in time
    int counter_seen;
    int flag_seen;
    int imm_seen;          // an immediate arrived
    uint32_t imm_value;    // its value
    int flag_at_imm;       // the flag as read right after the immediate arrived
    unsigned long long bad_bytes;
};

struct IbgdaCompatArgs {
    int me;
    int peer;
    int sender_blocks;
    int nregions;  // one region per sender warp (extra warps idle)
    const gg_region *regions;
    uint8_t *dst;        // symmetric
    const uint8_t *src;  // symmetric (local source)
    int *counter;        // symmetric, zero before the launch
    int *flag;           // symmetric, zero before the launch
    int flag_value;      // what this PE stores at the peer (nvshmemi_ibgda_rma_p with flag_imm)
    int expect_flag;     // what the peer stores here
    uint32_t flag_imm;   // immediate this PE sends with the flag
    uint32_t expect_imm; // immediate the peer sends
    uint32_t peer_seed;  // pattern of the peer's source buffer
    uint64_t timeout_ns;
    IbgdaCompatOut *out;
};

// Defined in deepep_style.cu (a translation unit that also includes NVSHMEM's IBGDA headers).
void ibgda_compat_launch(const IbgdaCompatArgs &a, int threads);
