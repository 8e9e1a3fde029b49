#!/usr/bin/env bash
# The data mover's whole GPU run in one call, within a time budget: what issue "One fast data mover"
# measures, on one GPU (2 PEs under CUDA MPS) or on two (one PE per GPU, no MPS; tests/gpu/mps.sh
# decides). Steps, in order of priority; a step whose time limit no longer fits the budget is
# skipped and says so:
#   1. the mover's GPU tests (copy engine, CUDA IPC / VMM across processes, kernel atomics, the
#      software queue's copy kernel);
#   2. the GDA suite on the default copy route (the copy kernel), then on the host route;
#   3. the GDA benchmark: the copy kernel route (gda), the host route (gda-host), NVSHMEM's proxy
#      path, P2P, the null consumer's post rate; 8 B to GDA_MAX_BYTES;
#   4. the NVSHMEM 3.4.5 suite through the library and the put benchmark against NVSHMEM's P2P path
#      and raw libfabric (fabtests -D cuda);
#   5. PyTorch's nvshmem_all_to_all with kernel atomics against NVSHMEM's P2P path;
#   6. the GDA post rate (null consumer) against the number of posting warps and the SQ depth
#      (GDA_SWEEP: BLOCKSxWARPS-DEPTH words), then the default route with data at the second of
#      them;
#   7. the NVSHMEM suite with kernel atomics (NVSHMEM_EFA_AMO_KERNEL=1) and PyTorch's
#      nvshmem_all_to_all with the default atomics.
# CUDA_VISIBLE_DEVICES=0 on a two-GPU machine runs the one-GPU layout (2 PEs under MPS).
# Key lines on stdout; every log in $OUT/logs.tgz, the tables' CSVs in $OUT.
#
# Staged on the build machine (repo root, after bash .ci/run's setup): bash tests/gpu/stage_mover_run.sh
# On the node (repo root), carrying .gpu/base.tgz .gpu/bins-3.4.5.tgz .gpu/py.tgz:
#   OUT=<dir> bash tests/gpu/mover_run.sh
# Environment: MOVER_RUN_BUDGET_S (default 560), MOVER_RUN_STEPS (default 1,2,3,4,5),
#   GDA_SWEEP (default "4x4-256 16x8-1024 66x8-4096 132x8-4096"),
#   GDA_MAX_BYTES (default 1048576), NVSHMEM_HOME (default: the node's torch venv).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu-out}
L=$OUT/logs
mkdir -p "$L"
budget=${MOVER_RUN_BUDGET_S:-560}
steps=${MOVER_RUN_STEPS:-1,2,3,4,5}
t0=$SECONDS
left() { echo $((budget - (SECONDS - t0))); }
want() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
# fits NAME MIN LIMIT: sets tmo to LIMIT, or to what is left of the budget (20 s kept for the
# packing) when that is less; skips the step (and says so) when less than MIN would be left.
tmo=0
fits() {
    tmo=$(($(left) - 20))
    [ $tmo -gt "$3" ] && tmo=$3
    if [ $tmo -lt "$2" ]; then
        echo "== $1: SKIPPED ($(left) s of the budget left, needs $2)"
        return 1
    fi
    echo "== $1 (at $((SECONDS - t0)) s, limit $tmo s)"
}
pack() {
    tar -C "$OUT" -czf "$OUT/logs.tgz" logs 2>/dev/null && rm -rf "$L"
    echo "== done in $((SECONDS - t0)) s; logs in $OUT/logs.tgz"
}
trap pack EXIT

for t in base bins-3.4.5 py; do [ -f .gpu/$t.tgz ] && tar -xzf .gpu/$t.tgz -C .gpu; done
export NVSHMEM_HOME=${NVSHMEM_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nvshmem}
export PLUGIN_DIR=$PWD/.gpu/plugin/lib LIBFABRIC_HOME=$PWD/.gpu/libfabric NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L | tee "$L/gpus.txt"
nvidia-smi topo -m >>"$L/gpus.txt" 2>&1
source tests/gpu/mps.sh
gpus=$(gpu_count)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" | tee -a "$L/gpus.txt"
echo "GPUs: $gpus ($([ "$gpus" -ge 2 ] && echo 'one PE per GPU' || echo '2 PEs under CUDA MPS'))"
consumer_log="nvshmem_efa_gda=info,nvshmem_efa_gda::gda::softq::consumer=debug"
kernel_lines() { # DIR: the copy kernel's stop lines and the route line, counted
    grep -rhoE "copy kernel: [0-9]+ launches, [0-9]+ applied by the kernel, [0-9]+ taken over by the host.*" \
        "$1" 2>/dev/null | grep -v "^copy kernel: 0 launches" | sort | uniq -c | sort -rn | head -4
    grep -rhoE "software queue: RDMA to same-host peers.*runs as [a-z -]+|software queue: no copy kernel.*" \
        "$1" 2>/dev/null | sort | uniq -c | head -2
}

if want 1 && fits "mover GPU tests" 60 120; then
    LD_LIBRARY_PATH=$LIBFABRIC_HOME/lib timeout $tmo .gpu/t/libtests mover::gpu_tests --test-threads=1 \
        --nocapture >"$L/libtests.log" 2>&1
    echo "libtests rc $?"
    grep -E "^test |copy kernel|kernel atomic|then one quiet|test result|panicked" "$L/libtests.log" | head -20
fi

# The GDA programs are built by the first GDA step and reused by the next.
gda_bins=$PWD/.gpu/gda-bins
gda_bin_args() { if [ -x "$gda_bins/gda_bench" ]; then echo --bin-dir "$gda_bins"; else echo --save-bins "$gda_bins"; fi; }
for route in kernel host; do
    want 2 && fits "GDA suite, copy route $route" 90 200 || continue
    env NVSHMEM_EFA_SOFT_IPC=$route NVSHMEM_EFA_LOG="$consumer_log" GDA_TESTS_TIMEOUT=$((tmo - 40)) \
        timeout $tmo bash tests/gpu_gda/run.sh --no-sanitizer --no-bench --out "$L/gda-suite-$route" \
        $(gda_bin_args) >"$L/gda-suite-$route.log" 2>&1
    echo "gda suite ($route route) rc $?"
    grep -E "passed, [0-9]+ failed|RESULT|FAIL|TIMEOUT" "$L/gda-suite-$route.log" | tail -5
    kernel_lines "$L/gda-suite-$route"
done

if want 3 && fits "GDA benchmark (gda, gda-host, proxy, p2p, null)" 150 300; then
    env GDA_BENCH_SETS=main,null,host GDA_BENCH_EXTRA="--max-bytes ${GDA_MAX_BYTES:-1048576}" \
        NVSHMEM_EFA_LOG="$consumer_log" timeout $tmo bash tests/gpu_gda/run.sh --no-sanitizer --no-tests \
        $(gda_bin_args) --out "$L/gda-bench" >"$L/gda-bench.log" 2>&1
    echo "gda bench rc $?"
    grep -E "^    +(gda|proxy|p2p)[a-z-]* +[0-9]+ B|RESULT|FAIL" "$L/gda-bench.log" | head -90
    grep -rhoE "software queue consumer stopped after [0-9]+ WQEs.*" "$L/gda-bench" 2>/dev/null |
        grep -v "after 0 WQEs" | head -4
    kernel_lines "$L/gda-bench"
    for f in bench-gda-proxy bench-host bench-null bench-p2p bench; do
        [ -s "$L/gda-bench/$f.csv" ] && cp "$L/gda-bench/$f.csv" "$OUT/gda-$f.csv"
    done
    [ -s "$L/gda-bench/bench.png" ] && cp "$L/gda-bench/bench.png" "$OUT/gda-bench.png"
fi

if want 4 && fits "NVSHMEM suite + put benchmark (library, P2P, fabtests)" 150 300; then
    OUT=$L/nvshmem timeout $tmo bash tests/gpu/run.sh --bin-dir .gpu/bins-3.4.5 --no-p2p-tests \
        >"$L/nvshmem.log" 2>&1
    echo "nvshmem suite+bench rc $?"
    grep -E "passed, [0-9]+ failed|^ +(size|[0-9]+ )|RESULT|FAIL|ratio|library|p2p" "$L/nvshmem/bench-compare.log" \
        2>/dev/null | head -40
    grep -E "^(tests|bench)[a-z-]*:|RESULT" "$L/nvshmem/summary.txt" 2>/dev/null
    [ -s "$L/nvshmem/bench-compare.csv" ] && cp "$L/nvshmem/bench-compare.csv" "$OUT/nvshmem-put-compare.csv"
fi

if want 5 && fits "PyTorch nvshmem_all_to_all, kernel atomics, then P2P" 100 150; then
    NVSHMEM_EFA_AMO_KERNEL=1 OUT=$L/torch timeout $tmo bash tests/python_gpu/run.sh --wheels .gpu/py \
        --libfabric .gpu/libfabric --only torch >"$L/torch.log" 2>&1
    echo "torch rc $?"
    grep -E "FAIL|^op|^all_to_all|^nvshmem_all|median of" "$L/torch.log" | tail -12
    f=$(find "$L/torch" -name torch_a2a.csv 2>/dev/null | head -1)
    [ -n "$f" ] && cp "$f" "$OUT/torch-a2a.csv"
fi

if want 6 && fits "GDA post rate against posting warps and SQ depth (null consumer)" 60 240; then
    sweep=(${GDA_SWEEP:-4x4-256 16x8-1024 66x8-4096 132x8-4096})
    for cfg in "${sweep[@]}"; do
        blocks=${cfg%%x*} rest=${cfg#*x}
        warps=${rest%%-*} depth=${rest#*-}
        if [ "$(left)" -lt 60 ]; then echo "  $cfg: SKIPPED ($(left) s left)"; continue; fi
        env NVSHMEM_EFA_SQ_DEPTH="$depth" GDA_BENCH_SETS=null \
            GDA_BENCH_EXTRA="--blocks $blocks --warps $warps --max-bytes 64 --budget-s 10" \
            timeout 60 bash tests/gpu_gda/run.sh --no-sanitizer --no-tests $(gda_bin_args) \
            --out "$L/sweep-null-$cfg" >"$L/sweep-null-$cfg.log" 2>&1
        echo "  null, $blocks blocks x $warps warps, SQ depth $depth: rc $?"
        grep -E "^    +gda-null +[0-9]+ B" "$L/sweep-null-$cfg.log" | head -4
    done
    cfg=${sweep[1]:-16x8-1024}
    blocks=${cfg%%x*} rest=${cfg#*x}
    warps=${rest%%-*} depth=${rest#*-}
    if [ "$(left)" -ge 80 ]; then
        env NVSHMEM_EFA_SQ_DEPTH="$depth" GDA_BENCH_SETS=gda NVSHMEM_EFA_LOG="$consumer_log" \
            GDA_BENCH_EXTRA="--blocks $blocks --warps $warps --max-bytes 65536 --budget-s 20" \
            timeout 80 bash tests/gpu_gda/run.sh --no-sanitizer --no-tests $(gda_bin_args) \
            --out "$L/sweep-gda-$cfg" >"$L/sweep-gda-$cfg.log" 2>&1
        echo "  gda (copy kernel), $blocks blocks x $warps warps, SQ depth $depth: rc $?"
        grep -E "^    +gda +[0-9]+ B" "$L/sweep-gda-$cfg.log" | head -14
        kernel_lines "$L/sweep-gda-$cfg"
    fi
fi

if want 7 && fits "NVSHMEM suite with kernel atomics" 60 150; then
    env NVSHMEM_EFA_AMO_KERNEL=1 NVSHMEM_EFA_LOG="nvshmem_efa_gda=info,nvshmem_efa_gda::mover=debug,nvshmem_efa_gda::nvshmem::transport=debug" \
        OUT=$L/nvshmem-kernel-amo timeout $tmo bash tests/gpu/run.sh \
        --bin-dir .gpu/bins-3.4.5 --no-bench --no-p2p-tests --no-fabtests >"$L/nvshmem-kernel-amo.log" 2>&1
    echo "nvshmem suite (kernel atomics) rc $?"
    grep -E "^tests[a-z-]*:|RESULT" "$L/nvshmem-kernel-amo/summary.txt" 2>/dev/null
    grep -rhoE "kernel atomics: [0-9]+ applied by the kernel, [0-9]+ taken over by the host" \
        "$L/nvshmem-kernel-amo" 2>/dev/null | sort | uniq -c | head -4
fi
if want 7 && fits "PyTorch nvshmem_all_to_all, default atomics (no P2P reference)" 80 120; then
    OUT=$L/torch-default timeout $tmo bash tests/python_gpu/run.sh --wheels .gpu/py \
        --libfabric .gpu/libfabric --only torch --no-ref >"$L/torch-default.log" 2>&1
    echo "torch (default atomics) rc $?"
    grep -E "FAIL|^op|^all_to_all|^nvshmem_all|median of" "$L/torch-default.log" | tail -8
fi
