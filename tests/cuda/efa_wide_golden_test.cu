// Golden-vector test of cuda/efa_wqe_wide.cuh.
//
// Reads tests/golden/efa_wide_vectors.txt (format: tests/golden/gen_wide_vectors.py), builds every
// valid wide entry (kind `wide`) with the header's writers and setters into a slot that held 0xa5
// bytes, and compares the 128 bytes with the expected ones. Negative vectors are skipped:
// validation lives in the Rust decoder (tests/efa_golden_wide.rs).
//
// Built by nvcc with a CUDA device present, the same entries are also built and stored in a
// kernel and must give the same bytes. Without a device that part is skipped, unless
// EFA_GOLDEN_REQUIRE_GPU=1 is set, which turns the skip into a failure.
//
//   nvcc -std=c++17 -x cu tests/cuda/efa_wide_golden_test.cu -o /tmp/efa_wide_golden_test
//   /tmp/efa_wide_golden_test tests/golden/efa_wide_vectors.txt
//
// Also compiles as plain C++ (g++ -std=c++17 -x c++ ...), host checks only.
// Exit status 0 and a last line "N passed, 0 failed" on success; non-zero otherwise.

#include "../../cuda/efa_wqe_wide.cuh"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

int g_pass = 0, g_fail = 0;

void check(bool ok, const std::string &what)
{
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        std::printf("FAIL: %s\n", what.c_str());
    }
}

struct Vector {
    std::string kind, name;
    std::map<std::string, std::string> f;

    const std::string &get(const std::string &k) const
    {
        auto it = f.find(k);
        if (it == f.end()) {
            std::printf("FAIL: %s: no key %s\n", name.c_str(), k.c_str());
            std::exit(2);
        }
        return it->second;
    }
    uint64_t num(const std::string &k) const { return std::strtoull(get(k).c_str(), nullptr, 0); }
    std::vector<uint8_t> bytes(const std::string &k) const
    {
        const std::string &s = get(k);
        std::vector<uint8_t> out;
        for (size_t i = 0; i + 1 < s.size(); i += 2)
            out.push_back((uint8_t)std::strtoul(s.substr(i, 2).c_str(), nullptr, 16));
        return out;
    }
};

std::vector<Vector> load(const char *path)
{
    std::ifstream in(path);
    if (!in) {
        std::printf("FAIL: cannot open %s\n", path);
        std::exit(2);
    }
    std::vector<Vector> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#')
            continue;
        std::istringstream ss(line);
        Vector v;
        ss >> v.kind >> v.name;
        std::string tok;
        while (ss >> tok) {
            size_t eq = tok.find('=');
            if (eq != std::string::npos)
                v.f[tok.substr(0, eq)] = tok.substr(eq + 1);
        }
        out.push_back(v);
    }
    return out;
}

std::string hex(const uint8_t *b, size_t n)
{
    std::string s;
    char t[3];
    for (size_t i = 0; i < n; i++) {
        std::snprintf(t, sizeof t, "%02x", b[i]);
        s += t;
    }
    return s;
}

// One wide entry to build.
struct Job {
    int write;  // 0: SEND, 1: RDMA write
    nvshmem_efa_route route;
    uint64_t raddr;
    uint32_t rkey;
    uint8_t data[NVSHMEM_EFA_INLINE_MAX_128];
    uint32_t len;
    int has_imm;
    uint32_t imm;
    uint64_t req_id;
    int phase, comp_req, high_pps;
};

// Builds and stores one entry; returns the writer's status.
NVSHMEM_EFA_FN int build(const Job *j, void *slot)
{
    nvshmem_efa_tx_wqe_128 w;
    int rc = j->write ? nvshmem_efa_write_rdma_write_inline_128(&w, &j->route, j->raddr, j->rkey,
                                                                j->data, j->len)
                      : nvshmem_efa_write_send_inline_128(&w, &j->route, j->data, j->len);
    if (rc)
        return rc;
    if (j->has_imm)
        nvshmem_efa_wqe128_set_imm(&w, j->imm);
    nvshmem_efa_wqe128_set_req_id64(&w, j->req_id);
    nvshmem_efa_wqe128_set_phase(&w, (unsigned)j->phase);
    nvshmem_efa_wqe128_set_comp_req(&w, j->comp_req);
    nvshmem_efa_wqe128_set_high_pps(&w, j->high_pps);
    nvshmem_efa_wqe128_store(slot, &w);
    return 0;
}

Job job(const Vector &v)
{
    Job j;
    memset(&j, 0, sizeof j);
    j.write = v.get("target") == "rdma_write";
    j.route.ah = (uint16_t)v.num("ah");
    j.route.dest_qpn = (uint16_t)v.num("dest_qpn");
    j.route.qkey = (uint32_t)v.num("qkey");
    if (j.write) {
        j.raddr = v.num("raddr");
        j.rkey = (uint32_t)v.num("rkey");
    }
    std::vector<uint8_t> d = v.bytes("data");
    j.len = (uint32_t)d.size();
    if (j.len <= NVSHMEM_EFA_INLINE_MAX_128 && j.len)
        memcpy(j.data, d.data(), j.len);
    j.has_imm = v.get("imm") != "-";
    j.imm = j.has_imm ? (uint32_t)v.num("imm") : 0;
    // Without the 64-bit capability only the low 16 bits are set, which the 64-bit setter
    // writes with zero extension words.
    j.req_id = v.num("req_id");
    j.phase = (int)v.num("phase");
    j.comp_req = (int)v.num("comp_req");
    j.high_pps = (int)v.num("high_pps");
    return j;
}

#ifdef __CUDACC__
__global__ void build_kernel(const Job *jobs, int n, uint8_t *slots, int *rcs)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        rcs[i] = build(&jobs[i], slots + (size_t)i * NVSHMEM_EFA_WQE_SIZE_128);
}

void device_checks(const std::vector<Job> &jobs, const std::vector<std::vector<uint8_t>> &want,
                   const std::vector<std::string> &names)
{
    int ndev = 0;
    const bool require = std::getenv("EFA_GOLDEN_REQUIRE_GPU") &&
                         std::string(std::getenv("EFA_GOLDEN_REQUIRE_GPU")) == "1";
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        std::printf("device checks skipped: no CUDA device\n");
        check(!require, "EFA_GOLDEN_REQUIRE_GPU=1 but no CUDA device");
        return;
    }
    const int n = (int)jobs.size();
    Job *djobs;
    uint8_t *dslots;
    int *drcs;
    cudaMalloc(&djobs, sizeof(Job) * n);
    cudaMalloc(&dslots, (size_t)NVSHMEM_EFA_WQE_SIZE_128 * n);
    cudaMalloc(&drcs, sizeof(int) * n);
    cudaMemcpy(djobs, jobs.data(), sizeof(Job) * n, cudaMemcpyHostToDevice);
    cudaMemset(dslots, 0xA5, (size_t)NVSHMEM_EFA_WQE_SIZE_128 * n);
    build_kernel<<<(n + 63) / 64, 64>>>(djobs, n, dslots, drcs);
    std::vector<uint8_t> slots((size_t)NVSHMEM_EFA_WQE_SIZE_128 * n);
    std::vector<int> rcs(n);
    cudaError_t e = cudaMemcpy(slots.data(), dslots, slots.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(rcs.data(), drcs, sizeof(int) * n, cudaMemcpyDeviceToHost);
    check(e == cudaSuccess, std::string("device run: ") + cudaGetErrorString(e));
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        const uint8_t *got = slots.data() + (size_t)i * NVSHMEM_EFA_WQE_SIZE_128;
        check(rcs[i] == 0 && memcmp(got, want[i].data(), NVSHMEM_EFA_WQE_SIZE_128) == 0,
              "device " + names[i] + "\n got  " + hex(got, 128) + "\n want " +
                  hex(want[i].data(), 128));
    }
    cudaFree(djobs);
    cudaFree(dslots);
    cudaFree(drcs);
    std::printf("device checks: %d wide entries\n", n);
}
#endif

}  // namespace

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/golden/efa_wide_vectors.txt";
    std::vector<Vector> vs = load(path);
    std::vector<Job> jobs;
    std::vector<std::vector<uint8_t>> want;
    std::vector<std::string> names;
    int skipped = 0, nsend80 = 0, nwrite80 = 0;
    for (const Vector &v : vs) {
        if (v.kind == "wide_bad") {
            skipped++;
            continue;
        }
        if (v.kind != "wide") {
            check(false, "unknown kind " + v.kind);
            continue;
        }
        Job j = job(v);
        std::vector<uint8_t> w = v.bytes("bytes");
        if (w.size() != NVSHMEM_EFA_WQE_SIZE_128 || j.len > NVSHMEM_EFA_INLINE_MAX_128) {
            check(false, v.name + ": bytes are not 128 long or the payload is over 80");
            continue;
        }
        nsend80 += !j.write && j.len == NVSHMEM_EFA_INLINE_MAX_128;
        nwrite80 += j.write && j.len == NVSHMEM_EFA_INLINE_MAX_128;
        alignas(64) uint8_t slot[NVSHMEM_EFA_WQE_SIZE_128];
        memset(slot, 0xA5, sizeof slot);
        int rc = build(&j, slot);
        check(rc == 0 && memcmp(slot, w.data(), sizeof slot) == 0,
              v.name + ": rc " + std::to_string(rc) + "\n got  " + hex(slot, 128) + "\n want " +
                  hex(w.data(), 128));
        jobs.push_back(j);
        want.push_back(w);
        names.push_back(v.name);
    }
    // The writers refuse what the device would not take.
    {
        nvshmem_efa_tx_wqe_128 w;
        nvshmem_efa_route r = {7, 0x42, 0x11223344u};
        uint8_t big[NVSHMEM_EFA_INLINE_MAX_128 + 1] = {0};
        check(nvshmem_efa_write_send_inline_128(&w, &r, big, 81) == -1, "81-byte SEND refused");
        check(nvshmem_efa_write_rdma_write_inline_128(&w, &r, 0x1000, 1, big, 0) == -1,
              "zero-byte inline write refused");
        check(nvshmem_efa_write_rdma_write_inline_128(&w, &r, 0x1000, 1, big, 81) == -1,
              "81-byte inline write refused");
    }
    check(nsend80 >= 1 && nwrite80 >= 1, "an 80-byte SEND and an 80-byte write among the vectors");
    std::printf("host checks: %zu wide entries; %d negative vectors skipped\n", jobs.size(),
                skipped);
#ifdef __CUDACC__
    device_checks(jobs, want, names);
#endif
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
