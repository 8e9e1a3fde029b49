#!/usr/bin/env bash
# Builds the CUDA golden-vector tests with the PyPI nvcc and runs their host part against
# tests/golden/efa_vectors.txt and tests/golden/efa_wide_vectors.txt (the same vectors the Rust
# encoders are checked with) and the generated C header against tests/golden/gda_state_layout.txt
# (the device state's layout, also checked on the Rust side by tests/efa_golden_state.rs); also compiles them as device code for sm_80 and sm_90 (and sm_100 when
# this nvcc has it).
set -euo pipefail
cd "$(dirname "$0")/../.."
source .ci/env.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -std=c++17 -x cu tests/cuda/efa_golden_test.cu -L"$CUDA_HOME/lib" -o "$tmp/efa_golden_test"
"$tmp/efa_golden_test" tests/golden/efa_vectors.txt
nvcc -std=c++17 -x cu tests/cuda/efa_wide_golden_test.cu -L"$CUDA_HOME/lib" -o "$tmp/efa_wide_golden_test"
"$tmp/efa_wide_golden_test" tests/golden/efa_wide_vectors.txt
nvcc -std=c++17 -x cu -Iinclude tests/cuda/gda_state_layout_test.cu -L"$CUDA_HOME/lib" -o "$tmp/gda_state_layout_test"
"$tmp/gda_state_layout_test" tests/golden/gda_state_layout.txt
archs="80 90"
nvcc --list-gpu-arch 2>/dev/null | grep -q compute_100 && archs="$archs 100"
for a in $archs; do
  nvcc -std=c++17 -x cu -arch=sm_$a -c tests/cuda/efa_golden_test.cu -o "$tmp/golden_sm$a.o"
  nvcc -std=c++17 -x cu -arch=sm_$a -c tests/cuda/efa_wide_golden_test.cu -o "$tmp/wide_sm$a.o"
  echo "compiled for sm_$a"
done
