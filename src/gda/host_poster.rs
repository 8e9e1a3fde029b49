//! A CPU implementation of the device side of the posting protocol in [`super::state`]: the thread
//! that "plays the GPU" in tests and benchmarks, and the reference the CUDA header follows.
//!
//! Step by step (numbers as in the protocol):
//! 1. reserve `k` slots: `base = fetch_add(ctrl.resv, k)`;
//! 2. wait until `base + k - ctrl.done <= sq_entries`, polling completions meanwhile, and until
//!    the WQEs to write lie within `B = min(max_batch, sq_entries)` of `ctrl.rung` (the last doorbell
//!    value): at most `max_batch` WQEs of all posters together stand written but not rung; while
//!    waiting for the window it rings what earlier posters committed (4b);
//! 3. write each WQE at slot `pc & (sq_entries - 1)` with phase `(pc / sq_entries) & 1` and request
//!    id `pc` (low 16 bits), the whole entry (a 128-byte entry gets 64 zero bytes after the WQE),
//!    then a full fence (`__threadfence_system()` on the GPU);
//! 4. wait until `ctrl.ready == base`, set `ctrl.ready = base + k`. The CUDA header reserves at most
//!    B WQEs at a time; this poster also takes larger reservations, and then, holding the commit
//!    turn (`ready == base`), commits and rings what it has written B at a time (`ready` moves
//!    through its own reservation) and writes the next B once the window allows;
//!    Doorbell (4b): ring after the commit (and in every wait): if `ctrl.ready` is past `ctrl.rung` and
//!    `ctrl.db_lock` is free, store `ready` into the doorbell, fence, set `ctrl.rung`, release the
//!    lock, look again; a busy lock is left to its holder, who looks again after releasing it;
//! 5. completions: the holder of `ctrl.cq_lock` (CAS 0 → 1) reads CQEs at `ctrl.cq_ci` while their
//!    phase is `((cq_ci / cq_entries) & 1) ^ 1`, marks `slot_status[req_id & (sq_entries - 1)] =
//!    status + 1`, counts errors (`ctrl.errors`, `ctrl.first_error`), advances `ctrl.done` over
//!    consecutive marked slots (clearing them), mirrors `done` into `host_ctrl.done`, releases the
//!    lock;
//! 6. quiet: wait until `ctrl.done >= ctrl.ready` as read at entry (ringing); report `ctrl.errors`.
//!
//! Receive completions (the RX ring, beyond the six steps): 32-byte entries (the extended EFA receive
//! form) read at `ctrl.rx_ci` with the phase rule of the CQ on `rx_entries`, each claimed by a
//! compare-and-swap of `ctrl.rx_ci` (no lock); the software queue reads `rx_ci` to know the ring has
//! room, so a consumer must advance it.
//!
//! Once a reservation is made it must be committed (later posters wait for it in step 4), so the
//! deadlines here are safety nets: a poster that gives up leaves the queue stuck and says so.
use std::mem::offset_of;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::efa::cqe::{self, RxCqe, RX_CQE_EX_SIZE, TX_CQE_SIZE};
use crate::efa::wqe::{self, WqeDesc, WQE_SIZE};

use super::error::{GdaError, Result};
use super::mem::{self, read_shared};
use super::softq::{HostView, SoftQueue};
use super::state::{NvshmemEfaGdaHostCtrl, NvshmemEfaGdaQueueCtrl};

const OFF_RESV: usize = offset_of!(NvshmemEfaGdaQueueCtrl, resv);
const OFF_READY: usize = offset_of!(NvshmemEfaGdaQueueCtrl, ready);
const OFF_DONE: usize = offset_of!(NvshmemEfaGdaQueueCtrl, done);
const OFF_CQ_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, cq_ci);
const OFF_ERRORS: usize = offset_of!(NvshmemEfaGdaQueueCtrl, errors);
const OFF_FIRST_ERROR: usize = offset_of!(NvshmemEfaGdaQueueCtrl, first_error);
const OFF_CQ_LOCK: usize = offset_of!(NvshmemEfaGdaQueueCtrl, cq_lock);
const OFF_RX_CI: usize = offset_of!(NvshmemEfaGdaQueueCtrl, rx_ci);
const OFF_HC_DONE: usize = offset_of!(NvshmemEfaGdaHostCtrl, done);
const OFF_RUNG: usize = offset_of!(NvshmemEfaGdaQueueCtrl, rung);
const OFF_DB_LOCK: usize = offset_of!(NvshmemEfaGdaQueueCtrl, db_lock);

/// Called by whichever poster polls a completion: the full producer count of the WQE it completes,
/// its status byte, and the 16 raw bytes of the CQE.
pub type CqeObserver = dyn Fn(u64, u8, &[u8; TX_CQE_SIZE]) + Send + Sync;

/// A CPU poster on a software queue whose control block is in host memory.
pub struct HostPoster<'q> {
    v: HostView,
    observer: Option<Arc<CqeObserver>>,
    timeout: Duration,
    duplicates: AtomicU64,
    queue: &'q SoftQueue,
}

impl<'q> HostPoster<'q> {
    /// A poster on `q`, which must have its control block in host memory
    /// ([`super::mem::CtrlPlacement::Host`], or no CUDA).
    pub fn new(q: &'q SoftQueue) -> Result<HostPoster<'q>> {
        Self::on_ring(q, 0)
    }

    /// A poster on ring `ring` of the queue (`SoftQueue::add_rings`; ring 0 is
    /// [`HostPoster::new`]'s).
    pub fn on_ring(q: &'q SoftQueue, ring: usize) -> Result<HostPoster<'q>> {
        if ring >= q.rings() {
            return Err(GdaError::invalid(format!(
                "ring {ring} of a software queue with {} rings",
                q.rings()
            )));
        }
        let v = q.ring_host_view(ring).ok_or_else(|| {
            GdaError::invalid(
                "the queue's control block is in GPU memory: create it with CtrlPlacement::Host",
            )
        })?;
        Ok(HostPoster {
            v,
            observer: None,
            timeout: Duration::from_secs(60),
            duplicates: AtomicU64::new(0),
            queue: q,
        })
    }

    /// Calls `f` for every completion any poster of this value reads.
    pub fn with_observer(mut self, f: Arc<CqeObserver>) -> Self {
        self.observer = Some(f);
        self
    }

    /// How long a wait may last before the poster reports the queue stuck (default 60 s).
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The queue's geometry.
    pub fn view(&self) -> &HostView {
        &self.v
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-byte aligned word of the control block, which the queue keeps alive for 'q.
        unsafe { mem::atomic_u64(self.v.ctrl.add(off)) }
    }

    fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: 4-byte aligned word of the control block.
        unsafe { mem::atomic_u32(self.v.ctrl.add(off)) }
    }

    fn status_word(&self, slot: u64) -> &AtomicU32 {
        // SAFETY: slot < sq_entries, inside the status array.
        unsafe { mem::atomic_u32(self.v.slot_status.add(slot as usize) as *mut u8) }
    }

    /// An error when the queue's consumer failed (nothing more will complete).
    fn check_alive(&self) -> Result<()> {
        match self.queue.failure() {
            Some(m) => Err(GdaError::io(format!(
                "host poster: the software queue failed: {m}"
            ))),
            None => Ok(()),
        }
    }

    /// Polls the CQ until `ready()`, backing off while nothing completes (then, with `alive`,
    /// checking the queue has not failed); fails with [`Self::stuck`] for `what` once the poster's
    /// timeout has passed since `start`.
    fn wait(
        &self,
        start: Instant,
        alive: bool,
        what: &str,
        ready: impl Fn() -> bool,
    ) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            if self.poll_cq() == 0 {
                if alive {
                    self.check_alive()?;
                }
                spins = spins.saturating_add(1);
                backoff(spins);
            }
            if start.elapsed() > self.timeout {
                return Err(self.stuck(what));
            }
        }
        Ok(())
    }

    fn stuck(&self, what: &str) -> GdaError {
        GdaError {
            code: -libc::ETIMEDOUT,
            message: format!(
                "host poster: {what} did not happen within {:?} (resv {}, ready {}, done {}, cq_ci {})",
                self.timeout,
                self.resv(),
                self.ready(),
                self.done(),
                self.word(OFF_CQ_CI).load(Ordering::Acquire)
            ),
        }
    }

    /// Posts `k` WQEs; `fill(pc, phase)` returns the 64 bytes for producer count `pc` (request id
    /// `pc as u16`, phase `phase` for a well-formed WQE). Returns the first producer count.
    pub fn post_with(
        &self,
        k: usize,
        mut fill: impl FnMut(u64, u8) -> [u8; WQE_SIZE],
    ) -> Result<u64> {
        let n = u64::from(self.v.sq_entries);
        if k == 0 {
            return Ok(self.ready());
        }
        if k as u64 > n {
            return Err(GdaError::invalid(format!(
                "cannot post {k} WQEs at once on a queue of {n}"
            )));
        }
        // 1. reserve
        let base = self.word(OFF_RESV).fetch_add(k as u64, Ordering::AcqRel);
        let end = base + k as u64;
        // 2. wait for free slots
        let start = Instant::now();
        self.wait(start, true, "free send-queue slots", || {
            end - self.word(OFF_DONE).load(Ordering::Acquire) <= n
        })?;
        // 2b. the doorbell window of the first B WQEs (ringing earlier posters' commits)
        let b = u64::from(self.v.max_batch.max(1)).min(n);
        let first_end = (base + b).min(end);
        let window = "the doorbell window (earlier posters' commits)";
        self.wait(start, false, window, || {
            self.ring();
            first_end - self.rung() <= b
        })?;
        // 3. write the first B WQEs
        self.write_entries(base, first_end, &mut fill);
        // 4. ordered commit; a large reservation, holding the turn, commits and rings what it has
        // written B at a time (`ready` moves through its own reservation), which opens the window
        // for its next B
        self.wait(start, true, "the ordered commit of earlier posters", || {
            self.word(OFF_READY).load(Ordering::Acquire) == base
        })?;
        let mut at = first_end;
        while at < end {
            self.word(OFF_READY).store(at, Ordering::Release);
            self.ring();
            let next = (at + b).min(end);
            self.wait(start, true, window, || {
                self.ring();
                next - self.rung() <= b
            })?;
            self.write_entries(at, next, &mut fill);
            at = next;
        }
        self.word(OFF_READY).store(end, Ordering::Release);
        // 4b. ring
        self.ring();
        Ok(base)
    }

    /// Writes the entries of producer counts `[from, to)`, then fences.
    fn write_entries(&self, from: u64, to: u64, fill: &mut impl FnMut(u64, u8) -> [u8; WQE_SIZE]) {
        let n = u64::from(self.v.sq_entries);
        let es = self.v.sq_entry_size as usize;
        let mut entry = [0u8; wqe::WQE_SIZE_128];
        for pc in from..to {
            let bytes = fill(pc, wqe::phase_for(pc, self.v.sq_entries));
            wqe::store_entry(&mut entry[..es], &bytes).expect("the queue checked its entry size");
            let slot = (pc & (n - 1)) as usize;
            // SAFETY: the slot lies inside the SQ ring; nobody else writes it until `done` passes pc.
            unsafe { mem::write_shared(self.v.sq.add(slot * es), &entry[..es]) };
        }
        fence(Ordering::SeqCst);
    }

    /// The full count of the last doorbell value (`ctrl.rung` holds its low 32 bits; it never
    /// passes `ctrl.ready`, read after it).
    fn rung(&self) -> u64 {
        let low = self.word32(OFF_RUNG).load(Ordering::Acquire);
        let ready = self.ready();
        ready - u64::from((ready as u32).wrapping_sub(low))
    }

    /// Stores `pc` into the doorbell and `ctrl.rung` under the doorbell lock (`pc` is past `rung`).
    fn store_doorbell(&self, pc: u64) {
        fence(Ordering::SeqCst);
        // SAFETY: the doorbell record lives in the queue's ring memory.
        unsafe { mem::atomic_u32(self.v.doorbell as *mut u8) }.store(pc as u32, Ordering::Release);
        fence(Ordering::SeqCst);
        self.word32(OFF_RUNG).store(pc as u32, Ordering::Release);
    }

    fn try_lock_doorbell(&self) -> bool {
        self.word32(OFF_DB_LOCK)
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    fn unlock_doorbell(&self) {
        self.word32(OFF_DB_LOCK).store(0, Ordering::Release);
    }

    /// 4b. Rings what is committed: stores `ctrl.ready` into the doorbell when it is past `rung`.
    /// Never waits for the doorbell lock: its holder looks at `ready` again after releasing it
    /// (this side: store `ready`, SeqCst fence, read the lock; the holder: release the lock, SeqCst
    /// fence, read `ready`; one of the two sees the other's store).
    fn ring(&self) {
        fence(Ordering::SeqCst);
        loop {
            if self.rung() >= self.ready() {
                return;
            }
            if !self.try_lock_doorbell() {
                return;
            }
            let ready = self.ready();
            let low = self.word32(OFF_RUNG).load(Ordering::Acquire);
            let rung = ready - u64::from((ready as u32).wrapping_sub(low));
            if ready > rung {
                self.store_doorbell(ready);
            }
            self.unlock_doorbell();
            fence(Ordering::SeqCst);
        }
    }

    /// Posts well-formed WQEs: each description gets request id and phase from its producer count.
    pub fn post(&self, descs: &[WqeDesc]) -> Result<u64> {
        let mut i = 0;
        self.post_with(descs.len(), |pc, phase| {
            let mut d = descs[i];
            i += 1;
            d.req_id = pc & 0xFFFF;
            d.req_id_64 = false;
            d.phase = phase;
            wqe::encode(&d)
        })
    }

    /// 5. Reads completions if no other poster holds the CQ lock; returns how many it read.
    pub fn poll_cq(&self) -> usize {
        let lock = self.word32(OFF_CQ_LOCK);
        if lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return 0;
        }
        let n = u64::from(self.v.cq_entries);
        let mask = u64::from(self.v.sq_entries - 1);
        let mut ci = self.word(OFF_CQ_CI).load(Ordering::Acquire);
        let done = self.word(OFF_DONE).load(Ordering::Acquire);
        let mut read = 0;
        loop {
            let entry = (ci & (n - 1)) as usize;
            // SAFETY: the entry lies inside the CQ ring.
            let p = unsafe { self.v.cq.add(entry * TX_CQE_SIZE) };
            // SAFETY: as above.
            let flags = unsafe { mem::atomic_u8(p.add(3)) }.load(Ordering::Acquire);
            if cqe::flags_phase(flags) != cqe::cq_expected_phase(ci, self.v.cq_entries) {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: 16-byte aligned entry inside the ring.
            let bytes: [u8; TX_CQE_SIZE] = unsafe { read_shared(p) };
            let req_id = u16::from_le_bytes([bytes[0], bytes[1]]);
            let status = bytes[2];
            let pc = done + u64::from(req_id.wrapping_sub(done as u16));
            let slot = u64::from(req_id) & mask;
            let w = self.status_word(slot);
            if w.load(Ordering::Acquire) != 0 {
                self.duplicates.fetch_add(1, Ordering::AcqRel);
            }
            w.store(u32::from(status) + 1, Ordering::Release);
            if status != 0 {
                self.word(OFF_ERRORS).fetch_add(1, Ordering::AcqRel);
                let _ = self.word32(OFF_FIRST_ERROR).compare_exchange(
                    0,
                    u32::from(status),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            if let Some(o) = &self.observer {
                o(pc, status, &bytes);
            }
            ci += 1;
            read += 1;
        }
        if read > 0 {
            self.word(OFF_CQ_CI).store(ci, Ordering::Release);
            let mut d = done;
            loop {
                let w = self.status_word(d & mask);
                if w.load(Ordering::Acquire) == 0 {
                    break;
                }
                w.store(0, Ordering::Relaxed);
                d += 1;
            }
            self.word(OFF_DONE).store(d, Ordering::Release);
            if !self.v.host_ctrl.is_null() {
                // SAFETY: the `done` word of the queue's host control block (8-byte aligned).
                unsafe { mem::atomic_u64(self.v.host_ctrl.add(OFF_HC_DONE)) }
                    .store(d, Ordering::Release);
            }
        }
        lock.store(0, Ordering::Release);
        read
    }

    /// Takes up to `max` receive completions and appends them to `out`. Any number of threads may
    /// call it: an entry is read, then claimed with a compare-and-swap of `ctrl.rx_ci` from its index
    /// to the next, and belongs to the caller only if the claim succeeds (the producer never rewrites
    /// an entry before `rx_ci` has passed it).
    pub fn poll_rx(
        &self,
        max: usize,
        out: &mut Vec<std::result::Result<RxCqe, cqe::CqeError>>,
    ) -> usize {
        let n = u64::from(self.v.rx_entries);
        let rx_ci = self.word(OFF_RX_CI);
        let mut taken = 0;
        while taken < max {
            let ci = rx_ci.load(Ordering::Acquire);
            // SAFETY: the entry lies inside the RX ring.
            let p = unsafe { self.v.rx.add((ci & (n - 1)) as usize * RX_CQE_EX_SIZE) };
            // SAFETY: as above.
            let flags = unsafe { mem::atomic_u8(p.add(3)) }.load(Ordering::Acquire);
            if cqe::flags_phase(flags) != cqe::cq_expected_phase(ci, self.v.rx_entries) {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: 32-byte entry inside the ring.
            let bytes: [u8; RX_CQE_EX_SIZE] = unsafe { read_shared(p) };
            if rx_ci
                .compare_exchange(ci, ci + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                out.push(cqe::decode_rx_ex(&bytes));
                taken += 1;
            }
        }
        taken
    }

    /// 6. Waits until everything committed before the call has completed; returns the error count.
    pub fn quiet(&self) -> Result<u64> {
        let target = self.ready();
        let start = Instant::now();
        let mut spins = 0u32;
        while self.done() < target {
            self.ring();
            if self.poll_cq() == 0 {
                self.check_alive()?;
                spins = spins.saturating_add(1);
                backoff(spins);
            }
            if start.elapsed() > self.timeout {
                return Err(self.stuck("quiet"));
            }
        }
        Ok(self.errors())
    }

    /// `ctrl.resv`.
    pub fn resv(&self) -> u64 {
        self.word(OFF_RESV).load(Ordering::Acquire)
    }
    /// `ctrl.ready`.
    pub fn ready(&self) -> u64 {
        self.word(OFF_READY).load(Ordering::Acquire)
    }
    /// `ctrl.done`.
    pub fn done(&self) -> u64 {
        self.word(OFF_DONE).load(Ordering::Acquire)
    }
    /// `ctrl.errors`.
    pub fn errors(&self) -> u64 {
        self.word(OFF_ERRORS).load(Ordering::Acquire)
    }
    /// `ctrl.first_error`.
    pub fn first_error(&self) -> u32 {
        self.word32(OFF_FIRST_ERROR).load(Ordering::Acquire)
    }
    /// Completions that hit a slot already marked (must stay 0: one completion per WQE).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Acquire)
    }
}

fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else if spins < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}
