//! Shared harness of the fabric tests that run several processes: a scratch directory, files written
//! atomically and awaited with a deadline, child processes re-executed from the test binary, and a
//! `Node` (one endpoint with one registered heap) that tracks completions while it drives progress.
//!
//! Included by `fabric_multiproc.rs` and `fabric_netns.rs` as `mod common`; built on its own it runs
//! the self-tests of the helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::fabric::{
    flags, AddressVector, AtomicOp, CompletionQueue, CqEntry, CqError, Datatype, Domain, Endpoint,
    Fabric, FiAddr, Info, InfoRequest, MemKind, MemoryRegion, OpContexts, Provider,
};

/// Rank of a child process (absent in the parent and in a plain test run).
pub const ENV_RANK: &str = "FABRIC_TEST_RANK";
/// Number of ranks.
pub const ENV_NRANKS: &str = "FABRIC_TEST_NRANKS";
/// Shared scratch directory.
pub const ENV_DIR: &str = "FABRIC_TEST_DIR";
/// Provider name (`tcp`, `shm`).
pub const ENV_PROVIDER: &str = "FABRIC_TEST_PROVIDER";
/// Comma-separated phases of the scenario to run (default: all of `ALL_PHASES`).
pub const ENV_PHASES: &str = "FABRIC_TEST_PHASES";
/// Every phase of the scenario, in the order they run.
pub const ALL_PHASES: &str = "write,read,writedata,sendrecv,atomics";

/// Longest any single wait may take.
pub const WAIT: Duration = Duration::from_secs(60);

/// Line a child prints when its whole scenario passed; the parent requires it.
pub fn ok_marker(rank: usize) -> String {
    format!("FABRIC-CHILD rank {rank} OK")
}

// ---------------------------------------------------------------------------------------------
// Scratch directory and files
// ---------------------------------------------------------------------------------------------

/// A scratch directory removed on drop (kept when the thread is panicking, for post-mortem).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/<prefix>-<pid>-<nanos>`.
    pub fn new(prefix: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Writes `dir/name` atomically: to a temporary name first, then renamed.
pub fn write_atomic(dir: &Path, name: &str, contents: &str) {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    fs::write(&tmp, contents).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    fs::rename(&tmp, dir.join(name)).unwrap_or_else(|e| panic!("rename to {name}: {e}"));
}

/// Reads `dir/name` once it exists, calling `idle` between looks; `Err` after `deadline`.
pub fn wait_file(
    dir: &Path,
    name: &str,
    deadline: Instant,
    mut idle: impl FnMut(),
) -> Result<String, String> {
    let path = dir.join(name);
    loop {
        match fs::read_to_string(&path) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for {}", path.display()));
        }
        idle();
    }
}

/// `key=value` lines.
pub fn encode_record(fields: &[(&str, String)]) -> String {
    let mut s = String::new();
    for (k, v) in fields {
        assert!(
            !k.contains('=') && !v.contains('\n'),
            "bad record field {k}={v}"
        );
        writeln!(s, "{k}={v}").expect("write to String");
    }
    s
}

/// Parses `key=value` lines.
pub fn decode_record(s: &str) -> HashMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn field<'a>(rec: &'a HashMap<String, String>, key: &str) -> &'a str {
    rec.get(key)
        .unwrap_or_else(|| panic!("record lacks {key}: {rec:?}"))
}

fn field_u64(rec: &HashMap<String, String>, key: &str) -> u64 {
    let v = field(rec, key);
    v.parse()
        .unwrap_or_else(|e| panic!("record field {key}={v}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

/// One child to start: its rank, extra environment, and an optional command prefix (for example
/// `ip netns exec <ns>`).
pub struct ChildSpec {
    pub rank: usize,
    pub env: Vec<(String, String)>,
    pub prefix: Vec<String>,
}

struct Running {
    rank: usize,
    child: Child,
    out: PathBuf,
    status: Option<std::process::ExitStatus>,
}

/// Starts every child as `<prefix> <this test binary> --exact <test> --nocapture --test-threads=1`
/// with the rank variables set, waits for all of them (killing the rest as soon as one fails, and
/// all of them at `timeout`), and panics with every child's output unless each exited 0 and printed
/// its OK line.
pub fn run_children(
    test: &str,
    dir: &Path,
    nranks: usize,
    provider: &str,
    specs: Vec<ChildSpec>,
    timeout: Duration,
) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut running = Vec::new();
    for spec in specs {
        let out = dir.join(format!("rank{}.log", spec.rank));
        let file = fs::File::create(&out).expect("create child log");
        let err = file.try_clone().expect("dup child log");
        let mut cmd = if spec.prefix.is_empty() {
            Command::new(&exe)
        } else {
            let mut c = Command::new(&spec.prefix[0]);
            c.args(&spec.prefix[1..]).arg(&exe);
            c
        };
        cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(ENV_RANK, spec.rank.to_string())
            .env(ENV_NRANKS, nranks.to_string())
            .env(ENV_DIR, dir)
            .env(ENV_PROVIDER, provider)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn rank {}: {e}", spec.rank));
        running.push(Running {
            rank: spec.rank,
            child,
            out,
            status: None,
        });
    }

    let deadline = Instant::now() + timeout;
    let mut failure: Option<String> = None;
    let mut grace: Option<Instant> = None;
    loop {
        for r in running.iter_mut().filter(|r| r.status.is_none()) {
            if let Some(st) = r.child.try_wait().expect("try_wait") {
                r.status = Some(st);
                if !st.success() && failure.is_none() {
                    failure = Some(format!("rank {} exited with {st}", r.rank));
                    // Let the others notice the abort file and report their side first.
                    grace = Some(Instant::now() + Duration::from_secs(5));
                }
            }
        }
        if running.iter().all(|r| r.status.is_some()) {
            break;
        }
        let now = Instant::now();
        if now >= deadline || grace.is_some_and(|g| now >= g) {
            if failure.is_none() {
                failure = Some(format!("children still running after {timeout:?}"));
            }
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                let _ = r.child.kill();
                r.status = r.child.wait().ok();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut report = String::new();
    for r in &running {
        let mut text = String::new();
        if let Ok(mut f) = fs::File::open(&r.out) {
            let _ = f.read_to_string(&mut text);
        }
        let st = r
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown".into());
        if failure.is_none() && !text.contains(&ok_marker(r.rank)) {
            failure = Some(format!(
                "rank {} exited 0 without finishing its scenario",
                r.rank
            ));
        }
        writeln!(report, "===== rank {} ({st}) =====\n{text}", r.rank).expect("write to String");
    }
    if let Some(f) = failure {
        let abort = fs::read_to_string(dir.join("abort")).unwrap_or_default();
        panic!("{f}\nfirst abort: {abort}\n{report}");
    }
}

/// Child side: the rank variables, or `None` when this process is not a child.
pub struct ChildEnv {
    pub rank: usize,
    pub nranks: usize,
    pub dir: PathBuf,
    pub provider: Provider,
}

impl ChildEnv {
    pub fn from_env() -> Option<ChildEnv> {
        let rank = std::env::var(ENV_RANK).ok()?;
        let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
        let env = ChildEnv {
            rank: rank.parse().expect("rank"),
            nranks: get(ENV_NRANKS).parse().expect("nranks"),
            dir: PathBuf::from(get(ENV_DIR)),
            provider: Provider::parse(&get(ENV_PROVIDER)).expect("provider"),
        };
        // A panicking child leaves a note so that its peers stop waiting for it at once.
        let dir = env.dir.clone();
        let rank = env.rank;
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Written aside, then linked into place: the first abort wins and is never torn.
            let tmp = dir.join(format!(".abort-{rank}"));
            if fs::write(&tmp, format!("rank {rank}: {info}")).is_ok() {
                let _ = fs::hard_link(&tmp, dir.join("abort"));
                let _ = fs::remove_file(&tmp);
            }
            default(info);
        }));
        Some(env)
    }
}

// ---------------------------------------------------------------------------------------------
// Node: one endpoint, one registered heap, completion tracking
// ---------------------------------------------------------------------------------------------

/// A peer as this node addresses it.
#[derive(Clone, Debug)]
pub struct Peer {
    pub fi_addr: FiAddr,
    /// Remote address of the peer's heap offset 0 (virtual address or 0, per FI_MR_VIRT_ADDR).
    pub base: u64,
    pub key: u64,
    pub len: u64,
}

/// A completion of one of our operations, or its error.
pub type Completion = Result<CqEntry, CqError>;

pub struct Node {
    // Drop order matters: the registration and the endpoint close before the contexts and the
    // memory they refer to.
    mr: MemoryRegion,
    pub ep: Endpoint,
    pub cq: Arc<CompletionQueue>,
    pub av: Arc<AddressVector>,
    pub domain: Arc<Domain>,
    pub info: Info,
    pub ctxs: OpContexts,
    heap: Box<[u64]>,
    pub rank: usize,
    pub nranks: usize,
    pub dir: PathBuf,
    pub peers: Vec<Peer>,
    done: HashMap<usize, Completion>,
    /// Completions carrying remote CQ data (writes with data aimed at us).
    pub remote_events: Vec<CqEntry>,
    /// Completions and errors that belong to no operation of ours.
    pub stray: Vec<String>,
    last_abort_check: Instant,
}

impl Node {
    /// Opens the provider's fabric, domain, AV, CQ and endpoint, registers a heap of `heap_bytes`.
    pub fn open(
        provider: &Provider,
        rank: usize,
        nranks: usize,
        dir: &Path,
        heap_bytes: usize,
    ) -> Node {
        let req = InfoRequest {
            provider: provider.clone(),
            hmem: false,
            atomics: true,
            msg: true,
        };
        let info = Info::get(&req).unwrap_or_else(|e| panic!("Info::get({provider}): {e}"));
        let fabric = Fabric::open(info.clone()).unwrap_or_else(|e| panic!("Fabric::open: {e}"));
        let domain = Domain::open(&fabric).unwrap_or_else(|e| panic!("Domain::open: {e}"));
        let av =
            AddressVector::open(&domain, nranks.max(1)).unwrap_or_else(|e| panic!("AV open: {e}"));
        let cq = CompletionQueue::open(&domain, 1024).unwrap_or_else(|e| panic!("CQ open: {e}"));
        let ep = Endpoint::open(&domain, &av, &cq, None)
            .unwrap_or_else(|e| panic!("Endpoint::open: {e}"));
        let heap = vec![0u64; heap_bytes.div_ceil(8)].into_boxed_slice();
        // SAFETY: the heap is a live allocation owned by the node; `mr` is declared before `heap`,
        // so the registration is closed before the memory is freed.
        let mr = unsafe {
            MemoryRegion::register(
                &domain,
                heap.as_ptr() as *const u8,
                heap.len() * 8,
                MemKind::Host,
                true,
                Some(&ep),
            )
        }
        .unwrap_or_else(|e| panic!("MemoryRegion::register: {e}"));
        Node {
            mr,
            ep,
            cq,
            av,
            domain,
            info,
            ctxs: OpContexts::new(512),
            heap,
            rank,
            nranks,
            dir: dir.to_path_buf(),
            peers: Vec::new(),
            done: HashMap::new(),
            remote_events: Vec::new(),
            stray: Vec::new(),
            last_abort_check: Instant::now(),
        }
    }

    /// Publishes this node's name and heap, waits for every rank's, and inserts them into the AV
    /// in rank order.
    pub fn exchange(&mut self) {
        self.publish();
        self.collect();
    }

    /// Writes this node's record (endpoint name, heap address and key) for the others.
    pub fn publish(&mut self) {
        let name = self
            .ep
            .name()
            .unwrap_or_else(|e| panic!("Endpoint::name: {e}"));
        let base = if self.info.virt_addr() {
            self.heap_base() as u64
        } else {
            0
        };
        let rec = encode_record(&[
            ("name", hex(&name)),
            ("base", base.to_string()),
            ("key", self.mr.key().to_string()),
            ("len", self.heap_len().to_string()),
            ("provider", self.info.provider_name()),
        ]);
        write_atomic(&self.dir, &format!("addr-{}", self.rank), &rec);
    }

    /// Waits for every rank's record and inserts the names into the AV in rank order.
    pub fn collect(&mut self) {
        let mut names = Vec::new();
        let mut recs = Vec::new();
        for r in 0..self.nranks {
            let s = self.wait_named_file(&format!("addr-{r}"));
            let rec = decode_record(&s);
            let n = unhex(field(&rec, "name"));
            assert_eq!(
                field(&rec, "provider"),
                self.info.provider_name(),
                "rank {r} runs another provider"
            );
            if let Some(first) = names.first() {
                assert_eq!(
                    Vec::len(first),
                    n.len(),
                    "endpoint names of different lengths"
                );
            }
            names.push(n);
            recs.push(rec);
        }
        let flat: Vec<u8> = names.concat();
        let addrs = self
            .av
            .insert(&flat, self.nranks)
            .unwrap_or_else(|e| panic!("AV insert of {} names: {e}", self.nranks));
        self.peers = recs
            .iter()
            .zip(addrs)
            .map(|(rec, fi_addr)| Peer {
                fi_addr,
                base: field_u64(rec, "base"),
                key: field_u64(rec, "key"),
                len: field_u64(rec, "len"),
            })
            .collect();
    }

    pub fn heap_base(&self) -> *mut u8 {
        self.heap.as_ptr() as *mut u8
    }

    pub fn heap_len(&self) -> usize {
        self.heap.len() * 8
    }

    pub fn desc(&self) -> *mut c_void {
        self.mr.desc()
    }

    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Pointer into the heap, bounds-checked.
    pub fn at(&self, off: usize, len: usize) -> *mut u8 {
        assert!(
            off.checked_add(len)
                .is_some_and(|end| end <= self.heap_len()),
            "heap range {off}+{len}"
        );
        // SAFETY: in bounds, checked above.
        unsafe { self.heap_base().add(off) }
    }

    /// Copies heap bytes out (volatile: remote writes land here behind the compiler's back).
    pub fn read_bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let p = self.at(off, len);
        // SAFETY: `at` checked the range; the bytes are plain data.
        (0..len)
            .map(|i| unsafe { std::ptr::read_volatile(p.add(i)) })
            .collect()
    }

    /// Fills heap bytes with `f(i)`.
    pub fn fill(&self, off: usize, len: usize, f: impl Fn(usize) -> u8) {
        let p = self.at(off, len);
        for i in 0..len {
            // SAFETY: `at` checked the range.
            unsafe { std::ptr::write_volatile(p.add(i), f(i)) };
        }
    }

    pub fn read_u64(&self, off: usize) -> u64 {
        assert!(off % 8 == 0);
        // SAFETY: in bounds and 8-byte aligned (the heap is a u64 slice).
        unsafe { std::ptr::read_volatile(self.at(off, 8) as *const u64) }
    }

    pub fn write_u64(&self, off: usize, v: u64) {
        assert!(off % 8 == 0);
        // SAFETY: as in read_u64.
        unsafe { std::ptr::write_volatile(self.at(off, 8) as *mut u64, v) }
    }

    /// Remote address of `off` in `rank`'s heap.
    pub fn raddr(&self, rank: usize, off: usize) -> u64 {
        self.peers[rank].base + off as u64
    }

    /// Reads the CQ once, sorting what it returns into our completions, remote CQ data events and
    /// strays. Returns how many entries it saw.
    pub fn progress(&mut self) -> usize {
        let mut buf: [CqEntry; 16] = [CqEntry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
        }; 16];
        match self.cq.read(&mut buf) {
            Ok(n) => {
                for e in &buf[..n] {
                    if self.ctxs.get(e.op_context).is_some() {
                        self.done.insert(e.op_context as usize, Ok(*e));
                    } else if e.flags & flags::REMOTE_CQ_DATA != 0 {
                        self.remote_events.push(*e);
                    } else {
                        self.stray.push(format!(
                            "completion flags {:#x} ctx {:p}",
                            e.flags, e.op_context
                        ));
                    }
                }
                n
            }
            Err(e) => {
                if self.ctxs.get(e.context).is_some() {
                    self.done.insert(e.context as usize, Err(e));
                } else {
                    self.stray.push(format!(
                        "error completion: {} (flags {:#x})",
                        e.error, e.flags
                    ));
                }
                1
            }
        }
    }

    /// Fails at once if a peer has aborted (checked every few milliseconds).
    fn check_abort(&mut self) {
        if self.last_abort_check.elapsed() < Duration::from_millis(10) {
            return;
        }
        self.last_abort_check = Instant::now();
        if let Ok(s) = fs::read_to_string(self.dir.join("abort")) {
            panic!("rank {} stops: a peer aborted: {s}", self.rank);
        }
    }

    /// Drives progress until `cond` holds; panics naming `what` after `WAIT`.
    pub fn wait_until(&mut self, what: &str, mut cond: impl FnMut(&mut Node) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if cond(self) {
                return;
            }
            if self.progress() == 0 {
                std::thread::yield_now();
            }
            self.check_abort();
            if Instant::now() >= deadline {
                panic!(
                    "rank {}: timed out after {WAIT:?} waiting for {what}",
                    self.rank
                );
            }
        }
    }

    fn wait_named_file(&mut self, name: &str) -> String {
        let deadline = Instant::now() + WAIT;
        let dir = self.dir.clone();
        let mut result = None;
        // Progress and the abort check run between looks at the file.
        while result.is_none() {
            match wait_file(&dir, name, Instant::now(), || {}) {
                Ok(s) => result = Some(s),
                Err(_) if Instant::now() < deadline => {
                    if self.progress() == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    self.check_abort();
                }
                Err(e) => panic!("rank {}: {e}", self.rank),
            }
        }
        result.expect("set above")
    }

    /// All ranks reach `name` (progress is driven while waiting).
    pub fn barrier(&mut self, name: &str) {
        write_atomic(&self.dir, &format!("bar-{name}-{}", self.rank), "");
        for r in 0..self.nranks {
            self.wait_named_file(&format!("bar-{name}-{r}"));
        }
    }

    /// Posts one operation with a fresh context, retrying on -FI_EAGAIN while driving progress.
    pub fn post(
        &mut self,
        what: &str,
        mut op: impl FnMut(&Endpoint, *mut c_void) -> nvshmem_efa_gda::fabric::Result<()>,
    ) -> *mut c_void {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(ctx) = self.ctxs.alloc(0, 0) {
                match op(&self.ep, ctx) {
                    Ok(()) => return ctx,
                    Err(e) if e.is_again() => {
                        self.ctxs.free(ctx);
                    }
                    Err(e) => {
                        self.ctxs.free(ctx);
                        panic!("rank {}: {what}: {e}", self.rank);
                    }
                }
            }
            self.progress();
            self.check_abort();
            if Instant::now() >= deadline {
                panic!(
                    "rank {}: {what}: still -FI_EAGAIN after {WAIT:?}",
                    self.rank
                );
            }
        }
    }

    /// The completion of the operation posted with `ctx`, if it has arrived (the context is freed).
    pub fn take_done(&mut self, ctx: *mut c_void) -> Option<Completion> {
        let c = self.done.remove(&(ctx as usize))?;
        self.ctxs.free(ctx);
        Some(c)
    }

    /// Waits for the completion of the operation posted with `ctx` and returns it.
    pub fn wait_ctx(&mut self, what: &str, ctx: *mut c_void) -> Completion {
        self.wait_until(what, |n| n.done.contains_key(&(ctx as usize)));
        let c = self.done.remove(&(ctx as usize)).expect("present");
        self.ctxs.free(ctx);
        c
    }

    /// Waits for every context in `ctxs` and panics on any error.
    pub fn wait_all_ok(&mut self, what: &str, ctxs: &[*mut c_void]) -> Vec<CqEntry> {
        ctxs.iter()
            .map(|&c| match self.wait_ctx(what, c) {
                Ok(e) => e,
                Err(e) => panic!("rank {}: {what}: {}", self.rank, e.error),
            })
            .collect()
    }
}

/// A byte pattern that differs by seed and position.
pub fn pattern(seed: u64, i: usize) -> u8 {
    let x =
        (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (x >> 56) as u8 ^ (i as u8)
}

/// First index where `got` differs from `want(i)`, with both bytes.
pub fn first_mismatch(got: &[u8], want: impl Fn(usize) -> u8) -> Option<(usize, u8, u8)> {
    got.iter()
        .enumerate()
        .find(|(i, &b)| b != want(*i))
        .map(|(i, &b)| (i, b, want(i)))
}

// ---------------------------------------------------------------------------------------------
// The scenario every rank runs
// ---------------------------------------------------------------------------------------------

const MIB: usize = 1 << 20;
/// Heap layout.
const INBOX: usize = 0; // writes from the left neighbour land here
const SRC: usize = 2 * MIB; // read by the right neighbour
const LOCAL: usize = 4 * MIB; // write sources, read destinations
const WDATA: usize = 6 * MIB; // write-with-data target
const ATOM: usize = 7 * MIB; // atomic words of rank 0
const ATOM_OPS: usize = ATOM + 4096; // operands and results of this rank's atomics
const MSG_RX: usize = 7 * MIB + 256 * 1024;
const MSG_TX: usize = 7 * MIB + 768 * 1024;
pub const HEAP: usize = 8 * MIB + 256 * 1024;
// The areas do not overlap and fit in the heap.
const _: () = assert!(
    SRC - INBOX >= 2 * MIB && ATOM_OPS + 4096 <= MSG_RX && MSG_TX + 4096 + 200 * 1024 <= HEAP
);

/// RMA sizes exercised (1 B .. 1 MiB, odd sizes included).
pub const RMA_SIZES: [usize; 10] = [1, 3, 8, 64, 1000, 4096, 4097, 65536, 65539, MIB];
const WRITEDATA_LEN: usize = 256;
const SUM_OPS: u64 = 64;
const FADD_OPS: usize = 64;

fn slots() -> Vec<usize> {
    let mut off = 0;
    RMA_SIZES
        .iter()
        .map(|&s| {
            let o = off;
            off += (s + 1 + 63) & !63; // one guard byte after each, 64-byte aligned
            o
        })
        .collect()
}

fn seed(rank: usize, what: u64) -> u64 {
    (rank as u64) << 32 | what
}

/// Runs the scenario (RMA write, RMA read, write with data, send/receive, atomics; or the phases
/// named in `ENV_PHASES`) as one rank, then prints the OK line. Rank 0 is the atomics target; ranks 1.. are the atomics initiators.
/// `check_name` sees this rank's endpoint name before anything is exchanged.
pub fn run_scenario(env: &ChildEnv, expect_provider: &str, check_name: impl Fn(&[u8])) {
    let started = Instant::now();
    let mut node = Node::open(&env.provider, env.rank, env.nranks, &env.dir, HEAP);
    check_name(
        &node
            .ep
            .name()
            .unwrap_or_else(|e| panic!("Endpoint::name: {e}")),
    );
    let info = node.info.clone();
    println!(
        "rank {} provider {} fabric {} domain {} caps {:#x} mr_mode {:#x} delivery_complete {} cq_data_size {} inject {}",
        env.rank,
        info.provider_name(),
        info.fabric_name(),
        info.domain_name(),
        info.caps(),
        info.mr_mode(),
        info.delivery_complete(),
        info.cq_data_size(),
        info.inject_size()
    );
    assert_eq!(info.provider_name(), expect_provider);
    assert!(
        info.cq_data_size() >= 8,
        "{expect_provider} carries only {} bytes of CQ data",
        info.cq_data_size()
    );
    assert!(
        info.has_atomics(),
        "{expect_provider} did not grant FI_ATOMIC: {info:?}"
    );

    let n = env.nranks;
    let me = env.rank;
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let slots = slots();

    // Initial contents, before anybody may touch them.
    node.fill(INBOX, SRC - INBOX, |_| 0xEE);
    node.fill(SRC, 2 * MIB, |i| pattern(seed(me, 1), i));
    node.fill(WDATA, 4096, |_| 0);
    node.fill(ATOM, 4096, |_| 0);
    node.exchange();
    node.barrier("init");

    let phases = std::env::var(ENV_PHASES).unwrap_or_else(|_| ALL_PHASES.to_string());
    let phases: Vec<&str> = phases.split(',').collect();
    for p in &phases {
        assert!(ALL_PHASES.split(',').any(|q| q == *p), "unknown phase {p}");
    }
    let run = |p: &str| phases.contains(&p);
    if run("write") {
        rma_write(&mut node, right, left, &slots);
    }
    if run("read") {
        rma_read(&mut node, left, &slots);
    }
    if run("writedata") {
        write_with_data(&mut node, right, left);
    }
    if run("sendrecv") {
        send_recv(&mut node, right, left);
    }
    if run("atomics") {
        atomics(&mut node);
    }

    node.barrier("end");
    // Drain what is left: nothing may arrive any more.
    for _ in 0..1000 {
        node.progress();
    }
    let wd: Vec<_> = node
        .remote_events
        .iter()
        .map(|e| (e.data, e.flags, e.len))
        .collect();
    let want = usize::from(run("writedata"));
    assert_eq!(
        wd.len(),
        want,
        "rank {me}: expected {want} remote CQ data completion(s), got {wd:x?}"
    );
    assert!(
        node.stray.is_empty(),
        "rank {me}: stray completions: {:?}",
        node.stray
    );
    assert_eq!(
        node.ctxs.in_flight(),
        0,
        "rank {me}: operations still in flight"
    );
    node.barrier("closed");
    println!("rank {me} finished in {:?}", started.elapsed());
    println!("{}", ok_marker(me));
}

fn rma_write(node: &mut Node, right: usize, left: usize, slots: &[usize]) {
    let me = node.rank;
    let desc = node.desc();
    let (fi_addr, key) = (node.peers[right].fi_addr, node.peers[right].key);
    let mut ctxs = Vec::new();
    for (k, (&size, &slot)) in RMA_SIZES.iter().zip(slots).enumerate() {
        let src_off = LOCAL + slot;
        node.fill(src_off, size, |i| pattern(seed(me, 100 + k as u64), i));
        let src = node.at(src_off, size);
        let raddr = node.raddr(right, INBOX + slot);
        ctxs.push(node.post("fi_write", |ep, ctx| {
            // SAFETY: the source lies in the registered heap, which outlives the operation; the
            // context comes from the node's pool and is reaped by wait_all_ok below.
            unsafe { ep.write(src, size, desc, fi_addr, raddr, key, ctx) }
        }));
    }
    node.wait_all_ok("fi_write", &ctxs);
    node.barrier("written");

    let check = |node: &Node| -> Option<String> {
        for (k, (&size, &slot)) in RMA_SIZES.iter().zip(slots).enumerate() {
            let got = node.read_bytes(INBOX + slot, size + 1);
            if let Some((i, g, w)) =
                first_mismatch(&got[..size], |i| pattern(seed(left, 100 + k as u64), i))
            {
                return Some(format!(
                    "write of {size} B from rank {left}: byte {i} is {g:#x}, want {w:#x}"
                ));
            }
            if got[size] != 0xEE {
                return Some(format!(
                    "write of {size} B from rank {left} ran over its end"
                ));
            }
        }
        None
    };
    if node.info.delivery_complete() {
        // Delivery complete: the writer's completion already meant the data was here.
        if let Some(err) = check(node) {
            panic!("rank {me}: {err}");
        }
    } else {
        let mut last = None;
        node.wait_until("RMA writes to land", |n| {
            last = check(n);
            last.is_none()
        });
    }
    println!(
        "rank {me}: RMA write of {} sizes (1 B .. 1 MiB) from rank {left} verified",
        RMA_SIZES.len()
    );
}

fn rma_read(node: &mut Node, left: usize, slots: &[usize]) {
    let me = node.rank;
    let desc = node.desc();
    let (fi_addr, key) = (node.peers[left].fi_addr, node.peers[left].key);
    let roff = |k: usize| (k * 4099) % 8192 + k; // unaligned remote offsets inside SRC
    let mut ctxs = Vec::new();
    for (k, (&size, &slot)) in RMA_SIZES.iter().zip(slots).enumerate() {
        node.fill(LOCAL + slot, size + 1, |_| 0x11);
        let dst = node.at(LOCAL + slot, size);
        let raddr = node.raddr(left, SRC + roff(k));
        ctxs.push(node.post("fi_read", |ep, ctx| {
            // SAFETY: the destination lies in the registered heap, which outlives the operation;
            // the context is reaped by wait_all_ok below.
            unsafe { ep.read(dst, size, desc, fi_addr, raddr, key, ctx) }
        }));
    }
    node.wait_all_ok("fi_read", &ctxs);
    for (k, (&size, &slot)) in RMA_SIZES.iter().zip(slots).enumerate() {
        let got = node.read_bytes(LOCAL + slot, size + 1);
        if let Some((i, g, w)) =
            first_mismatch(&got[..size], |i| pattern(seed(left, 1), roff(k) + i))
        {
            panic!("rank {me}: read of {size} B from rank {left}: byte {i} is {g:#x}, want {w:#x}");
        }
        assert_eq!(
            got[size], 0x11,
            "rank {me}: read of {size} B ran over its end"
        );
    }
    node.barrier("read");
    println!(
        "rank {me}: RMA read of {} sizes from rank {left} verified",
        RMA_SIZES.len()
    );
}

/// The 64-bit value rank `r` sends as remote CQ data (high bits set on purpose).
fn cq_value(r: usize) -> u64 {
    0xC0DE_0000_0000_0000 | (r as u64) << 16 | 0xA5
}

fn write_with_data(node: &mut Node, right: usize, left: usize) {
    let me = node.rank;
    let desc = node.desc();
    let (fi_addr, key) = (node.peers[right].fi_addr, node.peers[right].key);
    node.fill(LOCAL, WRITEDATA_LEN, |i| pattern(seed(me, 200), i));
    let src = node.at(LOCAL, WRITEDATA_LEN);
    let raddr = node.raddr(right, WDATA);
    let value = cq_value(me);
    let ctx = node.post("fi_writedata", |ep, ctx| {
        // SAFETY: the source lies in the registered heap; the context is reaped just below.
        unsafe { ep.write_data(src, WRITEDATA_LEN, desc, value, fi_addr, raddr, key, ctx) }
    });
    node.wait_all_ok("fi_writedata", &[ctx]);

    node.wait_until("the remote CQ data completion", |n| {
        !n.remote_events.is_empty()
    });
    let e = node.remote_events[0];
    assert_eq!(
        e.data,
        cq_value(left),
        "rank {me}: remote CQ data {:#x}",
        e.data
    );
    assert!(e.flags & flags::REMOTE_CQ_DATA != 0);
    let got = node.read_bytes(WDATA, WRITEDATA_LEN);
    if let Some((i, g, w)) = first_mismatch(&got, |i| pattern(seed(left, 200), i)) {
        panic!("rank {me}: write-with-data payload byte {i} is {g:#x}, want {w:#x}");
    }
    node.barrier("writedata");
    println!(
        "rank {me}: write with data {:#x} from rank {left} seen (flags {:#x})",
        e.data, e.flags
    );
}

// Atomic words of rank 0.
const W_SUM: usize = ATOM;
const W_FADD: usize = ATOM + 8;
const W_CAS: usize = ATOM + 16;
fn w_own(r: usize) -> usize {
    ATOM + 64 + 8 * r
}
// Operands and results of an initiator.
const O_SUM: usize = ATOM_OPS; // SUM_OPS operands
const O_ONE: usize = ATOM_OPS + 512;
const O_FADD: usize = ATOM_OPS + 1024; // FADD_OPS results
const O_CAS: usize = ATOM_OPS + 2048; // compare/swap operands and results
const O_SUMRES: usize = ATOM_OPS + 3072; // discarded old values of the shm adds (SUM_OPS slots)

fn atomic_op(
    node: &mut Node,
    what: &str,
    f: impl FnMut(&Endpoint, *mut c_void) -> nvshmem_efa_gda::fabric::Result<()>,
) -> *mut c_void {
    node.post(what, f)
}

fn atomics(node: &mut Node) {
    let me = node.rank;
    let n = node.nranks;
    let (a, f, _) = node.ep.atomic_valid(Datatype::U64, AtomicOp::Sum);
    let (_, _, c) = node.ep.atomic_valid(Datatype::U64, AtomicOp::Cswap);
    assert!(
        a && f && c,
        "rank {me}: u64 SUM/fetch-SUM/CSWAP not valid: {a} {f} {c}"
    );
    let desc = node.desc();
    let (dst, key) = (node.peers[0].fi_addr, node.peers[0].key);
    let initiators = n - 1;

    if me != 0 {
        // 1. SUM_OPS non-fetching adds, all in flight at once, from every initiator at once.
        let mut ctxs = Vec::new();
        for j in 0..SUM_OPS {
            let off = O_SUM + 8 * j as usize;
            node.write_u64(off, me as u64 * 1000 + j);
            let buf = node.at(off, 8);
            let raddr = node.raddr(0, W_SUM);
            // libfabric 2.1's shm releases the inject buffer of a non-fetching atomic sent with
            // FI_DELIVERY_COMPLETE (the layer's default) twice, so later atomics share a buffer and
            // sums come out wrong. On shm the add is therefore a fetching add whose old value is
            // discarded (as the transport does); the other providers use fi_atomic.
            let shm = node.info.provider_name() == "shm";
            let res = node.at(O_SUMRES + 8 * j as usize, 8);
            ctxs.push(atomic_op(node, "fi_atomic(SUM)", |ep, ctx| {
                // SAFETY: operand and result slot in the registered heap, context reaped by
                // wait_all_ok.
                unsafe {
                    if shm {
                        ep.fetch_atomic(
                            buf,
                            desc,
                            res,
                            desc,
                            dst,
                            raddr,
                            key,
                            Datatype::U64,
                            AtomicOp::Sum,
                            ctx,
                        )
                    } else {
                        ep.atomic(
                            buf,
                            desc,
                            dst,
                            raddr,
                            key,
                            Datatype::U64,
                            AtomicOp::Sum,
                            ctx,
                        )
                    }
                }
            }));
        }
        node.wait_all_ok("fi_atomic(SUM)", &ctxs);

        // 2. FADD_OPS fetch-adds of 1, each into its own result slot.
        node.write_u64(O_ONE, 1);
        let one = node.at(O_ONE, 8);
        let mut ctxs = Vec::new();
        for j in 0..FADD_OPS {
            node.write_u64(O_FADD + 8 * j, u64::MAX);
            let res = node.at(O_FADD + 8 * j, 8);
            let raddr = node.raddr(0, W_FADD);
            ctxs.push(atomic_op(node, "fi_fetch_atomic(SUM)", |ep, ctx| {
                // SAFETY: operand and result in the registered heap, context reaped below.
                unsafe {
                    ep.fetch_atomic(
                        one,
                        desc,
                        res,
                        desc,
                        dst,
                        raddr,
                        key,
                        Datatype::U64,
                        AtomicOp::Sum,
                        ctx,
                    )
                }
            }));
        }
        node.wait_all_ok("fi_fetch_atomic(SUM)", &ctxs);
        let fetched: Vec<u64> = (0..FADD_OPS)
            .map(|j| node.read_u64(O_FADD + 8 * j))
            .collect();

        // 3. Compare-swap on this rank's own word: 0 -> 100+me succeeds, then 0 -> 7 fails.
        let own = cas(node, w_own(me), 0, 100 + me as u64);
        assert_eq!(own, 0, "rank {me}: CAS on a zero word returned {own}");
        let again = cas(node, w_own(me), 0, 7);
        assert_eq!(
            again,
            100 + me as u64,
            "rank {me}: failing CAS returned {again}"
        );

        // 4. Contested compare-swap 0 -> me: exactly one initiator wins.
        let contested = cas(node, W_CAS, 0, me as u64);
        let list: Vec<String> = fetched.iter().map(u64::to_string).collect();
        let rec = encode_record(&[("fadd", list.join(",")), ("cas", contested.to_string())]);
        write_atomic(&node.dir, &format!("atom-{me}"), &rec);
    }
    node.barrier("atomics");

    let expected_sum: u64 = (1..n as u64)
        .map(|r| (0..SUM_OPS).map(|j| r * 1000 + j).sum::<u64>())
        .sum();
    let total_fadd = (FADD_OPS * initiators) as u64;
    let mut winner = 0;
    if me == 0 {
        wait_u64(node, W_SUM, expected_sum, "sum of all FI_SUM operands");
        wait_u64(node, W_FADD, total_fadd, "count of all fetch-adds");
        let mut all = Vec::new();
        let mut cas_results = Vec::new();
        for r in 1..n {
            let rec = decode_record(
                &fs::read_to_string(node.dir.join(format!("atom-{r}"))).expect("atom file"),
            );
            all.extend(
                field(&rec, "fadd")
                    .split(',')
                    .map(|v| v.parse::<u64>().expect("u64")),
            );
            cas_results.push((r, field_u64(&rec, "cas")));
            assert_eq!(
                node.read_u64(w_own(r)),
                100 + r as u64,
                "own CAS word of rank {r}"
            );
        }
        all.sort_unstable();
        let want: Vec<u64> = (0..total_fadd).collect();
        assert_eq!(
            all, want,
            "fetch-add results are not exactly 0..{total_fadd}, each once"
        );
        winner = node.read_u64(W_CAS);
        assert!(
            (1..n as u64).contains(&winner),
            "contested CAS word holds {winner}"
        );
        for (r, got) in &cas_results {
            if *r as u64 == winner {
                assert_eq!(*got, 0, "winner rank {r} fetched {got}");
            } else {
                assert_eq!(
                    *got, winner,
                    "loser rank {r} fetched {got}, the word held {winner}"
                );
            }
        }
        println!(
            "rank 0: {initiators} initiators: sum {expected_sum} exact, {total_fadd} fetch-add results distinct, CAS won by rank {winner}"
        );
    }
    node.barrier("atomics-checked");

    // 5. A compare-swap that must fail on the contested word: it returns the winner, changes nothing.
    if me != 0 {
        let got = cas(node, W_CAS, u64::MAX - 1, 999);
        assert!(
            got != 0 && got != 999 && got < n as u64,
            "rank {me}: failing CAS fetched {got}"
        );
    }
    node.barrier("cas-fail");
    if me == 0 {
        assert_eq!(
            node.read_u64(W_CAS),
            winner,
            "a failing CAS changed the word"
        );
        assert_eq!(
            node.read_u64(W_SUM),
            expected_sum,
            "the sum changed after the fact"
        );
    }
}

/// Compare-swap of the u64 at `off` in rank 0's heap; returns the value fetched.
fn cas(node: &mut Node, off: usize, compare: u64, swap: u64) -> u64 {
    let desc = node.desc();
    let (dst, key) = (node.peers[0].fi_addr, node.peers[0].key);
    node.write_u64(O_CAS, swap);
    node.write_u64(O_CAS + 8, compare);
    node.write_u64(O_CAS + 16, 0xDEAD_BEEF);
    let (buf, cmp, res) = (
        node.at(O_CAS, 8),
        node.at(O_CAS + 8, 8),
        node.at(O_CAS + 16, 8),
    );
    let raddr = node.raddr(0, off);
    let ctx = node.post("fi_compare_atomic", |ep, ctx| {
        // SAFETY: operands and result in the registered heap; the context is reaped just below.
        unsafe {
            ep.compare_atomic(
                buf,
                desc,
                cmp,
                desc,
                res,
                desc,
                dst,
                raddr,
                key,
                Datatype::U64,
                ctx,
            )
        }
    });
    node.wait_all_ok("fi_compare_atomic", &[ctx]);
    node.read_u64(O_CAS + 16)
}

fn wait_u64(node: &mut Node, off: usize, want: u64, what: &str) {
    // Shorter than the peers' barrier wait, so that a wrong value is reported as such first.
    let deadline = Instant::now() + WAIT / 4;
    loop {
        let got = node.read_u64(off);
        if got == want {
            return;
        }
        if Instant::now() >= deadline {
            panic!("rank {}: {what}: word holds {got}, want {want}", node.rank);
        }
        node.progress();
        node.check_abort();
    }
}

fn send_recv(node: &mut Node, right: usize, left: usize) {
    const SMALL: usize = 1000;
    const LARGE: usize = 200 * 1024;
    const RX: usize = 256 * 1024;
    let me = node.rank;
    let desc = node.desc();
    let mut rx = Vec::new();
    for b in 0..2 {
        let off = MSG_RX + b * RX;
        node.fill(off, RX, |_| 0);
        let buf = node.at(off, RX);
        let ctx = node.post("fi_recv", |ep, ctx| {
            // SAFETY: the buffer lies in the registered heap; the context is reaped below.
            unsafe { ep.recv(buf, RX, desc, ctx) }
        });
        rx.push((ctx, off));
    }
    node.barrier("recv-posted");

    let dest = node.peers[right].fi_addr;
    let mut tx = Vec::new();
    for (off, len) in [(MSG_TX, SMALL), (MSG_TX + 4096, LARGE)] {
        node.fill(off, len, |i| pattern(seed(me, 300 + len as u64), i));
        let buf = node.at(off, len);
        tx.push(node.post("fi_send", |ep, ctx| {
            // SAFETY: the buffer lies in the registered heap; the context is reaped below.
            unsafe { ep.send(buf, len, desc, dest, ctx) }
        }));
    }
    node.wait_all_ok("fi_send", &tx);

    let mut lens = Vec::new();
    for (ctx, off) in rx {
        let e = match node.wait_ctx("fi_recv", ctx) {
            Ok(e) => e,
            Err(e) => panic!("rank {me}: receive failed: {}", e.error),
        };
        assert!(
            e.flags & flags::RECV != 0 && e.flags & flags::MSG != 0,
            "recv flags {:#x}",
            e.flags
        );
        assert!(
            e.len == SMALL || e.len == LARGE,
            "rank {me}: received {} bytes",
            e.len
        );
        let got = node.read_bytes(off, e.len + 1);
        if let Some((i, g, w)) = first_mismatch(&got[..e.len], |i| {
            pattern(seed(left, 300 + e.len as u64), i)
        }) {
            panic!(
                "rank {me}: message of {} B: byte {i} is {g:#x}, want {w:#x}",
                e.len
            );
        }
        assert_eq!(
            got[e.len], 0,
            "rank {me}: message of {} B ran over its end",
            e.len
        );
        lens.push(e.len);
    }
    lens.sort_unstable();
    assert_eq!(lens, [SMALL, LARGE], "rank {me}: received lengths");
    node.barrier("sendrecv");
    println!("rank {me}: send/recv of {SMALL} B and {LARGE} B from rank {left} verified");
}

#[cfg(test)]
mod helper_tests {
    use super::*;

    #[test]
    fn record_roundtrip_and_hex() {
        let name = vec![0u8, 1, 0xfe, 0xff, 0x10];
        let s = encode_record(&[("name", hex(&name)), ("key", "42".into())]);
        let r = decode_record(&s);
        assert_eq!(unhex(field(&r, "name")), name);
        assert_eq!(field_u64(&r, "key"), 42);
    }

    #[test]
    fn wait_file_is_bounded_and_sees_atomic_writes() {
        let dir = TempDir::new("fabric-helper");
        let t = Instant::now();
        let err = wait_file(
            dir.path(),
            "never",
            Instant::now() + Duration::from_millis(100),
            || std::thread::sleep(Duration::from_millis(5)),
        )
        .unwrap_err();
        assert!(err.contains("timed out"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
        write_atomic(dir.path(), "x", "hello");
        assert_eq!(
            wait_file(dir.path(), "x", Instant::now(), || {}).unwrap(),
            "hello"
        );
        assert!(
            fs::read_dir(dir.path()).unwrap().count() == 1,
            "temporary file left behind"
        );
    }

    #[test]
    fn rma_slots_do_not_overlap_and_fit() {
        let s = slots();
        for k in 1..s.len() {
            // Room for the previous write and its guard byte.
            assert!(s[k] > s[k - 1] + RMA_SIZES[k - 1]);
        }
        assert!(s[s.len() - 1] + RMA_SIZES[s.len() - 1] < SRC - INBOX);
    }
}
