//! Asynchronous copies on a non-blocking stream of its own, and events to poll their completion
//! without blocking: the copy engine runs many copies per synchronisation, and nothing here waits
//! on the legacy default stream (which would wait for the application's running kernels).
use cudarc::driver::sys;

use super::{check, require, ContextGuard, CudaResult};

/// A non-blocking stream of one context, destroyed on drop.
#[derive(Debug)]
pub struct CopyStream {
    ctx: usize,
    stream: usize,
}

// SAFETY: driver stream handles may be used from any thread; every call pushes the stream's
// context first. Callers serialise enqueues that must stay ordered.
unsafe impl Send for CopyStream {}
// SAFETY: as above.
unsafe impl Sync for CopyStream {}

impl CopyStream {
    /// A new non-blocking stream in context `ctx` (0: the current context).
    pub fn new(ctx: usize) -> CudaResult<CopyStream> {
        require("cuStreamCreate")?;
        let _g = ContextGuard::enter(ctx)?;
        let mut st: sys::CUstream = std::ptr::null_mut();
        // SAFETY: creates a stream in the context just made current; writes one handle.
        check(
            unsafe {
                sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            || "cuStreamCreate(NON_BLOCKING)".into(),
        )?;
        Ok(CopyStream {
            ctx: super::current_context(),
            stream: st as usize,
        })
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> usize {
        self.ctx
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
        let _g = ContextGuard::enter(self.ctx)?;
        // SAFETY: the caller guarantees the ranges; the stream belongs to the pushed context.
        check(
            unsafe { sys::cuMemcpyAsync(dst, src, len, self.stream as sys::CUstream) },
            || format!("cuMemcpyAsync({dst:#x} <- {src:#x}, {len} bytes)"),
        )
    }

    /// Records `ev` after everything enqueued so far.
    pub fn record(&self, ev: &Event) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.ctx)?;
        // SAFETY: both handles belong to this process and to the pushed context.
        check(
            unsafe { sys::cuEventRecord(ev.ev as sys::CUevent, self.stream as sys::CUstream) },
            || "cuEventRecord".into(),
        )
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        if let Ok(_g) = ContextGuard::enter(self.ctx) {
            // SAFETY: created by new(), destroyed once; pending work still completes (driver rule).
            unsafe {
                let _ = sys::cuStreamDestroy_v2(self.stream as sys::CUstream);
            }
        }
    }
}

/// An event without timing (cheapest to record and query), destroyed on drop.
#[derive(Debug)]
pub struct Event {
    ctx: usize,
    ev: usize,
}

// SAFETY: event handles may be used from any thread; calls push the event's context.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// A new event in context `ctx` (0: the current context).
    pub fn new(ctx: usize) -> CudaResult<Event> {
        require("cuEventCreate")?;
        let _g = ContextGuard::enter(ctx)?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe {
                sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            },
            || "cuEventCreate(DISABLE_TIMING)".into(),
        )?;
        Ok(Event {
            ctx: super::current_context(),
            ev: ev as usize,
        })
    }

    /// Whether the work before the last record has completed (never blocks). An event never
    /// recorded counts as complete (driver rule).
    pub fn done(&self) -> CudaResult<bool> {
        let _g = ContextGuard::enter(self.ctx)?;
        // SAFETY: a live event of this process.
        let r = unsafe { sys::cuEventQuery(self.ev as sys::CUevent) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, || "cuEventQuery".into()).map(|()| true),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_g) = ContextGuard::enter(self.ctx) {
            // SAFETY: created by new(), destroyed once.
            unsafe {
                let _ = sys::cuEventDestroy_v2(self.ev as sys::CUevent);
            }
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
