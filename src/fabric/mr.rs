//! Memory registration: one region type that owns its registration and knows its memory kind
//! (host or CUDA device), decided once by the caller and carried from then on.
//!
//! Providers without `FI_MR_PROV_KEY` (tcp;ofi_rxm and shm among them) take the key from the
//! application and refuse a second registration with a key already in use in the domain
//! (`-FI_ENOKEY`). [`MemoryRegion::register`] draws keys from the domain's counter;
//! [`MemoryRegion::register_reserved`] (the GDA queues' registrations) from a process-wide range of
//! its own, so they never collide with the transport's registrations or with another queue's, even
//! on a domain object the transport holds separately.
use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::domain::{close_fid, Domain};
use super::endpoint::Endpoint;
use super::error::{check, Error, Result};
use super::handle::MrHandle;

/// First key [`MemoryRegion::register_reserved`] requests (a range the transport does not use).
const RESERVED_KEY_BASE: u64 = 0x4744_4100_0000;
static NEXT_RESERVED_KEY: AtomicU64 = AtomicU64::new(RESERVED_KEY_BASE);

/// Where registered memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// CUDA device memory of the given device ordinal.
    Cuda(i32),
}

impl MemKind {
    /// Whether this is CUDA device memory.
    pub fn is_device(self) -> bool {
        matches!(self, MemKind::Cuda(_))
    }
}

/// How GPU memory handed to the provider is registered (decided by the route:
/// [`crate::route::Route::gpu_registration`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuRegistration {
    /// By address: FI_HMEM iface CUDA and the device ordinal; the provider finds the pages itself
    /// (peer memory, or a dmabuf it exports on its own where its version does).
    #[default]
    Address,
    /// By dmabuf: `FI_MR_DMABUF` and a `struct fi_mr_dmabuf` whose descriptor comes from
    /// `cuMemGetHandleForAddressRange` (iface CUDA and the device as well).
    Dmabuf,
}

impl std::fmt::Display for GpuRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuRegistration::Address => "by address (FI_HMEM CUDA)",
            GpuRegistration::Dmabuf => "by dmabuf (FI_MR_DMABUF)",
        })
    }
}

/// A dmabuf that holds a range to register: byte 0 of the dmabuf is address `base`, the range starts
/// `offset` bytes in, and the dmabuf is `span` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmabufSource {
    /// The dmabuf file descriptor.
    pub fd: std::os::fd::RawFd,
    /// Address of the dmabuf's first byte (`fi_mr_dmabuf.base_addr`).
    pub base: u64,
    /// Offset of the registered range in the dmabuf (`fi_mr_dmabuf.offset`).
    pub offset: u64,
    /// Length of the dmabuf.
    pub span: u64,
}

/// The attribute of one `fi_mr_regattr` call, with what it points to (owned, so the pointers stay
/// valid while this value lives, moved or not).
pub(crate) struct RegAttr {
    pub(crate) attr: fi::fi_mr_attr,
    pub(crate) flags: u64,
    _iov: Box<libc::iovec>,
    _dmabuf: Option<Box<fi::fi_mr_dmabuf>>,
}

impl RegAttr {
    /// Builds the attribute for `[base, base+len)` of `kind`, by dmabuf where `dmabuf` is given.
    /// Refuses an empty range, GPU memory on a provider without FI_HMEM (`hmem`), a dmabuf for host
    /// memory, a negative descriptor, and a dmabuf that does not hold the whole range at `base`.
    fn build(
        base: *const u8,
        len: usize,
        kind: MemKind,
        req: &Request,
        dmabuf: Option<DmabufSource>,
        hmem: bool,
        prov: &str,
    ) -> Result<RegAttr> {
        if base.is_null() || len == 0 {
            return Err(Error::invalid(format!(
                "fi_mr_regattr: empty region {base:p}+{len}"
            )));
        }
        let iov = Box::new(libc::iovec {
            iov_base: base as *mut c_void,
            iov_len: len,
        });
        // SAFETY: an all-zero fi_mr_attr is a valid starting point; fields are set below.
        let mut attr: fi::fi_mr_attr = unsafe { std::mem::zeroed() };
        attr.__bindgen_anon_1.mr_iov = &*iov as *const libc::iovec as *const _;
        attr.iov_count = 1;
        attr.access = req.access;
        if let Some(k) = req.key {
            attr.requested_key = k;
        }
        let mut flags = 0;
        match kind {
            MemKind::Host => attr.iface = fi::fi_hmem_iface_FI_HMEM_SYSTEM,
            MemKind::Cuda(dev) => {
                if !hmem {
                    return Err(Error {
                        code: req.no_hmem_code,
                        context: format!(
                            "provider {prov} has no FI_HMEM: cannot register CUDA memory {base:p}"
                        ),
                    });
                }
                attr.iface = fi::fi_hmem_iface_FI_HMEM_CUDA;
                attr.device.cuda = dev;
                if req.device_only {
                    flags |= fi::FI_HMEM_DEVICE_ONLY;
                }
            }
        }
        let dmabuf = match dmabuf {
            None => None,
            Some(_) if !kind.is_device() => {
                return Err(Error::invalid(format!(
                    "fi_mr_regattr: a dmabuf for host memory {base:p}"
                )))
            }
            Some(d) if d.fd < 0 => {
                return Err(Error::invalid(format!(
                    "fi_mr_regattr: dmabuf descriptor {} for {base:p}",
                    d.fd
                )))
            }
            Some(d) => {
                let holds = d.base.checked_add(d.offset) == Some(base as u64)
                    && d.offset
                        .checked_add(len as u64)
                        .is_some_and(|e| e <= d.span);
                if !holds {
                    return Err(Error::invalid(format!(
                        "fi_mr_regattr: dmabuf at {:#x} (offset {}, {} bytes) does not hold {base:p}+{len}",
                        d.base, d.offset, d.span
                    )));
                }
                let b = Box::new(fi::fi_mr_dmabuf {
                    fd: d.fd,
                    offset: d.offset,
                    len,
                    base_addr: d.base as *mut c_void,
                });
                attr.__bindgen_anon_1.dmabuf = &*b as *const fi::fi_mr_dmabuf;
                flags |= fi::FI_MR_DMABUF;
                Some(b)
            }
        };
        Ok(RegAttr {
            attr,
            flags,
            _iov: iov,
            _dmabuf: dmabuf,
        })
    }
}

/// Sizes and offsets of `struct fi_mr_dmabuf` and of the `struct fi_mr_attr` fields a registration
/// sets, as the library is compiled (`tests/efa_ext_header.rs` compares them with the headers of each
/// libfabric release: the structs are part of libfabric's ABI and must not move).
pub fn mr_attr_layout() -> Vec<(&'static str, u64)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("sizeof.fi_mr_dmabuf", size_of::<fi::fi_mr_dmabuf>() as u64),
        (
            "offsetof.fi_mr_dmabuf.fd",
            offset_of!(fi::fi_mr_dmabuf, fd) as u64,
        ),
        (
            "offsetof.fi_mr_dmabuf.offset",
            offset_of!(fi::fi_mr_dmabuf, offset) as u64,
        ),
        (
            "offsetof.fi_mr_dmabuf.len",
            offset_of!(fi::fi_mr_dmabuf, len) as u64,
        ),
        (
            "offsetof.fi_mr_dmabuf.base_addr",
            offset_of!(fi::fi_mr_dmabuf, base_addr) as u64,
        ),
        (
            "offsetof.fi_mr_attr.mr_iov",
            offset_of!(fi::fi_mr_attr, __bindgen_anon_1) as u64,
        ),
        (
            "offsetof.fi_mr_attr.dmabuf",
            offset_of!(fi::fi_mr_attr, __bindgen_anon_1) as u64,
        ),
        (
            "offsetof.fi_mr_attr.iov_count",
            offset_of!(fi::fi_mr_attr, iov_count) as u64,
        ),
        (
            "offsetof.fi_mr_attr.access",
            offset_of!(fi::fi_mr_attr, access) as u64,
        ),
        (
            "offsetof.fi_mr_attr.requested_key",
            offset_of!(fi::fi_mr_attr, requested_key) as u64,
        ),
        (
            "offsetof.fi_mr_attr.iface",
            offset_of!(fi::fi_mr_attr, iface) as u64,
        ),
        (
            "offsetof.fi_mr_attr.device",
            offset_of!(fi::fi_mr_attr, device) as u64,
        ),
        ("value.FI_MR_DMABUF", fi::FI_MR_DMABUF),
        ("value.FI_HMEM_DEVICE_ONLY", fi::FI_HMEM_DEVICE_ONLY),
        ("value.FI_HMEM_CUDA", fi::fi_hmem_iface_FI_HMEM_CUDA as u64),
    ]
}

/// A registered memory region (closed on drop; keeps its domain open).
pub struct MemoryRegion {
    raw: *mut fi::fid_mr,
    base: usize,
    len: usize,
    kind: MemKind,
    _domain: Arc<Domain>,
}
// SAFETY: registration handles are immutable after creation.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

/// How one registration is made.
struct Request {
    access: u64,
    /// Key to request (always passed; providers with FI_MR_PROV_KEY ignore it).
    key: Option<u64>,
    /// Register device memory FI_HMEM_DEVICE_ONLY.
    device_only: bool,
    /// Code of the error for CUDA memory on a provider without FI_HMEM.
    no_hmem_code: i32,
}

impl MemoryRegion {
    /// Registers `[base, base+len)` for local and (if `remote`) remote access. For providers that
    /// need it (FI_MR_ENDPOINT) the region is bound to `ep` and enabled. Device memory is registered
    /// `FI_HMEM_DEVICE_ONLY` (as fabtests does): shm then moves it with CUDA IPC instead of its CPU
    /// copy protocols, which cannot read GPU memory.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        remote: bool,
        ep: Option<&Endpoint>,
    ) -> Result<MemoryRegion> {
        // SAFETY: forwarded contract.
        unsafe {
            Self::register_gpu(
                domain,
                base,
                len,
                kind,
                remote,
                ep,
                GpuRegistration::Address,
            )
        }
    }

    /// Registers `[base, base+len)` for local and remote access with a key from the reserved
    /// process-wide range (see the module documentation), without `FI_HMEM_DEVICE_ONLY`. CUDA
    /// memory on a provider without FI_HMEM is refused with `-EOPNOTSUPP`.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is dropped.
    pub unsafe fn register_reserved(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        ep: Option<&Endpoint>,
    ) -> Result<MemoryRegion> {
        let req = Request {
            access: (fi::FI_READ
                | fi::FI_WRITE
                | fi::FI_SEND
                | fi::FI_RECV
                | fi::FI_REMOTE_READ
                | fi::FI_REMOTE_WRITE) as u64,
            key: Some(NEXT_RESERVED_KEY.fetch_add(1, Ordering::Relaxed)),
            device_only: false,
            no_hmem_code: -libc::EOPNOTSUPP,
        };
        // SAFETY: forwarded contract.
        unsafe { Self::register_with(domain, base, len, kind, ep, req) }
    }

    /// Registers `[base, base+len)` like [`MemoryRegion::register`], GPU memory as `how` says: by
    /// address (FI_HMEM iface CUDA and the device) or by dmabuf (`FI_MR_DMABUF`, the range exported
    /// with `cuMemGetHandleForAddressRange`). A provider that refuses the dmabuf gets an error naming
    /// the way out, and a log line.
    ///
    /// # Safety
    /// As for [`MemoryRegion::register`].
    pub unsafe fn register_gpu(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        remote: bool,
        ep: Option<&Endpoint>,
        how: GpuRegistration,
    ) -> Result<MemoryRegion> {
        let mut access = (fi::FI_READ | fi::FI_WRITE | fi::FI_SEND | fi::FI_RECV) as u64;
        if remote {
            access |= (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        }
        let key = (domain.info().mr_mode() & fi::FI_MR_PROV_KEY as u64 == 0).then(|| {
            // The application chooses keys: unique within the domain.
            domain.next_key.fetch_add(1, Ordering::Relaxed)
        });
        let req = Request {
            access,
            key,
            device_only: true,
            no_hmem_code: -libc::EINVAL,
        };
        if !(kind.is_device() && how == GpuRegistration::Dmabuf) {
            // SAFETY: forwarded contract.
            return unsafe { Self::register_with(domain, base, len, kind, ep, req) };
        }
        let prov = domain.info().provider_name();
        let exported = crate::cuda::dmabuf::export(base as u64, len as u64).map_err(|e| {
            let m = format!(
                "GPU memory {base:p}+{len} cannot be exported as a dmabuf for provider {prov}: {e}; \
                 NVSHMEM_EFA_GPU_STAGING=1 stages GPU memory instead, NVSHMEM_EFA_DMABUF=0 registers \
                 it by address (needs the nvidia-peermem module)"
            );
            tracing::error!("{m}");
            Error {
                code: -libc::EOPNOTSUPP,
                context: m,
            }
        })?;
        let src = DmabufSource {
            fd: exported.fd.as_raw_fd(),
            base: exported.base,
            offset: exported.offset,
            span: exported.span,
        };
        // SAFETY: forwarded contract; the dmabuf stays open across the call (`exported`), after which
        // the provider holds its own reference.
        let r = unsafe { Self::register_attr(domain, base, len, kind, ep, &req, Some(src)) };
        drop(exported);
        r.map_err(|e| {
            let m = format!(
                "provider {prov} refused GPU memory {base:p}+{len} registered by dmabuf \
                 (FI_MR_DMABUF, fd {}, offset {}, span {}): {e}; NVSHMEM_EFA_GPU_STAGING=1 stages \
                 GPU memory instead, NVSHMEM_EFA_DMABUF=0 registers it by address",
                src.fd, src.offset, src.span
            );
            tracing::error!("{m}");
            Error {
                code: e.code,
                context: m,
            }
        })
    }

    /// # Safety
    /// As for [`MemoryRegion::register`].
    unsafe fn register_with(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        ep: Option<&Endpoint>,
        req: Request,
    ) -> Result<MemoryRegion> {
        // SAFETY: forwarded contract.
        unsafe { Self::register_attr(domain, base, len, kind, ep, &req, None) }
    }

    /// # Safety
    /// As for [`MemoryRegion::register`]; `dmabuf`, when given, must be an open dmabuf of the range.
    unsafe fn register_attr(
        domain: &Arc<Domain>,
        base: *const u8,
        len: usize,
        kind: MemKind,
        ep: Option<&Endpoint>,
        req: &Request,
        dmabuf: Option<DmabufSource>,
    ) -> Result<MemoryRegion> {
        let info = domain.info();
        let a = RegAttr::build(
            base,
            len,
            kind,
            req,
            dmabuf,
            info.has_hmem(),
            &info.provider_name(),
        )?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain; the attribute and what it points to (owned by `a`) live across the
        // call; raw receives the new object.
        let ret = unsafe { fi::fi_mr_regattr(domain.raw, &a.attr, a.flags, &mut raw) };
        check(ret as i64, || {
            format!(
                "fi_mr_regattr({base:p}, {len} bytes, {kind:?}{})",
                if dmabuf.is_some() {
                    ", FI_MR_DMABUF"
                } else {
                    ""
                }
            )
        })?;
        let mr = MemoryRegion {
            raw,
            base: base as usize,
            len,
            kind,
            _domain: domain.clone(),
        };
        if domain.info().mr_endpoint() {
            let ep = ep.ok_or_else(|| {
                Error::invalid("FI_MR_ENDPOINT provider: registration needs an endpoint")
            })?;
            // SAFETY: open registration and endpoint of the same domain.
            unsafe {
                check(fi::fi_mr_bind(raw, ep.fid(), 0) as i64, || {
                    "fi_mr_bind".to_string()
                })?;
                check(fi::fi_mr_enable(raw) as i64, || "fi_mr_enable".to_string())?;
            }
        }
        Ok(mr)
    }

    /// Remote key.
    pub fn key(&self) -> u64 {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_key(self.raw) }
    }

    /// Local descriptor for data transfer calls.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: open registration.
        unsafe { fi::fi_mr_desc(self.raw) }
    }

    /// Start address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty (registration refuses empty regions); present for API completeness.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the memory lives (as given at registration).
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// Whether the region is device memory.
    pub fn is_device(&self) -> bool {
        self.kind.is_device()
    }

    /// True if `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }

    /// A non-owning handle of the registration (valid while `self` lives).
    pub fn handle(&self) -> MrHandle {
        MrHandle(self.raw)
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_mr {
        self.raw
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: open registration.
        close_fid(unsafe { &mut (*self.raw).fid }, "mr");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(device_only: bool) -> Request {
        Request {
            access: (fi::FI_READ | fi::FI_REMOTE_WRITE) as u64,
            key: Some(7),
            device_only,
            no_hmem_code: -libc::EINVAL,
        }
    }

    const GPU: MemKind = MemKind::Cuda(1);

    fn dmabuf(fd: i32, base: u64, offset: u64, span: u64) -> Option<DmabufSource> {
        Some(DmabufSource {
            fd,
            base,
            offset,
            span,
        })
    }

    #[test]
    fn an_address_registration_names_iface_and_device() {
        let p = 0x7f00_0000_1000usize as *const u8;
        let a = RegAttr::build(p, 4096, GPU, &req(true), None, true, "shm").unwrap();
        assert_eq!(a.attr.iface, fi::fi_hmem_iface_FI_HMEM_CUDA);
        // SAFETY: the union field was written by build.
        assert_eq!(unsafe { a.attr.device.cuda }, 1);
        assert_eq!(a.flags, fi::FI_HMEM_DEVICE_ONLY);
        assert_eq!(a.attr.requested_key, 7);
        assert_eq!(a.attr.iov_count, 1);
        // SAFETY: build set the iov member, which points into `a`.
        let iov = unsafe { &*a.attr.__bindgen_anon_1.mr_iov };
        assert_eq!((iov.iov_base as usize, iov.iov_len), (p as usize, 4096));
        let h = RegAttr::build(p, 64, MemKind::Host, &req(true), None, false, "tcp").unwrap();
        assert_eq!(
            (h.attr.iface, h.flags),
            (fi::fi_hmem_iface_FI_HMEM_SYSTEM, 0)
        );
    }

    #[test]
    fn a_dmabuf_registration_points_at_its_dmabuf() {
        let base = 0x7f00_0020_0000u64;
        let p = (base + 0x1234) as *const u8;
        let a = RegAttr::build(
            p,
            0x1000,
            GPU,
            &req(false),
            dmabuf(9, base, 0x1234, 0x3000),
            true,
            "efa",
        )
        .unwrap();
        assert_eq!(a.flags, fi::FI_MR_DMABUF);
        assert_eq!(a.attr.iface, fi::fi_hmem_iface_FI_HMEM_CUDA);
        // SAFETY: build set the dmabuf member, which points into `a`.
        let d = unsafe { &*a.attr.__bindgen_anon_1.dmabuf };
        assert_eq!((d.fd, d.offset, d.len), (9, 0x1234, 0x1000));
        // libfabric's efa registers the I/O address base_addr + offset: the registered pointer.
        assert_eq!(d.base_addr as u64 + d.offset, p as u64);
        let both = RegAttr::build(
            p,
            8,
            GPU,
            &req(true),
            dmabuf(9, base, 0x1234, 0x3000),
            true,
            "shm",
        );
        assert_eq!(
            both.unwrap().flags,
            fi::FI_MR_DMABUF | fi::FI_HMEM_DEVICE_ONLY
        );
    }

    #[test]
    fn bad_registrations_are_refused() {
        let base = 0x7f00_0020_0000u64;
        let p = (base + 0x100) as *const u8;
        let bad = |r: Result<RegAttr>, what: &str| {
            let e = r.err().unwrap_or_else(|| panic!("{what}: accepted"));
            assert!(e.to_string().contains(what), "{what}: {e}");
            e.code
        };
        bad(
            RegAttr::build(std::ptr::null(), 8, GPU, &req(true), None, true, "efa"),
            "empty region",
        );
        bad(
            RegAttr::build(p, 0, GPU, &req(true), None, true, "efa"),
            "empty region",
        );
        let code = bad(
            RegAttr::build(p, 8, GPU, &req(true), None, false, "tcp;ofi_rxm"),
            "provider tcp;ofi_rxm has no FI_HMEM",
        );
        assert_eq!(code, -libc::EINVAL);
        bad(
            RegAttr::build(
                p,
                8,
                MemKind::Host,
                &req(true),
                dmabuf(3, base, 0x100, 4096),
                true,
                "efa",
            ),
            "a dmabuf for host memory",
        );
        bad(
            RegAttr::build(
                p,
                8,
                GPU,
                &req(true),
                dmabuf(-1, base, 0x100, 4096),
                true,
                "efa",
            ),
            "dmabuf descriptor -1",
        );
        // The range must start at base + offset and end inside the dmabuf.
        bad(
            RegAttr::build(
                p,
                8,
                GPU,
                &req(true),
                dmabuf(3, base, 0x200, 4096),
                true,
                "efa",
            ),
            "does not hold",
        );
        bad(
            RegAttr::build(
                p,
                4096,
                GPU,
                &req(true),
                dmabuf(3, base, 0x100, 4096),
                true,
                "efa",
            ),
            "does not hold",
        );
        bad(
            RegAttr::build(
                p,
                8,
                GPU,
                &req(true),
                dmabuf(3, base, u64::MAX, 4096),
                true,
                "efa",
            ),
            "does not hold",
        );
    }

    #[test]
    fn the_compiled_layout_is_libfabrics() {
        // libfabric 1.20+'s include/rdma/fi_domain.h on LP64 (also checked per release against the
        // headers by tests/efa_ext_header.rs).
        let l: std::collections::BTreeMap<_, _> = mr_attr_layout().into_iter().collect();
        assert_eq!(l["sizeof.fi_mr_dmabuf"], 32);
        assert_eq!(l["offsetof.fi_mr_dmabuf.base_addr"], 24);
        assert_eq!(l["offsetof.fi_mr_attr.dmabuf"], 0);
        assert_eq!(l["offsetof.fi_mr_attr.iface"], 64);
        assert_eq!(l["value.FI_MR_DMABUF"], 1 << 40);
    }
}
