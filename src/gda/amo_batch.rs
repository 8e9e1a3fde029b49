//! AMO messages on GPU words applied as a batch.
//!
//! The software queue's receiving thread, and the hardware queue's receive thread
//! ([`super::hw_rx`]), apply every AMO message their PE receives ([`super::apply`]). A GPU word costs a read-modify-write through the driver: a copy to the host,
//! the operation, a copy back, each copy waited for. On the GPU node under DeepEP's low-latency
//! kernels one such AMO took about 146 us (inferred: 21 ms per dispatch with 144 counts received,
//! 2.3 ms with 16), and since the one receiving thread waits through it, the counts alone took the
//! whole dispatch (results/gpu-2026-11-28d).
//!
//! A batch takes the AMOs of one CQ read (in arrival order), reads each distinct word once (one
//! batch of copies, one wait), applies the operations in arrival order to the host copies, and writes
//! the words back (one batch, one wait): two waits per CQ read instead of two per AMO. GPU words
//! that touch (a count array: one word ends where the next begins) are read and written as one
//! range, one copy each way: a copy costs the receiving thread a driver call of a few
//! microseconds, which for a batch of 25-62 counts was most of its 100-300 us (GPU node,
//! docs/gda-amo-path.md).
//! Host words go the same way with host atomic loads and stores made at once ([`Words`]), so the
//! host-memory tests run this path too.
//!
//! Exactness is that of the one-by-one path: one thread applies every AMO of the PE, and nothing
//! else writes these words while AMOs fly (the device API's contract, see [`super::apply`]); a word
//! touched by several AMOs of a batch is read once and written once with all of them applied in
//! order. Words of a batch that overlap without being the same word (a 4-byte AMO inside an
//! 8-byte one) would not compose through separate host copies: such a batch is applied one AMO at a
//! time, in order.
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::apply::amo_result;
use super::wire::AmoMsg;

/// How a batch reads and writes words: reads and writes are enqueued (or made at once), then
/// waited for together.
pub trait WordIo {
    /// Enqueues the read of the `size`-byte word at host-usable address `word` (GPU memory when
    /// `device`) into `out`. For GPU memory `size` may also be a run of adjacent words (any length);
    /// host words come one at a time (4 or 8 bytes).
    ///
    /// # Safety
    /// `word` must be a valid, `size`-aligned word and `out` valid for `size` bytes until
    /// [`WordIo::wait`] returned.
    unsafe fn read(
        &mut self,
        word: u64,
        size: u32,
        device: bool,
        out: *mut u8,
    ) -> Result<(), String>;
    /// Enqueues the write of `size` bytes from `val` into the word at `word`.
    ///
    /// # Safety
    /// As [`WordIo::read`], `val` valid for `size` bytes until `wait` returned.
    unsafe fn write(
        &mut self,
        word: u64,
        size: u32,
        device: bool,
        val: *const u8,
    ) -> Result<(), String>;
    /// Waits for every read and write enqueued.
    fn wait(&mut self) -> Result<(), String>;
}

/// The software queue's words: GPU words through a CUDA copy batch (none: GPU words fail),
/// host words with host atomics, made at once.
pub struct Words<'a>(pub Option<&'a mut crate::cuda::CopyBatch>);

impl Words<'_> {
    fn gpu(&mut self) -> Result<&mut crate::cuda::CopyBatch, String> {
        self.0
            .as_deref_mut()
            .ok_or_else(|| "no CUDA copy batch for a GPU word".to_string())
    }
}

impl WordIo for Words<'_> {
    unsafe fn read(
        &mut self,
        word: u64,
        size: u32,
        device: bool,
        out: *mut u8,
    ) -> Result<(), String> {
        if device {
            // SAFETY: forwarded to the caller.
            return unsafe {
                self.gpu()?
                    .copy(out.cast(), word as *const _, size as usize)
            }
            .map_err(|e| e.to_string());
        }
        // SAFETY: the caller's word, aligned (checked when the message was parsed).
        let v = unsafe { host_load(word, size) };
        // SAFETY: `out` is valid for `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), out, size as usize) };
        Ok(())
    }

    unsafe fn write(
        &mut self,
        word: u64,
        size: u32,
        device: bool,
        val: *const u8,
    ) -> Result<(), String> {
        if device {
            // SAFETY: forwarded to the caller.
            return unsafe { self.gpu()?.copy(word as *mut _, val.cast(), size as usize) }
                .map_err(|e| e.to_string());
        }
        let mut b = [0u8; 8];
        // SAFETY: `val` is valid for `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(val, b.as_mut_ptr(), size as usize) };
        // SAFETY: as in `read`.
        unsafe { host_store(word, size, u64::from_le_bytes(b)) };
        Ok(())
    }

    fn wait(&mut self) -> Result<(), String> {
        match self.0.as_deref_mut() {
            Some(b) => b.wait().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// # Safety
/// `word` is a valid `size`-aligned host word (4 or 8 bytes).
unsafe fn host_load(word: u64, size: u32) -> u64 {
    // SAFETY: forwarded to the caller.
    unsafe {
        if size == 8 {
            super::mem::atomic_u64(word as *mut u8).load(Ordering::Acquire)
        } else {
            u64::from(super::mem::atomic_u32(word as *mut u8).load(Ordering::Acquire))
        }
    }
}

/// # Safety
/// As [`host_load`].
unsafe fn host_store(word: u64, size: u32, v: u64) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if size == 8 {
            super::mem::atomic_u64(word as *mut u8).store(v, Ordering::Release)
        } else {
            super::mem::atomic_u32(word as *mut u8).store(v as u32, Ordering::Release)
        }
    }
}

/// What a receiving thread keeps to apply its batches: the copies of GPU words and page-locked
/// room for their values, both made at the first batch with a GPU word.
#[derive(Default)]
pub struct Applier {
    /// `Some(None)`: CUDA takes no copies here (GPU words then go one by one).
    copies: Option<Option<crate::cuda::CopyBatch>>,
    /// `Some(Err)`: no page-locked memory could be had (pageable memory then, one copy at a time).
    words: Option<Result<crate::cuda::MappedHostBuffer, ()>>,
    /// The last [`WATCH_WORDS`] distinct words batches wrote and their values, oldest first, when
    /// watched ([`Applier::watch`]; `None`: not watched).
    watched: Option<std::collections::VecDeque<WordValue>>,
}

/// A word an AMO batch wrote back, and the value it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WordValue {
    /// Host-usable address.
    pub addr: u64,
    /// 4 or 8 bytes.
    pub size: u32,
    /// GPU memory.
    pub device: bool,
    /// The value written (zero-extended).
    pub value: u64,
}

impl WordValue {
    /// The value as a signed integer of the word's size (counts such as DeepEP's are negative).
    pub fn signed(&self, v: u64) -> i64 {
        if self.size == 4 {
            i64::from(v as u32 as i32)
        } else {
            v as i64
        }
    }
}

/// Words an [`Applier`] keeps watching: the last this many distinct words it wrote.
pub const WATCH_WORDS: usize = 64;

/// Page-locked bytes for one batch's GPU words (8 per distinct word: 4096 words; a batch with more
/// uses pageable memory).
const SCRATCH_BYTES: usize = 32 << 10;

impl Applier {
    /// Applies `batch` (empty after) as [`AmoBatch::apply`], each AMO alone through
    /// [`super::apply::apply_checked`] where the batch cannot be applied together. `who` names the
    /// thread in log lines.
    pub fn apply<T>(&mut self, batch: &mut AmoBatch<T>, who: &str) -> Applied<T> {
        let gpu = batch.has_gpu_words();
        if gpu && self.copies.is_none() {
            self.copies = Some(crate::cuda::CopyBatch::new().ok());
        }
        if gpu && self.words.is_none() {
            self.words = Some(
                crate::cuda::MappedHostBuffer::new(SCRATCH_BYTES).map_err(|e| {
                    tracing::warn!(
                        "{who}: no page-locked memory for AMO batches ({e}); their GPU words go \
                     through pageable memory, one copy at a time"
                    );
                }),
            );
        }
        let scratch = match &self.words {
            // SAFETY: this applier's own buffer of `len` bytes, used by this call only and neither
            // dropped nor moved while the slice lives.
            Some(Ok(b)) if gpu => {
                Some(unsafe { std::slice::from_raw_parts_mut(b.host(), b.len()) })
            }
            _ => None,
        };
        let io = if gpu {
            self.copies.as_mut().and_then(|c| c.as_mut())
        } else {
            None
        };
        let mut single = |m: &AmoMsg, addr: u64, device: bool| match super::apply::apply_checked(
            *m, addr, device,
        ) {
            super::apply::Outcome::Rejected { why, .. } => Err(why),
            _ => Ok(()),
        };
        let Some(watched) = self.watched.as_mut() else {
            return batch.apply(&mut Words(io), scratch, &mut single);
        };
        let mut written = Vec::new();
        let done = batch.apply_noting(&mut Words(io), scratch, &mut single, Some(&mut written));
        for w in written {
            watched.retain(|o| o.addr != w.addr);
            if watched.len() == WATCH_WORDS {
                watched.pop_front();
            }
            watched.push_back(w);
        }
        done
    }

    /// Starts (`true`) or stops keeping the last [`WATCH_WORDS`] words written, for
    /// [`Applier::changed`] (a debug aid: an application that waits for a count this thread wrote
    /// shows whether the count is still there).
    pub fn watch(&mut self, on: bool) {
        if on != self.watched.is_some() {
            self.watched = on.then(Default::default);
        }
    }

    /// Reads the watched words again: how many are watched, and each whose value is no longer the
    /// one written, with its value now. GPU words are read with one batch of copies (none here
    /// before the first GPU word was written: then none is watched).
    pub fn changed(&mut self) -> Result<(usize, Vec<(WordValue, u64)>), String> {
        let Some(watched) = self.watched.as_ref() else {
            return Ok((0, Vec::new()));
        };
        let mut now = vec![0u64; watched.len()];
        let mut io = Words(self.copies.as_mut().and_then(|c| c.as_mut()));
        for (w, v) in watched.iter().zip(now.iter_mut()) {
            // SAFETY: the word was written by a batch of this applier (a local heap word, which
            // stays allocated while the queue lives); `now` is not moved until the wait returned.
            unsafe { io.read(w.addr, w.size, w.device, (v as *mut u64).cast())? };
        }
        io.wait()?;
        let changed = watched
            .iter()
            .zip(now)
            .filter(|(w, v)| *v != w.value)
            .map(|(w, v)| (*w, v))
            .collect();
        Ok((watched.len(), changed))
    }
}

/// AMO messages gathered for one batch, each with its word (host-usable address, whether GPU
/// memory) and a tag of the caller's (its receive buffer).
pub struct AmoBatch<T> {
    ops: Vec<(AmoMsg, u64, bool, T)>,
}

impl<T> Default for AmoBatch<T> {
    fn default() -> Self {
        AmoBatch { ops: Vec::new() }
    }
}

/// What a batch did: its AMOs' tags with `Ok` or the error that kept each from being applied.
pub type Applied<T> = Vec<(AmoMsg, T, Result<(), String>)>;

impl<T> AmoBatch<T> {
    /// Adds AMO `m` on the word at host-usable address `addr` (GPU memory when `device`).
    pub fn push(&mut self, m: AmoMsg, addr: u64, device: bool, tag: T) {
        self.ops.push((m, addr, device, tag));
    }

    /// AMOs gathered.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether a GPU word is among them.
    pub fn has_gpu_words(&self) -> bool {
        self.ops.iter().any(|o| o.2)
    }

    /// Whether none is gathered.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Applies the gathered AMOs (the batch is empty after) and returns each with its result.
    /// `single` applies one AMO alone (the one-by-one path), used when the words overlap or the
    /// batch read failed (then nothing was written yet). `scratch`: page-locked bytes for the
    /// words' values (8 per distinct word; too small or none: a vector of this call).
    pub fn apply(
        &mut self,
        io: &mut dyn WordIo,
        scratch: Option<&mut [u8]>,
        single: &mut dyn FnMut(&AmoMsg, u64, bool) -> Result<(), String>,
    ) -> Applied<T> {
        self.apply_noting(io, scratch, single, None)
    }

    /// [`AmoBatch::apply`], and where `written_out` is given, each word a batch wrote back with the
    /// value it wrote (words the one-by-one path applies are not noted).
    fn apply_noting(
        &mut self,
        io: &mut dyn WordIo,
        scratch: Option<&mut [u8]>,
        single: &mut dyn FnMut(&AmoMsg, u64, bool) -> Result<(), String>,
        written_out: Option<&mut Vec<WordValue>>,
    ) -> Applied<T> {
        let ops = std::mem::take(&mut self.ops);
        if ops.is_empty() {
            return Vec::new();
        }
        // Distinct words, in order of first use.
        let mut index: HashMap<u64, usize> = HashMap::with_capacity(ops.len());
        let mut words: Vec<(u64, u32, bool)> = Vec::new();
        let mut clash = false;
        for (m, addr, device, _) in &ops {
            let i = *index.entry(*addr).or_insert_with(|| {
                words.push((*addr, m.size, *device));
                words.len() - 1
            });
            clash |= words[i].1 != m.size;
        }
        // The words in address order: for the overlap check and for the ranges below.
        let mut by_addr: Vec<usize> = (0..words.len()).collect();
        by_addr.sort_unstable_by_key(|&k| words[k].0);
        clash = clash
            || by_addr
                .windows(2)
                .any(|w| words[w[0]].0 + u64::from(words[w[0]].1) > words[w[1]].0);
        if clash {
            return one_by_one(ops, single);
        }
        // Where each word's bytes (little-endian, `size` of them) live on the host, and the ranges
        // copied: GPU words that touch (one ends where the next begins: a count array) share one
        // range, read with one copy and written back with one (a driver call costs a few us
        // each, more than the bytes); host words have ranges of their own. Nothing between words
        // is copied: a range holds only words of this batch, and every word of a batch is
        // written (each has an AMO).
        let mut loc = vec![0usize; words.len()];
        // (address, host offset, bytes, GPU memory)
        let mut ranges: Vec<(u64, usize, usize, bool)> = Vec::new();
        let mut end = 0usize;
        for &k in &by_addr {
            let (addr, size, device) = words[k];
            let size = size as usize;
            match ranges.last_mut() {
                Some(r) if device && r.3 && r.0 + r.2 as u64 == addr => {
                    loc[k] = r.1 + r.2;
                    r.2 += size;
                    end += size;
                }
                _ => {
                    let at = end.next_multiple_of(8);
                    loc[k] = at;
                    ranges.push((addr, at, size, device));
                    end = at + size;
                }
            }
        }
        // In the caller's scratch when it has room (page-locked memory, so the copies are
        // asynchronous and one wait covers them), else in a vector of this call.
        let mut own = Vec::new();
        let vals: &mut [u8] = match scratch {
            Some(b) if b.len() >= end => &mut b[..end],
            _ => {
                own.resize(end, 0u8);
                &mut own
            }
        };
        let read = (|| {
            for &(addr, at, len, device) in &ranges {
                // SAFETY: every word of the range lies in a local heap chunk (checked by
                // `check_message`), which stays allocated while the queue lives, and the range is
                // those words and nothing else; `vals` is neither moved nor resized until the wait
                // below returned.
                unsafe { io.read(addr, len as u32, device, vals[at..].as_mut_ptr())? };
            }
            io.wait()
        })();
        if let Err(why) = read {
            tracing::warn!(
                "AMO batch: {} word(s) not read in one batch ({why}); each AMO alone",
                words.len()
            );
            // Nothing was written: the one-by-one path applies every AMO exactly once.
            return one_by_one(ops, single);
        }
        for (m, addr, _, _) in &ops {
            let k = index[addr];
            let n = m.size as usize;
            let at = loc[k]..loc[k] + n;
            let mut bytes = [0u8; 8];
            bytes[..n].copy_from_slice(&vals[at.clone()]);
            let old = u64::from_le_bytes(bytes);
            vals[at].copy_from_slice(&amo_result(m, old).to_le_bytes()[..n]);
        }
        let written = (|| {
            for &(addr, at, len, device) in &ranges {
                // SAFETY: as above; the host bytes stay put until the wait returned.
                unsafe { io.write(addr, len as u32, device, vals[at..].as_ptr())? };
            }
            io.wait()
        })();
        if let (Ok(()), Some(w)) = (&written, written_out) {
            for (k, &(addr, size, device)) in words.iter().enumerate() {
                let mut bytes = [0u8; 8];
                bytes[..size as usize].copy_from_slice(&vals[loc[k]..loc[k] + size as usize]);
                w.push(WordValue {
                    addr,
                    size,
                    device,
                    value: u64::from_le_bytes(bytes),
                });
            }
        }
        let result = written.map_err(|why| format!("AMO batch write-back failed: {why}"));
        ops.into_iter()
            .map(|(m, _, _, tag)| (m, tag, result.clone()))
            .collect()
    }
}

fn one_by_one<T>(
    ops: Vec<(AmoMsg, u64, bool, T)>,
    single: &mut dyn FnMut(&AmoMsg, u64, bool) -> Result<(), String>,
) -> Applied<T> {
    ops.into_iter()
        .map(|(m, addr, device, tag)| {
            let r = single(&m, addr, device);
            (m, tag, r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gda::wire::{AMO_OP_ADD, AMO_OP_SET};

    /// Host memory standing in for GPU words: reads and writes are queued and made at `wait`,
    /// counted.
    #[derive(Default)]
    struct Queued {
        pending: Vec<(u64, u64, usize)>,
        waits: usize,
        copies: usize,
        fail_read: bool,
    }

    impl WordIo for Queued {
        unsafe fn read(
            &mut self,
            word: u64,
            size: u32,
            _: bool,
            out: *mut u8,
        ) -> Result<(), String> {
            if self.fail_read {
                return Err("injected".into());
            }
            self.pending.push((out as u64, word, size as usize));
            Ok(())
        }
        unsafe fn write(
            &mut self,
            word: u64,
            size: u32,
            _: bool,
            val: *const u8,
        ) -> Result<(), String> {
            self.pending.push((word, val as u64, size as usize));
            Ok(())
        }
        fn wait(&mut self) -> Result<(), String> {
            for (d, s, n) in self.pending.drain(..) {
                // SAFETY: test buffers, alive for the test.
                unsafe { std::ptr::copy(s as *const u8, d as *mut u8, n) };
                self.copies += 1;
            }
            self.waits += 1;
            Ok(())
        }
    }

    fn amo(op: u32, size: u32, value: u64) -> AmoMsg {
        AmoMsg {
            op,
            size,
            offset: 0,
            value,
            flags: 0,
        }
    }

    /// The one-by-one path on host memory (plain read-modify-write).
    fn single(m: &AmoMsg, addr: u64, _device: bool) -> Result<(), String> {
        let mut cur = [0u8; 8];
        // SAFETY: test buffers.
        unsafe { std::ptr::copy(addr as *const u8, cur.as_mut_ptr(), m.size as usize) };
        let out = amo_result(m, u64::from_le_bytes(cur)).to_le_bytes();
        // SAFETY: test buffers.
        unsafe { std::ptr::copy(out.as_ptr(), addr as *mut u8, m.size as usize) };
        Ok(())
    }

    #[test]
    fn a_batch_equals_the_amos_one_by_one_with_two_waits() {
        let mut batched = vec![0u64; 8];
        let mut serial = vec![0u64; 8];
        batched[3] = u64::MAX - 1;
        serial[3] = u64::MAX - 1;
        // Adds and sets, several on one word, a 4-byte word (the high half of word 5 stays), an
        // add that wraps.
        let plan: Vec<(usize, u32, u32, u64)> = vec![
            (0, AMO_OP_ADD, 8, 5),
            (1, AMO_OP_ADD, 8, u64::MAX), // -1
            (0, AMO_OP_ADD, 8, 7),
            (2, AMO_OP_SET, 8, 42),
            (2, AMO_OP_ADD, 8, 1),
            (3, AMO_OP_ADD, 8, 3),
            (0, AMO_OP_SET, 8, 100),
            (0, AMO_OP_ADD, 8, 1),
        ];
        batched[5] = 0xAAAA_AAAA_0000_0001;
        serial[5] = 0xAAAA_AAAA_0000_0001;
        let mut b = AmoBatch::default();
        for (i, &(w, op, size, v)) in plan.iter().enumerate() {
            let m = amo(op, size, v);
            b.push(m, batched.as_mut_ptr() as u64 + 8 * w as u64, true, i);
            single(&m, serial.as_mut_ptr() as u64 + 8 * w as u64, true).unwrap();
        }
        let m = amo(AMO_OP_ADD, 4, 0xFFFF_FFFF);
        b.push(m, batched.as_mut_ptr() as u64 + 40, true, 99);
        single(&m, serial.as_mut_ptr() as u64 + 40, true).unwrap();
        assert_eq!(b.len(), 9);
        let mut io = Queued::default();
        let mut calls = 0;
        let mut scratch = [0u8; 40];
        let done = b.apply(&mut io, Some(&mut scratch), &mut |m, a, d| {
            calls += 1;
            single(m, a, d)
        });
        assert!(b.is_empty());
        assert_eq!(
            &scratch[..8],
            &101u64.to_le_bytes(),
            "word 0's value went through the scratch"
        );
        assert_eq!(batched, serial);
        assert_eq!(batched[0], 101);
        assert_eq!(batched[2], 43);
        assert_eq!(batched[3], 1, "wrapped");
        assert_eq!(
            batched[5], 0xAAAA_AAAA_0000_0000,
            "4-byte add left the high half"
        );
        assert_eq!(io.waits, 2, "one wait to read, one to write back");
        assert_eq!(
            io.copies,
            2 + 2,
            "words 0-3 touch: one range read and written once; word 5 (4 bytes at 40) another"
        );
        assert_eq!(calls, 0, "no AMO went the one-by-one way");
        let tags: Vec<usize> = done.iter().map(|d| d.1).collect();
        assert_eq!(tags, vec![0, 1, 2, 3, 4, 5, 6, 7, 99], "arrival order kept");
        assert!(done.iter().all(|d| d.2.is_ok()));
    }

    #[test]
    fn touching_gpu_words_share_a_copy_and_host_words_do_not() {
        // A count array of 4-byte words, every other one hit, then every one; host words alone.
        let mut w = vec![0u32; 16];
        let base = w.as_mut_ptr() as u64;
        let mut b = AmoBatch::default();
        for i in (0..16).step_by(2) {
            b.push(
                amo(AMO_OP_ADD, 4, i as u64 + 1),
                base + 4 * i as u64,
                true,
                i,
            );
        }
        let mut io = Queued::default();
        let done = b.apply(&mut io, None, &mut |_, _, _| unreachable!());
        assert_eq!(done.len(), 8);
        assert_eq!(io.copies, 8 + 8, "gaps between the words: a copy each");
        for i in 0..16 {
            b.push(amo(AMO_OP_ADD, 4, 100), base + 4 * i as u64, true, i);
        }
        b.push(amo(AMO_OP_ADD, 4, 1), base, true, 16);
        let mut io = Queued::default();
        b.apply(&mut io, Some(&mut [0u8; 64]), &mut |_, _, _| unreachable!());
        assert_eq!(io.copies, 1 + 1, "16 touching words: one range");
        let want: Vec<u32> = (0..16u32)
            .map(|i| 100 + if i % 2 == 0 { i + 1 } else { 0 } + u32::from(i == 0))
            .collect();
        assert_eq!(w, want);
        // Host words (not GPU memory) never share: host atomics, one word each.
        let mut h = vec![0u64; 3];
        let hb = h.as_mut_ptr() as u64;
        for i in 0..3 {
            b.push(amo(AMO_OP_ADD, 8, 7), hb + 8 * i, false, i as usize);
        }
        let mut io = Queued::default();
        b.apply(&mut io, None, &mut |_, _, _| unreachable!());
        assert_eq!(io.copies, 3 + 3);
        assert_eq!(h, vec![7, 7, 7]);
    }

    #[test]
    fn overlapping_words_and_a_failed_read_go_one_by_one_exactly_once() {
        let mut w = vec![0u64; 2];
        let base = w.as_mut_ptr() as u64;
        // An 8-byte add and a 4-byte add inside the same word: not composable through two copies.
        let mut b = AmoBatch::default();
        b.push(amo(AMO_OP_ADD, 8, 1 << 32), base, true, 0);
        b.push(amo(AMO_OP_ADD, 4, 2), base, true, 1);
        let mut io = Queued::default();
        let mut calls = 0;
        let done = b.apply(&mut io, None, &mut |m, a, d| {
            calls += 1;
            single(m, a, d)
        });
        assert_eq!((calls, io.waits), (2, 0));
        assert_eq!(w[0], (1 << 32) + 2);
        assert_eq!(done.len(), 2);

        // The batch read fails before anything is written: each AMO alone, once.
        b.push(amo(AMO_OP_ADD, 8, 5), base + 8, true, 2);
        b.push(amo(AMO_OP_ADD, 8, 6), base + 8, true, 3);
        let mut io = Queued {
            fail_read: true,
            ..Default::default()
        };
        let mut calls = 0;
        let done = b.apply(&mut io, None, &mut |m, a, d| {
            calls += 1;
            single(m, a, d)
        });
        assert_eq!(calls, 2);
        assert_eq!(w[1], 11, "applied exactly once each");
        assert!(done.iter().all(|d| d.2.is_ok()));
    }

    #[test]
    fn watched_words_name_the_ones_changed_since_they_were_written() {
        let mut mem = vec![0u64; 80];
        let base = mem.as_mut_ptr() as u64;
        let mut ap = Applier::default();
        // Not watched: nothing kept.
        let mut b = AmoBatch::default();
        b.push(amo(AMO_OP_ADD, 8, 1), base + 16, false, 9usize);
        ap.apply(&mut b, "test");
        assert_eq!(ap.changed().unwrap(), (0, vec![]));
        ap.watch(true);
        b.push(
            amo(AMO_OP_ADD, 4, (-5i32) as u32 as u64),
            base,
            false,
            0usize,
        );
        b.push(amo(AMO_OP_ADD, 8, 7), base + 8, false, 1);
        b.push(amo(AMO_OP_ADD, 4, 1), base, false, 2);
        let done = ap.apply(&mut b, "test");
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|d| d.2.is_ok()));
        assert_eq!(
            ap.changed().unwrap(),
            (2, vec![]),
            "both words hold what was written"
        );
        // The application cleans the first word after the batch.
        // SAFETY: the test's own memory.
        unsafe { *(base as *mut u32) = 0 };
        let (n, changed) = ap.changed().unwrap();
        assert_eq!(n, 2);
        assert_eq!(changed.len(), 1, "{changed:?}");
        let (w, now) = changed[0];
        assert_eq!((w.addr, w.size, w.device), (base, 4, false));
        assert_eq!(w.signed(w.value), -4, "-5 then +1");
        assert_eq!(now, 0);
        // The last WATCH_WORDS distinct words are kept, the oldest dropped first.
        for i in 0..70u64 {
            b.push(
                amo(AMO_OP_SET, 8, i),
                base + 8 * (i + 10) % (8 * 80),
                false,
                0,
            );
        }
        ap.apply(&mut b, "test");
        let (n, changed) = ap.changed().unwrap();
        assert_eq!(n, WATCH_WORDS);
        assert!(changed.is_empty(), "{changed:?}");
        // SAFETY: as above; word 10 + 69 was the last written.
        unsafe { *((base + 8 * 79) as *mut u64) = 1 };
        unsafe { *((base + 8 * 10) as *mut u64) = 1234 };
        let (_, changed) = ap.changed().unwrap();
        assert_eq!(
            changed.len(),
            1,
            "word 10 (written first of 70) is no longer watched: {changed:?}"
        );
        assert_eq!((changed[0].0.value, changed[0].1), (69, 1));
        ap.watch(false);
        assert_eq!(ap.changed().unwrap(), (0, vec![]));
    }
}
