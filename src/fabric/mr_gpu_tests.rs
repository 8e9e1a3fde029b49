//! GPU memory exported as a dmabuf and registered with a provider by dmabuf (`FI_MR_DMABUF`) and
//! by address, on a real GPU with the software providers (libfabric's utility providers take the
//! dmabuf as an address range: the registration code of the efa path runs on any GPU host). On
//! machines without a CUDA device each test says so and checks nothing else; on a GPU host run
//! `cargo test --release --lib fabric::mr_gpu_tests -- --test-threads=1 --nocapture`.
use std::sync::Arc;

use super::{Domain, Fabric, GpuRegistration, Info, InfoRequest, MemKind, MemoryRegion, Provider};
use crate::cuda::{self, dmabuf, DeviceBuffer};

const LEN: usize = 4 << 20;

fn device_buffer() -> Option<DeviceBuffer> {
    if !cuda::available() {
        eprintln!("no CUDA driver: nothing to check here");
        return None;
    }
    if cuda::use_primary_context(0).is_err() {
        eprintln!("CUDA driver present but no usable device: nothing to check here");
        return None;
    }
    Some(DeviceBuffer::new(LEN).expect("cuMemAlloc"))
}

/// The export covers the range from a page boundary, and fails exactly where the device says it
/// exports no dmabuf.
#[test]
fn dmabuf_export_of_device_memory() {
    let Some(buf) = device_buffer() else { return };
    let supported = dmabuf::device_supports(0).expect("DMA_BUF_SUPPORTED attribute");
    eprintln!("device 0 exports dmabuf: {supported}");
    let ptr = buf.ptr() + 4096 + 13;
    let len = 1 << 20;
    match dmabuf::export(ptr, len) {
        Ok(d) => {
            assert!(supported, "exported although the device says it cannot");
            assert_eq!(d.base % 4096, 0);
            assert_eq!(d.base + d.offset, ptr);
            assert!(d.offset + len <= d.span && d.span % 4096 == 0);
            eprintln!(
                "exported {ptr:#x}+{len}: base {:#x}, offset {}, span {}",
                d.base, d.offset, d.span
            );
        }
        Err(e) => assert!(!supported, "the device exports dmabuf, but: {e}"),
    }
}

fn domain(p: Provider) -> Option<Arc<Domain>> {
    let info = match Info::get(&InfoRequest {
        provider: p.clone(),
        hmem: true,
        atomics: false,
        msg: true,
    }) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{p}: no answer with FI_HMEM ({e}): not checked");
            return None;
        }
    };
    if info.mr_endpoint() {
        eprintln!("{p}: FI_MR_ENDPOINT: not checked here");
        return None;
    }
    let fabric = Fabric::open(info).expect("fi_fabric");
    Some(Domain::open(&fabric).expect("fi_domain"))
}

/// GPU memory registers by dmabuf and by address on shm and tcp, each registration covering the
/// range with a key of its own.
#[test]
fn dmabuf_registration_on_software_providers() {
    let Some(buf) = device_buffer() else { return };
    if !dmabuf::device_supports(0).unwrap_or(false) {
        eprintln!("device 0 exports no dmabuf: registration by dmabuf not checked");
        return;
    }
    for p in [Provider::Shm, Provider::Tcp] {
        let Some(d) = domain(p.clone()) else { continue };
        let base = (buf.ptr() + 4096) as *const u8;
        let len = LEN - 8192;
        let mut keys = Vec::new();
        for how in [GpuRegistration::Dmabuf, GpuRegistration::Address] {
            // SAFETY: the buffer outlives the region (dropped at the end of this iteration).
            let mr = unsafe {
                MemoryRegion::register_gpu(&d, base, len, MemKind::Cuda(0), true, None, how)
            }
            .unwrap_or_else(|e| panic!("{p}: GPU memory {how}: {e}"));
            assert!(mr.contains(base as usize, len) && mr.is_device());
            keys.push(mr.key());
            eprintln!("{p}: GPU memory registered {how}, key {:#x}", mr.key());
        }
        assert_ne!(keys[0], keys[1], "{p}: two registrations, one key");
    }
}
