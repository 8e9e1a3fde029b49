//! RDM endpoints and their data-transfer calls.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use ofi_libfabric_sys::bindgen as fi;

use super::av::AddressVector;
use super::cntr::Counter;
use super::cq::CompletionQueue;
use super::domain::{close_fid, Domain, FiAddr};
use super::error::{check, Result};
use super::handle::EndpointHandle;
use super::types::{AtomicOp, Datatype};

/// Declares `Endpoint` methods that each post one libfabric data-transfer call: the method takes
/// the call's operands (all but the endpoint), makes the call, and turns a failure into an error
/// whose message is the format string after `else` (it may name the method's arguments).
macro_rules! post_calls {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?)
            = $call:ident($($operand:expr),* $(,)?)
            else $($what:expr),+;
    )*) => {$(
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(&self, $($arg: $ty),*) -> Result<()> {
            // SAFETY: the caller upholds this function's contract (see `# Safety`).
            let ret = unsafe { fi::$call(self.raw, $($operand),*) };
            check(ret as i64, || format!($($what),+))
        }
    )*};
}

/// An enabled RDM endpoint bound to an AV, a CQ and a counter.
pub struct Endpoint {
    pub(super) raw: *mut fi::fid_ep,
    av: Arc<AddressVector>,
    cq: Arc<CompletionQueue>,
    /// A receive CQ of its own ([`Endpoint::open_split`]); otherwise `cq` takes both directions.
    rx_cq: Option<Arc<CompletionQueue>>,
    cntr: Option<Arc<Counter>>,
    domain: Arc<Domain>,
}
// SAFETY: FI_THREAD_SAFE endpoint.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Opens an endpoint, binds AV, CQ (transmit and receive) and optionally a counter (counting
    /// transmit, read and write completions), and enables it.
    pub fn open(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        cq: &Arc<CompletionQueue>,
        cntr: Option<&Arc<Counter>>,
    ) -> Result<Endpoint> {
        Self::open_bound(domain, av, cq, None, cntr, 0)
    }

    /// Opens an endpoint named `name` (`fi_setname` before it is enabled: shm names its region
    /// after it), binds AV and CQ (transmit and receive, no counter) and enables it. `name` is a C
    /// string (NUL-terminated).
    pub fn open_named(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        cq: &Arc<CompletionQueue>,
        name: &[u8],
    ) -> Result<Endpoint> {
        if name.last() != Some(&0) {
            return Err(super::error::Error::invalid(
                "fi_setname: name is not NUL-terminated".to_string(),
            ));
        }
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and info.
        let ret = unsafe {
            fi::fi_endpoint(
                domain.raw,
                domain.info().as_ptr(),
                &mut raw,
                ptr::null_mut(),
            )
        };
        check(ret as i64, || "fi_endpoint".to_string())?;
        let ep = Endpoint {
            raw,
            av: av.clone(),
            cq: cq.clone(),
            rx_cq: None,
            cntr: None,
            domain: domain.clone(),
        };
        // SAFETY: the endpoint is open and not yet enabled; the provider copies the name; binding
        // open objects of the same domain.
        unsafe {
            check(
                fi::fi_setname(ep.fid(), name.as_ptr() as *mut c_void, name.len()) as i64,
                || "fi_setname".to_string(),
            )?;
            check(fi::fi_ep_bind(raw, av.fid(), 0) as i64, || {
                "fi_ep_bind(av)".to_string()
            })?;
            check(
                fi::fi_ep_bind(raw, cq.fid(), (fi::FI_TRANSMIT | fi::FI_RECV) as u64) as i64,
                || "fi_ep_bind(cq)".to_string(),
            )?;
            check(fi::fi_enable(raw) as i64, || "fi_enable".to_string())?;
        }
        Ok(ep)
    }

    /// Opens an endpoint with separate transmit and receive CQs (no counter), binds them and the AV,
    /// and enables it.
    pub fn open_split(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        tx_cq: &Arc<CompletionQueue>,
        rx_cq: &Arc<CompletionQueue>,
    ) -> Result<Endpoint> {
        Self::open_split_mode(domain, av, tx_cq, rx_cq, 0)
    }

    /// [`Endpoint::open_split`] with `extra_mode` added to the mode bits of the endpoint's info (and
    /// of its receive attributes), e.g. `FI_RX_CQ_DATA`: the caller posts a receive for every
    /// incoming remote CQ data.
    pub fn open_split_mode(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        tx_cq: &Arc<CompletionQueue>,
        rx_cq: &Arc<CompletionQueue>,
        extra_mode: u64,
    ) -> Result<Endpoint> {
        Self::open_bound(domain, av, tx_cq, Some(rx_cq), None, extra_mode)
    }

    /// Opens an endpoint and binds, in this order, the AV, the CQs (`cq` for both directions, or
    /// `cq` for transmit and `rx_cq` for receive) and the counter, then enables it. `extra_mode` is
    /// added to the mode bits of the info (and of its receive attributes). A failure closes the
    /// endpoint (on drop).
    fn open_bound(
        domain: &Arc<Domain>,
        av: &Arc<AddressVector>,
        cq: &Arc<CompletionQueue>,
        rx_cq: Option<&Arc<CompletionQueue>>,
        cntr: Option<&Arc<Counter>>,
        extra_mode: u64,
    ) -> Result<Endpoint> {
        let info = domain.info().clone();
        if extra_mode != 0 {
            // SAFETY: `info` is our own duplicate; rx_attr is checked for null before it is written.
            unsafe {
                let i = info.as_ptr();
                (*i).mode |= extra_mode;
                if !(*i).rx_attr.is_null() {
                    (*(*i).rx_attr).mode |= extra_mode;
                }
            }
        }
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and info (the provider duplicates the info it keeps).
        let ret = unsafe { fi::fi_endpoint(domain.raw, info.as_ptr(), &mut raw, ptr::null_mut()) };
        check(ret as i64, || "fi_endpoint".to_string())?;
        let ep = Endpoint {
            raw,
            av: av.clone(),
            cq: cq.clone(),
            rx_cq: rx_cq.cloned(),
            cntr: cntr.cloned(),
            domain: domain.clone(),
        };
        ep.bind(av.fid(), 0, "av")?;
        match rx_cq {
            None => ep.bind(cq.fid(), (fi::FI_TRANSMIT | fi::FI_RECV) as u64, "cq")?,
            Some(rx_cq) => {
                ep.bind(cq.fid(), fi::FI_TRANSMIT as u64, "transmit cq")?;
                ep.bind(rx_cq.fid(), fi::FI_RECV as u64, "receive cq")?;
            }
        }
        if let Some(c) = cntr {
            let flags = (fi::FI_SEND | fi::FI_READ | fi::FI_WRITE) as u64;
            ep.bind(c.fid(), flags, "cntr")?;
        }
        // SAFETY: open endpoint with its objects bound.
        check(unsafe { fi::fi_enable(raw) } as i64, || {
            "fi_enable".to_string()
        })?;
        Ok(ep)
    }

    /// `fi_ep_bind` of an open object (`what` names it in the error) of the endpoint's domain.
    fn bind(&self, fid: *mut fi::fid, flags: u64, what: &str) -> Result<()> {
        // SAFETY: open endpoint; `fid` is an open object of the same domain.
        let ret = unsafe { fi::fi_ep_bind(self.raw, fid, flags) };
        check(ret as i64, || format!("fi_ep_bind({what})"))
    }

    /// Raw endpoint name, to be exchanged with peers and inserted into their AVs.
    pub fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf has len bytes.
        let mut ret =
            unsafe { fi::fi_getname(self.fid(), buf.as_mut_ptr() as *mut c_void, &mut len) };
        if ret == -(fi::FI_ETOOSMALL as i32) || (ret != 0 && len > buf.len()) {
            buf.resize(len, 0);
            // SAFETY: buf resized to the length libfabric asked for.
            ret = unsafe { fi::fi_getname(self.fid(), buf.as_mut_ptr() as *mut c_void, &mut len) };
        }
        check(ret as i64, || "fi_getname".to_string())?;
        buf.truncate(len);
        Ok(buf)
    }

    pub(crate) fn fid(&self) -> *mut fi::fid {
        // SAFETY: open endpoint.
        unsafe { &mut (*self.raw).fid }
    }

    /// The raw handle.
    pub fn as_ptr(&self) -> *mut fi::fid_ep {
        self.raw
    }

    /// The AV bound to the endpoint.
    pub fn av(&self) -> &Arc<AddressVector> {
        &self.av
    }

    /// The CQ bound to the endpoint (its transmit CQ when opened with [`Endpoint::open_split`]).
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// The receive CQ (the same as [`Endpoint::cq`] unless opened with [`Endpoint::open_split`]).
    pub fn rx_cq(&self) -> &Arc<CompletionQueue> {
        self.rx_cq.as_ref().unwrap_or(&self.cq)
    }

    /// A non-owning handle of the endpoint (valid while `self` lives).
    pub fn handle(&self) -> EndpointHandle {
        EndpointHandle(self.raw)
    }

    /// The counter bound to the endpoint, if any.
    pub fn counter(&self) -> Option<&Arc<Counter>> {
        self.cntr.as_ref()
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// RDMA write with explicit flags (FI_INJECT, FI_FENCE, FI_DELIVERY_COMPLETE, ...).
    ///
    /// # Safety
    /// As for `write`; with FI_INJECT the buffer may be reused on return.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_msg(
        &self,
        buf: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: the caller upholds this function's contract (see `# Safety`); `buf` is only
        // read by a write.
        unsafe {
            self.rma_msg(
                true,
                buf as *mut u8,
                len,
                desc,
                dest,
                addr,
                key,
                ctx,
                0,
                flags,
            )
        }
    }

    /// Whether the provider supports `op` on `datatype` (non-fetching, fetching, compare forms).
    pub fn atomic_valid(&self, datatype: Datatype, op: AtomicOp) -> (bool, bool, bool) {
        let (datatype, op) = (fi::fi_datatype::from(datatype), fi::fi_op::from(op));
        let mut count = 0usize;
        // SAFETY: queries only.
        unsafe {
            let a = fi::fi_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            let f = fi::fi_fetch_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            let c =
                fi::fi_compare_atomicvalid(self.raw, datatype, op, &mut count) == 0 && count > 0;
            (a, f, c)
        }
    }
}

impl Endpoint {
    post_calls! {
        /// RDMA write of `len` bytes to `(dest, addr, key)`.
        ///
        /// # Safety
        /// `buf` (described by `desc`) and `ctx` must stay valid until the completion is reaped.
        fn write(
            buf: *const u8, len: usize, desc: *mut c_void,
            dest: FiAddr, addr: u64, key: u64, ctx: *mut c_void,
        ) = fi_write(buf.cast(), len, desc, dest, addr, key, ctx)
            else "fi_write({len} bytes to {dest}:{addr:#x})";

        /// RDMA write carrying 64 bits of remote CQ data (the target gets a completion with it).
        ///
        /// # Safety
        /// As for `write`.
        fn write_data(
            buf: *const u8, len: usize, desc: *mut c_void, data: u64,
            dest: FiAddr, addr: u64, key: u64, ctx: *mut c_void,
        ) = fi_writedata(buf.cast(), len, desc, data, dest, addr, key, ctx)
            else "fi_writedata({len} bytes to {dest}:{addr:#x})";

        /// RDMA read of `len` bytes from `(dest, addr, key)` into `buf`.
        ///
        /// # Safety
        /// As for `write`.
        fn read(
            buf: *mut u8, len: usize, desc: *mut c_void,
            dest: FiAddr, addr: u64, key: u64, ctx: *mut c_void,
        ) = fi_read(buf.cast(), len, desc, dest, addr, key, ctx)
            else "fi_read({len} bytes from {dest}:{addr:#x})";

        /// Sends a message.
        ///
        /// # Safety
        /// As for `write`.
        fn send(buf: *const u8, len: usize, desc: *mut c_void, dest: FiAddr, ctx: *mut c_void)
            = fi_send(buf.cast(), len, desc, dest, ctx)
            else "fi_send({len} bytes to {dest})";

        /// Posts a receive buffer (from any source).
        ///
        /// # Safety
        /// As for `write`.
        fn recv(buf: *mut u8, len: usize, desc: *mut c_void, ctx: *mut c_void)
            = fi_recv(buf.cast(), len, desc, u64::MAX, ctx)
            else "fi_recv({len} bytes)";

        /// Non-fetching atomic on one element.
        ///
        /// # Safety
        /// As for `write` (`buf` holds the operand).
        fn atomic(
            buf: *const u8, desc: *mut c_void,
            dest: FiAddr, addr: u64, key: u64, dt: Datatype, op: AtomicOp, ctx: *mut c_void,
        ) = fi_atomic(buf.cast(), 1, desc, dest, addr, key, dt.into(), op.into(), ctx)
            else "fi_atomic(op {}, dt {}, {dest}:{addr:#x})",
                fi::fi_op::from(op), fi::fi_datatype::from(dt);

        /// Fetching atomic on one element; the old value lands in `result`.
        ///
        /// # Safety
        /// As for `write` (`buf` holds the operand, `result` receives the old value).
        fn fetch_atomic(
            buf: *const u8, desc: *mut c_void, result: *mut u8, result_desc: *mut c_void,
            dest: FiAddr, addr: u64, key: u64, dt: Datatype, op: AtomicOp, ctx: *mut c_void,
        ) = fi_fetch_atomic(
                buf.cast(), 1, desc, result.cast(), result_desc,
                dest, addr, key, dt.into(), op.into(), ctx,
            )
            else "fi_fetch_atomic(op {}, dt {}, {dest}:{addr:#x})",
                fi::fi_op::from(op), fi::fi_datatype::from(dt);

        /// Compare-and-swap on one element; the old value lands in `result`.
        ///
        /// # Safety
        /// As for `fetch_atomic`.
        fn compare_atomic(
            buf: *const u8, desc: *mut c_void, compare: *const u8, compare_desc: *mut c_void,
            result: *mut u8, result_desc: *mut c_void,
            dest: FiAddr, addr: u64, key: u64, dt: Datatype, ctx: *mut c_void,
        ) = fi_compare_atomic(
                buf.cast(), 1, desc, compare.cast(), compare_desc, result.cast(), result_desc,
                dest, addr, key, dt.into(), fi::fi_op_FI_CSWAP, ctx,
            )
            else "fi_compare_atomic(dt {}, {dest}:{addr:#x})", fi::fi_datatype::from(dt);
    }
}

/// The iovec of `len` bytes at `buf`.
fn iovec(buf: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    }
}

/// A libfabric message struct (`fi_msg`, `fi_msg_rma`) naming one local segment (`iov`, a
/// `&libc::iovec`, and `desc`, a `&mut` to its descriptor), the peer `dest` and the context `ctx`;
/// every other field zero. The caller keeps what the pointers name alive until the call returns.
macro_rules! one_segment_msg {
    ($ty:ty, $iov:expr, $desc:expr, $dest:expr, $ctx:expr) => {{
        // SAFETY: an all-zero libfabric message struct is valid (null pointers, zero counts).
        let mut msg: $ty = unsafe { std::mem::zeroed() };
        msg.msg_iov = $iov as *const libc::iovec as *const _;
        msg.desc = $desc;
        msg.iov_count = 1;
        msg.addr = $dest;
        msg.context = $ctx;
        msg
    }};
}

impl Endpoint {
    /// `fi_writemsg` (`write`) or `fi_readmsg` with one local and one remote segment, remote CQ data
    /// `data` (sent when `flags` holds [`flags::REMOTE_CQ_DATA`](super::flags::REMOTE_CQ_DATA)) and
    /// `flags`.
    ///
    /// # Safety
    /// `buf` (described by `desc`) must stay valid for `len` bytes, and `ctx` valid, until the
    /// completion is reaped or the endpoint is closed.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rma_msg(
        &self,
        write: bool,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
        data: u64,
        flags: u64,
    ) -> Result<()> {
        let iov = iovec(buf, len);
        let mut d = desc;
        let riov = fi::fi_rma_iov { addr, len, key };
        // Every pointer the message holds (iov, d, riov) outlives the call.
        let mut msg = one_segment_msg!(fi::fi_msg_rma, &iov, &mut d, dest, ctx);
        msg.rma_iov = &riov;
        msg.rma_iov_count = 1;
        msg.data = data;
        // SAFETY: open endpoint; the buffers and context per the contract.
        let ret = unsafe {
            if write {
                fi::fi_writemsg(self.raw, &msg, flags)
            } else {
                fi::fi_readmsg(self.raw, &msg, flags)
            }
        };
        let what = if write { "fi_writemsg" } else { "fi_readmsg" };
        check(ret as i64, || {
            format!("{what}({len} bytes, {dest}:{addr:#x}, flags {flags:#x})")
        })
    }

    /// `fi_sendmsg` of one registered buffer with `flags`.
    ///
    /// # Safety
    /// As for [`Endpoint::rma_msg`].
    pub unsafe fn send_msg(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        dest: FiAddr,
        ctx: *mut c_void,
        flags: u64,
    ) -> Result<()> {
        let iov = iovec(buf, len);
        let mut d = desc;
        // Every pointer the message holds (iov, d) outlives the call.
        let msg = one_segment_msg!(fi::fi_msg, &iov, &mut d, dest, ctx);
        // SAFETY: open endpoint; the buffer and context per the contract.
        let ret = unsafe { fi::fi_sendmsg(self.raw, &msg, flags) };
        check(ret as i64, || {
            format!("fi_sendmsg({len} bytes to {dest}, flags {flags:#x})")
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        close_fid(self.fid(), "ep");
    }
}
