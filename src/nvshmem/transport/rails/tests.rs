//! Unit tests of the rail variables, the handle's rail section and tcp names.
use super::*;

fn cfg(vars: &[(&str, &str)]) -> Result<RailConfig, String> {
    RailConfig::from_lookup(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
}

#[test]
fn variables_and_defaults() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.max, crate::topo::DEFAULT_MAX_NIC_PER_PE);
    assert_eq!(c.stripe, STRIPE_DEFAULT);
    assert_eq!(c.timeout, RAIL_TIMEOUT_DEFAULT);
    assert!(c.names.is_none());
    let c = cfg(&[
        ("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE", "3"),
        ("NVSHMEM_EFA_RAILS", "a, b,a"),
        ("NVSHMEM_EFA_RAIL_STRIPE_BYTES", "8192"),
        ("NVSHMEM_EFA_RAIL_TIMEOUT_MS", "250"),
    ])
    .unwrap();
    assert_eq!(c.max, 3);
    assert_eq!(c.names.unwrap(), ["a", "b", "a"]);
    assert_eq!(c.stripe, 8192);
    assert_eq!(c.timeout, Duration::from_millis(250));
    for bad in [
        ("NVSHMEM_EFA_RAILS", " , "),
        ("NVSHMEM_EFA_RAIL_STRIPE_BYTES", "100"),
        ("NVSHMEM_EFA_RAIL_TIMEOUT_MS", "0"),
        ("NVSHMEM_EFA_RAIL_TIMEOUT_MS", "soon"),
        ("NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE", "0"),
    ] {
        let e = cfg(&[bad]).unwrap_err();
        assert!(e.contains(bad.0), "{e}");
    }
}

#[test]
fn ip_of_tcp_names() {
    let mut v4 = [0u8; 16];
    v4[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    v4[2..4].copy_from_slice(&[0x1f, 0x90]);
    v4[4..8].copy_from_slice(&[203, 0, 113, 65]);
    assert_eq!(ip_of(&v4), Some(vec![203, 0, 113, 65]));
    let mut v6 = [0u8; 28];
    v6[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
    v6[23] = 1;
    assert_eq!(ip_of(&v6).map(|a| a[15]), Some(1));
    assert_eq!(ip_of(&v4[..12]), None, "not a sockaddr_in length");
    assert_eq!(ip_of(&[0u8; 32]), None, "not an IP name (EFA's GID + QPN)");
}

#[test]
fn handle_section_roundtrip() {
    let mut h = [0u8; 512];
    assert_eq!(section_key(&h, 0), None);
    let keys: Vec<u64> = (0..(MAX_RAILS as u64 - 1)).map(|k| k * 3 + 1).collect();
    write_section(&mut h, &keys);
    for (k, want) in keys.iter().enumerate() {
        assert_eq!(section_key(&h, k), Some(*want));
    }
    assert_eq!(section_key(&h, keys.len()), None);
    write_section(&mut h, &[7, u64::MAX]);
    assert_eq!(section_key(&h, 0), Some(7));
    assert_eq!(section_key(&h, 1), None, "no registration on that rail");
    assert_eq!(section_key(&h, 2), None);
}
