//! Answered SENDs (`src/gda/wire.rs`, docs/gda-amo-path.md): where the provider takes
//! delivery-complete sends one per peer at a time (libfabric's shm: SAR), the software queue posts
//! SENDs with transmit completion and completes each WQE when the target's answer comes, after the
//! target handled it. Checked on shm (skipped with a message where shm does not open): many AMO
//! messages leave without waiting for each other (the provider refused almost none of them, where
//! delivery completion had every SEND after the first refused until the one before it was done),
//! every one was answered, and a completed AMO is applied at the target: the word holds every add
//! the moment the poster's quiet returns, with no wait. On tcp SENDs keep delivery completion and
//! are not answered.
mod softq_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nvshmem_efa_gda::config::GdaMode;
use nvshmem_efa_gda::fabric::Provider;
use nvshmem_efa_gda::gda::host_poster::HostPoster;
use nvshmem_efa_gda::gda::wire::{AmoMsg, AMO_OP_ADD};
use softq_common::*;

/// Posts `n` AMO adds of 1 from PE 0 to the first word of PE 1's heap, 32 at a time, and quiets.
/// Returns PE 1's word as read right after the quiet.
fn adds(pes: &[Pe], n: u64) -> u64 {
    let q0 = pes[0].gda.soft_queue().unwrap();
    let poster = HostPoster::new(q0)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let peer = pes[0].peer(1);
    let amo = AmoMsg {
        op: AMO_OP_ADD,
        size: 8,
        offset: 0,
        value: 1,
        flags: 0,
    }
    .encode();
    let mut i = 0;
    while i < n {
        let k = (n - i).min(32);
        let ds: Vec<_> = (0..k).map(|_| send_inline(&peer, &amo, None)).collect();
        poster.post(&ds).unwrap();
        i += k;
    }
    poster.quiet().unwrap();
    assert_eq!(
        poster.errors(),
        0,
        "first error {:#x}",
        poster.first_error()
    );
    // SAFETY: the first 8-byte word of PE 1's live heap (page aligned); PE 1's consumer applies
    // the adds to it with atomics.
    unsafe { AtomicU64::from_ptr(pes[1].heap.ptr() as *mut u64) }.load(Ordering::Acquire)
}

#[test]
fn amo_messages_on_shm_are_answered_once_applied_and_leave_without_waiting() {
    if !providers().contains(&Provider::Shm) {
        eprintln!("shm does not open here: skipped");
        return;
    }
    const N: u64 = 512;
    let pes = setup_with(&Provider::Shm, 2, 1 << 20, 1024, 32, &config(GdaMode::Soft));
    let word = adds(&pes, N);
    let s0 = pes[0].gda.soft_queue().unwrap().stats();
    let s1 = pes[1].gda.soft_queue().unwrap().stats();
    eprintln!(
        "shm: {N} AMO messages: word {word} at the quiet; sender: {} refused for now, {} packed \
         SENDs; target: {} applied in {} batches, {} answered in {} messages",
        s0.wqes_refused,
        s0.sends_packed,
        s1.amos_applied,
        s1.amo_batches,
        s1.sends_answered,
        s1.answer_msgs
    );
    assert_eq!(
        word, N,
        "a completed AMO is applied at the target: the word must hold every add at the quiet"
    );
    assert_eq!(s1.amos_applied, N);
    assert_eq!(s1.sends_answered, N, "every SEND is answered on shm");
    // The AMOs went packed (several per SEND) and the answers of one batch share a message
    // (STAGE_ACKS): fewer SENDs than AMOs, no more answer messages than batches.
    assert!(
        s0.sends_packed >= 1 && s0.sends_packed < N / 4,
        "{} packed SENDs for {N} AMOs",
        s0.sends_packed
    );
    // The answers of one batch share a message (STAGE_ACKS): no more messages than batches.
    assert!(
        s1.answer_msgs >= 1 && s1.answer_msgs <= s1.amo_batches,
        "{} answer messages for {} batches",
        s1.answer_msgs,
        s1.amo_batches
    );
    assert!(
        s0.wqes_refused < N / 4,
        "the SENDs waited for each other: {} of {N} refused by the provider",
        s0.wqes_refused
    );
}

#[test]
fn sends_on_tcp_keep_delivery_completion_and_get_no_answer() {
    if !providers().contains(&Provider::Tcp) {
        eprintln!("tcp does not open here: skipped");
        return;
    }
    let pes = setup_with(&Provider::Tcp, 2, 1 << 20, 1024, 32, &config(GdaMode::Soft));
    let word = adds(&pes, 64);
    // Delivery completion: the messages are in PE 1's receive buffers when the SENDs complete;
    // PE 1's consumer applies them when it next reads its CQ (bounded wait: a loaded machine).
    let q1 = pes[1].gda.soft_queue().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while q1.stats().amos_applied < 64 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let s1 = q1.stats();
    assert_eq!(s1.amos_applied, 64);
    assert_eq!(s1.sends_answered, 0, "tcp SENDs are not answered SENDs");
    // The word as read at the quiet: the adds may have followed it.
    assert!(word <= 64);
}
