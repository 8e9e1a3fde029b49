//! The consumer thread: its state, its loop, stall reports and the idle policy.
use super::*;

/// The consumer thread's state.
pub(super) struct Consumer {
    pub(super) inner: Arc<Inner>,
    /// Which consumer thread this is (0 owns the endpoint; `threads.rs`).
    pub(super) id: usize,
    /// The index of the next ring of the tables to look at (whether it is this thread's).
    pub(super) next_ring: usize,
    /// WQEs handed to thread 0 (another thread), or taken from the other threads (thread 0).
    pub(super) handed: u64,
    /// Thread 0: WQEs the other threads handed over, not posted yet.
    pub(super) handed_in: VecDeque<Pending>,
    /// This thread's counters as last added to the queue's shared ones.
    pub(super) published: super::threads::Published,
    pub(super) tables: Arc<Tables>,
    pub(super) generation: u64,
    /// The rings served (`rings.rs`): ring 0 first, then the ones the tables add.
    pub(super) rings: Vec<super::rings::RingState>,
    /// The ring being consumed.
    pub(super) cur: usize,
    pub(super) rx_pc: u64,
    /// The GPU's consumer index of the RX ring, as last read.
    pub(super) rx_ci: crate::gda::mem::ConsumerIndex,
    pub(super) rx_seq: u64,
    /// RX completions waiting for room in the RX ring, each with the receive buffer it holds
    /// (receive credits only).
    pub(super) pending_rx: VecDeque<(RxCqe, Option<usize>)>,
    pub(super) rx_pending_warned: bool,
    /// WQEs the provider (or a pool) refused for now, one per ring at most, by the ring's position
    /// in `rings`: that ring waits until it goes, the others go on (WQEs of different rings are
    /// unordered, as EFA's queues are).
    pub(super) stalled: std::collections::BTreeMap<usize, Pending>,
    pub(super) slots: Vec<Option<InFlight>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) free_bounce: Vec<u32>,
    pub(super) in_flight: usize,
    pub(super) rejected: u64,
    pub(super) completed: u64,
    pub(super) delivery_flags: u64,
    pub(super) heartbeat: u64,
    /// Staged messages waiting for a send buffer (replies first).
    pub(super) outbox: VecDeque<OutItem>,
    /// Token of the WQE each send buffer's staged message awaits a reply for.
    pub(super) buf_owner: Vec<Option<u64>>,
    /// Copies between GPU memory and the staging buffers, waited for together (None: no CUDA).
    pub(super) copies: Option<cuda::CopyBatch>,
    /// Staged write chunks received whose copy into GPU memory is enqueued in `copies`: their
    /// acknowledgement (and immediate) waits for `flush_rx_batch`; (header, receive buffer).
    pub(super) rx_batch: Vec<(StageHdr, usize)>,
    /// AMO messages on GPU words received in the current CQ read, applied together at its end
    /// (`receive.rs` `flush_amo_batch`); each with its receive buffer and SEND header.
    pub(super) amo_batch: crate::gda::amo_batch::AmoBatch<(usize, SendHdr)>,
    /// What applies the AMO batches (their own copies of GPU words and page-locked room for the
    /// values; the copy stream is the staging copies' one).
    pub(super) amo_applier: crate::gda::amo_batch::Applier,
    /// What the staged path did, for the stall report.
    pub(super) stats: StageStats,
    /// The queue's own copy queue (the copy route), created at first need.
    pub(super) copyq: Option<crate::mover::queue::CopyQueue<Engine>>,
    /// Creating the copy queue failed: the copy route is off.
    pub(super) copyq_failed: bool,
    /// Copy WQEs waiting for their copy, in submission order.
    pub(super) copy_waits: VecDeque<CopyWait>,
    /// Copy WQEs taken this round, not yet enqueued.
    pub(super) round: super::ipc::CopyRound,
    /// WQEs executed as copies.
    pub(super) ipc_copies: u64,
    /// The bounce ring of the copy route's host hops ([`CopyRoute::Host`]), created with the copy
    /// queue.
    pub(super) bounce: Option<BounceRing>,
    /// The copy WQE last seen waiting for bounce ring room (its ring and producer count), and how
    /// many WQEs waited.
    pub(super) ring_wait_pc: Option<(u16, u64)>,
    pub(super) ipc_ring_waits: u64,
    /// The copy kernel of [`CopyRoute::Kernel`] (made with the queue, where the launches could be
    /// checked before any kernel of the application runs).
    pub(super) kcopies: Option<crate::mover::kcopy::KernelCopies<super::ipc::Hops>>,
    /// Copy kernel launches applied whose WQEs have not all completed yet.
    pub(super) kdone: std::collections::HashSet<u64>,
    /// The null consumer's batch of completions (kept for its allocation).
    pub(super) null_batch: Vec<(u16, CqStatus, OpType)>,
    /// Intake rounds, for the stop summary.
    pub(super) rounds: RoundStats,
    /// The ordering rule's bookkeeping (announcing AMOs wait for the data they announce).
    pub(super) order: super::order::Order,
    /// RDMA writes held back by the unordered fabric model, with the time each may go.
    pub(super) late: VecDeque<(Instant, Pending)>,
    /// The event trace (`NVSHMEM_EFA_SOFT_TRACE`).
    pub(super) trace: Option<Box<super::trace::Trace>>,
    /// When the current consumer pass began, in nanoseconds since `epoch` (one clock read per pass
    /// for what needs only a coarse time per ring; a u64 compare per ring, where a time-span
    /// subtraction per ring was about a sixth of an idle-heavy consumer's time on the host bench
    /// with 144 rings).
    pub(super) pass_ns: u64,
    /// The start of `pass_ns`.
    pub(super) epoch: Instant,
    /// Answered AMOs posted this pass and not sent yet, by destination, each entry its token and
    /// message ([`Consumer::flush_packed`]).
    pub(super) packing: Vec<(FiAddr, Vec<[u8; wire::PACKED_ENTRY]>)>,
    /// The tokens of the AMOs each send buffer carries as a packed SEND, until its completion.
    pub(super) packed_owners: Vec<Vec<u64>>,
    /// Answers owed to answered SENDs handled in this CQ read: sender's PE, token, status
    /// (`Consumer::flush_answers`).
    pub(super) answers: Vec<(u32, u64, CqStatus)>,
}

/// How the consumer's loop went, printed when it stops (debug level): tells a queue whose
/// consumer is the bottleneck (many loops, about one WQE per round) from one that waits on its
/// posters (few WQEs announced per round, most loops empty).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RoundStats {
    /// Passes of the consumer loop.
    pub(super) loops: u64,
    /// Passes that took at least one WQE.
    pub(super) rounds: u64,
    /// Most WQEs one pass took.
    pub(super) max_take: u64,
    /// When the first and the last WQE were taken.
    pub(super) first: Option<Instant>,
    pub(super) last: Option<Instant>,
    /// Time in the provider's completion queue, in the copy queue (enqueueing a round's copies
    /// and retiring finished ones), and taking WQEs (reading, checking, dispatching).
    pub(super) provider: Duration,
    pub(super) copies: Duration,
    pub(super) intake: Duration,
    /// Within the intake: checking WQEs, and dispatching them (provider call, copy or staging).
    pub(super) check: Duration,
    pub(super) post: Duration,
    /// Whether the times above are taken (debug level).
    pub(super) timing: bool,
    /// Post-to-completion times of WQEs by opcode (SEND, RDMA read, RDMA write; debug level).
    pub(super) latency: [Latency; 3],
}

/// Count, sum and maximum of a set of durations.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Latency {
    pub(super) n: u64,
    pub(super) sum: Duration,
    pub(super) max: Duration,
}

impl Latency {
    pub(super) fn add(&mut self, d: Duration) {
        self.n += 1;
        self.sum += d;
        self.max = self.max.max(d);
    }

    /// "N, mean M us, max X us" (or "none").
    pub(super) fn describe(&self) -> String {
        if self.n == 0 {
            return "none".into();
        }
        format!(
            "{}, mean {:.1} us, max {:.1} us",
            self.n,
            self.sum.as_secs_f64() * 1e6 / self.n as f64,
            self.max.as_secs_f64() * 1e6
        )
    }
}

/// Counts of the staged path, printed by [`Consumer::report`]: they tell a queue that waits on the
/// provider (sends refused) from one that waits on its peer (no acknowledgements) or on itself.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StageStats {
    /// Staged messages handed to the provider.
    pub(super) sent: u64,
    /// Sends the provider refused for now (`-FI_EAGAIN`), and since when they keep being refused.
    pub(super) refused: u64,
    pub(super) refused_since: Option<Instant>,
    /// Sends held back for want of an operation context.
    pub(super) no_ctx: u64,
    /// Send completions of staged messages (their buffers came back).
    pub(super) send_done: u64,
    /// Staged messages received from peers, and acknowledgements among them.
    pub(super) received: u64,
    pub(super) acks: u64,
    /// AMO batches applied (`amo_batch.rs`) and the AMOs in them.
    pub(super) amo_batches: u64,
    pub(super) amo_batched: u64,
    /// Time spent applying AMO batches (debug level only: a clock read costs).
    pub(super) amo_time: Duration,
    /// WQEs the provider refused for now (their ring waited: `stalled`).
    pub(super) wqe_refused: u64,
}

impl Consumer {
    /// Consumer thread `id` with `slots` slots (WQEs in flight at once); thread 0 serves ring 0.
    pub(super) fn new(inner: Arc<Inner>, id: usize, slots: usize) -> Consumer {
        let sq = slots as u32;
        let bounce = inner.send_bufs.count as u32;
        let tables = inner.tables.lock().clone();
        let mut rings = Vec::new();
        if id == 0 {
            inner.ring0_claim.claim(0, 0);
            rings.push(super::rings::RingState::first(&inner));
        }
        let mut c = Consumer {
            id,
            next_ring: 1,
            handed: 0,
            handed_in: VecDeque::new(),
            published: Default::default(),
            tables,
            generation: inner.generation.load(Ordering::Acquire),
            rings,
            cur: 0,
            rx_pc: 0,
            rx_ci: Default::default(),
            rx_seq: 0,
            pending_rx: VecDeque::new(),
            rx_pending_warned: false,
            stalled: Default::default(),
            slots: vec![None; sq as usize],
            free_slots: (0..sq).rev().collect(),
            free_bounce: (0..bounce).rev().collect(),
            in_flight: 0,
            rejected: 0,
            completed: 0,
            delivery_flags: flags::DELIVERY_COMPLETE,
            heartbeat: 0,
            outbox: VecDeque::new(),
            buf_owner: vec![None; bounce as usize],
            copies: None,
            rx_batch: Vec::new(),
            amo_batch: Default::default(),
            amo_applier: {
                // At debug level the idle report names AMO words changed since written.
                let mut a = crate::gda::amo_batch::Applier::default();
                a.watch(tracing::enabled!(tracing::Level::DEBUG));
                a
            },
            stats: StageStats::default(),
            copyq: None,
            copyq_failed: false,
            copy_waits: VecDeque::new(),
            round: Default::default(),
            ipc_copies: 0,
            bounce: None,
            ring_wait_pc: None,
            ipc_ring_waits: 0,
            kcopies: None,
            kdone: Default::default(),
            null_batch: Vec::new(),
            rounds: RoundStats::default(),
            order: Default::default(),
            late: VecDeque::new(),
            trace: super::trace::Trace::from_env(),
            answers: Vec::new(),
            packing: Vec::new(),
            packed_owners: vec![Vec::new(); bounce as usize],
            pass_ns: 0,
            epoch: Instant::now(),
            inner,
        };
        c.sync_rings();
        c
    }

    /// The thread body: [`Consumer::run`] behind a panic boundary. A panic is logged with its
    /// message and the queue is marked failed: [`SoftQueue::failure`] answers the message (host
    /// waiters stop waiting), and `host_ctrl.stopped` turns 1, which kernels' waits check.
    pub(super) fn run_guarded(self) {
        let inner = self.inner.clone();
        let id = self.id;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || self.run()));
        if let Err(p) = r {
            let msg = crate::log::panic_message(p.as_ref());
            tracing::error!(
                "software queue consumer thread {id} panicked: {msg}. The queue is failed: kernels \
                 see it stopped, host waiters get an error"
            );
            {
                let mut f = inner.failure.lock();
                if f.is_none() {
                    *f = Some(msg);
                }
            }
            inner.failed.store(true, Ordering::Release);
            inner.mark_all_stopped();
        }
        if id != 0 {
            inner.mail[id].gone.store(true, Ordering::Release);
            inner.helpers_live.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub(super) fn run(mut self) {
        if let Err(e) = cuda::set_current_context(self.inner.cuda_ctx) {
            tracing::warn!("software queue thread: {e}");
        }
        let mut idle = 0u32;
        let mut stop_deadline: Option<Instant> = None;
        let mut last_work = Instant::now();
        let mut last_report = last_work;
        let mut taken_at_report = 0u64;
        // Where the loop's time goes, for the stop summary (debug level only: a clock read costs).
        // The trace needs them too (its slow passes).
        let timing = tracing::enabled!(tracing::Level::DEBUG) || self.trace.is_some();
        self.rounds.timing = timing;
        // When the last pass ended (trace only: the gaps between passes).
        let mut pass_end: Option<Instant> = None;
        loop {
            self.pass_ns = self.epoch.elapsed().as_nanos() as u64;
            if let Some(e) = pass_end.take() {
                let gap = e.elapsed();
                if gap >= Duration::from_micros(50) {
                    let us = gap.as_micros().min(u128::from(u32::MAX)) as u32;
                    self.note(super::trace::Event::Gap, us, 0);
                }
            }
            self.heartbeat += 1;
            self.inner.mail[self.id]
                .beat
                .0
                .store(self.heartbeat, Ordering::Relaxed);
            self.rounds.loops += 1;
            let endpoint = self.owns_endpoint();
            if endpoint {
                self.inner
                    .host_ctrl_word(HC_HEARTBEAT)
                    .store(self.heartbeat, Ordering::Relaxed);
            }
            self.refresh_tables();
            let t0 = timing.then(Instant::now);
            let mut work = if endpoint {
                self.poll_cq()
            } else {
                self.take_done()
            };
            let t1 = timing.then(Instant::now);
            work += self.poll_copies();
            work += self.release_held();
            work += self.flush_packed();
            let t2 = timing.then(Instant::now);
            if endpoint {
                work += self.serve_handed();
                work += self.flush_rx();
                work += self.pump_outbox();
            }
            let t3 = timing.then(Instant::now);
            if let (Some(t0), Some(t1), Some(t2)) = (t0, t1, t2) {
                self.rounds.provider += t1 - t0;
                self.rounds.copies += t2 - t1;
            }
            if self.inner.stop.load(Ordering::Acquire) {
                let deadline = *stop_deadline.get_or_insert_with(|| Instant::now() + STOP_DRAIN);
                // Thread 0 serves the other threads' hand-overs until they all left.
                let helpers = endpoint && self.inner.helpers_live.load(Ordering::Acquire) > 0;
                if self.in_flight == 0
                    && self.stalled.is_empty()
                    && self.outbox.is_empty()
                    && self.order.idle()
                    && self.late.is_empty()
                    && self.handed_in.is_empty()
                    && !(endpoint && self.inner.mail[0].count.load(Ordering::Acquire) > 0)
                {
                    if !helpers {
                        break;
                    }
                } else if Instant::now() >= deadline {
                    self.flush_in_flight();
                    if !helpers {
                        break;
                    }
                }
                if !self.stalled.is_empty() {
                    work += self.retry_stalled();
                }
            } else {
                // One round: every ring's doorbell, what each announces.
                let before = self.taken();
                let t = timing.then(Instant::now);
                for q in 0..self.rings.len() {
                    self.cur = q;
                    work += if self.inner.null_consumer {
                        self.consume_null()
                    } else {
                        self.consume()
                    };
                }
                self.cur = 0;
                // The copies every ring's WQEs of this round asked for, together; the AMOs
                // packed per PE.
                self.flush_copies();
                self.flush_packed();
                if let (Some(t0), Some(t1), Some(t2), Some(t3), Some(t)) = (t0, t1, t2, t3, t) {
                    self.note_slow_pass([t1 - t0, t2 - t1, t3 - t2, t.elapsed()]);
                }
                if let Some(t) = t {
                    self.rounds.intake += t.elapsed();
                }
                let took = self.taken() - before;
                if took > 0 {
                    self.note(super::trace::Event::Take, took as u32, 0);
                }
                self.rounds.count(took);
            }
            if self.trace.is_some() {
                pass_end = Some(Instant::now());
            }
            if work > 0 {
                idle = 0;
                last_work = Instant::now();
            } else {
                idle = idle.saturating_add(1);
                if self.rings.is_empty() && !endpoint {
                    // No ring of its own yet (rings come with the queue table): nothing to poll.
                    std::thread::sleep(Duration::from_micros(200));
                } else {
                    backoff(idle, !self.tables.peers.is_empty());
                }
            }
            if self.heartbeat % 1024 == 0 {
                let now = Instant::now();
                if now - last_report >= STALL_REPORT {
                    self.report(now - last_work, now - last_report, taken_at_report);
                    last_report = now;
                    taken_at_report = self.taken();
                }
            }
        }
        if !self.pending_rx.is_empty() {
            tracing::warn!(
                "software queue stopped with {} receive completions the GPU never had room for",
                self.pending_rx.len()
            );
        }
        self.mark_stopped();
        self.publish_counts();
        if let Some(t) = &self.trace {
            t.write(self.tables.my_pe, self.id);
        }
        if let Some(k) = &self.kcopies {
            tracing::debug!(
                "software queue copy kernel: {} launches, {} applied by the kernel, {} taken over \
                 by the host; {:.3} s in launch calls, {:.1} us from launch to applied on average",
                k.launched,
                k.applied,
                k.taken_over,
                k.launch_time.as_secs_f64(),
                k.applied_time.as_secs_f64() * 1e6 / k.applied.max(1) as f64
            );
        }
        if self.order.announced > 0 {
            tracing::debug!(
                "software queue: {} AMOs announced data, {} of them waited for earlier WQEs to \
                 their PE (held: {})",
                self.order.announced,
                self.order.waited,
                self.order.hold_time.describe()
            );
        }
        if self.rounds.timing && self.rounds.latency.iter().any(|l| l.n > 0) {
            let [send, read, write] = &self.rounds.latency;
            tracing::debug!(
                "software queue consumer thread {}: post to completion: SEND {}; RDMA read {}; RDMA \
                 write {}",
                self.id,
                send.describe(),
                read.describe(),
                write.describe()
            );
        }
        let r = self.rounds;
        let busy = match (r.first, r.last) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let taken = self.taken();
        if self.stats.amo_batches > 0 || self.stats.wqe_refused > 0 {
            tracing::debug!(
                "software queue consumer thread {}: {} AMO messages applied in {} batches ({:.1} \
                 per batch), {:.3} s applying them ({:.1} us per batch); {} WQEs refused by the \
                 provider for now",
                self.id,
                self.stats.amo_batched,
                self.stats.amo_batches,
                self.stats.amo_batched as f64 / self.stats.amo_batches.max(1) as f64,
                self.stats.amo_time.as_secs_f64(),
                self.stats.amo_time.as_secs_f64() * 1e6 / self.stats.amo_batches.max(1) as f64,
                self.stats.wqe_refused
            );
        }
        tracing::debug!(
            "software queue consumer thread {} stopped after {} WQEs ({} rejected) from {} \
             ring(s), {} handed over: {} loop \
             passes, {} took WQEs (at most {} at once, {:.1} on average), {:.3} s from the first \
             WQE to the last ({:.3} M WQEs/s); time in the provider's CQ {:.3} s, in copies {:.3} \
             s, taking WQEs {:.3} s (checking {:.3} s, dispatching {:.3} s)",
            self.id,
            taken,
            self.rejected,
            self.rings.len(),
            self.handed,
            r.loops,
            r.rounds,
            r.max_take,
            taken as f64 / r.rounds.max(1) as f64,
            busy,
            if busy > 0.0 {
                taken as f64 / busy / 1e6
            } else {
                0.0
            },
            r.provider.as_secs_f64(),
            r.copies.as_secs_f64(),
            r.intake.as_secs_f64(),
            r.check.as_secs_f64(),
            r.post.as_secs_f64(),
        );
        let mine = self.summary();
        let mut all = self.inner.summaries.lock();
        all.push(mine);
        if self.id == 0 {
            // The other threads left before thread 0 (it waits for them).
            super::threads::log_totals(&all);
        }
    }

    /// Every `STALL_REPORT` while work is outstanding (in the consumer, or reserved by GPU posters
    /// and not yet taken): the queue's state, at debug level while it moves and as a warning once
    /// nothing moved for `STALL_REPORT` (`quiet`: time since the consumer last did anything). An
    /// idle queue is not reported.
    pub(super) fn report(&mut self, quiet: Duration, period: Duration, taken_before: u64) {
        // Ring 0's words and doorbell, and over all rings: WQEs announced and not taken, slots
        // reserved and not taken.
        let mut pending_wqes = 0u64;
        let mut unclaimed = 0u64;
        // At debug level, each ring whose GPU side is not where the consumer is (slots reserved
        // and not taken, or not committed, or committed without a doorbell): a poster waiting
        // for ring room or for its turn to commit shows here.
        let debug = tracing::enabled!(tracing::Level::DEBUG);
        let mut odd_rings: Vec<String> = Vec::new();
        let mut odd_count = 0usize;
        let saved = self.cur;
        for q in 0..self.rings.len() {
            self.cur = q;
            let db = self.doorbell();
            let r = &self.rings[q];
            pending_wqes += u64::from(db.wrapping_sub(r.ci as u32));
            let ctrl = r.ctrl(&self.inner);
            let resv = ctrl.read_u64(OFF_RESV).unwrap_or(u64::MAX);
            unclaimed += resv.saturating_sub(r.ci);
            if debug && (resv != r.ci || db != r.ci as u32) {
                odd_count += 1;
                if odd_rings.len() < ODD_RINGS_NAMED {
                    let word = |off: usize| ctrl.read_u64(off).unwrap_or(u64::MAX);
                    odd_rings.push(format!(
                        "ring {}: {resv} reserved, {} committed, {} done, doorbell {db}, {} taken",
                        r.id,
                        word(OFF_READY),
                        word(OFF_DONE),
                        r.ci
                    ));
                }
            }
        }
        // The GPU side of this thread's first ring (ring 0 on thread 0).
        let (first, db) = if self.rings.is_empty() {
            (usize::MAX, 0)
        } else {
            self.cur = 0;
            (self.rings[0].id, self.doorbell())
        };
        self.cur = saved;
        let ci = self.taken();
        let cq_pc: u64 = self.rings.iter().map(|r| r.cq_pc).sum();
        let inner = self.inner.clone();
        let ctrl = self.rings.first().map_or(&inner.ctrl, |r| r.ctrl(&inner));
        let word = |off: usize| ctrl.read_u64(off).unwrap_or(u64::MAX);
        let resv = word(OFF_RESV);
        let ready = word(OFF_READY);
        let done = word(OFF_DONE);
        let cq_ci = word(OFF_CQ_CI);
        let err_lock = word(OFF_FIRST_ERROR);
        // Idle: nothing to report, except at debug level once after WQEs were taken (the totals
        // once everything went quiet, e.g. when an application waits for a signal that every
        // WQE taken has already delivered).
        let took_since = ci > taken_before;
        if self.in_flight == 0
            && !(took_since && debug)
            && self.outbox.is_empty()
            && self.stalled.is_empty()
            && pending_wqes == 0
            && self.pending_rx.is_empty()
            && self.order.idle()
            && self.late.is_empty()
            && unclaimed == 0
            && self.handed_in.is_empty()
        {
            return;
        }
        let stalled = quiet >= STALL_REPORT;
        if !stalled && !debug {
            return;
        }
        let watched = self.watched_words(debug);
        let state =
            format!(
            "GPU side (ring {first}): {resv} slots reserved, {ready} committed, {done} done, CQ \
             consumer {cq_ci}, first error {:#x}, CQ lock {}. Consumer thread {} of {} ({} rings, \
             {} WQEs handed over): ring {first}'s doorbell {db}, {} WQEs taken ({pending_wqes} \
             announced but not taken), {} in flight, {} staged messages waiting for a send buffer \
             ({} free), {} WQE waiting for the provider, {} AMOs waiting for the data they \
             announce, {} TX completions written, {} receive completions waiting for ring space. \
             Staged path: {} messages sent, {} send completions, {} received ({} \
             acknowledgements), {} sends refused by the provider (try again){}, {} held for want \
             of an operation context. AMO messages: {} applied in {} batches. {unclaimed} slots \
             reserved and not taken over this thread's rings{}{}",
            err_lock & 0xffff_ffff,
            err_lock >> 32,
            self.id,
            self.inner.mail.len(),
            self.rings.len(),
            self.handed,
            ci,
            self.in_flight,
            self.outbox.len(),
            self.free_bounce.len(),
            self.stalled.len(),
            self.order.held(),
            cq_pc,
            self.pending_rx.len(),
            self.stats.sent,
            self.stats.send_done,
            self.stats.received,
            self.stats.acks,
            self.stats.refused,
            self.stats
                .refused_since
                .map(|t| format!(
                    " (refused without a break for {:.1} s)",
                    t.elapsed().as_secs_f64()
                ))
                .unwrap_or_default(),
            self.stats.no_ctx,
            self.stats.amo_batched,
            self.stats.amo_batches,
            if odd_count > 0 {
                format!(
                    "; {odd_count} ring(s) not at their consumer: {}{}",
                    odd_rings.join("; "),
                    if odd_count > odd_rings.len() { "; ..." } else { "" }
                )
            } else {
                String::new()
            },
            watched,
        );
        if stalled {
            tracing::warn!(
                "software queue of PE {}: no progress for {:.1} s. {state}",
                self.tables.my_pe,
                quiet.as_secs_f64()
            );
        } else {
            tracing::debug!(
                "software queue of PE {}: {} WQEs taken in the last {:.1} s. {state}",
                self.tables.my_pe,
                ci - taken_before,
                period.as_secs_f64()
            );
        }
    }

    /// At debug level, for the idle report: the AMO words this thread wrote last and any whose
    /// value changed since (an application waiting for a count that is no longer there was
    /// overwritten after delivery; one that is there waits for something else).
    fn watched_words(&mut self, debug: bool) -> String {
        if !debug {
            return String::new();
        }
        match self.amo_applier.changed() {
            Ok((0, _)) => String::new(),
            Ok((n, changed)) if changed.is_empty() => {
                format!(". The last {n} AMO words written hold the values written")
            }
            Ok((n, changed)) => {
                let named: Vec<String> = changed
                    .iter()
                    .rev()
                    .take(ODD_RINGS_NAMED)
                    .map(|(w, now)| {
                        format!(
                            "{:#x} ({} B{}) wrote {}, now {}",
                            w.addr,
                            w.size,
                            if w.device { ", GPU" } else { "" },
                            w.signed(w.value),
                            w.signed(*now)
                        )
                    })
                    .collect();
                format!(
                    ". Of the last {n} AMO words written, {} changed since (newest first): {}{}",
                    changed.len(),
                    named.join("; "),
                    if changed.len() > named.len() {
                        "; ..."
                    } else {
                        ""
                    }
                )
            }
            Err(why) => format!(". The last AMO words written could not be read again: {why}"),
        }
    }

    pub(super) fn refresh_tables(&mut self) {
        let g = self.inner.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.tables = self.inner.tables.lock().clone();
            self.generation = g;
            self.sync_rings();
        }
    }
}

impl Consumer {
    /// Records a consumer pass of 50 us or more in the trace: its microseconds and the part that
    /// took longest (0 the provider's CQ, 1 copies and held AMOs, 2 the endpoint's hand-overs,
    /// receive batch and outbox, 3 taking WQEs).
    fn note_slow_pass(&mut self, parts: [Duration; 4]) {
        let total: Duration = parts.iter().sum();
        if self.trace.is_none() || total < Duration::from_micros(50) {
            return;
        }
        let worst = (0..4).max_by_key(|&i| parts[i]).unwrap_or(0) as u32;
        let us = total.as_micros().min(u128::from(u32::MAX)) as u32;
        self.note(super::trace::Event::SlowPass, us, worst);
    }

    /// Records an event in the trace, when there is one.
    #[inline]
    pub(super) fn note(&mut self, e: super::trace::Event, a: u32, b: u32) {
        if let Some(t) = self.trace.as_mut() {
            t.note(e, a, b);
        }
    }
}

impl RoundStats {
    fn count(&mut self, took: u64) {
        if took > 0 {
            let now = Instant::now();
            self.rounds += 1;
            self.max_take = self.max_take.max(took);
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }
}

/// Idle policy of the consumer. Once peers exist it never sleeps: it is the progress engine of its
/// endpoint, and software providers move one-sided traffic aimed at this PE only while it polls
/// (traffic it cannot see, so "idle" is no evidence that nothing is arriving). Sleeping 50 us between
/// polls cut the write rate of a peer to this PE about fifty-fold. It yields the CPU instead, like
/// NVSHMEM's proxy thread. Before connect nothing can arrive, and it sleeps.
pub(super) fn backoff(idle: u32, connected: bool) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if connected || idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}
