//! What the transport lends the GDA software queue: its data mover's view of same-host peers'
//! heaps (CUDA IPC mappings opened when NVSHMEM hands the transport the peers' handles), so that
//! the queue runs RDMA to those peers as copy-engine copies; and the queue's set-up at connect.
use std::sync::Arc;

use super::{Allgather, Transport};
use crate::config::GdaMode;
use crate::gda::PeerMemory;
use crate::mover::engine::Mover;

/// The transport's mover as the software queue's [`PeerMemory`].
pub(super) struct MoverPeers(pub(super) Arc<Mover>);

impl PeerMemory for MoverPeers {
    fn local_addr(&self, pe: i32, addr: u64, len: u64) -> Option<u64> {
        self.0.lookup(pe, addr, len)
    }
}

/// The [`PeerMemory`] to give GDA for `mover`.
pub(super) fn peer_memory(mover: &Arc<Mover>) -> Arc<dyn PeerMemory> {
    Arc::new(MoverPeers(mover.clone()))
}

impl Transport {
    /// Sets the GDA queue up at connect (unless `NVSHMEM_EFA_GDA=off`): its own endpoint, the
    /// mover's peer memory, and the exchange of every PE's queue address.
    pub(super) fn setup_gda(&self, my_pe: i32, n_pes: i32, allgather: &Allgather<'_>) {
        if self.cfg.gda == GdaMode::Off {
            return;
        }
        // Every PE takes part in the exchange even if its own GDA init failed (empty name), so the
        // collective never hangs; a PE then simply has no GDA.
        let local = match self.gda.init(&self.domain, &self.cfg) {
            Ok(mode) => {
                tracing::info!("GDA initialised on its own endpoint (mode {mode})");
                let pm = peer_memory(&self.mover);
                if let Err(e) = self.gda.with(|g| g.set_peer_memory(Some(pm))) {
                    tracing::warn!("GDA: same-host copies not available to the queue: {e}");
                }
                self.gda.with(|g| g.address()).unwrap_or_default()
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
        if let Err(e) = allgather(&len, &mut lens) {
            tracing::warn!("GDA address size exchange failed ({e}): GDA disabled");
            self.gda.shutdown();
            return;
        }
        // n_pes > 0 (checked by connect), so both bounds come from real sizes.
        let (min, max) = lens
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        if max == 0 {
            return;
        }
        let mut mine = local.clone();
        mine.resize(max, 0);
        let mut all = vec![0u8; max * n_pes as usize];
        let why = match allgather(&mine, &mut all) {
            Err(e) => Some(format!("GDA address exchange failed ({e})")),
            // Every PE's address has the same size when each has GDA (an empty one: none).
            Ok(()) if min != max => Some(format!(
                "GDA addresses differ in size between PEs ({}; 0: that PE has no GDA, its \
                 own log says why)",
                lens.chunks(8)
                    .enumerate()
                    .map(|(pe, c)| format!(
                        "PE {pe}: {} bytes",
                        u64::from_le_bytes(c.try_into().unwrap())
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Ok(()) => None,
        };
        if let Some(why) = why {
            tracing::warn!("{why}: GDA disabled");
            self.gda.shutdown();
            return;
        }
        if let Err(e) = self.gda.with(|g| g.connect(my_pe, n_pes, &all, None)) {
            tracing::warn!("GDA connect failed: {e}");
            self.gda.shutdown();
        }
    }
}
