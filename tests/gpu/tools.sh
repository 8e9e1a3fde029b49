# Shared by tests/gpu/run.sh and tests/gpu_gda/run.sh: locating nvcc, NVSHMEM and MPI.
# Sourced, not run. Uses the caller's globals: repo (repository root) and compile_only (0/1: prefer
# the repository's PyPI wheels from .ci/setup-cuda.sh).

venv_nvidia() { # the repository's PyPI CUDA/NVSHMEM wheels (.ci/setup-cuda.sh), if present
    local d
    for d in "$repo"/.deps/cuda-venv/lib/python3*/site-packages/nvidia; do
        [ -d "$d" ] && { echo "$d"; return 0; }
    done
    return 1
}

find_nvcc() {
    local c v
    if [ $compile_only = 1 ] && v=$(venv_nvidia) && [ -x "$v/cu13/bin/nvcc" ]; then
        echo "$v/cu13/bin/nvcc"
        return 0
    fi
    for c in "${NVCC:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "$(command -v nvcc 2>/dev/null)" \
        /usr/local/cuda/bin/nvcc /usr/local/cuda-13*/bin/nvcc; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    if v=$(venv_nvidia) && [ -x "$v/cu13/bin/nvcc" ]; then
        echo "$v/cu13/bin/nvcc"
        return 0
    fi
    return 1
}

# need_device_lib (caller's global, default 1): 0 when prebuilt programs run (--bin-dir), so a
# runtime-only NVSHMEM (tests/gpu/pack_carry.sh: no libnvshmem_device.a) is accepted.
nvshmem_ok() {
    [ -f "$1/include/nvshmem.h" ] && [ -f "$1/lib/libnvshmem_host.so.3" ] &&
        { [ "${need_device_lib:-1}" = 0 ] || [ -f "$1/lib/libnvshmem_device.a" ]; }
}

find_nvshmem() {
    local d py v
    if [ -n "${NVSHMEM_HOME:-}" ]; then
        nvshmem_ok "$NVSHMEM_HOME" && { echo "$NVSHMEM_HOME"; return 0; }
        echo "NVSHMEM_HOME=$NVSHMEM_HOME lacks include/nvshmem.h, lib/libnvshmem_host.so.3 or" \
            "lib/libnvshmem_device.a" >&2
        return 1
    fi
    if [ $compile_only = 1 ] && v=$(venv_nvidia) && nvshmem_ok "$v/nvshmem"; then
        echo "$v/nvshmem"
        return 0
    fi
    for py in "${PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python3}" python3 python; do
        [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
        d=$(
            timeout 30 "$py" - 2>/dev/null <<'PY'
import os, sys
cands = []
try:
    import nvidia.nvshmem as m
    cands += list(getattr(m, "__path__", None) or [])
    if getattr(m, "__file__", None):
        cands.append(os.path.dirname(m.__file__))
except Exception:
    pass
cands += [os.path.join(p, "nvidia", "nvshmem") for p in sys.path if p]
for d in cands:
    if os.path.isfile(os.path.join(d, "include", "nvshmem.h")) and \
       os.path.isfile(os.path.join(d, "lib", "libnvshmem_host.so.3")):
        print(os.path.realpath(d))
        break
PY
        )
        [ -n "$d" ] && nvshmem_ok "$d" && { echo "$d"; return 0; }
    done
    if v=$(venv_nvidia) && nvshmem_ok "$v/nvshmem"; then
        echo "$v/nvshmem"
        return 0
    fi
    # Last resort: a bounded search of the file system for the wheel's layout; a 3.4.x first.
    local found=() f best=""
    mapfile -t found < <(timeout 60 find / \( -path /proc -o -path /sys -o -path /dev \) -prune \
        -o -type f -name libnvshmem_host.so.3 -path '*/nvidia/nvshmem/lib/*' -print 2>/dev/null)
    for f in "${found[@]}"; do
        d=$(dirname "$(dirname "$f")")
        nvshmem_ok "$d" || continue
        [ -z "$best" ] && best=$d
        if [ "$(nvshmem_version "$d")" = 3.4.5 ]; then best=$d; break; fi
    done
    [ -n "$best" ] && { echo "$best"; return 0; }
    return 1
}

nvshmem_version() { # DIR -> e.g. 3.4.5
    sed -n 's/^#define NVSHMEM_VENDOR_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
        "$1/include/non_abi/nvshmem_version.h" 2>/dev/null | paste -sd. -
}

nvshmem_transport_major() { # DIR -> the transport ABI major its plugins use (3 for 3.4.x ... 7 for 3.8.x)
    sed -n 's/^#define NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION \([0-9]*\).*/\1/p' \
        "$1/include/non_abi/nvshmem_version.h" 2>/dev/null | head -n 1
}

mpi_to_nvcc() {
    local tok a parts
    for tok in $1; do
        case "$tok" in
        -I* | -D* | -L* | -l*) echo "$tok" ;;
        -pthread) printf '%s\n' -Xcompiler -pthread ;;
        -Wl,*)
            IFS=, read -ra parts <<<"${tok#-Wl,}"
            for a in "${parts[@]}"; do printf '%s\n' -Xlinker "$a"; done
            ;;
        *) printf '%s\n' -Xcompiler "$tok" ;;
        esac
    done
}
