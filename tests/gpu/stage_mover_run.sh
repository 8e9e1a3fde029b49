#!/usr/bin/env bash
# Stages, on the build machine (after bash .ci/run's setup), what tests/gpu/mover_run.sh needs on
# a GPU node, as three tarballs under .gpu/ (git-ignored, about 58 MiB together):
#   .gpu/base.tgz        the release plugin and libfabric (.ci/stage-gpu.sh) and the library's unit
#                        test binary as .gpu/t/libtests (the mover's GPU tests run from it);
#   .gpu/bins-3.4.5.tgz  the NVSHMEM suite and put benchmark built against NVSHMEM 3.4.5;
#   .gpu/py.tgz          this library's wheel and the Python wheels the node lacks
#                        (tests/python_gpu/pack.sh).
# Then, on the node: OUT=<dir> bash tests/gpu/mover_run.sh, carrying the three tarballs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
bash .ci/stage-gpu.sh
lib_tests=$(cargo test --release --locked --lib --no-run 2>&1 |
    sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))/\1/p' | tail -n 1)
[ -x "$lib_tests" ] || { echo "stage_mover_run.sh: no unit test binary found" >&2; exit 1; }
mkdir -p .gpu/t
cp "$lib_tests" .gpu/t/libtests
strip .gpu/t/libtests
tar -C .gpu -czf .gpu/base.tgz plugin libfabric t
bash tests/gpu/run.sh --compile-only --save-bins .gpu/bins-3.4.5
tar -C .gpu -czf .gpu/bins-3.4.5.tgz bins-3.4.5
bash tests/python_gpu/pack.sh
ls -l .gpu/base.tgz .gpu/bins-3.4.5.tgz .gpu/py.tgz
