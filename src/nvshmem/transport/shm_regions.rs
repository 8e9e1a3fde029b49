//! Removal of the shm regions a dead peer left behind.
//!
//! libfabric's shm provider keeps each endpoint's queues in a POSIX shared-memory object named
//! after the endpoint (`/dev/shm/<name>`; libfabric 2.1.0, `prov/shm/src/smr_util.c`,
//! `smr_create`). It unlinks the object when the endpoint closes (`smr_free`) and, from a handler
//! it installs for SIGINT, SIGTERM and the like, when the process is signalled
//! (`smr_signal.h`); a process that is killed (SIGKILL) or crashes in a way no handler sees leaves
//! its regions, 4 to 16 MiB each, until the machine reboots.
//!
//! This transport names its shm endpoints `<pid>:<cookie>:<n>` and its transmit lanes
//! `<pid>:<cookie>:<n>:<pe>:<kind>:<gen>` (endpoints.rs, lanes.rs), with a random 64-bit cookie
//! per process, so every region of a process starts with `<pid>:<cookie>:` and no other process's
//! does. When a peer on this host is found dead (its process has exited: `peers.rs`), a survivor
//! removes the regions under that prefix: at the moment the peer is declared gone, and at finalize
//! for peers found dead then. Removing the name does not disturb the mappings survivors still hold
//! (the memory goes away with the last mapping). A peer that finalized removed its own.
use std::path::Path;

/// Where POSIX shared-memory objects live on Linux.
pub(super) const SHM_DIR: &str = "/dev/shm";

/// The `<pid>:<cookie>:` prefix of the regions of the process that owns the shm endpoint name
/// `name` (as exchanged at connect: `fi_shm://<pid>:<cookie>:<n>`, NUL-padded), or `None` when
/// the name is not one of this transport's (a name without a 16-digit hex cookie after the PID).
pub(super) fn region_prefix(name: &[u8]) -> Option<String> {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let s = std::str::from_utf8(&name[..end]).ok()?;
    let s = s.strip_prefix("fi_shm://").unwrap_or(s);
    let mut parts = s.split(':');
    let pid = parts.next()?;
    let cookie = parts.next()?;
    parts.next()?; // the endpoint index
    let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    let cookie_ok = cookie.len() == 16 && cookie.bytes().all(|b| b.is_ascii_hexdigit());
    (pid_ok && cookie_ok).then(|| format!("{pid}:{cookie}:"))
}

/// Removes every entry of `dir` whose name starts with `prefix`; returns how many were removed.
/// Failures (an entry another survivor removed first, a directory that does not exist) are not
/// errors: the regions are gone either way, or there is nothing this process may do about them.
pub(super) fn remove_regions(dir: &Path, prefix: &str) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for ent in rd.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(prefix) && std::fs::remove_file(ent.path()).is_ok() {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_come_from_this_transports_names_only() {
        let mut slot = b"fi_shm://4242:00000000deadbeef:1".to_vec();
        slot.resize(64, 0);
        assert_eq!(
            region_prefix(&slot).as_deref(),
            Some("4242:00000000deadbeef:")
        );
        assert_eq!(
            region_prefix(b"4242:0123456789abcdef:0:3:1:0").as_deref(),
            Some("4242:0123456789abcdef:")
        );
        // libfabric's default names (`fi_shm://<pid>`, `<pid>:<uid>:<n>`) and garbage: none.
        assert_eq!(region_prefix(b"fi_shm://4242\0"), None);
        assert_eq!(region_prefix(b"fi_shm://4242:0:1\0"), None);
        assert_eq!(region_prefix(b"fi_shm://x:0123456789abcdef:1"), None);
        assert_eq!(region_prefix(b""), None);
        assert_eq!(region_prefix(&[0xff, 0xfe, 0]), None);
    }

    #[test]
    fn only_the_dead_processes_regions_are_removed() {
        let dir = std::env::temp_dir().join(format!("shm-regions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dead = "4242:00000000deadbeef:";
        let files = [
            "4242:00000000deadbeef:0",
            "4242:00000000deadbeef:1",
            "4242:00000000deadbeef:0:1:0:0",
            "4242:00000000deadbeee:0", // same PID, another cookie (another process)
            "42421:00000000deadbeef:0", // another PID
            "4242",                    // libfabric's default name for PID 4242
        ];
        for f in files {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        assert_eq!(remove_regions(&dir, dead), 3);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "4242",
                "42421:00000000deadbeef:0",
                "4242:00000000deadbeee:0"
            ]
        );
        assert_eq!(remove_regions(&dir, dead), 0);
        assert_eq!(remove_regions(&dir.join("missing"), dead), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
