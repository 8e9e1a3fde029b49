#!/usr/bin/env bash
# DeepEP's low-latency test over a matrix of configs, GDA path (this library's queue, P2P off) and
# DeepEP's NVLink path, one CSV: $OUT/deepep-ll.csv
#   config,path,ranks,gpus,dispatch_us,combine_us,dispatch_combine_us,dispatch_send_us,combine_send_us
#
#   PLUGIN_DIR=.gpu/plugin/lib LIBFABRIC_HOME=.gpu/libfabric OUT=out \
#       bash tests/deepep/ll_matrix.sh [--configs "T:H:E:K ..."] [--ranks N] [--seeds S] [--two-host]
#       [--no-p2p-ref] [--no-gda] [--debug] DEEPEP_TREE   (the last three: run.sh's options)
#
# The tree is copied once per machine to $DEEPEP_WORK (default /tmp/deepep-ll/DeepEP) and built there
# (tests/deepep/run.sh, SAVE_EXT=$OUT/deepep-ext.tgz when set), so that calls that follow each other on a
# warm node reuse the build; a build tests/deepep/build_ext.sh has running there is waited for
# (BUILD_WAIT_S, default 900 s), not raced. Configs: tokens:hidden:experts:topk (default: DeepEP's default, a hidden
# 4096 one and a 32-expert one). --seeds S adds DeepEP's --pressure-test bounded to S seeds (see
# launch_ll.py: DEEPEP_PRESSURE_SEEDS). Figures per config and path: the mean over ranks of each rank's
# avg_t (DeepEP's own bench and kineto timings); a run that failed writes no row and is named in
# $OUT/summary.txt. --two-host: the GDA runs in the two-host layout (run.sh --two-host; no P2P rows;
# the CSV's gda rows are then the path between hosts).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
configs="128:7168:288:8 128:4096:288:8 128:7168:32:8"
ranks=2
seeds=0
extra=()
tree=""
while [ $# -gt 0 ]; do
    case "$1" in
    --configs) configs=${2:?}; shift ;;
    --ranks) ranks=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --no-p2p-ref | --no-gda | --two-host | --debug) extra+=("$1") ;;
    -*) echo "ll_matrix.sh: unknown option $1" >&2; exit 2 ;;
    *) tree=$1 ;;
    esac
    shift
done
[ -d "$tree" ] || { echo "ll_matrix.sh: DEEPEP_TREE missing" >&2; exit 2; }
OUT=${OUT:-$PWD/deepep-ll-out}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
work=${DEEPEP_WORK:-/tmp/deepep-ll/DeepEP}
if [ ! -d "$work" ]; then
    mkdir -p "$(dirname "$work")"
    cp -a "$tree" "$work"
fi
# A build that tests/deepep/build_ext.sh started in this work tree is waited for (up to BUILD_WAIT_S,
# default 900 s), never raced: on 2026-11-29 (h) a matrix started while that build ran (346 s in)
# began a second build of the same tree; the first finished at 615 s, the matrix ran out its time.
if [ "$(DEEPEP_WORK=$work bash "$here/build_ext.sh" state)" = building ]; then
    echo "ll_matrix.sh: build_ext.sh is building $work; waiting up to ${BUILD_WAIT_S:-900} s"
    DEEPEP_WORK=$work bash "$here/build_ext.sh" wait "${BUILD_WAIT_S:-900}" || {
        echo "ll_matrix.sh: that build did not finish (failed or still running); nothing run" >&2
        exit 1
    }
fi
# An extension carried in (SAVE_EXT of an earlier node) is unpacked into the work tree.
# The kit is applied first: applying it rewrites DeepEP's sources, and run.sh rebuilds an extension
# older than its sources (a carried tree without the kit cost a whole build on 2026-11-28 (d)).
if [ -n "${LOAD_EXT:-}" ] && [ -f "$LOAD_EXT" ] && ! ls "$work"/deep_ep_cpp*.so >/dev/null 2>&1; then
    bash "$here/../../patches/deepep/apply.sh" "$work" >/dev/null ||
        { echo "ll_matrix.sh: the DeepEP kit does not apply to $work" >&2; exit 1; }
    tar xzf "$LOAD_EXT" -C "$work" && touch "$work"/deep_ep_cpp*.so
    echo "ll_matrix.sh: extension from $LOAD_EXT (built with torch $(cat "$work/.nvshmem_efa_gda_torch" 2>/dev/null))"
fi
summary=$OUT/summary.txt
: >"$summary"
status=0
built=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && ngpu=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
gpus=$(( ngpu < ranks ? ngpu : ranks ))
for c in $configs; do
    IFS=: read -r t h e k <<<"$c"
    name=${t}x${h}x${e}x${k}
    args="--num-tokens $t --hidden $h --num-experts $e --num-topk $k"
    build_flag=()
    [ $built = 1 ] && build_flag=(--no-build)
    env DEEPEP_PRESSURE_SEEDS="$seeds" OUT="$OUT/$name" bash "$here/run.sh" "${build_flag[@]}" "${extra[@]}" \
        --ranks "$ranks" --timeout "${CASE_TIMEOUT:-180}" \
        --test-args "$args$([ "$seeds" -gt 0 ] && echo ' --pressure-test')" "$work"
    rc=$?
    built=1
    echo "config $name: rc=$rc" >>"$summary"
    [ $rc = 0 ] || status=1
done
python3 "$here/ll_csv.py" --ranks "$ranks" --gpus "$gpus" "$OUT" >"$OUT/deepep-ll.csv"
cat "$OUT/deepep-ll.csv"
exit $status
