//! C API of GPU Direct Async (`nvshmemt_efa_gda_*`), for a patched NVSHMEM and for C/C++ programs.
//!
//! Every function that returns a status returns 0 or a published positive code (`super`'s
//! `NVSHMEM_EFA_ERROR_*`, NVSHMEM's numbering where NVSHMEM has the code): INVALID_VALUE bad
//! argument, NOT_INITIALIZED no GDA context, NOT_SUPPORTED not available here, ALREADY_INITIALIZED
//! already set up differently, BUFFER_TOO_SMALL, NOT_FOUND, OUT_OF_MEMORY, INTERNAL driver or
//! libfabric failure (or a caught panic). Every failure is logged with its cause and its text kept
//! for `nvshmem_efa_gda_last_error()`; every function is thread-safe and never lets a panic cross
//! into C. Inside the library GDA errors carry errno-style codes ([`GdaError`]); [`status_of`] is
//! the one translation.
use std::ffi::c_void;

use super::{
    ffi_guard, set_last_error, NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED,
    NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL, NVSHMEM_EFA_ERROR_INTERNAL,
    NVSHMEM_EFA_ERROR_INVALID_VALUE, NVSHMEM_EFA_ERROR_NOT_FOUND,
    NVSHMEM_EFA_ERROR_NOT_INITIALIZED, NVSHMEM_EFA_ERROR_NOT_SUPPORTED,
    NVSHMEM_EFA_ERROR_OUT_OF_MEMORY,
};
use crate::fabric::{CqHandle, DomainHandle, EndpointHandle, MrHandle};
use crate::gda::{self, state::NvshmemEfaGdaDeviceState, GdaError};

/// What a panic inside a status-returning call returns.
const ON_PANIC: i32 = NVSHMEM_EFA_ERROR_INTERNAL;

/// The published code of a GDA error: the errno-style codes the GDA layer uses map onto their
/// published names; every other code (a libfabric, CUDA or driver failure) is INTERNAL.
pub fn status_of(e: &GdaError) -> i32 {
    match -e.code {
        libc::EINVAL => NVSHMEM_EFA_ERROR_INVALID_VALUE,
        libc::ENOMEM => NVSHMEM_EFA_ERROR_OUT_OF_MEMORY,
        libc::EOPNOTSUPP | libc::ENOSYS => NVSHMEM_EFA_ERROR_NOT_SUPPORTED,
        libc::ENODEV => NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
        libc::EALREADY => NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED,
        _ => NVSHMEM_EFA_ERROR_INTERNAL,
    }
}

/// Opaque `struct fid_domain` (libfabric); only pointers to it cross the C API.
pub struct FidDomain {
    _p: [u8; 0],
}

/// Opaque `struct fid_ep` (libfabric); only pointers to it cross the C API.
pub struct FidEp {
    _p: [u8; 0],
}

/// Opaque `struct fid_mr` (libfabric); only pointers to it cross the C API.
pub struct FidMr {
    _p: [u8; 0],
}

/// Opaque `struct fid_cq` (libfabric); only pointers to it cross the C API.
pub struct FidCq {
    _p: [u8; 0],
}

/// Logs a failure, keeps its text for `nvshmem_efa_gda_last_error()` and returns `code`.
fn refuse(name: &str, code: i32, message: &str) -> i32 {
    tracing::error!("{name}: {message}");
    set_last_error(&format!("{name}: {message}"));
    code
}

fn fail(name: &str, e: GdaError) -> i32 {
    refuse(name, status_of(&e), &e.to_string())
}

fn invalid(name: &str, what: &str) -> i32 {
    fail(name, GdaError::invalid(what))
}

/// Starts hardware GDA on an endpoint the caller owns (a patched NVSHMEM's own libfabric transport).
///
/// The endpoint must be enabled, belong to `domain`, and be dedicated to GDA: the GPU writes work
/// requests into its send queue, so libfabric must never post on it (not NVSHMEM's proxy endpoint,
/// which its proxy thread keeps using: the splice patches open an endpoint of its own, with its own
/// CQs and AV, on the proxy endpoint's domain). Both stay open until `nvshmemt_efa_gda_fini`. Its
/// transmit CQ is named next with `nvshmemt_efa_gda_set_cq`; without it the GPU has no completions
/// to read. Peers are then connected with `nvshmemt_efa_gda_connect` and `fi_addrs` of the caller's
/// AV (the caller takes the endpoint's name with `fi_getname`: `nvshmemt_efa_gda_get_address` names
/// only an endpoint the library opened). The software queue cannot run on an external endpoint:
/// with `NVSHMEM_EFA_GDA=soft`, or `auto` without GDA ops, this returns
/// `NVSHMEM_EFA_ERROR_NOT_SUPPORTED` and logs that the library must be used as NVSHMEM's transport
/// instead. With `NVSHMEM_EFA_GDA=off` it returns 0 and GDA stays off. Idempotent for the same
/// domain; `NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED` while a context on another domain is current.
/// The context belongs to the library until `nvshmemt_efa_gda_fini`.
///
/// # Safety
/// `domain` and `ep` must be open libfabric objects as described above (or null, rejected).
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_init_on_ep(
    domain: *mut FidDomain,
    ep: *mut FidEp,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_init_on_ep";
    ffi_guard(NAME, ON_PANIC, || {
        if domain.is_null() || ep.is_null() {
            return invalid(NAME, "null domain or endpoint");
        }
        // SAFETY: the caller guarantees they are open objects of one domain (or null).
        let handles = unsafe {
            (
                DomainHandle::from_opaque(domain as *mut c_void),
                EndpointHandle::from_opaque(ep as *mut c_void),
            )
        };
        let (Some(domain), Some(ep)) = handles else {
            return invalid(NAME, "null domain or endpoint");
        };
        // SAFETY: as above.
        match unsafe { gda::init_on_external_ep(domain, ep) } {
            Ok(_) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Names the transmit CQ bound to the endpoint given to `nvshmemt_efa_gda_init_on_ep` (hardware GDA
/// on the caller's endpoint), right after that call. The CQ is queried and mapped for the GPU; the
/// caller must not read completions from it afterwards. Its ring must hold a power of two of
/// entries, at least as many as the send queue (the splice opens it with the provider's transmit
/// queue size rounded up to a power of two); another is refused with NOT_SUPPORTED.
///
/// # Safety
/// `cq` must be the open CQ bound to that endpoint for transmit completions, open until fini.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_set_cq(cq: *mut FidCq) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_set_cq";
    ffi_guard(NAME, ON_PANIC, || {
        if cq.is_null() {
            return invalid(NAME, "null CQ");
        }
        // SAFETY: the caller guarantees it is the endpoint's open transmit CQ (or null).
        let Some(cq) = (unsafe { CqHandle::from_opaque(cq as *mut c_void) }) else {
            return invalid(NAME, "null CQ");
        };
        // SAFETY: as above.
        match unsafe { gda::set_cq(cq) } {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Shuts the current GDA context down (stops the software queue, unmaps the hardware queue), also
/// one this library's transport created (the transport then runs without GDA). Idempotent; call it
/// before closing the endpoint, domain and fabric.
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_fini() {
    ffi_guard("nvshmemt_efa_gda_fini", (), gda::fini)
}

/// Copies the raw name of the GDA endpoint into `buf` (`*len` bytes of room) and sets `*len` to its
/// length. With `buf` null only the length is returned. `NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL` (and the length) when the buffer is
/// too small. Only for an endpoint the library opened: on the caller's endpoint
/// (`nvshmemt_efa_gda_init_on_ep`) it returns `NVSHMEM_EFA_ERROR_INVALID_VALUE`, the caller naming
/// its endpoint itself (`fi_getname`).
///
/// # Safety
/// `len` must point to a `size_t`; `buf`, when not null, to `*len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_get_address(buf: *mut c_void, len: *mut usize) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_get_address";
    ffi_guard(NAME, ON_PANIC, || {
        if len.is_null() {
            return invalid(NAME, "null length pointer");
        }
        let name = match gda::address() {
            Ok(n) => n,
            Err(e) => return fail(NAME, e),
        };
        // SAFETY: len is non-null and points to a size_t per the contract.
        let room = unsafe { *len };
        // SAFETY: as above.
        unsafe { *len = name.len() };
        if buf.is_null() {
            return 0;
        }
        if room < name.len() {
            return refuse(
                NAME,
                NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL,
                &format!("buffer of {room} bytes for a {}-byte name", name.len()),
            );
        }
        // SAFETY: buf has room for `room` >= name.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), buf as *mut u8, name.len()) };
        0
    })
}

/// Builds the peer table. `addrs` holds `n_pes` endpoint names of `addr_len` bytes each, back to back
/// (PE i's name at `i * addr_len`), as gathered from every PE's `nvshmemt_efa_gda_get_address`;
/// `addr_len` may also be given as the total (`n_pes` times the name length). For hardware GDA on the
/// caller's endpoint pass `fi_addrs` (`n_pes` addresses of the caller's AV) and `addrs` null.
///
/// # Safety
/// `addrs`, when not null, must point to the bytes described; `fi_addrs`, when not null, to `n_pes`
/// values.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_connect(
    my_pe: i32,
    n_pes: i32,
    addrs: *const c_void,
    addr_len: usize,
    fi_addrs: *const u64,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_connect";
    ffi_guard(NAME, ON_PANIC, || {
        if n_pes <= 0 || my_pe < 0 || my_pe >= n_pes {
            return invalid(NAME, &format!("PE {my_pe} of {n_pes}"));
        }
        if addrs.is_null() && fi_addrs.is_null() {
            return invalid(NAME, "neither endpoint names nor fi_addr values");
        }
        let n = n_pes as usize;
        let names: &[u8] = if addrs.is_null() || addr_len == 0 {
            &[]
        } else {
            // Per-name length unless the caller gave the total.
            let own = gda::address().map(|a| a.len()).unwrap_or(0);
            let total = if own > 0 && addr_len == own * n {
                addr_len
            } else {
                match addr_len.checked_mul(n) {
                    Some(t) => t,
                    None => {
                        return invalid(
                            NAME,
                            &format!("{n_pes} names of {addr_len} bytes overflow"),
                        )
                    }
                }
            };
            // SAFETY: the caller provides `total` readable bytes (n_pes names of addr_len bytes).
            unsafe { std::slice::from_raw_parts(addrs as *const u8, total) }
        };
        let fa = if fi_addrs.is_null() {
            None
        } else {
            // SAFETY: the caller provides n_pes values.
            Some(unsafe { std::slice::from_raw_parts(fi_addrs, n) })
        };
        match gda::connect(my_pe, n_pes, names, fa) {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Sets the local symmetric heap. `mr` is its registration on the GDA domain (kept open until fini),
/// or null to let the library register it.
///
/// # Safety
/// `[base, base+size)` must stay allocated until fini; `mr`, when not null, must be an open
/// registration of that range on the domain GDA was initialised on.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_set_local_heap(
    base: *mut c_void,
    size: usize,
    mr: *mut FidMr,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_set_local_heap";
    ffi_guard(NAME, ON_PANIC, || {
        if base.is_null() || size == 0 {
            return invalid(NAME, &format!("empty heap {base:p}+{size}"));
        }
        // SAFETY: forwarded contract (`mr` is an open registration or null).
        let mr = unsafe { MrHandle::from_opaque(mr as *mut c_void) };
        // SAFETY: forwarded contract.
        match unsafe { gda::set_local_heap_raw(base as u64, size as u64, mr) } {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Records PE `pe`'s heap: base address (as that PE's kernels see it), size, and its registration key.
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_set_remote_heap(pe: i32, base: u64, size: u64, key: u64) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_set_remote_heap";
    ffi_guard(NAME, ON_PANIC, || {
        if pe < 0 || base == 0 || size == 0 {
            return invalid(NAME, &format!("PE {pe}, heap {base:#x}+{size}"));
        }
        match gda::set_remote_heap(pe, base, size, key) {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Adds chunk `[start, end)` (heap offsets; `start` a multiple of `2^log2_granularity`) of the local
/// symmetric heap, at `base` here. `mr` is its registration on the GDA domain (kept open until the
/// chunk is removed or fini), or null to let the library register it. Every chunk of one job uses the
/// same granularity.
///
/// # Safety
/// `[base, base + end - start)` must stay allocated until the chunk is removed or fini; `mr`, when
/// not null, must be an open registration of that range on the domain GDA was initialised on.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_add_local_heap_chunk(
    start: u64,
    end: u64,
    base: *mut c_void,
    mr: *mut FidMr,
    log2_granularity: u32,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_add_local_heap_chunk";
    ffi_guard(NAME, ON_PANIC, || {
        if base.is_null() || end <= start {
            return invalid(NAME, &format!("chunk [{start:#x}, {end:#x}) at {base:p}"));
        }
        // SAFETY: forwarded contract (`mr` is an open registration or null).
        let mr = unsafe { MrHandle::from_opaque(mr as *mut c_void) };
        // SAFETY: forwarded contract.
        match unsafe {
            gda::add_local_heap_chunk_raw(start, end, base as u64, mr, log2_granularity)
        } {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Records chunk `[start, end)` (heap offsets) of PE `pe`'s heap: `addr`, the address of `start` as
/// that PE's kernels see it, and the key of that PE's registration of the chunk.
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_add_remote_heap_chunk(
    pe: i32,
    start: u64,
    end: u64,
    addr: u64,
    key: u64,
    log2_granularity: u32,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_add_remote_heap_chunk";
    ffi_guard(NAME, ON_PANIC, || {
        if pe < 0 || addr == 0 || end <= start {
            return invalid(
                NAME,
                &format!("PE {pe}, chunk [{start:#x}, {end:#x}) at {addr:#x}"),
            );
        }
        match gda::add_remote_heap_chunk(pe, start, end, addr, key, log2_granularity) {
            Ok(()) => 0,
            Err(e) => fail(NAME, e),
        }
    })
}

/// Forgets the heap chunk at heap offset `start`, local and every PE's (the collective release of a
/// chunk). Returns 0, or `NVSHMEM_EFA_ERROR_NOT_FOUND` when no local chunk starts there.
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_remove_heap_chunk(start: u64) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_remove_heap_chunk";
    ffi_guard(NAME, ON_PANIC, || match gda::remove_heap_chunk(start) {
        Ok(true) => 0,
        Ok(false) => refuse(
            NAME,
            NVSHMEM_EFA_ERROR_NOT_FOUND,
            &format!("no local heap chunk starts at heap offset {start:#x}"),
        ),
        Err(e) => fail(NAME, e),
    })
}

/// The mode of the current GDA context, not a status: 0 off, 1 hardware queues, 2 software queue;
/// -1 when GDA is not initialised (no context is current).
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_mode() -> i32 {
    ffi_guard("nvshmemt_efa_gda_mode", -1, || {
        gda::mode().map_or(-1, |m| m as i32)
    })
}

/// Copies the device state (host copy; the addresses inside are device addresses) into `out`, a
/// buffer of `size` bytes: `sizeof(NvshmemEfaGdaDeviceState)` of the header the caller was built
/// against. A buffer smaller than this library's state (a caller built against an older header)
/// gets nothing written and an error naming both sizes.
///
/// # Safety
/// `out` must point to `size` writable bytes (or be null, rejected).
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_get_device_state_sized(
    out: *mut NvshmemEfaGdaDeviceState,
    size: usize,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_get_device_state_sized";
    ffi_guard(NAME, ON_PANIC, || {
        if out.is_null() {
            return invalid(NAME, "null output pointer");
        }
        let need = std::mem::size_of::<NvshmemEfaGdaDeviceState>();
        if size < need {
            return invalid(
                NAME,
                &format!(
                    "the caller's NvshmemEfaGdaDeviceState is {size} bytes, this library's \
                     (state version {}) is {need}: the caller was built against an older \
                     nvshmem_efa_gda.h; rebuild it against this library's header",
                    gda::state::NVSHMEM_EFA_GDA_STATE_VERSION
                ),
            );
        }
        match gda::device_state() {
            Some(s) => {
                // SAFETY: out is non-null and holds at least size_of::<state>() writable bytes
                // (checked above against the caller's size).
                unsafe { out.write(s) };
                0
            }
            None => {
                let e = if gda::mode().is_none() {
                    GdaError::not_initialised()
                } else {
                    GdaError::unsupported("GDA is off: there is no device state")
                };
                fail(NAME, e)
            }
        }
    })
}

/// Refused: the form without a size, which cannot tell how large the caller's buffer is (a
/// program built against a header of an older state version would get bytes written past its
/// struct). Writes nothing; the error names `nvshmemt_efa_gda_get_device_state_sized`.
///
/// # Safety
/// None needed: `out` is never written.
#[no_mangle]
pub unsafe extern "C" fn nvshmemt_efa_gda_get_device_state(
    out: *mut NvshmemEfaGdaDeviceState,
) -> i32 {
    const NAME: &str = "nvshmemt_efa_gda_get_device_state";
    ffi_guard(NAME, ON_PANIC, || {
        let _ = out;
        invalid(
            NAME,
            "refused: it cannot tell the size of the caller's buffer (state version 3 is larger \
             than 1 and 2); call nvshmemt_efa_gda_get_device_state_sized(out, sizeof(*out))",
        )
    })
}

/// Address of the device-resident copy of the state, for kernels (a host address when CUDA is not in
/// use); 0 when there is none.
#[no_mangle]
pub extern "C" fn nvshmemt_efa_gda_device_state_ptr() -> u64 {
    ffi_guard(
        "nvshmemt_efa_gda_device_state_ptr",
        0,
        gda::device_state_device_ptr,
    )
}
