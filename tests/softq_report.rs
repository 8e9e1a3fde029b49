//! The software queue's report at debug level names what an application stuck in a wait needs to
//! tell apart: an AMO word this PE's consumer wrote whose value changed since (a count overwritten
//! after delivery, e.g. cleaned too early), and a ring whose GPU side is not where the consumer is
//! (slots reserved and not committed: a poster waiting for ring room or for its turn). Checked on
//! the first provider that opens (tcp or shm); the report comes up to 5 s after the last activity.
mod softq_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_OP_ADD};
use softq_common::*;

fn wait_for(log: &Capture, at: usize, what: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = log.text_from(at);
        if text.contains(what) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn debug_report_names_a_changed_amo_word_and_a_ring_not_at_its_consumer() {
    let log = capture_at(tracing::Level::DEBUG);
    let p = providers().remove(0);
    let at = log.len();
    let pes = setup(&p, 2, 1 << 20, 64, 8);
    let (q0, q1) = (
        pes[0].gda.soft_queue().unwrap(),
        pes[1].gda.soft_queue().unwrap(),
    );
    let poster0 = HostPoster::new(q0)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let poster1 = HostPoster::new(q1)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    // PE 0 adds 5 to the first word of PE 1's heap (an AMO message PE 1's consumer applies).
    let amo = AmoMsg {
        op: AMO_OP_ADD,
        size: 8,
        offset: 0,
        value: 5,
        flags: 0,
    }
    .encode();
    poster0
        .post(&[send_inline(&pes[0].peer(1), &amo, None)])
        .unwrap();
    assert_eq!(poster0.quiet().unwrap(), 0);
    // SAFETY: the first 8-byte word of PE 1's live heap, written by PE 1's consumer with atomics.
    let word = unsafe { AtomicU64::from_ptr(pes[1].heap.ptr() as *mut u64) };
    // On tcp (the first provider that opens) the sender's quiet covers the SEND's delivery, not
    // its application (SENDs are answered only on shm, docs/gda-amo-path.md): PE 1's consumer
    // applies the AMO when it takes the message, so the word is awaited, bounded.
    wait_until_within("PE 1 to apply the AMO (5)", Duration::from_secs(10), || {
        word.load(Ordering::Acquire) == 5
    });
    // The application overwrites it (a clean after delivery); then PE 1 posts a write of its own,
    // so that its consumer reports once it is idle again.
    word.store(0, Ordering::Release);
    let base1 = pes[1].heap.addr();
    poster1
        .post(&[write(
            &pes[1].peer(0),
            base1 + 4096,
            pes[1].heap_lkey(),
            pes[0].heap.addr() + 4096,
            64,
            None,
        )])
        .unwrap();
    assert_eq!(poster1.quiet().unwrap(), 0);
    // Two slots of PE 0's ring 0 reserved and never committed (a poster that stopped between).
    let v = *poster0.view();
    // SAFETY: `resv` is the first word of the live queue's control block (host memory).
    let resv = unsafe { AtomicU64::from_ptr(v.ctrl as *mut u64) };
    let before = resv.fetch_add(2, Ordering::AcqRel);

    let changed = format!(
        "1 changed since (newest first): {:#x} (8 B) wrote 5, now 0",
        pes[1].heap.addr()
    );
    let text = wait_for(log, at, &changed, Duration::from_secs(15));
    assert!(
        text.contains("software queue of PE 1") && text.contains(&changed),
        "{p}: PE 1's report does not name the overwritten word:\n{text}"
    );
    let odd = format!(
        "1 ring(s) not at their consumer: ring 0: {} reserved, {before} committed, {before} done, \
         doorbell {before}, {before} taken",
        before + 2
    );
    let text = wait_for(log, at, &odd, Duration::from_secs(15));
    assert!(
        text.contains(&odd),
        "{p}: PE 0's report does not name its ring with slots reserved and not committed:\n{text}"
    );
    assert!(
        text.contains("2 slots reserved and not taken over this thread's rings"),
        "{p}: {text}"
    );
    resv.fetch_sub(2, Ordering::AcqRel);
    drop((poster0, poster1));
    drop(pes);
}
