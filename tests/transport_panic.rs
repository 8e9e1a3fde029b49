//! A panic in the progress thread marks the transport failed: a quiet that is waiting returns an
//! error at once (not at NVSHMEM_EFA_QUIET_TIMEOUT_MS), and later operations fail fast with a
//! message naming the panic. Two transports in one process over tcp;ofi_rxm. PE 1 runs without a
//! progress thread: a first target-applied AMO, while a pump thread polls PE 1, sets the connection
//! up and checks the path works; then PE 1 is no longer polled, so PE 0's second AMO stays
//! unanswered and PE 0's quiet waits until a panic is injected into PE 0's progress thread (a hook
//! compiled only with the `test-support` feature).
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::Config;
use nvshmem_efa_gda::nvshmem::abi::{
    amo, op, status, AmoMemdesc, AmoVerb, MemHandle, RmaBytesdesc, RmaMemdesc, RmaVerb,
    MEM_HANDLE_SIZE,
};
use nvshmem_efa_gda::nvshmem::{Transport, EP_HOST};

/// The quiet timeout: a waiter that is not woken by the panic fails only after this long.
const QUIET_MS: u64 = 30_000;
/// How soon after the panic the waiting quiet must fail.
const FAIL_WITHIN: Duration = Duration::from_secs(2);

fn config(progress_thread: bool) -> Config {
    let mut env = HashMap::new();
    env.insert("NVSHMEM_LIBFABRIC_PROVIDER", "tcp".to_string());
    env.insert("NVSHMEM_EFA_GDA", "off".to_string());
    env.insert("NVSHMEM_EFA_ATOMICS", "target".to_string());
    env.insert("NVSHMEM_EFA_QUIET_TIMEOUT_MS", QUIET_MS.to_string());
    env.insert(
        "NVSHMEM_EFA_PROGRESS_THREAD",
        if progress_thread { "1" } else { "0" }.to_string(),
    );
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

fn empty_handle() -> MemHandle {
    MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    }
}

#[test]
fn a_progress_thread_panic_fails_a_waiting_quiet_at_once_and_later_ops_fast() {
    std::env::set_var(
        "FI_TCP_IFACE",
        std::env::var("FI_TCP_IFACE").unwrap_or_else(|_| "lo".into()),
    );
    let t0 = Arc::new(Transport::new(config(true)).expect("transport 0"));
    let t1 = Arc::new(Transport::new(config(false)).expect("transport 1"));
    assert!(
        !t0.uses_provider_atomics(),
        "the test needs target-applied AMOs"
    );
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

    // PE 1's word that PE 0 adds to; PE 1 never polls, so the request is never answered.
    let mut word = vec![0u64; 1];
    let mut h_word = empty_handle();
    // SAFETY: the buffer outlives its registration (released with the transport at the end).
    unsafe {
        t1.get_mem_handle(&mut h_word, word.as_mut_ptr() as *mut _, 8, false)
            .expect("register the target word");
    }
    let mut target = AmoMemdesc {
        remote: RmaMemdesc {
            ptr: word.as_mut_ptr() as *mut _,
            offset: 0,
            handle: &mut h_word,
        },
        retflag: 0,
        retptr: std::ptr::null_mut(),
        valptr: std::ptr::null_mut(),
        cmpptr: std::ptr::null_mut(),
        val: 5,
        cmp: 0,
        ret_handle: std::ptr::null_mut(),
    };
    let verb = AmoVerb {
        op: amo::ADD,
        is_fetch: 0,
        is_val: 1,
        is_cmp: 0,
    };
    // While PE 1 is polled (here by a pump thread), an AMO is answered: the connection is set up
    // and the path works.
    let pumping = Arc::new(AtomicBool::new(true));
    let pump = {
        let (t1, pumping) = (t1.clone(), pumping.clone());
        std::thread::spawn(move || {
            while pumping.load(Ordering::Acquire) {
                t1.progress_all();
                std::thread::yield_now();
            }
        })
    };
    // SAFETY: the descriptor and the remote word stay valid until the quiet below.
    unsafe { t0.amo(1, verb, &mut target, 8, EP_HOST) }.expect("post the first AMO");
    t0.quiet(EP_HOST).expect("quiet while PE 1 is polled");
    // SAFETY: the AMO is complete (quiet); nothing writes the word now.
    assert_eq!(unsafe { std::ptr::read_volatile(word.as_ptr()) }, 5);
    pumping.store(false, Ordering::Release);
    pump.join().expect("pump thread");

    // From now on PE 1 is not polled: the next AMO is never answered.
    // SAFETY: as above.
    unsafe { t0.amo(1, verb, &mut target, 8, EP_HOST) }.expect("post the second AMO");

    // A waiter: quiet on PE 0 waits for the unanswered AMO.
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let t0 = t0.clone();
        std::thread::spawn(move || {
            let r = t0.quiet(EP_HOST);
            tx.send((Instant::now(), r))
                .expect("report the quiet result");
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "quiet returned although the AMO cannot have been answered"
    );

    let injected = Instant::now();
    t0.inject_progress_panic();
    let (done, quiet) = rx
        .recv_timeout(FAIL_WITHIN + Duration::from_secs(5))
        .expect("quiet still waiting seconds after the progress thread panicked");
    waiter.join().expect("waiter thread");
    let took = done.saturating_duration_since(injected);
    let err = quiet.expect_err("quiet succeeded although the AMO was never answered");
    eprintln!(
        "waiting quiet failed {took:?} after the panic: {}",
        err.message
    );
    assert!(
        took < FAIL_WITHIN,
        "waiting quiet failed {took:?} after the panic (bound {FAIL_WITHIN:?}, timeout {QUIET_MS} ms)"
    );
    assert_eq!(err.status, status::INTERNAL);
    assert!(
        err.message.contains("progress thread panicked")
            && err
                .message
                .contains("panic injected into the progress thread"),
        "the error does not name the panic: {}",
        err.message
    );

    // Later operations fail fast and say why.
    let mut src = [7u8; 8];
    let mut h_src = empty_handle();
    let mut remote = RmaMemdesc {
        ptr: word.as_mut_ptr() as *mut _,
        offset: 0,
        handle: &mut h_word,
    };
    let mut local = RmaMemdesc {
        ptr: src.as_mut_ptr() as *mut _,
        offset: 0,
        handle: &mut h_src,
    };
    let put = RmaVerb {
        op: op::PUT,
        is_nbi: 1,
        is_stream: 0,
        cstrm: std::ptr::null_mut(),
    };
    let bytes = RmaBytesdesc {
        nelems: 8,
        elembytes: 1,
        srcstride: 1,
        deststride: 1,
    };
    let start = Instant::now();
    // SAFETY: descriptors and buffers live for the call (it fails before posting anything).
    let put_err = unsafe { t0.rma(1, put, &mut remote, &mut local, bytes, EP_HOST) }
        .expect_err("a put on a failed transport succeeded");
    // SAFETY: as for the AMO above.
    let amo_err = unsafe { t0.amo(1, verb, &mut target, 8, EP_HOST) }
        .expect_err("an AMO on a failed transport succeeded");
    let quiet_err = t0
        .quiet(EP_HOST)
        .expect_err("quiet on a failed transport succeeded");
    let took = start.elapsed();
    assert!(took < FAIL_WITHIN, "later operations took {took:?} to fail");
    for e in [&put_err, &amo_err, &quiet_err] {
        assert_eq!(e.status, status::INTERNAL);
        assert!(
            e.message
                .starts_with("transport failed: the progress thread panicked"),
            "unclear error: {}",
            e.message
        );
    }

    // Shutdown still returns promptly (its quiet reports the failure as a warning).
    let start = Instant::now();
    t0.shutdown();
    t1.shutdown();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
}
