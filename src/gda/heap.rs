//! The symmetric heap's registrations (chunks), per PE, and the granule-indexed table kernels read
//! (`NvshmemEfaGdaHeapKey[(n_pes + 1) * key_stride]`, see [`super::state`]).
//!
//! NVSHMEM registers its heap in chunks (one `get_mem_handle` per VMM chunk, on multiples of its
//! cumem granularity) and hands every PE's handle of a chunk to `add_device_remote_mem_handles`
//! together with the chunk's heap offset and size. Each chunk has its own keys on each PE. Row `pe`
//! of the table holds PE `pe`'s chunks with their rkeys, row `n_pes` this PE's own chunks with their
//! lkeys; entry `row * key_stride + (offset >> log2)` is the chunk holding `offset` (O(1) lookup).
//! The table grows by reallocation (the caller keeps old copies alive, see [`super::Gda`]).
use super::error::{GdaError, Result};
use super::state::{NvshmemEfaGdaHeapKey, NVSHMEM_EFA_GDA_KEY_VALID};

/// Granularity used when the caller names none (the CUDA VMM minimum, 2 MiB).
pub const DEFAULT_LOG2_GRANULARITY: u32 = 21;
/// Largest granularity accepted (2^40 bytes).
pub const MAX_LOG2_GRANULARITY: u32 = 40;
/// Most granules per row (a 2 MiB granularity then covers 32 TiB of heap).
pub const MAX_GRANULES: u64 = 1 << 24;

/// One registration of a PE's heap: heap offsets `[start, end)` at virtual address `addr` (of
/// `start`) on that PE, with the key kernels put into WQEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapChunk {
    pub start: u64,
    pub end: u64,
    pub addr: u64,
    pub key: u32,
}

impl HeapChunk {
    fn entry(&self) -> NvshmemEfaGdaHeapKey {
        NvshmemEfaGdaHeapKey {
            addr: self.addr,
            start: self.start,
            end: self.end,
            key: self.key,
            flags: NVSHMEM_EFA_GDA_KEY_VALID,
        }
    }
}

/// Every row's chunks and the flat table built from them.
#[derive(Clone, Debug)]
pub struct HeapTable {
    log2: u32,
    /// Chunks per row, sorted by `start`, not overlapping.
    rows: Vec<Vec<HeapChunk>>,
    stride: u64,
    entries: Vec<NvshmemEfaGdaHeapKey>,
}

impl HeapTable {
    /// An empty table of `rows` rows (`n_pes + 1`).
    pub fn new(rows: usize, log2: u32) -> HeapTable {
        HeapTable {
            log2,
            rows: vec![Vec::new(); rows],
            stride: 0,
            entries: Vec::new(),
        }
    }

    pub fn log2(&self) -> u32 {
        self.log2
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Entries per row of [`HeapTable::entries`].
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// The flat table (`rows * stride` entries).
    pub fn entries(&self) -> &[NvshmemEfaGdaHeapKey] {
        &self.entries
    }

    /// Granules below the highest chunk end of any row.
    pub fn n_granules(&self) -> u64 {
        self.granules_for(self.extent_all())
    }

    fn granules_for(&self, end: u64) -> u64 {
        end.div_ceil(1u64 << self.log2)
    }

    fn extent_all(&self) -> u64 {
        (0..self.rows.len())
            .map(|r| self.extent(r))
            .max()
            .unwrap_or(0)
    }

    /// Highest chunk end of `row` (0 without chunks).
    pub fn extent(&self, row: usize) -> u64 {
        self.rows
            .get(row)
            .and_then(|r| r.last())
            .map_or(0, |c| c.end)
    }

    /// Row `row`'s chunks, by start.
    pub fn chunks(&self, row: usize) -> &[HeapChunk] {
        self.rows.get(row).map_or(&[], |r| r.as_slice())
    }

    /// The chunk of `row` holding heap offset `off` (O(1): one table entry).
    pub fn lookup(&self, row: usize, off: u64) -> Option<HeapChunk> {
        if row >= self.rows.len() {
            return None;
        }
        let g = off >> self.log2;
        if g >= self.stride {
            return None;
        }
        let e = self.entries[row * self.stride as usize + g as usize];
        (e.flags & NVSHMEM_EFA_GDA_KEY_VALID != 0 && off >= e.start && off < e.end).then_some(
            HeapChunk {
                start: e.start,
                end: e.end,
                addr: e.addr,
                key: e.key,
            },
        )
    }

    /// Changes the granularity; only while no chunk is recorded, or to one every chunk start is a
    /// multiple of (the table is rebuilt).
    pub fn set_log2(&mut self, log2: u32) -> Result<()> {
        if log2 > MAX_LOG2_GRANULARITY {
            return Err(GdaError::invalid(format!(
                "heap granularity 2^{log2} is above 2^{MAX_LOG2_GRANULARITY}"
            )));
        }
        if log2 == self.log2 {
            return Ok(());
        }
        let g = 1u64 << log2;
        if let Some(c) = self.rows.iter().flatten().find(|c| c.start % g != 0) {
            return Err(GdaError::invalid(format!(
                "heap granularity 2^{log2}: chunk at offset {:#x} is not on a granule",
                c.start
            )));
        }
        self.log2 = log2;
        self.rebuild(self.stride.max(self.n_granules()))
    }

    /// Records `c` in `row`. `end` may be unaligned only for the last chunk of a row (a heap of one
    /// registration); `start` must be a granule multiple. The same chunk again is a no-op; an
    /// overlapping one is refused. Returns whether the table was reallocated (grown).
    pub fn add(&mut self, row: usize, c: HeapChunk) -> Result<bool> {
        let g = 1u64 << self.log2;
        if row >= self.rows.len() {
            return Err(GdaError::invalid(format!(
                "heap chunk for row {row} of {}",
                self.rows.len()
            )));
        }
        if c.end <= c.start || c.start % g != 0 {
            return Err(GdaError::invalid(format!(
                "heap chunk [{:#x}, {:#x}): empty, or not starting on a granule (2^{})",
                c.start, c.end, self.log2
            )));
        }
        if c.addr.checked_add(c.end - c.start).is_none() {
            return Err(GdaError::invalid(format!(
                "heap chunk [{:#x}, {:#x}) at {:#x}: address range overflows",
                c.start, c.end, c.addr
            )));
        }
        let need = self.granules_for(c.end);
        if need > MAX_GRANULES {
            return Err(GdaError::invalid(format!(
                "heap chunk ends at {:#x}: {need} granules of 2^{} (at most {MAX_GRANULES})",
                c.end, self.log2
            )));
        }
        let r = &mut self.rows[row];
        if let Some(old) = r.iter().find(|o| o.start < c.end && c.start < o.end) {
            if *old == c {
                return Ok(false);
            }
            return Err(GdaError::invalid(format!(
                "heap chunk [{:#x}, {:#x}) of row {row} overlaps the recorded [{:#x}, {:#x})",
                c.start, c.end, old.start, old.end
            )));
        }
        // An unaligned end is only possible for the last chunk: nothing may follow it in its granule.
        if let Some(o) = r.iter().find(|o| {
            (o.start < c.start && o.end.div_ceil(g) > c.start / g)
                || (o.start > c.start && c.end.div_ceil(g) > o.start / g)
        }) {
            return Err(GdaError::invalid(format!(
                "heap chunk [{:#x}, {:#x}) of row {row} shares a granule with [{:#x}, {:#x})",
                c.start, c.end, o.start, o.end
            )));
        }
        let at = r.partition_point(|o| o.start < c.start);
        r.insert(at, c);
        if need > self.stride {
            let stride = need.max(self.stride * 2);
            self.rebuild(stride)?;
            return Ok(true);
        }
        self.fill(row, &c, c.entry());
        Ok(false)
    }

    /// Forgets the chunk of `row` starting at `start`; returns it.
    pub fn remove(&mut self, row: usize, start: u64) -> Option<HeapChunk> {
        let r = self.rows.get_mut(row)?;
        let i = r.iter().position(|c| c.start == start)?;
        let c = r.remove(i);
        self.fill(row, &c, NvshmemEfaGdaHeapKey::default());
        Some(c)
    }

    fn fill(&mut self, row: usize, c: &HeapChunk, e: NvshmemEfaGdaHeapKey) {
        let g0 = c.start >> self.log2;
        let g1 = self.granules_for(c.end).min(self.stride);
        let base = row as u64 * self.stride;
        for g in g0..g1 {
            self.entries[(base + g) as usize] = e;
        }
    }

    fn rebuild(&mut self, stride: u64) -> Result<()> {
        let n = (self.rows.len() as u64)
            .checked_mul(stride)
            .filter(|&n| n <= MAX_GRANULES * 64)
            .ok_or_else(|| {
                GdaError::nomem(format!("heap key table of {stride} granules per row"))
            })?;
        self.stride = stride;
        self.entries = vec![NvshmemEfaGdaHeapKey::default(); n as usize];
        let rows = self.rows.clone();
        for (row, r) in rows.iter().enumerate() {
            for c in r {
                self.fill(row, c, c.entry());
            }
        }
        Ok(())
    }
}

/// ceil(log2(n)) for n >= 1.
pub fn ceil_log2(n: u64) -> u32 {
    if n <= 1 {
        0
    } else {
        64 - (n - 1).leading_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 21;

    fn chunk(start: u64, end: u64, addr: u64, key: u32) -> HeapChunk {
        HeapChunk {
            start,
            end,
            addr,
            key,
        }
    }

    #[test]
    fn add_lookup_grow_and_release() {
        let mut t = HeapTable::new(3, 21);
        assert_eq!(t.lookup(0, 0), None);
        assert!(
            t.add(0, chunk(0, 2 * G, 0x1000_0000, 7)).unwrap(),
            "first chunk allocates"
        );
        assert_eq!(t.stride(), 2);
        // Growth: a chunk past the stride reallocates and keeps what was there.
        assert!(t.add(0, chunk(2 * G, 5 * G, 0x1040_0000, 8)).unwrap());
        assert!(t.stride() >= 5);
        assert_eq!(t.entries().len() as u64, 3 * t.stride());
        assert_eq!(t.lookup(0, 0).unwrap().key, 7);
        assert_eq!(t.lookup(0, 2 * G - 1).unwrap().key, 7);
        let c = t.lookup(0, 5 * G - 1).unwrap();
        assert_eq!(
            (c.key, c.start, c.end, c.addr),
            (8, 2 * G, 5 * G, 0x1040_0000)
        );
        assert_eq!(t.lookup(0, 5 * G), None);
        assert_eq!(t.lookup(1, 0), None, "other rows untouched");
        assert_eq!(t.n_granules(), 5);
        assert_eq!(t.extent(0), 5 * G);
        // The same chunk again is a no-op; an overlapping one is refused.
        assert!(!t.add(0, chunk(0, 2 * G, 0x1000_0000, 7)).unwrap());
        let e = t.add(0, chunk(G, 3 * G, 0x2000_0000, 9)).unwrap_err();
        assert!(e.message.contains("overlaps"), "{}", e.message);
        // Release clears exactly that chunk's entries.
        assert_eq!(t.remove(0, 0).unwrap().key, 7);
        assert_eq!(t.lookup(0, 0), None);
        assert_eq!(t.lookup(0, 2 * G).unwrap().key, 8);
        assert_eq!(t.remove(0, 0), None);
        assert_eq!(t.chunks(0).len(), 1);
        // The entry layout kernels read.
        let s = t.stride() as usize;
        let e = t.entries()[2];
        assert_eq!((e.start, e.end, e.key, e.flags), (2 * G, 5 * G, 8, 1));
        assert_eq!(t.entries()[s].flags, 0);
    }

    #[test]
    fn validation_errors() {
        let mut t = HeapTable::new(2, 21);
        assert!(t.add(2, chunk(0, G, 1, 1)).is_err(), "row out of range");
        assert!(
            t.add(0, chunk(G / 2, G, 1, 1)).is_err(),
            "start off a granule"
        );
        assert!(t.add(0, chunk(G, G, 1, 1)).is_err(), "empty");
        assert!(
            t.add(0, chunk(0, G, u64::MAX - 10, 1)).is_err(),
            "address overflow"
        );
        assert!(
            t.add(0, chunk(0, MAX_GRANULES * G + G, 1, 1)).is_err(),
            "too many granules"
        );
        // An unaligned end is fine for the last chunk, but nothing may share its granule.
        t.add(0, chunk(0, G + 5, 0x1000, 1)).unwrap();
        assert_eq!(t.lookup(0, G + 4).unwrap().key, 1);
        assert_eq!(t.lookup(0, G + 5), None);
        let e = t.add(0, chunk(G, 3 * G, 0x9000, 2)).unwrap_err();
        assert!(e.message.contains("overlaps"), "{}", e.message);
        assert!(t.set_log2(41).is_err());
        // Granularity changes rebuild the table when every start stays on a granule.
        t.set_log2(20).unwrap();
        assert_eq!(t.lookup(0, G + 4).unwrap().key, 1);
        t.add(1, chunk(3 << 20, 4 << 20, 0x5000, 3)).unwrap();
        assert!(
            t.set_log2(21).is_err(),
            "chunk at 3 MiB is not on a 2 MiB granule"
        );
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(4096), 12);
        assert_eq!(ceil_log2(4097), 13);
    }
}
