// SPDX-License-Identifier: BSD-3-Clause
//
// GPU-initiated put message rate and bandwidth, PE 0 -> PE 1, 8 B .. 4 MiB, for up to three paths:
//   gda    this project's device API (nvshmem_efa_gda::put_nbi_warp + quiet) on the GDA queue
//   proxy  NVSHMEM's device API (nvshmemx_putmem_nbi_warp + nvshmem_quiet) through NVSHMEM's proxy
//          thread and this library as its transport (run with NVSHMEM_DISABLE_P2P=1)
//   p2p    the same NVSHMEM kernel when NVSHMEM maps the peer over NVLink (a separate run without
//          NVSHMEM_DISABLE_P2P: NVSHMEM decides P2P vs remote at init)
// The path names are checked against what NVSHMEM decided (nvshmem_ptr of the peer).
//
// Every measurement: BLOCKS x WARPS warps each post their share of `msgs` puts of one size into a
// 64 MiB window of the peer's heap, then quiet; time = kernel time (CUDA events). The message count
// per size adapts to a time target after a warm-up, and the whole sweep stops at a budget, so the
// run is bounded. After each measurement PE 1 verifies every byte of the window that was written.
//
// Null-consumer mode: with NVSHMEM_EFA_SOFT_NULL=1 in the environment the software queue completes
// every WQE without moving data, so path gda (reported as gda-null) measures the GPU's WQE post
// rate: no verification, up to 1M messages per measurement, and the wqe_rate_mwps column is the
// number of WQEs the kernel posted (the queue's reservation counter, read before and after) per
// microsecond. The column is filled for every gda row (0 for proxy and p2p rows).
//
// With NVSHMEM_EFA_SOFT_IPC=host in the environment the gda rows are named gda-host (the software
// queue's copy route; default kernel, rows gda).
//
// Scope: with --scope warp (default) every warp posts one message at a time (put_nbi_warp /
// nvshmemx_putmem_nbi_warp); with --scope thread every thread does (put_nbi / nvshmem_putmem_nbi),
// and the converged lanes of a warp share one reservation and commit on the GDA queue (32 WQEs per
// commit): the rows are then named gda-thread, gda-null-thread, proxy-thread, p2p-thread.
//
// Queues: with --queues Q (default 1) warp w posts on qp_id = w % Q of the peer, i.e. on queue
// entry peer * queues_per_pe + (w % Q) % queues_per_pe of the state's queue table
// (docs/gda-queues.md), and waits for that queue alone (quiet_qp). Run it with
// NVSHMEM_IBGDA_NUM_RC_PER_PE >= Q so the table has Q queues per PE; the program prints the loaded
// table (entries, per PE, distinct queues) and warns when Q exceeds it.
//
// Counts (DeepEP's "data, then count"): with --count-every N (warp scope, path gda) every warp, after
// each N-th put, adds 1 to a 64-bit word of its own at the peer with amo_nonfetch_add_qp on the same
// queue, as DeepEP's dispatch announces a batch of tokens with rdma_recv_count. The target applies
// the count (an AMO message) to GPU memory. Rows are named gda-countN; after each measurement PE 1
// checks every word's total besides the window's bytes, and msgs counts the puts only (the counts
// are msgs / N more WQEs).
//
// Exchange (DeepEP's low-latency dispatch with its wait inside the kernel): with --exchange R both
// PEs run one kernel of R rounds; in each round every warp ("expert") puts --tokens T messages of
// --size S bytes (default 4 x 7168, DeepEP's default config spread over 144 experts per rank) into a
// region of its own at the peer on its queue (qp_id = w % Q), adds 1 to its count word at the peer
// on the same queue with signal_add_qp (what DeepEP's nvshmemi_ibgda_amo_nonfetch_add is here: the
// target applies it after the puts before it), and then spins until its own count word, which the peer's warp w bumps, reaches
// the round number (ld.acquire.sys, as DeepEP's receive phase polls rdma_recv_count). The target's
// kernel is thus running, polling GPU memory, while the data and counts for it arrive: what the
// count benchmark (target idle) does not show. A round's time is from its first warp's start to its
// last warp's count on this PE (%globaltimer); printed per PE as median / p90 / max over the rounds,
// the rows named gda-exchange (CSV: usec = kernel time, msgs = puts of this PE; the per-round times
// in CSV_PATH.rounds.csv: pe,round,usec). Checked after each run: every count is R, every region
// holds the source's bytes. A count that has not arrived 10 s after its round began fails the run
// (status 0x7e0u), it does not hang.
//
// Usage: gda_bench CSV_PATH [--paths gda,proxy|p2p] [--max-bytes N] [--budget-s S]
//                  [--blocks B] [--warps W] [--scope warp|thread] [--queues Q] [--count-every N]
//                  [--exchange R [--size S] [--tokens T]]
// CSV columns: path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s,wqes,wqe_rate_mwps
//              (usec = whole measurement)
#include "gda_common.cuh"

#include <algorithm>
#include <string>

#include "nvshmem_efa_gda_device.cuh"

using namespace gg;
namespace gda = nvshmem_efa_gda;

namespace {

const size_t kWindow = 64ull << 20;

struct KStatus {
    unsigned bad;
    unsigned first;
};

// Ends a poster's loop: quiet of its queue, then counts the poster as failed (first status kept)
// when a put (`s`, the first put error) or the quiet returned an error.
__device__ void quiet_and_count(unsigned s, KStatus *st, int peer, int qp) {
    const unsigned q = gda::quiet_qp(peer, qp);
    if (q != 0u && s == 0u) s = q;
    if (s != 0u) {
        atomicAdd(&st->bad, 1u);
        atomicCAS(&st->first, 0u, s);
    }
}

// Message m goes to window slot m % slots; warp w posts messages w, w + nwarps, ... on the queue
// of (peer, qp_id = w % queues). With count_every > 0, after each count_every-th of its puts the
// warp adds 1 to counts[w] at the peer on the same queue (data, then count).
__global__ void gda_put_kernel(uint8_t *dst, const uint8_t *src, size_t size, int msgs, int slots,
                               int peer, int queues, KStatus *st, int count_every,
                               unsigned long long *counts) {
    const int nwarps = (int)(gridDim.x * blockDim.x / 32);
    const int w = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32);
    const int qp = w % queues;
    unsigned s = 0;
    int mine = 0;
    for (int m = w; m < msgs; m += nwarps) {
        const size_t off = (size_t)(m % slots) * size;
        const unsigned r = gda::put_nbi_warp_qp(dst + off, src + off, size, peer, qp);
        if (r != 0u && s == 0u) s = r;
        if (count_every > 0 && ++mine % count_every == 0) {
            if (threadIdx.x % 32 == 0) {
                const unsigned c = gda::amo_nonfetch_add_qp(&counts[w], 1ull, peer, qp);
                if (c != 0u && s == 0u) s = c;
            }
            __syncwarp();
        }
    }
    if (threadIdx.x % 32 == 0) quiet_and_count(s, st, peer, qp);
}

// Status of a count that did not arrive within the exchange's timeout.
const unsigned kExchangeTimeout = 0x7e0u;

__device__ __forceinline__ unsigned long long ld_acquire_sys_u64(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// --exchange: rounds of "puts, then count" to the peer, each ended by waiting for the peer's count
// of the same round (see the file's comment). t_start[r] / t_end[r]: the first warp's start and the
// last warp's arrival of round r (min / max over warps; the host sets them to ~0 / 0).
__global__ void gda_exchange_kernel(uint8_t *recv, const uint8_t *src, size_t size, int tokens,
                                    int rounds, int peer, int queues, unsigned long long *counts,
                                    unsigned long long *t_start, unsigned long long *t_end,
                                    KStatus *st, unsigned long long timeout_ns) {
    const int w = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32);
    const int lane = (int)(threadIdx.x % 32);
    const int qp = w % queues;
    unsigned s = 0;
    for (int r = 0; r < rounds && s == 0u; ++r) {
        if (lane == 0) atomicMin(&t_start[r], global_ns());
        for (int t = 0; t < tokens; ++t) {
            const size_t off = ((size_t)w * (size_t)tokens + (size_t)t) * size;
            const unsigned x = gda::put_nbi_warp_qp(recv + off, src + off, size, peer, qp);
            if (x != 0u && s == 0u) s = x;
        }
        if (lane == 0) {
            // DeepEP's nvshmemi_ibgda_amo_nonfetch_add on this library: a signal (applied at the
            // target after the puts before it on this queue; docs/ordering.md).
            const unsigned c = gda::signal_add_qp(&counts[w], 1ull, peer, qp);
            if (c != 0u && s == 0u) s = c;
            const unsigned long long t0 = global_ns();
            while (s == 0u && ld_acquire_sys_u64(&counts[w]) < (unsigned long long)(r + 1))
                if (global_ns() - t0 > timeout_ns) s = kExchangeTimeout;
            atomicMax(&t_end[r], global_ns());
        }
        s = __shfl_sync(0xffffffffu, s, 0);
    }
    if (lane == 0) quiet_and_count(s, st, peer, qp);
}

// Thread scope: message m goes to slot m % slots; thread t posts messages t, t + nthreads, ...
// Thread t's warp w = t / 32 posts on qp_id = w % queues (the lanes of a warp share a queue, so
// they can share a reservation).
__global__ void gda_put_thread_kernel(uint8_t *dst, const uint8_t *src, size_t size, int msgs,
                                      int slots, int peer, int queues, KStatus *st) {
    const int nthreads = (int)(gridDim.x * blockDim.x);
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int qp = (t / 32) % queues;
    unsigned s = 0;
    for (int m = t; m < msgs; m += nthreads) {
        const size_t off = (size_t)(m % slots) * size;
        // Every lane runs the same iterations (msgs is a multiple of the thread count): meet here so
        // the lanes arrive at the put together and share one reservation (thread-scope puts
        // coalesce the converged lanes only).
        __syncwarp();
        const unsigned r = gda::put_nbi_qp(dst + off, src + off, size, peer, qp);
        if (r != 0u && s == 0u) s = r;
    }
    quiet_and_count(s, st, peer, qp);
}

__global__ void nvshmem_put_thread_kernel(uint8_t *dst, const uint8_t *src, size_t size, int msgs,
                                          int slots, int peer) {
    const int nthreads = (int)(gridDim.x * blockDim.x);
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    for (int m = t; m < msgs; m += nthreads) {
        const size_t off = (size_t)(m % slots) * size;
        nvshmem_putmem_nbi(dst + off, src + off, size, peer);
    }
    nvshmem_quiet();
}

__global__ void nvshmem_put_kernel(uint8_t *dst, const uint8_t *src, size_t size, int msgs,
                                   int slots, int peer) {
    const int nwarps = (int)(gridDim.x * blockDim.x / 32);
    const int w = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32);
    for (int m = w; m < msgs; m += nwarps) {
        const size_t off = (size_t)(m % slots) * size;
        nvshmemx_putmem_nbi_warp(dst + off, src + off, size, peer);
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) nvshmem_quiet();
}

// WQE slots reserved by posters so far, summed over the distinct queues of the queue table
// (entries that share a queue count it once). One thread.
__global__ void resv_kernel(unsigned long long *out) {
    const NvshmemEfaGdaDeviceState &s = nvshmem_efa_gda_state_d;
    const NvshmemEfaGdaQueue *t = reinterpret_cast<const NvshmemEfaGdaQueue *>(s.queues);
    const uint32_t n = t == nullptr ? 1u : s.n_queues;
    unsigned long long sum = 0ull;
    for (uint32_t i = 0; i < n; ++i) {
        const uint64_t ctrl = t == nullptr ? s.queue.ctrl : t[i].ctrl;
        bool seen = ctrl == 0u;
        for (uint32_t j = 0; j < i && !seen; ++j) seen = t[j].ctrl == ctrl;
        if (seen) continue;
        const NvshmemEfaGdaQueueCtrl *c = reinterpret_cast<const NvshmemEfaGdaQueueCtrl *>(ctrl);
        sum += *reinterpret_cast<const volatile unsigned long long *>(&c->resv);
    }
    *out = sum;
}

// The loaded state's queue table: entries, queues per PE, distinct queues (by control block).
__global__ void table_kernel(unsigned *out) {
    const NvshmemEfaGdaDeviceState &s = nvshmem_efa_gda_state_d;
    const NvshmemEfaGdaQueue *t = reinterpret_cast<const NvshmemEfaGdaQueue *>(s.queues);
    const uint32_t n = t == nullptr ? 1u : s.n_queues;
    unsigned distinct = 0;
    for (uint32_t i = 0; i < n; ++i) {
        bool seen = false;
        for (uint32_t j = 0; j < i && !seen; ++j) seen = t[j].ctrl == t[i].ctrl;
        if (!seen) ++distinct;
    }
    out[0] = n;
    out[1] = t == nullptr ? 1u : s.queues_per_pe;
    out[2] = t == nullptr ? 1u : distinct;
}

__global__ void check_kernel(const uint8_t *buf, size_t len, uint32_t seed, unsigned long long *bad) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride)
        if (buf[i] != pat_byte(seed, i)) atomicAdd(bad, 1ull);
}

#if defined(NVSHMEM_EFA_GDA_PROFILE)
// The device API's step profile (see NVSHMEM_EFA_GDA_PROFILE in nvshmem_efa_gda_device.cuh).
void prof_reset() {
    const unsigned long long z[NVSHMEM_EFA_GDA_PROF_N] = {};
    CK(cudaMemcpyToSymbol(nvshmem_efa_gda_prof_cycles, z, sizeof z));
    CK(cudaMemcpyToSymbol(nvshmem_efa_gda_prof_count, z, sizeof z));
}

void prof_print(const std::string &name, size_t size) {
    unsigned long long cyc[NVSHMEM_EFA_GDA_PROF_N], cnt[NVSHMEM_EFA_GDA_PROF_N];
    CK(cudaMemcpyFromSymbol(cyc, nvshmem_efa_gda_prof_cycles, sizeof cyc));
    CK(cudaMemcpyFromSymbol(cnt, nvshmem_efa_gda_prof_count, sizeof cnt));
    static const char *names[NVSHMEM_EFA_GDA_PROF_N] = {"reserve", "slots", "window", "write",
                                                        "turn", "ring", "poll", "quiet", "polls"};
    printf("  profile %s %zu B (cycles summed over threads / count = mean cycles):", name.c_str(), size);
    for (int k = 0; k < NVSHMEM_EFA_GDA_PROF_N; ++k)
        printf(" %s %llu x %.0f", names[k], cnt[k], cnt[k] ? (double)cyc[k] / (double)cnt[k] : 0.0);
    printf("\n");
}
#endif

struct Row {
    std::string path;
    size_t size;
    int msgs;
    double usec;
    unsigned long long wqes;
};

void usage(const char *argv0) {
    printf("usage: %s CSV_PATH [--paths gda,proxy|p2p] [--max-bytes N] [--budget-s S] [--blocks B] "
           "[--warps W] [--scope warp|thread] [--queues Q] [--count-every N] [--exchange R [--size S] "
           "[--tokens T]]\n"
           "CSV columns: path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s,wqes,wqe_rate_mwps\n"
           "NVSHMEM_EFA_SOFT_NULL=1: path gda measures the WQE post rate (no data moves)\n",
           argv0);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
        usage(argv[0]);
        return argc < 2 ? 2 : 0;
    }
    const std::string csv_path = argv[1];
    std::string paths_arg = "gda,proxy";
    size_t max_bytes = 4ull << 20;
    double budget_s = 70.0;
    int blocks = 4, warps = 4, queues = 1, count_every = 0, exchange = 0, tokens = 4;
    size_t xsize = 7168;
    std::string scope = "warp";
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        auto need = [&](const char *what) -> const char * {
            if (i + 1 >= argc) {
                printf("%s needs a value\n", what);
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--paths") paths_arg = need("--paths");
        else if (a == "--max-bytes") max_bytes = strtoull(need("--max-bytes"), nullptr, 0);
        else if (a == "--budget-s") budget_s = atof(need("--budget-s"));
        else if (a == "--blocks") blocks = atoi(need("--blocks"));
        else if (a == "--warps") warps = atoi(need("--warps"));
        else if (a == "--scope") scope = need("--scope");
        else if (a == "--queues") queues = atoi(need("--queues"));
        else if (a == "--count-every") count_every = atoi(need("--count-every"));
        else if (a == "--exchange") exchange = atoi(need("--exchange"));
        else if (a == "--size") xsize = strtoull(need("--size"), nullptr, 0);
        else if (a == "--tokens") tokens = atoi(need("--tokens"));
        else {
            usage(argv[0]);
            return 2;
        }
    }
    std::vector<std::string> paths;
    for (size_t p = 0; p <= paths_arg.size();) {
        size_t q = paths_arg.find(',', p);
        if (q == std::string::npos) q = paths_arg.size();
        if (q > p) paths.push_back(paths_arg.substr(p, q - p));
        p = q + 1;
    }
    for (const std::string &p : paths)
        if (p != "gda" && p != "proxy" && p != "p2p") {
            printf("unknown path '%s'\n", p.c_str());
            return 2;
        }
    if (blocks < 1 || warps < 1 || warps > 32 || queues < 1 || max_bytes < 8 || max_bytes > kWindow ||
        (scope != "warp" && scope != "thread") || count_every < 0) {
        usage(argv[0]);
        return 2;
    }
    if (exchange < 0 || tokens < 1 ||
        (exchange > 0 && (scope != "warp" || paths_arg != "gda" || count_every != 0 || xsize < 1 ||
                          (size_t)blocks * warps * tokens * xsize > kWindow))) {
        printf("--exchange R needs R > 0, --scope warp, --paths gda, no --count-every, and blocks x warps "
               "x tokens x size within the %zu MiB window\n",
               kWindow >> 20);
        return 2;
    }
    if (count_every > 0 && (scope != "warp" || paths_arg != "gda")) {
        printf("--count-every needs --scope warp and --paths gda\n");
        return 2;
    }

    const char *null_env = getenv("NVSHMEM_EFA_SOFT_NULL");
    const bool null_mode = null_env != nullptr && std::string(null_env) == "1";
    // The software queue's copy route, when not the default (kernel): gda rows are then named
    // gda-host.
    const char *route_env = getenv("NVSHMEM_EFA_SOFT_IPC");
    const std::string route = route_env != nullptr ? std::string(route_env) : std::string();
    const std::string gda_suffix = route == "host" ? "-" + route : "";

    job_init(&argc, &argv, 120);
    const int me = g_job.pe, npes = g_job.npes;
    if (npes != 2) fatal(__FILE__, __LINE__, "gda_bench needs exactly 2 PEs (got %d)", npes);
    const int peer = 1 - me;
    watchdog_arm("setup", 60);
    uint8_t *dst = (uint8_t *)sym_malloc(kWindow, "window");
    uint8_t *src = (uint8_t *)sym_malloc(kWindow, "source");
    // One count word per posting warp (symmetric, GPU memory: the target applies counts there).
    const int count_words = blocks * warps;
    unsigned long long *counts =
        (unsigned long long *)sym_malloc((size_t)count_words * sizeof(unsigned long long), "counts");
    std::vector<unsigned long long> hcounts((size_t)count_words);
    const uint32_t seed = make_seed(0, 77);
    fill_pattern(src, kWindow, seed);
    KStatus *kst = nullptr;
    unsigned long long *dbad = nullptr, *dresv = nullptr;
    CK(cudaMalloc(&kst, sizeof *kst));
    CK(cudaMalloc(&dbad, sizeof *dbad));
    CK(cudaMalloc(&dresv, sizeof *dresv));
    CK(cudaDeviceSynchronize());
    // Frees what every path allocated, finalizes, and gives the exit status.
    auto finish = [&](int failed) {
        CK(cudaFree(dresv));
        nvshmem_free(counts);
        nvshmem_free(dst);
        nvshmem_free(src);
        job_finalize(60);
        return failed ? 1 : 0;
    };
    const bool p2p_mapped = nvshmem_ptr(dst, peer) != nullptr;
    bool need_gda = false;
    for (const std::string &p : paths) need_gda = need_gda || p == "gda";
    int load_rc = 0;
    if (need_gda) load_rc = nvshmem_efa_gda_load_device_state(0);
    unsigned table[3] = {0u, 0u, 0u};
    if (need_gda && load_rc == NVSHMEM_EFA_GDA_LOAD_OK) {
        unsigned *dt = nullptr;
        CK(cudaMalloc(&dt, sizeof table));
        table_kernel<<<1, 1>>>(dt);
        CK_LAUNCH();
        CK(cudaMemcpy(table, dt, sizeof table, cudaMemcpyDeviceToHost));
        CK(cudaFree(dt));
    }
    watchdog_disarm();
    int ok = 1;
    if (me == 0) {
        printf("gda_bench: paths %s, %d blocks x %d warps, %s scope, %d queue(s), 8 B .. %zu B, budget "
               "%.0f s, peer %s, count every %d put(s)%s\n",
               paths_arg.c_str(), blocks, warps, scope.c_str(), queues, max_bytes, budget_s,
               p2p_mapped ? "mapped (P2P)" : "not mapped (remote transport)", count_every,
               count_every == 0 ? " (none)" : "");
        if (need_gda && load_rc == NVSHMEM_EFA_GDA_LOAD_OK) {
            printf("gda_bench: queue table: %u entries, %u per PE, %u distinct queue(s)\n", table[0],
                   table[1], table[2]);
            if ((unsigned)queues > table[1])
                printf("gda_bench: WARNING: --queues %d exceeds the table's %u queues per PE (set "
                       "NVSHMEM_IBGDA_NUM_RC_PER_PE): qp ids wrap\n",
                       queues, table[1]);
        }
        if (null_mode)
            printf("gda_bench: NULL-CONSUMER MODE (NVSHMEM_EFA_SOFT_NULL=1): path gda posts WQEs that the "
                   "software queue completes without moving data; its rows measure the WQE post rate and are "
                   "not verified\n");
        for (const std::string &p : paths) {
            if (p == "p2p" && !p2p_mapped) {
                printf("FAIL: path p2p requested but NVSHMEM does not map the peer (P2P disabled?)\n");
                ok = 0;
            }
            if ((p == "proxy" || p == "gda") && p2p_mapped) {
                printf("FAIL: path %s requested but NVSHMEM maps the peer: run with NVSHMEM_DISABLE_P2P=1\n",
                       p.c_str());
                ok = 0;
            }
        }
        if (need_gda && load_rc != NVSHMEM_EFA_GDA_LOAD_OK) {
            printf("FAIL: nvshmem_efa_gda_load_device_state returned %d: no GDA queue\n", load_rc);
            ok = 0;
        }
    }
    {
        std::vector<int> all(2);
        job_allgather(&ok, all.data(), sizeof ok);
        ok = all[0] && all[1];
    }
    if (!ok) {
        job_finalize(60);
        return 1;
    }

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    if (exchange > 0) {
        // --exchange: both PEs run the rounds (see the file's comment).
        const int nw = blocks * warps;
        const size_t region = (size_t)nw * (size_t)tokens * xsize;
        unsigned long long *ts = nullptr, *te = nullptr;
        CK(cudaMalloc(&ts, (size_t)exchange * sizeof(unsigned long long)));
        CK(cudaMalloc(&te, (size_t)exchange * sizeof(unsigned long long)));
        std::vector<unsigned long long> hs((size_t)exchange), he((size_t)exchange);
        int xfail = 0;
        auto run_rounds = [&](int rounds, float *ms) {
            CK(cudaMemset(dst, 0, region));
            CK(cudaMemset(counts, 0, (size_t)count_words * sizeof(unsigned long long)));
            CK(cudaMemset(kst, 0, sizeof *kst));
            CK(cudaMemset(ts, 0xff, (size_t)rounds * sizeof(unsigned long long)));
            CK(cudaMemset(te, 0, (size_t)rounds * sizeof(unsigned long long)));
            CK(cudaDeviceSynchronize());
            job_barrier();
            CK(cudaEventRecord(e0));
            gda_exchange_kernel<<<blocks, warps * 32>>>(dst, src, xsize, tokens, rounds, peer, queues, counts, ts,
                                                        te, kst, 10000000000ull);
            CK_LAUNCH();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(ms, e0, e1));
            KStatus h;
            CK(cudaMemcpy(&h, kst, sizeof h, cudaMemcpyDeviceToHost));
            if (h.bad) {
                printf("FAIL: PE %d exchange: %u warps saw status 0x%x%s\n", me, h.bad, h.first,
                       h.first == kExchangeTimeout ? " (a count did not arrive within 10 s)" : "");
                xfail = 1;
            }
            job_barrier();  // both PEs' quiets returned: every count and region of the run is in place
            CK(cudaMemcpy(hcounts.data(), counts, hcounts.size() * sizeof(unsigned long long),
                          cudaMemcpyDeviceToHost));
            for (int w = 0; w < nw && !xfail; ++w)
                if (hcounts[(size_t)w] != (unsigned long long)rounds) {
                    printf("VERIFY FAIL: PE %d exchange: count word %d is %llu, want %d\n", me, w,
                           hcounts[(size_t)w], rounds);
                    xfail = 1;
                }
            CK(cudaMemset(dbad, 0, sizeof *dbad));
            check_kernel<<<grid_for(region, 256, 4096), 256>>>(dst, region, seed, dbad);
            CK_LAUNCH();
            unsigned long long bad = 0;
            CK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
            if (bad) {
                printf("VERIFY FAIL: PE %d exchange: %llu of %zu bytes wrong\n", me, bad, region);
                xfail = 1;
            }
        };
        if (me == 0)
            printf("gda_bench: exchange: %d rounds, %d warps (experts) x %d puts of %zu B each way per round, "
                   "then a count each; %d queue(s)\n",
                   exchange, nw, tokens, xsize, queues);
        watchdog_arm("exchange warm-up", 60);
        float ms = 0.f;
        run_rounds(std::min(exchange, 8), &ms);
        watchdog_disarm();
        watchdog_arm("exchange", 120);
        run_rounds(exchange, &ms);
        watchdog_disarm();
        CK(cudaMemcpy(hs.data(), ts, hs.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(he.data(), te, he.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        std::vector<double> us((size_t)exchange);
        for (int r = 0; r < exchange; ++r)
            us[(size_t)r] = he[(size_t)r] >= hs[(size_t)r] && he[(size_t)r] != 0ull
                                ? (double)(he[(size_t)r] - hs[(size_t)r]) / 1e3
                                : -1.0;
        std::vector<double> all_us((size_t)exchange * 2);
        job_allgather(us.data(), all_us.data(), us.size() * sizeof(double));
        double kus = (double)ms * 1000.0;
        std::vector<double> all_k(2);
        job_allgather(&kus, all_k.data(), sizeof kus);
        std::vector<int> vf(2);
        job_allgather(&xfail, vf.data(), sizeof xfail);
        xfail = vf[0] || vf[1];
        if (me == 0) {
            const std::string rp = csv_path + ".rounds.csv";
            FILE *rf = fopen(rp.c_str(), "w");
            if (rf == nullptr) fatal(__FILE__, __LINE__, "cannot write %s", rp.c_str());
            fprintf(rf, "pe,round,usec\n");
            for (int pe = 0; pe < 2; ++pe)
                for (int r = 0; r < exchange; ++r)
                    fprintf(rf, "%d,%d,%.3f\n", pe, r, all_us[(size_t)pe * exchange + r]);
            fclose(rf);
            FILE *f = fopen(csv_path.c_str(), "w");
            if (f == nullptr) fatal(__FILE__, __LINE__, "cannot write %s", csv_path.c_str());
            fprintf(f, "path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s,wqes,wqe_rate_mwps\n");
            const int msgs = exchange * nw * tokens;
            for (int pe = 0; pe < 2; ++pe) {
                std::vector<double> v(all_us.begin() + (long)pe * exchange, all_us.begin() + (long)(pe + 1) * exchange);
                std::sort(v.begin(), v.end());
                const double k = all_k[(size_t)pe];
                printf("  %-12s PE %d %8zu B %4d rounds: round median %9.1f us  p90 %9.1f  max %9.1f  min %9.1f; "
                       "kernel %10.1f us (%.1f us per round, %.3f GB/s each way)\n",
                       "gda-exchange", pe, xsize, exchange, v[v.size() / 2], v[v.size() * 9 / 10], v.back(), v.front(),
                       k, k / exchange, (double)msgs * (double)xsize / k / 1e3);
                fprintf(f, "gda-exchange,%zu,%d,%.3f,%.6f,%.6f,0,0\n", xsize, msgs, k, msgs / k,
                        (double)msgs * (double)xsize / k / 1e3);
            }
            fclose(f);
            printf("gda_bench: exchange rows -> %s, rounds -> %s%s\n", csv_path.c_str(), rp.c_str(),
                   xfail ? "; VERIFY FAILED" : "");
        }
        CK(cudaFree(ts));
        CK(cudaFree(te));
        return finish(xfail);
    }

    std::vector<Row> rows;
    const double t_start = now_s();
    int verify_fail = 0;
    bool budget_hit = false;
    const bool thread_scope = scope == "thread";
    // Posters: warps, or threads with --scope thread.
    const int nwarps = blocks * warps * (thread_scope ? 32 : 1);

    // Runs one measurement on PE 0 (PE 1 only takes part in the barriers) and verifies it on PE 1.
    // The queue's reservation counter on this PE (0 without a GDA queue).
    auto resv_now = [&]() -> unsigned long long {
        resv_kernel<<<1, 1>>>(dresv);
        CK_LAUNCH();
        unsigned long long v = 0;
        CK(cudaMemcpy(&v, dresv, sizeof v, cudaMemcpyDeviceToHost));
        return v;
    };
    auto measure = [&](const std::string &path, size_t size, int msgs, double *usec,
                       unsigned long long *wqes) {
        const bool verify = !(null_mode && path == "gda");
        const int slots = (int)std::max<size_t>(1, std::min<size_t>(kWindow / size, (size_t)msgs));
        CK(cudaMemset(dst, 0, (size_t)slots * size));
        CK(cudaMemset(counts, 0, (size_t)count_words * sizeof(unsigned long long)));
        CK(cudaMemset(kst, 0, sizeof *kst));
        CK(cudaDeviceSynchronize());
        job_barrier();
        float ms = 0.f;
        unsigned long long posted = 0;
        if (me == 0) {
            const unsigned long long resv0 = path == "gda" ? resv_now() : 0ull;
            CK(cudaEventRecord(e0));
            if (path == "gda" && thread_scope)
                gda_put_thread_kernel<<<blocks, warps * 32>>>(dst, src, size, msgs, slots, peer,
                                                              queues, kst);
            else if (path == "gda")
                gda_put_kernel<<<blocks, warps * 32>>>(dst, src, size, msgs, slots, peer, queues,
                                                       kst, path == "gda" ? count_every : 0, counts);
            else if (thread_scope)
                nvshmem_put_thread_kernel<<<blocks, warps * 32>>>(dst, src, size, msgs, slots, peer);
            else
                nvshmem_put_kernel<<<blocks, warps * 32>>>(dst, src, size, msgs, slots, peer);
            CK_LAUNCH();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (path == "gda") posted = resv_now() - resv0;
            KStatus h;
            CK(cudaMemcpy(&h, kst, sizeof h, cudaMemcpyDeviceToHost));
            if (h.bad) {
                printf("FAIL: %s %zu B: %u warps saw status 0x%x\n", path.c_str(), size, h.bad, h.first);
                verify_fail = 1;
            }
        }
        job_barrier();  // PE 0's puts are complete (quiet) before PE 1 looks
        if (me == 1 && verify) {
            CK(cudaMemset(dbad, 0, sizeof *dbad));
            check_kernel<<<grid_for((size_t)slots * size, 256, 4096), 256>>>(dst, (size_t)slots * size,
                                                                            seed, dbad);
            CK_LAUNCH();
            unsigned long long bad = 0;
            CK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
            if (bad) {
                printf("VERIFY FAIL: %s %zu B: %llu of %zu bytes wrong at the target\n", path.c_str(),
                       size, bad, (size_t)slots * size);
                verify_fail = 1;
            }
            if (count_every > 0 && path == "gda") {
                // Warp w posted ceil((msgs - w) / nwarps) puts, so floor(that / N) counts.
                CK(cudaMemcpy(hcounts.data(), counts, hcounts.size() * sizeof(unsigned long long),
                              cudaMemcpyDeviceToHost));
                for (int w = 0; w < count_words; ++w) {
                    const long long puts = w < msgs ? (msgs - w + nwarps - 1) / nwarps : 0;
                    const unsigned long long want = (unsigned long long)(puts / count_every);
                    if (hcounts[(size_t)w] != want) {
                        printf("VERIFY FAIL: %s %zu B: count word %d is %llu, want %llu\n", path.c_str(),
                               size, w, hcounts[(size_t)w], want);
                        verify_fail = 1;
                        break;
                    }
                }
            }
        }
        double us = (double)ms * 1000.0;
        std::vector<double> all(2);
        job_allgather(&us, all.data(), sizeof us);
        *usec = all[0];
        std::vector<unsigned long long> wall(2);
        job_allgather(&posted, wall.data(), sizeof posted);
        *wqes = wall[0];
    };

    for (const std::string &path : paths) {
        for (size_t size = 8; size <= max_bytes && !budget_hit; size *= 2) {
            char step[96];
            snprintf(step, sizeof step, "%s %zu B", path.c_str(), size);
            watchdog_arm(step, 60);
#if defined(NVSHMEM_EFA_GDA_PROFILE)
            prof_reset();
#endif
            // Warm-up with a few messages per warp, then aim at ~60 ms per measurement. The first
            // size of a path warms up twice: its first messages pay for first use (queue and copy
            // route set-up), which would size its measurement far too small.
            double warm_us = 0;
            unsigned long long warm_wqes = 0;
            const int warm = nwarps * 4;
            if (size == 8) measure(path, size, warm, &warm_us, &warm_wqes);
            measure(path, size, warm, &warm_us, &warm_wqes);
            const double per_msg = std::max(warm_us / warm, 0.01);
            // The null consumer keeps up with far more messages per measurement (the launch and the
            // quiet would dominate 4096).
            // Thread scope has 32x the posters: allow more messages so each posts a few dozen.
            const double cap = null_mode && path == "gda" ? 1048576.0 : thread_scope ? 65536.0 : 4096.0;
            int msgs = (int)std::min(cap, std::max((double)nwarps * 4, 60000.0 / per_msg));
            msgs = std::min<int>(msgs, (int)std::max<size_t>((size_t)nwarps, (512ull << 20) / size));
            msgs = (msgs + nwarps - 1) / nwarps * nwarps;
            double best = 0;
            unsigned long long best_wqes = 0;
            for (int rep = 0; rep < 3; ++rep) {
                double us = 0;
                unsigned long long wqes = 0;
                measure(path, size, msgs, &us, &wqes);
                if (rep == 0 || us < best) {
                    best = us;
                    best_wqes = wqes;
                }
            }
            watchdog_disarm();
            const std::string name = (null_mode && path == "gda" ? std::string("gda-null") : path) +
                                     (path == "gda" && !null_mode ? gda_suffix : std::string()) +
                                     (thread_scope ? "-thread" : "") +
                                     (path == "gda" && count_every > 0
                                          ? "-count" + std::to_string(count_every)
                                          : std::string());
            rows.push_back({name, size, msgs, best, best_wqes});
            if (me == 0)
                printf("  %-8s %10zu B %7d msgs %12.1f us %10.4f Mmsg/s %9.3f GB/s %9.3f MWQE/s\n",
                       name.c_str(), size, msgs, best, msgs / best, (double)msgs * (double)size / best / 1e3,
                       best_wqes / best);
#if defined(NVSHMEM_EFA_GDA_PROFILE)
            if (me == 0 && path == "gda") prof_print(name, size);
#endif
            // Both PEs decide together (PE 0's clock) whether the budget allows another size.
            int stop = (now_s() - t_start) > budget_s ? 1 : 0;
            std::vector<int> st(2);
            job_allgather(&stop, st.data(), sizeof stop);
            budget_hit = st[0] != 0;
        }
    }
    int vf_all = 0;
    {
        std::vector<int> all(2);
        job_allgather(&verify_fail, all.data(), sizeof verify_fail);
        vf_all = all[0] || all[1];
    }
    if (me == 0) {
        FILE *f = fopen(csv_path.c_str(), "w");
        if (f == nullptr) fatal(__FILE__, __LINE__, "cannot write %s", csv_path.c_str());
        fprintf(f, "path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s,wqes,wqe_rate_mwps\n");
        for (const Row &r : rows)
            fprintf(f, "%s,%zu,%d,%.3f,%.6f,%.6f,%llu,%.6f\n", r.path.c_str(), r.size, r.msgs, r.usec,
                    r.msgs / r.usec, (double)r.msgs * (double)r.size / r.usec / 1e3, r.wqes,
                    r.wqes / r.usec);
        fclose(f);
        printf("gda_bench: %zu rows -> %s%s%s\n", rows.size(), csv_path.c_str(),
               budget_hit ? " (stopped at the time budget)" : "", vf_all ? "; VERIFY FAILED" : "");
    }
    return finish(vf_all);
}
