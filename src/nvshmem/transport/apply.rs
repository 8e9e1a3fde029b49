//! A coalesced message's records ([`super::wire::AM_PUT_MULTI`]) applied at the target.
//!
//! The records between two fences (`REC_FENCED`) form an epoch: NVSHMEM orders nothing among
//! them, so they land together, and an epoch lands in full before the next one starts.
//!
//! Where the endpoint has the copy kernel (`kstage`) and every record is a put into GPU memory
//! registered here or a non-fetching AMO on such a word, the whole message is one launch (up to
//! [`COPY_MAX`] records a launch): the puts as copies out of the receive buffer, the AMOs as the
//! GPU's own atomics, every fence kept inside the launch ([`crate::cuda::kernel::DESC_FENCE`]:
//! the block meets at a barrier after a system-scope fence). Otherwise (host memory, a word of
//! this CQ read's AMO batch, a launch taken over because the application's kernels hold every SM)
//! the host applies it: the message's AMO words in GPU memory read with one batch of copies, and
//! per epoch the puts into GPU memory and the words' new values as one copy, waited for; host
//! memory written at once. A message in which a put touches a word that one of its AMOs updates
//! goes record by record, so each sees the other in message order.
//!
//! Before, each AMO record into GPU memory cost two synchronous driver copies (read, write) and a
//! flush of the puts before it: 20-25 us per AMO on the progress thread (results/gpu-2026-11-29b,
//! `amo` rows).
use super::abi::amo;
use super::amo::{compute_amo, AmoBatch};
use super::endpoints::EpState;
use super::kstage::{Copy3, KERNEL_COPY_MAX};
use super::memory::{copy_any, copy_many};
use super::wire::{parse_records, read_amo_record, REC_AMO, REC_FENCED};
use super::{abi, Transport};
use crate::cuda::kernel::{amo_desc, desc_len, AmoOp, COPY_MAX, DESC_FENCE};
use crate::mover::kcopy::MAX_LAUNCH_BYTES;

/// A parsed record: target address, offset of its data in the payload, length, flags.
type Rec = (u64, usize, usize, u32);

/// One AMO word of a message: address, size, value, written since the last flush, GPU memory,
/// offset in the payload of the data of the last record that changed it (its new value goes there,
/// and from there to the word).
struct Word {
    addr: u64,
    size: u32,
    val: u64,
    dirty: bool,
    device: bool,
    at: usize,
}

impl Transport {
    /// Applies the records of a coalesced put message (`count` announced) from PE `src_pe`,
    /// epoch by epoch (see the module). `amos`: this CQ read's batch of AMO words (AMO requests);
    /// a record on one of its words is applied into it. Returns the status to answer with (the
    /// first failure's; the other records still land).
    pub(super) fn apply_records(
        &self,
        e: &EpState,
        payload: &mut [u8],
        count: u32,
        src_pe: i64,
        amos: Option<&mut AmoBatch<'_>>,
    ) -> i32 {
        let recs = match parse_records(payload, count) {
            Ok(r) => r,
            Err(err) => {
                tracing::error!("coalesced puts from PE {src_pe}: {err}; none applied");
                return abi::status::INVALID_VALUE;
            }
        };
        // The copy kernel applies what it can (all of it, or the records before a launch the host
        // took over); the host the rest.
        let done = self.apply_by_kernel(e, payload, &recs, amos.as_deref());
        if done == recs.len() {
            return 0;
        }
        self.apply_on_host(e, payload, &recs[done..], src_pe, amos)
    }

    /// The records `recs` of a message, applied by the host: GPU puts and AMO words in batches
    /// per epoch (see the module).
    fn apply_on_host(
        &self,
        e: &EpState,
        payload: &mut [u8],
        recs: &[Rec],
        src_pe: i64,
        mut amos: Option<&mut AmoBatch<'_>>,
    ) -> i32 {
        let mut status = 0;
        // The message's AMO words outside the CQ read's batch, with their registrations.
        let mut words: Vec<Word> = Vec::new();
        for &(addr, off, _, flags) in recs {
            if flags & REC_AMO == 0 {
                continue;
            }
            let (_, size, _) = read_amo_record(&payload[off..off + 16]);
            let in_batch = amos.as_deref().is_some_and(|b| b.holds(addr, size));
            if in_batch || words.iter().any(|w| w.addr == addr && w.size == size) {
                continue;
            }
            if (size != 4 && size != 8) || addr % size as u64 != 0 {
                continue; // refused record by record below
            }
            if let Some(r) = self.find_registration(addr, size as u64) {
                words.push(Word {
                    addr,
                    size,
                    val: 0,
                    dirty: false,
                    device: r.device,
                    at: 0,
                });
            }
        }
        if !words.is_empty() && puts_touch_words(recs, &words) {
            return self.apply_records_in_turn(e, payload, recs, src_pe, amos);
        }
        // Target-applied AMOs are serialised under one lock (the batch holds it already).
        let _lock = (amos.is_none() && !words.is_empty()).then(|| self.am_lock.lock());
        if let Err(err) = read_words(&mut words) {
            tracing::warn!(
                "coalesced puts from PE {src_pe}: AMO words not read in one batch ({}); record by \
                 record",
                err.message
            );
            drop(_lock);
            return self.apply_records_in_turn(e, payload, recs, src_pe, amos);
        }
        let mut device: Vec<(u64, u64, usize)> = Vec::new();
        let mut batch_dirty = false;
        let base = payload.as_ptr() as u64;
        for (k, &(addr, off, len, flags)) in recs.iter().enumerate() {
            if k > 0 && flags & REC_FENCED != 0 {
                // Everything before the fence lands first.
                self.flush_epoch(e, payload, &mut words, &mut device, src_pe, &mut status);
                if batch_dirty {
                    if let Some(b) = amos.as_deref_mut() {
                        if let Err(err) = self.amo_batch_write_back(b) {
                            tracing::error!("AMO from PE {src_pe}: {}", err.message);
                            status = err.status;
                        }
                    }
                    batch_dirty = false;
                }
            }
            if flags & REC_AMO != 0 {
                let (op, size, val) = read_amo_record(&payload[off..off + len]);
                if let Some(w) = words.iter_mut().find(|w| w.addr == addr && w.size == size) {
                    let mask = if size == 4 { 0xffff_ffff } else { u64::MAX };
                    match compute_amo(op, w.val & mask, val & mask, 0) {
                        Ok(new) => {
                            w.val = new & mask;
                            w.dirty = true;
                            w.at = off + 8;
                        }
                        Err(err) => {
                            tracing::error!("AMO from PE {src_pe}: {}", err.message);
                            status = err.status;
                        }
                    }
                    continue;
                }
                // A word of the CQ read's batch, or one refused here with its reason.
                let batch = amos.as_deref_mut();
                batch_dirty |=
                    self.amo_record_alone(op, size, addr, val, batch, src_pe, &mut status);
                continue;
            }
            let src = base + off as u64;
            self.land_put(addr, src, len, src_pe, &mut device, &mut status);
        }
        self.flush_epoch(e, payload, &mut words, &mut device, src_pe, &mut status);
        status
    }

    /// Applies the leading records of `recs` with the copy kernel (put records and AMO records
    /// in order, every fence kept inside a launch: [`crate::cuda::kernel::DESC_FENCE`]), where
    /// the endpoint has it and every record is a put into GPU memory registered here or a
    /// non-fetching AMO on such a word outside this CQ read's batch `amos`. Launches of up to
    /// [`COPY_MAX`] records, each waited for; returns how many records were applied (0: none went
    /// this way; fewer than all: a launch was taken over at the stuck limit, the host applies the
    /// rest). The kernel's atomics are the GPU's own: atomic against the GPU's atomics on the word,
    /// and serialised with the host's target-applied AMOs by the AMO lock.
    fn apply_by_kernel(
        &self,
        e: &EpState,
        payload: &[u8],
        recs: &[Rec],
        amos: Option<&AmoBatch<'_>>,
    ) -> usize {
        if e.kstage.lock().is_none() {
            return 0;
        }
        let base = payload.as_ptr() as u64;
        let mut descs: Vec<Copy3> = Vec::with_capacity(recs.len());
        let mut any_amo = false;
        for &(addr, off, len, flags) in recs {
            let fence = if flags & REC_FENCED != 0 {
                DESC_FENCE
            } else {
                0
            };
            if flags & REC_AMO != 0 {
                let (op, size, val) = read_amo_record(&payload[off..off + len]);
                let kop = match op {
                    amo::INC => Some((AmoOp::Add, 1)),
                    amo::ADD | amo::SIGNAL_ADD => Some((AmoOp::Add, val)),
                    amo::SET | amo::SIGNAL | amo::SIGNAL_SET => Some((AmoOp::Set, val)),
                    amo::AND => Some((AmoOp::And, val)),
                    amo::OR => Some((AmoOp::Or, val)),
                    amo::XOR => Some((AmoOp::Xor, val)),
                    _ => None,
                };
                let ok = (size == 4 || size == 8)
                    && addr % size as u64 == 0
                    && !amos.is_some_and(|b| b.holds(addr, size))
                    && self
                        .find_registration(addr, size as u64)
                        .is_some_and(|r| r.device);
                let (Some((kop, v)), true) = (kop, ok) else {
                    return 0;
                };
                let (d, s, w) = amo_desc(addr, kop, size, v);
                descs.push((d, s, w | fence));
                any_amo = true;
                continue;
            }
            if len > KERNEL_COPY_MAX
                || !self
                    .find_registration(addr, len as u64)
                    .is_some_and(|r| r.device)
            {
                return 0;
            }
            descs.push((addr, base + off as u64, len | fence));
        }
        // Target-applied AMOs are serialised under one lock (the batch holds it already). The AMO
        // lock is taken before the launches' (the order of the CQ batch and `copy_in_now`).
        let _lock = (any_amo && amos.is_none()).then(|| self.am_lock.lock());
        let mut ks = e.kstage.lock();
        let Some(ks) = ks.as_mut() else {
            return 0;
        };
        let mut done = 0;
        while done < descs.len() {
            let mut n = 0;
            let mut bytes = 0;
            while done + n < descs.len() && n < COPY_MAX {
                let b = desc_len(descs[done + n].2);
                if n > 0 && bytes + b > MAX_LAUNCH_BYTES {
                    break;
                }
                bytes += b;
                n += 1;
            }
            // SAFETY: the payload lies in the receive buffer (a mapped slab: the endpoint has a
            // KStage only then), reserved until this message is handled; the destinations are GPU
            // memory registered here; copy_now returns once the launch is decided (a taken-over
            // one never touches them).
            if !unsafe { ks.copy_now(&descs[done..done + n]) } {
                break;
            }
            done += n;
        }
        done
    }

    /// A put record of `len` bytes from `src` (in the receive buffer) to `addr`: GPU memory joins
    /// `device` (landed with its epoch), host memory is written at once; unregistered: refused.
    fn land_put(
        &self,
        addr: u64,
        src: u64,
        len: usize,
        src_pe: i64,
        device: &mut Vec<Copy3>,
        status: &mut i32,
    ) {
        match self.find_registration(addr, len as u64) {
            None => {
                tracing::error!(
                    "staged put from PE {src_pe}: {addr:#x}+{len} is not registered here"
                );
                *status = abi::status::INVALID_VALUE;
            }
            Some(r) if r.device => device.push((addr, src, len)),
            Some(_) => {
                if let Err(err) = copy_any(addr as *mut u8, src as *const u8, len) {
                    tracing::error!("staged put from PE {src_pe}: {}", err.message);
                    *status = err.status;
                }
            }
        }
    }

    /// An AMO record applied on its own (into the CQ read's batch `batch` when it holds the word);
    /// returns whether it changed the batch (written back before a fence).
    #[allow(clippy::too_many_arguments)]
    fn amo_record_alone(
        &self,
        op: i32,
        size: u32,
        addr: u64,
        val: u64,
        batch: Option<&mut AmoBatch<'_>>,
        src_pe: i64,
        status: &mut i32,
    ) -> bool {
        let in_batch = batch.as_ref().is_some_and(|b| b.holds(addr, size));
        if let Err(err) = self.apply_local_amo(op, size, addr, val, 0, batch) {
            tracing::error!("AMO from PE {src_pe}: {}", err.message);
            *status = err.status;
        }
        in_batch
    }

    /// Lands an epoch: the new values of the AMO words it changed (GPU words through the
    /// payload, with the puts), the puts into GPU memory as one copy, waited for.
    fn flush_epoch(
        &self,
        e: &EpState,
        payload: &mut [u8],
        words: &mut [Word],
        device: &mut Vec<(u64, u64, usize)>,
        src_pe: i64,
        status: &mut i32,
    ) {
        let base = payload.as_ptr() as u64;
        for w in words.iter_mut().filter(|w| w.dirty) {
            w.dirty = false;
            if w.device {
                // The last record that changed the word carries its final value to it.
                payload[w.at..w.at + 8].copy_from_slice(&w.val.to_le_bytes());
                device.push((w.addr, base + w.at as u64, w.size as usize));
            } else {
                super::amo::store_host_word(w.addr, w.size, w.val);
            }
        }
        if device.is_empty() {
            return;
        }
        // One launch of the copy kernel where the endpoint has it (`kstage`); every destination
        // here was found registered as GPU memory.
        if let Err(err) = self.copy_in_now(e, device, true) {
            tracing::error!("staged put from PE {src_pe}: {}", err.message);
            *status = err.status;
        }
        device.clear();
    }

    /// The way before: record by record, puts into GPU memory as one batch with one wait flushed
    /// before each AMO record, puts into host memory at once, each AMO applied alone.
    fn apply_records_in_turn(
        &self,
        e: &EpState,
        payload: &[u8],
        recs: &[Rec],
        src_pe: i64,
        mut amos: Option<&mut AmoBatch<'_>>,
    ) -> i32 {
        let mut status = 0;
        let mut batch_dirty = false;
        let mut device: Vec<(u64, u64, usize)> = Vec::new();
        let flush = |device: &mut Vec<(u64, u64, usize)>, status: &mut i32| {
            if !device.is_empty() {
                if let Err(err) = self.copy_in_now(e, device, true) {
                    tracing::error!("staged put from PE {src_pe}: {}", err.message);
                    *status = err.status;
                }
                device.clear();
            }
        };
        for &(addr, off, len, flags) in recs {
            if flags & REC_AMO != 0 {
                // After every put before it in the message (the GPU ones land first).
                flush(&mut device, &mut status);
                let (op, size, val) = read_amo_record(&payload[off..off + len]);
                let batch = amos.as_deref_mut();
                batch_dirty |=
                    self.amo_record_alone(op, size, addr, val, batch, src_pe, &mut status);
                continue;
            }
            if flags & REC_FENCED != 0 {
                flush(&mut device, &mut status);
                if std::mem::take(&mut batch_dirty) {
                    if let Some(b) = amos.as_deref_mut() {
                        if let Err(err) = self.amo_batch_write_back(b) {
                            tracing::error!("AMO from PE {src_pe}: {}", err.message);
                            status = err.status;
                        }
                    }
                }
            }
            let src = payload[off..off + len].as_ptr();
            self.land_put(addr, src as u64, len, src_pe, &mut device, &mut status);
        }
        flush(&mut device, &mut status);
        status
    }
}

/// Whether a put record of `recs` overlaps one of `words`.
fn puts_touch_words(recs: &[Rec], words: &[Word]) -> bool {
    let mut at: Vec<(u64, u64)> = words.iter().map(|w| (w.addr, w.size as u64)).collect();
    at.sort_unstable();
    recs.iter()
        .filter(|r| r.3 & REC_AMO == 0)
        .any(|&(addr, _, len, _)| {
            let end = addr.saturating_add(len as u64);
            // The first word that ends after the put starts (words do not overlap: at most 8 bytes).
            let k = at.partition_point(|&(a, s)| a + s <= addr);
            at.get(k).is_some_and(|&(a, _)| a < end)
        })
}

/// Reads the current values of `words`: GPU words with one batch of copies, host words with atomic
/// loads.
fn read_words(words: &mut [Word]) -> super::TResult<()> {
    let mut vals = vec![0u64; words.len()];
    let copies: Vec<(u64, u64, usize)> = words
        .iter()
        .zip(vals.iter_mut())
        .filter(|(w, _)| w.device)
        .map(|(w, v)| (v as *mut u64 as u64, w.addr, w.size as usize))
        .collect();
    if !copies.is_empty() {
        copy_many(&copies, true)?;
    }
    for (w, v) in words.iter_mut().zip(vals) {
        // Little-endian: a 4-byte word read into a u64 lands in its low half.
        w.val = if w.device {
            v
        } else {
            super::amo::load_host_word(w.addr, w.size)
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(addr: u64, size: u32) -> Word {
        Word {
            addr,
            size,
            val: 0,
            dirty: false,
            device: false,
            at: 0,
        }
    }

    #[test]
    fn puts_that_touch_an_amo_word_are_found() {
        let words = [word(0x1000, 8), word(0x2000, 4)];
        let put = |addr: u64, len: usize| vec![(addr, 0usize, len, 0u32)];
        assert!(!puts_touch_words(&put(0x1008, 64), &words));
        assert!(!puts_touch_words(&put(0x0ff8, 8), &words));
        assert!(puts_touch_words(&put(0x0ff8, 9), &words));
        assert!(puts_touch_words(&put(0x1004, 1), &words));
        assert!(puts_touch_words(&put(0x1f00, 0x101), &words));
        assert!(!puts_touch_words(&put(0x2004, 4), &words));
        // AMO records are not puts.
        assert!(!puts_touch_words(&[(0x1000, 0, 16, REC_AMO)], &words));
    }
}
