//! What peers learn about each other's memory: the host identity (exchanged at connect) and, per
//! registration, the IPC descriptor carried inside NVSHMEM's 512-byte memory handle.
//!
//! Memory handle layout (512 bytes, written by the transport at registration):
//!
//! | bytes | what |
//! |---|---|
//! | 0..72 | the transport's `HandleBlob` (magic, version, flags, base, len, keys, reg id, cookie, pe) |
//! | 72..128 | zero (room for the blob to grow) |
//! | 128..256 | [`IpcDesc`] when the region is exportable GPU memory; zero otherwise |
//! | 256..512 | zero |
//!
//! Descriptor layout (128 bytes):
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `EFAIPC\0\x01` |
//! | 8..12 | version (2) |
//! | 12..16 | kind: 1 legacy CUDA IPC, 2 CUDA VMM through the exporter's fd server |
//! | 16..64 | host id, pid, device ordinal, allocation base/length, region base/length |
//! | 64..128 | legacy: the 64-byte `CUipcMemHandle`. VMM: magic `EFAVMMFD`, the fd server's cookie, the export id, the piece count (u32), zeros |
//!
//! All integers little-endian. A descriptor is only trusted after [`IpcDesc::decode`] checked its
//! magic, version, kind and internal consistency; a zero section means "no IPC" (not an error). A
//! descriptor of one kind never decodes as the other: a VMM payload must carry its own magic and
//! zero tail, and a legacy handle that begins with that magic is refused.
use super::fdshare::MAX_PIECES;
use super::{MResult, MoverError};
use crate::cuda::ipc::HANDLE_BYTES;

/// Offset of the IPC descriptor inside the 512-byte memory handle.
pub const IPC_DESC_OFFSET: usize = 128;
/// Size of the encoded descriptor.
pub const IPC_DESC_BYTES: usize = 128;
const IPC_MAGIC: u64 = u64::from_le_bytes(*b"EFAIPC\0\x01");
const IPC_VERSION: u32 = 2;
const KIND_LEGACY: u32 = 1;
const KIND_VMM: u32 = 2;
const VMM_MAGIC: u64 = u64::from_le_bytes(*b"EFAVMMFD");

/// The identity of a host: same value means the same kernel boot (`/proc/sys/kernel/random/boot_id`)
/// and the same host name. 0 means unknown and never matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostId(pub u64);

impl HostId {
    /// Unknown host (matches nothing, itself included).
    pub const UNKNOWN: HostId = HostId(0);

    /// This host's identity (computed once).
    pub fn local() -> HostId {
        static ID: std::sync::OnceLock<HostId> = std::sync::OnceLock::new();
        *ID.get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
            let name = hostname();
            let id = HostId::from_parts(boot.as_deref(), name.as_deref());
            tracing::debug!(
                "host id {:#018x} (boot_id {boot:?}, host name {name:?})",
                id.0
            );
            id
        })
    }

    /// The identity of boot id `boot` and host name `name`; unknown without a boot id.
    pub fn from_parts(boot: Option<&str>, name: Option<&str>) -> HostId {
        let Some(boot) = boot.map(str::trim).filter(|b| !b.is_empty()) else {
            return HostId::UNKNOWN;
        };
        let mut h = Fnv::new();
        h.write(boot.as_bytes());
        h.write(&[0]);
        h.write(name.unwrap_or("").trim().as_bytes());
        // 0 is reserved for "unknown".
        HostId(h.0.max(1))
    }

    /// Whether two PEs share a host (both known and equal).
    pub fn same_as(self, other: HostId) -> bool {
        self.0 != 0 && self.0 == other.0
    }

    /// The 8 bytes exchanged at connect.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }

    /// Reads 8 exchanged bytes.
    pub fn from_bytes(b: [u8; 8]) -> HostId {
        HostId(u64::from_le_bytes(b))
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the local buffer.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// FNV-1a, 64 bit (stable across builds and processes, unlike std's hasher).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// How the allocation is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Export {
    /// Legacy CUDA IPC (`cuIpcGetMemHandle`) of the allocation.
    Legacy {
        /// The IPC handle.
        handle: [u8; HANDLE_BYTES],
    },
    /// CUDA VMM: the allocations' POSIX descriptors, handed out by the exporter's fd server
    /// ([`super::fdshare`], socket named by the exporter's pid and `cookie`).
    Vmm {
        /// The fd server's cookie (part of its socket name; checked in every request).
        cookie: u64,
        /// The export's id at that server.
        export_id: u64,
        /// How many pieces (physical allocations) the export has.
        pieces: u32,
    },
}

/// A registered GPU region as its owner exported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcDesc {
    /// The exporter's host.
    pub host: HostId,
    /// The exporter's process id (a process cannot open its own handle).
    pub pid: u32,
    /// The exporter's device ordinal (informational).
    pub ordinal: i32,
    /// The exported allocation's base in the exporter's address space.
    pub alloc_base: u64,
    /// The allocation's length.
    pub alloc_len: u64,
    /// The registered region's base (exporter's address space), inside the allocation.
    pub region_base: u64,
    /// The region's length.
    pub region_len: u64,
    /// How to open it.
    pub export: Export,
}

impl IpcDesc {
    /// Checks the descriptor's own consistency: a non-empty region inside a non-empty allocation;
    /// for VMM a cookie, an export id and 1 to [`MAX_PIECES`] pieces.
    pub fn validate(&self) -> MResult<()> {
        if let Export::Vmm {
            cookie,
            export_id,
            pieces,
        } = self.export
        {
            if cookie == 0 || export_id == 0 || pieces == 0 || pieces as usize > MAX_PIECES {
                return Err(MoverError::Invalid(format!(
                    "IPC descriptor: VMM export {export_id} of {pieces} piece(s), cookie {cookie:#x}"
                )));
            }
        }
        let alloc_end = self.alloc_base.checked_add(self.alloc_len);
        let region_end = self.region_base.checked_add(self.region_len);
        match (alloc_end, region_end) {
            (Some(ae), Some(re))
                if self.alloc_len > 0
                    && self.region_len > 0
                    && self.region_base >= self.alloc_base
                    && re <= ae =>
            {
                Ok(())
            }
            _ => Err(MoverError::Invalid(format!(
                "IPC descriptor: region {:#x}+{} is not inside allocation {:#x}+{}",
                self.region_base, self.region_len, self.alloc_base, self.alloc_len
            ))),
        }
    }

    /// The 128 bytes that go at [`IPC_DESC_OFFSET`] of the memory handle.
    pub fn encode(&self) -> [u8; IPC_DESC_BYTES] {
        let mut b = [0u8; IPC_DESC_BYTES];
        b[0..8].copy_from_slice(&IPC_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&IPC_VERSION.to_le_bytes());
        let kind = match self.export {
            Export::Legacy { .. } => KIND_LEGACY,
            Export::Vmm { .. } => KIND_VMM,
        };
        b[12..16].copy_from_slice(&kind.to_le_bytes());
        b[16..24].copy_from_slice(&self.host.0.to_le_bytes());
        b[24..28].copy_from_slice(&self.pid.to_le_bytes());
        b[28..32].copy_from_slice(&self.ordinal.to_le_bytes());
        b[32..40].copy_from_slice(&self.alloc_base.to_le_bytes());
        b[40..48].copy_from_slice(&self.alloc_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.region_base.to_le_bytes());
        b[56..64].copy_from_slice(&self.region_len.to_le_bytes());
        match self.export {
            Export::Legacy { handle } => b[64..128].copy_from_slice(&handle),
            Export::Vmm {
                cookie,
                export_id,
                pieces,
            } => {
                b[64..72].copy_from_slice(&VMM_MAGIC.to_le_bytes());
                b[72..80].copy_from_slice(&cookie.to_le_bytes());
                b[80..88].copy_from_slice(&export_id.to_le_bytes());
                b[88..92].copy_from_slice(&pieces.to_le_bytes());
            }
        }
        b
    }

    /// Reads a descriptor: `Ok(None)` for an all-zero section (the region has no IPC export),
    /// an error for anything else that is not a valid descriptor.
    pub fn decode(b: &[u8]) -> MResult<Option<IpcDesc>> {
        if b.len() < IPC_DESC_BYTES {
            return Err(MoverError::Invalid(format!(
                "IPC descriptor: {} bytes (need {IPC_DESC_BYTES})",
                b.len()
            )));
        }
        let b = &b[..IPC_DESC_BYTES];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        if u64_at(0) != IPC_MAGIC {
            return Err(MoverError::Invalid(
                "IPC descriptor: bad magic (handle of another library or version?)".into(),
            ));
        }
        if u32_at(8) != IPC_VERSION {
            return Err(MoverError::Invalid(format!(
                "IPC descriptor: version {} (this library writes version {IPC_VERSION})",
                u32_at(8)
            )));
        }
        let export = match u32_at(12) {
            KIND_LEGACY if u64_at(64) != VMM_MAGIC => Export::Legacy {
                handle: b[64..128].try_into().expect("64 bytes"),
            },
            KIND_VMM if u64_at(64) == VMM_MAGIC && b[92..128].iter().all(|&x| x == 0) => {
                Export::Vmm {
                    cookie: u64_at(72),
                    export_id: u64_at(80),
                    pieces: u32_at(88),
                }
            }
            k => {
                return Err(MoverError::Invalid(format!(
                    "IPC descriptor: kind {k} with a payload that does not match it"
                )))
            }
        };
        let d = IpcDesc {
            host: HostId(u64_at(16)),
            pid: u32_at(24),
            ordinal: u32_at(28) as i32,
            alloc_base: u64_at(32),
            alloc_len: u64_at(40),
            region_base: u64_at(48),
            region_len: u64_at(56),
            export,
        };
        d.validate()?;
        Ok(Some(d))
    }

    /// Whether `[addr, addr + len)` (exporter's addresses) lies inside the registered region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.region_base
            && len <= self.region_len
            && addr - self.region_base <= self.region_len - len
    }

    /// Translates the exporter's `addr` (range `len`) to this process, where the allocation is
    /// mapped at `mapped_base`. Errors when the range leaves the registered region.
    pub fn translate(&self, mapped_base: u64, addr: u64, len: u64) -> MResult<u64> {
        if !self.contains(addr, len) {
            return Err(MoverError::Invalid(format!(
                "remote range {addr:#x}+{len} outside the registered region {:#x}+{}",
                self.region_base, self.region_len
            )));
        }
        mapped_base
            .checked_add(addr - self.alloc_base)
            .ok_or_else(|| MoverError::Invalid("IPC mapping address overflows".into()))
    }
}

/// Writes `desc` (or zeros: no IPC) into its section of a memory handle's bytes.
pub fn write_section(handle: &mut [u8], desc: Option<&IpcDesc>) -> MResult<()> {
    let n = handle.len();
    let sec = handle
        .get_mut(IPC_DESC_OFFSET..IPC_DESC_OFFSET + IPC_DESC_BYTES)
        .ok_or_else(|| {
            MoverError::Invalid(format!("memory handle of {n} bytes has no IPC section"))
        })?;
    match desc {
        Some(d) => sec.copy_from_slice(&d.encode()),
        None => sec.fill(0),
    }
    Ok(())
}

/// Reads the IPC section of a memory handle's bytes (see [`IpcDesc::decode`]).
pub fn read_section(handle: &[u8]) -> MResult<Option<IpcDesc>> {
    match handle.get(IPC_DESC_OFFSET..) {
        Some(sec) => IpcDesc::decode(sec),
        None => Err(MoverError::Invalid(format!(
            "memory handle of {} bytes has no IPC section",
            handle.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> IpcDesc {
        let mut handle = [0u8; HANDLE_BYTES];
        for (i, h) in handle.iter_mut().enumerate() {
            *h = i as u8 ^ 0xa5;
        }
        IpcDesc {
            host: HostId(0x1234_5678_9abc_def0),
            pid: 4242,
            ordinal: 1,
            alloc_base: 0x7f00_0000_0000,
            alloc_len: 1 << 30,
            region_base: 0x7f00_0010_0000,
            region_len: 256 << 20,
            export: Export::Legacy { handle },
        }
    }

    fn vmm_desc() -> IpcDesc {
        IpcDesc {
            export: Export::Vmm {
                cookie: 0xfeed_beef_0123_4567,
                export_id: 42,
                pieces: 3,
            },
            ..desc()
        }
    }

    #[test]
    fn descriptor_round_trips_at_fixed_offsets() {
        let d = desc();
        let b = d.encode();
        assert_eq!(&b[0..6], b"EFAIPC");
        assert_eq!(
            u64::from_le_bytes(b[32..40].try_into().unwrap()),
            d.alloc_base
        );
        let Export::Legacy { handle } = d.export else {
            unreachable!()
        };
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 1);
        assert_eq!(&b[64..128], &handle[..]);
        assert_eq!(IpcDesc::decode(&b), Ok(Some(d)));
        // A longer slice (the rest of the memory handle) decodes the same.
        let mut h = [0u8; 512];
        h[IPC_DESC_OFFSET..IPC_DESC_OFFSET + IPC_DESC_BYTES].copy_from_slice(&b);
        assert_eq!(IpcDesc::decode(&h[IPC_DESC_OFFSET..]), Ok(Some(d)));
        // The section fits in the handle after the transport's blob.
        const { assert!(IPC_DESC_OFFSET + IPC_DESC_BYTES <= 512) };
    }

    #[test]
    fn sections_of_a_handle() {
        let mut h = [0xeeu8; 512];
        write_section(&mut h, Some(&desc())).unwrap();
        assert_eq!(read_section(&h), Ok(Some(desc())));
        assert_eq!(
            h[IPC_DESC_OFFSET - 1],
            0xee,
            "bytes before the section untouched"
        );
        assert_eq!(
            h[IPC_DESC_OFFSET + IPC_DESC_BYTES],
            0xee,
            "bytes after untouched"
        );
        write_section(&mut h, None).unwrap();
        assert_eq!(read_section(&h), Ok(None));
        assert!(write_section(&mut [0u8; 200], None).is_err());
        assert!(read_section(&[0u8; 100]).is_err());
    }

    #[test]
    fn zero_section_means_no_ipc_and_garbage_is_an_error() {
        assert_eq!(IpcDesc::decode(&[0u8; IPC_DESC_BYTES]), Ok(None));
        assert!(IpcDesc::decode(&[0u8; 10]).is_err());
        let mut b = desc().encode();
        b[0] ^= 1;
        assert!(matches!(IpcDesc::decode(&b), Err(MoverError::Invalid(m)) if m.contains("magic")));
        let mut b = desc().encode();
        b[8] = 1; // the layout before kinds
        assert!(
            matches!(IpcDesc::decode(&b), Err(MoverError::Invalid(m)) if m.contains("version"))
        );
        let mut b = desc().encode();
        b[12] = 3;
        assert!(matches!(IpcDesc::decode(&b), Err(MoverError::Invalid(m)) if m.contains("kind")));
    }

    #[test]
    fn vmm_descriptor_round_trips_at_fixed_offsets() {
        let d = vmm_desc();
        let b = d.encode();
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 2);
        assert_eq!(&b[64..72], b"EFAVMMFD");
        assert_eq!(
            u64::from_le_bytes(b[72..80].try_into().unwrap()),
            0xfeed_beef_0123_4567
        );
        assert_eq!(u64::from_le_bytes(b[80..88].try_into().unwrap()), 42);
        assert_eq!(u32::from_le_bytes(b[88..92].try_into().unwrap()), 3);
        assert!(b[92..].iter().all(|&x| x == 0));
        assert_eq!(IpcDesc::decode(&b), Ok(Some(d)));
        let mut h = [0xeeu8; 512];
        write_section(&mut h, Some(&d)).unwrap();
        assert_eq!(read_section(&h), Ok(Some(d)));
    }

    #[test]
    fn a_descriptor_of_one_kind_never_decodes_as_the_other() {
        // VMM bytes relabelled legacy: the payload's magic gives it away.
        let mut b = vmm_desc().encode();
        b[12] = 1;
        assert!(IpcDesc::decode(&b).is_err());
        // Legacy bytes relabelled VMM: no VMM magic.
        let mut b = desc().encode();
        b[12] = 2;
        assert!(IpcDesc::decode(&b).is_err());
        // VMM with something in its zero tail, or without its magic.
        let mut b = vmm_desc().encode();
        b[127] = 1;
        assert!(IpcDesc::decode(&b).is_err());
        let mut b = vmm_desc().encode();
        b[64] ^= 1;
        assert!(IpcDesc::decode(&b).is_err());
        // Kind 0 (the old "no flags" layout) is neither.
        let mut b = desc().encode();
        b[12] = 0;
        assert!(IpcDesc::decode(&b).is_err());
    }

    #[test]
    fn vmm_descriptors_need_cookie_id_and_a_sane_piece_count() {
        let with = |cookie, export_id, pieces| IpcDesc {
            export: Export::Vmm {
                cookie,
                export_id,
                pieces,
            },
            ..desc()
        };
        assert!(with(1, 1, 1).validate().is_ok());
        assert!(with(1, 1, MAX_PIECES as u32).validate().is_ok());
        for bad in [
            with(0, 1, 1),
            with(1, 0, 1),
            with(1, 1, 0),
            with(1, 1, MAX_PIECES as u32 + 1),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
            assert!(IpcDesc::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        // The region checks apply to VMM descriptors too.
        let mut d = vmm_desc();
        d.region_len = 0;
        assert!(IpcDesc::decode(&d.encode()).is_err());
    }

    #[test]
    fn inconsistent_regions_are_rejected() {
        let mut d = desc();
        d.region_base = d.alloc_base - 1;
        assert!(IpcDesc::decode(&d.encode()).is_err());
        let mut d = desc();
        d.region_len = d.alloc_len; // runs past the allocation's end
        assert!(IpcDesc::decode(&d.encode()).is_err());
        let mut d = desc();
        d.region_len = 0;
        assert!(IpcDesc::decode(&d.encode()).is_err());
        let mut d = desc();
        d.alloc_base = u64::MAX - 10;
        d.region_base = u64::MAX - 5;
        assert!(IpcDesc::decode(&d.encode()).is_err(), "overflowing ends");
        // Region exactly the allocation is fine.
        let mut d = desc();
        d.region_base = d.alloc_base;
        d.region_len = d.alloc_len;
        assert!(IpcDesc::decode(&d.encode()).unwrap().is_some());
    }

    #[test]
    fn translation_checks_bounds() {
        let d = desc();
        let mapped = 0x5000_0000_0000u64;
        let off = d.region_base - d.alloc_base;
        assert_eq!(d.translate(mapped, d.region_base, 8), Ok(mapped + off));
        let last = d.region_base + d.region_len - 8;
        assert_eq!(
            d.translate(mapped, last, 8),
            Ok(mapped + off + d.region_len - 8)
        );
        assert!(d.translate(mapped, last, 9).is_err());
        assert!(d.translate(mapped, d.region_base - 1, 1).is_err());
        assert!(d
            .translate(mapped, d.region_base, d.region_len + 1)
            .is_err());
        assert!(d.translate(mapped, u64::MAX, 1).is_err());
        assert!(
            d.translate(u64::MAX, d.region_base + 1, 1).is_err(),
            "overflow"
        );
        assert!(d.contains(d.region_base, 0));
    }

    #[test]
    fn host_ids_compare_boot_and_name() {
        let a = HostId::from_parts(Some("b1\n"), Some("node-a"));
        assert_eq!(a, HostId::from_parts(Some("b1"), Some("node-a ")));
        assert!(a.same_as(a));
        assert!(!a.same_as(HostId::from_parts(Some("b2"), Some("node-a"))));
        assert!(!a.same_as(HostId::from_parts(Some("b1"), Some("node-b"))));
        assert_eq!(HostId::from_parts(None, Some("node-a")), HostId::UNKNOWN);
        assert_eq!(
            HostId::from_parts(Some("  "), Some("node-a")),
            HostId::UNKNOWN
        );
        assert!(!HostId::UNKNOWN.same_as(HostId::UNKNOWN));
        assert_eq!(HostId::from_bytes(a.to_bytes()), a);
        // This machine has a boot id, so its id is known and stable.
        let me = HostId::local();
        assert_ne!(me, HostId::UNKNOWN);
        assert_eq!(me, HostId::local());
        assert!(me.same_as(me));
    }
}
