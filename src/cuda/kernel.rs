//! The library's one GPU kernel, `nvshmem_efa_amo` (`amo.ptx`, PTX text compiled by the driver when
//! the module loads): one thread applies one atomic (add, and, or, xor, swap, compare-and-swap; 4
//! or 8 bytes; the old value stored where asked) to GPU memory of this device or of a peer mapped
//! through CUDA IPC, unless the host has claimed the operation first through the slot it is given. The claim protocol is
//! [`crate::mover::amo`]'s; this module loads the kernel and launches it.
use std::ffi::c_void;

use cudarc::driver::sys;

use super::stream::CopyStream;
use super::{check, require, ContextGuard, ContextObject, CudaResult};

/// The kernel's source. `tests::ptx_assembles` runs `ptxas` over it where the CUDA compiler is
/// installed.
pub const AMO_PTX: &str = include_str!("amo.ptx");

/// The kernel's entry name in [`AMO_PTX`].
const AMO_ENTRY: &std::ffi::CStr = c"nvshmem_efa_amo";

/// The operation, as the kernel's `op` parameter encodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AmoOp {
    /// `*target += value` (wrapping).
    Add = 0,
    /// `*target &= value`.
    And = 1,
    /// `*target |= value`.
    Or = 2,
    /// `*target ^= value`.
    Xor = 3,
    /// `*target = value` (an atomic exchange).
    Set = 4,
    /// `*target = value` if `*target == cmp`.
    Cas = 5,
}

/// Unloads a module `ContextObject::create` got from `cuModuleLoadData`.
///
/// # Safety
/// Called once per module, with its context current, after its launches completed.
unsafe fn unload_module(h: usize) -> sys::CUresult {
    // SAFETY: per the contract.
    unsafe { sys::cuModuleUnload(h as sys::CUmodule) }
}

/// The kernel loaded into one context.
#[derive(Debug)]
pub struct AmoKernel {
    module: ContextObject,
    func: usize,
}

// SAFETY: module and function handles are process-wide driver handles; every call through them
// pushes the module's context first.
unsafe impl Send for AmoKernel {}
// SAFETY: as above; launching takes `&self` and the driver serialises launches per stream.
unsafe impl Sync for AmoKernel {}

impl AmoKernel {
    /// Loads [`AMO_PTX`] into context `ctx` (0: the current one). The driver compiles it for the
    /// device here, once; call it where no kernel of the application waits on the library (at
    /// connect).
    pub fn load(ctx: usize) -> CudaResult<AmoKernel> {
        require("cuModuleLoadData")?;
        let mut text = AMO_PTX.as_bytes().to_vec();
        text.push(0);
        let module = ContextObject::create(
            ctx,
            "cuModuleLoadData",
            "cuModuleLoadData(amo.ptx)",
            || {
                let mut m: sys::CUmodule = std::ptr::null_mut();
                // SAFETY: NUL-terminated PTX text that lives through the call; one handle written.
                let r = unsafe { sys::cuModuleLoadData(&mut m, text.as_ptr() as *const c_void) };
                (r, m as usize)
            },
            unload_module,
        )?;
        let _g = ContextGuard::enter(module.ctx)?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a live module of the pushed context; the name is NUL-terminated.
        check(
            unsafe {
                sys::cuModuleGetFunction(&mut f, module.handle as sys::CUmodule, AMO_ENTRY.as_ptr())
            },
            || "cuModuleGetFunction(nvshmem_efa_amo)".into(),
        )?;
        Ok(AmoKernel {
            module,
            func: f as usize,
        })
    }

    /// The context the kernel is loaded in.
    pub fn context(&self) -> usize {
        self.module.ctx
    }

    /// Enqueues one launch (one block of one thread) on `stream`, which must belong to the
    /// kernel's context: `op` with operand `value` (and `cmp` for [`AmoOp::Cas`]) on `target`;
    /// the old value is stored at `result` unless it is 0.
    ///
    /// # Safety
    /// `target` (and `result`, unless 0) are device-accessible memory of `size` (4 or 8) bytes,
    /// aligned, valid until the launch completes; `slot` is the device address of 32 bytes of
    /// mapped pinned host memory, zero, that outlive the launch.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        stream: &CopyStream,
        target: u64,
        value: u64,
        cmp: u64,
        result: u64,
        op: AmoOp,
        size: u32,
        slot: u64,
    ) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.module.ctx)?;
        let (mut t, mut v, mut c, mut r) = (target, value, cmp, result);
        let (mut o, mut s, mut sl) = (op as u32, size, slot);
        let mut params: [*mut c_void; 7] = [
            &mut t as *mut u64 as *mut c_void,
            &mut v as *mut u64 as *mut c_void,
            &mut c as *mut u64 as *mut c_void,
            &mut r as *mut u64 as *mut c_void,
            &mut o as *mut u32 as *mut c_void,
            &mut s as *mut u32 as *mut c_void,
            &mut sl as *mut u64 as *mut c_void,
        ];
        // SAFETY: a function of the pushed context, a stream of the same context, and seven
        // parameter pointers matching the entry's seven parameters, read during the call.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.func as sys::CUfunction,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream.handle(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            || format!("cuLaunchKernel(nvshmem_efa_amo, {size} bytes at {target:#x})"),
        )
    }
}

/// Whether an atomic of device `from` (an ordinal) on memory of device `to` is atomic against that
/// device's own atomics: the same device, or peers whose link has native atomics
/// (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`). False when the driver cannot say.
pub fn native_atomics(from: i32, to: i32) -> bool {
    if from == to {
        return true;
    }
    if require("cuDeviceGetP2PAttribute").is_err() {
        return false;
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: writes one int; ordinals come from the driver.
    let r = unsafe {
        sys::cuDeviceGetP2PAttribute(
            &mut v,
            sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
            from,
            to,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && v != 0
}

/// The device ordinal of context `ctx`, made current for the call.
pub fn context_device(ctx: usize) -> CudaResult<i32> {
    require("cuCtxGetDevice")?;
    let _g = ContextGuard::enter(ctx)?;
    let mut d: sys::CUdevice = 0;
    // SAFETY: writes one int for the pushed context.
    check(unsafe { sys::cuCtxGetDevice(&mut d) }, || {
        "cuCtxGetDevice".into()
    })?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ptxas` from the CUDA compiler `.ci/setup-cuda.sh` installs, if it is there.
    fn ptxas() -> Option<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/cuda-venv/lib");
        let py = std::fs::read_dir(&root)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("python"))?;
        let p = py.path().join("site-packages/nvidia/cu13/bin/ptxas");
        p.exists().then_some(p)
    }

    #[test]
    fn ptx_assembles_for_turing_and_hopper() {
        let Some(ptxas) = ptxas() else {
            eprintln!("no ptxas under .deps/cuda-venv (run .ci/setup-cuda.sh): not checked");
            return;
        };
        let dir = std::env::temp_dir().join(format!("amo-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("amo.ptx");
        std::fs::write(&src, AMO_PTX).unwrap();
        for arch in ["sm_75", "sm_90"] {
            let out = std::process::Command::new(&ptxas)
                .args([&format!("-arch={arch}"), "-o"])
                .arg(dir.join(format!("amo-{arch}.cubin")))
                .arg(&src)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ptxas -arch={arch} refused amo.ptx: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ptx_names_the_entry_and_its_seven_parameters_in_launch_order() {
        let entry = AMO_ENTRY.to_str().unwrap();
        assert!(AMO_PTX.contains(&format!(".visible .entry {entry}(")));
        let params: Vec<&str> = AMO_PTX
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with(".param"))
            .collect();
        assert_eq!(
            params,
            [
                ".param .u64 p_target,",
                ".param .u64 p_value,",
                ".param .u64 p_cmp,",
                ".param .u64 p_result,",
                ".param .u32 p_op,",
                ".param .u32 p_size,",
                ".param .u64 p_slot",
            ]
        );
        assert_eq!((AmoOp::Set as u32, AmoOp::Cas as u32), (4, 5));
    }

    #[test]
    fn without_a_driver_loading_fails_cleanly() {
        if crate::cuda::available() {
            return;
        }
        assert!(AmoKernel::load(0).is_err());
        assert!(!native_atomics(0, 1));
        assert!(native_atomics(0, 0));
    }
}
