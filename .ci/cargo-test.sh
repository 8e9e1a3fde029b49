#!/usr/bin/env bash
# cargo test as CI runs it, with its output (which holds the deliberate error cases' log lines) in
# target/ci-logs/cargo-test.log. The console gets one line: test binaries, passed, failed, ignored;
# on failure also the failing tests, their panics and the log's tail.
set -uo pipefail
cd "$(dirname "$0")/.."
log=target/ci-logs/cargo-test.log
mkdir -p target/ci-logs
cargo test --release --locked -- --test-threads=1 >"$log" 2>&1
rc=$?
# "test result: ok. 209 passed; 0 failed; 1 ignored; ..."
read -r bins p f i < <(awk '/^test result:/ {n++; p+=$4; f+=$6; i+=$8} END {print n+0, p+0, f+0, i+0}' "$log")
echo "cargo test: $bins test binaries, $p passed, $f failed, $i ignored (log: $log)"
if [ $rc -ne 0 ]; then
    grep -E "^test .* FAILED$|panicked at|^error(\[|:)" "$log" | head -n 40
    echo "--- last 60 lines of $log"
    tail -n 60 "$log"
fi
exit $rc
