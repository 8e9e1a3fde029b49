#!/usr/bin/env bash
# Fuzzes the EFA WQE/CQE decoders and the software-queue consumer for a bounded time.
#
#   tests/fuzz/run.sh                  # softq_consumer 30 s, wqe_decode 10 s
#   FUZZ_SECONDS=600 tests/fuzz/run.sh
#   FUZZ_SECONDS=600 FUZZ_TARGETS=softq_consumer tests/fuzz/run.sh
#
# FUZZ_SECONDS is softq_consumer's time; wqe_decode (fast, fuzzed at length before) gets a third of
# it. FUZZ_TARGETS picks targets (space-separated; default both). softq_consumer runs a real software
# queue over a loopback provider (SOFTQ_FUZZ_PROVIDER: tcp, the default, or shm) and needs libfabric
# (source .ci/env.sh or .deps/libfabric.env first).
#
# Only stable Rust is installed: RUSTC_BOOTSTRAP=1 lets it accept the unstable
# flags cargo-fuzz passes. The sanitizer defaults to none (the decoders are safe
# Rust; libFuzzer still catches panics, and debug assertions turn on overflow
# checks); set FUZZ_SANITIZER=address to add AddressSanitizer. The corpus starts
# from the golden vectors in tests/golden/efa_vectors.txt and efa_wide_vectors.txt.
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
if [ -z "$(ls -A "$corpus")" ]; then
    i=0
    for vectors in "$here/../golden/efa_vectors.txt" "$here/../golden/efa_wide_vectors.txt"; do
        [ -f "$vectors" ] || continue
        while read -r kind name rest; do
            case "$kind" in
                wqe | wqe_bad | tx_cqe | rx_cqe | rx_cqe_ex | cqe_bad | wide | wide_bad) ;;
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
    done
    echo "seeded $i corpus entries from tests/golden"
fi

secs="${FUZZ_SECONDS:-30}"
for target in ${FUZZ_TARGETS:-wqe_decode softq_consumer}; do
    case "$target" in
        wqe_decode)
            t=$((secs / 3))
            [ "$t" -ge 5 ] || t=5
            cargo fuzz run --fuzz-dir "$here" --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions \
                wqe_decode "$corpus" -- -max_total_time="$t"
            ;;
        softq_consumer)
            sq_corpus="$here/corpus/softq_consumer"
            mkdir -p "$sq_corpus"
            # One input posts at most 48 WQEs; a queue that stops answering fails the input after
            # 20 s (the poster's bound), well inside -timeout. The library's own warnings about
            # the rejected WQEs are expected: only errors are shown.
            NVSHMEM_EFA_LOG="${NVSHMEM_EFA_LOG:-nvshmem_efa_gda=error}" \
                cargo fuzz run --fuzz-dir "$here" --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions \
                softq_consumer "$sq_corpus" -- -max_total_time="$secs" -timeout=60 -max_len=4096
            ;;
        *)
            echo "unknown fuzz target '$target' (wqe_decode, softq_consumer)" >&2
            exit 2
            ;;
    esac
done
