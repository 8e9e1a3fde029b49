//! Provider choice and `fi_getinfo`.
use std::ffi::{CStr, CString};
use std::fmt;

use ofi_libfabric_sys::bindgen as fi;

use super::error::{Error, Result};

/// libfabric API version this crate asks for (2.0: the `efa-direct` fabric exists from 2.0 on).
pub const API_VERSION: u32 = 2 << 16;

/// A provider, named as `NVSHMEM_LIBFABRIC_PROVIDER` names it (extended with `tcp` and `shm`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// AWS EFA, RDM fabric `efa` (RMA, emulated atomics, FI_HMEM).
    Efa,
    /// AWS EFA, fabric `efa-direct` (device RMA only; FI_MR_LOCAL, FI_CONTEXT2).
    EfaDirect,
    /// InfiniBand/RoCE verbs under `ofi_rxm`.
    Verbs,
    /// HPE Slingshot.
    Cxi,
    /// `tcp;ofi_rxm`: RMA and atomics on host memory.
    Tcp,
    /// Shared memory (one node): RMA, atomics, FI_HMEM (CUDA).
    Shm,
}

impl Provider {
    /// Parses a provider name: `efa`, `efa-direct`, `verbs`, `cxi`, `tcp` (or `tcp;ofi_rxm`), `shm`.
    pub fn parse(name: &str) -> Result<Provider> {
        match name.trim().to_ascii_lowercase().as_str() {
            "efa" => Ok(Provider::Efa),
            "efa-direct" | "efa_direct" => Ok(Provider::EfaDirect),
            "verbs" | "verbs;ofi_rxm" => Ok(Provider::Verbs),
            "cxi" | "slingshot" => Ok(Provider::Cxi),
            "tcp" | "tcp;ofi_rxm" => Ok(Provider::Tcp),
            "shm" => Ok(Provider::Shm),
            other => Err(Error::invalid(format!(
                "unknown libfabric provider '{other}' (expected efa, efa-direct, verbs, cxi, tcp, shm)"
            ))),
        }
    }

    /// The provider a `fi_getinfo` answer names (`fabric_attr->prov_name`, `fabric_attr->name`);
    /// `None` for one this crate does not know. With [`super::caps`]'s identity table, the one
    /// place a provider's names are matched.
    pub fn of_answer(prov_name: &str, fabric_name: &str) -> Option<Provider> {
        // A utility provider layered on a core one is named `core;utility` (`tcp;ofi_rxm`).
        let core = prov_name.split(';').next().unwrap_or("");
        match core {
            "efa" if fabric_name == "efa-direct" => Some(Provider::EfaDirect),
            "efa" => Some(Provider::Efa),
            "verbs" => Some(Provider::Verbs),
            "cxi" => Some(Provider::Cxi),
            "tcp" => Some(Provider::Tcp),
            "shm" => Some(Provider::Shm),
            _ => None,
        }
    }

    /// The `prov_name` hint given to `fi_getinfo`.
    pub fn prov_name(&self) -> &'static str {
        match self {
            Provider::Efa | Provider::EfaDirect => "efa",
            Provider::Verbs => "verbs;ofi_rxm",
            Provider::Cxi => "cxi",
            Provider::Tcp => "tcp;ofi_rxm",
            Provider::Shm => "shm",
        }
    }

    /// The fabric name required of the answer, where the provider has several fabrics.
    pub fn fabric_name(&self) -> Option<&'static str> {
        match self {
            Provider::Efa => Some("efa"),
            Provider::EfaDirect => Some("efa-direct"),
            _ => None,
        }
    }

    /// Short name used in logs and by `parse`.
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Efa => "efa",
            Provider::EfaDirect => "efa-direct",
            Provider::Verbs => "verbs",
            Provider::Cxi => "cxi",
            Provider::Tcp => "tcp",
            Provider::Shm => "shm",
        }
    }

    /// The fabrics tried, in order, for `NVSHMEM_LIBFABRIC_PROVIDER` (`named`; `None`: the
    /// automatic order), each with whether FI_HMEM is required of it. `efa` tries the `efa-direct`
    /// fabric first, taken only with FI_HMEM (its NIC then reads and writes GPU memory itself), and
    /// then the RDM fabric (GPU memory staged); `efa-direct` names the one fabric.
    pub fn candidates(named: Option<&Provider>) -> Vec<(Provider, bool)> {
        let list: Vec<Provider> = match named {
            Some(p) => vec![p.clone()],
            None => Provider::auto_order().to_vec(),
        };
        list.into_iter()
            .flat_map(|p| match p {
                Provider::Efa => vec![(Provider::EfaDirect, true), (Provider::Efa, false)],
                p => vec![(p, false)],
            })
            .collect()
    }

    /// Order tried when no provider is named: hardware first, then the software fabrics.
    pub fn auto_order() -> [Provider; 5] {
        [
            Provider::Efa,
            Provider::Cxi,
            Provider::Verbs,
            Provider::Shm,
            Provider::Tcp,
        ]
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the caller needs from the provider.
#[derive(Clone, Debug)]
pub struct InfoRequest {
    /// Which provider.
    pub provider: Provider,
    /// Require FI_HMEM (device memory registration).
    pub hmem: bool,
    /// Ask for FI_ATOMIC (the answer says whether it was granted: `Info::has_atomics`).
    pub atomics: bool,
    /// Ask for FI_MSG (send/receive).
    pub msg: bool,
}

/// An owned `fi_info` (one entry, duplicated out of the provider's list).
pub struct Info {
    raw: *mut fi::fi_info,
}

// SAFETY: an fi_info is plain data owned by this value; libfabric does not mutate it behind us.
unsafe impl Send for Info {}
// SAFETY: only read through shared references.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: raw came from fi_dupinfo and is freed once.
        unsafe { fi::fi_freeinfo(self.raw) }
    }
}

impl Clone for Info {
    fn clone(&self) -> Self {
        // SAFETY: raw is a valid fi_info.
        let raw = unsafe { fi::fi_dupinfo(self.raw) };
        assert!(!raw.is_null(), "fi_dupinfo: out of memory");
        Info { raw }
    }
}

fn cstr_or_empty(p: *const libc::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libfabric strings are NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

const BASE_CAPS: u64 =
    (fi::FI_RMA | fi::FI_READ | fi::FI_WRITE | fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;

impl Info {
    /// Asks libfabric for an RDM endpoint of the requested provider. With `atomics` set, an answer
    /// without FI_ATOMIC is still accepted (see `has_atomics`): the caller then applies atomics itself.
    ///
    /// Transmit operations default to FI_DELIVERY_COMPLETE (a completion means the data is visible at
    /// the target, which quiet and put-with-signal rely on) where the provider offers it.
    pub fn get(req: &InfoRequest) -> Result<Info> {
        let mut last = None;
        for atomics in [true, false] {
            if atomics && !req.atomics {
                continue;
            }
            for dc in [true, false] {
                match Self::get_caps(req, atomics, dc) {
                    Ok(i) => return Ok(i),
                    Err(e) => {
                        tracing::debug!("{e}");
                        last = Some(e)
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::invalid("fi_getinfo: no attempt")))
    }

    /// Whether transmit operations default to FI_DELIVERY_COMPLETE.
    pub fn delivery_complete(&self) -> bool {
        // SAFETY: tx_attr is always set in a getinfo answer.
        unsafe { (*(*self.raw).tx_attr).op_flags & fi::FI_DELIVERY_COMPLETE as u64 != 0 }
    }

    /// Whether sends to one peer are delivered (and their receives completed) in the order they
    /// were posted: FI_ORDER_SAS in both `tx_attr->msg_order` and `rx_attr->msg_order` of the
    /// answer (the orderings the endpoint opened from it keeps).
    pub fn sends_in_order(&self) -> bool {
        let sas = fi::FI_ORDER_SAS as u64;
        // SAFETY: tx_attr and rx_attr are always set in a getinfo answer.
        unsafe {
            (*(*self.raw).tx_attr).msg_order & sas != 0
                && (*(*self.raw).rx_attr).msg_order & sas != 0
        }
    }

    fn get_caps(req: &InfoRequest, atomics: bool, dc: bool) -> Result<Info> {
        Self::get_list(req, atomics, dc, false).map(|mut v| v.remove(0))
    }

    /// The answers to one request (the first only unless `all`); never empty when `Ok`.
    fn get_list(req: &InfoRequest, atomics: bool, dc: bool, all: bool) -> Result<Vec<Info>> {
        let ctx = || {
            format!(
                "fi_getinfo(provider={}, hmem={}, atomics={atomics}, delivery_complete={dc})",
                req.provider, req.hmem
            )
        };
        // SAFETY: fi_allocinfo returns a zeroed fi_info with sub-attributes allocated; every string we
        // put into it is strdup'ed so fi_freeinfo may free it.
        unsafe {
            let hints = fi::fi_allocinfo();
            if hints.is_null() {
                return Err(Error::from_ret(-(libc::ENOMEM as i64), ctx()));
            }
            let mut caps = BASE_CAPS;
            if atomics {
                caps |= fi::FI_ATOMIC as u64;
            }
            if req.msg {
                caps |= (fi::FI_MSG | fi::FI_SEND | fi::FI_RECV) as u64;
            }
            if req.hmem {
                caps |= fi::FI_HMEM;
            }
            (*hints).caps = caps;
            (*hints).mode = fi::FI_CONTEXT | fi::FI_CONTEXT2;
            (*(*hints).ep_attr).type_ = fi::fi_ep_type_FI_EP_RDM;
            let d = (*hints).domain_attr;
            (*d).threading = fi::fi_threading_FI_THREAD_SAFE;
            (*d).mr_mode = (fi::FI_MR_LOCAL
                | fi::FI_MR_VIRT_ADDR
                | fi::FI_MR_ALLOCATED
                | fi::FI_MR_PROV_KEY
                | fi::FI_MR_ENDPOINT
                | fi::FI_MR_HMEM) as i32;
            (*d).av_type = fi::fi_av_type_FI_AV_TABLE;
            let prov = CString::new(req.provider.prov_name()).expect("no NUL");
            (*(*hints).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
            if let Some(fabric) = req.provider.fabric_name() {
                let f = CString::new(fabric).expect("no NUL");
                (*(*hints).fabric_attr).name = libc::strdup(f.as_ptr());
            }
            (*(*hints).tx_attr).op_flags = if dc {
                fi::FI_DELIVERY_COMPLETE as u64
            } else {
                0
            };
            let mut out: *mut fi::fi_info = std::ptr::null_mut();
            let ret = fi::fi_getinfo(
                API_VERSION,
                std::ptr::null(),
                std::ptr::null(),
                0,
                hints,
                &mut out,
            );
            fi::fi_freeinfo(hints);
            if ret != 0 {
                return Err(Error::from_ret(ret as i64, ctx()));
            }
            if out.is_null() {
                return Err(Error::from_ret(-(fi::FI_ENODATA as i64), ctx()));
            }
            let mut answers = Vec::new();
            let mut cur = out;
            while !cur.is_null() {
                // fi_dupinfo copies one entry (its `next` is not followed).
                let dup = fi::fi_dupinfo(cur);
                if dup.is_null() {
                    fi::fi_freeinfo(out);
                    return Err(Error::from_ret(-(libc::ENOMEM as i64), ctx()));
                }
                answers.push(Info { raw: dup });
                if !all {
                    break;
                }
                cur = (*cur).next;
            }
            fi::fi_freeinfo(out);
            Ok(answers)
        }
    }

    /// Every domain (NIC; for tcp, every interface) that answers the request `primary` was
    /// answered for with the same RMA capabilities: one entry per domain name, in libfabric's order.
    /// The rails of a PE are chosen among these (see the transport's `rails`).
    pub fn domains_like(req: &InfoRequest, primary: &Info) -> Result<Vec<Info>> {
        let req = InfoRequest {
            hmem: primary.has_hmem(),
            ..req.clone()
        };
        let all = Self::get_list(
            &req,
            primary.has_atomics(),
            primary.delivery_complete(),
            true,
        )?;
        let mut out: Vec<Info> = Vec::new();
        for i in all {
            tracing::trace!(
                "rails: answer {} {} {} caps {:#x}",
                i.provider_name(),
                i.fabric_name(),
                i.domain_name(),
                i.caps()
            );
            if i.provider_name() == primary.provider_name()
                // Rails carry RMA (and GPU memory where rail 0 does): the rest may differ (the
                // loopback interface, for one, answers without FI_REMOTE_COMM).
                && i.caps() & (BASE_CAPS | fi::FI_HMEM) == primary.caps() & (BASE_CAPS | fi::FI_HMEM)
                && !out.iter().any(|o| o.domain_name() == i.domain_name())
            {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// The raw pointer, for calls into libfabric.
    pub fn as_ptr(&self) -> *mut fi::fi_info {
        self.raw
    }

    /// Provider name as libfabric reports it (e.g. `shm`, `tcp;ofi_rxm`).
    pub fn provider_name(&self) -> String {
        // SAFETY: fabric_attr is always set in a getinfo answer.
        cstr_or_empty(unsafe { (*(*self.raw).fabric_attr).prov_name })
    }

    /// Fabric name.
    pub fn fabric_name(&self) -> String {
        // SAFETY: as above.
        cstr_or_empty(unsafe { (*(*self.raw).fabric_attr).name })
    }

    /// Domain name (the NIC, for hardware providers).
    pub fn domain_name(&self) -> String {
        // SAFETY: domain_attr is always set in a getinfo answer.
        cstr_or_empty(unsafe { (*(*self.raw).domain_attr).name })
    }

    /// The NIC's PCI address (`domain, bus, device, function`) where the provider fills in
    /// `nic->bus_attr` (EFA, verbs; not tcp or shm).
    pub fn pci_addr(&self) -> Option<(u16, u8, u8, u8)> {
        // SAFETY: `nic` and its `bus_attr` are checked for NULL; the PCI member is read only for a
        // PCI bus.
        unsafe {
            let nic = (*self.raw).nic;
            if nic.is_null() || (*nic).bus_attr.is_null() {
                return None;
            }
            let bus = &*(*nic).bus_attr;
            (bus.bus_type == fi::fi_bus_type_FI_BUS_PCI).then(|| {
                let p = bus.attr.pci;
                (p.domain_id, p.bus_id, p.device_id, p.function_id)
            })
        }
    }

    /// Capabilities granted.
    pub fn caps(&self) -> u64 {
        // SAFETY: valid fi_info.
        unsafe { (*self.raw).caps }
    }

    /// Mode bits the provider requires of us.
    pub fn mode(&self) -> u64 {
        // SAFETY: valid fi_info.
        unsafe { (*self.raw).mode }
    }

    /// Memory registration mode bits.
    pub fn mr_mode(&self) -> u64 {
        // SAFETY: valid fi_info.
        unsafe { (*(*self.raw).domain_attr).mr_mode as u32 as u64 }
    }

    /// Whether FI_ATOMIC was granted.
    pub fn has_atomics(&self) -> bool {
        self.caps() & fi::FI_ATOMIC as u64 != 0
    }

    /// Whether FI_HMEM was granted.
    pub fn has_hmem(&self) -> bool {
        self.caps() & fi::FI_HMEM != 0
    }

    /// Whether remote addresses are virtual addresses (else offsets into the registration).
    pub fn virt_addr(&self) -> bool {
        self.mr_mode() & fi::FI_MR_VIRT_ADDR as u64 != 0
    }

    /// Whether local buffers must be registered and passed as descriptors.
    pub fn mr_local(&self) -> bool {
        self.mr_mode() & fi::FI_MR_LOCAL as u64 != 0
    }

    /// Whether registrations must be bound to an endpoint.
    pub fn mr_endpoint(&self) -> bool {
        self.mr_mode() & fi::FI_MR_ENDPOINT as u64 != 0
    }

    /// Transmit queue depth (`tx_attr->size`).
    pub fn tx_size(&self) -> usize {
        // SAFETY: tx_attr is always set in a getinfo answer.
        unsafe { (*(*self.raw).tx_attr).size }
    }

    /// Receive queue depth (`rx_attr->size`).
    pub fn rx_size(&self) -> usize {
        // SAFETY: rx_attr is always set in a getinfo answer.
        unsafe { (*(*self.raw).rx_attr).size }
    }

    /// How many endpoints the domain admits (`domain_attr->ep_cnt`) and how many transmit contexts
    /// (`domain_attr->tx_ctx_cnt`, `domain_attr->max_ep_tx_ctx` per endpoint): the bound on GDA
    /// queues with a send queue of their own (docs/gda-queues.md).
    pub fn endpoint_limits(&self) -> (usize, usize, usize) {
        // SAFETY: domain_attr is always set in a getinfo answer.
        let d = unsafe { &*(*self.raw).domain_attr };
        (d.ep_cnt, d.tx_ctx_cnt, d.max_ep_tx_ctx)
    }

    /// Largest message.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: ep_attr is always set in a getinfo answer.
        unsafe { (*(*self.raw).ep_attr).max_msg_size }
    }

    /// Largest inject size.
    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr is always set in a getinfo answer.
        unsafe { (*(*self.raw).tx_attr).inject_size }
    }

    /// Whether data progress is manual (the application must poll for transfers to advance).
    pub fn manual_progress(&self) -> bool {
        // SAFETY: domain_attr is always set.
        unsafe {
            (*(*self.raw).domain_attr).__bindgen_anon_1.data_progress
                == fi::fi_progress_FI_PROGRESS_MANUAL
        }
    }

    /// Size of remote CQ data (immediate) the provider carries.
    pub fn cq_data_size(&self) -> usize {
        // SAFETY: domain_attr is always set.
        unsafe { (*(*self.raw).domain_attr).cq_data_size }
    }
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Info")
            .field("provider", &self.provider_name())
            .field("fabric", &self.fabric_name())
            .field("domain", &self.domain_name())
            .field("caps", &format_args!("{:#x}", self.caps()))
            .field("mode", &format_args!("{:#x}", self.mode()))
            .field("mr_mode", &format_args!("{:#x}", self.mr_mode()))
            .finish()
    }
}

/// The libfabric library version, as `major.minor`.
pub fn library_version() -> (u32, u32) {
    // SAFETY: fi_version has no preconditions.
    let v = unsafe { fi::fi_version() };
    (v >> 16, v & 0xffff)
}

/// A NIC as libfabric lists it: one domain of a provider, with its PCI address where the provider
/// fills in the NIC attributes (`fi_info::nic->bus_attr`; EFA and verbs do, tcp and shm do not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicAddr {
    pub provider: String,
    pub fabric: String,
    /// The domain name (the device name: `rdmap16s27` for EFA, the interface for tcp).
    pub domain: String,
    /// `domain:bus:device.function`, as PCI numbers.
    pub pci: Option<(u16, u8, u8, u8)>,
}

/// Calls `each` with every entry of libfabric's answer to a getinfo without hints (nothing when it
/// answers nothing).
fn for_each_unhinted_info(mut each: impl FnMut(&fi::fi_info)) {
    // SAFETY: plain getinfo with no hints; the entries are only read, each while the list lives,
    // and the list is freed before returning.
    unsafe {
        let mut list: *mut fi::fi_info = std::ptr::null_mut();
        if fi::fi_getinfo(
            API_VERSION,
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            &mut list,
        ) != 0
        {
            return;
        }
        let mut cur = list;
        while !cur.is_null() {
            each(&*cur);
            cur = (*cur).next;
        }
        fi::fi_freeinfo(list);
    }
}

/// Every domain libfabric answers for (no hints), once per provider and domain, with its PCI
/// address where known. Empty when libfabric answers nothing.
pub fn list_nics() -> Vec<NicAddr> {
    let mut out: Vec<NicAddr> = Vec::new();
    for_each_unhinted_info(|info| {
        // SAFETY: a getinfo answer always has fabric and domain attributes; `nic` and its
        // `bus_attr` are checked for NULL, and the PCI member is read only for a PCI bus.
        let (provider, fabric, domain, pci) = unsafe {
            let nic = info.nic;
            let mut pci = None;
            if !nic.is_null() && !(*nic).bus_attr.is_null() {
                let bus = &*(*nic).bus_attr;
                if bus.bus_type == fi::fi_bus_type_FI_BUS_PCI {
                    let p = bus.attr.pci;
                    pci = Some((p.domain_id, p.bus_id, p.device_id, p.function_id));
                }
            }
            (
                cstr_or_empty((*info.fabric_attr).prov_name),
                cstr_or_empty((*info.fabric_attr).name),
                cstr_or_empty((*info.domain_attr).name),
                pci,
            )
        };
        if !out
            .iter()
            .any(|n| n.provider == provider && n.domain == domain)
        {
            out.push(NicAddr {
                provider,
                fabric,
                domain,
                pci,
            });
        }
    });
    out
}

/// Names of every provider libfabric answers for (no hints), deduplicated, for the probe.
pub fn list_providers() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for_each_unhinted_info(|info| {
        // SAFETY: a getinfo answer always has fabric attributes.
        let (prov, fab) = unsafe {
            (
                cstr_or_empty((*info.fabric_attr).prov_name),
                cstr_or_empty((*info.fabric_attr).name),
            )
        };
        if !out.iter().any(|(p, f)| *p == prov && *f == fab) {
            out.push((prov, fab));
        }
    });
    out
}
