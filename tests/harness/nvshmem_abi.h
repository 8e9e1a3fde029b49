/*
 * C mirror of the NVSHMEM remote-transport ABI, as seen by the host that loads a
 * transport plugin (`nvshmemt_init`). Written for the host harness from the layouts
 * documented in docs/FACTS.md section 1 (NVSHMEM 3.4.5 = ABI v3, NVSHMEM 3.5.x = ABI v4).
 *
 * Every layout is pinned with _Static_assert (x86-64 / LP64 sizes and offsets), so a
 * drift between this mirror and the library's own definitions shows up at compile time
 * of the harness and as wrong behaviour at run time of the library, never silently.
 *
 * Names are the harness's own (prefix `harness_` / `HARNESS_`).
 */
#ifndef HARNESS_NVSHMEM_ABI_H
#define HARNESS_NVSHMEM_ABI_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "the harness ABI mirror is written for LP64 targets (x86-64, aarch64)"
#endif

/* ---------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------- */
/* api_version = major * 10000 + minor * 100 + patch */
#define HARNESS_API_VERSION_V3 30000 /* NVSHMEM 3.4.5 passes this */
#define HARNESS_API_VERSION_V4 40000 /* NVSHMEM 3.5.0 / 3.5.1 pass this */
/* NVSHMEM 3.6.5, 3.7.2, 3.8.0 pass 50000, 60000, 70000 (plugin versions 5.0.0, 6.0.0, 7.0.0) */
#define HARNESS_API_MAJOR(v) ((v) / 10000)
#define HARNESS_API_MAJOR_MINOR(v) ((v) / 100)
/* bootstrap_handle.version NVSHMEM 3.4.x / 3.5.x fill in (bootstrap ABI 3.0.0) */
#define HARNESS_BOOTSTRAP_VERSION 30000

/* ---------------------------------------------------------------------------------------
 * Opcodes
 * ------------------------------------------------------------------------------------- */
enum harness_op {
    HARNESS_OP_PUT = 1,
    HARNESS_OP_P = 2,
    HARNESS_OP_PUT_SIGNAL = 3,
    HARNESS_OP_GET = 4,
    HARNESS_OP_G = 5,
    HARNESS_OP_FENCE = 6,
    HARNESS_OP_AMO = 7,
    HARNESS_OP_QUIET = 8,
};

enum harness_amo {
    HARNESS_AMO_ACK = 1,
    HARNESS_AMO_INC = 2,
    HARNESS_AMO_SET = 3,
    HARNESS_AMO_ADD = 4,
    HARNESS_AMO_AND = 5,
    HARNESS_AMO_OR = 6,
    HARNESS_AMO_XOR = 7,
    HARNESS_AMO_SIGNAL = 8,
    HARNESS_AMO_SIGNAL_SET = 9,
    HARNESS_AMO_SIGNAL_ADD = 10,
    HARNESS_AMO_END_OF_NONFETCH = 11,
    HARNESS_AMO_FETCH = 12,
    HARNESS_AMO_FETCH_INC = 13,
    HARNESS_AMO_FETCH_ADD = 14,
    HARNESS_AMO_FETCH_AND = 15,
    HARNESS_AMO_FETCH_OR = 16,
    HARNESS_AMO_FETCH_XOR = 17,
    HARNESS_AMO_SWAP = 18,
    HARNESS_AMO_COMPARE_SWAP = 19,
};

/* qp_index values of ABI v4 */
#define HARNESS_QP_HOST 0
#define HARNESS_QP_DEFAULT 1 /* the proxy's queue */
#define HARNESS_QP_ALL INT_MAX

/* ---------------------------------------------------------------------------------------
 * Capability and attribute bits
 * ------------------------------------------------------------------------------------- */
enum {
    HARNESS_CAP_MAP = 1,
    HARNESS_CAP_MAP_GPU_ST = 1 << 1,
    HARNESS_CAP_MAP_GPU_LD = 1 << 2,
    HARNESS_CAP_MAP_GPU_ATOMICS = 1 << 3,
    HARNESS_CAP_CPU_WRITE = 1 << 4,
    HARNESS_CAP_CPU_READ = 1 << 5,
    HARNESS_CAP_CPU_ATOMICS = 1 << 6,
    HARNESS_CAP_GPU_WRITE = 1 << 7,
    HARNESS_CAP_GPU_READ = 1 << 8,
    HARNESS_CAP_GPU_ATOMICS = 1 << 9,
};

enum {
    HARNESS_ATTR_NO_ENDPOINTS = 1,
    HARNESS_ATTR_CONNECTED = 1 << 1,
};

enum { HARNESS_TRANSPORT_TYPE_NONE = 0, HARNESS_TRANSPORT_TYPE_IBGDA = 1 };
enum { HARNESS_STYLE_INFO = 0, HARNESS_STYLE_RST = 1 };

/* ---------------------------------------------------------------------------------------
 * Shared types
 * ------------------------------------------------------------------------------------- */
#define HARNESS_MEM_HANDLE_SIZE 512

/* Opaque to the host: it only copies, allgathers and passes pointers to these bytes. */
typedef struct harness_mem_handle {
    char bytes[HARNESS_MEM_HANDLE_SIZE];
} harness_mem_handle;

typedef struct harness_pcie_id {
    int dev_id;
    int bus_id;
    int domain_id;
} harness_pcie_id;

typedef struct harness_uuid {
    char bytes[16];
} harness_uuid;

typedef struct harness_pe_info {
    harness_pcie_id pcie_id;
    int pe;
    uint64_t host_hash;
    harness_uuid gpu_uuid;
} harness_pe_info;

typedef struct harness_rma_verb {
    int op; /* enum harness_op */
    int is_nbi;
    int is_stream;
    void *stream; /* cudaStream_t */
} harness_rma_verb;

typedef struct harness_rma_memdesc {
    void *ptr;
    uint64_t offset; /* offset of ptr inside the registration `handle` describes */
    harness_mem_handle *handle;
} harness_rma_memdesc;

typedef struct harness_rma_bytesdesc {
    size_t nelems;
    int elembytes;
    ptrdiff_t srcstride; /* in elements */
    ptrdiff_t deststride;
} harness_rma_bytesdesc;

typedef struct harness_amo_verb {
    int op; /* enum harness_amo */
    int is_fetch;
    int is_val;
    int is_cmp;
} harness_amo_verb;

/* ABI 7 (NVSHMEM 3.8.x; NVIDIA/nvshmem 6d5e14cd961a1fa07a30849e05f0882d78a6cdb1, transport.h):
 * amo_verb gains a trailing is_float; 20 bytes, so amo and put_signal take a different argument type
 * (passed in memory, not in two registers). ABI 6 (3.7.x) is assumed to have it too (inferred: the
 * 3.7.2 wheel adds NVSHMEMI_AMO_FLOAT_BIT; no major-6 header was found). ABI 5 (3.6.x; NVIDIA/nvshmem
 * ef92d34f16d05a7f119b760da864efaa0742d20d) keeps v4's layout exactly. ABI 7 appends rma_with_hints
 * and region_flush to the host ops and an enum (int) device_assignment_mode after them. */
typedef struct harness_amo_verb_f {
    int op;
    int is_fetch;
    int is_val;
    int is_cmp;
    int is_float;
} harness_amo_verb_f;

typedef struct harness_op_attrs {
    uint32_t flags; /* bit 0: MORE_FOLLOWS */
    uint32_t hints; /* bit 0: BATCH_RMA */
    uint64_t issuer_id;
    uint64_t region_id;
} harness_op_attrs;
#define HARNESS_OP_FLAG_MORE_FOLLOWS 1u
#define HARNESS_REGION_ROLE_HOST 0
#define HARNESS_REGION_ROLE_PROXY 1

typedef struct harness_amo_memdesc {
    harness_rma_memdesc remote;
    uint64_t retflag;
    void *retptr;
    void *valptr;
    void *cmpptr;
    uint64_t val;
    uint64_t cmp;
    harness_mem_handle *ret_handle;
} harness_amo_memdesc;

typedef struct harness_amo_bytesdesc {
    int name_type;
    int elembytes;
} harness_amo_bytesdesc;

/* What a fetching AMO through the proxy returns at retptr: {data, flag}. */
typedef struct harness_g_elem {
    volatile uint64_t data;
    volatile uint64_t flag;
} harness_g_elem;

/* libstdc++ std::vector<T> as it sits in memory; `std::vector<T>&` is a pointer to it. */
typedef struct harness_vec {
    void *begin;
    void *end;
    void *end_of_storage;
} harness_vec;

/* ---------------------------------------------------------------------------------------
 * Bootstrap handle (the host's; the plugin calls these to exchange data)
 * ------------------------------------------------------------------------------------- */
typedef struct harness_bootstrap_init_ops {
    void *cookie;
    int (*get_unique_id)(void *cookie);
} harness_bootstrap_init_ops;

typedef struct harness_bootstrap_handle {
    int version;
    int pg_rank;
    int pg_size;
    int mype_node;
    int npes_node;
    /* `bytes` is the size of one rank's block */
    int (*allgather)(const void *sendbuf, void *recvbuf, int bytes,
                     struct harness_bootstrap_handle *handle);
    int (*alltoall)(const void *sendbuf, void *recvbuf, int bytes,
                    struct harness_bootstrap_handle *handle);
    int (*barrier)(struct harness_bootstrap_handle *handle);
    void (*global_exit)(int status);
    int (*finalize)(struct harness_bootstrap_handle *handle);
    int (*show_info)(struct harness_bootstrap_handle *handle, int style);
    harness_bootstrap_init_ops *pre_init_ops;
    void *comm_state;
} harness_bootstrap_handle;

/* ---------------------------------------------------------------------------------------
 * ABI v3 (NVSHMEM 3.4.x): host_ops embedded right after `cap`
 * ------------------------------------------------------------------------------------- */
struct harness_transport_v3;

struct harness_host_ops_v3 {
    int (*can_reach_peer)(int *access, harness_pe_info *peer_info,
                          struct harness_transport_v3 *t);
    int (*connect_endpoints)(struct harness_transport_v3 *t, int *selected_dev_ids,
                             int num_selected_devs);
    int (*get_mem_handle)(harness_mem_handle *mem_handle, void *buf, size_t size,
                          struct harness_transport_v3 *t, bool local_only);
    int (*release_mem_handle)(harness_mem_handle *mem_handle, struct harness_transport_v3 *t);
    int (*finalize)(struct harness_transport_v3 *t);
    int (*show_info)(struct harness_transport_v3 *t, int style);
    int (*progress)(struct harness_transport_v3 *t);
    int (*rma)(struct harness_transport_v3 *t, int pe, harness_rma_verb verb,
               harness_rma_memdesc *remote, harness_rma_memdesc *local,
               harness_rma_bytesdesc bytesdesc, int is_proxy);
    int (*amo)(struct harness_transport_v3 *t, int pe, void *curetptr, harness_amo_verb verb,
               harness_amo_memdesc *target, harness_amo_bytesdesc bytesdesc, int is_proxy);
    int (*fence)(struct harness_transport_v3 *t, int pe, int is_proxy);
    int (*quiet)(struct harness_transport_v3 *t, int pe, int is_proxy);
    int (*enforce_cst)(struct harness_transport_v3 *t);
    int (*enforce_cst_at_target)(struct harness_transport_v3 *t);
    int (*add_device_remote_mem_handles)(struct harness_transport_v3 *t, int transport_stride,
                                         harness_mem_handle *mem_handles, uint64_t heap_offset,
                                         size_t size);
};

struct harness_transport_v3 {
    int api_version;
    int type;
    int *cap;
    struct harness_host_ops_v3 host_ops;
    harness_bootstrap_handle *boot_handle;
    void *state;
    void *type_specific_shared_state;
    void *cache_handle;
    char **device_pci_paths;
    int attr;
    int n_devices;
    bool atomics_complete_on_quiet;
    bool is_successfully_initialized;
    bool no_proxy;
    void *heap_base;
    size_t log2_cumem_granularity;
    uint64_t max_op_len;
    uint32_t atomic_host_endian_min_size;
    int index;
    int my_pe;
    int n_pes;
    void *alias_va_map; /* std::unordered_map<void *, void *> * */
    void *egm_map;      /* std::unordered_map<void *, size_t> * */
};

/* ---------------------------------------------------------------------------------------
 * ABI v4 (NVSHMEM 3.5.x): host_ops at the end, qp_index, put_signal
 * ------------------------------------------------------------------------------------- */
struct harness_transport_v4;
/* ABI 6/7 forms of amo and put_signal, called through the v4 view's slots. */
typedef int (*harness_amo_f_fn)(struct harness_transport_v4 *t, int pe, void *curetptr, harness_amo_verb_f verb,
                                harness_amo_memdesc *target, harness_amo_bytesdesc bytes, int qp);
typedef int (*harness_put_signal_f_fn)(struct harness_transport_v4 *t, int pe, harness_rma_verb write_verb,
                                       harness_vec *write_remote, harness_vec *write_local, harness_vec *write_bytes,
                                       harness_amo_verb_f sig_verb, harness_amo_memdesc *sig_target,
                                       harness_amo_bytesdesc sig_bytes, int qp);

struct harness_host_ops_v4 {
    int (*can_reach_peer)(int *access, harness_pe_info *peer_info,
                          struct harness_transport_v4 *t);
    int (*connect_endpoints)(struct harness_transport_v4 *t, int *selected_dev_ids,
                             int num_selected_devs, int *out_qp_indices, int num_qps);
    int (*get_mem_handle)(harness_mem_handle *mem_handle, void *buf, size_t size,
                          struct harness_transport_v4 *t, bool local_only);
    int (*release_mem_handle)(harness_mem_handle *mem_handle, struct harness_transport_v4 *t);
    int (*finalize)(struct harness_transport_v4 *t);
    int (*show_info)(struct harness_transport_v4 *t, int style);
    int (*progress)(struct harness_transport_v4 *t);
    int (*rma)(struct harness_transport_v4 *t, int pe, harness_rma_verb verb,
               harness_rma_memdesc *remote, harness_rma_memdesc *local,
               harness_rma_bytesdesc bytesdesc, int qp_index);
    int (*amo)(struct harness_transport_v4 *t, int pe, void *curetptr, harness_amo_verb verb,
               harness_amo_memdesc *target, harness_amo_bytesdesc bytesdesc, int qp_index);
    int (*fence)(struct harness_transport_v4 *t, int pe, int qp_index, int is_multi);
    int (*quiet)(struct harness_transport_v4 *t, int pe, int qp_index);
    /* write_remote, write_local: std::vector<rma_memdesc>&; write_bytes:
     * std::vector<rma_bytesdesc>& (one entry per chunk, same length) */
    int (*put_signal)(struct harness_transport_v4 *t, int pe, harness_rma_verb write_verb,
                      harness_vec *write_remote, harness_vec *write_local,
                      harness_vec *write_bytes, harness_amo_verb sig_verb,
                      harness_amo_memdesc *sig_target, harness_amo_bytesdesc sig_bytes,
                      int qp_index);
    int (*enforce_cst)(struct harness_transport_v4 *t);
    int (*enforce_cst_at_target)(struct harness_transport_v4 *t);
    int (*add_device_remote_mem_handles)(struct harness_transport_v4 *t, int transport_stride,
                                         harness_mem_handle *mem_handles, uint64_t heap_offset,
                                         size_t size);
};

struct harness_transport_v4 {
    int api_version;
    int type;
    int *cap;
    harness_bootstrap_handle *boot_handle;
    void *state;
    void *type_specific_shared_state;
    void *cache_handle;
    char **device_pci_paths;
    int attr;
    int n_devices;
    bool atomics_complete_on_quiet;
    bool is_successfully_initialized;
    bool no_proxy;
    void *heap_base;
    size_t log2_cumem_granularity;
    uint64_t max_op_len;
    uint32_t atomic_host_endian_min_size;
    int index;
    int my_pe;
    int n_pes;
    void *alias_va_map;
    void *egm_map;
    struct harness_host_ops_v4 host_ops;
};

/* ---------------------------------------------------------------------------------------
 * ABI 7 (NVSHMEM 3.8.x): v4's struct, two more host ops after add_device_remote_mem_handles (the
 * host ops are the struct's last member, so they follow v4's struct directly), then
 * device_assignment_mode. ABI 6 (3.7.x) as this library serves it: v4's struct and a zeroed reserve
 * the size of those three members (see src/nvshmem/abi/v6.rs).
 * ------------------------------------------------------------------------------------- */
typedef int (*harness_rma_with_hints_fn)(struct harness_transport_v4 *t, int pe, harness_rma_verb verb,
                                         harness_rma_memdesc *remote, harness_rma_memdesc *local,
                                         harness_rma_bytesdesc bytes, int qp_index, const harness_op_attrs *attrs);
typedef int (*harness_region_flush_fn)(struct harness_transport_v4 *t, int role, uint64_t issuer_id,
                                       uint64_t region_id);
struct harness_transport_v7 {
    struct harness_transport_v4 v4;           /* ... host_ops up to add_device_remote_mem_handles */
    harness_rma_with_hints_fn rma_with_hints; /* host_ops.rma_with_hints */
    harness_region_flush_fn region_flush;     /* host_ops.region_flush */
    int device_assignment_mode;               /* 0: NVSHMEM_TRANSPORT_DEVICE_ASSIGNMENT_DEFAULT */
};
struct harness_transport_v6 {
    struct harness_transport_v4 v4;
    uint64_t reserved_zero[3];
};
#define HARNESS_REGION_HINT_BATCH_RMA 1u

/* int nvshmemt_init(transport **out, struct nvshmemi_cuda_fn_table *table, int api_version) */
typedef int (*harness_transport_init_fn)(void **transport, void *cuda_fn_table, int api_version);

/* ---------------------------------------------------------------------------------------
 * Layout checks (LP64)
 * ------------------------------------------------------------------------------------- */
#define HARNESS_ASSERT_SIZE(T, n) _Static_assert(sizeof(T) == (n), "sizeof(" #T ") != " #n)
#define HARNESS_ASSERT_OFF(T, f, n) \
    _Static_assert(offsetof(T, f) == (n), "offsetof(" #T ", " #f ") != " #n)

HARNESS_ASSERT_SIZE(bool, 1);
HARNESS_ASSERT_SIZE(void *, 8);
HARNESS_ASSERT_SIZE(harness_mem_handle, 512);

HARNESS_ASSERT_SIZE(harness_pcie_id, 12);
HARNESS_ASSERT_SIZE(harness_pe_info, 40);
HARNESS_ASSERT_OFF(harness_pe_info, pe, 12);
HARNESS_ASSERT_OFF(harness_pe_info, host_hash, 16);
HARNESS_ASSERT_OFF(harness_pe_info, gpu_uuid, 24);

HARNESS_ASSERT_SIZE(harness_rma_verb, 24);
HARNESS_ASSERT_OFF(harness_rma_verb, is_nbi, 4);
HARNESS_ASSERT_OFF(harness_rma_verb, is_stream, 8);
HARNESS_ASSERT_OFF(harness_rma_verb, stream, 16);

HARNESS_ASSERT_SIZE(harness_rma_memdesc, 24);
HARNESS_ASSERT_OFF(harness_rma_memdesc, offset, 8);
HARNESS_ASSERT_OFF(harness_rma_memdesc, handle, 16);

HARNESS_ASSERT_SIZE(harness_rma_bytesdesc, 32);
HARNESS_ASSERT_OFF(harness_rma_bytesdesc, elembytes, 8);
HARNESS_ASSERT_OFF(harness_rma_bytesdesc, srcstride, 16);
HARNESS_ASSERT_OFF(harness_rma_bytesdesc, deststride, 24);

HARNESS_ASSERT_SIZE(harness_amo_verb, 16);
HARNESS_ASSERT_SIZE(harness_amo_verb_f, 20);
HARNESS_ASSERT_SIZE(harness_op_attrs, 24);
HARNESS_ASSERT_OFF(harness_amo_verb, is_fetch, 4);
HARNESS_ASSERT_OFF(harness_amo_verb, is_val, 8);
HARNESS_ASSERT_OFF(harness_amo_verb, is_cmp, 12);

HARNESS_ASSERT_SIZE(harness_amo_memdesc, 80);
HARNESS_ASSERT_OFF(harness_amo_memdesc, remote, 0);
HARNESS_ASSERT_OFF(harness_amo_memdesc, retflag, 24);
HARNESS_ASSERT_OFF(harness_amo_memdesc, retptr, 32);
HARNESS_ASSERT_OFF(harness_amo_memdesc, valptr, 40);
HARNESS_ASSERT_OFF(harness_amo_memdesc, cmpptr, 48);
HARNESS_ASSERT_OFF(harness_amo_memdesc, val, 56);
HARNESS_ASSERT_OFF(harness_amo_memdesc, cmp, 64);
HARNESS_ASSERT_OFF(harness_amo_memdesc, ret_handle, 72);

HARNESS_ASSERT_SIZE(harness_amo_bytesdesc, 8);
HARNESS_ASSERT_OFF(harness_amo_bytesdesc, elembytes, 4);

HARNESS_ASSERT_SIZE(harness_g_elem, 16);
HARNESS_ASSERT_SIZE(harness_vec, 24);

HARNESS_ASSERT_SIZE(harness_bootstrap_handle, 88);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, npes_node, 16);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, allgather, 24);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, alltoall, 32);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, barrier, 40);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, global_exit, 48);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, finalize, 56);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, show_info, 64);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, pre_init_ops, 72);
HARNESS_ASSERT_OFF(harness_bootstrap_handle, comm_state, 80);

/* v3 host_ops: 14 function pointers */
HARNESS_ASSERT_SIZE(struct harness_host_ops_v3, 14 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v3, progress, 6 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v3, rma, 7 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v3, quiet, 10 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v3, enforce_cst, 11 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v3, add_device_remote_mem_handles, 13 * 8);

/* v4 host_ops: 15 function pointers, put_signal right after quiet */
HARNESS_ASSERT_SIZE(struct harness_host_ops_v4, 15 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v4, rma, 7 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v4, quiet, 10 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v4, put_signal, 11 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v4, enforce_cst, 12 * 8);
HARNESS_ASSERT_OFF(struct harness_host_ops_v4, add_device_remote_mem_handles, 14 * 8);

/* v3 transport */
HARNESS_ASSERT_OFF(struct harness_transport_v3, cap, 0x08);
HARNESS_ASSERT_OFF(struct harness_transport_v3, host_ops, 0x10);
HARNESS_ASSERT_OFF(struct harness_transport_v3, boot_handle, 0x80);
HARNESS_ASSERT_OFF(struct harness_transport_v3, state, 0x88);
HARNESS_ASSERT_OFF(struct harness_transport_v3, cache_handle, 0x98);
HARNESS_ASSERT_OFF(struct harness_transport_v3, device_pci_paths, 0xa0);
HARNESS_ASSERT_OFF(struct harness_transport_v3, attr, 0xa8);
HARNESS_ASSERT_OFF(struct harness_transport_v3, n_devices, 0xac);
HARNESS_ASSERT_OFF(struct harness_transport_v3, atomics_complete_on_quiet, 0xb0);
HARNESS_ASSERT_OFF(struct harness_transport_v3, is_successfully_initialized, 0xb1);
HARNESS_ASSERT_OFF(struct harness_transport_v3, no_proxy, 0xb2);
HARNESS_ASSERT_OFF(struct harness_transport_v3, heap_base, 0xb8);
HARNESS_ASSERT_OFF(struct harness_transport_v3, log2_cumem_granularity, 0xc0);
HARNESS_ASSERT_OFF(struct harness_transport_v3, max_op_len, 0xc8);
HARNESS_ASSERT_OFF(struct harness_transport_v3, atomic_host_endian_min_size, 0xd0);
HARNESS_ASSERT_OFF(struct harness_transport_v3, index, 0xd4);
HARNESS_ASSERT_OFF(struct harness_transport_v3, my_pe, 0xd8);
HARNESS_ASSERT_OFF(struct harness_transport_v3, n_pes, 0xdc);
HARNESS_ASSERT_OFF(struct harness_transport_v3, alias_va_map, 0xe0);
HARNESS_ASSERT_OFF(struct harness_transport_v3, egm_map, 0xe8);
HARNESS_ASSERT_SIZE(struct harness_transport_v3, 0xf0);

/* v4 transport */
HARNESS_ASSERT_OFF(struct harness_transport_v4, cap, 0x08);
HARNESS_ASSERT_OFF(struct harness_transport_v4, boot_handle, 0x10);
HARNESS_ASSERT_OFF(struct harness_transport_v4, state, 0x18);
HARNESS_ASSERT_OFF(struct harness_transport_v4, cache_handle, 0x28);
HARNESS_ASSERT_OFF(struct harness_transport_v4, attr, 0x38);
HARNESS_ASSERT_OFF(struct harness_transport_v4, n_devices, 0x3c);
HARNESS_ASSERT_OFF(struct harness_transport_v4, atomics_complete_on_quiet, 0x40);
HARNESS_ASSERT_OFF(struct harness_transport_v4, is_successfully_initialized, 0x41);
HARNESS_ASSERT_OFF(struct harness_transport_v4, no_proxy, 0x42);
HARNESS_ASSERT_OFF(struct harness_transport_v4, heap_base, 0x48);
HARNESS_ASSERT_OFF(struct harness_transport_v4, log2_cumem_granularity, 0x50);
HARNESS_ASSERT_OFF(struct harness_transport_v4, max_op_len, 0x58);
HARNESS_ASSERT_OFF(struct harness_transport_v4, atomic_host_endian_min_size, 0x60);
HARNESS_ASSERT_OFF(struct harness_transport_v4, index, 0x64);
HARNESS_ASSERT_OFF(struct harness_transport_v4, my_pe, 0x68);
HARNESS_ASSERT_OFF(struct harness_transport_v4, n_pes, 0x6c);
HARNESS_ASSERT_OFF(struct harness_transport_v4, alias_va_map, 0x70);
HARNESS_ASSERT_OFF(struct harness_transport_v4, egm_map, 0x78);
HARNESS_ASSERT_OFF(struct harness_transport_v4, host_ops, 0x80);
HARNESS_ASSERT_SIZE(struct harness_transport_v4, 0xf8);

/* v7 transport (offsets of NVIDIA/nvshmem 6d5e14cd961a1fa07a30849e05f0882d78a6cdb1's transport.h) */
HARNESS_ASSERT_OFF(struct harness_transport_v7, rma_with_hints, 0x80 + 15 * 8);
HARNESS_ASSERT_OFF(struct harness_transport_v7, region_flush, 0x80 + 16 * 8);
HARNESS_ASSERT_OFF(struct harness_transport_v7, device_assignment_mode, 0x80 + 17 * 8);
HARNESS_ASSERT_SIZE(struct harness_transport_v7, 0x110);
HARNESS_ASSERT_SIZE(struct harness_transport_v6, 0x110);

#endif /* HARNESS_NVSHMEM_ABI_H */
