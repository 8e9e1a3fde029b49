//! File descriptors for same-host peers: the fd server of a process and its client.
//!
//! A CUDA VMM allocation is exported as a POSIX file descriptor, which means nothing in another
//! process. The exporting process therefore runs one small server ([`FdServer`]) on an
//! abstract-namespace unix stream socket named after its pid and a random cookie
//! ([`socket_name`]); the name and an export id travel in the memory handle, and a peer asks the
//! server for the export's pieces ([`fetch`]), which come back as `(offset, length)` pairs with the
//! descriptors attached (`SCM_RIGHTS`).
//!
//! Protocol (all integers little-endian). Request, [`REQ_BYTES`] bytes: magic `EFAF`, version u16,
//! op u16 (1: get pieces), the server's cookie u64, export id u64, first piece u32, zero u32.
//! Reply: a [`REP_HEADER`]-byte header (magic, status, total pieces of the export, pieces in this
//! reply, first piece, zero), then `count` entries of offset u64 and length u64, with `count`
//! descriptors attached to the first byte. At most [`BATCH`] pieces per reply; a client asks again
//! from the next piece until it has them all, on the same connection. A bad request gets a reply
//! with [`Status::BadRequest`] and the connection closes.
//!
//! The server serves one connection at a time, each under an overall deadline (a peer that connects
//! and sends nothing is dropped after it), only to processes of the same user (`SO_PEERCRED`), and
//! never panics out of its thread (a panic in a connection is caught and logged).
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bytes of a request.
pub const REQ_BYTES: usize = 32;
/// Bytes of a reply's header.
pub const REP_HEADER: usize = 24;
/// Bytes of one piece entry in a reply.
const ENTRY_BYTES: usize = 16;
/// Most pieces (descriptors) in one reply.
pub const BATCH: usize = 32;
/// Most pieces of one export.
pub const MAX_PIECES: usize = 4096;
/// Default deadline of one connection (server) and of one fetch (client).
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

const REQ_MAGIC: u32 = u32::from_le_bytes(*b"EFAF");
const REP_MAGIC: u32 = u32::from_le_bytes(*b"EFAR");
const VERSION: u16 = 1;
const OP_GET: u16 = 1;
/// Most requests on one connection (enough for [`MAX_PIECES`] in batches).
const MAX_REQUESTS: usize = MAX_PIECES / BATCH + 1;
const REP_MAX: usize = REP_HEADER + BATCH * ENTRY_BYTES;

/// A reply's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// The pieces follow.
    Ok = 0,
    /// No export with that id (released, or never made).
    Unknown = 1,
    /// Malformed request (magic, version, op, cookie, reserved bits, piece index).
    BadRequest = 2,
}

impl Status {
    fn from_u32(v: u32) -> Option<Status> {
        match v {
            0 => Some(Status::Ok),
            1 => Some(Status::Unknown),
            2 => Some(Status::BadRequest),
            _ => None,
        }
    }
}

/// One piece of an export: `len` bytes at `offset` of the exported range, backed by `fd`.
#[derive(Debug)]
pub struct Piece {
    /// Offset in the exported range.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// The descriptor (owned: closed when the piece is dropped).
    pub fd: OwnedFd,
}

/// The abstract socket name of the server of process `pid` with `cookie` (no leading NUL).
pub fn socket_name(pid: u32, cookie: u64) -> String {
    format!("nvshmem-efa-fd.{pid}.{cookie:016x}")
}

fn addr_of(pid: u32, cookie: u64) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(pid, cookie).as_bytes())
}

/// A random cookie (never 0): 8 bytes of `/dev/urandom`, else time and pid mixed.
fn random_cookie() -> u64 {
    let mut b = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let v = match read {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t.rotate_left(17) ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15
        }
    };
    v.max(1)
}

/// What the server thread shares with its owner.
struct Shared {
    cookie: u64,
    io_timeout: Duration,
    exports: Mutex<HashMap<u64, Arc<Vec<Piece>>>>,
    stop: AtomicBool,
}

/// The fd server of this process: serves registered exports to same-host peers until dropped.
pub struct FdServer {
    pid: u32,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    listener: UnixListener,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl FdServer {
    /// Starts a server with the default connection deadline.
    pub fn start() -> io::Result<FdServer> {
        FdServer::start_with(IO_TIMEOUT)
    }

    /// Starts a server whose connections each get `io_timeout` in all.
    pub fn start_with(io_timeout: Duration) -> io::Result<FdServer> {
        let pid = std::process::id();
        let cookie = random_cookie();
        let listener = UnixListener::bind_addr(&addr_of(pid, cookie)?)?;
        let shared = Arc::new(Shared {
            cookie,
            io_timeout,
            exports: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let l = listener.try_clone()?;
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("efa-fd-server".into())
            .spawn(move || serve_loop(&l, &s))?;
        tracing::debug!(
            "fd server listening on @{}",
            socket_name(pid, shared.cookie)
        );
        Ok(FdServer {
            pid,
            shared,
            next_id: AtomicU64::new(1),
            listener,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The process id in the socket name.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The cookie in the socket name (also checked in every request).
    pub fn cookie(&self) -> u64 {
        self.shared.cookie
    }

    /// Offers `pieces` to peers; returns the export id they ask for. The descriptors stay open
    /// until [`FdServer::remove`] or the server's end.
    pub fn add(&self, pieces: Vec<Piece>) -> io::Result<u64> {
        if pieces.is_empty() || pieces.len() > MAX_PIECES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "an export has 1 to {MAX_PIECES} pieces, not {}",
                    pieces.len()
                ),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.exports.lock().insert(id, Arc::new(pieces));
        Ok(id)
    }

    /// Withdraws export `id` and closes its descriptors (once no reply in flight uses them).
    /// False for an unknown id.
    pub fn remove(&self, id: u64) -> bool {
        self.shared.exports.lock().remove(&id).is_some()
    }

    /// Exports offered now.
    pub fn exports(&self) -> usize {
        self.shared.exports.lock().len()
    }

    /// Stops the server: no new connections, the thread joined (after the connection it serves, at
    /// most its deadline), every export closed. Idempotent; also done on drop.
    pub fn shutdown(&self) {
        let Some(t) = self.thread.lock().take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) on the listener's own open descriptor; it wakes a blocked accept.
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
        // In case the wake-up above did not reach accept: one connection of our own.
        let _ = addr_of(self.pid, self.shared.cookie).and_then(|a| UnixStream::connect_addr(&a));
        if t.join().is_err() {
            tracing::warn!("fd server thread ended with a panic");
        }
        self.shared.exports.lock().clear();
        tracing::debug!(
            "fd server @{} stopped",
            socket_name(self.pid, self.cookie())
        );
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve_loop(listener: &UnixListener, shared: &Shared) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((conn, _)) => {
                let served =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(conn, shared)));
                match served {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!("fd server: connection dropped: {e}"),
                    Err(_) => tracing::error!("fd server: a connection's handler panicked"),
                }
            }
            Err(e) => {
                tracing::debug!("fd server: accept: {e}");
                // E.g. out of descriptors: do not spin.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }));
    if r.is_err() {
        tracing::error!("fd server thread panicked; same-host peers cannot open VMM exports now");
    }
}

/// The uid of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the local ucred and updates len.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Reads exactly `buf.len()` bytes by `deadline`; `Ok(false)` on end of stream before the first.
fn read_by(s: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    cookie: u64,
    export: u64,
    start: u32,
}

fn encode_request(r: &Request) -> [u8; REQ_BYTES] {
    let mut b = [0u8; REQ_BYTES];
    b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&OP_GET.to_le_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_le_bytes());
    b[16..24].copy_from_slice(&r.export.to_le_bytes());
    b[24..28].copy_from_slice(&r.start.to_le_bytes());
    b
}

fn decode_request(b: &[u8; REQ_BYTES]) -> Option<Request> {
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(0) != REQ_MAGIC || u16_at(4) != VERSION || u16_at(6) != OP_GET || u32_at(28) != 0 {
        return None;
    }
    Some(Request {
        cookie: u64_at(8),
        export: u64_at(16),
        start: u32_at(24),
    })
}

fn reply_header(status: Status, total: u32, count: u32, start: u32) -> [u8; REP_HEADER] {
    let mut h = [0u8; REP_HEADER];
    h[0..4].copy_from_slice(&REP_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(status as u32).to_le_bytes());
    h[8..12].copy_from_slice(&total.to_le_bytes());
    h[12..16].copy_from_slice(&count.to_le_bytes());
    h[16..20].copy_from_slice(&start.to_le_bytes());
    h
}

/// Serves one connection: requests until the peer closes, errs, or the deadline passes.
fn serve(mut s: UnixStream, shared: &Shared) -> io::Result<()> {
    let deadline = Instant::now() + shared.io_timeout;
    s.set_write_timeout(Some(shared.io_timeout))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let uid = peer_uid(&s)?;
    if uid != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("peer of uid {uid} refused (this process runs as {me})"),
        ));
    }
    for _ in 0..MAX_REQUESTS {
        let mut b = [0u8; REQ_BYTES];
        if !read_by(&mut s, &mut b, deadline)? {
            return Ok(());
        }
        let req = decode_request(&b).filter(|r| r.cookie == shared.cookie);
        let Some(req) = req else {
            send_with_fds(&s, &reply_header(Status::BadRequest, 0, 0, 0), &[])?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "malformed request",
            ));
        };
        let pieces = shared.exports.lock().get(&req.export).cloned();
        let Some(pieces) = pieces else {
            send_with_fds(&s, &reply_header(Status::Unknown, 0, 0, req.start), &[])?;
            continue;
        };
        let total = pieces.len();
        let start = req.start as usize;
        if start >= total {
            send_with_fds(&s, &reply_header(Status::BadRequest, 0, 0, req.start), &[])?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("piece {start} asked of an export of {total}"),
            ));
        }
        let batch = &pieces[start..total.min(start + BATCH)];
        let mut msg = Vec::with_capacity(REP_MAX);
        msg.extend_from_slice(&reply_header(
            Status::Ok,
            total as u32,
            batch.len() as u32,
            req.start,
        ));
        for p in batch {
            msg.extend_from_slice(&p.offset.to_le_bytes());
            msg.extend_from_slice(&p.len.to_le_bytes());
        }
        let fds: Vec<BorrowedFd<'_>> = batch.iter().map(|p| p.fd.as_fd()).collect();
        send_with_fds(&s, &msg, &fds)?;
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "too many requests on one connection",
    ))
}

/// Control buffer for up to [`BATCH`] descriptors (u64 words: cmsghdr alignment).
type CmsgBuf = [u64; 2 + BATCH.div_ceil(2) + 2];

/// Sends `data` with `fds` attached to its first byte (at most [`BATCH`]).
fn send_with_fds(s: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > BATCH || data.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad message"));
    }
    let mut cbuf: CmsgBuf = [0; std::mem::size_of::<CmsgBuf>() / 8];
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: all-zero is a valid msghdr (no name, no control) to fill in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        // SAFETY: CMSG_SPACE is arithmetic on its argument.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
        debug_assert!(space <= std::mem::size_of::<CmsgBuf>());
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points to `space` zeroed, u64-aligned bytes of cbuf, enough for one
        // header with fds.len() descriptors (checked above); CMSG_FIRSTHDR returns its start and
        // CMSG_DATA the data area inside it, where the descriptors are copied.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
            let data = libc::CMSG_DATA(c) as *mut libc::c_int;
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    let sent = loop {
        // SAFETY: msg points to live locals (iov over `data`, cbuf) for the duration of the call.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // The descriptors went with the first byte; the rest (if the socket took less) follows plainly.
    if sent < data.len() {
        let mut w = s;
        w.write_all(&data[sent..])?;
    }
    Ok(())
}

/// Receives into `buf` (some bytes, at least one) and the descriptors attached to them. The
/// descriptors are owned at once, so they are closed on every error path.
fn recv_with_fds(s: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cbuf: CmsgBuf = [0; std::mem::size_of::<CmsgBuf>() / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: all-zero is a valid msghdr to fill in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
    let n = loop {
        // SAFETY: msg points to live locals (iov over `buf`, cbuf) for the duration of the call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_FIRSTHDR/CMSG_NXTHDR walk only
    // within them, and each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors that
    // this process now owns (each is wrapped exactly once).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors truncated (more than a reply may carry)",
        ));
    }
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok((n, fds))
}

/// Fetches export `export` from the server of process `pid` with `cookie`: every piece, with a
/// descriptor of this process, by `timeout`.
pub fn fetch(pid: u32, cookie: u64, export: u64, timeout: Duration) -> io::Result<Vec<Piece>> {
    let deadline = Instant::now() + timeout;
    let mut s = UnixStream::connect_addr(&addr_of(pid, cookie)?)?;
    s.set_write_timeout(Some(timeout))?;
    let mut pieces: Vec<Piece> = Vec::new();
    loop {
        let start = pieces.len() as u32;
        s.write_all(&encode_request(&Request {
            cookie,
            export,
            start,
        }))?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        s.set_read_timeout(Some(left))?;
        let mut buf = [0u8; REP_MAX];
        let (got, fds) = recv_with_fds(&s, &mut buf)?;
        if got < REP_HEADER && !read_by(&mut s, &mut buf[got..REP_HEADER], deadline)? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        if u32_at(&buf, 0) != REP_MAGIC || u32_at(&buf, 20) != 0 {
            return Err(bad("reply with a bad magic".into()));
        }
        let (total, count, first) = (u32_at(&buf, 8), u32_at(&buf, 12), u32_at(&buf, 16));
        match Status::from_u32(u32_at(&buf, 4)) {
            Some(Status::Ok) => {}
            Some(Status::Unknown) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("export {export} unknown to process {pid} (released?)"),
                ))
            }
            Some(Status::BadRequest) => return Err(bad("the server refused the request".into())),
            None => return Err(bad(format!("reply status {}", u32_at(&buf, 4)))),
        }
        let (total, count) = (total as usize, count as usize);
        if first != start
            || count == 0
            || count > BATCH
            || total > MAX_PIECES
            || start as usize + count > total
            || fds.len() != count
        {
            return Err(bad(format!(
                "reply of {count} piece(s) from {first} of {total} with {} descriptor(s) \
                 (asked from {start})",
                fds.len()
            )));
        }
        let end = REP_HEADER + count * ENTRY_BYTES;
        let have = got.max(REP_HEADER);
        if have < end && !read_by(&mut s, &mut buf[have..end], deadline)? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if have > end {
            return Err(bad("reply longer than announced".into()));
        }
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
        for (i, fd) in fds.into_iter().enumerate() {
            let o = REP_HEADER + i * ENTRY_BYTES;
            pieces.push(Piece {
                offset: u64_at(o),
                len: u64_at(o + 8),
                fd,
            });
        }
        if pieces.len() == total {
            return Ok(pieces);
        }
    }
}

#[cfg(test)]
mod tests;
