// Shared helpers for the NVSHMEM GPU test program and benchmark (tests/gpu/).
//
// - job start-up: MPI (default) or, with -DNVSHMEM_TESTS_NO_MPI, NVSHMEM's unique-id bootstrap
//   (id passed through a file, rank and size from the launcher) or its default bootstrap;
//   one GPU per PE, chosen from the node-local rank before NVSHMEM is initialised;
// - job-wide helpers that do not depend on the transport under test when MPI is present
//   (allgather of verdicts, barrier);
// - a SIGALRM watchdog that names the step that hung and exits non-zero;
// - CUDA / NVSHMEM return-code checks that abort the whole job with a clear line;
// - byte patterns that depend on (owner PE, region, tag, offset), fill and verify kernels.
#pragma once

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#ifndef NVSHMEM_TESTS_NO_MPI
#include <mpi.h>
#endif

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace gt {

// ---------------------------------------------------------------------------------------------
// Job state and fatal errors
// ---------------------------------------------------------------------------------------------
struct Job {
    int pe = -1;
    int npes = 0;
    int local_rank = 0;
    int device = -1;
    bool mpi_up = false;
    bool nvshmem_up = false;
    const char *step = "start-up";  // what is running now (for fatal messages)
};
static Job g_job;

static inline void job_abort(int code) {
    fflush(stdout);
    fflush(stderr);
#ifndef NVSHMEM_TESTS_NO_MPI
    if (g_job.mpi_up) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    if (g_job.nvshmem_up) nvshmem_global_exit(code);
    _exit(code);
}

static inline void fatal(const char *file, int line, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FATAL pe %d during '%s': %s:%d: %s\n", g_job.pe, g_job.step, file, line, msg);
    job_abort(3);
}

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t ck_e_ = (call);                                                        \
        if (ck_e_ != cudaSuccess)                                                          \
            gt::fatal(__FILE__, __LINE__, "%s -> %s (%s)", #call, cudaGetErrorName(ck_e_), \
                      cudaGetErrorString(ck_e_));                                          \
    } while (0)

// Launch check: configuration errors right away, execution errors at the synchronize.
#define CK_LAUNCH() CK(cudaGetLastError())

// NVSHMEM calls that return an int status (0 = success).
#define NVCK(call)                                                                          \
    do {                                                                                    \
        int nvck_rc_ = (call);                                                              \
        if (nvck_rc_ != 0) gt::fatal(__FILE__, __LINE__, "%s returned %d", #call, nvck_rc_); \
    } while (0)

static inline void *sym_malloc(size_t bytes, const char *what) {
    void *p = nvshmem_malloc(bytes);
    if (p == nullptr) {
        char why[160];
        snprintf(why, sizeof why, "nvshmem_malloc(%zu) for %s returned NULL", bytes, what);
        fatal(__FILE__, __LINE__, "%s (is NVSHMEM_SYMMETRIC_SIZE large enough? 1G is plenty)",
              why);
    }
    return p;
}

static inline double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    if (v == nullptr || *v == '\0') return dflt;
    char *end = nullptr;
    double d = strtod(v, &end);
    return (end != v && d > 0) ? d : dflt;
}

// ---------------------------------------------------------------------------------------------
// Watchdog: alarm() per step; the handler only uses async-signal-safe calls.
// ---------------------------------------------------------------------------------------------
static char g_wd_msg[1024];
static volatile size_t g_wd_len = 0;
static char g_wd_tail[256] = "";  // extra text (e.g. results so far), set by the program

static inline void wd_handler(int) {
    size_t n = g_wd_len;
    if (n > 0) {
        ssize_t w = write(STDOUT_FILENO, g_wd_msg, n);
        (void)w;
    }
    _exit(124);
}

static inline void watchdog_install() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wd_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, nullptr);
}

static inline void watchdog_arm(const char *what, unsigned seconds) {
    alarm(0);
    g_wd_len = 0;
    snprintf(g_wd_msg, sizeof g_wd_msg,
             "WATCHDOG pe %d: '%s' did not finish within %u s; exiting with status 124%s%s\n",
             g_job.pe, what, seconds, g_wd_tail[0] ? "\n" : "", g_wd_tail);
    g_wd_len = strlen(g_wd_msg);
    g_job.step = what;
    alarm(seconds);
}

static inline void watchdog_disarm() { alarm(0); }

// ---------------------------------------------------------------------------------------------
// Job start-up, allgather, barrier, finalize
// ---------------------------------------------------------------------------------------------
static inline int env_local_rank() {
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                           "SLURM_LOCALID", "PMI_LOCAL_RANK", "PALS_LOCAL_RANKID"};
    for (const char *n : names) {
        const char *v = getenv(n);
        if (v != nullptr && *v != '\0') return atoi(v);
    }
    return -1;
}

#ifdef NVSHMEM_TESTS_NO_MPI
static const size_t kStageSlot = 64 * 1024;
static uint8_t *g_stage = nullptr;  // symmetric: npes slots + one local source slot

static inline int env_int(const char *const *names, int n) {
    for (int i = 0; i < n; ++i) {
        const char *v = getenv(names[i]);
        if (v != nullptr && *v != '\0') return atoi(v);
    }
    return -1;
}

// Without MPI: when the launcher tells rank and size (mpirun, Slurm, PMI) and
// NVSHMEM_TESTS_UID_FILE names a fresh path, rank 0 publishes an NVSHMEM unique id in that file
// and every rank initialises with it (UID bootstrap). Otherwise nvshmem_init() (PMI bootstrap).
static inline void init_without_mpi() {
    const char *rank_names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
    const char *size_names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    const int rank = env_int(rank_names, 4), size = env_int(size_names, 3);
    const char *path = getenv("NVSHMEM_TESTS_UID_FILE");
    if (path == nullptr || *path == '\0' || rank < 0 || size < 1) {
        nvshmem_init();
        return;
    }
    g_job.pe = rank;
    static nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
    if (rank == 0) {
        NVCK(nvshmemx_get_uniqueid(&uid));
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f == nullptr || fwrite(&uid, sizeof uid, 1, f) != 1 || fclose(f) != 0)
            fatal(__FILE__, __LINE__, "cannot write the unique id to %s: %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0)
            fatal(__FILE__, __LINE__, "rename %s -> %s: %s", tmp, path, strerror(errno));
    } else {
        for (;;) {  // bounded by the start-up watchdog
            FILE *f = fopen(path, "rb");
            if (f != nullptr) {
                size_t got = fread(&uid, sizeof uid, 1, f);
                fclose(f);
                if (got == 1) break;
            }
            usleep(10000);
        }
    }
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    NVCK(nvshmemx_set_attr_uniqueid_args(rank, size, &uid, &attr));
    NVCK(nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr));
    if (rank == 0) unlink(path);  // every rank has read it: init is collective
}
#endif

static inline void job_init(int *argc, char ***argv, unsigned init_timeout_s) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    watchdog_install();
    watchdog_arm("start-up (MPI, CUDA device, nvshmem init)", init_timeout_s);
#ifndef NVSHMEM_TESTS_NO_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS) {
        printf("FATAL: MPI_Init failed\n");
        _exit(3);
    }
    g_job.mpi_up = true;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_job.pe = rank;  // provisional, replaced by nvshmem_my_pe() below
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
    {
        const char *rank_names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
        g_job.pe = env_int(rank_names, 4);  // provisional, for messages before init
    }
    int lr = env_local_rank();
    if (lr < 0) lr = 0;
#endif
    g_job.local_rank = lr;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 1) fatal(__FILE__, __LINE__, "no CUDA device visible");
    // Fewer GPUs than node-local PEs: the PEs share them (NVSHMEM's multiple-PEs-per-GPU mode,
    // which needs CUDA MPS; tests/gpu/mps.sh starts it).
    g_job.device = lr % ndev;
    CK(cudaSetDevice(g_job.device));
    CK(cudaFree(nullptr));  // create the context on the chosen device before NVSHMEM starts

#ifndef NVSHMEM_TESTS_NO_MPI
    MPI_Comm comm = MPI_COMM_WORLD;
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    attr.mpi_comm = &comm;
    NVCK(nvshmemx_init_attr(NVSHMEMX_INIT_WITH_MPI_COMM, &attr));
#else
    init_without_mpi();
#endif
    g_job.nvshmem_up = true;
    int st = nvshmemx_init_status();
    if (st < NVSHMEM_STATUS_IS_INITIALIZED)
        fatal(__FILE__, __LINE__, "nvshmemx_init_status() = %d after init", st);
    g_job.pe = nvshmem_my_pe();
    g_job.npes = nvshmem_n_pes();
#ifndef NVSHMEM_TESTS_NO_MPI
    int mpi_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    if (mpi_size != g_job.npes)
        fatal(__FILE__, __LINE__, "MPI has %d ranks but NVSHMEM reports %d PEs", mpi_size,
              g_job.npes);
#else
    g_stage = (uint8_t *)sym_malloc(kStageSlot * (size_t)(g_job.npes + 1), "job staging");
#endif
    int dev = -1;
    CK(cudaGetDevice(&dev));
    if (dev != g_job.device)
        fatal(__FILE__, __LINE__, "current device %d after nvshmem init, expected %d", dev,
              g_job.device);
    watchdog_disarm();
    g_job.step = "running";
}

// Gathers `bytes` from every PE into recv[pe * bytes]. Collective.
static inline void job_allgather(const void *send, void *recv, size_t bytes) {
#ifndef NVSHMEM_TESTS_NO_MPI
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

static inline long long job_max_ll(long long v) {
    std::vector<long long> all((size_t)g_job.npes);
    job_allgather(&v, all.data(), sizeof v);
    long long m = all[0];
    for (long long x : all) m = std::max(m, x);
    return m;
}

static inline void job_barrier() {
#ifndef NVSHMEM_TESTS_NO_MPI
    MPI_Barrier(MPI_COMM_WORLD);
#else
    nvshmem_barrier_all();
#endif
}

static inline void job_finalize(unsigned timeout_s) {
    watchdog_arm("nvshmem_finalize / MPI_Finalize", timeout_s);
    nvshmem_finalize();
    g_job.nvshmem_up = false;
#ifndef NVSHMEM_TESTS_NO_MPI
    MPI_Finalize();
    g_job.mpi_up = false;
#endif
    watchdog_disarm();
}

// ---------------------------------------------------------------------------------------------
// Device clock (nanoseconds, same on every SM)
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t dev_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---------------------------------------------------------------------------------------------
// Byte patterns
// ---------------------------------------------------------------------------------------------
__host__ __device__ __forceinline__ uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Byte at offset i of a region whose content is identified by `seed`.
__host__ __device__ __forceinline__ uint8_t pat_byte(uint32_t seed, uint64_t i) {
    uint32_t w = mix32(seed ^ mix32((uint32_t)(i >> 2) * 0x9e3779b1U + (uint32_t)(i >> 34)));
    return (uint8_t)(w >> ((i & 3) * 8));
}

// Seed for the data that PE `owner` writes for region `k` in test step `tag`.
static inline uint32_t make_seed(uint32_t owner, uint32_t k, uint32_t tag) {
    return mix32(owner * 0x01000193U + 0x5bd1e995U) ^ mix32(k * 0x27d4eb2fU + 0x165667b1U) ^
           mix32(tag * 0x9e3779b9U + 0x85ebca6bU);
}

static const uint8_t kSentinel = 0xE7;  // bytes that no operation may touch

static const int kMaxRegions = 24;
struct Region {
    size_t off;
    size_t len;
    uint32_t seed;
};
struct Layout {
    int n;
    size_t span;  // bytes [0, span) are checked: regions hold patterns, the rest kSentinel
    Region r[kMaxRegions];
};

static inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Regions of the given sizes, one after another with sentinel gaps; odd-numbered regions start
// 3 bytes past a 4 KiB boundary so unaligned addresses are exercised too.
static inline Layout make_layout(const size_t *sizes, int n, uint32_t owner, uint32_t tag,
                          bool misalign = true) {
    Layout L;
    memset(&L, 0, sizeof L);
    if (n > kMaxRegions) fatal(__FILE__, __LINE__, "too many regions (%d)", n);
    L.n = n;
    size_t off = 0;
    for (int k = 0; k < n; ++k) {
        off = align_up(off, 4096) + ((misalign && (k & 1)) ? 3 : 0);
        L.r[k].off = off;
        L.r[k].len = sizes[k];
        L.r[k].seed = make_seed(owner, (uint32_t)k, tag);
        off += sizes[k] + 64;
    }
    L.span = align_up(off, 4096) + 4096;
    return L;
}

// Same offsets, contents owned by another PE.
static inline Layout with_owner(Layout L, uint32_t owner, uint32_t tag) {
    for (int k = 0; k < L.n; ++k) L.r[k].seed = make_seed(owner, (uint32_t)k, tag);
    return L;
}

__global__ void fill_kernel(uint8_t *buf, size_t len, uint32_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride)
        buf[i] = pat_byte(seed, i);
}

struct VerifyOut {
    unsigned long long bad[kMaxRegions + 1];    // per region; [n] = bytes outside the regions
    unsigned long long first[kMaxRegions + 1];  // lowest bad buffer offset
};

__global__ void verify_kernel(const uint8_t *buf, Layout L, uint8_t sentinel, VerifyOut *out) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < L.span; i += stride) {
        int k = L.n;
        uint8_t want = sentinel;
        for (int j = 0; j < L.n; ++j) {
            if (i >= L.r[j].off && i - L.r[j].off < L.r[j].len) {
                k = j;
                want = pat_byte(L.r[j].seed, i - L.r[j].off);
                break;
            }
        }
        if (buf[i] != want) {
            atomicAdd(&out->bad[k], 1ULL);
            atomicMin(&out->first[k], (unsigned long long)i);
        }
    }
}

static inline unsigned grid_for(size_t n, unsigned block = 256, unsigned max_blocks = 2048) {
    size_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    if (g > max_blocks) g = max_blocks;
    return (unsigned)g;
}

static VerifyOut *g_vout = nullptr;  // device scratch

static inline void fill_region(uint8_t *buf, size_t len, uint32_t seed) {
    if (len == 0) return;
    fill_kernel<<<grid_for(len), 256>>>(buf, len, seed);
    CK_LAUNCH();
}

// Fills every region of L in buf (its seeds decide the content).
static inline void fill_layout(uint8_t *buf, const Layout &L) {
    for (int k = 0; k < L.n; ++k) fill_region(buf + L.r[k].off, L.r[k].len, L.r[k].seed);
}

// Checks buf against L (patterns in the regions, sentinel elsewhere in [0, span)).
// Calls report(msg) for every region with differences; returns the number of bad bytes.
template <typename Report>
static inline unsigned long long verify_layout(const uint8_t *buf, const Layout &L, Report report) {
    if (g_vout == nullptr) CK(cudaMalloc(&g_vout, sizeof(VerifyOut)));
    VerifyOut h;
    for (int k = 0; k <= kMaxRegions; ++k) {
        h.bad[k] = 0;
        h.first[k] = ~0ULL;
    }
    CK(cudaMemcpy(g_vout, &h, sizeof h, cudaMemcpyHostToDevice));
    verify_kernel<<<grid_for(L.span), 256>>>(buf, L, kSentinel, g_vout);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&h, g_vout, sizeof h, cudaMemcpyDeviceToHost));
    unsigned long long total = 0;
    for (int k = 0; k <= L.n; ++k) {
        if (h.bad[k] == 0) continue;
        total += h.bad[k];
        uint8_t got = 0;
        CK(cudaMemcpy(&got, buf + h.first[k], 1, cudaMemcpyDeviceToHost));
        char msg[320];
        if (k < L.n) {
            size_t rel = (size_t)(h.first[k] - L.r[k].off);
            snprintf(msg, sizeof msg,
                     "%zu-byte region at offset %zu: %llu of %zu bytes wrong, first at +%zu "
                     "(got 0x%02x, want 0x%02x)",
                     L.r[k].len, L.r[k].off, h.bad[k], L.r[k].len, rel, got,
                     pat_byte(L.r[k].seed, rel));
        } else {
            snprintf(msg, sizeof msg,
                     "%llu byte(s) outside the target regions were modified, first at buffer "
                     "offset %llu (got 0x%02x, want sentinel 0x%02x)",
                     h.bad[k], h.first[k], got, kSentinel);
        }
        report(msg);
    }
    return total;
}

}  // namespace gt
