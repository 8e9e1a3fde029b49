//! rxm's eager limit on tcp, chosen for the staged path.
//!
//! `tcp;ofi_rxm` sends a message up to its eager limit (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by
//! default) in one send, and a longer one by its segmentation-and-reassembly protocol (SAR): copied
//! into 16 KiB bounce buffers at the sender and out of them at the receiver. The staged path's
//! messages are up to 64 KiB and a header (the transport's active messages, the software queue's
//! staged chunks), so with the default every long one went by SAR, and libfabric 2.1 crashes a
//! process whose dead peer's connection closes with a SAR message half received (`rxm_close_conn`
//! treats its `deferred_sar_msgs` entries as receive entries and calls through a null pointer:
//! SIGSEGV in about 1 of 60-100 runs of `load_death_tcp_staged`; docs/staged-path.md).
//!
//! rxm reads the variable once, when libfabric initialises its providers (the first `fi_getinfo`),
//! so it must be in the environment before that: this library's load-time hook sets
//! `FI_OFI_RXM_BUFFER_SIZE` = [`EAGER_LIMIT`] when it is unset and `NVSHMEM_LIBFABRIC_PROVIDER`
//! names tcp (verbs;ofi_rxm uses rxm too and is left alone: there the eager buffers would cost
//! memory per connection for no staged traffic). `NVSHMEM_EFA_RXM_EAGER=keep` leaves the variable
//! alone. The cost: rxm posts its receive buffers (128 per connection) at that size, about 8 MiB per
//! connected peer and endpoint instead of 2 MiB. [`report`] warns at initialisation on tcp when
//! the variable says less than a staged message (set by the user, or kept). That libfabric was
//! initialised in this process before the library was loaded (then rxm read the variable before
//! the hook set it) cannot be seen from here: rxm's answer does not carry its eager limit (its
//! inject size follows the memory-registration mode).
use std::sync::atomic::{AtomicU8, Ordering};

/// The eager limit set: a staged message (64-byte header and 64 KiB of payload) and the software
/// queue's 64 KiB staged slots fit, with room to spare for rxm's own header.
pub const EAGER_LIMIT: usize = 65664;
/// [`EAGER_LIMIT`] as the hook writes it.
const EAGER_LIMIT_TEXT: &std::ffi::CStr = c"65664";

/// What the hook did: 0 not run, 1 set the variable, 2 it was set already, 3 the provider is not
/// tcp (or not named), 4 `NVSHMEM_EFA_RXM_EAGER=keep`.
static AT_LOAD: AtomicU8 = AtomicU8::new(0);

/// The hook's decision from the three variables' values (`None`: unset).
pub fn decide(provider: Option<&str>, buffer_size: Option<&str>, opt_out: Option<&str>) -> u8 {
    if opt_out.is_some_and(|v| v.trim().eq_ignore_ascii_case("keep")) {
        return 4;
    }
    if buffer_size.is_some() {
        return 2;
    }
    match provider.map(super::Provider::parse) {
        Some(Ok(p)) if super::caps::rxm_staged(&p) => 1,
        _ => 3,
    }
}

/// Runs when the shared library is loaded (ELF constructor): at process start when it is preloaded
/// or linked, at `dlopen` when a program loads it later (the Python package's `enable()`), as the
/// CUDA variables' hook does (`crate::cuda::module_loading`). It changes the environment only when
/// the provider named is tcp and the variable is unset.
extern "C" fn on_load() {
    // SAFETY: getenv/setenv with NUL-terminated literals; the values getenv returns are copied
    // before setenv runs. At process start the loader is single-threaded; at a later dlopen a
    // getenv of another thread could race this one setenv (glibc's caveat, shared with the CUDA
    // hook).
    unsafe {
        let get = |name: &std::ffi::CStr| {
            let v = libc::getenv(name.as_ptr());
            (!v.is_null()).then(|| std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned())
        };
        let provider = get(c"NVSHMEM_LIBFABRIC_PROVIDER");
        let size = get(c"FI_OFI_RXM_BUFFER_SIZE");
        let keep = get(c"NVSHMEM_EFA_RXM_EAGER");
        let mut what = decide(provider.as_deref(), size.as_deref(), keep.as_deref());
        if what == 1
            && libc::setenv(
                c"FI_OFI_RXM_BUFFER_SIZE".as_ptr(),
                EAGER_LIMIT_TEXT.as_ptr(),
                0,
            ) != 0
        {
            what = 0;
        }
        AT_LOAD.store(what, Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// The eager limit `FI_OFI_RXM_BUFFER_SIZE` gives rxm (`None`: unset or not a number, rxm's
/// default of 16 KiB then).
pub fn configured() -> Option<usize> {
    std::env::var("FI_OFI_RXM_BUFFER_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// Logs what the hook did and, on tcp;ofi_rxm with staged traffic (`staged`), a warning when the
/// eager limit `FI_OFI_RXM_BUFFER_SIZE` gives rxm is below a staged message.
pub fn report(is_rxm_tcp: bool, staged: bool) {
    if !is_rxm_tcp {
        return;
    }
    if AT_LOAD.load(Ordering::Relaxed) == 1 {
        tracing::info!(
            "set FI_OFI_RXM_BUFFER_SIZE={EAGER_LIMIT} when the library was loaded: staged messages \
             go in one eager send instead of rxm's SAR protocol, which libfabric 2.1 can crash on \
             when a peer dies mid-message (about 8 MiB of receive buffers per connected peer; \
             NVSHMEM_EFA_RXM_EAGER=keep leaves the variable alone)"
        );
    }
    let eager = configured().unwrap_or(16384);
    if staged && eager < EAGER_LIMIT {
        tracing::warn!(
            "tcp;ofi_rxm's eager limit is {eager} bytes: staged messages above it go by rxm's \
             SAR protocol, slower, and libfabric 2.1 can crash this process when a peer dies with \
             such a message half received (docs/staged-path.md). Run with \
             FI_OFI_RXM_BUFFER_SIZE={EAGER_LIMIT} (the library sets it itself when \
             NVSHMEM_LIBFABRIC_PROVIDER=tcp and libfabric was not initialised before it loaded)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_sets_the_limit_for_tcp_only_and_never_over_a_value() {
        assert_eq!(decide(Some("tcp"), None, None), 1);
        assert_eq!(decide(Some("tcp;ofi_rxm"), None, None), 1);
        assert_eq!(decide(Some("TCP"), None, None), 1);
        assert_eq!(decide(Some("tcp"), Some("16384"), None), 2);
        assert_eq!(decide(Some("tcp"), None, Some("keep")), 4);
        assert_eq!(decide(Some("tcp"), None, Some(" KEEP ")), 4);
        for other in [
            None,
            Some("shm"),
            Some("efa"),
            Some("verbs"),
            Some("nonsense"),
        ] {
            assert_eq!(decide(other, None, None), 3, "{other:?}");
        }
        assert_eq!(
            EAGER_LIMIT_TEXT.to_str().unwrap().parse::<usize>().unwrap(),
            EAGER_LIMIT
        );
        const { assert!(crate::gda::wire::STAGE_SLOT <= EAGER_LIMIT) };
    }
}
