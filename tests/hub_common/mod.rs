//! The hub shared by the multi-process transport tests (transport_peer_death, transport_load_death):
//! child processes meet in rounds through one Unix socket to the test's parent.
//!
//! Framing: a child sends [tag][payload] (each a u32 length + the bytes); the hub answers every
//! participant of the round with [len u32][the payloads of all participants, in PE order].
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};

/// Writes `parts`, each as a u32 length (little-endian) and its bytes, in one write.
pub fn write_frame(s: &mut UnixStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut buf = Vec::new();
    for p in parts {
        buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
        buf.extend_from_slice(p);
    }
    s.write_all(&buf)
}

/// Reads one length-prefixed chunk.
pub fn read_chunk(s: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut v = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// Child side: the connection to the hub (set once at the child's start).
pub static HUB: OnceLock<Mutex<UnixStream>> = OnceLock::new();
/// Child side: this child's PE (set once at its start; 99 in messages before that).
pub static ME: OnceLock<usize> = OnceLock::new();

/// Ends the child with status 1 and a line naming its PE.
pub fn fail(msg: &str) -> ! {
    eprintln!("PE {}: FAILED: {msg}", ME.get().copied().unwrap_or(99));
    std::process::exit(1);
}

/// A line on stderr naming the child's PE.
pub fn note(msg: &str) {
    eprintln!("PE {}: {msg}", ME.get().copied().unwrap_or(99));
}

/// One round through the hub: returns the concatenated payloads of the round's participants.
pub fn hub_round(tag: &str, payload: &[u8]) -> Vec<u8> {
    let mut s = HUB.get().expect("hub").lock().unwrap();
    if let Err(e) = write_frame(&mut s, &[tag.as_bytes(), payload]) {
        fail(&format!("hub round {tag}: send: {e}"));
    }
    read_chunk(&mut s).unwrap_or_else(|e| fail(&format!("hub round {tag}: receive: {e}")))
}

/// Parent side: serves the library's rounds ("lib") of `participants` until all of them reach the
/// round `tag`, and that round (each child's stream read with `limit`). `Err` says what went wrong:
/// a PE that left, PEs in different rounds, a round other than "lib" or `tag`.
pub fn serve_until(
    streams: &mut [Option<UnixStream>],
    tag: &str,
    participants: &[usize],
    limit: std::time::Duration,
) -> Result<(), String> {
    loop {
        let mut tags = Vec::new();
        let mut payloads = Vec::new();
        for &pe in participants {
            let s = streams[pe].as_mut().expect("stream");
            s.set_read_timeout(Some(limit))
                .map_err(|e| format!("PE {pe}: read timeout: {e}"))?;
            let (t, p) = read_chunk(s)
                .and_then(|t| read_chunk(s).map(|p| (t, p)))
                .map_err(|e| format!("PE {pe} left before round {tag}: {e}"))?;
            tags.push(String::from_utf8_lossy(&t).into_owned());
            payloads.push(p);
        }
        if tags.iter().any(|t| t != &tags[0]) {
            return Err(format!(
                "PEs {participants:?} are in different rounds: {tags:?}"
            ));
        }
        let all: Vec<u8> = payloads.concat();
        for &pe in participants {
            let s = streams[pe].as_mut().expect("stream");
            write_frame(s, &[&all])
                .map_err(|e| format!("reply to PE {pe} in round {}: {e}", tags[0]))?;
        }
        if tags[0] == tag {
            return Ok(());
        }
        if tags[0] != "lib" {
            return Err(format!(
                "PEs reached round {} while {tag} was expected",
                tags[0]
            ));
        }
    }
}

/// Parent side: waits up to `limit` for child `pe` to exit.
pub fn wait_exit(
    child: &mut std::process::Child,
    pe: usize,
    limit: std::time::Duration,
) -> Result<std::process::ExitStatus, String> {
    let t = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) if t.elapsed() < limit => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Ok(None) => return Err(format!("PE {pe} did not exit within {limit:?}")),
            Err(e) => return Err(format!("waiting for PE {pe}: {e}")),
        }
    }
}

/// Parent side: collects a child's stderr in the background (for the failure report).
pub fn capture_stderr(child: &mut std::process::Child) -> std::sync::Arc<Mutex<String>> {
    let out = std::sync::Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("stderr piped");
    let o2 = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            o2.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    out
}

/// Parent side: accepts the connections of `streams.len()` children (each first sends its PE as a
/// u32) within `limit`.
pub fn accept_all(
    listener: &std::os::unix::net::UnixListener,
    streams: &mut [Option<UnixStream>],
    limit: std::time::Duration,
) -> Result<(), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let t = std::time::Instant::now();
    let mut joined = 0;
    while joined < streams.len() {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| format!("accepted stream: {e}"))?;
                let mut id = [0u8; 4];
                s.read_exact(&mut id)
                    .map_err(|e| format!("a PE's first word: {e}"))?;
                let pe = u32::from_le_bytes(id) as usize;
                let slot = streams
                    .get_mut(pe)
                    .ok_or_else(|| format!("a child named PE {pe}"))?;
                *slot = Some(s);
                joined += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t.elapsed() > limit {
                    return Err("PEs did not connect to the hub".into());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    Ok(())
}
