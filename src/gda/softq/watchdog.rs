//! A thread that watches the consumer threads' loop passes and says when one stops making them.
//!
//! A consumer thread reports on itself (`Consumer::report`), so a thread blocked inside a call (a
//! CUDA copy or stream wait that never returns, a provider call) writes nothing, and its queue
//! looks the same as an idle one. On the GPU node a DeepEP run stopped with the consumer's last
//! report saying nothing was in flight: whether the library was idle or blocked from then on could
//! not be told (results/gpu-2026-11-29f). Each consumer thread stores its pass count in its mailbox
//! (`Mailbox::beat`) once per pass; this thread looks at them every tenth of the limit (at most
//! every second) and logs a warning when one has not moved for the limit
//! (`NVSHMEM_EFA_SOFT_WATCHDOG_MS`, default 5 s), naming the PE, the thread, how long, and what
//! WQEs wait; and an info line when it moves again. It never acts on the thread: a stopped pass
//! may still end (a long copy), and nothing but the call it is in can end it.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Inner;

/// Starts the watchdog of the queue's consumer threads, or returns `None` when `limit` is zero or
/// the thread cannot be made (logged: the queue works without it).
pub(super) fn start(inner: &Arc<Inner>, limit: Duration) -> Option<JoinHandle<()>> {
    if limit.is_zero() {
        return None;
    }
    let inner = inner.clone();
    match std::thread::Builder::new()
        .name("nvshmem-efa-softq-wd".into())
        .spawn(move || watch(&inner, limit))
    {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(
                "software queue: no watchdog thread ({e}): a consumer thread blocked inside a call \
                 will not be reported"
            );
            None
        }
    }
}

/// How often the watchdog looks, for a limit: a tenth of it, from 10 ms to 1 s.
pub(super) fn tick(limit: Duration) -> Duration {
    (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

fn watch(inner: &Inner, limit: Duration) {
    let n = inner.mail.len();
    let start = Instant::now();
    // Per thread: the last beat seen, when it was first seen, whether a warning is out.
    let mut seen: Vec<(u64, Instant, bool)> = (0..n)
        .map(|t| (inner.mail[t].beat.0.load(Ordering::Relaxed), start, false))
        .collect();
    let step = tick(limit);
    loop {
        // Sleep in short steps so that a stopping queue is not held up.
        let until = Instant::now() + step;
        while Instant::now() < until {
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(step.min(Duration::from_millis(20)));
        }
        if inner.failed.load(Ordering::Acquire) {
            // A consumer died of a panic: the queue is failed and said so; nothing runs to watch.
            return;
        }
        let now = Instant::now();
        for (t, s) in seen.iter_mut().enumerate() {
            let mail = &inner.mail[t];
            if mail.gone.load(Ordering::Acquire) {
                continue;
            }
            let beat = mail.beat.0.load(Ordering::Relaxed);
            if beat != s.0 {
                if s.2 {
                    tracing::info!(
                        "software queue of PE {}: consumer thread {t} goes on after {:.1} s \
                         inside one loop pass",
                        pe(inner),
                        now.duration_since(s.1).as_secs_f64()
                    );
                }
                *s = (beat, now, false);
            } else if !s.2 && now.duration_since(s.1) >= limit {
                s.2 = true;
                tracing::warn!(
                    "software queue of PE {}: consumer thread {t} has not finished a loop pass for \
                     {:.1} s (NVSHMEM_EFA_SOFT_WATCHDOG_MS): it is blocked inside a call (a CUDA \
                     copy or wait, or the provider), and every WQE of its rings waits for it; \
                     WQEs announced and not taken on ring 0: {}",
                    pe(inner),
                    now.duration_since(s.1).as_secs_f64(),
                    announced(inner)
                );
            }
        }
    }
}

/// This queue's PE, as the tables know it (0 before the queue was connected).
fn pe(inner: &Inner) -> i32 {
    inner.tables.lock().my_pe
}

/// WQEs ring 0's doorbell announces past what its consumer took.
fn announced(inner: &Inner) -> u32 {
    let consumed = inner
        .host_ctrl_word(super::layout::HC_CONSUMED)
        .load(Ordering::Acquire);
    // SAFETY: the doorbell word lives in the queue's ring memory for the life of the queue.
    let db = unsafe { super::mem::atomic_u32(inner.ring(inner.layout.doorbell)) }
        .load(Ordering::Acquire);
    // The doorbell holds the low 32 bits of the producer count.
    db.wrapping_sub(consumed as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_is_a_tenth_of_the_limit_within_bounds() {
        assert_eq!(tick(Duration::from_secs(5)), Duration::from_millis(500));
        assert_eq!(tick(Duration::from_millis(20)), Duration::from_millis(10));
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(1));
    }
}
