// Device-initiated put bandwidth and latency, PE 0 -> PE 1.
//
// One thread block on PE 0 runs, per iteration, nvshmemx_putmem_nbi_block(size) followed by
// nvshmem_quiet() (so every iteration is a completed put), for message sizes 8 B .. 64 MiB.
// Iteration counts shrink with the size, each size stops after a time cap, and the whole sweep
// stops after a total budget, so a slow path still finishes in bounded time. After every size
// PE 1 checks the received bytes; a wrong byte makes the run fail.
//
// Usage: nvshmem_bench CSV_PATH [--label NAME] [--max-bytes N] [--cap-ms MS] [--budget-s S]
// CSV columns: path,size_bytes,iters,usec_per_op,gbytes_per_s   (path = the label)
#include "common.cuh"

#include <string>

using namespace gt;

namespace {

struct BenchOut {
    unsigned long long ns;
    int iters;
};

__global__ void put_bw_kernel(uint8_t *dst, const uint8_t *src, size_t size, int iters, int peer,
                              uint64_t cap_ns, BenchOut *out) {
    __shared__ int stop;
    __shared__ uint64_t t0;
    if (threadIdx.x == 0) {
        stop = 0;
        t0 = dev_now_ns();
    }
    __syncthreads();
    int done = 0;
    for (int i = 0; i < iters; ++i) {
        nvshmemx_putmem_nbi_block(dst, src, size, peer);
        __syncthreads();
        if (threadIdx.x == 0) {
            nvshmem_quiet();
            if (dev_now_ns() - t0 > cap_ns) stop = 1;
        }
        __syncthreads();
        done = i + 1;
        if (stop) break;
    }
    if (threadIdx.x == 0) {
        out->ns = dev_now_ns() - t0;
        out->iters = done;
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
    printf("usage: %s CSV_PATH [--label NAME] [--max-bytes N] [--cap-ms MS] [--budget-s S]\n",
           argv0);
}

}  // namespace

int main(int argc, char **argv) {
    const char *csv_path = nullptr;
    std::string label = "nvshmem";
    size_t max_bytes = 64u << 20;
    double cap_ms = 1000, warm_cap_ms = 250, budget_s = 45;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if ((a == "-h" || a == "--help")) {
            usage(argv[0]);
            return 0;
        } else if (a == "--label" && i + 1 < argc) {
            label = argv[++i];
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
    if (csv_path == nullptr || max_bytes < 8 || cap_ms <= 0 || budget_s <= 0) {
        usage(argv[0]);
        return 2;
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
    CK(cudaMalloc(&dout, sizeof(BenchOut)));
    const bool mapped = nvshmem_ptr(dst, 1) != nullptr;
    watchdog_disarm();

    if (pe == 0) {
        int maj = 0, min = 0, patch = 0;
        nvshmemx_vendor_get_version_info(&maj, &min, &patch);
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, g_job.device));
        printf("nvshmem_bench [%s]: NVSHMEM %d.%d.%d, %d PEs, %s, pe 0 -> pe 1 (%s), 1 block x 256 "
               "threads, nvshmemx_putmem_nbi_block + nvshmem_quiet per iteration\n",
               label.c_str(), maj, min, patch, npes, prop.name,
               mapped ? "pe 1 mapped: P2P path" : "pe 1 not mapped: remote transport path");
        printf("%12s %8s %12s %10s\n", "size_bytes", "iters", "usec_per_op", "GB/s");
    }

    const double t_start = now_s();
    bool verify_failed = false;
    int rows = 0, skipped = 0;
    for (size_t size = 8; size <= max_bytes; size *= 2) {
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
        if (pe == 0) fill_region(src, size, seed);
        if (pe == 1) CK(cudaMemset(dst, kSentinel, size + 4096));
        CK(cudaDeviceSynchronize());
        nvshmem_barrier_all();

        int iters = iters_for(size);
        BenchOut h = {0, 0};
        if (pe == 0) {
            int warm = std::min(iters, 32);
            put_bw_kernel<<<1, 256>>>(dst, src, size, warm, 1, (uint64_t)(warm_cap_ms * 1e6), dout);
            CK_LAUNCH();
            CK(cudaDeviceSynchronize());
            put_bw_kernel<<<1, 256>>>(dst, src, size, iters, 1, (uint64_t)(cap_ms * 1e6), dout);
            CK_LAUNCH();
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(&h, dout, sizeof h, cudaMemcpyDeviceToHost));
        }
        nvshmem_barrier_all();

        long long bad = 0;
        if (pe == 1) {
            const size_t one[1] = {size};
            Layout L = make_layout(one, 1, 0, 0, false);
            L.r[0].seed = seed;
            L.span = size + 4096;
            bad = (long long)verify_layout(dst, L, [&](const char *msg) {
                printf("  [pe 1] VERIFY FAILED at %zu bytes: %s\n", size, msg);
            });
        }
        bad = job_max_ll(bad);
        watchdog_disarm();

        if (pe == 0) {
            const double ns = (double)h.ns;
            const double usec = h.iters > 0 ? ns / h.iters / 1000.0 : 0.0;
            const double gbps = ns > 0 ? (double)size * h.iters / ns : 0.0;
            printf("%12zu %8d %12.3f %10.3f%s\n", size, h.iters, usec, gbps,
                   bad ? "   <- DATA WRONG" : "");
            fprintf(csv, "%s,%zu,%d,%.4f,%.4f\n", label.c_str(), size, h.iters, usec, gbps);
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
