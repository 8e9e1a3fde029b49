//! Every environment variable the library reads, parsed and validated once.
//!
//! NVSHMEM's own variables keep their meaning (`NVSHMEM_LIBFABRIC_PROVIDER`, `NVSHMEM_DEBUG`); the
//! library's own are `NVSHMEM_EFA_*`. docs/environment.md has the table. One exception is read elsewhere:
//! `NVSHMEM_EFA_CUDA_MODULE_LOADING`, in the load-time hook of [`crate::cuda::module_loading`] (it
//! runs before anything else, when only the raw environment is safe to read).
use std::fmt;
use std::time::Duration;

use crate::fabric::Provider;

/// GPU Direct Async mode (`NVSHMEM_EFA_GDA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdaMode {
    /// Hardware queues when the provider's GDA ops answer, the software queue otherwise.
    Auto,
    /// Hardware queues or fail.
    Hw,
    /// Software queue always.
    Soft,
    /// No GDA.
    Off,
}

/// How AMOs are executed (`NVSHMEM_EFA_ATOMICS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicsPath {
    /// Provider atomics where the provider has them for the memory kind, else target-applied.
    Auto,
    /// Provider atomics only (error where there are none).
    Provider,
    /// Always apply at the target through active messages (no provider atomics, no GDRCopy).
    Target,
}

/// What `fence` does (`NVSHMEM_EFA_FENCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// Orders without waiting where the route can: the staged path's next message to the PE
    /// carries the fence and its target applies it only after everything before it; other
    /// routes wait only for what does not share their order (see `transport::fence`).
    Order,
    /// Every fence is a quiet towards the PE (waits until everything before it completed).
    Quiet,
}

/// The parsed configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// `NVSHMEM_LIBFABRIC_PROVIDER`: a provider, or `None` for the automatic order.
    pub provider: Option<Provider>,
    /// `NVSHMEM_EFA_GDA`.
    pub gda: GdaMode,
    /// `NVSHMEM_EFA_ATOMICS`.
    pub atomics: AtomicsPath,
    /// `NVSHMEM_EFA_QUIET_TIMEOUT_MS`: how long quiet/fence wait for outstanding operations.
    pub quiet_timeout: Duration,
    /// `NVSHMEM_EFA_PROGRESS_THREAD`: run a background thread that drives libfabric progress.
    pub progress_thread: bool,
    /// `NVSHMEM_EFA_MAX_INFLIGHT`: operations in flight per endpoint.
    pub max_inflight: usize,
    /// `NVSHMEM_EFA_ALLOW_VMM`: register CUDA VMM memory even where the provider's CUDA IPC path
    /// cannot export it (shm).
    pub allow_vmm: bool,
    /// `NVSHMEM_EFA_SQ_DEPTH`: software queue send ring depth (power of two).
    pub sq_depth: u32,
    /// `NVSHMEM_EFA_MAX_BATCH`: software queue doorbell batch limit.
    pub max_batch: u32,
    /// `NVSHMEM_EFA_SQ_ENTRY_SIZE`: software queue send-ring entry size, 64 or 128 (the size
    /// efa-direct picks on devices with 80 bytes of inline room).
    pub sq_entry_size: u32,
    /// `NVSHMEM_EFA_SOFT_RX_OVERWRITE`: the software queue's RX ring overwrites entries the GPU has
    /// not consumed, as the NIC's RX CQ does (it never sees the consumer index), instead of holding
    /// new entries back.
    pub soft_rx_overwrite: bool,
    /// `NVSHMEM_EFA_SOFT_RX_CREDITS`: the software queue holds a receive while its completion waits
    /// for RX ring room, as the hardware receive path does (senders then wait), instead of
    /// buffering completions without bound.
    pub soft_rx_credits: bool,
    /// `NVSHMEM_EFA_SOFT_IPC`: the software queue executes RDMA writes (without immediate) and reads
    /// whose peer range is mapped in this process (same-host peers, CUDA IPC) as copies: `kernel`
    /// (default; also `1`/`on`/`true`): a round's small copies in one launch of the library's copy
    /// kernel, taken over by the host route when it cannot start, larger ones as the host route
    /// moves them; `host`: two copy-engine hops through a pinned host bounce ring; `0`: they take
    /// the message path. (`direct`, one device-to-device copy, was removed: it deadlocks behind a
    /// kernel holding every SM; the value is refused with an error saying so.)
    pub soft_ipc: crate::gda::softq::CopyRoute,
    /// `NVSHMEM_EFA_SOFT_KERNEL_STUCK_US`: how long a copy kernel launch of
    /// `NVSHMEM_EFA_SOFT_IPC=kernel` may stay unstarted before the host takes its copies over
    /// (default 2000).
    pub soft_kernel_stuck: Duration,
    /// `NVSHMEM_EFA_SOFT_KERNEL_AHEAD`: copy kernel launches of `NVSHMEM_EFA_SOFT_IPC=kernel`
    /// undecided at once before the next round waits and gathers more copies (1 to 64, default
    /// 1).
    pub soft_kernel_ahead: usize,
    /// `NVSHMEM_EFA_SOFT_WATCHDOG_MS`: a software-queue consumer thread that has not finished a
    /// loop pass for this long is reported (warning; it is blocked inside a call: a CUDA copy or
    /// wait, the provider), and again when it goes on. 0: no watchdog (default 5000).
    pub soft_watchdog: Duration,
    /// `NVSHMEM_EFA_SOFT_THREADS`: consumer threads of the software queue (1 to 16, default 1):
    /// ring `r` is served by thread `r % T`; thread 0 alone uses the endpoint
    /// (docs/softq-threads.md).
    pub soft_threads: usize,
    /// Not from the environment (tests): where CUDA is not usable, the host thread that stands in
    /// for the copy kernel starts each launch this long after it was made.
    pub soft_kernel_host_delay: Duration,
    /// `NVSHMEM_EFA_SOFT_IPC_BOUNCE`: bytes of the bounce ring of `NVSHMEM_EFA_SOFT_IPC=host`
    /// (default 32 MiB); a larger copy takes the message path.
    pub soft_ipc_bounce: usize,
    /// `NVSHMEM_EFA_SOFT_NULL`: benchmark mode of the software queue: WQEs are completed with success
    /// after the request id and phase checks, without moving data (the GPU's post rate).
    pub soft_null: bool,
    /// `NVSHMEM_EFA_BENCH_NULL`: benchmark mode of the transport (`src/capi/bench_null.rs`): every
    /// RMA (put, get), put-with-signal and non-fetching atomic NVSHMEM's proxy issues (the proxy
    /// endpoint) completes at once without moving data, so NVSHMEM's own proxy ceiling can be timed.
    /// Host-initiated operations, fetching atomics and NVSHMEM's barrier signals
    /// (`NVSHMEMI_AMO_SIGNAL`, `ACK`) still run, so the job keeps synchronising. Logged as a
    /// warning at init and at finalize (with the count). Default off.
    pub bench_null: bool,
    /// `NVSHMEM_EFA_SOFT_UNORDERED_US`: a model of the fabric's lack of order (tests): the software
    /// queue issues every RDMA write this many microseconds after it took it, while the WQEs after
    /// it go on, so a SEND can overtake the writes before it as on SRD. 0 (default): off.
    pub soft_unordered: Duration,
    /// `NVSHMEM_EFA_GPU_STAGING`: `None` (auto): GPU memory moves by staged messages with
    /// non-blocking-stream copies on software providers, through FI_HMEM on NIC providers;
    /// `Some(true)`: every transfer is staged, host memory too (exercises the path without a GPU);
    /// `Some(false)`: never staged.
    pub gpu_staging: Option<bool>,
    /// `NVSHMEM_EFA_DMABUF`: how GPU memory handed to the provider is registered. `None` (auto): by
    /// dmabuf where the provider's NIC maps GPU memory that way (efa, efa-direct), else by address;
    /// `Some(true)`: by dmabuf on every provider with FI_HMEM (libfabric's utility providers accept
    /// it as an address range: runs the dmabuf path on shm and tcp); `Some(false)`: by address.
    pub dmabuf: Option<bool>,
    /// `NVSHMEM_EFA_IPC`: same-host GPU memory through CUDA IPC copies (`auto`) or never (`0`).
    pub ipc: crate::mover::IpcMode,
    /// `NVSHMEM_EFA_COPY_OVERLAP`: copies of the mover and of the software queue go through
    /// `cuMemcpyBatchAsync` with the overlap-with-compute hint where the driver has it (default), or
    /// through `cuMemcpyAsync` only (`0`).
    pub copy_overlap: bool,
    /// `NVSHMEM_EFA_COPY_BATCH`: same-host copies an endpoint's copy queue holds back to hand to
    /// the copy engine as one submission (default 64; `0` or `1`: each copy is submitted at once).
    /// Held copies go at quiet, fence, a blocking operation, 256 KiB held, or 20 us after the
    /// oldest (progress).
    pub copy_batch: usize,
    /// `NVSHMEM_EFA_COPY_KERNEL`: a batch of small same-host copies between GPU memory goes as one
    /// launch of the library's copy kernel instead of a copy-engine submission (default on; `0`:
    /// the copy engine alone). A launch that has not started within 2 ms (a kernel of the
    /// application holds every SM) is taken over and its copies go to the copy engine.
    pub copy_kernel: bool,
    /// `NVSHMEM_EFA_STAGE_SLOTS`: send slots (64 KiB each) per endpoint for the staged path:
    /// chunks and get answers in flight (default 32, at most the provider's transmit queue
    /// depth); receive buffers are twice as many (at most the receive queue depth).
    pub stage_slots: usize,
    /// `NVSHMEM_EFA_GET_WINDOW`: operations to one peer outstanding on an endpoint below which a
    /// long staged get posts its next chunk's request (`None`, the default: the endpoint's receive
    /// buffers, twice its send slots; `Some(0)`: no bound, every request at once).
    pub get_window: Option<usize>,
    /// `NVSHMEM_EFA_SIGNAL_COPY`: signals (`SIGNAL`, `SIGNAL_SET`) to same-host GPU memory as one
    /// write on the copy queue behind the puts (default), or always through the provider's
    /// atomics (`0`).
    pub signal_copy: bool,
    /// `NVSHMEM_EFA_FENCE`: `order` (default) or `quiet` ([`FenceMode`]).
    pub fence: FenceMode,
    /// `NVSHMEM_EFA_AMO_KERNEL`: every atomic (fetching or not) to same-host GPU memory as a
    /// one-thread kernel of the library's on a stream ordered after the puts (`1`), or through the
    /// provider's atomics (default). Off by default:
    /// an atomic whose kernel cannot start in time is taken over by the host, and that one is not
    /// atomic against other PEs' kernel atomics on the same word (see `mover::amo`).
    pub amo_kernel: bool,
    /// `NVSHMEM_EFA_AMO_KERNEL_STUCK_US`: how long such a kernel may stay unstarted before the
    /// host takes its atomic over (the application's kernels hold every SM).
    pub amo_kernel_stuck: Duration,
}

/// A bad environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Variable name.
    pub var: &'static str,
    /// Offending value.
    pub value: String,
    /// What was expected.
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}='{}' is not valid: expected {}",
            self.var, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// The values `NVSHMEM_EFA_SOFT_IPC` takes.
const SOFT_IPC_VALUES: &str = "0, kernel (or 1) or host";
/// What `NVSHMEM_EFA_SOFT_IPC=direct` is told.
const SOFT_IPC_DIRECT_REMOVED: &str = "0, kernel (or 1) or host; the direct route was removed \
     (its device-to-device copies never start while a kernel holds every SM: a persistent kernel \
     waiting for them deadlocks); kernel, the default, moves small copies in one launch";

fn parse_bool(var: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "y" | "yes" | "true" | "on" => Ok(true),
        "0" | "n" | "no" | "false" | "off" => Ok(false),
        _ => Err(ConfigError {
            var,
            value: v.into(),
            expected: "a boolean (1/0, yes/no, true/false)",
        }),
    }
}

/// The value `v` names among `choices` (`(spelling, value)` pairs; case and surrounding blanks are
/// ignored); otherwise an error that says what was `expected`.
fn parse_choice<T: Copy>(
    var: &'static str,
    v: &str,
    choices: &[(&str, T)],
    expected: &'static str,
) -> Result<T, ConfigError> {
    let key = v.trim().to_ascii_lowercase();
    choices
        .iter()
        .find(|(name, _)| *name == key)
        .map(|&(_, value)| value)
        .ok_or_else(|| ConfigError {
            var,
            value: v.into(),
            expected,
        })
}

/// The number `v` holds if it lies in `min..=max` and passes `ok`; otherwise an error that says what
/// was `expected`.
fn parse_u64(
    var: &'static str,
    v: &str,
    (min, max): (u64, u64),
    ok: fn(u64) -> bool,
    expected: &'static str,
) -> Result<u64, ConfigError> {
    match v.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) && ok(n) => Ok(n),
        _ => Err(ConfigError {
            var,
            value: v.into(),
            expected,
        }),
    }
}

/// Reads variables by name and parses them, so that each variable is named once.
struct Vars<F>(F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
    }

    /// `var` as a number in `range` (see [`parse_u64`]), if set.
    fn u64(
        &self,
        var: &'static str,
        range: (u64, u64),
        ok: fn(u64) -> bool,
        expected: &'static str,
    ) -> Result<Option<u64>, ConfigError> {
        self.get(var)
            .map(|v| parse_u64(var, &v, range, ok, expected))
            .transpose()
    }

    /// `var` as one of `choices` (see [`parse_choice`]), if set.
    fn choice<T: Copy>(
        &self,
        var: &'static str,
        choices: &[(&str, T)],
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.get(var)
            .map(|v| parse_choice(var, &v, choices, expected))
            .transpose()
    }

    /// `var` as a boolean, if set.
    fn bool(&self, var: &'static str) -> Result<Option<bool>, ConfigError> {
        self.get(var).map(|v| parse_bool(var, &v)).transpose()
    }
}

fn any(_: u64) -> bool {
    true
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses from any lookup function (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let vars = Vars(&get);
        let mut c = Config {
            provider: None,
            gda: GdaMode::Auto,
            atomics: AtomicsPath::Auto,
            quiet_timeout: Duration::from_secs(60),
            progress_thread: true,
            max_inflight: 4096,
            allow_vmm: false,
            sq_depth: 1024,
            max_batch: 32,
            sq_entry_size: 64,
            soft_rx_overwrite: false,
            soft_rx_credits: false,
            soft_ipc: crate::gda::softq::CopyRoute::Kernel,
            soft_ipc_bounce: crate::gda::softq::DEFAULT_BOUNCE_BYTES,
            copy_overlap: true,
            copy_batch: 64,
            copy_kernel: true,
            stage_slots: crate::nvshmem::transport::STAGE_SLOTS_DEFAULT,
            get_window: None,
            signal_copy: true,
            fence: FenceMode::Order,
            amo_kernel: false,
            amo_kernel_stuck: Duration::from_millis(10),
            soft_kernel_stuck: Duration::from_millis(2),
            soft_kernel_host_delay: Duration::ZERO,
            soft_kernel_ahead: 1,
            soft_watchdog: Duration::from_secs(5),
            soft_threads: 1,
            soft_null: false,
            bench_null: false,
            soft_unordered: Duration::ZERO,
            gpu_staging: None,
            dmabuf: None,
            ipc: crate::mover::IpcMode::Auto,
        };
        if let Some(v) = get("NVSHMEM_LIBFABRIC_PROVIDER") {
            if !v.trim().is_empty() && v.trim() != "auto" {
                c.provider = Some(Provider::parse(&v).map_err(|_| ConfigError {
                    var: "NVSHMEM_LIBFABRIC_PROVIDER",
                    value: v.clone(),
                    expected: "efa, efa-direct, verbs, cxi, tcp, shm or auto",
                })?);
            }
        }
        let modes = [
            ("auto", GdaMode::Auto),
            ("", GdaMode::Auto),
            ("hw", GdaMode::Hw),
            ("soft", GdaMode::Soft),
            ("off", GdaMode::Off),
            ("0", GdaMode::Off),
        ];
        if let Some(m) = vars.choice("NVSHMEM_EFA_GDA", &modes, "auto, hw, soft or off")? {
            c.gda = m;
        }
        let paths = [
            ("auto", AtomicsPath::Auto),
            ("", AtomicsPath::Auto),
            ("provider", AtomicsPath::Provider),
            ("target", AtomicsPath::Target),
        ];
        if let Some(p) = vars.choice("NVSHMEM_EFA_ATOMICS", &paths, "auto, provider or target")? {
            c.atomics = p;
        }
        if let Some(ms) = vars.u64(
            "NVSHMEM_EFA_QUIET_TIMEOUT_MS",
            (1, 86_400_000),
            any,
            "milliseconds, 1 to 86400000",
        )? {
            c.quiet_timeout = Duration::from_millis(ms);
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_PROGRESS_THREAD")? {
            c.progress_thread = b;
        }
        if let Some(n) = vars.u64(
            "NVSHMEM_EFA_MAX_INFLIGHT",
            (16, 1 << 20),
            any,
            "16 to 1048576",
        )? {
            c.max_inflight = n as usize;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_ALLOW_VMM")? {
            c.allow_vmm = b;
        }
        if let Some(d) = vars.u64(
            "NVSHMEM_EFA_SQ_DEPTH",
            (2, 32768),
            u64::is_power_of_two,
            "a power of two from 2 to 32768",
        )? {
            c.sq_depth = d as u32;
        }
        if let Some(v) = get("NVSHMEM_EFA_GPU_STAGING") {
            c.gpu_staging = match v.trim().to_ascii_lowercase().as_str() {
                "auto" | "" => None,
                _ => Some(
                    parse_bool("NVSHMEM_EFA_GPU_STAGING", &v).map_err(|_| ConfigError {
                        var: "NVSHMEM_EFA_GPU_STAGING",
                        value: v.clone(),
                        expected: "auto, 1 or 0",
                    })?,
                ),
            };
        }
        if let Some(v) = get("NVSHMEM_EFA_DMABUF") {
            c.dmabuf = match v.trim().to_ascii_lowercase().as_str() {
                "auto" | "" => None,
                _ => Some(
                    parse_bool("NVSHMEM_EFA_DMABUF", &v).map_err(|_| ConfigError {
                        var: "NVSHMEM_EFA_DMABUF",
                        value: v.clone(),
                        expected: "auto, 1 or 0",
                    })?,
                ),
            };
        }
        if let Some(v) = get("NVSHMEM_EFA_IPC") {
            c.ipc = crate::mover::IpcMode::parse(&v).ok_or_else(|| ConfigError {
                var: "NVSHMEM_EFA_IPC",
                value: v.clone(),
                expected: "auto or 0",
            })?;
        }
        if let Some(n) = vars.u64("NVSHMEM_EFA_MAX_BATCH", (1, 32768), any, "1 to 32768")? {
            c.max_batch = n as u32;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_COPY_OVERLAP")? {
            c.copy_overlap = b;
        }
        if let Some(n) = vars.u64("NVSHMEM_EFA_COPY_BATCH", (0, 1024), any, "0 to 1024")? {
            c.copy_batch = n as usize;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_COPY_KERNEL")? {
            c.copy_kernel = b;
        }
        if let Some(n) = vars.u64("NVSHMEM_EFA_STAGE_SLOTS", (8, 4096), any, "8 to 4096")? {
            c.stage_slots = n as usize;
        }
        if let Some(n) = vars.u64("NVSHMEM_EFA_GET_WINDOW", (0, 65536), any, "0 to 65536")? {
            c.get_window = Some(n as usize);
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_SIGNAL_COPY")? {
            c.signal_copy = b;
        }
        let fences = [
            ("order", FenceMode::Order),
            ("", FenceMode::Order),
            ("quiet", FenceMode::Quiet),
        ];
        if let Some(f) = vars.choice("NVSHMEM_EFA_FENCE", &fences, "order or quiet")? {
            c.fence = f;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_AMO_KERNEL")? {
            c.amo_kernel = b;
        }
        if let Some(us) = vars.u64(
            "NVSHMEM_EFA_AMO_KERNEL_STUCK_US",
            (0, 60_000_000),
            any,
            "microseconds, 0 to 60000000",
        )? {
            c.amo_kernel_stuck = Duration::from_micros(us);
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_SOFT_RX_OVERWRITE")? {
            c.soft_rx_overwrite = b;
        }
        if let Some(v) = get("NVSHMEM_EFA_SOFT_RX_CREDITS") {
            c.soft_rx_credits = parse_bool("NVSHMEM_EFA_SOFT_RX_CREDITS", &v)?;
        }
        if let Some(v) = get("NVSHMEM_EFA_SOFT_IPC") {
            c.soft_ipc = crate::gda::softq::CopyRoute::parse(&v).ok_or_else(|| ConfigError {
                var: "NVSHMEM_EFA_SOFT_IPC",
                value: v.clone(),
                expected: if v.trim().eq_ignore_ascii_case("direct") {
                    SOFT_IPC_DIRECT_REMOVED
                } else {
                    SOFT_IPC_VALUES
                },
            })?;
        }
        if let Some(us) = vars.u64(
            "NVSHMEM_EFA_SOFT_KERNEL_STUCK_US",
            (0, 60_000_000),
            any,
            "microseconds, 0 to 60000000",
        )? {
            c.soft_kernel_stuck = Duration::from_micros(us);
        }
        if let Some(n) = vars.u64(
            "NVSHMEM_EFA_SOFT_KERNEL_AHEAD",
            (1, crate::mover::kcopy::KSLOTS as u64),
            any,
            "launches, 1 to 64",
        )? {
            c.soft_kernel_ahead = n as usize;
        }
        if let Some(ms) = vars.u64(
            "NVSHMEM_EFA_SOFT_WATCHDOG_MS",
            (0, 3_600_000),
            any,
            "milliseconds, 0 (off) to 3600000",
        )? {
            c.soft_watchdog = Duration::from_millis(ms);
        }
        if let Some(n) = vars.u64(
            "NVSHMEM_EFA_SOFT_THREADS",
            (1, crate::gda::softq::MAX_SOFT_THREADS as u64),
            any,
            "consumer threads, 1 to 16",
        )? {
            c.soft_threads = n as usize;
        }
        if let Some(n) = vars.u64(
            "NVSHMEM_EFA_SOFT_IPC_BOUNCE",
            (crate::gda::softq::MIN_BOUNCE_BYTES as u64, 1 << 34),
            any,
            "bytes, 4096 to 17179869184",
        )? {
            c.soft_ipc_bounce = n as usize;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_SOFT_NULL")? {
            c.soft_null = b;
        }
        if let Some(b) = vars.bool("NVSHMEM_EFA_BENCH_NULL")? {
            c.bench_null = b;
        }
        if let Some(us) = vars.u64(
            "NVSHMEM_EFA_SOFT_UNORDERED_US",
            (0, 10_000_000),
            any,
            "microseconds, 0 to 10000000",
        )? {
            c.soft_unordered = Duration::from_micros(us);
        }
        if let Some(v) = get("NVSHMEM_EFA_SQ_ENTRY_SIZE") {
            c.sq_entry_size = match v.trim() {
                "64" => 64,
                "128" => 128,
                _ => {
                    return Err(ConfigError {
                        var: "NVSHMEM_EFA_SQ_ENTRY_SIZE",
                        value: v,
                        expected: "64 or 128",
                    })
                }
            };
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn sq_entry_size() {
        assert_eq!(cfg(&[]).unwrap().sq_entry_size, 64);
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_SQ_ENTRY_SIZE", "128")])
                .unwrap()
                .sq_entry_size,
            128
        );
        let e = cfg(&[("NVSHMEM_EFA_SQ_ENTRY_SIZE", "96")]).unwrap_err();
        assert_eq!(
            (e.var, e.expected),
            ("NVSHMEM_EFA_SQ_ENTRY_SIZE", "64 or 128")
        );
        type Flag = fn(&Config) -> bool;
        let flags: [(&str, Flag); 4] = [
            ("NVSHMEM_EFA_SOFT_RX_OVERWRITE", |c| c.soft_rx_overwrite),
            ("NVSHMEM_EFA_SOFT_RX_CREDITS", |c| c.soft_rx_credits),
            ("NVSHMEM_EFA_SOFT_NULL", |c| c.soft_null),
            ("NVSHMEM_EFA_BENCH_NULL", |c| c.bench_null),
        ];
        for (var, flag) in flags {
            assert!(!flag(&cfg(&[]).unwrap()), "{var} defaults to off");
            assert!(flag(&cfg(&[(var, "1")]).unwrap()), "{var}=1");
            assert_eq!(cfg(&[(var, "maybe")]).unwrap_err().var, var);
        }
    }

    #[test]
    fn amo_kernel_switch_and_stuck_limit() {
        let c = cfg(&[]).unwrap();
        assert!(!c.amo_kernel, "off by default");
        assert_eq!(c.amo_kernel_stuck, Duration::from_millis(10));
        let c = cfg(&[
            ("NVSHMEM_EFA_AMO_KERNEL", "1"),
            ("NVSHMEM_EFA_AMO_KERNEL_STUCK_US", "0"),
        ])
        .unwrap();
        assert!(c.amo_kernel);
        assert_eq!(c.amo_kernel_stuck, Duration::ZERO);
        let e = cfg(&[("NVSHMEM_EFA_AMO_KERNEL_STUCK_US", "-1")]).unwrap_err();
        assert_eq!(e.var, "NVSHMEM_EFA_AMO_KERNEL_STUCK_US");
        assert!(cfg(&[("NVSHMEM_EFA_AMO_KERNEL", "maybe")]).is_err());
    }

    #[test]
    fn soft_unordered_model() {
        assert_eq!(cfg(&[]).unwrap().soft_unordered, Duration::ZERO);
        let c = cfg(&[("NVSHMEM_EFA_SOFT_UNORDERED_US", "2500")]).unwrap();
        assert_eq!(c.soft_unordered, Duration::from_micros(2500));
        for bad in ["-1", "late", "10000001"] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_UNORDERED_US", bad)]).unwrap_err();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_UNORDERED_US");
        }
    }

    #[test]
    fn soft_kernel_stuck_limit() {
        assert_eq!(
            cfg(&[]).unwrap().soft_kernel_stuck,
            Duration::from_millis(2)
        );
        let c = cfg(&[("NVSHMEM_EFA_SOFT_KERNEL_STUCK_US", "150")]).unwrap();
        assert_eq!(c.soft_kernel_stuck, Duration::from_micros(150));
        for bad in ["-1", "soon", "60000001"] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_KERNEL_STUCK_US", bad)]).unwrap_err();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_KERNEL_STUCK_US", "{bad}");
        }
        assert_eq!(cfg(&[]).unwrap().soft_kernel_ahead, 1);
        assert_eq!(cfg(&[]).unwrap().soft_watchdog, Duration::from_secs(5));
        let c = cfg(&[("NVSHMEM_EFA_SOFT_WATCHDOG_MS", "0")]).unwrap();
        assert_eq!(c.soft_watchdog, Duration::ZERO);
        for bad in ["-5", "never", "3600001"] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_WATCHDOG_MS", bad)]).unwrap_err();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_WATCHDOG_MS", "{bad}");
        }
        let c = cfg(&[("NVSHMEM_EFA_SOFT_KERNEL_AHEAD", "64")]).unwrap();
        assert_eq!(c.soft_kernel_ahead, 64);
        for bad in ["0", "65", "many"] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_KERNEL_AHEAD", bad)]).unwrap_err();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_KERNEL_AHEAD", "{bad}");
        }
        assert_eq!(cfg(&[]).unwrap().soft_threads, 1);
        let c = cfg(&[("NVSHMEM_EFA_SOFT_THREADS", " 16 ")]).unwrap();
        assert_eq!(c.soft_threads, 16);
        for bad in ["0", "17", "-2", "two", ""] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_THREADS", bad)]).unwrap_err();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_THREADS", "{bad}");
            assert!(e.to_string().contains("1 to 16"), "{e}");
        }
    }

    #[test]
    fn fence_mode() {
        assert_eq!(
            cfg(&[]).unwrap().fence,
            FenceMode::Order,
            "order by default"
        );
        let q = cfg(&[("NVSHMEM_EFA_FENCE", "quiet")]).unwrap();
        assert_eq!(q.fence, FenceMode::Quiet);
        let e = cfg(&[("NVSHMEM_EFA_FENCE", "wait")]).unwrap_err();
        assert_eq!(e.var, "NVSHMEM_EFA_FENCE");
    }

    #[test]
    fn signal_copy_switch() {
        assert!(cfg(&[]).unwrap().signal_copy, "on by default");
        assert!(
            !cfg(&[("NVSHMEM_EFA_SIGNAL_COPY", "0")])
                .unwrap()
                .signal_copy
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_SIGNAL_COPY", "perhaps")])
                .unwrap_err()
                .var,
            "NVSHMEM_EFA_SIGNAL_COPY"
        );
    }

    #[test]
    fn copy_kernel_switch() {
        assert!(cfg(&[]).unwrap().copy_kernel, "on by default");
        assert!(
            !cfg(&[("NVSHMEM_EFA_COPY_KERNEL", "0")])
                .unwrap()
                .copy_kernel
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_COPY_KERNEL", "maybe")])
                .unwrap_err()
                .var,
            "NVSHMEM_EFA_COPY_KERNEL"
        );
    }

    #[test]
    fn copy_overlap_switch() {
        assert!(cfg(&[]).unwrap().copy_overlap, "on by default");
        assert_eq!(cfg(&[]).unwrap().copy_batch, 64);
        assert_eq!(cfg(&[]).unwrap().stage_slots, 32);
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_STAGE_SLOTS", "32")])
                .unwrap()
                .stage_slots,
            32
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_STAGE_SLOTS", "4")]).unwrap_err().var,
            "NVSHMEM_EFA_STAGE_SLOTS"
        );
        assert_eq!(cfg(&[]).unwrap().get_window, None);
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_GET_WINDOW", "0")]).unwrap().get_window,
            Some(0)
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_GET_WINDOW", "-1")]).unwrap_err().var,
            "NVSHMEM_EFA_GET_WINDOW"
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_COPY_BATCH", "0")]).unwrap().copy_batch,
            0
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_COPY_BATCH", "1025")]).unwrap_err().var,
            "NVSHMEM_EFA_COPY_BATCH"
        );
        assert!(
            !cfg(&[("NVSHMEM_EFA_COPY_OVERLAP", "0")])
                .unwrap()
                .copy_overlap
        );
        assert!(
            cfg(&[("NVSHMEM_EFA_COPY_OVERLAP", "1")])
                .unwrap()
                .copy_overlap
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_COPY_OVERLAP", "sometimes")])
                .unwrap_err()
                .var,
            "NVSHMEM_EFA_COPY_OVERLAP"
        );
    }

    #[test]
    fn soft_ipc_switch() {
        use crate::gda::softq::CopyRoute;
        let c = cfg(&[]).unwrap();
        assert_eq!(c.soft_ipc, CopyRoute::Kernel, "the copy kernel by default");
        assert_eq!(c.soft_ipc_bounce, 32 << 20);
        for (v, want) in [
            ("0", CopyRoute::Off),
            ("off", CopyRoute::Off),
            ("false", CopyRoute::Off),
            ("host", CopyRoute::Host),
            (" HOST ", CopyRoute::Host),
            ("1", CopyRoute::Kernel),
            ("on", CopyRoute::Kernel),
            ("true", CopyRoute::Kernel),
            ("kernel", CopyRoute::Kernel),
        ] {
            assert_eq!(
                cfg(&[("NVSHMEM_EFA_SOFT_IPC", v)]).unwrap().soft_ipc,
                want,
                "NVSHMEM_EFA_SOFT_IPC={v}"
            );
        }
        for bad in ["sometimes", "2", "device", ""] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_IPC", bad)]).unwrap_err();
            assert_eq!(
                (e.var, e.expected),
                ("NVSHMEM_EFA_SOFT_IPC", "0, kernel (or 1) or host"),
                "{bad:?}"
            );
        }
        // The removed route: refused, naming the values allowed and why it went.
        for old in ["direct", " Direct "] {
            let e = cfg(&[("NVSHMEM_EFA_SOFT_IPC", old)]).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.var, "NVSHMEM_EFA_SOFT_IPC");
            assert!(
                msg.starts_with(&format!(
                    "NVSHMEM_EFA_SOFT_IPC='{old}' is not valid: expected 0, kernel (or 1) or host; \
                     the direct route was removed"
                )),
                "{msg}"
            );
        }
        let c = cfg(&[("NVSHMEM_EFA_SOFT_IPC_BOUNCE", "65536")]).unwrap();
        assert_eq!(c.soft_ipc_bounce, 65536);
        for bad in ["4095", "0", "lots", "17179869185"] {
            assert_eq!(
                cfg(&[("NVSHMEM_EFA_SOFT_IPC_BOUNCE", bad)])
                    .unwrap_err()
                    .var,
                "NVSHMEM_EFA_SOFT_IPC_BOUNCE",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.provider, None);
        assert_eq!(c.gda, GdaMode::Auto);
        assert!(c.progress_thread);
        assert_eq!(c.sq_depth, 1024);
        assert_eq!(c.ipc, crate::mover::IpcMode::Auto);
    }

    #[test]
    fn ipc_switch() {
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_IPC", "0")]).unwrap().ipc,
            crate::mover::IpcMode::Off
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_IPC", "auto")]).unwrap().ipc,
            crate::mover::IpcMode::Auto
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_IPC", "later")]).unwrap_err().var,
            "NVSHMEM_EFA_IPC"
        );
    }

    #[test]
    fn dmabuf_switch() {
        assert_eq!(cfg(&[]).unwrap().dmabuf, None);
        assert_eq!(cfg(&[("NVSHMEM_EFA_DMABUF", "auto")]).unwrap().dmabuf, None);
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_DMABUF", "1")]).unwrap().dmabuf,
            Some(true)
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_DMABUF", "0")]).unwrap().dmabuf,
            Some(false)
        );
        let e = cfg(&[("NVSHMEM_EFA_DMABUF", "peermem")]).unwrap_err();
        assert_eq!(e.var, "NVSHMEM_EFA_DMABUF");
    }

    #[test]
    fn nvshmem_provider_names_and_extensions() {
        for (name, want) in [
            ("efa", Some(Provider::Efa)),
            ("tcp", Some(Provider::Tcp)),
            ("shm", Some(Provider::Shm)),
            ("auto", None),
        ] {
            let got = cfg(&[("NVSHMEM_LIBFABRIC_PROVIDER", name)]).unwrap();
            assert_eq!(got.provider, want, "{name}");
        }
        let e = cfg(&[("NVSHMEM_LIBFABRIC_PROVIDER", "bogus")]).unwrap_err();
        assert_eq!(e.var, "NVSHMEM_LIBFABRIC_PROVIDER");
    }

    #[test]
    fn bad_values_are_rejected_with_the_variable_named() {
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_GDA", "maybe")]).unwrap_err().var,
            "NVSHMEM_EFA_GDA"
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_SQ_DEPTH", "1000")]).unwrap_err().var,
            "NVSHMEM_EFA_SQ_DEPTH"
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_QUIET_TIMEOUT_MS", "0")])
                .unwrap_err()
                .var,
            "NVSHMEM_EFA_QUIET_TIMEOUT_MS"
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_PROGRESS_THREAD", "2")])
                .unwrap_err()
                .var,
            "NVSHMEM_EFA_PROGRESS_THREAD"
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_GDA", "soft")]).unwrap().gda,
            GdaMode::Soft
        );
        assert_eq!(
            cfg(&[("NVSHMEM_EFA_QUIET_TIMEOUT_MS", "250")])
                .unwrap()
                .quiet_timeout,
            Duration::from_millis(250)
        );
    }
}
