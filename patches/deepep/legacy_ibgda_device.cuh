// SPDX-License-Identifier: BSD-3-Clause
// nvshmem-efa-gda: replaces DeepEP's csrc/kernels/legacy/ibgda_device.cuh (DeepEP main, V1 kernels
// under legacy/; installed by patches/deepep/apply.sh, the original is kept as
// ibgda_device.cuh.orig). See ibgda_device.cuh next to this file: the same, in deep_ep::legacy.
#pragma once

// What the original header brought in, which other DeepEP files rely on.
#include <nvshmem.h>
#include <non_abi/device/threadgroup/nvshmemi_common_device_defines.cuh>
#include <deep_ep/common/exception.cuh>
#include "utils.cuh"

// Never fall back to NVSHMEM's proxy path: a network peer without a ready GDA state traps.
#define NVSHMEM_EFA_GDA_IBGDA_FALLBACK 0
#include "nvshmem_efa_gda_ibgda.cuh"

namespace deep_ep::legacy {
NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS
}  // namespace deep_ep::legacy
