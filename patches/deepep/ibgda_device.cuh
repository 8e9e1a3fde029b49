// SPDX-License-Identifier: BSD-3-Clause
// nvshmem-efa-gda: replaces DeepEP's csrc/kernels/ibgda_device.cuh (DeepEP v1.2.1 layout; installed by
// patches/deepep/apply.sh, the original is kept as ibgda_device.cuh.orig).
//
// DeepEP's kernels call nvshmemi_ibgda_put_nbi_warp<>, nvshmemi_ibgda_amo_nonfetch_add,
// nvshmemi_ibgda_rma_p, nvshmemi_ibgda_quiet, nvshmemi_get_p2p_ptr and ibgda_get_state() unqualified
// inside namespace deep_ep; the using-declarations below make them (and nvshmemx_barrier_all_block,
// which quiets the GDA queue before NVSHMEM's barrier) resolve to nvshmem_efa_gda::ibgda. The kernels
// themselves are not changed.
#pragma once

// What the original header brought in, which other DeepEP files rely on.
#include "configs.cuh"
#include "exception.cuh"
#include "utils.cuh"

// Never fall back to NVSHMEM's proxy path: a network peer without a ready GDA state traps.
#define NVSHMEM_EFA_GDA_IBGDA_FALLBACK 0
#include "nvshmem_efa_gda_ibgda.cuh"

namespace deep_ep {
NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS
}  // namespace deep_ep
