//! Several processes on one machine talking through the fabric layer over `tcp;ofi_rxm` and `shm`:
//! RMA write (1 B .. 1 MiB) and read verified byte for byte, write with remote CQ data seen exactly
//! once, send/receive, and atomics from three processes at once into one word (sum exact, fetch-add
//! results distinct, compare-swap success and failure). `tcp;ofi_rxm` runs everything in one set of
//! processes; `shm` runs the atomics in a set of their own, so that each failure points at one area.
//!
//! The parent test re-executes this binary once per rank, running only `multiproc_child` with the
//! rank in the environment; the ranks exchange endpoint names, addresses and keys through files in a
//! scratch directory.
#[path = "fabric_common.rs"]
mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{run_children, ChildEnv, ChildSpec, TempDir};

const RANKS: usize = 4;

/// One set of busy-polling children at a time, so that the sets do not starve each other.
static SERIAL: Mutex<()> = Mutex::new(());

fn run(provider: &str, expect: &str, extra_env: &[(&str, &str)]) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let dir = TempDir::new(&format!("fabric-mp-{provider}"));
    let specs = (0..RANKS)
        .map(|rank| ChildSpec {
            rank,
            env: extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .chain([("FABRIC_TEST_EXPECT".to_string(), expect.to_string())])
                .collect(),
            prefix: Vec::new(),
        })
        .collect();
    run_children(
        "multiproc_child",
        dir.path(),
        RANKS,
        provider,
        specs,
        Duration::from_secs(180),
    );
    println!(
        "{provider}: {RANKS} processes passed in {:?}",
        started.elapsed()
    );
}

/// Child entry point: does nothing unless started by `run` with a rank in the environment.
#[test]
fn multiproc_child() {
    let Some(env) = ChildEnv::from_env() else {
        return;
    };
    let expect = std::env::var("FABRIC_TEST_EXPECT").expect("FABRIC_TEST_EXPECT");
    common::run_scenario(&env, &expect, |_| {});
}

#[test]
fn multiproc_tcp_rxm() {
    // Keep the traffic on the loopback interface.
    run("tcp", "tcp;ofi_rxm", &[("FI_TCP_IFACE", "lo")]);
}

#[test]
fn multiproc_shm() {
    run(
        "shm",
        "shm",
        &[(common::ENV_PHASES, "write,read,writedata,sendrecv")],
    );
}

/// Fails with libfabric 2.1.0 as long as the fabric layer issues non-fetching atomics with
/// FI_DELIVERY_COMPLETE on shm: shm then releases the operation's inject buffer twice (once at the
/// target in `smr_progress_inject_atomic`, again at the initiator in `smr_progress_resp_entry`), two
/// later operations share one buffer, and sums and fetched values come out wrong. The same atomics
/// posted without FI_DELIVERY_COMPLETE (or as fetching atomics) come out exact.
#[test]
fn multiproc_shm_atomics() {
    run("shm", "shm", &[(common::ENV_PHASES, "atomics")]);
}
