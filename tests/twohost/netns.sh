# Two "hosts" on one machine: two network + UTS namespaces joined by a veth pair, each held open by
# one process (no bind mounts, no `ip netns`: works where only unshare, nsenter and an `ip` binary
# are at hand, e.g. a private copy of Debian's iproute2). Each namespace has its own host name, so
# the library's host identity (boot id + host name) differs and it takes the path between hosts;
# the PID namespace is shared. Sourced, not run. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
#
#   twohost_up [TAG]     creates them; sets TH_PID (holder PIDs), TH_IF (the veth end in each, both
#                        named TAGv, as every host of a cluster has the same interface name), TH_ADDR
#                        (IPv4 addresses, TEST-NET-2 198.51.100.0/24: never routed off the machine),
#                        TH_HOST (host names); returns 1 with the reason on stderr when not permitted
#   twohost_add_link NAME ADDR0 ADDR1 LEN
#                        one more veth pair between the two namespaces (after twohost_up): the end in
#                        each is named NAME (at most 14 characters), with ADDR0/LEN in namespace 0 and
#                        ADDR1/LEN in 1 (a subnet of its own per link); gone with the namespaces
#   twohost_run I CMD... runs CMD in namespace I (0 or 1) with the caller's environment
#   twohost_down         ends the holders: the namespaces and the veth pair go with them
#   twohost_check        both sides see their address and host name, and a TCP connection from
#                        namespace 1 to 0 over the veth works
# TWOHOST_IP: the ip command (default: ip on PATH); TWOHOST_IP_LIBS: a directory put in front of
# LD_LIBRARY_PATH for it (a private iproute2 and its libraries); TWOHOST_HOLD_S: how long the
# holders live at most (default 3600 s), so namespaces of a killed run do not stay for ever.

TH_PID=()
TH_IF=()
TH_ADDR=()
TH_HOST=()

th_ip() { # ARGS: the ip command in the caller's namespace
    if [ -n "${TWOHOST_IP_LIBS:-}" ]; then
        LD_LIBRARY_PATH="$TWOHOST_IP_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${TWOHOST_IP:-ip}" "$@"
    else
        "${TWOHOST_IP:-ip}" "$@"
    fi
}

th_ip_in() { # I ARGS: the ip command in namespace I
    local i=$1
    shift
    nsenter -t "${TH_PID[$i]}" -n -- env ${TWOHOST_IP_LIBS:+LD_LIBRARY_PATH="$TWOHOST_IP_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"} \
        "${TWOHOST_IP:-ip}" "$@"
}

twohost_up() {
    local tag=${1:-th$$} i pid
    command -v unshare >/dev/null 2>&1 || { echo "twohost: unshare not found" >&2; return 1; }
    command -v nsenter >/dev/null 2>&1 || { echo "twohost: nsenter not found" >&2; return 1; }
    th_ip -V >/dev/null 2>&1 || { echo "twohost: no usable ip command (${TWOHOST_IP:-ip})" >&2; return 1; }
    local made=("${tag}a" "${tag}b")
    TH_IF=("${tag}v" "${tag}v")
    TH_ADDR=(198.51.100.1 198.51.100.2)
    TH_HOST=("${tag}-host0" "${tag}-host1")
    TH_PID=()
    for i in 0 1; do
        # The holder sets its namespace's host name, then sleeps; ended by twohost_down.
        unshare -n -u -- sh -c 'echo "$0" > /proc/sys/kernel/hostname 2>/dev/null || hostname "$0" || exit 1; exec sleep "$1"' \
            "${TH_HOST[$i]}" "${TWOHOST_HOLD_S:-3600}" </dev/null >/dev/null 2>&1 &
        TH_PID+=($!)
    done
    # Up when the host name shows inside.
    for i in 0 1; do
        local ok=0 n
        for n in $(seq 1 100); do
            if [ "$(nsenter -t "${TH_PID[$i]}" -u -- uname -n 2>/dev/null)" = "${TH_HOST[$i]}" ]; then ok=1; break; fi
            kill -0 "${TH_PID[$i]}" 2>/dev/null || break
            sleep 0.05
        done
        [ $ok = 1 ] || { echo "twohost: namespace $i did not come up (unshare -n -u not permitted?)" >&2; twohost_down; return 1; }
    done
    if ! th_ip link add "${made[0]}" type veth peer name "${made[1]}" 2>/tmp/twohost-$$.err; then
        echo "twohost: cannot create a veth pair: $(cat /tmp/twohost-$$.err)" >&2
        rm -f /tmp/twohost-$$.err
        twohost_down
        return 1
    fi
    rm -f /tmp/twohost-$$.err
    for i in 0 1; do
        pid=${TH_PID[$i]}
        th_ip link set "${made[$i]}" netns "$pid" &&
            th_ip_in "$i" link set "${made[$i]}" name "${TH_IF[$i]}" &&
            th_ip_in "$i" addr add "${TH_ADDR[$i]}/24" dev "${TH_IF[$i]}" &&
            th_ip_in "$i" link set "${TH_IF[$i]}" up && th_ip_in "$i" link set lo up ||
            { echo "twohost: setting up namespace $i failed" >&2; th_ip link del "${made[0]}" 2>/dev/null; twohost_down; return 1; }
    done
    return 0
}

twohost_add_link() {
    local name=$1 len=$4 i
    local addr=("$2" "$3")
    [ ${#TH_PID[@]} = 2 ] || { echo "twohost: twohost_add_link before twohost_up" >&2; return 1; }
    th_ip link add "${name}a" type veth peer name "${name}b" ||
        { echo "twohost: cannot create the veth pair ${name}a/${name}b" >&2; return 1; }
    local ends=("${name}a" "${name}b")
    for i in 0 1; do
        th_ip link set "${ends[$i]}" netns "${TH_PID[$i]}" &&
            th_ip_in "$i" link set "${ends[$i]}" name "$name" &&
            th_ip_in "$i" addr add "${addr[$i]}/$len" dev "$name" &&
            th_ip_in "$i" link set "$name" up ||
            { echo "twohost: setting up $name in namespace $i failed" >&2; th_ip link del "${ends[0]}" 2>/dev/null; return 1; }
    done
}

twohost_run() {
    local i=$1
    shift
    nsenter -t "${TH_PID[$i]}" -n -u -- "$@"
}

# twohost_fi_rma_bw FI_RMA_BW LOG SCRATCH WINDOW OP SIZE ITERS: raw libfabric between the two
# namespaces (tcp;ofi_rxm, host memory, window WINDOW): fi_rma_bw -o OP, server in namespace 0,
# client in 1, started once the server listens. Both outputs are appended to LOG (SCRATCH holds
# them meanwhile); prints "MB/s Mxfers/s" of the client's line; status 1 (and a line on stderr)
# when either side failed.
twohost_fi_rma_bw() {
    local bin=$1 log=$2 scratch=$3 window=$4 op=$5 size=$6 iters=$7
    local port=$((30000 + RANDOM % 20000)) srv n
    local args=(-p "tcp;ofi_rxm" -E="$port" -o "$op" -S "$size" -I "$iters" -w 10 -W "$window" -m)
    echo "## fi_rma_bw $op $size: server in ${TH_HOST[0]}, client in ${TH_HOST[1]}: ${args[*]} ${TH_ADDR[0]}" >>"$log"
    twohost_run 0 timeout 60 "$bin" "${args[@]}" >"$scratch/srv.out" 2>&1 &
    srv=$!
    for n in $(seq 1 250); do
        awk -v p=":$(printf '%04X' "$port")" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' \
            "/proc/$srv/net/tcp" 2>/dev/null && break
        sleep 0.02
    done
    twohost_run 1 timeout 60 "$bin" "${args[@]}" "${TH_ADDR[0]}" >"$scratch/cli.out" 2>&1
    local crc=$? src=0
    wait "$srv" || src=$?
    cat "$scratch/srv.out" "$scratch/cli.out" >>"$log"
    [ $crc = 0 ] && [ $src = 0 ] || { echo "fi_rma_bw $op $size: client $crc, server $src" >&2; return 1; }
    sed -n "s/.*xfer_size: $size,.* MB\/sec: \([0-9.]*\), usec\/xfer: [0-9.]*, Mxfers\/sec: \([0-9.]*\).*/\1 \2/p" \
        "$scratch/cli.out" | head -n 1
}

twohost_down() {
    local p
    for p in "${TH_PID[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${TH_PID[@]}"; do wait "$p" 2>/dev/null; done
    TH_PID=()
}

twohost_check() {
    local i port=$((20000 + RANDOM % 20000)) got
    for i in 0 1; do
        got=$(twohost_run "$i" uname -n)
        [ "$got" = "${TH_HOST[$i]}" ] || { echo "twohost: namespace $i has host name '$got'" >&2; return 1; }
        th_ip_in "$i" -4 addr show dev "${TH_IF[$i]}" 2>/dev/null | grep -q "inet ${TH_ADDR[$i]}/" ||
            { echo "twohost: ${TH_IF[$i]} with ${TH_ADDR[$i]} missing in namespace $i" >&2; return 1; }
    done
    # TCP across the veth: a listener in 0 (python3; skipped without it), a client in 1 (bash).
    command -v python3 >/dev/null 2>&1 || return 0
    twohost_run 0 timeout 10 python3 -c "
import socket; s = socket.socket(); s.bind(('${TH_ADDR[0]}', $port)); s.listen(1)
c, _ = s.accept(); c.sendall(b'twohost-ok'); c.close()" &
    local lp=$!
    local n
    for n in $(seq 1 50); do
        got=$(twohost_run 1 timeout 2 bash -c "exec 3<>/dev/tcp/${TH_ADDR[0]}/$port && cat <&3" 2>/dev/null) && break
        sleep 0.1
    done
    wait $lp 2>/dev/null
    [ "$got" = twohost-ok ] || { echo "twohost: no TCP connection from namespace 1 to ${TH_ADDR[0]}:$port" >&2; return 1; }
}
