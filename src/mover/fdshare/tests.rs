//! The fd server with ordinary files and pipes (no GPU needed).
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use super::*;

/// A file with `content`, already unlinked (only the descriptor keeps it).
fn temp_file(tag: &str, content: &[u8]) -> File {
    let path = std::env::temp_dir().join(format!(
        "efa-fdshare-{}-{tag}-{:x}",
        std::process::id(),
        random_cookie()
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(content).unwrap();
    f
}

fn pieces_of(f: &File, n: usize) -> Vec<Piece> {
    (0..n)
        .map(|i| Piece {
            offset: (i as u64) << 21,
            len: 1 << 21,
            fd: OwnedFd::from(f.try_clone().unwrap()),
        })
        .collect()
}

const T: Duration = Duration::from_secs(5);

#[test]
fn pieces_round_trip_with_their_descriptors() {
    let srv = FdServer::start().unwrap();
    let f = temp_file("rt", b"shared bytes");
    let ino = f.metadata().unwrap().ino();
    let id = srv.add(pieces_of(&f, 3)).unwrap();
    let got = fetch(srv.pid(), srv.cookie(), id, T).unwrap();
    assert_eq!(got.len(), 3);
    for (i, p) in got.iter().enumerate() {
        assert_eq!((p.offset, p.len), ((i as u64) << 21, 1 << 21));
        let g = File::from(p.fd.try_clone().unwrap());
        assert_eq!(g.metadata().unwrap().ino(), ino, "the same file");
        let mut b = [0u8; 12];
        g.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"shared bytes");
    }
    // A new descriptor, not the server's number.
    assert!(got.iter().all(|p| p.fd.as_raw_fd() != f.as_raw_fd()));
    // Fetched again: same answer.
    assert_eq!(fetch(srv.pid(), srv.cookie(), id, T).unwrap().len(), 3);
}

#[test]
fn exports_larger_than_a_reply_come_in_batches() {
    let srv = FdServer::start().unwrap();
    let f = temp_file("batch", b"x");
    let n = 2 * BATCH + 5;
    let id = srv.add(pieces_of(&f, n)).unwrap();
    let got = fetch(srv.pid(), srv.cookie(), id, T).unwrap();
    assert_eq!(got.len(), n);
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.offset, (i as u64) << 21, "piece {i} in order");
    }
}

#[test]
fn unknown_and_removed_exports_are_not_found() {
    let srv = FdServer::start().unwrap();
    let e = fetch(srv.pid(), srv.cookie(), 777, T).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let f = temp_file("rm", b"x");
    let id = srv.add(pieces_of(&f, 1)).unwrap();
    assert_eq!(srv.exports(), 1);
    assert!(srv.remove(id));
    assert!(!srv.remove(id));
    assert_eq!(srv.exports(), 0);
    let e = fetch(srv.pid(), srv.cookie(), id, T).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    // Empty exports are refused.
    assert!(srv.add(Vec::new()).is_err());
}

/// An export of one piece whose descriptor is the only write end of a pipe: the read end, and the
/// export's id.
fn pipe_export(srv: &FdServer) -> (std::io::PipeReader, u64) {
    let (rd, wr) = std::io::pipe().unwrap();
    let id = srv
        .add(vec![Piece {
            offset: 0,
            len: 1,
            fd: OwnedFd::from(wr),
        }])
        .unwrap();
    (rd, id)
}

#[test]
fn removing_an_export_closes_its_descriptors() {
    let srv = FdServer::start().unwrap();
    let (mut rd, id) = pipe_export(&srv);
    assert!(srv.remove(id));
    // The only write end was the server's: the read end sees end of file.
    let mut b = Vec::new();
    assert_eq!(rd.read_to_end(&mut b).unwrap(), 0);
}

fn raw_connect(srv: &FdServer) -> UnixStream {
    let s = UnixStream::connect_addr(&addr_of(srv.pid(), srv.cookie()).unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s
}

fn read_status(s: &mut UnixStream) -> Option<u32> {
    let mut h = [0u8; REP_HEADER];
    s.read_exact(&mut h).ok()?;
    assert_eq!(u32::from_le_bytes(h[0..4].try_into().unwrap()), REP_MAGIC);
    Some(u32::from_le_bytes(h[4..8].try_into().unwrap()))
}

/// The connection is closed by the server (end of stream, or reset).
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn malformed_requests_get_a_refusal_and_the_connection_closes() {
    let srv = FdServer::start().unwrap();
    let f = temp_file("bad", b"x");
    let id = srv.add(pieces_of(&f, 2)).unwrap();
    let good = Request {
        cookie: srv.cookie(),
        export: id,
        start: 0,
    };
    let mut cases: Vec<(&str, [u8; REQ_BYTES])> = Vec::new();
    cases.push(("garbage", [0x5a; REQ_BYTES]));
    let mut b = encode_request(&good);
    b[4] = 9;
    cases.push(("version", b));
    let mut b = encode_request(&good);
    b[6] = 2;
    cases.push(("op", b));
    let mut b = encode_request(&good);
    b[29] = 1;
    cases.push(("reserved", b));
    cases.push((
        "wrong cookie",
        encode_request(&Request {
            cookie: srv.cookie() ^ 1,
            ..good
        }),
    ));
    cases.push((
        "piece past the end",
        encode_request(&Request { start: 2, ..good }),
    ));
    for (what, req) in cases {
        let mut s = raw_connect(&srv);
        s.write_all(&req).unwrap();
        assert_eq!(
            read_status(&mut s),
            Some(Status::BadRequest as u32),
            "{what}"
        );
        assert!(closed(&mut s), "{what}: connection left open");
    }
    // A short request followed by a close: nothing to answer; the server carries on.
    let mut s = raw_connect(&srv);
    s.write_all(&[1, 2, 3]).unwrap();
    drop(s);
    assert_eq!(fetch(srv.pid(), srv.cookie(), id, T).unwrap().len(), 2);
}

#[test]
fn a_silent_peer_is_dropped_at_the_deadline_and_others_are_served_after() {
    let srv = FdServer::start_with(Duration::from_millis(200)).unwrap();
    let f = temp_file("idle", b"x");
    let id = srv.add(pieces_of(&f, 1)).unwrap();
    let t = Instant::now();
    let mut idle = raw_connect(&srv);
    // Served after the idle one is dropped.
    assert_eq!(fetch(srv.pid(), srv.cookie(), id, T).unwrap().len(), 1);
    assert!(closed(&mut idle), "idle connection still open");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
}

#[test]
fn a_fetch_gives_up_at_its_own_deadline() {
    // A listener that accepts and never answers.
    let cookie = random_cookie();
    let l = UnixListener::bind_addr(&addr_of(std::process::id(), cookie).unwrap()).unwrap();
    let t = Instant::now();
    let e = fetch(std::process::id(), cookie, 1, Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3));
    drop(l);
}

#[test]
fn a_stopped_server_refuses_and_closes_every_export() {
    let srv = FdServer::start().unwrap();
    let (mut rd, id) = pipe_export(&srv);
    let (pid, cookie) = (srv.pid(), srv.cookie());
    let t = Instant::now();
    srv.shutdown();
    srv.shutdown(); // idempotent
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(srv.exports(), 0);
    let mut b = Vec::new();
    assert_eq!(rd.read_to_end(&mut b).unwrap(), 0, "descriptor closed");
    assert!(fetch(pid, cookie, id, T).is_err());
    drop(srv);
    // Dropping without an explicit shutdown stops it as well.
    let srv = FdServer::start().unwrap();
    let (pid, cookie) = (srv.pid(), srv.cookie());
    drop(srv);
    let e = fetch(pid, cookie, 1, T).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
}

#[test]
fn socket_names_carry_pid_and_cookie() {
    assert_eq!(socket_name(42, 0xab), "nvshmem-efa-fd.42.00000000000000ab");
    let a = FdServer::start().unwrap();
    let b = FdServer::start().unwrap();
    assert_ne!(a.cookie(), b.cookie());
    assert_ne!(a.cookie(), 0);
}

#[test]
fn requests_round_trip() {
    let r = Request {
        cookie: 0x0102_0304_0506_0708,
        export: 9,
        start: 64,
    };
    assert_eq!(decode_request(&encode_request(&r)), Some(r));
    assert_eq!(decode_request(&[0; REQ_BYTES]), None);
}
