//! Benchmark of the fabric layer between two processes, measured the way fabtests measures raw
//! libfabric so that `tests/bench/fabric_vs_fabtests.sh` can put the two side by side:
//!
//! * `bw`: put bandwidth, like `fi_rma_bw -o write`: both sides write to each other at once, a window
//!   of writes in flight, all of a window's completions reaped before the next window; MB/s is
//!   10^6 bytes per second of this side's writes.
//! * `lat`: write ping-pong, like `fi_rma_pingpong -o write`: each side writes the message to the
//!   peer, whose last byte carries the iteration number, and waits for the peer's write to land by
//!   polling its own buffer; the figure is half the round trip in microseconds.
//!
//! Usage: `fabric-bench --role server|client --provider tcp|shm --addr-dir DIR --test bw|lat
//! --size BYTES [--iters N] [--warmup N] [--window N] [--mode default|plain|inject]`.
//!
//! `--mode` picks how writes are posted: `default` is `Endpoint::write` with the layer's default
//! operation flags (FI_DELIVERY_COMPLETE where granted); `plain` is `Endpoint::write_msg` with no
//! flags (transmit complete, as fabtests without -U); `inject` adds FI_INJECT up to the provider's
//! inject size (as fabtests does; a completion is still reaped for each write). The two processes exchange endpoint names,
//! buffer addresses and keys through files in DIR. Each size prints one line
//! `RESULT provider=.. test=.. size=.. iters=.. value=.. unit=..`.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvshmem_efa_gda::fabric::Error as FabricError;
use nvshmem_efa_gda::fabric::{
    flags, AddressVector, CompletionQueue, CqEntry, Domain, Endpoint, Fabric, FiAddr, Info,
    InfoRequest, MemKind, MemoryRegion, OpContexts, Provider,
};
use std::ffi::c_void;

/// Longest any single wait may take before the benchmark gives up.
const WAIT: Duration = Duration::from_secs(60);
/// Remote writes cycle through a receive area of at most this many bytes.
const MAX_AREA: usize = 64 << 20;
/// Bytes before the receive area: the synchronisation word lives at offset 0.
const HEADER: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Server,
    Client,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Default,
    Plain,
    Inject,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Test {
    Bw,
    Lat,
}

struct Args {
    role: Role,
    provider: Provider,
    dir: PathBuf,
    test: Test,
    size: usize,
    iters: usize,
    warmup: usize,
    window: usize,
    mode: Mode,
}

const USAGE: &str = "usage: fabric-bench --role server|client --provider tcp|shm --addr-dir DIR \
--test bw|lat --size BYTES [--iters N] [--warmup N] [--window N] [--mode default|plain|inject]";

fn parse_args() -> Result<Args, String> {
    let mut role = None;
    let mut provider = None;
    let mut dir = None;
    let mut test = None;
    let mut size = None;
    let mut iters = 1000;
    let mut warmup = 10;
    let mut window = 64;
    let mut mode = Mode::Default;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--role" => {
                role = Some(match value.as_str() {
                    "server" => Role::Server,
                    "client" => Role::Client,
                    other => return Err(format!("unknown role {other}")),
                })
            }
            "--provider" => provider = Some(Provider::parse(&value).map_err(|e| e.to_string())?),
            "--addr-dir" => dir = Some(PathBuf::from(value)),
            "--test" => {
                test = Some(match value.as_str() {
                    "bw" => Test::Bw,
                    "lat" => Test::Lat,
                    other => return Err(format!("unknown test {other}")),
                })
            }
            "--size" => size = Some(num(&value)?),
            "--iters" => iters = num(&value)?,
            "--warmup" => warmup = num(&value)?,
            "--window" => window = num(&value)?,
            "--mode" => {
                mode = match value.as_str() {
                    "default" => Mode::Default,
                    "plain" => Mode::Plain,
                    "inject" => Mode::Inject,
                    other => return Err(format!("unknown mode {other}")),
                }
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    let args = Args {
        role: role.ok_or("--role is required")?,
        provider: provider.ok_or("--provider is required")?,
        dir: dir.ok_or("--addr-dir is required")?,
        test: test.ok_or("--test is required")?,
        size: size.ok_or("--size is required")?,
        iters,
        warmup,
        window,
        mode,
    };
    if args.size == 0 || args.iters == 0 || args.window == 0 {
        return Err("--size, --iters and --window must be positive".into());
    }
    Ok(args)
}

/// One side: endpoint, registered buffer (sync word, receive area, send area), peer coordinates.
struct Side {
    // Declared before the buffer and the contexts so that they close first.
    mr: MemoryRegion,
    ep: Endpoint,
    cq: Arc<CompletionQueue>,
    _av: Arc<AddressVector>,
    ctxs: OpContexts,
    buf: Box<[u64]>,
    area: usize,
    peer: FiAddr,
    peer_base: u64,
    peer_key: u64,
    sync_seq: u64,
    in_flight: usize,
    /// Flags for `write_msg`, or `None` to post with `write` (the layer's default flags).
    flags: Option<u64>,
    entries: Vec<CqEntry>,
}

fn write_atomic(dir: &Path, name: &str, contents: &str) -> Result<(), String> {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    fs::write(&tmp, contents).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    fs::rename(&tmp, dir.join(name)).map_err(|e| format!("rename {name}: {e}"))
}

fn wait_file(dir: &Path, name: &str) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(s) = fs::read_to_string(dir.join(name)) {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out waiting for {}",
                dir.join(name).display()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

impl Side {
    fn open(args: &Args) -> Result<Side, String> {
        let req = InfoRequest {
            provider: args.provider.clone(),
            hmem: false,
            atomics: false,
            msg: false,
        };
        let info = Info::get(&req).map_err(|e| e.to_string())?;
        let fabric = Fabric::open(info).map_err(|e| e.to_string())?;
        let domain = Domain::open(&fabric).map_err(|e| e.to_string())?;
        let av = AddressVector::open(&domain, 2).map_err(|e| e.to_string())?;
        let cq =
            CompletionQueue::open(&domain, 4 * args.window.max(64)).map_err(|e| e.to_string())?;
        let ep = Endpoint::open(&domain, &av, &cq, None).map_err(|e| e.to_string())?;
        let area = match args.test {
            Test::Bw => (args.size * args.window).min(MAX_AREA.max(args.size)),
            Test::Lat => args.size,
        };
        // 8 spare bytes: the sync word is staged at the start of the send area, which may be shorter.
        let bytes = HEADER + 2 * area + 8;
        let buf = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        // SAFETY: `buf` is owned by the Side and declared after `mr`, so it outlives the registration.
        let mr = unsafe {
            MemoryRegion::register(
                &domain,
                buf.as_ptr() as *const u8,
                bytes,
                MemKind::Host,
                true,
                Some(&ep),
            )
        }
        .map_err(|e| e.to_string())?;
        let mut side = Side {
            mr,
            ep,
            cq,
            _av: av,
            ctxs: OpContexts::new(args.window + 8),
            buf,
            area,
            peer: 0,
            peer_base: 0,
            peer_key: 0,
            sync_seq: 0,
            in_flight: 0,
            flags: match args.mode {
                Mode::Default => None,
                Mode::Plain => Some(0),
                Mode::Inject if args.size <= domain.info().inject_size() => Some(flags::INJECT),
                Mode::Inject => Some(0),
            },
            entries: vec![
                CqEntry {
                    op_context: std::ptr::null_mut(),
                    flags: 0,
                    len: 0,
                    buf: std::ptr::null_mut(),
                    data: 0
                };
                64
            ],
        };
        side.exchange(args)?;
        Ok(side)
    }

    fn exchange(&mut self, args: &Args) -> Result<(), String> {
        let me = if args.role == Role::Server {
            "server"
        } else {
            "client"
        };
        let other = if args.role == Role::Server {
            "client"
        } else {
            "server"
        };
        let info = self.ep.domain().info();
        let base = if info.virt_addr() {
            self.base() as u64
        } else {
            0
        };
        let name = self.ep.name().map_err(|e| e.to_string())?;
        write_atomic(
            &args.dir,
            me,
            &format!("{} {} {}\n", hex(&name), base, self.mr.key()),
        )?;
        let rec = wait_file(&args.dir, other)?;
        let f: Vec<&str> = rec.split_whitespace().collect();
        if f.len() != 3 {
            return Err(format!("bad peer record {rec:?}"));
        }
        let addrs = self
            .ep
            .av()
            .insert(&unhex(f[0])?, 1)
            .map_err(|e| e.to_string())?;
        self.peer = addrs[0];
        self.peer_base = f[1].parse().map_err(|e| format!("peer base: {e}"))?;
        self.peer_key = f[2].parse().map_err(|e| format!("peer key: {e}"))?;
        Ok(())
    }

    fn base(&self) -> *mut u8 {
        self.buf.as_ptr() as *mut u8
    }

    /// Local receive area (the peer writes here).
    fn rx(&self) -> *mut u8 {
        // SAFETY: HEADER + area is inside the buffer.
        unsafe { self.base().add(HEADER) }
    }

    /// Local send area.
    fn tx(&self) -> *mut u8 {
        // SAFETY: HEADER + area .. HEADER + 2 * area is inside the buffer.
        unsafe { self.base().add(HEADER + self.area) }
    }

    /// Reaps what the CQ holds; returns how many of our operations completed.
    fn poll(&mut self) -> Result<usize, String> {
        match self.cq.read(&mut self.entries) {
            Ok(n) => {
                for i in 0..n {
                    let ctx = self.entries[i].op_context;
                    if !self.ctxs.free(ctx) {
                        return Err(format!("completion for an unknown context {ctx:p}"));
                    }
                }
                self.in_flight -= n;
                Ok(n)
            }
            Err(e) => Err(format!("completion error: {}", e.error)),
        }
    }

    /// Drives progress until at most `left` operations are in flight.
    fn drain_to(&mut self, left: usize) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        while self.in_flight > left {
            if self.poll()? == 0 && Instant::now() >= deadline {
                return Err(format!(
                    "{} writes still in flight after {WAIT:?}",
                    self.in_flight
                ));
            }
        }
        Ok(())
    }

    /// Posts a write of `len` bytes from local `src` to the peer's receive area at `off`.
    fn write(&mut self, src: *const u8, len: usize, off: usize) -> Result<(), String> {
        let raddr = self.peer_base + (HEADER + off) as u64;
        let deadline = Instant::now() + WAIT;
        let flags = self.flags;
        self.post(
            0,
            deadline,
            |e| format!("{e} for {WAIT:?}"),
            |b, ctx| {
                let desc = b.mr.desc();
                // SAFETY: `src` lies in the registered buffer, which outlives the operation; the
                // context comes from our pool and returns to it when the completion is reaped.
                unsafe {
                    match flags {
                        None => b.ep.write(src, len, desc, b.peer, raddr, b.peer_key, ctx),
                        Some(f) => {
                            b.ep.write_msg(src, len, desc, b.peer, raddr, b.peer_key, ctx, f)
                        }
                    }
                }
            },
        )
    }

    /// Posts one operation through `post` with a context of the pool tagged `tag`, reaping
    /// completions while no context is free or the provider answers `-FI_EAGAIN`; past `deadline`
    /// gives up (`again` words the last EAGAIN). Counts the posted operation in flight.
    fn post(
        &mut self,
        tag: u64,
        deadline: Instant,
        again: impl Fn(&FabricError) -> String,
        post: impl Fn(&Self, *mut c_void) -> Result<(), FabricError>,
    ) -> Result<(), String> {
        loop {
            let Some(ctx) = self.ctxs.alloc(tag, 0) else {
                self.poll()?;
                if Instant::now() >= deadline {
                    return Err("no free operation context".into());
                }
                continue;
            };
            match post(self, ctx) {
                Ok(()) => {
                    self.in_flight += 1;
                    return Ok(());
                }
                Err(e) if e.is_again() => {
                    self.ctxs.free(ctx);
                    self.poll()?;
                    if Instant::now() >= deadline {
                        return Err(again(&e));
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn volatile_byte(&self, p: *const u8) -> u8 {
        // SAFETY: callers pass pointers into the registered buffer.
        unsafe { std::ptr::read_volatile(p) }
    }

    /// Both sides meet: each writes its sequence number into the other's sync word and waits for
    /// the other's to arrive.
    fn sync(&mut self) -> Result<(), String> {
        self.drain_to(0)?;
        self.sync_seq += 1;
        let seq = self.sync_seq;
        let src = self.tx() as *mut u64;
        // SAFETY: the send area holds at least 8 bytes past its start whatever the size (it is
        // followed by nothing else, but HEADER + 2 * area >= HEADER + area + 8 only when area >= 8,
        // so `open` sizes the buffer with room to spare); it need not be aligned.
        unsafe { std::ptr::write_unaligned(src, seq) };
        let raddr = self.peer_base;
        let deadline = Instant::now() + WAIT;
        // Nothing is in flight (drained above), so a context is always free.
        self.post(
            1,
            deadline,
            |e| format!("sync: {e}"),
            |b, ctx| {
                // SAFETY: as in `write`; the sync word is at offset 0 of the peer's registered
                // buffer.
                unsafe {
                    b.ep.write(
                        src as *const u8,
                        8,
                        b.mr.desc(),
                        b.peer,
                        raddr,
                        b.peer_key,
                        ctx,
                    )
                }
            },
        )?;
        self.drain_to(0)?;
        let word = self.base() as *const u64;
        // SAFETY: offset 0 of our own buffer, aligned; the peer writes it remotely.
        while unsafe { std::ptr::read_volatile(word) } < seq {
            self.poll()?;
            if Instant::now() >= deadline {
                return Err("sync: the peer never arrived".into());
            }
        }
        Ok(())
    }

    fn bandwidth(&mut self, args: &Args) -> Result<f64, String> {
        let size = args.size;
        // SAFETY: tx area holds `area` bytes.
        unsafe { std::ptr::write_bytes(self.tx(), 0x5a, self.area) };
        self.sync()?;
        let mut start = Instant::now();
        let mut off = 0;
        let mut j = 0;
        for i in 0..args.warmup + args.iters {
            if i == args.warmup {
                self.drain_to(0)?;
                j = 0;
                start = Instant::now();
            }
            if off + size > self.area {
                off = 0;
            }
            // SAFETY: off + size <= area.
            let src = unsafe { self.tx().add(off) };
            self.write(src, size, off)?;
            off += size;
            j += 1;
            if j == args.window {
                self.drain_to(0)?;
                j = 0;
            }
        }
        self.drain_to(0)?;
        let us = start.elapsed().as_secs_f64() * 1e6;
        // Let the peer finish its own writes to us before either side tears down.
        self.sync()?;
        Ok((size * args.iters) as f64 / us)
    }

    fn latency(&mut self, args: &Args) -> Result<f64, String> {
        let size = args.size;
        let last_rx = self.rx().wrapping_add(size - 1);
        let last_tx = self.tx().wrapping_add(size - 1);
        // SAFETY: both areas hold `size` bytes.
        unsafe {
            std::ptr::write_bytes(self.tx(), 0x5a, size);
            std::ptr::write_volatile(last_rx, 0xff);
        }
        self.sync()?;
        let mut start = Instant::now();
        for i in 0..args.warmup + args.iters {
            if i == args.warmup {
                start = Instant::now();
            }
            let tag = i as u8;
            if args.role == Role::Server {
                self.wait_byte(last_rx, tag)?;
            }
            // SAFETY: last byte of the send area; no write is reading it (the previous one landed
            // at the peer before the peer answered).
            unsafe { std::ptr::write_volatile(last_tx, tag) };
            self.write(self.tx(), size, 0)?;
            if args.role == Role::Client {
                self.wait_byte(last_rx, tag)?;
            }
        }
        let us = start.elapsed().as_secs_f64() * 1e6;
        self.sync()?;
        Ok(us / args.iters as f64 / 2.0)
    }

    fn wait_byte(&mut self, p: *const u8, want: u8) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        let mut spins = 0u32;
        while self.volatile_byte(p) != want {
            self.poll()?;
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 && Instant::now() >= deadline {
                return Err("the peer's write never landed".into());
            }
        }
        Ok(())
    }
}

fn run(args: &Args) -> Result<(), String> {
    let mut side = Side::open(args)?;
    let info = side.ep.domain().info().clone();
    eprintln!(
        "fabric-bench: {:?} provider {} ({}), delivery_complete {}, inject {}, mode {:?}, {:?} {} B x {}",
        args.role,
        info.provider_name(),
        info.fabric_name(),
        info.delivery_complete(),
        info.inject_size(),
        args.mode,
        args.test,
        args.size,
        args.iters
    );
    let (value, unit, test) = match args.test {
        Test::Bw => (side.bandwidth(args)?, "MB/s", "bw"),
        Test::Lat => (side.latency(args)?, "us", "lat"),
    };
    println!(
        "RESULT provider={} test={test} size={} iters={} value={value:.3} unit={unit}",
        args.provider, args.size, args.iters
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-bench ({:?}): {e}", args.role);
            ExitCode::FAILURE
        }
    }
}
