//! Rails: one PE moves RMA over several NICs (domains) at once, and a rail that fails fails over.
//!
//! Two processes (PE 0 writes, PE 1 is written to) use the transport's Rust API over tcp with three
//! rails; this test process is their bootstrap (a hub over a Unix socket, tests/hub_common). In order:
//! 1. every rail carries traffic: 256 puts of 4 KiB (round-robin) and two of 1 MiB (striped, one
//!    piece per rail), then gets of the same data back (small ones on the proxy's endpoint with a
//!    quiet towards PE 1 there, and a blocking striped one); the per-rail counters
//!    (`Transport::rail_stats`) of PE 0 all grew;
//! 2. quiet waits for all: PE 1 checks the data right after PE 0's quiet, with no other wait;
//! 3. a stopped peer fails no rail: PE 1 is stopped (SIGSTOP) with puts of PE 0 in flight on
//!    every rail; after twice the rail timeout no rail has failed, and once PE 1 runs again quiet
//!    succeeds;
//! 4. a rail fails mid-stream: PE 0 posts half a stream of puts, rail 1 is cut, PE 0 posts the other
//!    half, makes a blocking striped put (it must succeed: its piece on the failing rail runs
//!    again on the others) and quiets. `rails_lo` (no privileges, three domains over `lo`) fails rail 1 as a failed
//!    completion does (test support); `rails_netns` (run by tests/twohost/rails.sh as root: two
//!    network namespaces joined by three veth pairs) takes rail 1's link down inside PE 0's
//!    namespace, so its operations really stay without completion and the rail timeout fails it,
//!    and quiet must then report their error within the bound; on both, one WARN line names the
//!    failed rail;
//! 5. after the failover: the whole region is written again with a new pattern; quiet succeeds,
//!    rail 1's counter no longer moves, rails 0 and 2 carry it, PE 1 checks every byte;
//! 6. rail 0 fails towards PE 1 (it carries the atomics): `rails_lo` fails it by test support,
//!    `rails_netns` takes rail 0's link down in PE 0's namespace (RAILS_CUT0); a non-blocking
//!    fetch-add to a second counter is in flight on rail 0 then, a stream of puts follows (half of
//!    it round-robin on rail 0), quiet reports rail 0's error within the bound (netns); afterwards
//!    blocking fetch-adds go over rail 2 (the lowest live one) and are exact, the whole region is
//!    written again over rail 2 alone (rails 0 and 1 idle) and checked at PE 1; the fetch-add in
//!    flight at the cut was applied at most once (never: netns, where its connection is gone);
//!    one WARN line names the move of the atomics to rail 2;
//! 7. rail 2, carrying the atomics now, fails by test support with a fetch-add in flight on it
//!    (applied at most once): over `lo` (four rails there) they move to rail 3 (one WARN line),
//!    the fetch-adds after it are exact and the region is written over rail 3 alone; in the
//!    namespaces no rail is left to PE 1: a fetch-add fails with "no rail left", a put with "no
//!    other rail", at once;
//! 8. throughout, blocking fetch-adds to PE 1: every old value is the previous one plus one and
//!    PE 1's counter equals their number (none lost, none applied twice).
//!
//! `rails_lo_provider_atomics` runs `rails_lo` with provider atomics (`NVSHMEM_EFA_ATOMICS=provider`,
//! `tcp;ofi_rxm`'s): there a peer's atomics do not move off rail 0 (another PE's provider atomics
//! could reach the same word over rail 0), so after rail 0's failure a fetch-add fails at once,
//! saying why, one WARN line says so, and RMA fails over as in `rails_lo`.
use std::ffi::c_void;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::Config;
use nvshmem_efa_gda::nvshmem::abi::{
    amo, op, AmoMemdesc, AmoVerb, MemHandle, RmaBytesdesc, RmaMemdesc, RmaVerb, MEM_HANDLE_SIZE,
};
use nvshmem_efa_gda::nvshmem::{Transport, EP_HOST, EP_PROXY};

mod hub_common;
use hub_common::{fail, hub_round, note, HUB, ME};

const ENV_PE: &str = "RAILS_TEST_PE";
const ENV_SOCK: &str = "RAILS_TEST_SOCK";
/// Set by tests/twohost/rails.sh: the namespaces' holder PIDs ("pid0,pid1"), the rail interfaces
/// ("if0,if1,if2", the same names in both namespaces), and the command that takes rail 1 down.
const ENV_NS: &str = "RAILS_NS";
const ENV_IFACES: &str = "RAILS_IFACES";
const ENV_CUT: &str = "RAILS_CUT";
/// Set by tests/twohost/rails.sh: the command that takes rail 0 down.
const ENV_CUT0: &str = "RAILS_CUT0";

/// Rails: three veth pairs (netns); four domains over `lo`, so that the rail carrying the atomics
/// after rail 0's failure can fail in turn with one rail left.
fn rails(netns: bool) -> usize {
    if netns {
        3
    } else {
        4
    }
}
const RAIL_TIMEOUT_MS: u64 = 1500;
const QUIET_MS: u64 = 20_000;
/// How long the failed-over quiet may take: the rail timeout and some slack.
const BOUND: Duration = Duration::from_millis(RAIL_TIMEOUT_MS + 3000);
const ROUND_LIMIT: Duration = Duration::from_secs(60);

const HEAP: usize = 8 << 20;
const DATA_OFF: usize = 0; // 3 MiB written on PE 1
const DATA_LEN: usize = 3 << 20;
const EXTRA_OFF: usize = 3 << 20; // the blocking put across the failover (1 MiB)
const SRC_OFF: usize = 4 << 20; // PE 0's source (3 MiB)
const BACK_OFF: usize = HEAP - (1 << 20) - 4096; // gets land here (1 MiB)
const CTR_OFF: usize = HEAP - 64; // PE 1's counter
const RET_OFF: usize = HEAP - 128; // fetch results
const CTR2_OFF: usize = HEAP - 192; // PE 1's counter of the fetch-add in flight at rail 0's cut
const RET2_OFF: usize = HEAP - 256;
const CTR3_OFF: usize = HEAP - 320; // ... of the one in flight at rail 2's failure
const RET3_OFF: usize = HEAP - 384;
const SMALL: usize = 4096;
const BIG: usize = 1 << 20;
const STREAM: usize = 16 << 10;

fn pattern(salt: u8, i: usize) -> u8 {
    (i as u8)
        .wrapping_mul(13)
        .wrapping_add((i >> 8) as u8)
        .wrapping_add((i >> 16) as u8 ^ salt)
}

struct Pe {
    t: Arc<Transport>,
    heap: *mut u8,
    own: Box<MemHandle>,
    peer: Box<MemHandle>,
    /// Where the peer's heap starts in its address space.
    peer_base: u64,
    /// The endpoint RMA goes through (host, or the proxy's).
    ep: usize,
    /// AMOs by provider atomics (`rails_lo_provider_atomics`): they do not move off rail 0.
    provider_amo: bool,
    fetched: u64,
}

impl Pe {
    fn remote(&mut self, off: usize) -> RmaMemdesc {
        RmaMemdesc {
            ptr: (self.peer_base + off as u64) as *mut c_void,
            offset: off as u64,
            handle: &mut *self.peer,
        }
    }
    fn rma(
        &mut self,
        put: bool,
        nbi: bool,
        roff: usize,
        loff: usize,
        len: usize,
    ) -> Result<(), String> {
        // SAFETY: loff < HEAP.
        let lptr = unsafe { self.heap.add(loff) };
        self.rma_from(put, nbi, roff, lptr, loff, len)
    }
    /// [`Pe::rma`] with local memory at `lptr` (`loff`: its offset in the heap's handle).
    fn rma_from(
        &mut self,
        put: bool,
        nbi: bool,
        roff: usize,
        lptr: *mut u8,
        loff: usize,
        len: usize,
    ) -> Result<(), String> {
        let mut r = self.remote(roff);
        let mut l = RmaMemdesc {
            ptr: lptr as *mut c_void,
            offset: loff as u64,
            handle: &mut *self.own,
        };
        let verb = RmaVerb {
            op: if put { op::PUT } else { op::GET },
            is_nbi: nbi as i32,
            is_stream: 0,
            cstrm: std::ptr::null_mut(),
        };
        let bytes = RmaBytesdesc {
            nelems: len,
            elembytes: 1,
            srcstride: 1,
            deststride: 1,
        };
        // SAFETY: descriptors live for the call; both ranges lie in registered heaps.
        unsafe { self.t.rma(1, verb, &mut r, &mut l, bytes, self.ep) }.map_err(|e| e.message)
    }
    /// A fetch-add of 1 to PE 1's counter at `ctr`, its old value to `ret`; no quiet.
    fn fetch_add_nbi(&mut self, ctr: usize, ret: usize) -> Result<(), String> {
        let mut m = AmoMemdesc {
            remote: self.remote(ctr),
            retflag: 0,
            // SAFETY: ret < HEAP.
            retptr: unsafe { self.heap.add(ret) } as *mut c_void,
            valptr: std::ptr::null_mut(),
            cmpptr: std::ptr::null_mut(),
            val: 1,
            cmp: 0,
            ret_handle: &mut *self.own,
        };
        let verb = AmoVerb {
            op: amo::FETCH_ADD,
            is_fetch: 1,
            is_val: 1,
            is_cmp: 0,
        };
        // SAFETY: as for rma; the result slot is in the registered heap.
        unsafe { self.t.amo(1, verb, &mut m, 8, EP_HOST) }.map_err(|e| e.message)
    }
    /// A blocking fetch-add of 1 to PE 1's counter; the old value must follow the last one.
    fn fetch_add(&mut self) {
        if let Err(e) = self.fetch_add_nbi(CTR_OFF, RET_OFF) {
            fail(&format!("fetch-add: {e}"));
        }
        if let Err(e) = self.t.quiet(EP_HOST) {
            fail(&format!("quiet after fetch-add: {}", e.message));
        }
        // SAFETY: RET_OFF is 8-aligned inside the heap.
        let old = unsafe { std::ptr::read_volatile(self.heap.add(RET_OFF) as *const u64) };
        if old != self.fetched {
            fail(&format!(
                "fetch-add returned {old}, expected {}",
                self.fetched
            ));
        }
        self.fetched += 1;
    }
    fn fill(&mut self, off: usize, len: usize, salt: u8) {
        for i in 0..len {
            // SAFETY: off + len <= HEAP.
            unsafe { *self.heap.add(off + i) = pattern(salt, i) };
        }
    }
    fn check(&self, off: usize, len: usize, salt: u8, what: &str) {
        for i in 0..len {
            // SAFETY: off + len <= HEAP.
            let got = unsafe { std::ptr::read_volatile(self.heap.add(off + i)) };
            if got != pattern(salt, i) {
                fail(&format!(
                    "{what}: byte {i} is {got}, expected {}",
                    pattern(salt, i)
                ));
            }
        }
    }
    fn stats(&self) -> Vec<(u64, bool)> {
        self.t
            .rail_stats()
            .iter()
            .map(|s| (s.ops, s.failed.is_some()))
            .collect()
    }
    /// Writes the whole data region with `salt`: small puts round-robin, then striped ones.
    fn write_all(&mut self, salt: u8) -> Result<(), String> {
        self.fill(SRC_OFF, DATA_LEN, salt);
        let small_part = DATA_LEN - 2 * BIG;
        for k in 0..small_part / SMALL {
            self.rma(true, true, DATA_OFF + k * SMALL, SRC_OFF + k * SMALL, SMALL)?;
        }
        for k in 0..2 {
            let o = small_part + k * BIG;
            self.rma(true, true, DATA_OFF + o, SRC_OFF + o, BIG)?;
        }
        self.t.quiet(EP_HOST).map_err(|e| e.message)
    }
}

fn child_main(me: usize, sock: &str, netns: bool) {
    ME.set(me).unwrap();
    let mut s = UnixStream::connect(sock).unwrap_or_else(|e| fail(&format!("connect {sock}: {e}")));
    s.write_all(&(me as u32).to_le_bytes()).unwrap();
    HUB.set(std::sync::Mutex::new(s)).ok();
    nvshmem_efa_gda::log::init();
    let cfg = Config::from_env().unwrap_or_else(|e| fail(&format!("config: {e}")));
    let t = Arc::new(
        Transport::new(cfg).unwrap_or_else(|e| fail(&format!("transport: {}", e.message))),
    );
    let ag = |send: &[u8], recv: &mut [u8]| {
        let all = hub_round("lib", send);
        recv.copy_from_slice(&all);
        Ok(())
    };
    t.connect(me as i32, 2, &ag)
        .unwrap_or_else(|e| fail(&format!("connect: {}", e.message)));
    let heap = Box::leak(vec![0u8; HEAP].into_boxed_slice()).as_mut_ptr();
    let mut own = Box::new(MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    });
    // SAFETY: the heap is leaked (lives for the process).
    unsafe { t.get_mem_handle(&mut *own, heap as *mut c_void, HEAP, false) }
        .unwrap_or_else(|e| fail(&format!("get_mem_handle: {}", e.message)));
    let mut mine = own.reserved.to_vec();
    mine.extend_from_slice(&(heap as u64).to_le_bytes());
    let all = hub_round("handles", &mine);
    let theirs = &all[(1 - me) * (MEM_HANDLE_SIZE + 8)..(2 - me) * (MEM_HANDLE_SIZE + 8)];
    let mut peer = Box::new(MemHandle {
        reserved: [0; MEM_HANDLE_SIZE],
    });
    peer.reserved.copy_from_slice(&theirs[..MEM_HANDLE_SIZE]);
    let peer_base = u64::from_le_bytes(theirs[MEM_HANDLE_SIZE..].try_into().unwrap());
    let mut pe = Pe {
        t: t.clone(),
        heap,
        own,
        peer,
        peer_base,
        ep: EP_HOST,
        provider_amo: t.uses_provider_atomics(),
        fetched: 0,
    };
    if pe.provider_amo != (std::env::var("NVSHMEM_EFA_ATOMICS").as_deref() == Ok("provider")) {
        fail(&format!("provider atomics: {}", pe.provider_amo));
    }
    let n_rails = pe.stats().len();
    if n_rails != rails(netns) {
        fail(&format!("{n_rails} rails, expected {}", rails(netns)));
    }
    if me == 0 {
        writer(&mut pe, netns);
    } else {
        target(&mut pe);
    }
    t.shutdown();
    hub_round("done", &[]);
    note("passed");
}

fn writer(pe: &mut Pe, netns: bool) {
    // 1. every rail carries traffic (puts, then gets back).
    pe.write_all(1)
        .unwrap_or_else(|e| fail(&format!("phase 1 puts: {e}")));
    for _ in 0..4 {
        pe.fetch_add();
    }
    let s = pe.stats();
    if let Some(r) = s.iter().position(|(ops, _)| *ops == 0) {
        fail(&format!("rail {r} carried no puts: {s:?}"));
    }
    hub_round("p1", &[]);
    hub_round("p1-checked", &[]);
    // Gets on the proxy's endpoint, completed by a quiet towards PE 1 on that endpoint.
    pe.ep = EP_PROXY;
    for k in 0..16 {
        pe.rma(
            false,
            true,
            DATA_OFF + k * SMALL,
            BACK_OFF + k * SMALL,
            SMALL,
        )
        .unwrap_or_else(|e| fail(&format!("nbi get: {e}")));
    }
    pe.t.quiet_pe(EP_PROXY, 1)
        .unwrap_or_else(|e| fail(&format!("quiet after gets: {}", e.message)));
    pe.ep = EP_HOST;
    pe.check(BACK_OFF, 16 * SMALL, 1, "small gets");
    let big_at = DATA_LEN - 2 * BIG;
    pe.rma(false, false, DATA_OFF + big_at, BACK_OFF, BIG)
        .unwrap_or_else(|e| fail(&format!("blocking striped get: {e}")));
    for i in 0..BIG {
        // SAFETY: inside the heap.
        let got = unsafe { *pe.heap.add(BACK_OFF + i) };
        if got != pattern(1, big_at + i) {
            fail(&format!("striped get: byte {i} is {got}"));
        }
    }
    let before = pe.stats();
    note(&format!("phase 1: per-rail operations {before:?}"));
    // A stopped peer fails no rail: its operations wait (no progress anywhere), then complete.
    hub_round("pre-stop", &[]);
    // The parent stops PE 1 right after this round: give the signal time to land first, so that
    // none of the puts below completes (a completion on one rail and none on another would be
    // the working peer and broken rail that fail a rail).
    std::thread::sleep(Duration::from_millis(300));
    pe.fill(SRC_OFF, 8 * STREAM, 4);
    for k in 0..8 {
        pe.rma(
            true,
            true,
            DATA_OFF + k * STREAM,
            SRC_OFF + k * STREAM,
            STREAM,
        )
        .unwrap_or_else(|e| fail(&format!("put to the stopped peer: {e}")));
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2 * RAIL_TIMEOUT_MS + 500) {
        let _ = pe.t.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = pe.stats();
    if s.iter().any(|(_, failed)| *failed) {
        fail(&format!("a stopped peer failed a rail: {s:?}"));
    }
    hub_round("stopped-ok", &[]);
    hub_round("resumed", &[]);
    pe.t.quiet(EP_HOST)
        .unwrap_or_else(|e| fail(&format!("quiet after the peer resumed: {}", e.message)));
    // 3. a rail fails mid-stream.
    pe.fill(SRC_OFF, DATA_LEN, 2);
    let n = DATA_LEN / STREAM;
    for k in 0..n / 2 {
        pe.rma(
            true,
            true,
            DATA_OFF + k * STREAM,
            SRC_OFF + k * STREAM,
            STREAM,
        )
        .unwrap_or_else(|e| fail(&format!("stream put {k}: {e}")));
    }
    // The parent cuts rail 1 between these two rounds (netns); here it fails by test support.
    hub_round("half", &[]);
    if !netns {
        pe.t.inject_rail_failure(1);
    }
    hub_round("cut", &[]);
    let t0 = Instant::now();
    for k in n / 2..n {
        if let Err(e) = pe.rma(
            true,
            true,
            DATA_OFF + k * STREAM,
            SRC_OFF + k * STREAM,
            STREAM,
        ) {
            fail(&format!("stream put {k} after the cut: {e}"));
        }
    }
    // A blocking striped put while rail 1 is down but not yet found out: its piece there ends with
    // the rail's failure, and the put runs again on the rails left (it returns success).
    pe.fill(BACK_OFF, BIG, 5);
    pe.rma(true, false, EXTRA_OFF, BACK_OFF, BIG)
        .unwrap_or_else(|e| fail(&format!("blocking put across the failover: {e}")));
    let q = pe.t.quiet(EP_HOST);
    let dt = t0.elapsed();
    note(&format!(
        "quiet after the cut: {:?} after {dt:?}",
        q.as_ref().map_err(|e| &e.message)
    ));
    match (&q, netns) {
        (Err(e), _) if e.message.contains("rail 1") => {}
        (Ok(()), false) => {} // the injected failure may find nothing in flight
        _ => fail(&format!(
            "quiet after the cut returned {:?} (want rail 1's error)",
            q.map_err(|e| e.message)
        )),
    }
    if dt > BOUND {
        fail(&format!(
            "quiet after the cut took {dt:?} (bound {BOUND:?})"
        ));
    }
    let mid = pe.stats();
    if !mid[1].1 || mid[0].1 || mid[2].1 {
        fail(&format!(
            "after the cut: want rail 1 failed, 0 and 2 up: {mid:?}"
        ));
    }
    for _ in 0..4 {
        pe.fetch_add();
    }
    // 4. after the failover.
    pe.write_all(3)
        .unwrap_or_else(|e| fail(&format!("puts after the failover: {e}")));
    let after = pe.stats();
    note(&format!(
        "after the failover: per-rail operations {after:?}"
    ));
    if after[1].0 != mid[1].0 || after[0].0 <= mid[0].0 || after[2].0 <= mid[2].0 {
        fail(&format!(
            "after the failover rail 1 must stay idle, 0 and 2 carry: {mid:?} -> {after:?}"
        ));
    }
    hub_round("p3", &pe.fetched.to_le_bytes());
    hub_round("p3-checked", &[]);
    rail0_cut(pe, netns);
}

/// Step 6: rail 0 (and the atomics on it) fails towards PE 1.
fn rail0_cut(pe: &mut Pe, netns: bool) {
    let amos_before: Vec<u64> = pe.t.rail_stats().iter().map(|s| s.amos).collect();
    pe.fill(SRC_OFF, DATA_LEN, 6);
    // The parent cuts rail 0 between these two rounds (netns); here it fails by test support,
    // right after a fetch-add is posted on it.
    hub_round("half0", &[]);
    if !netns {
        pe.fetch_add_nbi(CTR2_OFF, RET2_OFF)
            .unwrap_or_else(|e| fail(&format!("fetch-add before rail 0's cut: {e}")));
        pe.t.inject_rail_failure(0);
    }
    hub_round("cut0", &[]);
    if netns {
        pe.fetch_add_nbi(CTR2_OFF, RET2_OFF)
            .unwrap_or_else(|e| fail(&format!("fetch-add after rail 0's cut: {e}")));
    }
    let t0 = Instant::now();
    let n = DATA_LEN / STREAM;
    for k in 0..n {
        if let Err(e) = pe.rma(
            true,
            true,
            DATA_OFF + k * STREAM,
            SRC_OFF + k * STREAM,
            STREAM,
        ) {
            fail(&format!("stream put {k} after rail 0's cut: {e}"));
        }
    }
    let q = pe.t.quiet(EP_HOST);
    let dt = t0.elapsed();
    note(&format!(
        "quiet after rail 0's cut: {:?} after {dt:?}",
        q.as_ref().map_err(|e| &e.message)
    ));
    match (&q, netns) {
        (Err(e), _) if e.message.contains("rail 0") => {}
        (Ok(()), false) => {} // the fetch-add may have completed before the injection
        _ => fail(&format!(
            "quiet after rail 0's cut returned {:?} (want rail 0's error)",
            q.map_err(|e| e.message)
        )),
    }
    if dt > BOUND {
        fail(&format!(
            "quiet after rail 0's cut took {dt:?} (bound {BOUND:?})"
        ));
    }
    let mid = pe.stats();
    if !mid[0].1 || !mid[1].1 || mid[2].1 {
        fail(&format!(
            "after rail 0's cut: want rails 0 and 1 failed, rail 2 up: {mid:?}"
        ));
    }
    if pe.provider_amo {
        // Provider atomics do not move: the peer's AMOs fail, at once.
        match pe.fetch_add_nbi(CTR_OFF, RET_OFF) {
            Err(e) if e.contains("provider atomics do not move") => {}
            r => fail(&format!(
                "a fetch-add after rail 0's cut with provider atomics returned {r:?}"
            )),
        }
    } else {
        for _ in 0..4 {
            pe.fetch_add();
        }
    }
    // What has no other rail (here a put from unregistered memory) fails at once.
    let loose = Box::leak(vec![9u8; SMALL].into_boxed_slice()).as_mut_ptr();
    let t1 = Instant::now();
    match pe.rma_from(true, false, DATA_OFF, loose, 0, SMALL) {
        Err(e) if e.contains("rail 0") && t1.elapsed() < Duration::from_secs(1) => {}
        r => fail(&format!(
            "a put from unregistered memory after rail 0's cut: {r:?} after {:?} (want rail 0's error at once)",
            t1.elapsed()
        )),
    }
    pe.write_all(7)
        .unwrap_or_else(|e| fail(&format!("puts after rail 0's cut: {e}")));
    let after = pe.stats();
    let amos: Vec<u64> = pe.t.rail_stats().iter().map(|s| s.amos).collect();
    note(&format!(
        "after rail 0's cut: per-rail operations {after:?}, AMOs per rail {amos_before:?} -> {amos:?}"
    ));
    if after[0].0 != mid[0].0 || after[1].0 != mid[1].0 || after[2].0 <= mid[2].0 {
        fail(&format!(
            "after rail 0's cut rails 0 and 1 must stay idle, 2 carries: {mid:?} -> {after:?}"
        ));
    }
    if !pe.provider_amo && (amos[2] < amos_before[2] + 4 || amos[1] != amos_before[1]) {
        fail(&format!(
            "after rail 0's cut the fetch-adds must go over rail 2: {amos_before:?} -> {amos:?}"
        ));
    }
    let mut msg = pe.fetched.to_le_bytes().to_vec();
    msg.push(netns as u8);
    hub_round("p5", &msg);
    hub_round("p5-checked", &[]);
    rail2_cut(pe, netns);
}

/// Step 7: rail 2, which carries the atomics now, fails (by test support). Over `lo` they move
/// to rail 3 and stay exact; in the namespaces no rail is left to PE 1, and its operations fail
/// at once.
fn rail2_cut(pe: &mut Pe, netns: bool) {
    let amos_before: Vec<u64> = pe.t.rail_stats().iter().map(|s| s.amos).collect();
    hub_round("half2", &[]);
    if !pe.provider_amo {
        pe.fetch_add_nbi(CTR3_OFF, RET3_OFF)
            .unwrap_or_else(|e| fail(&format!("fetch-add before rail 2's failure: {e}")));
    }
    pe.t.inject_rail_failure(2);
    let q = pe.t.quiet(EP_HOST);
    note(&format!(
        "quiet after rail 2's failure: {:?}",
        q.as_ref().map_err(|e| &e.message)
    ));
    if let Err(e) = &q {
        if !e.message.contains("rail 2") {
            fail(&format!("quiet after rail 2's failure: {}", e.message));
        }
    }
    if netns {
        match pe.fetch_add_nbi(CTR_OFF, RET_OFF) {
            Err(e) if e.contains("no rail left") => {}
            r => fail(&format!(
                "a fetch-add with no rail left returned {r:?} (want its error)"
            )),
        }
        match pe.rma(true, false, DATA_OFF, SRC_OFF, SMALL) {
            Err(e) if e.contains("no other rail") => {}
            r => fail(&format!(
                "a put with no rail left returned {r:?} (want its error)"
            )),
        }
    } else {
        let mid = pe.stats();
        if !pe.provider_amo {
            for _ in 0..4 {
                pe.fetch_add();
            }
        }
        pe.write_all(8)
            .unwrap_or_else(|e| fail(&format!("puts after rail 2's failure: {e}")));
        let after = pe.stats();
        let amos: Vec<u64> = pe.t.rail_stats().iter().map(|s| s.amos).collect();
        note(&format!(
            "after rail 2's failure: per-rail operations {after:?}, AMOs per rail {amos_before:?} -> {amos:?}"
        ));
        if (0..3).any(|r| after[r].0 != mid[r].0) || after[3].0 <= mid[3].0 {
            fail(&format!(
                "after rail 2's failure rails 0 to 2 must stay idle, 3 carries: {mid:?} -> {after:?}"
            ));
        }
        if !pe.provider_amo && (amos[3] < amos_before[3] + 4 || amos[2] > amos_before[2] + 1) {
            fail(&format!(
                "after rail 2's failure the fetch-adds must go over rail 3: {amos_before:?} -> {amos:?}"
            ));
        }
    }
    let mut msg = pe.fetched.to_le_bytes().to_vec();
    msg.push(netns as u8);
    hub_round("p6", &msg);
    hub_round("p6-checked", &[]);
}

fn target(pe: &mut Pe) {
    hub_round("p1", &[]);
    pe.check(DATA_OFF, DATA_LEN, 1, "phase 1 data at the target");
    hub_round("p1-checked", &[]);
    hub_round("pre-stop", &[]);
    // Stopped by the parent here, resumed after PE 0 checked its rails.
    hub_round("resumed", &[]);
    hub_round("half", &[]);
    hub_round("cut", &[]);
    let all = hub_round("p3", &0u64.to_le_bytes());
    let fetched = u64::from_le_bytes(all[0..8].try_into().unwrap());
    pe.check(DATA_OFF, DATA_LEN, 3, "data after the failover");
    pe.check(EXTRA_OFF, BIG, 5, "the blocking put across the failover");
    // SAFETY: CTR_OFF is 8-aligned inside the heap.
    let ctr = unsafe { std::ptr::read_volatile(pe.heap.add(CTR_OFF) as *const u64) };
    if ctr != fetched {
        fail(&format!("counter {ctr} after {fetched} fetch-adds"));
    }
    hub_round("p3-checked", &[]);
    hub_round("half0", &[]);
    hub_round("cut0", &[]);
    let all = hub_round("p5", &[0u8; 9]);
    let fetched = u64::from_le_bytes(all[0..8].try_into().unwrap());
    let netns = all[8] != 0;
    pe.check(DATA_OFF, DATA_LEN, 7, "data after rail 0's cut");
    // SAFETY: 8-aligned words inside the heap.
    let (ctr, ctr2) = unsafe {
        (
            std::ptr::read_volatile(pe.heap.add(CTR_OFF) as *const u64),
            std::ptr::read_volatile(pe.heap.add(CTR2_OFF) as *const u64),
        )
    };
    if ctr != fetched {
        fail(&format!(
            "counter {ctr} after {fetched} fetch-adds (rail 0 cut)"
        ));
    }
    // The fetch-add in flight at the cut ended with an error (or, injected, maybe completed
    // first): applied at most once, and not at all where its connection went down with it.
    if ctr2 > 1 || (netns && ctr2 != 0) {
        fail(&format!(
            "the fetch-add in flight at rail 0's cut was applied {ctr2} times"
        ));
    }
    note(&format!(
        "counter {ctr} after {fetched} fetch-adds; the one in flight at rail 0's cut applied {ctr2} time(s)"
    ));
    hub_round("p5-checked", &[]);
    hub_round("half2", &[]);
    let all = hub_round("p6", &[0u8; 9]);
    let fetched = u64::from_le_bytes(all[0..8].try_into().unwrap());
    pe.check(
        DATA_OFF,
        DATA_LEN,
        if netns { 7 } else { 8 },
        "data after rail 2's failure",
    );
    // SAFETY: 8-aligned words inside the heap.
    let (ctr, ctr3) = unsafe {
        (
            std::ptr::read_volatile(pe.heap.add(CTR_OFF) as *const u64),
            std::ptr::read_volatile(pe.heap.add(CTR3_OFF) as *const u64),
        )
    };
    if ctr != fetched || ctr3 > 1 {
        fail(&format!(
            "after rail 2's failure: counter {ctr} after {fetched} fetch-adds, the one in flight applied {ctr3} times"
        ));
    }
    note(&format!(
        "counter {ctr} after {fetched} fetch-adds; the one in flight at rail 2's failure applied {ctr3} time(s)"
    ));
    hub_round("p6-checked", &[]);
}

struct Job {
    children: Vec<Child>,
    streams: Vec<Option<UnixStream>>,
    output: Vec<Arc<Mutex<String>>>,
}

impl Job {
    fn abort(&mut self, why: &str) -> ! {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(100));
        for (pe, o) in self.output.iter().enumerate() {
            eprintln!("---- PE {pe} ----\n{}", o.lock().unwrap());
        }
        panic!("{why}");
    }
    fn serve(&mut self, tag: &str) {
        if let Err(e) = hub_common::serve_until(&mut self.streams, tag, &[0, 1], ROUND_LIMIT) {
            self.abort(&e);
        }
    }
}

/// The namespaces' holder PIDs, the rail interfaces, the commands that cut rail 1 and rail 0.
type Netns = (Vec<String>, String, String, String);

fn run_job(test_name: &str, ns: Option<Netns>, provider_amo: bool) {
    let sock = std::env::temp_dir().join(format!("rails-{}-{test_name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).expect("bind hub socket");
    let exe = std::env::current_exe().expect("test executable");
    let mut job = Job {
        children: Vec::new(),
        streams: vec![None, None],
        output: Vec::new(),
    };
    for pe in 0..2 {
        let mut cmd = match &ns {
            Some((pids, _, _, _)) => {
                let mut c = Command::new("nsenter");
                c.args(["-t", &pids[pe], "-n", "-u", "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let rails = match &ns {
            Some((_, ifaces, _, _)) => ifaces.clone(),
            None => vec!["lo"; rails(false)].join(","),
        };
        cmd.args([
            test_name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(ENV_PE, pe.to_string())
        .env(ENV_SOCK, &sock)
        .env("NVSHMEM_LIBFABRIC_PROVIDER", "tcp")
        .env("NVSHMEM_EFA_GDA", "off")
        .env(
            "NVSHMEM_EFA_ATOMICS",
            if provider_amo { "provider" } else { "auto" },
        )
        .env(
            "NVSHMEM_EFA_LOG",
            std::env::var("RAILS_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env("NVSHMEM_EFA_RAILS", rails)
        .env("NVSHMEM_EFA_RAIL_TIMEOUT_MS", RAIL_TIMEOUT_MS.to_string())
        .env("NVSHMEM_EFA_QUIET_TIMEOUT_MS", QUIET_MS.to_string())
        .env_remove("FI_TCP_IFACE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn a PE");
        job.output.push(hub_common::capture_stderr(&mut child));
        job.children.push(child);
    }
    if let Err(e) = hub_common::accept_all(&listener, &mut job.streams, ROUND_LIMIT) {
        job.abort(&e);
    }
    for tag in ["handles", "p1", "p1-checked", "pre-stop"] {
        job.serve(tag);
    }
    let target = job.children[1].id() as i32;
    // SAFETY: signals to a child of this process (the PE itself: nsenter without --fork execs it).
    unsafe { libc::kill(target, libc::SIGSTOP) };
    if let Err(e) = hub_common::serve_until(&mut job.streams, "stopped-ok", &[0], ROUND_LIMIT) {
        job.abort(&e);
    }
    // SAFETY: as above.
    unsafe { libc::kill(target, libc::SIGCONT) };
    for tag in ["resumed", "half"] {
        job.serve(tag);
    }
    if let Some((_, _, cut, _)) = &ns {
        let st = Command::new("sh").args(["-c", cut]).status();
        if !st.as_ref().is_ok_and(|s| s.success()) {
            job.abort(&format!("the cut ({cut}) failed: {st:?}"));
        }
    }
    for tag in ["cut", "p3", "p3-checked", "half0"] {
        job.serve(tag);
    }
    if let Some((_, _, _, cut0)) = &ns {
        let st = Command::new("sh").args(["-c", cut0]).status();
        if !st.as_ref().is_ok_and(|s| s.success()) {
            job.abort(&format!("the cut of rail 0 ({cut0}) failed: {st:?}"));
        }
    }
    for tag in [
        "cut0",
        "p5",
        "p5-checked",
        "half2",
        "p6",
        "p6-checked",
        "done",
    ] {
        job.serve(tag);
    }
    for pe in 0..2 {
        match hub_common::wait_exit(&mut job.children[pe], pe, Duration::from_secs(30)) {
            Ok(st) if st.success() => {}
            Ok(st) => job.abort(&format!("PE {pe} exited with {st}")),
            Err(e) => job.abort(&e),
        }
    }
    let _ = std::fs::remove_file(&sock);
    std::thread::sleep(Duration::from_millis(50));
    let out0 = job.output[0].lock().unwrap().clone();
    let warns = out0
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rail 1 (") && l.contains(") failed:"))
        .count();
    for l in out0
        .lines()
        .filter(|l| l.contains("rail") || l.starts_with("PE "))
    {
        eprintln!("[PE 0] {l}");
    }
    let out1 = job.output[1].lock().unwrap().clone();
    for l in out1.lines().filter(|l| l.starts_with("PE ")) {
        eprintln!("[PE 1] {l}");
    }
    if warns != 1 {
        job.abort(&format!(
            "{warns} WARN lines name rail 1's failure (want 1)"
        ));
    }
    let moves = out0
        .lines()
        .filter(|l| {
            l.contains("WARN")
                && l.contains("rail 0 (")
                && l.contains("failed towards PE 1")
                && l.contains(if provider_amo {
                    "PE 1's atomics fail from now on"
                } else {
                    "atomics now go over rail 2 ("
                })
        })
        .count();
    if moves != 1 {
        job.abort(&format!(
            "{moves} WARN lines name rail 0's failure and what became of the atomics (want 1)"
        ));
    }
    let then = if ns.is_some() {
        "no rail is left for PE 1's atomics"
    } else if provider_amo {
        ") failed: failure injected by a test"
    } else {
        "PE 1's atomics now go over rail 3 ("
    };
    let moves2 = out0
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rail 2 (") && l.contains(then))
        .count();
    if moves2 != 1 {
        job.abort(&format!(
            "{moves2} WARN lines name rail 2's failure and say \"{then}\" (want 1)"
        ));
    }
}

fn entry(test_name: &str, ns: Option<Netns>, provider_amo: bool) {
    if let (Ok(pe), Ok(sock)) = (std::env::var(ENV_PE), std::env::var(ENV_SOCK)) {
        child_main(pe.parse().expect("PE number"), &sock, ns.is_some());
        return;
    }
    run_job(test_name, ns, provider_amo);
}

/// Four rails over `lo` (four domains of one interface); rail 1, then rail 0, then rail 2 failed
/// by test support.
#[test]
fn rails_lo() {
    entry("rails_lo", None, false);
}

/// `rails_lo` with provider atomics (`tcp;ofi_rxm`'s): after rail 0's failure the peer's atomics
/// do not move, they fail at once with an error that says why; RMA fails over as before.
#[test]
fn rails_lo_provider_atomics() {
    entry("rails_lo_provider_atomics", None, true);
}

/// Three rails over three veth pairs between two network namespaces; rail 1's link goes down
/// mid-stream, later rail 0's. Needs tests/twohost/rails.sh (root), which sets RAILS_NS,
/// RAILS_IFACES, RAILS_CUT and RAILS_CUT0.
#[test]
#[ignore = "needs two network namespaces: tests/twohost/rails.sh runs it"]
fn rails_netns() {
    let ns = match (
        std::env::var(ENV_NS),
        std::env::var(ENV_IFACES),
        std::env::var(ENV_CUT),
        std::env::var(ENV_CUT0),
    ) {
        (Ok(p), Ok(i), Ok(c), Ok(c0)) => (p.split(',').map(str::to_string).collect(), i, c, c0),
        _ => panic!(
            "{ENV_NS}, {ENV_IFACES}, {ENV_CUT} and {ENV_CUT0} must be set (tests/twohost/rails.sh)"
        ),
    };
    entry("rails_netns", Some(ns), false);
}
