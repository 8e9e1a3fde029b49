//! Ring layout of the queue memory, the host control word offsets and the host view a CPU poster uses.
use super::*;

/// Host pointers of a software queue whose control block is in host memory: what a CPU thread
/// needs to play the GPU's part.
#[derive(Clone, Copy, Debug)]
pub struct HostView {
    /// SQ ring.
    pub sq: *mut u8,
    /// Doorbell record.
    pub doorbell: *mut u32,
    /// CQ ring.
    pub cq: *mut u8,
    /// RX ring.
    pub rx: *mut u8,
    /// Control block (`NvshmemEfaGdaQueueCtrl`).
    pub ctrl: *mut u8,
    /// Per-slot status words.
    pub slot_status: *mut u32,
    /// Host control words (`NvshmemEfaGdaHostCtrl`).
    pub host_ctrl: *mut u8,
    /// SQ depth.
    pub sq_entries: u32,
    /// Size of one SQ entry (64 or 128 bytes).
    pub sq_entry_size: u32,
    /// CQ depth.
    pub cq_entries: u32,
    /// RX ring depth.
    pub rx_entries: u32,
    /// Doorbell batch limit.
    pub max_batch: u32,
}

// SAFETY: plain addresses of memory owned by the queue; users access it atomically/volatilely.
unsafe impl Send for HostView {}
// SAFETY: as above.
unsafe impl Sync for HostView {}

#[derive(Clone, Copy, Debug)]
pub(super) struct RingLayout {
    pub(super) sq: usize,
    pub(super) cq: usize,
    pub(super) rx: usize,
    pub(super) doorbell: usize,
    pub(super) host_ctrl: usize,
    pub(super) total: usize,
}

pub(super) fn align64(x: usize) -> usize {
    (x + 63) & !63
}

impl RingLayout {
    pub(super) fn new(
        sq_entries: u32,
        sq_entry_size: u32,
        cq_entries: u32,
        rx_entries: u32,
    ) -> RingLayout {
        let sq = 0;
        let cq = align64(sq + sq_entries as usize * sq_entry_size as usize);
        let rx = align64(cq + cq_entries as usize * TX_CQE_SIZE);
        let doorbell = align64(rx + rx_entries as usize * RX_CQE_EX_SIZE);
        let host_ctrl = doorbell + 64;
        let total = host_ctrl + std::mem::size_of::<NvshmemEfaGdaHostCtrl>();
        RingLayout {
            sq,
            cq,
            rx,
            doorbell,
            host_ctrl,
            total,
        }
    }
}

pub(super) const CTRL_SIZE: usize = std::mem::size_of::<NvshmemEfaGdaQueueCtrl>();
pub(super) const OFF_DONE: usize = offset_of!(NvshmemEfaGdaQueueCtrl, done);
pub(super) const OFF_RESV: usize = offset_of!(NvshmemEfaGdaQueueCtrl, resv);
pub(super) const OFF_READY: usize = offset_of!(NvshmemEfaGdaQueueCtrl, ready);
pub(super) const OFF_CQ_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, cq_ci);
/// `first_error` (low 32 bits) and `cq_lock` (high 32 bits) as one little-endian word.
pub(super) const OFF_FIRST_ERROR: usize = offset_of!(NvshmemEfaGdaQueueCtrl, first_error);
pub(super) const OFF_RX_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, rx_ci);
pub(super) const HC_CONSUMED: usize = offset_of!(NvshmemEfaGdaHostCtrl, consumed);
pub(super) const HC_REJECTED: usize = offset_of!(NvshmemEfaGdaHostCtrl, rejected);
pub(super) const HC_RX_PRODUCED: usize = offset_of!(NvshmemEfaGdaHostCtrl, rx_produced);
pub(super) const HC_HEARTBEAT: usize = offset_of!(NvshmemEfaGdaHostCtrl, heartbeat);
pub(super) const HC_STOPPED: usize = offset_of!(NvshmemEfaGdaHostCtrl, stopped);
pub(super) const HC_DONE: usize = offset_of!(NvshmemEfaGdaHostCtrl, done);
