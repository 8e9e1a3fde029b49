//! A mover's kernel-atomic lanes, one per endpoint ([`super::amo::KernelAmos`] each): loaded at
//! connect, launched into by [`super::engine::Mover::kernel_amo`], settled by the transport's quiet
//! and progress, closed before the peers' mappings.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, ReentrantMutex, ReentrantMutexGuard, RwLock};

use super::amo::{AmoRequest, KernelAmos, Launch, Settled};
use super::{MResult, MoverError};
use crate::cuda::kernel::{self, AmoKernel, AmoOp};
use crate::cuda::stream::Event;

/// The kernel-atomic lanes of one mover.
pub struct AmoLanes {
    /// Kernel atomics are on: loaded by [`AmoLanes::prepare`], off again after a refused launch
    /// or [`AmoLanes::close`].
    on: AtomicBool,
    /// One lane per endpoint (created by `prepare`).
    lanes: Vec<Mutex<Option<KernelAmos>>>,
    /// Entries in each lane's pending list (read without the lane's lock).
    pending: Vec<AtomicUsize>,
    /// How long a kernel atomic may stay undecided before the host takes it over.
    stuck: RwLock<Duration>,
    /// Held per endpoint while atomics are settled and those taken over are handed on, so that a
    /// quiet in one thread waits for a take-over that another thread (progress) is carrying.
    carry: Vec<ReentrantMutex<()>>,
}

impl AmoLanes {
    /// `n` lanes, off.
    pub fn new(n: usize) -> AmoLanes {
        AmoLanes {
            on: AtomicBool::new(false),
            lanes: (0..n).map(|_| Mutex::new(None)).collect(),
            pending: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            stuck: RwLock::new(Duration::from_millis(10)),
            carry: (0..n).map(|_| ReentrantMutex::new(())).collect(),
        }
    }

    /// Loads the atomic kernel into context `ctx`, makes one lane per endpoint, and runs one
    /// launch that the host has claimed beforehand (it must leave its target alone and say so),
    /// waited for: the driver compiles and loads everything here, at connect, not in the middle of
    /// an application's kernel. `stuck`: how long an atomic may stay undecided before the host
    /// takes it over. An error leaves kernel atomics off.
    pub fn prepare(&self, ctx: usize, stuck: Duration) -> MResult<()> {
        let t = Instant::now();
        let device = kernel::context_device(ctx)?;
        let k = Arc::new(AmoKernel::load(ctx)?);
        let mut lanes = Vec::with_capacity(self.lanes.len());
        for _ in 0..self.lanes.len() {
            lanes.push(KernelAmos::new(k.clone())?);
        }
        lanes[0].check_claimed_launch(Instant::now() + Duration::from_secs(10))?;
        for (slot, lane) in self.lanes.iter().zip(lanes) {
            *slot.lock() = Some(lane);
        }
        *self.stuck.write() = stuck;
        self.on.store(true, Ordering::Release);
        tracing::info!(
            "kernel atomics: loaded on device {device} in {:?} (host takes over after {stuck:?})",
            t.elapsed()
        );
        Ok(())
    }

    /// Whether kernel atomics are on.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Launches one operation on endpoint `ep`'s lane (see [`KernelAmos::launch`]; `record_order`
    /// records the endpoint's copy queue). A launch the driver refuses turns kernel atomics off
    /// (logged) and answers [`Launch::NotHere`].
    ///
    /// # Safety
    /// As [`KernelAmos::launch`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn launch(
        &self,
        ep: usize,
        record_order: impl FnOnce(&Event) -> MResult<bool>,
        target: u64,
        op: AmoOp,
        size: u32,
        val: u64,
        result: u64,
        req: AmoRequest,
    ) -> MResult<Launch> {
        let (Some(lane), Some(count)) = (self.lanes.get(ep), self.pending.get(ep)) else {
            return Err(MoverError::Invalid(format!(
                "kernel lane {ep} does not exist"
            )));
        };
        let mut lane = lane.lock();
        let Some(l) = lane.as_mut() else {
            return Ok(Launch::NotHere);
        };
        // SAFETY: forwarded contract.
        let r = unsafe {
            l.launch(
                record_order,
                target,
                op,
                size,
                val,
                result,
                req,
                Instant::now(),
            )
        };
        count.store(l.in_flight(), Ordering::Release);
        r.or_else(|e| {
            tracing::error!(
                "kernel atomics: {e}; atomics take the provider's path from now on (not atomic \
                 against kernel atomics other PEs may still apply)"
            );
            self.on.store(false, Ordering::Release);
            Ok(Launch::NotHere)
        })
    }

    /// Decides endpoint `ep`'s pending kernel atomics: retires those the kernel applied, takes
    /// over those undecided for the stuck limit, and returns the taken-over ones for the caller to
    /// carry, and the fetched values for host memory the caller writes. With `until`, waits until
    /// none is undecided (an error after `until`); without, one look that never blocks (nothing
    /// when another thread holds the lane).
    pub fn settle(&self, ep: usize, until: Option<Instant>) -> MResult<Settled> {
        let (Some(lane), Some(count)) = (self.lanes.get(ep), self.pending.get(ep)) else {
            return Ok(Settled::default());
        };
        if count.load(Ordering::Acquire) == 0 {
            return Ok(Settled::default());
        }
        let stuck = *self.stuck.read();
        let started = Instant::now();
        let mut out = Settled::default();
        loop {
            let mut g = match until {
                Some(_) => lane.lock(),
                None => match lane.try_lock() {
                    Some(g) => g,
                    None => return Ok(out),
                },
            };
            let Some(l) = g.as_mut() else {
                return Ok(out);
            };
            let r = l.settle(Instant::now(), stuck);
            count.store(l.in_flight(), Ordering::Release);
            out.take_over.extend(r.take_over);
            out.results.extend(r.results);
            out.undecided = r.undecided;
            let Some(deadline) = until else {
                return Ok(out);
            };
            if r.undecided == 0 {
                return Ok(out);
            }
            if Instant::now() > deadline {
                return Err(MoverError::Timeout {
                    outstanding: r.undecided as u64,
                    waited: started.elapsed(),
                });
            }
            drop(g);
            std::hint::spin_loop();
        }
    }

    /// Lets endpoint `ep`'s lane launch again after the host took atomics over (see
    /// [`KernelAmos::end_host_mode`]): the transport calls it when a full quiet of `ep` has
    /// completed every operation posted before it.
    pub fn end_host_mode(&self, ep: usize) {
        if let Some(l) = self.lanes.get(ep) {
            if let Some(l) = l.lock().as_mut() {
                if l.in_host_mode() && l.end_host_mode() {
                    tracing::debug!("kernel atomics: endpoint {ep} launches kernels again");
                }
            }
        }
    }

    /// Endpoint `ep`'s carry guard: hold it from [`AmoLanes::settle`] until the operations it
    /// handed back are posted elsewhere. `wait`: block for it (quiet); else `None` when another
    /// thread holds it (progress). Reentrant: the thread holding it may settle again.
    pub fn carry(&self, ep: usize, wait: bool) -> Option<ReentrantMutexGuard<'_, ()>> {
        let m = self.carry.get(ep)?;
        if wait {
            Some(m.lock())
        } else {
            m.try_lock()
        }
    }

    /// Kernel atomics of endpoint `ep` not yet retired (undecided, or taken over and waiting for
    /// their late kernel).
    pub fn in_flight(&self, ep: usize) -> usize {
        self.pending
            .get(ep)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Counts of kernel atomics (applied by kernels, taken over by the host), for the log.
    pub fn counts(&self) -> (u64, u64) {
        self.lanes
            .iter()
            .filter_map(|l| l.lock().as_ref().map(|l| (l.applied, l.taken_over)))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Turns kernel atomics off and drops the lanes (each drop waits for launches still queued).
    pub fn close(&self) {
        self.on.store(false, Ordering::Release);
        for l in &self.lanes {
            l.lock().take();
        }
    }
}
