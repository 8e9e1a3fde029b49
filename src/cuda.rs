//! The few CUDA driver calls the library makes, through cudarc's dynamically loaded driver API: the
//! library loads and runs its host paths on machines without CUDA; every call here first checks that
//! the driver is present and initialised.
use std::ffi::{c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

use cudarc::driver::sys;

pub mod dmabuf;
pub mod ipc;
pub mod kernel;
pub mod stream;
pub mod vmm;

/// A CUDA driver error with context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaError {
    /// The driver's result code (`CUresult` as an integer); -1 when the driver is absent.
    pub code: i32,
    /// What was being done.
    pub context: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code < 0 {
            return write!(f, "{}: CUDA driver not available", self.context);
        }
        write!(f, "{}: CUDA error {}", self.context, self.code)?;
        if let Some(s) = error_string(self.code) {
            write!(f, " ({s})")?;
        }
        Ok(())
    }
}

impl std::error::Error for CudaError {}

/// Result of a CUDA call.
pub type CudaResult<T> = Result<T, CudaError>;

fn error_string(code: i32) -> Option<String> {
    if !available() {
        return None;
    }
    // SAFETY: code came from the driver; transmute into the enum is valid for driver-returned values.
    unsafe {
        let r: sys::CUresult = std::mem::transmute::<u32, sys::CUresult>(code as u32);
        let mut p: *const libc::c_char = std::ptr::null();
        if sys::cuGetErrorString(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            return Some(CStr::from_ptr(p).to_string_lossy().into_owned());
        }
    }
    None
}

fn check(r: sys::CUresult, context: impl FnOnce() -> String) -> CudaResult<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError {
            code: r as i32,
            context: context(),
        })
    }
}

fn require(context: &str) -> CudaResult<()> {
    if available() {
        Ok(())
    } else {
        Err(CudaError {
            code: -1,
            context: context.to_string(),
        })
    }
}

/// The CUDA driver version (`cuDriverGetVersion`, e.g. 13000 for CUDA 13.0), `None` when libcuda
/// cannot be loaded or does not answer. Does not initialise CUDA.
pub fn driver_version() -> Option<i32> {
    // SAFETY: is_culib_present only tries to load libcuda; cuDriverGetVersion needs no cuInit and
    // writes one int into a valid local.
    unsafe {
        if !sys::is_culib_present() {
            return None;
        }
        let mut v: std::ffi::c_int = 0;
        (sys::cuDriverGetVersion(&mut v) == sys::CUresult::CUDA_SUCCESS && v > 0).then_some(v)
    }
}

/// True when libcuda could be loaded and `cuInit` succeeded (cached).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: probing for the library has no preconditions; cuInit is only called if it loads.
        unsafe { sys::is_culib_present() && sys::cuInit(0) == sys::CUresult::CUDA_SUCCESS }
    })
}

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtrKind {
    /// Host memory (pageable, or not known to CUDA).
    Host,
    /// Device memory of `ordinal`; `legacy_ipc` tells whether cudaIpcGetMemHandle accepts it (false
    /// for VMM allocations made with cuMemCreate).
    Device {
        /// Device ordinal.
        ordinal: i32,
        /// Whether legacy CUDA IPC can export the allocation.
        legacy_ipc: bool,
    },
}

/// Classifies `ptr`. Without a CUDA driver everything is host memory.
pub fn pointer_kind(ptr: *const c_void) -> PtrKind {
    if !available() || ptr.is_null() {
        return PtrKind::Host;
    }
    // SAFETY: cuPointerGetAttribute writes into properly sized outputs; failure means "not CUDA".
    unsafe {
        let mut mem_type: u32 = 0;
        let r = sys::cuPointerGetAttribute(
            &mut mem_type as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as sys::CUdeviceptr,
        );
        if r != sys::CUresult::CUDA_SUCCESS
            || mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
        {
            return PtrKind::Host;
        }
        let mut ordinal: i32 = 0;
        let _ = sys::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as sys::CUdeviceptr,
        );
        let mut ipc: i32 = 0;
        let r = sys::cuPointerGetAttribute(
            &mut ipc as *mut i32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            ptr as sys::CUdeviceptr,
        );
        PtrKind::Device {
            ordinal,
            legacy_ipc: r == sys::CUresult::CUDA_SUCCESS && ipc != 0,
        }
    }
}

/// PCI address (domain, bus, device) of the current context's GPU; `None` without a driver or a
/// current context. The NIC choice of rails looks the GPU up in sysfs with it.
pub fn current_device_pci() -> Option<(u32, u8, u8)> {
    if current_context() == 0 {
        return None;
    }
    let mut dev: sys::CUdevice = 0;
    let attr = |a: sys::CUdevice_attribute, dev: sys::CUdevice| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int for a valid device ordinal.
        (unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) } == sys::CUresult::CUDA_SUCCESS)
            .then_some(v)
    };
    // SAFETY: writes one int for the current context.
    if unsafe { sys::cuCtxGetDevice(&mut dev) } != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    use sys::CUdevice_attribute as A;
    Some((
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev)? as u32,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev)? as u8,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev)? as u8,
    ))
}

/// The calling thread's current context (null if none), to make current in helper threads.
pub fn current_context() -> usize {
    if !available() {
        return 0;
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    unsafe {
        let _ = sys::cuCtxGetCurrent(&mut ctx);
    }
    ctx as usize
}

/// Makes device `ordinal`'s primary context current in this thread unless a context already is
/// (for programs with no other CUDA user: tools and tests). The primary context is retained for the
/// life of the process. Fails without a driver or without such a device.
pub fn use_primary_context(ordinal: i32) -> CudaResult<()> {
    require("cuDevicePrimaryCtxRetain")?;
    if current_context() != 0 {
        return Ok(());
    }
    let mut dev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialised (available() ran cuInit); outputs are locals; the retained
    // primary context stays alive for the life of the process.
    unsafe {
        check(sys::cuDeviceGet(&mut dev, ordinal), || {
            format!("cuDeviceGet({ordinal})")
        })?;
        check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), || {
            "cuDevicePrimaryCtxRetain".into()
        })?;
        check(sys::cuCtxSetCurrent(ctx), || "cuCtxSetCurrent".into())
    }
}

/// Keeps a context current in this thread while it lives: pushes it unless it already is current,
/// and pops it again on drop, so that the thread's own current context (NVSHMEM's proxy thread,
/// the application thread) is left as it was.
pub struct ContextGuard {
    pushed: bool,
    /// Push and pop must happen on the same thread.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ContextGuard {
    /// Makes `ctx` (from [`current_context`]) current; a no-op guard for 0 or when it already is.
    pub fn enter(ctx: usize) -> CudaResult<ContextGuard> {
        require("cuCtxPushCurrent")?;
        if ctx == 0 || current_context() == ctx {
            return Ok(ContextGuard {
                pushed: false,
                _not_send: std::marker::PhantomData,
            });
        }
        // SAFETY: ctx is a context handle obtained from the driver in this process and still alive
        // (contexts outlive the transport).
        check(
            unsafe { sys::cuCtxPushCurrent_v2(ctx as sys::CUcontext) },
            || "cuCtxPushCurrent".into(),
        )?;
        Ok(ContextGuard {
            pushed: true,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut prev: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops exactly the context this guard pushed on this thread (the guard is not Send).
            unsafe {
                let _ = sys::cuCtxPopCurrent_v2(&mut prev);
            }
        }
    }
}

/// A driver object of one context (stream, event, IPC mapping), kept as a plain handle and
/// released on drop with its context current. Handles of this process may be used from any thread;
/// every call on one pushes its context first.
#[derive(Debug)]
struct ContextObject {
    ctx: usize,
    handle: usize,
    release: unsafe fn(usize) -> sys::CUresult,
}

impl ContextObject {
    /// Creates an object in context `ctx` (0: the current context) through `create`, which returns
    /// the driver's answer and the handle it wrote; `api` names the driver call (checked for), `what`
    /// the failure. `release` destroys the handle on drop.
    fn create(
        ctx: usize,
        api: &str,
        what: &str,
        create: impl FnOnce() -> (sys::CUresult, usize),
        release: unsafe fn(usize) -> sys::CUresult,
    ) -> CudaResult<ContextObject> {
        require(api)?;
        let _g = ContextGuard::enter(ctx)?;
        let (r, handle) = create();
        check(r, || what.into())?;
        Ok(ContextObject {
            ctx: current_context(),
            handle,
            release,
        })
    }

    /// [`ContextObject::create`] for a driver constructor of the form `create(&mut handle, flags)`.
    fn create_flagged<H>(
        ctx: usize,
        api: &str,
        what: &str,
        create: unsafe fn(*mut *mut H, std::ffi::c_uint) -> sys::CUresult,
        flags: u32,
        release: unsafe fn(usize) -> sys::CUresult,
    ) -> CudaResult<ContextObject> {
        let make = || {
            let mut h: *mut H = std::ptr::null_mut();
            // SAFETY: a driver constructor writing one handle, called in the context just made
            // current with flags its caller chose.
            let r = unsafe { create(&mut h, flags) };
            (r, h as usize)
        };
        ContextObject::create(ctx, api, what, make, release)
    }
}

impl Drop for ContextObject {
    fn drop(&mut self) {
        if let Ok(_g) = ContextGuard::enter(self.ctx) {
            // SAFETY: the handle came from `create` in this context and is released once, here;
            // `release` is the driver call that destroys handles of its kind.
            unsafe {
                let _ = (self.release)(self.handle);
            }
        }
    }
}

/// Makes `ctx` (from `current_context`) current in this thread; no-op for 0.
pub fn set_current_context(ctx: usize) -> CudaResult<()> {
    if ctx == 0 {
        return Ok(());
    }
    require("cuCtxSetCurrent")?;
    // SAFETY: ctx is a context handle obtained from the driver in this process.
    check(
        unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) },
        || "cuCtxSetCurrent".into(),
    )
}

/// Copy between any two addresses (host or device, unified addressing) that returns once the data
/// has landed, without waiting for anything else on the GPU.
///
/// The copy runs on a non-blocking stream of the calling thread's current context (one stream per
/// context, created on first use). A plain `cuMemcpy`/`cudaMemcpy` runs on the legacy default stream,
/// which waits for every kernel running in blocking streams: a kernel that waits in `quiet` for this
/// very copy would deadlock. Without a current context the context given to
/// `set_fallback_context` is made current first.
///
/// # Safety
/// Both ranges must be valid for `len` bytes.
pub unsafe fn memcpy(dst: *mut c_void, src: *const c_void, len: usize) -> CudaResult<()> {
    require("cuMemcpyAsync")?;
    if len == 0 {
        return Ok(());
    }
    let stream = copy_stream()?;
    let _guard = stream.1.lock();
    // SAFETY: caller guarantees the ranges; the stream belongs to the current context.
    unsafe {
        check(
            sys::cuMemcpyAsync(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                len,
                stream.0 as sys::CUstream,
            ),
            || format!("cuMemcpyAsync({dst:p} <- {src:p}, {len} bytes)"),
        )?;
        check(sys::cuStreamSynchronize(stream.0 as sys::CUstream), || {
            "cuStreamSynchronize".into()
        })
    }
}

/// The copy stream of the calling thread's current context (the fallback context made current
/// first when none is).
fn copy_stream() -> CudaResult<&'static StreamSlot> {
    let ctx = match current_context() {
        0 => {
            let f = FALLBACK_CTX.load(std::sync::atomic::Ordering::Relaxed);
            set_current_context(f)?;
            f
        }
        c => c,
    };
    stream_for(ctx)
}

/// Copies enqueued on the same non-blocking stream as [`memcpy`] and waited for together: one
/// synchronisation for a burst of small copies instead of one each (the staging paths' per-message
/// cost). The host side of each copy must be page-locked for the copy to be asynchronous.
pub struct CopyBatch {
    stream: &'static StreamSlot,
    pending: usize,
}

impl CopyBatch {
    /// A batch on the calling thread's context (or the fallback context).
    pub fn new() -> CudaResult<CopyBatch> {
        require("cuMemcpyAsync")?;
        Ok(CopyBatch {
            stream: copy_stream()?,
            pending: 0,
        })
    }

    /// Enqueues a copy; it has landed once [`CopyBatch::wait`] returned `Ok`.
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until `wait` returns.
    pub unsafe fn copy(
        &mut self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
    ) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        let _guard = self.stream.1.lock();
        // SAFETY: caller guarantees the ranges; the stream belongs to the current context.
        check(
            unsafe {
                sys::cuMemcpyAsync(
                    dst as sys::CUdeviceptr,
                    src as sys::CUdeviceptr,
                    len,
                    self.stream.0 as sys::CUstream,
                )
            },
            || format!("cuMemcpyAsync({dst:p} <- {src:p}, {len} bytes)"),
        )?;
        self.pending += 1;
        Ok(())
    }

    /// Copies enqueued since the last wait.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Waits for every enqueued copy.
    pub fn wait(&mut self) -> CudaResult<()> {
        if self.pending == 0 {
            return Ok(());
        }
        self.pending = 0;
        let _guard = self.stream.1.lock();
        // SAFETY: the stream belongs to this process.
        check(
            unsafe { sys::cuStreamSynchronize(self.stream.0 as sys::CUstream) },
            || "cuStreamSynchronize".into(),
        )
    }
}

/// Enqueues a copy on the copy stream of the calling thread's context (the one [`memcpy`] and
/// [`CopyBatch`] use) and returns without waiting: the copy has landed once an event recorded
/// after it ([`copy_mark`]) is done. The host side must be page-locked for the copy to be
/// asynchronous (else the driver finishes it before returning).
///
/// # Safety
/// Both ranges must stay valid for `len` bytes until an event recorded after the copy is done.
pub unsafe fn memcpy_async(dst: *mut c_void, src: *const c_void, len: usize) -> CudaResult<()> {
    require("cuMemcpyAsync")?;
    if len == 0 {
        return Ok(());
    }
    let stream = copy_stream()?;
    let _guard = stream.1.lock();
    // SAFETY: caller guarantees the ranges; the stream belongs to the current context.
    check(
        unsafe {
            sys::cuMemcpyAsync(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                len,
                stream.0 as sys::CUstream,
            )
        },
        || format!("cuMemcpyAsync({dst:p} <- {src:p}, {len} bytes)"),
    )
}

/// An event recorded on the copy stream of context `ctx` (0: the calling thread's) after every
/// copy enqueued on it so far ([`memcpy_async`], [`CopyBatch`]): polled with
/// [`stream::Event::done`], never waited for.
pub fn copy_mark(ctx: usize) -> CudaResult<stream::Event> {
    let _g = ContextGuard::enter(ctx)?;
    let stream = copy_stream()?;
    let ev = stream::Event::new(current_context())?;
    let _guard = stream.1.lock();
    ev.record_on(stream.0)?;
    Ok(ev)
}

static FALLBACK_CTX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The context to use in threads that have none current (captured where the application's context
/// is current, e.g. in NVSHMEM's connect).
pub fn set_fallback_context(ctx: usize) {
    if ctx != 0 {
        FALLBACK_CTX.store(ctx, std::sync::atomic::Ordering::Relaxed);
    }
}

type StreamSlot = (usize, parking_lot::Mutex<()>);

/// The non-blocking copy stream of context `ctx` (created once and kept as long as the process:
/// contexts outlive the transport).
fn stream_for(ctx: usize) -> CudaResult<&'static StreamSlot> {
    static STREAMS: OnceLock<parking_lot::Mutex<Vec<(usize, &'static StreamSlot)>>> =
        OnceLock::new();
    let streams = STREAMS.get_or_init(|| parking_lot::Mutex::new(Vec::new()));
    let mut list = streams.lock();
    if let Some((_, s)) = list.iter().find(|(c, _)| *c == ctx) {
        return Ok(s);
    }
    let mut st: sys::CUstream = std::ptr::null_mut();
    // SAFETY: creates a stream in the current context (ctx is current in this thread).
    check(
        unsafe { sys::cuStreamCreate(&mut st, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        || "cuStreamCreate(NON_BLOCKING)".into(),
    )?;
    let slot: &'static StreamSlot = Box::leak(Box::new((st as usize, parking_lot::Mutex::new(()))));
    list.push((ctx, slot));
    Ok(slot)
}

/// `len` bytes the driver allocated at `addr`, released on drop by `free`.
struct DriverAlloc {
    addr: u64,
    len: usize,
    free: unsafe fn(u64) -> sys::CUresult,
}

impl Drop for DriverAlloc {
    fn drop(&mut self) {
        // SAFETY: `addr` came from the allocation call `free` belongs to and is released once.
        unsafe {
            let _ = (self.free)(self.addr);
        }
    }
}

/// Releases pinned host memory from `cuMemHostAlloc`.
///
/// # Safety
/// `addr` must come from `cuMemHostAlloc` and be released once.
unsafe fn free_host(addr: u64) -> sys::CUresult {
    // SAFETY: per the contract.
    unsafe { sys::cuMemFreeHost(addr as *mut c_void) }
}

/// Pinned, device-mapped host memory (`cuMemHostAlloc(DEVICEMAP)`), zeroed. Freed on drop. The
/// memory is plain memory shared with the GPU; access is coordinated by its users.
pub struct MappedHostBuffer {
    mem: DriverAlloc,
    device: u64,
}

impl MappedHostBuffer {
    /// Allocates `len` bytes.
    pub fn new(len: usize) -> CudaResult<MappedHostBuffer> {
        require("cuMemHostAlloc")?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: allocation with valid flags; the result written to a local.
        check(
            unsafe { sys::cuMemHostAlloc(&mut host, len, sys::CU_MEMHOSTALLOC_DEVICEMAP) },
            || format!("cuMemHostAlloc({len} bytes, DEVICEMAP)"),
        )?;
        let mem = DriverAlloc {
            addr: host as u64,
            len,
            free: free_host,
        };
        // SAFETY: the new allocation is `len` bytes long.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, len) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: a live allocation of this process; the result written to a local.
        check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) },
            || "cuMemHostGetDevicePointer".into(),
        )?;
        Ok(MappedHostBuffer { mem, device })
    }

    /// Host address.
    pub fn host(&self) -> *mut u8 {
        self.mem.addr as *mut u8
    }

    /// Device address of the same memory.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }
}

/// Device memory (`cuMemAlloc`), zeroed. Freed on drop.
pub struct DeviceBuffer {
    mem: DriverAlloc,
}

impl DeviceBuffer {
    /// Allocates `len` zeroed bytes on the current context's device.
    pub fn new(len: usize) -> CudaResult<DeviceBuffer> {
        require("cuMemAlloc")?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: allocation into a local.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, len) }, || {
            format!("cuMemAlloc({len} bytes)")
        })?;
        let mem = DriverAlloc {
            addr: p,
            len,
            free: sys::cuMemFree_v2,
        };
        // SAFETY: memset of the new allocation, `len` bytes long.
        check(unsafe { sys::cuMemsetD8_v2(p, 0, len) }, || {
            "cuMemsetD8".into()
        })?;
        Ok(DeviceBuffer { mem })
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.mem.addr
    }

    /// Copies `src` to the start of the buffer (stream-ordered, see [`memcpy`]); fails when it does
    /// not fit.
    pub fn upload<T: Copy>(&self, src: &[T]) -> CudaResult<()> {
        let len = std::mem::size_of_val(src);
        if len > self.mem.len {
            return Err(CudaError {
                code: sys::CUresult::CUDA_ERROR_INVALID_VALUE as i32,
                context: format!(
                    "upload of {len} bytes into a device buffer of {}",
                    self.mem.len
                ),
            });
        }
        // SAFETY: the destination is this live allocation, at least `len` bytes long; the source
        // is a slice of exactly `len` bytes.
        unsafe {
            memcpy(
                self.ptr() as *mut c_void,
                src.as_ptr() as *const c_void,
                len,
            )
        }
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }
}

/// Maps an existing host range (an MMIO doorbell or a provider's ring) for the GPU:
/// `cuMemHostRegister(flags)` then `cuMemHostGetDevicePointer`. Unregistered on drop.
pub struct HostRegistration {
    host: *mut c_void,
    device: u64,
}

// SAFETY: a registration is an immutable mapping.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

/// What kind of host range a [`HostRegistration`] maps for the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMapping {
    /// Device MMIO the GPU writes (send ring, doorbells): `DEVICEMAP | IOMEMORY`.
    Io,
    /// Memory the process maps read-only (rdma-core maps a provider-allocated CQ ring with
    /// `PROT_READ`): `DEVICEMAP | READ_ONLY`. Without `READ_ONLY` the driver refuses read-only CPU
    /// mappings on platforms whose GPU does not use the host page tables.
    ReadOnly,
    /// Ordinary host memory: `DEVICEMAP`.
    ReadWrite,
}

impl HostMapping {
    /// The `cuMemHostRegister` flags of this kind.
    pub const fn flags(self) -> u32 {
        match self {
            HostMapping::Io => sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_IOMEMORY,
            HostMapping::ReadOnly => {
                sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_READ_ONLY
            }
            HostMapping::ReadWrite => sys::CU_MEMHOSTREGISTER_DEVICEMAP,
        }
    }
}

impl HostRegistration {
    /// Registers `[host, host+len)` for the GPU as `kind`.
    ///
    /// # Safety
    /// The range must stay mapped until the registration is dropped.
    pub unsafe fn new(
        host: *mut c_void,
        len: usize,
        kind: HostMapping,
    ) -> CudaResult<HostRegistration> {
        require("cuMemHostRegister")?;
        let flags = kind.flags();
        // SAFETY: caller guarantees the range; outputs are locals.
        unsafe {
            check(sys::cuMemHostRegister_v2(host, len, flags), || {
                format!("cuMemHostRegister({host:p}, {len} bytes, flags {flags:#x})")
            })?;
            let mut dev: sys::CUdeviceptr = 0;
            if let Err(e) = check(sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0), || {
                format!("cuMemHostGetDevicePointer({host:p})")
            }) {
                let _ = sys::cuMemHostUnregister(host);
                return Err(e);
            }
            Ok(HostRegistration { host, device: dev })
        }
    }

    /// Device address of the registered range.
    pub fn device(&self) -> u64 {
        self.device
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // SAFETY: host was registered by new().
        unsafe {
            let _ = sys::cuMemHostUnregister(self.host);
        }
    }
}

/// CUDA lazy module loading and this library.
///
/// With lazy loading (the CUDA default since 12.2), the first launch of a kernel, or the first
/// `cudaFuncGetAttributes` on it, loads its module, and loading synchronises the context: it waits
/// for running kernels while it holds the driver's lock. NVSHMEM's on-stream calls
/// (`nvshmemx_*_on_stream`, `nvshmemx_quiet_on_stream`) launch such kernels while earlier ones
/// wait for NVSHMEM's proxy thread, and on providers without GPU RDMA this transport's proxy path
/// copies GPU memory with the driver: the copy waits for the lock, the loader for the kernel, the
/// kernel for the copy. Eager loading (`CUDA_MODULE_LOADING=EAGER`) loads every module when the
/// context is created and removes the cycle.
///
/// The same hook also sets `CUDA_DEVICE_MAX_CONNECTIONS=32` when it is unset. The driver maps every
/// stream of a process (of every client, under CUDA MPS) onto a few hardware work queues, 8 by
/// default; streams that share a queue run in order. This library's copies between GPU memory and
/// its staging buffers run on its own non-blocking stream, but when that stream shares a queue with
/// the application's stream whose kernel waits for the very data the copy delivers (a DeepEP
/// dispatch kernel spinning on a counter), the copy waits behind the kernel forever. Seen on the GPU
/// node: DeepEP's low-latency test, 2 ranks under MPS on one GPU, the receiving software queue's
/// consumer stuck in `cuStreamSynchronize` of its first staged write; with 32 queues it drained.
/// `NVSHMEM_EFA_CUDA_MAX_CONNECTIONS=keep` leaves the variable alone.
pub mod module_loading {
    use std::sync::atomic::{AtomicU8, Ordering};

    /// What the load-time hook did: 0 not run, 1 set EAGER, 2 the variable was already set,
    /// 3 CUDA was already loaded (too late to choose), 4 disabled by `NVSHMEM_EFA_CUDA_MODULE_LOADING`.
    static AT_LOAD: AtomicU8 = AtomicU8::new(0);
    /// What the hook did to `CUDA_DEVICE_MAX_CONNECTIONS` (same codes).
    static CONN_AT_LOAD: AtomicU8 = AtomicU8::new(0);

    /// Work queues asked for when `CUDA_DEVICE_MAX_CONNECTIONS` is unset (the driver's maximum).
    pub const MAX_CONNECTIONS: u32 = 32;
    /// [`MAX_CONNECTIONS`] as the hook writes it into the environment.
    const MAX_CONNECTIONS_TEXT: &std::ffi::CStr = c"32";
    /// The driver's number of work queues when `CUDA_DEVICE_MAX_CONNECTIONS` is unset.
    const DEFAULT_CONNECTIONS: u32 = 8;

    /// Whether the variable `name` is set to `keep` (any case).
    ///
    /// # Safety
    /// `name` is NUL-terminated; getenv is not raced by setenv (the loader is single-threaded).
    unsafe fn keep(name: &std::ffi::CStr) -> bool {
        // SAFETY: forwarded contract.
        let v = unsafe { libc::getenv(name.as_ptr()) };
        // SAFETY: getenv returns NUL-terminated text or NULL.
        !v.is_null()
            && unsafe { std::ffi::CStr::from_ptr(v) }
                .to_bytes()
                .eq_ignore_ascii_case(b"keep")
    }

    /// Sets `var` to `value` unless `opt_out` says `keep` or `var` is set; `cuda_loaded`: too late.
    ///
    /// # Safety
    /// As [`keep`]: called from the load-time hook only.
    unsafe fn set_if_unset(
        var: &std::ffi::CStr,
        value: &std::ffi::CStr,
        opt_out: &std::ffi::CStr,
        cuda_loaded: bool,
    ) -> u8 {
        // SAFETY: forwarded contract; literals are NUL-terminated.
        unsafe {
            if keep(opt_out) {
                return 4;
            }
            if !libc::getenv(var.as_ptr()).is_null() {
                return 2;
            }
            if cuda_loaded {
                return 3;
            }
            if libc::setenv(var.as_ptr(), value.as_ptr(), 0) == 0 {
                1
            } else {
                0
            }
        }
    }

    /// Runs when the shared library is loaded (ELF constructor). When `CUDA_MODULE_LOADING` is unset,
    /// libcuda is not loaded yet (so no CUDA context exists and the loader is still single-threaded,
    /// as with `LD_PRELOAD`) and `NVSHMEM_EFA_CUDA_MODULE_LOADING` is not `keep`, it sets
    /// `CUDA_MODULE_LOADING=EAGER`.
    extern "C" fn on_load() {
        // SAFETY: getenv/setenv with NUL-terminated literals while the loader is single-threaded;
        // dlopen(RTLD_NOLOAD) only queries.
        unsafe {
            let h = libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            let cuda_loaded = !h.is_null();
            if cuda_loaded {
                libc::dlclose(h);
            }
            AT_LOAD.store(
                set_if_unset(
                    c"CUDA_MODULE_LOADING",
                    c"EAGER",
                    c"NVSHMEM_EFA_CUDA_MODULE_LOADING",
                    cuda_loaded,
                ),
                Ordering::Relaxed,
            );
            CONN_AT_LOAD.store(
                set_if_unset(
                    c"CUDA_DEVICE_MAX_CONNECTIONS",
                    MAX_CONNECTIONS_TEXT,
                    c"NVSHMEM_EFA_CUDA_MAX_CONNECTIONS",
                    cuda_loaded,
                ),
                Ordering::Relaxed,
            );
        }
    }

    #[used]
    #[link_section = ".init_array"]
    static ON_LOAD: extern "C" fn() = on_load;

    /// True when the running context loads modules lazily (`None`: no CUDA, or unknown).
    pub fn lazy() -> Option<bool> {
        if !super::available() {
            return None;
        }
        let mut mode = cudarc::driver::sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING;
        // SAFETY: writes one enum value.
        let r = unsafe { cudarc::driver::sys::cuModuleGetLoadingMode(&mut mode) };
        (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
            .then_some(mode == cudarc::driver::sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING)
    }

    /// Logs what the load-time hook did and, where lazy loading is on although this transport
    /// copies GPU memory through the driver (`staged`), a warning that says how to avoid the hang.
    pub fn report(staged: bool) {
        match AT_LOAD.load(Ordering::Relaxed) {
            1 => tracing::info!(
                "set CUDA_MODULE_LOADING=EAGER when the library was loaded (lazy loading can deadlock \
                 NVSHMEM's on-stream calls with this transport; NVSHMEM_EFA_CUDA_MODULE_LOADING=keep \
                 leaves the variable alone)"
            ),
            3 => tracing::debug!(
                "CUDA was loaded before this library: CUDA_MODULE_LOADING left as it is"
            ),
            _ => {}
        }
        if CONN_AT_LOAD.load(Ordering::Relaxed) == 1 {
            tracing::info!(
                "set CUDA_DEVICE_MAX_CONNECTIONS={MAX_CONNECTIONS} when the library was loaded (with \
                 fewer hardware work queues this library's copies can wait behind a kernel that waits \
                 for them; NVSHMEM_EFA_CUDA_MAX_CONNECTIONS=keep leaves the variable alone)"
            );
        }
        let conns = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok());
        if staged && conns.unwrap_or(DEFAULT_CONNECTIONS) < MAX_CONNECTIONS {
            tracing::warn!(
                "CUDA_DEVICE_MAX_CONNECTIONS is {} and this transport copies GPU memory through the \
                 CUDA driver on this provider: its copies can queue behind an application kernel that \
                 waits for them (a hang; seen with DeepEP under CUDA MPS). Run with \
                 CUDA_DEVICE_MAX_CONNECTIONS={MAX_CONNECTIONS} (the library sets it itself when it \
                 is preloaded and the variable is unset)",
                conns.map_or(format!("unset ({DEFAULT_CONNECTIONS})"), |c| c.to_string())
            );
        }
        if staged && lazy() == Some(true) {
            tracing::warn!(
                "CUDA lazy module loading is on and this transport copies GPU memory through the CUDA \
                 driver on this provider: NVSHMEM's on-stream calls (nvshmemx_*_on_stream, \
                 nvshmemx_quiet_on_stream) can deadlock while a kernel waits for the proxy. Run with \
                 CUDA_MODULE_LOADING=EAGER (the library sets it itself when it is preloaded and the \
                 variable is unset)"
            );
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_value_written_is_the_value_checked() {
            assert_eq!(
                super::MAX_CONNECTIONS_TEXT
                    .to_str()
                    .unwrap()
                    .parse::<u32>()
                    .unwrap(),
                super::MAX_CONNECTIONS
            );
        }
    }
}

/// Host memory page-locked for the driver (`cuMemHostRegister`) while the value lives, so that
/// copies between it and GPU memory are plain DMA instead of the driver's pageable path (an extra
/// copy through the driver's own buffers, and a synchronous call).
pub struct HostPin {
    ptr: usize,
}

impl HostPin {
    /// Pins `[ptr, ptr + len)` when CUDA is usable from this thread (a context is current). `None`
    /// when it is not, or when the driver refuses (logged at debug level; copies then take the
    /// pageable path, which works, only slower).
    pub fn new(ptr: *mut u8, len: usize) -> Option<HostPin> {
        if !available() || current_context() == 0 || ptr.is_null() || len == 0 {
            return None;
        }
        // SAFETY: the caller owns the range; it stays allocated until this value is dropped.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::debug!(
                "cuMemHostRegister({ptr:p}, {len}) failed ({r:?}): copies use the pageable path"
            );
            return None;
        }
        Some(HostPin { ptr: ptr as usize })
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        // SAFETY: registered in new(); unregistered once.
        unsafe {
            let _ = sys::cuMemHostUnregister(self.ptr as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU's mappings of provider memory: MMIO it writes, read-only CPU mappings it reads.
    #[test]
    fn host_mapping_flags() {
        let (dm, io, ro) = (
            sys::CU_MEMHOSTREGISTER_DEVICEMAP,
            sys::CU_MEMHOSTREGISTER_IOMEMORY,
            sys::CU_MEMHOSTREGISTER_READ_ONLY,
        );
        assert_eq!((dm, io, ro), (2, 4, 8));
        assert_eq!(HostMapping::Io.flags(), dm | io);
        assert_eq!(HostMapping::ReadOnly.flags(), dm | ro);
        assert_eq!(HostMapping::ReadWrite.flags(), dm);
    }
}
