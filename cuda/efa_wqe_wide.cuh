/*
 * efa_wqe_wide.cuh - build 128-byte ("wide") EFA send-queue entries with up to 80
 * bytes of inline payload, from CUDA device code or host code. The twin of
 * src/efa/wqe/wide.rs (same bytes; golden vectors tests/golden/efa_wide_vectors.txt).
 *
 * Layout (rdma-core providers/efa/efa_io_defs.h, struct efa_io_tx_wqe_128, commit
 * 2166b90e284df10dfccea840765b863f905a28c2; libfabric prov/efa/src/efa_io_defs.h,
 * commit fd5b9ef5fbd9c66617476f28ce8cda20bae5cc4d):
 *     0-31   the meta descriptor of cuda/efa_wqe.cuh (nvshmem_efa_tx_meta)
 *     SEND inline:        32-111 payload (meta.length = byte count)
 *     RDMA write inline:  32-47  remote {length = byte count, rkey, addr_lo, addr_hi},
 *                         48-127 payload (meta.length = byte count, at least 1)
 * Every byte past the payload is zero. Use only on queues whose entries are 128 bytes;
 * an inline RDMA write only where the QP was created with inline write (libfabric 2.7
 * does so for every wide queue of a device with RDMA write; src/efa/sq.rs,
 * SqFormat::rdma_inline). Other WQEs keep the 64-byte layout of cuda/efa_wqe.cuh,
 * written with nvshmem_efa_wqe_store_entry.
 */
#ifndef NVSHMEM_EFA_WQE_WIDE_CUH
#define NVSHMEM_EFA_WQE_WIDE_CUH

#include "efa_wqe.cuh"

#define NVSHMEM_EFA_WQE_SIZE_128 128
#define NVSHMEM_EFA_INLINE_MAX_128 80

/* The 128-byte TX WQE. */
typedef struct nvshmem_efa_tx_wqe_128 {
    nvshmem_efa_tx_meta meta;
    union {
        nvshmem_efa_buf_desc sgl[NVSHMEM_EFA_SEND_MAX_SGES];
        uint8_t inline_data[NVSHMEM_EFA_INLINE_MAX_128];
        struct {
            nvshmem_efa_remote_desc remote;
            uint8_t inline_data[NVSHMEM_EFA_INLINE_MAX_128];
        } rdma;
    } data;
} nvshmem_efa_tx_wqe_128;

NVSHMEM_EFA_STATIC_ASSERT(sizeof(nvshmem_efa_tx_wqe_128) == NVSHMEM_EFA_WQE_SIZE_128,
                          "wide WQE is 128 bytes");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_wqe_128, data) == 32, "data at byte 32");
NVSHMEM_EFA_STATIC_ASSERT(offsetof(nvshmem_efa_tx_wqe_128, data.rdma.inline_data) == 48,
                          "RDMA inline payload at byte 48");

/* Clears the whole entry and fills the meta fields every inline WQE shares. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe128_init(nvshmem_efa_tx_wqe_128 *w, unsigned op,
                                            const nvshmem_efa_route *dst, uint32_t length)
{
    memset(w, 0, sizeof(*w));
    w->meta.ctrl1 = (uint8_t)(NVSHMEM_EFA_CTRL1_META_DESC | NVSHMEM_EFA_CTRL1_INLINE_MSG |
                              (op & NVSHMEM_EFA_CTRL1_OP_TYPE_MASK));
    w->meta.ctrl2 = (uint8_t)(NVSHMEM_EFA_CTRL2_FIRST | NVSHMEM_EFA_CTRL2_LAST);
    w->meta.dest_qp_num = dst->dest_qpn;
    w->meta.length = (uint16_t)length;
    w->meta.ah = dst->ah;
    w->meta.qkey = dst->qkey;
}

/* SEND of up to 80 bytes carried in the entry. Returns 0, or -1 (entry untouched) when
 * length exceeds NVSHMEM_EFA_INLINE_MAX_128. */
NVSHMEM_EFA_FN int nvshmem_efa_write_send_inline_128(nvshmem_efa_tx_wqe_128 *w,
                                                     const nvshmem_efa_route *dst,
                                                     const void *data, uint32_t length)
{
    if (length > NVSHMEM_EFA_INLINE_MAX_128)
        return -1;
    nvshmem_efa_wqe128_init(w, NVSHMEM_EFA_OP_SEND, dst, length);
    if (length)
        memcpy(w->data.inline_data, data, length);
    return 0;
}

/* RDMA write of 1 to 80 bytes carried in the entry to remote_addr (rkey): no local
 * buffer, no lkey. Returns 0, or -1 (entry untouched) for a length of 0 or over 80. */
NVSHMEM_EFA_FN int nvshmem_efa_write_rdma_write_inline_128(nvshmem_efa_tx_wqe_128 *w,
                                                           const nvshmem_efa_route *dst,
                                                           uint64_t remote_addr, uint32_t rkey,
                                                           const void *data, uint32_t length)
{
    if (length == 0 || length > NVSHMEM_EFA_INLINE_MAX_128)
        return -1;
    nvshmem_efa_wqe128_init(w, NVSHMEM_EFA_OP_RDMA_WRITE, dst, length);
    nvshmem_efa_set_remote(&w->data.rdma.remote, remote_addr, rkey, length);
    memcpy(w->data.rdma.inline_data, data, length);
    return 0;
}

/* Immediate data (delivered in the target's completion). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe128_set_imm(nvshmem_efa_tx_wqe_128 *w, uint32_t imm)
{
    nvshmem_efa_meta_set_imm(&w->meta, imm);
}

/* Phase bit, completion request, request id (16 bits, or 64 with the capability) and
 * the high packets-per-second hint: as the 64-byte setters of cuda/efa_wqe.cuh. */
NVSHMEM_EFA_FN void nvshmem_efa_wqe128_set_phase(nvshmem_efa_tx_wqe_128 *w, unsigned phase)
{
    nvshmem_efa_meta_set_phase(&w->meta, phase);
}

NVSHMEM_EFA_FN void nvshmem_efa_wqe128_set_comp_req(nvshmem_efa_tx_wqe_128 *w, int comp_req)
{
    nvshmem_efa_meta_set_comp_req(&w->meta, comp_req);
}

NVSHMEM_EFA_FN void nvshmem_efa_wqe128_set_req_id64(nvshmem_efa_tx_wqe_128 *w, uint64_t req_id)
{
    nvshmem_efa_meta_set_req_id64(&w->meta, req_id);
}

NVSHMEM_EFA_FN void nvshmem_efa_wqe128_set_high_pps(nvshmem_efa_tx_wqe_128 *w, int on)
{
    nvshmem_efa_meta_set_high_pps(&w->meta, on);
}

/* Copies a built wide WQE into its 128-byte ring slot (64-byte aligned): eight 16-byte
 * stores on the device. Order against the doorbell with __threadfence_system(). */
NVSHMEM_EFA_FN void nvshmem_efa_wqe128_store(void *slot, const nvshmem_efa_tx_wqe_128 *w)
{
    nvshmem_efa_store_16b(slot, w, sizeof(*w) / 16);
}

#endif /* NVSHMEM_EFA_WQE_WIDE_CUH */
