// NVSHMEM functional tests for a remote transport (2 or more PEs, one GPU each).
//
// Every case checks every byte it moves (patterns that depend on the writing PE, the region and
// the case), checks that bytes next to the targets stay untouched, and bounds every wait:
// device-side waits poll with a timeout, and a per-case watchdog ends the run with the name of
// the case that hung. PE 0 prints "RUN <case>" when a case starts and one result line per case,
// "PASS <case> (<s> s)" or "FAIL <case> (<s> s): <details>"; the run ends with
// "<N> passed, <M> failed", then "finalize ok" once NVSHMEM and MPI are shut down.
// The exit status is 0 only if every selected case passed.
//
// Usage: nvshmem_tests [--list | --names] [--timeout SECONDS] [CASE[,CASE...] ...]
// Environment: NVSHMEM_TESTS_TIMEOUT (seconds per case, default 60),
//              NVSHMEM_TESTS_WAIT (seconds a device-side wait may take, default 10).
#include "common.cuh"

#include <string>
#include <type_traits>

using namespace gt;

namespace {

// ---------------------------------------------------------------------------------------------
// Per-case failure bookkeeping
// ---------------------------------------------------------------------------------------------
struct CaseState {
    const char *name = "";
    int nfail = 0;
    int nprinted = 0;
    char first[320] = "";
};
CaseState g_cs;

void failf(const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_cs.nfail == 0) snprintf(g_cs.first, sizeof g_cs.first, "%s", msg);
    ++g_cs.nfail;
    if (g_cs.nprinted < 12) {
        printf("  [pe %d] %s: %s\n", g_job.pe, g_cs.name, msg);
    } else if (g_cs.nprinted == 12) {
        printf("  [pe %d] %s: (further failures of this case not shown)\n", g_job.pe, g_cs.name);
    }
    ++g_cs.nprinted;
}

#define EXPECT(cond, ...)        \
    do {                         \
        if (!(cond)) failf(__VA_ARGS__); \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Buffers (symmetric unless noted)
// ---------------------------------------------------------------------------------------------
const size_t kBufBytes = 96u << 20;  // holds the standard layout (about 81 MiB)
uint8_t *g_src = nullptr;            // data that this PE sends / that peers read
uint8_t *g_dst = nullptr;            // data that arrives here
uint8_t *g_misc = nullptr;           // small symmetric scratch (AMO targets, counters, signals)
const size_t kMiscBytes = 1u << 20;
uint8_t *g_local = nullptr;          // non-symmetric device scratch (results of device calls)
const size_t kLocalBytes = 1u << 20;

int g_pe = 0, g_npes = 0;
int g_peer = 0;  // the PE this PE puts to, gets from and targets with AMOs
int g_from = 0;  // the PE that puts into this PE (== g_peer with 2 PEs)
double g_wait_s = 10.0;  // device-side wait limit

const size_t kStdSizes[] = {1, 7, 4096, 65536, 1u << 20, 16u << 20, 64u << 20};
const int kNumStd = (int)(sizeof kStdSizes / sizeof kStdSizes[0]);

// Case tags: distinct data per case and direction, so stale data can never pass.
enum : uint32_t {
    TAG_HOST_PUT = 1,
    TAG_HOST_GET,
    TAG_HOST_PUT_NBI,
    TAG_HOST_GET_NBI,
    TAG_STREAM_PUT,
    TAG_STREAM_GET,
    TAG_DEV_PUT_THREAD,
    TAG_DEV_GET_THREAD,
    TAG_DEV_PUT_WARP,
    TAG_DEV_GET_WARP,
    TAG_DEV_PUT_BLOCK,
    TAG_DEV_GET_BLOCK,
    TAG_SIGNAL,
    TAG_MALLOC,
    TAG_BCAST,
    TAG_FCOLLECT,
};

// Fills my g_src regions with my data, sets g_dst to the sentinel and aligns the PEs.
void prepare(const Layout &mine) {
    if (mine.span > kBufBytes) fatal(__FILE__, __LINE__, "layout exceeds the buffers");
    fill_layout(g_src, mine);
    CK(cudaMemset(g_dst, kSentinel, mine.span));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
}

// Checks g_dst against the peer's data for `what`.
void check_dst(const Layout &expected, const char *what) {
    verify_layout(g_dst, expected, [&](const char *msg) { failf("%s: %s", what, msg); });
}

Layout std_layout(uint32_t owner, uint32_t tag) { return make_layout(kStdSizes, kNumStd, owner, tag); }

// ---------------------------------------------------------------------------------------------
// Host-initiated RMA
// ---------------------------------------------------------------------------------------------
void case_host_putget() {
    Layout mine = std_layout(g_pe, TAG_HOST_PUT), theirs = std_layout(g_from, TAG_HOST_PUT);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k)
        nvshmem_putmem(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len, g_peer);
    nvshmem_quiet();
    nvshmem_barrier_all();
    check_dst(theirs, "nvshmem_putmem");
    nvshmem_barrier_all();

    mine = std_layout(g_pe, TAG_HOST_GET);
    theirs = std_layout(g_peer, TAG_HOST_GET);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k)
        nvshmem_getmem(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len, g_peer);
    check_dst(theirs, "nvshmem_getmem");  // blocking get: the data is here on return
    nvshmem_barrier_all();
}

void case_host_putget_nbi() {
    Layout mine = std_layout(g_pe, TAG_HOST_PUT_NBI), theirs = std_layout(g_from, TAG_HOST_PUT_NBI);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k)  // all sizes outstanding at once
        nvshmem_putmem_nbi(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len, g_peer);
    nvshmem_quiet();
    nvshmem_barrier_all();
    check_dst(theirs, "nvshmem_putmem_nbi + nvshmem_quiet");
    nvshmem_barrier_all();

    mine = std_layout(g_pe, TAG_HOST_GET_NBI);
    theirs = std_layout(g_peer, TAG_HOST_GET_NBI);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k)
        nvshmem_getmem_nbi(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len, g_peer);
    nvshmem_quiet();
    check_dst(theirs, "nvshmem_getmem_nbi + nvshmem_quiet");
    nvshmem_barrier_all();
}

void case_stream_putget() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Layout mine = std_layout(g_pe, TAG_STREAM_PUT), theirs = std_layout(g_from, TAG_STREAM_PUT);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k) {
        if (k & 1)
            nvshmemx_putmem_nbi_on_stream(g_dst + mine.r[k].off, g_src + mine.r[k].off,
                                          mine.r[k].len, g_peer, s);
        else
            nvshmemx_putmem_on_stream(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len,
                                      g_peer, s);
    }
    nvshmemx_quiet_on_stream(s);
    CK(cudaStreamSynchronize(s));
    nvshmem_barrier_all();
    check_dst(theirs, "nvshmemx_putmem[_nbi]_on_stream + nvshmemx_quiet_on_stream");
    nvshmem_barrier_all();

    mine = std_layout(g_pe, TAG_STREAM_GET);
    theirs = std_layout(g_peer, TAG_STREAM_GET);
    prepare(mine);
    for (int k = 0; k < mine.n; ++k) {
        if (k & 1)
            nvshmemx_getmem_nbi_on_stream(g_dst + mine.r[k].off, g_src + mine.r[k].off,
                                          mine.r[k].len, g_peer, s);
        else
            nvshmemx_getmem_on_stream(g_dst + mine.r[k].off, g_src + mine.r[k].off, mine.r[k].len,
                                      g_peer, s);
    }
    nvshmemx_quiet_on_stream(s);
    CK(cudaStreamSynchronize(s));
    check_dst(theirs, "nvshmemx_getmem[_nbi]_on_stream + nvshmemx_quiet_on_stream");
    nvshmem_barrier_all();
    CK(cudaStreamDestroy(s));
}

// ---------------------------------------------------------------------------------------------
// Single elements: host p, device p, device g (32- and 64-bit)
// ---------------------------------------------------------------------------------------------
const int kPG = 256;

__host__ __device__ int pg_int(int pe, int j, int variant) {
    return (int)(0x01000000 * (variant + 1) + 0x10000 * (pe + 1) + 3 * j + 1);
}
__host__ __device__ uint64_t pg_u64(int pe, int j, int variant) {
    return 0xA500000000000000ULL ^ ((uint64_t)(variant + 1) << 48) ^ ((uint64_t)(pe + 1) << 40) ^
           ((uint64_t)j << 20) ^ (uint64_t)(j * 7 + 5);
}

__global__ void dev_p_kernel(int *ai, uint64_t *au, int n, int me, int peer) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        nvshmem_int_p(ai + j, pg_int(me, j, 1), peer);
        nvshmem_uint64_p(au + j, pg_u64(me, j, 1), peer);
    }
    nvshmem_quiet();
}

__global__ void dev_g_kernel(const int *ai, const uint64_t *au, int n, int peer, int *oi,
                             uint64_t *ou) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        oi[j] = nvshmem_int_g(ai + j, peer);
        ou[j] = nvshmem_uint64_g(au + j, peer);
    }
}

void case_p_g() {
    int *ai = (int *)g_misc;                    // kPG ints, followed by a guard
    uint64_t *au = (uint64_t *)(g_misc + 4096);  // kPG uint64, followed by a guard
    std::vector<int> hi(kPG + 16);
    std::vector<uint64_t> hu(kPG + 16);

    for (int variant = 0; variant < 2; ++variant) {  // 0: host nvshmem_*_p, 1: device nvshmem_*_p
        CK(cudaMemset(ai, 0xFF, (kPG + 16) * sizeof(int)));
        CK(cudaMemset(au, 0xFF, (kPG + 16) * sizeof(uint64_t)));
        CK(cudaDeviceSynchronize());
        nvshmem_barrier_all();
        if (variant == 0) {
            for (int j = 0; j < kPG; ++j) {
                nvshmem_int_p(ai + j, pg_int(g_pe, j, 0), g_peer);
                nvshmem_uint64_p(au + j, pg_u64(g_pe, j, 0), g_peer);
            }
            nvshmem_quiet();
        } else {
            dev_p_kernel<<<kPG / 64, 64>>>(ai, au, kPG, g_pe, g_peer);
            CK_LAUNCH();
            CK(cudaDeviceSynchronize());
        }
        nvshmem_barrier_all();
        CK(cudaMemcpy(hi.data(), ai, hi.size() * sizeof(int), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hu.data(), au, hu.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        const char *api = variant == 0 ? "host nvshmem_{int,uint64}_p" : "device nvshmem_{int,uint64}_p";
        int bad = 0;
        for (int j = 0; j < kPG + 16; ++j) {
            int wi = j < kPG ? pg_int(g_from, j, variant) : -1;
            uint64_t wu = j < kPG ? pg_u64(g_from, j, variant) : ~0ULL;
            if (hi[j] != wi && bad++ < 4)
                failf("%s: int element %d = 0x%08x, want 0x%08x%s", api, j, (unsigned)hi[j],
                      (unsigned)wi, j >= kPG ? " (guard)" : "");
            if (hu[j] != wu && bad++ < 4)
                failf("%s: uint64 element %d = 0x%016llx, want 0x%016llx%s", api, j,
                      (unsigned long long)hu[j], (unsigned long long)wu, j >= kPG ? " (guard)" : "");
        }
        nvshmem_barrier_all();
    }

    // Device g: each PE publishes its own values, then reads the peer's.
    for (int j = 0; j < kPG; ++j) {
        hi[j] = pg_int(g_pe, j, 2);
        hu[j] = pg_u64(g_pe, j, 2);
    }
    CK(cudaMemcpy(ai, hi.data(), kPG * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(au, hu.data(), kPG * sizeof(uint64_t), cudaMemcpyHostToDevice));
    int *oi = (int *)g_local;
    uint64_t *ou = (uint64_t *)(g_local + 4096);
    CK(cudaMemset(oi, 0, kPG * sizeof(int)));
    CK(cudaMemset(ou, 0, kPG * sizeof(uint64_t)));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    dev_g_kernel<<<kPG / 64, 64>>>(ai, au, kPG, g_peer, oi, ou);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hi.data(), oi, kPG * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hu.data(), ou, kPG * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int j = 0; j < kPG; ++j) {
        if (hi[j] != pg_int(g_peer, j, 2) && bad++ < 4)
            failf("device nvshmem_int_g: element %d = 0x%08x, want 0x%08x", j, (unsigned)hi[j],
                  (unsigned)pg_int(g_peer, j, 2));
        if (hu[j] != pg_u64(g_peer, j, 2) && bad++ < 4)
            failf("device nvshmem_uint64_g: element %d = 0x%016llx, want 0x%016llx", j,
                  (unsigned long long)hu[j], (unsigned long long)pg_u64(g_peer, j, 2));
    }
    nvshmem_barrier_all();
}

// ---------------------------------------------------------------------------------------------
// Strided iput / iget (host). NVSHMEM 3.4.5 forwards only unit strides to a remote transport
// (strided host RMA to an unmapped peer is "NOT IMPLEMENTED" and exits, the device versions
// assert), so strides > 1 are used only when the peer is mapped (P2P).
// ---------------------------------------------------------------------------------------------
void case_iput_iget() {
    const bool mapped = nvshmem_ptr(g_dst, g_peer) != nullptr;
    const ptrdiff_t dst_st = mapped ? 3 : 1, src_st = mapped ? 2 : 1;
    if (g_pe == 0 && !mapped)
        printf("  note: iput_iget: peer not mapped (remote transport): NVSHMEM 3.4.5 forwards only "
               "unit strides to a remote transport, so unit strides are tested\n");
    const int n = 1000;
    const size_t dst_elems = (size_t)n * dst_st + 32;
    for (int dir = 0; dir < 2; ++dir) {        // 0: iput, 1: iget
        for (int width = 0; width < 2; ++width) {  // 0: nvshmem_int_*, 1: nvshmem_*64
            const size_t es = width == 0 ? 4 : 8;
            std::vector<uint8_t> hsrc((size_t)n * src_st * es + 64, 0x3C), hdst(dst_elems * es);
            auto val = [&](int pe, int j) -> uint64_t {
                return pg_u64(pe, j, 10 + dir * 2 + width);
            };
            for (int j = 0; j < n; ++j) {
                uint64_t v = val(g_pe, j);
                memcpy(&hsrc[(size_t)j * src_st * es], &v, es);  // little-endian low bytes
            }
            CK(cudaMemcpy(g_src, hsrc.data(), hsrc.size(), cudaMemcpyHostToDevice));
            CK(cudaMemset(g_dst, kSentinel, dst_elems * es));
            CK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            if (dir == 0) {
                if (width == 0)
                    nvshmem_int_iput((int *)g_dst, (const int *)g_src, dst_st, src_st, n, g_peer);
                else
                    nvshmem_iput64(g_dst, g_src, dst_st, src_st, n, g_peer);
                nvshmem_quiet();
                nvshmem_barrier_all();
            } else {
                if (width == 0)
                    nvshmem_int_iget((int *)g_dst, (const int *)g_src, dst_st, src_st, n, g_peer);
                else
                    nvshmem_iget64(g_dst, g_src, dst_st, src_st, n, g_peer);
            }
            CK(cudaMemcpy(hdst.data(), g_dst, hdst.size(), cudaMemcpyDeviceToHost));
            const char *api = dir == 0 ? (width == 0 ? "nvshmem_int_iput" : "nvshmem_iput64")
                                       : (width == 0 ? "nvshmem_int_iget" : "nvshmem_iget64");
            int bad = 0;
            for (size_t e = 0; e < dst_elems; ++e) {
                uint8_t want[8];
                if (e % (size_t)dst_st == 0 && e / (size_t)dst_st < (size_t)n) {
                    uint64_t v = val(dir == 0 ? g_from : g_peer, (int)(e / (size_t)dst_st));
                    memcpy(want, &v, es);
                } else {
                    memset(want, kSentinel, es);
                }
                if (memcmp(want, &hdst[e * es], es) != 0 && bad++ < 4) {
                    uint64_t got = 0, w = 0;
                    memcpy(&got, &hdst[e * es], es);
                    memcpy(&w, want, es);
                    failf("%s (dst stride %td, src stride %td): element slot %zu = 0x%llx, want "
                          "0x%llx",
                          api, dst_st, src_st, e, (unsigned long long)got, (unsigned long long)w);
                }
            }
            nvshmem_barrier_all();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Device-initiated RMA at thread, warp and block scope
// ---------------------------------------------------------------------------------------------
// Thread scope: thread k handles region k; even threads blocking get, odd threads get_nbi.
__global__ void dev_put_thread_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    int k = threadIdx.x;
    if (k < L.n) nvshmem_putmem_nbi(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
    if (k < L.n) nvshmem_quiet();
}
__global__ void dev_get_thread_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    int k = threadIdx.x;
    if (k < L.n) {
        if (k & 1) {
            nvshmem_getmem_nbi(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
            nvshmem_quiet();
        } else {
            nvshmem_getmem(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
        }
    }
}
// Warp scope: warp w handles regions k with k % nwarps == w.
__global__ void dev_put_warp_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    int w = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int k = w; k < L.n; k += nw)
        nvshmemx_putmem_nbi_warp(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) nvshmem_quiet();
    __syncwarp();
}
__global__ void dev_get_warp_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    int w = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int k = w; k < L.n; k += nw) {
        if (k & 1)
            nvshmemx_getmem_nbi_warp(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
        else
            nvshmemx_getmem_warp(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
    }
    __syncwarp();
    if ((threadIdx.x & 31) == 0) nvshmem_quiet();
    __syncwarp();
}
// Block scope: block b handles regions k with k % gridDim.x == b.
__global__ void dev_put_block_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    for (int k = blockIdx.x; k < L.n; k += gridDim.x)
        nvshmemx_putmem_nbi_block(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    __syncthreads();
}
__global__ void dev_get_block_kernel(uint8_t *dst, const uint8_t *src, Layout L, int peer) {
    for (int k = blockIdx.x; k < L.n; k += gridDim.x) {
        if (k & 1)
            nvshmemx_getmem_nbi_block(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
        else
            nvshmemx_getmem_block(dst + L.r[k].off, src + L.r[k].off, L.r[k].len, peer);
    }
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    __syncthreads();
}

enum Scope { SCOPE_THREAD, SCOPE_WARP, SCOPE_BLOCK };

void dev_putget(Scope sc, uint32_t tag_put, uint32_t tag_get) {
    const char *names[3][2] = {
        {"device nvshmem_putmem_nbi + nvshmem_quiet (thread)",
         "device nvshmem_getmem / nvshmem_getmem_nbi + nvshmem_quiet (thread)"},
        {"device nvshmemx_putmem_nbi_warp + nvshmem_quiet",
         "device nvshmemx_getmem_warp / nvshmemx_getmem_nbi_warp + nvshmem_quiet"},
        {"device nvshmemx_putmem_nbi_block + nvshmem_quiet",
         "device nvshmemx_getmem_block / nvshmemx_getmem_nbi_block + nvshmem_quiet"}};
    for (int dir = 0; dir < 2; ++dir) {
        uint32_t tag = dir == 0 ? tag_put : tag_get;
        Layout mine = std_layout(g_pe, tag), theirs = std_layout(dir == 0 ? g_from : g_peer, tag);
        prepare(mine);
        if (sc == SCOPE_THREAD) {
            if (dir == 0) dev_put_thread_kernel<<<1, 32>>>(g_dst, g_src, mine, g_peer);
            else dev_get_thread_kernel<<<1, 32>>>(g_dst, g_src, mine, g_peer);
        } else if (sc == SCOPE_WARP) {
            if (dir == 0) dev_put_warp_kernel<<<1, 96>>>(g_dst, g_src, mine, g_peer);
            else dev_get_warp_kernel<<<1, 96>>>(g_dst, g_src, mine, g_peer);
        } else {
            if (dir == 0) dev_put_block_kernel<<<2, 256>>>(g_dst, g_src, mine, g_peer);
            else dev_get_block_kernel<<<2, 256>>>(g_dst, g_src, mine, g_peer);
        }
        CK_LAUNCH();
        CK(cudaDeviceSynchronize());
        if (dir == 0) nvshmem_barrier_all();  // the peer's puts into my g_dst are complete
        check_dst(theirs, names[sc][dir]);
        nvshmem_barrier_all();
    }
}

void case_dev_putget_thread() { dev_putget(SCOPE_THREAD, TAG_DEV_PUT_THREAD, TAG_DEV_GET_THREAD); }
void case_dev_putget_warp() { dev_putget(SCOPE_WARP, TAG_DEV_PUT_WARP, TAG_DEV_GET_WARP); }
void case_dev_putget_block() { dev_putget(SCOPE_BLOCK, TAG_DEV_PUT_BLOCK, TAG_DEV_GET_BLOCK); }

// ---------------------------------------------------------------------------------------------
// AMOs: every kind, exact fetched and final values, guard words around every target
// ---------------------------------------------------------------------------------------------
#define GT_AMO_WRAPPERS(NAME, T)                                                                  \
    __device__ inline T amo_fetch(T *d, int pe) { return nvshmem_##NAME##_atomic_fetch(d, pe); }  \
    __device__ inline void amo_set(T *d, T v, int pe) { nvshmem_##NAME##_atomic_set(d, v, pe); } \
    __device__ inline T amo_cswap(T *d, T c, T v, int pe) {                                       \
        return nvshmem_##NAME##_atomic_compare_swap(d, c, v, pe);                                 \
    }                                                                                             \
    __device__ inline T amo_swap(T *d, T v, int pe) { return nvshmem_##NAME##_atomic_swap(d, v, pe); } \
    __device__ inline T amo_finc(T *d, int pe) { return nvshmem_##NAME##_atomic_fetch_inc(d, pe); } \
    __device__ inline void amo_inc(T *d, int pe) { nvshmem_##NAME##_atomic_inc(d, pe); }         \
    __device__ inline T amo_fadd(T *d, T v, int pe) {                                             \
        return nvshmem_##NAME##_atomic_fetch_add(d, v, pe);                                       \
    }                                                                                             \
    __device__ inline void amo_add(T *d, T v, int pe) { nvshmem_##NAME##_atomic_add(d, v, pe); } \
    __device__ inline T amo_fand(T *d, T v, int pe) {                                             \
        return nvshmem_##NAME##_atomic_fetch_and(d, v, pe);                                       \
    }                                                                                             \
    __device__ inline void amo_and(T *d, T v, int pe) { nvshmem_##NAME##_atomic_and(d, v, pe); } \
    __device__ inline T amo_for(T *d, T v, int pe) { return nvshmem_##NAME##_atomic_fetch_or(d, v, pe); } \
    __device__ inline void amo_or(T *d, T v, int pe) { nvshmem_##NAME##_atomic_or(d, v, pe); }   \
    __device__ inline T amo_fxor(T *d, T v, int pe) {                                             \
        return nvshmem_##NAME##_atomic_fetch_xor(d, v, pe);                                       \
    }                                                                                             \
    __device__ inline void amo_xor(T *d, T v, int pe) { nvshmem_##NAME##_atomic_xor(d, v, pe); }

GT_AMO_WRAPPERS(uint32, uint32_t)
GT_AMO_WRAPPERS(uint64, uint64_t)
GT_AMO_WRAPPERS(int32, int32_t)

const int kAmoSlots = 14;                // one target per AMO kind
const int kAmoElems = 2 * kAmoSlots + 1;  // guard, slot, guard, slot, ..., guard
const int kAmoRets = 12 + kAmoSlots;

template <typename T>
struct AmoArgs {
    T init[kAmoSlots];
    T top;  // highest bit only
    T V1, V2, W1, W2, D1, D2, D3, M1, M2, M3, O1, O2, O3, X1, X2, X3;
};

template <typename T>
T trunc_to(uint64_t x) {
    using U = typename std::make_unsigned<T>::type;
    return (T)(U)x;
}
template <typename T>
T wrap_add(T a, T b) {
    using U = typename std::make_unsigned<T>::type;
    return (T)(U)((U)a + (U)b);
}
template <typename T>
uint64_t as_u64(T v) {
    using U = typename std::make_unsigned<T>::type;
    return (uint64_t)(U)v;
}
template <typename T>
T guard_value(int j) {
    return trunc_to<T>(0xA5A5A5A5A5A5A5A5ULL ^ ((uint64_t)j * 0x0101010101010101ULL));
}

template <typename T>
AmoArgs<T> amo_args() {
    AmoArgs<T> a;
    const uint64_t init[kAmoSlots] = {
        0x0123456789ABCDEFULL,  // 0 fetch
        0xFEDCBA9876543210ULL,  // 1 set
        0x1111111122222222ULL,  // 2 compare_swap
        0x0F0F0F0F0F0F0F0FULL,  // 3 swap
        0x00000000FFFFFFFFULL,  // 4 fetch_inc (carries into the high half / wraps at 32 bits)
        0x00000000FFFFFFFEULL,  // 5 inc x3
        0x7FFFFFFFFFFFFFF0ULL,  // 6 fetch_add
        0x00000001FFFFFFFFULL,  // 7 add x2
        0xF0F0F0F0F0F0F0F0ULL,  // 8 fetch_and
        0xFFFFFFFFFFFFFFFFULL,  // 9 and x2
        0x0000FFFF00000000ULL,  // 10 fetch_or
        0x1000000000000010ULL,  // 11 or x2
        0xDEADBEEFCAFEBABEULL,  // 12 fetch_xor x2
        0x5555555555555555ULL,  // 13 xor
    };
    for (int s = 0; s < kAmoSlots; ++s) a.init[s] = trunc_to<T>(init[s]);
    a.top = trunc_to<T>(1ULL << (8 * sizeof(T) - 1));
    a.V1 = trunc_to<T>(0x5A5A5A5AC3C3C3C3ULL);
    a.V2 = trunc_to<T>(0x3333333344444444ULL);
    a.W1 = trunc_to<T>(0xAAAAAAAA55555555ULL);
    a.W2 = trunc_to<T>(0x0000000123456789ULL);
    a.D1 = trunc_to<T>(0x20ULL);
    a.D2 = trunc_to<T>(~0ULL);  // -1
    a.D3 = trunc_to<T>(0x0000000100000001ULL);
    a.M1 = trunc_to<T>(0x3C3C3C3CFFFF0000ULL);
    a.M2 = trunc_to<T>(0x0123456789ABCDEFULL);
    a.M3 = trunc_to<T>(0xFFFF0000FFFF00FFULL);
    a.O1 = trunc_to<T>(0x8000000180000001ULL);
    a.O2 = trunc_to<T>(0x0000000100000002ULL);
    a.O3 = trunc_to<T>(0x4000000000000400ULL);
    a.X1 = trunc_to<T>(0xFFFF0000FFFF0000ULL);
    a.X2 = trunc_to<T>(0x0000FFFF0000FFFFULL);
    a.X3 = trunc_to<T>(0xFFFFFFFFFFFFFFFFULL);
    return a;
}

// Expected values of the slots after the kernel, and of the values it fetched.
template <typename T>
void amo_expected(const AmoArgs<T> &a, T fin[kAmoSlots], T ret[kAmoRets]) {
    const T *I = a.init;
    fin[0] = I[0];
    fin[1] = a.V1;
    fin[2] = a.V2;
    fin[3] = a.W2;
    fin[4] = wrap_add<T>(I[4], (T)1);
    fin[5] = wrap_add<T>(I[5], (T)3);
    fin[6] = wrap_add<T>(wrap_add<T>(I[6], a.D1), a.D2);
    fin[7] = wrap_add<T>(wrap_add<T>(I[7], a.D3), a.D3);
    fin[8] = (T)(I[8] & a.M1);
    fin[9] = (T)(I[9] & a.M2 & a.M3);
    fin[10] = (T)(I[10] | a.O1);
    fin[11] = (T)(I[11] | a.O2 | a.O3);
    fin[12] = (T)(I[12] ^ a.X1 ^ a.X2);
    fin[13] = (T)(I[13] ^ a.X3);
    ret[0] = I[0];                       // fetch
    ret[1] = I[2];                       // compare_swap, condition differs in the top bit: no swap
    ret[2] = I[2];                       // compare_swap, condition matches: swap
    ret[3] = I[3];                       // swap W1
    ret[4] = a.W1;                       // swap W2
    ret[5] = I[4];                       // fetch_inc
    ret[6] = I[6];                       // fetch_add D1
    ret[7] = wrap_add<T>(I[6], a.D1);    // fetch_add D2
    ret[8] = I[8];                       // fetch_and
    ret[9] = I[10];                      // fetch_or
    ret[10] = I[12];                     // fetch_xor X1
    ret[11] = (T)(I[12] ^ a.X1);         // fetch_xor X2
    for (int s = 0; s < kAmoSlots; ++s) ret[12 + s] = fin[s];  // fetch of every slot after quiet
}

const char *kAmoSlotNames[kAmoSlots] = {"fetch",     "set",     "compare_swap", "swap",
                                        "fetch_inc", "inc",     "fetch_add",    "add",
                                        "fetch_and", "and",     "fetch_or",     "or",
                                        "fetch_xor", "xor"};
const char *kAmoRetNames[12] = {"fetch",         "compare_swap (no match)", "compare_swap (match)",
                                "swap #1",       "swap #2",                 "fetch_inc",
                                "fetch_add #1",  "fetch_add #2",            "fetch_and",
                                "fetch_or",      "fetch_xor #1",            "fetch_xor #2"};

template <typename T>
__global__ void amo_kernel(T *buf, AmoArgs<T> a, int tp, T *R) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
#define SLOT(i) (buf + 2 * (i) + 1)
    R[0] = amo_fetch(SLOT(0), tp);
    amo_set(SLOT(1), a.V1, tp);
    R[1] = amo_cswap(SLOT(2), (T)(a.init[2] ^ a.top), a.V2, tp);
    R[2] = amo_cswap(SLOT(2), a.init[2], a.V2, tp);
    R[3] = amo_swap(SLOT(3), a.W1, tp);
    R[4] = amo_swap(SLOT(3), a.W2, tp);
    R[5] = amo_finc(SLOT(4), tp);
    amo_inc(SLOT(5), tp);
    amo_inc(SLOT(5), tp);
    amo_inc(SLOT(5), tp);
    R[6] = amo_fadd(SLOT(6), a.D1, tp);
    R[7] = amo_fadd(SLOT(6), a.D2, tp);
    amo_add(SLOT(7), a.D3, tp);
    amo_add(SLOT(7), a.D3, tp);
    R[8] = amo_fand(SLOT(8), a.M1, tp);
    amo_and(SLOT(9), a.M2, tp);
    amo_and(SLOT(9), a.M3, tp);
    R[9] = amo_for(SLOT(10), a.O1, tp);
    amo_or(SLOT(11), a.O2, tp);
    amo_or(SLOT(11), a.O3, tp);
    R[10] = amo_fxor(SLOT(12), a.X1, tp);
    R[11] = amo_fxor(SLOT(12), a.X2, tp);
    amo_xor(SLOT(13), a.X3, tp);
    nvshmem_quiet();
    for (int s = 0; s < kAmoSlots; ++s) R[12 + s] = amo_fetch(SLOT(s), tp);
#undef SLOT
}

template <typename T>
void amo_run(const char *tname, bool self) {
    const int tp = self ? g_pe : g_peer;  // target PE; my buffer is changed by g_from (or me)
    AmoArgs<T> a = amo_args<T>();
    T fin[kAmoSlots], ret[kAmoRets];
    amo_expected<T>(a, fin, ret);

    T *buf = (T *)g_misc;
    T *R = (T *)g_local;
    std::vector<T> h(kAmoElems);
    for (int j = 0; j < kAmoElems; ++j) h[j] = (j & 1) ? a.init[j / 2] : guard_value<T>(j);
    CK(cudaMemcpy(buf, h.data(), kAmoElems * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemset(R, 0, kAmoRets * sizeof(T)));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    amo_kernel<T><<<1, 1>>>(buf, a, tp, R);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    const char *where = self ? "own PE" : "peer";
    std::vector<T> r(kAmoRets);
    CK(cudaMemcpy(r.data(), R, kAmoRets * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < kAmoRets; ++i) {
        if (r[i] == ret[i]) continue;
        if (i < 12)
            failf("%s %s on %s returned 0x%llx, want 0x%llx", tname, kAmoRetNames[i], where,
                  (unsigned long long)as_u64(r[i]), (unsigned long long)as_u64(ret[i]));
        else
            failf("%s fetch of the '%s' target after quiet returned 0x%llx, want 0x%llx", tname,
                  kAmoSlotNames[i - 12], (unsigned long long)as_u64(r[i]),
                  (unsigned long long)as_u64(ret[i]));
    }
    CK(cudaMemcpy(h.data(), buf, kAmoElems * sizeof(T), cudaMemcpyDeviceToHost));
    for (int j = 0; j < kAmoElems; ++j) {
        T want = (j & 1) ? fin[j / 2] : guard_value<T>(j);
        if (h[j] == want) continue;
        if (j & 1)
            failf("%s '%s' target (applied by %s) holds 0x%llx, want 0x%llx", tname,
                  kAmoSlotNames[j / 2], self ? "this PE" : "the peer",
                  (unsigned long long)as_u64(h[j]), (unsigned long long)as_u64(want));
        else
            failf("%s guard word %d (next to the '%s' target) changed to 0x%llx, want 0x%llx",
                  tname, j, kAmoSlotNames[(j > 0 ? j - 1 : 0) / 2], (unsigned long long)as_u64(h[j]),
                  (unsigned long long)as_u64(want));
    }
    nvshmem_barrier_all();
}

void case_amo_u32() { amo_run<uint32_t>("nvshmem_uint32_atomic_*", false); }
void case_amo_u64() { amo_run<uint64_t>("nvshmem_uint64_atomic_*", false); }
void case_amo_i32() { amo_run<int32_t>("nvshmem_int32_atomic_*", false); }
void case_amo_self() {
    amo_run<uint32_t>("nvshmem_uint32_atomic_*", true);
    amo_run<uint64_t>("nvshmem_uint64_atomic_*", true);
}

// Contention: every thread of every PE hits counters on PE 0 and PE 1.
struct Counters {
    uint64_t g0;
    uint64_t c64;  // on PE 0: fetch_add(1) by everyone; fetched values must be a permutation
    uint64_t g1;
    uint64_t a64;  // on PE 1: add(3) by everyone
    uint64_t g2;
    uint32_t g3;
    uint32_t c32;  // on PE 1: fetch_inc by everyone; fetched values must be a permutation
    uint32_t g4;
    uint32_t i32;  // on PE 0: inc by everyone
    uint32_t g5;
    uint32_t pad;
};
const int kContBlocks = 4, kContThreads = 64;

__global__ void contention_kernel(Counters *c, uint64_t *retA, uint32_t *retB) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    retA[t] = nvshmem_uint64_atomic_fetch_add(&c->c64, 1, 0);
    retB[t] = nvshmem_uint32_atomic_fetch_inc(&c->c32, 1);
    nvshmem_uint64_atomic_add(&c->a64, 3, 1);
    nvshmem_uint32_atomic_inc(&c->i32, 0);
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

void case_amo_contention() {
    const int per_pe = kContBlocks * kContThreads;
    const uint64_t total = (uint64_t)per_pe * (uint64_t)g_npes;
    Counters *c = (Counters *)g_misc;
    Counters h;
    memset(&h, 0, sizeof h);
    h.g0 = 0x1111111111111111ULL;
    h.g1 = 0x2222222222222222ULL;
    h.g2 = 0x3333333333333333ULL;
    h.g3 = 0x44444444U;
    h.g4 = 0x55555555U;
    h.g5 = 0x66666666U;
    const Counters guards = h;
    CK(cudaMemcpy(c, &h, sizeof h, cudaMemcpyHostToDevice));
    uint64_t *retA = (uint64_t *)g_local;
    uint32_t *retB = (uint32_t *)(g_local + per_pe * sizeof(uint64_t));
    CK(cudaMemset(retA, 0xFF, per_pe * sizeof(uint64_t)));
    CK(cudaMemset(retB, 0xFF, per_pe * sizeof(uint32_t)));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    contention_kernel<<<kContBlocks, kContThreads>>>(c, retA, retB);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    CK(cudaMemcpy(&h, c, sizeof h, cudaMemcpyDeviceToHost));
    const bool on0 = g_pe == 0, on1 = g_pe == 1;
    uint64_t want_c64 = on0 ? total : 0, want_a64 = on1 ? 3 * total : 0;
    uint32_t want_c32 = on1 ? (uint32_t)total : 0, want_i32 = on0 ? (uint32_t)total : 0;
    EXPECT(h.c64 == want_c64, "uint64 fetch_add counter = %llu, want %llu",
           (unsigned long long)h.c64, (unsigned long long)want_c64);
    EXPECT(h.a64 == want_a64, "uint64 add(3) counter = %llu, want %llu", (unsigned long long)h.a64,
           (unsigned long long)want_a64);
    EXPECT(h.c32 == want_c32, "uint32 fetch_inc counter = %u, want %u", h.c32, want_c32);
    EXPECT(h.i32 == want_i32, "uint32 inc counter = %u, want %u", h.i32, want_i32);
    EXPECT(h.g0 == guards.g0 && h.g1 == guards.g1 && h.g2 == guards.g2 && h.g3 == guards.g3 &&
               h.g4 == guards.g4 && h.g5 == guards.g5,
           "guard words next to the counters changed");

    // Fetched values from all PEs together must be exactly {0, ..., total-1}.
    std::vector<uint64_t> a((size_t)per_pe), all_a(total);
    std::vector<uint32_t> b((size_t)per_pe), all_b(total);
    CK(cudaMemcpy(a.data(), retA, per_pe * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), retB, per_pe * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    job_allgather(a.data(), all_a.data(), per_pe * sizeof(uint64_t));
    job_allgather(b.data(), all_b.data(), per_pe * sizeof(uint32_t));
    if (g_pe == 0) {
        std::vector<int> seen_a(total, 0), seen_b(total, 0);
        uint64_t out_a = 0, dup_a = 0, out_b = 0, dup_b = 0;
        for (uint64_t i = 0; i < total; ++i) {
            if (all_a[i] >= total) ++out_a;
            else if (seen_a[all_a[i]]++) ++dup_a;
            if (all_b[i] >= total) ++out_b;
            else if (seen_b[all_b[i]]++) ++dup_b;
        }
        EXPECT(out_a == 0 && dup_a == 0,
               "uint64 fetch_add results are not a permutation of 0..%llu: %llu out of range, "
               "%llu duplicates",
               (unsigned long long)(total - 1), (unsigned long long)out_a,
               (unsigned long long)dup_a);
        EXPECT(out_b == 0 && dup_b == 0,
               "uint32 fetch_inc results are not a permutation of 0..%llu: %llu out of range, "
               "%llu duplicates",
               (unsigned long long)(total - 1), (unsigned long long)out_b,
               (unsigned long long)dup_b);
    }
    nvshmem_barrier_all();
}

// ---------------------------------------------------------------------------------------------
// put with signal: SET (one signal per message) and ADD (one counter for all messages)
// ---------------------------------------------------------------------------------------------
const size_t kSigSizes[] = {1, 8, 4096, 65536, 1u << 20, 7, 4u << 20, 256};
const int kSigRounds = (int)(sizeof kSigSizes / sizeof kSigSizes[0]);
const uint64_t kSigMagic = 0x5151000000000000ULL;

struct SigOut {
    unsigned int timeouts;
    unsigned int bad_signal;  // a value that can never be right was seen
    unsigned int bad_wait_ret;
    int round;                // round of the first problem
    unsigned long long seen;  // signal value at the first problem
    unsigned long long bad[kMaxRegions];
    unsigned long long first[kMaxRegions];
};

__global__ void sig_send_set_kernel(uint8_t *dst, const uint8_t *src, Layout L, uint64_t *sig,
                                    int peer) {
    if (threadIdx.x != 0) return;
    for (int r = 0; r < L.n; ++r)
        nvshmem_putmem_signal_nbi(dst + L.r[r].off, src + L.r[r].off, L.r[r].len, sig + r,
                                  kSigMagic + (uint64_t)r, NVSHMEM_SIGNAL_SET, peer);
    nvshmem_quiet();
}

__global__ void sig_send_add_kernel(uint8_t *dst, const uint8_t *src, Layout L, uint64_t *sig,
                                    int peer) {
    for (int r = 0; r < L.n; ++r)
        nvshmemx_putmem_signal_nbi_block(dst + L.r[r].off, src + L.r[r].off, L.r[r].len, sig,
                                         (uint64_t)(r + 1), NVSHMEM_SIGNAL_ADD, peer);
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

// Waits (bounded) for each signal, then checks the data of that message right away.
__global__ void sig_recv_kernel(const uint8_t *dst, Layout L, uint64_t *sig, int mode_add,
                                uint64_t timeout_ns, SigOut *out) {
    __shared__ int ok;
    const int steps = mode_add ? 1 : L.n;
    const uint64_t add_total = (uint64_t)L.n * (uint64_t)(L.n + 1) / 2;
    for (int step = 0; step < steps; ++step) {
        if (threadIdx.x == 0) {
            uint64_t *s = mode_add ? sig : sig + step;
            const uint64_t want = mode_add ? add_total : kSigMagic + (uint64_t)step;
            const uint64_t t0 = dev_now_ns();
            int good = 1;
            for (;;) {
                uint64_t v = nvshmem_signal_fetch(s);
                if (v == want) break;
                if ((!mode_add && v != 0) || (mode_add && v > want)) {
                    if (atomicAdd(&out->bad_signal, 1u) == 0) {
                        out->round = step;
                        out->seen = v;
                    }
                    good = 0;
                    break;
                }
                if (dev_now_ns() - t0 > timeout_ns) {
                    atomicAdd(&out->timeouts, 1u);
                    out->round = step;
                    out->seen = v;
                    good = 0;
                    break;
                }
            }
            if (good) {
                // Returns at once (the condition holds) and orders the data reads after it.
                uint64_t got = nvshmem_signal_wait_until(s, NVSHMEM_CMP_EQ, want);
                if (got != want) {
                    atomicAdd(&out->bad_wait_ret, 1u);
                    out->round = step;
                    out->seen = got;
                    good = 0;
                }
            }
            ok = good;
        }
        __syncthreads();
        if (!ok) return;
        const int r0 = mode_add ? 0 : step, r1 = mode_add ? L.n : step + 1;
        for (int r = r0; r < r1; ++r) {
            const volatile uint8_t *p = (const volatile uint8_t *)(dst + L.r[r].off);
            for (size_t i = threadIdx.x; i < L.r[r].len; i += blockDim.x) {
                if (p[i] != pat_byte(L.r[r].seed, i)) {
                    atomicAdd(&out->bad[r], 1ULL);
                    atomicMin(&out->first[r], (unsigned long long)i);
                }
            }
        }
        __syncthreads();
    }
}

void case_put_signal() {
    uint64_t *sig = (uint64_t *)g_misc;
    SigOut *dout = (SigOut *)g_local;
    const uint64_t timeout_ns = (uint64_t)(g_wait_s * 1e9);
    for (int mode_add = 0; mode_add < 2; ++mode_add) {
        for (int sender = 0; sender < 2; ++sender) {
            const int receiver = 1 - sender;
            const uint32_t tag = TAG_SIGNAL * 16 + (uint32_t)(mode_add * 2 + sender);
            Layout L = make_layout(kSigSizes, kSigRounds, (uint32_t)sender, tag);
            if (g_pe == sender) fill_layout(g_src, L);
            CK(cudaMemset(g_dst, kSentinel, L.span));
            CK(cudaMemset(sig, 0, 64 * sizeof(uint64_t)));
            SigOut h;
            memset(&h, 0, sizeof h);
            h.round = -1;
            for (int k = 0; k < kMaxRegions; ++k) h.first[k] = ~0ULL;
            CK(cudaMemcpy(dout, &h, sizeof h, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            if (g_pe == sender) {
                if (mode_add) sig_send_add_kernel<<<1, 128>>>(g_dst, g_src, L, sig, receiver);
                else sig_send_set_kernel<<<1, 32>>>(g_dst, g_src, L, sig, receiver);
                CK_LAUNCH();
            } else if (g_pe == receiver) {
                sig_recv_kernel<<<1, 256>>>(g_dst, L, sig, mode_add, timeout_ns, dout);
                CK_LAUNCH();
            }
            CK(cudaDeviceSynchronize());
            const char *api = mode_add ? "nvshmemx_putmem_signal_nbi_block + SIGNAL_ADD"
                                       : "nvshmem_putmem_signal_nbi + SIGNAL_SET";
            if (g_pe == receiver) {  // what the receiver saw, reported before waiting for the sender
                CK(cudaMemcpy(&h, dout, sizeof h, cudaMemcpyDeviceToHost));
                if (h.timeouts)
                    failf("%s from pe %d: signal %s not reached within %.0f s (value 0x%llx)", api,
                          sender, mode_add ? "total" : "of a message", g_wait_s,
                          (unsigned long long)h.seen);
                if (h.bad_signal)
                    failf("%s from pe %d: impossible signal value 0x%llx (step %d)", api, sender,
                          (unsigned long long)h.seen, h.round);
                if (h.bad_wait_ret)
                    failf("%s from pe %d: nvshmem_signal_wait_until returned 0x%llx (step %d)",
                          api, sender, (unsigned long long)h.seen, h.round);
                for (int r = 0; r < L.n; ++r)
                    if (h.bad[r])
                        failf("%s from pe %d: %zu-byte message: %llu bytes wrong when its signal "
                              "was seen, first at +%llu",
                              api, sender, L.r[r].len, h.bad[r], h.first[r]);
            }
            nvshmem_barrier_all();
            if (g_pe == receiver) {  // after the sender's quiet: everything must be in place
                char what[160];
                snprintf(what, sizeof what, "%s from pe %d (after completion)", api, sender);
                check_dst(L, what);
                uint64_t hs[kSigRounds];
                CK(cudaMemcpy(hs, sig, sizeof hs, cudaMemcpyDeviceToHost));
                for (int r = 0; r < kSigRounds; ++r) {
                    uint64_t want = mode_add ? (r == 0 ? (uint64_t)kSigRounds * (kSigRounds + 1) / 2 : 0)
                                             : kSigMagic + (uint64_t)r;
                    EXPECT(hs[r] == want, "%s from pe %d: signal word %d = 0x%llx, want 0x%llx",
                           api, sender, r, (unsigned long long)hs[r], (unsigned long long)want);
                }
            }
            nvshmem_barrier_all();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Barriers (host and device) with a counter that must be visible after each barrier
// ---------------------------------------------------------------------------------------------
const int kBarrierIters = 24;

__global__ void barrier_kernel(int *ctr, int peer, int iters, int *errs) {
    for (int i = 1; i <= iters; ++i) {
        if (threadIdx.x == 0) nvshmem_int_p(ctr, 1000 + i, peer);
        if (i & 1) {
            __syncthreads();
            if (threadIdx.x == 0) nvshmem_barrier_all();
            __syncthreads();
        } else {
            nvshmemx_barrier_all_block();
        }
        if (threadIdx.x == 0) {
            int v = *(volatile int *)ctr;
            if (v != 1000 + i) {
                if (errs[0]++ == 0) {
                    errs[1] = i;
                    errs[2] = v;
                }
            }
        }
        if (i & 1) {
            nvshmemx_barrier_all_block();
        } else {
            __syncthreads();
            if (threadIdx.x == 0) nvshmem_barrier_all();
            __syncthreads();
        }
    }
}

void case_barrier() {
    int *ctr = (int *)g_misc;
    CK(cudaMemset(ctr, 0, 64));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    int bad = 0;
    for (int i = 1; i <= kBarrierIters; ++i) {
        nvshmem_int_p(ctr, i, g_peer);
        nvshmem_barrier_all();
        int v = 0;
        CK(cudaMemcpy(&v, ctr, sizeof v, cudaMemcpyDeviceToHost));
        if (v != i && bad++ < 3)
            failf("host nvshmem_barrier_all: iteration %d: counter written by the peer before the "
                  "barrier reads %d",
                  i, v);
        nvshmem_barrier_all();
    }

    int *errs = (int *)g_local;
    CK(cudaMemset(errs, 0, 3 * sizeof(int)));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    int iters = kBarrierIters, peer = g_peer;
    void *args[] = {&ctr, &peer, &iters, &errs};
    NVCK(nvshmemx_collective_launch((const void *)barrier_kernel, dim3(1), dim3(64), args, 0, 0));
    CK(cudaDeviceSynchronize());
    int h[3];
    CK(cudaMemcpy(h, errs, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 0,
           "device nvshmem_barrier_all / nvshmemx_barrier_all_block: %d of %d iterations saw a "
           "stale counter (first: iteration %d read %d, want %d)",
           h[0], kBarrierIters, h[1], h[2], 1000 + h[1]);
    nvshmem_barrier_all();
}

// ---------------------------------------------------------------------------------------------
// nvshmem_malloc / nvshmem_free cycles, a put into every new (and the previous) allocation
// ---------------------------------------------------------------------------------------------
void put_and_verify(uint8_t *p, size_t sz, uint32_t tag, const char *what) {
    const size_t sizes[1] = {sz};
    Layout mine = make_layout(sizes, 1, (uint32_t)g_pe, tag, false);
    Layout theirs = with_owner(mine, (uint32_t)g_from, tag);
    mine.span = theirs.span = sz;  // the allocation itself, no room for guards
    fill_layout(g_src, mine);
    CK(cudaMemset(p, kSentinel, sz));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    nvshmem_putmem(p, g_src, sz, g_peer);
    nvshmem_quiet();
    nvshmem_barrier_all();
    verify_layout(p, theirs, [&](const char *msg) { failf("%s: %s", what, msg); });
    nvshmem_barrier_all();
}

void case_malloc_free() {
    const size_t sizes[20] = {1,       4096,    100000,  1u << 20, 7,         65536,  3u << 20,
                              16u << 20, 12345, 8,       4u << 20, 4096 * 3 + 5, 2u << 20, 777,
                              256,     8u << 20, 65537,  1u << 16, 5u << 20,  64};
    uint8_t *prev = nullptr;
    size_t prev_sz = 0;
    for (int c = 0; c < 20; ++c) {
        uint8_t *p = (uint8_t *)nvshmem_malloc(sizes[c]);
        long long got_null = p == nullptr ? 1 : 0;
        if (job_max_ll(got_null) != 0) {  // keep all PEs on the same path
            failf("cycle %d: nvshmem_malloc(%zu) returned NULL on %s", c, sizes[c],
                  got_null ? "this PE" : "another PE");
            if (p) nvshmem_free(p);
            break;
        }
        char what[96];
        snprintf(what, sizeof what, "cycle %d: put into new %zu-byte allocation", c, sizes[c]);
        put_and_verify(p, sizes[c], TAG_MALLOC * 64 + (uint32_t)c, what);
        if (prev != nullptr) {
            snprintf(what, sizeof what, "cycle %d: put into the previous %zu-byte allocation", c,
                     prev_sz);
            put_and_verify(prev, prev_sz, TAG_MALLOC * 64 + 32 + (uint32_t)c, what);
            nvshmem_free(prev);
        }
        prev = p;
        prev_sz = sizes[c];
    }
    if (prev != nullptr) nvshmem_free(prev);
    nvshmem_barrier_all();
}

// ---------------------------------------------------------------------------------------------
// Collectives on NVSHMEM_TEAM_WORLD (host and on-stream)
// ---------------------------------------------------------------------------------------------
void case_collectives() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int roots = std::min(g_npes, 2);

    // broadcastmem
    const size_t bsizes[] = {8, 65536 + 3, 1u << 20};
    for (int on_stream = 0; on_stream < 2; ++on_stream) {
        for (int root = 0; root < roots; ++root) {
            for (int k = 0; k < 3; ++k) {
                const uint32_t tag = TAG_BCAST * 64 + (uint32_t)(on_stream * 16 + root * 4 + k);
                const size_t one[1] = {bsizes[k]};
                Layout mine = make_layout(one, 1, (uint32_t)g_pe, tag, false);
                Layout rootl = with_owner(mine, (uint32_t)root, tag);
                fill_layout(g_src, mine);
                CK(cudaMemset(g_dst, kSentinel, mine.span));
                CK(cudaDeviceSynchronize());
                nvshmem_barrier_all();
                if (on_stream) {
                    NVCK(nvshmemx_broadcastmem_on_stream(NVSHMEM_TEAM_WORLD, g_dst, g_src,
                                                         bsizes[k], root, s));
                    CK(cudaStreamSynchronize(s));
                } else {
                    NVCK(nvshmem_broadcastmem(NVSHMEM_TEAM_WORLD, g_dst, g_src, bsizes[k], root));
                }
                if (g_pe != root) {  // the root's dest is not checked (its update is optional)
                    char what[96];
                    snprintf(what, sizeof what, "nvshmem%s_broadcastmem%s(%zu bytes, root %d)",
                             on_stream ? "x" : "", on_stream ? "_on_stream" : "", bsizes[k], root);
                    check_dst(rootl, what);
                }
                nvshmem_barrier_all();
            }
        }
    }

    // fcollectmem: dest holds every PE's block in PE order
    const size_t fsizes[] = {8, 65536};
    for (int on_stream = 0; on_stream < 2; ++on_stream) {
        for (int k = 0; k < 2; ++k) {
            const size_t nb = fsizes[k];
            const uint32_t tag = TAG_FCOLLECT * 64 + (uint32_t)(on_stream * 4 + k);
            if (g_npes > kMaxRegions) fatal(__FILE__, __LINE__, "too many PEs for fcollect check");
            Layout all;
            memset(&all, 0, sizeof all);
            all.n = g_npes;
            for (int p = 0; p < g_npes; ++p) {
                all.r[p].off = (size_t)p * nb;
                all.r[p].len = nb;
                all.r[p].seed = make_seed((uint32_t)p, 0, tag);
            }
            all.span = (size_t)g_npes * nb + 4096;
            fill_region(g_src, nb, make_seed((uint32_t)g_pe, 0, tag));
            CK(cudaMemset(g_dst, kSentinel, all.span));
            CK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            if (on_stream) {
                NVCK(nvshmemx_fcollectmem_on_stream(NVSHMEM_TEAM_WORLD, g_dst, g_src, nb, s));
                CK(cudaStreamSynchronize(s));
            } else {
                NVCK(nvshmem_fcollectmem(NVSHMEM_TEAM_WORLD, g_dst, g_src, nb));
            }
            char what[96];
            snprintf(what, sizeof what, "nvshmem%s_fcollectmem%s(%zu bytes per PE)",
                     on_stream ? "x" : "", on_stream ? "_on_stream" : "", nb);
            check_dst(all, what);
            nvshmem_barrier_all();
        }
    }

    // sum reductions: int (host API) and uint64 (on stream)
    const size_t n = 65536, guard = 64;
    {
        int *isrc = (int *)g_src, *idst = (int *)g_dst;
        std::vector<int> h(n + guard);
        for (size_t j = 0; j < n; ++j) h[j] = (int)(j * 7 + 1) * (g_pe + 1) + g_pe * 100003;
        CK(cudaMemcpy(isrc, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemset(idst, 0xFF, (n + guard) * sizeof(int)));
        CK(cudaDeviceSynchronize());
        nvshmem_barrier_all();
        NVCK(nvshmem_int_sum_reduce(NVSHMEM_TEAM_WORLD, idst, isrc, n));
        CK(cudaMemcpy(h.data(), idst, (n + guard) * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (size_t j = 0; j < n + guard; ++j) {
            long long want = -1;
            if (j < n) {
                want = 0;
                for (int p = 0; p < g_npes; ++p) want += (long long)(j * 7 + 1) * (p + 1) + p * 100003LL;
            }
            if ((long long)h[j] != want && bad++ < 4)
                failf("nvshmem_int_sum_reduce(%zu): element %zu = %d, want %lld%s", n, j, h[j], want,
                      j >= n ? " (past the end)" : "");
        }
        nvshmem_barrier_all();
    }
    {
        uint64_t *usrc = (uint64_t *)g_src, *udst = (uint64_t *)g_dst;
        std::vector<uint64_t> h(n + guard);
        auto val = [](int pe, size_t j) -> uint64_t {
            return ((uint64_t)(pe + 1) << 40) + (uint64_t)j * 0x10001ULL + 0x123456789ULL;
        };
        for (size_t j = 0; j < n; ++j) h[j] = val(g_pe, j);
        CK(cudaMemcpy(usrc, h.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice));
        CK(cudaMemset(udst, 0xFF, (n + guard) * sizeof(uint64_t)));
        CK(cudaDeviceSynchronize());
        nvshmem_barrier_all();
        NVCK(nvshmemx_uint64_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, udst, usrc, n, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(h.data(), udst, (n + guard) * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (size_t j = 0; j < n + guard; ++j) {
            uint64_t want = ~0ULL;
            if (j < n) {
                want = 0;
                for (int p = 0; p < g_npes; ++p) want += val(p, j);
            }
            if (h[j] != want && bad++ < 4)
                failf("nvshmemx_uint64_sum_reduce_on_stream(%zu): element %zu = 0x%llx, want "
                      "0x%llx%s",
                      n, j, (unsigned long long)h[j], (unsigned long long)want,
                      j >= n ? " (past the end)" : "");
        }
        nvshmem_barrier_all();
    }
    CK(cudaStreamDestroy(s));
}

// ---------------------------------------------------------------------------------------------
// Case table and driver
// ---------------------------------------------------------------------------------------------
struct TestCase {
    const char *name;
    void (*fn)();
    const char *what;
};

// Order: the paths a remote transport is mostly used for first (device-initiated RMA, AMOs,
// signals through NVSHMEM's proxy), so that a case that kills the process (NVSHMEM exits on some
// transport errors) hides as little as possible; run.sh resumes after such a case.
const TestCase kCases[] = {
    {"host_putget", case_host_putget, "host nvshmem_putmem / nvshmem_getmem, 1 B .. 64 MiB"},
    {"host_putget_nbi", case_host_putget_nbi, "host nvshmem_putmem_nbi / getmem_nbi + quiet"},
    {"dev_putget_thread", case_dev_putget_thread, "device putmem_nbi / getmem[_nbi], thread scope"},
    {"dev_putget_warp", case_dev_putget_warp, "device putmem_nbi_warp / getmem[_nbi]_warp"},
    {"dev_putget_block", case_dev_putget_block, "device putmem_nbi_block / getmem[_nbi]_block"},
    {"amo_u32", case_amo_u32, "all 14 device AMO kinds on uint32_t (peer)"},
    {"amo_u64", case_amo_u64, "all 14 device AMO kinds on uint64_t (peer)"},
    {"amo_i32", case_amo_i32, "all 14 device AMO kinds on int32_t (peer)"},
    {"amo_contention", case_amo_contention, "every thread of 4 blocks on every PE: fetch_add, "
                                            "fetch_inc, add, inc on counters on PE 0 and PE 1"},
    {"put_signal", case_put_signal, "putmem_signal_nbi SIGNAL_SET / _block SIGNAL_ADD, bounded wait"},
    {"barrier", case_barrier, "host and device barrier_all loops with a counter check"},
    {"malloc_free", case_malloc_free, "20 nvshmem_malloc/free cycles with put + verify"},
    {"stream_putget", case_stream_putget, "nvshmemx_{put,get}mem[_nbi]_on_stream + quiet_on_stream"},
    {"p_g", case_p_g, "host and device nvshmem_{int,uint64}_p, device nvshmem_{int,uint64}_g"},
    {"iput_iget", case_iput_iget, "host nvshmem_int_iput/iget, nvshmem_iput64/iget64"},
    {"collectives", case_collectives, "broadcastmem, fcollectmem, int/uint64 sum_reduce (host, stream)"},
    {"amo_self", case_amo_self, "all 14 device AMO kinds on uint32_t/uint64_t targeting own PE"},
};
const int kNumCases = (int)(sizeof kCases / sizeof kCases[0]);

void usage(const char *argv0) {
    printf("usage: %s [--list | --names] [--timeout SECONDS] [CASE[,CASE...] ...]\n", argv0);
    printf("cases (default: all, in this order):\n");
    for (const TestCase &c : kCases) printf("  %-18s %s\n", c.name, c.what);
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<bool> selected(kNumCases, false);
    bool any = false;
    unsigned case_timeout = (unsigned)env_double("NVSHMEM_TESTS_TIMEOUT", 60);
    g_wait_s = env_double("NVSHMEM_TESTS_WAIT", 10);
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(argv[0]);
            return 0;
        }
        if (!strcmp(a, "--names")) {  // machine-readable: one case name per line, in run order
            for (const TestCase &c : kCases) printf("%s\n", c.name);
            return 0;
        }
        if (!strcmp(a, "--timeout") && i + 1 < argc) {
            case_timeout = (unsigned)atoi(argv[++i]);
            if (case_timeout == 0) case_timeout = 60;
            continue;
        }
        std::string list(a);
        size_t pos = 0;
        while (pos <= list.size()) {
            size_t comma = list.find(',', pos);
            std::string name = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
            if (name.empty()) continue;
            int found = -1;
            for (int c = 0; c < kNumCases; ++c)
                if (name == kCases[c].name) found = c;
            if (found < 0) {
                printf("unknown case '%s'\n", name.c_str());
                usage(argv[0]);
                return 2;
            }
            selected[found] = true;
            any = true;
        }
    }
    if (!any) std::fill(selected.begin(), selected.end(), true);

    job_init(&argc, &argv, std::max(case_timeout, 120u));
    g_pe = g_job.pe;
    g_npes = g_job.npes;
    if (g_npes < 2) fatal(__FILE__, __LINE__, "needs at least 2 PEs, got %d", g_npes);
    g_peer = (g_pe + 1) % g_npes;
    g_from = (g_pe + g_npes - 1) % g_npes;
    if (g_pe == 0) {
        int maj = 0, min = 0, patch = 0;
        nvshmemx_vendor_get_version_info(&maj, &min, &patch);
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, g_job.device));
        printf("nvshmem_tests: %d PEs, NVSHMEM %d.%d.%d, pe 0 on device %d (%s), case timeout %u s, "
               "device wait limit %.0f s\n",
               g_npes, maj, min, patch, g_job.device, prop.name, case_timeout, g_wait_s);
        const char *vars[] = {"NVSHMEM_REMOTE_TRANSPORT", "NVSHMEM_LIBFABRIC_PROVIDER",
                              "NVSHMEM_DISABLE_P2P", "NVSHMEM_DISABLE_CUDA_VMM", "LD_PRELOAD"};
        printf("env:");
        for (const char *v : vars) printf(" %s=%s", v, getenv(v) ? getenv(v) : "(unset)");
        printf("\n");
    }

    watchdog_arm("symmetric allocations", case_timeout);
    g_src = (uint8_t *)sym_malloc(kBufBytes, "source buffer");
    g_dst = (uint8_t *)sym_malloc(kBufBytes, "destination buffer");
    g_misc = (uint8_t *)sym_malloc(kMiscBytes, "scratch");
    CK(cudaMalloc(&g_local, kLocalBytes));
    if (g_pe == 0) {
        const bool mapped = nvshmem_ptr(g_dst, 1) != nullptr;
        printf("peer access: %s\n", mapped ? "pe 1 is mapped (P2P path)"
                                           : "pe 1 is not mapped (remote transport path)");
        const char *dp = getenv("NVSHMEM_DISABLE_P2P");
        if (mapped && dp != nullptr && (dp[0] == '1' || dp[0] == 'y' || dp[0] == 'Y' || dp[0] == 't'))
            printf("WARNING: NVSHMEM_DISABLE_P2P=%s but pe 1 is mapped: the remote transport is "
                   "not what these cases exercise\n", dp);
    }
    watchdog_disarm();

    int passed = 0, failed = 0;
    for (int c = 0; c < kNumCases; ++c) {
        if (!selected[c]) continue;
        const TestCase &tc = kCases[c];
        g_cs = CaseState();
        g_cs.name = tc.name;
        snprintf(g_wd_tail, sizeof g_wd_tail, "results before this case: %d passed, %d failed",
                 passed, failed);
        if (g_pe == 0) printf("RUN %s\n", tc.name);
        watchdog_arm(tc.name, case_timeout);
        job_barrier();
        const double t0 = now_s();
        tc.fn();
        CK(cudaDeviceSynchronize());
        const double dt = now_s() - t0;

        struct Verdict {
            int nfail;
            char first[320];
        } mine, *all = new Verdict[(size_t)g_npes];
        memset(&mine, 0, sizeof mine);
        mine.nfail = g_cs.nfail;
        snprintf(mine.first, sizeof mine.first, "%s", g_cs.first);
        job_allgather(&mine, all, sizeof mine);
        watchdog_disarm();
        bool ok = true;
        for (int p = 0; p < g_npes; ++p) ok = ok && all[p].nfail == 0;
        if (ok) {
            ++passed;
            if (g_pe == 0) printf("PASS %s (%.2f s)\n", tc.name, dt);
        } else {
            ++failed;
            if (g_pe == 0) {
                std::string details;
                for (int p = 0; p < g_npes; ++p) {
                    if (all[p].nfail == 0) continue;
                    char part[400];
                    snprintf(part, sizeof part, "%spe %d: %d problem(s), first: %s",
                             details.empty() ? "" : "; ", p, all[p].nfail, all[p].first);
                    details += part;
                }
                printf("FAIL %s (%.2f s): %s\n", tc.name, dt, details.c_str());
            }
        }
        delete[] all;
    }

    snprintf(g_wd_tail, sizeof g_wd_tail, "results: %d passed, %d failed", passed, failed);
    watchdog_arm("freeing symmetric buffers", case_timeout);
    CK(cudaFree(g_local));
    nvshmem_free(g_misc);
    nvshmem_free(g_dst);
    nvshmem_free(g_src);
    watchdog_disarm();
    if (g_pe == 0) printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    job_finalize(60);
    if (g_pe == 0) printf("finalize ok\n");
    return failed == 0 ? 0 : 1;
}
