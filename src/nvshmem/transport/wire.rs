//! The wire format of the active-message and staging protocol: the 64-byte header every message
//! carries ([`AmMsg`]), its kinds, the staged chunk size, the window of an endpoint
//! ([`staging_window`]), and the messages the progress path owes a peer ([`Pending`]). The
//! modules that send, receive and account for messages (`am`, `endpoints`, `peers`) import it.
use crate::fabric::FiAddr;

// Active-message format (64 bytes, in a context's scratch space).
pub(super) const AM_MAGIC: u32 = 0x4d41_4645; // "EFAM"
pub(super) const AM_REQ: u32 = 1;
pub(super) const AM_RESP: u32 = 2;
/// Header of every active message; staged payloads follow it.
pub(super) const AM_BYTES: usize = 64;
/// Payload bytes one staged message may carry: a put of up to 64 KiB is one message.
pub(super) const STAGE_MAX: usize = 64 << 10;
// A whole staged message goes in one eager send of tcp;ofi_rxm at the limit the library sets.
const _: () = assert!(AM_BYTES + STAGE_MAX <= crate::fabric::rxm::EAGER_LIMIT);
/// Size of a receive or send slot: a header plus up to [`STAGE_MAX`] payload bytes.
pub(super) const STAGE_BYTES: usize = AM_BYTES + STAGE_MAX;
/// Payload bytes per chunk of a longer put or get (and per coalesced message): header and chunk
/// make 64 KiB, a whole number of the segments a provider cuts a message into (tcp;ofi_rxm with
/// its default eager limit: 16 KiB), so only the last chunk (up to [`STAGE_MAX`]) may end in a
/// short segment. A put or get of up to [`STAGE_MAX`] is one message (a 64 KiB get as 65472 +
/// 64 bytes was two requests and two answers, and ran at 0.4x of its neighbours' rate on tcp
/// with rxm's eager limit raised).
pub(super) const STAGE_CHUNK: usize = (64 << 10) - AM_BYTES;

/// Payload bytes of the next chunk of a put with `rest` bytes left: all of them when they fit one
/// message ([`STAGE_MAX`]), else [`STAGE_CHUNK`].
pub(super) const fn put_chunk(rest: u64) -> u64 {
    if rest <= STAGE_MAX as u64 {
        rest
    } else {
        STAGE_CHUNK as u64
    }
}

/// Payload bytes of the get chunk at `off` of a get of `len` bytes: the get in the fewest messages
/// of at most [`STAGE_MAX`], all of one size but the last (up to one chunk count fewer bytes). A
/// get whose last chunk was a tail of 64 or 128 bytes behind 64 KiB chunks (65472 + 64 at 64 KiB,
/// 2 x 65472 + 128 at 128 KiB) ran at 0.4x of its neighbours' rate on tcp with rxm's eager limit
/// raised, reproducibly; puts with such tails did not (not explained; tests/bench/staged_twohost.sh).
pub(super) const fn get_chunk(len: u64, off: u64) -> u64 {
    let n = len.div_ceil(STAGE_MAX as u64);
    let size = if n == 0 { 0 } else { len.div_ceil(n) };
    let rest = len - off;
    if rest < size {
        rest
    } else {
        size
    }
}

/// How many messages a put of `len` bytes takes ([`put_chunk`] after [`put_chunk`]).
pub(super) const fn put_chunks(len: u64) -> usize {
    if len <= STAGE_MAX as u64 {
        1
    } else {
        (len - STAGE_MAX as u64).div_ceil(STAGE_CHUNK as u64) as usize + 1
    }
}
/// The staging window when the provider does not bound it lower ([`staging_window`]): send slots
/// per endpoint (staged chunks and get answers in flight; `NVSHMEM_EFA_STAGE_SLOTS`). With 128,
/// shm refused a chunk's send (EAGAIN) for a whole quiet timeout once about 112 chunks were in
/// flight to one peer (2 of 5 host runs, docs/staged-path.md); until that is understood the
/// default stays at the window the path always had.
pub(super) const SEND_SLOTS: usize = 32;

/// The staging window of an endpoint: `(send slots, receive buffers)`. Send slots: `slots`
/// (`NVSHMEM_EFA_STAGE_SLOTS`), at most the provider's transmit queue depth; receive buffers twice
/// as many (the peers' chunks and this PE's answers arrive together), at most its receive queue
/// depth and at least 64. A chunk that finds no posted receive waits in the provider as an
/// unexpected message (on tcp;ofi_rxm a rendezvous that only starts once one is posted).
pub(super) fn staging_window(slots: usize, tx_size: usize, rx_size: usize) -> (usize, usize) {
    let send = slots.min(tx_size.max(8)).max(8);
    let recv = (2 * send).min(rx_size.max(64)).max(64);
    (send, recv)
}
/// Staged put: payload to write at `addr`; answered by AM_RESP.
pub(super) const AM_PUT: u32 = 3;
/// Staged get: `size` bytes at `addr` wanted; answered by AM_GET_DATA.
pub(super) const AM_GET: u32 = 4;
/// Staged get answer: payload (or a status).
pub(super) const AM_GET_DATA: u32 = 5;
/// `AmMsg::reserved` bit: the chunk belongs to an operation on the debug timeline (echoed in the
/// response, so both PEs log the same chunk).
pub(super) const AM_TRACED: u32 = 1;
/// `AmMsg::reserved` bit: the message carries a fence (it is a put chunk or AMO request issued
/// after a fence, or some record of it is [`REC_FENCED`]). The target applies it only after every
/// message it received before it from the same endpoint (sends arrive in order: FI_ORDER_SAS) is
/// applied in full (docs/ordering.md, "fence").
pub(super) const AM_FENCED: u32 = 2;
/// The sender (PE in `val`) finalizes: operations to it from now on fail at once.
pub(super) const AM_GOODBYE: u32 = 6;
/// Probe of a transmit lane (sender PE in `val`, sequence number in `token`): answered by AM_PONG
/// as soon as the target handles it, which proves that the target has processed every command
/// posted to it before (see `lanes`).
pub(super) const AM_PING: u32 = 7;
/// Answer to AM_PING (`token` echoed, sender PE in `val`).
pub(super) const AM_PONG: u32 = 8;

/// Several small staged puts to one peer in one message (`op`: how many, `size`: the payload
/// bytes, `val`: the sender PE): the payload is a run of records, each a [`PUT_RECORD`]-byte header
/// (target address, length) and the data, padded to 8 bytes. The target applies them in order and
/// answers once, with AM_RESP (the first failure's status, if any).
pub(super) const AM_PUT_MULTI: u32 = 9;
/// Answers to several staged put messages from one PE (`size`: how many, 2 to
/// [`RESP_TOKENS`]), all successful: their tokens in `token`, `addr`, `val`, `cmp` and `result`
/// ([`resp_tokens`]). The target merges the put answers it owes one peer that are next to each
/// other in its queue, so a stream of puts costs one answer message per up to five messages.
pub(super) const AM_RESP_MULTI: u32 = 10;
/// Most answers in one [`AM_RESP_MULTI`].
pub(super) const RESP_TOKENS: usize = 5;
/// `AmMsg::op` of an AM_RESP that answers a staged put message (mergeable into an
/// [`AM_RESP_MULTI`] when its status is 0 and it is not traced).
pub(super) const RESP_PUT: i32 = 1;

/// The tokens an [`AM_RESP_MULTI`] carries (`m.size` of them, at most [`RESP_TOKENS`]).
pub(super) fn resp_tokens(m: &AmMsg) -> impl Iterator<Item = u64> {
    [m.token, m.addr, m.val, m.cmp, m.result]
        .into_iter()
        .take((m.size as usize).min(RESP_TOKENS))
}

/// An [`AM_RESP_MULTI`] for `tokens` (2 to [`RESP_TOKENS`] of them).
pub(super) fn resp_multi(tokens: &[u64]) -> AmMsg {
    debug_assert!((2..=RESP_TOKENS).contains(&tokens.len()));
    let t = |k: usize| tokens.get(k).copied().unwrap_or(0);
    AmMsg {
        magic: AM_MAGIC,
        kind: AM_RESP_MULTI,
        token: t(0),
        addr: t(1),
        val: t(2),
        cmp: t(3),
        result: t(4),
        size: tokens.len().min(RESP_TOKENS) as u32,
        ..Default::default()
    }
}

/// Whether `m` is an answer to a staged put message that may share an [`AM_RESP_MULTI`].
pub(super) fn mergeable_answer(m: &AmMsg) -> bool {
    m.kind == AM_RESP && m.op == RESP_PUT && m.status == 0 && m.reserved & AM_TRACED == 0
}

/// Bytes of a coalesced put's record header: the target address (u64), the length (u32), the
/// record's flags (u32: [`REC_AMO`], [`REC_FENCED`], both or none).
pub(super) const PUT_RECORD: usize = 16;
/// Record flag: a non-fetching AMO on the word at the record's address; its [`AMO_RECORD`] data
/// bytes are the op (i32), the operand size (u32) and the operand (u64).
pub(super) const REC_AMO: u32 = 1;
/// Record flag: the record was issued after a fence: the target applies it only after every record
/// before it in the message (and every message before this one: [`AM_FENCED`]) is applied in full.
pub(super) const REC_FENCED: u32 = 2;
/// Data bytes of an AMO record.
pub(super) const AMO_RECORD: usize = 16;
/// The largest put that is coalesced with others ([`AM_PUT_MULTI`]); larger ones go in chunks of
/// their own.
pub(super) const COALESCE_MAX: usize = 16 << 10;

/// Bytes a record of `len` data bytes takes in a coalesced message.
pub(super) const fn record_bytes(len: usize) -> usize {
    PUT_RECORD + len.div_ceil(8) * 8
}

/// Writes the header of a record for `len` bytes at `addr` at the start of `buf` (which holds
/// [`record_bytes`]`(len)` bytes at least); the data goes at `PUT_RECORD`.
pub(super) fn write_record(buf: &mut [u8], addr: u64, len: u32, fenced: bool) {
    write_record_flagged(buf, addr, len, if fenced { REC_FENCED } else { 0 });
}

fn write_record_flagged(buf: &mut [u8], addr: u64, len: u32, flags: u32) {
    buf[0..8].copy_from_slice(&addr.to_le_bytes());
    buf[8..12].copy_from_slice(&len.to_le_bytes());
    buf[12..16].copy_from_slice(&flags.to_le_bytes());
}

/// Writes a whole AMO record (header and data) at the start of `buf` (which holds
/// [`record_bytes`]`(AMO_RECORD)` bytes at least); `fenced`: [`REC_FENCED`].
pub(super) fn write_amo_record(
    buf: &mut [u8],
    addr: u64,
    op: i32,
    size: u32,
    val: u64,
    fenced: bool,
) {
    let fence = if fenced { REC_FENCED } else { 0 };
    write_record_flagged(buf, addr, AMO_RECORD as u32, REC_AMO | fence);
    let d = &mut buf[PUT_RECORD..PUT_RECORD + AMO_RECORD];
    d[0..4].copy_from_slice(&op.to_le_bytes());
    d[4..8].copy_from_slice(&size.to_le_bytes());
    d[8..16].copy_from_slice(&val.to_le_bytes());
}

/// The op, operand size and operand of an AMO record's data.
pub(super) fn read_amo_record(d: &[u8]) -> (i32, u32, u64) {
    (
        i32::from_le_bytes(d[0..4].try_into().expect("4 bytes")),
        u32::from_le_bytes(d[4..8].try_into().expect("4 bytes")),
        u64::from_le_bytes(d[8..16].try_into().expect("8 bytes")),
    )
}

/// The records of a coalesced message's payload (`count` announced): for each, the target
/// address, the offset of its data in `payload`, its length and its flags; an error names the
/// first record that does not fit, has unknown flags, or a count that does not match.
pub(super) fn parse_records(
    payload: &[u8],
    count: u32,
) -> Result<Vec<(u64, usize, usize, u32)>, String> {
    walk_records(
        payload,
        count,
        "record",
        false,
        |k, at, addr, len, flags, data| {
            if flags & !(REC_AMO | REC_FENCED) != 0 || (flags & REC_AMO != 0 && len != AMO_RECORD) {
                return Err(format!(
                    "record {k} at byte {at}: flags {flags:#x} with {len} bytes"
                ));
            }
            Ok((addr, data, len, flags))
        },
    )
}

/// Walks a run of records as both coalesced formats lay them out ([`AM_PUT_MULTI`]'s records,
/// [`AM_GET_DATA_MULTI`]'s answers): each a 16-byte header (a u64, the data length as u32, a u32
/// word) and its data, padded to 8 bytes. `what` names a record in errors; `empty`: whether a
/// record may carry no data. `each` turns a record (its index, byte offset, u64, length, word and
/// the offset of its data) into an entry, or refuses it before its length is checked. An error
/// names the first record that does not fit, or a count other than `count`.
fn walk_records<T>(
    payload: &[u8],
    count: u32,
    what: &str,
    empty: bool,
    mut each: impl FnMut(usize, usize, u64, usize, u32, usize) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    const HEADER: usize = 16;
    const _: () = assert!(PUT_RECORD == HEADER && GET_ANSWER == HEADER);
    let mut out = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    while at < payload.len() {
        let Some(h) = payload.get(at..at + HEADER) else {
            return Err(format!("{what} {} header cut at byte {at}", out.len()));
        };
        let head = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        let word = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        let entry = each(out.len(), at, head, len, word, at + HEADER)?;
        let end = at + record_bytes(len);
        if (len == 0 && !empty) || end > payload.len() {
            return Err(format!(
                "{what} {} of {len} bytes at byte {at} exceeds the {}-byte payload",
                out.len(),
                payload.len()
            ));
        }
        out.push(entry);
        at = end;
    }
    if out.len() != count as usize {
        return Err(format!(
            "{} {what}s where {count} were announced",
            out.len()
        ));
    }
    Ok(out)
}

/// Several staged gets of one PE from one peer in one request (`op`: how many, `size`: the payload
/// bytes, `val`: the requesting PE): the payload is a run of [`GET_REQUEST`]-byte records (the
/// token of the get's waiting context, the source address, the length). The target answers them
/// all with one [`AM_GET_DATA_MULTI`]; the initiator bounds a request so that its answer fits one
/// message ([`get_answer_fits`]).
pub(super) const AM_GET_MULTI: u32 = 11;
/// The answer to an [`AM_GET_MULTI`] (`op`: how many records, `size`: the payload bytes, `status`:
/// non-zero when no record's data is valid): a run of records, each a [`GET_ANSWER`]-byte header
/// (the token, the data length, the record's status) and the data, padded to 8 bytes.
pub(super) const AM_GET_DATA_MULTI: u32 = 12;
/// Bytes of a record of an [`AM_GET_MULTI`].
pub(super) const GET_REQUEST: usize = 24;
/// Bytes of a record's header in an [`AM_GET_DATA_MULTI`].
pub(super) const GET_ANSWER: usize = 16;

/// Bytes the answer to a get of `len` bytes takes in an [`AM_GET_DATA_MULTI`].
pub(super) const fn get_answer_bytes(len: usize) -> usize {
    GET_ANSWER + len.div_ceil(8) * 8
}

/// Whether a request of `used` payload bytes whose answer takes `answer` bytes has room for one
/// more get of `len` bytes (both messages stay within one slot's payload, [`STAGE_MAX`]).
pub(super) const fn get_answer_fits(used: usize, answer: usize, len: usize) -> bool {
    used + GET_REQUEST <= STAGE_MAX && answer + get_answer_bytes(len) <= STAGE_MAX
}

/// Writes a get request record (`token`, `len` bytes at `addr`) at the start of `buf`.
pub(super) fn write_get_request(buf: &mut [u8], token: u64, addr: u64, len: u32) {
    buf[0..8].copy_from_slice(&token.to_le_bytes());
    buf[8..16].copy_from_slice(&addr.to_le_bytes());
    buf[16..20].copy_from_slice(&len.to_le_bytes());
    buf[20..24].copy_from_slice(&0u32.to_le_bytes());
}

/// The records of an [`AM_GET_MULTI`]'s payload (`count` announced): token, source address and
/// length of each; an error names what does not match (a record cut short, a length of 0 or
/// above [`COALESCE_MAX`], a count that differs).
pub(super) fn parse_get_requests(
    payload: &[u8],
    count: u32,
) -> Result<Vec<(u64, u64, u32)>, String> {
    if payload.len() % GET_REQUEST != 0 || payload.len() / GET_REQUEST != count as usize {
        return Err(format!(
            "{} payload bytes for {count} get records of {GET_REQUEST} bytes",
            payload.len()
        ));
    }
    payload
        .chunks_exact(GET_REQUEST)
        .enumerate()
        .map(|(k, r)| {
            let token = u64::from_le_bytes(r[0..8].try_into().expect("8 bytes"));
            let addr = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(r[16..20].try_into().expect("4 bytes"));
            if len == 0 || len as usize > COALESCE_MAX {
                return Err(format!("get record {k}: {len} bytes"));
            }
            Ok((token, addr, len))
        })
        .collect()
}

/// Writes the header of a get answer record (`token`, `len` data bytes following, `status`) at the
/// start of `buf`.
pub(super) fn write_get_answer(buf: &mut [u8], token: u64, len: u32, status: i32) {
    buf[0..8].copy_from_slice(&token.to_le_bytes());
    buf[8..12].copy_from_slice(&len.to_le_bytes());
    buf[12..16].copy_from_slice(&status.to_le_bytes());
}

/// The records of an [`AM_GET_DATA_MULTI`]'s payload (`count` announced): token, status, offset of
/// the data in `payload` and its length; an error names the first record that does not fit or a
/// count that does not match.
pub(super) fn parse_get_answers(
    payload: &[u8],
    count: u32,
) -> Result<Vec<(u64, i32, usize, usize)>, String> {
    walk_records(
        payload,
        count,
        "get answer",
        true,
        |_, _, token, len, status, data| Ok((token, status as i32, data, len)),
    )
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AmMsg {
    pub(super) magic: u32,
    pub(super) kind: u32,
    /// Initiator's waiting context (returned in the response).
    pub(super) token: u64,
    pub(super) op: i32,
    pub(super) size: u32,
    pub(super) addr: u64,
    pub(super) val: u64,
    pub(super) cmp: u64,
    /// Response: old value; request: initiator PE.
    pub(super) result: u64,
    pub(super) status: i32,
    pub(super) reserved: u32,
}
const _: () = assert!(std::mem::size_of::<AmMsg>() <= AM_BYTES);

/// Messages the progress path owes a peer (sent as soon as resources allow).
pub(super) enum Pending {
    /// A header-only message.
    Msg(FiAddr, AmMsg),
    /// Data for a staged get.
    GetData {
        dest: FiAddr,
        token: u64,
        addr: u64,
        len: u32,
        /// The send slot holding the data and the status to answer with, once taken
        /// (the active-message module's `prepare_get_data`).
        prep: Option<GetPrep>,
    },
    /// Data for the gets of an [`AM_GET_MULTI`] (token, source address, length of each), sent in
    /// one [`AM_GET_DATA_MULTI`].
    GetMulti {
        dest: FiAddr,
        gets: Vec<(u64, u64, u32)>,
        prep: Option<GetPrep>,
    },
}

impl Pending {
    /// The peer the message goes to.
    pub(super) fn dest(&self) -> FiAddr {
        match self {
            Pending::Msg(d, _) => *d,
            Pending::GetData { dest, .. } | Pending::GetMulti { dest, .. } => *dest,
        }
    }

    /// The send slot of a get answer whose data is (being) copied in.
    pub(super) fn prep_mut(&mut self) -> Option<&mut Option<GetPrep>> {
        match self {
            Pending::Msg(..) => None,
            Pending::GetData { prep, .. } | Pending::GetMulti { prep, .. } => Some(prep),
        }
    }
}

/// A staged get's answer with its data (being) copied in: its send slot, the status to answer
/// with, and the mark of its copy out of GPU memory (`None`: the data is in place).
#[derive(Clone, Debug)]
pub(super) struct GetPrep {
    pub(super) slot: usize,
    pub(super) status: i32,
    /// Payload bytes of the answer (the data of a single get; the records of a coalesced one).
    pub(super) size: u32,
    pub(super) copied: Option<std::sync::Arc<crate::cuda::stream::Event>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_layout_is_the_wire_format() {
        // Both PEs read the header with read_unaligned from a receive buffer: its fields sit at
        // fixed offsets, little-endian on every supported host.
        let m = AmMsg {
            magic: AM_MAGIC,
            kind: AM_PUT,
            token: 0x1122_3344_5566_7788,
            op: -3,
            size: 0xabcd,
            addr: 0x0102_0304_0506_0708,
            val: 9,
            cmp: 10,
            result: 11,
            status: -12,
            reserved: AM_TRACED,
        };
        let mut buf = [0u8; AM_BYTES];
        // SAFETY: the buffer holds AM_BYTES >= size_of::<AmMsg>() bytes.
        unsafe { std::ptr::write_unaligned(buf.as_mut_ptr() as *mut AmMsg, m) };
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
        assert_eq!(std::mem::size_of::<AmMsg>(), 64);
        assert_eq!(u32_at(0), AM_MAGIC);
        assert_eq!(&buf[0..4], b"EFAM");
        assert_eq!(u32_at(4), AM_PUT);
        assert_eq!(u64_at(8), m.token);
        assert_eq!(u32_at(16) as i32, -3);
        assert_eq!(u32_at(20), 0xabcd);
        assert_eq!(u64_at(24), m.addr);
        assert_eq!((u64_at(32), u64_at(40), u64_at(48)), (9, 10, 11));
        assert_eq!(u32_at(56) as i32, -12);
        assert_eq!(u32_at(60), AM_TRACED);
        // SAFETY: as above.
        let back: AmMsg = unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const AmMsg) };
        assert_eq!(
            (back.token, back.addr, back.status),
            (m.token, m.addr, m.status)
        );
        // A staged message is the header and at most STAGE_MAX payload bytes: one receive
        // buffer; a chunk and its header make 64 KiB.
        assert_eq!(AM_BYTES + STAGE_MAX, STAGE_BYTES);
        assert_eq!(AM_BYTES + STAGE_CHUNK, 64 << 10);
        // Slots stay 64-byte aligned in their slab.
        assert_eq!(STAGE_BYTES % 64, 0);
        // The kinds are distinct.
        let kinds = [
            AM_REQ,
            AM_RESP,
            AM_PUT,
            AM_GET,
            AM_GET_DATA,
            AM_GOODBYE,
            AM_PING,
            AM_PONG,
            AM_PUT_MULTI,
            AM_RESP_MULTI,
            AM_GET_MULTI,
            AM_GET_DATA_MULTI,
        ];
        for (i, a) in kinds.iter().enumerate() {
            assert!(!kinds[i + 1..].contains(a), "kind {a} twice");
        }
    }

    #[test]
    fn coalesced_records_round_trip_and_bad_ones_are_refused() {
        let puts: [(u64, &[u8]); 3] = [
            (0x1000, &[1u8; 8]),
            (0x2004, &[2u8; 3]),
            (0x3000, &[3u8; 17]),
        ];
        let mut buf = vec![0u8; 256];
        let mut at = 0;
        for (addr, data) in puts {
            write_record(&mut buf[at..], addr, data.len() as u32, addr == 0x2004);
            buf[at + PUT_RECORD..at + PUT_RECORD + data.len()].copy_from_slice(data);
            at += record_bytes(data.len());
        }
        assert_eq!(at, 24 + 24 + 40);
        let recs = parse_records(&buf[..at], 3).unwrap();
        assert_eq!(recs.len(), 3);
        for ((addr, off, len, flags), (want_addr, data)) in recs.iter().zip(puts) {
            let fenced = if want_addr == 0x2004 { REC_FENCED } else { 0 };
            assert_eq!((*addr, *len, *flags), (want_addr, data.len(), fenced));
            assert_eq!(&buf[*off..*off + *len], data);
        }
        // An AMO record after them round-trips; unknown flags and a wrong AMO length are refused.
        write_amo_record(&mut buf[at..], 0x4000, 9, 8, 0x55, false);
        let with_amo = at + record_bytes(AMO_RECORD);
        let recs = parse_records(&buf[..with_amo], 4).unwrap();
        let (addr, off, len, flags) = recs[3];
        assert_eq!((addr, len, flags), (0x4000, AMO_RECORD, REC_AMO));
        assert_eq!(read_amo_record(&buf[off..off + len]), (9, 8, 0x55));
        // A fenced AMO record keeps both flags.
        write_amo_record(&mut buf[at..], 0x4000, 9, 8, 0x55, true);
        let recs = parse_records(&buf[..with_amo], 4).unwrap();
        assert_eq!(recs[3].3, REC_AMO | REC_FENCED);
        buf[at + 12] = 4;
        assert!(parse_records(&buf[..with_amo], 4)
            .unwrap_err()
            .contains("flags"));
        write_record_flagged(&mut buf[at..], 0x4000, 8, REC_AMO);
        assert!(parse_records(&buf[..with_amo], 4).is_err());
        // A wrong count, a cut record, a record running past the payload, a zero length.
        assert!(parse_records(&buf[..at], 2)
            .unwrap_err()
            .contains("3 records"));
        assert!(parse_records(&buf[..at - 8], 3)
            .unwrap_err()
            .contains("record 2"));
        assert!(parse_records(&buf[..20], 1)
            .unwrap_err()
            .contains("record 0"));
        let mut zero = vec![0u8; 16];
        write_record(&mut zero, 0x1000, 0, false);
        assert!(parse_records(&zero, 1).is_err());
        // A full message of 8-byte puts: thousands per 64 KiB message.
        assert_eq!(STAGE_CHUNK / record_bytes(8), 2728);
        assert!(record_bytes(COALESCE_MAX) <= STAGE_CHUNK);
    }

    #[test]
    fn merged_put_answers_carry_their_tokens() {
        let tokens = [0x1_0000_0003u64, 0x3_0000_0007, 5, 0xffff_ffff_0000_0001, 9];
        for n in 2..=RESP_TOKENS {
            let m = resp_multi(&tokens[..n]);
            assert_eq!(
                (m.magic, m.kind, m.size),
                (AM_MAGIC, AM_RESP_MULTI, n as u32)
            );
            assert_eq!(resp_tokens(&m).collect::<Vec<_>>(), tokens[..n]);
        }
        // A count beyond the fields never reads past them.
        let mut m = resp_multi(&tokens);
        m.size = 99;
        assert_eq!(resp_tokens(&m).count(), RESP_TOKENS);
        // Only successful, untraced put answers merge.
        let put = AmMsg {
            magic: AM_MAGIC,
            kind: AM_RESP,
            op: RESP_PUT,
            ..Default::default()
        };
        assert!(mergeable_answer(&put));
        assert!(!mergeable_answer(&AmMsg { status: -1, ..put }));
        assert!(!mergeable_answer(&AmMsg {
            reserved: AM_TRACED,
            ..put
        }));
        assert!(!mergeable_answer(&AmMsg { op: 0, ..put }));
        assert!(!mergeable_answer(&AmMsg {
            kind: AM_PUT,
            ..put
        }));
    }

    #[test]
    fn a_put_of_up_to_64_kib_is_one_message_and_longer_ones_64_kib_messages() {
        let chunks = |len: u64| {
            let mut v = Vec::new();
            let mut off = 0;
            while off < len {
                let n = put_chunk(len - off);
                v.push(n);
                off += n;
            }
            assert_eq!(v.len(), put_chunks(len), "{len} bytes");
            v
        };
        assert_eq!(chunks(8), [8]);
        assert_eq!(chunks(32 << 10), [32 << 10]);
        // 64 KiB: one message (it used to be 65472 + 64 bytes, two messages and two answers).
        assert_eq!(chunks(64 << 10), [64 << 10]);
        let c = STAGE_CHUNK as u64;
        assert_eq!(chunks((64 << 10) + 1), [c, 65]);
        assert_eq!(chunks(128 << 10), [c, c, 128]);
        // 1 MiB: 16 chunks whose messages are 64 KiB each, and the rest.
        let mib = chunks(1 << 20);
        assert_eq!(mib.len(), 17);
        assert!(mib[..16].iter().all(|&n| n == c));
        assert_eq!(mib[16], (1 << 20) - 16 * c);
        assert!(mib.iter().all(|&n| n as usize <= STAGE_MAX));
    }

    #[test]
    fn coalesced_get_requests_and_answers_round_trip_and_bad_ones_are_refused() {
        let gets: [(u64, u64, u32); 3] = [(7, 0x1000, 8), (9, 0x2008, 13), (11, 0x3000, 4096)];
        let mut req = vec![0u8; gets.len() * GET_REQUEST];
        for (k, &(token, addr, len)) in gets.iter().enumerate() {
            write_get_request(&mut req[k * GET_REQUEST..], token, addr, len);
        }
        assert_eq!(parse_get_requests(&req, 3).unwrap(), gets);
        assert!(parse_get_requests(&req, 2).is_err());
        assert!(parse_get_requests(&req[..req.len() - 1], 3).is_err());
        let mut zero = req.clone();
        zero[16..20].copy_from_slice(&0u32.to_le_bytes());
        assert!(parse_get_requests(&zero, 3).is_err());
        let mut big = req.clone();
        big[16..20].copy_from_slice(&(COALESCE_MAX as u32 + 1).to_le_bytes());
        assert!(parse_get_requests(&big, 3).is_err());

        // The answer: each record's header, then its data padded to 8 bytes; a refused record
        // keeps its data space (its status says the data is not valid).
        let mut ans = Vec::new();
        for &(token, addr, len) in &gets {
            let at = ans.len();
            ans.resize(at + get_answer_bytes(len as usize), 0);
            let status = if token == 9 { -2 } else { 0 };
            write_get_answer(&mut ans[at..], token, len, status);
            for b in 0..len as usize {
                ans[at + GET_ANSWER + b] = (addr as usize + b) as u8;
            }
        }
        assert_eq!(get_answer_bytes(13), GET_ANSWER + 16);
        let parsed = parse_get_answers(&ans, 3).unwrap();
        assert_eq!(
            parsed,
            [
                (7, 0, GET_ANSWER, 8),
                (9, -2, 2 * GET_ANSWER + 8, 13),
                (11, 0, 3 * GET_ANSWER + 24, 4096)
            ]
        );
        let (_, _, off, len) = parsed[2];
        assert_eq!(ans[off], 0x00);
        assert_eq!(ans[off + len - 1], ((0x3000 + 4095) & 0xff) as u8);
        assert!(parse_get_answers(&ans, 4).is_err());
        assert!(parse_get_answers(&ans[..ans.len() - 8], 3).is_err());

        // A request's answer always fits one message: 8-byte gets until the answer is full, and
        // the largest coalesced get alone.
        assert!(get_answer_fits(0, 0, COALESCE_MAX));
        let n = (0..)
            .take_while(|&k| get_answer_fits(k * GET_REQUEST, k * get_answer_bytes(8), 8))
            .count();
        assert_eq!(n, STAGE_MAX / GET_REQUEST);
        assert!(n * get_answer_bytes(8) <= STAGE_MAX);
    }

    #[test]
    fn gets_are_cut_into_even_chunks() {
        let chunks = |len: u64| {
            let mut v = Vec::new();
            let mut off = 0;
            while off < len {
                let n = get_chunk(len, off);
                assert!(
                    n > 0 && n as usize <= STAGE_MAX,
                    "{len} bytes at {off}: {n}"
                );
                v.push(n);
                off += n;
            }
            assert_eq!(off, len);
            v
        };
        assert_eq!(chunks(8), [8]);
        assert_eq!(chunks(64 << 10), [64 << 10]);
        assert_eq!(chunks((64 << 10) + 1), [32769, 32768]);
        assert_eq!(chunks(128 << 10), [64 << 10, 64 << 10]);
        assert_eq!(chunks((128 << 10) + 64), [43712, 43712, 43712]);
        let mib = chunks(1 << 20);
        assert_eq!(mib, vec![64 << 10; 16]);
        let odd = chunks((1 << 20) + 3);
        assert_eq!(odd.len(), 17);
        assert!(odd.iter().all(|&n| n.abs_diff(odd[0]) < 17));
    }

    #[test]
    fn the_staging_window_follows_the_provider_queues() {
        // Room enough: the configured slots, twice as many receive buffers.
        assert_eq!(staging_window(128, 1024, 1024), (128, 256));
        // A short transmit queue bounds the slots, a short receive queue the buffers (64 at least).
        assert_eq!(staging_window(128, 64, 1024), (64, 128));
        assert_eq!(staging_window(128, 1024, 100), (128, 100));
        assert_eq!(staging_window(128, 1024, 16), (128, 64));
        // Never fewer than 8 slots, whatever the provider says.
        assert_eq!(staging_window(128, 0, 0), (8, 64));
        assert_eq!(staging_window(32, 1024, 1024), (32, 64));
    }
}
