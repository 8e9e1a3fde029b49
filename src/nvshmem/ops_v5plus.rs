//! Operations that transport ABI 6 and 7 (NVSHMEM 3.7.x, 3.8.x) add, on top of the one
//! ABI-independent [`Transport`]: floating-point AMOs, batched RMA (`rma_with_hints` with
//! MORE_FOLLOWS) and `region_flush`. Only public items of `Transport` are used.
//!
//! Float AMOs: set, swap, fetch and signal-set move the same bits as their integer forms and go down
//! the integer path unchanged. add, fetch-add, inc, fetch-inc, signal-add and compare-swap need float
//! arithmetic: they run as a compare-and-swap loop over the integer path (fetch the old bits, compute
//! the new value with [`float_amo`], integer compare-swap, retry when another PE changed the word
//! meanwhile). Each step waits with `quiet` on the endpoint, so a float AMO also completes the
//! endpoint's earlier operations (stronger than required, never weaker).
use std::ffi::c_void;
use std::time::Instant;

use super::abi::{self, amo, AmoMemdesc, AmoVerb, RmaBytesdesc, RmaMemdesc, RmaVerb};
use super::transport::{TResult, Transport, TransportError};
use crate::cuda::{self, PtrKind};

fn invalid(message: String) -> TransportError {
    tracing::error!("{message}");
    TransportError {
        status: abi::status::INVALID_VALUE,
        message,
    }
}

/// The new value of a floating-point AMO applied to `old` (NVSHMEM's float AMO semantics: IEEE-754
/// arithmetic in the operand's precision, compare-swap compares values, so `-0.0 == 0.0` and a NaN
/// never matches). Operands are the value's bits in the low `size` bytes (4: `float`, 8: `double`);
/// the result is in the same form. Bitwise ops are not defined on floats and are refused.
pub fn float_amo(opc: i32, size: u32, old: u64, val: u64, cmp: u64) -> Result<u64, String> {
    fn apply<F: Copy + PartialEq + std::ops::Add<Output = F>>(
        opc: i32,
        old: F,
        val: F,
        cmp: F,
        one: F,
    ) -> Result<F, String> {
        Ok(match opc {
            amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP => val,
            amo::FETCH => old,
            amo::INC | amo::FETCH_INC => old + one,
            amo::ADD | amo::SIGNAL_ADD | amo::FETCH_ADD => old + val,
            amo::COMPARE_SWAP => {
                if old == cmp {
                    val
                } else {
                    old
                }
            }
            other => {
                return Err(format!(
                    "AMO op {other} is not defined on floating-point values"
                ))
            }
        })
    }
    match size {
        4 => {
            let f = |b: u64| f32::from_bits(b as u32);
            let r = apply(opc, f(old), f(val), f(cmp), 1.0f32)?;
            Ok(r.to_bits() as u64)
        }
        8 => {
            let r = apply(
                opc,
                f64::from_bits(old),
                f64::from_bits(val),
                f64::from_bits(cmp),
                1.0f64,
            )?;
            Ok(r.to_bits())
        }
        other => Err(format!("float AMO size {other} (4 or 8)")),
    }
}

/// Whether a float AMO moves the same bits as its integer form (no arithmetic on the value).
pub fn float_amo_is_bitwise(opc: i32) -> bool {
    matches!(
        opc,
        amo::SET | amo::SIGNAL | amo::SIGNAL_SET | amo::SWAP | amo::FETCH
    )
}

/// For the target-applied AMO path (`Transport::apply_local_amo`): the new value of a request whose
/// op code may carry [`amo::FLOAT_BIT`]. Integer ops keep `integer`'s result (the existing
/// `compute_amo`).
pub fn apply_amo_any(
    opc_with_flag: i32,
    size: u32,
    old: u64,
    val: u64,
    cmp: u64,
    integer: impl FnOnce(i32, u64, u64, u64) -> TResult<u64>,
) -> TResult<u64> {
    if opc_with_flag & amo::FLOAT_BIT != 0 {
        float_amo(opc_with_flag & !amo::FLOAT_BIT, size, old, val, cmp).map_err(invalid)
    } else {
        integer(opc_with_flag, old, val, cmp)
    }
}

/// Per-endpoint batching state of `rma_with_hints`, kept by the ABI adapter next to the transport.
#[derive(Default)]
pub struct BatchState {
    /// A blocking operation was posted inside the open batch: the batch's last post waits for it.
    pending_wait: [std::sync::atomic::AtomicBool; super::NUM_EPS],
}

impl Transport {
    /// A floating-point AMO (ABI 6+ verb with `is_float`). See the module doc.
    ///
    /// # Safety
    /// As for [`Transport::amo`].
    pub unsafe fn amo_float(
        &self,
        pe: i32,
        verb: AmoVerb,
        target: *mut AmoMemdesc,
        elembytes: i32,
        ep: usize,
    ) -> TResult<()> {
        if float_amo_is_bitwise(verb.op) {
            // SAFETY: forwarded caller guarantees.
            return unsafe { self.amo(pe, verb, target, elembytes, ep) };
        }
        if target.is_null() {
            return Err(invalid("amo: null descriptor".into()));
        }
        if elembytes != 4 && elembytes != 8 {
            return Err(invalid(format!("float amo: size {elembytes} (4 or 8)")));
        }
        let size = elembytes as u32;
        let mask = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
        // SAFETY: non-null descriptor from NVSHMEM.
        let t = unsafe { *target };
        // Checks the op before anything is posted.
        float_amo(verb.op, size, 0, t.val, t.cmp).map_err(invalid)?;
        // The loop's own result word: host memory of this process (plain host memory is accepted
        // as a fetch target by providers without FI_MR_LOCAL and by the target-applied path).
        let mut word = Box::new(0u64);
        let wptr = &mut *word as *mut u64 as *mut c_void;
        let mut step = |opc: i32, val: u64, cmp: u64| -> TResult<u64> {
            *word = 0;
            let mut d = AmoMemdesc {
                retptr: wptr,
                ret_handle: std::ptr::null_mut(),
                val,
                cmp,
                ..t
            };
            let v = AmoVerb {
                op: opc,
                is_fetch: 1,
                is_val: 1,
                is_cmp: (opc == amo::COMPARE_SWAP) as i32,
            };
            // SAFETY: d is a valid descriptor on this stack frame; the result word outlives quiet.
            unsafe { self.amo(pe, v, &mut d, elembytes, ep)? };
            self.quiet(ep)?;
            // SAFETY: wptr points at `word`, written by the completed fetch.
            Ok(unsafe { *(wptr as *const u64) } & mask)
        };
        let deadline = Instant::now() + self.config().quiet_timeout;
        let mut old = step(amo::FETCH, 0, 0)?;
        loop {
            let new = float_amo(verb.op, size, old, t.val & mask, t.cmp & mask).map_err(invalid)?;
            if new == old {
                // Compare-swap that does not match (or an add of -0.0): nothing to write.
                break;
            }
            let seen = step(amo::COMPARE_SWAP, new, old)?;
            if seen == old {
                break;
            }
            old = seen;
            if Instant::now() > deadline {
                return Err(TransportError {
                    status: abi::status::INTERNAL,
                    message: format!("float amo on PE {pe}: word keeps changing (contention)"),
                });
            }
        }
        if verb.op > amo::END_OF_NONFETCH {
            if t.retptr.is_null() {
                return Err(invalid(format!(
                    "amo: fetching op {} without retptr",
                    verb.op
                )));
            }
            let bytes = old.to_le_bytes();
            if matches!(cuda::pointer_kind(t.retptr), PtrKind::Device { .. }) {
                // SAFETY: NVSHMEM's result buffer holds `size` bytes.
                unsafe { cuda::memcpy(t.retptr, bytes.as_ptr() as *const c_void, size as usize) }
                    .map_err(|e| invalid(e.to_string()))?;
            } else {
                // SAFETY: as above, host memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        t.retptr as *mut u8,
                        size as usize,
                    )
                };
            }
        }
        Ok(())
    }

    /// `rma_with_hints` (ABI 7). With `more_follows` the operation is posted without waiting (its
    /// completion wait, if the verb is blocking, moves to the batch's last post); the last post (no
    /// flag) waits once for the whole batch when any operation of it was blocking.
    ///
    /// # Safety
    /// As for [`Transport::rma`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rma_batched(
        &self,
        batch: &BatchState,
        pe: i32,
        verb: RmaVerb,
        remote: *mut RmaMemdesc,
        local: *mut RmaMemdesc,
        bytes: RmaBytesdesc,
        ep: usize,
        more_follows: bool,
    ) -> TResult<()> {
        use std::sync::atomic::Ordering;
        let flag = batch
            .pending_wait
            .get(ep)
            .ok_or_else(|| invalid(format!("rma: endpoint {ep}")))?;
        let blocking = verb.is_nbi == 0;
        let nbi = RmaVerb { is_nbi: 1, ..verb };
        // SAFETY: forwarded caller guarantees.
        unsafe { self.rma(pe, nbi, remote, local, bytes, ep)? };
        if more_follows {
            if blocking {
                flag.store(true, Ordering::Release);
            }
            return Ok(());
        }
        if flag.swap(false, Ordering::AcqRel) || blocking {
            self.quiet(ep)?;
        }
        Ok(())
    }

    /// `region_flush` (ABI 7): every operation of the region is complete on return. Operations are
    /// posted as they arrive (no region-side queue), so completing the role's endpoint — a quiet on
    /// it — completes the region's operations (and any other operation posted there before).
    pub fn region_flush(
        &self,
        batch: &BatchState,
        role: i32,
        issuer: u64,
        region: u64,
    ) -> TResult<()> {
        use std::sync::atomic::Ordering;
        let ep = match role {
            abi::v7::region_role::HOST => super::EP_HOST,
            abi::v7::region_role::PROXY => super::EP_PROXY,
            other => {
                return Err(invalid(format!(
                    "region_flush: role {other} (host 0, proxy 1), issuer {issuer}, region {region}"
                )))
            }
        };
        batch.pending_wait[ep].store(false, Ordering::Release);
        self.quiet(ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(x: f32) -> u64 {
        x.to_bits() as u64
    }
    fn d(x: f64) -> u64 {
        x.to_bits()
    }

    #[test]
    fn float_add_and_inc() {
        assert_eq!(float_amo(amo::ADD, 4, f(1.5), f(2.25), 0), Ok(f(3.75)));
        assert_eq!(
            float_amo(amo::FETCH_ADD, 8, d(-1.0), d(0.5), 0),
            Ok(d(-0.5))
        );
        assert_eq!(
            float_amo(amo::SIGNAL_ADD, 8, d(1e300), d(1e300), 0),
            Ok(d(2e300))
        );
        assert_eq!(float_amo(amo::INC, 4, f(41.0), 0, 0), Ok(f(42.0)));
        assert_eq!(float_amo(amo::FETCH_INC, 8, d(0.5), 0, 0), Ok(d(1.5)));
        // Rounds in the operand's precision: f32 loses what f64 keeps.
        assert_eq!(
            float_amo(amo::ADD, 4, f(16777216.0), f(1.0), 0),
            Ok(f(16777216.0))
        );
        assert_eq!(
            float_amo(amo::ADD, 8, d(16777216.0), d(1.0), 0),
            Ok(d(16777217.0))
        );
        // Only the low 4 bytes of a 4-byte operand count.
        assert_eq!(
            float_amo(amo::ADD, 4, f(1.0) | 0xdead_0000_0000_0000, f(1.0), 0),
            Ok(f(2.0))
        );
    }

    #[test]
    fn float_set_swap_fetch_move_bits() {
        assert_eq!(float_amo(amo::SET, 4, f(1.0), f(-7.5), 0), Ok(f(-7.5)));
        assert_eq!(float_amo(amo::SWAP, 8, d(1.0), d(3.0), 0), Ok(d(3.0)));
        assert_eq!(float_amo(amo::FETCH, 8, d(9.0), d(3.0), 0), Ok(d(9.0)));
        for op in [amo::SET, amo::SWAP, amo::FETCH, amo::SIGNAL_SET] {
            assert!(float_amo_is_bitwise(op));
        }
        for op in [amo::ADD, amo::FETCH_ADD, amo::COMPARE_SWAP, amo::INC] {
            assert!(!float_amo_is_bitwise(op));
        }
    }

    #[test]
    fn float_compare_swap_compares_values() {
        assert_eq!(
            float_amo(amo::COMPARE_SWAP, 4, f(2.0), f(5.0), f(2.0)),
            Ok(f(5.0))
        );
        assert_eq!(
            float_amo(amo::COMPARE_SWAP, 4, f(2.0), f(5.0), f(3.0)),
            Ok(f(2.0))
        );
        // -0.0 equals 0.0 as a value although the bits differ.
        assert_eq!(
            float_amo(amo::COMPARE_SWAP, 8, d(-0.0), d(1.0), d(0.0)),
            Ok(d(1.0))
        );
        // NaN never matches, not even itself.
        let nan = d(f64::NAN);
        assert_eq!(float_amo(amo::COMPARE_SWAP, 8, nan, d(1.0), nan), Ok(nan));
    }

    #[test]
    fn float_refuses_bitwise_ops_and_bad_sizes() {
        for op in [
            amo::AND,
            amo::OR,
            amo::XOR,
            amo::FETCH_AND,
            amo::FETCH_OR,
            amo::FETCH_XOR,
        ] {
            assert!(float_amo(op, 8, d(1.0), d(1.0), 0).is_err(), "op {op}");
        }
        assert!(float_amo(amo::ADD, 2, 0, 0, 0).is_err());
        assert!(float_amo(amo::ADD, 16, 0, 0, 0).is_err());
    }

    #[test]
    fn target_hook_strips_the_float_bit() {
        let int = |opc: i32, old: u64, val: u64, _cmp: u64| -> TResult<u64> {
            assert_eq!(opc, amo::ADD);
            Ok(old + val)
        };
        assert_eq!(apply_amo_any(amo::ADD, 8, 2, 3, 0, int).unwrap(), 5);
        let r = apply_amo_any(
            amo::ADD | amo::FLOAT_BIT,
            8,
            d(2.0),
            d(3.0),
            0,
            |_, _, _, _| panic!("integer path taken for a float op"),
        );
        assert_eq!(r.unwrap(), d(5.0));
        assert!(apply_amo_any(amo::XOR | amo::FLOAT_BIT, 8, 0, 0, 0, int).is_err());
    }
}
