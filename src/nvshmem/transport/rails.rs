//! Rails: a PE moves RMA over up to `NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE` NICs (domains) at once.
//!
//! Rail 0 is the transport's own domain and endpoints: everything goes there as before (active
//! messages, staged transfers, atomics, lanes, GDA). Rails 1.. are extra domains of the same
//! provider, one per further NIC (for tcp: per interface), each with one endpoint, CQ and AV of its
//! own, its own registration of every remotely accessible region (keys in the handle's rail
//! section, bytes [`RAIL_SECTION`].., so a peer looks a key up per rail) and its own contexts.
//! They carry provider RMA between registered memory: small operations go round-robin over the
//! live rails (rail 0 included), operations of at least `NVSHMEM_EFA_RAIL_STRIPE_BYTES` are cut
//! into one piece per live rail. A peer's atomics take one rail at a time, rail 0 until it fails
//! towards that peer ([`primary`]; then target-applied messages on an extra rail, [`msg`]): two
//! NICs' atomics are not atomic with respect to each other, and no AMO is ever re-posted.
//!
//! Quiet, fence and blocking calls cover every rail: each rail counts its operations per (endpoint,
//! PE) and joins the caller's completion group; progress (`progress_ep`) reads every rail's CQ.
//!
//! Failover: an extra rail whose post fails, or on which an operation fails (CQ error) or sees no
//! completion within `NVSHMEM_EFA_RAIL_TIMEOUT_MS` while its peer completes operations on other
//! rails, is failed once: one WARN line, its endpoint is closed (the provider cancels what it
//! still holds, so nothing lands later), every operation in flight on it ends with an error (its
//! group's, or its peer's for quiet), and atomics it carried move. New operations use the
//! remaining rails. Rail 0, shared by every peer, fails per peer by the same timeout rule
//! ([`primary`]). A failed rail stays down for the job (docs/rails.md says why).
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::abi::MemHandle;
use super::group::{self, Group};
use super::{internal, invalid, Allgather, Connected, TResult, Transport, NUM_EPS};
use crate::fabric::{
    AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, Fabric, FiAddr, Info, InfoRequest,
    MemKind, MemoryRegion, OpContexts, Provider,
};
use crate::mover::handle::HostId;
use crate::topo;

mod config;
mod msg;
mod primary;
mod quiet;

use config::section_key;
pub use config::RailConfig;
use config::{ip_of, write_section};
use primary::PeerRails;
pub(super) use primary::RailAmo;

/// Offset of the rail section (magic, count, one key per extra rail) in the 512-byte handle.
pub(super) const RAIL_SECTION: usize = 256;
const RAIL_MAGIC: u32 = u32::from_le_bytes(*b"RAIL");
/// Most rails a PE uses (rail 0 and the extra rails whose keys fit the handle's section).
pub const MAX_RAILS: usize = 1 + (512 - RAIL_SECTION - 8) / 8;
/// Bytes of one rail endpoint name in the exchange (its length, then the name).
const RAIL_NAME_SLOT: usize = 64;
/// Default of `NVSHMEM_EFA_RAIL_STRIPE_BYTES`.
pub const STRIPE_DEFAULT: u64 = 64 << 10;
/// Default of `NVSHMEM_EFA_RAIL_TIMEOUT_MS`.
pub const RAIL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Pieces of a striped operation start at multiples of this.
const STRIPE_ALIGN: u64 = 4096;

/// One rail's traffic and state, for tests and the description.
#[derive(Clone, Debug)]
pub struct RailStat {
    pub index: usize,
    /// The domain (NIC; interface for tcp).
    pub name: String,
    /// Operations (pieces) posted on it, and their bytes.
    pub ops: u64,
    pub bytes: u64,
    /// AMOs it carried (rail 0: those that went the transport's own ways).
    pub amos: u64,
    /// Why it failed, once it has.
    pub failed: Option<String>,
}

/// One RMA operation in flight on an extra rail.
struct RailOp {
    ep: usize,
    pe: usize,
    group: Option<Arc<Group>>,
    posted: Instant,
    /// The peer's completions on the other rails when it was posted (see `peer_progress`).
    peer_done: u64,
    /// An AMO waiting for its answer ([`msg`]): where its old value goes (0: nowhere), its size.
    amo: Option<(u64, u32)>,
}

/// The connected part of an extra rail (closed when the rail fails).
struct RailLink {
    ep: Endpoint,
    cq: Arc<CompletionQueue>,
    /// Per PE: its endpoint on this rail, `None` where the peer has no such rail.
    addrs: Vec<Option<FiAddr>>,
    /// The contexts' registration, where the provider needs local registration (messages are
    /// sent from and received into their scratch).
    ctx_mr: Option<MemoryRegion>,
}

impl RailLink {
    fn ctx_desc(&self) -> *mut c_void {
        self.ctx_mr
            .as_ref()
            .map_or(std::ptr::null_mut(), |m| m.desc())
    }
}

/// An extra rail (index >= 1).
struct Rail {
    index: usize,
    name: String,
    info: Info,
    domain: Arc<Domain>,
    link: RwLock<Option<RailLink>>,
    failed: OnceLock<String>,
    ops: Mutex<HashMap<usize, RailOp>>,
    ctxs: OpContexts,
    /// Per `ep * n_pes + pe`: operations submitted and completed (set at connect).
    counts: OnceLock<Vec<(AtomicU64, AtomicU64)>>,
    /// Per PE: operations completed without error (set at connect).
    ok: OnceLock<Vec<AtomicU64>>,
    n_ops: AtomicU64,
    n_bytes: AtomicU64,
    n_amos: AtomicU64,
    last_scan: Mutex<Instant>,
    /// Why the rail fails, found where it could not be failed at once (reaping inside a send).
    doom: Mutex<Option<String>>,
}

/// A region's registrations on the extra rails (index: rail - 1).
struct RailReg {
    base: u64,
    len: u64,
    mrs: Vec<Option<MemoryRegion>>,
}

/// Every rail of a transport.
pub(super) struct Rails {
    cfg: RailConfig,
    /// Whether PEs exchange rail addresses at connect (the same on every PE: from the variables
    /// and the provider alone).
    exchange: bool,
    primary_name: String,
    extra: Vec<Rail>,
    next: AtomicUsize,
    regs: RwLock<HashMap<u64, RailReg>>,
    primary_ops: AtomicU64,
    primary_bytes: AtomicU64,
    primary_amos: AtomicU64,
    /// Per PE: rail 0 towards it, the rail of its atomics (set at connect; see [`primary`]).
    peers: OnceLock<Vec<PeerRails>>,
    /// Origin of the probes' time stamps.
    epoch: Instant,
    last_scan0: Mutex<Instant>,
}

/// NICs with a place on the PCIe tree, chosen by distance from the PE's GPU (the current CUDA
/// context's; `src/topo.rs`, as `nvshmem-efa-gda info` shows them), nearest first; `Err` says why
/// there is no such choice.
fn nearest(answers: &[Info], cfg: &RailConfig) -> Result<Vec<Info>, String> {
    let (domain, bus, device) = crate::cuda::current_device_pci()
        .ok_or("no current CUDA context to choose NICs near its GPU")?;
    let gpu = topo::PciAddr {
        domain,
        bus,
        device,
        function: 0,
    };
    let listed: Vec<topo::NicName> = answers
        .iter()
        .map(|a| topo::NicName {
            name: a.domain_name(),
            provider: a.fabric_name(),
            pci: a
                .pci_addr()
                .map(|(domain, bus, device, function)| topo::PciAddr {
                    domain: domain as u32,
                    bus,
                    device,
                    function,
                }),
        })
        .collect();
    // NVSHMEM's variables (NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE, NVSHMEM_ENABLE_NIC_PE_MAPPING),
    // checked already by RailConfig.
    let policy = topo::NicPolicy::from_env().map_err(|e| e.0)?;
    debug_assert_eq!(policy.max_nic_per_pe, cfg.max);
    let order = topo::rail_order(&topo::Sysfs::system(), gpu, &listed, policy)
        .map_err(|e| format!("NICs near GPU {gpu}: {}", e.0))?;
    if order.is_empty() {
        return Err(format!("no NIC near GPU {gpu}"));
    }
    tracing::debug!(
        "rails: GPU {gpu}: nearest NICs {order:?} of {}",
        answers.len()
    );
    Ok(order.into_iter().map(|k| answers[k].clone()).collect())
}

fn is_loopback(i: &Info) -> bool {
    let f = i.fabric_name();
    i.domain_name() == "lo" || f.starts_with("127.") || f.starts_with("::1/")
}

impl Rails {
    /// Chooses the rails for `provider` whose first answer is `primary` and opens the extra ones.
    /// Returns the rails and rail 0's answer (the first of `NVSHMEM_EFA_RAILS` when set).
    /// Providers whose operations need per-peer transmit endpoints (`lanes`: shm, one domain per
    /// host anyway) get no rails: an extra rail has one endpoint that a dead peer could hold up.
    pub(super) fn open(
        provider: &Provider,
        per_peer_lanes: bool,
        req: &InfoRequest,
        primary: Info,
        max_inflight: usize,
    ) -> TResult<(Rails, Info)> {
        let cfg = RailConfig::from_lookup(|k| std::env::var(k).ok()).map_err(invalid)?;
        let exchange = cfg.max > 1 && !per_peer_lanes;
        let mut chosen = vec![primary.clone()];
        if exchange {
            let answers = Info::domains_like(req, &primary).unwrap_or_else(|e| {
                tracing::debug!("rails: {e}; one rail");
                vec![primary.clone()]
            });
            chosen = match &cfg.names {
                Some(names) => names
                    .iter()
                    .map(|n| {
                        answers
                            .iter()
                            .find(|a| a.domain_name() == *n)
                            .cloned()
                            .ok_or_else(|| {
                                let have: Vec<String> =
                                    answers.iter().map(|a| a.domain_name()).collect();
                                invalid(format!(
                                    "NVSHMEM_EFA_RAILS names {n:?}, which provider {provider} does not answer with (it has: {})",
                                    have.join(", ")
                                ))
                            })
                    })
                    .collect::<TResult<Vec<_>>>()?,
                None if is_loopback(&primary) => chosen,
                None if primary.pci_addr().is_some() => nearest(&answers, &cfg)
                    .unwrap_or_else(|why| {
                        tracing::info!("rails: {why}; one rail ({})", primary.domain_name());
                        chosen
                    }),
                None => {
                    let mut v = chosen;
                    v.extend(answers.into_iter().filter(|a| {
                        !is_loopback(a) && a.domain_name() != primary.domain_name()
                    }));
                    v
                }
            };
        }
        let limit = cfg.max.min(MAX_RAILS);
        if chosen.len() > limit {
            tracing::debug!(
                "rails: {} domains, NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE keeps {limit}",
                chosen.len()
            );
            chosen.truncate(limit);
        }
        let first = chosen.remove(0);
        let mut extra = Vec::new();
        for (k, info) in chosen.into_iter().enumerate() {
            let fabric = Fabric::open(info.clone())?;
            let domain = Domain::open(&fabric)?;
            extra.push(Rail {
                index: k + 1,
                name: info.domain_name(),
                info,
                domain,
                link: RwLock::new(None),
                failed: OnceLock::new(),
                ops: Mutex::new(HashMap::new()),
                ctxs: OpContexts::new(max_inflight),
                counts: OnceLock::new(),
                ok: OnceLock::new(),
                n_ops: AtomicU64::new(0),
                n_bytes: AtomicU64::new(0),
                n_amos: AtomicU64::new(0),
                last_scan: Mutex::new(Instant::now()),
                doom: Mutex::new(None),
            });
        }
        if !extra.is_empty() {
            let names: Vec<String> = std::iter::once(first.domain_name())
                .chain(extra.iter().map(|r| r.name.clone()))
                .collect();
            tracing::info!(
                "rails: {} over {} (striping from {} bytes, rail timeout {:?})",
                names.len(),
                names.join(", "),
                cfg.stripe,
                cfg.timeout
            );
        }
        Ok((
            Rails {
                cfg,
                exchange,
                primary_name: first.domain_name(),
                extra,
                next: AtomicUsize::new(0),
                regs: RwLock::new(HashMap::new()),
                primary_ops: AtomicU64::new(0),
                primary_bytes: AtomicU64::new(0),
                primary_amos: AtomicU64::new(0),
                peers: OnceLock::new(),
                epoch: Instant::now(),
                last_scan0: Mutex::new(Instant::now()),
            },
            first,
        ))
    }

    /// Whether there is more than one rail.
    pub(super) fn active(&self) -> bool {
        !self.extra.is_empty()
    }

    /// Traffic and state of every rail, rail 0 first.
    pub(super) fn stats(&self) -> Vec<RailStat> {
        let mut v = vec![RailStat {
            index: 0,
            name: self.primary_name.clone(),
            ops: self.primary_ops.load(Ordering::Relaxed),
            bytes: self.primary_bytes.load(Ordering::Relaxed),
            amos: self.primary_amos.load(Ordering::Relaxed),
            failed: self.peers.get().and_then(|v| {
                let down: Vec<String> = v
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.down0())
                    .map(|(pe, _)| format!("PE {pe}"))
                    .collect();
                (!down.is_empty()).then(|| format!("down towards {}", down.join(", ")))
            }),
        }];
        v.extend(self.extra.iter().map(|r| RailStat {
            index: r.index,
            name: r.name.clone(),
            ops: r.n_ops.load(Ordering::Relaxed),
            bytes: r.n_bytes.load(Ordering::Relaxed),
            amos: r.n_amos.load(Ordering::Relaxed),
            failed: r.failed.get().cloned(),
        }));
        v
    }

    /// Registers `[base, base+len)` on every extra rail and writes their keys into the handle's
    /// rail section (`handle` is the 512-byte handle). A rail whose registration fails serves this
    /// region on no transfer (they take another rail); it is logged.
    ///
    /// # Safety
    /// The memory stays allocated until [`Rails::release`].
    pub(super) unsafe fn register(
        &self,
        reg_id: u64,
        base: u64,
        len: u64,
        kind: MemKind,
        remote: bool,
        handle: &mut [u8],
    ) {
        if !self.active() {
            return;
        }
        let mut mrs = Vec::with_capacity(self.extra.len());
        let mut keys = Vec::with_capacity(self.extra.len());
        for r in &self.extra {
            let link = r.link.read();
            let ep = link.as_ref().map(|l| &l.ep);
            let mr = if r.info.mr_endpoint() && ep.is_none() {
                None
            } else {
                // SAFETY: forwarded contract.
                match unsafe {
                    MemoryRegion::register(
                        &r.domain,
                        base as *const u8,
                        len as usize,
                        kind,
                        remote,
                        ep.filter(|_| r.info.mr_endpoint()),
                    )
                } {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::warn!("rail {} ({}): registering {base:#x}+{len}: {e}; the region takes the other rails", r.index, r.name);
                        None
                    }
                }
            };
            keys.push(mr.as_ref().map_or(u64::MAX, |m| m.key()));
            mrs.push(mr);
        }
        write_section(handle, &keys);
        self.regs.write().insert(reg_id, RailReg { base, len, mrs });
    }

    /// Drops the rail registrations of `reg_id`.
    pub(super) fn release(&self, reg_id: u64) {
        self.regs.write().remove(&reg_id);
    }

    /// The descriptor of the local range `[addr, addr+len)` on extra rail `k` (0-based), if a
    /// region registered there covers it.
    fn local_desc(&self, k: usize, addr: u64, len: u64) -> Option<*mut c_void> {
        let regs = self.regs.read();
        regs.values()
            .filter(|r| {
                addr >= r.base && addr.checked_add(len).is_some_and(|e| e <= r.base + r.len)
            })
            .find_map(|r| r.mrs.get(k).and_then(|m| m.as_ref()).map(|m| m.desc()))
    }
}

/// What the error of an operation ended by its rail's failure says (see [`rail_failed`]).
const RAIL_FAILED: &str = ") failed (rail failover): ";

/// Whether an error is that of operations ended by their rail's failure (blocking puts and gets
/// run again on the rails left).
pub(super) fn rail_failed(err: &str) -> bool {
    err.contains(RAIL_FAILED)
}

/// One contiguous provider RMA between registered memory, before it is given a rail.
#[derive(Clone, Copy)]
pub(super) struct RailRma {
    pub pe: usize,
    pub ep: usize,
    pub is_put: bool,
    pub laddr: u64,
    /// The remote address as the provider takes it (virtual address or offset).
    pub raddr: u64,
    pub len: u64,
    pub handle: *mut MemHandle,
}

impl Transport {
    /// Opens the extra rails' endpoints and exchanges their names (collective: every PE takes part
    /// when the rail variables and provider say so, which they say alike on every PE).
    /// `hosts` holds every PE's host identity: a peer on another host whose endpoint on a rail
    /// has this PE's own IP address there (docker0 and other host-local bridges carry the same
    /// address on every host) is not reached over that rail.
    pub(super) fn rails_connect(
        &self,
        my_pe: usize,
        n: usize,
        hosts: &[HostId],
        allgather: &Allgather<'_>,
    ) -> TResult<()> {
        let rails = &self.rails;
        if !rails.exchange {
            return Ok(());
        }
        let slots = rails.cfg.max.min(MAX_RAILS) - 1;
        let rec = 8 + slots * RAIL_NAME_SLOT;
        let mut mine = vec![0u8; rec];
        // Each slot: the name's length (u16 LE; 0: this PE has no such rail), then the name.
        let open = |r: &Rail| -> TResult<(Endpoint, Arc<CompletionQueue>, Arc<AddressVector>)> {
            let cq = CompletionQueue::open(&r.domain, self.cfg.max_inflight.max(1024))?;
            let av = AddressVector::open(&r.domain, n)?;
            let ep = Endpoint::open(&r.domain, &av, &cq, None)?;
            Ok((ep, cq, av))
        };
        let mut opened = Vec::new();
        for r in &rails.extra {
            let at = 8 + (r.index - 1) * RAIL_NAME_SLOT;
            let o = open(r).and_then(|(ep, cq, av)| {
                let name = ep.name()?;
                if name.len() > RAIL_NAME_SLOT - 2 {
                    return Err(internal(format!(
                        "endpoint name of {} bytes (at most {})",
                        name.len(),
                        RAIL_NAME_SLOT - 2
                    )));
                }
                // The AMO channel's receives (their buffers: the contexts' scratch, registered
                // where the provider needs local registration), before the name is published.
                let ctx_mr = if r.info.mr_local() {
                    let (base, len) = r.ctxs.region();
                    // SAFETY: the pool lives as long as the rail, which outlives its link.
                    Some(unsafe {
                        MemoryRegion::register(
                            &r.domain,
                            base,
                            len,
                            MemKind::Host,
                            false,
                            Some(&ep).filter(|_| r.info.mr_endpoint()),
                        )
                    }?)
                } else {
                    None
                };
                let desc = ctx_mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
                self.rail_post_recvs(r, &ep, desc)?;
                mine[at..at + 2].copy_from_slice(&(name.len() as u16).to_le_bytes());
                mine[at + 2..at + 2 + name.len()].copy_from_slice(&name);
                Ok((ep, cq, av, ctx_mr))
            });
            if let Err(e) = &o {
                tracing::warn!(
                    "rail {} ({}) not opened: {}; the other rails serve",
                    r.index,
                    r.name,
                    e.message
                );
                let _ = r.failed.set(format!("not opened: {}", e.message));
            }
            opened.push(o.ok());
        }
        mine[0..4].copy_from_slice(&(rails.extra.len() as u32).to_le_bytes());
        mine[4..8].copy_from_slice(&(my_pe as u32).to_le_bytes());
        let mut all = vec![0u8; rec * n];
        allgather(&mine, &mut all)?;
        let name_at = |rec: &[u8], at: usize| -> Option<Vec<u8>> {
            let len = u16::from_le_bytes(rec[at..at + 2].try_into().unwrap()) as usize;
            (len > 0 && len <= RAIL_NAME_SLOT - 2).then(|| rec[at + 2..at + 2 + len].to_vec())
        };
        for (r, o) in rails.extra.iter().zip(opened) {
            let Some((ep, cq, av, ctx_mr)) = o else {
                continue;
            };
            let at = 8 + (r.index - 1) * RAIL_NAME_SLOT;
            let own = name_at(&mine, at).and_then(|nm| ip_of(&nm));
            let mut addrs = Vec::with_capacity(n);
            for pe in 0..n {
                let theirs = &all[pe * rec..(pe + 1) * rec];
                let count = u32::from_le_bytes(theirs[0..4].try_into().unwrap()) as usize;
                let name = match name_at(theirs, at) {
                    Some(nm) if r.index <= count => nm,
                    _ => {
                        addrs.push(None);
                        continue;
                    }
                };
                let name = &name[..];
                if pe != my_pe
                    && hosts.get(pe) != hosts.get(my_pe)
                    && own.is_some()
                    && ip_of(name) == own
                {
                    tracing::info!(
                        "rail {} ({}): PE {pe} on another host has this host's address there; not used towards it",
                        r.index,
                        r.name
                    );
                    addrs.push(None);
                    continue;
                }
                addrs.push(Some(av.insert(name, 1)?[0]));
            }
            let _ = r.counts.set(
                (0..NUM_EPS * n)
                    .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                    .collect(),
            );
            let _ = r.ok.set((0..n).map(|_| AtomicU64::new(0)).collect());
            *r.link.write() = Some(RailLink {
                ep,
                cq,
                addrs,
                ctx_mr,
            });
        }
        let _ = rails.peers.set(primary::peers_state(n));
        Ok(())
    }

    /// Traffic and state of every rail (rail 0, the transport's own domain, first).
    pub fn rail_stats(&self) -> Vec<RailStat> {
        self.rails.stats()
    }

    /// Test support: fails rail `index` as a failed completion would (rail 0: towards every peer
    /// an extra rail reaches, as operations without completion there would).
    #[cfg(any(test, feature = "test-support"))]
    #[doc(hidden)]
    pub fn inject_rail_failure(&self, index: usize) {
        let Some(c) = self.conn.get() else { return };
        if index == 0 {
            for pe in (0..c.n_pes as usize).filter(|&p| p != c.my_pe as usize) {
                self.fail_primary(c, pe, "failure injected by a test".into());
            }
        } else if let Some(r) = self.rails.extra.get(index - 1) {
            self.fail_rail(c, r, "failure injected by a test".into());
        }
    }

    /// Posts `x` over the rails: rail 0 (through `primary`, the transport's own post) or an extra
    /// rail, small operations round-robin, large ones striped.
    pub(super) fn rails_rma(
        &self,
        c: &Connected,
        x: RailRma,
        primary: &dyn Fn(u64, u64, u64) -> TResult<()>,
    ) -> TResult<()> {
        let rails = &self.rails;
        // SAFETY: the remote handle was read by remote_blob (a 512-byte handle of NVSHMEM's).
        let handle = unsafe { &(*x.handle).reserved };
        // Rail 0 unless it failed towards the peer.
        let down0 = self.peer_rails(x.pe).is_some_and(|p| p.down0());
        let live: Vec<usize> = (!down0)
            .then_some(0)
            .into_iter()
            .chain(rails.extra.iter().filter_map(|r| {
                (r.failed.get().is_none()
                    && section_key(handle, r.index - 1).is_some()
                    && r.link
                        .read()
                        .as_ref()
                        .is_some_and(|l| l.addrs.get(x.pe).is_some_and(|a| a.is_some())))
                .then_some(r.index)
            }))
            .collect();
        if live.is_empty() {
            return Err(internal(format!(
                "PE {}: rail 0 failed towards it and no other rail can carry this {}",
                x.pe,
                if x.is_put { "put" } else { "get" }
            )));
        }
        let pieces: Vec<(usize, u64, u64)> = if live.len() == 1 {
            vec![(live[0], 0, x.len)]
        } else if x.len < rails.cfg.stripe {
            let k = rails.next.fetch_add(1, Ordering::Relaxed) % live.len();
            vec![(live[k], 0, x.len)]
        } else {
            let per = x
                .len
                .div_ceil(live.len() as u64)
                .next_multiple_of(STRIPE_ALIGN);
            let mut v = Vec::new();
            let mut off = 0;
            for &r in &live {
                if off >= x.len {
                    break;
                }
                let n = per.min(x.len - off);
                v.push((r, off, n));
                off += n;
            }
            v
        };
        for (r, off, n) in pieces {
            let mut posted = r > 0 && self.rail_post(c, &rails.extra[r - 1], handle, &x, off, n)?;
            if !posted && down0 {
                // No rail 0 towards this peer: the other live rails, in order.
                for &o in live.iter().filter(|&&o| o != r) {
                    if self.rail_post(c, &rails.extra[o - 1], handle, &x, off, n)? {
                        posted = true;
                        break;
                    }
                }
                if !posted {
                    return Err(internal(format!(
                        "PE {}: rail 0 failed towards it and no other rail took a piece of {n} bytes",
                        x.pe
                    )));
                }
            }
            if !posted {
                rails.primary_ops.fetch_add(1, Ordering::Relaxed);
                rails.primary_bytes.fetch_add(n, Ordering::Relaxed);
                primary(x.laddr + off, x.raddr + off, n)?;
            }
        }
        Ok(())
    }

    /// Posts one piece on extra rail `r`; `false` when the rail cannot take it (failed, no local
    /// registration there, no free context): the caller uses rail 0.
    fn rail_post(
        &self,
        c: &Connected,
        r: &Rail,
        handle: &[u8],
        x: &RailRma,
        off: u64,
        n: u64,
    ) -> TResult<bool> {
        let Some(key) = section_key(handle, r.index - 1) else {
            return Ok(false);
        };
        let Some(desc) = self.rails.local_desc(r.index - 1, x.laddr + off, n) else {
            return Ok(false);
        };
        // Whether the piece was posted, and why the rail fails (a completion with an error read
        // while waiting for room, or a post that failed).
        let (posted, failure) = {
            let guard = r.link.read();
            let Some(link) = guard.as_ref() else {
                return Ok(false);
            };
            let Some(dest) = link.addrs.get(x.pe).copied().flatten() else {
                return Ok(false);
            };
            let Some(ctx) = r.ctxs.alloc(msg::TAG_RMA, 0) else {
                return Ok(false);
            };
            let group = group::current();
            if let Some(g) = &group {
                g.pending.fetch_add(1, Ordering::AcqRel);
            }
            let slot = x.ep * c.n_pes as usize + x.pe;
            let peer_done = self.peer_progress(c, x.pe, r.index);
            r.ops.lock().insert(
                ctx as usize,
                RailOp {
                    ep: x.ep,
                    pe: x.pe,
                    group,
                    posted: Instant::now(),
                    peer_done,
                    amo: None,
                },
            );
            let counts = r.counts.get().expect("counts set at connect");
            counts[slot].0.fetch_add(1, Ordering::AcqRel);
            let deadline = Instant::now() + self.rails.cfg.timeout;
            let mut reaped_error = None;
            let (laddr, raddr) = (x.laddr + off, x.raddr + off);
            loop {
                // SAFETY: the local range lies in a region registered on this rail (desc), which
                // NVSHMEM keeps valid until quiet (nbi) or until the blocking call returns (it waits
                // for its group); the context is this rail's until its completion is reaped or the
                // endpoint is closed.
                let ret = unsafe {
                    if x.is_put {
                        link.ep
                            .write(laddr as *const u8, n as usize, desc, dest, raddr, key, ctx)
                    } else {
                        link.ep
                            .read(laddr as *mut u8, n as usize, desc, dest, raddr, key, ctx)
                    }
                };
                match ret {
                    Ok(()) => {
                        r.n_ops.fetch_add(1, Ordering::Relaxed);
                        r.n_bytes.fetch_add(n, Ordering::Relaxed);
                        break (true, reaped_error);
                    }
                    Err(e) if e.is_again() && Instant::now() < deadline => {
                        if let (_, Some(why)) = self.rail_reap(c, r, link) {
                            reaped_error.get_or_insert(why);
                        }
                    }
                    Err(e) => {
                        // Never posted: taken back, and the piece goes to rail 0.
                        if let Some(op) = r.ops.lock().remove(&(ctx as usize)) {
                            if let Some(g) = op.group {
                                g.pending.fetch_sub(1, Ordering::AcqRel);
                            }
                        }
                        counts[slot].0.fetch_sub(1, Ordering::AcqRel);
                        r.ctxs.free(ctx);
                        break (false, Some(format!("posting failed: {e}")));
                    }
                }
            }
        };
        if let Some(why) = failure {
            self.fail_rail(c, r, why);
        }
        Ok(posted)
    }

    /// Reads rail `r`'s completions (the caller holds its link).
    fn rail_reap(&self, c: &Connected, r: &Rail, link: &RailLink) -> (usize, Option<String>) {
        // SAFETY: fi_cq_data_entry is plain data; all-zero is a valid value.
        let mut buf: [CqEntry; 16] = unsafe { std::mem::zeroed() };
        let mut handled = 0;
        loop {
            match link.cq.read(&mut buf) {
                Ok(0) => return (handled, None),
                Ok(k) => {
                    for ent in &buf[..k] {
                        match r.ctxs.get(ent.op_context).map(|t| t.0) {
                            Some(msg::TAG_SEND) => {
                                r.ctxs.free(ent.op_context);
                            }
                            Some(msg::TAG_RECV) => {
                                self.rail_msg(c, r, link, ent.op_context, ent.len);
                            }
                            _ => self.rail_finish(c, r, ent.op_context, None),
                        }
                    }
                    handled += k;
                }
                Err(err) => {
                    let msg = format!("rail {} ({}): {}", r.index, r.name, err.error);
                    handled += 1;
                    let (tag, data) = r.ctxs.get(err.context).unwrap_or((msg::TAG_RMA, 0));
                    if tag == msg::TAG_RECV {
                        // A receive the provider gave back (cancelled): not posted again.
                        r.ctxs.free(err.context);
                        continue;
                    }
                    // The operation the error ends: a send's is its waiting AMO (none for an
                    // answer).
                    let op_ctx = if tag == msg::TAG_SEND {
                        r.ctxs.free(err.context);
                        data as *mut c_void
                    } else {
                        err.context
                    };
                    // The rail is to blame when the peer works on other rails (it completed
                    // operations there since this one was posted), or nobody knows whose
                    // operation failed; otherwise the peer may be the one failing (dying,
                    // gone): the operation ends with the error, the rail stays.
                    let blame = match r.ops.lock().get(&(op_ctx as usize)) {
                        Some(op) => self.peer_progress(c, op.pe, r.index) > op.peer_done,
                        None => err.context.is_null(),
                    };
                    if !op_ctx.is_null() {
                        self.rail_finish(c, r, op_ctx, Some(msg.clone()));
                    }
                    if blame {
                        let why = format!("provider error: {}", err.error);
                        r.doom.lock().get_or_insert(why.clone());
                        return (handled, Some(why));
                    }
                }
            }
        }
    }

    /// Accounts the operation of `ctx` on rail `r` as finished, with `error` if it failed.
    fn rail_finish(&self, c: &Connected, r: &Rail, ctx: *mut c_void, error: Option<String>) {
        let Some(op) = r.ops.lock().remove(&(ctx as usize)) else {
            return;
        };
        r.ctxs.free(ctx);
        self.rail_account(c, r, op, error);
    }

    fn rail_account(&self, c: &Connected, r: &Rail, op: RailOp, error: Option<String>) {
        if error.is_none() {
            if let Some(ok) = r.ok.get() {
                ok[op.pe].fetch_add(1, Ordering::AcqRel);
            }
        }
        match op.group {
            Some(g) => {
                if let Some(m) = error {
                    g.error.lock().get_or_insert(m);
                }
                g.pending.fetch_sub(1, Ordering::AcqRel);
            }
            None => {
                if let Some(m) = error {
                    c.eps[op.ep].peer[op.pe].record_error(m);
                }
            }
        }
        if let Some(counts) = r.counts.get() {
            counts[op.ep * c.n_pes as usize + op.pe]
                .1
                .fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Progress of every extra rail: completions, then (every few milliseconds) the bound on
    /// operations without one.
    pub(super) fn rails_progress(&self, c: &Connected) -> usize {
        let mut handled = 0;
        for r in &self.rails.extra {
            let failure = {
                let guard = r.link.read();
                let Some(link) = guard.as_ref() else { continue };
                let (k, err) = self.rail_reap(c, r, link);
                handled += k;
                err.or_else(|| r.doom.lock().take())
                    .or_else(|| self.rail_overdue(c, r))
            };
            if let Some(why) = failure {
                self.fail_rail(c, r, why);
            }
        }
        self.primary_scan(c);
        handled
    }

    /// Completions of operations to `pe` on every rail but `except` (rail 0's on both endpoints):
    /// the peer's progress there. Only successes count on the extra rails, and rail 0's stop
    /// counting when it fails towards the peer: the operations a failure ends are no progress.
    fn peer_progress(&self, c: &Connected, pe: usize, except: usize) -> u64 {
        let mut sum = 0;
        if except != 0 {
            sum += self.primary_progress(c, pe);
        }
        for r in self.rails.extra.iter().filter(|r| r.index != except) {
            if let Some(ok) = r.ok.get() {
                sum += ok[pe].load(Ordering::Acquire);
            }
        }
        sum
    }

    /// Why rail `r` fails now: an operation older than the rail timeout to a peer that completed
    /// operations on other rails since it was posted (the peer works, this rail does not). One to a
    /// peer that made no progress anywhere is not the rail's fault (a stopped or dying peer: the
    /// dead-peer handling and quiet's timeout deal with it); one to a peer found gone ends with
    /// that error.
    fn rail_overdue(&self, c: &Connected, r: &Rail) -> Option<String> {
        {
            let mut last = r.last_scan.lock();
            if last.elapsed() < Duration::from_millis(2) {
                return None;
            }
            *last = Instant::now();
        }
        let timeout = self.rails.cfg.timeout;
        let mut gone = Vec::new();
        // Per peer: its overdue operations here, and when the first of them became overdue.
        let mut suspects: Vec<(usize, usize, Instant)> = Vec::new();
        {
            let ops = r.ops.lock();
            for (ctx, op) in ops.iter() {
                if op.posted.elapsed() > timeout {
                    if c.peers[op.pe].is_gone() {
                        gone.push(*ctx);
                    } else if self.peer_progress(c, op.pe, r.index) > op.peer_done {
                        let due = op.posted + timeout;
                        match suspects.iter_mut().find(|s| s.0 == op.pe) {
                            Some(s) => {
                                s.1 += 1;
                                s.2 = s.2.min(due);
                            }
                            None => suspects.push((op.pe, 1, due)),
                        }
                    }
                }
            }
        }
        // The peer must also answer a probe on another rail sent after that: a peer that was
        // stopped (or is dying) answers none, even when some of its operations completed first.
        let overdue: usize = suspects
            .into_iter()
            .filter(|&(pe, _, due)| self.peer_answers(c, pe, due, r.index) != Some(false))
            .map(|s| s.1)
            .sum();
        for ctx in gone {
            let pe = r.ops.lock().get(&ctx).map(|o| o.pe);
            if let Some(pe) = pe {
                let m = self.gone_error(c, pe).message;
                self.rail_finish(c, r, ctx as *mut c_void, Some(m));
            }
        }
        (overdue > 0).then(|| {
            format!("{overdue} operation(s) without completion after {timeout:?} while their peer works on other rails")
        })
    }

    /// Fails rail `r` (once): logs it, closes its endpoint, and ends every operation still in
    /// flight on it with an error. The caller holds none of the rail's locks.
    fn fail_rail(&self, c: &Connected, r: &Rail, why: String) {
        if r.failed.set(why.clone()).is_err() {
            return;
        }
        // Closing the endpoint cancels what the provider holds: nothing of it lands later.
        let link = r.link.write().take();
        drop(link);
        let ops: Vec<(usize, RailOp)> = r.ops.lock().drain().collect();
        let left = 1 + self
            .rails
            .extra
            .iter()
            .filter(|x| x.failed.get().is_none())
            .count();
        let n_ops = ops.len();
        for (ctx, op) in ops {
            r.ctxs.free(ctx as *mut c_void);
            let m = format!("rail {} ({}{RAIL_FAILED}{why}", r.index, r.name);
            self.rail_account(c, r, op, Some(m));
        }
        // Its AMOs have ended (with their errors): their peers' atomics move now.
        let moved = self.move_atomics_off(r.index);
        let moved = if moved.is_empty() {
            String::new()
        } else {
            format!("; {}", moved.join("; "))
        };
        tracing::warn!(
            "rail {} ({}) failed: {why}; its {n_ops} operation(s) in flight end with an error, new operations use the {left} remaining rail(s){moved}; the rail stays down for the job",
            r.index,
            r.name,
        );
    }
}

#[cfg(test)]
mod tests;
