// Golden-vector test of cuda/efa_wqe.cuh.
//
// Reads tests/golden/efa_vectors.txt (format: tests/golden/gen_vectors.py), builds every
// valid WQE with the header's writers and compares the 64 bytes with the expected ones,
// and decodes every valid CQE with the header's readers and compares each field with the
// vector. Ring-entry vectors (kind `entry`) write a WQE into a 64- or 128-byte slot that held
// 0xa5 bytes with nvshmem_efa_wqe_store_entry and compare the whole entry. Negative vectors are
// skipped: validation lives in the Rust decoder.
//
// Built by nvcc with a CUDA device present, the same WQE builds and CQE decodes also run
// in a kernel and must give the same bytes and fields as on the host. Without a device
// that part is skipped, unless EFA_GOLDEN_REQUIRE_GPU=1 is set, which turns the skip into
// a failure.
//
//   nvcc -std=c++17 -x cu tests/cuda/efa_golden_test.cu -o /tmp/efa_golden_test
//   /tmp/efa_golden_test tests/golden/efa_vectors.txt
//
// The file also compiles as plain C++ (g++ -std=c++17 -x c++ ...), host checks only.
// Exit status 0 and a last line "N passed, 0 failed" on success; non-zero otherwise.

#include "../../cuda/efa_wqe.cuh"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

enum WqeOpKind { K_SEND_INLINE, K_SEND_SGE, K_WRITE, K_WRITE_IMM, K_READ };

struct WqeJob {
    int op;
    uint64_t req_id;
    int req64;
    int phase;
    int comp_req;
    int high_pps;
    nvshmem_efa_route route;
    int has_imm;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t length;
    uint64_t laddr;
    uint32_t lkey;
    uint8_t inline_data[NVSHMEM_EFA_INLINE_MAX];
    uint32_t inline_len;
    nvshmem_efa_sge sges[NVSHMEM_EFA_SEND_MAX_SGES];
    uint32_t nsges;
};

enum CqeKind { C_TX, C_RX, C_RX_EX };

struct CqeJob {
    int kind;
    int req64;
    alignas(16) uint8_t bytes[32];
};

// A WQE written into a ring entry of entry_size bytes (64 or 128).
struct EntryJob {
    WqeJob wqe;
    uint32_t entry_size;
};

struct CqeOut {
    uint64_t req_id;
    uint32_t status, phase, qtype, op, has_imm, unsolicited, qp_num;
    uint32_t length, ah, src_qp, imm;
    uint32_t has_src_addr;
    uint8_t src_addr[16];
    uint32_t ready_at_expected, ready_at_other;
};

// Builds one WQE from a job with the header's writers; returns 0 or the writer's error.
NVSHMEM_EFA_FN int build_wqe(const WqeJob *j, nvshmem_efa_tx_wqe *w)
{
    int rc = 0;
    switch (j->op) {
    case K_SEND_INLINE:
        rc = nvshmem_efa_write_send_inline(w, &j->route, j->inline_data, j->inline_len);
        break;
    case K_SEND_SGE:
        rc = nvshmem_efa_write_send_sge(w, &j->route, j->sges, j->nsges);
        break;
    case K_WRITE:
        nvshmem_efa_write_rdma_write(w, &j->route, j->raddr, j->rkey, j->laddr, j->lkey,
                                     j->length);
        break;
    case K_WRITE_IMM:
        nvshmem_efa_write_rdma_write_imm(w, &j->route, j->raddr, j->rkey, j->laddr, j->lkey,
                                         j->length, j->imm);
        break;
    case K_READ:
        nvshmem_efa_write_rdma_read(w, &j->route, j->raddr, j->rkey, j->laddr, j->lkey,
                                    j->length);
        break;
    default:
        return -2;
    }
    if (rc)
        return rc;
    if (j->has_imm && (j->op == K_SEND_INLINE || j->op == K_SEND_SGE))
        nvshmem_efa_wqe_set_imm(w, j->imm);
    nvshmem_efa_wqe_set_phase(w, (unsigned)j->phase);
    nvshmem_efa_wqe_set_comp_req(w, j->comp_req);
    if (j->req64)
        nvshmem_efa_wqe_set_req_id64(w, j->req_id);
    else
        nvshmem_efa_wqe_set_req_id(w, (uint16_t)j->req_id);
    nvshmem_efa_wqe_set_high_pps(w, j->high_pps);
    return 0;
}

// Decodes one CQE with the header's readers.
NVSHMEM_EFA_FN void decode_cqe(const CqeJob *j, CqeOut *o)
{
    memset(o, 0, sizeof(*o));
    nvshmem_efa_cdesc_common c;
    memcpy(&c, j->bytes, sizeof(c));
    o->status = nvshmem_efa_cqe_status(&c);
    o->phase = nvshmem_efa_cqe_phase(&c);
    o->qtype = nvshmem_efa_cqe_queue_type(&c);
    o->op = nvshmem_efa_cqe_op_type(&c);
    o->has_imm = nvshmem_efa_cqe_has_imm(&c);
    o->unsolicited = nvshmem_efa_cqe_unsolicited(&c);
    o->qp_num = nvshmem_efa_cqe_qp_num(&c);
    o->req_id = nvshmem_efa_cqe_req_id(&c);
    // A ring of 8 entries: index 0 expects phase 1, index 8 expects phase 0.
    uint64_t ci_match = o->phase ? 0 : 8;
    uint64_t ci_other = o->phase ? 8 : 0;
    o->ready_at_expected = nvshmem_efa_cqe_ready(j->bytes, ci_match, 8);
    o->ready_at_other = nvshmem_efa_cqe_ready(j->bytes, ci_other, 8);
    if (j->kind == C_TX) {
        nvshmem_efa_tx_cdesc t;
        memcpy(&t, j->bytes, sizeof(t));
        if (j->req64)
            o->req_id = nvshmem_efa_tx_cqe_req_id64(&t);
        return;
    }
    nvshmem_efa_rx_cdesc_ex rx;
    memset(&rx, 0, sizeof(rx));
    memcpy(&rx, j->bytes, j->kind == C_RX_EX ? sizeof(rx) : sizeof(rx.base));
    o->length = j->kind == C_RX_EX ? nvshmem_efa_rx_cqe_ex_length(&rx)
                                   : nvshmem_efa_rx_cqe_length(&rx.base);
    o->ah = nvshmem_efa_rx_cqe_ah(&rx.base);
    o->src_qp = nvshmem_efa_rx_cqe_src_qp(&rx.base);
    o->imm = nvshmem_efa_rx_cqe_imm(&rx.base);
    if (j->kind == C_RX_EX) {
        const uint8_t *a = nvshmem_efa_rx_cqe_src_addr(&rx);
        if (a) {
            o->has_src_addr = 1;
            memcpy(o->src_addr, a, 16);
        }
    }
}

int g_pass = 0;
int g_fail = 0;

void check(bool ok, const std::string &what)
{
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    }
}

std::string hex(const uint8_t *b, size_t n)
{
    std::string s;
    char buf[3];
    for (size_t i = 0; i < n; i++) {
        std::snprintf(buf, sizeof buf, "%02x", b[i]);
        s += buf;
    }
    return s;
}

bool parse_hex(const std::string &s, std::vector<uint8_t> &out)
{
    out.clear();
    if (s == "-")
        return true;
    if (s.size() % 2)
        return false;
    for (size_t i = 0; i < s.size(); i += 2) {
        char *end = nullptr;
        std::string byte = s.substr(i, 2);
        unsigned long v = std::strtoul(byte.c_str(), &end, 16);
        if (*end)
            return false;
        out.push_back((uint8_t)v);
    }
    return true;
}

struct Vector {
    int line;
    std::string kind, name;
    std::map<std::string, std::string> f;

    const std::string &get(const std::string &k) const
    {
        auto it = f.find(k);
        if (it == f.end()) {
            std::fprintf(stderr, "line %d (%s): missing key %s\n", line, name.c_str(), k.c_str());
            std::exit(2);
        }
        return it->second;
    }
    uint64_t num(const std::string &k) const
    {
        const std::string &s = get(k);
        char *end = nullptr;
        uint64_t v = std::strtoull(s.c_str(), &end, 0);
        if (s.empty() || *end) {
            std::fprintf(stderr, "line %d (%s): bad number %s=%s\n", line, name.c_str(),
                         k.c_str(), s.c_str());
            std::exit(2);
        }
        return v;
    }
    std::vector<uint8_t> bytes(const std::string &k) const
    {
        std::vector<uint8_t> b;
        if (!parse_hex(get(k), b)) {
            std::fprintf(stderr, "line %d (%s): bad hex for %s\n", line, name.c_str(), k.c_str());
            std::exit(2);
        }
        return b;
    }
};

std::vector<Vector> load(const char *path)
{
    std::ifstream in(path);
    if (!in) {
        std::fprintf(stderr, "cannot open %s\n", path);
        std::exit(2);
    }
    std::vector<Vector> out;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        n++;
        if (line.empty() || line[0] == '#')
            continue;
        std::istringstream ss(line);
        Vector v;
        v.line = n;
        ss >> v.kind >> v.name;
        std::string tok;
        while (ss >> tok) {
            size_t eq = tok.find('=');
            if (eq == std::string::npos) {
                std::fprintf(stderr, "line %d: token %s is not key=value\n", n, tok.c_str());
                std::exit(2);
            }
            v.f[tok.substr(0, eq)] = tok.substr(eq + 1);
        }
        out.push_back(v);
    }
    return out;
}

WqeJob wqe_job(const Vector &v)
{
    WqeJob j;
    memset(&j, 0, sizeof(j));
    const std::string &op = v.get("op");
    if (op == "send_inline")
        j.op = K_SEND_INLINE;
    else if (op == "send_sge")
        j.op = K_SEND_SGE;
    else if (op == "rdma_write")
        j.op = K_WRITE;
    else if (op == "rdma_write_imm")
        j.op = K_WRITE_IMM;
    else if (op == "rdma_read")
        j.op = K_READ;
    else {
        std::fprintf(stderr, "%s: unknown op %s\n", v.name.c_str(), op.c_str());
        std::exit(2);
    }
    j.req_id = v.num("req_id");
    j.req64 = (int)v.num("req64");
    j.phase = (int)v.num("phase");
    j.comp_req = (int)v.num("comp_req");
    j.high_pps = (int)v.num("high_pps");
    j.route.ah = (uint16_t)v.num("ah");
    j.route.dest_qpn = (uint16_t)v.num("dest_qpn");
    j.route.qkey = (uint32_t)v.num("qkey");
    if (v.get("imm") != "-") {
        j.has_imm = 1;
        j.imm = (uint32_t)v.num("imm");
    }
    if (j.op == K_SEND_INLINE) {
        std::vector<uint8_t> d = v.bytes("inline");
        j.inline_len = (uint32_t)d.size();
        if (d.size() <= sizeof j.inline_data)
            memcpy(j.inline_data, d.data(), d.size());
    } else if (j.op == K_SEND_SGE) {
        j.nsges = (uint32_t)v.num("sges");
        for (uint32_t i = 0; i < j.nsges && i < NVSHMEM_EFA_SEND_MAX_SGES; i++) {
            std::string p = "s" + std::to_string(i) + "_";
            j.sges[i].addr = v.num(p + "addr");
            j.sges[i].lkey = (uint32_t)v.num(p + "lkey");
            j.sges[i].length = (uint32_t)v.num(p + "len");
        }
    } else {
        j.raddr = v.num("raddr");
        j.rkey = (uint32_t)v.num("rkey");
        j.length = (uint32_t)v.num("rlen");
        j.laddr = v.num("laddr");
        j.lkey = (uint32_t)v.num("lkey");
        if (v.num("llen") != j.length) {
            std::fprintf(stderr, "%s: rlen and llen differ in a valid vector\n", v.name.c_str());
            std::exit(2);
        }
    }
    return j;
}

const char *kCqeOps[] = {"send", "rdma_read", "rdma_write"};

// Compares decoded CQE fields with the vector's fields.
void check_cqe_fields(const Vector &v, const CqeOut &o)
{
    const std::string &n = v.name;
    check(o.req_id == v.num("req_id"), n + ": req_id");
    check(o.status == v.num("status"), n + ": status");
    check(o.phase == v.num("phase"), n + ": phase");
    check(o.op < 3 && v.get("op") == kCqeOps[o.op], n + ": op type");
    check(o.qp_num == v.num("qp_num"), n + ": qp_num");
    check(o.ready_at_expected == 1 && o.ready_at_other == 0, n + ": phase-based readiness");
    if (v.kind == "tx_cqe") {
        check(o.qtype == NVSHMEM_EFA_QUEUE_SEND, n + ": queue type");
        check(!o.has_imm && !o.unsolicited, n + ": rx-only flags clear");
        return;
    }
    check(o.qtype == NVSHMEM_EFA_QUEUE_RECV, n + ": queue type");
    check(o.has_imm == v.num("has_imm"), n + ": has_imm");
    check(o.unsolicited == v.num("unsolicited"), n + ": unsolicited");
    uint64_t len = v.num("length");
    if (v.kind == "rx_cqe")
        len &= 0xFFFF;
    check(o.length == len, n + ": length");
    check(o.ah == v.num("ah"), n + ": ah");
    check(o.src_qp == v.num("src_qp"), n + ": src_qp");
    check(o.imm == v.num("imm"), n + ": imm");
    if (v.kind == "rx_cqe_ex") {
        std::vector<uint8_t> want = v.bytes("src_addr");
        bool ok = want.empty() ? o.has_src_addr == 0
                               : (o.has_src_addr == 1 && want.size() == 16 &&
                                  memcmp(o.src_addr, want.data(), 16) == 0);
        check(ok, n + ": src_addr");
    }
}

// Expected content of a 128-byte slot after an entry vector: the vector's entry bytes, then the 0xa5 fill.
std::vector<uint8_t> entry_slot(const std::vector<uint8_t> &entry)
{
    std::vector<uint8_t> s(128, 0xA5);
    memcpy(s.data(), entry.data(), entry.size() < 128 ? entry.size() : 128);
    return s;
}

#ifdef __CUDACC__
__global__ void wqe_kernel(const WqeJob *jobs, int n, nvshmem_efa_tx_wqe *ring, int *rc)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    nvshmem_efa_tx_wqe w;
    rc[i] = build_wqe(&jobs[i], &w);
    // Slot and phase helpers exercised on the device; job i goes to slot i.
    uint32_t slot = nvshmem_efa_sq_slot((uint64_t)n + i, (uint32_t)n);
    if (nvshmem_efa_sq_phase((uint64_t)n + i, (uint32_t)n) != 1)
        rc[i] = -3;
    nvshmem_efa_wqe_store(&ring[slot], &w);
}

// Entry job i is written into the 128-byte slot i of `slots` (filled with 0xa5 beforehand).
__global__ void entry_kernel(const EntryJob *jobs, int n, uint8_t *slots, int *rc)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    nvshmem_efa_tx_wqe w;
    rc[i] = build_wqe(&jobs[i].wqe, &w);
    nvshmem_efa_wqe_store_entry(slots + (size_t)i * 128, &w, jobs[i].entry_size);
}

__global__ void cqe_kernel(const CqeJob *jobs, int n, CqeOut *out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        decode_cqe(&jobs[i], &out[i]);
}

#define CUDA_OK(call)                                                                     \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            check(false, std::string(#call) + ": " + cudaGetErrorString(e_));             \
            return;                                                                       \
        }                                                                                 \
    } while (0)

void device_entry_checks(const std::vector<EntryJob> &ejobs,
                         const std::vector<std::vector<uint8_t>> &eexp,
                         const std::vector<std::string> &enames)
{
    int ne = (int)ejobs.size();
    if (ne == 0)
        return;
    EntryJob *d_jobs = nullptr;
    uint8_t *d_slots = nullptr;
    int *d_rc = nullptr;
    CUDA_OK(cudaMalloc(&d_jobs, sizeof(EntryJob) * ne));
    CUDA_OK(cudaMalloc(&d_slots, (size_t)128 * ne));
    CUDA_OK(cudaMalloc(&d_rc, sizeof(int) * ne));
    CUDA_OK(cudaMemcpy(d_jobs, ejobs.data(), sizeof(EntryJob) * ne, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_slots, 0xA5, (size_t)128 * ne));
    entry_kernel<<<(ne + 63) / 64, 64>>>(d_jobs, ne, d_slots, d_rc);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> slots((size_t)128 * ne);
    std::vector<int> rc(ne);
    CUDA_OK(cudaMemcpy(slots.data(), d_slots, slots.size(), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(rc.data(), d_rc, sizeof(int) * ne, cudaMemcpyDeviceToHost));
    for (int i = 0; i < ne; i++) {
        std::vector<uint8_t> want = entry_slot(eexp[i]);
        const uint8_t *got = slots.data() + (size_t)128 * i;
        check(rc[i] == 0 && memcmp(got, want.data(), 128) == 0,
              "device entry " + enames[i] + "\n got  " + hex(got, 128) + "\n want " +
                  hex(want.data(), 128));
    }
    cudaFree(d_jobs);
    cudaFree(d_slots);
    cudaFree(d_rc);
    std::printf("device checks: %d ring entries written on the GPU\n", ne);
}

void device_checks(const std::vector<WqeJob> &wjobs, const std::vector<std::vector<uint8_t>> &wexp,
                   const std::vector<CqeJob> &cjobs, const std::vector<CqeOut> &chost,
                   const std::vector<std::string> &wnames, const std::vector<std::string> &cnames,
                   const std::vector<EntryJob> &ejobs, const std::vector<std::vector<uint8_t>> &eexp,
                   const std::vector<std::string> &enames)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        const char *req = std::getenv("EFA_GOLDEN_REQUIRE_GPU");
        bool required = req && std::string(req) == "1";
        std::printf("device checks skipped: no CUDA device (%s)\n",
                    e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        check(!required, "EFA_GOLDEN_REQUIRE_GPU=1 but no CUDA device");
        return;
    }
    int nw = (int)wjobs.size(), nc = (int)cjobs.size();
    WqeJob *d_jobs = nullptr;
    nvshmem_efa_tx_wqe *d_ring = nullptr;
    int *d_rc = nullptr;
    CqeJob *d_cjobs = nullptr;
    CqeOut *d_cout = nullptr;
    CUDA_OK(cudaMalloc(&d_jobs, sizeof(WqeJob) * nw));
    CUDA_OK(cudaMalloc(&d_ring, sizeof(nvshmem_efa_tx_wqe) * nw));
    CUDA_OK(cudaMalloc(&d_rc, sizeof(int) * nw));
    CUDA_OK(cudaMalloc(&d_cjobs, sizeof(CqeJob) * nc));
    CUDA_OK(cudaMalloc(&d_cout, sizeof(CqeOut) * nc));
    CUDA_OK(cudaMemcpy(d_jobs, wjobs.data(), sizeof(WqeJob) * nw, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_ring, 0xA5, sizeof(nvshmem_efa_tx_wqe) * nw));
    CUDA_OK(cudaMemcpy(d_cjobs, cjobs.data(), sizeof(CqeJob) * nc, cudaMemcpyHostToDevice));
    wqe_kernel<<<(nw + 63) / 64, 64>>>(d_jobs, nw, d_ring, d_rc);
    cqe_kernel<<<(nc + 63) / 64, 64>>>(d_cjobs, nc, d_cout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<nvshmem_efa_tx_wqe> ring(nw);
    std::vector<int> rc(nw);
    std::vector<CqeOut> cout(nc);
    CUDA_OK(cudaMemcpy(ring.data(), d_ring, sizeof(nvshmem_efa_tx_wqe) * nw,
                       cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(rc.data(), d_rc, sizeof(int) * nw, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(cout.data(), d_cout, sizeof(CqeOut) * nc, cudaMemcpyDeviceToHost));
    for (int i = 0; i < nw; i++) {
        const uint8_t *got = (const uint8_t *)&ring[i];
        bool ok = rc[i] == 0 && memcmp(got, wexp[i].data(), NVSHMEM_EFA_WQE_SIZE) == 0;
        check(ok, "device " + wnames[i] + ": rc " + std::to_string(rc[i]) + "\n got  " +
                      hex(got, NVSHMEM_EFA_WQE_SIZE) + "\n want " +
                      hex(wexp[i].data(), NVSHMEM_EFA_WQE_SIZE));
    }
    for (int i = 0; i < nc; i++)
        check(memcmp(&cout[i], &chost[i], sizeof(CqeOut)) == 0,
              "device " + cnames[i] + ": decoded fields differ from the host's");
    cudaFree(d_jobs);
    cudaFree(d_ring);
    cudaFree(d_rc);
    cudaFree(d_cjobs);
    cudaFree(d_cout);
    std::printf("device checks: %d WQEs and %d CQEs compared on GPU %d of %d\n", nw, nc, 0,
                count);
    device_entry_checks(ejobs, eexp, enames);
}
#endif

void helper_checks()
{
    check(nvshmem_efa_sq_phase(0, 8) == 0 && nvshmem_efa_sq_phase(7, 8) == 0 &&
              nvshmem_efa_sq_phase(8, 8) == 1 && nvshmem_efa_sq_phase(16, 8) == 0,
          "sq phase flips per wrap, starting at 0");
    check(nvshmem_efa_cq_expected_phase(0, 4) == 1 && nvshmem_efa_cq_expected_phase(4, 4) == 0 &&
              nvshmem_efa_cq_expected_phase(8, 4) == 1,
          "cq expected phase flips per wrap, starting at 1");
    check(nvshmem_efa_sq_slot(9, 8) == 1 && nvshmem_efa_sq_slot(UINT64_MAX, 1024) == 1023 &&
              nvshmem_efa_sq_slot(5, 0) == 0,
          "sq slot");
    nvshmem_efa_tx_wqe w;
    memset(&w, 0x5A, sizeof w);
    nvshmem_efa_route r = {1, 2, 3};
    uint8_t big[33] = {0};
    check(nvshmem_efa_write_send_inline(&w, &r, big, 33) == -1 && w.meta.ctrl1 == 0x5A,
          "inline longer than 32 bytes refused, WQE untouched");
    nvshmem_efa_sge s[3] = {{1, 1, 1}, {2, 2, 2}, {3, 3, 3}};
    check(nvshmem_efa_write_send_sge(&w, &r, s, 0) == -1 &&
              nvshmem_efa_write_send_sge(&w, &r, s, 3) == -1 && w.meta.ctrl1 == 0x5A,
          "send with 0 or 3 descriptors refused");
    // lkey bits above 23 are masked.
    nvshmem_efa_write_rdma_read(&w, &r, 0, 0, 0, 0xFFFFFFFFu, 1);
    check(w.data.rdma.local.lkey == NVSHMEM_EFA_LKEY_MASK, "lkey masked to 24 bits");
    // Phase and comp_req setters toggle both ways.
    nvshmem_efa_wqe_set_phase(&w, 1);
    nvshmem_efa_wqe_set_comp_req(&w, 1);
    nvshmem_efa_wqe_set_phase(&w, 0);
    nvshmem_efa_wqe_set_comp_req(&w, 0);
    check(w.meta.ctrl2 == (NVSHMEM_EFA_CTRL2_FIRST | NVSHMEM_EFA_CTRL2_LAST), "ctrl2 setters");
    nvshmem_efa_wqe_set_req_id64(&w, 0x1122334455667788ull);
    nvshmem_efa_wqe_set_req_id(&w, 0x99);
    check(w.meta.req_id == 0x99 && !w.meta.req_id_ex[0] && !w.meta.req_id_ex[1] &&
              !w.meta.req_id_ex[2],
          "16-bit request id clears req_id_ex");
    nvshmem_efa_tx_wqe slot;
    nvshmem_efa_wqe_store(&slot, &w);
    check(memcmp(&slot, &w, sizeof w) == 0, "store copies the WQE");
    // Entry sizes: 128 writes the whole entry; 64 (and any other size) writes the WQE only.
    alignas(64) uint8_t wide[192];
    memset(wide, 0xA5, sizeof wide);
    nvshmem_efa_wqe_store_entry(wide, &w, 128);
    bool tail_zero = true, after_kept = true;
    for (int i = 64; i < 128; i++)
        tail_zero = tail_zero && wide[i] == 0;
    for (int i = 128; i < 192; i++)
        after_kept = after_kept && wide[i] == 0xA5;
    check(memcmp(wide, &w, sizeof w) == 0 && tail_zero && after_kept,
          "a 128-byte entry is written whole: the WQE, then 64 zero bytes, nothing past it");
    memset(wide, 0xA5, sizeof wide);
    nvshmem_efa_wqe_store_entry(wide, &w, 64);
    after_kept = true;
    for (int i = 64; i < 192; i++)
        after_kept = after_kept && wide[i] == 0xA5;
    check(memcmp(wide, &w, sizeof w) == 0 && after_kept, "a 64-byte entry gets the WQE only");
}

} // namespace

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/golden/efa_vectors.txt";
    std::vector<Vector> vs = load(path);
    int skipped = 0, nwqe = 0, ncqe = 0;
    std::vector<WqeJob> wjobs;
    std::vector<std::vector<uint8_t>> wexp;
    std::vector<std::string> wnames, cnames;
    std::vector<CqeJob> cjobs;
    std::vector<CqeOut> chost;
    std::map<std::string, WqeJob> by_name;
    std::vector<EntryJob> ejobs;
    std::vector<std::vector<uint8_t>> eexp;
    std::vector<std::string> enames;
    int nentry = 0, nentry128 = 0;

    helper_checks();

    for (const Vector &v : vs) {
        if (v.kind == "wqe") {
            nwqe++;
            WqeJob j = wqe_job(v);
            std::vector<uint8_t> want = v.bytes("bytes");
            if (want.size() != NVSHMEM_EFA_WQE_SIZE) {
                check(false, v.name + ": expected bytes are not 64 long");
                continue;
            }
            nvshmem_efa_tx_wqe w;
            memset(&w, 0xA5, sizeof w);
            int rc = build_wqe(&j, &w);
            const uint8_t *got = (const uint8_t *)&w;
            bool ok = rc == 0 && memcmp(got, want.data(), NVSHMEM_EFA_WQE_SIZE) == 0;
            std::string diff;
            for (int i = 0; i < NVSHMEM_EFA_WQE_SIZE && !ok; i++)
                if (got[i] != want[i])
                    diff += " byte " + std::to_string(i) + ": got " + hex(&got[i], 1) +
                            " want " + hex(&want[i], 1) + ";";
            check(ok, v.name + ": rc " + std::to_string(rc) + "\n got  " +
                          hex(got, NVSHMEM_EFA_WQE_SIZE) + "\n want " +
                          hex(want.data(), NVSHMEM_EFA_WQE_SIZE) + "\n" + diff);
            wjobs.push_back(j);
            wexp.push_back(want);
            wnames.push_back(v.name);
            by_name[v.name] = j;
        } else if (v.kind == "entry") {
            nentry++;
            auto it = by_name.find(v.get("of"));
            uint32_t size = (uint32_t)v.num("entry_size");
            std::vector<uint8_t> want = v.bytes("bytes");
            if (it == by_name.end() || (size != 64 && size != 128) || want.size() != size) {
                check(false, v.name + ": unknown WQE, bad entry size or wrong byte count");
                continue;
            }
            nentry128 += size == 128;
            EntryJob e;
            e.wqe = it->second;
            e.entry_size = size;
            nvshmem_efa_tx_wqe w;
            int rc = build_wqe(&e.wqe, &w);
            alignas(64) uint8_t slot[128];
            memset(slot, 0xA5, sizeof slot);
            nvshmem_efa_wqe_store_entry(slot, &w, size);
            std::vector<uint8_t> expect = entry_slot(want);
            check(rc == 0 && memcmp(slot, expect.data(), 128) == 0,
                  v.name + "\n got  " + hex(slot, 128) + "\n want " + hex(expect.data(), 128));
            ejobs.push_back(e);
            eexp.push_back(want);
            enames.push_back(v.name);
        } else if (v.kind == "tx_cqe" || v.kind == "rx_cqe" || v.kind == "rx_cqe_ex") {
            ncqe++;
            CqeJob j;
            memset(&j, 0, sizeof j);
            j.kind = v.kind == "tx_cqe" ? C_TX : v.kind == "rx_cqe" ? C_RX : C_RX_EX;
            j.req64 = v.kind == "tx_cqe" ? (int)v.num("req64") : 0;
            std::vector<uint8_t> b = v.bytes("bytes");
            size_t want_len = j.kind == C_RX_EX ? 32 : 16;
            if (b.size() != want_len) {
                check(false, v.name + ": wrong byte count");
                continue;
            }
            memcpy(j.bytes, b.data(), b.size());
            CqeOut o;
            decode_cqe(&j, &o);
            check_cqe_fields(v, o);
            cjobs.push_back(j);
            chost.push_back(o);
            cnames.push_back(v.name);
        } else if (v.kind == "wqe_bad" || v.kind == "cqe_bad" || v.kind == "entry_bad") {
            skipped++;
        } else {
            check(false, "line " + std::to_string(v.line) + ": unknown kind " + v.kind);
        }
    }
    check(nwqe >= 40, "at least 40 WQE vectors");
    check(ncqe >= 20, "at least 20 CQE vectors");
    check(nentry128 >= 5, "at least 5 vectors of 128-byte ring entries");
    std::printf("host checks: %d WQE vectors, %d CQE vectors, %d ring entries (%d of 128 bytes); "
                "%d negative vectors skipped\n",
                nwqe, ncqe, nentry, nentry128, skipped);

#ifdef __CUDACC__
    device_checks(wjobs, wexp, cjobs, chost, wnames, cnames, ejobs, eexp, enames);
#endif

    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
