//! The ABI-independent transport: every NVSHMEM host op, implemented once over the fabric layer.
//! The per-ABI adapters (`v3.rs`, `v4.rs`) only translate arguments.
//!
//! Endpoints: index 0 serves host-initiated operations, index 1 NVSHMEM's proxy thread (device-
//! initiated operations). Peer `pe`'s endpoint `i` is `fi_addr = pe * 2 + i` in the AV. The GPU's own
//! queue (GDA) lives on a third, private endpoint of the transport's own GDA context (`gda`, a
//! [`GdaHandle`] the C API finds through `crate::gda`'s registry while the transport lives). On shm those endpoints
//! only receive: every operation to PE `p` leaves through a transmit endpoint ("lane") of this PE
//! for `p`, so an operation shm never answers (dead peer, released key) holds up only its lane
//! (see `lanes`).
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
//!
//! Failure: the progress thread runs behind a panic boundary. A panic there marks the transport
//! failed; every bounded wait and every later operation then returns an error naming the panic.
//!
//! Same-host GPU memory: puts and gets whose remote side is GPU memory of a PE on this host go
//! through [`crate::mover`] (CUDA IPC of the peer's registered heap, copy-engine copies on a
//! non-blocking stream, completion polled by quiet) instead of the staged path; see `rma`.
//!
//! Route: how data moves (staged or FI_HMEM GPU memory, provider or target-applied atomics, CUDA
//! IPC, whether the progress thread sleeps) is decided once in [`Transport::new`] as a
//! [`crate::route::Route`] and only acted on here.
//!
//! Rails: RMA between registered memory spreads over further NICs of the same provider (`rails`;
//! rail 0 is the domain and endpoints above, and the only one with one NIC).
//!
//! Layout: `endpoints` (endpoint state, connect, contexts and posting), `progress` (the progress
//! thread and completion dispatch), `lanes` (per-peer transmit endpoints on shm), `rails` (extra
//! NICs), `peers` (liveness,
//! per-peer accounting), `am` (active messages and staged transfers), `memory` (handles
//! and registrations), `rma`, `amo`, `quiet`, `provider_ops` (every raw libfabric constant used
//! here), `error`.

mod am;
mod amo;
mod apply;
mod endpoints;
mod error;
mod fence;
mod gda_link;
mod gets;
mod group;
mod kstage;
mod lanes;
mod memory;
mod outbox;
mod peers;
mod progress;
mod provider_ops;
mod quiet;
mod rails;
mod rma;
mod shm_regions;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use super::abi;
use crate::config::Config;
use crate::fabric::{AddressVector, Caps, Domain, Fabric, FiAddr, Info, InfoRequest, Provider};
use crate::gda::GdaHandle;
use crate::mover::engine::Mover;
use crate::route::{Host, Route, Staging};

use endpoints::EpState;
use error::{internal, invalid};
pub use error::{TResult, TransportError};
use memory::Registration;
pub use rails::{RailConfig, RailStat};

/// Endpoint index for host-initiated operations.
pub const EP_HOST: usize = 0;
/// Endpoint index for NVSHMEM's proxy (device-initiated operations).
pub const EP_PROXY: usize = 1;
/// Endpoints per PE.
pub const NUM_EPS: usize = 2;

/// Default of `NVSHMEM_EFA_STAGE_SLOTS` (staged chunks in flight per endpoint).
pub const STAGE_SLOTS_DEFAULT: usize = wire::SEND_SLOTS;

/// The bootstrap allgather: `send` from every PE lands in `recv`, PE by PE.
pub type Allgather<'a> = dyn Fn(&[u8], &mut [u8]) -> TResult<()> + 'a;

/// State that exists once endpoints are connected.
struct Connected {
    my_pe: i32,
    n_pes: i32,
    av: Arc<AddressVector>,
    eps: Vec<EpState>,
    /// `fi_addr` of endpoint `ep` of PE `pe` at `pe * NUM_EPS + ep` (replaced when a broken
    /// connection is rebuilt).
    addrs: Vec<AtomicU64>,
    /// The raw names behind `addrs`, `name_len` bytes each (to insert one again).
    names: Vec<u8>,
    name_len: usize,
    /// Liveness of every PE (index: PE).
    peers: Vec<peers::PeerState>,
    /// When peers with outstanding work were last looked up.
    last_check: Mutex<std::time::Instant>,
}

impl Connected {
    /// The address of endpoint `ep` of PE `pe` (checked by the caller).
    fn addr(&self, pe: i32, ep: usize) -> FiAddr {
        self.addrs[pe as usize * NUM_EPS + ep].load(Ordering::Acquire)
    }

    /// The PE an address belongs to.
    fn pe_of(&self, a: FiAddr) -> Option<usize> {
        self.addrs
            .iter()
            .position(|x| x.load(Ordering::Acquire) == a)
            .map(|k| k / NUM_EPS)
    }

    /// The address of endpoint `ep` of the PE a message names; `None` when the PE is out of range.
    fn peer_addr(&self, pe: i64, ep: usize) -> Option<FiAddr> {
        (0..self.n_pes as i64)
            .contains(&pe)
            .then(|| self.addr(pe as i32, ep))
    }
}

/// The transport.
pub struct Transport {
    cfg: Config,
    provider: Provider,
    domain: Arc<Domain>,
    info: Info,
    /// How data moves, decided once from the provider's capabilities and the configuration.
    route: Route,
    cookie: u64,
    conn: OnceLock<Connected>,
    regs: RwLock<HashMap<u64, Arc<Registration>>>,
    next_reg: AtomicU64,
    am_lock: Mutex<()>,
    stop: Arc<AtomicBool>,
    /// Why the transport can no longer work (set once, by the progress thread's panic boundary).
    failed: Arc<OnceLock<String>>,
    /// Test support: makes the progress thread panic at its next turn.
    #[cfg(any(test, feature = "test-support"))]
    inject_panic: Arc<AtomicBool>,
    progress_thread: Mutex<Option<JoinHandle<()>>>,
    cuda_ctx: AtomicU64,
    /// Same-host GPU copies through CUDA IPC, and the per-stage counters of every data path.
    mover: Arc<Mover>,
    /// This transport's GDA context: created at connect, registered (weakly) for the C API, dropped
    /// at finalize or with the transport.
    gda: GdaHandle,
    /// The extra NICs (rails 1..) RMA is spread over; rail 0 is `domain` (see `rails`).
    rails: rails::Rails,
}

fn provider_request(p: &Provider) -> InfoRequest {
    InfoRequest {
        provider: p.clone(),
        hmem: true,
        atomics: true,
        msg: true,
    }
}

/// The first fabric of [`Provider::candidates`] that answers, and why each fabric of the same
/// provider before it was not taken (`efa-direct` before `efa`'s RDM fabric).
fn open_info(cfg: &Config) -> TResult<(Provider, Info, Vec<String>)> {
    let mut errors: Vec<(Provider, String)> = Vec::new();
    let found = |p: Provider, i: Info, errors: Vec<(Provider, String)>| {
        let same: Vec<String> = errors
            .into_iter()
            .filter(|(q, _)| q.prov_name() == p.prov_name())
            .map(|(_, e)| e)
            .collect();
        Ok((p, i, same))
    };
    for (p, hmem_required) in Provider::candidates(cfg.provider.as_ref()) {
        // Prefer FI_HMEM; software providers without it still serve host memory.
        let mut req = provider_request(&p);
        match Info::get(&req) {
            Ok(i) => return found(p, i, errors),
            Err(e) => errors.push((p.clone(), format!("{p} with FI_HMEM: {e}"))),
        }
        if hmem_required {
            continue;
        }
        req.hmem = false;
        match Info::get(&req) {
            Ok(i) => return found(p, i, errors),
            Err(e) => errors.push((p.clone(), format!("{p} without FI_HMEM: {e}"))),
        }
    }
    Err(internal(format!(
        "no usable libfabric provider: {}",
        errors
            .into_iter()
            .map(|(_, e)| e)
            .collect::<Vec<_>>()
            .join("; ")
    )))
}

impl Transport {
    /// The provider `cfg` leads to (the one named, else the first of the automatic order that
    /// answers), its answer and the route decided from its capabilities and `cfg`: what
    /// [`Transport::new`] acts on, also shown by the `nvshmem-efa-gda` tool.
    pub fn decide_route(cfg: &Config) -> TResult<(Provider, Info, Route)> {
        let (provider, info, passed_over) = open_info(cfg)?;
        let mut route = Route::decide(Caps::of(&info), cfg, &Host::probe())
            .map_err(|e| invalid(e.to_string()))?;
        route.passed_over = passed_over;
        Ok((provider, info, route))
    }

    /// Opens fabric and domain for the configured provider.
    pub fn new(cfg: Config) -> TResult<Transport> {
        let (provider, info, route) = Self::decide_route(&cfg)?;
        // Rail 0 is the first rail chosen (the first answer unless NVSHMEM_EFA_RAILS names another).
        let (rails, info) = rails::Rails::open(
            &provider,
            route.caps.per_peer_lanes,
            &provider_request(&provider),
            info,
            cfg.max_inflight,
        )?;
        tracing::debug!(
            "provider {} (fabric {}, domain {}): hmem={} atomics={} delivery_complete={} mr_mode={:#x}",
            info.provider_name(),
            info.fabric_name(),
            info.domain_name(),
            info.has_hmem(),
            info.has_atomics(),
            info.delivery_complete(),
            info.mr_mode()
        );
        tracing::info!("{}", route.provider_line(cfg.provider.as_ref()));
        if let Some(n) = &route.note {
            tracing::warn!("{n}");
        }
        tracing::info!("{route}");
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
        crate::cuda::module_loading::report(
            route.staging != Staging::Off || !route.provider_atomics,
        );
        crate::fabric::rxm::report(route.caps.rxm_staged, route.staging != Staging::Off);
        let mover = Mover::new(route.mover_policy(), NUM_EPS)
            .with_timeout(cfg.quiet_timeout)
            .with_copy_batch(cfg.copy_batch)
            .with_copy_kernel(cfg.copy_kernel);
        Ok(Transport {
            cfg,
            provider,
            domain,
            info,
            route,
            cookie,
            conn: OnceLock::new(),
            regs: RwLock::new(HashMap::new()),
            next_reg: AtomicU64::new(1),
            am_lock: Mutex::new(()),
            stop: Arc::new(AtomicBool::new(false)),
            failed: Arc::new(OnceLock::new()),
            #[cfg(any(test, feature = "test-support"))]
            inject_panic: Arc::new(AtomicBool::new(false)),
            progress_thread: Mutex::new(None),
            cuda_ctx: AtomicU64::new(0),
            gda: GdaHandle::new(),
            mover: Arc::new(mover),
            rails,
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
        self.route.provider_atomics
    }

    /// How data moves (decided once, at [`Transport::new`]).
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// An error once the transport has failed (its progress thread panicked), naming the cause.
    fn check_alive(&self) -> TResult<()> {
        match self.failed.get() {
            None => Ok(()),
            Some(why) => Err(internal(format!("transport failed: {why}"))),
        }
    }

    /// Test support: makes the progress thread panic at its next turn, to exercise its panic
    /// boundary. Compiled only into unit tests and builds with the `test-support` feature, which
    /// only the crate's own tests enable; it is not reachable through the C ABI either.
    #[cfg(any(test, feature = "test-support"))]
    #[doc(hidden)]
    pub fn inject_progress_panic(&self) {
        self.inject_panic.store(true, Ordering::Release);
    }

    fn conn(&self) -> TResult<&Connected> {
        self.check_alive()?;
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
            if self.route.provider_atomics { "provider" } else { "target-applied" },
            self.info.delivery_complete(),
            crate::fabric::library_version().0,
            crate::fabric::library_version().1
        );
        s += &format!("\n  {}", self.route);
        if let Some(c) = self.conn.get() {
            for (i, e) in c.eps.iter().enumerate() {
                let kinds: Vec<String> = e
                    .ctxs
                    .in_flight_by_tag()
                    .into_iter()
                    .map(|(t, n)| format!("{}: {n}", endpoints::tag_name(t)))
                    .collect();
                s += &format!(
                    "\n  ep {i}: submitted {} completed {} in flight {} ({})",
                    e.submitted.load(Ordering::Relaxed),
                    e.completed.load(Ordering::Relaxed),
                    e.ctxs.in_flight(),
                    kinds.join(", ")
                );
            }
        }
        for line in self.rails_summary() {
            s += &format!("\n  {line}");
        }
        match self.gda.mode() {
            Some(m) => s += &format!("\n  GDA mode {m}"),
            None => s += "\n  GDA not initialised",
        }
        s
    }

    /// Stops the progress thread, shuts GDA down and waits (bounded) for in-flight operations.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.progress_thread.lock().take() {
            let _ = h.join();
        }
        self.gda.shutdown();
        if let Some(c) = self.conn.get() {
            self.say_goodbye(c);
            for ep in 0..NUM_EPS {
                if let Err(e) = self.quiet(ep) {
                    tracing::warn!("finalize: {}", e.message);
                }
            }
        }
        for line in self.rails_summary() {
            tracing::info!("{line}");
        }
        tracing::debug!("data path stages: {}", self.mover.stats().summary());
        let (applied, taken) = self.mover.amos().counts();
        if applied + taken > 0 {
            tracing::debug!(
                "kernel atomics: {applied} applied by the kernel, {taken} taken over by the host"
            );
        }
        self.mover.close_peers();
        if let Some(c) = self.conn.get() {
            // Peers killed before they could finalize leave their shm regions behind.
            for pe in 0..c.peers.len() {
                let p = &c.peers[pe];
                if p.same_host && p.proc.gone().is_some() {
                    self.remove_shm_regions_of(c, pe);
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
