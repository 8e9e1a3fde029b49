//! The ABI-independent transport: every NVSHMEM host op, implemented once over the fabric layer.
//! The per-ABI adapters (`v3.rs`, `v4.rs`) only translate arguments.
//!
//! Endpoints: index 0 serves host-initiated operations, index 1 NVSHMEM's proxy thread (device-
//! initiated operations). Peer `pe`'s endpoint `i` is `fi_addr = pe * 2 + i` in the AV. The GPU's own
//! queue (GDA) lives on a third, private endpoint owned by `crate::gda`.
//!
//! Completion accounting: every posted operation takes a context from the endpoint's pool and bumps
//! `submitted`; whoever reaps its completion (a caller of quiet/progress, or the progress thread)
//! bumps `completed` (and `errors` for a failed one). quiet waits, bounded, for `completed` to reach
//! the `submitted` it saw on entry. Transmit operations default to FI_DELIVERY_COMPLETE where the
//! provider has it, so a completed put is visible at the target.
//!
//! Atomics: provider atomics when the provider granted FI_ATOMIC and validates the operation for the
//! datatype; otherwise (or with `NVSHMEM_EFA_ATOMICS=target`) an active message to the target PE,
//! which applies it in its progress path under one lock (host memory with CPU atomics, GPU memory
//! with a CUDA copy in and out — no GDRCopy) and answers with the old value. All AMOs to a PE take
//! the same path, so concurrent AMOs from all PEs are exact.
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::abi::{self, amo, op, AmoMemdesc, MemHandle, RmaMemdesc};
use crate::config::{AtomicsPath, Config, GdaMode};
use crate::cuda::{self, PtrKind};
use crate::fabric::{
    sys, AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, Error as FabricError, Fabric,
    FiAddr, Info, InfoRequest, MemKind, MemoryRegion, OpContexts, Provider,
};

/// Endpoint index for host-initiated operations.
pub const EP_HOST: usize = 0;
/// Endpoint index for NVSHMEM's proxy (device-initiated operations).
pub const EP_PROXY: usize = 1;
/// Endpoints per PE.
pub const NUM_EPS: usize = 2;

/// A transport error: the NVSHMEM status code to return, and the message (already logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError {
    /// NVSHMEM status code (`abi::status::*`).
    pub status: i32,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn invalid(message: impl Into<String>) -> TransportError {
    let message = message.into();
    tracing::error!("{message}");
    TransportError {
        status: abi::status::INVALID_VALUE,
        message,
    }
}

fn internal(message: impl Into<String>) -> TransportError {
    let message = message.into();
    tracing::error!("{message}");
    TransportError {
        status: abi::status::INTERNAL,
        message,
    }
}

impl From<FabricError> for TransportError {
    fn from(e: FabricError) -> Self {
        internal(e.to_string())
    }
}

/// Result of a transport op.
pub type TResult<T> = Result<T, TransportError>;

/// The bootstrap allgather: `send` from every PE lands in `recv`, PE by PE.
pub type Allgather<'a> = dyn Fn(&[u8], &mut [u8]) -> TResult<()> + 'a;

const HANDLE_MAGIC: u64 = 0x4144_4741_4645_564e; // "NVEFAGDA"
const HANDLE_VERSION: u32 = 1;
const HANDLE_FLAG_DEVICE: u32 = 1;

/// What this transport writes into NVSHMEM's 512-byte opaque handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HandleBlob {
    magic: u64,
    version: u32,
    flags: u32,
    base: u64,
    len: u64,
    keys: [u64; NUM_EPS],
    reg_id: u64,
    cookie: u64,
    pe: i32,
    reserved: i32,
}

const _: () = assert!(std::mem::size_of::<HandleBlob>() <= abi::MEM_HANDLE_SIZE);

impl HandleBlob {
    fn write(&self, h: &mut MemHandle) {
        h.reserved = [0; abi::MEM_HANDLE_SIZE];
        // SAFETY: HandleBlob is plain data smaller than the handle (asserted above).
        unsafe { std::ptr::write_unaligned(h.reserved.as_mut_ptr() as *mut HandleBlob, *self) }
    }

    /// Reads a blob out of a handle; `None` unless it carries this transport's magic and version.
    fn read(h: *const MemHandle) -> Option<HandleBlob> {
        if h.is_null() {
            return None;
        }
        // SAFETY: NVSHMEM hands us pointers to 512-byte handles; the blob fits inside.
        let b = unsafe { std::ptr::read_unaligned((*h).reserved.as_ptr() as *const HandleBlob) };
        (b.magic == HANDLE_MAGIC && b.version == HANDLE_VERSION && b.len > 0).then_some(b)
    }

    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }
}

/// A local registration.
struct Registration {
    base: u64,
    len: u64,
    device: bool,
    /// One region, or one per endpoint for FI_MR_ENDPOINT providers.
    mrs: Vec<MemoryRegion>,
}

impl Registration {
    fn desc(&self, ep: usize) -> *mut c_void {
        // Staged GPU memory has no provider registration (and needs no descriptor).
        match self.mrs.len() {
            0 => std::ptr::null_mut(),
            n => self.mrs[ep.min(n - 1)].desc(),
        }
    }
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }
}

// Context tags.
const TAG_OP: u64 = 1;
const TAG_AM_SEND: u64 = 2;
const TAG_AM_RECV: u64 = 3;
const TAG_AM_WAIT: u64 = 4;
const TAG_SLOT_SEND: u64 = 5;

// Active-message format (64 bytes, in a context's scratch space).
const AM_MAGIC: u32 = 0x4d41_4645; // "EFAM"
const AM_REQ: u32 = 1;
const AM_RESP: u32 = 2;
/// Header of every active message; staged payloads follow it.
const AM_BYTES: usize = 64;
/// Size of a receive or send slot: a header plus up to `STAGE_CHUNK` payload bytes.
const STAGE_BYTES: usize = 64 << 10;
/// Payload bytes per staged message.
const STAGE_CHUNK: usize = STAGE_BYTES - AM_BYTES;
const AM_RECV_BUFS: usize = 64;
const SEND_SLOTS: usize = 32;
/// Staged put: payload to write at `addr`; answered by AM_RESP.
const AM_PUT: u32 = 3;
/// Staged get: `size` bytes at `addr` wanted; answered by AM_GET_DATA.
const AM_GET: u32 = 4;
/// Staged get answer: payload (or a status).
const AM_GET_DATA: u32 = 5;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AmMsg {
    magic: u32,
    kind: u32,
    /// Initiator's waiting context (returned in the response).
    token: u64,
    op: i32,
    size: u32,
    addr: u64,
    val: u64,
    cmp: u64,
    /// Response: old value; request: initiator PE.
    result: u64,
    status: i32,
    reserved: u32,
}
const _: () = assert!(std::mem::size_of::<AmMsg>() <= AM_BYTES);

/// One endpoint with its completion bookkeeping.
struct EpState {
    /// Page-locks of the host slabs below for the driver's copies (dropped before them).
    _pins: Vec<cuda::HostPin>,
    ep: Endpoint,
    cq: Arc<CompletionQueue>,
    ctxs: OpContexts,
    /// Registration of the context slab (operands live there) for FI_MR_LOCAL providers.
    ctx_mr: Option<MemoryRegion>,
    submitted: AtomicU64,
    completed: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Registered bounce buffer for unregistered local memory.
    bounce: Mutex<Option<(Box<[u8]>, MemoryRegion)>>,
    /// AM receive buffers (registered) and responses waiting to be sent.
    am_bufs: Option<(Box<[u8]>, MemoryRegion)>,
    am_pending: Mutex<VecDeque<Pending>>,
    /// Registered send slots for staged payloads, and the free ones.
    send_slab: (Box<[u8]>, MemoryRegion),
    send_free: Mutex<Vec<usize>>,
}

/// Messages the progress path owes a peer (sent as soon as resources allow).
enum Pending {
    /// A header-only message.
    Msg(FiAddr, AmMsg),
    /// Data for a staged get.
    GetData {
        dest: FiAddr,
        token: u64,
        addr: u64,
        len: u32,
    },
}

const BOUNCE_BYTES: usize = 4 << 20;

impl EpState {
    /// Counts a failed operation; quiet reports it with this message.
    fn record_error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::AcqRel);
        *self.last_error.lock() = Some(msg);
    }

    /// The context waiting for an answer with this token, and its data; `None` (logged) when the
    /// token names no waiting context.
    fn waiting(&self, token: u64, what: &str) -> Option<(*mut c_void, u64)> {
        let wait = token as *mut c_void;
        match self.ctxs.get(wait) {
            Some((TAG_AM_WAIT, data)) => Some((wait, data)),
            Some(_) => {
                tracing::error!("{what} for a context that is not waiting");
                None
            }
            None => {
                tracing::error!("{what} for an unknown token {token:#x}");
                None
            }
        }
    }

    /// Completes a waiting context (counted for quiet).
    fn finish_wait(&self, wait: *mut c_void) {
        self.ctxs.free(wait);
        self.completed.fetch_add(1, Ordering::AcqRel);
    }

    fn ctx_desc(&self) -> *mut c_void {
        self.ctx_mr
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.desc())
    }

    /// Sends `msg` from the scratch space of `ctx` (a context of this endpoint that the send's
    /// completion gives back). The caller frees `ctx` when this fails.
    fn send_from_scratch(
        &self,
        ctx: *mut c_void,
        dest: FiAddr,
        msg: AmMsg,
    ) -> crate::fabric::Result<()> {
        let s = self.ctxs.scratch(ctx).expect("own context");
        // SAFETY: scratch is 64 bytes owned by the context until its completion.
        unsafe {
            std::ptr::write_unaligned(s as *mut AmMsg, msg);
            self.ep.send(
                s as *const u8,
                std::mem::size_of::<AmMsg>(),
                self.ctx_desc(),
                dest,
                ctx,
            )
        }
    }
}

/// State that exists once endpoints are connected.
struct Connected {
    my_pe: i32,
    n_pes: i32,
    _av: Arc<AddressVector>,
    eps: Vec<EpState>,
    addrs: Vec<FiAddr>,
}

/// The transport.
pub struct Transport {
    cfg: Config,
    provider: Provider,
    domain: Arc<Domain>,
    info: Info,
    use_provider_atomics: bool,
    /// GPU memory is moved by staged messages instead of the provider's HMEM path.
    staging: bool,
    cookie: u64,
    conn: OnceLock<Connected>,
    regs: RwLock<HashMap<u64, Arc<Registration>>>,
    next_reg: AtomicU64,
    am_lock: Mutex<()>,
    stop: Arc<AtomicBool>,
    progress_thread: Mutex<Option<JoinHandle<()>>>,
    cuda_ctx: AtomicU64,
    gda_heap_set: AtomicBool,
}

fn provider_request(p: &Provider) -> InfoRequest {
    InfoRequest {
        provider: p.clone(),
        hmem: true,
        atomics: true,
        msg: true,
    }
}

fn open_info(cfg: &Config) -> TResult<(Provider, Info)> {
    let candidates: Vec<Provider> = match &cfg.provider {
        Some(p) => vec![p.clone()],
        None => Provider::auto_order().to_vec(),
    };
    let mut errors = Vec::new();
    for p in candidates {
        // Prefer FI_HMEM; software providers without it still serve host memory.
        let mut req = provider_request(&p);
        match Info::get(&req) {
            Ok(i) => return Ok((p, i)),
            Err(e) => errors.push(e.to_string()),
        }
        req.hmem = false;
        match Info::get(&req) {
            Ok(i) => return Ok((p, i)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(internal(format!(
        "no usable libfabric provider: {}",
        errors.join("; ")
    )))
}

impl Transport {
    /// Opens fabric and domain for the configured provider.
    pub fn new(cfg: Config) -> TResult<Transport> {
        let (provider, info) = open_info(&cfg)?;
        tracing::info!(
            "provider {} (fabric {}, domain {}): hmem={} atomics={} delivery_complete={} mr_mode={:#x}",
            info.provider_name(),
            info.fabric_name(),
            info.domain_name(),
            info.has_hmem(),
            info.has_atomics(),
            info.delivery_complete(),
            info.mr_mode()
        );
        let use_provider_atomics = match cfg.atomics {
            AtomicsPath::Target => false,
            AtomicsPath::Provider => {
                if !info.has_atomics() {
                    return Err(internal(format!(
                        "NVSHMEM_EFA_ATOMICS=provider but provider {} has no FI_ATOMIC",
                        provider
                    )));
                }
                true
            }
            // Provider atomics by default only where the NIC applies them (verbs, cxi). The
            // software-emulated atomics of the other providers go through the target's progress
            // engine anyway, and target-applied AMOs serialise every AMO into a PE under one lock,
            // GPU memory included, with no GDRCopy. (`provider` still selects them; on shm
            // non-fetching atomics are then issued as fetching ones, see amo_provider.)
            AtomicsPath::Auto => {
                info.has_atomics() && matches!(provider, Provider::Verbs | Provider::Cxi)
            }
        };
        // Software providers copy GPU memory with cudaMemcpy on the legacy default stream, which waits
        // for the application's running kernel - the one waiting in quiet for this very copy. They get
        // staged GPU transfers; NIC providers write GPU memory themselves (GPUDirect RDMA).
        let staging = match cfg.gpu_staging {
            Some(v) => v,
            None => !matches!(
                provider,
                Provider::EfaDirect | Provider::Verbs | Provider::Cxi
            ),
        };
        let fabric = Fabric::open(info.clone())?;
        let domain = Domain::open(&fabric)?;
        let cookie = {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64)
                ^ ((std::process::id() as u64) << 32)
                ^ (&domain as *const _ as u64)
        };
        // Staged RMA and target-applied AMOs copy GPU memory through the driver from the proxy path.
        crate::cuda::module_loading::report(staging || !use_provider_atomics);
        Ok(Transport {
            cfg,
            provider,
            domain,
            info,
            use_provider_atomics,
            staging,
            cookie,
            conn: OnceLock::new(),
            regs: RwLock::new(HashMap::new()),
            next_reg: AtomicU64::new(1),
            am_lock: Mutex::new(()),
            stop: Arc::new(AtomicBool::new(false)),
            progress_thread: Mutex::new(None),
            cuda_ctx: AtomicU64::new(0),
            gda_heap_set: AtomicBool::new(false),
        })
    }

    /// The provider in use.
    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether AMOs use provider atomics (else target-applied active messages).
    pub fn uses_provider_atomics(&self) -> bool {
        self.use_provider_atomics
    }

    fn conn(&self) -> TResult<&Connected> {
        self.conn
            .get()
            .ok_or_else(|| internal("transport used before connect_endpoints"))
    }

    /// Access bits for a peer (NVSHMEM's libfabric transport reports the same).
    pub fn can_reach_peer(&self) -> i32 {
        abi::cap::CPU_WRITE | abi::cap::CPU_READ | abi::cap::CPU_ATOMICS
    }

    /// Whether endpoints are connected.
    pub fn is_connected(&self) -> bool {
        self.conn.get().is_some()
    }

    /// Creates both endpoints, exchanges addresses through `allgather`, fills the AV, posts AM
    /// receive buffers, starts the progress thread and sets up GDA on its own endpoint.
    pub fn connect(
        self: &Arc<Self>,
        my_pe: i32,
        n_pes: i32,
        allgather: &Allgather<'_>,
    ) -> TResult<()> {
        if self.conn.get().is_some() {
            return Err(internal("connect_endpoints called twice"));
        }
        if n_pes <= 0 || my_pe < 0 || my_pe >= n_pes {
            return Err(invalid(format!(
                "connect_endpoints: bad my_pe {my_pe} / n_pes {n_pes}"
            )));
        }
        let n = n_pes as usize;
        let av = AddressVector::open(&self.domain, n * NUM_EPS)?;
        let mut eps = Vec::with_capacity(NUM_EPS);
        for _ in 0..NUM_EPS {
            let cq = CompletionQueue::open(&self.domain, self.cfg.max_inflight.max(1024))?;
            let ep = Endpoint::open(&self.domain, &av, &cq, None)?;
            let ctxs = OpContexts::new(self.cfg.max_inflight);
            let ctx_mr = if self.info.mr_local() {
                let (p, len) = ctxs.region();
                // SAFETY: the slab lives in EpState next to its registration and outlives it (field order).
                Some(unsafe {
                    MemoryRegion::register(&self.domain, p, len, MemKind::Host, false, Some(&ep))?
                })
            } else {
                None
            };
            // Host slabs owned by EpState together with their registrations.
            let slab = |bytes: usize| -> TResult<(Box<[u8]>, MemoryRegion)> {
                let buf = vec![0u8; bytes].into_boxed_slice();
                // SAFETY: the slab moves into EpState with its registration and outlives it.
                let mr = unsafe {
                    MemoryRegion::register(
                        &self.domain,
                        buf.as_ptr(),
                        buf.len(),
                        MemKind::Host,
                        false,
                        Some(&ep),
                    )?
                };
                Ok((buf, mr))
            };
            let mut send_slab = slab(SEND_SLOTS * STAGE_BYTES)?;
            let mut am_bufs = slab(AM_RECV_BUFS * STAGE_BYTES)?;
            // Staged GPU data is copied out of the send slots and into place from the receive
            // buffers: pinned memory makes those copies DMA.
            let pins = [&mut send_slab.0, &mut am_bufs.0]
                .into_iter()
                .filter_map(|b| cuda::HostPin::new(b.as_mut_ptr(), b.len()))
                .collect();
            let am_bufs = Some(am_bufs);
            eps.push(EpState {
                _pins: pins,
                ep,
                cq,
                ctxs,
                ctx_mr,
                submitted: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                last_error: Mutex::new(None),
                bounce: Mutex::new(None),
                am_bufs,
                am_pending: Mutex::new(VecDeque::new()),
                send_slab,
                send_free: Mutex::new((0..SEND_SLOTS).rev().collect()),
            });
        }
        // Exchange names: fixed-size slots so every PE's allgather has the same byte count.
        let names: Vec<Vec<u8>> = eps.iter().map(|e| e.ep.name()).collect::<Result<_, _>>()?;
        let slot = names.iter().map(|v| v.len()).max().unwrap_or(0);
        let mut mine = vec![0u8; 8 + NUM_EPS * slot];
        mine[0..4].copy_from_slice(&(slot as u32).to_le_bytes());
        mine[4..8].copy_from_slice(&(my_pe as u32).to_le_bytes());
        for (i, nm) in names.iter().enumerate() {
            mine[8 + i * slot..8 + i * slot + nm.len()].copy_from_slice(nm);
        }
        let mut all = vec![0u8; mine.len() * n];
        allgather(&mine, &mut all)?;
        let mut flat = Vec::with_capacity(n * NUM_EPS * slot);
        for pe in 0..n {
            let rec = &all[pe * mine.len()..(pe + 1) * mine.len()];
            let their_slot = u32::from_le_bytes(rec[0..4].try_into().unwrap()) as usize;
            let their_pe = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
            if their_slot != slot || their_pe != pe {
                return Err(internal(format!(
                    "address exchange: PE {pe} sent name size {their_slot} / pe {their_pe} (expected {slot} / {pe}): \
                     mixed providers or a bootstrap that does not order by PE"
                )));
            }
            flat.extend_from_slice(&rec[8..]);
        }
        let addrs = av.insert(&flat, n * NUM_EPS)?;
        let conn = Connected {
            my_pe,
            n_pes,
            _av: av,
            eps,
            addrs,
        };
        for (i, e) in conn.eps.iter().enumerate() {
            self.post_am_recvs(e, i)?;
        }
        if self.conn.set(conn).is_err() {
            return Err(internal("connect_endpoints raced with itself"));
        }
        self.cuda_ctx
            .store(cuda::current_context() as u64, Ordering::Relaxed);
        cuda::set_fallback_context(cuda::current_context());
        if self.cfg.progress_thread {
            self.start_progress_thread();
        }
        tracing::info!(
            "PE {my_pe}/{n_pes}: endpoints connected over {}",
            self.provider
        );
        self.setup_gda(my_pe, n_pes, allgather);
        Ok(())
    }

    fn setup_gda(&self, my_pe: i32, n_pes: i32, allgather: &Allgather<'_>) {
        if self.cfg.gda == GdaMode::Off {
            return;
        }
        // Every PE takes part in the exchange even if its own GDA init failed (empty name), so the
        // collective never hangs; a PE then simply has no GDA.
        let local = match crate::gda::init_internal(&self.domain, &self.cfg) {
            Ok(mode) => {
                tracing::info!("GDA initialised on its own endpoint (mode {mode})");
                crate::gda::address().unwrap_or_default()
            }
            Err(e) => {
                if self.cfg.gda == GdaMode::Hw {
                    tracing::error!("NVSHMEM_EFA_GDA=hw: {e}");
                } else {
                    tracing::warn!("GDA unavailable: {e}");
                }
                Vec::new()
            }
        };
        let mut len = [0u8; 8];
        let mut lens = vec![0u8; 8 * n_pes as usize];
        len.copy_from_slice(&(local.len() as u64).to_le_bytes());
        if allgather(&len, &mut lens).is_err() {
            tracing::warn!("GDA address size exchange failed");
            return;
        }
        let max = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .max()
            .unwrap_or(0) as usize;
        let min = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .min()
            .unwrap_or(0) as usize;
        if max == 0 {
            return;
        }
        let mut mine = local.clone();
        mine.resize(max, 0);
        let mut all = vec![0u8; max * n_pes as usize];
        if allgather(&mine, &mut all).is_err() || min != max {
            tracing::warn!("GDA address exchange failed or some PE has no GDA: GDA disabled");
            crate::gda::fini();
            return;
        }
        if let Err(e) = crate::gda::connect(my_pe, n_pes, &all, None) {
            tracing::warn!("GDA connect failed: {e}");
            crate::gda::fini();
        }
    }

    fn start_progress_thread(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let ctx = self.cuda_ctx.load(Ordering::Relaxed) as usize;
        // A target sees no completion for the RMA aimed at it, so "nothing completed" does not mean
        // idle: with manual data progress (software providers) every incoming write waits for this
        // PE to poll, and a sleeping poller costs each of the initiator's operations a sleep (measured
        // on shm: ~130 us per 8-byte put). Such providers are polled continuously (yielding the CPU
        // between polls, like NVSHMEM's proxy thread); with automatic progress the thread backs off.
        let may_sleep = !self.info.manual_progress()
            && matches!(
                self.provider,
                Provider::EfaDirect | Provider::Verbs | Provider::Cxi
            );
        let h = std::thread::Builder::new()
            .name("nvshmem-efa-progress".into())
            .spawn(move || {
                if let Err(e) = cuda::set_current_context(ctx) {
                    tracing::warn!("progress thread: {e}");
                }
                let mut idle = 0u32;
                while !stop.load(Ordering::Acquire) {
                    let Some(t) = weak.upgrade() else { break };
                    let n = t.progress_all();
                    drop(t);
                    if n > 0 {
                        idle = 0;
                    } else {
                        idle = idle.saturating_add(1);
                        if may_sleep && idle > 2000 {
                            std::thread::sleep(Duration::from_micros(50));
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
            });
        match h {
            Ok(h) => *self.progress_thread.lock() = Some(h),
            Err(e) => tracing::warn!("could not start the progress thread: {e}"),
        }
    }

    /// Drives every endpoint once; returns how many completions were handled.
    pub fn progress_all(&self) -> usize {
        let Some(c) = self.conn.get() else { return 0 };
        (0..c.eps.len()).map(|i| self.progress_ep(c, i)).sum()
    }

    fn progress_ep(&self, c: &Connected, i: usize) -> usize {
        let e = &c.eps[i];
        let mut handled = 0;
        // SAFETY: fi_cq_data_entry is plain data; all-zero is a valid value.
        let mut buf: [CqEntry; 16] = unsafe { std::mem::zeroed() };
        loop {
            match e.cq.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for ent in &buf[..n] {
                        self.complete(c, i, ent.op_context, ent.len, None);
                    }
                    handled += n;
                }
                Err(err) => {
                    handled += 1;
                    if err.context.is_null() {
                        // Not attributable to one operation: record it so quiet reports it.
                        e.record_error(err.error.to_string());
                        tracing::error!("endpoint {i}: {}", err.error);
                        break;
                    }
                    self.complete(c, i, err.context, 0, Some(err.error.to_string()));
                }
            }
        }
        self.flush_am_pending(c, i);
        handled
    }

    /// Handles one completion; `len` is the received length for receives.
    fn complete(
        &self,
        c: &Connected,
        i: usize,
        ctx: *mut c_void,
        len: usize,
        error: Option<String>,
    ) {
        let e = &c.eps[i];
        let Some((tag, data)) = e.ctxs.get(ctx) else {
            tracing::warn!("endpoint {i}: completion with a foreign context {ctx:p}");
            return;
        };
        match tag {
            TAG_OP => {
                if let Some(msg) = error {
                    tracing::error!("endpoint {i}: operation failed: {msg}");
                    e.record_error(msg);
                }
                e.ctxs.free(ctx);
                e.completed.fetch_add(1, Ordering::AcqRel);
            }
            TAG_AM_SEND => {
                if let Some(msg) = error {
                    // A request that never left fails its waiting operation; a lost response
                    // leaves the initiator's quiet to time out and report.
                    tracing::error!("endpoint {i}: active message send failed: {msg}");
                    if data != 0 {
                        self.fail_am_wait(e, data as *mut c_void, msg);
                    }
                }
                e.ctxs.free(ctx);
            }
            TAG_AM_RECV => {
                if let Some(msg) = error {
                    tracing::error!("endpoint {i}: active message receive failed: {msg}");
                } else {
                    self.handle_am(c, i, data as usize, len);
                }
                // Repost the same buffer with the same context.
                if let Some((buf, mr)) = &e.am_bufs {
                    let slot = data as usize;
                    // SAFETY: the buffer slot belongs to this endpoint's registered AM slab.
                    let r = unsafe {
                        e.ep.recv(
                            buf.as_ptr().add(slot * STAGE_BYTES) as *mut u8,
                            STAGE_BYTES,
                            mr.desc(),
                            ctx,
                        )
                    };
                    if let Err(err) = r {
                        tracing::error!(
                            "endpoint {i}: could not repost an AM receive buffer: {err}"
                        );
                        e.ctxs.free(ctx);
                    }
                }
            }
            TAG_SLOT_SEND => {
                if let Some(msg) = error {
                    tracing::error!("endpoint {i}: staged send failed: {msg}");
                    // SAFETY: own context; scratch[0] holds the waiting context (or 0).
                    let wait = e.ctxs.scratch(ctx).map(|s| unsafe { *s }).unwrap_or(0);
                    if wait != 0 {
                        self.fail_am_wait(e, wait as *mut c_void, msg);
                    }
                }
                e.send_free.lock().push(data as usize);
                e.ctxs.free(ctx);
            }
            TAG_AM_WAIT => {
                // Completed by a response (handle_am), never by the CQ.
                tracing::warn!("endpoint {i}: unexpected CQ completion for a waiting AMO");
            }
            _ => {
                tracing::warn!("endpoint {i}: completion with unknown tag {tag}");
                e.ctxs.free(ctx);
            }
        }
    }

    fn fail_am_wait(&self, e: &EpState, wait: *mut c_void, msg: String) {
        if e.ctxs.get(wait).map(|(t, _)| t) == Some(TAG_AM_WAIT) {
            e.record_error(msg);
            e.finish_wait(wait);
        }
    }

    fn post_am_recvs(&self, e: &EpState, i: usize) -> TResult<()> {
        let Some((buf, mr)) = &e.am_bufs else {
            return Ok(());
        };
        for slot in 0..AM_RECV_BUFS {
            let ctx = e.ctxs.alloc(TAG_AM_RECV, slot as u64).ok_or_else(|| {
                internal(format!("endpoint {i}: no context for AM receive buffers"))
            })?;
            // SAFETY: buffer slot inside the registered slab owned by the endpoint state.
            unsafe {
                e.ep.recv(
                    buf.as_ptr().add(slot * STAGE_BYTES) as *mut u8,
                    STAGE_BYTES,
                    mr.desc(),
                    ctx,
                )?
            };
        }
        Ok(())
    }

    /// Applies an AM request, or completes a waiting AMO with a response.
    fn handle_am(&self, c: &Connected, i: usize, slot: usize, len: usize) {
        let e = &c.eps[i];
        let Some((buf, _)) = &e.am_bufs else { return };
        // SAFETY: slot < AM_RECV_BUFS; the receive completed, so the provider is done writing it.
        let m: AmMsg = unsafe {
            std::ptr::read_unaligned(buf.as_ptr().add(slot * STAGE_BYTES) as *const AmMsg)
        };
        if m.magic != AM_MAGIC || len < std::mem::size_of::<AmMsg>() {
            tracing::error!("endpoint {i}: dropped a {len}-byte message without the AM header");
            return;
        }
        let carries_payload = matches!(m.kind, AM_PUT | AM_GET_DATA);
        if carries_payload && (m.size as usize > STAGE_CHUNK || len < AM_BYTES + m.size as usize) {
            let msg = format!(
                "endpoint {i}: staged message of {len} bytes announces {} payload bytes",
                m.size
            );
            tracing::error!("{msg}");
            if m.kind == AM_GET_DATA {
                self.fail_am_wait(e, m.token as *mut c_void, msg);
            }
            // A truncated put is not answered: its initiator's quiet reports the loss at its bound.
            return;
        }
        match m.kind {
            AM_REQ => {
                let src_pe = m.result as i64;
                let (status, old) = match self.apply_local_amo(m.op, m.size, m.addr, m.val, m.cmp) {
                    Ok(old) => (0, old),
                    Err(err) => {
                        tracing::error!("AMO from PE {src_pe}: {}", err.message);
                        (err.status, 0)
                    }
                };
                if src_pe < 0 || src_pe >= c.n_pes as i64 {
                    tracing::error!("AM request from out-of-range PE {src_pe}");
                    return;
                }
                let resp = AmMsg {
                    magic: AM_MAGIC,
                    kind: AM_RESP,
                    token: m.token,
                    result: old,
                    status,
                    ..Default::default()
                };
                let dest = c.addrs[src_pe as usize * NUM_EPS + i];
                e.am_pending.lock().push_back(Pending::Msg(dest, resp));
            }
            AM_RESP => {
                let Some((wait, retptr)) = e.waiting(m.token, "AM response") else {
                    return;
                };
                // SAFETY: own waiting context; scratch[0] holds the operand size (amo_target).
                let size = e
                    .ctxs
                    .scratch(wait)
                    .map(|s| unsafe { *s } as usize)
                    .unwrap_or(8)
                    .min(8);
                if m.status != 0 {
                    e.record_error(format!("remote AMO failed with status {}", m.status));
                } else if retptr != 0 {
                    let bytes = m.result.to_le_bytes();
                    if let Err(err) = write_any(retptr as *mut u8, &bytes[..size]) {
                        e.record_error(err.message);
                    }
                }
                e.finish_wait(wait);
            }
            AM_PUT => {
                let src_pe = m.val as i64;
                if src_pe < 0 || src_pe >= c.n_pes as i64 || m.size as usize > STAGE_CHUNK {
                    tracing::error!("staged put from PE {src_pe} with {} bytes dropped", m.size);
                    return;
                }
                // SAFETY: the payload follows the header inside this receive slot.
                let payload = unsafe { buf.as_ptr().add(slot * STAGE_BYTES + AM_BYTES) };
                let status = match self.find_registration(m.addr, m.size as u64) {
                    Some(_) => match copy_any(m.addr as *mut u8, payload, m.size as usize) {
                        Ok(()) => 0,
                        Err(err) => err.status,
                    },
                    None => {
                        tracing::error!(
                            "staged put from PE {src_pe}: {:#x}+{} is not registered here",
                            m.addr,
                            m.size
                        );
                        abi::status::INVALID_VALUE
                    }
                };
                let resp = AmMsg {
                    magic: AM_MAGIC,
                    kind: AM_RESP,
                    token: m.token,
                    status,
                    ..Default::default()
                };
                let dest = c.addrs[src_pe as usize * NUM_EPS + i];
                e.am_pending.lock().push_back(Pending::Msg(dest, resp));
            }
            AM_GET => {
                let src_pe = m.val as i64;
                if src_pe < 0 || src_pe >= c.n_pes as i64 || m.size as usize > STAGE_CHUNK {
                    tracing::error!("staged get from PE {src_pe} with {} bytes dropped", m.size);
                    return;
                }
                let dest = c.addrs[src_pe as usize * NUM_EPS + i];
                e.am_pending.lock().push_back(Pending::GetData {
                    dest,
                    token: m.token,
                    addr: m.addr,
                    len: m.size,
                });
            }
            AM_GET_DATA => {
                let Some((wait, dst)) = e.waiting(m.token, "staged get data") else {
                    return;
                };
                if m.status != 0 {
                    e.record_error(format!("remote get failed with status {}", m.status));
                } else {
                    // SAFETY: the payload follows the header inside this receive slot.
                    let payload = unsafe { buf.as_ptr().add(slot * STAGE_BYTES + AM_BYTES) };
                    if let Err(err) = copy_any(dst as *mut u8, payload, m.size as usize) {
                        e.record_error(err.message);
                    }
                }
                e.finish_wait(wait);
            }
            k => tracing::error!("endpoint {i}: unknown AM kind {k}"),
        }
    }

    fn flush_am_pending(&self, c: &Connected, i: usize) {
        let e = &c.eps[i];
        loop {
            let Some(p) = e.am_pending.lock().pop_front() else {
                return;
            };
            let r = match &p {
                Pending::Msg(dest, msg) => self.send_small(e, *dest, *msg),
                Pending::GetData {
                    dest,
                    token,
                    addr,
                    len,
                } => {
                    let Some(slot) = e.send_free.lock().pop() else {
                        e.am_pending.lock().push_front(p);
                        return;
                    };
                    // SAFETY: the slot belongs to this endpoint's registered send slab.
                    let sp = unsafe { e.send_slab.0.as_ptr().add(slot * STAGE_BYTES) as *mut u8 };
                    let status = match self.find_registration(*addr, *len as u64) {
                        // SAFETY: the payload area of the slot has STAGE_CHUNK >= len bytes.
                        Some(_) => match copy_any(
                            unsafe { sp.add(AM_BYTES) },
                            *addr as *const u8,
                            *len as usize,
                        ) {
                            Ok(()) => 0,
                            Err(err) => err.status,
                        },
                        None => {
                            tracing::error!("staged get: {addr:#x}+{len} is not registered here");
                            abi::status::INVALID_VALUE
                        }
                    };
                    let size = if status == 0 { *len } else { 0 };
                    let hdr = AmMsg {
                        magic: AM_MAGIC,
                        kind: AM_GET_DATA,
                        token: *token,
                        size,
                        status,
                        ..Default::default()
                    };
                    let r = self.send_slot(e, *dest, slot, hdr, 0);
                    if r.is_err() {
                        e.send_free.lock().push(slot);
                    }
                    r
                }
            };
            match r {
                Ok(()) => {}
                Err(err) if err.is_again() => {
                    e.am_pending.lock().push_front(p);
                    return;
                }
                Err(err) => tracing::error!("endpoint {i}: active message lost: {err}"),
            }
        }
    }

    /// Sends a header-only message from a context's scratch space (no wait; EAGAIN is returned).
    fn send_small(&self, e: &EpState, dest: FiAddr, msg: AmMsg) -> crate::fabric::Result<()> {
        let Some(ctx) = e.ctxs.alloc(TAG_AM_SEND, 0) else {
            return Err(FabricError::from_ret(
                -(sys::FI_EAGAIN as i64),
                "no context for an active message",
            ));
        };
        let r = e.send_from_scratch(ctx, dest, msg);
        if r.is_err() {
            e.ctxs.free(ctx);
        }
        r
    }

    /// Sends send slot `slot` (header written here, payload already in place). `wait` is the
    /// initiator's waiting context to fail if the send fails (0: none).
    fn send_slot(
        &self,
        e: &EpState,
        dest: FiAddr,
        slot: usize,
        hdr: AmMsg,
        wait: u64,
    ) -> crate::fabric::Result<()> {
        let Some(ctx) = e.ctxs.alloc(TAG_SLOT_SEND, slot as u64) else {
            return Err(FabricError::from_ret(
                -(sys::FI_EAGAIN as i64),
                "no context for a staged send",
            ));
        };
        // SAFETY: own context; scratch[0] remembers the waiting context.
        unsafe { *e.ctxs.scratch(ctx).expect("own context") = wait };
        // SAFETY: the slot lies in the registered send slab and stays reserved until completion.
        let r = unsafe {
            let sp = e.send_slab.0.as_ptr().add(slot * STAGE_BYTES) as *mut u8;
            std::ptr::write_unaligned(sp as *mut AmMsg, hdr);
            e.ep.send(
                sp,
                AM_BYTES + hdr.size as usize,
                e.send_slab.1.desc(),
                dest,
                ctx,
            )
        };
        if r.is_err() {
            e.ctxs.free(ctx);
        }
        r
    }

    /// Takes a free send slot, driving progress while none is free (bounded).
    fn alloc_slot(&self, c: &Connected, ep: usize) -> TResult<usize> {
        let e = &c.eps[ep];
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            if let Some(s) = e.send_free.lock().pop() {
                return Ok(s);
            }
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "endpoint {ep}: no staging slot freed within {:?}",
                    self.cfg.quiet_timeout
                )));
            }
            std::hint::spin_loop();
        }
    }

    /// Staged put or get of `len` bytes: GPU memory never reaches the provider. Each chunk is a
    /// message the target applies with a copy on a non-blocking stream (puts) or answers with data
    /// (gets); the waiting context completes on the answer, so quiet covers it.
    #[allow(clippy::too_many_arguments)]
    fn staged(
        &self,
        c: &Connected,
        pe: i32,
        is_put: bool,
        laddr: u64,
        raddr: u64,
        len: u64,
        ep: usize,
    ) -> TResult<()> {
        let e = &c.eps[ep];
        let dest = c.addrs[pe as usize * NUM_EPS + ep];
        let mut off = 0u64;
        while off < len {
            let n = (STAGE_CHUNK as u64).min(len - off);
            let wait_data = if is_put { 0 } else { laddr + off };
            let wait = self.alloc_ctx(c, ep, TAG_AM_WAIT, wait_data)?;
            e.submitted.fetch_add(1, Ordering::AcqRel);
            let hdr = AmMsg {
                magic: AM_MAGIC,
                kind: if is_put { AM_PUT } else { AM_GET },
                token: wait as u64,
                size: n as u32,
                addr: raddr + off,
                val: c.my_pe as u64,
                ..Default::default()
            };
            let r = if is_put {
                // Every failure below gives the slot back; the caller's cleanup gives back `wait`.
                self.alloc_slot(c, ep).and_then(|slot| {
                    // SAFETY: the slot's payload area holds STAGE_CHUNK >= n bytes.
                    let sp = unsafe {
                        e.send_slab.0.as_ptr().add(slot * STAGE_BYTES + AM_BYTES) as *mut u8
                    };
                    copy_any(sp, (laddr + off) as *const u8, n as usize)
                        .and_then(|()| {
                            self.retry_send(c, ep, || {
                                self.send_slot(e, dest, slot, hdr, wait as u64)
                            })
                        })
                        .inspect_err(|_| e.send_free.lock().push(slot))
                })
            } else {
                self.retry_send(c, ep, || self.send_small(e, dest, hdr))
            };
            if let Err(err) = r {
                e.ctxs.free(wait);
                e.submitted.fetch_sub(1, Ordering::AcqRel);
                return Err(err);
            }
            off += n;
        }
        Ok(())
    }

    fn retry_send(
        &self,
        c: &Connected,
        ep: usize,
        f: impl Fn() -> crate::fabric::Result<()>,
    ) -> TResult<()> {
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            match f() {
                Ok(()) => return Ok(()),
                Err(err) if err.is_again() && Instant::now() < deadline => {
                    self.progress_ep(c, ep);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Applies an AMO to this PE's memory, serialised with every other target-applied AMO.
    fn apply_local_amo(&self, opc: i32, size: u32, addr: u64, val: u64, cmp: u64) -> TResult<u64> {
        if size != 4 && size != 8 {
            return Err(invalid(format!("AMO size {size} (4 or 8)")));
        }
        if addr % size as u64 != 0 {
            return Err(invalid(format!(
                "AMO address {addr:#x} not aligned to {size}"
            )));
        }
        let reg = self.find_registration(addr, size as u64).ok_or_else(|| {
            invalid(format!(
                "AMO target {addr:#x}+{size} is not in a registered region"
            ))
        })?;
        let _g = self.am_lock.lock();
        let mut cur = [0u8; 8];
        if reg.device {
            // SAFETY: the range lies in a registration of this process.
            unsafe {
                cuda::memcpy(
                    cur.as_mut_ptr() as *mut c_void,
                    addr as *const c_void,
                    size as usize,
                )
            }
            .map_err(|e| internal(e.to_string()))?;
        } else {
            // SAFETY: as above; host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, cur.as_mut_ptr(), size as usize)
            };
        }
        let old = u64::from_le_bytes(cur);
        let mask = if size == 4 { 0xffff_ffff } else { u64::MAX };
        let new = compute_amo(opc, old & mask, val & mask, cmp & mask)? & mask;
        if new != old & mask {
            let bytes = new.to_le_bytes();
            if reg.device {
                // SAFETY: as above.
                unsafe {
                    cuda::memcpy(
                        addr as *mut c_void,
                        bytes.as_ptr() as *const c_void,
                        size as usize,
                    )
                }
                .map_err(|e| internal(e.to_string()))?;
            } else {
                // Host words are written atomically so concurrent CPU readers never see a torn value.
                // SAFETY: aligned (checked) word inside a registration.
                unsafe {
                    if size == 4 {
                        (*(addr as *const std::sync::atomic::AtomicU32))
                            .store(new as u32, Ordering::SeqCst)
                    } else {
                        (*(addr as *const AtomicU64)).store(new, Ordering::SeqCst)
                    }
                }
            }
        }
        Ok(old & mask)
    }

    fn find_registration(&self, addr: u64, len: u64) -> Option<Arc<Registration>> {
        self.regs
            .read()
            .values()
            .find(|r| r.contains(addr, len))
            .cloned()
    }

    /// `get_mem_handle`: registers `[buf, buf+size)` and describes it in `handle`.
    ///
    /// # Safety
    /// `handle` must be null or point to a writable 512-byte handle; the memory must stay allocated
    /// until `release_mem_handle`.
    pub unsafe fn get_mem_handle(
        &self,
        handle: *mut MemHandle,
        buf: *mut c_void,
        size: usize,
        local_only: bool,
    ) -> TResult<()> {
        if handle.is_null() || buf.is_null() || size == 0 {
            return Err(invalid(format!(
                "get_mem_handle: bad arguments (handle {handle:p}, buf {buf:p}, size {size})"
            )));
        }
        let kind = match cuda::pointer_kind(buf) {
            PtrKind::Host => MemKind::Host,
            PtrKind::Device {
                ordinal,
                legacy_ipc,
            } => {
                if !self.info.has_hmem() {
                    return Err(invalid(format!(
                        "get_mem_handle: {buf:p} is GPU memory but provider {} has no FI_HMEM",
                        self.provider
                    )));
                }
                if self.provider == Provider::Shm
                    && !self.staging
                    && !legacy_ipc
                    && !self.cfg.allow_vmm
                {
                    return Err(invalid(format!(
                        "get_mem_handle: {buf:p} is CUDA VMM memory, which the shm provider's CUDA IPC cannot \
                         export; run with NVSHMEM_DISABLE_CUDA_VMM=1 (or NVSHMEM_EFA_ALLOW_VMM=1 to try anyway)"
                    )));
                }
                MemKind::Cuda(ordinal)
            }
        };
        let conn = self.conn.get();
        let staged_device = self.staging && matches!(kind, MemKind::Cuda(_));
        let mrs = if staged_device {
            Vec::new()
        } else if self.info.mr_endpoint() {
            let c = conn.ok_or_else(|| {
                internal("get_mem_handle before connect on an FI_MR_ENDPOINT provider")
            })?;
            c.eps
                .iter()
                // SAFETY: NVSHMEM keeps the memory allocated until release_mem_handle.
                .map(|e| unsafe {
                    MemoryRegion::register(
                        &self.domain,
                        buf as *const u8,
                        size,
                        kind,
                        !local_only,
                        Some(&e.ep),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            // SAFETY: as above.
            vec![unsafe {
                MemoryRegion::register(
                    &self.domain,
                    buf as *const u8,
                    size,
                    kind,
                    !local_only,
                    None,
                )?
            }]
        };
        let reg_id = self.next_reg.fetch_add(1, Ordering::Relaxed);
        let mut keys = [0u64; NUM_EPS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mrs
                .get(i.min(mrs.len().saturating_sub(1)))
                .map_or(0, |m| m.key());
        }
        let device = matches!(kind, MemKind::Cuda(_));
        let blob = HandleBlob {
            magic: HANDLE_MAGIC,
            version: HANDLE_VERSION,
            flags: if device { HANDLE_FLAG_DEVICE } else { 0 },
            base: buf as u64,
            len: size as u64,
            keys,
            reg_id,
            cookie: self.cookie,
            pe: conn.map_or(-1, |c| c.my_pe),
            reserved: 0,
        };
        let reg = Arc::new(Registration {
            base: buf as u64,
            len: size as u64,
            device,
            mrs,
        });
        // The first remotely accessible registration is NVSHMEM's symmetric heap (NVSHMEM connects
        // endpoints, and so initialises GDA, before it sets the heap up).
        if !local_only && crate::gda::mode() > 0 && !self.gda_heap_set.swap(true, Ordering::AcqRel)
        {
            if let Err(e) = crate::gda::set_local_heap(buf as u64, size as u64, reg.mrs.first()) {
                tracing::warn!("GDA: could not set the local heap: {e}");
            }
        }
        self.regs.write().insert(reg_id, reg);
        // SAFETY: handle checked non-null; NVSHMEM passes a 512-byte handle.
        blob.write(unsafe { &mut *handle });
        tracing::debug!(
            "registered {buf:p}+{size} ({kind:?}, local_only={local_only}) as {reg_id}"
        );
        Ok(())
    }

    /// `release_mem_handle`.
    ///
    /// # Safety
    /// `handle` must be null or point to a readable 512-byte handle.
    pub unsafe fn release_mem_handle(&self, handle: *mut MemHandle) -> TResult<()> {
        let b = HandleBlob::read(handle)
            .ok_or_else(|| invalid("release_mem_handle: not a handle of this transport"))?;
        if b.cookie != self.cookie {
            return Err(invalid(
                "release_mem_handle: handle belongs to another transport instance or PE",
            ));
        }
        match self.regs.write().remove(&b.reg_id) {
            Some(_) => Ok(()),
            None => Err(invalid(format!(
                "release_mem_handle: registration {} unknown or already released",
                b.reg_id
            ))),
        }
    }

    /// `add_device_remote_mem_handles`: every PE's handle of one heap chunk, stride `stride`,
    /// this transport at `index`. Feeds GDA's peer table.
    ///
    /// # Safety
    /// `handles` must be null or hold `n_pes * stride` handles.
    pub unsafe fn add_remote_handles(
        &self,
        stride: i32,
        index: i32,
        handles: *mut MemHandle,
    ) -> TResult<()> {
        let c = self.conn()?;
        if handles.is_null() || stride <= 0 || index < 0 || index >= stride {
            return Err(invalid(format!(
                "add_device_remote_mem_handles: bad arguments (stride {stride}, index {index})"
            )));
        }
        if crate::gda::mode() <= 0 {
            return Ok(());
        }
        for pe in 0..c.n_pes {
            // SAFETY: NVSHMEM passes n_pes * stride handles.
            let h = unsafe { handles.add(pe as usize * stride as usize + index as usize) };
            let b = HandleBlob::read(h).ok_or_else(|| {
                invalid(format!(
                    "add_device_remote_mem_handles: PE {pe}'s handle is not ours"
                ))
            })?;
            if let Err(e) = crate::gda::set_remote_heap(pe, b.base, b.len, b.keys[0]) {
                tracing::warn!("GDA: remote heap of PE {pe}: {e}");
            }
        }
        Ok(())
    }

    fn check_pe(&self, c: &Connected, pe: i32) -> TResult<()> {
        if pe < 0 || pe >= c.n_pes {
            return Err(invalid(format!("PE {pe} out of range (n_pes {})", c.n_pes)));
        }
        Ok(())
    }

    /// The remote handle of `rd`, after checking that it is one of ours and covers `len` bytes at
    /// `rd.ptr`.
    fn remote_blob(&self, rd: &RmaMemdesc, len: u64, what: &str) -> TResult<HandleBlob> {
        let b = HandleBlob::read(rd.handle).ok_or_else(|| {
            invalid(format!(
                "{what}: remote handle {:p} was not made by this transport",
                rd.handle
            ))
        })?;
        let addr = rd.ptr as u64;
        if !b.contains(addr, len) {
            return Err(invalid(format!(
                "{what}: remote range {addr:#x}+{len} outside the registration {:#x}+{}",
                b.base, b.len
            )));
        }
        Ok(b)
    }

    /// Translates a remote address into what the provider wants, after checking the handle and range.
    fn remote_target(
        &self,
        rd: &RmaMemdesc,
        len: u64,
        ep: usize,
        what: &str,
    ) -> TResult<(u64, u64)> {
        let b = self.remote_blob(rd, len, what)?;
        let addr = rd.ptr as u64;
        let a = if self.info.virt_addr() {
            addr
        } else {
            addr - b.base
        };
        Ok((a, b.keys[ep]))
    }

    /// Local descriptor for `[addr, addr+len)`: from its handle, or a registration that contains it.
    fn local_desc(
        &self,
        handle: *mut MemHandle,
        addr: u64,
        len: u64,
        ep: usize,
    ) -> Option<(Arc<Registration>, *mut c_void)> {
        if let Some(b) = HandleBlob::read(handle) {
            if b.cookie == self.cookie {
                if let Some(r) = self.regs.read().get(&b.reg_id).cloned() {
                    if r.contains(addr, len) {
                        let d = r.desc(ep);
                        return Some((r, d));
                    }
                }
            }
        }
        self.find_registration(addr, len).map(|r| {
            let d = r.desc(ep);
            (r, d)
        })
    }

    fn alloc_ctx(&self, c: &Connected, ep: usize, tag: u64, data: u64) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            if let Some(x) = e.ctxs.alloc(tag, data) {
                return Ok(x);
            }
            self.progress_ep(c, ep);
            if Instant::now() > deadline {
                return Err(internal(format!(
                    "endpoint {ep}: {} operations in flight and none completes within {:?}",
                    e.ctxs.in_flight(),
                    self.cfg.quiet_timeout
                )));
            }
            std::hint::spin_loop();
        }
    }

    /// Posts one operation with retry on EAGAIN, counting it as submitted.
    fn post(
        &self,
        c: &Connected,
        ep: usize,
        tag: u64,
        data: u64,
        f: impl Fn(*mut c_void) -> crate::fabric::Result<()>,
    ) -> TResult<*mut c_void> {
        let e = &c.eps[ep];
        let ctx = self.alloc_ctx(c, ep, tag, data)?;
        if tag == TAG_OP {
            e.submitted.fetch_add(1, Ordering::AcqRel);
        }
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        loop {
            match f(ctx) {
                Ok(()) => return Ok(ctx),
                Err(err) if err.is_again() && Instant::now() < deadline => {
                    self.progress_ep(c, ep);
                }
                Err(err) => {
                    e.ctxs.free(ctx);
                    if tag == TAG_OP {
                        e.submitted.fetch_sub(1, Ordering::AcqRel);
                    }
                    return Err(err.into());
                }
            }
        }
    }

    /// `rma`: put, get, P, G (strided by element), blocking or not.
    ///
    /// # Safety
    /// `remote` and `local` must be null or valid descriptors whose handles are null or 512-byte
    /// handles; the local memory must stay valid until the operation completes (quiet).
    pub unsafe fn rma(
        &self,
        pe: i32,
        verb: abi::RmaVerb,
        remote: *mut RmaMemdesc,
        local: *mut RmaMemdesc,
        bytes: abi::RmaBytesdesc,
        ep: usize,
    ) -> TResult<()> {
        let c = self.conn()?;
        self.check_pe(c, pe)?;
        if remote.is_null() || local.is_null() {
            return Err(invalid("rma: null memory descriptor"));
        }
        // SAFETY: non-null descriptors from NVSHMEM, valid for the call.
        let (rd, ld) = unsafe { (*remote, *local) };
        let is_put = match verb.op {
            op::PUT | op::P => true,
            op::GET | op::G => false,
            other => return Err(invalid(format!("rma: unsupported op {other}"))),
        };
        if bytes.elembytes <= 0 || bytes.nelems == 0 {
            return Err(invalid(format!(
                "rma: zero length ({} x {} bytes)",
                bytes.nelems, bytes.elembytes
            )));
        }
        let elem = bytes.elembytes as u64;
        let total = (bytes.nelems as u64)
            .checked_mul(elem)
            .ok_or_else(|| invalid("rma: length overflows"))?;
        if ld.ptr.is_null() || rd.ptr.is_null() {
            return Err(invalid("rma: null address"));
        }
        tracing::trace!(
            "rma: pe {pe} op {} nbi {} {total} bytes, local {:p}, remote {:p}, endpoint {ep}",
            verb.op,
            verb.is_nbi,
            ld.ptr,
            rd.ptr
        );
        // `verb.is_stream` / `verb.cstrm` are not read: NVSHMEM orders on-stream operations itself
        // (it launches a kernel that goes through its proxy) and never hands a transport a stream,
        // and its proxy leaves both fields uninitialised in inline (P) requests.
        // A single element has no stride: NVSHMEM leaves the strides of its one-element requests (P, G,
        // inline proxy requests) uninitialised.
        let (lstride, rstride) = if bytes.nelems == 1 {
            (1, 1)
        } else if is_put {
            (bytes.srcstride, bytes.deststride)
        } else {
            (bytes.deststride, bytes.srcstride)
        };
        if lstride == 1 && rstride == 1 {
            self.rma_contig(c, pe, is_put, &rd, &ld, total, ep)?;
        } else {
            if lstride <= 0 || rstride <= 0 {
                return Err(invalid(format!(
                    "rma: strides must be positive (local {lstride}, remote {rstride})"
                )));
            }
            for i in 0..bytes.nelems as u64 {
                let r = RmaMemdesc {
                    ptr: (rd.ptr as u64 + i * rstride as u64 * elem) as *mut c_void,
                    offset: rd.offset + i * rstride as u64 * elem,
                    handle: rd.handle,
                };
                let l = RmaMemdesc {
                    ptr: (ld.ptr as u64 + i * lstride as u64 * elem) as *mut c_void,
                    offset: 0,
                    handle: ld.handle,
                };
                self.rma_contig(c, pe, is_put, &r, &l, elem, ep)?;
            }
        }
        if verb.is_nbi == 0 {
            self.quiet(ep)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rma_contig(
        &self,
        c: &Connected,
        pe: i32,
        is_put: bool,
        rd: &RmaMemdesc,
        ld: &RmaMemdesc,
        len: u64,
        ep: usize,
    ) -> TResult<()> {
        let what = if is_put { "put" } else { "get" };
        if self.staging {
            let b = self.remote_blob(rd, len, what)?;
            let raddr = rd.ptr as u64;
            let local_dev = matches!(cuda::pointer_kind(ld.ptr), PtrKind::Device { .. });
            let stage_all = self.cfg.gpu_staging == Some(true);
            if stage_all || local_dev || b.flags & HANDLE_FLAG_DEVICE != 0 {
                return self.staged(c, pe, is_put, ld.ptr as u64, raddr, len, ep);
            }
        }
        if len as usize > self.info.max_msg_size() {
            // Split into provider-sized pieces.
            let chunk = self.info.max_msg_size() as u64;
            let mut off = 0;
            while off < len {
                let n = chunk.min(len - off);
                let r = RmaMemdesc {
                    ptr: (rd.ptr as u64 + off) as *mut c_void,
                    offset: rd.offset + off,
                    handle: rd.handle,
                };
                let l = RmaMemdesc {
                    ptr: (ld.ptr as u64 + off) as *mut c_void,
                    offset: 0,
                    handle: ld.handle,
                };
                self.rma_contig(c, pe, is_put, &r, &l, n, ep)?;
                off += n;
            }
            return Ok(());
        }
        let (raddr, key) = self.remote_target(rd, len, ep, what)?;
        let dest = c.addrs[pe as usize * NUM_EPS + ep];
        let laddr = ld.ptr as u64;
        let e = &c.eps[ep];
        match self.local_desc(ld.handle, laddr, len, ep) {
            Some((_reg, desc)) => {
                self.post(c, ep, TAG_OP, 0, |ctx| {
                    // SAFETY: the local range lies in a live registration; NVSHMEM keeps buffers valid
                    // until quiet (nbi) or until we return (blocking: we quiet before returning).
                    unsafe {
                        if is_put {
                            e.ep.write(
                                laddr as *const u8,
                                len as usize,
                                desc,
                                dest,
                                raddr,
                                key,
                                ctx,
                            )
                        } else {
                            e.ep.read(laddr as *mut u8, len as usize, desc, dest, raddr, key, ctx)
                        }
                    }
                })?;
                Ok(())
            }
            None => self.rma_unregistered(c, pe, is_put, laddr, raddr, key, len, ep),
        }
    }

    /// Local memory that no registration covers (a P's stack value, a host buffer of the host API):
    /// small puts are injected; the rest goes through the endpoint's registered bounce buffer.
    #[allow(clippy::too_many_arguments)]
    fn rma_unregistered(
        &self,
        c: &Connected,
        pe: i32,
        is_put: bool,
        laddr: u64,
        raddr: u64,
        key: u64,
        len: u64,
        ep: usize,
    ) -> TResult<()> {
        let dest = c.addrs[pe as usize * NUM_EPS + ep];
        let e = &c.eps[ep];
        let device = matches!(
            cuda::pointer_kind(laddr as *const c_void),
            PtrKind::Device { .. }
        );
        if is_put && !device && (len as usize) <= self.info.inject_size() {
            self.post(c, ep, TAG_OP, 0, |ctx| {
                // SAFETY: FI_INJECT: the provider copies the source before returning.
                unsafe {
                    e.ep.write_msg(
                        laddr as *const u8,
                        len as usize,
                        std::ptr::null_mut(),
                        dest,
                        raddr,
                        key,
                        ctx,
                        sys::FI_INJECT as u64 | self.tx_flags(),
                    )
                }
            })?;
            return Ok(());
        }
        // Bounce buffer: serialised per endpoint, each chunk completed before the next.
        let mut guard = e.bounce.lock();
        if guard.is_none() {
            let buf = vec![0u8; BOUNCE_BYTES].into_boxed_slice();
            // SAFETY: the buffer lives with its registration in the endpoint state.
            let mr = unsafe {
                MemoryRegion::register(
                    &self.domain,
                    buf.as_ptr(),
                    buf.len(),
                    MemKind::Host,
                    false,
                    Some(&e.ep),
                )?
            };
            *guard = Some((buf, mr));
        }
        let (buf, mr) = guard.as_mut().expect("bounce buffer just created");
        let mut off = 0u64;
        while off < len {
            let n = (BOUNCE_BYTES as u64).min(len - off);
            let bp = buf.as_mut_ptr();
            if is_put {
                copy_any(bp, (laddr + off) as *const u8, n as usize)?;
            }
            self.post(c, ep, TAG_OP, 0, |ctx| {
                // SAFETY: bounce buffer registered and held (locked) until the chunk completes.
                unsafe {
                    if is_put {
                        e.ep.write(bp, n as usize, mr.desc(), dest, raddr + off, key, ctx)
                    } else {
                        e.ep.read(bp, n as usize, mr.desc(), dest, raddr + off, key, ctx)
                    }
                }
            })?;
            self.quiet(ep)?;
            if !is_put {
                copy_any((laddr + off) as *mut u8, bp, n as usize)?;
            }
            off += n;
        }
        Ok(())
    }

    fn tx_flags(&self) -> u64 {
        if self.info.delivery_complete() {
            sys::FI_DELIVERY_COMPLETE as u64
        } else {
            0
        }
    }

    /// `amo`: every NVSHMEM atomic, 4 and 8 bytes. Fetch results land in `retptr` by quiet.
    ///
    /// # Safety
    /// `target` must be null or a valid descriptor; `retptr` must stay valid until quiet.
    pub unsafe fn amo(
        &self,
        pe: i32,
        verb: abi::AmoVerb,
        target: *mut AmoMemdesc,
        elembytes: i32,
        ep: usize,
    ) -> TResult<()> {
        let c = self.conn()?;
        self.check_pe(c, pe)?;
        if target.is_null() {
            return Err(invalid("amo: null descriptor"));
        }
        // SAFETY: non-null descriptor from NVSHMEM.
        let t = unsafe { *target };
        if elembytes != 4 && elembytes != 8 {
            return Err(invalid(format!("amo: size {elembytes} (4 or 8)")));
        }
        let size = elembytes as u64;
        let fetch = verb.op > amo::END_OF_NONFETCH;
        let known = matches!(verb.op, amo::INC..=amo::SIGNAL_ADD | amo::FETCH..=amo::COMPARE_SWAP);
        if !known {
            return Err(invalid(format!("amo: unsupported op {}", verb.op)));
        }
        if fetch && t.retptr.is_null() {
            return Err(invalid(format!(
                "amo: fetching op {} without retptr",
                verb.op
            )));
        }
        let (raddr, key) = self.remote_target(&t.remote, size, ep, "amo")?;
        let val = match verb.op {
            amo::INC | amo::FETCH_INC => 1,
            _ => t.val,
        };
        if self.use_provider_atomics {
            if let Some((fop, dt)) = provider_op(verb.op, elembytes) {
                let (a, f, cmp) = c.eps[ep].ep.atomic_valid(dt, fop);
                let ok = if verb.op == amo::COMPARE_SWAP {
                    cmp
                } else if fetch || self.provider == Provider::Shm {
                    f
                } else {
                    a
                };
                if ok {
                    return self
                        .amo_provider(c, pe, verb.op, fop, dt, &t, val, raddr, key, size, ep);
                }
                if self.cfg.atomics == AtomicsPath::Provider {
                    return Err(invalid(format!(
                        "amo: provider {} cannot do op {} on {size}-byte values",
                        self.provider, verb.op
                    )));
                }
            }
        }
        self.amo_target(c, pe, verb.op, &t, val, size, ep)
    }

    #[allow(clippy::too_many_arguments)]
    fn amo_provider(
        &self,
        c: &Connected,
        pe: i32,
        opc: i32,
        fop: sys::fi_op,
        dt: sys::fi_datatype,
        t: &AmoMemdesc,
        val: u64,
        raddr: u64,
        key: u64,
        size: u64,
        ep: usize,
    ) -> TResult<()> {
        let dest = c.addrs[pe as usize * NUM_EPS + ep];
        let e = &c.eps[ep];
        let fetch = opc > amo::END_OF_NONFETCH;
        let (res_ptr, res_desc) = if fetch {
            let rp = t.retptr as u64;
            match self.local_desc(t.ret_handle, rp, size, ep) {
                Some((_r, d)) => (rp as *mut u8, d),
                None if !self.info.mr_local()
                    && !matches!(cuda::pointer_kind(t.retptr), PtrKind::Device { .. }) =>
                {
                    (rp as *mut u8, std::ptr::null_mut())
                }
                None => {
                    return Err(invalid(format!(
                        "amo: result buffer {:p} is not registered",
                        t.retptr
                    )))
                }
            }
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let cdesc = e.ctx_desc();
        let shm_fetch_workaround = self.provider == Provider::Shm && !fetch;
        self.post(c, ep, TAG_OP, 0, |ctx| {
            let s = e.ctxs.scratch(ctx).expect("own context");
            // SAFETY: operands live in the context's scratch until completion; the result buffer is
            // registered (or plain host memory where the provider allows) and kept by NVSHMEM.
            unsafe {
                *s = val;
                *s.add(1) = t.cmp;
                let opnd = s as *const u8;
                if opc == amo::COMPARE_SWAP {
                    e.ep.compare_atomic(
                        opnd,
                        cdesc,
                        s.add(1) as *const u8,
                        cdesc,
                        res_ptr,
                        res_desc,
                        dest,
                        raddr,
                        key,
                        dt,
                        ctx,
                    )
                } else if fetch {
                    e.ep.fetch_atomic(
                        opnd, cdesc, res_ptr, res_desc, dest, raddr, key, dt, fop, ctx,
                    )
                } else if shm_fetch_workaround {
                    // libfabric 2.1's shm releases the inject buffer of a non-fetching atomic sent
                    // with FI_DELIVERY_COMPLETE twice (target and sender), so two later atomics share
                    // one buffer. A fetching atomic into the context's scratch space avoids that path.
                    e.ep.fetch_atomic(
                        opnd,
                        cdesc,
                        s.add(2) as *mut u8,
                        cdesc,
                        dest,
                        raddr,
                        key,
                        dt,
                        fop,
                        ctx,
                    )
                } else {
                    e.ep.atomic(opnd, cdesc, dest, raddr, key, dt, fop, ctx)
                }
            }
        })?;
        Ok(())
    }

    /// Target-applied AMO: a request message to the target's endpoint of the same index; the waiting
    /// context completes when the response (old value, status) arrives.
    #[allow(clippy::too_many_arguments)]
    fn amo_target(
        &self,
        c: &Connected,
        pe: i32,
        opc: i32,
        t: &AmoMemdesc,
        val: u64,
        size: u64,
        ep: usize,
    ) -> TResult<()> {
        let e = &c.eps[ep];
        let retptr = if opc > amo::END_OF_NONFETCH {
            t.retptr as u64
        } else {
            0
        };
        let wait = self.alloc_ctx(c, ep, TAG_AM_WAIT, retptr)?;
        // SAFETY: own context; scratch[0] keeps the operand size for the response handler.
        unsafe { *e.ctxs.scratch(wait).expect("own context") = size };
        e.submitted.fetch_add(1, Ordering::AcqRel);
        let msg = AmMsg {
            magic: AM_MAGIC,
            kind: AM_REQ,
            token: wait as u64,
            op: opc,
            size: size as u32,
            addr: t.remote.ptr as u64,
            val,
            cmp: t.cmp,
            result: c.my_pe as u64,
            status: 0,
            reserved: 0,
        };
        let dest = c.addrs[pe as usize * NUM_EPS + ep];
        let r = self.post(c, ep, TAG_AM_SEND, wait as u64, |ctx| {
            e.send_from_scratch(ctx, dest, msg)
        });
        if let Err(err) = r {
            e.ctxs.free(wait);
            e.submitted.fetch_sub(1, Ordering::AcqRel);
            return Err(err);
        }
        Ok(())
    }

    /// `quiet` / `fence`: every operation posted on endpoint `ep` before the call is complete.
    pub fn quiet(&self, ep: usize) -> TResult<()> {
        let Some(c) = self.conn.get() else {
            return Ok(());
        };
        let e = &c.eps[ep];
        let target = e.submitted.load(Ordering::Acquire);
        let deadline = Instant::now() + self.cfg.quiet_timeout;
        let mut spins = 0u32;
        let mut warned = false;
        let started = Instant::now();
        while e.completed.load(Ordering::Acquire) < target {
            self.progress_ep(c, ep);
            if !warned && started.elapsed() > Duration::from_secs(2) {
                warned = true;
                tracing::warn!(
                    "quiet on endpoint {ep}: {} operation(s) still outstanding after 2 s ({} contexts in flight, {} errors so far)",
                    target.saturating_sub(e.completed.load(Ordering::Acquire)),
                    e.ctxs.in_flight(),
                    e.errors.load(Ordering::Acquire)
                );
            }
            if Instant::now() > deadline {
                let outstanding = target.saturating_sub(e.completed.load(Ordering::Acquire));
                return Err(internal(format!(
                    "quiet: {outstanding} operation(s) on endpoint {ep} not complete after {:?} (peer gone?)",
                    self.cfg.quiet_timeout
                )));
            }
            spins += 1;
            if spins > 1000 {
                std::thread::yield_now();
            }
        }
        if e.errors.swap(0, Ordering::AcqRel) > 0 {
            let msg = e.last_error.lock().take().unwrap_or_default();
            return Err(internal(format!(
                "quiet: operation(s) failed on endpoint {ep}: {msg}"
            )));
        }
        Ok(())
    }

    /// `put_signal` (ABI v4): the puts, then — once they are complete at the target — the signal.
    ///
    /// # Safety
    /// As for `rma` and `amo`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal(
        &self,
        pe: i32,
        verb: abi::RmaVerb,
        remote: &[RmaMemdesc],
        local: &[RmaMemdesc],
        bytes: &[abi::RmaBytesdesc],
        sig_verb: abi::AmoVerb,
        sig: *mut AmoMemdesc,
        sig_bytes: i32,
        ep: usize,
    ) -> TResult<()> {
        if remote.len() != local.len() || remote.len() != bytes.len() {
            return Err(invalid(format!(
                "put_signal: {} remote, {} local, {} sizes",
                remote.len(),
                local.len(),
                bytes.len()
            )));
        }
        let nbi = abi::RmaVerb {
            op: op::PUT,
            is_nbi: 1,
            ..verb
        };
        for i in 0..remote.len() {
            let mut r = remote[i];
            let mut l = local[i];
            // SAFETY: descriptors copied from the caller's valid vectors.
            unsafe { self.rma(pe, nbi, &mut r, &mut l, bytes[i], ep)? };
        }
        self.quiet(ep)?;
        match sig_verb.op {
            amo::SIGNAL | amo::SIGNAL_SET | amo::SIGNAL_ADD | amo::SET | amo::ADD => {}
            other => return Err(invalid(format!("put_signal: signal op {other}"))),
        }
        // SAFETY: the caller's signal descriptor.
        unsafe { self.amo(pe, sig_verb, sig, sig_bytes, ep)? };
        if verb.is_nbi == 0 {
            self.quiet(ep)?;
        }
        Ok(())
    }

    /// `progress`.
    pub fn progress(&self) -> TResult<()> {
        self.progress_all();
        Ok(())
    }

    /// Human-readable description for `show_info`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "nvshmem-efa-gda {}: provider {} (fabric {}, domain {}), hmem {}, atomics {}, delivery_complete {}, libfabric {}.{}",
            env!("CARGO_PKG_VERSION"),
            self.info.provider_name(),
            self.info.fabric_name(),
            self.info.domain_name(),
            self.info.has_hmem(),
            if self.use_provider_atomics { "provider" } else { "target-applied" },
            self.info.delivery_complete(),
            crate::fabric::library_version().0,
            crate::fabric::library_version().1
        );
        if let Some(c) = self.conn.get() {
            for (i, e) in c.eps.iter().enumerate() {
                s += &format!(
                    "\n  ep {i}: submitted {} completed {} in flight {}",
                    e.submitted.load(Ordering::Relaxed),
                    e.completed.load(Ordering::Relaxed),
                    e.ctxs.in_flight()
                );
            }
        }
        s += &format!("\n  GDA mode {}", crate::gda::mode());
        s
    }

    /// Stops the progress thread, shuts GDA down and waits (bounded) for in-flight operations.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.progress_thread.lock().take() {
            let _ = h.join();
        }
        crate::gda::fini();
        if self.conn.get().is_some() {
            for ep in 0..NUM_EPS {
                if let Err(e) = self.quiet(ep) {
                    tracing::warn!("finalize: {}", e.message);
                }
            }
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Maps an NVSHMEM AMO to a libfabric op and datatype.
fn provider_op(opc: i32, elembytes: i32) -> Option<(sys::fi_op, sys::fi_datatype)> {
    let dt = if elembytes == 4 {
        sys::fi_datatype_FI_UINT32
    } else {
        sys::fi_datatype_FI_UINT64
    };
    let fop = match opc {
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => sys::fi_op_FI_ATOMIC_WRITE,
        amo::INC | amo::ADD | amo::SIGNAL_ADD | amo::FETCH_INC | amo::FETCH_ADD => {
            sys::fi_op_FI_SUM
        }
        amo::AND | amo::FETCH_AND => sys::fi_op_FI_BAND,
        amo::OR | amo::FETCH_OR => sys::fi_op_FI_BOR,
        amo::XOR | amo::FETCH_XOR => sys::fi_op_FI_BXOR,
        amo::FETCH => sys::fi_op_FI_ATOMIC_READ,
        amo::COMPARE_SWAP => sys::fi_op_FI_CSWAP,
        _ => return None,
    };
    Some((fop, dt))
}

/// The new value of a target-applied AMO.
pub(crate) fn compute_amo(opc: i32, old: u64, val: u64, cmp: u64) -> TResult<u64> {
    Ok(match opc {
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => val,
        amo::INC | amo::FETCH_INC => old.wrapping_add(1),
        amo::ADD | amo::SIGNAL_ADD | amo::FETCH_ADD => old.wrapping_add(val),
        amo::AND | amo::FETCH_AND => old & val,
        amo::OR | amo::FETCH_OR => old | val,
        amo::XOR | amo::FETCH_XOR => old ^ val,
        amo::FETCH => old,
        amo::COMPARE_SWAP => {
            if old == cmp {
                val
            } else {
                old
            }
        }
        other => return Err(invalid(format!("AMO op {other} cannot be applied"))),
    })
}

fn copy_any(dst: *mut u8, src: *const u8, n: usize) -> TResult<()> {
    let dev = |p: *const u8| {
        matches!(
            cuda::pointer_kind(p as *const c_void),
            PtrKind::Device { .. }
        )
    };
    if dev(dst) || dev(src) {
        // SAFETY: both ranges come from NVSHMEM buffers of at least n bytes.
        unsafe { cuda::memcpy(dst as *mut c_void, src as *const c_void, n) }
            .map_err(|e| internal(e.to_string()))
    } else {
        // SAFETY: host ranges of at least n bytes that do not overlap (bounce buffer vs user buffer).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        Ok(())
    }
}

fn write_any(dst: *mut u8, bytes: &[u8]) -> TResult<()> {
    copy_any(dst, bytes.as_ptr(), bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amo_arithmetic() {
        assert_eq!(compute_amo(amo::FETCH_ADD, 5, 3, 0).unwrap(), 8);
        assert_eq!(compute_amo(amo::INC, u64::MAX, 0, 0).unwrap(), 0);
        assert_eq!(compute_amo(amo::COMPARE_SWAP, 5, 9, 5).unwrap(), 9);
        assert_eq!(compute_amo(amo::COMPARE_SWAP, 5, 9, 4).unwrap(), 5);
        assert_eq!(
            compute_amo(amo::FETCH_XOR, 0b1100, 0b1010, 0).unwrap(),
            0b0110
        );
        assert_eq!(compute_amo(amo::FETCH, 7, 1, 1).unwrap(), 7);
        assert!(compute_amo(amo::ACK, 0, 0, 0).is_err());
    }

    #[test]
    fn handle_blob_roundtrip_and_range() {
        let b = HandleBlob {
            magic: HANDLE_MAGIC,
            version: HANDLE_VERSION,
            base: 0x1000,
            len: 0x100,
            ..Default::default()
        };
        let mut h = MemHandle {
            reserved: [0; abi::MEM_HANDLE_SIZE],
        };
        b.write(&mut h);
        let r = HandleBlob::read(&h).unwrap();
        assert_eq!(r, b);
        assert!(r.contains(0x1000, 0x100));
        assert!(r.contains(0x10ff, 1));
        assert!(!r.contains(0x10ff, 2));
        assert!(!r.contains(0xfff, 1));
        assert!(!r.contains(u64::MAX, 1));
        let zero = MemHandle {
            reserved: [0; abi::MEM_HANDLE_SIZE],
        };
        assert!(HandleBlob::read(&zero).is_none());
        assert!(HandleBlob::read(std::ptr::null()).is_none());
    }

    #[test]
    fn provider_ops_cover_every_code() {
        for opc in amo::INC..=amo::SIGNAL_ADD {
            assert!(provider_op(opc, 8).is_some(), "op {opc}");
        }
        for opc in amo::FETCH..=amo::COMPARE_SWAP {
            assert!(provider_op(opc, 4).is_some(), "op {opc}");
        }
        assert!(provider_op(amo::ACK, 8).is_none());
    }
}
