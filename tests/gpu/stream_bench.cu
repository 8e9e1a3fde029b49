// Device-initiated stream benchmark between PE 0 and PE 1, run by PE 0: per iteration, k
// non-blocking operations, then ONE nvshmem_quiet; the figure a user of any NVSHMEM program
// (all-to-all, halo exchange, pipelines) recognises. k (the window) depends on the size unless
// --window fixes it: 200 up to 64 KiB, 20 up to 4 MiB, 4 above (4 x 64 MiB already fills 256 MiB).
//
//   put         nvshmemx_putmem_nbi_block into PE 1
//   get         nvshmemx_getmem_nbi_block from PE 1
//   put_signal  nvshmemx_putmem_signal_nbi_block (NVSHMEM_SIGNAL_ADD 1 on a word of PE 1)
//   amo         nvshmem_uint64_atomic_add(word of PE 1, 1): non-fetching, 8 B only; the k atomics of
//               an iteration are spread over the threads of the block(s)
//   signal      nvshmemx_signal_op(word of PE 1, 1, NVSHMEM_SIGNAL_ADD): the same, as a signal
//
// With B blocks (--blocks 1,8: both), operation i of an iteration is issued by block i % B; every
// block ends its iteration with one nvshmem_quiet (thread 0, after __syncthreads). Operation i
// moves `size` bytes between slot i of the source and destination regions (slots are distinct
// within an iteration), so the k operations of a window never overlap. A run stops after --cap-ms
// per measurement (at least one iteration) and the whole sweep after --budget-s.
//
// Checked (unless --no-verify, which the null mode of the library needs): after every measurement
// the receiving PE compares its destination region with the source pattern (both PEs fill their
// source with the same bytes), and for put_signal, amo and signal the word at PE 1 must equal the
// number of operations issued.
//
// Usage: stream_bench CSV_PATH [--label NAME] [--ops put,get,put_signal,amo,signal] [--blocks 1,8]
//                      [--sizes a,b,...] [--min-bytes N] [--max-bytes N] [--step F] (sizes: min,
//                      min x F, ... and max; default 8 B, x4, 64 MiB)
//                      [--window K] [--cap-ms MS] [--budget-s S] [--no-verify]
// CSV columns: label,op,blocks,size_bytes,window,iters,ops,usec,usec_per_op,mops,gbps,verified
//   (iters: the slowest block's iterations; ops: operations completed; usec: from the first block's
//   start to the last block's last quiet; mops: ops / usec; gbps: ops x size / usec / 1000;
//   verified: ok, skipped or WRONG)
#include "common.cuh"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

using namespace gt;

namespace {

enum Op { PUT, GET, PUT_SIGNAL, AMO, SIGNAL };
const char *const kOpNames[] = {"put", "get", "put_signal", "amo", "signal"};

struct BlockOut {
    unsigned long long t0, t1, ops;
    int iters;
};

// Block b issues operations b, b + B, ... of every iteration of `window` operations, then quiets.
__global__ void stream_kernel(int op, uint8_t *dst, const uint8_t *src, uint64_t *word,
                              size_t size, int window, int max_iters, int peer, uint64_t cap_ns,
                              BlockOut *out) {
    __shared__ int stop;
    __shared__ uint64_t t0;
    if (threadIdx.x == 0) {
        stop = 0;
        t0 = dev_now_ns();
    }
    __syncthreads();
    const int B = gridDim.x, b = blockIdx.x;
    unsigned long long mine = 0;  // operations this block issued (thread 0's count)
    int done = 0;
    for (int it = 0; it < max_iters; ++it) {
        if (op == AMO || op == SIGNAL) {
            // Thread-level atomics: operation i by thread (i / B) % blockDim of block i % B.
            for (int i = b + B * (int)threadIdx.x; i < window; i += B * (int)blockDim.x) {
                if (op == AMO)
                    nvshmem_uint64_atomic_add(word, 1, peer);
                else
                    nvshmemx_signal_op(word, 1, NVSHMEM_SIGNAL_ADD, peer);
            }
            if (threadIdx.x == 0) mine += (unsigned long long)((window - b + B - 1) / B);
        } else {
            for (int i = b; i < window; i += B) {
                const size_t off = (size_t)i * size;
                if (op == PUT)
                    nvshmemx_putmem_nbi_block(dst + off, src + off, size, peer);
                else if (op == GET)
                    nvshmemx_getmem_nbi_block(dst + off, src + off, size, peer);
                else
                    nvshmemx_putmem_signal_nbi_block(dst + off, src + off, size, word, 1,
                                                     NVSHMEM_SIGNAL_ADD, peer);
                if (threadIdx.x == 0) ++mine;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            nvshmem_quiet();
            if (dev_now_ns() - t0 > cap_ns) stop = 1;
        }
        __syncthreads();
        done = it + 1;
        if (stop) break;
    }
    if (threadIdx.x == 0) {
        out[b].t0 = t0;
        out[b].t1 = dev_now_ns();
        out[b].ops = mine;
        out[b].iters = done;
    }
}

// Counts bytes of `a` that differ from `b` (into *bad).
__global__ void compare_kernel(const uint8_t *a, const uint8_t *b, size_t n,
                               unsigned long long *bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        local += a[i] != b[i];
    if (local) atomicAdd(bad, local);
}

int window_for(size_t size, int fixed) {
    if (fixed > 0) return fixed;
    if (size <= (64u << 10)) return 200;
    if (size <= (4u << 20)) return 20;
    return 4;
}

std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string x;
    while (std::getline(ss, x, ','))
        if (!x.empty()) v.push_back(x);
    return v;
}

void usage(const char *argv0) {
    printf("usage: %s CSV_PATH [--label NAME] [--ops put,get,put_signal,amo,signal] "
           "[--blocks 1,8] [--sizes a,b,...] [--min-bytes N] [--max-bytes N] [--step F] "
           "[--window K] [--cap-ms MS] [--budget-s S] [--no-verify]\n",
           argv0);
}

}  // namespace

int main(int argc, char **argv) {
    const char *csv_path = nullptr;
    std::string label = "nvshmem";
    std::vector<int> ops = {PUT, GET, PUT_SIGNAL, AMO};
    std::vector<int> blocks_list = {1, 8};
    std::vector<size_t> sizes;
    size_t min_bytes = 8, max_bytes = 64u << 20, step = 4;
    int fixed_window = 0;
    double cap_ms = 250, budget_s = 60;
    bool verify = true;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                printf("%s needs a value\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            usage(argv[0]);
            return 0;
        } else if (a == "--label") {
            label = next();
        } else if (a == "--ops") {
            ops.clear();
            for (const std::string &o : split(next())) {
                int k = -1;
                for (int j = 0; j < 5; ++j)
                    if (o == kOpNames[j]) k = j;
                if (k < 0) {
                    printf("--ops: unknown operation '%s' (put, get, put_signal, amo, signal)\n",
                           o.c_str());
                    return 2;
                }
                ops.push_back(k);
            }
        } else if (a == "--blocks") {
            blocks_list.clear();
            for (const std::string &b : split(next())) blocks_list.push_back(atoi(b.c_str()));
        } else if (a == "--sizes") {
            for (const std::string &s : split(next()))
                sizes.push_back((size_t)strtoull(s.c_str(), nullptr, 0));
        } else if (a == "--min-bytes") {
            min_bytes = (size_t)strtoull(next().c_str(), nullptr, 0);
        } else if (a == "--max-bytes") {
            max_bytes = (size_t)strtoull(next().c_str(), nullptr, 0);
        } else if (a == "--step") {
            step = (size_t)strtoull(next().c_str(), nullptr, 0);
        } else if (a == "--window") {
            fixed_window = atoi(next().c_str());
        } else if (a == "--cap-ms") {
            cap_ms = atof(next().c_str());
        } else if (a == "--budget-s") {
            budget_s = atof(next().c_str());
        } else if (a == "--no-verify") {
            verify = false;
        } else if (!a.empty() && a[0] != '-' && csv_path == nullptr) {
            csv_path = argv[i];
        } else {
            printf("unknown argument '%s'\n", argv[i]);
            usage(argv[0]);
            return 2;
        }
    }
    if (sizes.empty()) {
        for (size_t s = min_bytes; s <= max_bytes; s *= step) sizes.push_back(s);
        if (!sizes.empty() && sizes.back() != max_bytes) sizes.push_back(max_bytes);  // the top size too
    }
    bool bad_args = csv_path == nullptr || ops.empty() || blocks_list.empty() || step < 2 ||
                    cap_ms <= 0 || budget_s <= 0 || fixed_window < 0 || fixed_window > 100000;
    for (int b : blocks_list) bad_args |= b < 1 || b > 1024;
    for (size_t s : sizes) bad_args |= s < 8 || s % 8 != 0;
    if (bad_args) {
        printf("bad arguments (sizes must be multiples of 8, at least 8; blocks 1 to 1024)\n");
        usage(argv[0]);
        return 2;
    }
    size_t region = 8;  // the largest window x size any measurement uses
    for (size_t s : sizes) region = std::max(region, (size_t)window_for(s, fixed_window) * s);

    job_init(&argc, &argv, 120);
    const int pe = g_job.pe, npes = g_job.npes;
    if (npes < 2) fatal(__FILE__, __LINE__, "needs 2 PEs, got %d", npes);
    const int peer = pe == 0 ? 1 : 0;

    watchdog_arm("symmetric allocations", 120);
    uint8_t *src = (uint8_t *)sym_malloc(region, "source region");
    uint8_t *dst = (uint8_t *)sym_malloc(region, "destination region");
    uint64_t *word = (uint64_t *)sym_malloc(64, "signal / atomic word");
    BlockOut *dout = nullptr;
    unsigned long long *dbad = nullptr;
    int max_blocks = *std::max_element(blocks_list.begin(), blocks_list.end());
    CK(cudaMalloc(&dout, sizeof(BlockOut) * max_blocks));
    CK(cudaMalloc(&dbad, sizeof(unsigned long long)));
    const bool mapped = nvshmem_ptr(dst, peer) != nullptr;
    watchdog_disarm();

    FILE *csv = nullptr;
    if (pe == 0) {
        csv = fopen(csv_path, "w");
        if (csv == nullptr)
            fatal(__FILE__, __LINE__, "cannot write %s: %s", csv_path, strerror(errno));
        fprintf(csv, "label,op,blocks,size_bytes,window,iters,ops,usec,usec_per_op,mops,gbps,"
                     "verified\n");
        int maj = 0, min = 0, patch = 0;
        nvshmemx_vendor_get_version_info(&maj, &min, &patch);
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, g_job.device));
        printf("stream_bench [%s]: NVSHMEM %d.%d.%d, %d PEs, %s, %s; window %s; one nvshmem_quiet "
               "per block and iteration; %s\n",
               label.c_str(), maj, min, patch, npes, prop.name,
               mapped ? "peer mapped: P2P path" : "peer not mapped: remote transport path",
               fixed_window ? std::to_string(fixed_window).c_str()
                            : "200 up to 64 KiB, 20 up to 4 MiB, 4 above",
               verify ? "data and counters checked" : "NOT verified (--no-verify)");
        printf("%-10s %6s %10s %6s %7s %10s %12s %10s %9s %s\n", "op", "blocks", "size_bytes",
               "window", "iters", "usec/iter", "usec_per_op", "Mops/s", "GB/s", "check");
    }

    const double t_start = now_s();
    int rows = 0, skipped = 0;
    bool failed = false;
    for (int op : ops) {
        for (int blocks : blocks_list) {
            for (size_t size : sizes) {
                const bool word_op = op == AMO || op == SIGNAL;
                if (word_op && size != sizes.front()) continue;  // one row: 8 B words
                const int window = window_for(size, fixed_window);
                if (!word_op && blocks > window) continue;  // idle blocks would add nothing
                long long stop = (pe == 0 && now_s() - t_start > budget_s) ? 1 : 0;
                if (job_max_ll(stop)) {
                    ++skipped;
                    continue;
                }
                char step_name[96];
                snprintf(step_name, sizeof step_name, "%s, %d block(s), %zu B x %d", kOpNames[op],
                         blocks, size, window);
                watchdog_arm(step_name, (unsigned)(cap_ms / 1000.0) * 4 + 120);
                const size_t span = word_op ? 8 : (size_t)window * size;
                const uint32_t seed = make_seed(0, (uint32_t)rows, 0x57E4u);
                // Both PEs hold the same source bytes: the receiver checks against its own copy.
                fill_region(src, span, seed);
                CK(cudaMemset(dst, kSentinel, span));
                CK(cudaMemset(word, 0, 64));
                CK(cudaDeviceSynchronize());
                nvshmem_barrier_all();

                std::vector<BlockOut> h(blocks, BlockOut{0, 0, 0, 0});
                if (pe == 0) {
                    // Warm-up: one iteration, counted in the word's total.
                    stream_kernel<<<blocks, 256>>>(op, dst, src, word, size, window, 1, peer, 0,
                                                   dout);
                    CK_LAUNCH();
                    CK(cudaDeviceSynchronize());
                    std::vector<BlockOut> w(blocks);
                    CK(cudaMemcpy(w.data(), dout, sizeof(BlockOut) * blocks,
                                  cudaMemcpyDeviceToHost));
                    stream_kernel<<<blocks, 256>>>(op, dst, src, word, size, window, 1 << 30,
                                                   peer, (uint64_t)(cap_ms * 1e6), dout);
                    CK_LAUNCH();
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(h.data(), dout, sizeof(BlockOut) * blocks,
                                  cudaMemcpyDeviceToHost));
                    // Total issued (warm-up included) for the word check below.
                    unsigned long long total = 0;
                    for (int b = 0; b < blocks; ++b) total += w[b].ops + h[b].ops;
                    h.push_back(BlockOut{0, 0, total, 0});
                }
                nvshmem_barrier_all();
                const long long issued = job_max_ll(pe == 0 ? (long long)h.back().ops : 0);

                // Verification on the receiving PE (PE 1 for puts and words, PE 0 for gets).
                long long bad = 0;
                const int receiver = op == GET ? 0 : 1;
                if (verify && pe == receiver) {
                    if (!word_op) {
                        CK(cudaMemset(dbad, 0, sizeof *dbad));
                        compare_kernel<<<grid_for(span), 256>>>(dst, src, span, dbad);
                        CK_LAUNCH();
                        unsigned long long nb = 0;
                        CK(cudaMemcpy(&nb, dbad, sizeof nb, cudaMemcpyDeviceToHost));
                        if (nb) {
                            printf("  [pe %d] VERIFY FAILED: %s: %llu of %zu bytes wrong\n", pe,
                                   step_name, nb, span);
                            bad = 1;
                        }
                    }
                    if (op == PUT_SIGNAL || word_op) {
                        uint64_t got = 0;
                        CK(cudaMemcpy(&got, word, sizeof got, cudaMemcpyDeviceToHost));
                        if ((long long)got != issued) {
                            printf("  [pe %d] VERIFY FAILED: %s: word is %llu after %lld "
                                   "operations\n",
                                   pe, step_name, (unsigned long long)got, issued);
                            bad = 1;
                        }
                    }
                }
                bad = job_max_ll(bad);
                watchdog_disarm();

                if (pe == 0) {
                    unsigned long long t0 = ~0ULL, t1 = 0, nops = 0;
                    int min_iters = 1 << 30;
                    for (int b = 0; b < blocks; ++b) {
                        t0 = std::min(t0, h[b].t0);
                        t1 = std::max(t1, h[b].t1);
                        nops += h[b].ops;
                        min_iters = std::min(min_iters, h[b].iters);
                    }
                    const double usec = (double)(t1 - t0) / 1000.0;
                    const double mops = usec > 0 ? (double)nops / usec : 0.0;
                    const size_t rsize = word_op ? 8 : size;  // an atomic moves one 8-byte word
                    const double gbps = mops * (double)rsize / 1000.0;
                    const char *check = !verify ? "skipped" : bad ? "WRONG" : "ok";
                    printf("%-10s %6d %10zu %6d %7d %10.2f %12.3f %10.4f %9.3f %s\n",
                           kOpNames[op], blocks, rsize, window, min_iters,
                           min_iters ? usec / min_iters : 0.0, nops ? usec / nops : 0.0, mops,
                           gbps, check);
                    fprintf(csv, "%s,%s,%d,%zu,%d,%d,%llu,%.3f,%.5f,%.5f,%.5f,%s\n",
                            label.c_str(), kOpNames[op], blocks, rsize, window, min_iters, nops,
                            usec, nops ? usec / nops : 0.0, mops, gbps, check);
                    fflush(csv);
                }
                if (bad) failed = true;
                ++rows;
            }
        }
    }
    if (pe == 0) {
        fclose(csv);
        printf("%d measurements in %.1f s%s; CSV: %s\n", rows, now_s() - t_start,
               skipped ? (", " + std::to_string(skipped) + " skipped (time budget)").c_str() : "",
               csv_path);
        if (failed) printf("FAIL: received data or a counter was wrong\n");
    }
    watchdog_arm("freeing buffers", 60);
    CK(cudaFree(dbad));
    CK(cudaFree(dout));
    nvshmem_free(word);
    nvshmem_free(dst);
    nvshmem_free(src);
    watchdog_disarm();
    job_finalize(60);
    return failed ? 1 : 0;
}
