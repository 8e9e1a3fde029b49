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
//! The bookkeeping here is per stream, a (queue, peer) pair (a queue's ring and the PE its WQEs
//! are aimed at; [`Pending::stream`]): the WQEs taken and not yet completed, in the order taken
//! (`open`), and the announcing AMOs held back (`held`, in the order taken). Producer counts are
//! the queue's own, so the rule holds per queue and never waits on another queue's WQEs. An AMO at producer
//! count `n` to PE `p` may go when no WQE to `p` with a count below `n` is open; an earlier
//! announcing AMO to `p` is such a WQE until it completes, so announcing AMOs to one PE also
//! leave, and are applied, in order.
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::intake::{Action, Pending};

/// One peer's side of the ordering rule.
#[derive(Default)]
struct PeerOrder {
    /// Producer counts of the WQEs to this peer taken and not yet known complete, in the order
    /// taken (so in increasing producer count), each with a "completed" mark; completed entries
    /// leave from the front.
    open: VecDeque<(u64, bool)>,
    /// Announcing AMOs held back, in the order taken, with when each was held.
    held: VecDeque<(Instant, Pending)>,
}

impl PeerOrder {
    /// Producer count of the oldest WQE to this peer not yet complete.
    fn oldest_open(&self) -> Option<u64> {
        self.open.front().map(|&(pc, _)| pc)
    }
}

/// Per-peer state of the ordering rule. O(1) per WQE: a push when it is taken, a mark when it
/// completes (completions arrive in any order), pops of the completed prefix.
#[derive(Default)]
pub(super) struct Order {
    peers: Vec<PeerOrder>,
    /// Index into `peers` of each stream seen.
    index: HashMap<u32, usize>,
    /// AMOs held now, over all peers.
    n_held: usize,
    /// AMOs that had to wait (for the stop summary and the tests' counters).
    pub(super) waited: u64,
    /// Announcing AMOs seen.
    pub(super) announced: u64,
    /// How long the held AMOs that left were held.
    pub(super) hold_time: super::consumer::Latency,
    /// When the AMO [`Order::next_ready`] gave out last was held (until [`Order::released`] or
    /// [`Order::put_back`]).
    out: Option<Instant>,
}

impl Pending {
    /// The ordering rule's stream of this WQE: its queue (high 16 bits) and its PE.
    pub(super) fn stream(&self) -> u32 {
        stream(self.q, self.peer)
    }

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

    /// Whether this WQE is an RDMA write (through the provider or staged).
    pub(super) fn writes(&self) -> bool {
        matches!(
            self.action,
            Action::Rdma { write: true, .. } | Action::Staged { write: true, .. }
        )
    }
}

/// The stream of queue `q` and PE `peer`.
pub(super) fn stream(q: u16, peer: u16) -> u32 {
    (u32::from(q) << 16) | u32::from(peer)
}

impl Order {
    fn peer(&mut self, key: u32) -> &mut PeerOrder {
        let n = self.peers.len();
        let i = *self.index.entry(key).or_insert(n);
        if i == n {
            self.peers.push(PeerOrder::default());
        }
        &mut self.peers[i]
    }

    /// WQE `pc` of stream `key` was taken (validated): it is open until [`Order::closed`].
    /// Called in producer order.
    pub(super) fn taken(&mut self, key: u32, pc: u64) {
        self.peer(key).open.push_back((pc, false));
    }

    /// WQE `pc` to `peer` completed (with any status). A binary search: the entries are in
    /// increasing producer count.
    pub(super) fn closed(&mut self, key: u32, pc: u64) {
        let Some(p) = self.index.get(&key).and_then(|&i| self.peers.get_mut(i)) else {
            return;
        };
        let Ok(i) = p.open.binary_search_by_key(&pc, |&(pc, _)| pc) else {
            return;
        };
        p.open[i].1 = true;
        while p.open.front().is_some_and(|&(_, done)| done) {
            p.open.pop_front();
        }
    }

    /// Takes `p` (already [`Order::taken`]) if it is an announcing AMO that must wait: a WQE to
    /// its peer taken before it is still open (an earlier held AMO is one of them). Hands it back
    /// otherwise.
    pub(super) fn hold_if_needed(&mut self, p: Pending) -> Option<Pending> {
        if !p.announces() {
            return Some(p);
        }
        self.announced += 1;
        let peer = self.peer(p.stream());
        if peer.oldest_open().is_none_or(|first| first >= p.pc) {
            return Some(p);
        }
        peer.held.push_back((Instant::now(), p));
        self.waited += 1;
        self.n_held += 1;
        None
    }

    /// The next held AMO that may go now (every WQE to its peer taken before it completed), if any.
    pub(super) fn next_ready(&mut self) -> Option<Pending> {
        if self.n_held == 0 {
            return None;
        }
        for peer in &mut self.peers {
            let Some((_, front)) = peer.held.front() else {
                continue;
            };
            if peer.oldest_open().is_some_and(|first| first < front.pc) {
                continue;
            }
            self.n_held -= 1;
            let (t, p) = peer.held.pop_front()?;
            self.out = Some(t);
            return Some(p);
        }
        None
    }

    /// The AMO [`Order::next_ready`] gave out last was posted: its hold time is counted.
    pub(super) fn released(&mut self) {
        if let Some(t) = self.out.take() {
            self.hold_time.add(t.elapsed());
        }
    }

    /// Puts back an AMO [`Order::next_ready`] gave out that could not be posted yet.
    pub(super) fn put_back(&mut self, p: Pending) {
        let t = self.out.take().unwrap_or_else(Instant::now);
        self.peer(p.stream()).held.push_front((t, p));
        self.n_held += 1;
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
        self.peers
            .iter_mut()
            .flat_map(|p| p.held.drain(..).map(|(_, p)| p))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::efa::wqe::OpType;
    use crate::gda::wire::SendHdr;

    fn send(pc: u64, peer: u16, after_data: bool) -> Pending {
        Pending {
            pc,
            req_id: pc as u16,
            op: OpType::Send,
            action: Action::Send {
                dest: 0,
                hdr: SendHdr {
                    src_pe: 0,
                    imm: None,
                    len: 32,
                    answer: None,
                    packed: false,
                },
                payload: super::super::Payload::Inline([0; crate::efa::wqe::INLINE_MAX], 32),
                after_data,
                amo: true,
            },
            slot: None,
            bounce: None,
            peer,
            q: 0,
            from: None,
        }
    }

    fn send_on(q: u16, pc: u64, peer: u16, after_data: bool) -> Pending {
        Pending {
            q,
            ..send(pc, peer, after_data)
        }
    }

    /// Takes `p` as the consumer does (bookkeeping, then the hold decision).
    fn take(o: &mut Order, p: Pending) -> (u64, Option<Pending>) {
        o.taken(p.stream(), p.pc);
        (p.pc, o.hold_if_needed(p))
    }

    #[test]
    fn an_announcing_amo_waits_for_earlier_wqes_to_its_peer_only() {
        let mut o = Order::default();
        let (w0, w1) = (0, 1);
        o.taken(1, w0); // a write to PE 1
        o.taken(2, w1); // a write to PE 2
                        // An AMO that does not announce never waits.
        let (plain, p) = take(&mut o, send(2, 1, false));
        assert!(p.is_some());
        // The announcing AMO to PE 1 waits for WQEs 0 and 2; one to PE 2 waits for WQE 1.
        let (a3, p) = take(&mut o, send(3, 1, true));
        assert!(p.is_none());
        let (a4, p) = take(&mut o, send(4, 2, true));
        assert!(p.is_none());
        // A later write to PE 1 does not hold the first AMO back.
        let w5 = 5;
        o.taken(1, w5);
        // A second announcing AMO to PE 1 waits behind the first.
        let (a6, p) = take(&mut o, send(6, 1, true));
        assert!(p.is_none());
        assert_eq!(o.held(), 3);
        assert!(o.next_ready().is_none());
        o.closed(2, w1);
        let p = o.next_ready().expect("PE 2's AMO may go");
        assert_eq!((p.pc, p.peer), (4, 2));
        o.closed(2, a4);
        assert!(o.next_ready().is_none());
        // Completions out of order: the plain AMO first, then the write before it.
        o.closed(1, plain);
        assert!(o.next_ready().is_none(), "WQE 0 is still open");
        o.closed(1, w0);
        let p = o.next_ready().expect("PE 1's first AMO may go");
        assert_eq!(p.pc, 3);
        // The second one waits for the first AMO (in flight now) and for WQE 5.
        assert!(o.next_ready().is_none());
        o.closed(1, w5);
        assert!(o.next_ready().is_none(), "AMO 3 is still open");
        o.closed(1, a3);
        assert_eq!(o.next_ready().map(|p| p.pc), Some(6));
        o.closed(1, a6);
        assert!(o.idle());
        assert_eq!((o.announced, o.waited), (3, 3));
        // Everything closed: a new announcing AMO goes at once; closing twice or an unknown
        // producer count changes nothing.
        o.closed(1, a6);
        o.closed(9, 0);
        let (_, p) = take(&mut o, send(7, 1, true));
        assert!(p.is_some());
    }

    #[test]
    fn the_rule_is_per_queue() {
        let mut o = Order::default();
        // Queue 0 has an open write (its count 0) to PE 1; queue 1's counts are its own.
        o.taken(stream(0, 1), 0);
        let (_, p) = take(&mut o, send_on(1, 0, 1, true));
        assert!(
            p.is_some(),
            "queue 1's AMO does not wait for queue 0's write"
        );
        o.taken(stream(1, 1), 1);
        let (_, p) = take(&mut o, send_on(1, 2, 1, true));
        assert!(
            p.is_none(),
            "queue 1's second AMO waits for queue 1's write 1"
        );
        let (_, p) = take(&mut o, send_on(0, 1, 1, true));
        assert!(p.is_none(), "queue 0's AMO waits for queue 0's write 0");
        // Completing queue 0's write releases queue 0's AMO only.
        o.closed(stream(0, 1), 0);
        let p = o.next_ready().expect("queue 0's AMO may go");
        assert_eq!((p.q, p.pc), (0, 1));
        assert!(o.next_ready().is_none());
        o.closed(stream(1, 1), 0);
        o.closed(stream(1, 1), 1);
        let p = o.next_ready().expect("queue 1's AMO may go");
        assert_eq!((p.q, p.pc), (1, 2));
    }

    #[test]
    fn put_back_keeps_the_order_and_drain_empties() {
        let mut o = Order::default();
        let w = 0;
        o.taken(0, w);
        assert!(take(&mut o, send(1, 0, true)).1.is_none());
        assert!(take(&mut o, send(2, 0, true)).1.is_none());
        o.closed(0, w);
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
