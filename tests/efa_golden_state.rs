//! The device state's layout against `tests/golden/gda_state_layout.txt`, the same file the CUDA
//! side checks the generated C header with (`tests/cuda/gda_state_layout_test.cu`, built by
//! `tests/cuda/run_golden.sh`): every field's offset and size, every struct's size, the version.
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

use nvshmem_efa_gda::gda::state::*;

const LAYOUT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/gda_state_layout.txt"
);

fn field_size<S, T>(_: fn(&S) -> &T) -> usize {
    size_of::<T>()
}

/// (struct, field) -> (offset, size), and struct -> size, from the Rust definitions.
macro_rules! layout {
    ($($s:ident { $($f:ident),* $(,)? })*) => {{
        let mut fields = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        $(
            sizes.insert(stringify!($s).to_string(), size_of::<$s>());
            $(
                fields.insert(
                    (stringify!($s).to_string(), stringify!($f).to_string()),
                    (offset_of!($s, $f), field_size(|x: &$s| &x.$f)),
                );
            )*
        )*
        (fields, sizes)
    }};
}

#[test]
fn device_state_layout_matches_the_golden_file() {
    let (fields, sizes) = layout! {
        NvshmemEfaGdaDeviceState {
            version, ready, my_pe, n_pes, queue, heap_base, heap_size, heap_lkey, reserved, peers,
            heap_keys, log2_granularity, key_stride, n_granules, reserved2, queues, n_queues,
            queues_per_pe,
        }
        NvshmemEfaGdaQueue {
            sq, sq_doorbell, cq, rx_cq, ctrl, slot_status, host_ctrl, sq_entries, sq_entry_size,
            cq_entries, cq_entry_size, rx_entries, max_batch, qpn, reserved, mode,
        }
        NvshmemEfaGdaQueueCtrl {
            resv, ready, done, cq_ci, errors, first_error, cq_lock, rx_ci, rung, db_lock,
        }
        NvshmemEfaGdaHostCtrl { consumed, rejected, rx_produced, heartbeat, stopped, done, pad }
        NvshmemEfaGdaPeer { ahn, qpn, qkey, heap_base, heap_size, heap_rkey, flags }
    };
    let text = std::fs::read_to_string(LAYOUT).expect("golden layout file");
    let mut seen_fields = 0;
    let mut seen_sizes = 0;
    let mut version = None;
    for (n, line) in text.lines().enumerate() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.is_empty() || w[0].starts_with('#') {
            continue;
        }
        let at = format!("{LAYOUT}:{}", n + 1);
        match w.as_slice() {
            ["version", v] => version = Some(v.parse::<u32>().expect("version number")),
            [s, "sizeof", size] => {
                let want: usize = size.parse().expect("size");
                assert_eq!(sizes.get(*s), Some(&want), "{at}: sizeof {s}");
                seen_sizes += 1;
            }
            [s, f, off, size] => {
                let want = (
                    off.parse::<usize>().expect("offset"),
                    size.parse::<usize>().expect("size"),
                );
                let got = fields.get(&(s.to_string(), f.to_string()));
                assert_eq!(got, Some(&want), "{at}: {s}.{f} (offset, size)");
                seen_fields += 1;
            }
            _ => panic!("{at}: cannot read {line:?}"),
        }
    }
    assert_eq!(
        version,
        Some(NVSHMEM_EFA_GDA_STATE_VERSION),
        "layout version"
    );
    assert_eq!(seen_fields, fields.len(), "every field has a line");
    assert_eq!(seen_sizes, sizes.len(), "every struct has a sizeof line");
    // No padding: the fields of each struct tile it.
    for (s, size) in &sizes {
        let sum: usize = fields
            .iter()
            .filter(|((st, _), _)| st == s)
            .map(|(_, (_, len))| len)
            .sum();
        assert_eq!(sum, *size, "{s}: fields cover the struct");
    }
}
