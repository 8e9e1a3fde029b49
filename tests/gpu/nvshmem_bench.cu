// Device-initiated put or get bandwidth and latency between PE 0 and PE 1, run by PE 0.
//
// --op put (default): per iteration, nvshmemx_putmem_nbi_block followed by nvshmem_quiet() (so
// every iteration is a completed put) from PE 0 into PE 1. --op get: per iteration, a blocking
// nvshmemx_getmem_block from PE 1 into PE 0 (the pattern of PyTorch's all_to_all_vdev). With
// --blocks N each of N thread blocks moves its 1/N of the size per iteration (sizes below N x 8
// bytes are skipped). Message sizes 8 B .. 64 MiB. Iteration counts shrink with the size, each
// block stops after a time cap, and the whole sweep stops after a total budget, so a slow path
// still finishes in bounded time. After every size the receiving PE checks the bytes; a wrong
// byte makes the run fail. --op barrier: every PE runs nvshmemx_barrier_all_block() a fixed number
// of times in one block (collective launch, implies --bidir); one row (size 8), no data.
// --threads T: threads per block (default 256). --collective: launched
// with nvshmemx_collective_launch (a cooperative launch, as PyTorch launches its NVSHMEM kernels)
// instead of <<<>>>. --all-quiet: the non-blocking call (nvshmemx_getmem_nbi_block or
// nvshmemx_putmem_nbi_block), then nvshmem_quiet() by every thread of the block, as PyTorch's
// all_to_all_vdev kernel ends. --bidir: both PEs run the same loop towards each other at once (each
// checks what it received); the figures printed are PE 0's.
//
// Usage: nvshmem_bench CSV_PATH [--label NAME] [--op put|get|barrier] [--blocks N] [--threads T]
//                      [--collective] [--all-quiet] [--bidir] [--max-bytes N] [--cap-ms MS]
//                      [--budget-s S]
// CSV columns: path,size_bytes,iters,usec_per_op,gbytes_per_s   (path = the label; with several
// blocks: iters = the slowest block's, usec_per_op = the slowest block's time per iteration,
// GB/s = the sum over the blocks)
#include "common.cuh"

#include <algorithm>
#include <string>
#include <vector>

using namespace gt;

namespace {

struct BenchOut {
    unsigned long long ns;
    int iters;
};

// Block b moves bytes [b * slice, (b + 1) * slice) of the message; out[b] gets its time.
__global__ void bw_kernel(bool get, bool all_quiet, uint8_t *dst, const uint8_t *src,
                          size_t slice, int iters, int peer, uint64_t cap_ns, BenchOut *out) {
    __shared__ int stop;
    __shared__ uint64_t t0;
    const size_t off = (size_t)blockIdx.x * slice;
    if (threadIdx.x == 0) {
        stop = 0;
        t0 = dev_now_ns();
    }
    __syncthreads();
    int done = 0;
    for (int i = 0; i < iters; ++i) {
        if (get && all_quiet) {
            nvshmemx_getmem_nbi_block(dst + off, src + off, slice, peer);
            nvshmem_quiet();
        } else if (get) {
            nvshmemx_getmem_block(dst + off, src + off, slice, peer);
        } else {
            nvshmemx_putmem_nbi_block(dst + off, src + off, slice, peer);
            __syncthreads();
            if (all_quiet || threadIdx.x == 0) nvshmem_quiet();
        }
        if (threadIdx.x == 0 && dev_now_ns() - t0 > cap_ns) stop = 1;
        __syncthreads();
        done = i + 1;
        if (stop) break;
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x].ns = dev_now_ns() - t0;
        out[blockIdx.x].iters = done;
    }
}

// Device barriers, the same count on every PE (no time cap: a PE that stopped early would leave the
// others waiting).
__global__ void barrier_kernel(int iters, BenchOut *out) {
    const uint64_t t0 = dev_now_ns();
    for (int i = 0; i < iters; ++i) nvshmemx_barrier_all_block();
    if (threadIdx.x == 0) {
        out[0].ns = dev_now_ns() - t0;
        out[0].iters = iters;
    }
}

int iters_for(size_t size) {
    // About 4 GiB per size, between 16 and 20000 iterations.
    unsigned long long it = (4ULL << 30) / size;
    if (it < 16) it = 16;
    if (it > 20000) it = 20000;
    return (int)it;
}

void usage(const char *argv0) {
    printf("usage: %s CSV_PATH [--label NAME] [--op put|get|barrier] [--blocks N] [--threads T] "
           "[--collective] [--all-quiet] [--bidir] [--max-bytes N] "
           "[--cap-ms MS] [--budget-s S]\n",
           argv0);
}

}  // namespace

int main(int argc, char **argv) {
    const char *csv_path = nullptr;
    std::string label = "nvshmem";
    size_t max_bytes = 64u << 20;
    double cap_ms = 1000, warm_cap_ms = 250, budget_s = 45;
    bool get = false, barrier = false, bidir = false, collective = false, all_quiet = false;
    int blocks = 1, threads = 256;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if ((a == "-h" || a == "--help")) {
            usage(argv[0]);
            return 0;
        } else if (a == "--label" && i + 1 < argc) {
            label = argv[++i];
        } else if (a == "--op" && i + 1 < argc) {
            std::string op = argv[++i];
            if (op != "put" && op != "get" && op != "barrier") {
                printf("--op must be put, get or barrier, got '%s'\n", op.c_str());
                return 2;
            }
            get = op == "get";
            barrier = op == "barrier";
        } else if (a == "--all-quiet") {
            all_quiet = true;
        } else if (a == "--collective") {
            collective = true;
        } else if (a == "--threads" && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (a == "--bidir") {
            bidir = true;
        } else if (a == "--blocks" && i + 1 < argc) {
            blocks = atoi(argv[++i]);
        } else if (a == "--max-bytes" && i + 1 < argc) {
            max_bytes = (size_t)strtoull(argv[++i], nullptr, 0);
        } else if (a == "--cap-ms" && i + 1 < argc) {
            cap_ms = atof(argv[++i]);
        } else if (a == "--budget-s" && i + 1 < argc) {
            budget_s = atof(argv[++i]);
        } else if (a.size() > 0 && a[0] != '-' && csv_path == nullptr) {
            csv_path = argv[i];
        } else {
            printf("unknown argument '%s'\n", argv[i]);
            usage(argv[0]);
            return 2;
        }
    }
    if (csv_path == nullptr || max_bytes < 8 || cap_ms <= 0 || budget_s <= 0 || blocks < 1 ||
        blocks > 1024 || threads < 32 || threads > 1024 || threads % 32 != 0) {
        usage(argv[0]);
        return 2;
    }

    if (barrier) {
        bidir = true;
        collective = true;
        blocks = 1;
        max_bytes = 8;
    }
    job_init(&argc, &argv, 120);
    const int pe = g_job.pe, npes = g_job.npes;
    if (npes < 2) fatal(__FILE__, __LINE__, "needs 2 PEs, got %d", npes);

    FILE *csv = nullptr;
    if (pe == 0) {
        csv = fopen(csv_path, "w");
        if (csv == nullptr)
            fatal(__FILE__, __LINE__, "cannot write %s: %s", csv_path, strerror(errno));
        fprintf(csv, "path,size_bytes,iters,usec_per_op,gbytes_per_s\n");
    }

    // Each step may take cap + warm-up cap + verification; the watchdog allows generously more.
    const unsigned step_timeout = (unsigned)(cap_ms / 1000.0 + warm_cap_ms / 1000.0) + 60;
    watchdog_arm("symmetric allocations", step_timeout);
    uint8_t *src = (uint8_t *)sym_malloc(max_bytes, "source");
    uint8_t *dst = (uint8_t *)sym_malloc(max_bytes + 4096, "destination");
    BenchOut *dout = nullptr;
    CK(cudaMalloc(&dout, sizeof(BenchOut) * blocks));
    const bool mapped = nvshmem_ptr(get ? src : dst, 1) != nullptr;
    // dst receives on `receiver` (and is checked there); src is filled on `sender`; with --bidir
    // every PE is both and runs the loop towards the other.
    const int receiver = get ? 0 : 1, sender = get ? 1 : 0;
    const bool fills = !barrier && (bidir || pe == sender);
    const bool checks = !barrier && (bidir || pe == receiver);
    const bool runs = bidir || pe == 0;
    const int peer = pe == 0 ? 1 : 0;
    watchdog_disarm();

    if (pe == 0) {
        int maj = 0, min = 0, patch = 0;
        nvshmemx_vendor_get_version_info(&maj, &min, &patch);
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, g_job.device));
        printf("nvshmem_bench [%s]: NVSHMEM %d.%d.%d, %d PEs, %s, %s (%s), %d block(s) x %d "
               "threads%s, %s per iteration\n",
               label.c_str(), maj, min, patch, npes, prop.name,
               bidir ? (get ? "pe 0 and pe 1 get from each other" : "pe 0 <-> pe 1")
                     : (get ? "pe 0 gets from pe 1" : "pe 0 -> pe 1"),
               mapped ? "pe 1 mapped: P2P path" : "pe 1 not mapped: remote transport path", blocks,
               threads, collective ? " (nvshmemx_collective_launch)" : "",
               barrier ? "nvshmemx_barrier_all_block"
               : get   ? (all_quiet ? "nvshmemx_getmem_nbi_block + nvshmem_quiet in every thread"
                                : "nvshmemx_getmem_block (blocking)")
                   : (all_quiet ? "nvshmemx_putmem_nbi_block + nvshmem_quiet in every thread"
                                : "nvshmemx_putmem_nbi_block + nvshmem_quiet"));
        printf("%12s %8s %12s %10s\n", "size_bytes", "iters", "usec_per_op", "GB/s");
    }

    // One run of the kernel: <<<>>> or NVSHMEM's collective (cooperative) launch.
    // One run of the kernel (the barrier kernel in --op barrier, else bw_kernel on `slice` bytes
    // per block): <<<>>> or NVSHMEM's collective (cooperative) launch.
    auto launch = [&](size_t slice, int it, uint64_t cap) {
        if (collective) {
            int p = peer;
            void *bw_args[] = {&get, &all_quiet, &dst, &src, &slice, &it, &p, &cap, &dout};
            void *barrier_args[] = {&it, &dout};
            const int rc = nvshmemx_collective_launch(
                barrier ? (const void *)barrier_kernel : (const void *)bw_kernel, dim3(blocks),
                dim3(threads), barrier ? barrier_args : bw_args, 0, 0);
            if (rc != 0) fatal(__FILE__, __LINE__, "nvshmemx_collective_launch failed: %d", rc);
        } else {
            bw_kernel<<<blocks, threads>>>(get, all_quiet, dst, src, slice, it, peer, cap, dout);
        }
        CK_LAUNCH();
    };

    const double t_start = now_s();
    bool verify_failed = false;
    int rows = 0, skipped = 0;
    for (size_t size = 8; size <= max_bytes; size *= 2) {
        if (size < (size_t)blocks * 8 || size % (size_t)blocks != 0) continue;
        // PE 0 decides whether the budget allows another size; everybody follows.
        long long stop = (pe == 0 && now_s() - t_start > budget_s) ? 1 : 0;
        if (job_max_ll(stop)) {
            ++skipped;
            continue;
        }
        char step[64];
        snprintf(step, sizeof step, "size %zu", size);
        watchdog_arm(step, step_timeout);

        const uint32_t seed = make_seed(0, (uint32_t)rows, 0xBE7C4u);
        if (fills) fill_region(src, size, seed);
        if (checks) CK(cudaMemset(dst, kSentinel, size + 4096));
        CK(cudaDeviceSynchronize());
        nvshmem_barrier_all();

        int iters = barrier ? 2000 : iters_for(size);
        std::vector<BenchOut> h(blocks, BenchOut{0, 0});
        const size_t slice = size / blocks;
        if (runs) {
            int warm = std::min(iters, 32);
            launch(slice, warm, (uint64_t)(warm_cap_ms * 1e6));
            CK(cudaDeviceSynchronize());
            launch(slice, iters, (uint64_t)(cap_ms * 1e6));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h.data(), dout, sizeof(BenchOut) * blocks, cudaMemcpyDeviceToHost));
        }
        nvshmem_barrier_all();

        long long bad = 0;
        if (checks) {
            const size_t one[1] = {size};
            Layout L = make_layout(one, 1, 0, 0, false);
            L.r[0].seed = seed;
            L.span = size + 4096;
            bad = (long long)verify_layout(dst, L, [&](const char *msg) {
                printf("  [pe %d] VERIFY FAILED at %zu bytes: %s\n", pe, size, msg);
            });
        }
        bad = job_max_ll(bad);
        watchdog_disarm();

        if (pe == 0) {
            // The slowest block's time per iteration and iterations; bandwidth summed over blocks.
            double usec = 0.0, gbps = 0.0;
            int min_iters = h[0].iters;
            for (const BenchOut &b : h) {
                if (b.iters > 0) usec = std::max(usec, (double)b.ns / b.iters / 1000.0);
                if (b.ns > 0) gbps += (double)slice * b.iters / (double)b.ns;
                min_iters = std::min(min_iters, b.iters);
            }
            printf("%12zu %8d %12.3f %10.3f%s\n", size, min_iters, usec, gbps,
                   bad ? "   <- DATA WRONG" : "");
            fprintf(csv, "%s,%zu,%d,%.4f,%.4f\n", label.c_str(), size, min_iters, usec, gbps);
            fflush(csv);
        }
        if (bad) verify_failed = true;
        ++rows;
    }
    if (pe == 0) {
        fclose(csv);
        printf("%d sizes measured in %.1f s%s%s; CSV: %s\n", rows, now_s() - t_start,
               skipped ? ", sizes skipped (time budget): " : "",
               skipped ? std::to_string(skipped).c_str() : "", csv_path);
        if (verify_failed) printf("FAIL: received data was wrong for at least one size\n");
    }
    watchdog_arm("freeing buffers", 60);
    CK(cudaFree(dout));
    nvshmem_free(dst);
    nvshmem_free(src);
    watchdog_disarm();
    job_finalize(60);
    return verify_failed ? 1 : 0;
}
