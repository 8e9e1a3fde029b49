//! Feeds arbitrary bytes to the EFA WQE and CQE decoders.
//!
//! Input layout: bytes 0-63 are a TX WQE, bytes 64-95 a 32-byte CQE slot, and bytes 0-127 a
//! 128-byte send-queue entry (wide inline payloads); missing bytes are zero. The first 32 bytes
//! are also decoded as CQEs so short inputs reach the CQE decoders. For every accepted entry the
//! description must be valid, must encode back to exactly the input bytes, and must decode again
//! to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvshmem_efa_gda::efa::{cqe, wqe};

fn check_cqes(slot: &[u8; 32]) {
    let mut b16 = [0u8; 16];
    b16.copy_from_slice(&slot[..16]);
    for req_id_64 in [false, true] {
        if let Ok(c) = cqe::decode_tx_with(&b16, req_id_64) {
            assert_eq!(cqe::validate_tx(&c), Ok(()));
            let again = cqe::encode_tx(&c);
            assert_eq!(again, b16);
            assert_eq!(cqe::decode_tx_with(&again, req_id_64), Ok(c));
        }
    }
    if let Ok(c) = cqe::decode_rx(&b16) {
        assert_eq!(cqe::validate_rx(&c, false), Ok(()));
        let again = cqe::encode_rx(&c);
        assert_eq!(again, b16);
        assert_eq!(cqe::decode_rx(&again), Ok(c));
    }
    if let Ok(c) = cqe::decode_rx_ex(slot) {
        assert_eq!(cqe::validate_rx(&c, true), Ok(()));
        let again = cqe::encode_rx_ex(&c);
        assert_eq!(&again, slot);
        assert_eq!(cqe::decode_rx_ex(&again), Ok(c));
    }
    assert_eq!(cqe::TxCdesc::from_bytes(&b16).to_bytes(), b16);
    assert_eq!(cqe::RxCdesc::from_bytes(&b16).to_bytes(), b16);
    assert_eq!(&cqe::RxCdescEx::from_bytes(slot).to_bytes(), slot);
    let _ = cqe::queue_type_of(&[slot[0], slot[1], slot[2], slot[3]]);
}

fn check_wide(e: &[u8; wqe::WQE_SIZE_128]) {
    for req_id_64 in [false, true] {
        match wqe::decode_entry_128(e, req_id_64) {
            Ok(wqe::Entry128::Inline(d)) => {
                assert_eq!(wqe::validate_inline(&d), Ok(()));
                let again = wqe::encode_inline(&d).expect("an accepted entry encodes");
                assert_eq!(&again, e, "accepted wide bytes are not canonical");
                assert_eq!(
                    wqe::decode_entry_128(&again, req_id_64),
                    Ok(wqe::Entry128::Inline(d))
                );
            }
            Ok(wqe::Entry128::Narrow(d)) => {
                let mut again = [0u8; wqe::WQE_SIZE_128];
                wqe::store_entry(&mut again, &wqe::encode(&d)).expect("128-byte entry");
                assert_eq!(&again, e, "accepted narrow entry is not canonical");
            }
            Err(_) => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut buf = [0u8; 128];
    let n = data.len().min(buf.len());
    buf[..n].copy_from_slice(&data[..n]);

    let mut w = [0u8; wqe::WQE_SIZE];
    w.copy_from_slice(&buf[..64]);
    for req_id_64 in [false, true] {
        if let Ok(d) = wqe::decode_with(&w, req_id_64) {
            assert_eq!(wqe::validate(&d), Ok(()));
            let again = wqe::encode(&d);
            assert_eq!(again, w, "accepted WQE bytes are not canonical");
            assert_eq!(wqe::decode_with(&again, req_id_64), Ok(d));
            assert_eq!(wqe::encode_checked(&d), Ok(w));
        }
    }
    assert_eq!(wqe::TxWqe::from_bytes(&w).to_bytes(), w);

    let mut slot = [0u8; 32];
    slot.copy_from_slice(&buf[..32]);
    check_cqes(&slot);
    slot.copy_from_slice(&buf[64..96]);
    check_cqes(&slot);
    check_wide(&buf);
});
