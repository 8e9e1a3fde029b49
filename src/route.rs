//! The route: how data moves, decided once at initialisation from the provider's capabilities
//! ([`crate::fabric::Caps`]) and the configuration, and then only acted on.
//!
//! | decision | from | acted on by |
//! |---|---|---|
//! | [`Route::staging`]: GPU memory (or everything) moves by staged messages | `nic_writes_gpu`, `NVSHMEM_EFA_GPU_STAGING` | the transport's RMA and registration, the mover's `choose`, the software queue |
//! | [`Route::provider_atomics`]: AMOs by provider atomics (else applied at the target) | `atomics`, `native_atomics`, `NVSHMEM_EFA_ATOMICS` | the transport's AMOs |
//! | [`Route::ipc`]: same-host GPU memory by CUDA IPC copies | `NVSHMEM_EFA_IPC`, a CUDA driver | the mover |
//! | [`Route::progress_sleeps`]: the progress thread may back off when idle | `nic`, `manual_progress` | the progress thread |
//!
//! Which of the means a single transfer takes (this PE, a CUDA IPC copy, staged, the provider)
//! also depends on the peer and the memory: [`crate::mover::choose`] applies the route to it, and
//! [`Staging::covers`] is the one staging rule both it and the transport's RMA use.
use std::fmt;

use crate::config::{AtomicsPath, Config};
use crate::fabric::Caps;
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
}

impl Route {
    /// Decides the route for a provider with `caps` under `cfg`; `cuda`: a CUDA driver is present.
    pub fn decide(caps: Caps, cfg: &Config, cuda: bool) -> Result<Route, RouteError> {
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
        Ok(Route {
            staging: Staging::decide(&caps, cfg.gpu_staging),
            provider_atomics,
            ipc: cfg.ipc == IpcMode::Auto && cuda,
            progress_sleeps,
            copy_overlap: cfg.copy_overlap,
            caps,
        })
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
            "route: GPU memory to other hosts {}; staged: {}; atomics {}; same-host GPU memory {}; \
             progress thread {}; caps: {}",
            match self.staging {
                Staging::Off if self.caps.nic_writes_gpu => "by the NIC (FI_HMEM)",
                Staging::Off => "handed to the provider (FI_HMEM, NVSHMEM_EFA_GPU_STAGING=0)",
                _ => "staged through host buffers",
            },
            self.staging,
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
            let r = Route::decide(caps(prov, fabric), &auto, true).expect(prov);
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
        let r =
            Route::decide(shm.clone(), &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "1")]), true).unwrap();
        assert_eq!(r.staging, Staging::All);
        assert!(r.mover_policy().stage_all && r.stages(false, false));
        let r =
            Route::decide(shm.clone(), &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "0")]), true).unwrap();
        assert_eq!(r.staging, Staging::Off);
        assert!(!r.stages(true, true) && r.hands_gpu_memory_to_provider());
        let r = Route::decide(
            verbs.clone(),
            &cfg(&[("NVSHMEM_EFA_GPU_STAGING", "1")]),
            true,
        )
        .unwrap();
        assert_eq!(r.staging, Staging::All);
        let r = Route::decide(
            shm.clone(),
            &cfg(&[("NVSHMEM_EFA_ATOMICS", "provider")]),
            true,
        )
        .unwrap();
        assert!(r.provider_atomics);
        let r = Route::decide(
            verbs.clone(),
            &cfg(&[("NVSHMEM_EFA_ATOMICS", "target")]),
            true,
        )
        .unwrap();
        assert!(!r.provider_atomics);
        let r = Route::decide(verbs.clone(), &cfg(&[("NVSHMEM_EFA_IPC", "0")]), true).unwrap();
        assert!(!r.ipc && !r.mover_policy().ipc);
        // No CUDA driver: no IPC, whatever the variable says.
        let r = Route::decide(verbs, &cfg(&[]), false).unwrap();
        assert!(!r.ipc);
        // Provider atomics asked of a provider without FI_ATOMIC: an error naming the way out.
        let direct = caps("efa", "efa-direct");
        assert!(!direct.atomics);
        let e =
            Route::decide(direct, &cfg(&[("NVSHMEM_EFA_ATOMICS", "provider")]), true).unwrap_err();
        assert!(
            e.0.contains("has no FI_ATOMIC") && e.0.contains("auto, target"),
            "{e}"
        );
    }

    #[test]
    fn a_nic_without_hmem_stages_gpu_memory() {
        let c = Caps::from_answer(&answer("verbs;ofi_rxm", "IB-0x", false, true));
        let r = Route::decide(c, &cfg(&[]), true).unwrap();
        assert_eq!(r.staging, Staging::Device);
        assert!(r.stages(true, false) && r.stages(false, true) && !r.stages(false, false));
    }

    #[test]
    fn the_decision_reads_as_one_line() {
        let r = Route::decide(caps("shm", "shm"), &cfg(&[]), true).unwrap();
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
}
