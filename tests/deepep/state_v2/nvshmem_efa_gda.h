/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Compile-test fixture: the device-state layout version 2 proposed for src/gda/state.rs (multi-chunk
 * symmetric heap, granule-indexed registration table), laid over the generated header so the CUDA
 * code's version-2 path can be compiled before the Rust side publishes it. Put this directory
 * BEFORE include/ on the include path, and only while include/nvshmem_efa_gda.h says version 1
 * (tests/deepep/ci_compile.sh checks); delete it once src/gda/state.rs publishes version 2.
 *
 * Layout (x86-64 and CUDA alike; every field naturally aligned, no implicit padding):
 *   NvshmemEfaGdaHeapKey (32 bytes)
 *     0  uint64_t addr    virtual address of heap offset `start` on the PE owning the registration
 *     8  uint64_t start   heap offset where the registration begins (multiple of the granularity)
 *    16  uint64_t end     heap offset where it ends, exclusive (multiple of the granularity)
 *    24  uint32_t key     rkey (rows 0..n_pes-1; software queue: its soft rkey of that registration)
 *                         or lkey (row n_pes, this PE's own registrations)
 *    28  uint32_t flags   NVSHMEM_EFA_GDA_KEY_VALID (1); 0 = no registration covers this granule
 *   NvshmemEfaGdaDeviceState, version 2 (160 bytes): the version-1 fields unchanged at their
 *   offsets (0..135), then
 *   136  uint64_t heap_keys         NvshmemEfaGdaHeapKey[(n_pes + 1) * key_stride] in device memory;
 *                                   entry [row * key_stride + (heap_offset >> log2_granularity)]
 *   144  uint32_t log2_granularity  NVSHMEM's log2_cumem_granularity (transport struct field)
 *   148  uint32_t key_stride        entries per row (granule capacity)
 *   152  uint32_t n_granules        granules published: offsets below n_granules << log2 are looked up
 *   156  uint32_t reserved2         zero
 */
#ifndef NVSHMEM_EFA_GDA_STATE_V2_FIXTURE_H
#define NVSHMEM_EFA_GDA_STATE_V2_FIXTURE_H

#define NvshmemEfaGdaDeviceState NvshmemEfaGdaDeviceStateV1Fixture
#define nvshmemt_efa_gda_get_device_state nvshmemt_efa_gda_get_device_state_v1_fixture
#include_next <nvshmem_efa_gda.h>
#undef NvshmemEfaGdaDeviceState
#undef nvshmemt_efa_gda_get_device_state

#if NVSHMEM_EFA_GDA_STATE_VERSION < 2
#undef NVSHMEM_EFA_GDA_STATE_VERSION
#define NVSHMEM_EFA_GDA_STATE_VERSION 2

#define NVSHMEM_EFA_GDA_KEY_VALID 1

typedef struct NvshmemEfaGdaHeapKey {
  uint64_t addr;
  uint64_t start;
  uint64_t end;
  uint32_t key;
  uint32_t flags;
} NvshmemEfaGdaHeapKey;

typedef struct NvshmemEfaGdaDeviceState {
  uint32_t version;
  uint32_t ready;
  int32_t my_pe;
  int32_t n_pes;
  struct NvshmemEfaGdaQueue queue;
  uint64_t heap_base;
  uint64_t heap_size;
  uint32_t heap_lkey;
  uint32_t reserved;
  uint64_t peers;
  uint64_t heap_keys;
  uint32_t log2_granularity;
  uint32_t key_stride;
  uint32_t n_granules;
  uint32_t reserved2;
} NvshmemEfaGdaDeviceState;

#ifdef __cplusplus
extern "C" {
#endif
int32_t nvshmemt_efa_gda_get_device_state(struct NvshmemEfaGdaDeviceState *out);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
static_assert(sizeof(NvshmemEfaGdaHeapKey) == 32, "heap key layout");
static_assert(__builtin_offsetof(NvshmemEfaGdaHeapKey, key) == 24, "heap key layout");
static_assert(sizeof(NvshmemEfaGdaDeviceState) == 160, "state v2 layout");
static_assert(__builtin_offsetof(NvshmemEfaGdaDeviceState, peers) == 128, "state v2 layout");
static_assert(__builtin_offsetof(NvshmemEfaGdaDeviceState, heap_keys) == 136, "state v2 layout");
static_assert(__builtin_offsetof(NvshmemEfaGdaDeviceState, log2_granularity) == 144, "state v2 layout");
static_assert(__builtin_offsetof(NvshmemEfaGdaDeviceState, n_granules) == 152, "state v2 layout");
#endif
#endif /* NVSHMEM_EFA_GDA_STATE_VERSION < 2 */

#endif /* NVSHMEM_EFA_GDA_STATE_V2_FIXTURE_H */
