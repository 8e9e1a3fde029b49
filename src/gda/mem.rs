//! Memory the queues live in.
//!
//! * [`SharedMem`]: host memory both the CPU and the GPU read and write. With a CUDA driver and a
//!   current context it is pinned, device-mapped host memory (`cuMemHostAlloc(DEVICEMAP)`); without
//!   one it is plain page-aligned host memory whose "device address" is its host address, so the
//!   software queue runs on CPU-only machines.
//! * [`CtrlMem`]: memory for the queue control block and the per-slot status words, which kernels
//!   update with GPU atomics: device memory (`cuMemAlloc`) when CUDA is in use, otherwise
//!   [`SharedMem`] (the CPU poster then uses host atomics on it).
//!
//! Both are zeroed at allocation and freed on drop. Access goes through the small volatile and
//! atomic helpers at the end of this file, which take raw pointers: these regions are written
//! concurrently by another agent (the GPU or a poster thread), so Rust references to their contents
//! are never formed.
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::cuda::{self, DeviceBuffer, MappedHostBuffer};
use crate::fabric::MemKind;

use super::error::{GdaError, Result};

/// Where a queue's GPU-updated control words live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlPlacement {
    /// Device memory when CUDA is usable (driver present and a context current), else host memory.
    Auto,
    /// Host memory (mapped for the GPU when CUDA is usable): lets a CPU thread play the GPU's part
    /// (`gda::host_poster::HostPoster`, feature `test-support`); GPU atomics on it are system-scope atomics over PCIe.
    Host,
}

/// True when CUDA can be used for allocations from this thread (driver present, context current).
pub fn cuda_usable() -> bool {
    cuda::available() && cuda::current_context() != 0
}

/// Where the memory at `addr` lives, as the CUDA driver says (host memory without CUDA). Asked once
/// per range; the answer travels with the range from then on.
pub fn mem_kind(addr: u64) -> MemKind {
    match cuda::pointer_kind(addr as *const c_void) {
        cuda::PtrKind::Host => MemKind::Host,
        cuda::PtrKind::Device { ordinal, .. } => MemKind::Cuda(ordinal),
    }
}

enum SharedKind {
    Mapped(MappedHostBuffer),
    Plain { ptr: *mut u8, layout: Layout },
}

/// Host memory visible to the GPU (or plain host memory on machines without CUDA).
pub struct SharedMem {
    kind: SharedKind,
    len: usize,
}

// SAFETY: the memory is owned by this value; concurrent access to its contents goes through raw
// pointers with volatile/atomic operations, coordinated by the queue protocol.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Allocates `len` zeroed bytes (page aligned). `cuda` chooses mapped pinned memory.
    pub fn new(len: usize, cuda: bool) -> Result<SharedMem> {
        let len = len.max(64);
        if cuda {
            let m = MappedHostBuffer::new(len)
                .map_err(|e| GdaError::nomem(format!("software queue rings: {e}")))?;
            return Ok(SharedMem {
                kind: SharedKind::Mapped(m),
                len,
            });
        }
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|e| GdaError::invalid(format!("software queue rings: bad size {len}: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(GdaError::nomem(format!(
                "software queue rings: {len} bytes of host memory"
            )));
        }
        Ok(SharedMem {
            kind: SharedKind::Plain { ptr, layout },
            len,
        })
    }

    /// Host address.
    pub fn host(&self) -> *mut u8 {
        match &self.kind {
            SharedKind::Mapped(m) => m.host(),
            SharedKind::Plain { ptr, .. } => *ptr,
        }
    }

    /// Address kernels use (equal to the host address for plain memory).
    pub fn device(&self) -> u64 {
        match &self.kind {
            SharedKind::Mapped(m) => m.device(),
            SharedKind::Plain { ptr, .. } => *ptr as u64,
        }
    }

    /// Whether this is CUDA-mapped memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self.kind, SharedKind::Mapped(_))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        if let SharedKind::Plain { ptr, layout } = self.kind {
            // SAFETY: allocated in new() with this layout, freed once.
            unsafe { dealloc(ptr, layout) }
        }
    }
}

/// Memory of the control block and slot status words.
pub enum CtrlMem {
    /// Device memory: the host reads it with `cuda::memcpy` (a non-blocking stream).
    Device(DeviceBuffer),
    /// Host memory: the host uses atomics on it directly.
    Host(SharedMem),
}

impl CtrlMem {
    /// Allocates `len` zeroed bytes as `placement` asks.
    pub fn new(len: usize, placement: CtrlPlacement) -> Result<CtrlMem> {
        let cuda = cuda_usable();
        if placement == CtrlPlacement::Auto && cuda {
            let d = DeviceBuffer::new(len.max(64))
                .map_err(|e| GdaError::nomem(format!("queue control block: {e}")))?;
            return Ok(CtrlMem::Device(d));
        }
        Ok(CtrlMem::Host(SharedMem::new(len, cuda)?))
    }

    /// Address kernels use.
    pub fn device(&self) -> u64 {
        match self {
            CtrlMem::Device(d) => d.ptr(),
            CtrlMem::Host(h) => h.device(),
        }
    }

    /// Host address when the memory is host memory.
    pub fn host(&self) -> Option<*mut u8> {
        match self {
            CtrlMem::Device(_) => None,
            CtrlMem::Host(h) => Some(h.host()),
        }
    }

    /// Reads the `u64` at byte offset `off` (atomically for host memory, by `cuda::memcpy` otherwise).
    pub fn read_u64(&self, off: usize) -> Result<u64> {
        match self {
            CtrlMem::Host(h) => {
                debug_assert!(off + 8 <= h.len() && off % 8 == 0);
                // SAFETY: in bounds and 8-byte aligned (page-aligned base, aligned offset).
                Ok(unsafe { atomic_u64(h.host().add(off)) }.load(Ordering::Acquire))
            }
            CtrlMem::Device(d) => {
                debug_assert!(off + 8 <= d.len());
                let mut v = 0u64;
                // SAFETY: 8 bytes of device memory inside the allocation into a local.
                unsafe {
                    cuda::memcpy(
                        &mut v as *mut u64 as *mut c_void,
                        (d.ptr() + off as u64) as *const c_void,
                        8,
                    )
                }
                .map_err(|e| GdaError::io(format!("reading the queue control block: {e}")))?;
                Ok(v)
            }
        }
    }
}

/// Views a host `u64` as an atomic.
///
/// # Safety
/// `p` must be valid, 8-byte aligned, and live for `'a`; every concurrent access must be atomic.
pub unsafe fn atomic_u64<'a>(p: *mut u8) -> &'a AtomicU64 {
    // SAFETY: the caller guarantees validity and alignment.
    unsafe { AtomicU64::from_ptr(p as *mut u64) }
}

/// Views a host `u32` as an atomic.
///
/// # Safety
/// As for [`atomic_u64`], with 4-byte alignment.
pub unsafe fn atomic_u32<'a>(p: *mut u8) -> &'a AtomicU32 {
    // SAFETY: the caller guarantees validity and alignment.
    unsafe { AtomicU32::from_ptr(p as *mut u32) }
}

/// Views a host byte as an atomic.
///
/// # Safety
/// `p` must be valid and live for `'a`; every concurrent access must be atomic.
pub unsafe fn atomic_u8<'a>(p: *mut u8) -> &'a AtomicU8 {
    // SAFETY: the caller guarantees validity.
    unsafe { AtomicU8::from_ptr(p) }
}

/// Copies `N` bytes out of shared memory with volatile reads (8 bytes at a time).
///
/// # Safety
/// `p` must be valid for `N` bytes and 8-byte aligned; `N` a multiple of 8.
pub unsafe fn read_shared<const N: usize>(p: *const u8) -> [u8; N] {
    let mut out = [0u8; N];
    for i in (0..N).step_by(8) {
        // SAFETY: in bounds and aligned per the contract.
        let w = unsafe { std::ptr::read_volatile(p.add(i) as *const u64) };
        out[i..i + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Writes `bytes` into shared memory with volatile byte stores.
///
/// # Safety
/// `p` must be valid for `bytes.len()` bytes.
pub unsafe fn write_shared(p: *mut u8, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: in bounds per the contract.
        unsafe { std::ptr::write_volatile(p.add(i), *b) };
    }
}

/// Publishes a completion entry: every byte but the flags byte (byte 3), a release fence, then the
/// flags byte (which holds the phase bit). A poller that sees the new phase and fences before reading
/// the rest sees the whole entry.
///
/// # Safety
/// `p` must be valid for `entry.len()` (>= 4) bytes of shared memory.
pub unsafe fn publish_cqe(p: *mut u8, entry: &[u8]) {
    // SAFETY: in bounds per the contract.
    unsafe {
        write_shared(p, &entry[..3]);
        write_shared(p.add(4), &entry[4..]);
        std::sync::atomic::fence(Ordering::Release);
        atomic_u8(p.add(3)).store(entry[3], Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_shared_memory_is_zeroed_and_aligned() {
        let m = SharedMem::new(10_000, false).unwrap();
        assert_eq!(m.host() as usize % 4096, 0);
        assert_eq!(m.device(), m.host() as u64);
        // SAFETY: within the allocation.
        let bytes: [u8; 64] = unsafe { read_shared(m.host().add(128)) };
        assert_eq!(bytes, [0u8; 64]);
    }

    #[test]
    fn publish_writes_flags_last_and_everything() {
        let m = SharedMem::new(4096, false).unwrap();
        let e: Vec<u8> = (1..=16).collect();
        // SAFETY: within the allocation.
        unsafe { publish_cqe(m.host(), &e) };
        // SAFETY: within the allocation.
        let back: [u8; 16] = unsafe { read_shared(m.host()) };
        assert_eq!(&back[..], &e[..]);
    }

    #[test]
    fn host_ctrl_reads_atomically() {
        let c = CtrlMem::new(256, CtrlPlacement::Host).unwrap();
        let h = c.host().unwrap();
        // SAFETY: aligned, in bounds.
        unsafe { atomic_u64(h.add(16)).store(0xdead_beef, Ordering::Release) };
        assert_eq!(c.read_u64(16).unwrap(), 0xdead_beef);
    }
}

/// How often a ring's consumer index in device memory is read back while the ring looks full (each
/// read is a copy from the GPU); in host memory it is read every time.
const CI_REFRESH: Duration = Duration::from_micros(50);

/// The host's view of the consumer index a GPU advances as it drains a ring the host produces into
/// (the RX ring of both queues): the last value read, and when.
#[derive(Debug, Default)]
pub struct ConsumerIndex {
    cached: u64,
    read_at: Option<Instant>,
}

impl ConsumerIndex {
    /// The last consumer index read (never past `produced` when it was read).
    pub fn cached(&self) -> u64 {
        self.cached
    }

    /// Whether a ring of `entries` slots with `produced` entries written has room for one more,
    /// reading the consumer index at `off` of `ctrl` when the cached value says the ring is full.
    /// `who` names the ring's owner in the warning of a failed read.
    pub fn room(
        &mut self,
        ctrl: &CtrlMem,
        off: usize,
        produced: u64,
        entries: u64,
        who: &str,
    ) -> bool {
        if produced - self.cached < entries {
            return true;
        }
        if let Some(t) = self.read_at {
            if ctrl.host().is_none() && t.elapsed() < CI_REFRESH {
                return false;
            }
        }
        self.read_at = Some(Instant::now());
        match ctrl.read_u64(off) {
            Ok(ci) => self.cached = ci.min(produced),
            Err(e) => tracing::warn!("{who}: {e}"),
        }
        produced - self.cached < entries
    }
}
