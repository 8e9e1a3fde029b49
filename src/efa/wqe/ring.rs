//! The send-queue ring: the slot and phase of a producer counter, and ring entries of 64 or 128
//! bytes.

use super::{decode_with, WqeDesc, WqeError, WQE_SIZE, WQE_SIZE_128};
use crate::efa::le::first_nonzero;

/// Phase bit a producer writes for producer counter `pc` on a ring of `entries` slots:
/// `(pc / entries) & 1`, so the first pass writes 0. `entries == 0` yields 0.
pub fn phase_for(pc: u64, entries: u32) -> u8 {
    match pc.checked_div(u64::from(entries)) {
        Some(wraps) => (wraps & 1) as u8,
        None => 0,
    }
}

/// Ring slot for producer counter `pc` on a ring of `entries` slots: `pc % entries`
/// (equal to `pc & (entries - 1)` for the power-of-two rings EFA uses). `entries == 0` yields 0.
pub fn slot_for(pc: u64, entries: u32) -> u32 {
    match pc.checked_rem(u64::from(entries)) {
        Some(slot) => slot as u32,
        None => 0,
    }
}

/// Writes a built WQE into a send-queue ring entry of `entry.len()` bytes (64 or 128): the 64
/// WQE bytes, then zeros. A 128-byte entry is written whole, as the producers on hardware do
/// (rdma-core's `efa_post_send` clears `wqe_size` bytes before it copies; NCCL's EFA GDA post path
/// zeroes a 128-byte staging WQE and copies `wqe_size` bytes): the device reads bytes 64-127
/// too, and a previous WQE's bytes there must not survive. The CUDA twin is
/// `nvshmem_efa_wqe_store_entry` in `cuda/efa_wqe.cuh` (golden vectors of kind `entry`).
pub fn store_entry(entry: &mut [u8], wqe: &[u8; WQE_SIZE]) -> Result<(), WqeError> {
    if entry.len() != WQE_SIZE && entry.len() != WQE_SIZE_128 {
        return Err(WqeError::BadEntrySize(entry.len()));
    }
    entry[..WQE_SIZE].copy_from_slice(wqe);
    entry[WQE_SIZE..].fill(0);
    Ok(())
}

/// Decodes and validates a send-queue ring entry of 64 or 128 bytes: bytes 0-63 as
/// [`decode_with`], then every byte past them must be zero ([`WqeError::ReservedNonZero`] with
/// the offset within the entry), since no WQE this library accepts uses them.
pub fn decode_entry(entry: &[u8], req_id_64: bool) -> Result<WqeDesc, WqeError> {
    if entry.len() != WQE_SIZE && entry.len() != WQE_SIZE_128 {
        return Err(WqeError::BadEntrySize(entry.len()));
    }
    let mut head = [0u8; WQE_SIZE];
    head.copy_from_slice(&entry[..WQE_SIZE]);
    let desc = decode_with(&head, req_id_64)?;
    if let Some(offset) = first_nonzero(entry, WQE_SIZE, entry.len()) {
        return Err(WqeError::ReservedNonZero { offset });
    }
    Ok(desc)
}
