//! Asynchronous copies on a non-blocking stream of its own, and events to poll their completion
//! without blocking: the copy engine runs many copies per synchronisation, and nothing here waits
//! on the legacy default stream (which would wait for the application's running kernels).
use cudarc::driver::sys;

use super::{check, ContextGuard, ContextObject, CudaResult};

/// A non-blocking stream of one context, destroyed on drop (pending work still completes: driver
/// rule). Callers serialise enqueues that must stay ordered.
#[derive(Debug)]
pub struct CopyStream(ContextObject);

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

impl CopyStream {
    /// A new non-blocking stream in context `ctx` (0: the current context).
    pub fn new(ctx: usize) -> CudaResult<CopyStream> {
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let (api, what) = ("cuStreamCreate", "cuStreamCreate(NON_BLOCKING)");
        ContextObject::create_flagged(ctx, api, what, sys::cuStreamCreate, flags, destroy_stream)
            .map(CopyStream)
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> usize {
        self.0.ctx
    }

    fn stream(&self) -> sys::CUstream {
        self.0.handle as sys::CUstream
    }

    /// Enqueues a copy of `len` bytes (unified addressing: host or device on either side). It has
    /// landed once an event recorded after it reports done.
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until the copy has completed.
    pub unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        let _g = ContextGuard::enter(self.0.ctx)?;
        // SAFETY: the caller guarantees the ranges; the stream belongs to the pushed context.
        check(
            unsafe { sys::cuMemcpyAsync(dst, src, len, self.stream()) },
            || format!("cuMemcpyAsync({dst:#x} <- {src:#x}, {len} bytes)"),
        )
    }

    /// Records `ev` after everything enqueued so far.
    pub fn record(&self, ev: &Event) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.0.ctx)?;
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
        let e = CopyStream::new(0).unwrap_err();
        assert_eq!(e.code, -1);
        assert!(e.to_string().contains("not available"), "{e}");
        assert_eq!(Event::new(0).unwrap_err().code, -1);
    }
}
