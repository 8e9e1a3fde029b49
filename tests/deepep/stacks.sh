#!/usr/bin/env bash
# Dumps what every process of a running DeepEP test is doing: per thread its name and kernel wait
# channel, host stacks (gdb, when installed) and the kernels resident on the GPU (cuda-gdb, when
# installed), plus nvidia-smi. Used by tests/deepep/run.sh --stacks S on a run still going after S s.
#   bash tests/deepep/stacks.sh OUTFILE
out=${1:?usage: stacks.sh OUTFILE}
# The ranks (torch.multiprocessing children) first: the launcher only waits for them.
pids="$(pgrep -f 'multiprocessing.spawn' 2>/dev/null | sort -u | tr '\n' ' ')$(pgrep -f '^[^ ]*python[^ ]* .*launch_ll.py' 2>/dev/null | tr '\n' ' ')"
{
    echo "== $(date -u +%FT%TZ) processes: $(echo $pids)"
    nvidia-smi 2>&1 | tail -n 12
    gdb_bin=$(command -v gdb || true)
    cgdb_bin=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -n 1)
    for p in $pids; do
        echo "== pid $p: $(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -c1-160)"
        for t in /proc/$p/task/*; do
            printf '  tid %s %-16s wchan=%s\n' "${t##*/}" "$(cat $t/comm 2>/dev/null)" "$(cat $t/wchan 2>/dev/null)"
        done
        # cuda-gdb is a gdb too: one attach gives the resident kernels and the host stacks.
        dbg=${cgdb_bin:-$gdb_bin}
        if [ -n "$dbg" ]; then
            cmds=(-ex 'set pagination off')
            [ -n "$cgdb_bin" ] && cmds+=(-ex 'info cuda kernels')
            cmds+=(-ex 'thread apply all bt 12')
            timeout 40 "$dbg" -p "$p" -batch "${cmds[@]}" 2>&1 |
                grep -vE '^\[New|^\[Thread|^$|^warning|Reading symbols|^Using host' | head -n 400 | cut -c1-220
        fi
    done
    [ -n "$gdb_bin" ] || echo "(no gdb on this machine: wait channels only)"
    [ -n "$cgdb_bin" ] || echo "(no cuda-gdb on this machine: no GPU-side view)"
} >"$out" 2>&1
