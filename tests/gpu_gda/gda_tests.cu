// SPDX-License-Identifier: BSD-3-Clause
//
// GPU tests of the GDA device API (cuda/nvshmem_efa_gda_device.cuh and
// cuda/nvshmem_efa_gda_ibgda.cuh) over the library's software EFA queue.
//
// Setup: 2 PEs on 2 GPUs (MPI bootstrap; -DGDA_TESTS_NO_MPI uses nvshmem_init()), NVSHMEM 3.4.5
// with this library preloaded as its libfabric transport and NVSHMEM_DISABLE_P2P=1. After
// nvshmem_init the library's GDA state is ready; nvshmem_efa_gda_load_device_state() copies it into
// this program's device state.
//
// Every case prints one line, `PASS name: ...` or `FAIL name: ...` (verdicts of all PEs merged),
// and the program ends with `N passed, M failed`; the exit status is 0 only when all passed.
// A SIGALRM watchdog bounds every case; every device wait is bounded too.
//
// Usage: gda_tests [--reduced] [--list] [CASE[,CASE...]]
//   --reduced   small grids and sizes (for compute-sanitizer memcheck / racecheck)
// Environment: GDA_TESTS_EXPECT_MODE (soft|hw|any, default soft), GDA_TESTS_CASE_TIMEOUT
// (seconds per case, default 180), NVSHMEM_EFA_SQ_DEPTH (checked against the queue's depth).
#include "gda_common.cuh"

#include <algorithm>
#include <string>

#include "nvshmem_efa_gda_device.cuh"

using namespace gg;
namespace gda = nvshmem_efa_gda;

namespace {

const uint8_t kSentinel = 0xE7;
const size_t kBufBytes = 40ull << 20;  // destination span; sources are kBufBytes + 64 KiB
const size_t kSrcBytes = kBufBytes + (64u << 10);

bool g_reduced = false;
unsigned g_case_timeout = 180;

// ---- results ---------------------------------------------------------------------------------
struct Verdict {
    int pass;
    char msg[500];
};

struct DevStatus {
    unsigned long long bad;  // operations that returned a non-zero status
    unsigned first;          // first such status
    unsigned reserved;
};

__device__ void note_status(DevStatus *s, unsigned st) {
    if (st != 0u) {
        atomicAdd(&s->bad, 1ull);
        atomicCAS(&s->first, 0u, st);
    }
}

struct Ctx {
    int me = 0, npes = 0, next = 0, prev = 0;
    uint8_t *dst = nullptr;  // symmetric, kBufBytes
    uint8_t *src = nullptr;  // symmetric, kSrcBytes
    int *c32 = nullptr;      // symmetric counters / flags (64 bytes)
    unsigned long long *c64 = nullptr;
    int *flag = nullptr;
    DevStatus *status = nullptr;  // device scratch
    unsigned long long *vbad = nullptr;
    unsigned long long *vfirst = nullptr;
    NvshmemEfaGdaDeviceState state{};
    bool gda_ready = false;
};

void vfmt(std::string &out, const char *fmt, va_list ap) {
    char b[512];
    vsnprintf(b, sizeof b, fmt, ap);
    if (!out.empty()) out += "; ";
    out += b;
}

struct Check {
    bool ok = true;
    std::string msg;
    void fail(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vfmt(msg, fmt, ap);
        va_end(ap);
        ok = false;
    }
    void note(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vfmt(msg, fmt, ap);
        va_end(ap);
    }
};

// ---- regions -----------------------------------------------------------------------------------
// n regions of len_of(u) bytes, each starting at a 64-byte boundary plus 0..3 bytes (unaligned
// addresses too), 16+ sentinel bytes between them, source offset shifted by u % 7.
template <typename F>
std::vector<gg_region> make_regions(int n, F len_of, uint64_t *span) {
    std::vector<gg_region> r((size_t)n);
    uint64_t off = 0;
    for (int u = 0; u < n; ++u) {
        off = (off + 63) / 64 * 64 + (uint64_t)((u * 3) % 4);
        r[(size_t)u].dst_off = off;
        r[(size_t)u].src_off = off + (uint64_t)(u % 7);
        r[(size_t)u].len = len_of(u);
        off += r[(size_t)u].len + 16;
    }
    *span = (off + 4095) / 4096 * 4096;
    return r;
}

gg_region *upload(const std::vector<gg_region> &r) {
    gg_region *d = nullptr;
    CK(cudaMalloc(&d, std::max<size_t>(1, r.size()) * sizeof(gg_region)));
    if (!r.empty()) CK(cudaMemcpy(d, r.data(), r.size() * sizeof(gg_region), cudaMemcpyHostToDevice));
    return d;
}

__global__ void verify_kernel(const uint8_t *buf, uint64_t span, const gg_region *regs, int n,
                              uint32_t seed, uint8_t sentinel, unsigned long long *bad,
                              unsigned long long *first) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < span; i += stride) {
        int lo = 0, hi = n;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (regs[mid].dst_off <= i) lo = mid + 1;
            else hi = mid;
        }
        uint8_t want = sentinel;
        if (lo > 0 && i - regs[lo - 1].dst_off < regs[lo - 1].len)
            want = pat_byte(seed, regs[lo - 1].src_off + (i - regs[lo - 1].dst_off));
        if (buf[i] != want) {
            atomicAdd(bad, 1ull);
            atomicMin(first, (unsigned long long)i);
        }
    }
}

// Checks buf[0, span) against the regions (pattern `seed`) and the sentinel elsewhere.
void verify(Ctx &c, Check &chk, const char *what, const uint8_t *buf, uint64_t span,
            const std::vector<gg_region> &regs, const gg_region *dregs, uint32_t seed) {
    unsigned long long zero = 0, inf = ~0ull;
    CK(cudaMemcpy(c.vbad, &zero, sizeof zero, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.vfirst, &inf, sizeof inf, cudaMemcpyHostToDevice));
    verify_kernel<<<grid_for(span, 256, 4096), 256>>>(buf, span, dregs, (int)regs.size(), seed,
                                                       kSentinel, c.vbad, c.vfirst);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    unsigned long long bad = 0, first = 0;
    CK(cudaMemcpy(&bad, c.vbad, sizeof bad, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&first, c.vfirst, sizeof first, cudaMemcpyDeviceToHost));
    if (bad == 0) return;
    uint8_t got = 0;
    CK(cudaMemcpy(&got, buf + first, 1, cudaMemcpyDeviceToHost));
    auto it = std::upper_bound(regs.begin(), regs.end(), first,
                               [](uint64_t v, const gg_region &r) { return v < r.dst_off; });
    if (it != regs.begin() && first - (it - 1)->dst_off < (it - 1)->len) {
        const gg_region &r = *(it - 1);
        chk.fail("%s: %llu wrong byte(s) of %llu checked; first in the %llu-byte region #%lld at "
                 "+%llu (got 0x%02x want 0x%02x)",
                 what, bad, (unsigned long long)span, (unsigned long long)r.len,
                 (long long)(it - 1 - regs.begin()), (unsigned long long)(first - r.dst_off), got,
                 pat_byte(seed, r.src_off + (first - r.dst_off)));
    } else {
        chk.fail("%s: %llu wrong byte(s); first at offset %llu outside every region (got 0x%02x, "
                 "sentinel 0x%02x)",
                 what, bad, first, got, kSentinel);
    }
}

void reset_status(Ctx &c) { CK(cudaMemset(c.status, 0, sizeof(DevStatus))); }

void check_status(Ctx &c, Check &chk, const char *what) {
    DevStatus s;
    CK(cudaMemcpy(&s, c.status, sizeof s, cudaMemcpyDeviceToHost));
    if (s.bad != 0) chk.fail("%s: %llu call(s) returned an error, first status 0x%x", what, s.bad, s.first);
}

// ---- RDMA kernels --------------------------------------------------------------------------------
enum Scope { kThread = 0, kWarp = 1, kBlock = 2, kMixed = 3 };
enum Op { kPut = 0, kGet = 1 };

// Block b handles regions [b * per_block, (b + 1) * per_block). Within the block, by scope: each
// thread posts its own regions, each warp posts its regions together, or the block posts them
// together. kMixed picks the scope per block (b % 3). Every poster ends with quiet().
__global__ void rdma_kernel(int scope, int op, const gg_region *regs, int n, int per_block,
                            uint8_t *dst, uint8_t *src, int pe, DevStatus *st) {
    const int sc = scope == kMixed ? (int)(blockIdx.x % 3) : scope;
    const int r0 = (int)blockIdx.x * per_block;
    const int r1 = min(n, r0 + per_block);
    unsigned status = 0;
    if (sc == kThread) {
        for (int r = r0 + (int)threadIdx.x; r < r1; r += (int)blockDim.x) {
            const gg_region g = regs[r];
            const unsigned s = op == kPut ? gda::put_nbi(dst + g.dst_off, src + g.src_off, g.len, pe)
                                          : gda::get_nbi(dst + g.dst_off, src + g.src_off, g.len, pe);
            if (s != 0u && status == 0u) status = s;
        }
        const unsigned q = gda::quiet();
        if (q != 0u && status == 0u) status = q;
        note_status(st, status);
    } else if (sc == kWarp || op == kGet) {
        const int w = (int)threadIdx.x / 32, nw = (int)blockDim.x / 32, lane = (int)threadIdx.x % 32;
        for (int r = r0 + w; r < r1; r += nw) {
            const gg_region g = regs[r];
            const unsigned s = op == kPut
                                   ? gda::put_nbi_warp(dst + g.dst_off, src + g.src_off, g.len, pe)
                                   : gda::get_nbi_warp(dst + g.dst_off, src + g.src_off, g.len, pe);
            if (s != 0u && status == 0u) status = s;
        }
        if (lane == 0) {
            const unsigned q = gda::quiet();
            if (q != 0u && status == 0u) status = q;
            note_status(st, status);
        }
    } else {
        for (int r = r0; r < r1; ++r) {
            const gg_region g = regs[r];
            const unsigned s = gda::put_nbi_block(dst + g.dst_off, src + g.src_off, g.len, pe);
            if (s != 0u && status == 0u) status = s;
        }
        if (threadIdx.x == 0) {
            const unsigned q = gda::quiet();
            if (q != 0u && status == 0u) status = q;
            note_status(st, status);
        }
    }
}

struct RdmaCase {
    const char *name;
    int scope;
    int op;
    int grid, block, per_block;
    bool to_self;
    int sizes_kind;  // 0 small (1..200), 1 medium (1..4 KiB), 2 size list, 3 medium-mixed
};

const uint64_t kSizeList[] = {1,         2,           3,           4095,          65536 + 3,
                              1ull << 20, (1ull << 20) - 1, (1ull << 20) + 1, (4ull << 20) + 3,
                              16ull << 20};
const uint64_t kSizeListReduced[] = {1, 2, 3, 4095, 65536 + 3, 131072 + 5};
const uint64_t kGetSizes[] = {1, 7, 4096, 65537, (1ull << 20) + 5, (4ull << 20) + 3};
const uint64_t kGetSizesReduced[] = {1, 7, 4096, 65537};

std::vector<gg_region> regions_for(const RdmaCase &k, int n, uint64_t *span) {
    switch (k.sizes_kind) {
    case 0: return make_regions(n, [](int u) { return (uint64_t)(1 + (u * 37) % 200); }, span);
    case 1: return make_regions(n, [](int u) { return (uint64_t)(1 + (u * 977) % 4096); }, span);
    case 3: return make_regions(n, [](int u) { return (uint64_t)(1 + (u * 131) % 3000); }, span);
    default: break;
    }
    const uint64_t *list;
    int cnt;
    if (k.op == kGet) {
        list = g_reduced ? kGetSizesReduced : kGetSizes;
        cnt = g_reduced ? (int)(sizeof kGetSizesReduced / 8) : (int)(sizeof kGetSizes / 8);
    } else {
        list = g_reduced ? kSizeListReduced : kSizeList;
        cnt = g_reduced ? (int)(sizeof kSizeListReduced / 8) : (int)(sizeof kSizeList / 8);
    }
    return make_regions(std::min(n, cnt), [list](int u) { return list[u]; }, span);
}

Check run_rdma(Ctx &c, const RdmaCase &k, uint32_t tag) {
    Check chk;
    const int n = k.grid * k.per_block;
    uint64_t span = 0;
    std::vector<gg_region> regs = regions_for(k, n, &span);
    const int grid = k.sizes_kind == 2 ? (int)((regs.size() + (size_t)k.per_block - 1) / (size_t)k.per_block)
                                       : k.grid;
    if (span > kBufBytes) fatal(__FILE__, __LINE__, "%s: span %llu too large", k.name, (unsigned long long)span);
    gg_region *dregs = upload(regs);
    const int target = k.to_self ? c.me : c.next;
    const int writer = k.to_self ? c.me : c.prev;  // whose data lands in my buffer
    unsigned long long bytes = 0;
    for (auto &r : regs) bytes += r.len;

    // Fresh source pattern and sentinel destination everywhere before anyone posts.
    fill_pattern(c.src, std::min<uint64_t>(kSrcBytes, span + 4096), make_seed((uint32_t)c.me, tag));
    CK(cudaMemset(c.dst, kSentinel, span));
    reset_status(c);
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    const double t0 = now_s();
    rdma_kernel<<<grid, k.block>>>(k.scope, k.op, dregs, (int)regs.size(), k.per_block, c.dst, c.src,
                                   target, c.status);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    const double dt = now_s() - t0;
    nvshmem_barrier_all();

    check_status(c, chk, "device calls");
    // Put: my destination holds the writer's source; get: my destination holds the target's source.
    const uint32_t seed = make_seed((uint32_t)(k.op == kPut ? writer : target), tag);
    verify(c, chk, "destination", c.dst, span, regs, dregs, seed);
    chk.note("%zu %s of %llu bytes total, grid %d x %d, %.3f s", regs.size(),
             k.op == kPut ? "puts" : "gets", bytes, grid, k.block, dt);
    CK(cudaFree(dregs));
    return chk;
}

// ---- put with immediate ------------------------------------------------------------------------
struct ImmRecv {
    unsigned long long received;   // immediates in range
    unsigned long long bogus;      // immediates outside [base, base + expected)
    unsigned long long data_bad;   // payload bytes wrong when the immediate arrived
    unsigned long long bad_status; // RX entries with an error status
    unsigned long long not_write;  // RX entries that are not RDMA writes
    unsigned timed_out;
    unsigned poll_error;
};

__global__ void imm_kernel(int poster_blocks, const gg_region *regs, int nmsg, uint8_t *dst,
                           const uint8_t *src, int peer, uint32_t my_base, DevStatus *st,
                           ImmRecv *rv, unsigned *counts, uint32_t peer_base, uint32_t peer_seed,
                           uint64_t timeout_ns, uint64_t linger_ns) {
    if ((int)blockIdx.x < poster_blocks) {
        unsigned status = 0;
        const int nthreads = poster_blocks * (int)blockDim.x;
        for (int m = (int)(blockIdx.x * blockDim.x + threadIdx.x); m < nmsg; m += nthreads) {
            const gg_region g = regs[m];
            const unsigned s =
                gda::put_imm(dst + g.dst_off, src + g.src_off, g.len, my_base + (uint32_t)m, peer);
            if (s != 0u && status == 0u) status = s;
        }
        const unsigned q = gda::quiet();
        if (q != 0u && status == 0u) status = q;
        note_status(st, status);
        return;
    }
    // Receivers: every thread of the last block polls the RX ring concurrently.
    const uint64_t t0 = dev_now_ns();
    uint64_t done_at = 0;
    for (;;) {
        uint32_t imm = 0;
        gda::RxEvent ev;
        const int r = gda::poll_imm(&imm, 200000ull, &ev);
        if (r < 0) {
            atomicCAS(&rv->poll_error, 0u, (unsigned)-r);
            break;
        }
        if (r == 1) {
            if (ev.status != 0) atomicAdd(&rv->bad_status, 1ull);
            if (ev.op != NVSHMEM_EFA_OP_RDMA_WRITE) atomicAdd(&rv->not_write, 1ull);
            const uint32_t idx = imm - peer_base;
            if (idx < (uint32_t)nmsg) {
                atomicAdd(&counts[idx], 1u);
                const gg_region g = regs[idx];
                const volatile uint8_t *d = dst + g.dst_off;
                unsigned long long wrong = 0;
                for (uint64_t j = 0; j < g.len; ++j)
                    if (d[j] != pat_byte(peer_seed, g.src_off + j)) ++wrong;
                if (wrong) atomicAdd(&rv->data_bad, wrong);
                atomicAdd(&rv->received, 1ull);
            } else {
                atomicAdd(&rv->bogus, 1ull);
            }
        }
        const uint64_t now = dev_now_ns();
        const unsigned long long got = *reinterpret_cast<volatile unsigned long long *>(&rv->received);
        if (got >= (unsigned long long)nmsg) {
            // All expected immediates are in: keep polling a little to catch duplicates.
            if (done_at == 0) done_at = now;
            if (now - done_at > linger_ns) break;
        } else if (now - t0 > timeout_ns) {
            atomicExch(&rv->timed_out, 1u);
            break;
        }
    }
}

Check run_imm(Ctx &c, uint32_t tag) {
    Check chk;
    const int nmsg = g_reduced ? 64 : 2048;
    uint64_t span = 0;
    // Payloads of 0..96 bytes; the last message is larger than one WQE (three chunks) in the full
    // run, so the immediate must wait for the earlier chunks.
    std::vector<gg_region> regs = make_regions(
        nmsg,
        [nmsg](int u) {
            if (u == nmsg - 1) return g_reduced ? (uint64_t)70000 : (uint64_t)(5ull << 19) + 3;
            return (uint64_t)((u * 13) % 97);
        },
        &span);
    gg_region *dregs = upload(regs);
    ImmRecv *rv = nullptr;
    unsigned *counts = nullptr;
    CK(cudaMalloc(&rv, sizeof(ImmRecv)));
    CK(cudaMalloc(&counts, sizeof(unsigned) * (size_t)nmsg));
    CK(cudaMemset(rv, 0, sizeof(ImmRecv)));
    CK(cudaMemset(counts, 0, sizeof(unsigned) * (size_t)nmsg));
    fill_pattern(c.src, std::min<uint64_t>(kSrcBytes, span + 4096), make_seed((uint32_t)c.me, tag));
    CK(cudaMemset(c.dst, kSentinel, span));
    reset_status(c);
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();

    const uint32_t my_base = 0x10000000u * (uint32_t)(c.me + 1) + tag * 0x10000u;
    const uint32_t peer_base = 0x10000000u * (uint32_t)(c.prev + 1) + tag * 0x10000u;
    const int poster_blocks = g_reduced ? 1 : 8;
    const double t0 = now_s();
    imm_kernel<<<poster_blocks + 1, g_reduced ? 32 : 128>>>(
        poster_blocks, dregs, nmsg, c.dst, c.src, c.next, my_base, c.status, rv, counts, peer_base,
        make_seed((uint32_t)c.prev, tag), 60ull * 1000000000ull, 200ull * 1000000ull);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    const double dt = now_s() - t0;
    nvshmem_barrier_all();

    check_status(c, chk, "put_imm/quiet");
    ImmRecv h;
    CK(cudaMemcpy(&h, rv, sizeof h, cudaMemcpyDeviceToHost));
    std::vector<unsigned> cnt((size_t)nmsg);
    CK(cudaMemcpy(cnt.data(), counts, sizeof(unsigned) * (size_t)nmsg, cudaMemcpyDeviceToHost));
    int missing = 0, dup = 0, first_missing = -1, first_dup = -1;
    for (int i = 0; i < nmsg; ++i) {
        if (cnt[(size_t)i] == 0) {
            ++missing;
            if (first_missing < 0) first_missing = i;
        } else if (cnt[(size_t)i] > 1) {
            ++dup;
            if (first_dup < 0) first_dup = i;
        }
    }
    if (h.poll_error) chk.fail("poll_imm returned error 0x%x", h.poll_error);
    if (missing) chk.fail("%d of %d immediates never arrived (first #%d)", missing, nmsg, first_missing);
    if (dup) chk.fail("%d immediates arrived more than once (first #%d, %u times)", dup, first_dup,
                      cnt[(size_t)first_dup]);
    if (h.bogus) chk.fail("%llu immediates with unexpected values", h.bogus);
    if (h.data_bad) chk.fail("%llu payload bytes were not in place when their immediate arrived", h.data_bad);
    if (h.bad_status) chk.fail("%llu RX entries with an error status", h.bad_status);
    if (h.not_write) chk.fail("%llu RX entries were not RDMA writes", h.not_write);
    if (h.timed_out && !missing) chk.fail("receiver timed out");
    // After everything: the whole destination (sentinels between payloads included).
    verify(c, chk, "destination", c.dst, span, regs, dregs, make_seed((uint32_t)c.prev, tag));
    chk.note("%d immediates each way, last payload %llu bytes, %.3f s", nmsg,
             (unsigned long long)regs.back().len, dt);
    CK(cudaFree(dregs));
    CK(cudaFree(rv));
    CK(cudaFree(counts));
    return chk;
}

// ---- AMO ---------------------------------------------------------------------------------------
__host__ __device__ inline int amo_v32(unsigned t) { return (int)(1u + t % 5u) * ((t % 11u) == 3u ? -1 : 1); }
__host__ __device__ inline unsigned long long amo_v64(unsigned t) {
    return (1ull << 32) * (unsigned long long)(1u + t % 3u) + 0xffffffffull * (t & 1u) + 1ull;
}

__global__ void amo_kernel(int *c32, unsigned long long *c64, int npes, DevStatus *st) {
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned status = 0;
    for (int pe = 0; pe < npes; ++pe) {
        unsigned s = gda::amo_nonfetch_add<int>(c32, amo_v32(t), pe);
        if (s != 0u && status == 0u) status = s;
        s = gda::amo_nonfetch_add<unsigned long long>(c64, amo_v64(t), pe);
        if (s != 0u && status == 0u) status = s;
    }
    const unsigned q = gda::quiet();
    if (q != 0u && status == 0u) status = q;
    note_status(st, status);
}

Check run_amo(Ctx &c) {
    Check chk;
    const int grid = g_reduced ? 2 : 66, block = g_reduced ? 64 : 256;
    long long e32 = 0;
    unsigned long long e64 = 0;
    for (unsigned t = 0; t < (unsigned)(grid * block); ++t) {
        e32 += amo_v32(t);
        e64 += amo_v64(t);
    }
    const int exp32 = (int)(uint32_t)(e32 * c.npes);
    const unsigned long long exp64 = e64 * (unsigned long long)c.npes;
    CK(cudaMemset(c.c32, 0, 64));
    CK(cudaMemset(c.c64, 0, 64));
    reset_status(c);
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    const double t0 = now_s();
    amo_kernel<<<grid, block>>>(c.c32, c.c64, c.npes, c.status);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    check_status(c, chk, "amo/quiet");
    // The target applies the messages: wait (bounded) until both counters are exact, then make sure
    // nothing more arrives.
    int v32 = 0;
    unsigned long long v64 = 0;
    const double deadline = now_s() + 30.0;
    for (;;) {
        CK(cudaMemcpy(&v32, c.c32, sizeof v32, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&v64, c.c64, sizeof v64, cudaMemcpyDeviceToHost));
        if ((v32 == exp32 && v64 == exp64) || now_s() > deadline) break;
        usleep(2000);
    }
    const double dt = now_s() - t0;
    usleep(200000);
    int w32 = 0;
    unsigned long long w64 = 0;
    CK(cudaMemcpy(&w32, c.c32, sizeof w32, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&w64, c.c64, sizeof w64, cudaMemcpyDeviceToHost));
    if (w32 != exp32) chk.fail("32-bit counter %d, expected %d", w32, exp32);
    if (w64 != exp64) chk.fail("64-bit counter %llu, expected %llu", w64, exp64);
    if (w32 != v32 || w64 != v64) chk.fail("counters still changed after reaching their totals");
    chk.note("%d threads x %d PEs x 2 adds per PE, exact after %.3f s", grid * block, c.npes, dt);
    return chk;
}

// ---- IBGDA compatibility (DeepEP names, deepep_style.cu) -------------------------------------------
Check run_ibgda_compat(Ctx &c, uint32_t tag) {
    Check chk;
    const int sender_blocks = g_reduced ? 1 : 4, threads = g_reduced ? 64 : 128;
    const int nreg = sender_blocks * (threads / 32);
    uint64_t span = 0;
    std::vector<gg_region> regs =
        make_regions(nreg, [](int u) { return (uint64_t)(1 + (u * 1237) % 9000); }, &span);
    gg_region *dregs = upload(regs);
    IbgdaCompatOut *out = nullptr;
    CK(cudaMalloc(&out, sizeof *out));
    CK(cudaMemset(out, 0, sizeof *out));
    fill_pattern(c.src, std::min<uint64_t>(kSrcBytes, span + 4096), make_seed((uint32_t)c.me, tag));
    CK(cudaMemset(c.dst, kSentinel, span));
    CK(cudaMemset(c.c32, 0, 64));
    CK(cudaMemset(c.flag, 0, 64));
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    IbgdaCompatArgs a;
    a.me = c.me;
    a.peer = c.next;
    a.sender_blocks = sender_blocks;
    a.nregions = nreg;
    a.regions = dregs;
    a.dst = c.dst;
    a.src = c.src;
    a.counter = c.c32;
    a.flag = c.flag;
    a.flag_value = 0x5eed00 + c.me;
    a.expect_flag = 0x5eed00 + c.prev;
    a.flag_imm = 0xC0DE0000u + (uint32_t)c.me;
    a.expect_imm = 0xC0DE0000u + (uint32_t)c.prev;
    a.peer_seed = make_seed((uint32_t)c.prev, tag);
    a.timeout_ns = 60ull * 1000000000ull;
    a.out = out;
    ibgda_compat_launch(a, threads);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    nvshmem_barrier_all();
    IbgdaCompatOut h;
    CK(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost));
    if (h.num_rc_per_pe < 1 || h.num_devices != 1)
        chk.fail("ibgda_get_state() reports num_rc_per_pe %d, num_devices_initialized %d",
                 h.num_rc_per_pe, h.num_devices);
    if (h.p2p_peer != 0) chk.fail("nvshmemi_get_p2p_ptr gave 0x%llx for the peer with P2P disabled",
                                  (unsigned long long)h.p2p_peer);
    if (!h.p2p_self_ok) chk.fail("nvshmemi_get_p2p_ptr(ptr, me, me) != ptr");
    if (!h.waited_ok)
        chk.fail("counter %d (want %d) / flag 0x%x (want 0x%x) not reached in time", h.counter_seen,
                 nreg, h.flag_seen, a.expect_flag);
    if (!h.imm_seen) chk.fail("the immediate of nvshmemi_ibgda_rma_p never arrived");
    else if (h.imm_value != a.expect_imm || h.flag_at_imm != a.expect_flag)
        chk.fail("immediate 0x%x (want 0x%x) arrived with the flag at 0x%x (want 0x%x)", h.imm_value,
                 a.expect_imm, h.flag_at_imm, a.expect_flag);
    if (h.bad_bytes) chk.fail("%llu bytes missing when the counter was complete (AMO overtook its puts)",
                              h.bad_bytes);
    verify(c, chk, "destination", c.dst, span, regs, dregs, a.peer_seed);
    int final_counter = 0;
    CK(cudaMemcpy(&final_counter, c.c32, sizeof final_counter, cudaMemcpyDeviceToHost));
    if (final_counter != nreg) chk.fail("final counter %d, expected %d", final_counter, nreg);
    chk.note("%d warps: put_nbi_warp + amo_nonfetch_add + rma_p(imm) + quiet; num_rc_per_pe %d", nreg,
             h.num_rc_per_pe);
    CK(cudaFree(dregs));
    CK(cudaFree(out));
    return chk;
}

// ---- queue health ----------------------------------------------------------------------------------
struct Health {
    unsigned long long errors;
    unsigned first_error;
    unsigned fatal;
    unsigned long long rejected;
    unsigned long long resv, ready, done;
    unsigned quiet;
};

__global__ void health_kernel(Health *h) {
    h->quiet = gda::quiet();
    h->errors = gda::error_count();
    h->first_error = gda::first_error();
    h->fatal = nvshmem_efa_gda_local_d.fatal;
    const NvshmemEfaGdaQueueCtrl *ctrl =
        reinterpret_cast<const NvshmemEfaGdaQueueCtrl *>(nvshmem_efa_gda_state_d.queue.ctrl);
    h->resv = *reinterpret_cast<const volatile unsigned long long *>(&ctrl->resv);
    h->ready = *reinterpret_cast<const volatile unsigned long long *>(&ctrl->ready);
    h->done = *reinterpret_cast<const volatile unsigned long long *>(&ctrl->done);
    const NvshmemEfaGdaHostCtrl *hc =
        reinterpret_cast<const NvshmemEfaGdaHostCtrl *>(nvshmem_efa_gda_state_d.queue.host_ctrl);
    h->rejected = hc ? *reinterpret_cast<const volatile unsigned long long *>(&hc->rejected) : 0ull;
}

Check run_health(Ctx &c) {
    Check chk;
    Health *d = nullptr;
    CK(cudaMalloc(&d, sizeof *d));
    health_kernel<<<1, 1>>>(d);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    Health h;
    CK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    if (h.quiet != 0) chk.fail("quiet() = 0x%x", h.quiet);
    if (h.errors != 0) chk.fail("%llu errors recorded on the queue, first 0x%x", h.errors, h.first_error);
    if (h.fatal != 0) chk.fail("queue failed with 0x%x", h.fatal);
    if (h.rejected != 0) chk.fail("the software queue rejected %llu WQEs", h.rejected);
    if (!(h.resv == h.ready && h.ready == h.done))
        chk.fail("counters not settled: resv %llu ready %llu done %llu", h.resv, h.ready, h.done);
    chk.note("%llu WQEs posted on this PE's queue (%llu ring wraps)", h.done,
             h.done / (c.state.queue.sq_entries ? c.state.queue.sq_entries : 1));
    return chk;
}

// ---- state -------------------------------------------------------------------------------------
Check run_state(Ctx &c, int load_rc) {
    Check chk;
    NvshmemEfaGdaDeviceState &s = c.state;
    CK(cudaMemcpyFromSymbol(&s, nvshmem_efa_gda_state_d, sizeof s));
    const char *want = getenv("GDA_TESTS_EXPECT_MODE");
    std::string mode = want && *want ? want : "soft";
    if (load_rc != NVSHMEM_EFA_GDA_LOAD_OK) chk.fail("nvshmem_efa_gda_load_device_state returned %d", load_rc);
    if (s.version != NVSHMEM_EFA_GDA_STATE_VERSION) chk.fail("state version %u", s.version);
    if (!s.ready) chk.fail("state not ready (is the library preloaded as NVSHMEM's transport, NVSHMEM_EFA_GDA set?)");
    if (s.my_pe != c.me || s.n_pes != c.npes)
        chk.fail("state says PE %d of %d, NVSHMEM says %d of %d", s.my_pe, s.n_pes, c.me, c.npes);
    if (mode == "soft" && s.queue.mode != NVSHMEM_EFA_GDA_MODE_SOFT)
        chk.fail("queue mode %u, expected the software queue (%d)", s.queue.mode, NVSHMEM_EFA_GDA_MODE_SOFT);
    if (mode == "hw" && s.queue.mode != NVSHMEM_EFA_GDA_MODE_HW)
        chk.fail("queue mode %u, expected the hardware queue (%d)", s.queue.mode, NVSHMEM_EFA_GDA_MODE_HW);
    const uint64_t lo = (uint64_t)(uintptr_t)c.dst, hi = (uint64_t)(uintptr_t)c.src + kSrcBytes;
    if (s.ready && (lo < s.heap_base || hi > s.heap_base + s.heap_size))
        chk.fail("symmetric buffers [0x%llx, 0x%llx) outside the GDA heap [0x%llx, +%llu)",
                 (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)s.heap_base,
                 (unsigned long long)s.heap_size);
    if (s.ready && s.queue.mode == NVSHMEM_EFA_GDA_MODE_SOFT && s.queue.host_ctrl == 0)
        chk.fail("software queue without host_ctrl");
    if (s.ready && s.queue.rx_cq == 0) chk.fail("no RX ring (put_imm cannot be received)");
    const char *depth = getenv("NVSHMEM_EFA_SQ_DEPTH");
    if (s.ready && depth && *depth && strtoul(depth, nullptr, 0) != s.queue.sq_entries)
        chk.fail("NVSHMEM_EFA_SQ_DEPTH=%s but the queue has %u entries", depth, s.queue.sq_entries);
    chk.note("mode %u, sq %u x %u B, cq %u x %u B, rx %u, max_batch %u, heap %llu MiB", s.queue.mode,
             s.queue.sq_entries, s.queue.sq_entry_size, s.queue.cq_entries, s.queue.cq_entry_size,
             s.queue.rx_entries, s.queue.max_batch, (unsigned long long)(s.heap_size >> 20));
    c.gda_ready = chk.ok;
    return chk;
}

// ---- driver --------------------------------------------------------------------------------------
struct CaseDef {
    const char *name;
    const char *what;
};

const CaseDef kCases[] = {
    {"state", "device state loaded, ready, software queue, geometry"},
    {"put_thread_1blk", "thread-scope puts, 1 block x 256 threads, 1..200 B"},
    {"put_thread_7blk", "thread-scope puts, 7 blocks x 256 threads"},
    {"put_thread_132blk", "thread-scope puts, 132 blocks x 256 threads (many ring wraps)"},
    {"put_warp_132blk", "warp-scope puts, 132 blocks x 8 warps, 1 B..4 KiB"},
    {"put_block_sizes", "block-scope puts, 1 B .. 16 MiB (chunked)"},
    {"put_mixed_132blk", "thread/warp/block scopes at once, 132 blocks"},
    {"put_self", "thread-scope puts to this PE (loopback)"},
    {"put_imm", "write with immediate: every immediate exactly once, payload first"},
    {"amo_add", "amo_nonfetch_add (32 and 64 bit) from every thread of every PE: exact totals"},
    {"get_thread", "thread-scope gets, 1..200 B"},
    {"get_warp_sizes", "warp-scope gets, 1 B .. 4 MiB"},
    {"ibgda_compat", "DeepEP's IBGDA calls (nvshmem_efa_gda_ibgda.cuh) in a DeepEP-style TU"},
    {"queue_health", "no errors, no rejected WQEs, counters settled"},
};

bool selected(const std::vector<std::string> &want, const char *name) {
    if (want.empty()) return true;
    return std::find(want.begin(), want.end(), std::string(name)) != want.end();
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<std::string> want;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--reduced") {
            g_reduced = true;
        } else if (a == "--list" || a == "-h" || a == "--help") {
            printf("usage: %s [--reduced] [--list] [CASE[,CASE...]]\ncases:\n", argv[0]);
            for (const CaseDef &d : kCases) printf("  %-18s %s\n", d.name, d.what);
            return 0;
        } else {
            size_t p = 0;
            while (p <= a.size()) {
                size_t q = a.find(',', p);
                if (q == std::string::npos) q = a.size();
                if (q > p) want.push_back(a.substr(p, q - p));
                p = q + 1;
            }
        }
    }
    for (const std::string &w : want) {
        bool known = false;
        for (const CaseDef &d : kCases) known = known || w == d.name;
        if (!known) {
            printf("unknown case '%s' (see --list)\n", w.c_str());
            return 2;
        }
    }
    if (const char *t = getenv("GDA_TESTS_CASE_TIMEOUT")) {
        if (atoi(t) > 0) g_case_timeout = (unsigned)atoi(t);
    }

    job_init(&argc, &argv, 120);
    Ctx c;
    c.me = g_job.pe;
    c.npes = g_job.npes;
    c.next = (c.me + 1) % c.npes;
    c.prev = (c.me + c.npes - 1) % c.npes;
    if (c.me == 0)
        printf("gda_tests: %d PEs, %s run\n", c.npes, g_reduced ? "reduced" : "full");

    watchdog_arm("nvshmem_efa_gda_load_device_state", 60);
    const int load_rc = nvshmem_efa_gda_load_device_state(0);
    c.dst = (uint8_t *)sym_malloc(kBufBytes, "destination");
    c.src = (uint8_t *)sym_malloc(kSrcBytes, "source");
    c.c32 = (int *)sym_malloc(64, "32-bit counter");
    c.c64 = (unsigned long long *)sym_malloc(64, "64-bit counter");
    c.flag = (int *)sym_malloc(64, "flag");
    CK(cudaMalloc(&c.status, sizeof(DevStatus)));
    CK(cudaMalloc(&c.vbad, sizeof(unsigned long long)));
    CK(cudaMalloc(&c.vfirst, sizeof(unsigned long long)));
    // The state is always checked: every other case needs it.
    watchdog_arm("state", 60);
    const Check state_chk = run_state(c, load_rc);
    {
        // Cases run only when every PE can post (they are collective).
        int mine = c.gda_ready ? 1 : 0;
        std::vector<int> all((size_t)c.npes);
        job_allgather(&mine, all.data(), sizeof mine);
        for (int x : all) c.gda_ready = c.gda_ready && x == 1;
    }
    watchdog_disarm();

    const int T = g_reduced ? 1 : 0;  // shorthand
    const RdmaCase rdma_full[] = {
        {"put_thread_1blk", kThread, kPut, 1, 256, 1024, false, 0},
        {"put_thread_7blk", kThread, kPut, 7, 256, 512, false, 0},
        {"put_thread_132blk", kThread, kPut, 132, 256, 512, false, 0},
        {"put_warp_132blk", kWarp, kPut, 132, 256, 32, false, 1},
        {"put_block_sizes", kBlock, kPut, 10, 256, 1, false, 2},
        {"put_mixed_132blk", kMixed, kPut, 132, 256, 64, false, 3},
        {"put_self", kThread, kPut, 4, 128, 128, true, 0},
        {"get_thread", kThread, kGet, 8, 256, 256, false, 0},
        {"get_warp_sizes", kWarp, kGet, 6, 32, 1, false, 2},
    };
    const RdmaCase rdma_reduced[] = {
        {"put_thread_1blk", kThread, kPut, 1, 64, 128, false, 0},
        {"put_thread_7blk", kThread, kPut, 2, 64, 64, false, 0},
        {"put_thread_132blk", kThread, kPut, 4, 64, 32, false, 0},
        {"put_warp_132blk", kWarp, kPut, 4, 64, 8, false, 1},
        {"put_block_sizes", kBlock, kPut, 6, 64, 1, false, 2},
        {"put_mixed_132blk", kMixed, kPut, 3, 64, 16, false, 3},
        {"put_self", kThread, kPut, 1, 64, 64, true, 0},
        {"get_thread", kThread, kGet, 2, 64, 32, false, 0},
        {"get_warp_sizes", kWarp, kGet, 4, 32, 1, false, 2},
    };
    const RdmaCase *rdma = T ? rdma_reduced : rdma_full;
    const int n_rdma = (int)(sizeof rdma_full / sizeof rdma_full[0]);

    int passed = 0, failed = 0;
    uint32_t tag = 1;
    for (const CaseDef &d : kCases) {
        if (!selected(want, d.name)) continue;
        watchdog_arm(d.name, g_case_timeout);
        Check chk;
        const std::string name = d.name;
        if (name == "state") {
            chk = state_chk;
        } else if (!c.gda_ready) {
            chk.fail("skipped: the GDA state is not ready (see case 'state')");
        } else if (name == "put_imm") {
            chk = run_imm(c, tag);
        } else if (name == "amo_add") {
            chk = run_amo(c);
        } else if (name == "ibgda_compat") {
            chk = run_ibgda_compat(c, tag);
        } else if (name == "queue_health") {
            chk = run_health(c);
        } else {
            for (int i = 0; i < n_rdma; ++i)
                if (name == rdma[i].name) chk = run_rdma(c, rdma[i], tag);
        }
        ++tag;
        watchdog_disarm();
        // Merge the verdicts of all PEs.
        Verdict v;
        memset(&v, 0, sizeof v);
        v.pass = chk.ok ? 1 : 0;
        snprintf(v.msg, sizeof v.msg, "%s", chk.msg.c_str());
        std::vector<Verdict> all((size_t)c.npes);
        job_allgather(&v, all.data(), sizeof v);
        bool ok = true;
        for (const Verdict &x : all) ok = ok && x.pass;
        if (ok) ++passed;
        else ++failed;
        if (c.me == 0) {
            printf("%s %s:", ok ? "PASS" : "FAIL", d.name);
            for (int p = 0; p < c.npes; ++p)
                printf(" [pe %d%s] %s", p, all[(size_t)p].pass ? "" : " FAILED", all[(size_t)p].msg);
            printf("\n");
        }
        job_barrier();
    }
    if (c.me == 0) printf("%d passed, %d failed\n", passed, failed);

    nvshmem_free(c.dst);
    nvshmem_free(c.src);
    nvshmem_free(c.c32);
    nvshmem_free(c.c64);
    nvshmem_free(c.flag);
    job_finalize(60);
    return failed == 0 && passed > 0 ? 0 : 1;
}
