//! Bad input to the fabric layer: unknown and absent providers, RMA with a wrong key or beyond the
//! registered length, empty registrations, garbage addresses. Each must give an error (at the call or
//! as an error completion) in bounded time: never a crash, a hang or a silent success.
//!
//! The RMA cases run two endpoints in this one process (one fabric each, as two processes would),
//! over `tcp;ofi_rxm` (both on this host's first interface, so the traffic stays on the machine) and
//! over `shm`.
#[path = "fabric_common.rs"]
mod common;

use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

use common::{Completion, Node, TempDir};
use nvshmem_efa_gda::fabric::{
    list_providers, sys, Endpoint, Error, Info, InfoRequest, MemKind, MemoryRegion, Provider,
};

/// How long an erroneous operation may take to report itself.
const REPORT: Duration = Duration::from_secs(20);

#[test]
fn unknown_provider_name_lists_the_valid_ones() {
    for bad in ["bogus", "", "tcp;ofi_rxm;extra", "efa direct", "sockets"] {
        let e = Provider::parse(bad).expect_err(bad);
        let msg = e.to_string();
        for valid in ["efa", "efa-direct", "verbs", "cxi", "tcp", "shm"] {
            assert!(
                msg.contains(valid),
                "error for '{bad}' does not name '{valid}': {msg}"
            );
        }
        assert!(
            msg.contains(&format!("'{}'", bad.trim())),
            "error does not quote the bad name: {msg}"
        );
        assert!(e.code < 0);
    }
    // The accepted spellings still parse (so the check above is about the bad ones only).
    for (name, p) in [
        ("tcp;ofi_rxm", Provider::Tcp),
        ("SHM", Provider::Shm),
        (" efa-direct ", Provider::EfaDirect),
    ] {
        assert_eq!(Provider::parse(name).unwrap(), p);
    }
}

/// fi_strerror text of a (negative) code, straight from libfabric.
fn fi_strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(sys::fi_strerror(-code)) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn absent_provider_gives_an_error_with_fi_strerror_text() {
    let present: Vec<String> = list_providers().into_iter().map(|(p, _)| p).collect();
    let absent: Vec<Provider> = [
        Provider::Cxi,
        Provider::Efa,
        Provider::EfaDirect,
        Provider::Verbs,
    ]
    .into_iter()
    .filter(|p| {
        !present
            .iter()
            .any(|q| q.split(';').next() == Some(p.prov_name().split(';').next().unwrap()))
    })
    .collect();
    assert!(
        !absent.is_empty(),
        "every hardware provider is present ({present:?}): nothing to test"
    );
    for p in absent {
        for atomics in [false, true] {
            let req = InfoRequest {
                provider: p.clone(),
                hmem: false,
                atomics,
                msg: false,
            };
            let e: Error = Info::get(&req).expect_err("provider is absent");
            let text = fi_strerror(e.code);
            assert!(e.code < 0, "{p}: code {}", e.code);
            assert_eq!(e.text(), text);
            assert!(
                !text.is_empty() && !text.starts_with("error "),
                "{p}: {text}"
            );
            let shown = e.to_string();
            assert!(shown.contains(&text), "{p}: '{shown}' lacks '{text}'");
            assert!(
                shown.contains("fi_getinfo") && shown.contains(p.name()),
                "{p}: no context in '{shown}'"
            );
        }
    }
}

#[test]
fn empty_or_null_registration_is_refused() {
    for p in [Provider::Tcp, Provider::Shm] {
        let dir = TempDir::new("fabric-err-mr");
        let node = open(&p, 0, dir.path());
        let buf = [0u8; 64];
        let cases: [(*const u8, usize); 3] = [
            (buf.as_ptr(), 0),
            (std::ptr::null(), 64),
            (std::ptr::null(), 0),
        ];
        for (ptr, len) in cases {
            // SAFETY: the registration is refused (asserted); were it not, `buf` outlives it.
            let r = unsafe {
                MemoryRegion::register(&node.domain, ptr, len, MemKind::Host, true, Some(&node.ep))
            };
            let e = r
                .err()
                .unwrap_or_else(|| panic!("{p}: registering {ptr:p}+{len} succeeded"));
            assert!(
                e.code < 0 && e.to_string().contains("empty region"),
                "{p}: {e}"
            );
        }
    }
}

fn open(p: &Provider, rank: usize, dir: &std::path::Path) -> Node {
    Node::open(p, rank, 2, dir, 1 << 20)
}

/// Two endpoints in this process that know each other: `a` initiates, `b` is the target.
fn pair(p: &Provider, dir: &std::path::Path) -> (Node, Node) {
    let mut a = open(p, 0, dir);
    let mut b = open(p, 1, dir);
    a.publish();
    b.publish();
    a.collect();
    b.collect();
    (a, b)
}

/// What became of an operation that ought to fail.
enum Outcome {
    /// The call itself returned an error.
    Refused(Error),
    /// An error completion arrived (at the initiator, or failing that at the target).
    Failed(String),
}

impl Outcome {
    fn text(&self) -> String {
        match self {
            Outcome::Refused(e) => format!("refused at the call: {e}"),
            Outcome::Failed(s) => format!("error completion: {s}"),
        }
    }
}

/// Posts `op` on `a`, retrying -FI_EAGAIN while driving both nodes, for at most `REPORT`.
fn post_both(
    a: &mut Node,
    b: &mut Node,
    op: impl FnMut(&Endpoint, *mut c_void) -> nvshmem_efa_gda::fabric::Result<()>,
) -> Result<*mut c_void, Error> {
    post_both_for(a, b, REPORT, op)
}

/// As `post_both`, retrying for at most `patience`.
fn post_both_for(
    a: &mut Node,
    b: &mut Node,
    patience: Duration,
    mut op: impl FnMut(&Endpoint, *mut c_void) -> nvshmem_efa_gda::fabric::Result<()>,
) -> Result<*mut c_void, Error> {
    let deadline = Instant::now() + patience;
    loop {
        let ctx = a.ctxs.alloc(0, 0).expect("free context");
        match op(&a.ep, ctx) {
            Ok(()) => return Ok(ctx),
            Err(e) => {
                a.ctxs.free(ctx);
                if !e.is_again() || Instant::now() >= deadline {
                    return Err(e);
                }
                a.progress();
                b.progress();
                std::thread::yield_now();
            }
        }
    }
}

/// Drives both nodes until the operation of `ctx` completes at `a`, or `REPORT` passes.
fn complete_both(a: &mut Node, b: &mut Node, ctx: *mut c_void) -> Option<Completion> {
    let deadline = Instant::now() + REPORT;
    loop {
        a.progress();
        b.progress();
        if let Some(c) = a.take_done(ctx) {
            return Some(c);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Posts `op` on `a` and drives both nodes until it completes; panics if it completes
/// successfully, or if nothing is reported within `REPORT` (an endless -FI_EAGAIN included).
fn expect_failure(
    what: &str,
    a: &mut Node,
    b: &mut Node,
    op: impl FnMut(&Endpoint, *mut c_void) -> nvshmem_efa_gda::fabric::Result<()>,
) -> Outcome {
    let ctx = match post_both(a, b, op) {
        Ok(ctx) => ctx,
        Err(e) if e.is_again() => {
            panic!("{what}: still -FI_EAGAIN after {REPORT:?}: the failure is never reported")
        }
        Err(e) => return Outcome::Refused(e),
    };
    match complete_both(a, b, ctx) {
        Some(Ok(e)) => panic!(
            "{what}: completed successfully (flags {:#x}, len {})",
            e.flags, e.len
        ),
        Some(Err(e)) => Outcome::Failed(e.error.to_string()),
        None => panic!(
            "{what}: no completion at the initiator after {REPORT:?} (target saw: {:?})",
            b.stray
        ),
    }
}

/// Writes 64 bytes from `a` to offset 128 of `b`, checks that they land, and restores `b`'s 0xAB.
fn good_write(p: &Provider, a: &mut Node, b: &mut Node) {
    a.fill(0, 64, |i| i as u8);
    let desc = a.desc();
    let peer = a.peers[1].clone();
    let src = a.at(0, 64);
    let good = a.raddr(1, 128);
    let saved = b.read_bytes(128, 64);
    let ctx = post_both(a, b, |ep, ctx| {
        // SAFETY: source in a's registered heap; the context is reaped below.
        unsafe { ep.write(src, 64, desc, peer.fi_addr, good, peer.key, ctx) }
    })
    .unwrap_or_else(|e| panic!("{p}: good write: {e}"));
    match complete_both(a, b, ctx) {
        Some(Ok(_)) => {}
        Some(Err(e)) => panic!("{p}: good write failed: {}", e.error),
        None => panic!("{p}: good write did not complete"),
    }
    let wanted: Vec<u8> = (0..64u8).collect();
    let t = Instant::now();
    while b.read_bytes(128, 64) != wanted {
        b.progress();
        assert!(t.elapsed() < REPORT, "{p}: good write did not land");
    }
    b.fill(128, 64, |i| saved[i]);
}

fn check_untouched(b: &Node, what: &str) {
    let got = b.read_bytes(0, b.heap_len());
    if let Some(i) = got.iter().position(|&x| x != 0xAB) {
        panic!("{what}: the target's memory changed at byte {i}");
    }
}

/// One bad RMA case on a fresh pair of endpoints (a provider may drop the connection after an
/// error, so the cases must not share one).
fn bad_rma_case(
    p: &Provider,
    what: &str,
    write: bool,
    raddr: impl Fn(&Node) -> u64,
    wrong_key: bool,
) {
    let what = format!("{p}: {what}");
    let dir = TempDir::new("fabric-err-rma");
    let (mut a, mut b) = pair(p, dir.path());
    b.fill(0, b.heap_len(), |_| 0xAB);
    a.fill(0, 4096, |i| i as u8);
    a.fill(4096, 64, |_| 0x11);
    let desc = a.desc();
    let peer = a.peers[1].clone();
    let src = a.at(0, 64);
    let dst = a.at(4096, 64);

    // A good write first, so that the failure below is about the bad input, not the connection.
    good_write(p, &mut a, &mut b);

    let raddr = raddr(&a);
    let key = if wrong_key {
        peer.key ^ 0x5a5a_1234
    } else {
        peer.key
    };
    let outcome = expect_failure(&what, &mut a, &mut b, |ep, ctx| {
        // SAFETY: local buffers in a's registered heap; the context is reaped by expect_failure
        // (or the endpoint is closed first).
        unsafe {
            if write {
                ep.write(src, 64, desc, peer.fi_addr, raddr, key, ctx)
            } else {
                ep.read(dst, 64, desc, peer.fi_addr, raddr, key, ctx)
            }
        }
    });
    println!("{what}: {}", outcome.text());
    check_untouched(&b, &what);
    if !write {
        assert!(
            a.read_bytes(4096, 64).iter().all(|&x| x == 0x11),
            "{what}: the failed read changed the destination"
        );
    }
}

fn bad_rma(p: Provider) {
    let end = |a: &Node| a.raddr(1, a.peers[1].len as usize - 8);
    bad_rma_case(&p, "write with a wrong key", true, |a| a.raddr(1, 0), true);
    bad_rma_case(&p, "read with a wrong key", false, |a| a.raddr(1, 0), true);
    bad_rma_case(
        &p,
        "write running past the end of the region",
        true,
        end,
        false,
    );
    bad_rma_case(
        &p,
        "read running past the end of the region",
        false,
        end,
        false,
    );
    bad_rma_case(
        &p,
        "write far beyond the region",
        true,
        |a| a.raddr(1, a.peers[1].len as usize + (1 << 30)),
        false,
    );
    bad_rma_case(
        &p,
        "read before the region",
        false,
        |a| a.raddr(1, 0).wrapping_sub(4096),
        false,
    );
}

#[test]
fn rma_with_bad_key_or_range_fails_tcp() {
    bad_rma(Provider::Tcp);
}

/// libfabric 2.1.0's shm drops an RMA command whose key or range the target rejects without
/// answering it (`smr_progress_cmd_rma` returns before any response; `smr_progress_cmd` logs
/// "error processing command" and releases it), so the initiator's operation never completes.
/// Run with `--ignored` against a newer libfabric.
#[test]
#[ignore = "libfabric 2.1.0 shm never completes an RMA the target rejects"]
fn rma_with_bad_key_or_range_fails_shm() {
    bad_rma(Provider::Shm);
}

fn garbage_av(p: Provider) {
    let dir = TempDir::new("fabric-err-av");
    let (mut a, mut b) = pair(&p, dir.path());
    let name = a.ep.name().expect("name");
    println!(
        "{p}: endpoint names look like {:?}",
        String::from_utf8_lossy(&name)
    );
    // Deterministic junk of a plausible length, and of implausible lengths.
    let mut junk: Vec<u8> = (0..name.len())
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(0x9d))
        .collect();
    if p == Provider::Tcp {
        // Keep the address family invalid so that nothing tries to reach a real host.
        junk[0] = 0xff;
        junk[1] = 0xff;
    }
    for bytes in [junk.clone(), vec![0xa5; 3], vec![0u8; name.len()]] {
        let what = format!("{p}: AV insert of {} garbage bytes", bytes.len());
        match a.av.insert(&bytes, 1) {
            Err(e) => {
                assert!(e.code < 0, "{what}: {e}");
                println!("{what}: refused: {e}");
            }
            Ok(addrs) => {
                // Accepted: using it must then fail and say so. An unknown shm peer answers
                // -FI_EAGAIN (it might not have started yet) for as long as it is absent: that is
                // reported at every call, so the caller can give up; a success is never allowed.
                let src = a.at(0, 64);
                let desc = a.desc();
                let posted = post_both_for(&mut a, &mut b, Duration::from_secs(3), |ep, ctx| {
                    // SAFETY: source in a's registered heap; the context is reaped below (or the
                    // endpoint is closed first).
                    unsafe { ep.write(src, 64, desc, addrs[0], 0, 0, ctx) }
                });
                let outcome = match posted {
                    Err(e) => Outcome::Refused(e),
                    Ok(ctx) => match complete_both(&mut a, &mut b, ctx) {
                        Some(Ok(e)) => panic!(
                            "{what}: a write to it completed successfully (flags {:#x})",
                            e.flags
                        ),
                        Some(Err(e)) => Outcome::Failed(e.error.to_string()),
                        None => panic!(
                            "{what}: a write to it never completed, and no error was reported"
                        ),
                    },
                };
                println!("{what}: accepted as {addrs:?}, then {}", outcome.text());
            }
        }
    }
    // The endpoint still works with a real peer afterwards.
    good_write(&p, &mut a, &mut b);
}

#[test]
fn garbage_address_is_refused_or_fails_later_tcp() {
    garbage_av(Provider::Tcp);
}

#[test]
fn garbage_address_is_refused_or_fails_later_shm() {
    garbage_av(Provider::Shm);
}
