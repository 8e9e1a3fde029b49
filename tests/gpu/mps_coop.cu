// mps_coop: can the cooperative grids of several processes sharing one GPU under CUDA MPS run at the
// same time? DeepEP's low-latency kernels are cooperative grids sized from the SMs a rank sees, and
// each waits for data the other ranks' grids send; with two ranks on one GPU both grids must be
// resident together. MPS limits the SMs a client may use, and reserves none ("kernels launched from
// different MPS client contexts may execute on the same SM": the MPS documentation as quoted in
// forums.developer.nvidia.com/t/351838), so whether they are is a question of the GPU's scheduling,
// asked here without DeepEP and without this library.
//
// Every process of a run (N of them, --me 0..N-1, one shared file) launches one cooperative grid:
// --blocks blocks (default: one per SM the process sees, DeepEP's shape), --threads threads each,
// --smem bytes of dynamic shared memory each (default: the most one block may have, so one block
// per SM). Thread 0 of each block records its SM and a live flag in its slots of the file (host
// memory mapped into every process) and waits until every block of every grid is live at once, or
// --timeout-ms passes (then it clears its flag). Prints one line:
//
//   mps_coop me=K procs=N sms=S blocks=B threads=T smem=M per_sm=P resident_all=yes|no waited_ms=W
//     started=<started/grid of each process, read when this grid ended> distinct_sms=<SMs of this
//     grid> overlap=<of them, SMs the other grids' blocks ran on>
//
// Exit status 0 when every block of this grid saw every block of every grid, 1 when a block timed
// out, 2 on a usage or CUDA error. tests/gpu/mps_coop.sh runs it under MPS at several percentages.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <set>
#include <string>

namespace {

constexpr int kMaxProcs = 8;
constexpr int kMaxBlocks = 4096;

// The shared file: one page-aligned region every process maps and registers with CUDA.
struct Shared {
    unsigned arrived[kMaxProcs];   // processes that wrote their grid size (host side, before launch)
    unsigned grid[kMaxProcs];      // each process's grid size
    unsigned sm[kMaxProcs][kMaxBlocks];    // SM + 1 of each block that started (0: not started)
    unsigned live[kMaxProcs][kMaxBlocks];  // 1 from a block's start until it gives up
};

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "mps_coop: %s failed: %s\n", #x, cudaGetErrorString(e_));           \
            exit(2);                                                                            \
        }                                                                                       \
    } while (0)

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One block per SM's worth of resources; thread 0 does the bookkeeping, the rest wait at the end.
// Each block writes its SM and sets its live flag (its own slots: no atomics on host memory, which
// PCIe may not make atomic), then scans every grid's live flags until all are set. A block that
// gives up clears its flag first, so the first scan that finds them all set finds every block of
// every grid running at once (a block only leaves without clearing after such a scan).
__global__ void coop_kernel(Shared *s, int me, int procs, unsigned long long timeout_ns,
                            unsigned *timed_out) {
    // The dynamic shared memory is held by the block from its launch, used or not.
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        *(volatile unsigned *)&s->sm[me][blockIdx.x] = smid + 1u;
        *(volatile unsigned *)&s->live[me][blockIdx.x] = 1u;
        __threadfence_system();
        const unsigned long long t0 = now_ns();
        for (;;) {
            bool all = true;
            for (int p = 0; p < procs && all; ++p) {
                const unsigned g = *(volatile unsigned *)&s->grid[p];
                for (unsigned b = 0; b < g && all; ++b)
                    all = *(volatile unsigned *)&s->live[p][b] != 0u;
            }
            if (all) break;
            if (now_ns() - t0 > timeout_ns) {
                *(volatile unsigned *)&s->live[me][blockIdx.x] = 0u;
                __threadfence_system();
                atomicAdd(timed_out, 1u);
                break;
            }
            __nanosleep(2000);
        }
    }
    __syncthreads();
}

double wall_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

void usage() {
    fprintf(stderr,
            "usage: mps_coop --file PATH --me K --procs N [--blocks B] [--threads T] [--smem BYTES]\n"
            "                [--timeout-ms MS]\n"
            "  Every process of a run gives the same --file and --procs and its own --me (0..N-1).\n"
            "  Defaults: one block per SM seen, 1024 threads, the largest dynamic shared memory a\n"
            "  block may have, 10000 ms.\n");
}

}  // namespace

int main(int argc, char **argv) {
    const char *file = nullptr;
    int me = -1, procs = 0, blocks = 0, threads = 1024;
    long smem = -1, timeout_ms = 10000;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--help" || a == "-h") {
            usage();
            return 0;
        }
        if (!v) {
            usage();
            return 2;
        }
        if (a == "--file") file = v;
        else if (a == "--me") me = atoi(v);
        else if (a == "--procs") procs = atoi(v);
        else if (a == "--blocks") blocks = atoi(v);
        else if (a == "--threads") threads = atoi(v);
        else if (a == "--smem") smem = atol(v);
        else if (a == "--timeout-ms") timeout_ms = atol(v);
        else {
            fprintf(stderr, "mps_coop: unknown option %s\n", a.c_str());
            usage();
            return 2;
        }
        ++i;
    }
    if (!file || procs < 1 || procs > kMaxProcs || me < 0 || me >= procs || threads < 32 ||
        threads > 1024 || timeout_ms < 1) {
        fprintf(stderr, "mps_coop: need --file, --procs 1..%d, --me 0..procs-1, --threads 32..1024\n",
                kMaxProcs);
        return 2;
    }

    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int coop = 0;
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    if (!coop) {
        fprintf(stderr, "mps_coop: the device has no cooperative launch\n");
        return 2;
    }
    int smem_max = 0;
    CK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem < 0) smem = smem_max;
    if (smem > smem_max) {
        fprintf(stderr, "mps_coop: --smem %ld is over the device's %d\n", smem, smem_max);
        return 2;
    }
    CK(cudaFuncSetAttribute(coop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_kernel, threads, (size_t)smem));
    if (blocks <= 0) blocks = prop.multiProcessorCount;
    if (blocks > kMaxBlocks || blocks > per_sm * prop.multiProcessorCount) {
        fprintf(stderr, "mps_coop: %d blocks do not fit one cooperative grid here (%d SMs x %d)\n", blocks,
                prop.multiProcessorCount, per_sm);
        return 2;
    }

    // The shared file, mapped and registered (host memory every process's kernels can reach).
    const size_t len = (sizeof(Shared) + 4095) & ~size_t(4095);
    int fd = open(file, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        perror("mps_coop: shared file");
        return 2;
    }
    void *map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        perror("mps_coop: mmap");
        return 2;
    }
    CK(cudaHostRegister(map, len, cudaHostRegisterMapped | cudaHostRegisterPortable));
    Shared *h = static_cast<Shared *>(map);
    Shared *d = nullptr;
    CK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&d), map, 0));
    unsigned *timed_out = nullptr;
    CK(cudaMalloc(&timed_out, sizeof(unsigned)));
    CK(cudaMemset(timed_out, 0, sizeof(unsigned)));
    CK(cudaDeviceSynchronize());

    // Launch together: every process writes its grid size, then waits for the others' (host side,
    // bounded by the same timeout).
    __atomic_store_n(&h->grid[me], (unsigned)blocks, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&h->arrived[me], 1u, __ATOMIC_SEQ_CST);
    const double t_wait = wall_ms();
    for (;;) {
        int ready = 0;
        for (int p = 0; p < procs; ++p) ready += __atomic_load_n(&h->arrived[p], __ATOMIC_SEQ_CST) > 0;
        if (ready == procs) break;
        if (wall_ms() - t_wait > (double)timeout_ms) {
            fprintf(stderr, "mps_coop: me=%d: the other processes did not arrive within %ld ms\n", me,
                    timeout_ms);
            return 2;
        }
        usleep(100);
    }

    const unsigned long long timeout_ns = (unsigned long long)timeout_ms * 1000000ull;
    void *args[] = {&d, &me, &procs, const_cast<unsigned long long *>(&timeout_ns), &timed_out};
    const double t0 = wall_ms();
    CK(cudaLaunchCooperativeKernel((void *)coop_kernel, dim3(blocks), dim3(threads), args, (size_t)smem,
                                   0));
    CK(cudaDeviceSynchronize());
    const double waited = wall_ms() - t0;
    unsigned to = 0;
    CK(cudaMemcpy(&to, timed_out, sizeof(unsigned), cudaMemcpyDeviceToHost));

    // Blocks of each grid that started, and the SMs of this grid and of the others.
    std::string started;
    std::set<unsigned> mine, others;
    for (int p = 0; p < procs; ++p) {
        const unsigned g = __atomic_load_n(&h->grid[p], __ATOMIC_SEQ_CST);
        unsigned n = 0;
        for (unsigned b = 0; b < g && b < (unsigned)kMaxBlocks; ++b) {
            const unsigned v = __atomic_load_n(&h->sm[p][b], __ATOMIC_SEQ_CST);
            if (v == 0u) continue;
            ++n;
            (p == me ? mine : others).insert(v - 1u);
        }
        started += (p ? "," : "") + std::to_string(n) + "/" + std::to_string(g);
    }
    int shared_sms = 0;
    for (unsigned x : mine) shared_sms += others.count(x) ? 1 : 0;
    printf("mps_coop me=%d procs=%d sms=%d blocks=%d threads=%d smem=%ld per_sm=%d resident_all=%s "
           "waited_ms=%.0f started=%s distinct_sms=%zu overlap=%d\n",
           me, procs, prop.multiProcessorCount, blocks, threads, smem, per_sm, to == 0 ? "yes" : "no",
           waited, started.c_str(), mine.size(), shared_sms);
    CK(cudaHostUnregister(map));
    munmap(map, len);
    close(fd);
    return to == 0 ? 0 : 1;
}
