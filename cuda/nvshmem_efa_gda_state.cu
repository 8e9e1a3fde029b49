// SPDX-License-Identifier: BSD-3-Clause
//
// nvshmem_efa_gda_state.cu: the ONE definition of the GDA device state of an application, and the
// host function that loads it.
//
// Compile this file exactly once per application (relocatable device code, -rdc=true), next to the
// translation units that include nvshmem_efa_gda_device.cuh / nvshmem_efa_gda_ibgda.cuh: the headers
// only declare the variables (extern __device__), so several kernels files can include them without
// the "multiple definition" error of the device link.
//
// Host use, after nvshmem_init() (the library publishes its GDA state while NVSHMEM connects the
// transport) and before the first kernel that posts:
//     int rc = nvshmem_efa_gda_load_device_state(stream);   // 0: ready
// Call it again after the library re-initialised its queue. It synchronises `stream` before it
// returns, so every later launch on any stream sees the new state.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "nvshmem_efa_gda_device.cuh"

__device__ NvshmemEfaGdaDeviceState nvshmem_efa_gda_state_d;
__device__ NvshmemEfaGdaDeviceLocal nvshmem_efa_gda_local_d = {1, 1, 0u, 0u};

#ifndef NVSHMEM_EFA_GDA_HAVE_GET_DEVICE_STATE_DECL
// Exported by libnvshmem_efa_gda.so (the library NVSHMEM loads as its libfabric transport): copies the
// library's current device state into *out. Returns 0 on success, else a positive
// NVSHMEM_EFA_ERROR_* code of the host C API (nvshmem_efa_gda.h).
extern "C" int nvshmemt_efa_gda_get_device_state_sized(NvshmemEfaGdaDeviceState *out, size_t size);
#endif
// Exported by the same library: the text of this thread's last failed nvshmemt_efa_gda_* call.
extern "C" const char *nvshmem_efa_gda_last_error(void);

static bool is_pow2(uint32_t x) { return x != 0u && (x & (x - 1u)) == 0u; }

// Checks one queue's geometry; returns a static reason or NULL.
static const char *nvshmem_efa_gda_queue_problem(const NvshmemEfaGdaQueue &q) {
    if (q.sq == 0 || q.sq_doorbell == 0 || q.cq == 0 || q.ctrl == 0 || q.slot_status == 0)
        return "queue pointer missing";
    if (!is_pow2(q.sq_entries) || q.sq_entries > 65536u)
        return "sq_entries must be a power of two <= 65536 (16-bit request ids)";
    if (q.sq_entry_size != 64u && q.sq_entry_size != 128u) return "sq_entry_size must be 64 or 128";
    if (!is_pow2(q.cq_entries) || q.cq_entries < q.sq_entries)
        return "cq_entries must be a power of two >= sq_entries";
    if (q.cq_entry_size != 16u && q.cq_entry_size != 32u) return "cq_entry_size must be 16 or 32";
    if (q.rx_cq != 0 && !is_pow2(q.rx_entries)) return "rx_entries must be a power of two";
    return NULL;
}

// Checks what the device code relies on (queue 0, the queue table and every entry); returns a
// static reason or NULL.
static const char *nvshmem_efa_gda_geometry_problem(const NvshmemEfaGdaDeviceState &s) {
    if (const char *why = nvshmem_efa_gda_queue_problem(s.queue)) return why;
#if NVSHMEM_EFA_GDA_STATE_VERSION >= 3
    if (s.queues == 0 || s.queues_per_pe == 0 ||
        (uint64_t)s.n_queues != (uint64_t)s.n_pes * (uint64_t)s.queues_per_pe)
        return "queue table missing or not n_pes * queues_per_pe entries";
    if (s.n_queues > NVSHMEM_EFA_GDA_MAX_QUEUES) return "queue table too large";
    NvshmemEfaGdaQueue *table = (NvshmemEfaGdaQueue *)malloc(sizeof(NvshmemEfaGdaQueue) * s.n_queues);
    if (table == NULL) return "no host memory to check the queue table";
    const char *why = NULL;
    if (cudaMemcpy(table, reinterpret_cast<const void *>(s.queues),
                   sizeof(NvshmemEfaGdaQueue) * s.n_queues, cudaMemcpyDeviceToHost) != cudaSuccess)
        why = "queue table unreadable";
    for (uint32_t i = 0; why == NULL && i < s.n_queues; ++i) why = nvshmem_efa_gda_queue_problem(table[i]);
    if (why == NULL && memcmp(&table[0], &s.queue, sizeof s.queue) != 0)
        why = "queue table entry 0 is not the state's queue";
    free(table);
    if (why != NULL) return why;
#endif
    if (s.n_pes <= 0 || s.my_pe < 0 || s.my_pe >= s.n_pes || s.peers == 0)
        return "PE numbering or peer table missing";
    if (s.heap_size == 0) return "local heap missing";
    return NULL;
}

// DeepEP sets NVSHMEM_IBGDA_NUM_RC_PER_PE to its number of QPs per rank before NVSHMEM starts and
// asserts on it in its kernels; report the same number through ibgda_get_state().
static int nvshmem_efa_gda_env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    return (end != v && x > 0 && x < (1L << 20)) ? (int)x : dflt;
}

extern "C" int nvshmem_efa_gda_set_ibgda_compat(int num_rc_per_pe, int num_devices_initialized,
                                                cudaStream_t stream) {
    NvshmemEfaGdaDeviceLocal l;
    cudaError_t e = cudaMemcpyFromSymbol(&l, nvshmem_efa_gda_local_d, sizeof l);
    if (e != cudaSuccess) return NVSHMEM_EFA_GDA_LOAD_ECUDA;
    l.num_rc_per_pe = num_rc_per_pe > 0 ? num_rc_per_pe : 1;
    l.num_devices_initialized = num_devices_initialized > 0 ? num_devices_initialized : 1;
    e = cudaMemcpyToSymbolAsync(nvshmem_efa_gda_local_d, &l, sizeof l, 0, cudaMemcpyHostToDevice,
                                stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? NVSHMEM_EFA_GDA_LOAD_OK : NVSHMEM_EFA_GDA_LOAD_ECUDA;
}

extern "C" int nvshmem_efa_gda_load_device_state(cudaStream_t stream) {
    NvshmemEfaGdaDeviceState s;
    memset(&s, 0, sizeof s);
    int rc = nvshmemt_efa_gda_get_device_state_sized(&s, sizeof s);
    if (rc != 0) {
        fprintf(stderr,
                "nvshmem_efa_gda_load_device_state: nvshmemt_efa_gda_get_device_state_sized -> %d (%s)\n",
                rc, nvshmem_efa_gda_last_error());
        memset(&s, 0, sizeof s);
        rc = NVSHMEM_EFA_GDA_LOAD_EGET;
    } else if (s.version != NVSHMEM_EFA_GDA_STATE_VERSION) {
        fprintf(stderr,
                "nvshmem_efa_gda_load_device_state: library state version %u, header version %u\n",
                s.version, (unsigned)NVSHMEM_EFA_GDA_STATE_VERSION);
        memset(&s, 0, sizeof s);
        rc = NVSHMEM_EFA_GDA_LOAD_EVERSION;
    } else if (!s.ready) {
        rc = NVSHMEM_EFA_GDA_LOAD_NOT_READY;
    } else if (const char *why = nvshmem_efa_gda_geometry_problem(s)) {
        fprintf(stderr, "nvshmem_efa_gda_load_device_state: %s\n", why);
        s.ready = 0;
        rc = NVSHMEM_EFA_GDA_LOAD_EGEOMETRY;
    } else {
        rc = NVSHMEM_EFA_GDA_LOAD_OK;
    }
    // Kernels of this application see ready == 0 unless rc == OK, and take their fallback paths.
    NvshmemEfaGdaDeviceLocal l;
    l.num_rc_per_pe = nvshmem_efa_gda_env_int("NVSHMEM_IBGDA_NUM_RC_PER_PE", 1);
    l.num_devices_initialized = 1;
    l.fatal = 0u;
    l.reserved = 0u;
    // Both sources are host stack objects: a copy from pageable memory has consumed its source when
    // the call returns; the synchronize below makes the state visible to the caller's next launch on
    // any stream.
    cudaError_t e = cudaMemcpyToSymbolAsync(nvshmem_efa_gda_state_d, &s, sizeof s, 0,
                                            cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess)
        e = cudaMemcpyToSymbolAsync(nvshmem_efa_gda_local_d, &l, sizeof l, 0,
                                    cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "nvshmem_efa_gda_load_device_state: %s\n", cudaGetErrorString(e));
        return NVSHMEM_EFA_GDA_LOAD_ECUDA;
    }
    return rc;
}
