//! Memory handles: what the transport writes into NVSHMEM's opaque handle, local registrations,
//! and the checks that turn a descriptor into a local descriptor or a remote address and key.
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::abi::{self, MemHandle, RmaMemdesc};
use super::{internal, invalid, Connected, TResult, Transport, NUM_EPS};
use crate::cuda::{self, PtrKind};
use crate::fabric::{Endpoint, MemKind, MemoryRegion};
use crate::mover::handle::{self as mhandle, IpcDesc};

pub(super) const HANDLE_MAGIC: u64 = 0x4144_4741_4645_564e; // "NVEFAGDA"
pub(super) const HANDLE_VERSION: u32 = 1;
pub(super) const HANDLE_FLAG_DEVICE: u32 = 1;
/// The handle carries the region's CUDA IPC descriptor at `mover::handle::IPC_DESC_OFFSET`
/// (bytes 128..256 of the 512; the blob above takes the first 72).
pub(super) const HANDLE_FLAG_IPC: u32 = 2;
/// The registration has no remote access (`local_only`): remote operations on it are refused.
pub(super) const HANDLE_FLAG_LOCAL_ONLY: u32 = 4;

/// Whether `[addr, addr+len)` lies inside `[base, base+size)` (without overflow).
fn range_contains(base: u64, size: u64, addr: u64, len: u64) -> bool {
    addr >= base && len <= size && addr - base <= size - len
}

/// What this transport writes into NVSHMEM's 512-byte opaque handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HandleBlob {
    pub(super) magic: u64,
    pub(super) version: u32,
    pub(super) flags: u32,
    pub(super) base: u64,
    pub(super) len: u64,
    pub(super) keys: [u64; NUM_EPS],
    pub(super) reg_id: u64,
    pub(super) cookie: u64,
    pub(super) pe: i32,
    pub(super) reserved: i32,
}

const _: () = assert!(std::mem::size_of::<HandleBlob>() <= abi::MEM_HANDLE_SIZE);

impl HandleBlob {
    pub(super) fn write(&self, h: &mut MemHandle) {
        h.reserved = [0; abi::MEM_HANDLE_SIZE];
        // SAFETY: HandleBlob is plain data smaller than the handle (asserted above).
        unsafe { std::ptr::write_unaligned(h.reserved.as_mut_ptr() as *mut HandleBlob, *self) }
    }

    /// Reads a blob out of a handle; `None` unless it carries this transport's magic and version.
    pub(super) fn read(h: *const MemHandle) -> Option<HandleBlob> {
        if h.is_null() {
            return None;
        }
        // SAFETY: NVSHMEM hands us pointers to 512-byte handles; the blob fits inside.
        let b = unsafe { std::ptr::read_unaligned((*h).reserved.as_ptr() as *const HandleBlob) };
        (b.magic == HANDLE_MAGIC
            && b.version == HANDLE_VERSION
            && b.len > 0
            && b.base.checked_add(b.len).is_some())
        .then_some(b)
    }

    pub(super) fn contains(&self, addr: u64, len: u64) -> bool {
        range_contains(self.base, self.len, addr, len)
    }
}

/// A local registration.
pub(super) struct Registration {
    pub(super) base: u64,
    pub(super) len: u64,
    pub(super) device: bool,
    /// One region, or one per endpoint for FI_MR_ENDPOINT providers.
    pub(super) mrs: Vec<MemoryRegion>,
}

impl Registration {
    pub(super) fn desc(&self, ep: usize) -> *mut c_void {
        // Staged GPU memory has no provider registration (and needs no descriptor).
        match self.mrs.len() {
            0 => std::ptr::null_mut(),
            n => self.mrs[ep.min(n - 1)].desc(),
        }
    }

    pub(super) fn contains(&self, addr: u64, len: u64) -> bool {
        range_contains(self.base, self.len, addr, len)
    }
}

impl Transport {
    pub(super) fn find_registration(&self, addr: u64, len: u64) -> Option<Arc<Registration>> {
        self.regs
            .read()
            .values()
            .find(|r| r.contains(addr, len))
            .cloned()
    }

    /// `get_mem_handle`: registers `[buf, buf+size)` and describes it in `handle`.
    ///
    /// # Safety
    /// `handle` must be null or point to a writable 512-byte handle; the memory must stay allocated
    /// until `release_mem_handle`.
    pub unsafe fn get_mem_handle(
        &self,
        handle: *mut MemHandle,
        buf: *mut c_void,
        size: usize,
        local_only: bool,
    ) -> TResult<()> {
        if handle.is_null() || buf.is_null() || size == 0 {
            return Err(invalid(format!(
                "get_mem_handle: bad arguments (handle {handle:p}, buf {buf:p}, size {size})"
            )));
        }
        if size > isize::MAX as usize || (buf as usize).checked_add(size).is_none() {
            return Err(invalid(format!(
                "get_mem_handle: range {buf:p}+{size} wraps around the address space"
            )));
        }
        let kind = match cuda::pointer_kind(buf) {
            PtrKind::Host => {
                if let Err(e) = host_range_mapped(buf as usize, size) {
                    return Err(invalid(format!(
                        "get_mem_handle: {buf:p}+{size} is not mapped memory of this process ({e})"
                    )));
                }
                MemKind::Host
            }
            PtrKind::Device {
                ordinal,
                legacy_ipc,
            } => {
                // Staged GPU memory never reaches the provider: only the FI_HMEM path needs it.
                if self.route.hands_gpu_memory_to_provider() && !self.route.caps.hmem {
                    return Err(invalid(format!(
                        "get_mem_handle: {buf:p} is GPU memory but provider {} has no FI_HMEM \
                         (and NVSHMEM_EFA_GPU_STAGING=0 hands GPU memory to the provider)",
                        self.provider
                    )));
                }
                if self.route.caps.hmem_needs_legacy_ipc
                    && self.route.hands_gpu_memory_to_provider()
                    && !legacy_ipc
                    && !self.cfg.allow_vmm
                {
                    return Err(invalid(format!(
                        "get_mem_handle: {buf:p} is CUDA VMM memory, which the shm provider's CUDA IPC cannot \
                         export; run with NVSHMEM_DISABLE_CUDA_VMM=1 (or NVSHMEM_EFA_ALLOW_VMM=1 to try anyway)"
                    )));
                }
                // libfabric's rule for VMM memory on efa's RDM fabric (ofiwg/libfabric#12853): it
                // registers, but the first RMA fails, the provider setting a pointer attribute VMM
                // allocations refuse. Refused here, at registration, with the ways out.
                if self.route.caps.hmem_vmm_sync_memops
                    && self.route.hands_gpu_memory_to_provider()
                    && !legacy_ipc
                    && !self.cfg.allow_vmm
                {
                    let m = format!(
                        "get_mem_handle: {buf:p} is CUDA VMM memory, and provider {} fails RMA on it \
                         (it sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, which VMM allocations refuse: \
                         ofiwg/libfabric#12853); leave NVSHMEM_EFA_GPU_STAGING unset (GPU memory staged), \
                         use the efa-direct fabric, or run with NVSHMEM_DISABLE_CUDA_VMM=1 \
                         (NVSHMEM_EFA_ALLOW_VMM=1 to try anyway)",
                        self.provider
                    );
                    tracing::error!("{m}");
                    return Err(invalid(m));
                }
                // SAFETY: size >= 1 and buf + size does not wrap (checked above).
                let last = unsafe { (buf as *const u8).add(size - 1) } as *const c_void;
                match cuda::pointer_kind(last) {
                    PtrKind::Device { ordinal: o, .. } if o == ordinal => {}
                    _ => {
                        return Err(invalid(format!(
                            "get_mem_handle: {buf:p}+{size} starts in GPU memory of device {ordinal} but does not end in it"
                        )))
                    }
                }
                MemKind::Cuda(ordinal)
            }
        };
        let conn = self.conn.get();
        let staged_device = self.route.stages(matches!(kind, MemKind::Cuda(_)), false);
        // The endpoints to bind the registration to: each one for FI_MR_ENDPOINT providers, else
        // one registration bound to none.
        let bind_to: Vec<Option<&Endpoint>> = if staged_device {
            Vec::new()
        } else if self.info.mr_endpoint() {
            let c = conn.ok_or_else(|| {
                internal("get_mem_handle before connect on an FI_MR_ENDPOINT provider")
            })?;
            c.eps.iter().map(|e| Some(&e.ep)).collect()
        } else {
            vec![None]
        };
        let mrs = bind_to
            .into_iter()
            // SAFETY: NVSHMEM keeps the memory allocated until release_mem_handle.
            .map(|ep| unsafe {
                MemoryRegion::register_gpu(
                    &self.domain,
                    buf as *const u8,
                    size,
                    kind,
                    !local_only,
                    ep,
                    self.route.gpu_registration,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let reg_id = self.next_reg.fetch_add(1, Ordering::Relaxed);
        let mut keys = [0u64; NUM_EPS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mrs
                .get(i.min(mrs.len().saturating_sub(1)))
                .map_or(0, |m| m.key());
        }
        let device = matches!(kind, MemKind::Cuda(_));
        // Remotely accessible GPU memory is exported for the copy engines of same-host peers.
        let ipc = if device && !local_only {
            self.mover.register(buf as u64, size as u64).ipc
        } else {
            None
        };
        let blob = HandleBlob {
            magic: HANDLE_MAGIC,
            version: HANDLE_VERSION,
            flags: if device { HANDLE_FLAG_DEVICE } else { 0 }
                | if ipc.is_some() { HANDLE_FLAG_IPC } else { 0 }
                | if local_only {
                    HANDLE_FLAG_LOCAL_ONLY
                } else {
                    0
                },
            base: buf as u64,
            len: size as u64,
            keys,
            reg_id,
            cookie: self.cookie,
            pe: conn.map_or(-1, |c| c.my_pe),
            reserved: 0,
        };
        let reg = Arc::new(Registration {
            base: buf as u64,
            len: size as u64,
            device,
            mrs,
        });
        self.regs.write().insert(reg_id, reg);
        // SAFETY: handle checked non-null; NVSHMEM passes a 512-byte handle.
        let h = unsafe { &mut *handle };
        blob.write(h);
        if let Err(e) = mhandle::write_section(&mut h.reserved, ipc.as_ref()) {
            self.regs.write().remove(&reg_id);
            self.mover.unregister(buf as u64, size as u64);
            return Err(internal(format!("get_mem_handle: {e}")));
        }
        if !staged_device {
            // SAFETY: as for the registrations above.
            unsafe {
                self.rails.register(
                    reg_id,
                    buf as u64,
                    size as u64,
                    kind,
                    !local_only,
                    &mut h.reserved,
                )
            };
        }
        tracing::debug!(
            "registered {buf:p}+{size} ({kind:?}, local_only={local_only}) as {reg_id}"
        );
        Ok(())
    }

    /// `release_mem_handle`.
    ///
    /// # Safety
    /// `handle` must be null or point to a readable 512-byte handle.
    pub unsafe fn release_mem_handle(&self, handle: *mut MemHandle) -> TResult<()> {
        let b = HandleBlob::read(handle)
            .ok_or_else(|| invalid("release_mem_handle: not a handle of this transport"))?;
        if b.cookie != self.cookie {
            return Err(invalid(
                "release_mem_handle: handle belongs to another transport instance or PE",
            ));
        }
        let reg = self.regs.write().remove(&b.reg_id);
        self.rails.release(b.reg_id);
        match reg {
            Some(r) => {
                if r.device {
                    // Its VMM export (if any) is withdrawn and the exported descriptors closed.
                    self.mover.unregister(r.base, r.len);
                }
                // A heap chunk GDA knows goes from GDA (every PE's row: the release is collective)
                // before its registration closes.
                if self.gda.active() {
                    match self.gda.remove_heap_chunk_at(r.base) {
                        Ok(true) => tracing::debug!("GDA: heap chunk at {:#x} released", r.base),
                        Ok(false) => {}
                        Err(e) => tracing::warn!("GDA: releasing heap chunk at {:#x}: {e}", r.base),
                    }
                }
                Ok(())
            }
            None => Err(invalid(format!(
                "release_mem_handle: registration {} unknown or already released",
                b.reg_id
            ))),
        }
    }

    /// `add_device_remote_mem_handles`: every PE's handle of one heap chunk (heap offsets
    /// `[heap_offset, heap_offset + size)`), stride `stride`, this transport at `index`. Opens the
    /// chunk of every same-host PE for CUDA IPC now (at heap setup, while no kernel waits for the
    /// proxy, rather than at the first put). The only source of GDA's heap chunks: every PE's chunk
    /// goes to GDA's key table, and this PE's own registration of it becomes a local chunk.
    /// `heap_base` and `log2_granularity` are what NVSHMEM wrote into the transport struct.
    ///
    /// # Safety
    /// `handles` must be null or hold `n_pes * stride` handles.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn add_remote_handles(
        &self,
        stride: i32,
        index: i32,
        handles: *mut MemHandle,
        heap_offset: u64,
        size: u64,
        heap_base: u64,
        log2_granularity: u32,
    ) -> TResult<()> {
        let c = self.conn()?;
        if handles.is_null() || stride <= 0 || index < 0 || index >= stride {
            return Err(invalid(format!(
                "add_device_remote_mem_handles: bad arguments (stride {stride}, index {index})"
            )));
        }
        if self.mover.policy().ipc {
            for pe in (0..c.n_pes).filter(|&pe| pe != c.my_pe && self.mover.same_host(pe)) {
                // SAFETY: NVSHMEM passes n_pes * stride handles.
                let h = unsafe { handles.add(pe as usize * stride as usize + index as usize) };
                let Some(b) = HandleBlob::read(h) else {
                    continue;
                };
                let rd = RmaMemdesc {
                    ptr: b.base as *mut c_void,
                    offset: 0,
                    handle: h,
                };
                match self.remote_ipc(&rd, &b, "add_device_remote_mem_handles") {
                    // A handle that does not open is remembered and logged by the mover; its
                    // transfers take the staged path.
                    Ok(Some(d)) => {
                        let _ = self.mover.resolve(pe, &d, d.region_base, d.region_len);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("PE {pe}: {}", e.message),
                }
            }
        }
        if !self.gda.active() {
            return Ok(());
        }
        let refuse = |m: String| {
            tracing::error!("GDA: add_device_remote_mem_handles: {m}");
            invalid(format!("add_device_remote_mem_handles: {m}"))
        };
        let end = heap_offset
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(|| refuse(format!("bad chunk {heap_offset:#x}+{size}")))?;
        // NVSHMEM fills log2_cumem_granularity; should it leave 0 (a static heap, one chunk), the
        // granularity already in use serves, else one granule covering this chunk.
        let log2_granularity = match log2_granularity {
            0 => {
                let l = self.gda.heap_log2().unwrap_or_else(|| {
                    crate::gda::heap::ceil_log2(end).max(crate::gda::heap::DEFAULT_LOG2_GRANULARITY)
                });
                tracing::info!(
                    "GDA: log2_cumem_granularity is 0: heap granularity 2^{l} for chunk {heap_offset:#x}+{size}"
                );
                l
            }
            l => l,
        };
        if log2_granularity > crate::gda::heap::MAX_LOG2_GRANULARITY {
            return Err(refuse(format!(
                "heap granularity 2^{log2_granularity} (log2_cumem_granularity) is not usable"
            )));
        }
        let g = 1u64 << log2_granularity;
        // The start must lie on a granule; the end too, except for the last chunk of a heap (a
        // static heap is one registration of any size; the key table refuses a chunk that would share
        // its last granule).
        if heap_offset % g != 0 {
            return Err(refuse(format!(
                "chunk {heap_offset:#x}+{size} does not start on a granule (2^{log2_granularity})"
            )));
        }
        if end % g != 0 {
            tracing::info!(
                "GDA: heap chunk {heap_offset:#x}+{size} ends off a granule (2^{log2_granularity}): no chunk may follow it"
            );
        }
        let blobs = (0..c.n_pes)
            .map(|pe| {
                // SAFETY: NVSHMEM passes n_pes * stride handles.
                let h = unsafe { handles.add(pe as usize * stride as usize + index as usize) };
                HandleBlob::read(h)
                    .filter(|b| b.len >= size)
                    .ok_or_else(|| {
                        refuse(format!(
                            "PE {pe}'s handle is not ours or shorter than {size} bytes"
                        ))
                    })
            })
            .collect::<TResult<Vec<_>>>()?;
        let mine = &blobs[c.my_pe as usize];
        if mine.cookie != self.cookie {
            return Err(refuse(format!(
                "this PE's handle (PE {}) belongs to another transport instance",
                mine.pe
            )));
        }
        if mine.base.wrapping_sub(heap_base) != heap_offset {
            return Err(refuse(format!(
                "this PE's registration at {:#x} is heap offset {:#x} (heap base {heap_base:#x}), NVSHMEM says {heap_offset:#x}",
                mine.base,
                mine.base.wrapping_sub(heap_base)
            )));
        }
        let reg = self.regs.read().get(&mine.reg_id).cloned().ok_or_else(|| {
            refuse(format!(
                "this PE's registration {} is not (or no longer) registered",
                mine.reg_id
            ))
        })?;
        // SAFETY: the registration stays open and the memory allocated until release_mem_handle,
        // which removes the chunk from GDA first.
        unsafe {
            self.gda.add_local_heap_chunk(
                heap_offset,
                end,
                mine.base,
                reg.mrs.first(),
                log2_granularity,
            )
        }
        .map_err(|e| refuse(format!("local chunk {heap_offset:#x}+{size}: {e}")))?;
        for (pe, b) in blobs.iter().enumerate() {
            self.gda
                .with(|g| {
                    g.add_remote_heap_chunk(
                        pe as i32,
                        heap_offset,
                        end,
                        b.base,
                        b.keys[0],
                        log2_granularity,
                    )
                })
                .map_err(|e| refuse(format!("chunk {heap_offset:#x}+{size} of PE {pe}: {e}")))?;
        }
        tracing::info!(
            "GDA: heap chunk [{heap_offset:#x}, {end:#x}) of {} PEs recorded",
            c.n_pes
        );
        Ok(())
    }

    pub(super) fn check_pe_range(&self, c: &Connected, pe: i32) -> TResult<()> {
        if pe < 0 || pe >= c.n_pes {
            return Err(invalid(format!("PE {pe} out of range (n_pes {})", c.n_pes)));
        }
        Ok(())
    }

    /// PE in range and not gone.
    pub(super) fn check_pe(&self, c: &Connected, pe: i32) -> TResult<()> {
        self.check_pe_range(c, pe)?;
        self.check_peer(c, pe as usize)
    }

    /// The remote handle of `rd`, after checking that it is one of ours and covers `len` bytes at
    /// `rd.ptr`.
    pub(super) fn remote_blob(&self, rd: &RmaMemdesc, len: u64, what: &str) -> TResult<HandleBlob> {
        let b = HandleBlob::read(rd.handle).ok_or_else(|| {
            invalid(format!(
                "{what}: remote handle {:p} was not made by this transport",
                rd.handle
            ))
        })?;
        if b.flags & HANDLE_FLAG_LOCAL_ONLY != 0 {
            return Err(invalid(format!(
                "{what}: the remote handle {:p} names a local_only registration (no remote access)",
                rd.handle
            )));
        }
        let addr = rd.ptr as u64;
        if !b.contains(addr, len) {
            return Err(invalid(format!(
                "{what}: remote range {addr:#x}+{len} outside the registration {:#x}+{}",
                b.base, b.len
            )));
        }
        Ok(b)
    }

    /// The provider's address and key for `rd` on endpoint `ep`, from its handle's blob `b`
    /// (checked against the range by `remote_blob`).
    pub(super) fn provider_target(&self, rd: &RmaMemdesc, b: &HandleBlob, ep: usize) -> (u64, u64) {
        let addr = rd.ptr as u64;
        let a = if self.info.virt_addr() {
            addr
        } else {
            addr - b.base
        };
        (a, b.keys[ep])
    }

    /// The CUDA IPC descriptor a peer put into its handle (`b`, already checked by `remote_blob`),
    /// or `None` when it exported none.
    pub(super) fn remote_ipc(
        &self,
        rd: &RmaMemdesc,
        b: &HandleBlob,
        what: &str,
    ) -> TResult<Option<IpcDesc>> {
        if b.flags & HANDLE_FLAG_IPC == 0 {
            return Ok(None);
        }
        // SAFETY: remote_blob read this transport's blob out of the same 512-byte handle.
        let bytes = unsafe { &(*rd.handle).reserved };
        mhandle::read_section(bytes)
            .map_err(|e| invalid(format!("{what}: the remote handle's IPC section: {e}")))
    }

    /// Local descriptor for `[addr, addr+len)`: from its handle, or a registration that contains it.
    pub(super) fn local_desc(
        &self,
        handle: *mut MemHandle,
        addr: u64,
        len: u64,
        ep: usize,
    ) -> Option<(Arc<Registration>, *mut c_void)> {
        let by_handle = HandleBlob::read(handle)
            .filter(|b| b.cookie == self.cookie)
            .and_then(|b| self.regs.read().get(&b.reg_id).cloned())
            .filter(|r| r.contains(addr, len));
        by_handle
            .or_else(|| self.find_registration(addr, len))
            .map(|r| {
                let d = r.desc(ep);
                (r, d)
            })
    }
}

/// Whether `p` is GPU memory.
pub(super) fn is_device(p: *const c_void) -> bool {
    matches!(cuda::pointer_kind(p), PtrKind::Device { .. })
}

/// Copies `n` bytes between any two of host and GPU memory (the driver where either is GPU memory).
pub(super) fn copy_any(dst: *mut u8, src: *const u8, n: usize) -> TResult<()> {
    let device = is_device(dst as *const c_void) || is_device(src as *const c_void);
    // SAFETY: both ranges come from NVSHMEM buffers (or our bounce buffers) of at least n bytes
    // that do not overlap (bounce buffer vs user buffer).
    unsafe { crate::mover::copy_bytes(dst, src, n, device) }.map_err(|e| internal(e.to_string()))
}

/// Copies `(dst, src, len)` entries between host memory and, where `device` says so, GPU memory:
/// `memcpy` each when `device` is false, else all enqueued on one non-blocking stream and waited
/// for once ([`crate::cuda::CopyBatch`]), not one synchronisation per copy.
pub(super) fn copy_many(copies: &[(u64, u64, usize)], device: bool) -> TResult<()> {
    if !device {
        for &(d, s, n) in copies {
            // SAFETY: callers pass ranges of this process that do not overlap (a send slot or a
            // receive buffer against a registered buffer).
            unsafe { crate::mover::copy_bytes(d as *mut u8, s as *const u8, n, false) }
                .map_err(|e| internal(e.to_string()))?;
        }
        return Ok(());
    }
    let mut batch = crate::cuda::CopyBatch::new().map_err(|e| internal(e.to_string()))?;
    for &(d, s, n) in copies {
        // SAFETY: as above; the batch is waited for before returning, also after an error (the
        // copies enqueued before it must not outlive the call).
        if let Err(e) = unsafe { batch.copy(d as *mut c_void, s as *const c_void, n) } {
            let _ = batch.wait();
            return Err(internal(e.to_string()));
        }
    }
    batch.wait().map_err(|e| internal(e.to_string()))
}

/// Whether every page of `[addr, addr+len)` is mapped in this process (`mincore` fails with ENOMEM
/// on any page that is not).
fn host_range_mapped(addr: usize, len: usize) -> Result<(), String> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or("range wraps")?
        & !(page - 1);
    const CHUNK_PAGES: usize = 1 << 16;
    let mut vec = vec![0u8; CHUNK_PAGES.min((end - start) / page)];
    let mut at = start;
    while at < end {
        let n = CHUNK_PAGES.min((end - at) / page);
        // SAFETY: mincore only inspects the mapping of the range; `vec` holds one byte per page.
        let r = unsafe { libc::mincore(at as *mut c_void, n * page, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(format!(
                "page span {at:#x}+{}: {}",
                n * page,
                std::io::Error::last_os_error()
            ));
        }
        at += n * page;
    }
    Ok(())
}

pub(super) fn write_any(dst: *mut u8, bytes: &[u8]) -> TResult<()> {
    copy_any(dst, bytes.as_ptr(), bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_blob_roundtrip_and_range() {
        let b = HandleBlob {
            magic: HANDLE_MAGIC,
            version: HANDLE_VERSION,
            base: 0x1000,
            len: 0x100,
            ..Default::default()
        };
        let mut h = MemHandle {
            reserved: [0; abi::MEM_HANDLE_SIZE],
        };
        b.write(&mut h);
        let r = HandleBlob::read(&h).unwrap();
        assert_eq!(r, b);
        assert!(r.contains(0x1000, 0x100));
        assert!(r.contains(0x10ff, 1));
        assert!(!r.contains(0x10ff, 2));
        assert!(!r.contains(0xfff, 1));
        assert!(!r.contains(u64::MAX, 1));
        let zero = MemHandle {
            reserved: [0; abi::MEM_HANDLE_SIZE],
        };
        assert!(HandleBlob::read(&zero).is_none());
        assert!(HandleBlob::read(std::ptr::null()).is_none());
    }
}
