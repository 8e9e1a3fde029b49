#!/usr/bin/env python3
"""Generate tests/golden/efa_wide_vectors.txt: golden vectors of 128-byte ("wide") EFA send-queue
entries carrying an inline payload of up to 80 bytes.

Expected bytes are computed here from the field positions of rdma-core's efa_io_defs.h at commit
2166b90e284df10dfccea840765b863f905a28c2 (struct efa_io_tx_wqe_128, efa_io_rdma_req_128,
EFA_IO_TX_DESC_INLINE_MAX_SIZE_128 = 80) and f655e05dea2d76720519bafaceff3a64f2014f8e (req_id_ex
at bytes 26-31), and from how libfabric's efa-direct data path (main af8ddbe92f03, 2.7.0a1) fills
them: inline bit, meta.length = byte count; an RDMA write also puts the byte count in the remote
descriptor's length and its payload after that descriptor. Independent of the Rust encoder.

Kinds (one per line; tokens key=value; numbers decimal or 0x hex; bytes lowercase hex):
  wide      valid entry; keys: target (send|rdma_write) req_id req64 phase comp_req dest_qpn ah
            qkey high_pps imm (value or -) raddr rkey (rdma_write only) data=<hex> bytes=<256 hex>
  wide_bad  entry a strict decoder rejects; keys: req64 bytes error (Name or Name:detail)

Run: python3 tests/golden/gen_wide_vectors.py > tests/golden/efa_wide_vectors.txt
"""

OP_SEND, OP_READ, OP_WRITE = 0, 1, 2
HAS_IMM, INLINE, META_DESC = 1 << 4, 1 << 5, 1 << 7
PHASE, FIRST, LAST, COMP_REQ = 1 << 0, 1 << 2, 1 << 3, 1 << 4


def put(b, off, width, value):
    assert 0 <= value < (1 << (8 * width)), (value, width)
    for i in range(width):
        b[off + i] = (value >> (8 * i)) & 0xFF


def hexs(b):
    return "".join("%02x" % x for x in b)


def entry(v):
    b = bytearray(128)
    op = OP_WRITE if v["target"] == "rdma_write" else OP_SEND
    put(b, 0, 2, v["req_id"] & 0xFFFF)
    ctrl1 = META_DESC | INLINE | op
    if v["imm"] is not None:
        ctrl1 |= HAS_IMM
    b[2] = ctrl1
    b[3] = FIRST | LAST | (PHASE if v["phase"] else 0) | (COMP_REQ if v["comp_req"] else 0)
    put(b, 4, 2, v["dest_qpn"])
    put(b, 6, 2, len(v["data"]))
    put(b, 8, 4, v["imm"] or 0)
    put(b, 12, 2, v["ah"])
    b[14] = 1 if v["high_pps"] else 0
    put(b, 16, 4, v["qkey"])
    if v["req64"]:
        for i in range(3):
            put(b, 26 + 2 * i, 2, (v["req_id"] >> (16 * (i + 1))) & 0xFFFF)
    if op == OP_WRITE:
        put(b, 32, 4, len(v["data"]))
        put(b, 36, 4, v["rkey"])
        put(b, 40, 4, v["raddr"] & 0xFFFFFFFF)
        put(b, 44, 4, v["raddr"] >> 32)
        at = 48
    else:
        at = 32
    b[at:at + len(v["data"])] = v["data"]
    return b


def wide(name, target, data, **kw):
    v = dict(name=name, target=target, data=bytes(data), req_id=0x1234, req64=0, phase=0,
             comp_req=1, dest_qpn=0x42, ah=0x7, qkey=0x11223344, high_pps=0, imm=None,
             raddr=0x00007F0012340000, rkey=0xA1B2C3D4)
    v.update(kw)
    return v


def line(v):
    t = ["wide", v["name"], "target=" + v["target"], "req_id=0x%x" % v["req_id"],
         "req64=%d" % v["req64"], "phase=%d" % v["phase"], "comp_req=%d" % v["comp_req"],
         "dest_qpn=0x%x" % v["dest_qpn"], "ah=0x%x" % v["ah"], "qkey=0x%x" % v["qkey"],
         "high_pps=%d" % v["high_pps"],
         "imm=" + ("0x%x" % v["imm"] if v["imm"] is not None else "-")]
    if v["target"] == "rdma_write":
        t += ["raddr=0x%x" % v["raddr"], "rkey=0x%x" % v["rkey"]]
    t += ["data=" + hexs(v["data"]), "bytes=" + hexs(entry(v))]
    return " ".join(t)


def ramp(n, start=1):
    return [(start + i) & 0xFF for i in range(n)]


def positives():
    return [
        wide("send_33", "send", ramp(33)),
        wide("send_80", "send", ramp(80), phase=1),
        wide("send_80_ones", "send", [0xFF] * 80, imm=0xFFFFFFFF, req_id=0xFFFF, dest_qpn=0xFFFF,
             ah=0xFFFF, qkey=0xFFFFFFFF, high_pps=1),
        wide("send_64_imm", "send", ramp(64, 0x40), imm=0xDEADBEEF),
        wide("send_48_req64", "send", ramp(48), req64=1, req_id=0x0123456789ABCDEF),
        wide("write_1", "rdma_write", [0x5A]),
        wide("write_8_signal", "rdma_write", [1, 0, 0, 0, 0, 0, 0, 0], comp_req=0),
        wide("write_32", "rdma_write", ramp(32)),
        wide("write_80", "rdma_write", ramp(80), phase=1),
        wide("write_80_imm_hint", "rdma_write", ramp(80, 0x80), imm=0x01020304, high_pps=1),
        wide("write_req64", "rdma_write", ramp(16), req64=1, req_id=0xFFFF000000000000),
        wide("write_high_addr", "rdma_write", ramp(24), raddr=0xFFFF800000000000, rkey=0x80000000),
    ]


def negatives():
    """(name, req64, bytes, error)"""
    out = []
    base_w = entry(wide("x", "rdma_write", ramp(8)))
    base_s = entry(wide("x", "send", ramp(40)))
    b = bytearray(base_w); put(b, 6, 2, 0); put(b, 32, 4, 0); b[48:56] = bytes(8)
    out.append(("write_zero", 0, b, "ZeroLength:0"))
    b = bytearray(base_w); put(b, 6, 2, 81); put(b, 32, 4, 81)
    out.append(("write_81", 0, b, "InlineTooLong:81"))
    b = bytearray(base_w); put(b, 32, 4, 9)
    out.append(("write_len_mismatch", 0, b, "LengthMismatch:8"))
    b = bytearray(base_w); b[56] = 1
    out.append(("write_tail", 0, b, "ReservedNonZero:56"))
    b = bytearray(base_w); b[127] = 1
    out.append(("write_last_byte", 0, b, "ReservedNonZero:127"))
    b = bytearray(base_w); b[2] = (b[2] & 0xF0) | OP_READ
    out.append(("read_inline", 0, b, "InlineRdma"))
    b = bytearray(base_s); put(b, 6, 2, 81)
    out.append(("send_81", 0, b, "InlineTooLong:81"))
    b = bytearray(base_s); b[72] = 1
    out.append(("send_tail", 0, b, "ReservedNonZero:72"))
    b = bytearray(base_s); b[2] &= ~META_DESC & 0xFF
    out.append(("send_no_meta_desc", 0, b, "MissingMetaDesc"))
    b = bytearray(base_w); b[27] = 1
    out.append(("write_req_id_ex_without_cap", 0, b, "ReservedNonZero:27"))
    b = bytearray(base_w); put(b, 8, 4, 7)
    out.append(("write_stray_imm", 0, b, "StrayImmediate"))
    b = entry(wide("x", "send", ramp(32))); b[64] = 1
    out.append(("short_send_tail", 0, b, "ReservedNonZero:64"))
    return out


def main():
    print("# EFA wide-entry golden vectors, generated by tests/golden/gen_wide_vectors.py. Do not edit.")
    pos = positives()
    print("# --- valid 128-byte entries with inline payload (%d)" % len(pos))
    for v in pos:
        print(line(v))
    neg = negatives()
    print("# --- 128-byte entries a strict decoder rejects (%d)" % len(neg))
    for name, req64, b, err in neg:
        assert len(b) == 128
        print("wide_bad bad_%s req64=%d bytes=%s error=%s" % (name, req64, hexs(b), err))


if __name__ == "__main__":
    main()
