//! The queue's rings (docs/gda-queues.md): ring 0 is the queue made with it (SQ, CQ, RX ring,
//! doorbell, control block); [`SoftQueue::add_rings`] adds rings of their own (SQ, CQ, doorbell,
//! control block; the RX ring stays ring 0's: it belongs to the PE), one per entry of the device
//! state's queue table up to [`SoftQueueConfig::max_rings`]. The consumer keeps per ring what the
//! posting protocol makes per queue ([`RingState`]): its consumer index, the `done` it last saw, its
//! CQ producer count, its doorbell checks. Each ring has one consumer thread for good (`threads.rs`:
//! ring `r` on thread `r % T`); a thread's slots, copy queue and bounce ring are shared by its
//! rings, and a round reads every one of its rings' doorbells.
use super::*;

/// Memory of a ring added after ring 0.
pub(super) struct RingMem {
    pub(super) mem: SharedMem,
    pub(super) ctrl: CtrlMem,
    pub(super) layout: RingLayout,
    /// The consumer thread that serves the ring (`threads.rs`).
    pub(super) claim: super::threads::RingClaim,
}

/// The rings added after ring 0, as the tables carry them to the consumer.
#[derive(Clone, Default)]
pub(super) struct ExtraRings(pub(super) Vec<Arc<RingMem>>);

impl std::fmt::Debug for ExtraRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} extra rings", self.0.len())
    }
}

/// What the consumer keeps of one ring.
pub(super) struct RingState {
    /// The ring's index in the queue (the queue table's entry, below `max_rings`).
    pub(super) id: usize,
    /// The ring's memory (`None`: ring 0, the queue's own).
    pub(super) mem: Option<Arc<RingMem>>,
    pub(super) sq: *mut u8,
    pub(super) cq: *mut u8,
    pub(super) doorbell: *mut u8,
    pub(super) host_ctrl: *mut u8,
    /// WQEs taken (the ring's consumer index).
    pub(super) ci: u64,
    pub(super) cached_done: u64,
    pub(super) done_checked: Option<Instant>,
    /// The device has been seen writing this ring's `host_ctrl.done`.
    pub(super) done_mirrored: bool,
    /// Completions written into the ring's CQ.
    pub(super) cq_pc: u64,
    /// WQEs of this ring rejected.
    pub(super) rejected: u64,
    pub(super) bad_doorbell: Option<u32>,
    /// Producer counts of WQEs seen written more than `max_batch` ahead of the doorbell.
    pub(super) ahead: std::collections::BTreeSet<u64>,
    /// When the written-ahead look is next due, in nanoseconds of the consumer's pass clock
    /// (`Consumer::pass_ns`; 0: at once).
    pub(super) ahead_due: u64,
}

impl RingState {
    fn new(id: usize, mem: Option<Arc<RingMem>>, base: *mut u8, layout: &RingLayout) -> RingState {
        // SAFETY: the offsets come from the layout the memory was sized with.
        let at = |off: usize| unsafe { base.add(off) };
        RingState {
            id,
            sq: at(layout.sq),
            cq: at(layout.cq),
            doorbell: at(layout.doorbell),
            host_ctrl: at(layout.host_ctrl),
            mem,
            ci: 0,
            cached_done: 0,
            done_checked: None,
            done_mirrored: false,
            cq_pc: 0,
            rejected: 0,
            bad_doorbell: None,
            ahead: Default::default(),
            ahead_due: 0,
        }
    }

    /// Ring 0's state.
    pub(super) fn first(inner: &Inner) -> RingState {
        RingState::new(0, None, inner.rings.host(), &inner.layout)
    }

    /// A host control word of this ring.
    pub(super) fn host_word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-byte aligned word inside the ring's host control block, which lives as long as
        // the ring (its memory is held by `mem` or by the queue).
        unsafe { mem::atomic_u64(self.host_ctrl.add(off)) }
    }

    /// The ring's device control block.
    pub(super) fn ctrl<'a>(&'a self, inner: &'a Inner) -> &'a CtrlMem {
        self.mem.as_ref().map_or(&inner.ctrl, |m| &m.ctrl)
    }
}

// SAFETY: the pointers address memory the state keeps alive (`mem`) or the queue's own rings,
// which outlive the consumer; only the consumer thread uses them.
unsafe impl Send for RingState {}

impl RingMem {
    /// A ring of `sq_entries` entries of `entry_size` bytes, its CQ, doorbell and control block.
    pub(super) fn new(
        sq_entries: u32,
        entry_size: u32,
        placement: CtrlPlacement,
    ) -> Result<RingMem> {
        let layout = RingLayout::new(sq_entries, entry_size, sq_entries, 0);
        Ok(RingMem {
            mem: SharedMem::new(layout.total, mem::cuda_usable())?,
            ctrl: CtrlMem::new(CTRL_SIZE + 4 * sq_entries as usize, placement)?,
            layout,
            claim: Default::default(),
        })
    }
}

impl Consumer {
    /// Takes the rings the tables name that this thread serves and does not serve yet: ring `r`
    /// is thread `r % T`'s, for good (`threads.rs`).
    pub(super) fn sync_rings(&mut self) {
        let extra = &self.tables.rings.0;
        let t = self.inner.mail.len().max(1);
        while self.next_ring < extra.len() + 1 {
            let id = self.next_ring;
            self.next_ring += 1;
            if id % t != self.id {
                continue;
            }
            let m = extra[id - 1].clone();
            m.claim.claim(id, self.id);
            let base = m.mem.host();
            let layout = m.layout;
            self.rings.push(RingState::new(id, Some(m), base, &layout));
        }
    }

    /// The ring being consumed.
    pub(super) fn r(&mut self) -> &mut RingState {
        &mut self.rings[self.cur]
    }

    /// WQEs taken over all rings.
    pub(super) fn taken(&self) -> u64 {
        self.rings.iter().map(|r| r.ci).sum()
    }

    /// Marks every ring stopped (kernels waiting on any of them see it).
    pub(super) fn mark_stopped(&self) {
        for r in &self.rings {
            r.host_word(HC_STOPPED).store(1, Ordering::Release);
        }
    }
}

impl SoftQueue {
    /// Gives the queue `n` rings in all (ring 0 and `n - 1` of their own, at most
    /// [`SoftQueueConfig::max_rings`]; logged when capped); rings already there stay. Returns the
    /// number of rings.
    pub fn add_rings(&self, n: usize) -> Result<usize> {
        let want = n.max(1);
        let cap = self.inner.max_rings.max(1);
        if want > cap {
            tracing::warn!(
                "software queue: {want} queues asked for, the queue makes at most {cap} rings \
                 (max_rings): queues share rings, queue i on ring i % {cap}"
            );
        }
        let target = want.min(cap);
        let have = self.rings();
        if target <= have {
            return Ok(have);
        }
        let mut fresh = Vec::with_capacity(target - have);
        for _ in have..target {
            fresh.push(Arc::new(RingMem::new(
                self.inner.sq_entries,
                self.inner.sq_entry_size,
                self.inner.ctrl_placement,
            )?));
        }
        self.update(|t| {
            t.rings.0.extend(fresh);
            Ok(())
        })?;
        let t = self.inner.mail.len();
        tracing::info!(
            "software queue: {target} rings of {} x {} B (one per queue, served by {} consumer \
             thread(s), ring r by thread r % {t})",
            self.inner.sq_entries,
            self.inner.sq_entry_size,
            t.min(target)
        );
        Ok(target)
    }

    /// Rings the queue has (ring 0 and the ones [`SoftQueue::add_rings`] added).
    pub fn rings(&self) -> usize {
        self.inner.tables.lock().rings.0.len() + 1
    }

    /// Ring `i` as kernels see it (ring 0: [`SoftQueue::queue_desc`]); `None` past the rings.
    pub fn ring_desc(&self, i: usize) -> Option<NvshmemEfaGdaQueue> {
        let q0 = self.queue_desc();
        if i == 0 {
            return Some(q0);
        }
        let m = self.inner.tables.lock().rings.0.get(i - 1)?.clone();
        let base = m.mem.device();
        Some(NvshmemEfaGdaQueue {
            sq: base + m.layout.sq as u64,
            sq_doorbell: base + m.layout.doorbell as u64,
            cq: base + m.layout.cq as u64,
            // The RX ring belongs to the PE: ring 0's.
            rx_cq: q0.rx_cq,
            ctrl: m.ctrl.device(),
            slot_status: m.ctrl.device() + CTRL_SIZE as u64,
            host_ctrl: base + m.layout.host_ctrl as u64,
            ..q0
        })
    }
}

impl Inner {
    /// Marks ring 0 and every added ring stopped (kernels waiting on any of them see it).
    pub(super) fn mark_all_stopped(&self) {
        self.host_ctrl_word(HC_STOPPED).store(1, Ordering::Release);
        let extra = self.tables.lock().rings.clone();
        for m in &extra.0 {
            // SAFETY: 8-byte aligned word inside the ring's host control block.
            unsafe { mem::atomic_u64(m.mem.host().add(m.layout.host_ctrl + HC_STOPPED)) }
                .store(1, Ordering::Release);
        }
    }
}

impl SoftQueue {
    /// Host pointers of ring `i` ([`SoftQueue::host_view`] for ring 0), when its control block is
    /// in host memory.
    pub fn ring_host_view(&self, i: usize) -> Option<HostView> {
        let v0 = self.host_view()?;
        if i == 0 {
            return Some(v0);
        }
        let m = self.inner.tables.lock().rings.0.get(i - 1)?.clone();
        let ctrl = m.ctrl.host()?;
        let base = m.mem.host();
        // SAFETY: offsets of the layout the ring memory was sized with; the memory stays while
        // the queue lives (the tables keep every ring they ever named).
        let at = |off: usize| unsafe { base.add(off) };
        Some(HostView {
            sq: at(m.layout.sq),
            doorbell: at(m.layout.doorbell) as *mut u32,
            cq: at(m.layout.cq),
            ctrl,
            // SAFETY: the status words follow the control block inside the same allocation.
            slot_status: unsafe { ctrl.add(CTRL_SIZE) } as *mut u32,
            host_ctrl: at(m.layout.host_ctrl),
            ..v0
        })
    }
}
