//! Asynchronous copies on a non-blocking stream of its own, and events to poll their completion
//! without blocking: the copy engine runs many copies per synchronisation, and nothing here waits
//! on the legacy default stream (which would wait for the application's running kernels). The
//! library's one kernel ([`super::kernel`]) runs on such a stream too.
use cudarc::driver::sys;

use super::{check, ContextGuard, ContextObject, CudaError, CudaResult};

/// A non-blocking stream of one context, destroyed on drop (pending work still completes: driver
/// rule). Callers serialise enqueues that must stay ordered.
#[derive(Debug)]
pub struct CopyStream {
    obj: ContextObject,
    /// Copies go through the batch API with the overlap hint (asked for, the driver has it, and it
    /// has not refused a batch call on this stream).
    overlap: std::sync::atomic::AtomicBool,
}

/// Destroys a stream `ContextObject::create` got from `cuStreamCreate`.
///
/// # Safety
/// Called once per stream, with its context current.
unsafe fn destroy_stream(h: usize) -> sys::CUresult {
    // SAFETY: per the contract.
    unsafe { sys::cuStreamDestroy_v2(h as sys::CUstream) }
}

/// Destroys an event `ContextObject::create` got from `cuEventCreate`.
///
/// # Safety
/// Called once per event, with its context current.
unsafe fn destroy_event(h: usize) -> sys::CUresult {
    // SAFETY: per the contract.
    unsafe { sys::cuEventDestroy_v2(h as sys::CUevent) }
}

/// Whether the driver has `cuMemcpyBatchAsync` (asked once).
fn driver_has_batch_copies() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let v = super::driver_version().unwrap_or(0);
        tracing::debug!(
            "copies: driver {v}, batch copies with the overlap hint {}",
            if v >= BATCH_API_DRIVER {
                "available"
            } else {
                "not available"
            }
        );
        v >= BATCH_API_DRIVER
    })
}

/// The first driver with `cuMemcpyBatchAsync` (CUDA 12.8).
const BATCH_API_DRIVER: i32 = 12080;

/// One `cuMemcpyBatchAsync` over the entries of `dsts`, `srcs`, `sizes` (as many in each):
/// stream-ordered sources, overlap-with-compute hint, no order among the copies. `what` names the
/// call in an error.
///
/// # Safety
/// Every range valid for its size until the copies complete; `stream` belongs to the current
/// context; the driver has the batch API.
unsafe fn batch_call(
    dsts: &mut [sys::CUdeviceptr],
    srcs: &mut [sys::CUdeviceptr],
    sizes: &mut [usize],
    stream: sys::CUstream,
    what: impl FnOnce(usize) -> String,
) -> CudaResult<()> {
    debug_assert!(dsts.len() == srcs.len() && srcs.len() == sizes.len());
    // SAFETY: a plain C struct of enums and ints, for which all-zero is valid (location type
    // INVALID: no hint; the hints only matter for managed memory).
    let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.flags = sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32;
    let mut idx = [0usize];
    let mut fail_idx = usize::MAX;
    // SAFETY: the three arrays hold `count` entries and the attribute arrays `numAttrs` (1), all
    // outliving the call; the caller guarantees the ranges, the stream and the symbol.
    let r = unsafe {
        sys::cuMemcpyBatchAsync(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            &mut attr,
            idx.as_mut_ptr(),
            1,
            &mut fail_idx,
            stream,
        )
    };
    check(r, || what(fail_idx))
}

/// One copy through `cuMemcpyBatchAsync` (see [`batch_call`]).
///
/// # Safety
/// Both ranges valid for `len` bytes until the copy completes; `stream` belongs to the current
/// context; the driver has the batch API.
unsafe fn batch_copy(dst: u64, src: u64, len: usize, stream: sys::CUstream) -> CudaResult<()> {
    // SAFETY: the caller's guarantee.
    unsafe {
        batch_call(
            &mut [dst as sys::CUdeviceptr],
            &mut [src as sys::CUdeviceptr],
            &mut [len],
            stream,
            |_| format!("cuMemcpyBatchAsync({dst:#x} <- {src:#x}, {len} bytes)"),
        )
    }
}

/// Copies through one `cuMemcpyBatchAsync` (see [`batch_call`]), in no particular order among
/// themselves.
///
/// # Safety
/// As [`batch_copy`] for every entry.
unsafe fn batch_copy_many(copies: &[(u64, u64, usize)], stream: sys::CUstream) -> CudaResult<()> {
    let mut dsts: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.0 as sys::CUdeviceptr).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.1 as sys::CUdeviceptr).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
    // SAFETY: the caller's guarantee.
    unsafe {
        batch_call(&mut dsts, &mut srcs, &mut sizes, stream, |at| {
            format!(
                "cuMemcpyBatchAsync({} copies, failed at {at})",
                copies.len()
            )
        })
    }
}

/// Most copies one batch call takes.
const BATCH_MAX: usize = 1024;

impl CopyStream {
    /// A new non-blocking stream in context `ctx` (0: the current context); `overlap`: copy through
    /// the batch API with the overlap hint where the driver has it (`NVSHMEM_EFA_COPY_OVERLAP`).
    pub fn new(ctx: usize, overlap: bool) -> CudaResult<CopyStream> {
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let (api, what) = ("cuStreamCreate", "cuStreamCreate(NON_BLOCKING)");
        let obj = ContextObject::create_flagged(
            ctx,
            api,
            what,
            sys::cuStreamCreate,
            flags,
            destroy_stream,
        )?;
        Ok(CopyStream {
            obj,
            overlap: std::sync::atomic::AtomicBool::new(overlap && driver_has_batch_copies()),
        })
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> usize {
        self.obj.ctx
    }

    fn stream(&self) -> sys::CUstream {
        self.obj.handle as sys::CUstream
    }

    /// Enqueues a copy of `len` bytes (unified addressing: host or device on either side). It has
    /// landed once an event recorded after it reports done.
    ///
    /// Where the driver has the batch copy API (CUDA 12.8 and later), the copy is a one-entry
    /// `cuMemcpyBatchAsync` with `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`: a device-to-device
    /// copy may otherwise run as a copy kernel, which cannot start while a kernel that waits for
    /// this very copy holds every SM (a persistent GDA kernel waiting for its completions).
    /// Elsewhere, or when the driver refuses the batch call, `cuMemcpyAsync` (logged once).
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until the copy has completed.
    pub unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        let _g = ContextGuard::enter(self.obj.ctx)?;
        if self.overlap.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: the caller guarantees the ranges; the stream belongs to the pushed context.
            match unsafe { batch_copy(dst, src, len, self.stream()) } {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.overlap
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        "{e}: this stream's copies go through cuMemcpyAsync from now on (a device-to-device copy \
                         may then wait for running kernels)"
                    );
                }
            }
        }
        // SAFETY: the caller guarantees the ranges; the stream belongs to the pushed context.
        check(
            unsafe { sys::cuMemcpyAsync(dst, src, len, self.stream()) },
            || format!("cuMemcpyAsync({dst:#x} <- {src:#x}, {len} bytes)"),
        )
    }

    /// Enqueues copies that may run in any order among themselves, in one `cuMemcpyBatchAsync` per
    /// [`BATCH_MAX`] copies where the driver has it (one driver call instead of one per copy, which
    /// bounds a queue of small copies), else one by one. Returns how many it enqueued (a prefix)
    /// and the error that stopped the rest. A refused batch call turns the batch API off for this
    /// stream, as in [`CopyStream::copy`], and the copies go one by one (a copy of the refused
    /// batch the driver had started is then done twice, with the same bytes).
    ///
    /// # Safety
    /// As [`CopyStream::copy`] for every entry.
    pub unsafe fn copy_many(&self, copies: &[(u64, u64, usize)]) -> (usize, Option<CudaError>) {
        let live: Vec<(u64, u64, usize)> = copies.iter().copied().filter(|c| c.2 > 0).collect();
        if live.len() > 1 && self.overlap.load(std::sync::atomic::Ordering::Relaxed) {
            let guard = ContextGuard::enter(self.obj.ctx);
            if let Err(e) = guard {
                return (0, Some(e));
            }
            let mut ok = true;
            for chunk in live.chunks(BATCH_MAX) {
                // SAFETY: the caller guarantees the ranges; the stream belongs to the pushed
                // context.
                if let Err(e) = unsafe { batch_copy_many(chunk, self.stream()) } {
                    self.overlap
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        "{e}: this stream's copies go through cuMemcpyAsync from now on (a device-to-device \
                         copy may then wait for running kernels)"
                    );
                    ok = false;
                    break;
                }
            }
            if ok {
                return (copies.len(), None);
            }
        }
        for (i, &(dst, src, len)) in copies.iter().enumerate() {
            // SAFETY: the caller's guarantee, entry by entry.
            if let Err(e) = unsafe { self.copy(dst, src, len) } {
                return (i, Some(e));
            }
        }
        (copies.len(), None)
    }

    /// Whether everything enqueued so far has completed (`cuStreamQuery`; never blocks). Answers
    /// for the whole stream without an event recorded first.
    pub fn idle(&self) -> CudaResult<bool> {
        let _g = ContextGuard::enter(self.obj.ctx)?;
        // SAFETY: a live stream of this process, its context pushed.
        let r = unsafe { sys::cuStreamQuery(self.stream()) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, || "cuStreamQuery".into()).map(|()| true),
        }
    }

    /// Makes work enqueued on this stream from now on wait until the work before `ev`'s last
    /// record (on any stream of the same context) has completed (`cuStreamWaitEvent`; never blocks
    /// the host).
    pub fn wait(&self, ev: &Event) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.obj.ctx)?;
        // SAFETY: both handles belong to this process and to the pushed context.
        check(
            unsafe { sys::cuStreamWaitEvent(self.stream(), ev.event(), 0) },
            || "cuStreamWaitEvent".into(),
        )
    }

    /// The driver's handle, for launches on this stream ([`super::kernel`]).
    pub(crate) fn handle(&self) -> sys::CUstream {
        self.stream()
    }

    /// Records `ev` after everything enqueued so far.
    pub fn record(&self, ev: &Event) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.obj.ctx)?;
        // SAFETY: both handles belong to this process and to the pushed context.
        check(
            unsafe { sys::cuEventRecord(ev.event(), self.stream()) },
            || "cuEventRecord".into(),
        )
    }
}

/// An event without timing (cheapest to record and query), destroyed on drop.
#[derive(Debug)]
pub struct Event(ContextObject);

impl Event {
    /// A new event in context `ctx` (0: the current context).
    pub fn new(ctx: usize) -> CudaResult<Event> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let (api, what) = ("cuEventCreate", "cuEventCreate(DISABLE_TIMING)");
        ContextObject::create_flagged(ctx, api, what, sys::cuEventCreate, flags, destroy_event)
            .map(Event)
    }

    fn event(&self) -> sys::CUevent {
        self.0.handle as sys::CUevent
    }

    /// Records the event on raw stream `stream` of its context (`cuEventRecord`).
    pub(crate) fn record_on(&self, stream: usize) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.0.ctx)?;
        // SAFETY: a live event and a live stream of the same context.
        check(
            unsafe { sys::cuEventRecord(self.event(), stream as sys::CUstream) },
            || "cuEventRecord".into(),
        )
    }

    /// Whether the work before the last record has completed (never blocks). An event never
    /// recorded counts as complete (driver rule).
    pub fn done(&self) -> CudaResult<bool> {
        let _g = ContextGuard::enter(self.0.ctx)?;
        // SAFETY: a live event of this process.
        let r = unsafe { sys::cuEventQuery(self.event()) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, || "cuEventQuery".into()).map(|()| true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_streams_and_events_fail_cleanly() {
        if super::super::available() {
            return; // covered on the GPU node
        }
        let e = CopyStream::new(0, true).unwrap_err();
        assert_eq!(e.code, -1);
        assert!(e.to_string().contains("not available"), "{e}");
        assert_eq!(Event::new(0).unwrap_err().code, -1);
    }
}
