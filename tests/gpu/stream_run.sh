#!/usr/bin/env bash
# The stream benchmark's whole GPU run, in one call, within a time budget (default 460 s): k
# non-blocking operations then one quiet (tests/gpu/stream_bench.cu), in two layouts on one node:
#   same-host  both PEs in this host's namespaces: the library on shm, NVSHMEM's P2P path, the
#              library's null completion (NVSHMEM_EFA_BENCH_NULL=1), fi_rma_bw on shm;
#   two-host   each PE in its own network + UTS namespace joined by a veth pair
#              (tests/twohost/netns.sh; iproute2 carried): the library on tcp over the veth (the
#              path between hosts), the null completion, fi_rma_bw on tcp between the namespaces;
# then PyTorch symmetric memory (nvshmem_all_to_all, all_to_all_vdev through enable()) same-host
# (library and P2P, tests/python_gpu/run.sh) and two-host (library over tcp). PEs start without
# MPI: NVSHMEM's unique-id bootstrap (id through a file, sockets over the veth in the two-host
# layout), one PE per GPU, or both on one GPU under CUDA MPS (tests/gpu/mps.sh;
# CUDA_VISIBLE_DEVICES=0 on a two-GPU node). Steps in order of priority; one that no longer fits
# the budget is skipped and says so.
#
# Staged on the build machine (repo root): bash tests/gpu/stage_stream_run.sh
# On the node (repo root, root user), carrying .gpu/stream-base.tgz and .gpu/py.tgz:
#   OUT=<dir> bash tests/gpu/stream_run.sh [--quick] [--budget S] [--only STEPS] [--dry-run]
# Writes $OUT/stream-compare.csv, stream-compare.txt, torch-compare.csv, every stream-*.csv,
# fabric.csv (fi_rma_bw write, write with FI_DELIVERY_COMPLETE as op write_dc, and read), command.txt
# (how it was called, every command line), logs.tgz (all logs); and
# stream-compare.png when matplotlib imports (else: python3 tests/gpu/stream_compare.py DIR --png
# FILE wherever it does).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

usage() {
    cat <<'EOF'
usage: tests/gpu/stream_run.sh [options]
  --quick        fewer sizes (8 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB), shorter measurements: ~5 minutes
  --budget S     wall-clock budget in seconds (default 460; --quick 300)
  --only LIST    comma-separated steps: same,p2p,null,two,twonull,lat,fabric,torch,twotorch
                 (default: all)
  --dry-run      check the inputs and print every command without running anything
environment: OUT (default ./stream-out), PYTHON (torch python, default /opt/torch/.venv/bin/python),
  NVSHMEM_HOME (default: the torch python's nvidia-nvshmem-cu13), STREAM_EXTRA (more stream_bench
  arguments for every run), STREAM_PLUGIN_DIR (the library to measure, default .gpu/plugin/lib: an
  older build there compares a change with what it replaced on one node)
EOF
}

quick=0 budget="" only="same,p2p,null,two,twonull,lat,fabric,torch,twotorch" dry=0
invocation="$0 $*"
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --dry-run) dry=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "stream_run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[ -n "$budget" ] || budget=$([ $quick = 1 ] && echo 300 || echo 460)
case $budget in '' | *[!0-9]*) echo "--budget must be seconds" >&2; exit 2 ;; esac
T0=$SECONDS
left() { echo $((budget - (SECONDS - T0))); }
want() { [[ ",$only," == *",$1,"* ]]; }
say() { echo "[stream_run] $*"; }
die() { echo "[stream_run] ERROR: $*" >&2; exit 2; }

OUT=${OUT:-$PWD/stream-out}
mkdir -p "$OUT" || die "cannot create OUT=$OUT"
OUT=$(cd "$OUT" && pwd)
L=$OUT/logs
mkdir -p "$L"
CMDS=$OUT/command.txt
{ echo "# $(date -u +%FT%TZ) on $(uname -n): $invocation"; echo "# budget $budget s, quick $quick, steps $only"; } >"$CMDS"

# ---------------------------------------------------------------- inputs
for t in .gpu/stream-base.tgz .gpu/py.tgz; do
    if [ -f "$t" ]; then
        [ $dry = 1 ] || tar -xzf "$t" -C .gpu || die "cannot unpack $t"
    fi
done
PLUGIN_DIR=${STREAM_PLUGIN_DIR:-$repo/.gpu/plugin/lib}
FAB=$repo/.gpu/libfabric
BINS=$repo/.gpu/bins-3.4.5
IPR=$repo/.gpu/iproute2
if [ $dry = 0 ]; then
    [ -f "$PLUGIN_DIR/nvshmem_transport_libfabric.so.3" ] || die "no .gpu/plugin (carry .gpu/stream-base.tgz from tests/gpu/stage_stream_run.sh)"
    [ -x "$BINS/stream_bench" ] || die "no $BINS/stream_bench (tests/gpu/stage_stream_run.sh)"
    [ -x "$FAB/bin/fi_rma_bw" ] || die "no $FAB/bin/fi_rma_bw"
    if grep -q MPI_Init "$BINS/stream_bench"; then die "$BINS/stream_bench was built with MPI; this runner starts PEs without MPI (build where mpi.h is absent, as stage_stream_run.sh does)"; fi
fi
PY=${PYTHON:-}
[ -n "$PY" ] || { [ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python || PY=python3; }
compile_only=0
need_device_lib=0
# shellcheck source=tests/gpu/tools.sh
source "$here/tools.sh"
if [ -z "${NVSHMEM_HOME:-}" ]; then
    NVSHMEM=$(PYTHON=$PY find_nvshmem) || { [ $dry = 1 ] && NVSHMEM=/nonexistent/nvshmem; } || die "NVSHMEM not found (NVSHMEM_HOME)"
else
    NVSHMEM=$NVSHMEM_HOME
fi
fabric_lib=$FAB/lib
ipcmd=ip
iplibs=""
if ! command -v ip >/dev/null 2>&1; then ipcmd=$IPR/bin/ip iplibs=$IPR/lib; fi
command -v nsenter >/dev/null 2>&1 || export PATH="$PATH:$IPR/bin"
export TWOHOST_IP=$ipcmd TWOHOST_IP_LIBS=$iplibs

# ---------------------------------------------------------------- placement, namespaces
# shellcheck source=tests/gpu/mps.sh
source "$here/mps.sh"
# shellcheck source=tests/twohost/netns.sh
source "$repo/tests/twohost/netns.sh"
cleanup() {
    twohost_down
    gpu_placement_end
}
trap cleanup EXIT
GPU_ENV=()
GPU_LAYOUT="(dry run)"
if [ $dry = 0 ]; then
    gpu_placement 2 || die "no GPU layout for 2 PEs: $GPU_LAYOUT"
fi
say "GPUs: $GPU_LAYOUT; NVSHMEM $NVSHMEM; ip: $ipcmd; budget $budget s"
two_ok=0
if [ $dry = 1 ]; then
    TH_PID=(PID0 PID1) TH_IF=(thsv thsv) TH_ADDR=(198.51.100.1 198.51.100.2) TH_HOST=(ths-host0 ths-host1)
    two_ok=1
elif twohost_up ths && twohost_check; then
    two_ok=1
    say "two-host layout: ${TH_HOST[0]} ${TH_ADDR[0]} | ${TH_HOST[1]} ${TH_ADDR[1]} (veth ${TH_IF[0]})"
else
    say "two-host layout NOT available: its steps are skipped"
fi

# ---------------------------------------------------------------- common environments
if [ $quick = 1 ]; then
    SIZES="--sizes 8,4096,65536,1048576,16777216"
    CAP=100
    FAB_SIZES="8 4096 65536 1048576 16777216"
else
    SIZES="--min-bytes 8 --max-bytes 67108864 --step 4"
    CAP=150
    FAB_SIZES="8 128 2048 32768 524288 2097152 8388608 67108864"
fi
window_for() { if [ "$1" -le 65536 ]; then echo 200; elif [ "$1" -le 4194304 ]; then echo 20; else echo 4; fi; }
common_env=(
    NVSHMEM_DISABLE_NVLS=1 NVSHMEM_DISABLE_NCCL=1 NVSHMEM_DISABLE_CUDA_VMM=1
    "NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}" NVSHMEM_DEBUG=WARN
    NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY=AF_INET "${GPU_ENV[@]}"
)
lib_env() { # PROVIDER IFACE: the library's environment
    echo NVSHMEM_REMOTE_TRANSPORT=libfabric "NVSHMEM_LIBFABRIC_PROVIDER=$1" NVSHMEM_DISABLE_P2P=1 \
        "FI_TCP_IFACE=$2" "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=$2" FI_LOG_LEVEL=warn \
        "LD_PRELOAD=$PLUGIN_DIR/nvshmem_transport_libfabric.so.3" \
        "LD_LIBRARY_PATH=$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib" "FI_PROVIDER_PATH=$fabric_lib/libfabric" \
        "NVSHMEM_EFA_LOG=${NVSHMEM_EFA_LOG:-nvshmem_efa_gda=warn,nvshmem_efa_gda::mover=debug}"
}
p2p_env=(NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_DISABLE_P2P=0 NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
    "LD_LIBRARY_PATH=$NVSHMEM/lib")

# pes NAME LAYOUT LIMIT ENV... -- PROGRAM ARGS: 2 PEs without MPI (unique-id bootstrap through a
# file), PE r on GPU r (or both under MPS), in namespace r for LAYOUT two-host. Sets prc.
pes() {
    local name=$1 layout=$2 lim=$3 r envs=() pids=() rc
    shift 3
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local uid=$L/uid-$name
    rm -f "$uid"
    prc=0
    for r in 0 1; do
        local pre=()
        [ "$layout" = two-host ] && pre=(nsenter -t "${TH_PID[$r]}" -n -u --)
        local cmd=(timeout -k 10 "$lim" "${pre[@]}" env "${common_env[@]}" "${envs[@]}" OMPI_COMM_WORLD_RANK=$r
            OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=$r "NVSHMEM_TESTS_UID_FILE=$uid" "$@")
        printf '%q ' "${cmd[@]}" >>"$CMDS"
        echo >>"$CMDS"
        if [ $dry = 1 ]; then continue; fi
        "${cmd[@]}" >"$L/$name.pe$r.log" 2>&1 </dev/null &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || { rc=$?; [ $prc = 0 ] && prc=$rc; }; done
    return 0
}

# stream NAME LAYOUT KIND PROVIDER LIMIT ENV... : one stream_bench run (CSV $OUT/stream-NAME.csv)
stream() {
    local name=$1 layout=$2 kind=$3 prov=$4 lim=$5 extra=()
    shift 5
    [ "$kind" = null ] && extra=(--no-verify)
    local b=$((lim - 25))
    # shellcheck disable=SC2086 # SIZES, STREAM_EXTRA: several words by design
    pes "$name" "$layout" "$lim" "$@" -- "$BINS/stream_bench" "$OUT/stream-$name.csv" \
        --label "$layout/$kind/$prov" --blocks 1,8 $SIZES --cap-ms $CAP --budget-s $b "${extra[@]}" ${STREAM_EXTRA:-}
    [ $dry = 1 ] && return
    say "$name: exit status $prc"
    grep -hE '^stream_bench|^(put|get|put_signal|amo|signal) |measurements in|FAIL|VERIFY|WATCHDOG|FATAL|BENCH_NULL|of 2 PEs on this host' \
        "$L/$name.pe0.log" "$L/$name.pe1.log" | head -n 120 | sed 's/^/    /'
    [ $prc = 0 ] || { echo "    --- last lines of PE 0:"; tail -n 15 "$L/$name.pe0.log" | sed 's/^/    | /'; }
}

fits() { # WHAT SECONDS: whether the step fits the budget left
    local l
    l=$(left)
    if [ "$l" -lt "$2" ]; then say "SKIPPED: $1 (needs ~$2 s, $l s left)"; return 1; fi
    say "--- $1 ($l s left)"
}

big=$([ $quick = 1 ] && echo 40 || echo 70)
small=$([ $quick = 1 ] && echo 30 || echo 50)

# ---------------------------------------------------------------- the stream runs
if want same && fits "same-host: library on shm, P2P off" "$big"; then
    stream same-library same-host library shm "$big" $(lib_env shm lo)
fi
if want two && [ $two_ok = 1 ] && fits "two-host: library on tcp over the veth" "$big"; then
    stream two-library two-host library tcp "$big" $(lib_env tcp "${TH_IF[0]}")
fi
if want p2p && fits "same-host: NVSHMEM P2P" "$small"; then
    stream same-p2p same-host p2p p2p "$small" "${p2p_env[@]}"
fi
if want null && fits "same-host: null completion (NVSHMEM's proxy ceiling)" "$small"; then
    stream same-null same-host null shm "$small" $(lib_env shm lo) NVSHMEM_EFA_BENCH_NULL=1
fi
if want twonull && [ $two_ok = 1 ] && fits "two-host: null completion" "$small"; then
    stream two-null two-host null tcp "$small" $(lib_env tcp "${TH_IF[0]}") NVSHMEM_EFA_BENCH_NULL=1
fi
if want lat && fits "one put then quiet (latency), both layouts" 40; then
    for lay in same two; do
        [ $lay = two ] && [ $two_ok = 0 ] && continue
        prov=$([ $lay = same ] && echo shm || echo tcp)
        ifc=$([ $lay = same ] && echo lo || echo "${TH_IF[0]}")
        layout=$([ $lay = same ] && echo same-host || echo two-host)
        pes "lat-$lay" "$layout" 25 $(lib_env "$prov" "$ifc") -- "$BINS/stream_bench" "$OUT/latency-$lay.csv" \
            --label "$layout/latency/$prov" --ops put --blocks 1 --window 1 --sizes 8,1048576 --cap-ms 300 --budget-s 10
        [ $dry = 1 ] || { say "latency $layout: exit status $prc"; grep -hE '^put ' "$L/lat-$lay.pe0.log" | sed 's/^/    /'; }
    done
fi

# ---------------------------------------------------------------- raw libfabric, same window
# fab LAYOUT PROVIDER MEMORY OP SIZE: fi_rma_bw -W k, a row of fabric.csv
fab() {
    local layout=$1 prov=$2 mem=$3 op=$4 size=$5 k iters port
    k=$(window_for "$size")
    iters=$((($([ $quick = 1 ] && echo 67108864 || echo 268435456)) / size))
    [ $iters -gt 10000 ] && iters=10000
    [ $iters -lt $((k * 4)) ] && iters=$((k * 4))
    port=$((30000 + RANDOM % 20000))
    local p=$prov
    [ "$p" = tcp ] && p="tcp;ofi_rxm"
    # write_dc: writes with FI_DELIVERY_COMPLETE (-U), a window ending where a quiet ends.
    local args=(-p "$p" -E="$port" -o "${op%_dc}" -S "$size" -I "$iters" -w 4 -W "$k" -m)
    [ "$op" = write_dc ] && args+=(-U)
    local dev_s=() dev_c=()
    if [ "$mem" = cuda ]; then
        args+=(-D cuda)
        dev_s=(-i 0)
        dev_c=(-i "$([ "${GPU_COUNT:-1}" -ge 2 ] && echo 1 || echo 0)")
    fi
    local envs=(env "LD_LIBRARY_PATH=$fabric_lib" "FI_PROVIDER_PATH=$fabric_lib/libfabric" "${GPU_ENV[@]}")
    local srv=() cli=() addr=127.0.0.1
    if [ "$layout" = two-host ]; then
        srv=(nsenter -t "${TH_PID[0]}" -n -u --) cli=(nsenter -t "${TH_PID[1]}" -n -u --) addr=${TH_ADDR[0]}
        envs+=("FI_TCP_IFACE=${TH_IF[0]}")
    else
        envs+=(FI_TCP_IFACE=lo)
    fi
    local scmd=(timeout 40 "${srv[@]}" "${envs[@]}" "$FAB/bin/fi_rma_bw" "${args[@]}" "${dev_s[@]}")
    local ccmd=(timeout 40 "${cli[@]}" "${envs[@]}" "$FAB/bin/fi_rma_bw" "${args[@]}" "${dev_c[@]}" "$addr")
    { printf '%q ' "${scmd[@]}"; echo "&"; printf '%q ' "${ccmd[@]}"; echo; } >>"$CMDS"
    [ $dry = 1 ] && return 0
    local lg=$L/fabric-$layout-$op-$size.log
    "${scmd[@]}" >"$lg.srv" 2>&1 &
    local sp=$! n
    for n in $(seq 1 150); do
        awk -v p=":$(printf '%04X' "$port")" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' \
            "/proc/$sp/net/tcp" 2>/dev/null && break
        sleep 0.02
    done
    "${ccmd[@]}" >"$lg" 2>&1
    local crc=$? src=0
    wait $sp || src=$?
    local line
    line=$(sed -n "s/.*xfer_size: $size,.* MB\/sec: \([0-9.]*\), usec\/xfer: \([0-9.]*\),.*/\2,\1/p" "$lg" | tail -n 1)
    if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ]; then
        echo "$layout,$prov,$op,$size,$k,$mem,$line" >>"$OUT/fabric.csv"
        printf '    %-9s %-4s %-5s %-4s %10s  k %3s  %s MB/s\n' "$layout" "$prov" "$op" "$mem" "$size" "$k" "${line#*,}"
    else
        printf '    %-9s %-4s %-5s %-4s %10s  k %3s  FAILED (client %s, server %s; %s)\n' "$layout" "$prov" "$op" "$mem" "$size" "$k" "$crc" "$src" "$lg"
        return 1
    fi
}
hmem_of() { # PROVIDER: cuda when fi_info lists it with FI_HMEM, else host
    local p=$1
    [ "$p" = tcp ] && p="tcp;ofi_rxm"
    if [ $dry = 0 ] && env LD_LIBRARY_PATH="$fabric_lib" FI_PROVIDER_PATH="$fabric_lib/libfabric" timeout 20 \
        "$FAB/bin/fi_info" -p "$p" -c FI_HMEM 2>/dev/null | grep -q 'provider:'; then echo cuda; else echo host; fi
}
if want fabric && fits "fi_rma_bw, same windows and providers (write, read)" 40; then
    echo "layout,provider,op,size_bytes,window,memory,usec_per_xfer,mbps" >"$OUT/fabric.csv"
    for lay in same-host two-host; do
        [ $lay = two-host ] && [ $two_ok = 0 ] && continue
        prov=$([ $lay = same-host ] && echo shm || echo tcp)
        mem=$(hmem_of "$prov")
        say "fi_rma_bw $lay on $prov, $mem memory"
        first=1
        for op in write write_dc read; do
            for s in $FAB_SIZES; do
                [ "$(left)" -lt 12 ] && { say "fi_rma_bw: out of time at $lay $op $s"; break 3; }
                if ! fab "$lay" "$prov" "$mem" "$op" "$s" && [ $first = 1 ] && [ "$mem" = cuda ]; then
                    # fi_info lists FI_HMEM, yet GPU memory fails: host memory then (says so).
                    mem=host
                    say "fi_rma_bw $lay on $prov: GPU memory failed at the first size; host memory from here"
                    fab "$lay" "$prov" "$mem" "$op" "$s"
                fi
                first=0
            done
        done
    done
fi

# ---------------------------------------------------------------- PyTorch symmetric memory
venv=/tmp/nvshmem-efa-gda-pyvenv
if want torch && fits "PyTorch all-to-all same-host: library (shm) and P2P (tests/python_gpu/run.sh)" 110; then
    cmd=(timeout -k 10 $(($(left) - 60 > 150 ? 150 : $(left) - 60)) bash tests/python_gpu/run.sh --wheels .gpu/py --libfabric "$FAB"
        --python "$PY" --venv "$venv" --only torch --timeout 80)
    { printf 'OUT=%q ' "$L/torch-same"; printf '%q ' "${cmd[@]}"; echo; } >>"$CMDS"
    if [ $dry = 0 ]; then
        OUT=$L/torch-same "${cmd[@]}" >"$L/torch-same.log" 2>&1
        say "torch same-host: exit status $?"
        grep -E 'PASS|FAIL|^op|all_to_all|median of' "$L/torch-same.log" | tail -n 14 | sed 's/^/    /'
        for m in library p2p; do
            f=$L/torch-same/python_gpu/torch_$m.csv
            [ -s "$f" ] && cp "$f" "$OUT/torch-same-host-$m.csv"
        done
    fi
fi
if want twotorch && [ $two_ok = 1 ] && fits "PyTorch all-to-all two-host: library on tcp over the veth" 60; then
    VPY=$venv/bin/python
    if [ $dry = 0 ] && [ ! -x "$VPY" ]; then
        say "SKIPPED: two-host torch needs the venv of the same-host torch step ($venv)"
    else
        nvdir=$([ $dry = 0 ] && "$VPY" -c 'import importlib.util as u; print(u.find_spec("nvidia.nvshmem").submodule_search_locations[0])' 2>/dev/null || echo "$NVSHMEM")
        port=$((29500 + RANDOM % 1000))
        pids=()
        for r in 0 1; do
            tcmd=(timeout -k 10 "$(($(left) < 80 ? $(left) : 80))" nsenter -t "${TH_PID[$r]}" -n -u -- env -u LD_PRELOAD PYTHONUNBUFFERED=1
                "${GPU_ENV[@]}" "LD_LIBRARY_PATH=$fabric_lib:$nvdir/lib" "FI_PROVIDER_PATH=$fabric_lib/libfabric"
                NVSHMEM_DISABLE_P2P=1 NVSHMEM_DISABLE_NVLS=1 NVSHMEM_LIBFABRIC_PROVIDER=tcp
                "FI_TCP_IFACE=${TH_IF[0]}" "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=${TH_IF[0]}" NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY=AF_INET
                "NCCL_SOCKET_IFNAME=${TH_IF[0]}" "GLOO_SOCKET_IFNAME=${TH_IF[0]}" NCCL_IB_DISABLE=1
                "NVSHMEM_EFA_LOG=nvshmem_efa_gda=info,nvshmem_efa_gda::mover=debug"
                RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=1 GROUP_RANK=$r "MASTER_ADDR=${TH_ADDR[0]}" MASTER_PORT=$port
                "$VPY" tests/python_gpu/symm_mem_a2a.py --mode library --csv "$OUT/torch-two-host-library.csv")
            { printf '%q ' "${tcmd[@]}"; echo "&"; } >>"$CMDS"
            [ $dry = 1 ] && continue
            "${tcmd[@]}" >"$L/torch-two.rank$r.log" 2>&1 </dev/null &
            pids+=($!)
        done
        trc=0
        for p in "${pids[@]}"; do wait "$p" || trc=$?; done
        if [ $dry = 0 ]; then
            say "torch two-host: exit status $trc"
            grep -hE 'PASS|FAIL|all_to_all|time |of 2 PEs on this host|Traceback|Error' "$L/torch-two.rank0.log" "$L/torch-two.rank1.log" |
                head -n 30 | sed 's/^/    /'
        fi
    fi
fi

# ---------------------------------------------------------------- tables, plot
if [ $dry = 1 ]; then
    say "dry run: every command is in $CMDS"
    cat "$CMDS"
    exit 0
fi
python3 "$here/stream_compare.py" "$OUT" >"$L/compare.log" 2>&1
crc=$?
cat "$L/compare.log"
if python3 -c 'import matplotlib' 2>/dev/null || "$PY" -c 'import matplotlib' 2>/dev/null; then
    pyp=python3
    python3 -c 'import matplotlib' 2>/dev/null || pyp=$PY
    "$pyp" "$here/stream_compare.py" "$OUT" --png "$OUT/stream-compare.png" >/dev/null 2>&1 &&
        say "plot: $OUT/stream-compare.png"
else
    say "no matplotlib here: make the plot elsewhere with python3 tests/gpu/stream_compare.py DIR --png DIR/stream-compare.png"
fi
grep -h 'NVSHMEM_EFA_BENCH_NULL=1: BENCHMARK MODE ended' "$L"/*null*.log 2>/dev/null | head -n 2 | sed 's/^/    /'
for lay in same two; do
    ids=$(grep -hoE 'PE [01]: [0-9] of 2 PEs on this host' "$L/$lay-library.pe0.log" "$L/$lay-library.pe1.log" 2>/dev/null | sort -u | paste -sd';' -)
    [ -n "$ids" ] && say "host identity, $lay-host layout: $ids"
    if [ $lay = two ] && echo "$ids" | grep -q '2 of 2'; then
        say "WARNING: in the two-host layout the library saw both PEs on one host: the figures are not the path between hosts"
    fi
done
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$L"
say "done in $((SECONDS - T0)) s; compare exit status $crc; results in $OUT"
exit $crc
