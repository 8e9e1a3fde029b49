//! The ordering rule of the software queue: an AMO that announces data
//! ([`crate::gda::wire::AMO_AFTER_DATA`]) is not sent to its target, hence not applied there,
//! before every WQE that the queue took before it and that is aimed at the same PE has completed
//! (docs/ordering.md).
//!
//! "Completed" is the completion the consumer writes for the WQE: an RDMA write through the
//! provider completes with `FI_DELIVERY_COMPLETE` (the data is at the target), a copy of the copy
//! route once the copy engine finished, a staged write once the target acknowledged every chunk
//! after copying it into place. The GPU never waits for this: the AMO's WQE simply completes later.
//!
//! The bookkeeping here is per peer: the producer counts of WQEs taken and not yet completed
//! (`open`), and the announcing AMOs held back (`held`, in the order taken). An AMO at producer
//! count `n` to PE `p` may go when no WQE to `p` with a count below `n` is open and no earlier AMO
//! to `p` is still held (so announcing AMOs to one PE also leave in order).
use std::collections::{BTreeSet, VecDeque};

use super::intake::{Action, Pending};

/// Per-peer state of the ordering rule.
#[derive(Default)]
pub(super) struct Order {
    /// Per peer: producer counts of WQEs taken and not yet completed.
    open: Vec<BTreeSet<u64>>,
    /// Per peer: announcing AMOs held until the WQEs before them completed, in the order taken.
    held: Vec<VecDeque<Pending>>,
    /// AMOs held now, over all peers.
    n_held: usize,
    /// AMOs that had to wait (for the stop summary and the tests' counters).
    pub(super) waited: u64,
    /// Announcing AMOs seen.
    pub(super) announced: u64,
}

impl Pending {
    /// Whether this WQE is an AMO that announces data.
    pub(super) fn announces(&self) -> bool {
        matches!(
            self.action,
            Action::Send {
                after_data: true,
                ..
            }
        )
    }
}

impl Pending {
    /// Whether this WQE is an RDMA write (through the provider or staged).
    pub(super) fn writes(&self) -> bool {
        matches!(
            self.action,
            Action::Rdma { write: true, .. } | Action::Staged { write: true, .. }
        )
    }
}

impl Order {
    fn grow(&mut self, peer: u16) {
        let n = usize::from(peer) + 1;
        if self.open.len() < n {
            self.open.resize_with(n, BTreeSet::new);
            self.held.resize_with(n, VecDeque::new);
        }
    }

    /// WQE `pc` to `peer` is in flight.
    pub(super) fn opened(&mut self, peer: u16, pc: u64) {
        self.grow(peer);
        self.open[usize::from(peer)].insert(pc);
    }

    /// WQE `pc` to `peer` completed (with any status).
    pub(super) fn closed(&mut self, peer: u16, pc: u64) {
        if let Some(s) = self.open.get_mut(usize::from(peer)) {
            s.remove(&pc);
        }
    }

    /// Whether an announcing AMO at `pc` to `peer` must wait.
    fn blocked(&self, peer: u16, pc: u64) -> bool {
        let i = usize::from(peer);
        self.held
            .get(i)
            .is_some_and(|h| h.iter().any(|p| p.pc < pc))
            || self
                .open
                .get(i)
                .and_then(|s| s.first())
                .is_some_and(|&first| first < pc)
    }

    /// Takes `p` if it is an announcing AMO that must wait; hands it back otherwise.
    pub(super) fn hold_if_needed(&mut self, p: Pending) -> Option<Pending> {
        if !p.announces() {
            return Some(p);
        }
        self.announced += 1;
        if !self.blocked(p.peer, p.pc) {
            return Some(p);
        }
        self.grow(p.peer);
        self.waited += 1;
        self.n_held += 1;
        self.held[usize::from(p.peer)].push_back(p);
        None
    }

    /// The next held AMO that may go now (its peer's earlier WQEs all completed), if any.
    pub(super) fn next_ready(&mut self) -> Option<Pending> {
        if self.n_held == 0 {
            return None;
        }
        for i in 0..self.held.len() {
            let Some(front) = self.held[i].front() else {
                continue;
            };
            let pc = front.pc;
            if self.open[i].first().is_some_and(|&first| first < pc) {
                continue;
            }
            self.n_held -= 1;
            return self.held[i].pop_front();
        }
        None
    }

    /// Puts back an AMO [`Order::next_ready`] gave out that could not be posted yet.
    pub(super) fn put_back(&mut self, p: Pending) {
        self.grow(p.peer);
        self.n_held += 1;
        self.held[usize::from(p.peer)].push_front(p);
    }

    /// Whether nothing is held.
    pub(super) fn idle(&self) -> bool {
        self.n_held == 0
    }

    /// AMOs held now.
    pub(super) fn held(&self) -> usize {
        self.n_held
    }

    /// Everything held, for a stopping queue.
    pub(super) fn drain(&mut self) -> Vec<Pending> {
        self.n_held = 0;
        self.held.iter_mut().flat_map(|h| h.drain(..)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::efa::wqe::OpType;
    use crate::fabric::FiAddr;
    use crate::gda::wire::SendHdr;

    fn send(pc: u64, peer: u16, after_data: bool) -> Pending {
        Pending {
            pc,
            req_id: pc as u16,
            op: OpType::Send,
            action: Action::Send {
                dest: FiAddr::default(),
                hdr: SendHdr {
                    src_pe: 0,
                    imm: None,
                    len: 32,
                },
                payload: super::super::Payload::Inline([0; crate::efa::wqe::INLINE_MAX], 32),
                after_data,
            },
            slot: None,
            bounce: None,
            peer,
        }
    }

    #[test]
    fn an_announcing_amo_waits_for_earlier_wqes_to_its_peer_only() {
        let mut o = Order::default();
        o.opened(1, 0); // a write to PE 1
        o.opened(2, 1); // a write to PE 2
                        // An AMO that does not announce never waits.
        assert!(o.hold_if_needed(send(2, 1, false)).is_some());
        // The announcing AMO to PE 1 waits for WQE 0; one to PE 2 waits for WQE 1.
        assert!(o.hold_if_needed(send(3, 1, true)).is_none());
        assert!(o.hold_if_needed(send(4, 2, true)).is_none());
        // A later write to PE 1 does not hold the AMO back.
        o.opened(1, 5);
        // A second announcing AMO to PE 1 waits behind the first even with nothing open before
        // it but WQE 0 (order among announcing AMOs of one peer).
        assert!(o.hold_if_needed(send(6, 1, true)).is_none());
        assert_eq!(o.held(), 3);
        assert!(o.next_ready().is_none());
        o.closed(2, 1);
        let p = o.next_ready().expect("PE 2's AMO may go");
        assert_eq!((p.pc, p.peer), (4, 2));
        assert!(o.next_ready().is_none());
        o.closed(1, 0);
        let p = o.next_ready().expect("PE 1's first AMO may go");
        assert_eq!(p.pc, 3);
        // The second one waits for WQE 5 (and would wait for the first AMO once it is in flight).
        o.opened(1, 3);
        assert!(o.next_ready().is_none());
        o.closed(1, 3);
        assert!(o.next_ready().is_none(), "WQE 5 is still open");
        o.closed(1, 5);
        assert_eq!(o.next_ready().map(|p| p.pc), Some(6));
        assert!(o.idle());
        assert_eq!((o.announced, o.waited), (3, 3));
    }

    #[test]
    fn put_back_keeps_the_order_and_drain_empties() {
        let mut o = Order::default();
        o.opened(0, 0);
        assert!(o.hold_if_needed(send(1, 0, true)).is_none());
        assert!(o.hold_if_needed(send(2, 0, true)).is_none());
        o.closed(0, 0);
        let p = o.next_ready().unwrap();
        assert_eq!(p.pc, 1);
        o.put_back(p);
        assert_eq!(o.held(), 2);
        assert_eq!(o.next_ready().map(|p| p.pc), Some(1));
        let rest = o.drain();
        assert_eq!(rest.len(), 1);
        assert!(o.idle());
    }
}
