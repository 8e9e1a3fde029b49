#!/usr/bin/env bash
# Runs the README's GPU quick starts as written, on a GPU node with 2 GPUs: the blocks are read from
# README.md itself (the fenced block after each `<!-- quickstart:NAME -->` marker), so what runs is
# what the README says. Only the environment is the node's (what a user's machine would provide):
#   - a venv that sees the torch venv's packages (torch, nvidia-nvshmem-cu13 3.4.5 stay the node's;
#     the node has no network: pip gets PIP_NO_INDEX=1 and installs the wheel file), with the
#     `torchrun` console script a torch install puts there;
#   - LD_LIBRARY_PATH with a libfabric >= 2.0 (an EFA instance has the EFA installer's) and
#     NVSHMEM's lib/ (for the C++ program, which links libnvshmem_host.so.3);
#   - OpenMPI run as root on one node (OMPI_ALLOW_RUN_AS_ROOT*, the shared-memory BTLs);
#   - ./my_nvshmem_app: a two-line wrapper that runs --app with a per-job NVSHMEM_TESTS_UID_FILE
#     (tests/gpu's programs built without MPI exchange NVSHMEM's unique id through that file);
#   - NVSHMEM_EFA_LOG=nvshmem_efa_gda=info, so the library's `nvshmemt_init` line shows that NVSHMEM
#     loaded it.
#
#   OUT=<dir> bash tests/gpu/quickstart.sh [--wheels DIR] [--libfabric DIR] [--app PATH] [--python PY]
#   bash tests/gpu/quickstart.sh --extract-only DIR     (no GPU: writes the blocks to DIR; CI)
#
#   --wheels DIR     holds nvshmem_efa_gda-0.1.0-py3-none-manylinux_2_34_x86_64.whl (and pip-*.whl when
#                    the node's python has no ensurepip); default .gpu/py (tests/python_gpu/pack.sh)
#   --libfabric DIR  libfabric >= 2.0 prefix (default $LIBFABRIC_HOME, else .gpu/libfabric)
#   --app PATH       the NVSHMEM program the C++ quick start calls ./my_nvshmem_app (default
#                    .gpu/bins-3.4.5/nvshmem_tests: tests/gpu/run.sh --compile-only --save-bins)
#   --python PY      the torch python (default /opt/torch/.venv/bin/python)
# Steps (PASS/FAIL each; logs under $OUT/quickstart/): torch-install, then each line of torch-run
# (both ranks must print "nvshmem_all_to_all ok"; the NVSHMEM_DISABLE_P2P line must also show the
# library's nvshmemt_init in both ranks), then the cxx block (its mpirun lines must exit 0; the
# NVSHMEM_DISABLE_P2P one must show nvshmemt_init). Last line: N passed, N failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
readme=$repo/README.md

# block NAME: the fenced block after the marker `<!-- quickstart:NAME ...-->` (exit 1 if none).
block() {
    awk -v name="$1" '
        $0 ~ "^<!-- quickstart:" name "( [^>]*)? -->$" { armed = 1; next }
        armed && /^```/ { if (inside) { found = 1; exit } inside = 1; next }
        inside { print }
        END { exit !found }' "$readme"
}
# The file name the torch-script marker gives (`<!-- quickstart:torch-script a2a.py -->`).
script_name() { sed -n 's/^<!-- quickstart:torch-script \([^ ]*\) -->$/\1/p' "$readme"; }
BLOCKS="torch-install torch-script torch-run cxx"

extract() { # DIR
    mkdir -p "$1" || return 2
    local b ok=0
    for b in $BLOCKS; do
        if ! block "$b" >"$1/$b.txt" || [ ! -s "$1/$b.txt" ]; then
            echo "README.md: no quick-start block '$b' (marker <!-- quickstart:$b --> + a fenced block)" >&2
            ok=1
        fi
    done
    local s
    s=$(script_name)
    [ -n "$s" ] || { echo "README.md: the torch-script marker names no file" >&2; ok=1; }
    [ -z "$s" ] || cp "$1/torch-script.txt" "$1/$s"
    return $ok
}

wheels=$repo/.gpu/py
fabric=${LIBFABRIC_HOME:-$repo/.gpu/libfabric}
app=$repo/.gpu/bins-3.4.5/nvshmem_tests
PY=/opt/torch/.venv/bin/python
while [ $# -gt 0 ]; do
    case "$1" in
    --extract-only) extract "${2:?--extract-only needs a directory}"; exit $? ;;
    --wheels) wheels=${2:?}; shift ;;
    --libfabric) fabric=${2:?}; shift ;;
    --app) app=${2:?}; shift ;;
    --python) PY=${2:?}; shift ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "quickstart.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done

# The blocks run in a scratch directory: every path given becomes absolute first.
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
wheels=$(abspath "$wheels") fabric=$(abspath "$fabric") app=$(abspath "$app")
OUT=${OUT:-$PWD/gpu-out}
log=$OUT/quickstart
mkdir -p "$log" || exit 2
log=$(cd "$log" && pwd)
summary=$log/summary.txt
: >"$summary"
npass=0
nfail=0
say() { echo "[quickstart] $*" | tee -a "$summary"; }
result() { # NAME STATUS [DETAIL]
    if [ "$2" = 0 ]; then npass=$((npass + 1)); say "PASS $1${3:+ ($3)}"
    else nfail=$((nfail + 1)); say "FAIL $1${3:+ ($3)}"; fi
}
die() { say "error: $1"; say "$npass passed, $((nfail + 1)) failed"; exit 2; }

work=$(mktemp -d /tmp/quickstart.XXXXXX)
trap 'rm -rf "$work"' EXIT
extract "$work/blocks" || die "README.md lacks quick-start blocks"
cp "$work"/blocks/*.txt "$log/"
wheel_name=$(grep -o 'nvshmem_efa_gda-[^ ]*\.whl' "$work/blocks/torch-install.txt" | head -n 1)
[ -f "$wheels/$wheel_name" ] || die "no $wheels/$wheel_name (--wheels; tests/python_gpu/pack.sh builds it)"
fabric_lib=$fabric/lib
[ -e "$fabric_lib/libfabric.so.1" ] || fabric_lib=$fabric/lib64
[ -e "$fabric_lib/libfabric.so.1" ] || die "no libfabric.so.1 under $fabric (--libfabric)"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (--python)"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 2 ] || die "the quick starts run 2 ranks with NCCL: 2 GPUs needed, $ngpu found"

# ---- the environment: a venv that sees the torch venv, pip offline, torchrun in it
venv=$work/venv
{
    "$PY" -m venv --system-site-packages "$venv" || { rm -rf "$venv"; "$PY" -m venv --system-site-packages --without-pip "$venv"; }
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ "$("$PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')" = 1 ]; then
        "$PY" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' |
            sort -u | sed "s|.*|import site; site.addsitedir('&')|" >"$site/zz_torch_venv.pth"
    fi
    if ! "$venv/bin/python" -m pip --version; then
        pipwhl=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -n 1)
        [ -n "$pipwhl" ] && "$venv/bin/python" "$pipwhl/pip" install --no-index "$pipwhl"
    fi
    printf '#!%s\nfrom torch.distributed.run import main\nraise SystemExit(main())\n' "$venv/bin/python" >"$venv/bin/torchrun"
    chmod +x "$venv/bin/torchrun"
} >"$log/venv.log" 2>&1
[ -x "$venv/bin/pip" ] || die "the venv has no pip (see $log/venv.log)"
nvshmem_dir=$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("nvidia.nvshmem").submodule_search_locations[0])' 2>/dev/null)
[ -d "$nvshmem_dir/lib" ] || die "the torch environment has no nvidia-nvshmem-cu13"
export PATH=$venv/bin:$PATH PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$fabric_lib:$nvshmem_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d "$fabric_lib/libfabric" ] && export FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-$fabric_lib/libfabric}
export NVSHMEM_EFA_LOG=nvshmem_efa_gda=info
unset LD_PRELOAD NVSHMEM_REMOTE_TRANSPORT CUDA_MODULE_LOADING CUDA_DEVICE_MAX_CONNECTIONS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_osc=^ucx
say "torch python $PY; NVSHMEM $nvshmem_dir; libfabric $fabric_lib; $ngpu GPUs; logs $log"

# ---- PyTorch
(cd "$wheels" && bash -e "$work/blocks/torch-install.txt") >"$log/torch-install.log" 2>&1
result "torch-install: $(cat "$work/blocks/torch-install.txt")" $?
# count PATTERN FILE: occurrences, not lines (the ranks' prints can share a line).
count() { grep -o "$1" "$2" | wc -l; }
tdir=$work/torch
mkdir -p "$tdir" && cp "$work/blocks/$(script_name)" "$tdir/"
i=0
while IFS= read -r line; do
    [ -n "${line// /}" ] || continue
    i=$((i + 1))
    l=$log/torch-run-$i.log
    (cd "$tdir" && timeout -k 10 300 bash -c "$line") >"$l" 2>&1
    rc=$?
    ok=$([ $rc = 0 ] && [ "$(count 'rank [0-9]*: nvshmem_all_to_all ok' "$l")" -ge 2 ] && echo 0 || echo 1)
    case "$line" in *NVSHMEM_DISABLE_P2P=1*)
        [ "$(count 'nvshmemt_init: transport ABI' "$l")" -ge 2 ] || ok=1 ;;
    esac
    result "torch-run: $line" "$ok" "exit $rc; $l"
done <"$work/blocks/torch-run.txt"

# ---- C/C++ program with the preload
[ -x "$app" ] || die "no NVSHMEM program at $app (--app)"
cdir=$work/cxx
mkdir -p "$cdir" && cp "$wheels/$wheel_name" "$cdir/"
# ./my_nvshmem_app: the program, with the unique-id file its ranks share when it was built without
# MPI (tests/gpu/common.cuh), one per mpirun job (PMIx names each job).
app_abs=$(cd "$(dirname "$app")" && pwd)/$(basename "$app")
printf '#!/bin/sh\nNVSHMEM_TESTS_UID_FILE=%s/uid-${PMIX_NAMESPACE:-${OMPI_MCA_orte_ess_jobid:-job}} exec %s "$@"\n' \
    "$cdir" "$app_abs" >"$cdir/my_nvshmem_app"
chmod +x "$cdir/my_nvshmem_app"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}
# One shell for the whole block (its eval feeds the lines after it); each line is echoed first.
(cd "$cdir" && timeout -k 10 600 bash -ev "$work/blocks/cxx.txt") >"$log/cxx.log" 2>&1
rc=$?
ok=$rc
[ "$(count 'nvshmemt_init: transport ABI' "$log/cxx.log")" -ge 2 ] || ok=1
result "cxx block (pip install, eval env, mpirun with P2P and with NVSHMEM_DISABLE_P2P=1)" "$ok" "exit $rc; $log/cxx.log"
say "$npass passed, $nfail failed"
[ "$nfail" = 0 ]
