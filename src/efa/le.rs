//! Byte-level helpers shared by the WQE and CQE formats: little-endian field access (every
//! multi-byte field of both is little-endian), the reserved-byte scan, and the 64-bit request id
//! that both carry as a 16-bit word plus three 16-bit extension words.

/// The little-endian `u16` at `b[off..off + 2]`.
pub(super) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// The little-endian `u32` at `b[off..off + 4]`.
pub(super) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Writes `v` little-endian at `b[off..off + 2]`.
pub(super) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `b[off..off + 4]`.
pub(super) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// A copy of the `N` bytes of `b` that start at `off`.
pub(super) fn array_at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[off..off + N]);
    out
}

/// The 16-byte descriptors (buffer and remote memory) are four little-endian `u32` words.
pub(super) fn words_from_bytes(b: &[u8; 16]) -> [u32; 4] {
    [get_u32(b, 0), get_u32(b, 4), get_u32(b, 8), get_u32(b, 12)]
}

/// The 16 little-endian bytes of four `u32` words.
pub(super) fn words_to_bytes(words: [u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (i, w) in words.into_iter().enumerate() {
        put_u32(&mut b, 4 * i, w);
    }
    b
}

/// The offset of the first non-zero byte in `b[start..end]`, as a byte offset (formats are at
/// most 128 bytes long).
pub(super) fn first_nonzero(b: &[u8], start: usize, end: usize) -> Option<u8> {
    (start..end).find(|&i| b[i] != 0).map(|i| i as u8)
}

/// Bits 16-31, 32-47 and 48-63 of a request id: the extension words of a queue with the 64-bit
/// request-id capability.
pub(super) fn req_id_ex_words(req_id: u64) -> [u16; 3] {
    [
        (req_id >> 16) as u16,
        (req_id >> 32) as u16,
        (req_id >> 48) as u16,
    ]
}

/// The request id made of its low 16 bits and its three extension words.
pub(super) fn req_id_from_words(low: u16, ex: [u16; 3]) -> u64 {
    u64::from(low) | (u64::from(ex[0]) << 16) | (u64::from(ex[1]) << 32) | (u64::from(ex[2]) << 48)
}
