//! Mode choice and error paths: software providers have no GDA ops, so `auto` picks the software
//! queue and says why, `hw` fails with the clear error, `off` is a no-op; the C API rejects bad
//! arguments, is idempotent, and reports "not initialised" before init and after fini.
mod softq_common;

use std::ffi::c_void;

use nvshmem_efa_gda::capi::gda::*;
use nvshmem_efa_gda::capi::{
    NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED, NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL,
    NVSHMEM_EFA_ERROR_INVALID_VALUE, NVSHMEM_EFA_ERROR_NOT_INITIALIZED,
    NVSHMEM_EFA_ERROR_NOT_SUPPORTED,
};
use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::fabric::{AddressVector, CompletionQueue, Endpoint};
use nvshmem_efa_gda::gda::hw::{self, NO_GDA_OPS};
use nvshmem_efa_gda::gda::state::NvshmemEfaGdaDeviceState;
use nvshmem_efa_gda::gda::{self, Gda, GdaOptions, MODE_OFF, MODE_SOFT};
use softq_common::*;

/// Runs `f` and returns what was logged meanwhile (by any thread).
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    let c = capture();
    let at = c.len();
    let r = f();
    (r, c.text_from(at))
}

#[test]
fn software_providers_have_no_gda_ops() {
    capture();
    for p in providers() {
        let d = domain(&p).unwrap();
        let e = hw::open_ops(&d)
            .err()
            .expect("no GDA ops on a software provider");
        assert_eq!(e.code, -libc::EOPNOTSUPP, "{e}");
        assert!(e.message.contains(NO_GDA_OPS), "{e}");
        assert!(e.message.contains("fi_open_ops"), "{e}");
    }
}

#[test]
fn auto_picks_the_software_queue_and_says_why() {
    capture();
    for p in providers() {
        let d = domain(&p).unwrap();
        let (g, log) = logged(|| Gda::new(&d, &config(GdaMode::Auto), &GdaOptions::default()));
        let g = g.expect("auto falls back to the software queue");
        assert_eq!(g.mode(), MODE_SOFT);
        assert!(g.reason().contains(NO_GDA_OPS), "{}", g.reason());
        assert!(
            log.contains("software EFA queue") && log.contains(NO_GDA_OPS),
            "log: {log}"
        );
        assert!(!g.address().unwrap().is_empty());
    }
}

#[test]
fn hw_fails_with_the_clear_error() {
    capture();
    for p in providers() {
        let d = domain(&p).unwrap();
        let (g, log) = logged(|| Gda::new(&d, &config(GdaMode::Hw), &GdaOptions::default()));
        let e = g.err().expect("hw must fail without GDA ops");
        assert_eq!(e.code, -libc::EOPNOTSUPP, "{e}");
        assert!(
            e.message.contains("NVSHMEM_EFA_GDA=hw") && e.message.contains(NO_GDA_OPS),
            "{e}"
        );
        assert!(log.contains(NO_GDA_OPS), "log: {log}");
    }
}

#[test]
fn off_is_a_no_op() {
    capture();
    let p = providers().remove(0);
    let d = domain(&p).unwrap();
    let mut g = Gda::new(&d, &config(GdaMode::Off), &GdaOptions::default()).unwrap();
    assert_eq!(g.mode(), MODE_OFF);
    assert!(g.device_state().is_none());
    assert_eq!(g.address().unwrap_err().code, -libc::EOPNOTSUPP);
    assert!(g.connect(0, 1, b"x", None).is_err());
}

#[test]
fn bad_arguments_to_a_context_are_errors() {
    capture();
    let p = providers().remove(0);
    let mut pes = setup(&p, 2, 1 << 20, 16, 4);
    let g = &mut pes[0].gda;
    assert_eq!(
        g.set_remote_heap(7, 0x1000, 4096, 1).unwrap_err().code,
        -libc::EINVAL
    );
    assert_eq!(
        g.set_remote_heap(-1, 0x1000, 4096, 1).unwrap_err().code,
        -libc::EINVAL
    );
    assert_eq!(
        g.set_remote_heap(1, u64::MAX, 4096, 1).unwrap_err().code,
        -libc::EINVAL
    );
    assert_eq!(
        g.set_local_heap(0, 10, None).unwrap_err().code,
        -libc::EINVAL
    );
    assert_eq!(
        g.connect(0, 3, b"abc", None).unwrap_err().code,
        -libc::EALREADY
    );
    let name = g.address().unwrap();
    assert!(g.connect(5, 2, &name, None).is_err());
    // Reconnecting with what it already has is fine.
    let st = g.device_state().unwrap();
    assert_eq!(st.ready, 1);
    assert_eq!(st.n_pes, 2);
}

fn c_state() -> Option<NvshmemEfaGdaDeviceState> {
    let mut s = std::mem::MaybeUninit::<NvshmemEfaGdaDeviceState>::uninit();
    // SAFETY: valid output pointer.
    let r = unsafe {
        nvshmemt_efa_gda_get_device_state_sized(
            s.as_mut_ptr(),
            std::mem::size_of::<NvshmemEfaGdaDeviceState>(),
        )
    };
    // SAFETY: written on success.
    (r == 0).then(|| unsafe { s.assume_init() })
}

/// The process-global context through the C API, in one test because it is one global.
#[test]
fn c_api_lifecycle_and_argument_checks() {
    capture();
    let p = providers().remove(0);
    let enodev = NVSHMEM_EFA_ERROR_NOT_INITIALIZED;
    let einval = NVSHMEM_EFA_ERROR_INVALID_VALUE;
    assert!(nvshmemt_efa_gda_mode() < 0);
    let mut len = 0usize;
    // SAFETY: valid pointers (or deliberate nulls) throughout.
    unsafe {
        assert_eq!(
            nvshmemt_efa_gda_get_address(std::ptr::null_mut(), &mut len),
            enodev
        );
        assert_eq!(
            nvshmemt_efa_gda_get_address(std::ptr::null_mut(), std::ptr::null_mut()),
            einval
        );
        assert_eq!(
            nvshmemt_efa_gda_get_device_state_sized(std::ptr::null_mut(), 4096),
            einval
        );
        assert_eq!(
            nvshmemt_efa_gda_init_on_ep(std::ptr::null_mut(), std::ptr::null_mut()),
            einval
        );
        assert_eq!(nvshmemt_efa_gda_set_cq(std::ptr::null_mut()), einval);
        assert_eq!(
            nvshmemt_efa_gda_connect(0, 0, std::ptr::null(), 0, std::ptr::null()),
            einval
        );
        assert_eq!(
            nvshmemt_efa_gda_connect(0, 2, b"ab".as_ptr() as *const c_void, 1, std::ptr::null()),
            enodev
        );
        assert_eq!(
            nvshmemt_efa_gda_set_local_heap(std::ptr::null_mut(), 10, std::ptr::null_mut()),
            einval
        );
    }
    assert_eq!(nvshmemt_efa_gda_set_remote_heap(-1, 1, 1, 0), einval);
    assert_eq!(nvshmemt_efa_gda_set_remote_heap(0, 0x1000, 4096, 0), enodev);
    assert!(c_state().is_none());
    assert_eq!(nvshmemt_efa_gda_device_state_ptr(), 0);

    // Init, idempotent and thread-safe.
    let d = domain(&p).unwrap();
    let cfg = config(GdaMode::Auto);
    let modes: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| gda::init_internal(&d, &cfg).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(modes, vec![MODE_SOFT; 4]);
    assert_eq!(nvshmemt_efa_gda_mode(), 2);
    let other = domain(&p).unwrap();
    assert_eq!(
        gda::init_internal(&other, &cfg).unwrap_err().code,
        -libc::EALREADY
    );

    // Address: length query, too small, right size.
    let mut len = 0usize;
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            nvshmemt_efa_gda_get_address(std::ptr::null_mut(), &mut len),
            0
        );
        assert!(len > 0);
        let mut buf = vec![0u8; len];
        let mut small = len - 1;
        assert_eq!(
            nvshmemt_efa_gda_get_address(buf.as_mut_ptr() as *mut c_void, &mut small),
            NVSHMEM_EFA_ERROR_BUFFER_TOO_SMALL
        );
        assert_eq!(small, len);
        assert_eq!(
            nvshmemt_efa_gda_get_address(buf.as_mut_ptr() as *mut c_void, &mut len),
            0
        );
        assert_eq!(buf, gda::address().unwrap());
        // Connect as the only PE, set the heaps.
        assert_eq!(
            nvshmemt_efa_gda_connect(1, 1, buf.as_ptr() as *const c_void, len, std::ptr::null()),
            einval
        );
        assert_eq!(
            nvshmemt_efa_gda_connect(0, 1, buf.as_ptr() as *const c_void, len, std::ptr::null()),
            0
        );
        assert_eq!(
            nvshmemt_efa_gda_connect(0, 1, buf.as_ptr() as *const c_void, len, std::ptr::null()),
            0,
            "idempotent"
        );
    }
    let heap = HostBuf::new(1 << 20);
    // SAFETY: the heap outlives fini below.
    assert_eq!(
        unsafe {
            nvshmemt_efa_gda_set_local_heap(
                heap.ptr() as *mut c_void,
                heap.len(),
                std::ptr::null_mut(),
            )
        },
        0
    );
    let st = c_state().unwrap();
    assert_eq!(st.ready, 0, "not ready before the remote heaps are known");
    // A buffer of an older state version (160 bytes, version 2) gets nothing written, and the form
    // without a size is refused: neither can write past a caller's struct.
    let mut small = [0xa5u8; 256];
    let full = std::mem::size_of::<NvshmemEfaGdaDeviceState>();
    assert!(full > 160 && full <= small.len());
    // SAFETY: `small` holds 256 writable bytes; the call is told 160.
    unsafe {
        assert_eq!(
            nvshmemt_efa_gda_get_device_state_sized(small.as_mut_ptr().cast(), 160),
            einval
        );
        assert_eq!(
            nvshmemt_efa_gda_get_device_state(small.as_mut_ptr().cast()),
            einval
        );
    }
    assert!(
        small.iter().all(|&b| b == 0xa5),
        "a refused call wrote bytes"
    );
    let key = gda::local_heap_key().unwrap();
    assert_eq!(
        nvshmemt_efa_gda_set_remote_heap(1, heap.addr(), heap.len() as u64, key),
        einval
    );
    assert_eq!(
        nvshmemt_efa_gda_set_remote_heap(0, heap.addr(), heap.len() as u64, key),
        0
    );
    let st = c_state().unwrap();
    assert_eq!(st.ready, 1);
    assert_eq!((st.my_pe, st.n_pes, st.queue.mode), (0, 1, 2));
    assert_eq!(st.heap_base, heap.addr());
    assert_eq!(st.heap_size, heap.len() as u64);
    assert!(st.heap_lkey != 0 && st.peers != 0);
    assert!(
        st.queue.sq != 0 && st.queue.cq != 0 && st.queue.rx_cq != 0 && st.queue.sq_doorbell != 0
    );
    assert_eq!(st.queue.sq_entry_size, 64);
    assert_eq!(st.queue.cq_entry_size, 16);
    let ptr = nvshmemt_efa_gda_device_state_ptr();
    assert_ne!(ptr, 0);
    if !nvshmem_efa_gda::cuda::available() {
        // Without CUDA the "device" copy is host memory.
        // SAFETY: the published copy lives until fini.
        let published = unsafe { *(ptr as *const NvshmemEfaGdaDeviceState) };
        assert_eq!(published, st);
        // SAFETY: one peer entry in host memory.
        let peer = unsafe { *(st.peers as *const nvshmem_efa_gda::gda::state::NvshmemEfaGdaPeer) };
        assert_eq!(peer.heap_base, heap.addr());
        assert_eq!(peer.heap_rkey, gda::wire::SOFT_RKEY_HEAP);
    }

    // An external endpoint while initialised on another domain.
    let d2 = domain(&p).unwrap();
    let av = AddressVector::open(&d2, 4).unwrap();
    let cq = CompletionQueue::open(&d2, 64).unwrap();
    let ep = Endpoint::open(&d2, &av, &cq, None).unwrap();
    // SAFETY: open objects of one domain.
    let r = unsafe {
        nvshmemt_efa_gda_init_on_ep(d2.as_ptr() as *mut FidDomain, ep.as_ptr() as *mut FidEp)
    };
    assert_eq!(r, NVSHMEM_EFA_ERROR_ALREADY_INITIALIZED);

    nvshmemt_efa_gda_fini();
    nvshmemt_efa_gda_fini();
    assert!(nvshmemt_efa_gda_mode() < 0);
    assert!(c_state().is_none());
    assert_eq!(nvshmemt_efa_gda_device_state_ptr(), 0);

    // The external endpoint path: software providers have no GDA ops, and the software queue cannot
    // run on an endpoint the caller owns.
    for env in ["auto", "soft", "hw"] {
        std::env::set_var("NVSHMEM_EFA_GDA", env);
        let (r, log) = logged(|| {
            // SAFETY: open objects of one domain.
            unsafe {
                nvshmemt_efa_gda_init_on_ep(
                    d2.as_ptr() as *mut FidDomain,
                    ep.as_ptr() as *mut FidEp,
                )
            }
        });
        assert_eq!(r, NVSHMEM_EFA_ERROR_NOT_SUPPORTED, "NVSHMEM_EFA_GDA={env}");
        assert!(nvshmemt_efa_gda_mode() < 0);
        if env != "hw" {
            assert!(
                log.contains("NVSHMEM_REMOTE_TRANSPORT=libfabric"),
                "NVSHMEM_EFA_GDA={env}: {log}"
            );
        }
        if env != "soft" {
            assert!(log.contains(NO_GDA_OPS), "NVSHMEM_EFA_GDA={env}: {log}");
        }
    }
    std::env::set_var("NVSHMEM_EFA_GDA", "off");
    // SAFETY: open objects of one domain.
    assert_eq!(
        unsafe {
            nvshmemt_efa_gda_init_on_ep(d2.as_ptr() as *mut FidDomain, ep.as_ptr() as *mut FidEp)
        },
        0
    );
    assert_eq!(nvshmemt_efa_gda_mode(), 0);
    assert!(c_state().is_none());
    nvshmemt_efa_gda_fini();
    std::env::remove_var("NVSHMEM_EFA_GDA");
    drop(heap);
}

/// The limits hardware GDA sizes its queues by (docs/gda-queues.md) come from the provider: every
/// software provider admits endpoints with at least one transmit context each.
#[test]
fn the_domain_reports_its_endpoint_limits() {
    for p in providers() {
        let d = domain(&p).expect("domain");
        let (ep_cnt, tx_ctx, per_ep) = d.info().endpoint_limits();
        eprintln!("{p}: ep_cnt {ep_cnt}, tx_ctx_cnt {tx_ctx}, max_ep_tx_ctx {per_ep}");
        assert!(ep_cnt >= 1, "{p}: ep_cnt {ep_cnt}");
        assert!(
            tx_ctx >= 1 && per_ep >= 1,
            "{p}: {tx_ctx} / {per_ep} transmit contexts"
        );
    }
}
