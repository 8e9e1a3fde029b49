#!/usr/bin/env bash
# DeepEP's extension built in the background on a GPU node, so that the build (5-10 minutes, most of
# it nvcc on DeepEP's internode.cu) runs while the same call measures something else, and outlives
# the call on a warm node (its own process session, setsid).
#
#   PLUGIN_DIR=.gpu/plugin/lib LIBFABRIC_HOME=.gpu/libfabric \
#       bash tests/deepep/build_ext.sh start DEEPEP_TREE   # copy the tree to $DEEPEP_WORK, start the build
#   bash tests/deepep/build_ext.sh wait S                  # wait up to S seconds; 0 = built, 1 = failed,
#                                                          # 3 = still building
#   bash tests/deepep/build_ext.sh status                  # one line
#   bash tests/deepep/build_ext.sh state                   # one word: absent, building, built,
#                                                          # failed or lost
#
# The work tree is the one tests/deepep/ll_matrix.sh uses ($DEEPEP_WORK, default
# /tmp/deepep-ll/DeepEP), so a later ll_matrix.sh finds the extension built. The build is
# tests/deepep/run.sh (the kit, then setup.py build_ext) with no test run; its log and summary are in
# $DEEPEP_WORK/../build (build.log, summary.txt, console.txt). With SAVE_EXT=FILE the extension is kept
# there too (gzip'd tar, what ll_matrix.sh's LOAD_EXT takes on a fresh node).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${DEEPEP_WORK:-/tmp/deepep-ll/DeepEP}
logdir=$(dirname "$work")/build
say() { echo "[deepep build_ext] $*"; }

state() {
    if [ -f "$logdir/rc" ]; then
        if [ "$(cat "$logdir/rc")" = 0 ]; then echo built; else echo failed; fi
    elif [ -f "$logdir/pid" ] && kill -0 "$(cat "$logdir/pid")" 2>/dev/null; then
        echo building
    elif [ -f "$logdir/pid" ]; then
        echo lost # the process is gone without writing rc (the machine was given back)
    else
        echo absent
    fi
}

case "${1:-}" in
start)
    tree=${2:?start needs DEEPEP_TREE}
    [ -d "$tree" ] || { say "DEEPEP_TREE $tree is not a directory"; exit 2; }
    [ -n "${PLUGIN_DIR:-}" ] || { say "PLUGIN_DIR is not set (the extension links libnvshmem_efa_gda.so)"; exit 2; }
    PLUGIN_DIR=$(cd "$PLUGIN_DIR" && pwd) || exit 2
    s=$(state)
    if [ "$s" = building ] || [ "$s" = built ]; then say "already $s in $work"; exit 0; fi
    if [ ! -d "$work" ]; then
        mkdir -p "$(dirname "$work")"
        cp -a "$tree" "$work"
    fi
    rm -rf "$logdir"
    mkdir -p "$logdir"
    # --no-gda --no-p2p-ref: run.sh applies the kit and builds, then has nothing to run.
    setsid bash -c '
        OUT="$1" PLUGIN_DIR="$2" bash "$3/run.sh" --no-gda --no-p2p-ref "$4" >"$1/console.txt" 2>&1
        rc=$?
        if [ $rc = 0 ] && [ -n "${SAVE_EXT:-}" ]; then
            (cd "$4" && tar czf "$SAVE_EXT" deep_ep_cpp*.so .nvshmem_efa_gda_torch) || rc=1
        fi
        echo $rc >"$1/rc"' build_ext "$logdir" "$PLUGIN_DIR" "$here" "$work" </dev/null >/dev/null 2>&1 &
    echo $! >"$logdir/pid"
    say "started (pid $(cat "$logdir/pid")) in $work; log $logdir/console.txt"
    ;;
wait)
    limit=${2:?wait needs seconds}
    t0=$SECONDS
    while [ "$(state)" = building ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 2; done
    s=$(state)
    say "$s after $((SECONDS - t0)) s of waiting"
    case $s in
    built) exit 0 ;;
    building) exit 3 ;;
    *) [ -f "$logdir/console.txt" ] && tail -n 20 "$logdir/console.txt"; exit 1 ;;
    esac
    ;;
status) say "$(state) ($work)" ;;
state) state ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
