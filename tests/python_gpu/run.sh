#!/usr/bin/env bash
# Real Python clients on a GPU node, through nvshmem_efa_gda.enable() (no LD_PRELOAD anywhere):
# PyTorch's symmetric memory on its NVSHMEM backend and an nvshmem4py program, each with 2 ranks
# launched by torchrun, each also run on NVSHMEM's own P2P path without the library for reference.
#
#   OUT=<dir> bash tests/python_gpu/run.sh --wheels .gpu/py --libfabric .gpu/libfabric
#
# Steps (each prints PASS/FAIL; logs and CSVs under $OUT/python_gpu/):
#   venv      a venv made by the node's torch python (default /opt/torch/.venv/bin/python) that sees
#             the torch venv's packages (torch, nvidia-nvshmem-cu13 3.4.5 stay the node's), with
#             `pip install --no-index --find-links WHEELS nvshmem-efa-gda nvshmem4py-cu13`
#   env       `python -m nvshmem_efa_gda env` names the transport ABI of the installed NVSHMEM;
#             `nvshmem-efa-gda info` (log only, its exit status reported)
#   torch-library  torchrun, symm_mem_a2a.py --mode library: enable() in each rank,
#             NVSHMEM_DISABLE_P2P=1: nvshmem_all_to_all, all_to_all_vdev checked and timed; the log
#             must show the library's nvshmemt_init in every rank
#   torch-p2p      the same program without the library (NVSHMEM_REMOTE_TRANSPORT=none, P2P on)
#   table     both runs' timings side by side (torch_a2a.csv)
#   nvshmem4py-library / nvshmem4py-p2p   nvshmem4py_check.py: put/get/barriers/host AMOs
# With fewer GPUs than ranks the ranks share a GPU under CUDA MPS (tests/gpu/mps.sh); torch then
# uses a gloo process group (NCCL refuses two ranks on one GPU).
# Exit status: 0 when every step passed, 1 when one failed, 2 on a usage/setup error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() {
    cat <<'EOT'
usage: tests/python_gpu/run.sh --wheels DIR [options]
  --wheels DIR      the carried wheels: nvshmem_efa_gda-*.whl, nvshmem4py_cu13-*.whl and their
                    dependencies (tests/python_gpu/pack.sh makes .gpu/py)
  --libfabric DIR   libfabric >= 2.0 prefix (default $LIBFABRIC_HOME, else .gpu/libfabric)
  --python PY       the torch python (default /opt/torch/.venv/bin/python, else python3)
  --venv DIR        where the venv is made, afresh (default /tmp/nvshmem-efa-gda-pyvenv)
  --ranks N         ranks per job (default 2)
  --provider P      NVSHMEM_LIBFABRIC_PROVIDER for the library runs (default shm)
  --timeout S       seconds per torchrun job (default 120; pip gets 180)
  --only LIST       comma-separated subset of: torch,nvshmem4py (default both)
  --no-ref          skip the P2P reference runs
environment: OUT (default ./gpu-out); NVSHMEM_* / FI_* / NVSHMEM_EFA_* pass through.
EOT
}

wheels=""
fabric=${LIBFABRIC_HOME:-}
PY=""
venv=/tmp/nvshmem-efa-gda-pyvenv
ranks=2
provider=${NVSHMEM_LIBFABRIC_PROVIDER:-shm}
tmo=120
only="torch,nvshmem4py"
do_ref=1
while [ $# -gt 0 ]; do
    case "$1" in
    --wheels) wheels=${2:?--wheels needs a directory}; shift ;;
    --libfabric) fabric=${2:?--libfabric needs a directory}; shift ;;
    --python) PY=${2:?--python needs a path}; shift ;;
    --venv) venv=${2:?--venv needs a directory}; shift ;;
    --ranks) ranks=${2:?--ranks needs a number}; shift ;;
    --provider) provider=${2:?--provider needs a name}; shift ;;
    --timeout) tmo=${2:?--timeout needs seconds}; shift ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --no-ref) do_ref=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

OUT=${OUT:-$PWD/gpu-out}
log=$OUT/python_gpu
mkdir -p "$log" || exit 2
log=$(cd "$log" && pwd)
summary=$log/summary.txt
npass=0
nfail=0
: >"$summary"
say() { echo "[python_gpu] $*" | tee -a "$summary"; }
die() { say "error: $1"; say "$npass passed, $((nfail + 1)) failed"; exit 2; }
result() { # result NAME OK DETAIL
    if [ "${2:-0}" = 0 ]; then npass=$((npass + 1)); say "PASS $1${3:+ ($3)}"
    else nfail=$((nfail + 1)); say "FAIL $1${3:+ ($3)}"; fi
}

case $ranks in '' | *[!0-9]*) die "--ranks must be a number" ;; esac
case $tmo in '' | *[!0-9]*) die "--timeout must be a number" ;; esac
[ -n "$wheels" ] || { usage >&2; die "--wheels is required"; }
[ -d "$wheels" ] || die "--wheels $wheels is not a directory"
wheels=$(cd "$wheels" && pwd)
ls "$wheels"/nvshmem_efa_gda-*.whl >/dev/null 2>&1 || die "no nvshmem_efa_gda-*.whl in $wheels (tests/python_gpu/pack.sh)"
[ -n "$fabric" ] || fabric=$repo/.gpu/libfabric
[ -d "$fabric" ] || die "libfabric prefix $fabric missing (--libfabric; .ci/stage-gpu.sh stages one)"
fabric=$(cd "$fabric" && pwd)
fabric_lib=$fabric/lib
[ -e "$fabric_lib/libfabric.so.1" ] || fabric_lib=$fabric/lib64
[ -e "$fabric_lib/libfabric.so.1" ] || die "no libfabric.so.1 under $fabric/lib or lib64"
if [ -z "$PY" ]; then
    if [ -x /opt/torch/.venv/bin/python ]; then PY=/opt/torch/.venv/bin/python; else PY=$(command -v python3); fi
fi
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (--python)"
command -v timeout >/dev/null || die "timeout (coreutils) not found"

say "python:    $PY ($("$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1))"
say "wheels:    $wheels ($(ls "$wheels"/*.whl | wc -l) wheels)"
say "libfabric: $fabric_lib"
say "out:       $log"

# ---------------------------------------------------------------- venv
say "--- venv: $venv"
rm -rf "$venv"
{
    # A venv's own python makes a venv whose "system site packages" are the BASE interpreter's, not
    # the torch venv's: in that case a .pth file adds the torch venv's site-packages (after the new
    # venv's own, so what is installed here wins, and the torch venv itself is never written).
    base_sites=$("$PY" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' | sort -u)
    nested=$("$PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
    echo "torch python is a venv: $nested; its site-packages: $base_sites"
    if ! timeout 120 "$PY" -m venv --system-site-packages "$venv"; then
        echo "venv with pip failed (no ensurepip?): making one without pip"
        rm -rf "$venv"
        timeout 120 "$PY" -m venv --system-site-packages --without-pip "$venv"
    fi
} >"$log/venv.log" 2>&1
VPY=$venv/bin/python
if [ ! -x "$VPY" ]; then
    result "venv" 1 "could not create $venv; see $log/venv.log"
    die "no venv"
fi
site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$nested" = 1 ]; then
    for d in $base_sites; do
        echo "import site; site.addsitedir('$d')"
    done >"$site/zz_torch_venv.pth"
fi
{
    if ! "$VPY" -m pip --version; then
        pipwhl=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -n 1)
        [ -n "$pipwhl" ] && timeout 120 "$VPY" "$pipwhl/pip" install --no-index --find-links "$wheels" pip
    fi
    timeout -k 10 180 "$VPY" -m pip install --no-index --disable-pip-version-check \
        --find-links "$wheels" nvshmem-efa-gda nvshmem4py-cu13
} >>"$log/venv.log" 2>&1
rc=$?
"$VPY" - >"$log/venv-contents.txt" 2>&1 <<'EOF'
import importlib.metadata as m, sys
print("sys.path:", *sys.path, sep="\n  ")
for d in ("torch", "nvidia-nvshmem-cu13", "nvshmem4py-cu13", "nvshmem-efa-gda", "cuda-core",
          "cuda-bindings", "cuda-pathfinder", "cuda-python", "numpy", "Cython"):
    try:
        dist = m.distribution(d)
        print(f"{d} {dist.version} at {dist.locate_file('')}")
    except m.PackageNotFoundError:
        print(f"{d} MISSING")
EOF
cat "$log/venv-contents.txt" >>"$log/venv.log"
grep -v '^  \|^sys.path' "$log/venv-contents.txt" | sed 's/^/    /' | tee -a "$summary"
if [ $rc != 0 ]; then
    tail -n 20 "$log/venv.log"
    result "venv: pip install --no-index of the carried wheels" 1 "rc=$rc; see $log/venv.log"
    die "the venv has no nvshmem-efa-gda / nvshmem4py-cu13"
fi
result "venv: pip install --no-index of the carried wheels"
# torch and NVSHMEM must stay the node's (the torch venv's), nothing of them installed here.
own=$("$VPY" - "$site" <<'EOF' 2>&1
import importlib.metadata as m, os, sys
site = os.path.realpath(sys.argv[1])
for d in ("torch", "nvidia-nvshmem-cu13"):
    try:
        loc = os.path.realpath(str(m.distribution(d).locate_file("")))
    except m.PackageNotFoundError:
        print(f"{d} missing"); continue
    if loc == site:
        print(f"{d} installed into the new venv")
EOF
)
[ -z "$own" ]
result "venv: torch and nvidia-nvshmem-cu13 are the torch venv's" $? "$own"
nvshmem_dir=$("$VPY" -c 'import importlib.util as u; print(u.find_spec("nvidia.nvshmem").submodule_search_locations[0])' 2>/dev/null)
nv_version=$("$VPY" -c 'import importlib.metadata as m; print(m.version("nvidia-nvshmem-cu13"))' 2>/dev/null)
[ -n "$nvshmem_dir" ] && [ -d "$nvshmem_dir/lib" ] || die "the venv sees no nvidia.nvshmem package"
say "nvshmem:   $nv_version at $nvshmem_dir"

# ---------------------------------------------------------------- env / info
# LD_LIBRARY_PATH: the libfabric >= 2.0 this library needs (what an EFA installer provides), and
# NVSHMEM's lib/ (cuda.pathfinder, which nvshmem4py uses, looks only in site.getsitepackages(),
# which does not include the torch venv's folder added by the .pth above).
run_env=(env -u LD_PRELOAD -u NVSHMEM_REMOTE_TRANSPORT -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS PYTHONUNBUFFERED=1
    "LD_LIBRARY_PATH=$fabric_lib:$nvshmem_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
[ -d "$fabric_lib/libfabric" ] && run_env+=("FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-$fabric_lib/libfabric}")
abi=$(echo "$nv_version" | awk -F. '$1 == 3 && $2 >= 4 && $2 <= 8 { print $2 - 1 }')
(cd /tmp && "${run_env[@]}" timeout 60 "$VPY" -m nvshmem_efa_gda env) >"$log/env.txt" 2>&1
rc=$?
sed 's/^/    /' "$log/env.txt" | tee -a "$summary"
[ $rc = 0 ] && [ -n "$abi" ] && grep -q "transport ABI $abi," "$log/env.txt" &&
    grep -q "nvshmem_transport_libfabric.so.$abi" "$log/env.txt"
result "python -m nvshmem_efa_gda env: NVSHMEM $nv_version -> transport ABI ${abi:-?}" $?
(cd /tmp && "${run_env[@]}" timeout 60 "$venv/bin/nvshmem-efa-gda" info) >"$log/info.txt" 2>&1
rc=$?
say "nvshmem-efa-gda info: exit status $rc (log $log/info.txt)"
grep -E 'served|found via|libfabric|GDA|driver' "$log/info.txt" | head -n 12 | sed 's/^/    /' | tee -a "$summary"
result "nvshmem-efa-gda info exits 0" $rc
(cd /tmp && "${run_env[@]}" timeout 60 "$VPY" -c 'import nvshmem, nvshmem.core as nv
v = nv.get_version()
print(f"nvshmem4py {nvshmem.__version__} opens NVSHMEM {v.libnvshmem_version}")') >"$log/nvshmem4py-import.txt" 2>&1
rc=$?
tail -n 3 "$log/nvshmem4py-import.txt" | sed 's/^/    /' | tee -a "$summary"
[ $rc = 0 ] && grep -q "opens NVSHMEM $nv_version" "$log/nvshmem4py-import.txt"
result "nvshmem4py imports and opens the torch venv's NVSHMEM $nv_version" $?

# ---------------------------------------------------------------- placement
# shellcheck source=../gpu/mps.sh
source "$repo/tests/gpu/mps.sh"
gpu_placement "$ranks" || die "GPU placement failed: $GPU_LAYOUT"
trap gpu_placement_end EXIT
say "placement: $GPU_LAYOUT"
restart_mps() { # a job killed by timeout leaves its clients in the MPS server, which then refuses
    [ "$GPU_MPS_STARTED" = 1 ] || return 0
    gpu_placement_end
    sleep 2
    gpu_placement "$ranks" >/dev/null || say "warning: MPS did not restart"
}

lib_env=("NVSHMEM_DISABLE_P2P=1" "NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}"
    "NVSHMEM_LIBFABRIC_PROVIDER=$provider" "NVSHMEM_EFA_LOG=${NVSHMEM_EFA_LOG:-nvshmem_efa_gda=info}")
ref_env=("NVSHMEM_REMOTE_TRANSPORT=none" "NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}")

job() { # job NAME ENV... -- PROGRAM ARGS...: torchrun with $ranks ranks; sets job_rc
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local t0; t0=$(date +%s)
    say "run $name: $* (log $log/$name.log)"
    timeout -k 15 "$tmo" "${run_env[@]}" "${GPU_ENV[@]}" "${envs[@]}" \
        "$VPY" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node "$ranks" \
        --max-restarts 0 "$@" >"$log/$name.log" 2>&1
    job_rc=$?
    grep -E '\] (PASS|FAIL)|passed,|time |enable\(\)|Traceback|Error|error' "$log/$name.log" |
        grep -v '^ ' | head -n 80 | sed 's/^/    /' | tee -a "$summary"
    if [ $job_rc = 124 ] || [ $job_rc = 137 ]; then
        say "run $name: TIMEOUT after $tmo s"
        restart_mps
    fi
    [ $job_rc = 0 ] || tail -n 25 "$log/$name.log" | sed 's/^/    | /'
    say "run $name: rc=$job_rc in $(($(date +%s) - t0)) s"
}
lib_init_seen() { # every rank's NVSHMEM called this library's nvshmemt_init
    local n; n=$(grep -c 'nvshmemt_init: transport ABI' "$log/$1.log")
    [ "$n" -ge "$ranks" ]
    result "$1: NVSHMEM initialised the library's transport in every rank" $? "$n of $ranks ranks logged nvshmemt_init"
}

case ",$only," in *,torch,*)
    job torch-library "${lib_env[@]}" -- "$here/symm_mem_a2a.py" --mode library --csv "$log/torch_library.csv"
    result "torch symmetric memory through enable(), P2P off" $job_rc
    lib_init_seen torch-library
    if [ $do_ref = 1 ]; then
        job torch-p2p "${ref_env[@]}" -- "$here/symm_mem_a2a.py" --mode p2p --csv "$log/torch_p2p.csv"
        result "torch symmetric memory on NVSHMEM's P2P path (reference, no library)" $job_rc
    fi
    say "--- timings (nvshmem_all_to_all and all_to_all_vdev, $ranks ranks)"
    "$VPY" "$here/table.py" "$log/torch_a2a.csv" "$log/torch_library.csv" "$log/torch_p2p.csv" 2>&1 |
        tee -a "$summary"
    ;;
esac

case ",$only," in *,nvshmem4py,*)
    job nvshmem4py-library "${lib_env[@]}" -- "$here/nvshmem4py_check.py" --mode library
    result "nvshmem4py put/get/barriers/AMOs through enable(), P2P off" $job_rc
    lib_init_seen nvshmem4py-library
    if [ $do_ref = 1 ]; then
        job nvshmem4py-p2p "${ref_env[@]}" -- "$here/nvshmem4py_check.py" --mode p2p
        result "nvshmem4py on NVSHMEM's P2P path (reference, no library)" $job_rc
    fi
    ;;
esac

gpu_placement_end
trap - EXIT
say "$npass passed, $nfail failed"
[ $nfail = 0 ]
