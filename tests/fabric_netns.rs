//! Two "hosts" on one machine: two Linux network namespaces joined by a veth pair, one process in
//! each, talking `tcp;ofi_rxm` over the veth (`FI_TCP_IFACE`), with the same scenario as the
//! multi-process test (RMA write and read verified byte for byte, write with data, send/receive,
//! atomics). The veth addresses are from TEST-NET-2 (198.51.100.0/24, documentation only) and exist
//! only inside the two namespaces, so no traffic leaves the machine.
//!
//! Needs CAP_SYS_ADMIN and CAP_NET_ADMIN; without them (`ip netns add` fails) the test prints
//! `SKIP: network namespaces not permitted: <reason>` and passes. The namespaces are removed on every
//! exit path, failures included.
#[path = "fabric_common.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{run_children, ChildEnv, ChildSpec, TempDir};

const SUBNET: [u8; 3] = [198, 51, 100];

/// Runs `ip <args>`; `Err` carries its stderr (or why it could not start).
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {} ({})",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))
    }
}

/// Owns the namespaces (and the veth, until it is moved into them); removes them on drop.
struct Netns {
    namespaces: Vec<String>,
    veth: Option<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(v) = &self.veth {
            let _ = ip(&["link", "del", v]);
        }
        for ns in &self.namespaces {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Reads a statistics counter of `dev` inside `ns`.
fn counter(ns: &str, dev: &str, which: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "cat",
            &format!("/sys/class/net/{dev}/statistics/{which}"),
        ])
        .output()
        .expect("ip netns exec cat");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{which} of {dev} in {ns}: {e}: {out:?}"))
}

#[test]
fn netns_two_hosts_over_veth() {
    let started = Instant::now();
    let pid = std::process::id();
    let ns = [format!("fabns{pid}a"), format!("fabns{pid}b")];
    let veth = [format!("fv{pid}a"), format!("fv{pid}b")];
    let mut guard = Netns {
        namespaces: Vec::new(),
        veth: None,
    };

    if let Err(e) = ip(&["netns", "add", &ns[0]]) {
        println!("SKIP: network namespaces not permitted: {e}");
        return;
    }
    guard.namespaces.push(ns[0].clone());
    ip(&["netns", "add", &ns[1]]).unwrap_or_else(|e| panic!("second namespace: {e}"));
    guard.namespaces.push(ns[1].clone());
    if let Err(e) = ip(&[
        "link", "add", &veth[0], "type", "veth", "peer", "name", &veth[1],
    ]) {
        println!("SKIP: veth pairs not available: {e}");
        return;
    }
    guard.veth = Some(veth[0].clone());
    for i in 0..2 {
        let addr = format!("{}.{}.{}.{}/24", SUBNET[0], SUBNET[1], SUBNET[2], i + 1);
        let steps: [&[&str]; 4] = [
            &["link", "set", &veth[i], "netns", &ns[i]],
            &["-n", &ns[i], "addr", "add", &addr, "dev", &veth[i]],
            &["-n", &ns[i], "link", "set", &veth[i], "up"],
            &["-n", &ns[i], "link", "set", "lo", "up"],
        ];
        for step in steps {
            ip(step).unwrap_or_else(|e| panic!("namespace setup: {e}"));
        }
    }
    // Both ends now live in the namespaces and go with them.
    guard.veth = None;

    let dir = TempDir::new("fabric-netns");
    let specs = (0..2)
        .map(|i| ChildSpec {
            rank: i,
            env: vec![
                ("FI_TCP_IFACE".to_string(), veth[i].clone()),
                (
                    "FABRIC_TEST_EXPECT_IPV4".to_string(),
                    format!("{}.{}.{}.{}", SUBNET[0], SUBNET[1], SUBNET[2], i + 1),
                ),
            ],
            prefix: vec!["ip".into(), "netns".into(), "exec".into(), ns[i].clone()],
        })
        .collect();
    let before: Vec<u64> = (0..2)
        .map(|i| counter(&ns[i], &veth[i], "tx_bytes"))
        .collect();
    run_children(
        "netns_child",
        dir.path(),
        2,
        "tcp",
        specs,
        Duration::from_secs(180),
    );

    // The data went over the veth pair: each side sent at least the 1 MiB write and 1 MiB read reply.
    for i in 0..2 {
        let tx = counter(&ns[i], &veth[i], "tx_bytes") - before[i];
        assert!(
            tx > 2 << 20,
            "{} sent only {tx} bytes over {}",
            ns[i],
            veth[i]
        );
        println!("{}: {tx} bytes sent over {}", ns[i], veth[i]);
    }
    drop(guard);
    for n in &ns {
        let list = ip(&["netns", "list"]).unwrap_or_default();
        assert!(
            !list.lines().any(|l| l.split_whitespace().next() == Some(n)),
            "namespace {n} left behind"
        );
    }
    println!("two namespaces over veth passed in {:?}", started.elapsed());
}

/// Child entry point: does nothing unless started by the test above with a rank in the environment.
#[test]
fn netns_child() {
    let Some(env) = ChildEnv::from_env() else {
        return;
    };
    let want: std::net::Ipv4Addr = std::env::var("FABRIC_TEST_EXPECT_IPV4")
        .expect("FABRIC_TEST_EXPECT_IPV4")
        .parse()
        .expect("IPv4 address");
    common::run_scenario(&env, "tcp;ofi_rxm", |name| {
        // tcp names are a sockaddr: family (host order), port and address (network order).
        assert!(name.len() >= 8, "short tcp name {name:?}");
        let family = u16::from_ne_bytes([name[0], name[1]]);
        assert_eq!(
            family,
            libc::AF_INET as u16,
            "endpoint is not IPv4: {name:?}"
        );
        let got = std::net::Ipv4Addr::new(name[4], name[5], name[6], name[7]);
        assert_eq!(
            got, want,
            "endpoint bound to {got}, not to the veth address {want}"
        );
        println!(
            "rank {} endpoint on {got}:{}",
            env.rank,
            u16::from_be_bytes([name[2], name[3]])
        );
    });
}
