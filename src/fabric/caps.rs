//! What the provider can do, built once from libfabric's `fi_getinfo` answer.
//!
//! Everything the rest of the crate decides about a provider (stage GPU memory or hand it to the
//! NIC, provider or target-applied atomics, per-peer transmit lanes, whether the progress thread may
//! sleep, whether GDA ops exist) is decided from a [`Caps`] value, never from a provider's name.
//! Most fields are read from the answer (FI_HMEM, FI_ATOMIC, data progress, inject size, delivery
//! complete). What the answer does not say (whether a hardware NIC moves the bytes by DMA or the
//! provider copies them with CUDA calls of its own, provider quirks) is known per provider, and that
//! knowledge lives in one table here, [`Identity::of`], keyed by the [`Provider`] that
//! [`Provider::of_answer`] maps the answer's names to. A new provider is one row there.
use std::fmt;

use super::info::{Info, Provider};

/// The plain fields of a `fi_getinfo` answer that [`Caps`] is built from (also built by hand in
/// tests, without libfabric).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// `fabric_attr->prov_name` (e.g. `shm`, `tcp;ofi_rxm`, `efa`).
    pub prov_name: String,
    /// `fabric_attr->name` (e.g. `efa-direct`, `127.0.0.0/8`).
    pub fabric_name: String,
    /// `domain_attr->name` (the NIC, for hardware providers).
    pub domain_name: String,
    /// FI_HMEM granted.
    pub hmem: bool,
    /// FI_ATOMIC granted.
    pub atomics: bool,
    /// `domain_attr->progress == FI_PROGRESS_MANUAL`.
    pub manual_progress: bool,
    /// `tx_attr->inject_size`.
    pub inject_size: usize,
    /// `ep_attr->max_msg_size`.
    pub max_msg_size: usize,
    /// Transmit operations default to FI_DELIVERY_COMPLETE.
    pub delivery_complete: bool,
    /// FI_ORDER_SAS in the answer's transmit and receive `msg_order`.
    pub sends_in_order: bool,
}

impl Answer {
    /// The fields of an answer libfabric gave.
    pub fn of(info: &Info) -> Answer {
        Answer {
            prov_name: info.provider_name(),
            fabric_name: info.fabric_name(),
            domain_name: info.domain_name(),
            hmem: info.has_hmem(),
            atomics: info.has_atomics(),
            manual_progress: info.manual_progress(),
            inject_size: info.inject_size(),
            max_msg_size: info.max_msg_size(),
            delivery_complete: info.delivery_complete(),
            sends_in_order: info.sends_in_order(),
        }
    }
}

/// What a provider is, beyond what its `fi_getinfo` answer says: the one table of provider
/// identity (a new provider is one row in [`Identity::of`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Identity {
    /// A hardware NIC carries the data.
    nic: bool,
    /// With FI_HMEM, the NIC reads and writes GPU memory by DMA (GPUDirect RDMA) and the provider
    /// never copies it with CUDA calls of its own. Not so for the software providers, which copy
    /// GPU memory with `cudaMemcpy` on the legacy default stream (it waits for the running kernel:
    /// the one waiting in quiet for that copy), nor for efa's RDM fabric, whose protocols copy
    /// through host bounce buffers.
    nic_moves_gpu_memory: bool,
    /// With FI_ATOMIC, the NIC applies atomics (else the provider emulates them in its progress
    /// engine, at the target, which the library's target-applied AMOs do as well).
    nic_atomics: bool,
    /// Non-fetching atomics must be issued as fetching ones (libfabric 2.1's shm releases the
    /// inject buffer of a non-fetching atomic sent with FI_DELIVERY_COMPLETE twice).
    nonfetch_atomics_as_fetch: bool,
    /// One endpoint answers completions in posting order and never answers an operation to a dead
    /// peer or through a released key: every operation to a peer leaves through transmit
    /// endpoints of its own (shm; see the transport's `lanes`).
    per_peer_lanes: bool,
    /// Endpoint names are chosen by the caller and read by the provider as C strings (shm's
    /// `fi_shm://` region names).
    named_endpoints: bool,
    /// The provider's FI_HMEM path shares GPU memory by legacy CUDA IPC, which CUDA VMM
    /// allocations do not export (shm).
    hmem_needs_legacy_ipc: bool,
    /// The domain has EFA's GPU Direct Async ops table (`efa gda ops`; efa-direct only).
    gda_ops: bool,
    /// GPU memory is registered by dmabuf (`FI_MR_DMABUF`): the NIC maps it through a dmabuf the
    /// driver exports. efa's implicit path registered CUDA memory by address (`ibv_reg_mr`, which
    /// needs nvidia-peermem) up to libfabric 2.4 (ofiwg/libfabric#12019); an explicit dmabuf works
    /// from API 1.20 on, in every release.
    gpu_by_dmabuf: bool,
    /// CUDA VMM memory handed to the provider fails its first RMA: the RDM protocols set
    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` per pointer, which VMM allocations refuse
    /// (ofiwg/libfabric#12853; efa's RDM fabric).
    hmem_vmm_sync_memops: bool,
    /// A send asked for FI_DELIVERY_COMPLETE goes by a protocol that has one transfer in flight
    /// per peer (libfabric 2.1's shm: `smr_select_proto` picks SAR for it at any size, and SAR
    /// refuses a second transfer to the peer with -FI_EAGAIN until the first one's handshake,
    /// which needs the receiver's progress, is over). Sends that need no delivery completion
    /// are then posted with FI_TRANSMIT_COMPLETE (docs/staged-path.md, docs/ordering.md).
    dc_sends_serialise: bool,
    /// The provider is rxm over tcp, whose eager limit decides how staged messages travel
    /// (`fabric::rxm`: the library raises it for them; verbs;ofi_rxm carries no staged traffic
    /// worth the memory).
    rxm_staged: bool,
}

impl Identity {
    /// The provider identity table.
    fn of(p: Option<&Provider>) -> Identity {
        let none = Identity::default();
        match p {
            Some(Provider::EfaDirect) => Identity {
                nic: true,
                nic_moves_gpu_memory: true,
                gda_ops: true,
                gpu_by_dmabuf: true,
                ..none
            },
            Some(Provider::Efa) => Identity {
                nic: true,
                gpu_by_dmabuf: true,
                hmem_vmm_sync_memops: true,
                ..none
            },
            Some(Provider::Verbs) | Some(Provider::Cxi) => Identity {
                nic: true,
                nic_moves_gpu_memory: true,
                nic_atomics: true,
                ..none
            },
            Some(Provider::Shm) => Identity {
                nonfetch_atomics_as_fetch: true,
                dc_sends_serialise: true,
                per_peer_lanes: true,
                named_endpoints: true,
                hmem_needs_legacy_ipc: true,
                ..none
            },
            Some(Provider::Tcp) => Identity {
                rxm_staged: true,
                ..none
            },
            // One this crate does not know: nothing assumed.
            None => none,
        }
    }
}

/// Whether `p` is rxm over tcp, for decisions made before libfabric answers (the load-time hook of
/// [`super::rxm`]).
pub fn rxm_staged(p: &Provider) -> bool {
    Identity::of(Some(p)).rxm_staged
}

/// The provider's capabilities, as the crate acts on them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The provider, as [`Provider::of_answer`] maps the answer's names (`None`: unknown).
    pub provider: Option<Provider>,
    /// Names from the answer, for logs.
    pub prov_name: String,
    /// Fabric name from the answer.
    pub fabric_name: String,
    /// Domain name from the answer.
    pub domain_name: String,
    /// FI_HMEM granted (GPU memory may be registered).
    pub hmem: bool,
    /// A hardware NIC carries the data.
    pub nic: bool,
    /// The NIC writes and reads GPU memory itself: FI_HMEM granted and a NIC that moves GPU memory
    /// by DMA (see [`Identity`]).
    pub nic_writes_gpu: bool,
    /// FI_ATOMIC granted.
    pub atomics: bool,
    /// FI_ATOMIC granted and applied by the NIC.
    pub native_atomics: bool,
    /// Non-fetching provider atomics are issued as fetching ones.
    pub nonfetch_atomics_as_fetch: bool,
    /// Sends with FI_DELIVERY_COMPLETE go one per peer at a time (see [`Identity`]).
    pub dc_sends_serialise: bool,
    /// rxm over tcp: its eager limit decides how staged messages travel ([`super::rxm`]).
    pub rxm_staged: bool,
    /// Operations to each peer leave through transmit endpoints of their own.
    pub per_peer_lanes: bool,
    /// Endpoints are opened with names of the caller's (C strings).
    pub named_endpoints: bool,
    /// GPU memory handed to the provider must be legacy-IPC memory (not CUDA VMM).
    pub hmem_needs_legacy_ipc: bool,
    /// Data progress is manual: incoming RMA lands only while this process polls.
    pub manual_progress: bool,
    /// EFA's GPU Direct Async ops exist on the domain.
    pub gda_ops: bool,
    /// GPU memory is registered by dmabuf by default (FI_HMEM granted and a provider whose NIC maps
    /// GPU memory through a dmabuf; see [`Identity`]).
    pub gpu_by_dmabuf: bool,
    /// CUDA VMM memory handed to the provider fails at its first RMA (FI_HMEM granted; efa RDM,
    /// ofiwg/libfabric#12853).
    pub hmem_vmm_sync_memops: bool,
    /// Largest injected message.
    pub inject_size: usize,
    /// Largest message.
    pub max_msg_size: usize,
    /// Transmit operations complete only once delivered.
    pub delivery_complete: bool,
    /// Sends to one peer arrive, and complete at the target, in posting order (FI_ORDER_SAS): the
    /// staged path's messages then carry a fence (`fence`) instead of waiting for it.
    pub sends_in_order: bool,
}

impl Caps {
    /// The capabilities of the provider behind `info`.
    pub fn of(info: &Info) -> Caps {
        Caps::from_answer(&Answer::of(info))
    }

    /// The capabilities an answer describes.
    pub fn from_answer(a: &Answer) -> Caps {
        let provider = Provider::of_answer(&a.prov_name, &a.fabric_name);
        let id = Identity::of(provider.as_ref());
        Caps {
            provider,
            prov_name: a.prov_name.clone(),
            fabric_name: a.fabric_name.clone(),
            domain_name: a.domain_name.clone(),
            hmem: a.hmem,
            nic: id.nic,
            nic_writes_gpu: a.hmem && id.nic_moves_gpu_memory,
            atomics: a.atomics,
            native_atomics: a.atomics && id.nic_atomics,
            nonfetch_atomics_as_fetch: a.atomics && id.nonfetch_atomics_as_fetch,
            dc_sends_serialise: id.dc_sends_serialise,
            rxm_staged: id.rxm_staged,
            per_peer_lanes: id.per_peer_lanes,
            named_endpoints: id.named_endpoints,
            hmem_needs_legacy_ipc: a.hmem && id.hmem_needs_legacy_ipc,
            manual_progress: a.manual_progress,
            gda_ops: id.gda_ops,
            gpu_by_dmabuf: a.hmem && id.gpu_by_dmabuf,
            hmem_vmm_sync_memops: a.hmem && id.hmem_vmm_sync_memops,
            inject_size: a.inject_size,
            max_msg_size: a.max_msg_size,
            delivery_complete: a.delivery_complete,
            sends_in_order: a.sends_in_order,
        }
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self
            .provider
            .as_ref()
            .map_or("unknown provider".to_string(), |p| p.to_string());
        write!(
            f,
            "{name} ({} / {} / {}): hmem={} nic={} nic_writes_gpu={} atomics={} native_atomics={} \
             per_peer_lanes={} manual_progress={} gda_ops={} gpu_by_dmabuf={} inject={} max_msg={} \
             delivery_complete={} sends_in_order={}",
            self.prov_name,
            self.fabric_name,
            self.domain_name,
            self.hmem,
            self.nic,
            self.nic_writes_gpu,
            self.atomics,
            self.native_atomics,
            self.per_peer_lanes,
            self.manual_progress,
            self.gda_ops,
            self.gpu_by_dmabuf,
            self.inject_size,
            self.max_msg_size,
            self.delivery_complete,
            self.sends_in_order
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An answer as libfabric 2.1 gives it for `prov` (names as the provider reports them).
    pub(crate) fn answer(prov: &str, fabric: &str, hmem: bool, atomics: bool) -> Answer {
        Answer {
            prov_name: prov.into(),
            fabric_name: fabric.into(),
            domain_name: "d".into(),
            hmem,
            atomics,
            manual_progress: !(prov == "efa" && fabric == "efa-direct"),
            inject_size: 32,
            max_msg_size: 1 << 30,
            delivery_complete: true,
            sends_in_order: prov != "efa" || fabric != "efa-direct",
        }
    }

    #[test]
    fn answers_map_to_providers() {
        for (prov, fabric, want) in [
            ("efa", "efa", Some(Provider::Efa)),
            ("efa", "efa-direct", Some(Provider::EfaDirect)),
            ("verbs;ofi_rxm", "IB-0xfe80", Some(Provider::Verbs)),
            ("cxi", "cxi", Some(Provider::Cxi)),
            ("tcp;ofi_rxm", "127.0.0.0/8", Some(Provider::Tcp)),
            ("tcp", "127.0.0.0/8", Some(Provider::Tcp)),
            ("shm", "shm", Some(Provider::Shm)),
            ("psm3", "psm3", None),
            ("ucx", "ucx", None),
        ] {
            assert_eq!(Provider::of_answer(prov, fabric), want, "{prov} / {fabric}");
        }
    }

    /// `efa` tries the efa-direct fabric first (FI_HMEM required), then the RDM fabric; other names
    /// are one fabric; the automatic order expands `efa` the same way.
    #[test]
    fn efa_tries_efa_direct_first() {
        use Provider::*;
        assert_eq!(
            Provider::candidates(Some(&Efa)),
            vec![(EfaDirect, true), (Efa, false)]
        );
        assert_eq!(
            Provider::candidates(Some(&EfaDirect)),
            vec![(EfaDirect, false)]
        );
        assert_eq!(Provider::candidates(Some(&Shm)), vec![(Shm, false)]);
        let auto: Vec<Provider> = Provider::candidates(None)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(auto, vec![EfaDirect, Efa, Cxi, Verbs, Shm, Tcp]);
    }

    /// The capability table docs/routing.md shows.
    #[test]
    fn capability_table() {
        struct Row {
            a: Answer,
            nic_writes_gpu: bool,
            native_atomics: bool,
            lanes: bool,
            gda: bool,
            dmabuf: bool,
        }
        let rows = [
            Row {
                a: answer("efa", "efa", true, true),
                nic_writes_gpu: false,
                native_atomics: false,
                lanes: false,
                gda: false,
                dmabuf: true,
            },
            Row {
                a: answer("efa", "efa-direct", true, false),
                nic_writes_gpu: true,
                native_atomics: false,
                lanes: false,
                gda: true,
                dmabuf: true,
            },
            Row {
                a: answer("verbs;ofi_rxm", "IB-0x", true, true),
                nic_writes_gpu: true,
                native_atomics: true,
                lanes: false,
                gda: false,
                dmabuf: false,
            },
            Row {
                a: answer("cxi", "cxi", true, true),
                nic_writes_gpu: true,
                native_atomics: true,
                lanes: false,
                gda: false,
                dmabuf: false,
            },
            Row {
                a: answer("tcp;ofi_rxm", "127.0.0.0/8", true, true),
                nic_writes_gpu: false,
                native_atomics: false,
                lanes: false,
                gda: false,
                dmabuf: false,
            },
            Row {
                a: answer("shm", "shm", true, true),
                nic_writes_gpu: false,
                native_atomics: false,
                lanes: true,
                gda: false,
                dmabuf: false,
            },
        ];
        for r in rows {
            let c = Caps::from_answer(&r.a);
            let what = format!("{} / {}", r.a.prov_name, r.a.fabric_name);
            assert_eq!(c.nic_writes_gpu, r.nic_writes_gpu, "{what}: nic_writes_gpu");
            assert_eq!(c.native_atomics, r.native_atomics, "{what}: native_atomics");
            assert_eq!(c.per_peer_lanes, r.lanes, "{what}: lanes");
            assert_eq!(c.named_endpoints, r.lanes, "{what}: named endpoints");
            assert_eq!(c.gda_ops, r.gda, "{what}: gda ops");
            assert_eq!(c.gpu_by_dmabuf, r.dmabuf, "{what}: GPU memory by dmabuf");
            assert_eq!(
                c.hmem_vmm_sync_memops,
                c.provider == Some(Provider::Efa),
                "{what}: VMM memory and SYNC_MEMOPS"
            );
            assert_eq!(c.inject_size, 32);
        }
    }

    #[test]
    fn what_the_answer_withholds_is_not_assumed() {
        // A NIC provider without FI_HMEM does not write GPU memory; one without FI_ATOMIC has no
        // native atomics.
        let c = Caps::from_answer(&answer("verbs;ofi_rxm", "IB-0x", false, false));
        assert!(c.nic && !c.nic_writes_gpu && !c.native_atomics);
        // efa without FI_HMEM: no GPU registration rule applies.
        let c = Caps::from_answer(&answer("efa", "efa-direct", false, false));
        assert!(c.nic && !c.nic_writes_gpu && !c.gpu_by_dmabuf && !c.hmem_vmm_sync_memops);
        let c = Caps::from_answer(&answer("efa", "efa", false, true));
        assert!(!c.gpu_by_dmabuf && !c.hmem_vmm_sync_memops);
        // shm without FI_HMEM or FI_ATOMIC: no HMEM or atomics quirk applies.
        let c = Caps::from_answer(&answer("shm", "shm", false, false));
        assert!(!c.hmem_needs_legacy_ipc && !c.nonfetch_atomics_as_fetch && c.per_peer_lanes);
        // Delivery-complete sends go one per peer at a time on shm (SAR) whatever it grants, on
        // no other provider.
        assert!(c.dc_sends_serialise);
        for (prov, fabric) in [
            ("tcp;ofi_rxm", "192.0.2.0/24"),
            ("efa", "efa"),
            ("efa", "efa-direct"),
        ] {
            assert!(!Caps::from_answer(&answer(prov, fabric, true, true)).dc_sends_serialise);
        }
        // rxm's eager limit matters for tcp;ofi_rxm only (not shm, not verbs;ofi_rxm).
        assert!(!c.rxm_staged);
        assert!(Caps::from_answer(&answer("tcp;ofi_rxm", "192.0.2.0/24", false, true)).rxm_staged);
        assert!(!Caps::from_answer(&answer("verbs;ofi_rxm", "IB-0x", true, true)).rxm_staged);
        assert!(rxm_staged(&Provider::Tcp) && !rxm_staged(&Provider::Verbs));
        // An unknown provider is taken as a software provider with what its answer grants.
        let c = Caps::from_answer(&answer("psm3", "psm3", true, true));
        assert_eq!(c.provider, None);
        assert!(c.hmem && c.atomics && !c.nic && !c.nic_writes_gpu && !c.native_atomics);
        assert!(c
            .to_string()
            .starts_with("unknown provider (psm3 / psm3 / d)"));
    }

    /// Provider identity is mapped here and in `info.rs` only: no other source file of the crate
    /// compares a provider's name or enum value.
    #[test]
    fn provider_identity_is_matched_in_one_place() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // Files that may name providers: the identity table, the name mapping, the parsing of
        // NVSHMEM_LIBFABRIC_PROVIDER, and the tools that take a provider on their command line.
        let allowed = ["fabric/caps.rs", "fabric/info.rs", "config.rs", "bin/"];
        let needles = [
            "== Provider::",
            "!= Provider::",
            "provider_name() ==",
            "provider_name() !=",
            "provider_name().starts_with",
            "provider_name().contains",
            "fabric_name() ==",
            "fabric_name() !=",
            "prov_name.starts_with",
            "prov_name.contains",
            "is_nic(",
        ];
        let mut found = Vec::new();
        let mut stack = vec![root.clone()];
        let mut files = 0;
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("read src") {
                let p = e.expect("dir entry").path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") {
                    continue;
                }
                let rel = p
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if allowed.iter().any(|a| rel.starts_with(a)) {
                    continue;
                }
                files += 1;
                let text = std::fs::read_to_string(&p).expect("read source");
                for (n, line) in text.lines().enumerate() {
                    let matches_enum = line.contains("matches!(") && line.contains("Provider::");
                    if matches_enum || needles.iter().any(|x| line.contains(x)) {
                        found.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(files > 50, "walked only {files} source files");
        assert!(
            found.is_empty(),
            "provider identity matched outside fabric/caps.rs:\n{}",
            found.join("\n")
        );
    }
}
