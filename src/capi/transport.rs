//! `nvshmemt_init` and the host-op thunks for transport ABI 3 to 7 (NVSHMEM 3.4.x to 3.8.x).
//!
//! `nvshmemt_init` reads the host's `api_version` (major*10000 + minor*100 + patch), allocates the
//! struct of the matching layout (`crate::nvshmem::abi::v3` .. `v7`), fills its host ops with the
//! thunks of that ABI, and keeps the one ABI-independent transport behind `state`. The thunks are
//! generic over the layout: each one is panic boundary, argument checks and conversion, then a call
//! of the shared implementation. Error codes at this boundary are NVSHMEM's, published as
//! `NVSHMEM_EFA_ERROR_*` (see `crate::capi`).
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::{ffi_guard, NVSHMEM_EFA_ERROR_INTERNAL, NVSHMEM_EFA_ERROR_INVALID_VALUE};
use crate::config::Config;
use crate::nvshmem::abi::v3::{HostOpsV3, TransportV3};
use crate::nvshmem::abi::v4::{HostOpsV4, TransportV4};
use crate::nvshmem::abi::v5::TransportV5;
use crate::nvshmem::abi::v6::{HostOpsV6, TransportV6};
use crate::nvshmem::abi::v7::{self, op_flag, HostOpsV7, OpAttrs, TransportV7};
use crate::nvshmem::abi::{
    self, AmoBytesdesc, AmoMemdesc, AmoVerb, AmoVerbF, BootstrapHandle, CxxVector, MemHandle,
    PeInfo, RmaBytesdesc, RmaMemdesc, RmaVerb, TransportTail,
};
use crate::nvshmem::ops_v5plus::BatchState;

use super::bench_null::BenchNull;
use crate::nvshmem::transport::{TResult, Transport, TransportError, EP_HOST, EP_PROXY};

const INTERNAL: c_int = NVSHMEM_EFA_ERROR_INTERNAL;
const INVALID: c_int = NVSHMEM_EFA_ERROR_INVALID_VALUE;

/// What `state` points to: the shared transport and the adapter's batching state.
struct Plugin {
    tr: Arc<Transport>,
    batch: BatchState,
    /// `NVSHMEM_EFA_BENCH_NULL` (benchmarks only).
    null: BenchNull,
}

impl std::ops::Deref for Plugin {
    type Target = Arc<Transport>;
    fn deref(&self) -> &Arc<Transport> {
        &self.tr
    }
}

/// Access to the common tail of every layout, and the transport ABI major the layout mirrors.
trait Layout {
    /// The transport ABI major.
    const MAJOR: c_int;
    fn tail(&mut self) -> &mut TransportTail;

    /// The endpoint an op's last argument selects: ABI 3 passes `is_proxy` (non-zero: the proxy
    /// endpoint), later ABIs a QP index (above 0: one of the device QPs, which share the proxy
    /// endpoint; see `connect_qp`).
    fn endpoint(arg: c_int) -> usize {
        let proxy = if Self::MAJOR == 3 { arg != 0 } else { arg > 0 };
        if proxy {
            EP_PROXY
        } else {
            EP_HOST
        }
    }
}

/// The AMO verb an `amo` or `put_signal` op receives: `amo_verb_t` up to ABI 5, from ABI 6 on the
/// 20-byte verb that adds `is_float`.
trait VerbArg: Copy {
    /// The integer verb and the float flag.
    fn split(self) -> (AmoVerb, bool);
}

impl VerbArg for AmoVerb {
    fn split(self) -> (AmoVerb, bool) {
        (self, false)
    }
}

impl VerbArg for AmoVerbF {
    fn split(self) -> (AmoVerb, bool) {
        AmoVerbF::split(self)
    }
}
macro_rules! layouts {
    ($($t:ty => $m:expr),*) => {$(
        impl Layout for $t {
            const MAJOR: c_int = $m;
            fn tail(&mut self) -> &mut TransportTail {
                &mut self.tail
            }
        }
    )*};
}
layouts!(
    TransportV3 => 3,
    TransportV4 => 4,
    TransportV5 => 5,
    TransportV6 => 6,
    TransportV7 => 7
);

/// Transport structs handed out by `nvshmemt_init` and not finalized yet (addresses). A thunk
/// touches a struct only if it is listed here, so a finalized or foreign pointer gets an error
/// instead of a read of freed memory. Finalized structs are never freed (a few hundred bytes each):
/// their addresses are never reused, so a stale pointer can never name a newer transport.
static LIVE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Finalized transport structs, kept for the reason above. Holding their pointers here keeps them
/// reachable, so a leak checker (valgrind `--errors-for-leak-kinds=definite`) does not report the
/// deliberately kept memory as lost. Nothing reads the list; it only grows, by one per finalize.
static RETIRED: std::sync::Mutex<Vec<Retired>> = std::sync::Mutex::new(Vec::new());

/// A finalized transport struct (a pointer, not an address, so that it keeps the memory reachable).
struct Retired(#[cfg_attr(not(test), allow(dead_code))] *mut c_void);
// SAFETY: the pointer is never dereferenced; it only keeps the allocation reachable.
unsafe impl Send for Retired {}

fn live_set() -> std::sync::MutexGuard<'static, Vec<usize>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves `t` from LIVE to RETIRED; false if it was not live.
fn retire(t: *mut c_void) -> bool {
    let mut live = live_set();
    let Some(i) = live.iter().position(|&x| x == t as usize) else {
        return false;
    };
    live.swap_remove(i);
    RETIRED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Retired(t));
    true
}

fn is_live(t: *mut c_void) -> bool {
    live_set().contains(&(t as usize))
}

/// The transport behind a struct pointer NVSHMEM hands back to a thunk.
///
/// # Safety
/// `t` must be null, a struct this library allocated with layout `L`, or any other value (refused
/// without being dereferenced unless it is a live transport of this library).
unsafe fn transport_of<L: Layout>(t: *mut c_void) -> Result<Arc<Plugin>, c_int> {
    if t.is_null() {
        tracing::error!("transport op called with a null transport");
        return Err(INVALID);
    }
    if !is_live(t) {
        tracing::error!(
            "transport op called with {t:p}, which is not a live transport of this library (finalized?)"
        );
        return Err(INVALID);
    }
    // SAFETY: caller guarantees the layout; state holds a leaked Box<Arc<Plugin>> or null.
    let state = unsafe { (*(t as *mut L)).tail().state } as *const Arc<Plugin>;
    if state.is_null() {
        tracing::error!("transport op called on a finalized transport");
        return Err(INVALID);
    }
    // SAFETY: state is the Box<Arc<Plugin>> set by nvshmemt_init, alive until finalize.
    Ok(unsafe { (*state).clone() })
}

fn code(r: TResult<()>) -> c_int {
    match r {
        Ok(()) => 0,
        // The transport logged the message where the error arose.
        Err(TransportError { status, .. }) => boundary_code(status),
    }
}

/// Maps a transport status onto the published codes: invalid input stays INVALID_VALUE, every other
/// failure is INTERNAL.
fn boundary_code(status: c_int) -> c_int {
    if status == abi::status::INVALID_VALUE {
        INVALID
    } else {
        INTERNAL
    }
}

/// Runs a thunk body with the transport of `t`.
fn with<L: Layout>(name: &str, t: *mut c_void, f: impl FnOnce(&Plugin) -> c_int) -> c_int {
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

/// NVSHMEM's transport entry point. Serves transport ABI majors 3 to 7 (`abi::SERVED_MAJORS`) from one
/// binary. (Not in the public header: NVSHMEM declares it with its own types.)
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
        let Some(own) = abi::own_version(major) else {
            tracing::error!(
                "nvshmemt_init: NVSHMEM offers transport interface {api_version} (major {major}); this \
                 library serves majors {}",
                abi::served_list()
            );
            return INVALID;
        };
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
        let null = BenchNull::new(cfg.bench_null);
        let tr = match Transport::new(cfg) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                tracing::error!("nvshmemt_init: {}", e.message);
                return INTERNAL;
            }
        };
        let plugin = Arc::new(Plugin {
            tr,
            batch: BatchState::default(),
            null,
        });
        let state = Box::into_raw(Box::new(plugin)) as *mut c_void;
        let version = api_version.min(own);
        let ptr = match major {
            3 => alloc::<TransportV3>(version, state, |t| t.host_ops = ops_v3()),
            4 => alloc::<TransportV4>(version, state, |t| t.host_ops = ops_v4::<TransportV4>()),
            5 => alloc::<TransportV5>(version, state, |t| t.host_ops = ops_v4::<TransportV5>()),
            6 => alloc::<TransportV6>(version, state, |t| t.host_ops = ops_v6()),
            _ => alloc::<TransportV7>(version, state, |t| {
                t.host_ops = ops_v7();
                t.device_assignment_mode = v7::device_assignment::DEFAULT;
            }),
        };
        live_set().push(ptr as usize);
        // SAFETY: out checked non-null.
        unsafe { *out = ptr };
        tracing::info!(
            "nvshmemt_init: transport ABI {major} (NVSHMEM {}; host {api_version}, serving {version})",
            abi::nvshmem_line(major).unwrap_or("?")
        );
        0
    })
}

/// Allocates a zeroed struct of layout `L`, sets its version, tail and (through `fill`) host ops.
fn alloc<L: Layout>(version: c_int, state: *mut c_void, fill: impl FnOnce(&mut L)) -> *mut c_void {
    // SAFETY: every layout is plain data (integers, pointers, optional fn pointers); all-zero is its
    // empty value.
    let mut t: Box<L> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: api_version is the first field of every layout (repr(C), offset 0).
    unsafe { *(&mut *t as *mut L as *mut c_int) = version };
    fill_tail(t.tail(), state);
    fill(&mut t);
    Box::into_raw(t) as *mut c_void
}

/// The host-ops table `$ops` of layout `$l`: the ops whose thunk is the same in every ABI, plus the
/// entries given (those whose C signature differs by ABI, and those only some ABIs have).
macro_rules! host_ops {
    ($ops:ident<$l:ty> { $($field:ident: $thunk:expr),* $(,)? }) => {
        $ops {
            can_reach_peer: Some(can_reach_peer::<$l>),
            get_mem_handle: Some(get_mem_handle::<$l>),
            release_mem_handle: Some(release_mem_handle::<$l>),
            finalize: Some(finalize::<$l>),
            show_info: Some(show_info::<$l>),
            progress: Some(progress::<$l>),
            rma: Some(rma::<$l>),
            quiet: Some(quiet::<$l>),
            enforce_cst: Some(enforce_cst::<$l>),
            enforce_cst_at_target: Some(enforce_cst::<$l>),
            add_device_remote_mem_handles: Some(add_remote_handles::<$l>),
            $($field: Some($thunk)),*
        }
    };
}

/// ABI 3: `connect_endpoints` without QP outputs, `fence` without `is_multi`, no `put_signal`.
fn ops_v3() -> HostOpsV3 {
    type L = TransportV3;
    host_ops!(HostOpsV3<L> {
        connect_endpoints: connect_v3,
        amo: amo::<L, AmoVerb>,
        fence: fence_v3::<L>,
    })
}

/// The v4 table (also v5's, whose layout is v4's).
fn ops_v4<L: Layout>() -> HostOpsV4 {
    host_ops!(HostOpsV4<L> {
        connect_endpoints: connect_qp::<L>,
        amo: amo::<L, AmoVerb>,
        fence: fence_qp::<L>,
        put_signal: put_signal::<L, AmoVerb>,
    })
}

/// ABI 6: v4's table with the 20-byte AMO verb.
fn ops_v6() -> HostOpsV6 {
    type L = TransportV6;
    host_ops!(HostOpsV6<L> {
        connect_endpoints: connect_qp::<L>,
        amo: amo::<L, AmoVerbF>,
        fence: fence_qp::<L>,
        put_signal: put_signal::<L, AmoVerbF>,
    })
}

/// ABI 7: v6's table plus `rma_with_hints` and `region_flush`.
fn ops_v7() -> HostOpsV7 {
    type L = TransportV7;
    host_ops!(HostOpsV7<L> {
        connect_endpoints: connect_qp::<L>,
        amo: amo::<L, AmoVerbF>,
        fence: fence_qp::<L>,
        put_signal: put_signal::<L, AmoVerbF>,
        rma_with_hints: rma_with_hints::<L>,
        region_flush: region_flush::<L>,
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
        if boot.is_null() {
            tracing::error!("{name}: the transport's bootstrap handle (boot_handle) is NULL");
            return INVALID;
        }
        // SAFETY: non-null bootstrap handle NVSHMEM stored in the struct.
        if unsafe { (*boot).allgather }.is_none() {
            tracing::error!("{name}: the bootstrap handle has no allgather");
            return INVALID;
        }
        // SAFETY: a non-null boot handle is NVSHMEM's, valid while the transport lives.
        let boot_ids = (!boot.is_null()).then(|| unsafe { ((*boot).pg_rank, (*boot).pg_size) });
        if let Err(msg) = check_host_fields(L::MAJOR, my_pe, n_pes, boot_ids) {
            tracing::error!("{name}: {msg}");
            return INVALID;
        }
        let ag = boot_allgather(boot);
        code(tr.connect(my_pe, n_pes, &ag))
    })
}

/// The layout self-check: when NVSHMEM first calls `connect_endpoints` it has filled `boot_handle`,
/// `my_pe` and `n_pes` of the struct. If the library mirrored the wrong layout for this NVSHMEM,
/// these read as garbage (or the handle's rank and size disagree with them), and the transport
/// refuses to go on instead of writing through a misread struct later.
fn check_host_fields(
    major: c_int,
    my_pe: c_int,
    n_pes: c_int,
    boot: Option<(c_int, c_int)>,
) -> Result<(), String> {
    let hint = || {
        format!(
            "the transport struct of ABI {major} (NVSHMEM {}) as this library mirrors it does not \
             match the host's; refusing to continue (wrong NVSHMEM version for this ABI, or a \
             layout this library has wrong)",
            abi::nvshmem_line(major).unwrap_or("?")
        )
    };
    let Some((rank, size)) = boot else {
        return Err(format!("no bootstrap handle in the struct: {}", hint()));
    };
    if n_pes <= 0 || my_pe < 0 || my_pe >= n_pes {
        return Err(format!(
            "my_pe {my_pe} / n_pes {n_pes} out of range: {}",
            hint()
        ));
    }
    if rank != my_pe || size != n_pes {
        return Err(format!(
            "my_pe {my_pe} / n_pes {n_pes} disagree with the bootstrap's rank {rank} / size \
             {size}: {}",
            hint()
        ));
    }
    Ok(())
}

unsafe extern "C" fn connect_v3(t: *mut c_void, _dev_ids: *mut c_int, _n: c_int) -> c_int {
    connect_common::<TransportV3>("connect_endpoints", t)
}

unsafe extern "C" fn connect_qp<L: Layout>(
    t: *mut c_void,
    _dev_ids: *mut c_int,
    _n: c_int,
    out_qp: *mut c_int,
    num_qps: c_int,
) -> c_int {
    // NVSHMEM 3.5's nvshmemx_qp_create calls connect_endpoints again on a connected transport to ask
    // for `num_qps` device QPs. Every one maps to the proxy endpoint (QP index 1): operations on them
    // are served, in order with the proxy's other traffic.
    if num_qps < 0 {
        return ffi_guard("connect_endpoints", INTERNAL, || {
            tracing::error!("connect_endpoints: num_qps is {num_qps} (negative)");
            INVALID
        });
    }
    if num_qps > 0 && out_qp.is_null() {
        return ffi_guard("connect_endpoints", INTERNAL, || {
            tracing::error!("connect_endpoints: out_qp_indices is NULL for {num_qps} QPs");
            INVALID
        });
    }
    if num_qps > 0 {
        let r = with::<L>("connect_endpoints", t, |tr| {
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
    connect_common::<L>("connect_endpoints", t)
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
        if !retire(t) {
            tracing::error!(
                "finalize: {t:p} is not a live transport of this library (finalized twice?)"
            );
            return INVALID;
        }
        // SAFETY: t is our struct (it was live); state is the Box<Arc<Plugin>> from nvshmemt_init.
        let state = unsafe { (*(t as *mut L)).tail().state } as *mut Arc<Plugin>;
        // SAFETY: as above; the struct stays allocated (see LIVE, RETIRED) with its state cleared.
        unsafe { (*(t as *mut L)).tail().state = std::ptr::null_mut() };
        if !state.is_null() {
            // SAFETY: taken back exactly once (the struct left LIVE above).
            let tr = unsafe { Box::from_raw(state) };
            tr.null.report();
            tr.shutdown();
            drop(tr);
        }
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

unsafe extern "C" fn rma<L: Layout>(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    r: *mut RmaMemdesc,
    l: *mut RmaMemdesc,
    b: RmaBytesdesc,
    ep: c_int,
) -> c_int {
    // SAFETY: NVSHMEM's descriptors, valid for the call; buffers live until quiet.
    with::<L>("rma", t, |tr| {
        if tr.null.rma(L::endpoint(ep)) {
            return 0;
        }
        code(unsafe { tr.rma(pe, verb, r, l, b, L::endpoint(ep)) })
    })
}

/// `amo`; from ABI 6 on the verb carries `is_float`.
unsafe extern "C" fn amo<L: Layout, V: VerbArg>(
    t: *mut c_void,
    pe: c_int,
    _cur: *mut c_void,
    verb: V,
    m: *mut AmoMemdesc,
    b: AmoBytesdesc,
    ep: c_int,
) -> c_int {
    let (verb, is_float) = verb.split();
    let ep = L::endpoint(ep);
    // SAFETY: NVSHMEM's descriptor, valid for the call; retptr lives until quiet.
    with::<L>("amo", t, |tr| {
        if tr.null.amo(ep, verb.op) {
            return 0;
        }
        code(unsafe {
            if is_float {
                tr.amo_float(pe, verb, m, b.elembytes, ep)
            } else {
                tr.amo(pe, verb, m, b.elembytes, ep)
            }
        })
    })
}

/// `quiet` or `fence` (named `name`; `op` is the transport's, given `ep` and `pe`) towards `pe`
/// on endpoint `ep`; `pe < 0` means every PE.
fn quiet_common<L: Layout>(
    name: &str,
    t: *mut c_void,
    pe: c_int,
    ep: usize,
    op: impl FnOnce(&Plugin, usize, i32) -> crate::nvshmem::transport::TResult<()>,
) -> c_int {
    with::<L>(name, t, |tr| {
        // A PE out of range is still an error.
        let n = {
            // SAFETY: our struct.
            unsafe { (*(t as *mut L)).tail().n_pes }
        };
        if pe >= n && n > 0 {
            tracing::error!("{name}: PE {pe} out of range (n_pes {n})");
            return INVALID;
        }
        code(op(tr, ep, pe))
    })
}

/// `fence`: ordered without a wait where the route allows (`transport::fence`).
fn fence_common<L: Layout>(t: *mut c_void, pe: c_int, ep: usize) -> c_int {
    quiet_common::<L>("fence", t, pe, ep, |tr, ep, pe| tr.fence(ep, pe))
}

unsafe extern "C" fn fence_v3<L: Layout>(t: *mut c_void, pe: c_int, is_proxy: c_int) -> c_int {
    fence_common::<L>(t, pe, L::endpoint(is_proxy))
}

unsafe extern "C" fn fence_qp<L: Layout>(
    t: *mut c_void,
    pe: c_int,
    qp: c_int,
    _is_multi: c_int,
) -> c_int {
    fence_common::<L>(t, pe, L::endpoint(qp))
}

unsafe extern "C" fn quiet<L: Layout>(t: *mut c_void, pe: c_int, ep: c_int) -> c_int {
    quiet_common::<L>("quiet", t, pe, L::endpoint(ep), |tr, ep, pe| {
        tr.quiet_pe(ep, pe)
    })
}

/// `put_signal` (ABI 4 on). A signal is a `uint64_t` word: a float flag on its verb (ABI 6 on) is
/// refused.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn put_signal<L: Layout, V: VerbArg>(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    remote: *mut CxxVector<RmaMemdesc>,
    local: *mut CxxVector<RmaMemdesc>,
    bytes: *mut CxxVector<RmaBytesdesc>,
    sig_verb: V,
    sig: *mut AmoMemdesc,
    sig_bytes: AmoBytesdesc,
    qp: c_int,
) -> c_int {
    let (sig_verb, is_float) = sig_verb.split();
    if is_float {
        tracing::error!(
            "put_signal: the signal verb is flagged floating-point (signals are uint64_t)"
        );
        return INVALID;
    }
    with::<L>("put_signal", t, |tr| {
        if tr.null.rma(L::endpoint(qp)) {
            return 0;
        }
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
                L::endpoint(qp),
            )
        })
    })
}

/// `rma_with_hints` (ABI 7): `rma` plus operation attributes; MORE_FOLLOWS batches posts.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_with_hints<L: Layout>(
    t: *mut c_void,
    pe: c_int,
    verb: RmaVerb,
    r: *mut RmaMemdesc,
    l: *mut RmaMemdesc,
    b: RmaBytesdesc,
    qp: c_int,
    attrs: *const OpAttrs,
) -> c_int {
    // SAFETY: a null attrs means "no hints"; otherwise NVSHMEM's struct, valid for the call.
    let more = !attrs.is_null() && unsafe { (*attrs).flags } & op_flag::MORE_FOLLOWS != 0;
    with::<L>("rma_with_hints", t, |tr| {
        if tr.null.rma(L::endpoint(qp)) {
            return 0;
        }
        // SAFETY: NVSHMEM's descriptors, valid for the call; buffers live until quiet.
        code(unsafe { tr.rma_batched(&tr.batch, pe, verb, r, l, b, L::endpoint(qp), more) })
    })
}

/// `region_flush` (ABI 7): completes the region's operations (a quiet on the role's endpoint).
unsafe extern "C" fn region_flush<L: Layout>(
    t: *mut c_void,
    role: c_int,
    issuer: u64,
    region: u64,
) -> c_int {
    with::<L>("region_flush", t, |tr| {
        code(tr.region_flush(&tr.batch, role, issuer, region))
    })
}

#[cfg(test)]
mod tests {
    use super::check_host_fields;

    #[test]
    fn retired_structs_stay_listed_once_finalized() {
        let mut slot = 0u64;
        let t = &mut slot as *mut u64 as *mut std::ffi::c_void;
        super::live_set().push(t as usize);
        assert!(super::retire(t));
        assert!(!super::is_live(t));
        let retired = super::RETIRED.lock().unwrap();
        assert!(retired.iter().any(|r| r.0 == t));
        drop(retired);
        // A second finalize of the same struct is refused.
        assert!(!super::retire(t));
    }

    #[test]
    fn host_fields_matching_the_bootstrap_pass() {
        assert!(check_host_fields(7, 0, 2, Some((0, 2))).is_ok());
        assert!(check_host_fields(6, 3, 4, Some((3, 4))).is_ok());
    }

    #[test]
    fn misread_host_fields_fail_naming_the_abi() {
        let e = check_host_fields(6, 1, 2, Some((0, 2))).unwrap_err();
        assert!(
            e.contains("ABI 6 (NVSHMEM 3.7.x)") && e.contains("rank 0"),
            "{e}"
        );
        let e = check_host_fields(7, 0, 2, Some((0, 4))).unwrap_err();
        assert!(e.contains("ABI 7") && e.contains("size 4"), "{e}");
        let e = check_host_fields(5, 0, 0, Some((0, 0))).unwrap_err();
        assert!(e.contains("out of range") && e.contains("ABI 5"), "{e}");
        let e = check_host_fields(5, 7, 2, Some((7, 2))).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = check_host_fields(4, 0, 2, None).unwrap_err();
        assert!(
            e.contains("no bootstrap handle") && e.contains("ABI 4"),
            "{e}"
        );
    }
}
