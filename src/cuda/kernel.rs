//! The library's two GPU kernels, PTX text compiled by the driver when the module loads:
//!
//! - `nvshmem_efa_amo` (`amo.ptx`): one thread applies one atomic (add, and, or, xor, swap,
//!   compare-and-swap; 4 or 8 bytes; the old value stored where asked) to GPU memory of this device
//!   or of a peer mapped through CUDA IPC. The claim protocol is [`crate::mover::amo`]'s.
//! - `nvshmem_efa_copy` (`copy.ptx`): one block moves up to [`COPY_MAX`] copies listed in its
//!   parameters (the software queue's small same-host RDMA). The claim protocol is
//!   [`crate::mover::kcopy`]'s.
//!
//! Each runs unless the host has claimed the launch first through the slot it is given; this
//! module loads the kernels and launches them.
use std::ffi::c_void;

use cudarc::driver::sys;

use super::stream::CopyStream;
use super::{check, require, ContextGuard, ContextObject, CudaResult};

/// The atomic kernel's source. `tests::ptx_assembles` runs `ptxas` over it where the CUDA compiler
/// is installed.
pub const AMO_PTX: &str = include_str!("amo.ptx");

/// The atomic kernel's entry name in [`AMO_PTX`].
const AMO_ENTRY: &std::ffi::CStr = c"nvshmem_efa_amo";

/// The copy kernel's source.
pub const COPY_PTX: &str = include_str!("copy.ptx");

/// The copy kernel's entry name in [`COPY_PTX`].
const COPY_ENTRY: &std::ffi::CStr = c"nvshmem_efa_copy";

/// Threads of the copy kernel's one block (its `.reqntid`).
pub const COPY_THREADS: u32 = 256;

/// Most descriptors one copy launch takes (its `p_descs` parameter: 3072 bytes, within the 4 KiB of
/// parameters every device takes).
pub const COPY_MAX: usize = 128;

/// Bytes of one copy descriptor: destination, source, length word (little-endian u64 each).
pub const COPY_DESC_BYTES: usize = 24;

/// Length word flag of a copy descriptor: everything before this descriptor in the launch lands
/// first, for every observer; the descriptors between two such flags land together (an epoch).
pub const DESC_FENCE: usize = 1 << 63;
/// Length word flag of a copy descriptor: an atomic on the 4- or 8-byte word at the destination
/// instead of a copy; the operand in the source field, the size in bits 0-7, the [`AmoOp`] (not
/// [`AmoOp::Cas`]) in bits 8-15.
pub const DESC_AMO: usize = 1 << 62;

/// The bytes a copy descriptor's length word moves (0 for an atomic).
pub const fn desc_len(word: usize) -> usize {
    if word & DESC_AMO != 0 {
        0
    } else {
        word & 0xffff_ffff
    }
}

/// A descriptor applying `op` with operand `val` to the `size`-byte word at `dst` (no
/// compare-and-swap: the kernel does not return values).
pub const fn amo_desc(dst: u64, op: AmoOp, size: u32, val: u64) -> (u64, u64, usize) {
    (
        dst,
        val,
        DESC_AMO | ((op as usize) << 8) | (size as usize & 0xff),
    )
}

// The copy kernel's parameters (slot, count, descriptors) stay within the 4 KiB every device takes.
const _: () = assert!(8 + 8 + COPY_MAX * COPY_DESC_BYTES <= 4096);

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

/// One entry of a module of the library's own PTX, loaded into one context.
#[derive(Debug)]
struct Loaded {
    module: ContextObject,
    func: usize,
}

// SAFETY: module and function handles are process-wide driver handles; every call through them
// pushes the module's context first.
unsafe impl Send for Loaded {}
// SAFETY: as above; launching takes `&self` and the driver serialises launches per stream.
unsafe impl Sync for Loaded {}

impl Loaded {
    /// Loads `ptx` into context `ctx` (0: the current one) and finds `entry`. The driver compiles
    /// the text for the device here, once; call it where no kernel of the application waits on
    /// the library.
    fn load(ctx: usize, ptx: &str, entry: &std::ffi::CStr) -> CudaResult<Loaded> {
        require("cuModuleLoadData")?;
        let name = entry.to_string_lossy();
        let mut text = ptx.as_bytes().to_vec();
        text.push(0);
        let module = ContextObject::create(
            ctx,
            "cuModuleLoadData",
            &format!("cuModuleLoadData({name})"),
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
                sys::cuModuleGetFunction(&mut f, module.handle as sys::CUmodule, entry.as_ptr())
            },
            || format!("cuModuleGetFunction({name})"),
        )?;
        Ok(Loaded {
            module,
            func: f as usize,
        })
    }

    /// Enqueues one launch of `threads` threads in one block on `stream` (of the module's
    /// context).
    ///
    /// # Safety
    /// `params` point at values matching the entry's parameters, in order; what the kernel
    /// touches stays valid until the launch completes.
    unsafe fn launch(
        &self,
        stream: &CopyStream,
        threads: u32,
        params: &mut [*mut c_void],
        what: impl FnOnce() -> String,
    ) -> CudaResult<()> {
        let _g = ContextGuard::enter(self.module.ctx)?;
        // SAFETY: a function of the pushed context, a stream of the same context, and parameter
        // pointers matching the entry's parameters (the caller's contract), read during the call.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.func as sys::CUfunction,
                    1,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    stream.handle(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            what,
        )
    }
}

/// The atomic kernel loaded into one context.
#[derive(Debug)]
pub struct AmoKernel(Loaded);

impl AmoKernel {
    /// Loads [`AMO_PTX`] into context `ctx` (0: the current one) (see [`Loaded::load`]: at
    /// connect).
    pub fn load(ctx: usize) -> CudaResult<AmoKernel> {
        Loaded::load(ctx, AMO_PTX, AMO_ENTRY).map(AmoKernel)
    }

    /// The context the kernel is loaded in.
    pub fn context(&self) -> usize {
        self.0.module.ctx
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
        // SAFETY: seven pointers matching the entry's seven parameters; the caller vouches for
        // the memory.
        unsafe {
            self.0.launch(stream, 1, &mut params, || {
                format!("cuLaunchKernel(nvshmem_efa_amo, {size} bytes at {target:#x})")
            })
        }
    }
}

/// The copy kernel loaded into one context.
#[derive(Debug)]
pub struct CopyKernel(Loaded);

impl CopyKernel {
    /// Loads [`COPY_PTX`] into context `ctx` (0: the current one) (see [`Loaded::load`]: where the
    /// software queue is created).
    pub fn load(ctx: usize) -> CudaResult<CopyKernel> {
        Loaded::load(ctx, COPY_PTX, COPY_ENTRY).map(CopyKernel)
    }

    /// The context the kernel is loaded in.
    pub fn context(&self) -> usize {
        self.0.module.ctx
    }

    /// Enqueues one launch (one block of [`COPY_THREADS`]) on `stream` moving `copies`
    /// ((destination, source, length); at most [`COPY_MAX`]), passed in the launch's parameters.
    ///
    /// # Safety
    /// `slot` is the device address of 32 bytes of mapped pinned host memory, zero; it and every
    /// range of `copies` (device-accessible memory) stay valid until the launch completes.
    pub unsafe fn launch(
        &self,
        stream: &CopyStream,
        slot: u64,
        copies: &[(u64, u64, usize)],
    ) -> CudaResult<()> {
        assert!(
            copies.len() <= COPY_MAX,
            "at most {COPY_MAX} copies per launch"
        );
        let mut descs = [0u64; COPY_MAX * COPY_DESC_BYTES / 8];
        for (d, &(dst, src, len)) in descs.chunks_exact_mut(3).zip(copies) {
            d.copy_from_slice(&[dst, src, len as u64]);
        }
        // Bit 31 of the count tells the kernel to look for epochs (DESC_FENCE).
        let fenced = copies.iter().any(|c| c.2 & DESC_FENCE != 0);
        let (mut sl, mut n) = (slot, copies.len() as u32 | if fenced { 1 << 31 } else { 0 });
        let mut params: [*mut c_void; 3] = [
            &mut sl as *mut u64 as *mut c_void,
            &mut n as *mut u32 as *mut c_void,
            descs.as_mut_ptr() as *mut c_void,
        ];
        // SAFETY: three pointers matching the entry's three parameters (the last one 3072 bytes,
        // as `p_descs`); the caller vouches for the memory.
        unsafe {
            self.0.launch(stream, COPY_THREADS, &mut params, || {
                format!("cuLaunchKernel(nvshmem_efa_copy, {} copies)", copies.len())
            })
        }
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
        let dir = std::env::temp_dir().join(format!("kernel-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [("amo", AMO_PTX), ("copy", COPY_PTX)] {
            let src = dir.join(format!("{name}.ptx"));
            std::fs::write(&src, text).unwrap();
            for arch in ["sm_75", "sm_90"] {
                let out = std::process::Command::new(&ptxas)
                    .args([&format!("-arch={arch}"), "-o"])
                    .arg(dir.join(format!("{name}-{arch}.cubin")))
                    .arg(&src)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "ptxas -arch={arch} refused {name}.ptx: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The `.param` lines of `ptx`, which must declare the visible entry `entry`.
    fn ptx_params<'a>(ptx: &'a str, entry: &std::ffi::CStr) -> Vec<&'a str> {
        let entry = entry.to_str().unwrap();
        assert!(ptx.contains(&format!(".visible .entry {entry}(")));
        ptx.lines()
            .map(str::trim)
            .filter(|l| l.starts_with(".param"))
            .collect()
    }

    #[test]
    fn copy_ptx_matches_the_launch() {
        assert_eq!(
            ptx_params(COPY_PTX, COPY_ENTRY),
            [
                ".param .u64 p_slot,",
                ".param .u32 p_count,",
                &format!(
                    ".param .align 8 .b8 p_descs[{}]",
                    COPY_MAX * COPY_DESC_BYTES
                ),
            ]
        );
        assert!(COPY_PTX.contains(&format!(".reqntid {COPY_THREADS}, 1, 1")));
        // Eight warps stride over each epoch's descriptors; descriptors are three u64 words.
        assert!(COPY_PTX.contains(&format!("add.u32 \t%r42, %r42, {};", COPY_THREADS / 32)));
        assert!(COPY_PTX.contains(&format!("mul.wide.u32 \t%rd3, %r42, {COPY_DESC_BYTES};")));
        // The flags the launch and the descriptors carry are the ones the kernel reads: bit 31 of
        // the count, bit 63 (FENCE: negative as a signed word) and bit 62 (AMO) of the length.
        assert!(COPY_PTX.contains("and.b32 \t%r30, %r1, -2147483648;"));
        assert!(COPY_PTX.contains("setp.lt.s64 \t%p10, %rd17, 0;"));
        assert!(COPY_PTX.contains("shr.u64 \t%rd18, %rd7, 62;"));
        assert_eq!((DESC_FENCE, DESC_AMO), (1 << 63, 1 << 62));
        assert_eq!(desc_len(DESC_FENCE | 4096), 4096);
        assert_eq!(desc_len(amo_desc(0, AmoOp::Add, 8, 1).2), 0);
        assert_eq!(
            amo_desc(0x40, AmoOp::Xor, 4, 9),
            (0x40, 9, DESC_AMO | 0x304)
        );
    }

    #[test]
    fn ptx_names_the_entry_and_its_seven_parameters_in_launch_order() {
        assert_eq!(
            ptx_params(AMO_PTX, AMO_ENTRY),
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
        assert!(CopyKernel::load(0).is_err());
        assert!(!native_atomics(0, 1));
        assert!(native_atomics(0, 0));
    }
}
