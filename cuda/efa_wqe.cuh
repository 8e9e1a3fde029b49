/*
 * efa_wqe.cuh - build EFA send-queue WQEs and read EFA completion entries from
 * CUDA device code or host code.
 *
 * Every function is `__host__ __device__ static inline` under nvcc; compiled as
 * plain C or C++ the qualifiers are defined away, so host programs (and tests) can
 * use the same code. The byte layout matches the Rust side (src/efa/wqe/ and
 * src/efa/cqe.rs) bit for bit; both follow the EFA device's queue formats:
 *
 *   TX WQE, 64 bytes, little-endian:
 *     0-1   req_id (low 16 bits of the request id)
 *     2     ctrl1: op_type 3:0, has_imm 4, inline_msg 5, meta_extension 6 (0),
 *           meta_desc 7 (1)
 *     3     ctrl2: phase 0, first 2 (1), last 3 (1), comp_req 4
 *     4-5   dest_qp_num      6-7  length (inline bytes or descriptor count)
 *     8-11  immediate_data   12-13 ah   14 ctrl3 (processing hints 1:0)
 *     16-19 qkey             26-31 req_id_ex (request id bits 16-63, 64-bit cap)
 *     32-63 SEND: two buffer descriptors or 32 inline bytes;
 *           RDMA: remote {length, rkey, addr_lo, addr_hi} then one local
 *           buffer descriptor {length, lkey 23:0, addr_lo, addr_hi}
 *
 *   CQE: 0-1 req_id, 2 status, 3 flags (phase 0, queue type 2:1, has_imm 3,
 *        op_type 6:4, unsolicited 7), 4-5 qp_num; TX adds req_id_ex at 6-11;
 *        RX adds length 6-7, ah 8-9, src_qp 10-11, imm 12-15 and, in the
 *        32-byte form, length_hi at 16-17 (RDMA write) or the sender's address
 *        at 16-31 (unknown ah).
 *
 * Posting: build the WQE in registers or local memory, copy it to ring slot
 * nvshmem_efa_sq_slot(pc, n) with nvshmem_efa_wqe_store_entry() (the whole
 * 64- or 128-byte entry), __threadfence_system(), write the new producer
 * counter to the doorbell, fence again.
 * Polling: compare nvshmem_efa_cqe_flags() against nvshmem_efa_cq_expected_phase(),
 * fence, then read the rest of the entry.
 */
#ifndef NVSHMEM_EFA_WQE_CUH
#define NVSHMEM_EFA_WQE_CUH

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>
#include <cstring>
#else
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#endif

#ifdef __CUDACC__
#define NVSHMEM_EFA_HD __host__ __device__
#else
#define NVSHMEM_EFA_HD
#endif
#define NVSHMEM_EFA_FN NVSHMEM_EFA_HD static inline

#ifdef __cplusplus
#define NVSHMEM_EFA_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define NVSHMEM_EFA_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* ------------------------------------------------------------------ sizes */

#define NVSHMEM_EFA_WQE_SIZE 64
#define NVSHMEM_EFA_INLINE_MAX 32
#define NVSHMEM_EFA_SEND_MAX_SGES 2
#define NVSHMEM_EFA_TX_CQE_SIZE 16
#define NVSHMEM_EFA_RX_CQE_SIZE 16
#define NVSHMEM_EFA_RX_CQE_EX_SIZE 32
#define NVSHMEM_EFA_LKEY_MASK 0x00FFFFFFu
#define NVSHMEM_EFA_AH_UNKNOWN 0xFFFFu

/* ------------------------------------------------------------------ enums */

/* Operation type (WQE ctrl1 3:0 and CQE flags 6:4). */
enum nvshmem_efa_op_type {
    NVSHMEM_EFA_OP_SEND = 0,
    NVSHMEM_EFA_OP_RDMA_READ = 1,
    NVSHMEM_EFA_OP_RDMA_WRITE = 2
};

/* Queue type (CQE flags 2:1). */
enum nvshmem_efa_queue_type {
    NVSHMEM_EFA_QUEUE_SEND = 1,
    NVSHMEM_EFA_QUEUE_RECV = 2
};

/* Completion status (CQE byte 2). */
enum nvshmem_efa_cq_status {
    NVSHMEM_EFA_CQ_OK = 0,
    NVSHMEM_EFA_CQ_FLUSHED = 1,
    NVSHMEM_EFA_CQ_LOCAL_QP_INTERNAL_ERROR = 2,
    NVSHMEM_EFA_CQ_LOCAL_UNSUPPORTED_OP = 3,
    NVSHMEM_EFA_CQ_LOCAL_INVALID_AH = 4,
    NVSHMEM_EFA_CQ_LOCAL_INVALID_LKEY = 5,
    NVSHMEM_EFA_CQ_LOCAL_BAD_LENGTH = 6,
    NVSHMEM_EFA_CQ_REMOTE_BAD_ADDRESS = 7,
    NVSHMEM_EFA_CQ_REMOTE_ABORT = 8,
    NVSHMEM_EFA_CQ_REMOTE_BAD_DEST_QPN = 9,
    NVSHMEM_EFA_CQ_REMOTE_RNR = 10,
    NVSHMEM_EFA_CQ_REMOTE_BAD_LENGTH = 11,
    NVSHMEM_EFA_CQ_REMOTE_BAD_STATUS = 12,
    NVSHMEM_EFA_CQ_LOCAL_UNRESPONSIVE_REMOTE = 13,
    NVSHMEM_EFA_CQ_REMOTE_UNKNOWN_PEER = 14,
    NVSHMEM_EFA_CQ_LOCAL_UNREACHABLE_REMOTE = 15,
    NVSHMEM_EFA_CQ_REMOTE_FEATURE_MISMATCH = 18
};

/* ------------------------------------------------------------- bit fields */

#define NVSHMEM_EFA_CTRL1_OP_TYPE_MASK 0x0Fu
#define NVSHMEM_EFA_CTRL1_HAS_IMM (1u << 4)
#define NVSHMEM_EFA_CTRL1_INLINE_MSG (1u << 5)
#define NVSHMEM_EFA_CTRL1_META_EXTENSION (1u << 6)
#define NVSHMEM_EFA_CTRL1_META_DESC (1u << 7)
#define NVSHMEM_EFA_CTRL2_PHASE (1u << 0)
#define NVSHMEM_EFA_CTRL2_FIRST (1u << 2)
#define NVSHMEM_EFA_CTRL2_LAST (1u << 3)
#define NVSHMEM_EFA_CTRL2_COMP_REQ (1u << 4)
#define NVSHMEM_EFA_CTRL3_HINT_MASK 0x03u
#define NVSHMEM_EFA_CTRL3_HINT_HIGH_PPS 0x01u

#define NVSHMEM_EFA_CQE_PHASE (1u << 0)
#define NVSHMEM_EFA_CQE_Q_TYPE_MASK 0x06u
#define NVSHMEM_EFA_CQE_Q_TYPE_SHIFT 1
#define NVSHMEM_EFA_CQE_HAS_IMM (1u << 3)
#define NVSHMEM_EFA_CQE_OP_TYPE_MASK 0x70u
#define NVSHMEM_EFA_CQE_OP_TYPE_SHIFT 4
#define NVSHMEM_EFA_CQE_UNSOLICITED (1u << 7)

/* ---------------------------------------------------------------- structs */

/* WQE metadata descriptor, bytes 0-31. */
typedef struct nvshmem_efa_tx_meta {
    uint16_t req_id;
    uint8_t ctrl1;
    uint8_t ctrl2;
    uint16_t dest_qp_num;
    uint16_t length;
    uint32_t immediate_data;
    uint16_t ah;
    uint8_t ctrl3;
    uint8_t reserved;
    uint32_t qkey;
    uint8_t reserved2[6];
    uint16_t req_id_ex[3];
} nvshmem_efa_tx_meta;

/* Local buffer descriptor (lkey in bits 23:0). */
typedef struct nvshmem_efa_buf_desc {
    uint32_t length;
    uint32_t lkey;
    uint32_t addr_lo;
    uint32_t addr_hi;
} nvshmem_efa_buf_desc;

/* Remote memory descriptor of an RDMA request. */
typedef struct nvshmem_efa_remote_desc {
    uint32_t length;
    uint32_t rkey;
    uint32_t addr_lo;
    uint32_t addr_hi;
} nvshmem_efa_remote_desc;

/* Data area of an RDMA read or write. */
typedef struct nvshmem_efa_rdma_req {
    nvshmem_efa_remote_desc remote;
    nvshmem_efa_buf_desc local;
} nvshmem_efa_rdma_req;

/* The 64-byte TX WQE. */
typedef struct nvshmem_efa_tx_wqe {
    nvshmem_efa_tx_meta meta;
    union {
        nvshmem_efa_buf_desc sgl[NVSHMEM_EFA_SEND_MAX_SGES];
        uint8_t inline_data[NVSHMEM_EFA_INLINE_MAX];
        nvshmem_efa_rdma_req rdma;
    } data;
} nvshmem_efa_tx_wqe;

/* Destination of a work request (from the GDA query_addr call). */
typedef struct nvshmem_efa_route {
    uint16_t ah;
    uint16_t dest_qpn;
    uint32_t qkey;
} nvshmem_efa_route;

/* One scatter-gather element of a SEND. */
typedef struct nvshmem_efa_sge {
    uint64_t addr;
    uint32_t lkey;
    uint32_t length;
} nvshmem_efa_sge;

/* Common head of every completion entry. */
typedef struct nvshmem_efa_cdesc_common {
    uint16_t req_id;
    uint8_t status;
    uint8_t flags;
    uint16_t qp_num;
} nvshmem_efa_cdesc_common;

/* Send-queue completion, 16 bytes. */
typedef struct nvshmem_efa_tx_cdesc {
    nvshmem_efa_cdesc_common common;
    uint16_t req_id_ex[3];
    uint8_t reserved[4];
} nvshmem_efa_tx_cdesc;

/* Receive completion, base form, 16 bytes. */
typedef struct nvshmem_efa_rx_cdesc {
    nvshmem_efa_cdesc_common common;
    uint16_t length;
    uint16_t ah;
    uint16_t src_qp_num;
    uint32_t imm;
} nvshmem_efa_rx_cdesc;

/* Receive completion, extended form, 32 bytes. */
typedef struct nvshmem_efa_rx_cdesc_ex {
    nvshmem_efa_rx_cdesc base;
    union {
        uint16_t length_hi;
        uint8_t src_addr[16];
    } u;
} nvshmem_efa_rx_cdesc_ex;

NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_tx_meta) == 32, "meta is 32 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, ctrl1) == 2, "ctrl1 at 2");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, ctrl2) == 3, "ctrl2 at 3");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, dest_qp_num) == 4, "dest_qp at 4");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, length) == 6, "length at 6");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, immediate_data) == 8, "imm at 8");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, ah) == 12, "ah at 12");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, ctrl3) == 14, "ctrl3 at 14");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, qkey) == 16, "qkey at 16");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, reserved2) == 20, "reserved2 at 20");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_meta, req_id_ex) == 26, "req_id_ex at 26");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_buf_desc) == 16, "buffer descriptor is 16 bytes");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_remote_desc) == 16, "remote descriptor is 16 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rdma_req, local) == 16, "local at 16");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_tx_wqe) == NVSHMEM_EFA_WQE_SIZE, "WQE is 64 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_wqe, data) == 32, "data at 32");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_cdesc_common) == 6, "CQE head is 6 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_cdesc_common, status) == 2, "status at 2");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_cdesc_common, flags) == 3, "flags at 3");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_cdesc_common, qp_num) == 4, "qp_num at 4");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_tx_cdesc) == NVSHMEM_EFA_TX_CQE_SIZE, "TX CQE is 16 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_cdesc, req_id_ex) == 6, "req_id_ex at 6");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_rx_cdesc) == NVSHMEM_EFA_RX_CQE_SIZE, "RX CQE is 16 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rx_cdesc, length) == 6, "length at 6");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rx_cdesc, ah) == 8, "ah at 8");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rx_cdesc, src_qp_num) == 10, "src_qp at 10");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rx_cdesc, imm) == 12, "imm at 12");
NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_rx_cdesc_ex) == NVSHMEM_EFA_RX_CQE_EX_SIZE, "RX CQE ex is 32 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_rx_cdesc_ex, u) == 16, "extension at 16");

/* ------------------------------------------------------------- ring index */

/* Phase bit the producer writes for producer counter pc (0 on the first pass). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_sq_phase(uint64_t pc, uint32_t entries)
{
    return entries ? (uint8_t)((pc / entries) & 1u) : 0;
}

/* Ring slot for counter pc (pc modulo entries; entries is a power of two on EFA). */
NVSHMEM_EFA_FN uint32_t nvshmem_efa_sq_slot(uint64_t pc, uint32_t entries)
{
    return entries ? (uint32_t)(pc % entries) : 0;
}

/* Phase a consumer expects at consumer index ci (1 on the first pass). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cq_expected_phase(uint64_t ci, uint32_t entries)
{
    return entries ? (uint8_t)(1u ^ ((ci / entries) & 1u)) : 1;
}

/* ------------------------------------------------------------- WQE build */

/* Fills a local buffer descriptor (lkey masked to 24 bits). */
NVSHMEM_EFA_FN void nvshmem_efa_set_buf(nvshmem_efa_buf_desc *d, uint64_t addr, uint32_t lkey,
                                        uint32_t length)
{
    d->length = length;
    d->lkey = lkey & NVSHMEM_EFA_LKEY_MASK;
    d->addr_lo = (uint32_t)addr;
    d->addr_hi = (uint32_t)(addr >> 32);
}

/* Fills a remote memory descriptor. */
NVSHMEM_EFA_FN void nvshmem_efa_set_remote(nvshmem_efa_remote_desc *d, uint64_t addr, uint32_t rkey,
                                           uint32_t length)
{
    d->length = length;
    d->rkey = rkey;
    d->addr_lo = (uint32_t)addr;
    d->addr_hi = (uint32_t)(addr >> 32);
}

/* Clears the WQE and fills the fields every operation shares: meta_desc, op type,
 * first, last, destination. Phase 0, no completion request, request id 0. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_init(nvshmem_efa_tx_wqe *w, unsigned op,
                                         const nvshmem_efa_route *dst)
{
    memset(w, 0, sizeof(*w));
    w->meta.ctrl1 = (uint8_t)(NVSHMEM_EFA_CTRL1_META_DESC | (op & NVSHMEM_EFA_CTRL1_OP_TYPE_MASK));
    w->meta.ctrl2 = (uint8_t)(NVSHMEM_EFA_CTRL2_FIRST | NVSHMEM_EFA_CTRL2_LAST);
    w->meta.dest_qp_num = dst->dest_qpn;
    w->meta.ah = dst->ah;
    w->meta.qkey = dst->qkey;
}

/* Common body of the RDMA writers: one local descriptor, equal local and remote lengths. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_rdma(nvshmem_efa_tx_wqe *w, unsigned op,
                                         const nvshmem_efa_route *dst, uint64_t remote_addr,
                                         uint32_t rkey, uint64_t local_addr, uint32_t lkey,
                                         uint32_t length)
{
    nvshmem_efa_wqe_init(w, op, dst);
    w->meta.length = 1;
    nvshmem_efa_set_remote(&w->data.rdma.remote, remote_addr, rkey, length);
    nvshmem_efa_set_buf(&w->data.rdma.local, local_addr, lkey, length);
}

/* RDMA write of length bytes from local_addr (lkey) to remote_addr (rkey). */
NVSHMEM_EFA_FN void nvshmem_efa_write_rdma_write(nvshmem_efa_tx_wqe *w, const nvshmem_efa_route *dst,
                                                 uint64_t remote_addr, uint32_t rkey,
                                                 uint64_t local_addr, uint32_t lkey,
                                                 uint32_t length)
{
    nvshmem_efa_wqe_rdma(w, NVSHMEM_EFA_OP_RDMA_WRITE, dst, remote_addr, rkey, local_addr, lkey,
                         length);
}

/* RDMA write with 4 bytes of immediate data delivered in the target's completion. */
NVSHMEM_EFA_FN void nvshmem_efa_write_rdma_write_imm(nvshmem_efa_tx_wqe *w,
                                                     const nvshmem_efa_route *dst,
                                                     uint64_t remote_addr, uint32_t rkey,
                                                     uint64_t local_addr, uint32_t lkey,
                                                     uint32_t length, uint32_t imm)
{
    nvshmem_efa_wqe_rdma(w, NVSHMEM_EFA_OP_RDMA_WRITE, dst, remote_addr, rkey, local_addr, lkey,
                         length);
    w->meta.ctrl1 = (uint8_t)(w->meta.ctrl1 | NVSHMEM_EFA_CTRL1_HAS_IMM);
    w->meta.immediate_data = imm;
}

/* RDMA read of length bytes from remote_addr (rkey) into local_addr (lkey). */
NVSHMEM_EFA_FN void nvshmem_efa_write_rdma_read(nvshmem_efa_tx_wqe *w, const nvshmem_efa_route *dst,
                                                uint64_t remote_addr, uint32_t rkey,
                                                uint64_t local_addr, uint32_t lkey,
                                                uint32_t length)
{
    nvshmem_efa_wqe_rdma(w, NVSHMEM_EFA_OP_RDMA_READ, dst, remote_addr, rkey, local_addr, lkey,
                         length);
}

/* SEND of up to 32 bytes copied into the WQE. Returns 0, or -1 (WQE untouched)
 * when length exceeds NVSHMEM_EFA_INLINE_MAX. */
NVSHMEM_EFA_FN int nvshmem_efa_write_send_inline(nvshmem_efa_tx_wqe *w, const nvshmem_efa_route *dst,
                                                 const void *data, uint32_t length)
{
    if (length > NVSHMEM_EFA_INLINE_MAX)
        return -1;
    nvshmem_efa_wqe_init(w, NVSHMEM_EFA_OP_SEND, dst);
    w->meta.ctrl1 = (uint8_t)(w->meta.ctrl1 | NVSHMEM_EFA_CTRL1_INLINE_MSG);
    w->meta.length = (uint16_t)length;
    if (length)
        memcpy(w->data.inline_data, data, length);
    return 0;
}

/* SEND from one or two buffers. Returns 0, or -1 (WQE untouched) when count is
 * not 1 or 2. */
NVSHMEM_EFA_FN int nvshmem_efa_write_send_sge(nvshmem_efa_tx_wqe *w, const nvshmem_efa_route *dst,
                                              const nvshmem_efa_sge *sges, uint32_t count)
{
    uint32_t i;
    if (count < 1 || count > NVSHMEM_EFA_SEND_MAX_SGES)
        return -1;
    nvshmem_efa_wqe_init(w, NVSHMEM_EFA_OP_SEND, dst);
    w->meta.length = (uint16_t)count;
    for (i = 0; i < count; i++)
        nvshmem_efa_set_buf(&w->data.sgl[i], sges[i].addr, sges[i].lkey, sges[i].length);
    return 0;
}


/* Meta-descriptor setters and the ring store, shared by the 64-byte entries here and the
 * 128-byte ones of cuda/efa_wqe_wide.cuh (both begin with an nvshmem_efa_tx_meta). */
NVSHMEM_EFA_FN void nvshmem_efa_meta_set_imm(nvshmem_efa_tx_meta *m, uint32_t imm)
{
    m->ctrl1 = (uint8_t)(m->ctrl1 | NVSHMEM_EFA_CTRL1_HAS_IMM);
    m->immediate_data = imm;
}

NVSHMEM_EFA_FN void nvshmem_efa_meta_set_phase(nvshmem_efa_tx_meta *m, unsigned phase)
{
    m->ctrl2 = (uint8_t)((m->ctrl2 & ~NVSHMEM_EFA_CTRL2_PHASE) | (phase & NVSHMEM_EFA_CTRL2_PHASE));
}

NVSHMEM_EFA_FN void nvshmem_efa_meta_set_comp_req(nvshmem_efa_tx_meta *m, int comp_req)
{
    m->ctrl2 = (uint8_t)(comp_req ? (m->ctrl2 | NVSHMEM_EFA_CTRL2_COMP_REQ)
                                  : (m->ctrl2 & ~NVSHMEM_EFA_CTRL2_COMP_REQ));
}

NVSHMEM_EFA_FN void nvshmem_efa_meta_set_req_id64(nvshmem_efa_tx_meta *m, uint64_t req_id)
{
    m->req_id = (uint16_t)req_id;
    m->req_id_ex[0] = (uint16_t)(req_id >> 16);
    m->req_id_ex[1] = (uint16_t)(req_id >> 32);
    m->req_id_ex[2] = (uint16_t)(req_id >> 48);
}

NVSHMEM_EFA_FN void nvshmem_efa_meta_set_high_pps(nvshmem_efa_tx_meta *m, int on)
{
    m->ctrl3 = (uint8_t)(on ? NVSHMEM_EFA_CTRL3_HINT_HIGH_PPS : 0);
}

/* Copies n16 x 16 bytes of a built entry into its ring slot (64-byte aligned): 16-byte stores on
 * the device. Order them against the doorbell with __threadfence_system(). */
NVSHMEM_EFA_FN void nvshmem_efa_store_16b(void *slot, const void *entry, int n16)
{
#if defined(__CUDA_ARCH__)
    uint4 *dst = (uint4 *)slot;
    const unsigned char *src = (const unsigned char *)entry;
    int i;
    for (i = 0; i < n16; i++) {
        uint4 v;
        memcpy(&v, src + 16 * i, sizeof(v));
        dst[i] = v;
    }
#else
    memcpy(slot, entry, (size_t)n16 * 16);
#endif
}

/* Adds immediate data to a SEND (RDMA writes use nvshmem_efa_write_rdma_write_imm). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_imm(nvshmem_efa_tx_wqe *w, uint32_t imm)
{
    nvshmem_efa_meta_set_imm(&w->meta, imm);
}

/* Sets the phase bit (only bit 0 of phase is used). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_phase(nvshmem_efa_tx_wqe *w, unsigned phase)
{
    nvshmem_efa_meta_set_phase(&w->meta, phase);
}

/* Requests (non-zero) or suppresses (zero) a completion entry. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_comp_req(nvshmem_efa_tx_wqe *w, int comp_req)
{
    nvshmem_efa_meta_set_comp_req(&w->meta, comp_req);
}

/* Sets a 16-bit request id (queues without the 64-bit request-id capability);
 * req_id_ex stays zero. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_req_id(nvshmem_efa_tx_wqe *w, uint16_t req_id)
{
    w->meta.req_id = req_id;
    w->meta.req_id_ex[0] = 0;
    w->meta.req_id_ex[1] = 0;
    w->meta.req_id_ex[2] = 0;
}

/* Sets a 64-bit request id (queues with the 64-bit request-id capability). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_req_id64(nvshmem_efa_tx_wqe *w, uint64_t req_id)
{
    nvshmem_efa_meta_set_req_id64(&w->meta, req_id);
}

/* Sets (non-zero) or clears the high packets-per-second processing hint. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_set_high_pps(nvshmem_efa_tx_wqe *w, int on)
{
    nvshmem_efa_meta_set_high_pps(&w->meta, on);
}

/* Copies a built WQE into its ring slot (64-byte aligned). On the device this is
 * four 16-byte stores; order them against the doorbell with __threadfence_system(). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_store(void *slot, const nvshmem_efa_tx_wqe *w)
{
    nvshmem_efa_store_16b(slot, w, sizeof(*w) / 16);
}

/* Writes a built WQE into a ring slot of entry_size bytes (64 or 128; 64-byte
 * aligned): the 64 WQE bytes, then zeros up to entry_size. Queues with
 * 128-byte entries (efa-direct picks them for devices with 80 bytes of inline
 * room) read the whole entry; its bytes 64-127 hold no field this code sets
 * and must not keep a previous WQE's bytes, so the whole entry is written,
 * as the producers on hardware do. Other sizes write the 64 WQE bytes only.
 * Order against the doorbell with __threadfence_system(). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe_store_entry(void *slot, const nvshmem_efa_tx_wqe *w,
                                                uint32_t entry_size)
{
    nvshmem_efa_wqe_store(slot, w);
    if (entry_size == 2u * NVSHMEM_EFA_WQE_SIZE) {
#if defined(__CUDA_ARCH__)
        uint4 *tail = (uint4 *)((unsigned char *)slot + NVSHMEM_EFA_WQE_SIZE);
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        int i;
        for (i = 0; i < 4; i++)
            tail[i] = z;
#else
        memset((unsigned char *)slot + NVSHMEM_EFA_WQE_SIZE, 0, NVSHMEM_EFA_WQE_SIZE);
#endif
    }
}

/* ------------------------------------------------------------- CQE decode */

/* Flags byte of an entry, read through a volatile pointer (read it before the rest). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cqe_flags(const volatile void *cqe)
{
    return ((const volatile uint8_t *)cqe)[3];
}

/* True when the entry at consumer index ci has been written (phase matches). */
NVSHMEM_EFA_FN bool nvshmem_efa_cqe_ready(const volatile void *cqe, uint64_t ci, uint32_t entries)
{
    return (nvshmem_efa_cqe_flags(cqe) & NVSHMEM_EFA_CQE_PHASE) ==
           nvshmem_efa_cq_expected_phase(ci, entries);
}

/* Phase bit of the entry. */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cqe_phase(const nvshmem_efa_cdesc_common *c)
{
    return (uint8_t)(c->flags & NVSHMEM_EFA_CQE_PHASE);
}

/* Completion status (enum nvshmem_efa_cq_status; 0 is success). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cqe_status(const nvshmem_efa_cdesc_common *c)
{
    return c->status;
}

/* Request id, low 16 bits. */
NVSHMEM_EFA_FN uint16_t nvshmem_efa_cqe_req_id(const nvshmem_efa_cdesc_common *c)
{
    return c->req_id;
}

/* Local queue-pair number. */
NVSHMEM_EFA_FN uint16_t nvshmem_efa_cqe_qp_num(const nvshmem_efa_cdesc_common *c)
{
    return c->qp_num;
}

/* NVSHMEM_EFA_QUEUE_SEND, NVSHMEM_EFA_QUEUE_RECV (0 and 3 are invalid). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cqe_queue_type(const nvshmem_efa_cdesc_common *c)
{
    return (uint8_t)((c->flags & NVSHMEM_EFA_CQE_Q_TYPE_MASK) >> NVSHMEM_EFA_CQE_Q_TYPE_SHIFT);
}

/* Op type of the completed operation (enum nvshmem_efa_op_type). */
NVSHMEM_EFA_FN uint8_t nvshmem_efa_cqe_op_type(const nvshmem_efa_cdesc_common *c)
{
    return (uint8_t)((c->flags & NVSHMEM_EFA_CQE_OP_TYPE_MASK) >> NVSHMEM_EFA_CQE_OP_TYPE_SHIFT);
}

/* Immediate data present (receive completions). */
NVSHMEM_EFA_FN bool nvshmem_efa_cqe_has_imm(const nvshmem_efa_cdesc_common *c)
{
    return (c->flags & NVSHMEM_EFA_CQE_HAS_IMM) != 0;
}

/* No receive WQE consumed (RDMA write with immediate). */
NVSHMEM_EFA_FN bool nvshmem_efa_cqe_unsolicited(const nvshmem_efa_cdesc_common *c)
{
    return (c->flags & NVSHMEM_EFA_CQE_UNSOLICITED) != 0;
}

/* Full request id of a send completion on a queue with the 64-bit request-id capability. */
NVSHMEM_EFA_FN uint64_t nvshmem_efa_tx_cqe_req_id64(const nvshmem_efa_tx_cdesc *t)
{
    return (uint64_t)t->common.req_id | ((uint64_t)t->req_id_ex[0] << 16) |
           ((uint64_t)t->req_id_ex[1] << 32) | ((uint64_t)t->req_id_ex[2] << 48);
}

/* Immediate data of a receive completion (valid when has_imm is set). */
NVSHMEM_EFA_FN uint32_t nvshmem_efa_rx_cqe_imm(const nvshmem_efa_rx_cdesc *r)
{
    return r->imm;
}

/* Received byte count from the base form (bits 15:0 only). */
NVSHMEM_EFA_FN uint32_t nvshmem_efa_rx_cqe_length(const nvshmem_efa_rx_cdesc *r)
{
    return r->length;
}

/* Received byte count from the extended form (adds bits 31:16 for RDMA write). */
NVSHMEM_EFA_FN uint32_t nvshmem_efa_rx_cqe_ex_length(const nvshmem_efa_rx_cdesc_ex *r)
{
    uint32_t len = r->base.length;
    if (nvshmem_efa_cqe_op_type(&r->base.common) == NVSHMEM_EFA_OP_RDMA_WRITE)
        len |= (uint32_t)r->u.length_hi << 16;
    return len;
}

/* Sender's address handle number (NVSHMEM_EFA_AH_UNKNOWN if unknown). */
NVSHMEM_EFA_FN uint16_t nvshmem_efa_rx_cqe_ah(const nvshmem_efa_rx_cdesc *r)
{
    return r->ah;
}

/* Sender's queue-pair number. */
NVSHMEM_EFA_FN uint16_t nvshmem_efa_rx_cqe_src_qp(const nvshmem_efa_rx_cdesc *r)
{
    return r->src_qp_num;
}

/* Sender's 16-byte address from the extended form, or NULL when the entry does not
 * carry one (known ah, RDMA write, or an all-zero field). */
NVSHMEM_EFA_FN const uint8_t *nvshmem_efa_rx_cqe_src_addr(const nvshmem_efa_rx_cdesc_ex *r)
{
    int i;
    if (r->base.ah != NVSHMEM_EFA_AH_UNKNOWN ||
        nvshmem_efa_cqe_op_type(&r->base.common) != NVSHMEM_EFA_OP_SEND)
        return NULL;
    for (i = 0; i < 16; i++)
        if (r->u.src_addr[i])
            return r->u.src_addr;
    return NULL;
}

#endif /* NVSHMEM_EFA_WQE_CUH */
