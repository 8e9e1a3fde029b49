#!/usr/bin/env bash
# Every test of the project (needs the setup of .ci/run). Prints one summary line per stage and
# exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
bash .ci/clean-shm.sh
failed=()
passed=0
stage() {
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@"; then
    echo "=== $name: ok ($((SECONDS - t0)) s)"
    passed=$((passed + 1))
  else
    echo "=== $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
  # Regions of test processes killed on purpose; the line says how many a stage left.
  bash .ci/clean-shm.sh
}
stage fmt cargo fmt --all -- --check
stage clippy cargo clippy --all-targets --locked -- -D warnings
stage build-release cargo build --release --locked
# Unit, integration (host harness for ABI v3 and v4, software queue, fabric layer), header freshness.
stage cargo-test bash .ci/cargo-test.sh
# Two "hosts" on this machine (network + UTS namespaces over a veth pair), host memory, tcp: the
# harness's cases and its stream benchmark next to fi_rma_bw in the same namespaces (data checked).
stage twohost-host env OUT="${TMPDIR:-/tmp}/twohost-ci" bash tests/twohost/ci.sh
# Rails: three veth pairs between the two namespaces, one rail each; one taken down mid-stream.
stage twohost-rails bash tests/twohost/rails.sh
# The host harness under valgrind: no memcheck error, no definitely lost block.
stage valgrind bash .ci/valgrind.sh
stage wheel bash .ci/wheel.sh
# The README's quick starts parse and match tests/gpu/quickstart.sh, which runs them on a GPU node.
stage quickstart-sync bash .ci/quickstart-check.sh
stage efa-golden-cuda bash tests/cuda/run_golden.sh
stage gpu-tests-compile bash tests/gpu/run.sh --compile-only
stage gda-tests-compile bash tests/gpu_gda/run.sh --compile-only
stage mps-coop-compile env OUT="${TMPDIR:-/tmp}/mps-coop-ci" bash tests/gpu/mps_coop.sh --compile-only
stage splice bash tests/splice/run.sh
stage cxx-example bash tests/cxx/run.sh
stage deepep-compile bash tests/deepep/ci_compile.sh
stage fuzz-wqe env FUZZ_SECONDS=${FUZZ_SECONDS:-30} bash tests/fuzz/run.sh
# The probe exits 0 (hardware GDA), 3 (software queue would be used) or 1/2 (error, usage).
probe() { ./target/release/efa-gda-probe; local rc=$?; [ $rc -eq 0 ] || [ $rc -eq 3 ]; }
stage probe probe
echo
[ ${#failed[@]} -eq 0 ] || echo "failed stages: ${failed[*]}"
# One line per stage above; this closing line counts stages, each of which ran its own tests.
echo "$passed passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
