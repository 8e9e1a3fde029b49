// SPDX-License-Identifier: BSD-3-Clause
//
// Helpers shared by the GDA device-API tests and benchmark (tests/gpu_gda/):
//   - job start-up: MPI (default) or, with -DGDA_TESTS_NO_MPI, nvshmem_init(); one GPU per PE,
//     chosen from the node-local rank before NVSHMEM starts;
//   - job-wide allgather / barrier (MPI when present, NVSHMEM host API otherwise);
//   - a SIGALRM watchdog that names the step that hung and exits with status 124;
//   - CUDA / NVSHMEM return-code checks that abort the whole job with one clear line;
//   - fill kernel for the byte patterns of gda_shared.h.
#pragma once

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#ifndef GDA_TESTS_NO_MPI
#include <mpi.h>
#endif

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include "nvshmem_efa_gda_device.cuh"
#include "gda_shared.h"

namespace gg {

struct Job {
    int pe = -1;
    int npes = 0;
    int local_rank = 0;
    bool mpi_up = false;
    bool nvshmem_up = false;
    const char *step = "start-up";
};
static Job g_job;

static void job_abort(int code) {
    fflush(stdout);
    fflush(stderr);
#ifndef GDA_TESTS_NO_MPI
    if (g_job.mpi_up) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    if (g_job.nvshmem_up) nvshmem_global_exit(code);
    _exit(code);
}

static void fatal(const char *file, int line, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FATAL pe %d during '%s': %s:%d: %s\n", g_job.pe, g_job.step, file, line, msg);
    job_abort(3);
}

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t ck_e_ = (call);                                                         \
        if (ck_e_ != cudaSuccess)                                                           \
            gg::fatal(__FILE__, __LINE__, "%s -> %s (%s)", #call, cudaGetErrorName(ck_e_),  \
                      cudaGetErrorString(ck_e_));                                           \
    } while (0)
#define CK_LAUNCH() CK(cudaGetLastError())

static void *sym_malloc(size_t bytes, const char *what) {
    void *p = nvshmem_malloc(bytes);
    if (p == nullptr)
        fatal(__FILE__, __LINE__, "nvshmem_malloc(%zu) for %s returned NULL (NVSHMEM_SYMMETRIC_SIZE?)",
              bytes, what);
    return p;
}

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- watchdog --------------------------------------------------------------------------------
static char g_wd_msg[512];
static volatile size_t g_wd_len = 0;

static void wd_handler(int) {
    size_t n = g_wd_len;
    if (n > 0) {
        ssize_t w = write(STDOUT_FILENO, g_wd_msg, n);
        (void)w;
    }
    _exit(124);
}

static void watchdog_arm(const char *what, unsigned seconds) {
    alarm(0);
    g_wd_len = 0;
    snprintf(g_wd_msg, sizeof g_wd_msg,
             "WATCHDOG pe %d: '%s' did not finish within %u s; exiting with status 124\n",
             g_job.pe, what, seconds);
    g_wd_len = strlen(g_wd_msg);
    g_job.step = what;
    alarm(seconds);
}

static void watchdog_disarm() { alarm(0); }

// ---- start-up --------------------------------------------------------------------------------
static int env_local_rank() {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK"};
    for (const char *n : names) {
        const char *v = getenv(n);
        if (v != nullptr && *v != '\0') return atoi(v);
    }
    return -1;
}

#ifdef GDA_TESTS_NO_MPI
static const size_t kStageSlot = 4096;
static uint8_t *g_stage = nullptr;  // symmetric: npes slots + one source slot
#endif

static void job_init(int *argc, char ***argv, unsigned init_timeout_s) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wd_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, nullptr);
    watchdog_arm("start-up (MPI, CUDA device, nvshmem init)", init_timeout_s);
#ifndef GDA_TESTS_NO_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS) {
        printf("FATAL: MPI_Init failed\n");
        _exit(3);
    }
    g_job.mpi_up = true;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_job.pe = rank;
    int lr = env_local_rank();
    if (lr < 0) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &lr);
        MPI_Comm_free(&node);
    }
#else
    (void)argc;
    (void)argv;
    int lr = env_local_rank();
    if (lr < 0) lr = 0;
#endif
    g_job.local_rank = lr;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 1) fatal(__FILE__, __LINE__, "no CUDA device visible");
    // Fewer GPUs than node-local PEs: shared through CUDA MPS (tests/gpu/mps.sh).
    CK(cudaSetDevice(lr % ndev));
    CK(cudaFree(nullptr));
#ifndef GDA_TESTS_NO_MPI
    MPI_Comm comm = MPI_COMM_WORLD;
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    attr.mpi_comm = &comm;
    int st = nvshmemx_init_attr(NVSHMEMX_INIT_WITH_MPI_COMM, &attr);
    if (st != 0) fatal(__FILE__, __LINE__, "nvshmemx_init_attr returned %d", st);
#else
    nvshmem_init();
#endif
    g_job.nvshmem_up = true;
    g_job.pe = nvshmem_my_pe();
    g_job.npes = nvshmem_n_pes();
#ifdef GDA_TESTS_NO_MPI
    g_stage = (uint8_t *)sym_malloc(kStageSlot * (size_t)(g_job.npes + 1), "job staging");
#endif
    watchdog_disarm();
    g_job.step = "running";
}

// Gathers `bytes` from every PE into recv[pe * bytes]. Collective.
static void job_allgather(const void *send, void *recv, size_t bytes) {
#ifndef GDA_TESTS_NO_MPI
    if (MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        fatal(__FILE__, __LINE__, "MPI_Allgather failed");
#else
    if (bytes > kStageSlot) fatal(__FILE__, __LINE__, "job_allgather: %zu bytes too large", bytes);
    uint8_t *mine = g_stage + kStageSlot * (size_t)g_job.npes;
    CK(cudaMemcpy(mine, send, bytes, cudaMemcpyHostToDevice));
    nvshmem_barrier_all();
    for (int p = 0; p < g_job.npes; ++p)
        nvshmem_putmem(g_stage + kStageSlot * (size_t)g_job.pe, mine, bytes, p);
    nvshmem_quiet();
    nvshmem_barrier_all();
    for (int p = 0; p < g_job.npes; ++p)
        CK(cudaMemcpy((uint8_t *)recv + (size_t)p * bytes, g_stage + kStageSlot * (size_t)p, bytes,
                      cudaMemcpyDeviceToHost));
    nvshmem_barrier_all();
#endif
}

static void job_barrier() {
#ifndef GDA_TESTS_NO_MPI
    MPI_Barrier(MPI_COMM_WORLD);
#else
    nvshmem_barrier_all();
#endif
}

static void job_finalize(unsigned timeout_s) {
    watchdog_arm("nvshmem_finalize / MPI_Finalize", timeout_s);
    nvshmem_finalize();
    g_job.nvshmem_up = false;
#ifndef GDA_TESTS_NO_MPI
    MPI_Finalize();
    g_job.mpi_up = false;
#endif
    watchdog_disarm();
}

static __global__ void fill_kernel(uint8_t *buf, size_t len, uint32_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride)
        buf[i] = pat_byte(seed, i);
}

static unsigned grid_for(size_t n, unsigned block = 256, unsigned max_blocks = 2048) {
    size_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    if (g > max_blocks) g = max_blocks;
    return (unsigned)g;
}

static void fill_pattern(uint8_t *buf, size_t len, uint32_t seed) {
    if (len == 0) return;
    fill_kernel<<<grid_for(len), 256>>>(buf, len, seed);
    CK_LAUNCH();
}

}  // namespace gg
