# Shared by the benchmark scripts in tests/bench: running fabtests and our programs as server/client
# pairs on one machine. Sourced, not run. Uses the caller's globals: BW_BYTES, LOG, WORK, PIDS,
# SRV_PIN, CLI_PIN (bench_workdir and bench_pins set these four), RUN_TIMEOUT, OOB_PORT (and
# RUN_PAIR_NO_LISTEN, see run_pair).

# PIN (default 1 where taskset exists and there are 2 CPUs or more) -> SRV_PIN (CPU 0), CLI_PIN
# (CPU 1), BOTH_PIN (CPUs 0 and 1), or empty prefixes.
bench_pins() {
    if [[ -z ${PIN:-} ]]; then
        if command -v taskset > /dev/null && (( $(nproc) >= 2 )); then PIN=1; else PIN=0; fi
    fi
    if (( PIN )); then
        SRV_PIN=(taskset -c 0); CLI_PIN=(taskset -c 1); BOTH_PIN=(taskset -c '0,1')
    else
        SRV_PIN=(); CLI_PIN=(); BOTH_PIN=()
    fi
}

# bench_workdir NAME: WORK, a fresh directory removed on exit, and PIDS, processes killed on exit.
bench_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
}
bench_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}

# fabtests' name of a provider.
ft_prov() { [[ $1 == tcp ]] && echo "tcp;ofi_rxm" || echo "$1"; }

# Iterations of a bandwidth run of $1-byte messages: BW_BYTES in all, 100 to 10000.
bw_iters() {
    local n=$(( BW_BYTES / $1 ))
    (( n > 10000 )) && n=10000
    (( n < 100 )) && n=100
    echo "$n"
}

# Waits (bounded) until something listens on TCP port $1 of this host.
wait_listen() {
    local hex _
    hex=$(printf '%04X' "$1")
    for _ in $(seq 1 250); do
        if awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
            return 0
        fi
        sleep 0.02
    done
    return 1
}

# run_pair NAME SERVER_CMD... -- CLIENT_CMD... : runs both under a timeout, the server first;
# prints the client's stdout; fails (with both outputs in the log) if either fails.
run_pair() {
    local name=$1; shift
    local srv=() cli=()
    while [[ $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    { echo "## $name"; echo "server: ${SRV_PIN[*]} ${srv[*]}"; echo "client: ${CLI_PIN[*]} ${cli[*]}"; } >> "$LOG"
    timeout "$RUN_TIMEOUT" "${SRV_PIN[@]}" "${srv[@]}" > "$WORK/srv.out" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    # A server that exchanges addresses through files (RUN_PAIR_NO_LISTEN) opens no port to wait for.
    if [[ ${srv[0]} != "${RUN_PAIR_NO_LISTEN:-}" ]]; then
        wait_listen "$OOB_PORT" || { echo "$name: server never listened" >&2; cat "$WORK/srv.out" >&2; return 1; }
    fi
    local crc=0 src=0
    timeout "$RUN_TIMEOUT" "${CLI_PIN[@]}" "${cli[@]}" > "$WORK/cli.out" 2>&1 || crc=$?
    wait "$spid" || src=$?
    cat "$WORK/srv.out" "$WORK/cli.out" >> "$LOG"
    if (( crc != 0 || src != 0 )); then
        echo "$name failed (client $crc, server $src); see $LOG" >&2
        return 1
    fi
    cat "$WORK/cli.out"
}

# ours / fabtests to three decimals ("inf" when fabtests reported 0).
ratio() { awk -v o="$1" -v f="$2" 'BEGIN { if (f > 0) printf "%.3f", o / f; else print "inf" }'; }
