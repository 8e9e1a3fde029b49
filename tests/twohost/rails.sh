#!/usr/bin/env bash
# Rails over several tcp interfaces between two "hosts" on one machine (CI): the two network + UTS
# namespaces of tests/twohost/netns.sh, joined by three more veth pairs (one subnet each, the same
# interface names in both), one PE in each; the transport uses the three as rails
# (NVSHMEM_EFA_RAILS). The test itself is tests/transport_rails.rs's rails_netns: every rail
# carries traffic (per-rail counters), quiet waits for all, then rail 1's link goes down inside PE
# 0's namespace mid-stream (RAILS_CUT): its operations end with an error within the rail timeout,
# one WARN line says so, the data written after it (over the other rails) is checked, and the
# fetch-adds throughout are exact. Then rail 0's link goes down too (RAILS_CUT0): its operations
# to PE 1 end with an error within the rail timeout, PE 1's atomics move to rail 2 (one WARN line
# names the move), the fetch-adds after it are exact, the one in flight at the cut is applied
# never, and the data written over rail 2 alone is checked. This script also checks, from the
# kernel's counters, that every rail interface of namespace 0 sent data. Root (CAP_SYS_ADMIN,
# CAP_NET_ADMIN), iproute2, veth.
# Under a minute once the test is built.
#
#   bash tests/twohost/rails.sh        (.ci/env.sh's setup; TWOHOST_IP / TWOHOST_IP_LIBS: netns.sh)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
source .ci/env.sh
say() { echo "[rails] $*"; }
fail() { say "FAILED: $*"; exit 1; }
START=$SECONDS

cargo test --quiet --test transport_rails --no-run 2>/dev/null || fail "building tests/transport_rails.rs"
# shellcheck source=tests/twohost/netns.sh
source tests/twohost/netns.sh
trap 'twohost_down' EXIT
tag=rl$$
twohost_up "$tag" || fail "the namespaces could not be made (root with CAP_SYS_ADMIN and CAP_NET_ADMIN, iproute2, veth)"
twohost_check || fail "the namespaces do not answer"
ifaces=()
for k in 0 1 2; do
    # TEST-NET-3 (never routed off the machine), one /26 per rail.
    twohost_add_link "${tag}r$k" "203.0.113.$((k * 64 + 1))" "203.0.113.$((k * 64 + 2))" 26 || fail "rail link $k"
    ifaces+=("${tag}r$k")
done

say "namespaces ${TH_HOST[0]} and ${TH_HOST[1]}, rails ${ifaces[*]} (203.0.113.0/26, .64/26, .128/26)"
tx_bytes() { # IFACE: bytes sent by namespace 0's end
    th_ip_in 0 -s link show dev "$1" | awk '/TX:/ { getline; print $1; exit }'
}
before=()
for i in "${ifaces[@]}"; do before+=("$(tx_bytes "$i")"); done

ip_cmd="${TWOHOST_IP:-ip}"
[ -n "${TWOHOST_IP_LIBS:-}" ] && ip_cmd="env LD_LIBRARY_PATH=$TWOHOST_IP_LIBS $ip_cmd"
export RAILS_NS="${TH_PID[0]},${TH_PID[1]}"
export RAILS_IFACES
RAILS_IFACES=$(IFS=,; echo "${ifaces[*]}")
export RAILS_CUT="nsenter -t ${TH_PID[0]} -n -- $ip_cmd link set dev ${ifaces[1]} down"
export RAILS_CUT0="nsenter -t ${TH_PID[0]} -n -- $ip_cmd link set dev ${ifaces[0]} down"
# The whole output (the library's log lines too, among them the deliberate cut's WARN and ERROR
# lines) goes to a log file; the console gets the test's own progress lines and a count.
logs=${CI_LOGS:-$ROOT/target/ci-logs}
mkdir -p "$logs"
out=$logs/twohost-rails.log
timeout 120 cargo test --quiet --test transport_rails -- rails_netns --ignored --exact --nocapture >"$out" 2>&1
rc=$?
grep -E '^\[PE [01]\] PE [01]: ' "$out" | sed 's/^/    /'
if [ $rc != 0 ]; then
    tail -n 80 "$out"
    fail "rails_netns (exit status $rc; log $out)"
fi
say "the cut's expected library log lines: $(grep -c ' WARN ' "$out") warning(s), $(grep -c ' ERROR ' "$out") error(s) (log $out)"
for k in 0 1 2; do
    sent=$(($(tx_bytes "${ifaces[$k]}") - before[k]))
    [ "$sent" -ge $((512 * 1024)) ] || fail "rail $k (${ifaces[$k]}) sent only $sent bytes"
    say "rail $k (${ifaces[$k]}): namespace 0 sent $sent bytes"
done
say "RESULT: ok ($((SECONDS - START)) s)"
