//! The rail variables, the memory handle's rail section and tcp endpoint names' addresses.
use std::time::Duration;

use super::{RAIL_MAGIC, RAIL_SECTION, RAIL_TIMEOUT_DEFAULT, STRIPE_ALIGN, STRIPE_DEFAULT};

/// The rail variables.
#[derive(Clone, Debug)]
pub struct RailConfig {
    /// `NVSHMEM_LIBFABRIC_MAX_NIC_PER_PE` (NVSHMEM's variable and default, 16).
    pub max: usize,
    /// `NVSHMEM_EFA_RAILS`: domains (NICs, tcp interfaces) to use, in order; repeats allowed.
    pub names: Option<Vec<String>>,
    /// `NVSHMEM_EFA_RAIL_STRIPE_BYTES`: operations of at least this size are striped.
    pub stripe: u64,
    /// `NVSHMEM_EFA_RAIL_TIMEOUT_MS`: an operation without completion this long fails its rail.
    pub timeout: Duration,
}

impl RailConfig {
    /// Reads the variables through `get`; a bad value is an error naming it.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<RailConfig, String> {
        let policy = crate::topo::NicPolicy::from_lookup(&get).map_err(|e| e.0)?;
        let mut c = RailConfig {
            max: policy.max_nic_per_pe,
            names: None,
            stripe: STRIPE_DEFAULT,
            timeout: RAIL_TIMEOUT_DEFAULT,
        };
        if let Some(v) = get("NVSHMEM_EFA_RAILS") {
            let names: Vec<String> = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if names.is_empty() {
                return Err(format!(
                    "NVSHMEM_EFA_RAILS={v:?}: expected a comma-separated list of domain (NIC or interface) names"
                ));
            }
            c.names = Some(names);
        }
        let num = |k: &str, lo: u64, hi: u64| -> Result<Option<u64>, String> {
            match get(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(format!(
                        "{k}={v:?}: expected a whole number from {lo} to {hi}"
                    )),
                },
            }
        };
        if let Some(n) = num("NVSHMEM_EFA_RAIL_STRIPE_BYTES", STRIPE_ALIGN, 1 << 40)? {
            c.stripe = n;
        }
        if let Some(n) = num("NVSHMEM_EFA_RAIL_TIMEOUT_MS", 1, 86_400_000)? {
            c.timeout = Duration::from_millis(n);
        }
        Ok(c)
    }
}

/// Writes the keys of the extra rails (`u64::MAX`: none on that rail) into the handle's section.
pub(super) fn write_section(handle: &mut [u8], keys: &[u64]) {
    let sec = &mut handle[RAIL_SECTION..];
    sec[0..4].copy_from_slice(&RAIL_MAGIC.to_le_bytes());
    sec[4..8].copy_from_slice(&(keys.len() as u32).to_le_bytes());
    for (i, k) in keys.iter().enumerate() {
        sec[8 + i * 8..16 + i * 8].copy_from_slice(&k.to_le_bytes());
    }
}

/// The key of extra rail `k` (0-based) in a peer's handle; `None` when it has none there.
pub(super) fn section_key(handle: &[u8], k: usize) -> Option<u64> {
    let sec = handle.get(RAIL_SECTION..)?;
    let magic = u32::from_le_bytes(sec[0..4].try_into().ok()?);
    let count = u32::from_le_bytes(sec[4..8].try_into().ok()?) as usize;
    if magic != RAIL_MAGIC || k >= count || 16 + k * 8 > sec.len() {
        return None;
    }
    let key = u64::from_le_bytes(sec[8 + k * 8..16 + k * 8].try_into().ok()?);
    (key != u64::MAX).then_some(key)
}

/// The IP address in an endpoint name that is a `sockaddr_in` / `sockaddr_in6` (tcp's names);
/// `None` for other names.
pub(super) fn ip_of(name: &[u8]) -> Option<Vec<u8>> {
    let family = u16::from_ne_bytes(name.get(0..2)?.try_into().ok()?);
    match (family as i32, name.len()) {
        (libc::AF_INET, 16) => Some(name[4..8].to_vec()),
        (libc::AF_INET6, 28) => Some(name[8..24].to_vec()),
        _ => None,
    }
}
