//! The route: how data moves, decided once at initialisation from the provider's capabilities
//! ([`crate::fabric::Caps`]) and the configuration, and then only acted on.
//!
//! | decision | from | acted on by |
//! |---|---|---|
//! | [`Route::staging`]: GPU memory (or everything) moves by staged messages | `nic_writes_gpu`, `NVSHMEM_EFA_GPU_STAGING` | the transport's RMA and registration, the mover's `choose`, the software queue |
//! | [`Route::provider_atomics`]: AMOs by provider atomics (else applied at the target) | `atomics`, `native_atomics`, `NVSHMEM_EFA_ATOMICS` | the transport's AMOs |
//! | [`Route::ipc`]: same-host GPU memory by CUDA IPC copies | `NVSHMEM_EFA_IPC`, a CUDA driver | the mover |
//! | [`Route::progress_sleeps`]: the progress thread may back off when idle | `nic`, `manual_progress` | the progress thread |
//! | [`Route::ordered_fence`]: a fence orders the staged path's messages instead of waiting for them | `sends_in_order` (FI_ORDER_SAS), `NVSHMEM_EFA_FENCE` | the transport's fence and the routes behind it (`transport::fence`) |
//! | [`Route::gpu_registration`]: GPU memory handed to the provider is registered by dmabuf or by address | `gpu_by_dmabuf`, `NVSHMEM_EFA_DMABUF`, [`Host`] (dmabuf export, nvidia-peermem) | the transport's registration |
//!
//! Which of the means a single transfer takes (this PE, a CUDA IPC copy, staged, the provider)
//! also depends on the peer and the memory: [`crate::mover::choose`] applies the route to it, and
//! [`Staging::covers`] is the one staging rule both it and the transport's RMA use.
use std::fmt;

use crate::config::{AtomicsPath, Config, FenceMode};
use crate::fabric::{Caps, GpuRegistration, Provider};
use crate::mover::{IpcMode, Policy};

/// Which transfers move by staged messages (host buffers, copies on a non-blocking CUDA stream)
/// instead of handing the memory to the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Staging {
    /// Never: the provider moves every buffer (FI_HMEM for GPU memory).
    #[default]
    Off,
    /// Transfers that touch GPU memory.
    Device,
    /// Every transfer, host memory included (exercises the path without a GPU).
    All,
}

impl Staging {
    /// The staging `NVSHMEM_EFA_GPU_STAGING` (`gpu_staging`) asks for on a provider: auto stages
    /// GPU memory unless the NIC writes GPU memory itself. Software providers (and efa's RDM
    /// fabric) copy GPU memory with CUDA calls of their own, on the legacy default stream, which
    /// waits for the very kernel that waits for the copy.
    pub fn decide(caps: &Caps, gpu_staging: Option<bool>) -> Staging {
        match gpu_staging {
            Some(true) => Staging::All,
            Some(false) => Staging::Off,
            None if caps.nic_writes_gpu => Staging::Off,
            None => Staging::Device,
        }
    }

    /// Whether a transfer is staged; `gpu`: either side of it is GPU memory.
    pub fn covers(self, gpu: bool) -> bool {
        match self {
            Staging::Off => false,
            Staging::Device => gpu,
            Staging::All => true,
        }
    }
}

impl fmt::Display for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Staging::Off => "off",
            Staging::Device => "GPU memory",
            Staging::All => "everything",
        })
    }
}

/// A configuration the provider cannot serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteError(pub String);

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RouteError {}

/// What this host offers a NIC that registers GPU memory, read once ([`Host::probe`]) before the
/// route is decided, so that the decision is made once and is the same on every PE of a cluster
/// of one instance type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// A CUDA driver is present.
    pub cuda: bool,
    /// The GPU exports memory as dmabuf (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`): `None` unknown
    /// (no CUDA driver), `Some(Err(why))` not.
    pub dmabuf: Option<Result<(), String>>,
    /// The nvidia-peermem module is loaded: a NIC can register GPU memory by address.
    pub peermem: bool,
}

impl Host {
    /// Reads the host's facts (CUDA driver, dmabuf export of the current device, or device 0
    /// without a current context; `/sys/module/nvidia_peermem`).
    pub fn probe() -> Host {
        let cuda = crate::cuda::available();
        let dmabuf = cuda.then(|| {
            let dev = crate::cuda::dmabuf::current_device().unwrap_or(0);
            match crate::cuda::dmabuf::device_supports(dev) {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!(
                    "CUDA device {dev} does not export dmabuf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED \
                     is 0: needs the open kernel modules, or a driver and kernel with dmabuf)"
                )),
                Err(e) => Err(e.to_string()),
            }
        });
        Host {
            cuda,
            dmabuf,
            peermem: std::path::Path::new("/sys/module/nvidia_peermem").exists(),
        }
    }

    /// A host without a GPU.
    pub fn without_gpu() -> Host {
        Host {
            cuda: false,
            dmabuf: None,
            peermem: false,
        }
    }
}

/// The route of a transport: every choice about how data moves that does not depend on the
/// single transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// What the provider can do.
    pub caps: Caps,
    /// Which transfers are staged.
    pub staging: Staging,
    /// AMOs use provider atomics (where the provider validates the operation), else they are
    /// applied by the target's progress path.
    pub provider_atomics: bool,
    /// Same-host GPU memory moves by CUDA IPC copies.
    pub ipc: bool,
    /// The progress thread may sleep when idle (else it polls, yielding between polls).
    pub progress_sleeps: bool,
    /// Copies use the batch API's overlap-with-compute hint where the driver has it.
    pub copy_overlap: bool,
    /// How GPU memory handed to the provider is registered (where `staging` leaves any to it).
    pub gpu_registration: GpuRegistration,
    /// A fence orders instead of waiting: the provider delivers sends to a peer in order
    /// (FI_ORDER_SAS), so a message that carries the fence is applied by its target only after
    /// everything before it; `NVSHMEM_EFA_FENCE=quiet` (or a provider without that order): every
    /// fence waits like a quiet towards its PE.
    pub ordered_fence: bool,
    /// Why the route differs from what the provider's capabilities alone would give (a NIC that
    /// could move GPU memory but cannot register it here, registration by address instead of
    /// dmabuf), for the log.
    pub note: Option<String>,
    /// Fabrics tried before this one and why they were not taken (`efa-direct` before `efa`).
    pub passed_over: Vec<String>,
}

impl Route {
    /// Decides the route for a provider with `caps` under `cfg` on `host`.
    ///
    /// GPU memory for a NIC that maps it by dmabuf (efa, efa-direct) is registered by dmabuf. Where
    /// the GPU exports no dmabuf, it is registered by address if nvidia-peermem is loaded; else
    /// the NIC cannot reach GPU memory at all, and GPU memory is staged through host buffers (a
    /// working transport at staged bandwidth, with a warning naming the cause) unless the NIC path
    /// was asked for explicitly (`NVSHMEM_EFA_GPU_STAGING=0`, `NVSHMEM_EFA_DMABUF=1`): then an
    /// error. The choice is made here, once, from host facts, never per registration: a PE whose
    /// heap were staged while its peers write to it through the NIC would receive writes with no
    /// key.
    pub fn decide(caps: Caps, cfg: &Config, host: &Host) -> Result<Route, RouteError> {
        let provider_atomics = match cfg.atomics {
            AtomicsPath::Target => false,
            AtomicsPath::Provider if !caps.atomics => {
                return Err(RouteError(format!(
                    "NVSHMEM_EFA_ATOMICS=provider but provider {} has no FI_ATOMIC \
                     (allowed here: auto, target)",
                    caps.prov_name
                )))
            }
            AtomicsPath::Provider => true,
            // Provider atomics by default only where the NIC applies them. The software-emulated
            // atomics of the other providers go through the target's progress engine anyway, and
            // target-applied AMOs serialise every AMO into a PE under one lock, GPU memory
            // included, with no GDRCopy.
            AtomicsPath::Auto => caps.native_atomics,
        };
        // A target sees no completion for the RMA aimed at it: with manual data progress every
        // incoming write waits for this PE to poll, and a sleeping poller costs each of the
        // initiator's operations a sleep. Only a NIC with automatic progress lets it sleep.
        let progress_sleeps = caps.nic && !caps.manual_progress;
        let mut staging = Staging::decide(&caps, cfg.gpu_staging);
        let mut gpu_registration = match cfg.dmabuf {
            Some(true) => GpuRegistration::Dmabuf,
            Some(false) => GpuRegistration::Address,
            None if caps.gpu_by_dmabuf => GpuRegistration::Dmabuf,
            None => GpuRegistration::Address,
        };
        if cfg.dmabuf == Some(true) && !caps.hmem {
            return Err(RouteError(format!(
                "NVSHMEM_EFA_DMABUF=1 but provider {} has no FI_HMEM: it takes no GPU memory",
                caps.prov_name
            )));
        }
        let mut note = None;
        let hands_gpu = staging == Staging::Off && caps.hmem;
        if let (true, GpuRegistration::Dmabuf, Some(Err(why))) =
            (hands_gpu, gpu_registration, &host.dmabuf)
        {
            if cfg.dmabuf == Some(true) {
                return Err(RouteError(format!(
                    "NVSHMEM_EFA_DMABUF=1 but GPU memory cannot be exported as dmabuf here: {why}"
                )));
            }
            if host.peermem {
                gpu_registration = GpuRegistration::Address;
                note = Some(format!(
                    "GPU memory registered by address through nvidia-peermem: {why}"
                ));
            } else if cfg.gpu_staging == Some(false) {
                return Err(RouteError(format!(
                    "NVSHMEM_EFA_GPU_STAGING=0 but provider {} cannot register GPU memory here: {why}, \
                     and nvidia-peermem is not loaded (allowed here: auto, 1)",
                    caps.prov_name
                )));
            } else {
                staging = Staging::Device;
                note = Some(format!(
                    "the NIC could move GPU memory itself, but cannot register it here ({why}; \
                     nvidia-peermem is not loaded): GPU memory is staged through host buffers, and \
                     hardware GDA queues cannot address the heap"
                ));
            }
        }
        Ok(Route {
            staging,
            provider_atomics,
            ipc: cfg.ipc == IpcMode::Auto && host.cuda,
            progress_sleeps,
            copy_overlap: cfg.copy_overlap,
            gpu_registration,
            ordered_fence: cfg.fence == FenceMode::Order && caps.sends_in_order,
            note,
            passed_over: Vec::new(),
            caps,
        })
    }

    /// One line saying what the provider chosen for `NVSHMEM_LIBFABRIC_PROVIDER` (`asked`; `None`:
    /// automatic) gives GPU memory: logged once at initialisation, shown by `nvshmem-efa-gda info`.
    pub fn provider_line(&self, asked: Option<&Provider>) -> String {
        let asked = asked.map_or("auto".to_string(), |p| p.to_string());
        let fabric = format!("{} / {}", self.caps.prov_name, self.caps.fabric_name);
        let gpu = match self.staging {
            Staging::Off if self.caps.nic_writes_gpu => format!(
                "the NIC reads and writes GPU memory itself (registered {}), no staging",
                self.gpu_registration
            ),
            Staging::Off if self.caps.hmem => format!(
                "GPU memory handed to the provider's own FI_HMEM path (registered {}, \
                 NVSHMEM_EFA_GPU_STAGING=0)",
                self.gpu_registration
            ),
            Staging::Off => "no FI_HMEM: host memory only".to_string(),
            Staging::Device if self.caps.nic => {
                "GPU memory staged through host buffers (its RDMA protocols would copy GPU memory \
                 with CUDA calls of their own)"
                    .to_string()
            }
            Staging::Device => "GPU memory staged through host buffers".to_string(),
            Staging::All => "every transfer staged (NVSHMEM_EFA_GPU_STAGING=1)".to_string(),
        };
        let gda = if self.caps.gda_ops {
            "; GDA: hardware EFA queues (efa gda ops)"
        } else {
            "; GDA: the software EFA queue"
        };
        let mut line = format!("NVSHMEM_LIBFABRIC_PROVIDER={asked}: {fabric}: {gpu}{gda}");
        if let Some(n) = &self.note {
            line.push_str(&format!("; {n}"));
        }
        if !self.passed_over.is_empty() {
            line.push_str(&format!("; not taken: {}", self.passed_over.join("; ")));
        }
        line
    }

    /// Whether a transfer is staged (`local_gpu`/`remote_gpu`: which sides are GPU memory).
    pub fn stages(&self, local_gpu: bool, remote_gpu: bool) -> bool {
        self.staging.covers(local_gpu || remote_gpu)
    }

    /// The route's part the mover acts on.
    pub fn mover_policy(&self) -> Policy {
        Policy {
            ipc: self.ipc,
            staging: self.staging != Staging::Off,
            stage_all: self.staging == Staging::All,
            copy_overlap: self.copy_overlap,
        }
    }

    /// Whether GPU memory the provider is handed must be registered with it (the FI_HMEM path).
    pub fn hands_gpu_memory_to_provider(&self) -> bool {
        self.staging == Staging::Off
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route: GPU memory to other hosts {}; staged: {}; GPU registration {}; atomics {}; \
             same-host GPU memory {}; progress thread {}; caps: {}",
            match self.staging {
                Staging::Off if self.caps.nic_writes_gpu => "by the NIC (FI_HMEM)",
                Staging::Off => "handed to the provider (FI_HMEM, NVSHMEM_EFA_GPU_STAGING=0)",
                _ => "staged through host buffers",
            },
            self.staging,
            self.gpu_registration,
            if self.provider_atomics {
                "by the provider"
            } else {
                "applied at the target"
            },
            if self.ipc {
                "by CUDA IPC copies"
            } else {
                "as for other hosts"
            },
            if self.progress_sleeps {
                "backs off when idle"
            } else {
                "polls"
            },
            self.caps
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::caps::tests::answer;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        Config::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .expect("config")
    }

    /// A GPU host whose GPU exports dmabuf, without nvidia-peermem.
    fn gpu() -> Host {
        Host {
            cuda: true,
            dmabuf: Some(Ok(())),
            peermem: false,
        }
    }

    /// A GPU host whose GPU exports no dmabuf.
    fn no_dmabuf(peermem: bool) -> Host {
        Host {
            cuda: true,
            dmabuf: Some(Err("device 0 exports no dmabuf".into())),
            peermem,
        }
    }

    fn caps(prov: &str, fabric: &str) -> Caps {
        Caps::from_answer(&answer(
            prov,
            fabric,
            true,
            prov != "efa" || fabric == "efa",
        ))
    }

    /// The policy table docs/routing.md shows: provider -> staging, atomics, progress.
    #[test]
    fn policy_table() {
        use Staging::*;
        let auto = cfg(&[]);
        for (prov, fabric, staging, atomics, sleeps) in [
            ("efa", "efa", Device, false, false),
            ("efa", "efa-direct", Off, false, true),
            ("verbs;ofi_rxm", "IB-0x", Off, true, false),
            ("cxi", "cxi", Off, true, false),
            ("tcp;ofi_rxm", "127.0.0.0/8", Device, false, false),
            ("shm", "shm", Device, false, false),
        ] {
            let r = Route::decide(caps(prov, fabric), &auto, &gpu()).expect(prov);
            let what = format!("{prov} / {fabric}");
            assert_eq!(r.staging, staging, "{what}");
            assert_eq!(r.provider_atomics, atomics, "{what}");
            assert_eq!(r.progress_sleeps, sleeps, "{what}");
            assert!(r.ipc, "{what}");
            let p = r.mover_policy();
            assert_eq!(p.staging, staging == Device, "{what}");
            assert!(!p.stage_all);
        }
    }

    #[test]
    fn configuration_overrides() {
        let shm = caps("shm", "shm");
        let verbs = caps("verbs;ofi_rxm", "IB-0x");
        let r = Route::decide(
            shm.clone(),
            &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "1")]),
            &gpu(),
        )
        .unwrap();
        assert_eq!(r.staging, Staging::All);
        assert!(r.mover_policy().stage_all && r.stages(false, false));
        let r = Route::decide(
            shm.clone(),
            &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "0")]),
            &gpu(),
        )
        .unwrap();
        assert_eq!(r.staging, Staging::Off);
        assert!(!r.stages(true, true) && r.hands_gpu_memory_to_provider());
        let r = Route::decide(
            verbs.clone(),
            &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "1")]),
            &gpu(),
        )
        .unwrap();
        assert_eq!(r.staging, Staging::All);
        let r = Route::decide(
            shm.clone(),
            &cfg(&[("NVSHMEM_EFA_ATOMICS", "provider")]),
            &gpu(),
        )
        .unwrap();
        assert!(r.provider_atomics);
        let r = Route::decide(
            verbs.clone(),
            &cfg(&[("NVSHMEM_EFA_ATOMICS", "target")]),
            &gpu(),
        )
        .unwrap();
        assert!(!r.provider_atomics);
        let r = Route::decide(verbs.clone(), &cfg(&[("NVSHMEM_EFA_IPC", "0")]), &gpu()).unwrap();
        assert!(!r.ipc && !r.mover_policy().ipc);
        // No CUDA driver: no IPC, whatever the variable says.
        let r = Route::decide(verbs, &cfg(&[]), &Host::without_gpu()).unwrap();
        assert!(!r.ipc);
        // Provider atomics asked of a provider without FI_ATOMIC: an error naming the way out.
        let direct = caps("efa", "efa-direct");
        assert!(!direct.atomics);
        let e = Route::decide(direct, &cfg(&[("NVSHMEM_EFA_ATOMICS", "provider")]), &gpu())
            .unwrap_err();
        assert!(
            e.0.contains("has no FI_ATOMIC") && e.0.contains("auto, target"),
            "{e}"
        );
    }

    /// A fence orders (instead of waiting) where the provider keeps sends in order and the
    /// configuration leaves it so.
    #[test]
    fn ordered_fence() {
        for (prov, fabric) in [
            ("tcp;ofi_rxm", "127.0.0.0/8"),
            ("shm", "shm"),
            ("efa", "efa"),
        ] {
            let r = Route::decide(caps(prov, fabric), &cfg(&[]), &gpu()).unwrap();
            assert!(r.ordered_fence, "{prov}");
            let q = cfg(&[("NVSHMEM_EFA_FENCE", "quiet")]);
            assert!(
                !Route::decide(caps(prov, fabric), &q, &gpu())
                    .unwrap()
                    .ordered_fence
            );
        }
        // efa-direct keeps no send order (EFA_MSG_ORDER is 0): every fence waits.
        let direct = caps("efa", "efa-direct");
        assert!(!direct.sends_in_order);
        assert!(
            !Route::decide(direct, &cfg(&[]), &gpu())
                .unwrap()
                .ordered_fence
        );
    }

    #[test]
    fn a_nic_without_hmem_stages_gpu_memory() {
        let c = Caps::from_answer(&answer("verbs;ofi_rxm", "IB-0x", false, true));
        let r = Route::decide(c, &cfg(&[]), &gpu()).unwrap();
        assert_eq!(r.staging, Staging::Device);
        assert!(r.stages(true, false) && r.stages(false, true) && !r.stages(false, false));
    }

    #[test]
    fn the_decision_reads_as_one_line() {
        let r = Route::decide(caps("shm", "shm"), &cfg(&[]), &gpu()).unwrap();
        let s = r.to_string();
        for part in [
            "staged through host buffers",
            "atomics applied at the target",
            "by CUDA IPC copies",
            "progress thread polls",
            "caps: shm (shm / shm / d): hmem=true",
            "per_peer_lanes=true",
        ] {
            assert!(s.contains(part), "{part:?} not in {s}");
        }
        assert!(!s.contains('\n'));
    }

    /// GPU registration per capability fixture: dmabuf on efa and efa-direct, by address elsewhere;
    /// no FI_HMEM, no GPU registration rule.
    #[test]
    fn gpu_registration_per_capability() {
        use GpuRegistration::*;
        let auto = cfg(&[]);
        for (prov, fabric, hmem, staging, reg) in [
            ("efa", "efa-direct", true, Staging::Off, Dmabuf),
            ("efa", "efa-direct", false, Staging::Device, Address),
            ("efa", "efa", true, Staging::Device, Dmabuf),
            ("efa", "efa", false, Staging::Device, Address),
            ("verbs;ofi_rxm", "IB-0x", true, Staging::Off, Address),
            ("tcp;ofi_rxm", "127.0.0.0/8", true, Staging::Device, Address),
            ("shm", "shm", true, Staging::Device, Address),
            ("shm", "shm", false, Staging::Device, Address),
        ] {
            let c = Caps::from_answer(&answer(prov, fabric, hmem, true));
            let r = Route::decide(c, &auto, &gpu()).unwrap();
            let what = format!("{prov} / {fabric} hmem={hmem}");
            assert_eq!((r.staging, r.gpu_registration), (staging, reg), "{what}");
            assert_eq!(r.note, None, "{what}");
        }
    }

    /// efa-direct on a host whose GPU exports no dmabuf: by address with nvidia-peermem; without
    /// it staged, with the reason kept for the log; an explicit ask for the NIC path is an error.
    #[test]
    fn efa_direct_without_dmabuf() {
        let direct = caps("efa", "efa-direct");
        let r = Route::decide(direct.clone(), &cfg(&[]), &no_dmabuf(true)).unwrap();
        assert_eq!(r.staging, Staging::Off);
        assert_eq!(r.gpu_registration, GpuRegistration::Address);
        assert!(r.note.as_deref().unwrap().contains("nvidia-peermem"));
        let r = Route::decide(direct.clone(), &cfg(&[]), &no_dmabuf(false)).unwrap();
        assert_eq!(r.staging, Staging::Device);
        assert!(r.stages(true, false) && !r.hands_gpu_memory_to_provider());
        let n = r.note.as_deref().unwrap();
        assert!(
            n.contains("exports no dmabuf") && n.contains("staged"),
            "{n}"
        );
        let e = Route::decide(
            direct.clone(),
            &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "0")]),
            &no_dmabuf(false),
        )
        .unwrap_err();
        assert!(
            e.0.contains("NVSHMEM_EFA_GPU_STAGING=0") && e.0.contains("peermem"),
            "{e}"
        );
        let e = Route::decide(
            direct.clone(),
            &cfg(&[("NVSHMEM_EFA_DMABUF", "1")]),
            &no_dmabuf(true),
        )
        .unwrap_err();
        assert!(e.0.contains("NVSHMEM_EFA_DMABUF=1"), "{e}");
        // NVSHMEM_EFA_DMABUF=0: by address whatever the host says.
        let r =
            Route::decide(direct.clone(), &cfg(&[("NVSHMEM_EFA_DMABUF", "0")]), &gpu()).unwrap();
        assert_eq!(r.gpu_registration, GpuRegistration::Address);
        // No CUDA driver: nothing to register, the NIC route stays.
        let r = Route::decide(direct, &cfg(&[]), &Host::without_gpu()).unwrap();
        assert_eq!(
            (r.staging, r.gpu_registration),
            (Staging::Off, GpuRegistration::Dmabuf)
        );
    }

    /// The opt-in that runs the dmabuf registration on the software providers (with GPU memory
    /// handed to them), and its refusals.
    #[test]
    fn dmabuf_opt_in_on_software_providers() {
        let both = cfg(&[
            ("NVSHMEM_EFA_DMABUF", "1"),
            ("NVSHMEM_EFA_GPU_STAGING", "0"),
        ]);
        for (prov, fabric) in [("shm", "shm"), ("tcp;ofi_rxm", "127.0.0.0/8")] {
            let r = Route::decide(caps(prov, fabric), &both, &gpu()).unwrap();
            assert_eq!(r.staging, Staging::Off, "{prov}");
            assert_eq!(r.gpu_registration, GpuRegistration::Dmabuf, "{prov}");
            assert!(r.provider_line(None).contains("by dmabuf (FI_MR_DMABUF)"));
        }
        let no_hmem = Caps::from_answer(&answer("tcp;ofi_rxm", "127.0.0.0/8", false, true));
        let e = Route::decide(no_hmem, &both, &gpu()).unwrap_err();
        assert!(e.0.contains("has no FI_HMEM"), "{e}");
    }

    /// What a user who sets NVSHMEM_LIBFABRIC_PROVIDER=efa gets, in the line logged at init.
    #[test]
    fn the_provider_line_says_what_efa_gives() {
        let efa = Some(Provider::Efa);
        let r = Route::decide(caps("efa", "efa-direct"), &cfg(&[]), &gpu()).unwrap();
        let l = r.provider_line(efa.as_ref());
        assert!(
            l.starts_with("NVSHMEM_LIBFABRIC_PROVIDER=efa: efa / efa-direct: the NIC reads and writes GPU memory itself (registered by dmabuf (FI_MR_DMABUF)), no staging; GDA: hardware EFA queues"),
            "{l}"
        );
        let mut r = Route::decide(caps("efa", "efa"), &cfg(&[]), &gpu()).unwrap();
        r.passed_over = vec!["efa-direct with FI_HMEM: no data".into()];
        let l = r.provider_line(efa.as_ref());
        for part in [
            "NVSHMEM_LIBFABRIC_PROVIDER=efa: efa / efa: GPU memory staged through host buffers",
            "GDA: the software EFA queue",
            "not taken: efa-direct with FI_HMEM: no data",
        ] {
            assert!(l.contains(part), "{part:?} not in {l}");
        }
        let r = Route::decide(caps("efa", "efa-direct"), &cfg(&[]), &no_dmabuf(false)).unwrap();
        let l = r.provider_line(None);
        assert!(
            l.starts_with("NVSHMEM_LIBFABRIC_PROVIDER=auto: efa / efa-direct: GPU memory staged"),
            "{l}"
        );
        assert!(l.contains("cannot register it here"), "{l}");
        let r = Route::decide(caps("shm", "shm"), &cfg(&[]), &gpu()).unwrap();
        assert!(r.provider_line(Some(&Provider::Shm)).starts_with(
            "NVSHMEM_LIBFABRIC_PROVIDER=shm: shm / shm: GPU memory staged through host buffers;"
        ));
        assert!(!l.contains('\n'));
    }
}
