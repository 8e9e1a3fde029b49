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
