//! The software queue's consumer thread behind its panic boundary: a panic (injected through the
//! `test-support` hook) is logged with its message and fails the queue at once, visibly to kernels
//! (`host_ctrl.stopped`, the word their waits check) and to host waiters (an error naming the
//! panic), well inside the quiet timeout.
mod softq_common;

use std::time::{Duration, Instant};

use nvshmem_efa_gda::gda::host_poster::HostPoster;
use softq_common::*;

#[test]
fn consumer_panic_fails_the_queue_at_once() {
    let log = capture();

    let quiet_timeout = Duration::from_secs(60);
    for p in providers() {
        let pes = setup(&p, 1, 1 << 20, 64, 8);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        let poster = HostPoster::new(q).unwrap().with_timeout(quiet_timeout);
        let peer = pe.peer(0);
        let base = pe.heap.addr();
        let lkey = pe.heap_lkey();

        // A healthy queue first.
        let pc = poster
            .post(&[write(&peer, base, lkey, base + 65536, 64, None)])
            .unwrap();
        assert_eq!(pc, 0);
        assert_eq!(poster.quiet().unwrap(), 0);
        assert!(q.failure().is_none());
        assert!(!q.stopped());

        // The consumer panics when it takes the next WQE; the quiet that waits for it must fail
        // long before the timeout.
        q.inject_panic_at(1);
        let pc = poster
            .post(&[write(&peer, base + 64, lkey, base + 65536 + 64, 64, None)])
            .unwrap();
        assert_eq!(pc, 1);
        let t = Instant::now();
        let e = poster
            .quiet()
            .expect_err("quiet on a queue whose consumer panicked");
        let waited = t.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "{p}: the failure took {waited:?} to reach the waiter (quiet timeout {quiet_timeout:?})"
        );
        assert_eq!(e.code, -libc::EIO, "{e}");
        assert!(
            e.message
                .contains("injected fault: consumer panic at WQE 1"),
            "{p}: {e}"
        );
        // What kernels read: host_ctrl.stopped.
        assert!(q.stopped(), "{p}: the failed queue is not marked stopped");
        assert_eq!(
            q.failure().as_deref(),
            Some("injected fault: consumer panic at WQE 1")
        );
        // Posting goes on failing at once rather than hanging.
        let t = Instant::now();
        assert!(poster
            .post(&[write(&peer, base, lkey, base + 65536, 64, None)])
            .and_then(|_| poster.quiet())
            .is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
        let text = log.text();
        assert!(
            text.contains(
                "software queue consumer thread 0 panicked: injected fault: consumer panic at WQE 1"
            ),
            "{p}: the panic was not logged with its message:\n{text}"
        );
        // Dropping the failed queue returns (the thread is gone, nothing to join on).
        drop(poster);
        let t = Instant::now();
        drop(pes);
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}

/// A consumer thread blocked inside its loop pass (injected: it sleeps 3 s when it takes WQE 1) is
/// reported by the watchdog once its limit passed, naming the PE and the thread, and again when it
/// goes on; a healthy queue, busy or idle, gets no such warning; the stalled WQE still completes.
#[test]
fn watchdog_reports_a_blocked_consumer() {
    let log = capture();
    let mut cfg = config(nvshmem_efa_gda::config::GdaMode::Soft);
    cfg.soft_watchdog = Duration::from_secs(1);
    for p in providers() {
        let at = log.len();
        let pes = setup_with(&p, 1, 1 << 20, 64, 8, &cfg);
        let pe = &pes[0];
        let q = pe.gda.soft_queue().unwrap();
        let poster = HostPoster::new(q)
            .unwrap()
            .with_timeout(Duration::from_secs(60));
        let peer = pe.peer(0);
        let base = pe.heap.addr();
        let lkey = pe.heap_lkey();

        // Healthy: a WQE, then idle for one and a half limits.
        poster
            .post(&[write(&peer, base, lkey, base + 65536, 64, None)])
            .unwrap();
        assert_eq!(poster.quiet().unwrap(), 0);
        std::thread::sleep(Duration::from_millis(1500));
        let text = log.text_from(at);
        assert!(
            !text.contains("has not finished a loop pass"),
            "{p}: a healthy consumer was reported as blocked:\n{text}"
        );

        // Blocked for 3 s inside the pass that takes WQE 1.
        q.inject_stall_at(1, 3000);
        let t = Instant::now();
        let pc = poster
            .post(&[write(&peer, base + 64, lkey, base + 65536 + 64, 64, None)])
            .unwrap();
        assert_eq!(pc, 1);
        assert_eq!(
            poster.quiet().unwrap(),
            0,
            "{p}: the stalled WQE did not complete"
        );
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(2900),
            "{p}: no stall ({waited:?})"
        );
        // The watchdog looks every tenth of its limit: the line that says it goes on may come a
        // little after the quiet returned.
        let deadline = Instant::now() + Duration::from_secs(5);
        let text = loop {
            let text = log.text_from(at);
            if text.contains("goes on after") || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            text.contains(
                "software queue of PE 0: consumer thread 0 has not finished a loop pass for"
            ),
            "{p}: the blocked consumer was not reported:\n{text}"
        );
        assert_eq!(
            text.matches("has not finished a loop pass").count(),
            1,
            "{p}: one stall, one warning:\n{text}"
        );
        assert!(
            text.contains("software queue of PE 0: consumer thread 0 goes on after"),
            "{p}: the consumer's going on was not reported:\n{text}"
        );
        drop(poster);
        drop(pes);
    }
}
