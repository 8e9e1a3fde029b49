//! The symmetric heap's chunks on a [`Gda`]: local chunks (registered for the queue, lkeys) and
//! every PE's chunks (rkeys), kept in [`HeapTable`] and published as the state's `heap_keys`.
//!
//! NVSHMEM registers its heap chunk by chunk; `add_device_remote_mem_handles` names each chunk's heap
//! offset and size with every PE's handle of it, and the transport feeds both ends here. The
//! single-heap calls ([`Gda::set_local_heap`], [`Gda::set_remote_heap`]) are one chunk at offset 0.
use std::collections::BTreeMap;

use crate::fabric::{MemKind, MemoryRegion, MrHandle};

use super::error::{GdaError, Result};
use super::heap::{ceil_log2, HeapChunk, HeapTable, DEFAULT_LOG2_GRANULARITY};
use super::mem;
use super::queue::{self, Registration};
use super::Gda;

/// A local chunk: heap offsets `[start, end)` at `base` here.
pub(super) struct LocalChunk {
    pub(super) end: u64,
    pub(super) base: u64,
    /// Key peers use for it.
    pub(super) key: u64,
    /// lkey kernels put into WQEs.
    pub(super) lkey: u32,
    /// What the queue wants back when the chunk goes.
    token: Option<u32>,
    /// The registration made here for the chunk (none when the caller's serves), closed with it.
    own: Option<MemoryRegion>,
}

/// A chunk of a PE's heap as recorded (applied to the queue once connected).
#[derive(Clone, Copy, Debug)]
pub(super) struct RemoteChunk {
    pub(super) end: u64,
    pub(super) addr: u64,
    pub(super) key: u64,
    /// The rkey kernels use, once the queue knows the chunk.
    pub(super) rkey: Option<u32>,
}

/// Every chunk this context knows.
#[derive(Default)]
pub(super) struct Chunks {
    pub(super) local: BTreeMap<u64, LocalChunk>,
    pub(super) remote: BTreeMap<(i32, u64), RemoteChunk>,
    /// The granularity, once a chunk named it.
    pub(super) log2: Option<u32>,
    /// `n_pes + 1` rows once connected, none before.
    pub(super) table: Option<HeapTable>,
}

impl Chunks {
    /// The chunk of `pe` at heap offset 0 (what the version-1 fields describe).
    pub(super) fn remote0(&self, pe: i32) -> Option<&RemoteChunk> {
        self.remote.get(&(pe, 0))
    }

    /// Highest end of `pe`'s chunks.
    pub(super) fn remote_extent(&self, pe: i32) -> u64 {
        self.remote
            .range((pe, 0)..=(pe, u64::MAX))
            .map(|(_, c)| c.end)
            .max()
            .unwrap_or(0)
    }

    pub(super) fn local_extent(&self) -> u64 {
        self.local.values().map(|c| c.end).max().unwrap_or(0)
    }

    /// Local heap base: the address of heap offset 0.
    pub(super) fn local_base(&self) -> u64 {
        self.local
            .iter()
            .next()
            .map_or(0, |(start, c)| c.base.wrapping_sub(*start))
    }
}

impl Gda {
    /// Fixes the granularity. It may change only while no chunk is recorded, or, for the single-heap
    /// calls (`whole`), while every chunk starts at 0 (soft rkeys stay the same).
    fn use_log2(&mut self, log2: u32, whole: bool) -> Result<u32> {
        let c = &mut self.chunks;
        if c.log2 == Some(log2) {
            return Ok(log2);
        }
        let only_zero = c.local.keys().all(|&s| s == 0) && c.remote.keys().all(|&(_, s)| s == 0);
        let empty = c.local.is_empty() && c.remote.is_empty();
        if !(empty || (whole && only_zero)) {
            let m = format!(
                "heap granularity 2^{log2} differs from the 2^{} of the chunks recorded",
                c.log2.unwrap_or(0)
            );
            tracing::error!("GDA: {m}");
            return Err(GdaError::invalid(m));
        }
        if let Some(t) = c.table.as_mut() {
            t.set_log2(log2)?;
        }
        c.log2 = Some(log2);
        Ok(log2)
    }

    /// Granularity for a single-heap call of `size` bytes: at least one granule covers it.
    fn whole_log2(&self, size: u64) -> u32 {
        ceil_log2(size)
            .max(self.chunks.log2.unwrap_or(DEFAULT_LOG2_GRANULARITY))
            .min(super::heap::MAX_LOG2_GRANULARITY)
    }

    /// Adds local heap chunk `[start, end)` at `base`, granularity `2^log2`. With `mr` (an open
    /// registration of exactly this range on the queue's domain, kept open by the caller until the
    /// chunk is removed or this value dropped) its key and descriptor are used; without, the range is
    /// registered here. The same chunk again is a no-op.
    ///
    /// # Safety
    /// `mr`, when given, must be as described; the memory must stay allocated until the chunk is
    /// removed or this value is dropped.
    pub unsafe fn add_local_heap_chunk(
        &mut self,
        start: u64,
        end: u64,
        base: u64,
        mr: Option<(MrHandle, MemKind)>,
        log2: u32,
    ) -> Result<()> {
        self.q()?;
        if end <= start || base == 0 || base.checked_add(end - start).is_none() {
            return Err(GdaError::invalid(format!(
                "local heap chunk [{start:#x}, {end:#x}) at {base:#x}: bad range"
            )));
        }
        if let Some(c) = self.chunks.local.get(&start) {
            if c.end == end && c.base == base {
                return Ok(());
            }
            self.remove_local_chunk(start)?;
        }
        let log2 = self.use_log2(log2, false)?;
        // Validate against the table before the queue learns anything.
        let row = self.n_pes as usize;
        let entry = HeapChunk {
            start,
            end,
            addr: base,
            key: 0,
        };
        if let Some(t) = self.chunks.table.as_ref() {
            t.clone().add(row, entry)?;
        }
        let takes_caller = {
            let mr_endpoint = self.domain.as_ref().is_some_and(|d| d.info().mr_endpoint());
            self.q()?.takes_caller_registration(mr_endpoint)
        };
        let size = end - start;
        let registered = self.registrations.len();
        let reg = match mr {
            Some((m, kind)) if takes_caller => {
                // SAFETY: open registration per the contract.
                let (key, desc) = unsafe { (m.key(), m.desc()) };
                Registration {
                    key,
                    desc,
                    handle: Some(m),
                    kind,
                }
            }
            Some((_, kind)) => self.register(base, size, kind)?,
            None => self.register(base, size, mem::mem_kind(base))?,
        };
        // A registration made here belongs to the chunk (closed when the chunk goes).
        let own = (self.registrations.len() > registered)
            .then(|| self.registrations.pop())
            .flatten();
        // SAFETY: reg describes [base, base+size), registered and allocated per the contract (or
        // by `own`, which the chunk keeps).
        let place = queue::LocalChunk {
            start,
            end,
            base,
            log2,
        };
        // SAFETY: as above.
        let (lkey, token) = unsafe { self.q()?.add_heap_chunk(&place, &reg)? };
        if let Some(t) = self.chunks.table.as_mut() {
            t.add(row, HeapChunk { key: lkey, ..entry })?;
        }
        let device = reg.kind.is_device();
        self.chunks.local.insert(
            start,
            LocalChunk {
                end,
                base,
                key: reg.key,
                lkey,
                token,
                own,
            },
        );
        tracing::info!(
            "GDA: local heap chunk [{start:#x}, {end:#x}) at {base:#x} ({}), lkey {lkey}",
            if device { "GPU" } else { "host" }
        );
        self.publish()
    }

    fn remove_local_chunk(&mut self, start: u64) -> Result<()> {
        if let Some(c) = self.chunks.local.remove(&start) {
            if let Some(t) = self.chunks.table.as_mut() {
                t.remove(self.n_pes as usize, start);
            }
            self.q()?.remove_heap_chunk(start, c.token)?;
            // The queue no longer names it: its own registration (if any) can close.
            drop(c.own);
        }
        Ok(())
    }

    /// Records chunk `[start, end)` of PE `pe`'s heap: `addr` (of `start`) on that PE and the key
    /// of its registration, granularity `2^log2`. Before [`Gda::connect`] it is kept and applied
    /// when the peer table exists.
    pub fn add_remote_heap_chunk(
        &mut self,
        pe: i32,
        start: u64,
        end: u64,
        addr: u64,
        key: u64,
        log2: u32,
    ) -> Result<()> {
        let q = self.q()?;
        if pe < 0 || (self.n_pes > 0 && pe >= self.n_pes) {
            return Err(GdaError::invalid(format!(
                "heap chunk of PE {pe}: PE out of range (n_pes {})",
                self.n_pes
            )));
        }
        if end <= start || addr.checked_add(end - start).is_none() {
            return Err(GdaError::invalid(format!(
                "heap chunk [{start:#x}, {end:#x}) of PE {pe} at {addr:#x}: bad range"
            )));
        }
        q.check_remote_key(pe, key)?;
        if let Some(c) = self.chunks.remote.get(&(pe, start)) {
            if c.end == end && c.addr == addr && c.key == key {
                return Ok(());
            }
            self.remove_remote_chunk(pe, start)?;
        }
        self.use_log2(log2, false)?;
        let c = RemoteChunk {
            end,
            addr,
            key,
            rkey: None,
        };
        if self.n_pes > 0 {
            let rc = self.apply_remote_chunk(pe, start, c)?;
            self.chunks.remote.insert((pe, start), rc);
            self.publish()
        } else {
            self.chunks.remote.insert((pe, start), c);
            Ok(())
        }
    }

    /// Gives a recorded chunk to the queue and the table (connected only).
    pub(super) fn apply_remote_chunk(
        &mut self,
        pe: i32,
        start: u64,
        c: RemoteChunk,
    ) -> Result<RemoteChunk> {
        let log2 = self.chunks.log2.unwrap_or(DEFAULT_LOG2_GRANULARITY);
        let ordinal = u32::try_from(start >> log2).map_err(|_| {
            GdaError::invalid(format!("heap chunk at {start:#x}: ordinal too large"))
        })?;
        let entry = HeapChunk {
            start,
            end: c.end,
            addr: c.addr,
            key: 0,
        };
        if let Some(t) = self.chunks.table.as_ref() {
            t.clone().add(pe as usize, entry)?;
        }
        let rkey = self.q()?.add_remote_chunk(&queue::PeerChunk {
            pe,
            ordinal,
            start,
            base: c.addr,
            size: c.end - start,
            key: c.key,
        })?;
        if let Some(t) = self.chunks.table.as_mut() {
            t.add(pe as usize, HeapChunk { key: rkey, ..entry })?;
        }
        Ok(RemoteChunk {
            rkey: Some(rkey),
            ..c
        })
    }

    fn remove_remote_chunk(&mut self, pe: i32, start: u64) -> Result<()> {
        if let Some(c) = self.chunks.remote.remove(&(pe, start)) {
            if let Some(t) = self.chunks.table.as_mut() {
                t.remove(pe as usize, start);
            }
            if c.rkey.is_some() {
                let log2 = self.chunks.log2.unwrap_or(DEFAULT_LOG2_GRANULARITY);
                self.q()?.remove_remote_chunk(pe, (start >> log2) as u32)?;
            }
        }
        Ok(())
    }

    /// Forgets the heap chunk at heap offset `start` on every PE (the collective release of a chunk).
    /// Returns whether a local chunk was there.
    pub fn remove_heap_chunk(&mut self, start: u64) -> Result<bool> {
        self.q()?;
        let had = self.chunks.local.contains_key(&start);
        self.remove_local_chunk(start)?;
        let pes: Vec<i32> = self
            .chunks
            .remote
            .keys()
            .filter(|k| k.1 == start)
            .map(|k| k.0)
            .collect();
        for pe in pes {
            self.remove_remote_chunk(pe, start)?;
        }
        tracing::info!("GDA: heap chunk at offset {start:#x} released");
        self.publish()?;
        Ok(had)
    }

    /// The heap granularity (log2) in use, once a chunk named it.
    pub fn heap_log2(&self) -> Option<u32> {
        self.chunks.log2
    }

    /// The key peers use for the local chunk at heap offset `start`.
    pub fn local_chunk_key(&self, start: u64) -> Option<u64> {
        self.chunks.local.get(&start).map(|c| c.key)
    }

    /// Heap offset of the local chunk registered at `base`, if any.
    pub fn local_chunk_start(&self, base: u64) -> Option<u64> {
        self.chunks
            .local
            .iter()
            .find(|(_, c)| c.base == base)
            .map(|(s, _)| *s)
    }

    /// Sets the whole local heap as one chunk at offset 0 (replacing every local chunk). With `mr`
    /// (a registration of exactly this range on the queue's domain, kept open by the caller until
    /// [`Gda`] is dropped) its descriptor, key and memory kind are used; without, the range is
    /// registered here.
    pub fn set_local_heap(
        &mut self,
        base: u64,
        size: u64,
        mr: Option<&MemoryRegion>,
    ) -> Result<()> {
        // SAFETY: a MemoryRegion is an open registration.
        unsafe { self.set_local_heap_with(base, size, mr.map(|m| (m.handle(), m.kind()))) }
    }

    /// [`Gda::set_local_heap`] with a registration the caller owns (`None`: register here). The
    /// memory kind is found from the address.
    ///
    /// # Safety
    /// `mr`, when given, must be an open registration of `[base, base+size)` on the queue's domain
    /// that stays open until this value is dropped; the memory must stay allocated as long.
    pub unsafe fn set_local_heap_raw(
        &mut self,
        base: u64,
        size: u64,
        mr: Option<MrHandle>,
    ) -> Result<()> {
        let kind = mem::mem_kind(base);
        // SAFETY: forwarded contract.
        unsafe { self.set_local_heap_with(base, size, mr.map(|m| (m, kind))) }
    }

    /// # Safety
    /// As for [`Gda::set_local_heap_raw`].
    unsafe fn set_local_heap_with(
        &mut self,
        base: u64,
        size: u64,
        mr: Option<(MrHandle, MemKind)>,
    ) -> Result<()> {
        self.q()?;
        if base == 0 || size == 0 || base.checked_add(size).is_none() {
            return Err(GdaError::invalid(format!(
                "set_local_heap: bad range {base:#x}+{size}"
            )));
        }
        let starts: Vec<u64> = self.chunks.local.keys().copied().collect();
        for s in starts {
            self.remove_local_chunk(s)?;
        }
        let log2 = self.use_log2(self.whole_log2(size), true)?;
        // SAFETY: forwarded contract.
        unsafe { self.add_local_heap_chunk(0, size, base, mr, log2) }
    }

    /// The key peers use for this PE's heap chunk at offset 0.
    pub fn local_heap_key(&self) -> Result<u64> {
        self.chunks
            .local
            .get(&0)
            .map(|h| h.key)
            .ok_or_else(|| GdaError::invalid("the local heap is not set"))
    }

    /// Records PE `pe`'s whole heap as one chunk at offset 0 (replacing every chunk known for it):
    /// base address, size, and the key of its registration. Before [`Gda::connect`] the heap is
    /// kept and applied when the peer table exists.
    pub fn set_remote_heap(&mut self, pe: i32, base: u64, size: u64, key: u64) -> Result<()> {
        let q = self.q()?;
        if pe < 0 || (self.n_pes > 0 && pe >= self.n_pes) {
            return Err(GdaError::invalid(format!(
                "set_remote_heap: PE {pe} out of range (n_pes {})",
                self.n_pes
            )));
        }
        if base.checked_add(size).is_none() || size == 0 {
            return Err(GdaError::invalid(format!(
                "set_remote_heap: bad range {base:#x}+{size} for PE {pe}"
            )));
        }
        q.check_remote_key(pe, key)?;
        let starts: Vec<u64> = self
            .chunks
            .remote
            .range((pe, 0)..=(pe, u64::MAX))
            .map(|(k, _)| k.1)
            .filter(|&s| s != 0)
            .collect();
        for s in starts {
            self.remove_remote_chunk(pe, s)?;
        }
        let log2 = self.use_log2(self.whole_log2(size), true)?;
        self.chunks.remote.remove(&(pe, 0));
        if let Some(t) = self.chunks.table.as_mut() {
            t.remove(pe as usize, 0);
        }
        self.add_remote_heap_chunk(pe, 0, size, base, key, log2)
    }

    /// After connect: the table with `n_pes + 1` rows, every chunk recorded so far in it.
    pub(super) fn build_table(&mut self) -> Result<()> {
        let log2 = self.chunks.log2.unwrap_or(DEFAULT_LOG2_GRANULARITY);
        let n = self.n_pes;
        let mut t = HeapTable::new(n as usize + 1, log2);
        for (&start, c) in &self.chunks.local {
            t.add(
                n as usize,
                HeapChunk {
                    start,
                    end: c.end,
                    addr: c.base,
                    key: c.lkey,
                },
            )?;
        }
        self.chunks.table = Some(t);
        let pending: Vec<((i32, u64), RemoteChunk)> =
            self.chunks.remote.iter().map(|(k, v)| (*k, *v)).collect();
        for ((pe, start), c) in pending {
            if pe >= n {
                tracing::warn!(
                    "GDA: heap chunk recorded for PE {pe}, which is not among the {n} PEs: dropped"
                );
                self.chunks.remote.remove(&(pe, start));
                continue;
            }
            let rc = self.apply_remote_chunk(pe, start, c)?;
            self.chunks.remote.insert((pe, start), rc);
        }
        Ok(())
    }
}
