//! A peer that goes away makes quiet fail within the configured bound (NVSHMEM_EFA_QUIET_TIMEOUT_MS),
//! never hang: two transports in one process over tcp;ofi_rxm, one shut down mid-run.
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::Config;
use nvshmem_efa_gda::nvshmem::abi::{
    op, MemHandle, RmaBytesdesc, RmaMemdesc, RmaVerb, MEM_HANDLE_SIZE,
};
use nvshmem_efa_gda::nvshmem::{Transport, EP_HOST};

const QUIET_MS: u64 = 1500;

fn config() -> Config {
    let mut env = HashMap::new();
    env.insert("NVSHMEM_LIBFABRIC_PROVIDER", "tcp".to_string());
    env.insert("NVSHMEM_EFA_GDA", "off".to_string());
    env.insert("NVSHMEM_EFA_QUIET_TIMEOUT_MS", QUIET_MS.to_string());
    Config::from_lookup(|k| env.get(k).cloned()).expect("valid config")
}

/// An allgather between the two in-process "PEs": each round, both write, meet, read, meet.
struct Exchange {
    slots: Mutex<[Vec<u8>; 2]>,
    barrier: Barrier,
}

impl Exchange {
    fn allgather(&self, pe: usize, send: &[u8], recv: &mut [u8]) {
        self.slots.lock().unwrap()[pe] = send.to_vec();
        self.barrier.wait();
        {
            let s = self.slots.lock().unwrap();
            recv[..send.len()].copy_from_slice(&s[0]);
            recv[send.len()..2 * send.len()].copy_from_slice(&s[1]);
        }
        self.barrier.wait();
    }
}

fn put(
    t: &Transport,
    pe: i32,
    src: &mut [u8],
    dst: *mut u8,
    dst_handle: &mut MemHandle,
    src_handle: &mut MemHandle,
) -> i32 {
    let mut remote = RmaMemdesc {
        ptr: dst as *mut _,
        offset: 0,
        handle: dst_handle,
    };
    let mut local = RmaMemdesc {
        ptr: src.as_mut_ptr() as *mut _,
        offset: 0,
        handle: src_handle,
    };
    let verb = RmaVerb {
        op: op::PUT,
        is_nbi: 1,
        is_stream: 0,
        cstrm: std::ptr::null_mut(),
    };
    let bytes = RmaBytesdesc {
        nelems: src.len(),
        elembytes: 1,
        srcstride: 1,
        deststride: 1,
    };
    // SAFETY: descriptors and buffers live until the quiet below.
    match unsafe { t.rma(pe, verb, &mut remote, &mut local, bytes, EP_HOST) } {
        Ok(()) => 0,
        Err(e) => e.status,
    }
}

#[test]
fn quiet_fails_within_the_bound_when_the_peer_is_gone() {
    std::env::set_var(
        "FI_TCP_IFACE",
        std::env::var("FI_TCP_IFACE").unwrap_or_else(|_| "lo".into()),
    );
    let t0 = Arc::new(Transport::new(config()).expect("transport 0"));
    let t1 = Arc::new(Transport::new(config()).expect("transport 1"));
    let ex = Arc::new(Exchange {
        slots: Mutex::new([Vec::new(), Vec::new()]),
        barrier: Barrier::new(2),
    });
    let threads: Vec<_> = [(0usize, t0.clone()), (1, t1.clone())]
        .into_iter()
        .map(|(pe, t)| {
            let ex = ex.clone();
            std::thread::spawn(move || {
                let ag = |send: &[u8], recv: &mut [u8]| {
                    ex.allgather(pe, send, recv);
                    Ok(())
                };
                t.connect(pe as i32, 2, &ag).expect("connect");
            })
        })
        .collect();
    for th in threads {
        th.join().expect("connect thread");
    }

    let mut src = vec![0x5au8; 4096];
    let mut dst = vec![0u8; 4096];
    let mut h_src = MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    };
    let mut h_dst = MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    };
    // SAFETY: both buffers outlive their registrations (released below or with the transports).
    unsafe {
        t0.get_mem_handle(&mut h_src, src.as_mut_ptr() as *mut _, src.len(), false)
            .expect("register src");
        t1.get_mem_handle(&mut h_dst, dst.as_mut_ptr() as *mut _, dst.len(), false)
            .expect("register dst");
    }

    // While the peer lives, a put completes and lands.
    assert_eq!(
        put(&t0, 1, &mut src, dst.as_mut_ptr(), &mut h_dst, &mut h_src),
        0
    );
    t0.quiet(EP_HOST).expect("quiet with a live peer");
    assert!(dst.iter().all(|&b| b == 0x5a), "put did not land");

    // The peer goes away (endpoints closed, progress stopped).
    t1.shutdown();
    drop(t1);

    let start = Instant::now();
    let posted = put(&t0, 1, &mut src, dst.as_mut_ptr(), &mut h_dst, &mut h_src);
    let quiet = t0.quiet(EP_HOST);
    let elapsed = start.elapsed();
    assert!(
        posted != 0 || quiet.is_err(),
        "a put to a vanished peer neither failed to post nor made quiet fail"
    );
    let bound = Duration::from_millis(3 * QUIET_MS + 2000);
    assert!(elapsed < bound, "failure took {elapsed:?}, bound {bound:?}");
    eprintln!(
        "put to a vanished peer: post status {posted}, quiet {:?}, after {elapsed:?}",
        quiet.err().map(|e| e.message)
    );
    t0.shutdown();
}
