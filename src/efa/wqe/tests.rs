use super::*;

#[test]
fn entries_of_other_sizes_are_refused() {
    let w = [0u8; WQE_SIZE];
    for n in [0usize, 32, 63, 65, 96, 127, 129, 256] {
        let mut e = vec![0x5Au8; n];
        assert_eq!(store_entry(&mut e, &w), Err(WqeError::BadEntrySize(n)));
        assert!(e.iter().all(|&x| x == 0x5A), "entry of {n} bytes touched");
        assert_eq!(decode_entry(&e, false), Err(WqeError::BadEntrySize(n)));
    }
    assert!(WqeError::BadEntrySize(96).to_string().contains("96 bytes"));
}
use proptest::prelude::*;

fn base(op: WqeOp) -> WqeDesc {
    WqeDesc {
        op,
        req_id: 0x1234,
        req_id_64: false,
        phase: 1,
        comp_req: true,
        dest_qpn: 0x0102,
        ah: 0x0304,
        qkey: 0x0506_0708,
        high_pps: false,
    }
}

fn write_op(len: u32) -> WqeOp {
    WqeOp::RdmaWrite {
        remote: RemoteBuf {
            addr: 0xAABB_CCDD_1122_3344,
            rkey: 0xDEAD_BEEF,
            len,
        },
        local: LocalBuf {
            addr: 0x0000_7F00_0000_1000,
            lkey: 0x00AB_CDEF,
            len,
        },
    }
}

#[test]
fn rdma_write_bytes_by_hand() {
    let b = encode(&base(write_op(4096)));
    assert_eq!(&b[0..2], &[0x34, 0x12]);
    assert_eq!(b[2], 0x82, "meta_desc | RDMA_WRITE");
    assert_eq!(b[3], 0x1D, "phase | first | last | comp_req");
    assert_eq!(&b[4..6], &[0x02, 0x01]);
    assert_eq!(&b[6..8], &[1, 0], "one descriptor");
    assert_eq!(&b[8..12], &[0; 4]);
    assert_eq!(&b[12..14], &[0x04, 0x03]);
    assert_eq!(&b[14..16], &[0, 0]);
    assert_eq!(&b[16..20], &[0x08, 0x07, 0x06, 0x05]);
    assert_eq!(&b[20..32], &[0; 12]);
    assert_eq!(&b[32..36], &4096u32.to_le_bytes());
    assert_eq!(&b[36..40], &0xDEAD_BEEFu32.to_le_bytes());
    assert_eq!(&b[40..44], &0x1122_3344u32.to_le_bytes());
    assert_eq!(&b[44..48], &0xAABB_CCDDu32.to_le_bytes());
    assert_eq!(&b[48..52], &4096u32.to_le_bytes());
    assert_eq!(&b[52..56], &0x00AB_CDEFu32.to_le_bytes());
    assert_eq!(&b[56..60], &0x0000_1000u32.to_le_bytes());
    assert_eq!(&b[60..64], &0x0000_7F00u32.to_le_bytes());
}

#[test]
fn req_id_64_goes_to_ext_words() {
    let mut d = base(write_op(8));
    d.req_id = 0x8877_6655_4433_2211;
    d.req_id_64 = true;
    let b = encode(&d);
    assert_eq!(&b[0..2], &[0x11, 0x22]);
    assert_eq!(&b[26..32], &[0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    assert_eq!(decode_with(&b, true), Ok(d));
    // The same bytes on a queue without the capability are reserved-byte violations.
    assert_eq!(decode(&b), Err(WqeError::ReservedNonZero { offset: 26 }));
}

#[test]
fn validate_rejects_what_decode_rejects() {
    let mut d = base(write_op(8));
    d.req_id = 0x1_0000;
    assert_eq!(validate(&d), Err(WqeError::ReqIdTooWide(0x1_0000)));
    assert_eq!(encode_checked(&d), Err(WqeError::ReqIdTooWide(0x1_0000)));
    let mut d = base(write_op(8));
    d.phase = 2;
    assert_eq!(validate(&d), Err(WqeError::PhaseOutOfRange(2)));
    let d = base(write_op(0));
    assert_eq!(validate(&d), Err(WqeError::ZeroLength { index: 0 }));
    assert_eq!(decode(&encode(&d)), Err(WqeError::ZeroLength { index: 0 }));
    let d = base(WqeOp::RdmaWriteImm {
        remote: RemoteBuf {
            addr: 1,
            rkey: 2,
            len: 0,
        },
        local: LocalBuf {
            addr: 3,
            lkey: 4,
            len: 0,
        },
        imm: 5,
    });
    assert_eq!(validate(&d), Ok(()));
    assert_eq!(decode(&encode(&d)), Ok(d));
    let mut d = base(write_op(8));
    if let WqeOp::RdmaWrite { local, .. } = &mut d.op {
        local.lkey = 0x0100_0000;
    }
    assert_eq!(
        validate(&d),
        Err(WqeError::LkeyTooWide {
            index: 0,
            lkey: 0x0100_0000
        })
    );
    let mut data = [0u8; INLINE_MAX];
    data[5] = 9;
    let d = base(WqeOp::Send {
        payload: SendPayload::Inline { len: 4, data },
        imm: None,
    });
    assert_eq!(validate(&d), Err(WqeError::ReservedNonZero { offset: 37 }));
}

#[test]
fn inline_helpers() {
    assert!(SendPayload::inline(&[0u8; 33]).is_none());
    let p = SendPayload::inline(b"hello").unwrap();
    assert_eq!(p.inline_bytes(), Some(&b"hello"[..]));
    let d = base(WqeOp::Send {
        payload: p,
        imm: Some(7),
    });
    let b = encode(&d);
    assert_eq!(b[2], 0x80 | 0x20 | 0x10);
    assert_eq!(&b[6..8], &[5, 0]);
    assert_eq!(&b[32..37], b"hello");
    assert_eq!(decode(&b), Ok(d));
}

#[test]
fn phase_and_slot() {
    assert_eq!(phase_for(0, 8), 0);
    assert_eq!(phase_for(7, 8), 0);
    assert_eq!(phase_for(8, 8), 1);
    assert_eq!(phase_for(16, 8), 0);
    assert_eq!(phase_for(5, 0), 0);
    assert_eq!(slot_for(9, 8), 1);
    assert_eq!(slot_for(u64::MAX, 1024), 1023);
    assert_eq!(slot_for(5, 0), 0);
}

#[test]
fn error_display_is_specific() {
    let s = WqeError::LengthMismatch {
        local: 1,
        remote: 2,
    }
    .to_string();
    assert!(s.contains('1') && s.contains('2'), "{s}");
    assert_eq!(WqeError::UnknownOpType(3).to_string(), "unknown op type 3");
}

fn local_buf(allow_zero: bool) -> impl Strategy<Value = LocalBuf> {
    let min = u32::from(!allow_zero);
    (any::<u64>(), 0..=LKEY_MASK, min..=u32::MAX).prop_map(|(addr, lkey, len)| LocalBuf {
        addr,
        lkey,
        len,
    })
}

fn rdma_pair(allow_zero: bool) -> impl Strategy<Value = (RemoteBuf, LocalBuf)> {
    (local_buf(allow_zero), any::<u64>(), any::<u32>()).prop_map(|(local, addr, rkey)| {
        (
            RemoteBuf {
                addr,
                rkey,
                len: local.len,
            },
            local,
        )
    })
}

fn payload() -> impl Strategy<Value = SendPayload> {
    prop_oneof![
        (local_buf(false), proptest::option::of(local_buf(false)))
            .prop_map(|(first, second)| SendPayload::Sgl { first, second }),
        proptest::collection::vec(any::<u8>(), 0..=INLINE_MAX)
            .prop_map(|v| SendPayload::inline(&v).unwrap()),
    ]
}

fn wqe_op() -> impl Strategy<Value = WqeOp> {
    prop_oneof![
        (payload(), proptest::option::of(any::<u32>()))
            .prop_map(|(payload, imm)| WqeOp::Send { payload, imm }),
        rdma_pair(false).prop_map(|(remote, local)| WqeOp::RdmaWrite { remote, local }),
        (rdma_pair(true), any::<u32>())
            .prop_map(|((remote, local), imm)| { WqeOp::RdmaWriteImm { remote, local, imm } }),
        rdma_pair(false).prop_map(|(remote, local)| WqeOp::RdmaRead { remote, local }),
    ]
}

prop_compose! {
    fn valid_desc()(
        op in wqe_op(),
        req_id_64 in any::<bool>(),
        id in any::<u64>(),
        phase in 0u8..=1,
        comp_req in any::<bool>(),
        dest_qpn in any::<u16>(),
        ah in any::<u16>(),
        qkey in any::<u32>(),
        high_pps in any::<bool>(),
    ) -> WqeDesc {
        WqeDesc {
            op,
            req_id: if req_id_64 { id } else { id & REQ_ID_16_MAX },
            req_id_64,
            phase,
            comp_req,
            dest_qpn,
            ah,
            qkey,
            high_pps,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn encode_decode_identity(d in valid_desc()) {
        prop_assert_eq!(validate(&d), Ok(()));
        let b = encode(&d);
        prop_assert_eq!(decode_with(&b, d.req_id_64), Ok(d));
        // The raw view round-trips the bytes exactly.
        prop_assert_eq!(TxWqe::from_bytes(&b).to_bytes(), b);
    }

    #[test]
    fn decode_never_panics_and_is_stable(
        v in proptest::collection::vec(any::<u8>(), WQE_SIZE),
        req_id_64 in any::<bool>(),
    ) {
        let mut b = [0u8; WQE_SIZE];
        b.copy_from_slice(&v);
        if let Ok(d) = decode_with(&b, req_id_64) {
            // Accepted bytes are canonical: they re-encode to themselves.
            prop_assert_eq!(validate(&d), Ok(()));
            prop_assert_eq!(encode(&d), b);
        }
    }

    #[test]
    fn entries_round_trip_and_reject_a_stale_tail(
        d in valid_desc(),
        wide in any::<bool>(),
        fill in 1u8..=255,
        stale in WQE_SIZE..WQE_SIZE_128,
    ) {
        let size = if wide { WQE_SIZE_128 } else { WQE_SIZE };
        let mut e = vec![fill; size];
        let b = encode(&d);
        prop_assert_eq!(store_entry(&mut e, &b), Ok(()));
        prop_assert_eq!(&e[..WQE_SIZE], &b[..]);
        prop_assert!(e[WQE_SIZE..].iter().all(|&x| x == 0));
        prop_assert_eq!(decode_entry(&e, d.req_id_64), Ok(d));
        if wide {
            e[stale] = fill;
            prop_assert_eq!(
                decode_entry(&e, d.req_id_64),
                Err(WqeError::ReservedNonZero { offset: stale as u8 })
            );
        }
    }

    #[test]
    fn mutated_valid_wqe_decodes_consistently(
        d in valid_desc(),
        idx in 0usize..WQE_SIZE,
        bit in 0u8..8,
    ) {
        let mut b = encode(&d);
        b[idx] ^= 1 << bit;
        if let Ok(d2) = decode_with(&b, d.req_id_64) {
            prop_assert_eq!(encode(&d2), b);
            prop_assert_ne!(d2, d);
        }
    }
}
