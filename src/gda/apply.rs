//! The one AMO applier both queue kinds run: the software queue's consumer thread
//! (`softq::receive`) and the hardware queue's receive thread ([`super::hw_rx`]) hand every received
//! SEND payload to [`apply_message`], which recognises an AMO message ([`AmoMsg`]), checks it against
//! the local heap, and applies it.
//!
//! Exactness: every AMO message a PE receives is applied by that PE's one receiving thread, in
//! arrival order. Host memory is changed with a host atomic; GPU memory with a read-modify-write
//! through `cuda::memcpy` on a non-blocking stream (never waiting for running kernels), which is
//! exact because no other agent applies AMOs to the word (the device API's contract: these AMOs are
//! used only together with other AMOs of this API on the same word).
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use crate::cuda;
use crate::efa::cqe::CqStatus;

use super::mem;
use super::wire::{self, AmoError, AmoMsg};

/// The local symmetric heap as the applier sees it.
pub trait LocalHeap {
    /// Highest heap offset any local chunk reaches (0: no heap yet).
    fn extent(&self) -> u64;
    /// Host-usable address of heap offsets `[off, off + len)` and whether it is GPU memory; `None`
    /// when no single chunk holds the whole range.
    fn locate(&self, off: u64, len: u64) -> Option<(u64, bool)>;
}

/// What [`apply_message`] did with a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The payload is not an AMO message (wrong size or magic).
    NotAmo,
    /// The AMO was applied.
    Applied(AmoMsg),
    /// The AMO message was refused or could not be applied: the completion status to report and
    /// why (the caller logs it).
    Rejected {
        /// EFA completion status for the receive completion.
        status: CqStatus,
        /// What was wrong.
        why: String,
    },
}

/// Completion status of a malformed AMO message.
pub fn amo_status(e: &AmoError) -> CqStatus {
    match e {
        AmoError::BadOp(_) => CqStatus::LocalUnsupportedOp,
        AmoError::BadSize(_) | AmoError::UnknownFlags(_) => CqStatus::LocalBadLength,
        AmoError::Misaligned(_) | AmoError::OutOfRange(_) => CqStatus::RemoteBadAddress,
    }
}

/// A received SEND payload, recognised and checked against the local heap but not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Not an AMO message.
    NotAmo,
    /// An acceptable AMO: the message, the host-usable address of its word, and whether that word
    /// is GPU memory.
    Ready(AmoMsg, u64, bool),
    /// Refused: as [`Outcome::Rejected`].
    Rejected {
        /// EFA completion status for the receive completion.
        status: CqStatus,
        /// What was wrong.
        why: String,
    },
}

/// Recognises and checks one received SEND payload (nothing is applied).
pub fn check_message(payload: &[u8], heap: &dyn LocalHeap) -> Checked {
    let m = match AmoMsg::parse(payload, heap.extent()) {
        None => return Checked::NotAmo,
        Some(Err(e)) => {
            return Checked::Rejected {
                status: amo_status(&e),
                why: e.to_string(),
            }
        }
        Some(Ok(m)) => m,
    };
    match heap.locate(m.offset, u64::from(m.size)) {
        Some((addr, device)) => Checked::Ready(m, addr, device),
        None => Checked::Rejected {
            status: CqStatus::RemoteBadAddress,
            why: format!("offset {:#x} lies in no heap chunk", m.offset),
        },
    }
}

/// Recognises, checks and applies one received SEND payload.
pub fn apply_message(payload: &[u8], heap: &dyn LocalHeap) -> Outcome {
    match check_message(payload, heap) {
        Checked::NotAmo => Outcome::NotAmo,
        Checked::Rejected { status, why } => Outcome::Rejected { status, why },
        Checked::Ready(m, addr, device) => apply_checked(m, addr, device),
    }
}

/// Applies an AMO [`check_message`] found ready.
pub fn apply_checked(m: AmoMsg, addr: u64, device: bool) -> Outcome {
    match apply_amo(&m, addr, device) {
        Ok(()) => Outcome::Applied(m),
        Err(why) => Outcome::Rejected {
            status: CqStatus::LocalQpInternalError,
            why,
        },
    }
}

/// The new value of a `size`-byte word holding `old` after AMO `m` (only the low `size` bytes of
/// the result are stored).
pub(crate) fn amo_result(m: &AmoMsg, old: u64) -> u64 {
    if m.op == wire::AMO_OP_ADD {
        old.wrapping_add(m.value)
    } else {
        m.value
    }
}

/// Applies a checked AMO to the word at host-usable address `addr` (GPU memory when `device`).
fn apply_amo(m: &AmoMsg, addr: u64, device: bool) -> Result<(), String> {
    if device {
        let mut cur = [0u8; 8];
        let n = m.size as usize;
        // SAFETY: the caller located the range inside a local heap chunk, which stays allocated
        // while the queue lives.
        unsafe { cuda::memcpy(cur.as_mut_ptr() as *mut c_void, addr as *const c_void, n) }
            .map_err(|e| e.to_string())?;
        let out = amo_result(m, u64::from_le_bytes(cur)).to_le_bytes();
        // SAFETY: as above.
        unsafe { cuda::memcpy(addr as *mut c_void, out.as_ptr() as *const c_void, n) }
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    // SAFETY: the range lies inside a local heap chunk and is aligned to the operand size (checked
    // by `AmoMsg::parse`); other agents access these words atomically or not at all while AMOs fly.
    unsafe {
        if m.size == 8 {
            let a = mem::atomic_u64(addr as *mut u8);
            if m.op == wire::AMO_OP_ADD {
                a.fetch_add(m.value, Ordering::AcqRel);
            } else {
                a.store(m.value, Ordering::Release);
            }
        } else {
            let a = mem::atomic_u32(addr as *mut u8);
            if m.op == wire::AMO_OP_ADD {
                a.fetch_add(m.value as u32, Ordering::AcqRel);
            } else {
                a.store(m.value as u32, Ordering::Release);
            }
        }
    }
    Ok(())
}

/// One local heap chunk: heap offsets `[start, end)` at host-usable address `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    end: u64,
    addr: u64,
    device: bool,
}

/// The local heap's chunks by start offset (the hardware queue's table; the software queue has its
/// own granule-indexed one).
#[derive(Clone, Debug, Default)]
pub struct HeapChunks {
    chunks: BTreeMap<u64, Chunk>,
}

impl HeapChunks {
    /// Adds chunk `[start, end)` at `addr`; refuses an empty or overlapping one.
    pub fn add(&mut self, start: u64, end: u64, addr: u64, device: bool) -> Result<(), String> {
        if end <= start {
            return Err(format!("empty heap chunk [{start:#x}, {end:#x})"));
        }
        let before = self.chunks.range(..end).next_back();
        if let Some((&s, c)) = before {
            if c.end > start {
                return Err(format!(
                    "heap chunk [{start:#x}, {end:#x}) overlaps [{s:#x}, {:#x})",
                    c.end
                ));
            }
        }
        self.chunks.insert(start, Chunk { end, addr, device });
        Ok(())
    }

    /// Removes the chunk starting at `start`; whether there was one.
    pub fn remove(&mut self, start: u64) -> bool {
        self.chunks.remove(&start).is_some()
    }
}

impl LocalHeap for HeapChunks {
    fn extent(&self) -> u64 {
        self.chunks.values().map(|c| c.end).max().unwrap_or(0)
    }

    fn locate(&self, off: u64, len: u64) -> Option<(u64, bool)> {
        let (&start, c) = self.chunks.range(..=off).next_back()?;
        let end = off.checked_add(len)?;
        (end <= c.end).then(|| (c.addr + (off - start), c.device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gda::wire::{AMO_OP_ADD, AMO_OP_SET};

    fn msg(op: u32, size: u32, offset: u64, value: u64) -> [u8; wire::AMO_MSG_SIZE] {
        AmoMsg {
            op,
            size,
            offset,
            value,
            flags: 0,
        }
        .encode()
    }

    #[test]
    fn applies_checks_and_rejects() {
        let mut heap = vec![0u64; 64];
        let mut h = HeapChunks::default();
        // Two chunks with a hole between them: [0, 256) and [512, 768) both backed by `heap`.
        let base = heap.as_mut_ptr() as u64;
        h.add(0, 256, base, false).unwrap();
        h.add(512, 768, base + 256, false).unwrap();
        assert!(h.add(700, 800, base, false).is_err(), "overlap refused");
        assert!(h.add(8, 8, base, false).is_err(), "empty refused");
        assert_eq!(h.extent(), 768);

        assert_eq!(
            apply_message(&msg(AMO_OP_ADD, 8, 8, 5), &h),
            Outcome::Applied(AmoMsg {
                op: AMO_OP_ADD,
                size: 8,
                offset: 8,
                value: 5,
                flags: 0,
            })
        );
        assert!(matches!(
            apply_message(&msg(AMO_OP_ADD, 4, 516, 7), &h),
            Outcome::Applied(_)
        ));
        assert!(matches!(
            apply_message(&msg(AMO_OP_SET, 8, 16, 9), &h),
            Outcome::Applied(_)
        ));
        assert_eq!(heap[1], 5);
        assert_eq!(heap[2], 9);
        assert_eq!(heap[32] >> 32, 7, "offset 516 is chunk 2's byte 4");

        // In the hole, misaligned, bad op, beyond the heap, not an AMO.
        let r = apply_message(&msg(AMO_OP_ADD, 8, 256, 1), &h);
        assert!(
            matches!(&r, Outcome::Rejected { status: CqStatus::RemoteBadAddress, why } if why.contains("no heap chunk")),
            "{r:?}"
        );
        assert!(matches!(
            apply_message(&msg(AMO_OP_ADD, 8, 12, 1), &h),
            Outcome::Rejected {
                status: CqStatus::RemoteBadAddress,
                ..
            }
        ));
        assert!(matches!(
            apply_message(&msg(9, 8, 8, 1), &h),
            Outcome::Rejected {
                status: CqStatus::LocalUnsupportedOp,
                ..
            }
        ));
        assert!(matches!(
            apply_message(&msg(AMO_OP_ADD, 8, 768, 1), &h),
            Outcome::Rejected {
                status: CqStatus::RemoteBadAddress,
                ..
            }
        ));
        assert_eq!(apply_message(b"not an amo", &h), Outcome::NotAmo);
        assert_eq!(heap[1], 5, "rejected messages change nothing");
        assert!(h.remove(512));
        assert!(!h.remove(512));
        assert_eq!(h.extent(), 256);
    }
}
