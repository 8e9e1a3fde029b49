//! What the transport lends the GDA software queue: its data mover's view of same-host peers'
//! heaps (CUDA IPC mappings opened when NVSHMEM hands the transport the peers' handles), so that
//! the queue runs RDMA to those peers as copy-engine copies.
use std::sync::Arc;

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
