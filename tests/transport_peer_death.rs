//! One dead peer never poisons the others.
//!
//! Per provider (tcp, shm) four processes drive the library through its C ABI (transport ABI 4), as
//! NVSHMEM does; this test process is their bootstrap (a hub over a Unix socket) and their reaper:
//! 1. all four connect, register a heap, exchange handles and move data with each other;
//! 2. PE 3 leaves early (finalize, exit 0), PE 2 is stopped (SIGSTOP);
//! 3. the survivors (PEs 0 and 1) post puts, gets and AMOs to PE 2 (they stay in flight: it is
//!    stopped), to PE 3 (departed) and to each other, on the host and the proxy endpoint;
//! 4. PE 2 is killed (SIGKILL);
//! 5. each survivor checks, every step within `BOUND` (much shorter than the quiet timeout,
//!    `QUIET_MS`): quiet towards the live peer succeeds; quiet towards PE 2 and PE 3 fails;
//!    new puts, gets and AMOs between the survivors succeed and their data is right; operations
//!    posted to the dead PE fail; finalize returns.
//!
//! A survivor stops at its first failed check (so a library that waits out the quiet timeout costs
//! one timeout, not one per check); the test then reports every process's output.
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::capi::transport::nvshmemt_init;
use nvshmem_efa_gda::nvshmem::abi::v4::{HostOpsV4, TransportV4};
use nvshmem_efa_gda::nvshmem::abi::{
    amo, op, AmoBytesdesc, AmoMemdesc, AmoVerb, BootstrapHandle, MemHandle, RmaBytesdesc,
    RmaMemdesc, RmaVerb, MEM_HANDLE_SIZE,
};

const NP: usize = 4;
const DEAD: usize = 2;
const DEPARTED: usize = 3;
const QUIET_MS: u64 = 15_000;
/// What "promptly" means: every survivor step involving a dead or departed peer, and finalize.
const BOUND: Duration = Duration::from_millis(3_000);
/// One bootstrap round may take this long before the test gives up on the job.
const ROUND_LIMIT: Duration = Duration::from_secs(90);

const ENV_PE: &str = "PEER_DEATH_PE";
const ENV_SOCK: &str = "PEER_DEATH_SOCK";

const HEAP: usize = 4 << 20;
const WARM_OFF: usize = 0; // 4 KiB per source PE
const AMO_OFF: usize = 64 << 10; // 8-byte counter per source PE
const SINK_OFF: usize = 128 << 10; // destinations of the operations to PEs that go away
const LIVE_OFF: usize = 1 << 20; // 256 KiB per source PE: survivor traffic
const SRC_OFF: usize = 2 << 20; // source patterns, 512 KiB
const RET_OFF: usize = 3 << 20; // fetch results, 64 slots of 8 bytes
const BIG: usize = 64 << 10;

fn pattern(src: usize, salt: u8, i: usize) -> u8 {
    (src as u8)
        .wrapping_mul(31)
        .wrapping_add((i as u8).wrapping_mul(7))
        .wrapping_add((i >> 8) as u8)
        .wrapping_add(salt)
}

// The hub's framing and the child side of its rounds: tests/hub_common.
mod hub_common;
use hub_common::{fail, hub_round, note, HUB, ME};

unsafe extern "C" fn boot_allgather(
    s: *const c_void,
    r: *mut c_void,
    bytes: c_int,
    _h: *mut BootstrapHandle,
) -> c_int {
    if bytes < 0 {
        return 1;
    }
    // SAFETY: the library passes `bytes` readable bytes.
    let send = unsafe { std::slice::from_raw_parts(s as *const u8, bytes as usize) };
    let all = hub_round("lib", send);
    if all.len() != bytes as usize * NP {
        note(&format!(
            "library allgather of {bytes} bytes got {} bytes back",
            all.len()
        ));
        return 1;
    }
    // SAFETY: the library passes room for n_pes * bytes.
    unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), r as *mut u8, all.len()) };
    0
}

unsafe extern "C" fn boot_barrier(_h: *mut BootstrapHandle) -> c_int {
    hub_round("lib", &[]);
    0
}

unsafe extern "C" fn boot_alltoall(
    _s: *const c_void,
    _r: *mut c_void,
    _bytes: c_int,
    _h: *mut BootstrapHandle,
) -> c_int {
    note("the library called alltoall, which this bootstrap does not serve");
    1
}

/// A PE's view of the job: its transport and everyone's heap.
struct Pe {
    me: usize,
    t: *mut TransportV4,
    heap: Vec<u64>,
    own: Box<MemHandle>,
    handles: Vec<MemHandle>,
    bases: Vec<u64>,
}

impl Pe {
    fn ops(&self) -> &HostOpsV4 {
        // SAFETY: the struct the library returned, alive until finalize.
        unsafe { &(*self.t).host_ops }
    }
    fn heap_ptr(&self, off: usize) -> *mut u8 {
        // SAFETY: offsets stay inside the heap.
        unsafe { (self.heap.as_ptr() as *mut u8).add(off) }
    }
    fn heap_bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= HEAP);
        // SAFETY: in bounds; read after a barrier that follows the writers' quiet.
        unsafe { std::slice::from_raw_parts(self.heap_ptr(off), len) }
    }
    fn remote(&mut self, pe: usize, off: usize) -> RmaMemdesc {
        RmaMemdesc {
            ptr: (self.bases[pe] + off as u64) as *mut c_void,
            offset: off as u64,
            handle: &mut self.handles[pe],
        }
    }
    fn local(&mut self, off: usize) -> RmaMemdesc {
        RmaMemdesc {
            ptr: self.heap_ptr(off) as *mut c_void,
            offset: 0x5a5a_5a5a,
            handle: &mut *self.own,
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn rma(
        &mut self,
        pe: usize,
        opc: i32,
        nbi: bool,
        roff: usize,
        loff: usize,
        len: usize,
        qp: c_int,
    ) -> c_int {
        let mut r = self.remote(pe, roff);
        let mut l = self.local(loff);
        let verb = RmaVerb {
            op: opc,
            is_nbi: nbi as c_int,
            is_stream: 0,
            cstrm: std::ptr::null_mut(),
        };
        let bytes = RmaBytesdesc {
            nelems: len,
            elembytes: 1,
            srcstride: 1,
            deststride: 1,
        };
        let f = self.ops().rma.expect("rma");
        // SAFETY: descriptors live for the call; buffers are in the registered heap.
        unsafe {
            f(
                self.t as *mut c_void,
                pe as c_int,
                verb,
                &mut r,
                &mut l,
                bytes,
                qp,
            )
        }
    }
    fn amo(
        &mut self,
        pe: usize,
        opc: i32,
        roff: usize,
        val: u64,
        ret_off: usize,
        qp: c_int,
    ) -> c_int {
        let fetch = opc > amo::END_OF_NONFETCH;
        let mut m = AmoMemdesc {
            remote: self.remote(pe, roff),
            retflag: 0,
            retptr: if fetch {
                self.heap_ptr(ret_off) as *mut c_void
            } else {
                std::ptr::null_mut()
            },
            valptr: std::ptr::null_mut(),
            cmpptr: std::ptr::null_mut(),
            val,
            cmp: 0,
            ret_handle: &mut *self.own,
        };
        let verb = AmoVerb {
            op: opc,
            is_fetch: fetch as c_int,
            is_val: 1,
            is_cmp: 0,
        };
        let f = self.ops().amo.expect("amo");
        // SAFETY: as for rma; the result slot is in the registered heap.
        unsafe {
            f(
                self.t as *mut c_void,
                pe as c_int,
                std::ptr::null_mut(),
                verb,
                &mut m,
                AmoBytesdesc {
                    name_type: 9,
                    elembytes: 8,
                },
                qp,
            )
        }
    }
    fn quiet(&self, pe: usize, qp: c_int) -> c_int {
        let f = self.ops().quiet.expect("quiet");
        // SAFETY: live transport.
        unsafe { f(self.t as *mut c_void, pe as c_int, qp) }
    }
    fn barrier(&self, tag: &str) {
        hub_round(tag, &[]);
    }
}

/// The proxy's quiet: every QP (NVSHMEMX_QP_ALL).
const QP_ALL: c_int = c_int::MAX;

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// `what` must return `want_ok` (0 or not) within BOUND.
fn expect(what: &str, rc: c_int, dt: Duration, want_ok: bool) {
    note(&format!("{what}: rc {rc} after {dt:?}"));
    if want_ok && rc != 0 {
        fail(&format!("{what} returned {rc} after {dt:?} (want 0)"));
    }
    if !want_ok && rc == 0 {
        fail(&format!("{what} returned 0 after {dt:?} (want an error)"));
    }
    if dt > BOUND {
        fail(&format!(
            "{what} took {dt:?} (bound {BOUND:?}, quiet timeout {QUIET_MS} ms)"
        ));
    }
}

fn child_main(me: usize, sock: &str) {
    ME.set(me).unwrap();
    let mut s = UnixStream::connect(sock).unwrap_or_else(|e| fail(&format!("connect {sock}: {e}")));
    s.write_all(&(me as u32).to_le_bytes()).unwrap();
    HUB.set(Mutex::new(s)).ok();

    let mut t: *mut c_void = std::ptr::null_mut();
    // SAFETY: out pointer valid; NVSHMEM passes no CUDA table either when the library needs none.
    let rc = unsafe { nvshmemt_init(&mut t, std::ptr::null_mut(), 40000) };
    if rc != 0 || t.is_null() {
        fail(&format!("nvshmemt_init returned {rc}"));
    }
    let t = t as *mut TransportV4;
    let boot = Box::leak(Box::new(BootstrapHandle {
        version: 1,
        pg_rank: me as c_int,
        pg_size: NP as c_int,
        mype_node: me as c_int,
        npes_node: NP as c_int,
        allgather: Some(boot_allgather),
        alltoall: Some(boot_alltoall),
        barrier: Some(boot_barrier),
        global_exit: None,
        finalize: None,
        show_info: None,
        pre_init_ops: std::ptr::null_mut(),
        comm_state: std::ptr::null_mut(),
    }));
    let cap = Box::leak(vec![0 as c_int; NP].into_boxed_slice());
    let mut pe = Pe {
        me,
        t,
        heap: vec![0u64; HEAP / 8],
        own: Box::new(MemHandle {
            reserved: [0; MEM_HANDLE_SIZE],
        }),
        handles: Vec::new(),
        bases: Vec::new(),
    };
    // SAFETY: host fields as nvshmemi_transport_init sets them.
    unsafe {
        (*t).tail.boot_handle = boot;
        (*t).tail.heap_base = pe.heap_ptr(0) as *mut c_void;
        (*t).tail.log2_cumem_granularity = 21;
        (*t).cap = cap.as_mut_ptr();
        (*t).tail.index = 1;
        (*t).tail.my_pe = me as c_int;
        (*t).tail.n_pes = NP as c_int;
        if (*t).tail.max_op_len == 0 {
            (*t).tail.max_op_len = u64::MAX;
        }
    }
    let mut dev = [-1 as c_int];
    let connect = pe.ops().connect_endpoints.expect("connect_endpoints");
    // SAFETY: as NVSHMEM calls it (dev id n_devices-1 = -1, one device, no QPs).
    let rc = unsafe {
        connect(
            t as *mut c_void,
            dev.as_mut_ptr(),
            1,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        fail(&format!("connect_endpoints returned {rc}"));
    }
    let gmh = pe.ops().get_mem_handle.expect("get_mem_handle");
    // SAFETY: the heap outlives the registration (released with the transport at finalize).
    let rc = unsafe {
        gmh(
            &mut *pe.own,
            pe.heap_ptr(0) as *mut c_void,
            HEAP,
            t as *mut c_void,
            false,
        )
    };
    if rc != 0 {
        fail(&format!("get_mem_handle returned {rc}"));
    }
    let mut mine = pe.own.reserved.to_vec();
    mine.extend_from_slice(&(pe.heap_ptr(0) as u64).to_le_bytes());
    let all = hub_round("setup", &mine);
    let rec = MEM_HANDLE_SIZE + 8;
    assert_eq!(all.len(), rec * NP);
    for p in 0..NP {
        let r = &all[p * rec..(p + 1) * rec];
        let mut h = MemHandle {
            reserved: [0; MEM_HANDLE_SIZE],
        };
        h.reserved.copy_from_slice(&r[..MEM_HANDLE_SIZE]);
        pe.handles.push(h);
        pe.bases
            .push(u64::from_le_bytes(r[MEM_HANDLE_SIZE..].try_into().unwrap()));
    }
    for i in 0..(512 << 10) {
        // SAFETY: inside the heap.
        unsafe { *pe.heap_ptr(SRC_OFF + i) = pattern(me, 1, i) };
    }

    // 1. everyone works with everyone
    for p in 0..NP {
        let rc = pe.rma(p, op::PUT, true, WARM_OFF + me * 4096, SRC_OFF, 4096, 0);
        if rc != 0 {
            fail(&format!("warm-up put to PE {p} returned {rc}"));
        }
        let rc = pe.amo(p, amo::ADD, AMO_OFF + me * 8, 1 + me as u64, 0, 0);
        if rc != 0 {
            fail(&format!("warm-up AMO to PE {p} returned {rc}"));
        }
    }
    for p in 0..NP {
        let rc = pe.quiet(p, 0);
        if rc != 0 {
            fail(&format!("warm-up quiet(PE {p}) returned {rc}"));
        }
    }
    pe.barrier("warm");
    for p in 0..NP {
        let got = pe.heap_bytes(WARM_OFF + p * 4096, 4096);
        if (0..4096).any(|i| got[i] != pattern(p, 1, i)) {
            fail(&format!("warm-up put from PE {p} wrong"));
        }
        let v = u64::from_le_bytes(pe.heap_bytes(AMO_OFF + p * 8, 8).try_into().unwrap());
        if v != 1 + p as u64 {
            fail(&format!("warm-up AMO from PE {p}: {v}"));
        }
    }
    pe.barrier("pre-stop");

    if me == DEPARTED {
        // Leaves first, as a PE that simply finishes does.
        let fin = pe.ops().finalize.expect("finalize");
        // SAFETY: live transport; not touched afterwards.
        let (rc, dt) = timed(|| unsafe { fin(t as *mut c_void) });
        note(&format!("departed: finalize returned {rc} after {dt:?}"));
        std::process::exit(0);
    }
    if me == DEAD {
        // Stopped and then killed by the test; never gets past this read.
        hub_round("never", &[]);
        fail("the PE to be killed was not stopped");
    }
    survivor(&mut pe);
}

fn survivor(pe: &mut Pe) {
    let me = pe.me;
    let live = 1 - me;
    pe.barrier("go"); // PE 2 is stopped, PE 3 has finalized and exited

    // 2. operations in flight to the stopped PE, to the departed one, and to the live one
    let mut ret = 0;
    // Posting never waits long (the outcome may be an error at once or a later failing quiet).
    let mut refused_departed = false;
    let posted = |what: &str, rc: c_int, dt: Duration| {
        note(&format!("{what}: rc {rc} after {dt:?}"));
        if dt > BOUND {
            fail(&format!("posting {what} took {dt:?} (bound {BOUND:?})"));
        }
        rc != 0
    };
    for k in 0..4 {
        let (rc, dt) = timed(|| pe.rma(DEAD, op::PUT, true, SINK_OFF + k * BIG, SRC_OFF, BIG, 0));
        posted("nbi put to the stopped PE", rc, dt);
        let (rc, dt) = timed(|| {
            pe.rma(
                live,
                op::PUT,
                true,
                LIVE_OFF + me * (256 << 10) + k * BIG,
                SRC_OFF + k * BIG,
                BIG,
                0,
            )
        });
        if rc != 0 {
            fail(&format!(
                "nbi put to the live PE {live} returned {rc} after {dt:?}"
            ));
        }
    }
    for k in 0..2 {
        let (rc, dt) = timed(|| {
            pe.rma(
                DEAD,
                op::GET,
                true,
                SRC_OFF,
                SINK_OFF + 512 * 1024 + k * 4096,
                4096,
                0,
            )
        });
        posted("nbi get from the stopped PE", rc, dt);
        ret += 1;
        let (rc, dt) = timed(|| {
            pe.amo(
                DEAD,
                amo::FETCH_ADD,
                AMO_OFF + me * 8,
                1,
                RET_OFF + ret * 8,
                0,
            )
        });
        posted("FETCH_ADD to the stopped PE", rc, dt);
        let (rc, dt) = timed(|| pe.amo(DEAD, amo::ADD, AMO_OFF + me * 8, 1, 0, 1));
        posted("ADD to the stopped PE (proxy endpoint)", rc, dt);
        let (rc, dt) = timed(|| pe.amo(DEPARTED, amo::ADD, AMO_OFF + me * 8, 1, 0, 0));
        refused_departed |= posted("ADD to the departed PE", rc, dt);
        let (rc, dt) = timed(|| pe.rma(DEPARTED, op::PUT, true, SINK_OFF, SRC_OFF, 4096, 0));
        refused_departed |= posted("nbi put to the departed PE", rc, dt);
    }
    let rc = pe.amo(live, amo::ADD, AMO_OFF + 32 + me * 8, 10, 0, 0);
    if rc != 0 {
        fail(&format!("AMO to the live PE {live} returned {rc}"));
    }
    let rc = pe.amo(live, amo::ADD, AMO_OFF + 32 + me * 8, 100, 0, 1);
    if rc != 0 {
        fail(&format!(
            "AMO to the live PE {live} (proxy endpoint) returned {rc}"
        ));
    }
    pe.barrier("posted");
    pe.barrier("killed"); // PE 2 is dead now

    // 3. the live pair is unaffected; the dead and the departed PE fail fast
    let (rc, dt) = timed(|| pe.quiet(live, 0));
    expect(&format!("quiet(live PE {live}, host)"), rc, dt, true);
    let (rc, dt) = timed(|| pe.quiet(live, QP_ALL));
    expect(&format!("quiet(live PE {live}, all QPs)"), rc, dt, true);
    let (rc, dt) = timed(|| pe.quiet(DEAD, 0));
    expect(
        "quiet(dead PE 2, host) with operations in flight",
        rc,
        dt,
        false,
    );
    let (rc, dt) = timed(|| pe.quiet(DEAD, QP_ALL));
    expect(
        "quiet(dead PE 2, all QPs) with an AMO in flight",
        rc,
        dt,
        false,
    );
    // Operations to the departed PE fail: at the call, or at the quiet that covers them.
    let (rc, dt) = timed(|| pe.quiet(DEPARTED, 0));
    note(&format!("quiet(departed PE 3): rc {rc} after {dt:?}"));
    if !refused_departed && rc == 0 {
        fail("operations posted to the departed PE 3 were accepted and its quiet returned 0");
    }
    if dt > BOUND {
        fail(&format!(
            "quiet(departed PE 3) took {dt:?} (bound {BOUND:?})"
        ));
    }
    let (rc, dt) = timed(|| pe.quiet(live, 0));
    expect(
        &format!("quiet(live PE {live}) after the failed quiets"),
        rc,
        dt,
        true,
    );

    // 4. new traffic between the survivors, blocking and not, every kind
    let (rc, dt) = timed(|| {
        pe.rma(
            live,
            op::PUT,
            false,
            LIVE_OFF + me * (256 << 10) + 4 * BIG - 8192,
            SRC_OFF + 8192,
            8192,
            0,
        )
    });
    expect("blocking put to the live PE", rc, dt, true);
    let (rc, dt) = timed(|| pe.rma(live, op::GET, false, SRC_OFF, RET_OFF + 4096, 16384, 0));
    expect("blocking get from the live PE", rc, dt, true);
    let got = pe.heap_bytes(RET_OFF + 4096, 16384);
    if (0..16384).any(|i| got[i] != pattern(live, 1, i)) {
        fail("blocking get from the live PE returned wrong data");
    }
    let (rc, dt) = timed(|| {
        pe.amo(
            live,
            amo::FETCH_ADD,
            AMO_OFF + 48 + me * 8,
            7,
            RET_OFF + 63 * 8,
            0,
        )
    });
    expect("FETCH_ADD to the live PE", rc, dt, true);
    let (rc, dt) = timed(|| pe.quiet(live, 0));
    expect("quiet(live PE) after the new traffic", rc, dt, true);
    let old = u64::from_le_bytes(pe.heap_bytes(RET_OFF + 63 * 8, 8).try_into().unwrap());
    if old != 0 {
        fail(&format!("FETCH_ADD to the live PE fetched {old} (want 0)"));
    }

    // 5. operations to the dead PE posted now fail, promptly
    let (rc, dt) = timed(|| pe.rma(DEAD, op::PUT, false, SINK_OFF, SRC_OFF, 4096, 0));
    expect("blocking put to the dead PE", rc, dt, false);
    let (rc1, dt1) = timed(|| pe.amo(DEAD, amo::FETCH_ADD, AMO_OFF, 1, RET_OFF + 62 * 8, 0));
    let (rc2, dt2) = timed(|| pe.quiet(DEAD, 0));
    expect(
        "FETCH_ADD to the dead PE, then quiet(PE 2)",
        if rc1 != 0 { rc1 } else { rc2 },
        dt1 + dt2,
        false,
    );
    let (rc, dt) = timed(|| pe.quiet(live, 0));
    expect("quiet(live PE) at the end", rc, dt, true);

    pe.barrier("verify");
    let slot = LIVE_OFF + live * (256 << 10);
    let got = pe.heap_bytes(slot, 4 * BIG);
    for k in 0..4 {
        for i in 0..BIG {
            let want = if k == 3 && i >= BIG - 8192 {
                pattern(live, 1, 8192 + i - (BIG - 8192))
            } else {
                pattern(live, 1, k * BIG + i)
            };
            if got[k * BIG + i] != want {
                fail(&format!(
                    "data from the live PE {live}: put {k} wrong at byte {i}"
                ));
            }
        }
    }
    let v = u64::from_le_bytes(
        pe.heap_bytes(AMO_OFF + 32 + live * 8, 8)
            .try_into()
            .unwrap(),
    );
    if v != 110 {
        fail(&format!(
            "AMOs from the live PE {live}: counter {v} (want 110)"
        ));
    }
    let v = u64::from_le_bytes(
        pe.heap_bytes(AMO_OFF + 48 + live * 8, 8)
            .try_into()
            .unwrap(),
    );
    if v != 7 {
        fail(&format!(
            "FETCH_ADD from the live PE {live}: counter {v} (want 7)"
        ));
    }
    pe.barrier("done");

    let fin = pe.ops().finalize.expect("finalize");
    // SAFETY: live transport; not touched afterwards.
    let (rc, dt) = timed(|| unsafe { fin(pe.t as *mut c_void) });
    note(&format!("finalize returned {rc} after {dt:?}"));
    if dt > BOUND {
        fail(&format!(
            "finalize with a dead peer took {dt:?} (bound {BOUND:?})"
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Parent side: hub, stop/kill, reaping
// ---------------------------------------------------------------------------------------------
struct Job {
    provider: &'static str,
    children: Vec<Child>,
    streams: Vec<Option<UnixStream>>,
    output: Vec<Arc<Mutex<String>>>,
    started: Instant,
}

impl Job {
    fn pid(&self, pe: usize) -> libc::pid_t {
        self.children[pe].id() as libc::pid_t
    }

    fn abort(&mut self, why: &str) -> ! {
        for c in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut s = format!(
            "provider {}: {why} (after {:?})\n",
            self.provider,
            self.started.elapsed()
        );
        for (pe, o) in self.output.iter().enumerate() {
            let o = o.lock().unwrap();
            let tail: String = o
                .lines()
                .rev()
                .take(25)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            s += &format!("--- PE {pe} (last lines) ---\n{tail}\n");
        }
        panic!("{s}");
    }

    /// Serves library rounds until every participant reaches the round `tag`, and that round.
    fn serve_until(&mut self, tag: &str, participants: &[usize]) {
        if let Err(e) = hub_common::serve_until(&mut self.streams, tag, participants, ROUND_LIMIT) {
            self.abort(&e);
        }
    }

    fn wait_exit(&mut self, pe: usize, limit: Duration) -> std::process::ExitStatus {
        match hub_common::wait_exit(&mut self.children[pe], pe, limit) {
            Ok(st) => st,
            Err(e) => self.abort(&e),
        }
    }
}

fn run_job(provider: &'static str, test_name: &str) {
    let sock =
        std::env::temp_dir().join(format!("peer-death-{}-{provider}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).expect("bind hub socket");
    let exe = std::env::current_exe().expect("test executable");
    let mut job = Job {
        provider,
        children: Vec::new(),
        streams: (0..NP).map(|_| None).collect(),
        output: Vec::new(),
        started: Instant::now(),
    };
    for pe in 0..NP {
        let mut cmd = Command::new(&exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_PE, pe.to_string())
            .env(ENV_SOCK, &sock)
            .env("NVSHMEM_LIBFABRIC_PROVIDER", provider)
            .env("NVSHMEM_EFA_GDA", "off")
            .env("NVSHMEM_EFA_QUIET_TIMEOUT_MS", QUIET_MS.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if std::env::var_os("FI_TCP_IFACE").is_none() {
            cmd.env("FI_TCP_IFACE", "lo");
        }
        let mut child = cmd.spawn().expect("spawn a PE");
        let out = hub_common::capture_stderr(&mut child);
        job.children.push(child);
        job.output.push(out);
    }
    if let Err(e) = hub_common::accept_all(&listener, &mut job.streams, ROUND_LIMIT) {
        job.abort(&e);
    }
    let all: Vec<usize> = (0..NP).collect();
    job.serve_until("setup", &all);
    job.serve_until("warm", &all);
    job.serve_until("pre-stop", &all);
    // PE 3 finalizes and exits; PE 2 is stopped where it stands.
    // SAFETY: a child of this process.
    unsafe { libc::kill(job.pid(DEAD), libc::SIGSTOP) };
    let mut st = 0;
    // SAFETY: as above; WUNTRACED returns once it is stopped.
    let r = unsafe { libc::waitpid(job.pid(DEAD), &mut st, libc::WUNTRACED) };
    if r != job.pid(DEAD) || !libc::WIFSTOPPED(st) {
        job.abort("PE 2 could not be stopped");
    }
    let dep = job.wait_exit(DEPARTED, Duration::from_secs(30));
    if !dep.success() {
        job.abort(&format!("the departing PE 3 exited with {dep}"));
    }
    job.streams[DEPARTED] = None;
    let survivors = [0usize, 1];
    job.serve_until("go", &survivors);
    job.serve_until("posted", &survivors);
    // SAFETY: a child of this process.
    unsafe { libc::kill(job.pid(DEAD), libc::SIGKILL) };
    let _ = job.children[DEAD].wait();
    job.streams[DEAD] = None;
    job.serve_until("killed", &survivors);
    job.serve_until("verify", &survivors);
    job.serve_until("done", &survivors);
    for pe in survivors {
        let st = job.wait_exit(pe, Duration::from_secs(30));
        if !st.success() {
            job.abort(&format!("survivor PE {pe} exited with {st}"));
        }
    }
    let _ = std::fs::remove_file(&sock);
    for (pe, o) in job.output.iter().enumerate() {
        for l in o.lock().unwrap().lines().filter(|l| l.starts_with("PE ")) {
            eprintln!("[{provider}] {l}");
        }
        let _ = pe;
    }
    eprintln!(
        "[{provider}] peer death: survivors passed in {:?}",
        job.started.elapsed()
    );
}

/// Runs the child role when this process is one of the job's PEs; otherwise the parent.
fn entry(provider: &'static str, test_name: &str) {
    if let (Ok(pe), Ok(sock)) = (std::env::var(ENV_PE), std::env::var(ENV_SOCK)) {
        child_main(pe.parse().expect("PE number"), &sock);
        return;
    }
    run_job(provider, test_name);
}

#[test]
fn peer_death_tcp() {
    entry("tcp", "peer_death_tcp");
}

/// On shm each peer has transmit endpoints of its own (libfabric 2.1's shm completes an endpoint's
/// operations in posting order, so an unanswered operation to a dead peer would otherwise hold up the
/// completions of every later operation on a shared endpoint, survivors' traffic included).
#[test]
fn peer_death_shm() {
    entry("shm", "peer_death_shm");
}
