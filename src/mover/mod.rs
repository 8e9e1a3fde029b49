//! The one data mover: moves bytes between a local region and a peer's region by the best means the
//! pair of PEs allows.
//!
//! | local | remote | peer | means |
//! |---|---|---|---|
//! | any | any | this PE | [`Means::Local`]: `memcpy` host to host, else a copy-engine copy |
//! | any | GPU, IPC-opened (legacy or VMM) | same host | [`Means::Ipc`]: copy engine into/out of the peer's heap |
//! | GPU on either side | | software provider | [`Means::Staged`]: the transport's staged messages |
//! | otherwise | | | [`Means::Provider`]: the provider moves it (host memory, or FI_HMEM NICs) |
//!
//! Same-host GPU memory goes through CUDA IPC of the registered heap: each registration exports
//! its allocation ([`handle::IpcDesc`], 128 bytes carried in the transport's 512-byte memory handle
//! at [`handle::IPC_DESC_OFFSET`]); a peer opens it lazily, once per (peer, export)
//! ([`engine::Mover::resolve`]; [`engine::Mover::lookup`] answers for what is already open), and
//! copies run on a non-blocking stream of the transport's context, many per synchronisation,
//! completion polled through events ([`queue::CopyQueue`]). No host bounce, never the legacy default
//! stream, and a quiet with a deadline that fails instead of hanging. A batch of small copies
//! between GPU-addressable ranges goes as one launch of the library's copy kernel instead
//! ([`kfront::KernelFront`], `NVSHMEM_EFA_COPY_KERNEL`; the queues are made at connect by
//! [`engine::Mover::prepare_queues`]).
//!
//! The export has one of two kinds:
//!
//! | memory | export (at registration) | open (at the peer) |
//! |---|---|---|
//! | `cuMemAlloc`/`cudaMalloc` | legacy handle of the allocation (`cuIpcGetMemHandle`), in the descriptor | `cuIpcOpenMemHandle` |
//! | CUDA VMM (`cuMemCreate`; NVSHMEM's default heap) | per mapping in the region: `cuMemRetainAllocationHandle`, `cuMemExportToShareableHandle` (POSIX fd); the fds go to this process's [`fdshare::FdServer`], the descriptor carries its cookie and the export id | fetch the fds over the server's abstract unix socket (`SCM_RIGHTS`), `cuMemImportFromShareableHandle` each, one `cuMemAddressReserve` for the run of mappings, `cuMemMap` each at its offset, `cuMemSetAccess` read/write |
//!
//! VMM allocations created without the POSIX-fd handle type (e.g. fabric handles only) do not
//! export: registration logs one warning and peers use the staged path. The fd server starts with
//! the first VMM export; `release_mem_handle` withdraws a region's export (closing its fds) and
//! finalize ([`engine::Mover::close_peers`]) stops the server. Peers keep what they mapped until
//! their own finalize.
//!
//! Ordering: the copies of one endpoint's queue run on one stream, in submissions of up to
//! `NVSHMEM_EFA_COPY_BATCH` copies ([`queue::CopyQueue::with_batch`]) that are ordered among
//! themselves while the copies inside one are not (NVSHMEM orders non-blocking puts only by fence
//! and quiet, which wait for the queue; a signal by copy flushes the puts before it); against
//! operations carried by other means
//! (staged messages, provider operations, target-applied AMOs such as a put-with-signal's signal)
//! the transport's fence and quiet wait for the queue first.
//!
//! Same host means the same kernel boot and host name ([`handle::HostId`]); PEs exchange it in the
//! transport's address allgather. An export that does not open (GPU not visible, another
//! container or user, fd server gone) sends that peer's region down the staged path, logged once.
//!
//! Atomics to such memory may run as the library's one-thread kernel instead of the provider's
//! host-side read-modify-write ([`crate::mover::amo`], `NVSHMEM_EFA_AMO_KERNEL=1`): launched on a stream of the
//! endpoint that waits for its copies, settled at quiet, and taken over by the host when the
//! kernel cannot start.
//!
//! [`stats`] counts the stages of the staged path and of IPC copies for the debug timeline.
pub mod amo;
pub mod amo_lanes;
pub mod claim;
pub mod engine;
pub mod fdshare;
pub mod handle;
pub mod kcopy;
pub mod kfront;
pub mod queue;
pub mod stats;

#[cfg(test)]
mod gpu_tests;

use std::fmt;

/// Copies `len` bytes between two ranges of this process at once (returns when they have landed):
/// `memcpy` when both are host memory (`device` false), else a copy on a non-blocking stream of the
/// current context, waited for ([`crate::cuda::memcpy`]; never the legacy default stream). The one
/// synchronous copy of the staged paths of the transport and of the software queue.
///
/// # Safety
/// Both ranges valid for `len` bytes, not overlapping.
pub unsafe fn copy_bytes(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    device: bool,
) -> Result<(), crate::cuda::CudaError> {
    if len == 0 {
        return Ok(());
    }
    if device {
        // SAFETY: forwarded contract.
        unsafe {
            crate::cuda::memcpy(
                dst as *mut std::ffi::c_void,
                src as *const std::ffi::c_void,
                len,
            )
        }
    } else {
        // SAFETY: forwarded contract (host ranges of this process).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        Ok(())
    }
}

/// Where a region's bytes live; decided once, at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Host memory (pinned, pageable or unknown to CUDA).
    Host,
    /// GPU memory of a device.
    Device,
}

/// How one transfer is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Means {
    /// Both ends in this process: `memcpy`, or a copy-engine copy when a side is GPU memory.
    Local,
    /// Same host, the peer's GPU memory opened through CUDA IPC: a copy-engine copy.
    Ipc,
    /// GPU memory over a provider that must not see it: the transport's staged messages.
    Staged,
    /// The provider moves it (host memory everywhere; GPU memory on FI_HMEM NIC providers).
    Provider,
}

impl fmt::Display for Means {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Means::Local => "local copy",
            Means::Ipc => "CUDA IPC copy",
            Means::Staged => "staged",
            Means::Provider => "provider",
        })
    }
}

/// `NVSHMEM_EFA_IPC`: whether same-host GPU memory moves through CUDA IPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcMode {
    /// Where peers share a host and the heap exports (legacy IPC or VMM), else staged/provider.
    Auto,
    /// Never (the staged or provider path for every peer).
    Off,
}

impl IpcMode {
    /// Parses the variable's value (`auto`, `0`/`off`/`no`/`false`; `1`/`on` mean `auto`).
    pub fn parse(v: &str) -> Option<IpcMode> {
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" | "1" | "on" | "yes" | "true" | "y" => Some(IpcMode::Auto),
            "0" | "off" | "no" | "false" | "n" => Some(IpcMode::Off),
            _ => None,
        }
    }
}

/// The transport's choices that bear on the means, fixed at initialisation: the mover's part of
/// the route ([`crate::route::Route::mover_policy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Same-host IPC allowed (`NVSHMEM_EFA_IPC` not `0`, and a CUDA driver present).
    pub ipc: bool,
    /// GPU memory must not reach the provider (software providers; `NVSHMEM_EFA_GPU_STAGING`).
    pub staging: bool,
    /// Every remote transfer is staged, host memory too (`NVSHMEM_EFA_GPU_STAGING=1`, for tests).
    pub stage_all: bool,
    /// Copies through the batch API with the overlap hint where the driver has it
    /// (`NVSHMEM_EFA_COPY_OVERLAP`).
    pub copy_overlap: bool,
}

impl Policy {
    /// The route's staging these flags stand for.
    pub fn staging_mode(&self) -> crate::route::Staging {
        use crate::route::Staging;
        match (self.stage_all, self.staging) {
            (true, _) => Staging::All,
            (false, true) => Staging::Device,
            (false, false) => Staging::Off,
        }
    }
}

/// What the transport knows about the peer of one transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The peer is this PE.
    pub is_self: bool,
    /// The peer runs on this host (same [`handle::HostId`]).
    pub same_host: bool,
    /// The peer's region is open here through CUDA IPC ([`engine::Mover::resolve`] found a mapping).
    pub ipc_open: bool,
}

/// Chooses the means for a transfer between a local region of kind `local` and a peer's region of
/// kind `remote`.
pub fn choose(policy: Policy, local: Kind, remote: Kind, peer: Peer) -> Means {
    if peer.is_self {
        return Means::Local;
    }
    if policy.ipc && peer.same_host && peer.ipc_open && remote == Kind::Device {
        return Means::Ipc;
    }
    let gpu = local == Kind::Device || remote == Kind::Device;
    if policy.staging_mode().covers(gpu) {
        return Means::Staged;
    }
    Means::Provider
}

/// A mover error: what failed, already phrased for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoverError {
    /// Bad input (range outside a registration, malformed handle bytes).
    Invalid(String),
    /// A CUDA call failed.
    Cuda(String),
    /// Copies still outstanding when the deadline passed.
    Timeout {
        /// Copies not complete.
        outstanding: u64,
        /// How long was waited.
        waited: std::time::Duration,
    },
}

impl fmt::Display for MoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoverError::Invalid(m) | MoverError::Cuda(m) => f.write_str(m),
            MoverError::Timeout {
                outstanding,
                waited,
            } => write!(
                f,
                "{outstanding} copy(ies) not complete after {waited:?} (GPU hung or copy stalled)"
            ),
        }
    }
}

impl std::error::Error for MoverError {}

impl From<crate::cuda::CudaError> for MoverError {
    fn from(e: crate::cuda::CudaError) -> Self {
        MoverError::Cuda(e.to_string())
    }
}

/// Result of a mover call.
pub type MResult<T> = Result<T, MoverError>;

#[cfg(test)]
mod tests {
    use super::*;

    const fn policy(ipc: bool, staging: bool) -> Policy {
        Policy {
            ipc,
            staging,
            stage_all: false,
            copy_overlap: true,
        }
    }
    const fn peer(is_self: bool, same_host: bool, ipc_open: bool) -> Peer {
        Peer {
            is_self,
            same_host,
            ipc_open,
        }
    }
    const SOFT: Policy = policy(true, true);
    const NIC: Policy = policy(true, false);
    /// The testing knob on a software provider.
    const STAGE_ALL: Policy = Policy {
        stage_all: true,
        ..SOFT
    };
    const REMOTE_HOST: Peer = peer(false, false, false);
    const LOCAL_OPEN: Peer = peer(false, true, true);
    const LOCAL_CLOSED: Peer = peer(false, true, false);
    const ME: Peer = peer(true, true, false);
    use Kind::{Device as D, Host as H};

    #[test]
    fn same_host_gpu_memory_goes_through_ipc_from_any_local_kind() {
        for p in [SOFT, NIC] {
            assert_eq!(choose(p, D, D, LOCAL_OPEN), Means::Ipc);
            assert_eq!(choose(p, H, D, LOCAL_OPEN), Means::Ipc);
        }
        // Testing knob stage_all does not take GPU memory away from IPC.
        let all = STAGE_ALL;
        assert_eq!(choose(all, D, D, LOCAL_OPEN), Means::Ipc);
    }

    #[test]
    fn host_memory_of_a_peer_is_never_ipc() {
        assert_eq!(choose(SOFT, D, H, LOCAL_OPEN), Means::Staged);
        assert_eq!(choose(SOFT, H, H, LOCAL_OPEN), Means::Provider);
        assert_eq!(choose(NIC, D, H, LOCAL_OPEN), Means::Provider);
    }

    #[test]
    fn without_ipc_gpu_memory_is_staged_on_software_providers_and_direct_on_nics() {
        let off = Policy { ipc: false, ..SOFT };
        for peer in [REMOTE_HOST, LOCAL_CLOSED, LOCAL_OPEN] {
            assert_eq!(choose(off, D, D, peer), Means::Staged, "{peer:?}");
            assert_eq!(choose(off, H, D, peer), Means::Staged);
            assert_eq!(choose(off, D, H, peer), Means::Staged);
            assert_eq!(choose(off, H, H, peer), Means::Provider);
        }
        for peer in [REMOTE_HOST, LOCAL_CLOSED] {
            assert_eq!(choose(SOFT, D, D, peer), Means::Staged);
            assert_eq!(choose(NIC, D, D, peer), Means::Provider);
            assert_eq!(choose(NIC, H, H, peer), Means::Provider);
        }
        // A peer on another host never takes IPC, even if some mapping were claimed.
        let bogus = Peer {
            same_host: false,
            ..LOCAL_OPEN
        };
        assert_eq!(choose(SOFT, D, D, bogus), Means::Staged);
    }

    #[test]
    fn stage_all_stages_host_memory_too() {
        let all = STAGE_ALL;
        assert_eq!(choose(all, H, H, REMOTE_HOST), Means::Staged);
        assert_eq!(choose(all, H, H, LOCAL_OPEN), Means::Staged);
    }

    #[test]
    fn self_is_always_local() {
        for p in [SOFT, NIC] {
            for (l, r) in [(H, H), (H, D), (D, H), (D, D)] {
                assert_eq!(choose(p, l, r, ME), Means::Local);
            }
        }
    }

    #[test]
    fn ipc_mode_parses_and_rejects() {
        assert_eq!(IpcMode::parse("auto"), Some(IpcMode::Auto));
        assert_eq!(IpcMode::parse(" AUTO "), Some(IpcMode::Auto));
        assert_eq!(IpcMode::parse("1"), Some(IpcMode::Auto));
        assert_eq!(IpcMode::parse("0"), Some(IpcMode::Off));
        assert_eq!(IpcMode::parse("off"), Some(IpcMode::Off));
        assert_eq!(IpcMode::parse("sometimes"), None);
        assert_eq!(IpcMode::parse(""), None);
    }

    #[test]
    fn timeout_error_names_the_count() {
        let e = MoverError::Timeout {
            outstanding: 3,
            waited: std::time::Duration::from_millis(5),
        };
        assert!(e.to_string().starts_with("3 copy(ies) not complete"), "{e}");
    }
}
