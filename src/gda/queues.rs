//! The queue table of device state version 3 (docs/gda-queues.md): one entry per
//! `(dst_pe, qp_id)` pair, entry `dst_pe * queues_per_pe + qp_id % queues_per_pe`, each naming the
//! queue kernels post that pair's WQEs to.
//!
//! How many entries: `queues_per_pe` comes from `NVSHMEM_IBGDA_NUM_RC_PER_PE` (the QPs per peer
//! that IBGDA code such as DeepEP asks NVSHMEM for; unset: 1), capped at
//! [`NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE`] and so that the table has at most
//! [`NVSHMEM_EFA_GDA_MAX_QUEUES`] entries; a cap is logged, and `qp_id`s then wrap onto the table.
//!
//! Which queue each entry names is the queue's business ([`super::queue::GdaQueue::queue_table`]):
//! entries may name the same queue (the same control block), and the pairs of such entries share
//! its ring and its commit order. [`assign`] is the rule for spreading `n` entries over `limit`
//! distinct queues: entry `i` on queue `i % limit`.
use super::error::{GdaError, Result};
use super::state::{
    NvshmemEfaGdaQueue, NVSHMEM_EFA_GDA_MAX_QUEUES, NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE,
};

/// The variable IBGDA code sets to its QPs per peer.
pub const NUM_RC_PER_PE_VAR: &str = "NVSHMEM_IBGDA_NUM_RC_PER_PE";

/// Queues per PE as `NVSHMEM_IBGDA_NUM_RC_PER_PE` asks (`raw`: its value, `None` when unset):
/// unset or empty gives 1; a value that is not a positive integer is an error; a value above
/// [`NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE`] is capped (logged).
pub fn parse_queues_per_pe(raw: Option<&str>) -> Result<u32> {
    let Some(v) = raw.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(1);
    };
    let n: u64 = v.parse().map_err(|_| {
        GdaError::invalid(format!(
            "{NUM_RC_PER_PE_VAR}={v:?} is not a number of queues per PE (a positive integer)"
        ))
    })?;
    if n == 0 {
        return Err(GdaError::invalid(format!(
            "{NUM_RC_PER_PE_VAR}=0: at least one queue per PE"
        )));
    }
    let max = u64::from(NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE);
    if n > max {
        tracing::warn!(
            "GDA: {NUM_RC_PER_PE_VAR}={n} is above the library's {max} queues per PE: the queue \
             table holds {max} per PE and qp ids wrap onto it (qp_id % {max})"
        );
        return Ok(max as u32);
    }
    Ok(n as u32)
}

/// Queues per PE from the environment ([`parse_queues_per_pe`]).
pub fn queues_per_pe_from_env() -> Result<u32> {
    parse_queues_per_pe(std::env::var(NUM_RC_PER_PE_VAR).ok().as_deref())
}

/// Queues per PE for `n_pes` PEs: `wanted`, reduced so that the table has at most
/// [`NVSHMEM_EFA_GDA_MAX_QUEUES`] entries (logged).
pub fn fit_queues_per_pe(n_pes: i32, wanted: u32) -> Result<u32> {
    let n = u32::try_from(n_pes)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| GdaError::invalid(format!("queue table for {n_pes} PEs")))?;
    if n > NVSHMEM_EFA_GDA_MAX_QUEUES {
        return Err(GdaError::invalid(format!(
            "queue table for {n} PEs: at most {NVSHMEM_EFA_GDA_MAX_QUEUES} entries"
        )));
    }
    let fit = (NVSHMEM_EFA_GDA_MAX_QUEUES / n).max(1);
    let per_pe = wanted.clamp(1, fit);
    if per_pe < wanted {
        tracing::warn!(
            "GDA: {wanted} queues per PE for {n} PEs exceed the table's {NVSHMEM_EFA_GDA_MAX_QUEUES} \
             entries: {per_pe} per PE, qp ids wrap onto them"
        );
    }
    Ok(per_pe)
}

/// Index of the queue of `(dst_pe, qp_id)` in a table of `queues_per_pe` queues per PE (IBGDA's
/// `ibgda_get_rc`).
pub fn queue_index(dst_pe: u32, qp_id: u32, queues_per_pe: u32) -> usize {
    dst_pe as usize * queues_per_pe as usize + (qp_id % queues_per_pe.max(1)) as usize
}

/// Spreads `n` table entries over at most `limit` distinct queues: entry `i` on queue
/// `i % limit` (a `limit` of 0 counts as 1).
pub fn assign(n: usize, limit: usize) -> Vec<usize> {
    let l = limit.max(1);
    (0..n).map(|i| i % l).collect()
}

/// The table of `n_pes * queues_per_pe` entries over `distinct` queues, entry `i` naming
/// `distinct[assign(..)[i]]`.
pub fn build(
    n_pes: i32,
    queues_per_pe: u32,
    distinct: &[NvshmemEfaGdaQueue],
) -> Result<Vec<NvshmemEfaGdaQueue>> {
    if distinct.is_empty() {
        return Err(GdaError::invalid("queue table without a queue"));
    }
    let n = n_pes.max(0) as usize * queues_per_pe as usize;
    if n == 0 || n > NVSHMEM_EFA_GDA_MAX_QUEUES as usize {
        return Err(GdaError::invalid(format!(
            "queue table of {n_pes} PEs x {queues_per_pe} queues"
        )));
    }
    Ok(assign(n, distinct.len())
        .into_iter()
        .map(|q| distinct[q])
        .collect())
}

/// How many GDA QPs a hardware device admits for one context, from the provider's domain limits
/// (`Info::endpoint_limits()`: `ep_cnt`, `tx_ctx_cnt`, `max_ep_tx_ctx`): the endpoint count, capped
/// by the transmit contexts where the provider reports them (each QP is an endpoint with one
/// transmit context). `None` when the provider reports no endpoint count (0): the caller then
/// opens one QP and warns.
pub fn qp_limit(ep_cnt: usize, tx_ctx_cnt: usize, _max_ep_tx_ctx: usize) -> Option<usize> {
    if ep_cnt == 0 {
        return None;
    }
    Some(if tx_ctx_cnt > 0 {
        ep_cnt.min(tx_ctx_cnt)
    } else {
        ep_cnt
    })
}

/// Hardware queues for `n` table entries: how many QPs serve them (`opened` of them open now,
/// at most `limit`) and the line that says so.
pub fn hw_plan(n: usize, limit: Option<usize>, opened: usize) -> (usize, String) {
    let qps = opened.max(1);
    let why = match limit {
        None => "no endpoint limit known from the provider".to_string(),
        Some(l) if l < n => format!("the device admits {l} endpoints"),
        Some(l) => format!(
            "the device admits {l} endpoints; this library opens {qps} GDA QP per context (a QP per \
             queue is not built)"
        ),
    };
    let line = if qps >= n {
        format!("hardware GDA: {n} queue(s) on {qps} QP(s), one each")
    } else {
        format!(
            "hardware GDA: {n} queues (dst_pe x qp_id) share {qps} QP(s), queue i on QP i % {qps} \
             ({why}); a shared QP shares its commit order, and the ordering rule (a quiet of the \
             signal's queue) then covers the other queues on it too"
        )
    };
    (qps, line)
}

/// Distinct queues among the entries (by control block).
pub fn distinct_count(table: &[NvshmemEfaGdaQueue]) -> usize {
    let mut ctrls: Vec<u64> = table.iter().map(|q| q.ctrl).collect();
    ctrls.sort_unstable();
    ctrls.dedup();
    ctrls.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(ctrl: u64) -> NvshmemEfaGdaQueue {
        NvshmemEfaGdaQueue {
            sq: ctrl + 1,
            sq_doorbell: 0,
            cq: 0,
            rx_cq: 0,
            ctrl,
            slot_status: 0,
            host_ctrl: 0,
            sq_entries: 64,
            sq_entry_size: 64,
            cq_entries: 64,
            cq_entry_size: 16,
            rx_entries: 0,
            max_batch: 16,
            qpn: 0,
            reserved: 0,
            mode: 2,
        }
    }

    #[test]
    fn queues_per_pe_parses_and_caps() {
        assert_eq!(parse_queues_per_pe(None).unwrap(), 1);
        assert_eq!(parse_queues_per_pe(Some("")).unwrap(), 1);
        assert_eq!(parse_queues_per_pe(Some(" 144 ")).unwrap(), 144);
        assert_eq!(
            parse_queues_per_pe(Some("100000")).unwrap(),
            NVSHMEM_EFA_GDA_MAX_QUEUES_PER_PE
        );
        for bad in ["0", "-3", "four", "1.5"] {
            let e = parse_queues_per_pe(Some(bad)).unwrap_err();
            assert!(
                e.message.contains(NUM_RC_PER_PE_VAR),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn table_fits_the_entry_cap() {
        assert_eq!(fit_queues_per_pe(2, 144).unwrap(), 144);
        assert_eq!(fit_queues_per_pe(1024, 1024).unwrap(), 64);
        assert_eq!(fit_queues_per_pe(65536, 8).unwrap(), 1);
        assert!(fit_queues_per_pe(0, 1).is_err());
        assert!(fit_queues_per_pe(65537, 1).is_err());
    }

    #[test]
    fn index_is_ibgda_get_rc() {
        assert_eq!(queue_index(0, 0, 4), 0);
        assert_eq!(queue_index(1, 2, 4), 6);
        assert_eq!(queue_index(1, 6, 4), 6);
        assert_eq!(queue_index(3, 0, 1), 3);
        assert_eq!(queue_index(3, 9, 1), 3);
    }

    #[test]
    fn hardware_limits_and_plan() {
        assert_eq!(qp_limit(0, 0, 0), None);
        assert_eq!(qp_limit(32768, 0, 1), Some(32768));
        assert_eq!(qp_limit(256, 64, 1), Some(64));
        let (qps, line) = hw_plan(288, Some(256), 1);
        assert_eq!(qps, 1);
        assert!(line.contains("share 1 QP"), "{line}");
        assert!(line.contains("admits 256"), "{line}");
        let (_, line) = hw_plan(8, None, 1);
        assert!(line.contains("no endpoint limit known"), "{line}");
        let (_, line) = hw_plan(8, Some(32768), 1);
        assert!(line.contains("not built"), "{line}");
        let (qps, line) = hw_plan(1, Some(16), 1);
        assert_eq!(qps, 1);
        assert!(line.contains("one each"), "{line}");
    }

    #[test]
    fn entries_share_queues_round_robin() {
        assert_eq!(assign(5, 2), vec![0, 1, 0, 1, 0]);
        assert_eq!(assign(3, 0), vec![0, 0, 0]);
        assert_eq!(assign(3, 8), vec![0, 1, 2]);
        let t = build(2, 3, &[q(0x100), q(0x200)]).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(t[0], q(0x100));
        assert_eq!(t[1], q(0x200));
        assert_eq!(t[4], q(0x100));
        assert_eq!(distinct_count(&t), 2);
        let one = build(4, 2, &[q(0x100)]).unwrap();
        assert_eq!(distinct_count(&one), 1);
        assert!(build(2, 3, &[]).is_err());
        assert!(build(0, 3, &[q(1)]).is_err());
    }
}
