#!/usr/bin/env bash
# Fuzzes the EFA WQE/CQE decoders for a bounded time.
#
#   tests/fuzz/run.sh                  # 30 seconds
#   FUZZ_SECONDS=600 tests/fuzz/run.sh
#
# Only stable Rust is installed: RUSTC_BOOTSTRAP=1 lets it accept the unstable
# flags cargo-fuzz passes. The sanitizer defaults to none (the decoders are safe
# Rust; libFuzzer still catches panics, and debug assertions turn on overflow
# checks); set FUZZ_SANITIZER=address to add AddressSanitizer. The corpus starts
# from the golden vectors in tests/golden/efa_vectors.txt.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# Start from the main crate's lock file so the library is fuzzed with the dependency
# versions it ships with; cargo adds libfuzzer-sys and drops what the target does not use.
if [ ! -f "$here/Cargo.lock" ] && [ -f "$here/../../Cargo.lock" ]; then
    cp "$here/../../Cargo.lock" "$here/Cargo.lock"
fi

corpus="$here/corpus/wqe_decode"
mkdir -p "$corpus"
vectors="$here/../golden/efa_vectors.txt"
if [ -f "$vectors" ] && [ -z "$(ls -A "$corpus")" ]; then
    i=0
    while read -r kind name rest; do
        case "$kind" in
            wqe | wqe_bad | tx_cqe | rx_cqe | rx_cqe_ex | cqe_bad) ;;
            *) continue ;;
        esac
        for tok in $rest; do
            case "$tok" in
                bytes=*)
                    hex="${tok#bytes=}"
                    printf '%b' "$(printf '%s' "$hex" | sed 's/../\\x&/g')" >"$corpus/seed-$i-$name"
                    i=$((i + 1))
                    ;;
            esac
        done
    done <"$vectors"
    echo "seeded $i corpus entries from $vectors"
fi

cargo fuzz run --fuzz-dir "$here" --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions \
    wqe_decode "$corpus" -- -max_total_time="${FUZZ_SECONDS:-30}"
