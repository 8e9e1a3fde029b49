//! Logging through `tracing`, set up once. `NVSHMEM_DEBUG` keeps NVSHMEM's meaning (VERSION, WARN,
//! INFO, TRACE; ABORT counts as WARN); `NVSHMEM_EFA_LOG` takes a full `tracing` filter and wins.
use std::sync::Once;

static INIT: Once = Once::new();

fn level_from_nvshmem_debug(v: &str) -> &'static str {
    match v.trim().to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "INFO" => "info",
        "" | "VERSION" | "WARN" | "ABORT" => "warn",
        _ => "warn",
    }
}

/// Installs the log subscriber (stderr) once per process; later calls do nothing.
pub fn init() {
    INIT.call_once(|| {
        let filter = std::env::var("NVSHMEM_EFA_LOG").ok().unwrap_or_else(|| {
            let lvl = std::env::var("NVSHMEM_DEBUG")
                .map(|v| level_from_nvshmem_debug(&v))
                .unwrap_or("warn");
            format!("nvshmem_efa_gda={lvl}")
        });
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("nvshmem_efa_gda=warn"));
        // Another subscriber may already be installed by the host program: keep it.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .try_init();
    });
}

/// The message of a panic payload (`panic!` with a literal or a formatted string): what the
/// library's panic boundaries (C entry points, the progress thread, the software-queue consumer)
/// log and report.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvshmem_debug_levels_map() {
        assert_eq!(super::level_from_nvshmem_debug("INFO"), "info");
        assert_eq!(super::level_from_nvshmem_debug("trace"), "trace");
        assert_eq!(super::level_from_nvshmem_debug("WARN"), "warn");
        assert_eq!(super::level_from_nvshmem_debug("ABORT"), "warn");
    }
}
