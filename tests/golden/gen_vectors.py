#!/usr/bin/env python3
"""Generate tests/golden/efa_vectors.txt: golden EFA TX WQE and CQE vectors.

Expected bytes are computed here from the bit positions of the EFA queue formats
(docs FACTS.md section 3, checked against efa_io_defs.h), with explicit shifts and
masks, independently of the encoders under test.

File format: one vector per line, '#' starts a comment line. Tokens are separated by
single spaces; the first token is the kind, the second a unique name, the rest are
key=value pairs. Numbers are decimal or 0x-prefixed hex. Byte strings are lowercase hex
with no separators; '-' stands for "absent" (or an empty inline payload).

Kinds:
  wqe        valid 64-byte TX WQE; keys: op (send_inline|send_sge|rdma_write|
             rdma_write_imm|rdma_read) req_id req64 phase comp_req dest_qpn ah qkey
             high_pps imm (value or '-'), then per op:
               send_inline: inline=<hex or ->
               send_sge:    sges=1|2 s0_addr s0_lkey s0_len [s1_addr s1_lkey s1_len]
               rdma_*:      raddr rkey rlen laddr lkey llen
             and bytes=<128 hex digits>
  wqe_bad    bytes a strict decoder must reject; keys: req64 bytes error
  tx_cqe     16-byte send completion; keys: req_id req64 status phase op qp_num bytes
  rx_cqe     16-byte receive completion; keys: req_id status phase op has_imm
             unsolicited qp_num length ah src_qp imm bytes
  rx_cqe_ex  32-byte receive completion; rx_cqe keys plus src_addr=<32 hex or ->
  cqe_bad    completion bytes a strict decoder must reject; keys: form (tx|tx64|rx|
             rx_ex) bytes error
  entry      a send-queue ring entry after the WQE named by `of` (a `wqe` vector) was
             written into a slot of entry_size bytes (64 or 128) that held 0xa5 bytes:
             the 64 WQE bytes, then zeros up to entry_size (a 128-byte entry is written
             whole); keys: of entry_size bytes=<2*entry_size hex digits>
  entry_bad  128-byte ring entries a strict decoder must reject (a valid WQE in bytes
             0-63, a stale byte past it); keys: req64 bytes error

CQE op values: send, rdma_read, rdma_write. error is Name or Name:detail, where detail
is the variant's first number (offset, raw value, descriptor index or count, bit).

Run: python3 tests/golden/gen_vectors.py > tests/golden/efa_vectors.txt
"""

import random

OP_SEND, OP_READ, OP_WRITE = 0, 1, 2
CQE_OP_NAME = {OP_SEND: "send", OP_READ: "rdma_read", OP_WRITE: "rdma_write"}

# ctrl1
OP_TYPE_SHIFT = 0
HAS_IMM_BIT = 4
INLINE_MSG_BIT = 5
META_EXT_BIT = 6
META_DESC_BIT = 7
# ctrl2
PHASE_BIT = 0
FIRST_BIT = 2
LAST_BIT = 3
COMP_REQ_BIT = 4
# CQE flags
CQ_PHASE_BIT = 0
CQ_QTYPE_SHIFT = 1
CQ_HAS_IMM_BIT = 3
CQ_OP_SHIFT = 4
CQ_UNSOL_BIT = 7
Q_SEND, Q_RECV = 1, 2


def put(buf, off, width, value):
    """Store `value` little-endian in `width` bytes at `off`, one shifted byte at a time."""
    assert 0 <= value < (1 << (8 * width)), (value, width)
    for i in range(width):
        buf[off + i] = (value >> (8 * i)) & 0xFF


def hexs(b):
    return "".join("%02x" % x for x in b)


def h(v):
    return "0x%x" % v


def wqe_bytes(v):
    b = bytearray(64)
    op = v["opcode"]
    put(b, 0, 2, v["req_id"] & 0xFFFF)
    ctrl1 = (1 << META_DESC_BIT) | (op << OP_TYPE_SHIFT)
    if v["imm"] is not None:
        ctrl1 |= 1 << HAS_IMM_BIT
    if v["op"] == "send_inline":
        ctrl1 |= 1 << INLINE_MSG_BIT
    b[2] = ctrl1
    ctrl2 = (1 << FIRST_BIT) | (1 << LAST_BIT) | (v["phase"] << PHASE_BIT)
    if v["comp_req"]:
        ctrl2 |= 1 << COMP_REQ_BIT
    b[3] = ctrl2
    put(b, 4, 2, v["dest_qpn"])
    if v["op"] == "send_inline":
        length = len(v["inline"])
    elif v["op"] == "send_sge":
        length = len(v["sges"])
    else:
        length = 1
    put(b, 6, 2, length)
    put(b, 8, 4, v["imm"] if v["imm"] is not None else 0)
    put(b, 12, 2, v["ah"])
    b[14] = 1 if v["high_pps"] else 0
    put(b, 16, 4, v["qkey"])
    if v["req64"]:
        put(b, 26, 2, (v["req_id"] >> 16) & 0xFFFF)
        put(b, 28, 2, (v["req_id"] >> 32) & 0xFFFF)
        put(b, 30, 2, (v["req_id"] >> 48) & 0xFFFF)
    if v["op"] == "send_inline":
        for i, x in enumerate(v["inline"]):
            b[32 + i] = x
    elif v["op"] == "send_sge":
        for i, (addr, lkey, ln) in enumerate(v["sges"]):
            base = 32 + 16 * i
            put(b, base + 0, 4, ln)
            put(b, base + 4, 4, lkey & 0xFFFFFF)
            put(b, base + 8, 4, addr & 0xFFFFFFFF)
            put(b, base + 12, 4, addr >> 32)
    else:
        put(b, 32, 4, v["rlen"])
        put(b, 36, 4, v["rkey"])
        put(b, 40, 4, v["raddr"] & 0xFFFFFFFF)
        put(b, 44, 4, v["raddr"] >> 32)
        put(b, 48, 4, v["llen"])
        put(b, 52, 4, v["lkey"] & 0xFFFFFF)
        put(b, 56, 4, v["laddr"] & 0xFFFFFFFF)
        put(b, 60, 4, v["laddr"] >> 32)
    return b


OPCODES = {
    "send_inline": OP_SEND,
    "send_sge": OP_SEND,
    "rdma_write": OP_WRITE,
    "rdma_write_imm": OP_WRITE,
    "rdma_read": OP_READ,
}


def wqe(name, op, **kw):
    v = dict(
        name=name,
        op=op,
        opcode=OPCODES[op],
        req_id=0x1234,
        req64=0,
        phase=0,
        comp_req=1,
        dest_qpn=0x0042,
        ah=0x0007,
        qkey=0x11223344,
        high_pps=0,
        imm=None,
    )
    if op.startswith("rdma"):
        v.update(raddr=0x00007F0012340000, rkey=0xA1B2C3D4, rlen=4096,
                 laddr=0x00007E0000001000, lkey=0x000ABC, llen=None)
    if op == "rdma_write_imm":
        v["imm"] = 0xDEADBEEF
    if op == "send_inline":
        v["inline"] = b""
    if op == "send_sge":
        v["sges"] = [(0x1000, 0x1, 64)]
    v.update(kw)
    if op.startswith("rdma") and v["llen"] is None:
        v["llen"] = v["rlen"]
    return v


def wqe_line(v):
    t = ["wqe", v["name"], "op=" + v["op"], "req_id=" + h(v["req_id"]),
         "req64=%d" % v["req64"], "phase=%d" % v["phase"], "comp_req=%d" % v["comp_req"],
         "dest_qpn=" + h(v["dest_qpn"]), "ah=" + h(v["ah"]), "qkey=" + h(v["qkey"]),
         "high_pps=%d" % v["high_pps"],
         "imm=" + (h(v["imm"]) if v["imm"] is not None else "-")]
    if v["op"] == "send_inline":
        t.append("inline=" + (hexs(v["inline"]) if v["inline"] else "-"))
    elif v["op"] == "send_sge":
        t.append("sges=%d" % len(v["sges"]))
        for i, (addr, lkey, ln) in enumerate(v["sges"]):
            t += ["s%d_addr=%s" % (i, h(addr)), "s%d_lkey=%s" % (i, h(lkey)),
                  "s%d_len=%s" % (i, h(ln))]
    else:
        t += ["raddr=" + h(v["raddr"]), "rkey=" + h(v["rkey"]), "rlen=" + h(v["rlen"]),
              "laddr=" + h(v["laddr"]), "lkey=" + h(v["lkey"]), "llen=" + h(v["llen"])]
    t.append("bytes=" + hexs(wqe_bytes(v)))
    return " ".join(t)


def positive_wqes():
    M64 = (1 << 64) - 1
    out = [
        wqe("write_basic", "rdma_write"),
        wqe("write_all_ones", "rdma_write", req_id=0xFFFF, phase=1, dest_qpn=0xFFFF,
            ah=0xFFFF, qkey=0xFFFFFFFF, raddr=M64, rkey=0xFFFFFFFF, rlen=0xFFFFFFFF,
            laddr=M64, lkey=0xFFFFFF),
        wqe("write_phase0_nocomp", "rdma_write", phase=0, comp_req=0),
        wqe("write_phase1", "rdma_write", phase=1),
        wqe("write_req64_max", "rdma_write", req64=1, req_id=M64),
        wqe("write_req64_small", "rdma_write", req64=1, req_id=0x00FF),
        wqe("write_req64_pattern", "rdma_write", req64=1, req_id=0x0123456789ABCDEF),
        wqe("write_req64_hi_only", "rdma_write", req64=1, req_id=0xFFFF000000000000),
        wqe("write_high_pps", "rdma_write", high_pps=1),
        wqe("write_zero_fields", "rdma_write", req_id=0, dest_qpn=0, ah=0, qkey=0,
            raddr=0, rkey=0, rlen=1, laddr=0, lkey=0),
        wqe("write_addr_hi_bit", "rdma_write", raddr=0x8000000000000000,
            laddr=0x8000000000000001, rlen=1),
        wqe("write_addr_lo_only", "rdma_write", raddr=0x00000000FFFFFFFF,
            laddr=0x00000000FFFFFFF0),
        wqe("write_addr_hi_only", "rdma_write", raddr=0xFFFFFFFF00000000,
            laddr=0x0000000100000000),
        wqe("write_imm_basic", "rdma_write_imm"),
        wqe("write_imm_zero_len", "rdma_write_imm", rlen=0, imm=0x01020304),
        wqe("write_imm_imm_zero", "rdma_write_imm", imm=0),
        wqe("write_imm_imm_max", "rdma_write_imm", imm=0xFFFFFFFF, phase=1,
            lkey=0xFFFFFF),
        wqe("write_imm_req64", "rdma_write_imm", req64=1, req_id=0xFEDCBA9876543210,
            high_pps=1),
        wqe("read_basic", "rdma_read"),
        wqe("read_lkey_zero", "rdma_read", lkey=0, phase=1),
        wqe("read_lkey_max", "rdma_read", lkey=0xFFFFFF, rkey=0x80000000),
        wqe("read_high_addr", "rdma_read", raddr=0xFFFF800000000000,
            laddr=0x00007FFFFFFFFFFF, rlen=0x10000),
        wqe("read_req64", "rdma_read", req64=1, req_id=0x0000000100000000, comp_req=0),
        wqe("read_one_byte", "rdma_read", rlen=1, high_pps=1),
        wqe("inline_empty", "send_inline"),
        wqe("inline_one", "send_inline", inline=b"\x5a"),
        wqe("inline_max", "send_inline", inline=bytes(range(1, 33)), phase=1),
        wqe("inline_max_ff", "send_inline", inline=b"\xff" * 32, imm=0xCAFEBABE),
        wqe("inline_31_imm", "send_inline", inline=bytes(range(0x40, 0x40 + 31)),
            imm=0x00000001),
        wqe("inline_imm_zero", "send_inline", inline=b"ab", imm=0),
        wqe("inline_req64", "send_inline", inline=b"hello", req64=1,
            req_id=0xAAAA5555AAAA5555),
        wqe("inline_zero_bytes", "send_inline", inline=b"\x00\x00\x00\x00"),
        wqe("sge1_basic", "send_sge"),
        wqe("sge2_basic", "send_sge", sges=[(0x7F0000001000, 0x10, 128),
                                            (0x7F0000002000, 0x11, 256)]),
        wqe("sge2_max", "send_sge", sges=[(M64, 0xFFFFFF, 0xFFFFFFFF),
                                          (0x8000000000000000, 0xFFFFFF, 1)], phase=1),
        wqe("sge1_imm_zero", "send_sge", imm=0),
        wqe("sge1_imm", "send_sge", imm=0x89ABCDEF, high_pps=1),
        wqe("sge1_req64", "send_sge", req64=1, req_id=0x10000, comp_req=0),
        wqe("sge1_lkey_zero", "send_sge", sges=[(0, 0, 1)]),
    ]
    rng = random.Random(0x45FA)
    kinds = ["rdma_write", "rdma_write_imm", "rdma_read", "send_inline", "send_sge"]
    for i in range(15):
        op = kinds[i % len(kinds)]
        req64 = rng.randint(0, 1)
        kw = dict(
            req64=req64,
            req_id=rng.getrandbits(64) if req64 else rng.getrandbits(16),
            phase=rng.randint(0, 1),
            comp_req=rng.randint(0, 1),
            dest_qpn=rng.getrandbits(16),
            ah=rng.getrandbits(16),
            qkey=rng.getrandbits(32),
            high_pps=rng.randint(0, 1),
        )
        if op.startswith("rdma"):
            kw.update(raddr=rng.getrandbits(64), rkey=rng.getrandbits(32),
                      rlen=rng.randint(1, (1 << 32) - 1), laddr=rng.getrandbits(64),
                      lkey=rng.getrandbits(24))
            if op == "rdma_write_imm":
                kw["imm"] = rng.getrandbits(32)
        elif op == "send_inline":
            n = rng.randint(0, 32)
            kw["inline"] = bytes(rng.getrandbits(8) for _ in range(n))
            kw["imm"] = rng.getrandbits(32) if rng.randint(0, 1) else None
        else:
            kw["sges"] = [(rng.getrandbits(64), rng.getrandbits(24), rng.randint(1, 1 << 20))
                          for _ in range(rng.randint(1, 2))]
            kw["imm"] = rng.getrandbits(32) if rng.randint(0, 1) else None
        out.append(wqe("random_%02d_%s" % (i, op), op, **kw))
    return out


def mutate(v, edits):
    b = wqe_bytes(v)
    for off, fn in edits:
        b[off] = fn(b[off]) & 0xFF
    return b


def negative_wqes():
    w = wqe("x", "rdma_write")
    r = wqe("x", "rdma_read")
    wi = wqe("x", "rdma_write_imm")
    s1 = wqe("x", "send_sge")
    s2 = wqe("x", "send_sge", sges=[(0x1000, 1, 8), (0x2000, 2, 8)])
    inl = wqe("x", "send_inline", inline=b"abcd")
    setb = lambda bit: (lambda x: x | (1 << bit))
    clrb = lambda bit: (lambda x: x & ~(1 << bit))
    const = lambda c: (lambda x: c)
    out = [
        ("no_meta_desc", 0, mutate(w, [(2, clrb(META_DESC_BIT))]), "MissingMetaDesc"),
        ("meta_ext", 0, mutate(w, [(2, setb(META_EXT_BIT))]), "MetaExtension"),
        ("op_type_3", 0, mutate(w, [(2, lambda x: (x & 0xF0) | 3)]), "UnknownOpType:3"),
        ("op_type_15", 0, mutate(s1, [(2, lambda x: x | 0x0F)]), "UnknownOpType:15"),
        ("not_first", 0, mutate(w, [(3, clrb(FIRST_BIT))]), "NotFirst"),
        ("not_last", 0, mutate(r, [(3, clrb(LAST_BIT))]), "NotLast"),
        ("ctrl2_bit1", 0, mutate(w, [(3, setb(1))]), "ReservedNonZero:3"),
        ("ctrl2_bit7", 0, mutate(w, [(3, setb(7))]), "ReservedNonZero:3"),
        ("ctrl3_bit2", 0, mutate(w, [(14, setb(2))]), "ReservedNonZero:14"),
        ("ctrl3_hint2", 0, mutate(w, [(14, const(2))]), "UnknownProcessingHint:2"),
        ("byte15", 0, mutate(w, [(15, const(1))]), "ReservedNonZero:15"),
        ("byte20", 0, mutate(w, [(20, const(0x80))]), "ReservedNonZero:20"),
        ("byte25", 1, mutate(w, [(25, const(1))]), "ReservedNonZero:25"),
        ("req_id_ex_without_cap", 0, mutate(w, [(29, const(1))]), "ReservedNonZero:29"),
        ("read_has_imm", 0, mutate(r, [(2, setb(HAS_IMM_BIT))]), "ImmediateWithRead"),
        ("stray_imm", 0, mutate(w, [(9, const(0x10))]), "StrayImmediate"),
        ("write_inline", 0, mutate(w, [(2, setb(INLINE_MSG_BIT))]), "InlineRdma"),
        ("read_inline", 0, mutate(r, [(2, setb(INLINE_MSG_BIT))]), "InlineRdma"),
        ("rdma_two_descs", 0, mutate(w, [(6, const(2))]), "BadDescriptorCount:2"),
        ("rdma_zero_descs", 0, mutate(wi, [(6, const(0))]), "BadDescriptorCount:0"),
        ("rdma_lkey_wide", 0, mutate(w, [(55, const(1))]), "LkeyTooWide:0"),
        ("rdma_len_mismatch", 0, mutate(w, [(48, lambda x: x + 1)]), "LengthMismatch"),
        ("read_zero_len", 0, mutate(wqe("x", "rdma_read", rlen=0), []), "ZeroLength:0"),
        ("write_zero_len", 0, mutate(wqe("x", "rdma_write", rlen=0), []), "ZeroLength:0"),
        ("inline_33", 0, mutate(inl, [(6, const(33))]), "InlineTooLong:33"),
        ("inline_trailing", 0, mutate(inl, [(40, const(7))]), "ReservedNonZero:40"),
        ("inline_last_byte", 0, mutate(inl, [(63, const(1))]), "ReservedNonZero:63"),
        ("sge_count_0", 0, mutate(s1, [(6, const(0))]), "BadDescriptorCount:0"),
        ("sge_count_3", 0, mutate(s1, [(6, const(3))]), "BadDescriptorCount:3"),
        ("sge_unused_slot", 0, mutate(s1, [(52, const(1))]), "ReservedNonZero:52"),
        ("sge1_lkey_wide", 0, mutate(s2, [(55, const(0xFF))]), "LkeyTooWide:1"),
        ("sge0_zero_len", 0, mutate(s1, [(32, const(0))]), "ZeroLength:0"),
        ("sge1_zero_len", 0, mutate(s2, [(48, const(0))]), "ZeroLength:1"),
        ("all_zero", 0, bytearray(64), "MissingMetaDesc"),
        ("all_ones", 1, bytearray(b"\xff" * 64), "MetaExtension"),
    ]
    return out


ENTRY_FILL = 0xA5
ENTRIES = [
    # (name, wqe vector, entry size)
    ("e64_write_basic", "write_basic", 64),
    ("e64_inline_max", "inline_max", 64),
    ("e128_write_basic", "write_basic", 128),
    ("e128_write_all_ones", "write_all_ones", 128),
    ("e128_read_high_addr", "read_high_addr", 128),
    ("e128_write_imm_req64", "write_imm_req64", 128),
    ("e128_inline_max_ff", "inline_max_ff", 128),
    ("e128_sge2_max", "sge2_max", 128),
    ("e128_random_03_send_inline", "random_03_send_inline", 128),
]


def entry_bytes(v, size):
    """A slot of `size` bytes that held ENTRY_FILL, after the WQE was written into it."""
    b = bytearray([ENTRY_FILL] * size)
    b[0:64] = wqe_bytes(v)
    for i in range(64, size):
        b[i] = 0
    return b


def negative_entries():
    w = wqe("x", "rdma_write")
    inl = wqe("x", "send_inline", inline=b"\xff" * 32)
    out = []
    for name, v, off, val in (("tail64", w, 64, 1), ("tail100", w, 100, 0x80),
                              ("tail127", w, 127, 0xFF), ("inline_tail64", inl, 64, 0xFF),
                              ("stale_fill", w, None, ENTRY_FILL)):
        b = entry_bytes(v, 128)
        if off is None:
            for i in range(64, 128):
                b[i] = val
            off = 64
        else:
            b[off] = val
        out.append((name, 0, b, "ReservedNonZero:%d" % off))
    return out


def tx_cqe_bytes(req_id, req64, status, phase, op, qp_num):
    b = bytearray(16)
    put(b, 0, 2, req_id & 0xFFFF)
    b[2] = status
    b[3] = (phase << CQ_PHASE_BIT) | (Q_SEND << CQ_QTYPE_SHIFT) | (op << CQ_OP_SHIFT)
    put(b, 4, 2, qp_num)
    if req64:
        put(b, 6, 2, (req_id >> 16) & 0xFFFF)
        put(b, 8, 2, (req_id >> 32) & 0xFFFF)
        put(b, 10, 2, (req_id >> 48) & 0xFFFF)
    return b


def rx_cqe_bytes(c, extended):
    b = bytearray(32 if extended else 16)
    put(b, 0, 2, c["req_id"])
    b[2] = c["status"]
    f = (c["phase"] << CQ_PHASE_BIT) | (Q_RECV << CQ_QTYPE_SHIFT) | (c["op"] << CQ_OP_SHIFT)
    if c["has_imm"]:
        f |= 1 << CQ_HAS_IMM_BIT
    if c["unsolicited"]:
        f |= 1 << CQ_UNSOL_BIT
    b[3] = f
    put(b, 4, 2, c["qp_num"])
    put(b, 6, 2, c["length"] & 0xFFFF)
    put(b, 8, 2, c["ah"])
    put(b, 10, 2, c["src_qp"])
    put(b, 12, 4, c["imm"])
    if extended:
        if c["op"] == OP_WRITE:
            put(b, 16, 2, c["length"] >> 16)
        elif c.get("src_addr"):
            for i, x in enumerate(c["src_addr"]):
                b[16 + i] = x
    return b


STATUSES = list(range(16)) + [18]


def tx_cqes():
    out = []
    for i, st in enumerate(STATUSES):
        out.append(("tx_status_%d" % st, (i * 0x1111) & 0xFFFF, 0, st, i & 1, i % 3,
                    (0x100 + i * 7) & 0xFFFF))
    out += [
        ("tx_req64_max", (1 << 64) - 1, 1, 0, 1, OP_WRITE, 0xFFFF),
        ("tx_req64_pattern", 0x0123456789ABCDEF, 1, 10, 0, OP_SEND, 0x0001),
        ("tx_req64_small", 0x0000000000000005, 1, 0, 1, OP_READ, 0x0002),
        ("tx_req16_max", 0xFFFF, 0, 0, 1, OP_WRITE, 0),
    ]
    return out


def rx(name, **kw):
    c = dict(name=name, req_id=0x0010, status=0, phase=1, op=OP_SEND, has_imm=0,
             unsolicited=0, qp_num=0x0003, length=64, ah=0x0009, src_qp=0x0021, imm=0,
             src_addr=None)
    c.update(kw)
    return c


def rx_cqes():
    base = [
        rx("rx_send"),
        rx("rx_send_imm", has_imm=1, imm=0x01020304, phase=0),
        rx("rx_send_imm_zero", has_imm=1, imm=0),
        rx("rx_send_max", req_id=0xFFFF, qp_num=0xFFFF, length=0xFFFF, ah=0xFFFE,
           src_qp=0xFFFF),
        rx("rx_send_unknown_ah", ah=0xFFFF, length=0),
        rx("rx_write_imm", op=OP_WRITE, has_imm=1, imm=0xFFFFFFFF, length=4096),
        rx("rx_write_imm_unsolicited", op=OP_WRITE, has_imm=1, unsolicited=1,
           imm=0xCAFEF00D, req_id=0, length=0),
        rx("rx_send_flushed", status=1, length=0),
        rx("rx_send_rnr_status", status=10, phase=0),
    ]
    ext = [
        rx("rxex_write_imm_long", op=OP_WRITE, has_imm=1, imm=0x11111111,
           length=0x12345678, unsolicited=1),
        rx("rxex_write_imm_max_len", op=OP_WRITE, has_imm=1, imm=0, length=0xFFFFFFFF,
           phase=0),
        rx("rxex_write_imm_short", op=OP_WRITE, has_imm=1, imm=7, length=0x8000),
        rx("rxex_send_src_addr", ah=0xFFFF,
           src_addr=bytes([0xFE, 0x80] + [0] * 6 + list(range(1, 9)))),
        rx("rxex_send_unknown_ah_no_addr", ah=0xFFFF),
        rx("rxex_send_known_ah", ah=0x0001, has_imm=1, imm=0xABCDEF01),
    ]
    return base, ext


def negative_cqes():
    tx_ok = tx_cqe_bytes(0x55, 0, 0, 1, OP_WRITE, 3)
    rx_ok = rx_cqe_bytes(rx("x"), False)
    rxw = rx_cqe_bytes(rx("x", op=OP_WRITE, has_imm=1, imm=5), True)
    rxs = rx_cqe_bytes(rx("x"), True)

    def m(b, off, val):
        b = bytearray(b)
        b[off] = val
        return b

    return [
        ("tx_status_16", "tx", m(tx_ok, 2, 16), "UnknownStatus:16"),
        ("tx_status_17", "tx", m(tx_ok, 2, 17), "UnknownStatus:17"),
        ("tx_status_255", "tx", m(tx_ok, 2, 255), "UnknownStatus:255"),
        ("tx_qtype_0", "tx", m(tx_ok, 3, tx_ok[3] & ~0x06), "UnknownQueueType:0"),
        ("tx_qtype_3", "tx", m(tx_ok, 3, tx_ok[3] | 0x06), "UnknownQueueType:3"),
        ("tx_qtype_rq", "tx", m(tx_ok, 3, (tx_ok[3] & ~0x06) | (Q_RECV << 1)),
         "WrongQueueType"),
        ("tx_op_7", "tx", m(tx_ok, 3, tx_ok[3] | 0x70), "UnknownOpType:7"),
        ("tx_has_imm", "tx", m(tx_ok, 3, tx_ok[3] | 0x08), "RxOnlyFlag:3"),
        ("tx_unsolicited", "tx", m(tx_ok, 3, tx_ok[3] | 0x80), "RxOnlyFlag:7"),
        ("tx_reserved_12", "tx64", m(tx_ok, 12, 1), "ReservedNonZero:12"),
        ("tx_reserved_15", "tx64", m(tx_ok, 15, 0x80), "ReservedNonZero:15"),
        ("tx_ext_without_cap", "tx", m(tx_ok, 8, 1), "ReservedNonZero:8"),
        ("rx_qtype_sq", "rx", m(rx_ok, 3, (rx_ok[3] & ~0x06) | (Q_SEND << 1)),
         "WrongQueueType"),
        ("rx_op_read", "rx", m(rx_ok, 3, (rx_ok[3] & ~0x70) | (OP_READ << 4)),
         "InvalidOpForQueue"),
        ("rx_op_5", "rx", m(rx_ok, 3, (rx_ok[3] & ~0x70) | (5 << 4)), "UnknownOpType:5"),
        ("rx_unsolicited_send", "rx", m(rx_ok, 3, rx_ok[3] | 0x80),
         "UnsolicitedWithoutWrite"),
        ("rx_write_no_imm", "rx", m(rx_ok, 3, (rx_ok[3] & ~0x70) | (OP_WRITE << 4)),
         "WriteWithoutImm"),
        ("rx_stray_imm", "rx", m(rx_ok, 15, 1), "StrayImmediate"),
        ("rx_status_19", "rx", m(rx_ok, 2, 19), "UnknownStatus:19"),
        ("rxex_write_tail", "rx_ex", m(rxw, 18, 1), "ReservedNonZero:18"),
        ("rxex_write_tail_end", "rx_ex", m(rxw, 31, 1), "ReservedNonZero:31"),
        ("rxex_send_known_ah_tail", "rx_ex", m(rxs, 20, 1), "ReservedNonZero:20"),
    ]


def main():
    print("# EFA golden vectors, generated by tests/golden/gen_vectors.py from the bit")
    print("# positions of the EFA TX WQE and CQE formats. Do not edit by hand.")
    pos = positive_wqes()
    names = set()
    print("# --- valid TX WQEs (%d)" % len(pos))
    for v in pos:
        assert v["name"] not in names
        names.add(v["name"])
        print(wqe_line(v))
    neg = negative_wqes()
    print("# --- TX WQEs a strict decoder rejects (%d)" % len(neg))
    for name, req64, b, err in neg:
        assert len(b) == 64
        print("wqe_bad bad_%s req64=%d bytes=%s error=%s" % (name, req64, hexs(b), err))
    tx = tx_cqes()
    print("# --- send completions (%d)" % len(tx))
    for name, req_id, req64, st, ph, op, qp in tx:
        b = tx_cqe_bytes(req_id, req64, st, ph, op, qp)
        print("tx_cqe %s req_id=%s req64=%d status=%d phase=%d op=%s qp_num=%s bytes=%s"
              % (name, h(req_id), req64, st, ph, CQE_OP_NAME[op], h(qp), hexs(b)))
    base, ext = rx_cqes()
    print("# --- receive completions, base form (%d) and extended form (%d)"
          % (len(base), len(ext)))
    for kind, items, extended in (("rx_cqe", base, False), ("rx_cqe_ex", ext, True)):
        for c in items:
            t = [kind, c["name"], "req_id=" + h(c["req_id"]), "status=%d" % c["status"],
                 "phase=%d" % c["phase"], "op=" + CQE_OP_NAME[c["op"]],
                 "has_imm=%d" % c["has_imm"], "unsolicited=%d" % c["unsolicited"],
                 "qp_num=" + h(c["qp_num"]), "length=" + h(c["length"]),
                 "ah=" + h(c["ah"]), "src_qp=" + h(c["src_qp"]), "imm=" + h(c["imm"])]
            if extended:
                t.append("src_addr=" + (hexs(c["src_addr"]) if c["src_addr"] else "-"))
            t.append("bytes=" + hexs(rx_cqe_bytes(c, extended)))
            print(" ".join(t))
    negc = negative_cqes()
    print("# --- completions a strict decoder rejects (%d)" % len(negc))
    for name, form, b, err in negc:
        print("cqe_bad bad_%s form=%s bytes=%s error=%s" % (name, form, hexs(b), err))
    by_name = {v["name"]: v for v in pos}
    print("# --- send-queue ring entries: a WQE written into a 64- or 128-byte slot (%d)"
          % len(ENTRIES))
    for name, of, size in ENTRIES:
        print("entry %s of=%s entry_size=%d bytes=%s"
              % (name, of, size, hexs(entry_bytes(by_name[of], size))))
    nege = negative_entries()
    print("# --- 128-byte entries a strict decoder rejects (%d)" % len(nege))
    for name, req64, b, err in nege:
        assert len(b) == 128
        print("entry_bad bad_%s req64=%d bytes=%s error=%s" % (name, req64, hexs(b), err))


if __name__ == "__main__":
    main()
