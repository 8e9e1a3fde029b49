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
#
# Pinned tooling: cargo-fuzz CARGO_FUZZ_VERSION (installed with --locked unless that version is
# already there) and the committed tests/fuzz/Cargo.lock, checked to be current before the run
# (after a dependency change of the main crate: cd tests/fuzz && cargo update -w).
#
# Console: one line per target (runs, time, coverage, how many refusals the library logged). The full libFuzzer
# output, including the library's errors about the deliberately bad WQEs and doorbells the inputs
# post, goes to FUZZ_LOGS/<target>.log (default tests/fuzz/target/logs); it is printed (its tail)
# only when a target fails.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export RUSTC_BOOTSTRAP=1

CARGO_FUZZ_VERSION=0.13.2
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION (cargo install --locked)"
    ilog=$(mktemp)
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --force >"$ilog" 2>&1 ||
        { tail -40 "$ilog"; echo "cargo install cargo-fuzz $CARGO_FUZZ_VERSION failed" >&2; exit 1; }
    rm -f "$ilog"
fi

# The committed lock file: the library is fuzzed with the dependency versions it ships with
# (the main crate's, plus libfuzzer-sys). A stale one stops the run instead of being re-resolved.
if ! cargo metadata --locked --format-version 1 --manifest-path "$here/Cargo.toml" >/dev/null 2>&1; then
    echo "tests/fuzz/Cargo.lock is not current (the main crate's dependencies changed?):" \
        "run 'cd tests/fuzz && cargo update -w' and commit it" >&2
    exit 1
fi
logs=${FUZZ_LOGS:-$here/target/logs}
mkdir -p "$logs"

# fuzz_one TARGET CORPUS LIBFUZZER_ARGS...: runs one target with its output in $logs/TARGET.log.
fuzz_one() {
    local target=$1 corpus=$2 log=$logs/$1.log rc=0
    shift 2
    cargo fuzz run --fuzz-dir "$here" --sanitizer "${FUZZ_SANITIZER:-none}" --debug-assertions \
        "$target" "$corpus" -- "$@" >"$log" 2>&1 || rc=$?
    local done errors
    done=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)
    errors=$(grep -c ' ERROR ' "$log" || true)
    if [ "$rc" -ne 0 ]; then
        tail -60 "$log"
        echo "$target: FAILED (exit $rc); full output: $log" >&2
        return 1
    fi
    echo "$target: ${done:-finished}; $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | sed -E 's/^#[0-9]+[[:space:]]+DONE +//; s/ +exec.*//')" \
        "($errors refusals of bad input logged by the library: $log)"
}

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
            fuzz_one wqe_decode "$corpus" -max_total_time="$t"
            ;;
        softq_consumer)
            sq_corpus="$here/corpus/softq_consumer"
            mkdir -p "$sq_corpus"
            # One input posts at most 48 WQEs; a queue that stops answering fails the input after
            # 20 s (the poster's bound), well inside -timeout. The library's errors about the
            # refused WQEs and doorbells are expected (warnings are not even logged); they stay in
            # the log file.
            NVSHMEM_EFA_LOG="${NVSHMEM_EFA_LOG:-nvshmem_efa_gda=error}" \
                fuzz_one softq_consumer "$sq_corpus" -max_total_time="$secs" -timeout=60 -max_len=4096
            ;;
        *)
            echo "unknown fuzz target '$target' (wqe_decode, softq_consumer)" >&2
            exit 2
            ;;
    esac
done
