//! Benchmark-only null completion (`NVSHMEM_EFA_BENCH_NULL=1`): the operations NVSHMEM's proxy
//! thread issues for a device kernel (the proxy endpoint) return success at once and move no data,
//! so a benchmark can time NVSHMEM's own proxy path (device ring, proxy thread, transport call)
//! without the fabric under it: the ceiling any remote transport can reach through the proxy.
//!
//! Completed without moving data: RMA (puts and gets), put-with-signal (data and signal), and the
//! non-fetching atomics a program issues (`INC`, `SET`, `ADD`, `AND`, `OR`, `XOR`, `SIGNAL_SET`,
//! `SIGNAL_ADD`). Still executed: everything on the host endpoint (host-initiated operations),
//! fetching atomics (NVSHMEM waits for their value), and `SIGNAL` / `ACK`, which NVSHMEM's own
//! barriers and syncs use, so the job still synchronises between measurements. Received data is of
//! course wrong in this mode: a benchmark must not verify it.
//!
//! Loud on purpose: a warning at init and one at finalize with the number of operations completed
//! without data.
use std::sync::atomic::{AtomicU64, Ordering};

use crate::nvshmem::abi::amo;
use crate::nvshmem::transport::EP_PROXY;

/// The mode's switch and its count.
pub(super) struct BenchNull {
    on: bool,
    taken: AtomicU64,
}

impl BenchNull {
    /// The mode as configured; warns when it is on.
    pub fn new(on: bool) -> BenchNull {
        if on {
            tracing::warn!(
                "NVSHMEM_EFA_BENCH_NULL=1: BENCHMARK MODE: puts, gets, put-with-signal and \
                 non-fetching atomics issued by NVSHMEM's proxy complete at once and MOVE NO DATA \
                 (host-initiated operations, fetching atomics and barrier signals still run)"
            );
        }
        BenchNull {
            on,
            taken: AtomicU64::new(0),
        }
    }

    /// Whether an RMA or put-with-signal on endpoint `ep` completes without data (and counts it).
    pub fn rma(&self, ep: usize) -> bool {
        self.take(self.on && ep == EP_PROXY)
    }

    /// Whether an atomic with operation code `op` on endpoint `ep` completes without data.
    pub fn amo(&self, ep: usize, op: i32) -> bool {
        let plain = matches!(
            op & !amo::FLOAT_BIT,
            amo::INC
                | amo::SET
                | amo::ADD
                | amo::AND
                | amo::OR
                | amo::XOR
                | amo::SIGNAL_SET
                | amo::SIGNAL_ADD
        );
        self.take(self.on && ep == EP_PROXY && plain)
    }

    fn take(&self, yes: bool) -> bool {
        if yes {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        yes
    }

    /// Operations completed without data so far.
    pub fn count(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// The finalize warning (nothing when the mode is off).
    pub fn report(&self) {
        if self.on {
            tracing::warn!(
                "NVSHMEM_EFA_BENCH_NULL=1: BENCHMARK MODE ended: {} operations of NVSHMEM's proxy \
                 were completed WITHOUT MOVING DATA",
                self.count()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvshmem::transport::EP_HOST;

    #[test]
    fn off_takes_nothing() {
        let n = BenchNull::new(false);
        assert!(!n.rma(EP_PROXY) && !n.amo(EP_PROXY, amo::ADD));
        assert_eq!(n.count(), 0);
    }

    #[test]
    fn on_takes_proxy_data_ops_only() {
        let n = BenchNull::new(true);
        assert!(n.rma(EP_PROXY));
        assert!(!n.rma(EP_HOST), "host-initiated operations still run");
        for op in [amo::INC, amo::SET, amo::ADD, amo::AND, amo::OR, amo::XOR] {
            assert!(n.amo(EP_PROXY, op), "op {op}");
        }
        assert!(n.amo(EP_PROXY, amo::SIGNAL_ADD) && n.amo(EP_PROXY, amo::SIGNAL_SET));
        assert!(n.amo(EP_PROXY, amo::ADD | amo::FLOAT_BIT));
        // NVSHMEM's barriers (SIGNAL, ACK) and every fetching atomic still run.
        for op in [
            amo::SIGNAL,
            amo::ACK,
            amo::FETCH,
            amo::FETCH_ADD,
            amo::COMPARE_SWAP,
        ] {
            assert!(!n.amo(EP_PROXY, op), "op {op}");
        }
        assert!(!n.amo(EP_HOST, amo::ADD));
        assert_eq!(n.count(), 10);
    }
}
