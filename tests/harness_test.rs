//! Host harness runs: `tests/harness/harness.c` drives `libnvshmem_efa_gda.so` the way NVSHMEM's
//! host library does, on several processes without a GPU (see tests/harness/README.md).
//!
//! Every configuration (ABI 3 to 7 x provider x number of PEs x AMO path) is one harness
//! invocation running all cases; a run must exit 0, print `N passed, 0 failed` and a `PASS` line
//! for every case that applies to its ABI. A missing provider fails the run (CI builds libfabric
//! with tcp and shm). `harness_reports_injected_faults` checks that the harness itself catches
//! wrong data, crashes, hangs and out-of-step collectives, through a fault-injection shim.
//!
//! Runs are serialised (CI machines have few cores and every PE spins a progress thread); each run
//! is killed after 180 s.
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const RUN_LIMIT: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn work_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("harness");
    std::fs::create_dir_all(&d).expect("create the harness build directory");
    d
}

fn compile(out: &Path, extra_front: &[&str], src: &str) -> Result<PathBuf, String> {
    let src = repo().join(src);
    let mut cmd = Command::new("cc");
    cmd.args(extra_front)
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(&src)
        .arg("-ldl");
    let o = cmd.output().map_err(|e| format!("cannot run cc: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "compiling {} failed ({}):\n{}{}",
            src.display(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(out.to_path_buf())
}

/// `cc -O1 -g -Wall -Werror -o <tmp>/harness tests/harness/harness.c -ldl`, once.
fn harness_bin() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(|| compile(&work_dir().join("harness"), &[], "tests/harness/harness.c")) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn fault_shim() -> &'static Path {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match LIB.get_or_init(|| {
        compile(
            &work_dir().join("fault_shim.so"),
            &["-shared", "-fPIC"],
            "tests/harness/fault_shim.c",
        )
    }) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// The cdylib cargo built with this test binary: `cargo test` leaves it in `<target>/<profile>/deps`
/// (current for this run); `cargo build` copies it up to `<target>/<profile>`.
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("the test binary lives in <target>/<profile>/deps");
    let candidates = [
        deps.join("libnvshmem_efa_gda.so"),
        deps.parent().unwrap_or(deps).join("libnvshmem_efa_gda.so"),
    ];
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => p.clone(),
        None => panic!(
            "libnvshmem_efa_gda.so not found (looked at {} and {}): the crate must build its cdylib",
            candidates[0].display(),
            candidates[1].display()
        ),
    }
}

struct Outcome {
    status: Option<ExitStatus>,
    timed_out: bool,
    elapsed: Duration,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn report(&self) -> String {
        const TAIL: usize = 16 * 1024;
        let err = if self.stderr.len() > TAIL {
            let mut cut = self.stderr.len() - TAIL;
            while !self.stderr.is_char_boundary(cut) {
                cut += 1;
            }
            format!("[... {} bytes cut ...]\n{}", cut, &self.stderr[cut..])
        } else {
            self.stderr.clone()
        };
        format!(
            "exit status: {:?}{}, {:.1} s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            if self.timed_out {
                " (killed at the time limit)"
            } else {
                ""
            },
            self.elapsed.as_secs_f64(),
            self.stdout,
            err
        )
    }

    /// The final line of rank 0, exactly `N passed, 0 failed`.
    fn clean_summary(&self) -> bool {
        self.stdout.lines().any(|l| {
            l.trim_end()
                .strip_suffix(" passed, 0 failed")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Runs the harness with `args`; `env`: Some(value) sets, None removes.
fn run_harness(args: &[OsString], env: &[(&str, Option<&str>)], limit: Duration) -> Outcome {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(harness_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Own process group: on timeout the harness and all its ranks go together.
    cmd.process_group(0);
    let lf = repo().join(".deps/libfabric/lib");
    if lf.is_dir() {
        let mut v = lf.into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", v);
    }
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", harness_bin().display()));
    let pid = child.id();
    let out_rx = reader(child.stdout.take().expect("piped stdout"));
    let err_rx = reader(child.stderr.take().expect("piped stderr"));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(_) => break None,
        }
        if start.elapsed() > limit {
            timed_out = true;
            kill_group(pid);
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let grab = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(10))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|_| "<output still held open by a leftover process>".into())
    };
    let stdout = grab(out_rx);
    if stdout.starts_with("<output still held") {
        kill_group(pid);
    }
    let stderr = grab(err_rx);
    Outcome {
        status,
        timed_out,
        elapsed,
        stdout,
        stderr,
    }
}

/// Cases the harness runs for `abi` (`harness --list --abi N`).
fn cases_for(abi: u32) -> Vec<String> {
    let o = Command::new(harness_bin())
        .args(["--list", "--abi", &abi.to_string()])
        .output()
        .expect("harness --list");
    assert!(o.status.success(), "harness --list failed: {o:?}");
    let v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert!(v.len() >= 10, "harness --list gave {v:?}");
    v
}

/// One configuration: every case must pass.
fn expect_pass(abi: u32, np: u32, provider: &str, atomics: Option<&str>) {
    expect_pass_with(abi, np, provider, atomics, false, &[]);
}

/// `manual_progress`: the library's progress thread off (`NVSHMEM_EFA_PROGRESS_THREAD=0`) and the
/// harness calling `progress` from a thread of its own, as NVSHMEM's proxy thread does.
fn expect_pass_with(
    abi: u32,
    np: u32,
    provider: &str,
    atomics: Option<&str>,
    manual_progress: bool,
    extra: &[(&str, &str)],
) {
    let lib = cdylib();
    let mut args: Vec<OsString> = vec![
        "--lib".into(),
        lib.into_os_string(),
        "--abi".into(),
        abi.to_string().into(),
        "--np".into(),
        np.to_string().into(),
    ];
    if manual_progress {
        args.push("--proxy-progress".into());
    }
    // tcp stays on the loopback interface unless the caller chose another.
    let tcp_iface = std::env::var("FI_TCP_IFACE").unwrap_or_else(|_| "lo".to_string());
    let mut env = vec![
        ("FI_TCP_IFACE", Some(tcp_iface.as_str())),
        ("NVSHMEM_LIBFABRIC_PROVIDER", Some(provider)),
        ("NVSHMEM_EFA_GDA", Some("off")),
        ("NVSHMEM_EFA_ATOMICS", atomics),
        ("NVSHMEM_EFA_QUIET_TIMEOUT_MS", Some("20000")),
        (
            "NVSHMEM_EFA_PROGRESS_THREAD",
            Some(if manual_progress { "0" } else { "1" }),
        ),
    ];
    // Later entries override earlier ones of the same name.
    env.retain(|(k, _)| !extra.iter().any(|(x, _)| x == k));
    env.extend(extra.iter().map(|(k, v)| (*k, Some(*v))));
    let what = format!(
        "ABI {abi}, provider {provider}, {np} PEs{}{}{}",
        atomics
            .map(|a| format!(", NVSHMEM_EFA_ATOMICS={a}"))
            .unwrap_or_default(),
        if manual_progress {
            ", progress only from the harness's proxy thread"
        } else {
            ""
        },
        extra
            .iter()
            .map(|(k, v)| format!(", {k}={v}"))
            .collect::<String>()
    );
    let out = run_harness(&args, &env, RUN_LIMIT);
    let mut problems = Vec::new();
    if out.timed_out {
        problems.push(format!("killed after {} s", RUN_LIMIT.as_secs()));
    }
    if !out.status.is_some_and(|s| s.success()) {
        problems.push("non-zero exit status".to_string());
    }
    if !out.clean_summary() {
        problems.push("no `N passed, 0 failed` line".to_string());
    }
    for case in cases_for(abi) {
        let want = format!("PASS {case} abi={abi} np={np}");
        if !out.stdout.lines().any(|l| l.trim_end() == want) {
            problems.push(format!("no `{want}` line"));
        }
    }
    if !problems.is_empty() {
        panic!(
            "harness run ({what}) failed: {}\n{}",
            problems.join("; "),
            out.report()
        );
    }
    eprintln!(
        "harness run ({what}): all cases passed in {:.1} s",
        out.elapsed.as_secs_f64()
    );
}

#[test]
fn abi3_tcp_np2() {
    expect_pass(3, 2, "tcp", None);
}
#[test]
fn abi3_tcp_np4() {
    expect_pass(3, 4, "tcp", None);
}
#[test]
fn abi3_shm_np2() {
    expect_pass(3, 2, "shm", None);
}
#[test]
fn abi3_shm_np3() {
    expect_pass(3, 3, "shm", None);
}
#[test]
fn abi3_tcp_target_atomics_np3() {
    expect_pass(3, 3, "tcp", Some("target"));
}
#[test]
fn abi3_tcp_provider_atomics_np3() {
    expect_pass(3, 3, "tcp", Some("provider"));
}
#[test]
fn abi4_tcp_np2() {
    expect_pass(4, 2, "tcp", None);
}
#[test]
fn abi4_tcp_np4() {
    expect_pass(4, 4, "tcp", None);
}
#[test]
fn abi4_shm_np2() {
    expect_pass(4, 2, "shm", None);
}
#[test]
fn abi4_shm_np3() {
    expect_pass(4, 3, "shm", None);
}
#[test]
fn abi4_tcp_target_atomics_np3() {
    expect_pass(4, 3, "tcp", Some("target"));
}
#[test]
fn abi4_tcp_provider_atomics_np3() {
    expect_pass(4, 3, "tcp", Some("provider"));
}
#[test]
fn abi4_tcp_manual_progress_np3() {
    expect_pass_with(4, 3, "tcp", None, true, &[]);
}
/// Every put and get through the staged protocol that carries GPU memory on software providers.
// ABI 5 (NVSHMEM 3.6.x), 6 (3.7.x) and 7 (3.8.x): 2 PEs on each software provider (the v4 cases
// cover the shared ops; 6 and 7 call amo/put_signal with the 20-byte verb, 7 checks the new ops).
#[test]
fn abi5_tcp_np2() {
    expect_pass(5, 2, "tcp", None);
}
#[test]
fn abi5_shm_np2() {
    expect_pass(5, 2, "shm", None);
}
#[test]
fn abi6_tcp_np2() {
    expect_pass(6, 2, "tcp", None);
}
#[test]
fn abi6_shm_np2() {
    expect_pass(6, 2, "shm", None);
}
#[test]
fn abi7_tcp_np2() {
    expect_pass(7, 2, "tcp", None);
}
#[test]
fn abi7_shm_np2() {
    expect_pass(7, 2, "shm", None);
}

#[test]
fn abi3_shm_staged_np3() {
    expect_pass_with(
        3,
        3,
        "shm",
        None,
        false,
        &[("NVSHMEM_EFA_GPU_STAGING", "1")],
    );
}
#[test]
fn abi4_tcp_staged_np2() {
    expect_pass_with(
        4,
        2,
        "tcp",
        None,
        false,
        &[("NVSHMEM_EFA_GPU_STAGING", "1")],
    );
}
/// shm's own atomics (non-fetching ones issued as fetching, see the transport).
#[test]
fn abi4_shm_provider_atomics_np3() {
    expect_pass(4, 3, "shm", Some("provider"));
}
/// The transport with its software EFA queue set up beside it, as under NVSHMEM.
#[test]
fn abi3_shm_with_gda_np2() {
    expect_pass_with(3, 2, "shm", None, false, &[("NVSHMEM_EFA_GDA", "auto")]);
}

/// The harness must turn each injected fault into a failure: a `FAIL` line naming the case, a
/// non-zero exit, no clean summary, and all of it in bounded time.
#[test]
fn harness_reports_injected_faults() {
    let lib = cdylib();
    let shim = fault_shim();
    // (fault, ABI, cases, what stdout must contain)
    let faults: [(&str, u32, &[&str], &[&str]); 5] = [
        (
            "drop_put",
            3,
            &["put"],
            &["FAIL put abi=3 np=2: ", "4096-byte transfer"],
        ),
        (
            "wrong_add",
            4,
            &["amo", "contention"],
            &["FAIL amo abi=4 np=2: ", "FAIL contention abi=4 np=2: "],
        ),
        (
            "crash_rma",
            3,
            &["put"],
            &[
                "FAIL put abi=3 np=2: rank 1: crashed (signal 11)",
                "killed by signal 11",
            ],
        ),
        (
            "hang_quiet",
            4,
            &["put_nbi"],
            &["FAIL put_nbi abi=4 np=2: rank 1: timed out after 5 s"],
        ),
        ("stray_barrier", 3, &["put"], &["FAIL connect abi=3 np=2: "]),
    ];
    let mut problems = Vec::new();
    for (fault, abi, cases, must) in faults {
        let mut args: Vec<OsString> = vec![
            "--lib".into(),
            shim.as_os_str().to_os_string(),
            "--abi".into(),
            abi.to_string().into(),
            "--np".into(),
            "2".into(),
            "--case-timeout".into(),
            "5".into(),
        ];
        for c in cases {
            args.push("--case".into());
            args.push((*c).into());
        }
        let env = [
            ("HARNESS_SHIM_REAL", Some(lib.to_str().expect("utf-8 path"))),
            ("HARNESS_SHIM_FAULT", Some(fault)),
            ("NVSHMEM_LIBFABRIC_PROVIDER", Some("tcp")),
            ("NVSHMEM_EFA_GDA", Some("off")),
            ("NVSHMEM_EFA_ATOMICS", None),
            ("NVSHMEM_EFA_QUIET_TIMEOUT_MS", Some("3000")),
        ];
        let out = run_harness(&args, &env, Duration::from_secs(90));
        let mut bad = Vec::new();
        if out.timed_out {
            bad.push("the harness itself hung".to_string());
        }
        if out.status.is_none_or(|s| s.success()) {
            bad.push("exit status 0".to_string());
        }
        if out.clean_summary() {
            bad.push("printed a clean summary".to_string());
        }
        for m in must {
            if !out.stdout.contains(m) {
                bad.push(format!("no `{m}` in stdout"));
            }
        }
        if !bad.is_empty() {
            problems.push(format!(
                "fault {fault}: {}\n{}",
                bad.join("; "),
                out.report()
            ));
        } else {
            eprintln!(
                "fault {fault}: reported in {:.1} s",
                out.elapsed.as_secs_f64()
            );
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// `NVSHMEM_EFA_BENCH_NULL=1` (benchmarks only) through the real ABI: puts on the host endpoint
/// still move data (`put` passes), puts and gets through the proxy endpoint complete without data
/// (`proxy_put_get` fails its byte checks), and the library warns at init and, with the count, at
/// finalize.
#[test]
fn bench_null_completes_proxy_rma_without_data() {
    let lib = cdylib();
    let args: Vec<OsString> = vec![
        "--lib".into(),
        lib.into_os_string(),
        "--abi".into(),
        "4".into(),
        "--np".into(),
        "2".into(),
        "--case".into(),
        "put".into(),
        "--case".into(),
        "proxy_put_get".into(),
    ];
    let env = [
        ("FI_TCP_IFACE", Some("lo")),
        ("NVSHMEM_LIBFABRIC_PROVIDER", Some("tcp")),
        ("NVSHMEM_EFA_GDA", Some("off")),
        ("NVSHMEM_EFA_BENCH_NULL", Some("1")),
        ("NVSHMEM_EFA_LOG", Some("warn")),
    ];
    let out = run_harness(&args, &env, RUN_LIMIT);
    let has = |prefix: &str| out.stdout.lines().any(|l| l.starts_with(prefix));
    assert!(!out.timed_out, "timed out\n{}", out.report());
    assert!(
        has("PASS put abi=4 np=2"),
        "host-endpoint puts must still move data\n{}",
        out.report()
    );
    assert!(
        has("FAIL proxy_put_get abi=4 np=2"),
        "proxy-endpoint puts and gets must not move data\n{}",
        out.report()
    );
    assert!(
        out.stderr
            .contains("NVSHMEM_EFA_BENCH_NULL=1: BENCHMARK MODE:"),
        "no warning at init\n{}",
        out.report()
    );
    let counts: Vec<u64> = out
        .stderr
        .lines()
        .filter_map(|l| l.split("BENCHMARK MODE ended: ").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts.iter().any(|&n| n > 0),
        "want one finalize warning per rank with operations counted, got {counts:?}\n{}",
        out.report()
    );
}
