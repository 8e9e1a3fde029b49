//! A peer killed in the middle of a stream: with many operations in flight to every peer, one PE
//! dies and the others neither hang nor lose data.
//!
//! Four processes (this test binary, one PE each; the test process is their bootstrap hub over a
//! Unix socket and their reaper) drive the transport's Rust API with host memory. After setup every
//! PE streams, round after round, to every other PE: `K` non-blocking puts (proxy endpoint), `G`
//! non-blocking gets and `A` non-fetching AMOs (host endpoint), then a quiet towards each peer on
//! both endpoints. The test kills PE 3 (SIGKILL) while the stream runs. Each survivor checks:
//! * every call towards the dead PE (post, quiet) returns within `BOUND` (the bound the other
//!   peer-death tests hold), and the first failure comes after the kill (no live peer was taken
//!   for dead) and within `BOUND` of it;
//! * the stream to the live PEs goes on: every quiet towards them succeeds, at least
//!   `ROUNDS_AFTER` rounds complete after the failure, each get returns the peer's bytes, and at
//!   the end every live peer's last puts and all its AMOs are in this PE's heap;
//! * nothing leaks: no operation context stays in flight, every submitted operation completed
//!   (failed ones included), and finalize returns within `BOUND`; on shm no shared-memory region
//!   of a survivor outlives it.
//!
//! Staged variants (`*_staged`): host memory moved the way GPU memory is for a PE the provider
//! must not give it to (`NVSHMEM_EFA_GPU_STAGING=1`: puts and gets as active messages through host
//! send slots, each waiting for the target's answer); the waiting contexts of the messages the dead
//! PE never answered must be released with the rest. On tcp the staged variant runs with rxm's
//! eager limit above the staged message size, which the library sets itself when it is loaded
//! (`FI_OFI_RXM_BUFFER_SIZE` = `fabric::rxm::EAGER_LIMIT` for `NVSHMEM_LIBFABRIC_PROVIDER=tcp`;
//! every PE checks the variable after the transport opened): with rxm's default, a staged message of
//! 16-128 KiB goes by its segmentation protocol (SAR), and libfabric 2.1 crashes a survivor whose
//! dead peer's connection closes with such a message half received (`rxm_close_conn` treats its
//! `deferred_sar_msgs` entries as receive entries and calls through a null pointer; 1 run in
//! ~60-100, docs/staged-path.md). `load_death_tcp_staged_sar` (ignored) keeps rxm's default
//! (`NVSHMEM_EFA_RXM_EAGER=keep`).
//!
//! Layouts: the same host (tcp over `lo`, shm), and two hosts (tcp): each PE in a network, UTS and
//! PID namespace of its own, joined by veth pairs on a bridge, so the library sees four hosts and
//! learns of the death only through the provider, as on a cluster. The two-host layout needs
//! CAP_SYS_ADMIN and CAP_NET_ADMIN; without them it prints `SKIP: ...` and passes.
use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshmem_efa_gda::config::Config;
use nvshmem_efa_gda::nvshmem::abi::{
    amo, op, AmoMemdesc, AmoVerb, MemHandle, RmaBytesdesc, RmaMemdesc, RmaVerb, MEM_HANDLE_SIZE,
};
use nvshmem_efa_gda::nvshmem::{Transport, EP_HOST, EP_PROXY};

const NP: usize = 4;
const DEAD: usize = 3;
/// Operations per peer per round: puts, gets, AMOs.
const K: usize = 32;
const G: usize = 8;
const A: usize = 8;
const CH: usize = 4096;
const QUIET_MS: u64 = 15_000;
/// The quiet timeout of the two-host layout, where a killed peer is only ever seen by it (below).
const QUIET_MS_TWO_HOSTS: u64 = 2_000;
/// What "promptly" means (as in transport_peer_death.rs).
const BOUND: Duration = Duration::from_millis(3_000);
/// The victim is killed this long after the stream started.
const KILL_AFTER: Duration = Duration::from_millis(400);
/// Rounds every survivor completes with its live peers after the dead one failed.
const ROUNDS_AFTER: u64 = 20;
/// A survivor that has not seen the death by then fails.
const STREAM_LIMIT: Duration = Duration::from_secs(30);
const ROUND_LIMIT: Duration = Duration::from_secs(90);

const HEAP: usize = 2 << 20;
const PUT_OFF: usize = 0; // K chunks per source PE
const GET_OFF: usize = 512 << 10; // G chunks per peer
const AMO_OFF: usize = 768 << 10; // one 8-byte counter per source PE
const SRC_OFF: usize = 1 << 20; // K chunks of this PE's pattern

const ENV_PE: &str = "LOAD_DEATH_PE";
const ENV_SOCK: &str = "LOAD_DEATH_SOCK";
const ENV_DIR: &str = "LOAD_DEATH_DIR";
/// Set for the two-host layout: the bound towards the dead PE is the quiet timeout (see
/// [`dead_bound`]).
const ENV_REMOTE: &str = "LOAD_DEATH_REMOTE";

/// How the PEs move data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Through the provider (RMA; AMOs as the route says).
    Direct,
    /// Staged; on tcp with rxm's eager limit the library sets at load.
    Staged,
    /// Staged with rxm's default protocols (SAR for 16-128 KiB messages).
    StagedSar,
}

/// How soon operations to the dead PE must fail. On one host the library sees the process go
/// (`/proc`, every 100 ms) and `BOUND` holds. Across hosts tcp;ofi_rxm reports nothing for the
/// operations in flight on the connection the killed process's kernel closed, so they fail at the
/// quiet timeout; what holds then is that timeout (and a second).
fn dead_bound() -> Duration {
    if std::env::var_os(ENV_REMOTE).is_some() {
        Duration::from_millis(QUIET_MS_TWO_HOSTS) + Duration::from_secs(1)
    } else {
        BOUND
    }
}

fn pattern(src: usize, chunk: usize, i: usize) -> u8 {
    (src as u8)
        .wrapping_mul(53)
        .wrapping_add((chunk as u8).wrapping_mul(29))
        .wrapping_add((i as u8).wrapping_mul(7))
        .wrapping_add((i >> 8) as u8)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine (namespaces too).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// The hub's framing and the child side of its rounds: tests/hub_common.
mod hub_common;
use hub_common::{fail, hub_round, note, HUB, ME};

struct Pe {
    me: usize,
    t: Arc<Transport>,
    heap: Vec<u64>,
    own: Box<MemHandle>,
    handles: Vec<MemHandle>,
    bases: Vec<u64>,
}

impl Pe {
    fn at(&self, off: usize) -> *mut u8 {
        assert!(off < HEAP);
        // SAFETY: inside the heap.
        unsafe { (self.heap.as_ptr() as *mut u8).add(off) }
    }

    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= HEAP);
        // SAFETY: in bounds; read once the writers' quiet and a barrier are behind us.
        unsafe { std::slice::from_raw_parts(self.at(off), len) }
    }

    fn rma(
        &mut self,
        pe: usize,
        opc: i32,
        roff: usize,
        loff: usize,
        len: usize,
        ep: usize,
    ) -> bool {
        let mut r = RmaMemdesc {
            ptr: (self.bases[pe] + roff as u64) as *mut c_void,
            offset: roff as u64,
            handle: &mut self.handles[pe],
        };
        let mut l = RmaMemdesc {
            ptr: self.at(loff) as *mut c_void,
            offset: 0,
            handle: &mut *self.own,
        };
        let verb = RmaVerb {
            op: opc,
            is_nbi: 1,
            is_stream: 0,
            cstrm: std::ptr::null_mut(),
        };
        let bytes = RmaBytesdesc {
            nelems: len,
            elembytes: 1,
            srcstride: 1,
            deststride: 1,
        };
        // SAFETY: descriptors live for the call; buffers are in the registered heap, which lives
        // until the transport is shut down.
        unsafe { self.t.rma(pe as i32, verb, &mut r, &mut l, bytes, ep) }.is_ok()
    }

    fn add(&mut self, pe: usize, roff: usize, val: u64) -> bool {
        let mut m = AmoMemdesc {
            remote: RmaMemdesc {
                ptr: (self.bases[pe] + roff as u64) as *mut c_void,
                offset: roff as u64,
                handle: &mut self.handles[pe],
            },
            retflag: 0,
            retptr: std::ptr::null_mut(),
            valptr: std::ptr::null_mut(),
            cmpptr: std::ptr::null_mut(),
            val,
            cmp: 0,
            ret_handle: &mut *self.own,
        };
        let verb = AmoVerb {
            op: amo::ADD,
            is_fetch: 0,
            is_val: 1,
            is_cmp: 0,
        };
        // SAFETY: the descriptor lives for the call.
        unsafe { self.t.amo(pe as i32, verb, &mut m, 8, EP_HOST) }.is_ok()
    }

    /// One round towards `p`: K puts, G gets, A AMOs, then quiet on both endpoints. `Ok` when
    /// everything succeeded; `Err` with the first failure otherwise.
    fn round(&mut self, p: usize, r: u64) -> Result<(), String> {
        let me = self.me;
        for j in 0..K {
            let src = SRC_OFF + ((r as usize + j) % K) * CH;
            if !self.rma(p, op::PUT, PUT_OFF + (me * K + j) * CH, src, CH, EP_PROXY) {
                return Err(format!("put {j} of round {r} refused"));
            }
        }
        for j in 0..G {
            let dst = GET_OFF + (p * G + j) * CH;
            if !self.rma(p, op::GET, SRC_OFF + j * CH, dst, CH, EP_HOST) {
                return Err(format!("get {j} of round {r} refused"));
            }
        }
        for j in 0..A {
            if !self.add(p, AMO_OFF + me * 8, 1) {
                return Err(format!("AMO {j} of round {r} refused"));
            }
        }
        for ep in [EP_PROXY, EP_HOST] {
            self.t
                .quiet_pe(ep, p as i32)
                .map_err(|e| format!("quiet(PE {p}, endpoint {ep}): {}", e.message))?;
        }
        Ok(())
    }
}

/// One endpoint's accounting, read from the transport's description.
#[derive(Clone, Copy, Debug)]
struct Acct {
    in_flight: u64,
    submitted: u64,
    completed: u64,
    /// Contexts waiting for an answer (target-applied AMOs, staged puts and gets).
    waiting: u64,
}

fn accounting(t: &Transport) -> Vec<Acct> {
    let d = t.describe();
    let num = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|w| w.parse().ok())
    };
    let need = |line: &str, key: &str| {
        num(line, key).unwrap_or_else(|| fail(&format!("no {key:?} in {line:?}")))
    };
    d.lines()
        .filter(|l| l.trim_start().starts_with("ep "))
        .map(|l| Acct {
            in_flight: need(l, "in flight "),
            submitted: need(l, "submitted "),
            completed: need(l, "completed "),
            waiting: num(l, "waiting for an answer: ").unwrap_or(0),
        })
        .collect()
}

fn child_main(me: usize, sock: &str, dir: &Path) {
    ME.set(me).unwrap();
    let mut s = UnixStream::connect(sock).unwrap_or_else(|e| fail(&format!("connect {sock}: {e}")));
    s.write_all(&(me as u32).to_le_bytes()).unwrap();
    HUB.set(Mutex::new(s)).ok();

    // The library's log, as the C ABI's init sets it up (NVSHMEM_DEBUG, NVSHMEM_EFA_LOG).
    nvshmem_efa_gda::log::init();
    let cfg = Config::from_env().unwrap_or_else(|e| fail(&format!("config: {e}")));
    let t = Arc::new(Transport::new(cfg).unwrap_or_else(|e| fail(&e.message)));
    // On tcp the library's load-time hook raised rxm's eager limit (unless kept) before
    // libfabric read it.
    if std::env::var("NVSHMEM_LIBFABRIC_PROVIDER").as_deref() == Ok("tcp") {
        let kept = std::env::var("NVSHMEM_EFA_RXM_EAGER").is_ok();
        let eager = nvshmem_efa_gda::fabric::rxm::configured();
        let want = (!kept).then_some(nvshmem_efa_gda::fabric::rxm::EAGER_LIMIT);
        if eager != want {
            fail(&format!(
                "FI_OFI_RXM_BUFFER_SIZE is {eager:?}, want {want:?} (NVSHMEM_EFA_RXM_EAGER {})",
                if kept { "=keep" } else { "unset" }
            ));
        }
    }
    let ag = |send: &[u8], recv: &mut [u8]| {
        let all = hub_round("lib", send);
        if all.len() != recv.len() {
            fail(&format!(
                "allgather: {} bytes for {}",
                all.len(),
                recv.len()
            ));
        }
        recv.copy_from_slice(&all);
        Ok(())
    };
    t.connect(me as i32, NP as i32, &ag)
        .unwrap_or_else(|e| fail(&format!("connect: {}", e.message)));
    note(&t.route().to_string());
    let mut pe = Pe {
        me,
        t: t.clone(),
        heap: vec![0u64; HEAP / 8],
        own: Box::new(MemHandle {
            reserved: [0; MEM_HANDLE_SIZE],
        }),
        handles: Vec::new(),
        bases: Vec::new(),
    };
    // SAFETY: the heap outlives the registration (the transport is shut down first).
    unsafe { t.get_mem_handle(&mut *pe.own, pe.at(0) as *mut c_void, HEAP, false) }
        .unwrap_or_else(|e| fail(&format!("get_mem_handle: {}", e.message)));
    for c in 0..K {
        for i in 0..CH {
            // SAFETY: inside the heap, before anyone reads it.
            unsafe { *pe.at(SRC_OFF + c * CH + i) = pattern(me, c, i) };
        }
    }
    let mut mine = pe.own.reserved.to_vec();
    mine.extend_from_slice(&(pe.at(0) as u64).to_le_bytes());
    let all = hub_round("setup", &mine);
    let rec = MEM_HANDLE_SIZE + 8;
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
    // Contexts held while idle (the receives posted for active messages).
    let idle: Vec<u64> = accounting(&t).iter().map(|a| a.in_flight).collect();
    hub_round("stream", &[]);
    // The transport goes with the PE (finalize drops it, as NVSHMEM's finalize does).
    drop(t);
    stream(pe, dir, &idle);
}

fn stream(mut pe: Pe, dir: &Path, idle: &[u64]) {
    let me = pe.me;
    let started = Instant::now();
    let live: Vec<usize> = (0..NP).filter(|&p| p != me && p != DEAD).collect();
    let mut first_fail: Option<(u64, String)> = None;
    let mut rounds = 0u64;
    let mut after = 0u64;
    let mut slowest_dead = Duration::ZERO;
    let mut slowest_live = Duration::ZERO;
    let mut dead_calls = 0u64;
    loop {
        for p in (0..NP).filter(|&p| p != me) {
            let t0 = Instant::now();
            let res = pe.round(p, rounds);
            let dt = t0.elapsed();
            if p != DEAD {
                if let Err(e) = res {
                    fail(&format!("round {rounds} with live PE {p}: {e}"));
                }
                slowest_live = slowest_live.max(dt);
                for j in 0..G {
                    let got = pe.bytes(GET_OFF + (p * G + j) * CH, CH);
                    if (0..CH).any(|i| got[i] != pattern(p, j, i)) {
                        fail(&format!(
                            "round {rounds}: get {j} from PE {p} returned wrong bytes"
                        ));
                    }
                }
                continue;
            }
            // me == DEAD streams until it is killed; the others watch it fail.
            if me == DEAD {
                if let Err(e) = res {
                    fail(&format!(
                        "the victim saw a failure before it was killed: {e}"
                    ));
                }
                continue;
            }
            if first_fail.is_some() {
                dead_calls += 1;
                slowest_dead = slowest_dead.max(dt);
            }
            if dt > dead_bound() {
                fail(&format!(
                    "round {rounds} towards the dead PE took {dt:?} (bound {:?}): {res:?}",
                    dead_bound()
                ));
            }
            if let (Err(e), None) = (res, &first_fail) {
                first_fail = Some((mono_ns(), e));
            }
        }
        rounds += 1;
        if first_fail.is_some() {
            after += 1;
        }
        if me != DEAD && after >= ROUNDS_AFTER {
            break;
        }
        if started.elapsed() > STREAM_LIMIT {
            fail(&match &first_fail {
                None => format!("no failure towards PE {DEAD} after {rounds} rounds in {STREAM_LIMIT:?}"),
                Some(_) => format!(
                    "only {after} of {ROUNDS_AFTER} rounds after PE {DEAD} failed, in {STREAM_LIMIT:?}"
                ),
            });
        }
    }
    let (failed_at, why) = first_fail.expect("loop ends after a failure");
    let killed_at: u64 = std::fs::read_to_string(dir.join("killed_at"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fail("the hub wrote no kill time"));
    if failed_at < killed_at {
        fail(&format!(
            "operations to PE {DEAD} failed {:?} before it was killed: {why}",
            Duration::from_nanos(killed_at - failed_at)
        ));
    }
    let latency = Duration::from_nanos(failed_at - killed_at);
    note(&format!(
        "PE {DEAD} failed {latency:?} after the kill ({why}); {rounds} rounds, {after} after the \
         failure; slowest round: live {slowest_live:?}, dead {slowest_dead:?} ({dead_calls} after the failure)"
    ));
    if latency > dead_bound() {
        fail(&format!(
            "the death was seen {latency:?} after the kill (bound {:?})",
            dead_bound()
        ));
    }

    // Everyone's stream is over; each says how many rounds it made.
    let all = hub_round("report", &rounds.to_le_bytes());
    // The hub answers in PE order: the survivors' counts.
    let made: HashMap<usize, u64> = (0..NP)
        .filter(|&p| p != DEAD)
        .enumerate()
        .map(|(k, p)| {
            (
                p,
                u64::from_le_bytes(all[k * 8..k * 8 + 8].try_into().unwrap()),
            )
        })
        .collect();
    for &p in &live {
        let last = made[&p] - 1;
        let slot = PUT_OFF + p * K * CH;
        let got = pe.bytes(slot, K * CH);
        for j in 0..K {
            let c = (last as usize + j) % K;
            if (0..CH).any(|i| got[j * CH + i] != pattern(p, c, i)) {
                fail(&format!(
                    "PE {p}'s last put {j} (round {last}) is not in the heap"
                ));
            }
        }
        let n = u64::from_le_bytes(pe.bytes(AMO_OFF + p * 8, 8).try_into().unwrap());
        if n != made[&p] * A as u64 {
            fail(&format!(
                "AMOs from PE {p}: counter {n}, want {} ({} rounds x {A})",
                made[&p] * A as u64,
                made[&p]
            ));
        }
    }
    // Nothing leaks: every operation, failed ones included, completed, and the contexts come back
    // to what the endpoints held while idle (answers to the peers' last operations may still be on
    // their way out: they get `BOUND`). That includes the contexts waiting for an answer the dead
    // PE never sent (target-applied AMOs, staged puts and gets): they are released when the peer
    // is declared gone (a late answer names a generation of its context that no longer exists).
    let t0 = Instant::now();
    loop {
        let acct = accounting(&pe.t);
        if acct.len() != idle.len() {
            fail(&format!("endpoints {acct:?}, idle {idle:?}"));
        }
        let settled = acct
            .iter()
            .zip(idle)
            .all(|(a, &i)| a.submitted == a.completed && a.in_flight == i && a.waiting == 0);
        if settled || t0.elapsed() > BOUND {
            for (ep, (a, &i)) in acct.iter().zip(idle).enumerate() {
                note(&format!("endpoint {ep}: {a:?} (idle {i})"));
                if !(a.submitted == a.completed && a.in_flight == i && a.waiting == 0) {
                    note(&pe.t.describe());
                    fail(&format!(
                        "endpoint {ep} {:?} after the stream: {a:?}, idle {i}",
                        t0.elapsed()
                    ));
                }
            }
            break;
        }
        let _ = pe.t.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    hub_round("verified", &[]);
    let t0 = Instant::now();
    pe.t.shutdown();
    // The last reference: endpoints close (shm unlinks its regions), before the heap goes.
    let Pe { t, heap, .. } = pe;
    if Arc::strong_count(&t) != 1 {
        fail("the transport is still shared at finalize");
    }
    drop(t);
    drop(heap);
    let dt = t0.elapsed();
    note(&format!("finalize took {dt:?}"));
    if dt > BOUND {
        fail(&format!(
            "finalize with a dead peer took {dt:?} (bound {BOUND:?})"
        ));
    }
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------
/// How the PEs are placed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    SameHost,
    TwoHosts,
}

struct Job {
    label: String,
    children: Vec<Child>,
    streams: Vec<Option<UnixStream>>,
    output: Vec<Arc<Mutex<String>>>,
    started: Instant,
}

impl Job {
    fn abort(&mut self, why: &str) -> ! {
        for c in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(200));
        // LOAD_DEATH_LOGS=DIR keeps every PE's whole output there (pe<N>.log).
        if let Some(d) = std::env::var_os("LOAD_DEATH_LOGS") {
            for (pe, o) in self.output.iter().enumerate() {
                let _ = std::fs::write(
                    Path::new(&d).join(format!("pe{pe}.log")),
                    o.lock().unwrap().as_bytes(),
                );
            }
        }
        let mut s = format!(
            "{}: {why} (after {:?})\n",
            self.label,
            self.started.elapsed()
        );
        for (pe, o) in self.output.iter().enumerate() {
            let o = o.lock().unwrap();
            let lines: Vec<&str> = o.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
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

/// The process that runs the PE: the child itself, or (two hosts) the process of this test
/// binary below it (`ip netns exec` and `unshare` may each fork; the PE is PID 1 of its PID
/// namespace, so killing it ends that namespace).
fn pe_pid(child: &Child, layout: Layout) -> Option<libc::pid_t> {
    let pid = child.id();
    if layout == Layout::SameHost {
        return Some(pid as libc::pid_t);
    }
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let mut todo = vec![pid];
        while let Some(p) = todo.pop() {
            let is_pe = std::fs::read_link(format!("/proc/{p}/exe"))
                .ok()
                .and_then(|e| e.canonicalize().ok())
                .is_some_and(|e| e == exe);
            if is_pe {
                return Some(p as libc::pid_t);
            }
            let kids =
                std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
            todo.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn run_job(
    provider: &'static str,
    layout: Layout,
    mode: Mode,
    test_name: &str,
    wrap: &[Vec<String>],
    iface: &[String],
) {
    let label = format!("{provider} ({layout:?}, {mode:?})");
    // One directory per job: the staged and direct variants of a provider run at the same time.
    let dir = std::env::temp_dir().join(format!(
        "load-death-{}-{provider}-{layout:?}-{mode:?}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("job directory");
    let sock = dir.join("hub.sock");
    let listener = UnixListener::bind(&sock).expect("bind hub socket");
    let exe = std::env::current_exe().expect("test executable");
    let mut job = Job {
        label: label.clone(),
        children: Vec::new(),
        streams: (0..NP).map(|_| None).collect(),
        output: Vec::new(),
        started: Instant::now(),
    };
    for pe in 0..NP {
        let mut argv: Vec<String> = wrap[pe].clone();
        argv.push(exe.display().to_string());
        argv.extend(
            [
                test_name,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ]
            .map(String::from),
        );
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env(ENV_PE, pe.to_string())
            .env(ENV_SOCK, &sock)
            .env(ENV_DIR, &dir)
            .env("NVSHMEM_LIBFABRIC_PROVIDER", provider)
            .env("NVSHMEM_EFA_GDA", "off")
            .env(
                "NVSHMEM_EFA_QUIET_TIMEOUT_MS",
                match layout {
                    Layout::SameHost => QUIET_MS,
                    Layout::TwoHosts => QUIET_MS_TWO_HOSTS,
                }
                .to_string(),
            )
            .env("FI_TCP_IFACE", &iface[pe])
            .env(
                "NVSHMEM_EFA_GPU_STAGING",
                if mode == Mode::Direct { "0" } else { "1" },
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if layout == Layout::TwoHosts {
            cmd.env(ENV_REMOTE, "1");
        }
        if mode == Mode::StagedSar {
            cmd.env("NVSHMEM_EFA_RXM_EAGER", "keep");
        }
        let mut child = cmd.spawn().expect("spawn a PE");
        let out = hub_common::capture_stderr(&mut child);
        job.children.push(child);
        job.output.push(out);
    }
    if let Err(e) = hub_common::accept_all(&listener, &mut job.streams, ROUND_LIMIT) {
        job.abort(&e);
    }
    let pids: Vec<libc::pid_t> = (0..NP)
        .map(|pe| {
            pe_pid(&job.children[pe], layout)
                .unwrap_or_else(|| job.abort(&format!("no process for PE {pe}")))
        })
        .collect();
    let all: Vec<usize> = (0..NP).collect();
    job.serve_until("setup", &all);
    job.serve_until("stream", &all);
    std::thread::sleep(KILL_AFTER);
    let killed_at = mono_ns();
    // SAFETY: the victim's process (a child of this process, or of the unshare that is).
    unsafe { libc::kill(pids[DEAD], libc::SIGKILL) };
    std::fs::write(dir.join("killed_at"), killed_at.to_string()).expect("write the kill time");
    let st = job.wait_exit(DEAD, Duration::from_secs(30));
    if st.success() {
        job.abort("the victim exited normally: it was not killed mid-stream");
    }
    job.streams[DEAD] = None;
    let survivors: Vec<usize> = (0..NP).filter(|&p| p != DEAD).collect();
    job.serve_until("report", &survivors);
    job.serve_until("verified", &survivors);
    for &pe in &survivors {
        let st = job.wait_exit(pe, Duration::from_secs(30));
        if !st.success() {
            job.abort(&format!("survivor PE {pe} exited with {st}"));
        }
    }
    // shm: a survivor's regions (named after its PID) go with its finalize; the victim's stay
    // behind (it was killed) and are removed here.
    if provider == "shm" {
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        for (pe, pid) in pids.iter().enumerate() {
            let mine: Vec<&String> = left
                .iter()
                .filter(|n| n.starts_with(&format!("{pid}:")))
                .collect();
            if pe == DEAD {
                for n in mine {
                    let _ = std::fs::remove_file(Path::new("/dev/shm").join(n));
                }
            } else if !mine.is_empty() {
                job.abort(&format!(
                    "survivor PE {pe} left shared memory behind: {mine:?}"
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for o in &job.output {
        for l in o.lock().unwrap().lines().filter(|l| l.starts_with("PE ")) {
            eprintln!("[{label}] {l}");
        }
    }
    eprintln!(
        "[{label}] load and death: survivors passed in {:?}",
        job.started.elapsed()
    );
}

/// Runs the child role when this process is one of the job's PEs; otherwise the parent.
fn child_role() -> bool {
    if let (Ok(pe), Ok(sock), Ok(dir)) = (
        std::env::var(ENV_PE),
        std::env::var(ENV_SOCK),
        std::env::var(ENV_DIR),
    ) {
        child_main(pe.parse().expect("PE number"), &sock, &PathBuf::from(dir));
        return true;
    }
    false
}

fn same_host(provider: &'static str, mode: Mode, test_name: &str) {
    if child_role() {
        return;
    }
    let iface = std::env::var("FI_TCP_IFACE").unwrap_or_else(|_| "lo".into());
    run_job(
        provider,
        Layout::SameHost,
        mode,
        test_name,
        &vec![Vec::new(); NP],
        &vec![iface; NP],
    );
}

#[test]
fn load_death_tcp() {
    same_host("tcp", Mode::Direct, "load_death_tcp");
}

#[test]
fn load_death_shm() {
    same_host("shm", Mode::Direct, "load_death_shm");
}

#[test]
fn load_death_tcp_staged() {
    same_host("tcp", Mode::Staged, "load_death_tcp_staged");
}

#[test]
fn load_death_shm_staged() {
    same_host("shm", Mode::Staged, "load_death_shm_staged");
}

#[test]
#[ignore = "libfabric 2.1's rxm crashes a survivor in about 1 run of 60-100: a connection that \
            closes with a SAR message half received is torn down through a null pointer \
            (rxm_close_conn, deferred_sar_msgs; docs/staged-path.md)"]
fn load_death_tcp_staged_sar() {
    same_host("tcp", Mode::StagedSar, "load_death_tcp_staged_sar");
}

// ---------------------------------------------------------------------------------------------
// Two hosts: a namespace per PE on a bridge
// ---------------------------------------------------------------------------------------------
const SUBNET: &str = "198.51.100";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {} ({})",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))
    }
}

/// The namespaces of one job (the bridge's and one per PE); removed on drop, veths with them.
struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.0 {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Sets up the hosts; `Err` when namespaces, veths or bridges are not permitted here.
fn hosts(pid: u32) -> Result<(Netns, Vec<String>, Vec<String>), String> {
    let sw = format!("ldsw{pid}");
    ip(&["netns", "add", &sw])?;
    let mut guard = Netns(vec![sw.clone()]);
    ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", &sw, "link", "set", "br0", "up"])?;
    let mut ifaces = Vec::new();
    let mut names = Vec::new();
    for pe in 0..NP {
        let ns = format!("ld{pid}h{pe}");
        ip(&["netns", "add", &ns])?;
        guard.0.push(ns.clone());
        let (a, b) = (format!("ld{pe}a{pid}"), format!("ld{pe}b{pid}"));
        let (a, b) = (&a[..a.len().min(15)], &b[..b.len().min(15)]);
        ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
        let addr = format!("{SUBNET}.{}/24", pe + 1);
        for step in [
            vec!["link", "set", a, "netns", &ns],
            vec!["link", "set", b, "netns", &sw],
            vec!["-n", &sw, "link", "set", b, "master", "br0"],
            vec!["-n", &sw, "link", "set", b, "up"],
            vec!["-n", &ns, "addr", "add", &addr, "dev", a],
            vec!["-n", &ns, "link", "set", a, "up"],
            vec!["-n", &ns, "link", "set", "lo", "up"],
        ] {
            ip(&step)?;
        }
        ifaces.push(a.to_string());
        names.push(ns);
    }
    Ok((guard, names, ifaces))
}

/// Each PE on a host of its own: its network namespace, and new UTS (host name) and PID
/// namespaces, so that neither the data mover (host identity) nor the liveness checks (`/proc`)
/// take a peer for a local one.
#[test]
#[ignore = "needs CAP_NET_ADMIN and CAP_SYS_ADMIN, and is not yet reliable: in 1 of 17 runs one \
            PE saw no error from tcp;ofi_rxm for the killed PE and waited out every quiet timeout \
            (docs/routing.md)"]
fn load_death_tcp_two_hosts() {
    if child_role() {
        return;
    }
    let pid = std::process::id();
    let (guard, names, ifaces) = match hosts(pid) {
        Ok(h) => h,
        Err(e) => {
            println!("SKIP: network namespaces, veth pairs or bridges not permitted: {e}");
            return;
        }
    };
    if Command::new("unshare").arg("--version").output().is_err() {
        println!("SKIP: unshare not found");
        return;
    }
    let wrap: Vec<Vec<String>> = (0..NP)
        .map(|pe| {
            [
                "ip",
                "netns",
                "exec",
                &names[pe],
                "unshare",
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                "sh",
                "-c",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("hostname loadhost{pe} && exec \"$0\" \"$@\"")])
            .collect()
        })
        .collect();
    run_job(
        "tcp",
        Layout::TwoHosts,
        Mode::Direct,
        "load_death_tcp_two_hosts",
        &wrap,
        &ifaces,
    );
    drop(guard);
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let list = String::from_utf8_lossy(&list.stdout);
    for n in &names {
        assert!(
            !list.lines().any(|l| l.split_whitespace().next() == Some(n)),
            "namespace {n} left behind"
        );
    }
}
