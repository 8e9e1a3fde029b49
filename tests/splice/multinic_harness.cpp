// Runs the NVSHMEM 3.6-3.8 splice (patches/nvshmem-3.6-3.8) outside NVSHMEM: the code the patch adds
// to libfabric.cpp is compiled against this file's own stand-ins for the transport's types and
// stock host ops (the member and function names the splice uses, laid out as in the multi-NIC
// transport: host endpoints first, then one proxy endpoint per NIC) and against a recording
// stand-in for libnvshmem_efa_gda's C API and for the libfabric calls the splice makes. It checks
// what the splice does: that GDA gets an endpoint of its own (its own CQs and AV, bound and enabled
// on the first proxy endpoint's domain, never NVSHMEM's proxy endpoint), that its transmit CQ goes
// to set_cq, the fi_addrs it connects (every PE's endpoint name inserted into the GDA AV), the heap
// registration and remote keys it hands over, that every PE agrees, and that GDA stops, and its
// endpoint closes, before the stock release and finalize.
//
// tests/splice/run.sh extracts the patch's additions into splice_include.inc, splice_block.inc and
// splice_hook.inc and builds this file twice: with the ABI 5 host-op signatures, and with an
// extra trailing parameter on each wrapped op (-DHARNESS_EXTRA_PARAM), as a later ABI might add.
#include <array>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <strings.h>

// ---- stand-ins for the libfabric objects and calls the splice uses (recording) ----
typedef uint64_t fi_addr_t;
struct fid {
    int fclass;
};
struct fid_ep {
    struct fid fid;
};
struct fid_cq {
    struct fid fid;
};
struct fid_av {
    struct fid fid;
};
struct fid_domain;
struct fid_mr;
enum { FI_CQ_FORMAT_DATA = 3 };
enum { FI_WAIT_NONE = 0 };
enum fi_av_type { FI_AV_UNSPEC = 0, FI_AV_MAP = 1, FI_AV_TABLE = 2 };
#define FI_TRANSMIT (1ULL << 11)
#define FI_RECV (1ULL << 10)
struct fi_tx_attr {
    size_t size;
};
struct fi_domain_attr {
    enum fi_av_type av_type;
};
struct fi_info {
    struct fi_tx_attr *tx_attr;
    struct fi_domain_attr *domain_attr;
};
struct fi_cq_attr {
    size_t size;
    uint64_t flags;
    int format;
    int wait_obj;
};
struct fi_av_attr {
    enum fi_av_type type;
};

#include "splice_include.inc"

// ---- stand-ins for NVSHMEM's transport types and macros ----
#define NVSHMEMX_SUCCESS 0
#define NVSHMEMX_ERROR_OUT_OF_MEMORY 2
#define NVSHMEMX_ERROR_INTERNAL 7
#define INFO(level, ...) ((void)(level), log_line("INFO", __VA_ARGS__))
#define NVSHMEMI_WARN_PRINT(...) log_line("WARN", __VA_ARGS__)
#define NVSHMEMI_ERROR_PRINT(...) log_line("ERROR", __VA_ARGS__)
#define NVSHMEMI_ERROR_JMP(status, err, label, ...) \
    do {                                            \
        log_line("ERROR", __VA_ARGS__);             \
        status = err;                               \
        goto label;                                 \
    } while (0)
#define NVSHMEMI_NZ_ERROR_JMP(status, err, label, ...) \
    do {                                               \
        if (status != 0) {                             \
            log_line("ERROR", __VA_ARGS__);            \
            status = err;                              \
            goto label;                                \
        }                                              \
    } while (0)

static std::string g_log;
static void log_line(const char *level, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_log += std::string(level) + ": " + buf + "\n";
}

typedef struct {
    char reserved[512];
} nvshmem_mem_handle_t;

struct bootstrap_handle {
    int (*allgather)(const void *send, void *recv, int bytes, struct bootstrap_handle *h);
};

struct nvshmem_transport;
typedef struct nvshmem_transport *nvshmem_transport_t;

#ifdef HARNESS_EXTRA_PARAM
#define EXTRA , int extra
#define EXTRA_ARG , 7
#else
#define EXTRA
#define EXTRA_ARG
#endif

struct nvshmem_transport_host_ops {
    int (*connect_endpoints)(nvshmem_transport_t t, int *dev_ids, int n, int *qp, int nqp EXTRA);
    int (*get_mem_handle)(nvshmem_mem_handle_t *h, void *buf, size_t len, nvshmem_transport_t t,
                          bool local_only EXTRA);
    int (*release_mem_handle)(nvshmem_mem_handle_t *h, nvshmem_transport_t t EXTRA);
    int (*finalize)(nvshmem_transport_t t);
    int (*add_device_remote_mem_handles)(nvshmem_transport_t t, int stride,
                                         nvshmem_mem_handle_t *handles, uint64_t heap_offset,
                                         size_t size);
};

struct nvshmem_transport {
    struct nvshmem_transport_host_ops host_ops;
    struct bootstrap_handle *boot_handle;
    void *state;
    int index;
    int my_pe;
    int n_pes;
};

typedef struct {
    struct fid_ep *endpoint;
    int domain_index;
} nvshmemt_libfabric_endpoint_t;

typedef struct {
    std::vector<struct fi_info *> prov_infos;
    std::vector<struct fid_domain *> domains;
    std::vector<std::unique_ptr<nvshmemt_libfabric_endpoint_t>> eps;
    void *local_mem_ptr;
    int log_level;
    int num_host_domains;
} nvshmemt_libfabric_state_t;

typedef struct {
    struct fid_mr *mr;
    uint64_t key;
    void *local_desc;
} nvshmemt_libfabric_mem_handle_ep_t;

struct nvshmemt_libfabric_mem_handle_t {
    void *buf;
    std::array<nvshmemt_libfabric_mem_handle_ep_t, 21> hdls;
};

// ---- stand-ins for the stock host ops, recording the order of events ----
static std::vector<std::string> g_events;
static const int kProxyNics = 4; /* proxy endpoints 1..4 after the host endpoint 0 */

static struct fid_domain *fake_domain(int i) { return (struct fid_domain *)(uintptr_t)(0x1000 + i); }
static struct fid_ep *fake_ep(int i) { return (struct fid_ep *)(uintptr_t)(0x2000 + i); }
static struct fid_mr *fake_mr(int i) { return (struct fid_mr *)(uintptr_t)(0x3000 + i); }
static struct fi_tx_attr g_tx_attr = {1000};
static struct fi_domain_attr g_domain_attr = {FI_AV_TABLE};
static struct fi_info g_infos[1 + kProxyNics];

// The GDA objects the splice opens, and what it did with them.
static struct fid_ep g_gda_ep;
static struct fid_cq g_cqs[2];
static struct fid_av g_gda_av;
static int g_cqs_open = 0;
static struct fid_domain *g_ep_domain;
static struct fi_info *g_ep_info;
static struct fi_cq_attr g_cq_attr;
static enum fi_av_type g_av_type;
static std::vector<std::pair<struct fid *, uint64_t>> g_binds;
static bool g_enabled = false;
static int g_endpoint_ret = 0; /* what fi_endpoint returns */
static struct fid_av *g_insert_av;
static std::string g_inserted;

static int fi_cq_open(struct fid_domain *, struct fi_cq_attr *attr, struct fid_cq **cq, void *) {
    g_cq_attr = *attr;
    *cq = &g_cqs[g_cqs_open++ % 2];
    g_events.push_back("fi_cq_open");
    return 0;
}
static int fi_av_open(struct fid_domain *, struct fi_av_attr *attr, struct fid_av **av, void *) {
    g_av_type = attr->type;
    *av = &g_gda_av;
    g_events.push_back("fi_av_open");
    return 0;
}
static int fi_endpoint(struct fid_domain *d, struct fi_info *info, struct fid_ep **ep, void *) {
    g_ep_domain = d;
    g_ep_info = info;
    if (g_endpoint_ret) return g_endpoint_ret;
    *ep = &g_gda_ep;
    g_events.push_back("fi_endpoint");
    return 0;
}
static int fi_ep_bind(struct fid_ep *ep, struct fid *f, uint64_t flags) {
    if (ep != &g_gda_ep) return -22;
    g_binds.push_back(std::make_pair(f, flags));
    return 0;
}
static int fi_enable(struct fid_ep *ep) {
    if (ep != &g_gda_ep) return -22;
    g_enabled = true;
    g_events.push_back("fi_enable");
    return 0;
}
static int fi_getname(struct fid *f, void *name, size_t *len) {
    if (f != &g_gda_ep.fid || *len < 6) return -22;
    memcpy(name, "gdaep", 6);
    *len = 6;
    return 0;
}
static int fi_av_insert(struct fid_av *av, const void *names, size_t n, fi_addr_t *out, uint64_t,
                        void *) {
    g_insert_av = av;
    g_inserted.assign((const char *)names, 6 * n);
    for (size_t i = 0; i < n; i++) out[i] = 700 + i;
    return (int)n;
}
static int fi_close(struct fid *f) {
    if (f == &g_gda_ep.fid) g_events.push_back("close ep");
    else if (f == &g_cqs[0].fid || f == &g_cqs[1].fid) g_events.push_back("close cq");
    else if (f == &g_gda_av.fid) g_events.push_back("close av");
    else g_events.push_back("close ?");
    return 0;
}
static const char *fi_strerror(int) { return "stand-in error"; }

static int nvshmemt_libfabric_connect_endpoints(nvshmem_transport_t t, int *, int, int *,
                                                int EXTRA) {
    nvshmemt_libfabric_state_t *s = (nvshmemt_libfabric_state_t *)t->state;
    g_events.push_back("stock connect");
    if (!s->eps.empty()) return 0; /* already connected, as the stock op says */
    s->num_host_domains = 1;
    for (int i = 0; i < 1 + kProxyNics; i++) {
        g_infos[i].tx_attr = &g_tx_attr;
        g_infos[i].domain_attr = &g_domain_attr;
        s->prov_infos.push_back(&g_infos[i]);
        s->domains.push_back(fake_domain(i));
        s->eps.emplace_back(new nvshmemt_libfabric_endpoint_t());
        s->eps[i]->endpoint = fake_ep(i);
        s->eps[i]->domain_index = i;
    }
    return 0;
}

static int nvshmemt_libfabric_get_mem_handle(nvshmem_mem_handle_t *h, void *buf, size_t,
                                             nvshmem_transport_t t, bool local_only EXTRA) {
    nvshmemt_libfabric_state_t *s = (nvshmemt_libfabric_state_t *)t->state;
    nvshmemt_libfabric_mem_handle_t *fh = (nvshmemt_libfabric_mem_handle_t *)h;
    fh->buf = buf;
    for (size_t i = 0; i < s->domains.size(); i++) {
        fh->hdls[i].mr = fake_mr((int)i);
        fh->hdls[i].key = 100 * (uint64_t)t->my_pe + i;
    }
    if (!local_only && s->local_mem_ptr == NULL) s->local_mem_ptr = buf;
    g_events.push_back("stock get_mem_handle");
    return 0;
}

static int nvshmemt_libfabric_release_mem_handle(nvshmem_mem_handle_t *, nvshmem_transport_t EXTRA) {
    g_events.push_back("stock release");
    return 0;
}

static int nvshmemt_libfabric_finalize(nvshmem_transport_t) {
    g_events.push_back("stock finalize");
    return 0;
}

// ---- the splice's additions ----
#include "splice_block.inc"

static void install_host_ops(nvshmem_transport_t transport) {
    transport->host_ops.connect_endpoints = nvshmemt_libfabric_connect_endpoints;
    transport->host_ops.get_mem_handle = nvshmemt_libfabric_get_mem_handle;
    transport->host_ops.release_mem_handle = nvshmemt_libfabric_release_mem_handle;
    transport->host_ops.finalize = nvshmemt_libfabric_finalize;
    transport->host_ops.add_device_remote_mem_handles = NULL;
#include "splice_hook.inc"
}

// ---- recording stand-in for libnvshmem_efa_gda ----
static struct fid_domain *g_init_domain;
static struct fid_ep *g_init_ep;
static int g_mode = 1;       /* what nvshmemt_efa_gda_mode() answers after init */
static int g_init_ret = 0;   /* what init_on_ep returns */
static int g_fini_calls = 0;
static struct fid_cq *g_set_cq;
static int g_set_cq_ret = 0;
static std::vector<uint64_t> g_fi_addrs;
static void *g_heap_base;
static struct fid_mr *g_heap_mr;
static std::vector<uint64_t> g_remote_keys, g_remote_bases;

extern "C" {
int32_t nvshmemt_efa_gda_init_on_ep(struct fid_domain *d, struct fid_ep *e) {
    g_init_domain = d;
    g_init_ep = e;
    if (!g_enabled) return 99; /* the endpoint must be enabled first */
    g_events.push_back("gda init");
    return g_init_ret;
}
int32_t nvshmemt_efa_gda_mode(void) { return g_init_ret == 0 ? g_mode : -1; }
int32_t nvshmemt_efa_gda_set_cq(struct fid_cq *cq) {
    g_set_cq = cq;
    g_events.push_back("gda set_cq");
    return g_set_cq_ret;
}
int32_t nvshmemt_efa_gda_get_address(void *buf, size_t *len) {
    if (*len < 8) return 1;
    memcpy(buf, "gdaaddr", 8);
    *len = 8;
    return 0;
}
static bool g_connect_names = false; /* connect was given endpoint names (not for the caller's ep) */
int32_t nvshmemt_efa_gda_connect(int32_t, int32_t n_pes, const void *names, size_t,
                                 const uint64_t *fi_addrs) {
    g_connect_names = names != NULL;
    g_fi_addrs.assign(fi_addrs, fi_addrs + n_pes);
    g_events.push_back("gda connect");
    return 0;
}
void nvshmemt_efa_gda_fini(void) {
    g_fini_calls++;
    g_events.push_back("gda fini");
}
int32_t nvshmemt_efa_gda_set_local_heap(void *base, size_t, struct fid_mr *mr) {
    g_heap_base = base;
    g_heap_mr = mr;
    return 0;
}
int32_t nvshmemt_efa_gda_set_remote_heap(int32_t, uint64_t base, uint64_t, uint64_t key) {
    g_remote_bases.push_back(base);
    g_remote_keys.push_back(key);
    return 0;
}
}

// ---- a fake bootstrap: n_pes PEs, every other PE answering what this one sent, unless told ----
static int g_bad_pe = -1; /* this PE's GDA record arrives with mode 0 from that PE */
static int fake_allgather(const void *send, void *recv, int bytes, struct bootstrap_handle *) {
    for (int pe = 0; pe < 4; pe++) memcpy((char *)recv + (size_t)pe * bytes, send, bytes);
    if (g_bad_pe >= 0 && bytes == (int)sizeof(nvshmemt_libfabric_gda_peer_t))
        ((nvshmemt_libfabric_gda_peer_t *)recv)[g_bad_pe].mode = 0;
    return 0;
}

static int g_failed = 0, g_passed = 0;
#define CHECK(cond)                                                  \
    do {                                                             \
        if (cond) {                                                  \
            g_passed++;                                              \
        } else {                                                     \
            g_failed++;                                              \
            fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond); \
        }                                                            \
    } while (0)

struct Pe {
    struct bootstrap_handle boot;
    nvshmemt_libfabric_state_t state;
    struct nvshmem_transport t;
    Pe() : state() {
        boot.allgather = fake_allgather;
        memset(&t, 0, sizeof(t));
        t.boot_handle = &boot;
        t.state = &state;
        t.index = 0;
        t.my_pe = 1;
        t.n_pes = 4;
        state.local_mem_ptr = NULL;
        install_host_ops(&t);
    }
};

static void reset() {
    g_events.clear();
    g_log.clear();
    g_fini_calls = 0;
    g_fi_addrs.clear();
    g_heap_base = NULL;
    g_heap_mr = NULL;
    g_remote_keys.clear();
    g_remote_bases.clear();
    g_bad_pe = -1;
    g_mode = 1;
    g_init_ret = 0;
    g_set_cq = NULL;
    g_init_ep = NULL;
    g_init_domain = NULL;
    g_set_cq_ret = 0;
    g_endpoint_ret = 0;
    g_binds.clear();
    g_enabled = false;
    g_cqs_open = 0;
    g_ep_domain = NULL;
    g_ep_info = NULL;
    g_insert_av = NULL;
    g_inserted.clear();
    g_connect_names = false;
    nvshmemt_libfabric_gda_stop();
    g_fini_calls = 0;
    g_events.clear();
    unsetenv("NVSHMEM_EFA_GDA");
}

int main() {
    int dev_ids[kProxyNics] = {0, 1, 2, 3};
    // 1. GDA on the first proxy endpoint, every PE connected through its first proxy endpoint.
    reset();
    {
        Pe pe;
        CHECK(pe.t.host_ops.add_device_remote_mem_handles != NULL);
        int rc = pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG);
        CHECK(rc == 0);
        // GDA's own endpoint, on the first proxy endpoint's domain with that endpoint's info; never
        // NVSHMEM's proxy endpoint.
        CHECK(g_ep_domain == fake_domain(1) && g_ep_info == &g_infos[1]);
        CHECK(g_init_domain == fake_domain(1) && g_init_ep == &g_gda_ep);
        for (int i = 0; i < 1 + kProxyNics; i++) CHECK(g_init_ep != fake_ep(i));
        // Its own AV (the domain's AV type) and CQs: a transmit CQ that goes to set_cq, a receive
        // CQ; a power-of-two CQ at least as deep as the send queue; enabled before init.
        CHECK(g_av_type == FI_AV_TABLE);
        CHECK(g_cq_attr.size == 1024 && g_cq_attr.format == FI_CQ_FORMAT_DATA &&
              g_cq_attr.wait_obj == FI_WAIT_NONE);
        CHECK(g_binds.size() == 3);
        if (g_binds.size() == 3) {
            CHECK(g_binds[0].first == &g_gda_av.fid && g_binds[0].second == 0);
            CHECK(g_binds[1].first == &g_cqs[0].fid && g_binds[1].second == FI_TRANSMIT);
            CHECK(g_binds[2].first == &g_cqs[1].fid && g_binds[2].second == FI_RECV);
        }
        CHECK(g_enabled && g_set_cq == &g_cqs[0]);
        CHECK(g_events.size() >= 8 && g_events[0] == "stock connect" &&
              g_events[1] == "fi_cq_open" && g_events[4] == "fi_endpoint" &&
              g_events[5] == "fi_enable" && g_events[6] == "gda init" &&
              g_events[7] == "gda set_cq");
        // Every PE's GDA endpoint name into the GDA AV; connect with those fi_addrs, no names.
        CHECK(g_insert_av == &g_gda_av && g_inserted == std::string("gdaep\0gdaep\0gdaep\0gdaep\0", 24));
        CHECK(g_fi_addrs.size() == 4 && !g_connect_names);
        for (size_t p = 0; p < g_fi_addrs.size(); p++) CHECK(g_fi_addrs[p] == 700 + p);
        CHECK(g_log.find("EFA GDA on (mode 1) on its own endpoint, domain 1 of proxy endpoint 1 of 5") !=
              std::string::npos);
        // A second connect_endpoints (the stock op tolerates it) does not set GDA up again.
        size_t inits = 0;
        pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG);
        for (auto &e : g_events) inits += (e == "gda init");
        CHECK(inits == 1);

        // 2. A local-only registration is not the heap; the first remote one is, with the
        //    registration on the proxy domain; a later one is not.
        static char scratch[64], heap[4096], other[4096];
        nvshmem_mem_handle_t h_local, h_heap, h_other;
        CHECK(pe.t.host_ops.get_mem_handle(&h_local, scratch, sizeof(scratch), &pe.t, true EXTRA_ARG) == 0);
        CHECK(g_heap_base == NULL);
        CHECK(pe.t.host_ops.get_mem_handle(&h_heap, heap, sizeof(heap), &pe.t, false EXTRA_ARG) == 0);
        CHECK(g_heap_base == heap && g_heap_mr == fake_mr(1));
        CHECK(pe.t.host_ops.get_mem_handle(&h_other, other, sizeof(other), &pe.t, false EXTRA_ARG) == 0);
        CHECK(g_heap_base == heap);

        // 3. Remote heaps: each PE's base and its proxy-domain key; other chunks ignored.
        nvshmem_mem_handle_t all[4];
        for (int p = 0; p < 4; p++) {
            nvshmemt_libfabric_mem_handle_t *fh = (nvshmemt_libfabric_mem_handle_t *)&all[p];
            fh->buf = heap;
            for (int i = 0; i < 5; i++) fh->hdls[i].key = 1000 * (uint64_t)p + i;
        }
        CHECK(pe.t.host_ops.add_device_remote_mem_handles(&pe.t, 1, all, 0, sizeof(heap)) == 0);
        CHECK(g_remote_keys.size() == 4);
        for (size_t p = 0; p < g_remote_keys.size(); p++) {
            CHECK(g_remote_keys[p] == 1000 * p + 1);
            CHECK(g_remote_bases[p] == (uint64_t)(uintptr_t)heap);
        }
        nvshmem_mem_handle_t chunk[4];
        for (int p = 0; p < 4; p++) ((nvshmemt_libfabric_mem_handle_t *)&chunk[p])->buf = other;
        g_remote_keys.clear();
        CHECK(pe.t.host_ops.add_device_remote_mem_handles(&pe.t, 1, chunk, 4096, sizeof(other)) == 0);
        CHECK(g_remote_keys.empty());

        // 4. Releasing another registration leaves GDA on; releasing the heap stops it first.
        g_events.clear();
        pe.t.host_ops.release_mem_handle(&h_other, &pe.t EXTRA_ARG);
        CHECK(g_fini_calls == 0);
        pe.t.host_ops.release_mem_handle(&h_heap, &pe.t EXTRA_ARG);
        // fini, then the GDA endpoint before its CQs and AV, then the stock release.
        const char *want[] = {"stock release", "gda fini", "close ep", "close cq",
                              "close cq",      "close av", "stock release"};
        CHECK(g_events.size() == 7);
        for (size_t i = 0; i < 7 && i < g_events.size(); i++) CHECK(g_events[i] == want[i]);
        // 5. finalize: no second fini (already stopped), then the stock finalize.
        g_events.clear();
        pe.t.host_ops.finalize(&pe.t);
        CHECK(g_fini_calls == 1 && g_events.back() == "stock finalize");
    }
    // 6. finalize with GDA on stops it before the stock finalize.
    reset();
    {
        Pe pe;
        pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG);
        g_events.clear();
        pe.t.host_ops.finalize(&pe.t);
        CHECK(g_events.size() == 6 && g_events[0] == "gda fini" && g_events[1] == "close ep" &&
              g_events[4] == "close av" && g_events[5] == "stock finalize");
    }
    // 7. One PE without GDA: off everywhere, the transport carries on, fini owed and paid.
    reset();
    {
        Pe pe;
        g_bad_pe = 2;
        CHECK(pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG) == 0);
        CHECK(g_fi_addrs.empty() && g_fini_calls == 1);
        CHECK(g_log.find("EFA GDA off") != std::string::npos);
        static char heap[64];
        nvshmem_mem_handle_t h;
        pe.t.host_ops.get_mem_handle(&h, heap, sizeof(heap), &pe.t, false EXTRA_ARG);
        CHECK(g_heap_base == NULL);
    }
    // 8. ... unless NVSHMEM_EFA_GDA=hw demands it: then connect_endpoints fails, with the reason.
    reset();
    {
        Pe pe;
        g_bad_pe = 2;
        setenv("NVSHMEM_EFA_GDA", "hw", 1);
        CHECK(pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG) != 0);
        CHECK(g_log.find("EFA GDA on PE 2 is in mode 0") != std::string::npos);
        CHECK(g_fini_calls == 1);
    }
    // 10. The endpoint cannot be opened: off, no init, what was opened is closed.
    reset();
    {
        Pe pe;
        g_endpoint_ret = -12;
        CHECK(pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG) == 0);
        CHECK(g_init_ep == NULL && g_fi_addrs.empty() && g_fini_calls == 0);
        size_t closes = 0;
        for (auto &e : g_events) closes += (e == "close cq" || e == "close av");
        CHECK(closes == 3);
        CHECK(g_log.find("opening its endpoint failed: -12") != std::string::npos);
    }
    // 11. set_cq refusing (a ring the kernels cannot read): off, fini owed and paid, endpoint closed.
    reset();
    {
        Pe pe;
        g_set_cq_ret = 4;
        CHECK(pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG) == 0);
        CHECK(g_fi_addrs.empty() && g_fini_calls == 1);
        CHECK(g_log.find("EFA GDA unavailable on PE 1 (init 4") != std::string::npos);
        bool closed = false;
        for (auto &e : g_events) closed |= (e == "close ep");
        CHECK(closed);
    }
    // 9. init_on_ep refusing (e.g. no GDA ops on this fabric): off, no connect.
    reset();
    {
        Pe pe;
        g_init_ret = 3;
        CHECK(pe.t.host_ops.connect_endpoints(&pe.t, dev_ids, kProxyNics, NULL, 0 EXTRA_ARG) == 0);
        CHECK(g_fi_addrs.empty());
        CHECK(g_log.find("EFA GDA unavailable on PE 1 (init 3") != std::string::npos);
    }
    reset();
    printf("multinic harness%s: %d checks passed, %d failed\n",
#ifdef HARNESS_EXTRA_PARAM
           " (extra host-op parameter)",
#else
           " (ABI 5 host ops)",
#endif
           g_passed, g_failed);
    return g_failed ? 1 : 0;
}
