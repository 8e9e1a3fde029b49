//! `nvshmemt_init` and the host-op thunks for transport ABI v3 (NVSHMEM 3.4.x) and v4 (3.5.x).
//!
//! `nvshmemt_init` reads the host's `api_version` (major*10000 + minor*100 + patch), allocates the
//! struct of the matching layout, fills the host ops with the thunks of that ABI, and keeps the
//! transport behind `state`. Every thunk: panic boundary, argument checks, then the safe transport.
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::ffi_guard;
use crate::config::Config;
use crate::nvshmem::abi::{
    self, AmoBytesdesc, AmoMemdesc, AmoVerb, BootstrapHandle, CxxVector, HostOpsV3, HostOpsV4,
    MemHandle, PeInfo, RmaBytesdesc, RmaMemdesc, RmaVerb, TransportTail, TransportV3, TransportV4,
};
use crate::nvshmem::transport::{TResult, Transport, TransportError, EP_HOST, EP_PROXY};
use crate::nvshmem::SUPPORTED_MAJORS;

const INTERNAL: c_int = abi::status::INTERNAL;
const INVALID: c_int = abi::status::INVALID_VALUE;

/// This library's transport interface version per major (minor/patch of the NVSHMEM release it
/// was checked against).
fn own_version(major: i32) -> i32 {
    match major {
        3 => 30000,
        _ => 40000,
    }
}

/// Access to the common tail and the transport of either layout.
trait Layout {
    fn tail(&mut self) -> &mut TransportTail;
}
impl Layout for TransportV3 {
    fn tail(&mut self) -> &mut TransportTail {
        &mut self.tail
    }
}
impl Layout for TransportV4 {
    fn tail(&mut self) -> &mut TransportTail {
        &mut self.tail
    }
}

/// The transport behind a struct pointer NVSHMEM hands back to a thunk.
///
/// # Safety
/// `t` must be null or a struct this library allocated with layout `L`.
unsafe fn transport_of<L: Layout>(t: *mut c_void) -> Result<Arc<Transport>, c_int> {
    if t.is_null() {
        tracing::error!("transport op called with a null transport");
        return Err(INVALID);
    }
    // SAFETY: caller guarantees the layout; state holds a leaked Box<Arc<Transport>> or null.
    let state = unsafe { (*(t as *mut L)).tail().state } as *const Arc<Transport>;
    if state.is_null() {
        tracing::error!("transport op called on a finalized transport");
        return Err(INVALID);
    }
    // SAFETY: state is the Box<Arc<Transport>> set by nvshmemt_init, alive until finalize.
    Ok(unsafe { (*state).clone() })
}

fn code(r: TResult<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(TransportError { status, .. }) => status,
    }
}

/// Runs a thunk body with the transport of `t`.
fn with<L: Layout>(name: &str, t: *mut c_void, f: impl FnOnce(&Arc<Transport>) -> c_int) -> c_int {
    ffi_guard(name, INTERNAL, || {
        // SAFETY: NVSHMEM passes back the struct this library allocated with layout L.
        match unsafe { transport_of::<L>(t) } {
            Ok(tr) => {
                tracing::trace!("{name}: enter");
                let c = f(&tr);
                tracing::trace!("{name}: return {c}");
                c
            }
            Err(c) => c,
        }
    })
}

fn ep_of_proxy_flag(is_proxy: c_int) -> usize {
    if is_proxy != 0 {
        EP_PROXY
    } else {
        EP_HOST
    }
}

fn ep_of_qp_index(qp: c_int) -> usize {
    if qp > 0 {
        EP_PROXY
    } else {
        EP_HOST
    }
}

/// NVSHMEM's transport entry point. Serves transport ABI majors 3 and 4 from one binary.
/// (Not in the public header: NVSHMEM declares it with its own types.)
///
/// cbindgen:ignore
///
/// # Safety
/// `out` must be a valid pointer to store the transport pointer; NVSHMEM guarantees this.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_init(
    out: *mut *mut c_void,
    table: *mut c_void,
    api_version: c_int,
) -> c_int {
    // NVSHMEM's CUDA function table is not needed: the library loads the driver API itself.
    let _ = table;
    ffi_guard("nvshmemt_init", INTERNAL, || {
        let major = api_version / 10000;
        if !SUPPORTED_MAJORS.contains(&major) {
            tracing::error!(
                "nvshmemt_init: NVSHMEM offers transport interface {api_version} (major {major}); this library \
                 serves majors {:?} (NVSHMEM 3.4.x = 3, 3.5.x = 4)",
                SUPPORTED_MAJORS
            );
            return INVALID;
        }
        if out.is_null() {
            tracing::error!("nvshmemt_init: null output pointer");
            return INVALID;
        }
        let cfg = match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("nvshmemt_init: {e}");
                return INVALID;
            }
        };
        let tr = match Transport::new(cfg) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                tracing::error!("nvshmemt_init: {}", e.message);
                return INTERNAL;
            }
        };
        let state = Box::into_raw(Box::new(tr)) as *mut c_void;
        let version = api_version.min(own_version(major));
        let ptr = if major == 3 {
            // SAFETY: TransportV3 is plain data; all-zero is its empty value.
            let mut t: Box<TransportV3> = Box::new(unsafe { std::mem::zeroed() });
            t.api_version = version;
            t.host_ops = HostOpsV3 {
                can_reach_peer: Some(can_reach_peer::<TransportV3>),
                connect_endpoints: Some(connect_v3),
                get_mem_handle: Some(get_mem_handle::<TransportV3>),
                release_mem_handle: Some(release_mem_handle::<TransportV3>),
                finalize: Some(finalize::<TransportV3>),
                show_info: Some(show_info::<TransportV3>),
                progress: Some(progress::<TransportV3>),
                rma: Some(rma_v3),
                amo: Some(amo_v3),
                fence: Some(fence_v3),
                quiet: Some(quiet_v3),
                enforce_cst: Some(enforce_cst::<TransportV3>),
                enforce_cst_at_target: Some(enforce_cst::<TransportV3>),
                add_device_remote_mem_handles: Some(add_remote_handles::<TransportV3>),
            };
            fill_tail(&mut t.tail, state);
            Box::into_raw(t) as *mut c_void
        } else {
            // SAFETY: as above.
            let mut t: Box<TransportV4> = Box::new(unsafe { std::mem::zeroed() });
            t.api_version = version;
            t.host_ops = HostOpsV4 {
                can_reach_peer: Some(can_reach_peer::<TransportV4>),
                connect_endpoints: Some(connect_v4),
                get_mem_handle: Some(get_mem_handle::<TransportV4>),
                release_mem_handle: Some(release_mem_handle::<TransportV4>),
                finalize: Some(finalize::<TransportV4>),
                show_info: Some(show_info::<TransportV4>),
                progress: Some(progress::<TransportV4>),
                rma: Some(rma_v4),
                amo: Some(amo_v4),
                fence: Some(fence_v4),
                quiet: Some(quiet_v4),
                put_signal: Some(put_signal_v4),
                enforce_cst: Some(enforce_cst::<TransportV4>),
                enforce_cst_at_target: Some(enforce_cst::<TransportV4>),
                add_device_remote_mem_handles: Some(add_remote_handles::<TransportV4>),
            };
            fill_tail(&mut t.tail, state);
            Box::into_raw(t) as *mut c_void
        };
        // SAFETY: out checked non-null.
        unsafe { *out = ptr };
        tracing::info!(
            "nvshmemt_init: transport ABI {major} (host {api_version}, serving {version})"
        );
        0
    })
}

fn fill_tail(tail: &mut TransportTail, state: *mut c_void) {
    tail.state = state;
    tail.attr = abi::attr::CONNECTED;
    // 0 devices: the transport manages its devices itself (NVSHMEM then passes dev id -1).
    tail.n_devices = 0;
    // Fetch results are in place once quiet returns (provider atomics complete into retptr; target
    // AMOs complete when the response wrote retptr).
    tail.atomics_complete_on_quiet = true;
    tail.is_successfully_initialized = true;
    tail.no_proxy = false;
    tail.max_op_len = 0;
    tail.atomic_host_endian_min_size = 0;
}

unsafe extern "C" fn can_reach_peer<L: Layout>(
    access: *mut c_int,
    peer: *mut PeInfo,
    t: *mut c_void,
) -> c_int {
    with::<L>("can_reach_peer", t, |tr| {
        if access.is_null() || peer.is_null() {
            tracing::error!("can_reach_peer: null argument");
            return INVALID;
        }
        // SAFETY: checked non-null.
        unsafe { *access = tr.can_reach_peer() };
        0
    })
}

/// Bootstrap allgather through the handle NVSHMEM put in the struct.
fn boot_allgather(boot: *mut BootstrapHandle) -> impl Fn(&[u8], &mut [u8]) -> TResult<()> {
    move |send: &[u8], recv: &mut [u8]| {
        if boot.is_null() {
            return Err(TransportError {
                status: INTERNAL,
                message: "no bootstrap handle".into(),
            });
        }
        // SAFETY: NVSHMEM's bootstrap handle is valid while the transport lives.
        let f = unsafe { (*boot).allgather };
        let Some(f) = f else {
            return Err(TransportError {
                status: INTERNAL,
                message: "bootstrap has no allgather".into(),
            });
        };
        // SAFETY: recv holds n_pes * send.len() bytes (the caller sized it).
        let r = unsafe {
            f(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                send.len() as c_int,
                boot,
            )
        };
        if r != 0 {
            return Err(TransportError {
                status: INTERNAL,
                message: format!("bootstrap allgather failed ({r})"),
            });
        }
        Ok(())
    }
}

fn connect_common<L: Layout>(name: &str, t: *mut c_void) -> c_int {
    with::<L>(name, t, |tr| {
        // SAFETY: t is our struct (checked by with()).
        let tail = unsafe { (*(t as *mut L)).tail() };
        let (my_pe, n_pes, boot) = (tail.my_pe, tail.n_pes, tail.boot_handle);
        let ag = boot_allgather(boot);
        code(tr.connect(my_pe, n_pes, &ag))
    })
}

unsafe extern "C" fn connect_v3(t: *mut c_void, _dev_ids: *mut c_int, _n: c_int) -> c_int {
    connect_common::<TransportV3>("connect_endpoints", t)
}

unsafe extern "C" fn connect_v4(
    t: *mut c_void,
    _dev_ids: *mut c_int,
    _n: c_int,
    out_qp: *mut c_int,
    num_qps: c_int,
) -> c_int {
    // NVSHMEM 3.5's nvshmemx_qp_create calls connect_endpoints again on a connected transport to ask
    // for `num_qps` device QPs. Every one maps to the proxy endpoint (QP index 1): operations on them
    // are served, in order with the proxy's other traffic.
    if num_qps > 0 && !out_qp.is_null() {
        let r = with::<TransportV4>("connect_endpoints", t, |tr| {
            if !tr.is_connected() {
                tracing::error!(
                    "connect_endpoints: QPs requested before the transport is connected"
                );
                return INVALID;
            }
            for i in 0..num_qps as usize {
                // SAFETY: NVSHMEM passes num_qps slots.
                unsafe { *out_qp.add(i) = EP_PROXY as c_int };
            }
            tracing::info!("connect_endpoints: {num_qps} device QPs share the proxy endpoint");
            0
        });
        return r;
    }
    connect_common::<TransportV4>("connect_endpoints", t)
}

unsafe extern "C" fn get_mem_handle<L: Layout>(
    h: *mut MemHandle,
    buf: *mut c_void,
    size: usize,
    t: *mut c_void,
    local_only: bool,
) -> c_int {
    // SAFETY: NVSHMEM passes a 512-byte handle and memory it keeps until release.
    with::<L>("get_mem_handle", t, |tr| {
        code(unsafe { tr.get_mem_handle(h, buf, size, local_only) })
    })
}

unsafe extern "C" fn release_mem_handle<L: Layout>(h: *mut MemHandle, t: *mut c_void) -> c_int {
    // SAFETY: NVSHMEM passes one of its 512-byte handles.
    with::<L>("release_mem_handle", t, |tr| {
        code(unsafe { tr.release_mem_handle(h) })
    })
}

unsafe extern "C" fn finalize<L: Layout>(t: *mut c_void) -> c_int {
    ffi_guard("finalize", INTERNAL, || {
        if t.is_null() {
            tracing::error!("finalize: null transport");
            return INVALID;
        }
        // SAFETY: t is our struct; state is the Box<Arc<Transport>> from nvshmemt_init.
        let state = unsafe { (*(t as *mut L)).tail().state } as *mut Arc<Transport>;
        if !state.is_null() {
            // SAFETY: taken back exactly once.
            let tr = unsafe { Box::from_raw(state) };
            tr.shutdown();
            drop(tr);
        }
        // SAFETY: the struct was allocated by Box in nvshmemt_init with layout L.
        unsafe { drop(Box::from_raw(t as *mut L)) };
        0
    })
}

unsafe extern "C" fn show_info<L: Layout>(t: *mut c_void, _style: c_int) -> c_int {
    with::<L>("show_info", t, |tr| {
        eprintln!("{}", tr.describe());
        0
    })
}

unsafe extern "C" fn progress<L: Layout>(t: *mut c_void) -> c_int {
    with::<L>("progress", t, |tr| code(tr.progress()))
}

unsafe extern "C" fn enforce_cst<L: Layout>(t: *mut c_void) -> c_int {
    // Completions are delivery-complete and the target side of the software providers writes GPU
    // memory with ordered copies, so there is nothing to flush; the fence orders our own view.
    with::<L>("enforce_cst", t, |_| {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        0
    })
}

unsafe extern "C" fn add_remote_handles<L: Layout>(
    t: *mut c_void,
    stride: c_int,
    handles: *mut MemHandle,
    heap_offset: u64,
    size: usize,
) -> c_int {
    with::<L>("add_device_remote_mem_handles", t, |tr| {
        // SAFETY: our struct.
        let (index, base, log2) = unsafe {
            let tail = (*(t as *mut L)).tail();
            (
                tail.index,
                tail.heap_base as u64,
                tail.log2_cumem_granularity,
            )
        };
        let log2 = u32::try_from(log2).unwrap_or(u32::MAX);
        // SAFETY: NVSHMEM passes n_pes * stride handles.
        code(unsafe {
            tr.add_remote_handles(stride, index, handles, heap_offset, size as u64, base, log2)
        })
    })
}

fn rma_common<L: Layout>(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    r: *mut RmaMemdesc,
    l: *mut RmaMemdesc,
    b: RmaBytesdesc,
    ep: usize,
) -> c_int {
    // SAFETY: NVSHMEM's descriptors, valid for the call; buffers live until quiet.
    with::<L>("rma", t, |tr| {
        code(unsafe { tr.rma(pe, verb, r, l, b, ep) })
    })
}

unsafe extern "C" fn rma_v3(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    r: *mut RmaMemdesc,
    l: *mut RmaMemdesc,
    b: RmaBytesdesc,
    is_proxy: c_int,
) -> c_int {
    rma_common::<TransportV3>(t, pe, verb, r, l, b, ep_of_proxy_flag(is_proxy))
}

unsafe extern "C" fn rma_v4(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    r: *mut RmaMemdesc,
    l: *mut RmaMemdesc,
    b: RmaBytesdesc,
    qp: c_int,
) -> c_int {
    rma_common::<TransportV4>(t, pe, verb, r, l, b, ep_of_qp_index(qp))
}

fn amo_common<L: Layout>(
    t: *mut c_void,
    pe: c_int,
    verb: AmoVerb,
    m: *mut AmoMemdesc,
    b: AmoBytesdesc,
    ep: usize,
) -> c_int {
    // SAFETY: NVSHMEM's descriptor, valid for the call; retptr lives until quiet.
    with::<L>("amo", t, |tr| {
        code(unsafe { tr.amo(pe, verb, m, b.elembytes, ep) })
    })
}

unsafe extern "C" fn amo_v3(
    t: *mut c_void,
    pe: c_int,
    _cur: *mut c_void,
    verb: AmoVerb,
    m: *mut AmoMemdesc,
    b: AmoBytesdesc,
    is_proxy: c_int,
) -> c_int {
    amo_common::<TransportV3>(t, pe, verb, m, b, ep_of_proxy_flag(is_proxy))
}

unsafe extern "C" fn amo_v4(
    t: *mut c_void,
    pe: c_int,
    _cur: *mut c_void,
    verb: AmoVerb,
    m: *mut AmoMemdesc,
    b: AmoBytesdesc,
    qp: c_int,
) -> c_int {
    amo_common::<TransportV4>(t, pe, verb, m, b, ep_of_qp_index(qp))
}

fn quiet_common<L: Layout>(name: &str, t: *mut c_void, pe: c_int, ep: usize) -> c_int {
    with::<L>(name, t, |tr| {
        // pe < 0 means "all PEs"; a PE out of range is still an error.
        let n = {
            // SAFETY: our struct.
            unsafe { (*(t as *mut L)).tail().n_pes }
        };
        if pe >= n && n > 0 {
            tracing::error!("{name}: PE {pe} out of range (n_pes {n})");
            return INVALID;
        }
        code(tr.quiet(ep))
    })
}

unsafe extern "C" fn fence_v3(t: *mut c_void, pe: c_int, is_proxy: c_int) -> c_int {
    quiet_common::<TransportV3>("fence", t, pe, ep_of_proxy_flag(is_proxy))
}

unsafe extern "C" fn quiet_v3(t: *mut c_void, pe: c_int, is_proxy: c_int) -> c_int {
    quiet_common::<TransportV3>("quiet", t, pe, ep_of_proxy_flag(is_proxy))
}

unsafe extern "C" fn fence_v4(t: *mut c_void, pe: c_int, qp: c_int, _is_multi: c_int) -> c_int {
    quiet_common::<TransportV4>("fence", t, pe, ep_of_qp_index(qp))
}

unsafe extern "C" fn quiet_v4(t: *mut c_void, pe: c_int, qp: c_int) -> c_int {
    quiet_common::<TransportV4>("quiet", t, pe, ep_of_qp_index(qp))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn put_signal_v4(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    remote: *mut CxxVector<RmaMemdesc>,
    local: *mut CxxVector<RmaMemdesc>,
    bytes: *mut CxxVector<RmaBytesdesc>,
    sig_verb: AmoVerb,
    sig: *mut AmoMemdesc,
    sig_bytes: AmoBytesdesc,
    qp: c_int,
) -> c_int {
    with::<TransportV4>("put_signal", t, |tr| {
        if remote.is_null() || local.is_null() || bytes.is_null() || sig.is_null() {
            tracing::error!("put_signal: null argument");
            return INVALID;
        }
        // SAFETY: NVSHMEM passes live std::vector references.
        let (r, l, b) = unsafe {
            (
                (*remote).as_slice(),
                (*local).as_slice(),
                (*bytes).as_slice(),
            )
        };
        let (Some(r), Some(l), Some(b)) = (r, l, b) else {
            tracing::error!("put_signal: malformed vector argument");
            return INVALID;
        };
        // SAFETY: NVSHMEM's descriptors, valid for the call.
        code(unsafe {
            tr.put_signal(
                pe,
                verb,
                r,
                l,
                b,
                sig_verb,
                sig,
                sig_bytes.elembytes,
                ep_of_qp_index(qp),
            )
        })
    })
}
