#!/usr/bin/env bash
# The host harness (tests/harness) under valgrind's memcheck: 2 processes over tcp;ofi_rxm load the
# release library as NVSHMEM does and run init, connect, register, puts, gets, atomics, the proxy
# endpoint, a second transport used after its finalize, and finalize. Fails on any memcheck error
# and on any "definitely lost" block (--errors-for-leak-kinds=definite); possibly lost and still
# reachable blocks (libfabric's and libnl's start-up allocations, finalized transport structs kept
# on purpose in src/capi/transport.rs) are not errors. One valgrind log per process goes to
# target/ci-logs/valgrind.<pid>.log; the console gets the harness's closing line.
#
#   bash .ci/valgrind.sh            (after cargo build --release)
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
target=${CARGO_TARGET_DIR:-$PWD/target}
lib=$target/release/libnvshmem_efa_gda.so
[ -f "$lib" ] || { echo "no $lib: run cargo build --release first"; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is not installed (.ci/apt-packages.txt)"; exit 1; }
logs=${CI_LOGS:-$target/ci-logs}
mkdir -p "$logs"
rm -f "$logs"/valgrind.*.log
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O1 -g -Wall -o "$work/harness" tests/harness/harness.c -ldl
rc=0
# The harness forks its ranks (no exec), so valgrind follows them without --trace-children.
NVSHMEM_LIBFABRIC_PROVIDER=tcp NVSHMEM_EFA_GDA=off timeout 600 \
  valgrind -q --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
  --error-exitcode=97 --log-file="$logs/valgrind.%p.log" \
  "$work/harness" --lib "$lib" --abi 3 --np 2 --case-timeout 240 --timeout 540 \
  --case put --case get --case amo --case proxy_put_get --case use_after_finalize \
  >"$logs/valgrind-harness.log" 2>&1 || rc=$?
# Memcheck's findings, also counted from the logs (a rank's exit status 97 already fails the run).
found=$(cat "$logs"/valgrind.*.log 2>/dev/null |
  grep -cE '== (Invalid |Conditional jump|Use of uninitialised|Syscall param|Mismatched free|Source and destination overlap|[0-9,]+ bytes in [0-9,]+ blocks are definitely lost)' || true)
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
  cat "$logs/valgrind-harness.log"
  for f in "$logs"/valgrind.*.log; do [ -s "$f" ] && { echo "--- $f"; head -80 "$f"; }; done
  echo "valgrind: FAILED (harness exit $rc, $found memcheck report lines; logs in $logs)"
  exit 1
fi
echo "valgrind: $(tail -1 "$logs/valgrind-harness.log"); no memcheck errors, no definite leaks ($logs)"
